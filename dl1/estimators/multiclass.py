"""More than two classes for :class:`dl1.LogisticRegression`: the multinomial model of
:func:`dl1.fit_multiclass`, with scikit-learn's attributes (``classes_``, ``coef_`` of shape
``(K, p)``, ``intercept_`` ``(K,)``) and predictions (``decision_function`` ``(n, K)``,
``predict_proba`` rows summing to 1, ``predict`` the most probable class).

scikit-learn's multinomial objective is ``C sum_i CE_i + penalty(W)``; dl1's the mean
cross-entropy plus ``alpha penalty(W)``: the same minimiser with ``alpha = 1 / (n C)``.

The fit's ``result_`` is a :class:`dl1.models.MulticlassModel` (the solver's result with the
problem it solved), which ``save`` writes and :func:`dl1.load_estimator` reads back.
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
from dl1.estimators.base import computed, is_out_of_core
from dl1.models import (
    MulticlassModel,
    labels_of_decisions,
    multiclass_decisions,
    probabilities_of_decisions,
)
from dl1.multiclass import fit_multiclass

#: What the multinomial fit does not take yet, with the setting that would be ignored.
NOT_YET = {"standardize": False, "warm_start": False, "screen": False}


def labels_of(X: Any, y: Any) -> np.ndarray | None:
    """The training labels: ``y`` (a column vector flattened), or those stored with an
    out-of-core ``X``; None when there are none to read."""
    if y is not None:
        y = computed(y) if is_out_of_core(X) else np.asarray(y)
        return y.ravel() if y.ndim == 2 and y.shape[1] == 1 else y
    return stored_labels(X, "train") if is_out_of_core(X) else None


class MultinomialFit:
    """The multinomial side of a classifier (a mixin of :class:`dl1.LogisticRegression`):
    taken when the labels have more than two classes."""

    def _fit_multinomial(self, X: Any, y: Any, sample_weight: Any) -> Any:
        for name, default in NOT_YET.items():
            if getattr(self, name) != default:
                raise ValueError(
                    f"{type(self).__name__}: {name}={getattr(self, name)!r} is not supported "
                    f"with more than two classes yet (the multinomial fit)"
                )
        if is_out_of_core(X):
            _check_feature_names(self, X, reset=True)
            y = None if y is None else computed(y)
            if sample_weight is not None:
                sample_weight = computed(sample_weight).astype(np.float64)
        else:
            X, y = validate_data(self, X, y, accept_sparse=("csr", "csc"), dtype=np.float64)
            check_classification_targets(y)
            if sample_weight is not None:
                sample_weight = _check_sample_weight(sample_weight, X, dtype=np.float64)
        labels = labels_of(X, y)  # read once: out of core, from the store
        sample_weight = self._with_class_weights(labels, sample_weight)
        total = len(labels) if sample_weight is None else float(sample_weight.sum())
        alpha = 1.0 / (float(self.C) * total)
        res = fit_multiclass(
            X, labels, alpha=alpha, l1_ratio=self._l1_ratio(),
            sample_weight=sample_weight, fit_intercept=self.fit_intercept, tol=self.tol,
            max_rounds=self.max_iter, n_partitions=self.n_partitions, stream=self.stream,
            client=self.client,
        )  # fmt: skip
        self._set_multinomial(MulticlassModel.from_result(
            res, alpha=alpha, l1_ratio=self._l1_ratio(), fit_intercept=self.fit_intercept,
            n_samples=len(labels),
        ))  # fmt: skip
        return self

    def _set_multinomial(self, model: MulticlassModel) -> None:
        """scikit-learn's attributes from a multinomial fit (made here or loaded)."""
        self.result_ = model
        self.classes_ = model.classes_
        self.n_features_in_ = model.n_features_in_
        self.coef_ = model.coef_.toarray()
        self.intercept_ = model.intercept_ if self.fit_intercept else np.zeros(model.n_classes)
        self.n_iter_ = int(model.n_rounds_)
        self.dual_gap_ = self.gap_ = float(model.gap_)

    def _set_loaded(self, res: Any, fitted: dict[str, Any]) -> None:
        """A loaded multinomial model's attributes as :meth:`_fit_multinomial` sets them
        (``fitted``: those of the estimator record); a binary model's as the base class's."""
        if getattr(res, "saved_kind", None) != "multiclass":
            super()._set_loaded(res, fitted)  # type: ignore[misc]
            return
        for name, value in fitted.items():
            setattr(self, name, value)
        self._set_multinomial(res)

    @classmethod
    def _from_fit(cls, model: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """A multinomial model saved without an estimator record: the parameters that fit it
        (``C = 1 / (n_samples * alpha)``, the unweighted fit's) and its classes; None for the
        grouped penalty (no estimator takes it). A binary model: as the base class's."""
        if getattr(model, "saved_kind", None) != "multiclass":
            return super()._from_fit(model)  # type: ignore[misc]
        if model.penalty != "l1":
            return None
        r = float(model.l1_ratio)
        params: dict[str, Any] = {"fit_intercept": bool(model.fit_intercept),
                                  "penalty": "l1" if r == 1.0 else "elasticnet"}  # fmt: skip
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

    def _is_multinomial(self) -> bool:
        return len(getattr(self, "classes_", ())) > 2

    def _decisions(self, X: Any) -> Any:
        """``X @ coef_.T + intercept_`` (n, K): an ndarray in memory, a lazy dask array out
        of core (one lazy column a class, over the same reads of X)."""
        check_is_fitted(self)
        if not is_out_of_core(X):
            return np.asarray(self._validated(X) @ self.coef_.T + self.intercept_)
        return multiclass_decisions(X, self.coef_, self.intercept_)

    def _multinomial_predict(self, X: Any) -> Any:
        return labels_of_decisions(self._decisions(X), self.classes_)

    def _multinomial_proba(self, X: Any, log: bool = False) -> Any:
        return probabilities_of_decisions(self._decisions(X), log=log)
