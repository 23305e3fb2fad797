"""More than two classes for :class:`dl1.LogisticRegression`: the multinomial model of
:func:`dl1.fit_multiclass`, with scikit-learn's attributes (``classes_``, ``coef_`` of shape
``(K, p)``, ``intercept_`` ``(K,)``) and predictions (``decision_function`` ``(n, K)``,
``predict_proba`` rows summing to 1, ``predict`` the most probable class).

scikit-learn's multinomial objective is ``C sum_i CE_i + penalty(W)``; dl1's the mean
cross-entropy plus ``alpha penalty(W)``: the same minimiser with ``alpha = 1 / (n C)``.
"""

from __future__ import annotations

from typing import Any

import dask.array as da
import numpy as np
from scipy.special import log_softmax, softmax
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
from dl1.multiclass import fit_multiclass
from dl1.predict import decision_function

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
        res = fit_multiclass(
            X, labels, alpha=1.0 / (float(self.C) * total), l1_ratio=self._l1_ratio(),
            sample_weight=sample_weight, fit_intercept=self.fit_intercept, tol=self.tol,
            max_rounds=self.max_iter, n_partitions=self.n_partitions, stream=self.stream,
            client=self.client,
        )  # fmt: skip
        self.result_ = res
        self.classes_ = res.classes_
        self.n_features_in_ = int(res.coef_.shape[1])
        self.coef_ = res.coef_.toarray()
        self.intercept_ = res.intercept_ if self.fit_intercept else np.zeros(len(res.classes_))
        self.n_iter_ = int(res.n_rounds_)
        self.dual_gap_ = self.gap_ = float(res.gap_)
        return self

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
        cols = [decision_function(X, self.coef_[k], float(self.intercept_[k]))
                for k in range(self.coef_.shape[0])]  # fmt: skip
        return da.stack(cols, axis=1).rechunk({1: -1})  # a block holds every class's column

    def _multinomial_predict(self, X: Any) -> Any:
        d = self._decisions(X)
        classes = self.classes_
        if isinstance(d, np.ndarray):
            return classes[np.argmax(d, axis=1)]
        return d.map_blocks(lambda b: classes[np.argmax(b, axis=1)], dtype=classes.dtype,
                            drop_axis=1)  # fmt: skip

    def _multinomial_proba(self, X: Any, log: bool = False) -> Any:
        d = self._decisions(X)
        fn = log_softmax if log else softmax
        if isinstance(d, np.ndarray):
            return fn(d, axis=1)
        return d.map_blocks(lambda b: fn(b, axis=1), dtype=np.float64)
