"""Cross-validated estimators: :class:`LassoCV`, :class:`ElasticNetCV` and
:class:`LogisticRegressionCV`, thin shells over :func:`dl1.fit_cv`.

Each fold is a warm-started path on a data handle (the data is read once for all
folds and the refit; a :class:`dl1.Dataset` given as ``X`` is used as it is), the folds run
side by side on a cluster, and the choice is scikit-learn's (best mean held-out score, the
first on the grid) plus glmnet's one-standard-error alpha (``alpha_1se_``).
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from dl1.cross_validation import fit_cv
from dl1.estimators.base import CONSTRAINTS, SHARED, in_estimator_terms
from dl1.estimators.classification import LogisticRegression, is_class_weight
from dl1.estimators.multiclass import checked_multiclass_data
from dl1.estimators.regression import _Regressor
from dl1.models import MulticlassModel
from dl1.params import POSITIVE_INT, UNIT, Interval, Options, is_cv_splitter, predicate

#: dl1.fit's parameters the CV estimators take (blocks are held: no ``stream``; the
#: sample-wise solvers' ``max_epochs`` does not apply to a path).
CV_SHARED = tuple(name for name in SHARED if name not in ("stream", "max_epochs"))


@predicate("an int >= 1 or an array of alphas > 0")
def is_grid(value: Any) -> bool:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return value >= 1
    try:
        a = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    return a.ndim == 1 and a.size > 0 and bool(np.all(np.isfinite(a) & (a > 0)))


@predicate("a float in [0, 1] or a sequence of them")
def is_ratios(value: Any) -> bool:
    try:
        a = np.atleast_1d(np.asarray(value, dtype=np.float64))
    except (TypeError, ValueError):
        return False
    return a.ndim == 1 and a.size > 0 and bool(np.all((a >= 0) & (a <= 1)))


CV_CONSTRAINTS: dict[str, list[Any]] = {
    **{
        name: CONSTRAINTS[name]
        for name in (*CV_SHARED, "tol", "max_iter", "random_state", "n_jobs")
    },
    "cv": [Interval(numbers.Integral, 2, None, closed="left"), is_cv_splitter, None],
    "eps": [Interval(numbers.Real, 0, 1, closed="neither")],
    "alphas": [is_grid],
}


class _CrossValidated:
    """The fit of the CV estimators: :func:`dl1.fit_cv`, then the refit's attributes."""

    _fits: tuple[str, ...] = ()  # a saved fit loads as the estimator, not as its CV
    _multiclass_losses: tuple[str, ...] = ()  # loads no multiclass fit (but LogisticRegressionCV)

    def fit(self, X: Any, y: Any = None, sample_weight: Any = None) -> Any:
        """Cross-validate the grid, choose, and refit on all rows (:func:`dl1.fit_cv`).

        Parameters
        ----------
        X : array-like or sparse matrix, dask array, dl1 store, store path or dl1.Dataset
        y : array-like (n_samples,), optional
            Targets; those of the store or Dataset when X is one and y is None.
        sample_weight : array-like (n_samples,), optional

        Returns
        -------
        self
        """
        self._validate_params()
        X, y, sample_weight, _ = self._inputs(X, y, sample_weight)
        res = fit_cv(
            X, y, cv=5 if self.cv is None else self.cv, loss=self._loss,
            sample_weight=sample_weight, fit_intercept=self.fit_intercept,
            standardize=self.standardize, tol=self.tol, max_rounds=self.max_iter,
            n_partitions=self.n_partitions, solver=self.solver, screen=self.screen,
            seed=self._seed(), client=self.client, **self._grid(), **self._penalty_options(),
        )  # fmt: skip
        self.cv_result_ = res
        self._set_result(res.fit)
        self._set_cv(res)
        return self

    def _set_loaded(self, res: Any, fitted: dict[str, Any]) -> None:
        """As the base class's, and ``alpha_``, the refit's (the folds' grids and scores
        are not saved)."""
        super()._set_loaded(res, fitted)  # type: ignore[misc]
        self.alpha_ = float(res.alpha)

    def _grid(self) -> dict[str, Any]:
        """:func:`dl1.fit_cv`'s grid keywords: ``alphas`` an int is their number."""
        if isinstance(self.alphas, numbers.Integral):
            return {"n_alphas": int(self.alphas), "eps": self.eps, "l1_ratio": self._ratios()}
        return {"alphas": np.asarray(self.alphas, np.float64), "l1_ratio": self._ratios()}

    def _ratios(self) -> Any:
        return 1.0

    def _set_cv(self, res: Any) -> None:
        """scikit-learn's attributes: the grids and held-out errors per fold (squeezed to
        one ``l1_ratio`` when a single one was given), the choice."""
        self.alpha_ = res.alpha
        self.alpha_1se_ = res.alpha_1se
        alphas = np.array([r.alphas[0] for r in res.cv])
        paths = np.array([r.scores for r in res.cv])
        single = np.ndim(self._ratios()) == 0
        self.alphas_ = alphas[0] if single else alphas
        self.mse_path_ = paths[0] if single else paths


