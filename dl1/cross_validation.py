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
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np
import scipy.sparse as sp
from scipy.special import log_softmax

from dl1.dataset import Dataset, persist
from dl1.entry_labels import entry_labels
from dl1.errors import ValidationError
from dl1.inputs import as_dask, as_vector, read_inputs
from dl1.labels import with_classes
from dl1.models import multiclass_decisions
from dl1.multiclass import (
    LabelledBlocks,
    class_labels,
    fit_labelled,
    load_labelled,
    multinomial_penalty,
)
from dl1.multiclass_path import PathGrid, path_labelled
from dl1.objective.datafits import datafit_class, make_datafit
from dl1.params import FIT_CV, validated
from dl1.paths.cv import (
    SCORINGS,
    CVResult,
    Fold,
    choose,
    cross_validate,
    make_folds,
    path_runner,
    warn_at_edge,
)
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
from dl1.runtime.compute import computed
from dl1.runtime.executor import coordinating, executor_for
from dl1.solvers.base import Problem
from dl1.solvers.multiclass import MulticlassResult, MulticlassWorkingSetSolver
from dl1.solvers.options import SolverOptions
from dl1.solvers.registry import make_solver
from dl1.solvers.result import FitResult, convergence_warning
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
    fit : FitResult, MulticlassResult or None
        The refit on all rows at ``alpha`` (None with ``refit=False``); its ``classes_``
        are :attr:`classes`. More than two classes: the multinomial model's
        (:func:`dl1.fit_multiclass`), ``coef_`` sparse ``(K, p)``.
    classes : ndarray (2,) or (K,), or None
        A classification loss's labels, sorted (two: the second is +1 in the fits;
        ``[-1.0, 1.0]`` for labels -1 / +1); None for the other losses.
    """

    cv: list[CVResult]
    best: int
    l1_ratios: np.ndarray
    alpha: float
    alpha_1se: float
    index: int
    index_1se: int
    fit: FitResult | MulticlassResult | None
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
@validated(FIT_CV, "dl1.fit_cv()")
def fit_cv(
    X: Any,
    y: Any = None,
    *,
    cv: Any = 5,
    l1_ratio: Any = 1.0,
    penalty: str = "l1",
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
    score_weight: Any = None,
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
    penalty : {"l1", "grouped"}
        ``"l1"``: the elastic net of ``l1_ratio``. ``"grouped"``: more than two classes
        only (the multinomial model), the l1 part the sum of each feature's ``K``
        coefficients' Euclidean norms, a feature in or out for every class at once
        (glmnet's ``cv.glmnet(family="multinomial", type.multinomial="grouped")``); the
        grid's ``alpha_max`` is then the grouped penalty's.
    alphas, n_alphas, eps
        The grid: ``alphas``, or ``n_alphas`` from ``alpha_max`` down to ``eps`` times it.
    Cs : sequence of floats, optional
        The classifiers' grid instead: ``C`` values (``alpha = 1 / (C * weight)``).
    scoring : {"mse", "accuracy", "neg_log_loss"}, optional
        Held-out metric (default "mse" for the squared loss, "accuracy" otherwise).
    score_weight : array-like (n_samples,), optional
        More than two classes: the rows' weights in the held-out scores (None: those of
        ``sample_weight``, or the store's). scikit-learn's ``LogisticRegressionCV`` fits by
        the sample weights times the class weights and scores by the sample weights alone:
        :class:`dl1.LogisticRegressionCV` passes the latter here. Two classes score by
        ``sample_weight`` (this is refused).
    refit : bool
        Refit on all rows at the chosen alpha.

    Returns
    -------
    CrossValidatedFit
        With more than two classes (``loss="logistic"``): the multinomial model's
        cross-validation (scikit-learn's multinomial ``LogisticRegressionCV``). Each fold
        is a :func:`dl1.path_multiclass` over the grid (every class warm-started from
        alpha to alpha) on all rows, its held-out rows weighing 0 (so that its objective is
        the training rows'), scored on the held-out rows by the multinomial model's
        predictions (accuracy: the class of the largest decision value; neg_log_loss: the
        log of the softmax at the true class); ``classes`` the ``K`` labels and ``fit`` the
        refit's :class:`~dl1.solvers.multiclass.MulticlassResult` (:func:`dl1.fit_multiclass`).
        It takes the L1 / elastic-net or the grouped penalty without ``penalty_factor``,
        ``positive``, ``bounds``, ``standardize`` or ``screen``, data in memory, as a dask
        array or a store (not a Dataset), loaded once for every fold and the refit.
    """
    ratios = np.atleast_1d(np.asarray(l1_ratio, dtype=np.float64))
    if ratios.ndim != 1 or ratios.size == 0 or np.any((ratios < 0) | (ratios > 1)):
        raise ValidationError(f"l1_ratio must be in [0, 1] (one value or several); got {l1_ratio}")
    labels = class_labels(X, y, loss, split)
    if labels is None and penalty == "grouped":
        raise ValidationError(
            f"penalty='grouped' needs more than two classes (the multinomial model, "
            f"loss='logistic'); loss={loss!r} on these labels is a binary or regression fit: "
            "use penalty='l1'"
        )
    if labels is not None:
        _check_multiclass_call(X, loss, solver, penalty_factor=penalty_factor,
                               positive=positive, bounds=bounds, standardize=standardize,
                               screen=screen, random_order=random_order)  # fmt: skip
        grid = MulticlassGrid(alphas, n_alphas, eps, Cs, ratios)
        opts = MulticlassOptions(fit_intercept, tol, max_rounds, n_partitions, client, split,
                                 penalty=penalty)  # fmt: skip
        return fit_cv_multiclass(X, labels, grid, opts, cv=cv, scoring=scoring,
                                 sample_weight=sample_weight, score_weight=score_weight,
                                 refit=refit)  # fmt: skip
    if score_weight is not None:
        raise ValidationError(
            "score_weight is for more than two classes: two classes score the held-out rows "
            "by sample_weight"
        )
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
        alpha, alpha_1se = _chosen_alphas(chosen, Cs, total)
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


