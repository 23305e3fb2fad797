"""More than two classes for :class:`dl1.LogisticRegression` and :class:`dl1.LinearSVC`:
the multinomial model or ``K`` one-vs-rest binary problems of :func:`dl1.fit_multiclass`,
with scikit-learn's attributes (``classes_``, ``coef_`` of shape ``(K, p)``, ``intercept_``
``(K,)``) and predictions (``decision_function`` ``(n, K)``, ``predict`` the class of the
largest decision value; the logistic models' ``predict_proba`` rows summing to 1).

scikit-learn's objectives are ``C sum_i loss_i + penalty(W)``; dl1's the mean loss plus
``alpha penalty(W)``: the same minimiser with ``alpha = 1 / (n C)`` (``1 / (C sum_i s_i)``
weighted). One-vs-rest is liblinear's scheme (scikit-learn's ``LinearSVC``, and its
``OneVsRestClassifier``): class ``k`` against the rest, each problem that objective.

The fit's ``result_`` is a :class:`dl1.models.MulticlassModel` (the solver's result with the
problem it solved, its scheme and loss), which ``save`` writes and :func:`dl1.load_estimator`
reads back.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.utils.class_weight import compute_class_weight
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import (
    _check_feature_names,
    _check_sample_weight,
    check_is_fitted,
    validate_data,
)

from dl1.entry_labels import stored_labels
from dl1.estimators.base import computed, in_estimator_terms, is_out_of_core
from dl1.models import (
    MulticlassModel,
    labels_of_decisions,
    multiclass_decisions,
    probabilities_of_decisions,
)
from dl1.multiclass import fit_multiclass

#: What the multiclass fit does not take yet, with the setting that would be ignored.
NOT_YET = {"screen": False}


def labels_of(X: Any, y: Any) -> np.ndarray | None:
    """The training labels: ``y`` (a column vector flattened), or those stored with an
    out-of-core ``X``; None when there are none to read."""
    if y is not None:
        y = computed(y) if is_out_of_core(X) else np.asarray(y)
        return y.ravel() if y.ndim == 2 and y.shape[1] == 1 else y
    return stored_labels(X, "train") if is_out_of_core(X) else None


def checked_multiclass_data(
    est: Any, X: Any, y: Any, sample_weight: Any
) -> tuple[Any, Any, Any]:
    """``(X, labels, sample_weight)`` of a K-class fit, checked as scikit-learn's estimators
    check them (in memory) or computed once (out of core: the labels read from the store)."""
    if is_out_of_core(X):
        _check_feature_names(est, X, reset=True)
        y = None if y is None else computed(y)
        if sample_weight is not None:
            sample_weight = computed(sample_weight).astype(np.float64)
    else:
        X, y = validate_data(est, X, y, accept_sparse=("csr", "csc"), dtype=np.float64)
        check_classification_targets(y)
        if sample_weight is not None:
            sample_weight = _check_sample_weight(sample_weight, X, dtype=np.float64)
    return X, labels_of(X, y), sample_weight


class MulticlassFit:
    """The side of a classifier taken when the labels have more than two classes (a mixin
    of :class:`dl1.LogisticRegression` and :class:`dl1.LinearSVC`, before their binary
    base): the fit, the predictions, saving and loading, the conversion to scikit-learn.
    A class says its scheme and loss by :meth:`_scheme`, and which saved multiclass models
    it loads by ``_multiclass_losses``."""

    #: The losses of the saved multiclass models this class loads as its own.
    _multiclass_losses: tuple[str, ...] = ()

    def _scheme(self) -> tuple[str, str]:
        """``(multi_class, loss)`` of the fit of more than two classes, as
        :class:`~dl1.models.MulticlassModel` names them."""
        raise NotImplementedError

    def fit(self, X: Any, y: Any = None, sample_weight: Any = None) -> Any:
        """Fit the model, certified by its duality gap: two classes by :func:`dl1.fit`,
        more by :func:`dl1.fit_multiclass` (every class sharing each pass over the data).

        Parameters
        ----------
        X, y, sample_weight
            As :meth:`dl1.Lasso.fit`'s; ``y`` holds class labels (read from the store or
            Dataset when X is one and y is None).

        Returns
        -------
        self
        """
        self._validate_params()
        if self._many_labels(X, y):
            return self._fit_multiclass(X, y, sample_weight)
        return super().fit(X, y, sample_weight)  # type: ignore[misc]

    @staticmethod
    def _many_labels(X: Any, y: Any) -> bool:
        """Whether the labels (``y``, or those of the store or Dataset ``X``) hold more
        than two classes: the fit is then the multiclass one."""
        labels = labels_of(X, y)
        return labels is not None and np.unique(labels).shape[0] > 2

    def _fit_multiclass(self, X: Any, y: Any, sample_weight: Any) -> Any:
        self._check_multiclass()
        X, labels, sample_weight = checked_multiclass_data(self, X, y, sample_weight)
        sample_weight = self._with_class_weights(labels, sample_weight)
        total = len(labels) if sample_weight is None else float(sample_weight.sum())
        alpha, scheme = 1.0 / (float(self.C) * total), self._scheme()
        epochs = {} if self.max_epochs is None else {"max_epochs": self.max_epochs}
        with in_estimator_terms():
            res = fit_multiclass(
                X, labels, alpha=alpha, l1_ratio=self._l1_ratio(), multi_class=scheme[0],
                loss="logistic" if scheme[1] == "multinomial" else scheme[1],
                sample_weight=sample_weight, fit_intercept=self.fit_intercept, tol=self.tol,
                max_rounds=self.max_iter, standardize=self.standardize,
                n_partitions=self.n_partitions, stream=self.stream, client=self.client,
                **epochs, **self._multiclass_warm_start(labels),
            )  # fmt: skip
        self._set_multiclass(MulticlassModel.from_result(
            res, alpha=alpha, l1_ratio=self._l1_ratio(), fit_intercept=self.fit_intercept,
            n_samples=len(labels),
        ))  # fmt: skip
        return self

    def _multiclass_warm_start(self, labels: np.ndarray) -> dict[str, Any]:
        """``coef_init`` / ``intercept_init`` from the previous fit when ``warm_start`` and
        it was a multiclass fit of the same classes (scikit-learn's ``warm_start``; a
        different feature count is refused by the fit, as scikit-learn refuses it)."""
        previous = getattr(self, "result_", None)
        if not (self.warm_start and isinstance(previous, MulticlassModel)
                and np.array_equal(previous.classes_, np.unique(labels))):  # fmt: skip
            return {}
        return {"coef_init": previous.coef_, "intercept_init": previous.intercept_}

    def _check_multiclass(self) -> None:
        """Refuse what the fit of more than two classes does not take (yet)."""
        for name, default in NOT_YET.items():
            if getattr(self, name) != default:
                raise ValueError(
                    f"{type(self).__name__}: {name}={getattr(self, name)!r} is not supported "
                    f"with more than two classes yet (the multiclass fit)"
                )
        if self._scheme()[1] == "hinge" and self._l1_ratio() != 1.0:
            raise ValueError(
                f"{type(self).__name__}: loss='hinge' with more than two classes (one-vs-rest) "
                f"takes penalty='l1' only (exact LP working sets of the pure L1 penalty); got "
                f"penalty={self.penalty!r}, l1_ratio={self.l1_ratio!r}: use "
                "loss='squared_hinge' for the elastic net"
            )

    def _set_multiclass(self, model: MulticlassModel) -> None:
        """scikit-learn's attributes from a multiclass fit (made here or loaded)."""
        self.result_ = model
        self.classes_ = model.classes_
        self.n_features_in_ = model.n_features_in_
        self.coef_ = model.coef_.toarray()
        self.intercept_ = model.intercept_ if self.fit_intercept else np.zeros(model.n_classes)
        self.n_iter_ = int(model.n_rounds_)
        self.dual_gap_ = self.gap_ = float(model.gap_)

    def _set_loaded(self, res: Any, fitted: dict[str, Any]) -> None:
        """A loaded multiclass model's attributes as :meth:`_fit_multiclass` sets them
        (``fitted``: those of the estimator record); a binary model's as the base class's."""
        if getattr(res, "saved_kind", None) != "multiclass":
            super()._set_loaded(res, fitted)  # type: ignore[misc]
            return
        for name, value in fitted.items():
            setattr(self, name, value)
        self._set_multiclass(res)

    @classmethod
    def fits_multiclass(cls, model: Any) -> bool:
        """Whether this class fits multiclass models of the scheme and loss of ``model``."""
        return model.loss in cls._multiclass_losses

    @classmethod
    def _from_fit(cls, model: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """A multiclass model saved without an estimator record: the parameters that fit it
        (``C = 1 / (n_samples * alpha)``, the unweighted fit's; its scheme) and its
        classes; None when this class does not fit it. A binary model: as the base
        class's."""
        if getattr(model, "saved_kind", None) != "multiclass":
            return super()._from_fit(model)  # type: ignore[misc]
        if not cls.fits_multiclass(model) or model.penalty != "l1":
            return None  # no estimator takes the grouped penalty
        r = float(model.l1_ratio)
        params: dict[str, Any] = {"fit_intercept": bool(model.fit_intercept),
                                  "penalty": "l1" if r == 1.0 else "elasticnet"}  # fmt: skip
        if "multi_class" in cls._get_param_names():  # type: ignore[attr-defined]
            params["multi_class"] = model.multi_class
        if r != 1.0:
            params["l1_ratio"] = r
        if 0.0 < model.tol < 1.0:
            params["tol"] = float(model.tol)
        if model.n_samples_ and model.alpha > 0:
            params["C"] = 1.0 / (model.n_samples_ * model.alpha)
        return params, {"classes_": model.classes_.copy(), "class_weight_": None}

    def _with_class_weights(self, labels: np.ndarray, sample_weight: Any) -> Any:
        """Each sample's weight times its class's (``class_weight``, scikit-learn's rule:
        ``"balanced"`` is ``total / (K * class total)`` of the sample weights);
        ``class_weight_`` set (None without)."""
        self.class_weight_ = None
        if self.class_weight is None:
            return sample_weight
        classes, codes = np.unique(labels, return_inverse=True)
        self.class_weight_ = compute_class_weight(
            self.class_weight, classes=classes, y=labels, sample_weight=sample_weight
        )
        per_sample = self.class_weight_[codes]
        return per_sample if sample_weight is None else sample_weight * per_sample

    def _is_multiclass(self) -> bool:
        return len(getattr(self, "classes_", ())) > 2

    def _decisions(self, X: Any) -> Any:
        """``X @ coef_.T + intercept_`` (n, K): an ndarray in memory, a lazy dask array out
        of core (one lazy column a class, over the same reads of X)."""
        check_is_fitted(self)
        if not is_out_of_core(X):
            return np.asarray(self._validated(X) @ self.coef_.T + self.intercept_)
        return multiclass_decisions(X, self.coef_, self.intercept_)

    def decision_function(self, X: Any) -> Any:
        """Binary: the signed distance, > 0 for ``classes_[1]``; more classes: the ``(n, K)``
        decision values ``X @ coef_.T + intercept_``. An ndarray in memory, a lazy dask
        array out of core."""
        if self._is_multiclass():
            return self._decisions(X)
        return super().decision_function(X)  # type: ignore[misc]

    def predict(self, X: Any) -> Any:
        """The class of each sample (more than two classes: of its largest decision value,
        the first on a tie, as scikit-learn's); lazy, blockwise, for out-of-core X."""
        if self._is_multiclass():
            return labels_of_decisions(self._decisions(X), self.classes_)
        return super().predict(X)  # type: ignore[misc]

    def _multiclass_proba(self, X: Any, log: bool = False) -> Any:
        """The class probabilities (or their logs) of the fitted model's scheme: the
        softmax of a multinomial model, the normalised sigmoids of a one-vs-rest one."""
        d = self._decisions(X)
        return probabilities_of_decisions(d, log=log, scheme=self.result_.multi_class)

    def to_sklearn(self) -> Any:
        """The fitted scikit-learn estimator with the same predictions (more than two
        classes: :meth:`dl1.models.MulticlassModel.to_sklearn`'s, with this estimator's
        ``C`` where it has one)."""
        if not self._is_multiclass():
            return super().to_sklearn()  # type: ignore[misc]
        check_is_fitted(self)
        est = self.result_.to_sklearn()
        for e in (est, getattr(est, "estimator", None), *getattr(est, "estimators_", ())):
            if e is not None and "C" in e.get_params(deep=False):
                e.set_params(C=float(self.C))
        return est

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()  # type: ignore[misc]
        tags.classifier_tags.multi_class = True
        return tags
