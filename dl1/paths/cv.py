"""Cross-validated choice of alpha: one warm-started path per fold, on a data handle.

Folds are row masks, not copies: a fold's path runs on a view of a
:class:`~dl1.dataset.Dataset` whose held-out rows weigh zero, so that its objective is the
one of the training rows (weights are normalised to sum to n, so the mean loss is the mean
over the training rows). The solver keeps ``z = X w + b`` for every row, the held-out ones
included, so each alpha's held-out predictions come with its solution, without another pass.
On a cluster the folds' paths run side by side (one coordinating thread each).

The choice follows scikit-learn's ``LassoCV`` (least mean error over the folds, the first
such alpha of the grid) and adds glmnet's one-standard-error rule: the largest alpha whose
mean error is within one standard error (over the folds) of the least.
"""

from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from dl1.errors import GridEdgeWarning, ValidationError
from dl1.objective.datafits import datafit_class
from dl1.objective.penalties.elastic_net import ElasticNet
from dl1.paths.loop import AlphaStep, walk
from dl1.solvers.result import convergence_warning

#: Held-out metrics, by name: ``(function of (y, z, weights), larger_is_better)``.
SCORINGS = ("mse", "accuracy", "neg_log_loss")


@dataclass(frozen=True)
class Fold:
    """One split of the rows (indices into the data the cross-validation was given)."""

    train: np.ndarray
    test: np.ndarray


@dataclass(frozen=True)
class CVResult:
    """A cross-validation's held-out errors and the alphas it chose.

    Attributes
    ----------
    alphas : ndarray (n_folds, n_alphas)
        Each fold's grid, decreasing (the same on every fold for the regressors; for the
        classifiers' ``C`` grid, ``1 / (C * n_train)`` differs by fold).
    scores : ndarray (n_alphas, n_folds)
        The held-out metric ``scoring`` per alpha and fold (``mse_path_`` for the squared
        loss).
    scoring : str
        ``"mse"`` (lower is better), ``"accuracy"`` or ``"neg_log_loss"`` (higher is better).
    best : int
        Grid index of the best mean score (the first such, as scikit-learn).
    best_1se : int
        Grid index of the largest alpha whose mean error is within one standard error of
        the best (glmnet's ``lambda.1se``).
    """

    alphas: np.ndarray
    scores: np.ndarray
    scoring: str
    best: int
    best_1se: int

    @property
    def mean(self) -> np.ndarray:
        return self.scores.mean(axis=1)

    @property
    def standard_error(self) -> np.ndarray:
        k = self.scores.shape[1]
        return self.scores.std(axis=1, ddof=1) / np.sqrt(k) if k > 1 else np.zeros(len(self.mean))


def make_folds(cv: Any, n: int, y: np.ndarray | None, classifier: bool) -> list[Fold]:
    """The folds of ``cv`` (an int, a scikit-learn splitter or an iterable of
    ``(train, test)``), as scikit-learn's ``check_cv`` makes them (stratified for
    classifiers given an int)."""
    # local: sklearn.model_selection (~0.06 s beyond the rest of scikit-learn) only for folds
    from sklearn.model_selection import check_cv

    splitter = check_cv(5 if cv is None else cv, y, classifier=classifier)
    X_stub = np.zeros((n, 1))
    folds = [Fold(np.asarray(tr, np.int64), np.asarray(te, np.int64))
             for tr, te in splitter.split(X_stub, y)]  # fmt: skip
    if len(folds) < 2 and not isinstance(cv, (list, tuple)):
        raise ValidationError(f"cross-validation needs at least 2 folds, got {len(folds)}")
    for k, f in enumerate(folds):
        if f.train.size == 0 or f.test.size == 0:
            raise ValidationError(f"fold {k} has an empty training or test set")
    return folds


def choose(scores: np.ndarray, scoring: str) -> tuple[int, int]:
    """(best, best_1se) grid indices from held-out ``scores`` (n_alphas, n_folds)."""
    err = scores if scoring == "mse" else -scores
    mean = err.mean(axis=1)
    k = err.shape[1]
    se = err.std(axis=1, ddof=1) / np.sqrt(k) if k > 1 else np.zeros_like(mean)
    finite = np.where(np.isfinite(mean), mean, np.inf)
    best = int(np.argmin(finite))
    within = np.flatnonzero(finite <= finite[best] + se[best])
    return best, int(within.min())  # the grid decreases: the first is the largest alpha


def held_out_score(scoring: str, y: np.ndarray, z: np.ndarray, w: np.ndarray | None) -> float:
    """The held-out metric of predictions ``z`` (decision values) for targets ``y``."""
    if scoring == "mse":
        e = (y - z) ** 2
    elif scoring == "accuracy":  # z > 0 predicts +1, otherwise -1 (z = 0 included)
        e = ((z > 0) == (y > 0)).astype(np.float64)
    else:  # neg_log_loss of the logistic model's probabilities
        e = -np.logaddexp(0.0, -y * z)
    return float(np.average(e, weights=w))


def fold_scores(
    view: Any,
    test_rows: np.ndarray,
    grid: np.ndarray,
    *,
    run: Any,
    scoring: str,
    test_weight: np.ndarray | None,
) -> tuple[np.ndarray, list[int]]:
    """The held-out scores of one fold's path on ``grid``, and the alphas not certified:
    ``run(view, grid, on_alpha)`` walks the path on the training view; each alpha's ``z``
    gives the held-out rows' decision values (``test_rows`` index the handle's rows)."""
    y = view._inputs.y  # the held targets, all rows
    out = np.full(grid.shape[0], np.nan)
    uncertified: list[int] = []

    def on_alpha(step: AlphaStep) -> None:
        # the held-out predictions: the decision values through the loss's inverse link
        pred = datafit_class(step.result.loss).response(step.state.z[test_rows])
        out[step.k] = held_out_score(scoring, y[test_rows], pred, test_weight)
        if not step.result.converged_:
            uncertified.append(step.k)

    run(view, grid, on_alpha)
    return out, uncertified