class LassoCV(_CrossValidated, _Regressor):
    """Lasso with alpha chosen by cross-validation, every fold's path certified.

    As scikit-learn's ``LassoCV``: a grid of ``alphas`` values from ``alpha_max`` (the
    whole data's) down to ``eps * alpha_max``, the same folds (``cv`` as ``check_cv``),
    the alpha of least mean held-out squared error, then a refit on all rows. Each fold's
    path runs on a view of one data handle (:func:`dl1.persist`; folds are row masks, not
    copies), warm-started (screened with ``screen=True``), the folds side by side on a
    cluster.

    Parameters
    ----------
    eps : float, default=1e-3
        ``alpha_min / alpha_max``.
    alphas : int or array-like, default=100
        The number of alphas on the grid, or the alphas themselves.
    cv : int, splitter or iterable, default=None
        The folds (None: 5-fold ``KFold``).
    fit_intercept, tol, max_iter, random_state, solver, client, n_partitions, standardize
        As :class:`dl1.Lasso` (``tol`` bounds every alpha's relative gap on every fold).
    n_jobs : int, optional
        Accepted for scikit-learn's habit and ignored: the folds run side by side on the
        cluster's workers (in process, one after the other).
    screen : bool, default=False
        Gap-safe screening along the paths (off: on the tfidf preset it took 1.6 passes per
        alpha against 1.0 without, the certifying pass no longer serving the next alpha).
    positive : bool, default=False
        Coefficients kept ``>= 0`` (scikit-learn's ``positive``), in every fold and the refit.

    Attributes
    ----------
    alpha_ : float
        The chosen alpha.
    alpha_1se_ : float
        glmnet's one-standard-error alpha: the largest whose mean error is within one
        standard error (over the folds) of the least.
    alphas_ : ndarray (n_alphas,)
    mse_path_ : ndarray (n_alphas, n_folds)
        Held-out mean squared error per alpha and fold.
    coef_, intercept_, dual_gap_, gap_, n_iter_, n_features_in_, feature_names_in_, result_
        Of the refit at ``alpha_`` (as :class:`dl1.Lasso`).
    cv_result_ : dl1.cross_validation.CrossValidatedFit
    """

    _parameter_constraints = {**CV_CONSTRAINTS, "screen": ["boolean"], "positive": ["boolean"]}

    def __init__(
        self,
        *,
        eps: float = 1e-3,
        alphas: Any = 100,
        fit_intercept: bool = True,
        tol: float = 1e-4,
        max_iter: int = 1000,
        cv: Any = None,
        random_state: Any = None,
        solver: Any = "ws",
        client: Any = None,
        n_partitions: int = 2,
        standardize: bool = False,
        screen: bool = False,
        positive: bool = False,
        n_jobs: int | None = None,
    ) -> None:
        self.eps = eps
        self.alphas = alphas
        self.fit_intercept = fit_intercept
        self.tol = tol
        self.max_iter = max_iter
        self.cv = cv
        self.random_state = random_state
        self.solver = solver
        self.client = client
        self.n_partitions = n_partitions
        self.standardize = standardize
        self.screen = screen
        self.positive = positive
        self.n_jobs = n_jobs


