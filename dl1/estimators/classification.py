"""L1 / elastic-net classifiers: logistic regression and linear SVMs, fitted by
:func:`dl1.fit` (two classes) or :func:`dl1.fit_multiclass` (more:
:mod:`dl1.estimators.multiclass`) with scikit-learn's parametrisation.

scikit-learn minimises ``C sum_i s_i loss_i + penalty(w)``; dl1 minimises ``(1 / sum_i s_i)
sum_i s_i loss_i + alpha penalty(w)``. Dividing the first by ``C sum_i s_i`` gives the second
with ``alpha = 1 / (C sum_i s_i)`` (``1 / (n C)`` unweighted): the same minimiser. Any two
labels (strings, ints, bools) are mapped to -1 / +1 (``classes_[1]`` is +1) and back.
``class_weight`` multiplies each sample's weight by its class's, as scikit-learn does.
"""

from __future__ import annotations

from typing import Any

import dask.array as da
import numpy as np
from sklearn.base import ClassifierMixin
from sklearn.utils.class_weight import compute_class_weight
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted

from dl1.entry_labels import stored_labels
from dl1.errors import ValidationError
from dl1.estimators.base import (
    CONSTRAINTS,
    SHARED,
    DL1Estimator,
    computed,
    is_out_of_core,
)
from dl1.estimators.multiclass import MulticlassFit
from dl1.labels import as_pm1, with_classes
from dl1.params import UNIT, InvalidParameterError, Options, predicate
from dl1.predict import predict_proba


@predicate('None, "balanced" or a dict from class label to weight')
def is_class_weight(value: Any) -> bool:
    """scikit-learn's ``class_weight``."""
    return (
        value is None or isinstance(value, dict) or (isinstance(value, str) and value == "balanced")
    )


def class_weights(
    class_weight: Any, classes: np.ndarray, y: np.ndarray, sample_weight: np.ndarray | None
) -> np.ndarray:
    """The weights of ``classes`` (-1 then +1 in ``y``): a dict's (classes it leaves out
    weigh 1; a key that is no class is refused, by scikit-learn's
    ``compute_class_weight``), or ``"balanced"``: ``total / (2 * class total)`` of the
    sample weights (1 each without them), scikit-learn's weighted rule."""
    if class_weight != "balanced":
        return compute_class_weight(class_weight, classes=classes, y=classes)
    sw = np.ones(y.shape[0]) if sample_weight is None else sample_weight
    per_class = np.array([sw[y < 0].sum(), sw[y > 0].sum()])
    return sw.sum() / (2.0 * per_class)


