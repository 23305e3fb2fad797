"""What dl1's scikit-learn estimators share: parameters, input routing, the fit.

An estimator is a thin shell over :func:`dl1.fit`: ``__init__`` stores its parameters
untouched (scikit-learn's contract), ``fit`` validates them once against
``_parameter_constraints`` (declared with :mod:`dl1.params`, the declarations
:func:`dl1.fit` itself uses), routes the data and copies the :class:`~dl1.FitResult` into
scikit-learn's attributes. Data in memory (NumPy, SciPy sparse, pandas, lists) is checked
as scikit-learn checks it (:func:`sklearn.utils.validation.validate_data`); data out of core
(a dask array, a dl1 store or its path, a :class:`dl1.Dataset`) goes to :func:`dl1.fit`
untouched, and predictions on it are lazy dask arrays computed where the blocks are.
"""

from __future__ import annotations

import contextlib
import numbers
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, clone
from sklearn.metrics import accuracy_score, r2_score
from sklearn.utils import check_random_state
from sklearn.utils.validation import (
    _check_feature_names,
    _check_sample_weight,
    check_is_fitted,
    validate_data,
)

from dl1.dataset import Dataset
from dl1.entry_labels import stored_labels
from dl1.estimators.record import estimator_record
from dl1.objective.datafits import datafit_class
from dl1.params import (
    NON_NEGATIVE_INT,
    PENALISED,
    POSITIVE,
    RELATIVE_TOL,
    UNIT,
    predicate,
    validate_params,
)
from dl1.penalised import fit as dl1_fit
from dl1.predict import as_input, decision_function
from dl1.runtime.compute import computed as compute_here
from dl1.saving import save_model
from dl1.solvers.result import convergence_warning
from dl1.store import Store
from dl1.store.location import is_store_source

#: Parameters of :func:`dl1.fit` the estimators take under the same name.
SHARED = ("fit_intercept", "standardize", "n_partitions", "stream", "screen", "solver",
          "client", "max_epochs")  # fmt: skip


@predicate("None, an int >= 0 or a numpy.random.RandomState")
def is_random_state(value: Any) -> bool:
    """scikit-learn's ``random_state`` (a Generator too): a seed or a random source."""
    return (
        value is None
        or NON_NEGATIVE_INT(value)
        or isinstance(value, (np.random.RandomState, np.random.Generator))
    )


@predicate("None or an int")
def is_n_jobs(value: Any) -> bool:
    """scikit-learn's ``n_jobs``: accepted, the parallelism being the cluster's."""
    return value is None or (isinstance(value, numbers.Integral) and not isinstance(value, bool))


#: Constraints of every estimator's parameters, from :data:`dl1.params.PENALISED` where the
#: parameter is dl1.fit's (``max_iter`` is its ``max_rounds``).
CONSTRAINTS: dict[str, list[Any]] = {
    **{name: PENALISED[name] for name in SHARED},
    "alpha": [POSITIVE],
    "l1_ratio": [UNIT],
    "C": [POSITIVE],
    "tol": [RELATIVE_TOL],
    "max_iter": PENALISED["max_rounds"],
    "warm_start": ["boolean"],
    "random_state": [is_random_state],
    "positive": PENALISED["positive"],
    "n_jobs": [is_n_jobs],
}


def is_out_of_core(X: Any) -> bool:
    """A dask array, a dl1 store or its path, or a :class:`dl1.Dataset`: data passed to
    :func:`dl1.fit` and to :mod:`dl1.predict` untouched."""
    if is_store_source(X):
        return True
    if type(X).__module__.startswith("dask."):
        return True
    if isinstance(X, Store):
        return True
    return isinstance(X, Dataset)


def computed(a: Any) -> np.ndarray:
    """A dask array computed (length-n vectors only) on the scheduler a solve here uses
    (:func:`dl1.runtime.compute.computed`), anything else as an ndarray."""
    return np.asarray(compute_here(a)[0] if hasattr(a, "compute") else a)


