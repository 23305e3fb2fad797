"""The record of a fitted estimator saved beside its model (:meth:`DL1Estimator.save`): its
dl1 class, the parameters JSON holds exactly, and what a fit sets that the model does not
hold (a classifier's labels and class weights, the input's feature names). Read back by
:func:`dl1.estimators.saved.load_estimator`."""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from dl1.saving import LABEL_DTYPES, hex_float, is_label_dtype, labels_json

#: Parameters never saved with an estimator: a live cluster connection.
NOT_SAVED = ("client",)
#: A parameter JSON cannot hold exactly (left out of the record).
DROPPED = object()


def dl1_class(est: Any) -> type | None:
    """The dl1 estimator class of ``est``: the first class of its MRO defined in
    :mod:`dl1.estimators` (a user's subclass saves as the dl1 class it derives from)."""
    return next((c for c in type(est).__mro__ if c.__module__.startswith("dl1.estimators.")),
                None)  # fmt: skip


def estimator_record(est: Any) -> dict[str, Any]:
    """The ``estimator`` record of a fitted dl1 estimator (written by its ``save``).

    ``class`` is the name of its dl1 class (a subclass: the dl1 class it derives from),
    ``params`` its parameters that JSON holds exactly: ``None``, bools, integers, finite
    floats, strings, and lists, tuples or 1-D arrays of them (read back as lists). The
    others are dropped (the loaded estimator has their defaults): ``client`` always (a live
    connection), a ``RandomState`` ``random_state``, a solver object, a splitter ``cv``, a
    dict ``class_weight``. A classifier's ``classes_`` (and ``class_weight_``) and
    ``feature_names_in_`` are recorded as fitted.

    Raises
    ------
    TypeError
        ``est`` is not a dl1 estimator.
    ValueError
        Its ``classes_`` are not bools, numbers or strings (or not finite).
    """
    cls = dl1_class(est)
    if cls is None:
        raise TypeError(f"{type(est).__name__} is not one of dl1's estimators")
    names = set(cls._get_param_names()) - set(NOT_SAVED)
    params = {}
    for name, value in est.get_params(deep=False).items():
        if name in names and (v := json_param(value)) is not DROPPED:
            params[name] = v
    record: dict[str, Any] = {"class": cls.__name__, "params": params}
    if hasattr(est, "classes_"):
        record["classes"] = labels_json(est.classes_)
        cw = getattr(est, "class_weight_", None)
        record["class_weight"] = None if cw is None else [hex_float(w) for w in np.ravel(cw)]
    names_in = getattr(est, "feature_names_in_", None)
    if names_in is not None:
        record["feature_names"] = [str(f) for f in names_in]
    return record


def json_scalar(v: Any) -> Any:
    """``v`` as the JSON scalar that holds it exactly, or ``DROPPED``."""
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, str):
        return str(v)
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, numbers.Integral):
        return int(v)
    if isinstance(v, numbers.Real) and math.isfinite(float(v)):
        return float(v)
    return DROPPED


def json_param(v: Any) -> Any:
    """``v`` as JSON holds it exactly (a scalar or a flat list), or ``DROPPED``."""
    if isinstance(v, np.ndarray):
        if v.ndim != 1 or v.dtype.kind not in "biufU":
            return DROPPED
        v = v.tolist()
    if isinstance(v, (list, tuple)):
        items = [json_scalar(x) for x in v]
        return DROPPED if any(x is DROPPED for x in items) else items
    return json_scalar(v)


__all__ = [
    "DROPPED",
    "LABEL_DTYPES",
    "NOT_SAVED",
    "dl1_class",
    "estimator_record",
    "is_label_dtype",
    "json_param",
    "json_scalar",
    "labels_json",
]
