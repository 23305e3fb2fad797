"""``dl1.path``: the penalised problem's regularisation path, with warm starts, held-out
scores, cross-validation (``cv=``) and a checkpoint that a path resumes from."""

from __future__ import annotations

import dataclasses
import os
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from dl1.cross_validation import cross_validated, handle
from dl1.entry_labels import entry_labels, held_out
from dl1.errors import ValidationError
from dl1.labels import with_classes
from dl1.loading import col_scales
from dl1.multiclass import many_classes, multiclass_scheme
from dl1.multiclass_path import path_multiclass
from dl1.objective.datafits import make_datafit
from dl1.params import PATH, validated
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
from dl1.penalised import check_penalty, make_penalty, n_samples, set_up
from dl1.routing import plan_execution
from dl1.runtime.executor import coordinating
from dl1.solvers.alpha_max import problem_alpha_max
from dl1.solvers.base import Problem, WarmState
from dl1.solvers.options import DEFAULT_MAX_ROUNDS, SolverOptions
from dl1.solvers.registry import make_solver
from dl1.solvers.result import convergence_warning
from dl1.specs import Call, Data, Execution, Grid, Model


@coordinating
@validated(PATH, "dl1.path()")
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
        class is refused). Labels of more than two classes with the logistic loss walk the
        multinomial path of :func:`dl1.path_multiclass` and return its
        :class:`~dl1.multiclass_path.MulticlassPath` (the binary-only settings refused).
    """
    if many_classes(X, y, loss, split):
        if loss != "logistic":
            raise ValidationError(
                f"dl1.path(): with more than two classes the path is the multinomial one "
                f"(loss='logistic'); a one-vs-rest path of loss={loss!r} is not built: fit "
                "each alpha with dl1.fit_multiclass(multi_class='ovr')"
            )
        multiclass_scheme(
            loss, "dl1.path()",
            penalty_factor=penalty_factor, positive=positive, bounds=bounds,
            screen=screen, spread=spread, solver=solver, cv=cv,
            checkpoint=checkpoint, X_test=X_test,
        )  # fmt: skip
        return path_multiclass(
            X, y, alphas=alphas, n_alphas=n_alphas, eps=eps, l1_ratio=l1_ratio,
            sample_weight=sample_weight, fit_intercept=fit_intercept, tol=tol,
            max_rounds=max_rounds or 100, max_epochs=max_epochs or 5000,
            standardize=standardize, n_partitions=n_partitions, stream=stream, client=client,
            split=split,
        )  # fmt: skip
    labels = entry_labels(X, y, loss, split)  # any two labels as -1 / +1, before any work
    X_test, y_test = held_out(labels.X, X_test, y_test, labels)
    if cv is not None and checkpoint is not None:
        raise ValidationError("checkpoint is not available with cv")
    options = SolverOptions(
        max_rounds=max_rounds, max_epochs=max_epochs, random_order=random_order, seed=seed,
        screen=screen, spread=spread, tight_inner=True,
    )  # fmt: skip
    call = PathCall(
        Data(labels.X, labels.y, sample_weight, split, X_test, y_test),
        Model(loss, make_penalty(1.0, l1_ratio, penalty_factor, positive, bounds),
              fit_intercept, standardize, tol),  # fmt: skip
        make_solver(solver, options, make_datafit(loss)),
        Execution(client, n_partitions, stream, verbose, callback, checkpoint),
        Grid(alphas, n_alphas, eps), cv, scoring,
    )
    check_penalty(call.model.penalty, call.solver, standardize)
    res = walked(call) if cv is None else cross_validated_path(call)
    return with_classes(res, labels.classes)


@dataclass(frozen=True)
class PathCall(Call):
    """One :func:`path` call, validated (:mod:`dl1.specs`): its grid and, with ``cv``, its
    cross-validation."""

    grid: Grid = Grid()
    cv: Any = None
    scoring: str | None = None


def cross_validated_path(call: PathCall) -> PathResult:
    """The path of ``call`` on the whole data, its grid cross-validated first on a data
    handle (made here unless ``X`` is one): ``cv_`` holds the folds' scores."""
    data, model, execution = call.data, call.model, call.execution
    with handle(data.X, data.y, execution.client, execution.n_partitions, data.split) as ds:
        cvres = cross_validated(ds, model, call.solver, cv=call.cv, scoring=call.scoring,
                                sample_weight=data.sample_weight, client=execution.client,
                                grid=call.grid)  # fmt: skip
        whole = Data(ds, None, data.sample_weight, data.split, data.X_test, data.y_test)
        res = walked(dataclasses.replace(
            call, data=whole, grid=Grid(cvres.alphas[0]), cv=None,
            execution=dataclasses.replace(execution, n_partitions=ds.n_partitions),
        ))  # fmt: skip
    res.cv_ = cvres
    return res