class ElasticNetCV(_CrossValidated, _Regressor):
    """Elastic net with alpha (and ``l1_ratio``, given several) chosen by
    cross-validation, as scikit-learn's ``ElasticNetCV``; see :class:`LassoCV`.

    Parameters
    ----------
    l1_ratio : float or sequence of floats, default=0.5
        Each is cross-validated on its own grid (from its own ``alpha_max``); the best
        mean held-out error over all is chosen.
    eps, alphas, fit_intercept, tol, max_iter, cv, random_state, solver, client,
    n_partitions, standardize, screen, n_jobs
        As :class:`LassoCV`.

    Attributes
    ----------
    l1_ratio_ : float
    alpha_, alpha_1se_ : float
    alphas_ : ndarray (n_alphas,) or (n_l1_ratio, n_alphas)
    mse_path_ : ndarray (n_alphas, n_folds) or (n_l1_ratio, n_alphas, n_folds)
    coef_, intercept_, dual_gap_, gap_, n_iter_, n_features_in_, feature_names_in_,
    result_, cv_result_
        As :class:`LassoCV`.
    """

    _parameter_constraints = {**CV_CONSTRAINTS, "screen": ["boolean"], "l1_ratio": [is_ratios],
                              "positive": ["boolean"]}  # fmt: skip

    def __init__(
        self,
        *,
        l1_ratio: Any = 0.5,
        eps: float = 1e-3,
        alphas: Any = 100,
        fit_intercept: bool = True,
        tol: float = 1e-4,
        max_iter: int = 1000,
        cv: Any = None,
        random_state: Any = None,
        solver: Any = "ws",
        client: Any = None,
        n_partitions: int = 2,
        standardize: bool = False,
        screen: bool = False,
        positive: bool = False,
        n_jobs: int | None = None,
    ) -> None:
        self.l1_ratio = l1_ratio
        self.eps = eps
        self.alphas = alphas
        self.fit_intercept = fit_intercept
        self.tol = tol
        self.max_iter = max_iter
        self.cv = cv
        self.random_state = random_state
        self.solver = solver
        self.client = client
        self.n_partitions = n_partitions
        self.standardize = standardize
        self.screen = screen
        self.positive = positive
        self.n_jobs = n_jobs

    def _ratios(self) -> Any:
        r = np.asarray(self.l1_ratio, dtype=np.float64)
        return float(r) if r.ndim == 0 else r

    def _l1_ratio(self) -> float:
        return float(self.l1_ratio_)

    def _set_cv(self, res: Any) -> None:
        super()._set_cv(res)
        self.l1_ratio_ = res.l1_ratio

    def _set_loaded(self, res: Any, fitted: dict[str, Any]) -> None:
        super()._set_loaded(res, fitted)
        self.l1_ratio_ = float(res.l1_ratio)


