"""``dl1.fit_constrained`` and ``dl1.path_constrained``: the Lasso as a constraint.

The constrained problem ``min f(w, b)`` s.t. ``||w||_1 <= delta`` (``f`` the summed loss, any
differentiable one: squared, logistic, Poisson, Huber..., plus ``l2/2 ||w||^2`` for the
elastic net) is solved by randomized
Frank-Wolfe (Frandi et al., :mod:`dl1.solvers.fw`): each iteration scores a random sample of
columns, so the data stays in worker memory and no pass over all of it is needed until the
answer is certified. A fit stops at the FW gap the caller asked for (``tol``), or says, with a
:class:`dl1.ConvergenceWarning`, which rule stopped it short and at what gap.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dl1.errors import ValidationError
from dl1.inputs import check_two_classes, read_inputs
from dl1.loading import col_scales, decide_stream, load_blocks
from dl1.params import CONSTRAINED, CONSTRAINED_PATH, validated
from dl1.paths import PathResult
from dl1.paths.evaluation import records_as_arrays, sparse_record, test_data, test_metric
from dl1.paths.loop import AlphaStep, walk
from dl1.penalised import alpha_max, fit
from dl1.runtime.executor import coordinating, executor_for
from dl1.solvers.fw import ConstrainedProblem, FrankWolfeSolver
from dl1.solvers.fw_problem import FWProblem, FWResult, sample_size
from dl1.solvers.result import convergence_warning
from dl1.store.reader import block_memory

#: Default relative FW gap ``gap / f(0)`` at which a fit stops.
DEFAULT_TOL = 1e-4


def fw_inputs(X: Any, y: Any, loss: str, fit_intercept: bool, split: str) -> Any:
    """The constrained solver's validated inputs, read once: refused before any block is
    loaded when they carry sample weights or (with an intercept) one class of labels."""
    inputs = read_inputs(X, y, None, loss, split)
    if inputs.sample_weight.shape[0]:
        raise ValidationError(
            "the constrained solver takes no sample weights (the store holds some, or X is a "
            "Dataset view of some rows); use dl1.fit"
        )
    check_two_classes(inputs, loss, fit_intercept)
    if not inputs.datafit.smooth:
        raise ValidationError(
            f"the constrained solver needs a differentiable loss (its line search and FW gap "
            f"use the gradient), got loss={inputs.datafit.name!r}; use dl1.fit"
        )
    return inputs


def fw_problem(
    inputs: Any,
    *,
    fit_intercept: bool,
    standardize: bool,
    n_partitions: int,
    sample: float | tuple[float, int],
    stream: bool | None,
    client: Any,
    split: str,
    l2: float = 0.0,
) -> tuple[FWProblem, float]:
    """The blocks in worker memory and the fixed data of the FW solver (``sigma = X^T y``),
    for inputs from :func:`fw_inputs`.

    Returns the problem and the seconds spent loading the blocks.
    """
    Xd, yv, sw, store = inputs.X, inputs.y, inputs.sample_weight, inputs.store
    ex = executor_for(client)
    if decide_stream(stream, store, split, ex, inputs.dataset):
        raise ValidationError(
            "the constrained solver needs the feature blocks in worker memory: every "
            "iteration scores a random sample of columns of every block, so out of core it "
            "would read the whole store per iteration "
            f"({block_memory(store, split) / 2**30:.2f} GiB of blocks against the workers' "
            "memory limits); use dl1.fit or workers with more memory"
        )
    t0 = time.perf_counter()
    if inputs.dataset is not None:
        blocks, cb = inputs.dataset.feature_blocks(ex, sw, standardize, fit_intercept)
    else:
        blocks, cb = load_blocks(
            ex, Xd, sw, standardize, fit_intercept, n_partitions, store, split, False,
            local=inputs.local,
        )
        ex.wait(blocks)
    t_load = time.perf_counter() - t0
    prob = FWProblem(
        ex,
        blocks,
        cb,
        yv,
        fit_intercept=fit_intercept,
        n_partitions=n_partitions,
        kappa=sample_size(int(cb[-1]), sample),
        l2=l2,
        datafit=inputs.datafit,
    )
    return prob, t_load


@coordinating
@validated(CONSTRAINED, "dl1.fit_constrained()")
def fit_constrained(
    X: Any,
    y: Any = None,
    *,
    delta: float,
    loss: str = "squared",
    l2: float = 0.0,
    fit_intercept: bool = True,
    standardize: bool = False,
    sample: float | tuple[float, int] = 0.01,
    stop: str = "gap",
    tol: float = DEFAULT_TOL,
    step_tol: float = 1e-3,
    max_iter: int = 10000,
    certify: bool = True,
    n_partitions: int = 2,
    seed: int = 0,
    stream: bool | None = None,
    client: Any = None,
    split: str = "train",
    verbose: bool = False,
    callback: Any = None,
) -> FWResult:
    """Fit the constrained Lasso ``min f(w, b)`` s.t. ``||w||_1 <= delta`` by randomized
    Frank-Wolfe (Frandi et al.), certified by its FW gap.

    ``f`` is ``1/2 ||y - X w - b||^2`` (``loss="squared"``) or the summed loss of any other
    differentiable datafit (``"logistic"``, labels in {-1, +1}; ``"poisson"``, ``"huber"``, the
    smooth hinges), plus ``l2/2 ||w||^2`` (the elastic net in constrained form). Each
    iteration scores a random sample of columns against the residual, so an iteration costs a
    fraction of a pass; the answer is certified by one full pass (the exact FW gap, which
    bounds ``f(w) - f*``, and the duality gap of the penalised problem ``w`` solves).

    Parameters
    ----------
    X, y
        As in :func:`dl1.fit` (no sample weights; the blocks are held in worker memory).
    delta : float
        Radius of the l1 ball (on the standardised coefficients with ``standardize``).
    loss : str or Datafit, default="squared"
        As in :func:`dl1.fit`, a differentiable loss (the hinge is refused).
    l2 : float
        Ridge term ``l2/2 ||w||^2``, in the scale of ``1/2 ||y - X w - b||^2``.
    fit_intercept, standardize : bool
        As in :func:`dl1.fit`.
    sample : float or (float, int)
        Columns scored per iteration: a fraction of p in (0, 1] (the paper's 0.01 to 0.03;
        1.0 is deterministic FW), or ``(rho, s)`` for Frandi et al.'s Eq. (12), see
        :func:`dl1.solvers.fw_problem.sample_size`.
    stop : {"gap", "paper"}
        ``"gap"``: stop when the exact FW gap is ``<= tol * f(0)`` (checked by a full pass).
        ``"paper"``: stop when ``||w_{k+1} - w_k||_inf <= step_tol``, the rule of the
        paper's experiments, which does not look at the gap.
    tol : float
        Target relative FW gap. A fit returning above it, whatever stopped it, warns
        (:class:`dl1.ConvergenceWarning`) with the gap reached and the rule.
    step_tol : float
        Threshold of ``stop="paper"``.
    max_iter : int
        Iteration limit.
    certify : bool
        End with a full pass so that the reported gaps are exact; without it, a stop by the
        step rule or ``max_iter`` reports the last sample's estimate (a lower bound).
    n_partitions, seed, stream, client, split, verbose, callback
        As in :func:`dl1.fit`; ``seed`` seeds the column samples, ``stream=True`` is refused
        (every iteration reads every block), ``callback`` gets each iteration's history.

    Returns
    -------
    dl1.solvers.fw_problem.FWResult
        With ``stopped_by_`` naming the rule that ended the run.
    """
    solver = FrankWolfeSolver(
        stop=stop, tol=tol, step_tol=step_tol, max_iter=max_iter, seed=seed, certify=certify,
        verbose=verbose, callback=callback,
    )  # fmt: skip
    prob, t_load = fw_problem(
        fw_inputs(X, y, loss, fit_intercept, split), fit_intercept=fit_intercept,
        standardize=standardize, n_partitions=n_partitions, sample=sample, stream=stream,
        client=client, split=split, l2=l2,
    )  # fmt: skip
    res, _ = solver.solve(ConstrainedProblem(prob, float(delta)))
    res.load_seconds_ = t_load
    why = solver.shortfall(res)
    if why is not None:
        warnings.warn(f"Frank-Wolfe {why}", convergence_warning(), stacklevel=3)
    return res


@coordinating
def delta_max(
    X: Any,
    y: Any = None,
    *,
    eps: float = 1e-2,
    fit_intercept: bool = True,
    standardize: bool = False,
    tol: float = 1e-6,
    n_partitions: int = 2,
    client: Any = None,
    split: str = "train",
) -> float:
    """The paper's ``delta_max = ||w(lambda_min)||_1`` (Frandi et al., Sec. 5): the l1 norm of
    the penalised Lasso solution at ``alpha = eps * alpha_max``, fitted to relative duality
    gap ``tol``.

    A constrained path up to this radius spans the models of the penalised path down to
    ``eps * alpha_max``.

    Parameters
    ----------
    X, y, fit_intercept, standardize, n_partitions, client, split
        As in :func:`dl1.fit` (squared loss).
    eps : float
        ``lambda_min / alpha_max``.
    tol : float
        Relative duality gap of the penalised fit.

    Returns
    -------
    float
        The l1 norm (of the standardised coefficients with ``standardize``).
    """
    common = dict(fit_intercept=fit_intercept, standardize=standardize, client=client, split=split)
    amax = alpha_max(X, y, **common)
    if not (np.isfinite(amax) and amax > 0):
        raise ValidationError(f"alpha_max is {amax}: y is not explained by any feature")
    res = fit(X, y, alpha=eps * amax, tol=tol, n_partitions=n_partitions, **common)
    w = res.coef_
    if standardize:
        # the ball constrains the standardised coefficients: undo the scaling of coef_
        w = _standardized(X, y, w, fit_intercept, n_partitions, client, split)
    return float(np.abs(w).sum())


def _standardized(X, y, coef, fit_intercept, n_partitions, client, split) -> np.ndarray:
    inputs = read_inputs(X, y, None, "squared", split)
    Xd, sw, store = inputs.X, inputs.sample_weight, inputs.store
    ex = executor_for(client)
    blocks, _ = load_blocks(ex, Xd, sw, True, fit_intercept, n_partitions, store, split, False,
                            local=inputs.local)  # fmt: skip
    scales = col_scales(ex, blocks)
    out = np.zeros_like(coef)
    nz = scales > 0
    out[nz] = coef[nz] / scales[nz]
    return out


def radii(
    X: Any,
    y: Any,
    *,
    n_deltas: int,
    eps: float,
    deltas: Any,
    largest: float | None,
    fit_intercept: bool,
    standardize: bool,
    n_partitions: int,
    client: Any,
    split: str,
) -> np.ndarray:
    """The path's radii: ``deltas``, or ``n_deltas`` from ``eps * largest`` up to ``largest``
    (geometric; default :func:`delta_max`)."""
    if deltas is not None:
        grid = np.asarray(deltas, dtype=np.float64).ravel()
        if grid.size == 0 or not np.all(np.isfinite(grid)) or np.any(grid <= 0):
            raise ValueError("deltas must be finite and > 0")
        return grid
    if largest is None:
        largest = delta_max(
            X, y, eps=eps, fit_intercept=fit_intercept, standardize=standardize,
            n_partitions=n_partitions, client=client, split=split,
        )  # fmt: skip
    if not (np.isfinite(largest) and largest > 0):
        raise ValueError(f"delta_max must be finite and > 0, got {largest!r}")
    return np.geomspace(eps * largest, largest, n_deltas)


@dataclass(frozen=True)
class Miss:
    """A radius of a path whose fit fell short of ``tol``, and why."""

    k: int
    delta: float
    why: str


def warn_misses(misses: Sequence[Miss], n: int, tol: float) -> None:
    """One :class:`dl1.ConvergenceWarning` for all the radii of a path that missed ``tol``."""
    if not misses:
        return
    listed = "; ".join(f"delta[{m.k}] = {m.delta:.4g} {m.why}" for m in misses)
    warnings.warn(
        f"Frank-Wolfe path: {len(misses)} of {n} radii missed tol {tol:.0e}: {listed}",
        convergence_warning(),
        stacklevel=4,
    )


def path_record(res: FWResult, prob: FWProblem, seconds: float, metric: Any) -> dict[str, Any]:
    """A radius's entry in the path's arrays (the penalised path's record layout)."""
    return dict(
        coef=res.coef_,
        intercept=res.intercept_,
        gap=res.gap_,
        converged=res.certified_,
        n_active=res.n_active_,
        passes=res.nnz_visited_ / max(prob.nnz, 1),
        seconds=seconds,
        rounds=res.n_iter_,
        test_metric=metric,
    )


def path_extra(res: FWResult, delta: float) -> dict[str, Any]:
    """A radius's FW statistics (``PathResult.extra_``)."""
    return {
        "delta": float(delta),
        "l1_norm": res.l1_norm_,
        "objective": res.loss_,
        "gap_kind": res.gap_kind_,
        "lasso_alpha": res.lasso_alpha_,
        "lasso_l1_ratio": res.lasso_l1_ratio_,
        "lasso_gap": res.lasso_gap_,
        "iterations": res.n_iter_,
        "full_passes": res.n_full_passes_,
        "dot_products": res.dot_products_,
        "nnz_visited": res.nnz_visited_,
        "stopped_by_rule": res.converged_,
        "stopped_by": res.stopped_by_,
    }


@coordinating
@validated(CONSTRAINED_PATH, "dl1.path_constrained()")
def path_constrained(
    X: Any,
    y: Any = None,
    *,
    n_deltas: int = 100,
    eps: float = 1e-2,
    deltas: Any = None,
    delta_max: float | None = None,
    loss: str = "squared",
    l2: float = 0.0,
    fit_intercept: bool = True,
    standardize: bool = False,
    sample: float | tuple[float, int] = 0.01,
    stop: str = "gap",
    tol: float = DEFAULT_TOL,
    step_tol: float = 1e-3,
    max_iter: int = 10000,
    certify: bool = True,
    n_partitions: int = 2,
    seed: int = 0,
    stream: bool | None = None,
    client: Any = None,
    X_test: Any = None,
    y_test: Any = None,
    split: str = "train",
    verbose: bool = False,
    callback: Any = None,
):
    """The constrained Lasso path in ``delta`` (``||w||_1 <= delta``) by randomized
    Frank-Wolfe, every radius certified by its FW gap.

    Radii go up, each fit warm-started from the previous solution rescaled onto the new ball
    (Frandi et al., Sec. 5), so that most radii need few iterations. Radii whose fit misses
    ``tol`` are listed in one :class:`dl1.ConvergenceWarning` at the end.

    Parameters
    ----------
    X, y, loss, l2, fit_intercept, standardize, sample, stop, tol, step_tol, certify,
    n_partitions, seed, stream, client, split, verbose
        As in :func:`fit_constrained`; ``tol``, ``stop`` and ``max_iter`` (the iteration
        limit) apply to each radius.
    n_deltas, eps : int, float
        ``n_deltas`` radii from ``eps * delta_max`` up to ``delta_max`` (geometric).
    deltas : array_like, optional
        Explicit radii (increasing for warm starts to help).
    delta_max : float, optional
        Largest radius; default :func:`dl1.delta_max` (the paper's ``||w(eps alpha_max)||_1``),
        which makes the constrained path span the models of the penalised one.
    X_test, y_test
        Held-out data for the validation error per radius, as in :func:`dl1.path`.
    callback : callable, optional
        Called after each radius with ``(k, delta, result)``.

    Returns
    -------
    dl1.paths.PathResult
        With ``deltas_``, ``gaps_`` the relative FW gaps, ``alphas_`` the penalised alpha
        each solution corresponds to, and per radius in ``extra_``: iterations, dot
        products, nonzeros read, full passes, the rule that stopped it, the penalised
        Lasso's relative gap and the objective ``f``.
    """
    solver = FrankWolfeSolver(
        stop=stop, tol=tol, step_tol=step_tol, max_iter=max_iter, seed=seed, certify=certify
    )
    where = dict(fit_intercept=fit_intercept, standardize=standardize, client=client, split=split)
    # inputs refused before the radii's penalised fit, which is of the squared loss
    inputs = fw_inputs(X, y, loss, fit_intercept, split)
    grid = radii(
        X, y, n_deltas=n_deltas, eps=eps, deltas=deltas, largest=delta_max,
        n_partitions=n_partitions, **where,
    )  # fmt: skip
    prob, _ = fw_problem(
        inputs, n_partitions=n_partitions, sample=sample, stream=stream, l2=l2, **where
    )
    test = test_data(X, X_test, y_test)
    records, extra, misses = [], [], []
    lasso_alphas = np.full(grid.shape[0], np.nan)

    def on_delta(step: AlphaStep) -> None:
        res, k, delta = step.result, step.k, step.alpha
        lasso_alphas[k] = res.lasso_alpha_
        metric = None
        if test is not None:
            metric = test_metric(test, res.coef_, res.intercept_, client, loss)
        records.append(sparse_record(path_record(res, prob, step.seconds, metric)))
        extra.append(path_extra(res, delta))
        why = solver.shortfall(res)
        if why is not None:
            misses.append(Miss(k, delta, why))
        if verbose:
            print(
                f"delta[{k:3d}] {delta:.4e}  nnz {res.n_active_:6d}  fw gap {res.gap_:.2e}"
                f"  iterations {res.n_iter_}"
            )
        if callback is not None:
            callback(k, delta, res)

    walk(solver, ConstrainedProblem(prob, float(grid[0])), grid, float, on_delta)
    warn_misses(misses, grid.shape[0], tol)
    d = {**records_as_arrays(records, prob.p), "alphas": lasso_alphas, "extra": extra}
    out = PathResult.from_checkpoint_arrays(d, l1_ratio=1.0, loss=loss, tol=tol)
    out.deltas_ = grid
    return out