class _Classifier(ClassifierMixin, DL1Estimator):
    """Binary classifier: labels, ``alpha`` from ``C``, the penalty from ``penalty`` and
    ``l1_ratio``; ``coef_`` of shape (1, n_features) and ``intercept_`` (1,) as
    scikit-learn's linear classifiers."""

    @classmethod
    def _from_fit(cls, model: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
        got = super()._from_fit(model)
        if got is None:
            return None
        params, fitted = got
        r, alpha, n = float(model.l1_ratio), float(model.alpha), model.n_samples_
        params["penalty"] = "l1" if r == 1.0 else "elasticnet"
        if r != 1.0:
            params["l1_ratio"] = r
        if n and alpha > 0:  # C = 1 / (n_samples * alpha), the unweighted fit's
            params["C"] = 1.0 / (n * alpha)
        classes = model.classes_
        fitted["classes_"] = np.array([-1.0, 1.0]) if classes is None else classes.copy()
        fitted["class_weight_"] = None
        return params, fitted

    def _alpha(self, total_weight: float) -> float:
        return 1.0 / (float(self.C) * total_weight)

    def _inputs(self, X: Any, y: Any, sample_weight: Any) -> tuple[Any, Any, Any, float]:
        """As the base class's, each sample's weight then multiplied by its class's
        (``class_weight``); ``class_weight_`` set (None without)."""
        X, y, sample_weight, total = super()._inputs(X, y, sample_weight)
        self.class_weight_ = None
        if self.class_weight is None:
            return X, y, sample_weight, total
        # as -1 / +1 (y given: mapped already; else the labels stored with X)
        labels = y if y is not None else as_pm1(stored_labels(X, "train"), self.classes_)
        if sample_weight is None and is_out_of_core(X):
            own = getattr(X, "sample_weight", None)  # a Dataset's weights
            sample_weight = None if own is None else computed(own).astype(np.float64)
        self.class_weight_ = class_weights(self.class_weight, self.classes_, labels,
                                           sample_weight)  # fmt: skip
        per_sample = self.class_weight_[(labels > 0).astype(np.intp)]
        sample_weight = per_sample if sample_weight is None else sample_weight * per_sample
        self._check_weighted_targets(labels, sample_weight)
        return X, y, sample_weight, float(sample_weight.sum())

    def _l1_ratio(self) -> float:
        return 1.0 if self.penalty == "l1" else float(self.l1_ratio)

    def _check_combination(self) -> None:
        if self.penalty == "elasticnet" and self.l1_ratio is None:
            raise InvalidParameterError(
                f"{type(self).__name__}: penalty='elasticnet' needs l1_ratio (in [0, 1])"
            )
        if self.penalty == "l1" and self.l1_ratio not in (None, 1, 1.0):
            raise InvalidParameterError(
                f"{type(self).__name__}: l1_ratio={self.l1_ratio!r} is only used with "
                "penalty='elasticnet' (penalty='l1' is l1_ratio=1)"
            )

    def _targets(self, y: Any, source: Any) -> Any:
        """Labels as -1.0 / +1.0, ``classes_`` set; None (out of core, y not given): the
        source's own labels, any two, which :func:`dl1.fit` maps to -1 / +1 itself (the
        larger to +1, as ``classes_[1]``: :mod:`dl1.labels`)."""
        if y is None:
            labels = stored_labels(source, "train")
            if labels is None:
                raise ValidationError("y is required unless X is a dl1 store or Dataset")
            check_classification_targets(labels)
            self.classes_ = self._classes(labels)
            return None
        y = np.asarray(y)
        if y.ndim == 2 and y.shape[1] == 1:
            y = y.ravel()
        check_classification_targets(y)
        self.classes_ = self._classes(y)
        return np.where(y == self.classes_[1], 1.0, -1.0)

    def _check_weighted_targets(self, y: Any, sample_weight: np.ndarray) -> None:
        for label in (-1.0, 1.0):
            if not np.any(sample_weight[y == label] > 0):
                raise ValueError(
                    "only one class has positive sample_weight (class "
                    f"{self.classes_[int(label > 0)].item()!r} has none): a binary classifier "
                    "needs both"
                )

    def _classes(self, y: np.ndarray) -> np.ndarray:
        classes = np.unique(y)
        if classes.shape[0] < 2:
            raise ValueError(
                "This solver needs samples of at least 2 classes in the data, but the data "
                f"contains only one class: {classes[0].item()!r}"
            )
        if classes.shape[0] > 2:
            raise ValueError(
                f"Only binary classification is supported. {type(self).__name__}: y has "
                f"{classes.shape[0]} classes ({', '.join(map(repr, classes[:5].tolist()))}"
                f"{', ...' if classes.shape[0] > 5 else ''}); use "
                "sklearn.multiclass.OneVsRestClassifier for more"
            )
        return classes

    def _set_result(self, res: Any) -> None:
        """As the base class's; ``result_`` predicts in ``classes_`` when they are numbers
        (a FitResult's labels are numbers: others leave it in -1 / +1)."""
        if np.issubdtype(self.classes_.dtype, np.number) or self.classes_.dtype == bool:
            res = with_classes(res, self.classes_)
        super()._set_result(res)
        self.coef_ = self.coef_.reshape(1, -1)
        self.intercept_ = np.array([self.intercept_])

    def score(self, X: Any, y: Any = None, sample_weight: Any = None) -> float:
        """Accuracy of :meth:`predict` on X (out of core, y None: X's own labels)."""
        if is_out_of_core(X):
            return self._score_out_of_core(X, y, sample_weight)
        return super().score(X, y, sample_weight)

    def decision_function(self, X: Any) -> Any:
        """Signed distance to the hyperplane, > 0 for ``classes_[1]``: an ndarray in memory,
        a lazy dask array out of core."""
        return self._decision(X)

    def predict(self, X: Any) -> Any:
        """``classes_[1]`` where the decision function is > 0, else ``classes_[0]`` (lazy,
        blockwise, for out-of-core X)."""
        d = self._decision(X)
        classes = self.classes_
        if isinstance(d, np.ndarray):
            return classes[(d > 0).astype(np.intp)]
        return d.map_blocks(lambda b: classes[(b > 0).astype(np.intp)], dtype=classes.dtype)

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = False
        return tags


def _constraints(**extra: list[Any]) -> dict[str, list[Any]]:
    names = ("C", "tol", "max_iter", "warm_start", "random_state", *SHARED)
    return {**{name: CONSTRAINTS[name] for name in names}, "l1_ratio": [UNIT, None],
            "penalty": [Options(("l1", "elasticnet"))], "class_weight": [is_class_weight],
            **extra}  # fmt: skip


class LogisticRegression(MulticlassFit, _Classifier):
    """Logistic regression with an L1 or elastic-net penalty, certified by its duality gap.

    Two classes: minimises ``C sum_i s_i log(1 + exp(-y_i (x_i w + b))) + penalty(w)``
    (scikit-learn's ``LogisticRegression``, intercept unpenalised), with ``penalty(w) =
    ||w||_1`` or ``l1_ratio ||w||_1 + (1 - l1_ratio) / 2 ||w||^2``: dl1.fit's logistic loss
    with ``alpha = 1 / (C sum_i s_i)``. More classes (:func:`dl1.fit_multiclass`, every
    pass over the data shared by the classes; ``warm_start`` starts from the last fit of the
    same classes; ``standardize`` as for two; no screening yet):
    scikit-learn's multinomial model (``C`` times the summed cross-entropy of the softmax
    of ``X W^T + b``, the same penalty on ``W``), or with ``multi_class="ovr"`` ``K``
    one-vs-rest binary problems (class ``k`` against the rest, each the binary objective
    above with its own intercept: scikit-learn's ``OneVsRestClassifier`` of
    ``LogisticRegression``). Either saves and loads as a binary one
    (:meth:`dl1.Lasso.save`, :func:`dl1.load_estimator`).

    Parameters
    ----------
    penalty : {"l1", "elasticnet"}, default="l1"
    C : float, default=1.0
        Inverse penalty strength (> 0).
    l1_ratio : float in [0, 1], optional
        The L1 part of the elastic net (``penalty="elasticnet"`` only, where it is
        required).
    class_weight : dict or "balanced", optional
        Weights of the classes: each sample's weight is multiplied by its class's (a
        dict from label to weight, classes it leaves out weigh 1; ``"balanced"``:
        ``total weight / (K * the class's weight)``), as scikit-learn's. One-vs-rest:
        every class's problem takes those weights (liblinear's weighs only the class's own
        samples in its problem).
    multi_class : {"multinomial", "ovr"}, default="multinomial"
        More than two classes: one multinomial model (the softmax of the ``K`` decision
        values; ``predict_proba`` its probabilities), or ``K`` one-vs-rest binary
        problems (``predict_proba``: each class's sigmoid, rows normalised to sum to 1, as
        scikit-learn's one-vs-rest). Ignored with two classes (the binary model).
    n_jobs : int, optional
        Accepted for scikit-learn's habit and ignored: the parallelism is the cluster's
        (its workers and their threads), or one thread in process.
    fit_intercept, tol, max_iter, warm_start, random_state, solver, client, n_partitions,
    stream, standardize, screen, max_epochs
        As :class:`dl1.Lasso` (``solver``: the binary fit's).

    Attributes
    ----------
    classes_ : ndarray (K,)
    class_weight_ : ndarray (K,) or None
        The weights of ``classes_`` the fit used (None without ``class_weight``).
    coef_ : ndarray (1, n_features), or (K, n_features) for K > 2 classes
    intercept_ : ndarray (1,) or (K,)
    n_iter_, dual_gap_, gap_, n_features_in_, feature_names_in_
        As :class:`dl1.Lasso` (one-vs-rest: ``gap_`` is the largest class's).
    result_ : dl1.FitResult, or dl1.models.MulticlassModel for K > 2
        The fit; a binary one predicts in ``classes_`` when they are numbers, else in
        -1 / +1; a multiclass one in ``classes_``.
    """

    _loss = "logistic"
    _fits = ("logistic",)
    _multiclass_losses = ("multinomial", "logistic")
    _parameter_constraints = _constraints(
        n_jobs=CONSTRAINTS["n_jobs"], multi_class=[Options(("multinomial", "ovr"))]
    )

    def __init__(
        self,
        penalty: str = "l1",
        *,
        C: float = 1.0,
        l1_ratio: float | None = None,
        class_weight: Any = None,
        multi_class: str = "multinomial",
        fit_intercept: bool = True,
        tol: float = 1e-4,
        max_iter: int = 1000,
        warm_start: bool = False,
        random_state: Any = None,
        solver: Any = "ws",
        client: Any = None,
        n_partitions: int = 2,
        stream: bool | None = None,
        standardize: bool = False,
        screen: bool = False,
        max_epochs: int | None = None,
        n_jobs: int | None = None,
    ) -> None:
        self.penalty = penalty
        self.C = C
        self.l1_ratio = l1_ratio
        self.class_weight = class_weight
        self.multi_class = multi_class
        self.fit_intercept = fit_intercept
        self.tol = tol
        self.max_iter = max_iter
        self.warm_start = warm_start
        self.random_state = random_state
        self.solver = solver
        self.client = client
        self.n_partitions = n_partitions
        self.stream = stream
        self.standardize = standardize
        self.screen = screen
        self.max_epochs = max_epochs
        self.n_jobs = n_jobs

    def _scheme(self) -> tuple[str, str]:
        return self.multi_class, "multinomial" if self.multi_class == "multinomial" else "logistic"

    def predict_proba(self, X: Any) -> Any:
        """Probabilities of ``classes_`` (n, K), rows summing to 1 (binary: the sigmoid of
        the decision function; multinomial: the softmax of the K decision values;
        one-vs-rest: each class's sigmoid, rows normalised); lazy for out-of-core X."""
        if self._is_multiclass():
            return self._multiclass_proba(X)
        if not is_out_of_core(X):
            return np.asarray(predict_proba(self._validated(X), *self._coef_intercept()))
        check_is_fitted(self)
        return predict_proba(X, *self._coef_intercept())

    def predict_log_proba(self, X: Any) -> Any:
        """Log of :meth:`predict_proba`, computed stably from the decision function."""
        if self._is_multiclass():
            return self._multiclass_proba(X, log=True)
        d = self._decision(X)
        if isinstance(d, np.ndarray):
            return -np.logaddexp(0.0, -np.multiply.outer(d, [-1.0, 1.0]))
        return -da.logaddexp(0.0, -da.stack([-d, d], axis=1))


class LinearSVC(MulticlassFit, _Classifier):
    """Linear support vector classifier with an L1 or elastic-net penalty, certified by its
    duality gap.

    Two classes: minimises ``C sum_i s_i loss(y_i (x_i w + b)) + penalty(w)`` with the
    squared hinge ``max(0, 1 - m)^2`` (default, as scikit-learn's ``LinearSVC``; smooth: the
    working-set solver) or the hinge ``max(0, 1 - m)`` (not smooth: ``solver="auto"`` takes
    the smoothing solver, exact LP working sets for the pure L1 penalty). More classes:
    one-vs-rest, liblinear's scheme as scikit-learn's ``LinearSVC``: class ``k`` against the
    rest, each that binary problem with its own intercept, the ``K`` problems solved
    together by :func:`dl1.fit_multiclass` (every pass over the data shared; each class
    certified by its own gap; the hinge with ``penalty="l1"`` only). Unlike liblinear, the
    intercept is not penalised: with ``fit_intercept=False`` the minimiser is
    ``sklearn.svm.LinearSVC(penalty="l1", dual=False, fit_intercept=False)``'s.

    Parameters
    ----------
    penalty : {"l1", "elasticnet"}, default="l1"
    loss : {"squared_hinge", "hinge"}, default="squared_hinge"
    C : float, default=1.0
    l1_ratio, class_weight
        As :class:`LogisticRegression` (one-vs-rest: every class's problem takes the class
        weights, where liblinear weighs only the class's own samples in its problem).
    solver : str or solver object, default="auto"
        The binary fit's: ``"ws"`` for the squared hinge, ``"smoothing"`` for the hinge
        (:func:`dl1.fit`); more classes: the one-vs-rest solver.
    fit_intercept, tol, max_iter, warm_start, random_state, client, n_partitions, stream,
    standardize, screen, max_epochs
        As :class:`dl1.Lasso`.

    Attributes
    ----------
    classes_, class_weight_, coef_, intercept_, n_iter_, dual_gap_, gap_, n_features_in_,
    feature_names_in_, result_
        As :class:`LogisticRegression` (``coef_`` ``(1, p)`` for two classes, ``(K, p)``
        for more).
    """

    _fits = ("squared_hinge", "hinge")
    _multiclass_losses = _fits
    _parameter_constraints = _constraints(loss=[Options(_fits)])

    @classmethod
    def _from_fit(cls, model: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
        got = super()._from_fit(model)
        if got is not None:
            got[0]["loss"] = model.loss
        return got

    def __init__(
        self,
        penalty: str = "l1",
        loss: str = "squared_hinge",
        *,
        C: float = 1.0,
        l1_ratio: float | None = None,
        class_weight: Any = None,
        fit_intercept: bool = True,
        tol: float = 1e-4,
        max_iter: int = 1000,
        warm_start: bool = False,
        random_state: Any = None,
        solver: Any = "auto",
        client: Any = None,
        n_partitions: int = 2,
        stream: bool | None = None,
        standardize: bool = False,
        screen: bool = False,
        max_epochs: int | None = None,
    ) -> None:
        self.penalty = penalty
        self.loss = loss
        self.C = C
        self.l1_ratio = l1_ratio
        self.class_weight = class_weight
        self.fit_intercept = fit_intercept
        self.tol = tol
        self.max_iter = max_iter
        self.warm_start = warm_start
        self.random_state = random_state
        self.solver = solver
        self.client = client
        self.n_partitions = n_partitions
        self.stream = stream
        self.standardize = standardize
        self.screen = screen
        self.max_epochs = max_epochs

    @property
    def _loss(self) -> str:  # type: ignore[override]
        return self.loss

    def _scheme(self) -> tuple[str, str]:
        return "ovr", self.loss