class LogisticRegressionCV(_CrossValidated, LogisticRegression):
    """L1 / elastic-net logistic regression with ``C`` chosen by cross-validation, as
    scikit-learn's ``LogisticRegressionCV`` (stratified folds, accuracy by default).

    Each fold's path runs over ``Cs`` (alpha ``1 / (C * n_train)`` on the fold, so that its
    objective is scikit-learn's), on a view of one data handle; see :class:`LassoCV`.

    More than two classes: the multinomial model (scikit-learn's default), by
    :func:`dl1.fit_cv`: each fold a :func:`dl1.path_multiclass` over the ``C`` grid (every
    class warm-started from C to C), scored on its held-out rows, ``C_`` chosen as
    scikit-learn's (the best mean score, the smallest such C), the refit on all rows by
    :func:`dl1.fit_multiclass`; ``coef_`` ``(K, p)``, ``C_`` and ``l1_ratio_`` one per
    class (all equal), ``scores_`` the same array under every class, as scikit-learn's.
    No ``standardize`` or ``screen`` there (refused). One-vs-rest cross-validation is
    scikit-learn's: ``OneVsRestClassifier(LogisticRegressionCV())``, each class choosing
    its own ``C`` on the binary paths.

    Parameters
    ----------
    Cs : int or array-like, default=10
        The ``C`` values (an int: that many on ``np.logspace(-4, 4)``, as scikit-learn).
    l1_ratios : float or sequence of floats, optional
        Elastic-net mixes to cross-validate (None: the L1 penalty, ``l1_ratio = 1``).
    scoring : {"accuracy", "neg_log_loss"}, optional
        Held-out metric (None: accuracy, the estimator's ``score``), weighted by the
        samples' weights, their classes' included (more than two classes: without the
        classes', as scikit-learn's).
    class_weight : dict or "balanced", optional
        As :class:`LogisticRegression`, from the classes of all rows (as scikit-learn's).
    fit_intercept, tol, max_iter, cv, random_state, solver, client, n_partitions,
    standardize, screen, n_jobs
        As :class:`LassoCV`.

    Attributes
    ----------
    classes_ : ndarray (2,) or (K,)
    Cs_ : ndarray (n_Cs,)
    C_ : ndarray (1,) or (K,)
        The chosen C (more than two classes: repeated for each class, as scikit-learn's).
    C_1se_ : float
        The smallest C whose mean held-out score is within one standard error of the best.
    l1_ratio_ : ndarray (1,)
    scores_ : dict
        ``{classes_[1]: ndarray (n_folds, n_Cs)}`` (``(n_folds, n_Cs, n_l1_ratios)`` for
        several l1_ratios), the held-out scores as scikit-learn's; more than two classes:
        the same array under every class.
    alpha_, alpha_1se_ : float
        dl1's penalty strengths of ``C_`` and ``C_1se_`` on all rows.
    coef_ : ndarray (1, n_features) or (K, n_features)
    intercept_ : ndarray (1,) or (K,)
    dual_gap_, gap_, n_iter_, n_features_in_, feature_names_in_, result_, cv_result_
        Of the refit at ``C_`` (``result_`` a :class:`dl1.models.MulticlassModel` for
        more than two classes).
    """

    #: the saved multiclass fits it loads: its own multinomial refits (no one-vs-rest)
    _multiclass_losses = ("multinomial",)
    _parameter_constraints = {
        **{k: v for k, v in CV_CONSTRAINTS.items() if k not in ("eps", "alphas")},
        "screen": ["boolean"],
        "Cs": [POSITIVE_INT, is_grid],
        "l1_ratios": [is_ratios, UNIT, None],
        "scoring": [Options(("accuracy", "neg_log_loss")), None],
        "class_weight": [is_class_weight],
    }

    def __init__(
        self,
        *,
        Cs: Any = 10,
        l1_ratios: Any = None,
        class_weight: Any = None,
        fit_intercept: bool = True,
        cv: Any = None,
        scoring: str | None = None,
        tol: float = 1e-4,
        max_iter: int = 1000,
        random_state: Any = None,
        solver: Any = "ws",
        client: Any = None,
        n_partitions: int = 2,
        standardize: bool = False,
        screen: bool = False,
        n_jobs: int | None = None,
    ) -> None:
        self.Cs = Cs
        self.l1_ratios = l1_ratios
        self.class_weight = class_weight
        self.fit_intercept = fit_intercept
        self.cv = cv
        self.scoring = scoring
        self.tol = tol
        self.max_iter = max_iter
        self.random_state = random_state
        self.solver = solver
        self.client = client
        self.n_partitions = n_partitions
        self.standardize = standardize
        self.screen = screen
        self.n_jobs = n_jobs

    def fit(self, X: Any, y: Any = None, sample_weight: Any = None) -> Any:
        """Cross-validate the ``C`` grid, choose, and refit on all rows
        (:func:`dl1.fit_cv`): two classes by the binary paths, more by the multinomial
        model's.

        Parameters
        ----------
        X : array-like or sparse matrix, dask array, dl1 store, store path or dl1.Dataset
            (a Dataset: two classes only)
        y : array-like (n_samples,), optional
            Class labels; those of the store or Dataset when X is one and y is None.
        sample_weight : array-like (n_samples,), optional

        Returns
        -------
        self
        """
        self._validate_params()
        if self._many_labels(X, y):
            return self._fit_multiclass_cv(X, y, sample_weight)
        return super().fit(X, y, sample_weight)

    def _fit_multiclass_cv(self, X: Any, y: Any, sample_weight: Any) -> Any:
        """The multinomial model's cross-validation and refit (more than two classes)."""
        for name in ("standardize", "screen"):
            if getattr(self, name):
                raise ValueError(
                    f"{type(self).__name__}: {name}=True is not supported with more than two "
                    "classes yet (the multinomial cross-validation)"
                )
        X, labels, sample_weight = checked_multiclass_data(self, X, y, sample_weight)
        # scikit-learn's: the folds fit by the sample weights times the class weights (of
        # all rows) and score by the sample weights alone
        scored = sample_weight
        if scored is None and self.class_weight is not None:
            scored = np.ones(len(labels))
        sample_weight = self._with_class_weights(labels, sample_weight)
        with in_estimator_terms():
            res = fit_cv(
                X, labels, cv=5 if self.cv is None else self.cv, loss="logistic",
                sample_weight=sample_weight, score_weight=scored,
                fit_intercept=self.fit_intercept, tol=self.tol,
                max_rounds=self.max_iter, n_partitions=self.n_partitions, client=self.client,
                **self._grid(),
            )  # fmt: skip
        self.cv_result_ = res
        self._set_multiclass(MulticlassModel.from_result(
            res.fit, alpha=res.alpha, l1_ratio=res.l1_ratio, fit_intercept=self.fit_intercept,
            n_samples=len(labels),
        ))  # fmt: skip
        self._set_cv(res)
        return self

    def _check_combination(self) -> None:
        """Nothing between parameters: ``l1_ratios`` says the penalty."""

    def _scheme(self) -> tuple[str, str]:
        """More than two classes: the multinomial model (no one-vs-rest cross-validation)."""
        return "multinomial", "multinomial"

    def _cs(self) -> np.ndarray:
        if isinstance(self.Cs, numbers.Integral):
            return np.logspace(-4, 4, int(self.Cs))
        return np.sort(np.asarray(self.Cs, dtype=np.float64))

    def _ratios(self) -> Any:
        if self.l1_ratios is None:
            return 1.0
        r = np.asarray(self.l1_ratios, dtype=np.float64)
        return float(r) if r.ndim == 0 else r

    def _grid(self) -> dict[str, Any]:
        return {"Cs": self._cs(), "l1_ratio": self._ratios(), "scoring": self.scoring}

    def _l1_ratio(self) -> float:
        """The chosen ``l1_ratio`` (unfitted: the one cross-validated, given one)."""
        if hasattr(self, "l1_ratio_"):
            return float(self.l1_ratio_[0])
        return float(np.ravel(self._ratios())[0])

    def _set_loaded(self, res: Any, fitted: dict[str, Any]) -> None:
        super()._set_loaded(res, fitted)
        self.l1_ratio_ = np.full(self._n_choices(), float(res.l1_ratio))

    def _n_choices(self) -> int:
        """How many ``C_`` (and ``l1_ratio_``) scikit-learn reports: one per class for
        more than two classes, else one."""
        return len(self.classes_) if self._is_multiclass() else 1

    def _set_cv(self, res: Any) -> None:
        self.Cs_ = self._cs()
        self.C_ = np.full(self._n_choices(), self.Cs_[res.index])
        self.C_1se_ = float(self.Cs_[res.index_1se])
        self.l1_ratio_ = np.full(self._n_choices(), res.l1_ratio)
        self.alpha_ = res.alpha
        self.alpha_1se_ = res.alpha_1se
        scores = np.stack([r.scores.T for r in res.cv], axis=-1)  # (folds, Cs, l1_ratios)
        single = np.ndim(self._ratios()) == 0
        scores = scores[..., 0] if single else scores
        keys = self.classes_ if self._is_multiclass() else self.classes_[1:]
        self.scores_ = {key: scores.copy() for key in keys}