def _chosen_alphas(chosen: CVResult, Cs: Any, total: float) -> tuple[float, float]:
    """The whole data's alphas of the chosen grid point and of its one-standard-error
    one: for a ``C`` grid ``1 / (C * total)`` (``total``: the rows' weight), else the
    grid's own alphas."""
    picks = (chosen.best, chosen.best_1se)
    if Cs is not None:
        Cs_sorted = np.sort(np.asarray(Cs, np.float64))
        return 1.0 / (Cs_sorted[picks[0]] * total), 1.0 / (Cs_sorted[picks[1]] * total)
    return float(chosen.alphas[0][picks[0]]), float(chosen.alphas[0][picks[1]])


# -- more than two classes: the multinomial model ---------------------------------------------


@dataclass(frozen=True)
class MulticlassGrid:
    """The multinomial cross-validation's grid: ``alphas``, or ``n_alphas`` below the
    whole data's ``alpha_max`` down to ``eps`` times it, or ``Cs``; each ``l1_ratios``."""

    alphas: Any
    n_alphas: int
    eps: float
    Cs: Any
    l1_ratios: np.ndarray


@dataclass(frozen=True)
class MulticlassOptions:
    """What every multinomial fit of a cross-validation (the folds' paths, the refit)
    takes, as :func:`dl1.fit_multiclass`; ``penalty`` ``"l1"`` (the elastic net of each
    ``l1_ratio``) or ``"grouped"``."""

    fit_intercept: bool
    tol: float
    max_rounds: int | None
    n_partitions: int
    client: Any
    split: str
    penalty: str

    def keywords(self) -> dict[str, Any]:
        """The settings of the fits on the loaded data (:func:`~dl1.multiclass_path.
        path_labelled`, :func:`~dl1.multiclass.fit_labelled`)."""
        return {"fit_intercept": self.fit_intercept, "tol": self.tol, "penalty": self.penalty,
                "max_rounds": 100 if self.max_rounds is None else self.max_rounds}  # fmt: skip


def _check_multiclass_call(X: Any, loss: str, solver: Any, **settings: Any) -> None:
    """Refuse what the multinomial cross-validation does not take (each setting at its
    default: ``settings``' values are checked against them)."""
    defaults = {"penalty_factor": None, "positive": False, "bounds": None,
                "standardize": False, "screen": False, "random_order": False}  # fmt: skip
    if loss != "logistic":
        raise ValidationError(
            f"more than two classes: dl1.fit_cv cross-validates the multinomial model, "
            f"loss='logistic'; got loss={loss!r} (one-vs-rest: dl1.fit_multiclass)"
        )
    if isinstance(X, Dataset):
        raise ValidationError(
            "more than two classes: dl1.fit_cv takes a store, a dask array or a matrix, not a "
            "Dataset (the multinomial fits load their own blocks)"
        )
    if not (isinstance(solver, str) and solver == "ws"):
        raise ValidationError(
            f"more than two classes: the multinomial model has its own working-set solver; "
            f"solver={solver!r} applies to two classes only (leave it 'ws')"
        )
    for name, value in settings.items():
        if value is not defaults[name] and value != defaults[name]:
            raise ValidationError(
                f"more than two classes: dl1.fit_cv does not take {name}={value!r} with the "
                f"multinomial model (leave it {defaults[name]!r})"
            )