class DL1Estimator(BaseEstimator):
    """Base of dl1's estimators (not public): subclasses set ``_loss`` and the penalty
    (:meth:`_alpha`, :meth:`_l1_ratio`), and how targets are checked (:meth:`_targets`)."""

    _loss = "squared"
    #: The losses of the saved fits (without an estimator record) this class loads as its
    #: own (:meth:`_from_fit`, :func:`dl1.load_estimator`); none for the CV estimators.
    _fits: ClassVar[tuple[str, ...]] = ()
    _parameter_constraints: dict[str, list[Any]] = {}

    # -- parameters ------------------------------------------------------------------------
    def _validate_params(self) -> None:
        """Check every parameter against ``_parameter_constraints`` (dl1's declarations;
        replaces scikit-learn's, which reads its own constraint types)."""
        validate_params(self._parameter_constraints, self.get_params(deep=False),
                        f"{type(self).__name__}")  # fmt: skip
        self._check_combination()

    def _check_combination(self) -> None:
        """Constraints between parameters (none by default)."""

    def _alpha(self, total_weight: float) -> float:
        return float(self.alpha)

    def _l1_ratio(self) -> float:
        return 1.0

    def _penalty_options(self) -> dict[str, Any]:
        """Options of the penalty beyond alpha and l1_ratio (none by default)."""
        return {}

    def _seed(self) -> int:
        rs = self.random_state
        if rs is None:
            return 0
        if isinstance(rs, numbers.Integral):
            return int(rs)
        return int(check_random_state(rs).randint(np.iinfo(np.int32).max)
                   if isinstance(rs, np.random.RandomState)
                   else rs.integers(np.iinfo(np.int32).max))  # fmt: skip

    # -- fit --------------------------------------------------------------------------------
    def fit(self, X: Any, y: Any = None, sample_weight: Any = None) -> DL1Estimator:
        """Fit the model, certified by its duality gap (:func:`dl1.fit`).

        Parameters
        ----------
        X : array-like or sparse matrix (n_samples, n_features), dask array, dl1 store,
            store path or dl1.Dataset
            In memory: checked and converted to float64 as scikit-learn does; out of core:
            passed to :func:`dl1.fit` untouched (its blocks never gathered).
        y : array-like (n_samples,), optional
            Targets; read from the store or Dataset when X is one and y is None.
        sample_weight : array-like (n_samples,), optional

        Returns
        -------
        self
        """
        self._validate_params()
        X, y, sample_weight, total = self._inputs(X, y, sample_weight)
        kwargs = {name: getattr(self, name) for name in SHARED}
        with in_estimator_terms():
            res = dl1_fit(
                X, y, alpha=self._alpha(total), l1_ratio=self._l1_ratio(), loss=self._loss,
                sample_weight=sample_weight, tol=self.tol, max_rounds=self.max_iter,
                seed=self._seed(), **kwargs, **self._warm_start(),
                **self._penalty_options(),
            )  # fmt: skip
        self._set_result(res)
        return self

    def _inputs(self, X: Any, y: Any, sample_weight: Any) -> tuple[Any, Any, Any, float]:
        """``(X, y, sample_weight, total weight)`` for :func:`dl1.fit`; sets
        ``n_features_in_`` (and ``feature_names_in_`` for a DataFrame)."""
        if is_out_of_core(X):
            _check_feature_names(self, X, reset=True)
            self.n_features_in_ = _n_features(X)
            y = self._targets(None if y is None else computed(y), X)
            if sample_weight is not None:
                sample_weight = computed(sample_weight).astype(np.float64)
                if y is not None:
                    self._check_weighted_targets(y, sample_weight)
                return X, y, sample_weight, float(sample_weight.sum())
            own = getattr(X, "sample_weight", None)  # a Dataset's weights, read by dl1.fit
            return X, y, None, float(_n_samples(X) if own is None else np.sum(own))
        X, y = validate_data(self, X, y, accept_sparse=("csr", "csc"), dtype=np.float64,
                             y_numeric=not datafit_class(self._loss).classifies)  # fmt: skip
        y = self._targets(y, None)
        if sample_weight is not None:
            sample_weight = _check_sample_weight(sample_weight, X, dtype=np.float64)
            self._check_weighted_targets(y, sample_weight)
        return X, y, sample_weight, _total(sample_weight, X.shape[0])

    def _targets(self, y: Any, source: Any) -> Any:
        """Targets as :func:`dl1.fit` takes them (regressors: unchanged; None: those of the
        out-of-core ``source``, read by dl1.fit)."""
        return y

    def _check_weighted_targets(self, y: Any, sample_weight: np.ndarray) -> None:
        """Targets that weights leave unusable are refused (classifiers: both classes)."""

    def _warm_start(self) -> dict[str, Any]:
        """``coef_init`` / ``intercept_init`` from the previous fit when ``warm_start``."""
        if not (self.warm_start and hasattr(self, "coef_")):
            return {}
        coef = np.ravel(self.coef_)
        if coef.shape[0] != self.n_features_in_:
            return {}
        b = float(np.ravel(self.intercept_)[0]) if self.fit_intercept else None
        return {"coef_init": coef, "intercept_init": b}

    def _set_result(self, res: Any) -> None:
        self.result_ = res
        self.coef_ = np.asarray(res.coef_, dtype=np.float64)
        self.intercept_ = float(res.intercept_) if self.fit_intercept else 0.0
        self.n_iter_ = int(res.n_rounds_)
        self.dual_gap_ = float(res.dual_gap_)
        self.gap_ = float(res.gap_)

    @classmethod
    def _from_fit(cls, model: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The parameters of this estimator fitting ``model`` (a FitResult saved without an
        estimator record) and the fitted attributes the model does not hold; None when
        ``model`` is not one of this class's fits."""
        if model.loss not in cls._fits:
            return None
        params: dict[str, Any] = {"fit_intercept": bool(model.fit_intercept)}
        if 0.0 < model.tol < 1.0:
            params["tol"] = float(model.tol)
        return params, {}

    def _set_loaded(self, res: Any, fitted: dict[str, Any]) -> None:
        """The attributes a fit sets, from a saved model (:func:`dl1.load_estimator`):
        ``n_features_in_`` (the input check's), ``fitted`` (``classes_``,
        ``feature_names_in_``, ...: what the model alone does not hold), then ``res``'s
        by :meth:`_set_result`, as after :meth:`fit`."""
        self.n_features_in_ = int(res.n_features_in_)
        for name, value in fitted.items():
            setattr(self, name, value)
        self._set_result(res)

    def save(self, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
        """Write the fitted estimator to the directory ``path`` (JSON and ``.npy``, no
        pickle), read back by :func:`dl1.load_estimator` as this estimator, fitted.

        The files are ``result_``'s saved model (:func:`dl1.saving.save_model`; so
        :func:`dl1.load_model` reads them as ``result_``) with a record of the estimator:
        its class, its parameters that JSON holds exactly, a classifier's ``classes_`` and
        ``class_weight_``, and ``feature_names_in_``
        (:func:`dl1.estimators.record.estimator_record`).
        Not saved: ``client`` (a connection), parameters that are not JSON (a
        ``RandomState``, a solver object, a ``cv`` splitter, a dict ``class_weight``: the
        loaded estimator has their defaults), ``result_``'s history and timings, and the
        CV estimators' folds and scores (``cv_result_``, ``mse_path_``, ...).

        Parameters
        ----------
        path : str or PathLike
            The directory to create.
        overwrite : bool, default=False
            Replace ``path`` if it holds a saved model (nothing else is ever replaced).

        Returns
        -------
        Path
            The directory written.

        Raises
        ------
        sklearn.exceptions.NotFittedError
            The estimator is not fitted.
        FileExistsError
            ``path`` exists and ``overwrite`` is False, or it is not a saved model.
        """
        check_is_fitted(self)
        return save_model(self.result_, path, overwrite=overwrite,
                          estimator=estimator_record(self))  # fmt: skip

    @property
    def sparse_coef_(self) -> sp.csr_matrix:
        """``coef_`` as a sparse row (scikit-learn's ``ElasticNet.sparse_coef_``)."""
        check_is_fitted(self)
        return sp.csr_matrix(np.atleast_2d(self.coef_))

    def to_sklearn(self) -> Any:
        """The fitted scikit-learn estimator with the same predictions
        (:func:`dl1.saving.to_sklearn` of ``result_``), a classifier's ``classes_`` this
        estimator's."""
        check_is_fitted(self)
        est = self.result_.to_sklearn()
        if hasattr(self, "classes_"):
            est.classes_ = self.classes_
        return est

    # -- predictions ------------------------------------------------------------------------
    def _coef_intercept(self) -> tuple[np.ndarray, float]:
        return np.ravel(self.coef_), float(np.ravel(self.intercept_)[0])

    def _decision(self, X: Any) -> Any:
        """``X @ coef_ + intercept_``: an ndarray in memory, a lazy dask array out of core."""
        if not is_out_of_core(X):
            return np.asarray(decision_function(self._validated(X), *self._coef_intercept()))
        check_is_fitted(self)
        return decision_function(X, *self._coef_intercept())

    def _validated(self, X: Any) -> Any:
        """In-memory X checked against the fit (features, names, finiteness), float64."""
        check_is_fitted(self)
        return validate_data(self, X, accept_sparse=("csr", "csc"), dtype=np.float64,
                             reset=False)  # fmt: skip

    def _score_out_of_core(self, X: Any, y: Any, sample_weight: Any) -> float:
        """R^2 (regressors) or accuracy (classifiers) of the lazy predictions on X, gathered
        (length n); y None: the store's (test split) or the Dataset's own targets."""
        y = stored_labels(X, "test") if y is None else computed(y)
        pred = computed(self.predict(X))
        sw = None if sample_weight is None else computed(sample_weight)
        metric = accuracy_score if datafit_class(self._loss).classifies else r2_score
        return float(metric(y, pred, sample_weight=sw))

    # -- scikit-learn protocol --------------------------------------------------------------
    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags

    def __sklearn_clone__(self) -> DL1Estimator:
        """A clone sharing the client (a cluster connection is not copied)."""
        params = {k: v if k == "client" else clone(v, safe=False)
                  for k, v in self.get_params(deep=False).items()}  # fmt: skip
        return type(self)(**params)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the client (a live connection): unpickled, it predicts in
        process or on the current client."""
        state = dict(super().__getstate__())
        state["client"] = None
        return state


@contextlib.contextmanager
def in_estimator_terms() -> Iterator[None]:
    """Re-issue the fit's ConvergenceWarnings in the estimator's terms: its parameter is
    ``max_iter``, not dl1.fit's ``max_rounds``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            caught = list(caught)
    for w in caught:
        message = str(w.message)
        if issubclass(w.category, convergence_warning()):
            message = message.replace("max_rounds", "max_iter")
        warnings.warn_explicit(message, w.category, w.filename, w.lineno)


def _n_features(X: Any) -> int:
    return int(as_input(X, "train").shape[1])


def _n_samples(X: Any) -> int:
    return int(as_input(X, "train").shape[0])


def _total(sample_weight: np.ndarray | None, n: int) -> float:
    """The weight the classifiers' ``alpha = 1 / (C * total)`` divides by."""
    return float(n if sample_weight is None else np.sum(sample_weight))