def path_runner(problem_for: Any, *, penalty: ElasticNet) -> Any:
    """``run(view, grid, on_alpha, weights)`` for :func:`cross_validate`: the solver and
    problem of ``problem_for(view, weights)`` walked along ``grid`` (each alpha's penalty
    ``penalty.at(alpha)``)."""

    def run(view: Any, grid: np.ndarray, on_alpha: Any, weights: Any) -> None:
        solver, problem = problem_for(view, weights)
        if not solver.returns_z:
            problem.executor.close()
            raise ValidationError(
                "cross-validation scores the held-out rows from the solver's predictions, "
                f"which solver={solver.name!r} keeps on the workers: use solver='ws'"
            )
        try:
            walk(solver, problem, grid, penalty.at, on_alpha)
        finally:
            problem.executor.close()

    return run


@dataclass(frozen=True)
class FoldJob:
    """One fold's path as it travels (to a worker, for a fold solved in one piece): the
    training rows (of the handle cross-validated), the held-out rows (of the data it
    holds), the grid, the metric and the two sets of weights."""

    train: np.ndarray
    test_rows: np.ndarray
    grid: np.ndarray
    scoring: str
    train_weight: np.ndarray | None
    test_weight: np.ndarray | None

    def scores(self, ds: Any, run: Any) -> tuple[np.ndarray, list[int]]:
        """:func:`fold_scores` of this fold on handle ``ds`` walked by ``run``."""
        return fold_scores(
            ds[self.train], self.test_rows, self.grid,
            run=lambda v, g, cb: run(v, g, cb, self.train_weight), scoring=self.scoring,
            test_weight=self.test_weight,
        )  # fmt: skip


def fold_jobs(ds: Any, folds: list[Fold], grids: np.ndarray, scoring: str,
              sample_weight: np.ndarray | None) -> list[FoldJob]:  # fmt: skip
    """The jobs of ``folds`` on ``ds`` (``sample_weight``: of ``ds``'s rows, or None)."""
    base = np.arange(ds.shape[0]) if ds.rows is None else ds.rows
    pick = lambda rows: None if sample_weight is None else sample_weight[rows]  # noqa: E731
    return [FoldJob(f.train, base[f.test], grids[k], scoring, pick(f.train), pick(f.test))
            for k, f in enumerate(folds)]  # fmt: skip


def warn_at_edge(scores: np.ndarray, scoring: str, best: int, grid: np.ndarray) -> None:
    """A :class:`GridEdgeWarning` when ``best`` is an end of the (decreasing) grid and its
    mean held-out error is below its neighbour's by more than the standard error of the
    difference over the folds: the score still improves there, beyond the folds' noise.
    (Ties at an end, such as several alphas above ``alpha_max`` all giving the empty
    model, say nothing.)"""
    n, k = scores.shape
    if n < 2 or k < 2 or best not in (0, n - 1):
        return
    err = scores if scoring == "mse" else -scores
    neighbour = 1 if best == 0 else n - 2
    gain = err[neighbour] - err[best]  # per fold
    if not gain.mean() > gain.std(ddof=1) / np.sqrt(k):
        return
    end, c_end = ("largest", "smallest") if best == 0 else ("smallest", "largest")
    warnings.warn(
        f"cross-validation chose the {end} alpha of its grid ({grid[best]:.6g}; for a C "
        f"grid, the {c_end} C) with the held-out {scoring} still improving there: a better "
        "one may lie beyond the grid; extend it (eps, alphas or Cs)",
        GridEdgeWarning,
        stacklevel=4,
    )


def cross_validate(
    ds: Any,
    folds: list[Fold],
    grids: np.ndarray,
    *,
    run: Any,
    scoring: str,
    sample_weight: np.ndarray | None,
    concurrent: bool,
    in_one_piece: Any = None,
) -> CVResult:
    """Every fold's path on a view of ``ds`` (its training rows), side by side when
    ``concurrent``; ``grids[k]`` is fold ``k``'s alpha grid, ``sample_weight`` the weights
    of ``ds``'s rows (None: none). ``in_one_piece(jobs)``, if given, solves the folds'
    jobs instead, each as one task (:mod:`dl1.runtime.one_piece`)."""
    jobs = fold_jobs(ds, folds, grids, scoring, sample_weight)
    # Each path silences its alphas' warnings (collected and reported below, from this
    # thread): with threads, one filter set for all of them, restored once at the end.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", convergence_warning())
        if in_one_piece is not None:
            per_fold = in_one_piece(jobs)
        elif concurrent and len(folds) > 1:
            with ThreadPoolExecutor(len(folds), thread_name_prefix="dl1-cv") as pool:
                per_fold = list(pool.map(lambda j: j.scores(ds, run), jobs))
        else:
            per_fold = [j.scores(ds, run) for j in jobs]
    for k, (_, bad) in enumerate(per_fold):
        if bad:
            warnings.warn(
                f"cross-validation fold {k}: {len(bad)} alpha(s) not certified (first: "
                f"alpha[{bad[0]}] = {grids[k][bad[0]]:.6g}); raise max_iter or tol",
                convergence_warning(),
                stacklevel=3,
            )
    scores = np.column_stack([sc for sc, _ in per_fold])
    best, best_1se = choose(scores, scoring)
    warn_at_edge(scores, scoring, best, grids[0])
    return CVResult(np.asarray(grids, np.float64), scores, scoring, best, best_1se)