def fit_cv_multiclass(X: Any, labels: np.ndarray, grid: MulticlassGrid,
                      opts: MulticlassOptions, *, cv: Any, scoring: str | None,
                      sample_weight: Any, score_weight: Any = None,
                      refit: bool = True) -> CrossValidatedFit:  # fmt: skip
    """:func:`fit_cv` of more than two classes: each ``l1_ratio``'s folds' multinomial
    paths (:func:`dl1.path_multiclass`) scored on their held-out rows, the choice (the
    best mean score, the first on the grid, as scikit-learn's), the refit on all rows
    (:func:`dl1.fit_multiclass`). The data are loaded (or located, streamed) once for
    every fit, each fold's reweighting its rows."""
    scoring = scoring or "accuracy"
    if scoring not in ("accuracy", "neg_log_loss"):
        raise ValidationError(f"scoring={scoring!r} does not go with loss='logistic'")
    if sp.issparse(X) and X.format not in ("csr", "csc"):
        X = X.tocsr()  # rows indexable for the held-out predictions
    n = labels.shape[0]
    sw = _all_weights(X, sample_weight, n, opts.split)
    scored = sw if score_weight is None else as_vector(score_weight, n, "score_weight")
    folds = make_folds(cv, n, labels, classifier=True)
    data = load_labelled(X, labels, sw, opts.split, opts.client, opts.n_partitions, None)
    rows = _CVRows(X, data, labels, sw, scored)
    results = [_multiclass_folds(rows, folds, grid, float(r), scoring, opts)
               for r in grid.l1_ratios]  # fmt: skip
    best = _best_ratio(results)
    chosen = results[best]
    total = float(n if sw is None else sw.sum())
    alpha, alpha_1se = _chosen_alphas(chosen, grid.Cs, total)
    res = None
    if refit:
        res = fit_labelled(data, alpha=alpha, l1_ratio=float(grid.l1_ratios[best]),
                           multi_class="multinomial", loss="logistic", stacklevel=4,
                           **opts.keywords())  # fmt: skip
    return CrossValidatedFit(results, best, grid.l1_ratios, float(alpha), float(alpha_1se),
                             chosen.best, chosen.best_1se, res, np.unique(labels))  # fmt: skip


def _all_weights(X: Any, sample_weight: Any, n: int, split: str) -> np.ndarray | None:
    """Every row's weight: ``sample_weight``, or those stored with ``X``; None for unit
    weights."""
    if sample_weight is not None:
        return as_vector(sample_weight, n, "sample_weight")
    if isinstance(X, np.ndarray) or sp.issparse(X):
        return None
    stored = as_dask(X, split)[2]
    return None if stored is None else np.asarray(stored, np.float64)


class _CVRows(NamedTuple):
    """The rows of a multinomial cross-validation: ``X`` (for the held-out predictions),
    its blocks loaded once (``data``), the labels, and the rows' weights in the fits and in
    the scores (None: unit)."""

    X: Any
    data: LabelledBlocks
    labels: np.ndarray
    fit_weight: np.ndarray | None
    score_weight: np.ndarray | None


