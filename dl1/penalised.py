"""The penalised problem's entry points: ``dl1.fit``, ``dl1.alpha_max`` and ``dl1.path``
(the functional core of the estimators)."""

from __future__ import annotations

import inspect
import os
import time
import warnings
from typing import Any

import dask
import numpy as np

from dl1.entry_labels import entry_labels, held_out
from dl1.errors import ValidationError
from dl1.inputs import read_inputs
from dl1.labels import with_classes
from dl1.loading import col_scales, decide_stream, load_problem
from dl1.objective.datafits import make_datafit
from dl1.objective.penalties.elastic_net import ElasticNet
from dl1.objective.penalties.weighted import WeightedElasticNet
from dl1.params import PATH, PENALISED, validate_params
from dl1.paths.checkpoint import PathCheckpoint
from dl1.paths.checkpoint_format import solver_settings
from dl1.paths.evaluation import (
    alpha_grid,
    crc,
    fingerprint,
    records_as_arrays,
    sparse_record,
    test_data,
    test_metric,
)
from dl1.paths.loop import AlphaStep, walk
from dl1.paths.result import PathResult
from dl1.routing import check_dataset, read_or_ship
from dl1.runtime.executor import coordinating, executor_for
from dl1.runtime.one_piece import excluded
from dl1.runtime.rpc import rpc_executor
from dl1.solvers.alpha_max import problem_alpha_max
from dl1.solvers.auto import choose_solver
from dl1.solvers.base import Problem, WarmState, solver_class
from dl1.solvers.registry import SOLVERS  # noqa: F401  (solvers load with the entry points)
from dl1.solvers.result import ConvergenceWarning, FitResult


def make_solver(
    solver: str,
    *,
    max_rounds: int | None,
    max_epochs: int | None = None,
    datafit: Any = None,
    **options: Any,
) -> Any:
    """The solver called ``solver`` in :data:`dl1.solvers.registry.SOLVERS` (``"auto"``:
    :func:`dl1.solvers.auto.choose_solver`'s for ``datafit``), configured from the entry
    points' keywords: each solver takes those its constructor names (the working-set solver
    ``screen`` and ``spread``, coordinate descent ``n_epochs``, the sample-wise solvers
    ``max_epochs``, ...); a keyword left to its default (None) is not passed. A solver
    object is used as it is configured."""
    if not isinstance(solver, str):
        return solver
    if solver == "auto":
        solver = choose_solver(datafit)
    cls = solver_class(solver)
    accepted = inspect.signature(cls).parameters
    options["max_rounds"] = 1000 if max_rounds is None else max_rounds
    if max_epochs is not None:
        options["max_epochs"] = max_epochs
    return cls(**{k: v for k, v in options.items() if k in accepted})


def _set_up(
    inputs: Any, ex: Any, stream: bool | None, solver: Any, **settings: Any
) -> tuple[Problem, float]:
    """The out-of-core decision on executor ``ex`` (given direct calls where ``solver``
    gains from them), and the loaded problem with its loading seconds."""
    settings["penalty"].check_features(int(inputs.X.shape[1]))
    streamed = decide_stream(stream, inputs.store, inputs.split, ex, inputs.dataset)
    ex = direct_calls(ex, solver, streamed)
    try:
        return load_problem(inputs, ex, streamed=streamed, layout=solver.layout, **settings)
    except BaseException:  # an error or an interrupt: the servers started meanwhile go
        ex.close()
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


def direct_calls(ex: Any, solver: Any, streamed: bool) -> Any:
    """``ex`` with direct calls to the workers' partition servers when the solver's rounds
    gain from them (blocks in worker memory, gathered subproblems), unless Dask's
    configuration says ``dl1.direct-calls: False`` (every step a Dask task)."""
    if streamed or not solver.direct_calls or not dask.config.get("dl1.direct-calls", True):
        return ex
    return rpc_executor(ex)


