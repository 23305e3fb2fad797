"""Cross-validated fits: the functional core of the CV estimators and of ``dl1.path(cv=)``.

:func:`fit_cv` cross-validates a grid of alphas (and of ``l1_ratio`` values) with one
warm-started path per fold on a data handle (:mod:`dl1.paths.cv`), chooses, and refits on
all rows at the choice, reading the store once in all (the handle is made here unless ``X``
is one). The grid, as scikit-learn's ``LassoCV``: ``n_alphas`` values from the whole data's
``alpha_max`` down to ``eps`` times it; the classifiers cross-validate ``C`` values, whose
alpha ``1 / (C * training weight)`` differs by fold as in scikit-learn.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from dl1.dataset import Dataset, persist
from dl1.entry_labels import entry_labels
from dl1.errors import ValidationError
from dl1.inputs import as_vector, read_inputs
from dl1.labels import with_classes
from dl1.objective.datafits import datafit_class, make_datafit
from dl1.params import PATH, validated
from dl1.paths.cv import SCORINGS, CVResult, cross_validate, make_folds, path_runner
from dl1.paths.evaluation import alpha_grid
from dl1.penalised import (
    FitCall,
    check_penalty,
    fitted,
    largest_alpha,
    make_penalty,
    set_up,
)
from dl1.routing import Plan, check_call, direct_calls
from dl1.runtime import one_piece
from dl1.runtime.executor import coordinating, executor_for
from dl1.solvers.base import Problem
from dl1.solvers.options import SolverOptions
from dl1.solvers.registry import make_solver
from dl1.solvers.result import FitResult
from dl1.specs import Call, Data, Execution, Grid, Model


@dataclass(frozen=True)
class CrossValidatedFit:
    """What :func:`fit_cv` returns.

    Attributes
    ----------
    cv : list of CVResult
        One per ``l1_ratio`` (in the order given): the folds' held-out scores per alpha.
    best : int
        Index in ``cv`` (and in ``l1_ratios``) of the chosen ``l1_ratio``.
    l1_ratios : ndarray
    alpha, alpha_1se : float
        The chosen alpha (best mean held-out score) and glmnet's one-standard-error alpha,
        on the whole data's scale (for the classifiers' ``C`` grid: ``1 / (C_ * weight)``).
    index, index_1se : int
        Their grid indices.
    fit : FitResult or None
        The refit on all rows at ``alpha`` (None with ``refit=False``); its ``classes_``
        are :attr:`classes`.
    classes : ndarray (2,) or None
        A classification loss's two labels, sorted (the second is +1 in the fits; ``[-1.0,
        1.0]`` for labels -1 / +1); None for the other losses.
    """

    cv: list[CVResult]
    best: int
    l1_ratios: np.ndarray
    alpha: float
    alpha_1se: float
    index: int
    index_1se: int
    fit: FitResult | None
    classes: np.ndarray | None = None

    @property
    def l1_ratio(self) -> float:
        return float(self.l1_ratios[self.best])


@contextlib.contextmanager
def handle(X: Any, y: Any, client: Any, n_partitions: int, split: str) -> Iterator[Any]:
    """``X`` as a :class:`~dl1.dataset.Dataset`: itself if it is one (given no ``y``), or
    one persisted here and released at the end."""
    if isinstance(X, Dataset):
        if y is not None:
            raise ValidationError("y comes with the Dataset; pass y to dl1.persist")
        yield X
        return
    ds = persist(X, y, client=client, n_partitions=n_partitions, split=split)
    try:
        yield ds
    finally:
        ds.release()


def cross_validated(
    ds: Any,
    model: Model,
    solver: Any,
    *,
    cv: Any,
    scoring: str | None,
    sample_weight: Any,
    client: Any,
    grid: Grid,
    Cs: Any = None,
) -> CVResult:
    """Cross-validation of one grid on the data handle ``ds`` (:mod:`dl1.paths.cv`): each
    fold's path of ``model`` (its penalty at alpha 1) solved by ``solver``, warm-started
    from alpha to alpha. The grid is ``grid``'s alphas, or its ``n_alphas`` from the whole
    data's ``alpha_max`` down to ``eps`` times it, the same on every fold; or, given ``Cs``
    (increasing), each fold's ``1 / (C * training weight)``."""
    classifies = datafit_class(model.loss).classifies
    scoring = scoring or ("accuracy" if classifies else "mse")
    if scoring not in SCORINGS or (scoring == "mse") == classifies:
        raise ValidationError(f"scoring={scoring!r} does not go with loss={model.loss!r}")
    n = ds.shape[0]
    sw = None if sample_weight is None else as_vector(sample_weight, n, "sample_weight")
    folds = make_folds(cv, n, ds.y, classifier=classifies)
    if Cs is not None:
        Cs = np.sort(np.asarray(Cs, np.float64))
        grids = np.array([1.0 / (Cs * _weight_sum(sw, f.train)) for f in folds])
    else:
        alphas = grid.alphas
        if alphas is None:
            whole = Data(ds, None, sw)
            amax = largest_alpha(whole, model, Execution(client, ds.n_partitions))
            alphas = alpha_grid(amax, grid.n_alphas, grid.eps)
        alphas = np.sort(np.asarray(alphas, np.float64).ravel())[::-1]
        grids = np.tile(alphas, (len(folds), 1))

    fold_run = FoldRun(model, solver)
    ex = executor_for(client)
    in_one_piece = None
    if one_piece.chosen(ex, ds.held_bytes, None):
        recipe, blocks = ds.shipped()

        def in_one_piece(jobs: list[Any]) -> list[Any]:
            shipments = [
                one_piece.Shipment(fold_in_process, None, {"job": j, "fold_run": fold_run},
                                   recipe)
                for j in jobs
            ]  # fmt: skip
            return one_piece.run_many(ex, shipments, blocks, spread=True)

    return cross_validate(
        ds, folds, grids, run=fold_run.runner(client), scoring=scoring, sample_weight=sw,
        concurrent=client is not None, in_one_piece=in_one_piece,
    )  # fmt: skip