def _multiclass_folds(rows: _CVRows, folds: list[Fold], grid: MulticlassGrid, l1_ratio: float,
                      scoring: str, opts: MulticlassOptions) -> CVResult:  # fmt: skip
    """One ``l1_ratio``'s cross-validation: each fold's path on its grid (decreasing;
    for a ``C`` grid, ``1 / (C * training weight)`` by fold, as scikit-learn's), scored."""
    sw = rows.fit_weight
    if grid.Cs is not None:
        Cs = np.sort(np.asarray(grid.Cs, np.float64))
        grids = np.array([1.0 / (Cs * _weight_sum(sw, f.train)) for f in folds])
    else:
        alphas = grid.alphas
        if alphas is None:
            alphas = alpha_grid(_multiclass_alpha_max(rows.data, l1_ratio, opts),
                                grid.n_alphas, grid.eps)  # fmt: skip
        alphas = np.sort(np.asarray(alphas, np.float64).ravel())[::-1]
        grids = np.tile(alphas, (len(folds), 1))
    per_fold = []
    for k, fold in enumerate(folds):
        scores, bad = _fold_path_scores(rows, fold, grids[k], l1_ratio, scoring, opts)
        if bad:
            warnings.warn(
                f"cross-validation fold {k}: {len(bad)} alpha(s) not certified (first: "
                f"alpha[{bad[0]}] = {grids[k][bad[0]]:.6g}); raise max_iter or tol",
                convergence_warning(), stacklevel=4,
            )  # fmt: skip
        per_fold.append(scores)
    scores = np.column_stack(per_fold)
    best, best_1se = choose(scores, scoring)
    warn_at_edge(scores, scoring, best, grids[0])
    return CVResult(grids, scores, scoring, best, best_1se)


def _multiclass_alpha_max(data: LabelledBlocks, l1_ratio: float,
                          opts: MulticlassOptions) -> float:  # fmt: skip
    """The whole data's ``alpha_max`` of the multinomial model with ``opts.penalty`` (one
    pass)."""
    problem = data.problem(multinomial_penalty(opts.penalty, 1.0, l1_ratio), opts.fit_intercept)
    return MulticlassWorkingSetSolver().alpha_max(problem, l1_ratio)


def _fold_path_scores(rows: _CVRows, fold: Fold, grid: np.ndarray, l1_ratio: float,
                      scoring: str,
                      opts: MulticlassOptions) -> tuple[np.ndarray, list[int]]:  # fmt: skip
    """One fold's held-out scores along its multinomial path, and the alphas not
    certified. The path is fitted on all rows with the held-out ones weighing 0: its
    objective is the training rows' (the weights are normalised to sum to n, so the mean
    loss is the training rows' weighted mean), and the loaded blocks serve every fold."""
    sw, scored = rows.fit_weight, rows.score_weight
    train = np.zeros(rows.labels.shape[0])
    train[fold.train] = 1.0 if sw is None else sw[fold.train]
    with warnings.catch_warnings():  # reported by fold, as the binary folds'
        warnings.simplefilter("ignore", convergence_warning())
        path = path_labelled(rows.data.reweighted(train), PathGrid(alphas=grid),
                             l1_ratio=l1_ratio, **opts.keywords())  # fmt: skip
    codes = np.searchsorted(path.classes_, rows.labels[fold.test])
    test_weight = None if scored is None else scored[fold.test]
    decisions = _held_out_decisions(rows.X, path.fits_, fold.test, opts.split)
    scores = np.array([multiclass_score(scoring, codes, d, test_weight) for d in decisions])
    return scores, [k for k, f in enumerate(path.fits_) if not f.converged_]


def _held_out_decisions(X: Any, fits: list[MulticlassResult], test: np.ndarray,
                        split: str) -> list[np.ndarray]:  # fmt: skip
    """Each fit's decision values ``X W^T + b`` (n_test, K) of the rows ``test``: in
    memory from those rows; out of core, every fit's over one computation (a read of X)."""
    if isinstance(X, np.ndarray) or sp.issparse(X):
        Xt = X[test]
        out = []
        for f in fits:
            prod = f.coef_ @ Xt.T  # (K, n_test), the sparse coefficients kept sparse
            out.append((prod.toarray() if sp.issparse(prod) else np.asarray(prod)).T
                       + f.intercept_)  # fmt: skip
        return out
    lazy = [multiclass_decisions(X, f.coef_.toarray(), f.intercept_, split=split) for f in fits]
    done = lazy if all(isinstance(d, np.ndarray) for d in lazy) else computed(*lazy, what="X")
    return [np.asarray(d)[test] for d in done]


def multiclass_score(scoring: str, codes: np.ndarray, d: np.ndarray,
                     w: np.ndarray | None) -> float:  # fmt: skip
    """The held-out metric of the multinomial model's decision values ``d`` (n, K) for
    the classes ``codes``: accuracy of the class of the largest value (the first on a tie,
    as scikit-learn's ``predict``), or the mean log of the softmax at the true class
    (scikit-learn's ``neg_log_loss``), weighted by ``w``."""
    if scoring == "accuracy":
        e = (np.argmax(d, axis=1) == codes).astype(np.float64)
    else:
        e = log_softmax(d, axis=1)[np.arange(codes.shape[0]), codes]
    return float(np.average(e, weights=w))
