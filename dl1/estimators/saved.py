"""A fitted estimator read back from its saved model (:func:`load_estimator`): the model
checked as untrusted input (:func:`dl1.models.read_model`), then the estimator record
written beside it (:mod:`dl1.estimators.record`) checked field by field against dl1's
estimator classes and the model."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

import dl1.estimators as estimators
from dl1.errors import ValidationError
from dl1.estimators.multiclass import MulticlassFit
from dl1.estimators.record import DROPPED, NOT_SAVED, json_scalar
from dl1.models import check_labels, float_value, read_model
from dl1.objective.datafits import datafit_class, loss_name, make_datafit
from dl1.store.manifest import FieldChecker

#: Fields of the ``estimator`` record (``class`` and ``params`` required).
ESTIMATOR_FIELDS = ("class", "params", "classes", "class_weight", "feature_names")


def load_estimator(path: str | os.PathLike) -> Any:
    """Read a saved fit back as a fitted dl1 estimator, checking its files as untrusted input.

    A model saved by an estimator's ``save`` (:meth:`dl1.Lasso.save`) comes back as that
    estimator, with its saved parameters; one saved from a :class:`dl1.FitResult` (no
    estimator record) as the estimator of its loss: ``Lasso`` (``"squared"``, ``l1_ratio``
    1) or ``ElasticNet``, ``LogisticRegression``, ``LinearSVC`` (hinges), ``PoissonRegressor``
    or ``HuberRegressor``; a multiclass fit (:class:`dl1.models.MulticlassModel`) as the
    estimator of its scheme and loss, of its classes: ``LogisticRegression`` (multinomial,
    or ``multi_class="ovr"`` for one-vs-rest logistic) or ``LinearSVC`` (one-vs-rest
    hinges). Its fitted attributes (``coef_``, ``intercept_``,
    ``classes_``, ``n_features_in_``, ``result_``, ``dual_gap_``, ``n_iter_``, ...) are set
    as a fit sets them, so that it predicts bit for bit as the estimator saved, scores, converts
    (``to_sklearn``) and saves again.

    Parameters
    ----------
    path : str or PathLike
        The directory of the saved model.

    Returns
    -------
    DL1Estimator
        Fitted. Parameters that were not saved (``client``; not JSON-able ones) have their
        defaults; cross-validation's own attributes (``cv_result_``, ``alphas_``,
        ``mse_path_``, ``alpha_1se_``, ``Cs_``, ``C_``, ``scores_``) are not restored,
        ``alpha_`` and ``l1_ratio_`` (the refit's) are.

    Raises
    ------
    ModelFileError
        As :func:`load_model`; also: the model is a path (``kind`` "path": read it with
        :func:`load_model`), its loss has no estimator, or a field of its estimator record
        is malformed, names no dl1 estimator or parameter of it, or disagrees with the model
        (the message names the file and the field).
    """
    model, meta, ck = read_model(path)
    if meta["kind"] == "path":
        ck.fail(
            "kind",
            "is 'path': a regularisation path is no single fitted estimator; read it with "
            "dl1.load_model (a PathResult, which predicts at any of its alphas)",
            meta["kind"],
        )
    if "estimator" in meta:
        est, fitted = _check_estimator(ck, meta["estimator"], model)
    else:
        est, fitted = _natural_estimator(ck, model)
    est._set_loaded(model, fitted)
    return est


def _estimator_classes() -> dict[str, type]:
    """dl1's estimator classes by name: the names a saved record may give."""
    return {name: getattr(estimators, name) for name in estimators.__all__}


def _only(ck: FieldChecker, d: dict[str, Any], allowed: tuple[str, ...], field: str) -> None:
    extra = sorted(set(d) - set(allowed))
    if extra:
        ck.fail(f"{field}.{extra[0]}", f"is not a field of the record (fields: {allowed})")


def _check_estimator(ck: FieldChecker, raw: Any, model: Any) -> tuple[Any, dict[str, Any]]:
    """The estimator (unfitted, with its saved parameters) and the fitted attributes of an
    ``estimator`` record, every field checked, and against the model (its loss, intercept,
    features)."""
    record = ck.obj(raw, "estimator")
    _only(ck, record, ESTIMATOR_FIELDS, "estimator")
    known = _estimator_classes()
    name = ck.key(record, "class", "estimator")
    if not isinstance(name, str) or name not in known:
        ck.fail("estimator.class", f"is not one of dl1's estimators {sorted(known)}", name)
    cls = known[name]
    params = _check_params(ck, ck.key(record, "params", "estimator"), cls)
    est = cls(**params)
    try:
        est._validate_params()
    except (ValidationError, ValueError, TypeError) as e:
        ck.fail("estimator.params", f"are not valid for {name}: {e}", params)
    multinomial = model.saved_kind == "multiclass"
    if multinomial:
        _check_multiclass(ck, est, model, params)
    else:
        _check_loss(ck, est, model, params)
    if bool(est.fit_intercept) != bool(model.fit_intercept):
        ck.fail("estimator.params.fit_intercept", "is not the model's fit_intercept",
                est.fit_intercept)  # fmt: skip
    fitted: dict[str, Any] = {}
    if multinomial or datafit_class(loss_name(est._loss)).classifies:
        n = model.n_classes if multinomial else 2
        fitted["classes_"] = check_labels(ck, ck.key(record, "classes", "estimator"),
                                          "estimator.classes", n)  # fmt: skip
        if multinomial and not _same_labels(fitted["classes_"], model.classes_):
            ck.fail("estimator.classes", "are not the model's classes",
                    record["classes"])  # fmt: skip
        cw = record.get("class_weight")
        fitted["class_weight_"] = None if cw is None else np.array(
            [float_value(ck, w, f"estimator.class_weight[{k}]", lo=0.0)
             for k, w in enumerate(ck.seq(cw, "estimator.class_weight", n))]
        )  # fmt: skip
    else:
        for key in ("classes", "class_weight"):
            if key in record:
                ck.fail(f"estimator.{key}", f"is given for {name}, which does not classify")
    if "feature_names" in record:
        fitted["feature_names_in_"] = _feature_names(ck, record["feature_names"],
                                                     model.n_features_in_)  # fmt: skip
    return est, fitted


def _check_loss(ck: FieldChecker, est: Any, model: Any, params: dict[str, Any]) -> None:
    """A binary model's estimator fits its loss, with its loss parameters."""
    name, loss = type(est).__name__, loss_name(est._loss)
    if loss != model.loss:
        ck.fail("estimator.class", f"is {name} of loss {loss!r}, the model's is {model.loss!r}",
                name)  # fmt: skip
    if make_datafit(est._loss).params() != model.loss_params:
        ck.fail("estimator.params", f"do not give the model's loss parameters "
                f"{model.loss_params}", params)  # fmt: skip


def _check_multiclass(ck: FieldChecker, est: Any, model: Any, params: dict[str, Any]) -> None:
    """A multiclass model's estimator fits models of its scheme and loss, with its penalty
    (its parameters give the model's scheme, loss and l1_ratio)."""
    name = type(est).__name__
    what = ("multinomial" if model.multi_class == "multinomial"
            else f"one-vs-rest {model.loss}")  # fmt: skip
    if not isinstance(est, MulticlassFit) or not type(est).fits_multiclass(model):
        ck.fail("estimator.class", f"is {name}, which fits no {what} model (the model's "
                "kind is 'multiclass')", name)  # fmt: skip
    if est._scheme() != (model.multi_class, model.loss):
        ck.fail("estimator.params", f"do not give the model's scheme and loss "
                f"({model.multi_class!r}, {model.loss!r})", params)  # fmt: skip
    if model.penalty != "l1" or est._l1_ratio() != model.l1_ratio:
        ck.fail("estimator.params", f"do not give the model's penalty ({model.penalty!r}, "
                f"l1_ratio {model.l1_ratio})", params)  # fmt: skip


def _same_labels(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.tolist() == b.tolist()


def _check_params(ck: FieldChecker, raw: Any, cls: type) -> dict[str, Any]:
    """Parameters of ``cls`` (saved ones: not ``client``), each a JSON scalar (finite) or a
    flat list of them."""
    params = ck.obj(raw, "estimator.params")
    names = [n for n in cls._get_param_names() if n not in NOT_SAVED]
    for key, value in params.items():
        field = f"estimator.params.{key}"
        if key not in names:
            ck.fail(field, f"is not a saved parameter of {cls.__name__} (those are {names})")
        items = value if isinstance(value, list) else [value]
        for x in items:
            if json_scalar(x) is DROPPED or isinstance(x, list):
                ck.fail(field, "is not null, a bool, a finite number, a string or a list of "
                        "them", value)  # fmt: skip
    return params


def _feature_names(ck: FieldChecker, raw: Any, p: int) -> np.ndarray:
    names = ck.seq(raw, "estimator.feature_names", p)
    for k, f in enumerate(names):
        if not isinstance(f, str):
            ck.fail(f"estimator.feature_names[{k}]", "is not a string", f)
    if len(set(names)) != len(names):
        ck.fail("estimator.feature_names", "are not distinct")
    return np.asarray(names, dtype=object)


def _natural_estimator(ck: FieldChecker, model: Any) -> tuple[Any, dict[str, Any]]:
    """The estimator of a fit saved without a record (unfitted, and the fitted attributes
    the model does not hold): the first of dl1's estimator classes that takes it as one of
    its fits (:meth:`~dl1.estimators.base.DL1Estimator._from_fit`)."""
    for cls in _estimator_classes().values():
        got = cls._from_fit(model)
        if got is not None:
            return cls(**got[0]), got[1]
    what = "a FitResult" if model.saved_kind == "fit" else "a MulticlassModel"
    field = "penalty" if model.saved_kind == "multiclass" else "loss"
    value = getattr(model, field)
    ck.fail(field, f"is {value!r}, which no dl1 estimator fits: read the model with "
            f"dl1.load_model ({what}, which predicts and converts to scikit-learn)",
            value)  # fmt: skip