@dataclass(frozen=True)
class FoldRun:
    """How each fold's path is solved: the model (its penalty at alpha 1: each alpha's is
    ``penalty.at(alpha)``) and the configured solver (a plain record: it travels with the
    folds solved in one piece)."""

    model: Model
    solver: Any

    def problem_for(self, view: Any, weights: Any, client: Any) -> tuple[Any, Problem]:
        """The solver (a copy per fold: folds run side by side) and the loaded problem of
        the training view ``view``."""
        solver, loss = copy.copy(self.solver), self.model.loss
        inputs = read_inputs(view, None, weights, loss, "train")
        check_call(inputs, client, solver, loss, view.n_partitions)
        call = Call(Data(view, None, weights), self.model, solver,
                    Execution(client, view.n_partitions, False))  # fmt: skip
        ex = direct_calls(executor_for(client), solver, False)
        problem, _ = set_up(call, Plan(inputs=inputs, ex=ex))
        return solver, problem

    def runner(self, client: Any) -> Any:
        """The fold runner of :func:`dl1.paths.cv.cross_validate` on ``client``."""
        return path_runner(lambda v, w: self.problem_for(v, w, client),
                           penalty=self.model.penalty)  # fmt: skip


def fold_in_process(X: Any, *, client: Any, job: Any, fold_run: FoldRun) -> Any:
    """One fold's held-out scores computed in this process on handle ``X`` (the task of a
    fold solved in one piece, :mod:`dl1.runtime.one_piece`)."""
    return job.scores(X, fold_run.runner(client))


def _weight_sum(sw: np.ndarray | None, rows: np.ndarray) -> float:
    return float(rows.shape[0]) if sw is None else float(sw[rows].sum())


