"""``dl1.fit`` and ``dl1.alpha_max``: the functional core of the estimators."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from dl1.loading import (
    col_scales,
    decide_stream,
    load_blocks,
    load_problem,
    read_inputs,
    xt_theta_absmax,
)
from dl1.params import PENALISED, validate_params
from dl1.penalties.elastic_net import ElasticNet
from dl1.solvers.base import solver_class
from dl1.solvers.executor import coordinating, executor_for
from dl1.solvers.result import FitResult
from dl1.solvers.rpc import rpc_executor


def make_solver(
    solver: str,
    *,
    max_rounds: int | None,
    n_epochs: int = 1,
    random_order: bool = False,
    seed: int = 0,
    screen: bool = False,
    spread: bool | str | None = None,
    tight_inner: bool = False,
    verbose: bool = False,
    callback: Any = None,
) -> Any:
    """The solver object ``solver`` (a name of :data:`dl1.solvers.registry.SOLVERS`)
    configured from the entry points' keywords."""
    rounds = 1000 if max_rounds is None else max_rounds
    common = dict(max_rounds=rounds, random_order=random_order, seed=seed, verbose=verbose,
                  callback=callback)  # fmt: skip
    if solver == "cd":
        return solver_class("cd")(n_epochs=n_epochs, **common)
    return solver_class(solver)(screen=screen, spread=spread, tight_inner=tight_inner, **common)


def direct_calls(ex: Any, solver: Any, streamed: bool) -> Any:
    """``ex`` with direct calls to the workers' partition servers when the solver's rounds
    gain from them (blocks in worker memory, gathered subproblems)."""
    if streamed or not solver.direct_calls:
        return ex
    return rpc_executor(ex)