@coordinating
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
) -> FitResult:
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
    client : distributed.Client, optional
        The cluster to run on; by default the current Dask client (as ``dask.compute``:
        ``distributed.default_client()``), and in this process when there is none.
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
        labels -1 / +1).
    """
    call = dict(locals())
    validate_params(PENALISED, call, "dl1.fit()")
    labels = entry_labels(X, y, loss, split)  # any two labels as -1 / +1, before any work
    call.update(X=labels.X, y=labels.y)
    solver_obj = make_solver(
        solver, max_rounds=max_rounds, max_epochs=max_epochs, datafit=make_datafit(loss),
        n_epochs=n_epochs,
        random_order=random_order, seed=seed, screen=screen, spread=spread, verbose=verbose,
        callback=callback,
    )  # fmt: skip
    penalty = make_penalty(alpha, l1_ratio, penalty_factor, positive, bounds)
    check_penalty(penalty, solver_obj, standardize)
    refusal = excluded(stream=stream, verbose=verbose)
    ready = read_or_ship("fit", call, solver_obj, refusal)
    if ready.shipped:
        return with_classes(ready.result, labels.classes)
    inputs, ex = ready.inputs, ready.ex
    problem, t_load = _set_up(
        inputs, ex, stream, solver_obj, penalty=penalty,
        fit_intercept=fit_intercept, standardize=standardize, tol=tol,
        n_partitions=n_partitions, loss=loss,
    )  # fmt: skip
    ex = problem.executor
    t0 = time.perf_counter()
    warm = None
    if coef_init is not None or intercept_init is not None:
        warm = warm_state(problem, solver_obj, coef_init, intercept_init, standardize)
    try:
        res, state = solver_obj.solve(problem, warm)
        solver_obj.release(problem, state)
    finally:  # interrupted too: nothing of the solve stays on the workers
        ex.close()
    res.load_seconds_ = t_load
    res.solve_seconds_ = time.perf_counter() - t0
    res.n_samples_ = n_samples(inputs, problem)
    if standardize:
        res.coef_ = res.coef_ * col_scales(ex, problem.blocks)
    return with_classes(res, labels.classes)


def warm_state(
    problem: Problem, solver: Any, coef: Any, intercept: float | None, standardize: bool
) -> WarmState:
    """The solver's state at ``coef`` (input scale; None: zeros) and ``intercept`` (None:
    the intercept of ``w = 0``), with ``z = X w + b`` computed on the workers."""
    from dl1.solvers.result import coef_by_block
    from dl1.tasks.passes import matvec_task
    from dl1.tasks.rows import rows_matvec_task

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
    validate_params(PENALISED, locals(), "dl1.alpha_max()")
    labels = entry_labels(X, y, loss, split)  # any two labels as -1 / +1
    inputs = read_inputs(labels.X, labels.y, sample_weight, loss, split)
    check_dataset(inputs, client, inputs.dataset.n_partitions if inputs.dataset else 2)
    ex = executor_for(client)
    streamed = decide_stream(stream, inputs.store, split, ex, inputs.dataset)
    n_parts = inputs.dataset.n_partitions if inputs.dataset else max(1, ex.n_workers)
    penalty = make_penalty(1.0, l1_ratio, penalty_factor, positive, bounds)
    penalty.check_features(int(inputs.X.shape[1]))
    problem, _ = load_problem(
        inputs, ex, penalty=penalty, fit_intercept=fit_intercept,
        standardize=standardize, tol=1.0, n_partitions=n_parts, loss=loss, streamed=streamed,
    )  # fmt: skip
    return problem_alpha_max(problem, l1_ratio)


@coordinating
def path(
    X: Any,
    y: Any = None,
    *,
    n_alphas: int = 100,
    eps: float = 1e-2,
    alphas: Any = None,
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
    client: Any = None,
    screen: bool = False,
    stream: bool | None = None,
    spread: bool | str | None = None,
    checkpoint: str | os.PathLike | None = None,
    X_test: Any = None,
    y_test: Any = None,
    split: str = "train",
    verbose: bool = False,
    callback: Any = None,
    solver: str = "ws",
    random_order: bool = False,
    seed: int = 0,
    cv: Any = None,
    scoring: str | None = None,
) -> PathResult:
    """Regularisation path: warm-started, every alpha certified by its duality gap.

    Parameters
    ----------
    X, y, l1_ratio, loss, fit_intercept, standardize, sample_weight, tol, max_rounds,
    n_partitions, client, split
        As in :func:`dl1.fit`.
    stream : bool, optional
        Out-of-core mode, as in :func:`dl1.fit` (default: decided from the size of the
        blocks and the workers' memory limits). Each pass then reads the blocks it visits
        from the store; blocks whose columns are all screened out are not read.
    spread : bool or "cocoa", optional
        Working-set subproblems spread over the partitions' workers, as in :func:`dl1.fit`.
    n_alphas, eps : grid from ``alpha_max`` down to ``eps * alpha_max`` (geometric).
    alphas : array_like, optional
        Explicit grid (sorted decreasing for warm starts to help).
    screen : bool
        Gap-safe screening (Lasso and L1-logistic): sequential between alphas (the first
        pass of an alpha already applies the sphere of the previous alpha's solution) and
        dynamic within one (every pass applies the sphere of the previous pass's point, see
        :func:`dl1.fit`).
    checkpoint : path, optional
        A zarr group where each alpha's result is written atomically before the next starts;
        an interrupted path resumes there (redoing at most the alpha in progress, with
        bit-identical results). A checkpoint of other data, settings or versions is refused.
    X_test, y_test : held-out data for the validation error per alpha (a store's split name,
        e.g. ``X_test="test"`` with a store X, is accepted too).
    callback : callable, optional
        Called after each alpha with ``(k, alpha, result)``.
    solver : {"ws", "cd"}
        As in :func:`dl1.fit`. The constrained path in ``delta`` is
        :func:`dl1.path_constrained`.
    random_order, seed : bool, int
        Coordinate order of the solver's epochs, as in :func:`dl1.fit`.
    cv : int, scikit-learn splitter or iterable of (train, test), optional
        Cross-validate the grid first (:mod:`dl1.paths.cv`): one path per fold on a data
        handle (:func:`dl1.persist`, made here unless ``X`` is one), the folds side by side;
        the result's ``cv_`` holds the held-out scores and the chosen alphas.
    scoring : {"mse", "accuracy", "neg_log_loss"}, optional
        The held-out metric of ``cv`` (default: "mse" for the squared loss, "accuracy"
        otherwise).

    Returns
    -------
    dl1.paths.PathResult
        With a classification loss, ``classes_`` holds the two labels, as :func:`dl1.fit`'s
        (held-out labels ``y_test`` are mapped as the training labels; a value of neither
        class is refused).
    """
    call = dict(locals())
    validate_params(PATH, call, "dl1.path()")
    labels = entry_labels(X, y, loss, split)  # any two labels as -1 / +1, before any work
    X, y = labels.X, labels.y
    X_test, y_test = held_out(X, X_test, y_test, labels)
    call.update(X=X, y=y, X_test=X_test, y_test=y_test)
    base = make_penalty(1.0, l1_ratio, penalty_factor, positive, bounds)
    if cv is not None:
        if checkpoint is not None:
            raise ValidationError("checkpoint is not available with cv")
        settings = dict(
            n_alphas=n_alphas, eps=eps, alphas=alphas, l1_ratio=l1_ratio, loss=loss,
            fit_intercept=fit_intercept, standardize=standardize, tol=tol,
            max_rounds=max_rounds, client=client, screen=screen, solver=solver,
            random_order=random_order, seed=seed, X_test=X_test, y_test=y_test,
            verbose=verbose, callback=callback, penalty_factor=penalty_factor,
            positive=positive, bounds=bounds,
        )  # fmt: skip
        from dl1.cross_validation import cross_validated, handle

        with handle(X, y, client, n_partitions, split) as ds:
            cvres = cross_validated(ds, cv=cv, scoring=scoring, sample_weight=sample_weight,
                                    **settings)  # fmt: skip
            res = path(ds, sample_weight=sample_weight, n_partitions=ds.n_partitions,
                       **{**settings, "alphas": cvres.alphas[0]})  # fmt: skip
        res.cv_ = cvres
        return with_classes(res, labels.classes)
    solver_obj = make_solver(
        solver, max_rounds=max_rounds, max_epochs=max_epochs, datafit=make_datafit(loss),
        random_order=random_order,
        seed=seed, screen=screen, spread=spread,
        # warm-started from the previous alpha, the working set is usually right: its
        # subproblem is solved to the target gap at once (one pass per alpha, not two)
        tight_inner=True,
    )  # fmt: skip
    check_penalty(base, solver_obj, standardize)
    refusal = excluded(stream=stream, checkpoint=checkpoint, verbose=verbose)
    ready = read_or_ship("path", call, solver_obj, refusal)
    if ready.shipped:
        return with_classes(ready.result, labels.classes)
    inputs, ex = ready.inputs, ready.ex
    problem, _ = _set_up(
        inputs, ex, stream, solver_obj, penalty=base,
        fit_intercept=fit_intercept, standardize=standardize, tol=tol,
        n_partitions=n_partitions, loss=loss,
    )  # fmt: skip
    ex = problem.executor
    try:
        grid = _grid(problem, alphas, n_alphas, eps, l1_ratio)
        test = test_data(X, X_test, y_test)
        settings = _checkpoint_settings(call, inputs, test, solver_obj, base)
        ck = None
        if checkpoint is not None:
            ck = PathCheckpoint.open_or_create(
                checkpoint, fingerprint=fingerprint(X, inputs.y, split), settings=settings,
                alphas=grid, n_features=problem.p,
            )  # fmt: skip
        state, start = _resumed(ck, solver_obj, problem, grid, l1_ratio)
        scales = col_scales(ex, problem.blocks) if standardize else None
        records: list[dict[str, Any]] = []

        def on_alpha(step: AlphaStep) -> None:
            res, w = step.result, step.result.coef_
            coef = w if scales is None else w * scales
            metric = None if test is None else test_metric(test, coef, res.intercept_, client, loss)
            rec = dict(
                coef=coef, intercept=res.intercept_, gap=res.gap_, converged=res.converged_,
                n_active=int(np.count_nonzero(w)), passes=res.passes_, seconds=step.seconds,
                rounds=res.n_rounds_, test_metric=metric,
            )  # fmt: skip
            if ck is not None:
                ck.record(step.k, **rec, state=step.state.checkpoint_arrays())
            records.append(sparse_record(rec))
            _report(step, rec, tol, verbose, callback)

        penalty_at = base.at
        walk(solver_obj, problem, grid, penalty_at, on_alpha, state=state, start=start,
             reproducible=ck is not None)  # fmt: skip
    finally:  # interrupted too: nothing of the solve stays on the workers
        ex.close()
    d = ck.load() if ck is not None else records_as_arrays(records, problem.p)
    res = PathResult.from_checkpoint_arrays(d, alphas=grid, l1_ratio=l1_ratio, loss=loss, tol=tol)
    res.fit_intercept, res.n_samples_ = fit_intercept, n_samples(inputs, problem)
    return with_classes(res, labels.classes)


def _checkpoint_settings(
    call: dict[str, Any], inputs: Any, test: Any, solver: Any, penalty: ElasticNet
) -> dict[str, Any]:
    """What a path's checkpoint resumes only with: the call's problem and solver settings,
    digests of its weights and test targets, and a weighted penalty's factors and sign."""
    settings = {
        "l1_ratio": call["l1_ratio"], "loss": call["loss"],
        "fit_intercept": call["fit_intercept"], "standardize": call["standardize"],
        "tol": call["tol"],
        "max_rounds": 1000 if call["max_rounds"] is None else call["max_rounds"],
        "n_partitions": call["n_partitions"], "solver": call["solver"],
        "screen": call["screen"],
        "sample_weight": None if inputs.weights is None else crc(inputs.sample_weight),
        "test": None if test is None else crc(np.asarray(test[1])),
        "solver_options": solver_settings(solver),
    }  # fmt: skip
    if not penalty.uniform:
        factors, box = penalty.factors, penalty.bounds  # empty: all 1, none
        settings["penalty"] = {
            "positive": penalty.positive,
            "penalty_factor": crc(factors) if factors.size else None,
        }
        if box.size and not penalty.positive:
            settings["penalty"]["bounds"] = crc(box)
    return settings


def n_samples(inputs: Any, problem: Problem) -> int:
    """Rows of the data fitted: a Dataset view's own (its problem holds all rows)."""
    return problem.n if inputs.dataset is None else int(inputs.dataset.shape[0])


def _grid(problem: Problem, alphas: Any, n_alphas: int, eps: float, l1_ratio: float) -> np.ndarray:
    """The alphas of the path: given, or ``n_alphas`` from ``alpha_max`` down geometrically."""
    if alphas is not None:
        grid = np.asarray(alphas, dtype=np.float64).ravel()
        if grid.size == 0 or not np.all(np.isfinite(grid)) or np.any(grid <= 0):
            raise ValueError("alphas must be finite and > 0")
        return grid
    return alpha_grid(problem_alpha_max(problem, l1_ratio), n_alphas, eps)


def _resumed(
    ck: Any, solver: Any, problem: Problem, grid: np.ndarray, l1_ratio: float
) -> tuple[WarmState | None, int]:
    """Where a checkpointed path resumes: the solver's state after the last completed alpha
    (bit for bit) and the next alpha's index; ``(None, 0)`` for a fresh path."""
    if ck is None or not ck.n_done:
        return None, 0
    start = ck.n_done
    intercept = float(ck.load()["intercepts"][start - 1])
    # checked (lengths, finiteness) before any kernel sees them: the checkpoint is untrusted
    lengths = {"w": problem.p, "z": problem.n, "xt_bound": 1}
    arrays = ck.state(start - 1, lengths=lengths, required=("w", "z"))
    at = problem.at(problem.penalty.at(float(grid[start - 1])))
    return solver.restore(at, arrays, intercept), start


def _report(step: AlphaStep, rec: dict[str, Any], tol: float, verbose: bool, callback: Any):
    """An alpha's warning when not certified, its line, its callback."""
    res = step.result
    if not res.converged_:
        why = res.history_[-1].get("stopped") if res.history_ else None  # stopped early
        warnings.warn(
            f"alpha[{step.k}] = {step.alpha:.6g} is not certified: relative duality gap "
            f"{res.gap_:.3e} > tol {tol:.3e} after {res.n_rounds_} rounds"
            + ("" if why is None else f"; {why}"),
            ConvergenceWarning,
            stacklevel=4,
        )
    if verbose:
        print(f"alpha[{step.k:3d}] {step.alpha:.4e}  nnz {rec['n_active']:6d}  "
              f"gap {res.gap_:.2e}  passes {rec['passes']}")  # fmt: skip
    if callback is not None:
        callback(step.k, step.alpha, res)