@coordinating
@validated({k: v for k, v in PATH.items() if k != "l1_ratio"}, "dl1.fit_cv()")
def fit_cv(
    X: Any,
    y: Any = None,
    *,
    cv: Any = 5,
    l1_ratio: Any = 1.0,
    alphas: Any = None,
    n_alphas: int = 100,
    eps: float = 1e-3,
    Cs: Any = None,
    penalty_factor: Any = None,
    positive: bool = False,
    bounds: Any = None,
    loss: str = "squared",
    scoring: str | None = None,
    sample_weight: Any = None,
    fit_intercept: bool = True,
    standardize: bool = False,
    tol: float = 1e-4,
    max_rounds: int | None = None,
    n_partitions: int = 2,
    solver: Any = "ws",
    screen: bool = False,
    random_order: bool = False,
    seed: int = 0,
    refit: bool = True,
    client: Any = None,
    split: str = "train",
) -> CrossValidatedFit:
    """Choose alpha (and ``l1_ratio``) by cross-validation, then refit on all rows.

    Parameters
    ----------
    X, y, loss, sample_weight, fit_intercept, standardize, tol, max_rounds, n_partitions,
    solver, screen, random_order, seed, client, split, penalty_factor, positive, bounds
        As in :func:`dl1.fit` (``screen``: gap-safe screening along each fold's path; any
        two labels of a classification loss, mapped to -1 / +1 before any work). ``X`` may
        be a :class:`~dl1.dataset.Dataset` (then ``y`` comes with it); otherwise one is made
        for the folds and the refit, and released at the end.
    cv : int, scikit-learn splitter or iterable of (train, test)
        The folds (an int: ``KFold``, stratified for the classification losses, as
        scikit-learn's ``check_cv``).
    l1_ratio : float or sequence of floats
        Each is cross-validated on its own grid; the best mean score over all is chosen.
    alphas, n_alphas, eps
        The grid: ``alphas``, or ``n_alphas`` from ``alpha_max`` down to ``eps`` times it.
    Cs : sequence of floats, optional
        The classifiers' grid instead: ``C`` values (``alpha = 1 / (C * weight)``).
    scoring : {"mse", "accuracy", "neg_log_loss"}, optional
        Held-out metric (default "mse" for the squared loss, "accuracy" otherwise).
    refit : bool
        Refit on all rows at the chosen alpha.

    Returns
    -------
    CrossValidatedFit
    """
    ratios = np.atleast_1d(np.asarray(l1_ratio, dtype=np.float64))
    if ratios.ndim != 1 or ratios.size == 0 or np.any((ratios < 0) | (ratios > 1)):
        raise ValidationError(f"l1_ratio must be in [0, 1] (one value or several); got {l1_ratio}")
    labels = entry_labels(X, y, loss, split)  # any two labels as -1 / +1, before any work
    datafit = make_datafit(loss)
    options = SolverOptions(max_rounds=max_rounds, random_order=random_order, seed=seed)
    refit_solver = make_solver(solver, options, datafit)
    # warm-started along each fold's path, the working set is usually right (dl1.path's)
    path_solver = make_solver(solver, replace(options, screen=screen, tight_inner=True), datafit)
    models = [Model(loss, make_penalty(1.0, float(r), penalty_factor, positive, bounds),
                    fit_intercept, standardize, tol) for r in ratios]  # fmt: skip
    for m in models:
        check_penalty(m.penalty, path_solver, standardize)
    with handle(labels.X, labels.y, client, n_partitions, split) as ds:
        sw = sample_weight if sample_weight is not None else ds.sample_weight
        results = [
            cross_validated(ds, m, path_solver, cv=cv, scoring=scoring, sample_weight=sw,
                            client=client, grid=Grid(alphas, n_alphas, eps), Cs=Cs)
            for m in models
        ]  # fmt: skip
        best = _best_ratio(results)
        chosen = results[best]
        total = float(ds.shape[0] if sw is None else np.sum(sw))
        if Cs is not None:  # the whole data's alpha of the chosen C (and its 1-se C)
            Cs_sorted = np.sort(np.asarray(Cs, np.float64))
            alpha, alpha_1se = (
                1.0 / (Cs_sorted[k] * total) for k in (chosen.best, chosen.best_1se)
            )
        else:
            alpha, alpha_1se = (float(chosen.alphas[0][k]) for k in (chosen.best, chosen.best_1se))
        res = None
        if refit:
            model = replace(models[best], penalty=models[best].penalty.at(alpha))
            res = fitted(FitCall(Data(ds, None, sample_weight), model, refit_solver,
                                 Execution(client, ds.n_partitions)))  # fmt: skip
    return CrossValidatedFit(results, best, ratios, float(alpha), float(alpha_1se), chosen.best,
                             chosen.best_1se, with_classes(res, labels.classes),
                             labels.classes)  # fmt: skip


def _best_ratio(results: list[CVResult]) -> int:
    """The ``l1_ratio`` whose best mean score is best (the first such, as scikit-learn)."""
    sign = 1.0 if results[0].scoring == "mse" else -1.0
    return int(np.argmin([sign * r.mean[r.best] for r in results]))