@coordinating
def fit(
    X: Any,
    y: Any = None,
    *,
    alpha: float,
    l1_ratio: float = 1.0,
    loss: str = "squared",
    fit_intercept: bool = True,
    standardize: bool = False,
    sample_weight: Any = None,
    tol: float = 1e-4,
    max_rounds: int | None = None,
    n_partitions: int = 2,
    n_epochs: int = 1,
    random_order: bool = False,
    seed: int = 0,
    solver: str = "ws",
    screen: bool = False,
    stream: bool | None = None,
    spread: bool | str | None = None,
    client: Any = None,
    split: str = "train",
    verbose: bool = False,
    callback: Any = None,
) -> FitResult:
    """Fit an L1 / elastic-net linear model, certified by its duality gap.

    Minimises ``F(X w + b) + alpha * (l1_ratio ||w||_1 + (1 - l1_ratio) / 2 ||w||_2^2)`` with
    ``F`` the mean squared loss ``1/(2n) ||y - X w - b||^2`` (scikit-learn's ElasticNet
    convention) or the mean logistic loss (labels in {-1, +1}), weighted by
    ``sample_weight`` (normalised to sum to n). The constrained problem (``||w||_1 <=
    delta``) has its own entry point, :func:`dl1.fit_constrained`.

    Parameters
    ----------
    X : dask array (scipy.sparse, pydata sparse or dense chunks), dl1 Store, store path,
        scipy.sparse matrix or ndarray
        Each column chunk of a dask array is a feature block.
    y : array_like or dask array, optional
        Targets; read from the store when X is a store.
    alpha, l1_ratio : float
        Penalty strength (> 0) and mix (1.0: Lasso / L1 logistic).
    loss : {"squared", "logistic"}
    fit_intercept : bool
        Fit an unpenalised intercept.
    standardize : bool
        Penalise coefficients of features scaled to unit (weighted) standard deviation,
        implicitly (never densifying X); ``coef_`` is returned in the input's scale.
    sample_weight : array_like, optional
    tol : float
        Stop when the duality gap is ``<= tol * P(0)``.
    max_rounds : int, optional
        Round limit (default 1000); reaching it warns (ConvergenceWarning) with the gap.
    n_partitions : int
        Groups of feature blocks whose updates are added each round (CoCoA+ sigma'); fixed
        by the caller, not by the cluster, so results do not depend on the workers.
    n_epochs : int
        ``solver="cd"``: local coordinate-descent epochs per round.
    random_order, seed : bool, int
        Uniformly random coordinate order (stochastic coordinate descent), and its seed.
    solver : {"ws", "cd"}
        ``"ws"``: working sets (:class:`dl1.solvers.ws.WorkingSetSolver`): each round is one
        pass that certifies the current point and picks the features whose subproblem is
        then solved. ``"cd"``: CoCoA+ coordinate descent on every partition each round
        (:class:`dl1.solvers.cd.CoordinateDescentSolver`).
    screen : bool
        ``"ws"``: gap-safe sphere screening (Lasso and L1-logistic).
    stream : bool, optional
        Out of core (X a store): every task reads the blocks it needs and drops them.
        None: when the blocks would take more than half of the workers' memory for data.
    spread : bool or "cocoa", optional
        ``"ws"``: solve working-set subproblems where their columns were extracted instead
        of gathering them on one worker (None: out of core, when they would not fit).
    client : distributed.Client, optional
        The cluster to run on; without it everything runs in this process.
    split : str
        Split of a store to fit on.
    verbose, callback : a line, or a call with the history entry, per round.

    Returns
    -------
    FitResult
    """
    validate_params(PENALISED, locals(), "dl1.fit()")
    inputs = read_inputs(X, y, sample_weight, loss, split)
    solver_obj = make_solver(
        solver, max_rounds=max_rounds, n_epochs=n_epochs, random_order=random_order,
        seed=seed, screen=screen, spread=spread, verbose=verbose, callback=callback,
    )  # fmt: skip
    ex = executor_for(client)
    streamed = decide_stream(stream, inputs.store, split, ex)
    ex = direct_calls(ex, solver_obj, streamed)
    problem, t_load = load_problem(
        inputs, ex, penalty=ElasticNet(alpha, l1_ratio), fit_intercept=fit_intercept,
        standardize=standardize, tol=tol, n_partitions=n_partitions, loss=loss,
        streamed=streamed,
    )  # fmt: skip
    t0 = time.perf_counter()
    res, state = solver_obj.solve(problem)
    solver_obj.release(problem, state)
    ex.close()
    res.load_seconds_ = t_load
    res.solve_seconds_ = time.perf_counter() - t0
    if standardize:
        res.coef_ = res.coef_ * col_scales(ex, problem.blocks)
    return res


def alpha_max(
    X: Any,
    y: Any = None,
    *,
    l1_ratio: float = 1.0,
    loss: str = "squared",
    fit_intercept: bool = True,
    standardize: bool = False,
    sample_weight: Any = None,
    client: Any = None,
    split: str = "train",
    stream: bool | None = None,
) -> float:
    """Smallest ``alpha`` whose solution is ``w = 0``: ``||X^T grad F(b0)||_inf / l1_ratio``.

    One pass over the data (per-block reductions on the workers; ``stream`` as in
    :func:`fit`).
    """
    validate_params(PENALISED, locals(), "dl1.alpha_max()")
    inputs = read_inputs(X, y, sample_weight, loss, split)
    ex = executor_for(client)
    streamed = decide_stream(stream, inputs.store, split, ex)
    n_parts = max(1, ex.n_workers)
    blocks, _ = load_blocks(
        ex, inputs.X, inputs.sample_weight, standardize, fit_intercept, n_parts,
        inputs.store, split, streamed,
    )  # fmt: skip
    y_, s = inputs.y, inputs.weights
    b0 = inputs.datafit.initial_intercept(y_, s) if fit_intercept else 0.0
    theta = inputs.datafit.dual_point(y_, np.full(y_.shape[0], b0), s, fit_intercept)
    absmax = xt_theta_absmax(ex, blocks, theta, n_parts)
    return ElasticNet.alpha_max(absmax / y_.shape[0], l1_ratio)