def walked(call: PathCall) -> PathResult:
    """The functional core of :func:`path` (without ``cv``): ``call`` planned, its problem
    loaded, its alphas solved in turn, each warm-started from the previous one (in one
    piece on a worker when the plan says so)."""
    plan = plan_execution(walked, call)
    if plan.shipped:
        return plan.answer
    problem, _ = set_up(call, plan)
    data, model, execution = call.data, call.model, call.execution
    ex, solver = problem.executor, call.solver
    try:
        grid = _grid(problem, call.grid, model.penalty.l1_ratio)
        test = test_data(data.X, data.X_test, data.y_test)
        ck = _checkpoint(call, plan.inputs, test, problem, grid)
        state, start = _resumed(ck, solver, problem, grid)
        scales = col_scales(ex, problem.blocks) if model.standardize else None
        records: list[dict[str, Any]] = []

        def on_alpha(step: AlphaStep) -> None:
            res, w = step.result, step.result.coef_
            coef = w if scales is None else w * scales
            metric = None
            if test is not None:
                metric = test_metric(test, coef, res.intercept_, execution.client, model.loss)
            rec = dict(
                coef=coef, intercept=res.intercept_, gap=res.gap_, converged=res.converged_,
                n_active=int(np.count_nonzero(w)), passes=res.passes_, seconds=step.seconds,
                rounds=res.n_rounds_, test_metric=metric,
            )  # fmt: skip
            if ck is not None:
                ck.record(step.k, **rec, state=step.state.checkpoint_arrays())
            records.append(sparse_record(rec))
            _report(step, rec, model.tol, execution)

        walk(solver, problem, grid, model.penalty.at, on_alpha, state=state, start=start,
             reproducible=ck is not None)  # fmt: skip
    finally:  # interrupted too: nothing of the solve stays on the workers
        ex.close()
    d = ck.load() if ck is not None else records_as_arrays(records, problem.p)
    res = PathResult.from_checkpoint_arrays(d, alphas=grid, l1_ratio=model.penalty.l1_ratio,
                                            loss=model.loss, tol=model.tol)  # fmt: skip
    res.fit_intercept, res.n_samples_ = model.fit_intercept, n_samples(plan.inputs, problem)
    return res


def _checkpoint(
    call: PathCall, inputs: Any, test: Any, problem: Problem, grid: np.ndarray
) -> PathCheckpoint | None:
    """The path's checkpoint, opened (to resume) or created; None without one."""
    if call.execution.checkpoint is None:
        return None
    return PathCheckpoint.open_or_create(
        call.execution.checkpoint, fingerprint=fingerprint(call.data.X, inputs.y, call.data.split),
        settings=_checkpoint_settings(call, inputs, test), alphas=grid, n_features=problem.p,
    )  # fmt: skip


def _checkpoint_settings(call: PathCall, inputs: Any, test: Any) -> dict[str, Any]:
    """What a path's checkpoint resumes only with: the call's problem and solver settings,
    digests of its weights and test targets, and a weighted penalty's factors and sign."""
    model, solver, penalty = call.model, call.solver, call.model.penalty
    settings = {
        "l1_ratio": penalty.l1_ratio, "loss": model.loss,
        "fit_intercept": model.fit_intercept, "standardize": model.standardize,
        "tol": model.tol,
        "max_rounds": getattr(solver, "max_rounds", DEFAULT_MAX_ROUNDS),
        "n_partitions": call.execution.n_partitions, "solver": solver.name,
        "screen": getattr(solver, "screen", False),
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


def _grid(problem: Problem, grid: Grid, l1_ratio: float) -> np.ndarray:
    """The alphas of the path: given, or ``n_alphas`` from ``alpha_max`` down geometrically."""
    if grid.alphas is not None:
        alphas = np.asarray(grid.alphas, dtype=np.float64).ravel()
        if alphas.size == 0 or not np.all(np.isfinite(alphas)) or np.any(alphas <= 0):
            raise ValueError("alphas must be finite and > 0")
        return alphas
    return alpha_grid(problem_alpha_max(problem, l1_ratio), grid.n_alphas, grid.eps)


def _resumed(
    ck: Any, solver: Any, problem: Problem, grid: np.ndarray
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


def _report(step: AlphaStep, rec: dict[str, Any], tol: float, execution: Execution) -> None:
    """An alpha's warning when not certified, its line, its callback."""
    res = step.result
    if not res.converged_:
        why = res.history_[-1].get("stopped") if res.history_ else None  # stopped early
        warnings.warn(
            f"alpha[{step.k}] = {step.alpha:.6g} is not certified: relative duality gap "
            f"{res.gap_:.3e} > tol {tol:.3e} after {res.n_rounds_} rounds"
            + ("" if why is None else f"; {why}"),
            convergence_warning(),
            stacklevel=4,
        )
    if execution.verbose:
        print(f"alpha[{step.k:3d}] {step.alpha:.4e}  nnz {rec['n_active']:6d}  "
              f"gap {res.gap_:.2e}  passes {rec['passes']}")  # fmt: skip
    if execution.callback is not None:
        execution.callback(step.k, step.alpha, res)
