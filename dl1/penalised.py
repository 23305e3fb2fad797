"""The penalised problem's entry points ``dl1.fit`` and ``dl1.alpha_max`` (used by the
estimators), each a thin shell that validates its keywords once, builds the call's record
(:class:`FitCall`) and hands it to its functional core (:func:`fitted`); and the set-up
they share with ``dl1.path`` (:mod:`dl1.penalised_path`) and cross-validation
(:mod:`dl1.cross_validation`)."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from dl1.entry_labels import entry_labels
from dl1.errors import ValidationError
from dl1.inputs import read_inputs
from dl1.labels import with_classes
from dl1.loading import col_scales, decide_stream, load_problem
from dl1.multiclass import fit_multiclass, many_classes, multiclass_scheme
from dl1.objective.datafits import make_datafit
from dl1.objective.penalties.elastic_net import ElasticNet
from dl1.objective.penalties.weighted import WeightedElasticNet
from dl1.params import PENALISED, validated
from dl1.routing import Plan, check_dataset, plan_execution
from dl1.runtime.executor import coordinating, executor_for
from dl1.solvers.alpha_max import problem_alpha_max
from dl1.solvers.base import Problem, WarmState
from dl1.solvers.multiclass import MulticlassResult
from dl1.solvers.options import SolverOptions
from dl1.solvers.ovr import OvrResult
from dl1.solvers.registry import make_solver
from dl1.solvers.result import FitResult, coef_by_block
from dl1.specs import Call, Data, Execution, Model, solver_with_callback
from dl1.tasks.passes import matvec_task
from dl1.tasks.rows import rows_matvec_task


@dataclass(frozen=True)
class FitCall(Call):
    """One :func:`fit` call, validated (:mod:`dl1.specs`), with its warm start."""

    coef_init: Any = None
    intercept_init: float | None = None

    @property
    def callback(self) -> Any:
        return getattr(self.solver, "callback", None)  # called per round by the solver

    def with_callback(self, callback: Any) -> FitCall:
        return dataclasses.replace(self, solver=solver_with_callback(self.solver, callback))


def set_up(call: Call, plan: Plan) -> tuple[Problem, float]:
    """The problem of ``call`` loaded as ``plan`` says, with its loading seconds (the
    servers started for it closed if loading fails or is interrupted)."""
    model = call.model
    try:
        return load_problem(
            plan.inputs, plan.ex, penalty=model.penalty, fit_intercept=model.fit_intercept,
            standardize=model.standardize, tol=model.tol,
            n_partitions=call.execution.n_partitions, loss=model.loss,
            streamed=plan.streamed, layout=call.solver.layout,
        )  # fmt: skip
    except BaseException:
        plan.ex.close()
        raise


def make_penalty(
    alpha: float, l1_ratio: float, penalty_factor: Any, positive: bool, bounds: Any = None
) -> ElasticNet:
    """The penalty of a call: the elastic net, or with per-feature factors, ``positive`` or
    ``bounds`` the weighted one (checked here, before any work)."""
    if penalty_factor is None and not positive and bounds is None:
        return ElasticNet(alpha, l1_ratio)
    return WeightedElasticNet(alpha, l1_ratio, penalty_factor, positive, bounds)


def check_penalty(penalty: ElasticNet, solver: Any, standardize: bool = False) -> None:
    """Refuse per-feature factors and bounds for the solvers without them: the working-set
    solver fits them, without screening (its sphere test is the plain penalty's). Finite
    bounds other than 0 are refused with ``standardize`` (they would bound the
    standardised coefficients, not the ones returned)."""
    if penalty.uniform:
        return
    if solver.name != "ws" or getattr(solver, "screen", False):
        raise ValidationError(
            "penalty_factor, positive and bounds are fitted by solver='ws' without "
            f"screening, not solver={solver.name!r}"
            + (" with screen=True" if solver.name == "ws" else "")
        )
    if getattr(solver, "spread", None) == "cocoa":
        raise ValidationError("penalty_factor, positive and bounds: spread='cocoa' has one "
                              "penalty")  # fmt: skip
    box = penalty.bounds
    if standardize and np.any(np.isfinite(box) & (box != 0.0)):
        raise ValidationError("bounds other than 0 with standardize=True: the bounds would "
                              "hold for the standardised coefficients; scale X yourself or "
                              "give standardize=False")  # fmt: skip


@coordinating
@validated(PENALISED, "dl1.fit()")
def fit(
    X: Any,
    y: Any = None,
    *,
    alpha: float,
    l1_ratio: float = 1.0,
    penalty_factor: Any = None,
    positive: bool = False,
    bounds: Any = None,
    loss: str = "squared",
    fit_intercept: bool = True,
    standardize: bool = False,
    sample_weight: Any = None,
    tol: float = 1e-4,
    max_rounds: int | None = None,
    max_epochs: int | None = None,
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
    coef_init: Any = None,
    intercept_init: float | None = None,
) -> FitResult | MulticlassResult | OvrResult:
    """Fit an L1 / elastic-net linear model, certified by its duality gap.

    Minimises ``F(X w + b) + alpha * (l1_ratio ||w||_1 + (1 - l1_ratio) / 2 ||w||_2^2)`` with
    ``F`` the mean squared loss ``1/(2n) ||y - X w - b||^2`` (scikit-learn's ElasticNet
    convention) or the mean logistic loss (labels -1 and +1, or any two numbers), weighted by
    ``sample_weight`` (normalised to sum to n). The constrained problem (``||w||_1 <=
    delta``) has its own entry point, :func:`dl1.fit_constrained`.

    Parameters
    ----------
    X : dask array (scipy.sparse, pydata sparse or dense chunks), dl1 Store, store path,
        scipy.sparse matrix or ndarray
        Each column chunk of a dask array is a feature block.
    y : array_like or dask array, optional
        Targets; read from the store when X is a store (or from the Dataset). A
        classification loss takes any two numbers as labels: they are mapped to -1 / +1
        before any work (the larger to +1, as scikit-learn's ``classes_[1]``;
        :mod:`dl1.labels`) and the result predicts and scores in them (``classes_``).
    alpha, l1_ratio : float
        Penalty strength (> 0) and mix (1.0: Lasso / L1 logistic).
    penalty_factor : array_like (p,), optional
        Per-feature factors ``f_j >= 0`` of the penalty, ``alpha sum_j f_j (l1_ratio |w_j| +
        (1 - l1_ratio) / 2 w_j^2)`` (glmnet's ``penalty.factor``, not rescaled); 0 leaves a
        feature unpenalised (smooth losses, not with ``positive``; ``alpha_max`` and the
        gap are then those of the penalised features, the free ones at their optimum).
    positive : bool
        Coefficients kept ``>= 0`` (scikit-learn's ``positive``, glmnet's ``lower.limits =
        0``): ``bounds=(0, None)``.
    bounds : (lower, upper), optional
        Box constraints ``lower_j <= w_j <= upper_j`` (glmnet's ``lower.limits`` /
        ``upper.limits``): each a number, an array of one bound per feature or None
        (unbounded), with ``lower <= 0 <= upper``; not with ``standardize`` (other than
        ``0``). Factors, ``positive`` and bounds are fitted by ``solver="ws"`` without
        screening; the certificate counts the bounds (a finite bound makes its side of the
        dual finite).
    loss : {"squared", "logistic", "hinge", "smooth_hinge"}
        The hinge (``max(0, 1 - y z)``) is not smooth: ``"smoothing"`` certifies it at
        ``tol`` (``"auto"`` picks it), the sample-wise solvers take it too; the smoothed
        hinge (Shalev-Shwartz & Zhang, ``gamma = 1``) is smooth, for every solver.
    fit_intercept : bool
        Fit an unpenalised intercept.
    standardize : bool
        Penalise coefficients of features scaled to unit (weighted) standard deviation,
        implicitly (never densifying X); ``coef_`` is returned in the input's scale.
    sample_weight : array_like, optional
    tol : float in (0, 1)
        Stop when the duality gap is ``<= tol * P(0)`` (``tol >= 1`` would accept ``w = 0``
        whatever the data: its gap is at most ``P(0)``).
    max_rounds : int, optional
        Round limit (default 1000); reaching it warns (ConvergenceWarning) with the gap.
    max_epochs : int, optional
        The sample-wise solvers (``"sdca"``, ``"sgd"``, ``"fobos"``, ``"rda"``,
        ``"smidas"``): passes over the data at most (default 20; 100 rounds for
        ``"sdca"``); reaching it warns with the gap.
    n_partitions : int
        Groups of feature blocks whose updates are added each round (CoCoA+ sigma'); fixed
        by the caller, not by the cluster, so results do not depend on the workers.
    n_epochs : int
        ``solver="cd"``: local coordinate-descent epochs per round.
    random_order, seed : bool, int
        Uniformly random coordinate order (stochastic coordinate descent), and its seed.
    solver : {"ws", "smoothing", "cd", "sdca", "sgd", "fobos", "rda", "smidas", "auto"}, or object
        A name, or a solver configured beyond these keywords (e.g.
        ``dl1.solvers.rda.RDASolver(rho=0.005)``).
        ``"ws"``: working sets (:class:`dl1.solvers.ws.WorkingSetSolver`): each round is one
        pass that certifies the current point and picks the features whose subproblem is
        then solved. ``"cd"``: CoCoA+ coordinate descent on every partition each round
        (:class:`dl1.solvers.cd.CoordinateDescentSolver`). ``"sgd"`` / ``"fobos"``: epochs
        of stochastic steps over row blocks with lazy elastic-net updates, the partitions'
        models averaged per epoch, each epoch certified
        (:class:`dl1.solvers.sgd.StochasticGradientSolver`). ``"rda"``: l1-regularised dual
        averaging (sparser models along the way); ``"smidas"``: mirror descent for L1
        problems with very many features; ``"sdca"``: Prox-SDCA with CoCoA+ rounds
        (linear rate with a ridge part); ``"smoothing"``: the hinge, by exact LPs on
        working sets (pure L1) or continuation over the smoothed hinge. ``"auto"``: the
        rule of :mod:`dl1.solvers.auto` (``"ws"`` for smooth losses, ``"smoothing"`` for
        the hinge). Each solver's docstring says when to use it.
    screen : bool
        ``"ws"``: gap-safe sphere screening (Lasso and L1-logistic).
    stream : bool, optional
        Out of core (X a store): every task reads the blocks it needs and drops them.
        None: when the blocks would take more than half of the workers' memory for data.
    spread : bool or "cocoa", optional
        ``"ws"``: solve working-set subproblems where their columns were extracted instead
        of gathering them on one worker (None: out of core, when they would not fit).
    client : distributed.Client or str, optional
        The cluster to run on; by default the current Dask client (as ``dask.compute``:
        ``distributed.default_client()``), and in this process when there is none. An
        address (``"tcp://host:8786"``) is connected to for the call, with Dask's configured
        security (``distributed.comm.tls.*``).
    split : str
        Split of a store to fit on.
    verbose, callback : a line, or a call with the history entry, per round.
    coef_init, intercept_init : array_like (p,) and float, optional
        Warm start: the solve starts from these coefficients (in the input's scale) and
        intercept, e.g. a previous fit's at a nearby alpha; the answer is certified the same.

    Returns
    -------
    FitResult
        With a classification loss, ``classes_`` holds the two labels (``[-1.0, 1.0]`` for
        labels -1 / +1). Labels of more than two classes fit the multiclass model of
        :func:`dl1.fit_multiclass` (the logistic loss: multinomial; the hinges:
        one-vs-rest) and return its result (``standardize`` too); the binary-only settings
        (``penalty_factor``, bounds, screening, warm starts, other solvers) are refused.
    """
    if many_classes(X, y, loss, split):
        scheme = multiclass_scheme(
            loss, "dl1.fit()", penalty_factor=penalty_factor, positive=positive,
            bounds=bounds, screen=screen, spread=spread,
            coef_init=coef_init, intercept_init=intercept_init, solver=solver,
        )  # fmt: skip
        return fit_multiclass(
            X, y, alpha=alpha, l1_ratio=l1_ratio, **scheme, sample_weight=sample_weight,
            fit_intercept=fit_intercept, tol=tol, max_rounds=max_rounds or 100,
            max_epochs=max_epochs or 5000, standardize=standardize, n_partitions=n_partitions,
            stream=stream, client=client, split=split, verbose=verbose, callback=callback,
        )  # fmt: skip
    labels = entry_labels(X, y, loss, split)  # any two labels as -1 / +1, before any work
    options = SolverOptions(
        max_rounds=max_rounds, max_epochs=max_epochs, n_epochs=n_epochs,
        random_order=random_order, seed=seed, screen=screen, spread=spread, verbose=verbose,
        callback=callback,
    )  # fmt: skip
    call = FitCall(
        Data(labels.X, labels.y, sample_weight, split),
        Model(loss, make_penalty(alpha, l1_ratio, penalty_factor, positive, bounds),
              fit_intercept, standardize, tol),  # fmt: skip
        make_solver(solver, options, make_datafit(loss)),
        Execution(client, n_partitions, stream, verbose),
        coef_init, intercept_init,
    )
    check_penalty(call.model.penalty, call.solver, standardize)
    return with_classes(fitted(call), labels.classes)


def fitted(call: FitCall) -> FitResult:
    """The functional core of :func:`fit`: ``call`` planned, its problem loaded and solved
    (in one piece on a worker when the plan says so), certified by the solver."""
    plan = plan_execution(fitted, call)
    if plan.shipped:
        return plan.answer
    problem, t_load = set_up(call, plan)
    ex, model = problem.executor, call.model
    t0 = time.perf_counter()
    warm = None
    if call.coef_init is not None or call.intercept_init is not None:
        warm = warm_state(problem, call.solver, call.coef_init, call.intercept_init,
                          model.standardize)  # fmt: skip
    try:
        res, state = call.solver.solve(problem, warm)
        call.solver.release(problem, state)
    finally:  # interrupted too: nothing of the solve stays on the workers
        ex.close()
    res.load_seconds_ = t_load
    res.solve_seconds_ = time.perf_counter() - t0
    res.n_samples_ = n_samples(plan.inputs, problem)
    if model.standardize:
        res.coef_ = res.coef_ * col_scales(ex, problem.blocks)
    return res


def warm_state(
    problem: Problem, solver: Any, coef: Any, intercept: float | None, standardize: bool
) -> WarmState:
    """The solver's state at ``coef`` (input scale; None: zeros) and ``intercept`` (None:
    the intercept of ``w = 0``), with ``z = X w + b`` computed on the workers."""
    pb, ex = problem, problem.executor
    w = np.zeros(pb.p) if coef is None else np.asarray(coef, dtype=np.float64).ravel()
    if w.shape[0] != pb.p or not np.isfinite(w).all():
        raise ValidationError(f"coef_init must be {pb.p} finite values (one per feature)")
    b = pb.initial_intercept() if intercept is None else float(intercept)
    b = b if pb.fit_intercept else 0.0
    if pb.rows is not None:
        parts = ex.gather([ex.submit_to(q, rows_matvec_task, [pb.rows.blocks[i] for i in part],
                                        w, b) for q, part in enumerate(pb.rows.parts)])  # fmt: skip
        z = np.concatenate([seg for part in parts for seg in part])
    else:
        scales = col_scales(ex, pb.blocks) if standardize else None
        if scales is not None:  # the solver's scale: coef = w_solver * scale
            if np.any((scales == 0) & (w != 0)):
                raise ValidationError("coef_init is nonzero on a constant (unscaled) feature")
            w = np.divide(w, scales, out=np.zeros_like(w), where=scales > 0)
        z = np.full(pb.n, b)
        for q, part in enumerate(pb.partitions):
            pieces = coef_by_block(w, pb.col_bounds, part)
            z += ex.gather([ex.submit_to(q, matvec_task, [pb.blocks[j] for j in part], pieces,
                                         pb.n)])[0]  # fmt: skip
    return solver.restore(pb, {"w": w, "z": z}, b)


@coordinating
@validated(PENALISED, "dl1.alpha_max()")
def alpha_max(
    X: Any,
    y: Any = None,
    *,
    l1_ratio: float = 1.0,
    penalty_factor: Any = None,
    positive: bool = False,
    bounds: Any = None,
    loss: str = "squared",
    fit_intercept: bool = True,
    standardize: bool = False,
    sample_weight: Any = None,
    client: Any = None,
    split: str = "train",
    stream: bool | None = None,
) -> float:
    """Smallest ``alpha`` whose solution is ``w = 0``: ``||X^T grad F(b0)||_inf / l1_ratio``
    (with ``penalty_factor``, ``positive`` or ``bounds``, the weighted penalty's:
    ``max_j e_j / f_j``, ``e_j`` the largest of ``x_j^T grad`` and its opposite over the
    sides whose bound is not 0; the positive part of ``x_j^T grad`` under ``positive``).

    One pass over the data (per-block reductions on the workers; ``stream`` as in
    :func:`fit`; any two labels of a classification loss are mapped to -1 / +1 as there).
    """
    labels = entry_labels(X, y, loss, split)  # any two labels as -1 / +1
    data = Data(labels.X, labels.y, sample_weight, split)
    model = Model(loss, make_penalty(1.0, l1_ratio, penalty_factor, positive, bounds),
                  fit_intercept, standardize)  # fmt: skip
    return largest_alpha(data, model, Execution(client, stream=stream))


def largest_alpha(data: Data, model: Model, execution: Execution) -> float:
    """The core of :func:`alpha_max`: one pass over ``data`` for ``model``'s penalty (its
    ``l1_ratio`` and weights), on the partitions of a data handle or one per worker."""
    inputs = read_inputs(data.X, data.y, data.sample_weight, model.loss, data.split)
    n_parts = inputs.dataset.n_partitions if inputs.dataset else None
    check_dataset(inputs, execution.client, n_parts or 2)
    ex = executor_for(execution.client)
    streamed = decide_stream(execution.stream, inputs.store, data.split, ex, inputs.dataset)
    model.penalty.check_features(int(inputs.X.shape[1]))
    problem, _ = load_problem(
        inputs, ex, penalty=model.penalty, fit_intercept=model.fit_intercept,
        standardize=model.standardize, tol=1.0, n_partitions=n_parts or max(1, ex.n_workers),
        loss=model.loss, streamed=streamed,
    )  # fmt: skip
    return problem_alpha_max(problem, model.penalty.l1_ratio)


def n_samples(inputs: Any, problem: Problem) -> int:
    """Rows of the data fitted: a Dataset view's own (its problem holds all rows)."""
    return problem.n if inputs.dataset is None else int(inputs.dataset.shape[0])
