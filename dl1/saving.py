"""Fitted models of dl1 written without pickle (:func:`save_model`), and converted to
scikit-learn (:func:`to_sklearn`); read back by :mod:`dl1.models`.

A saved model is a directory::

    MODEL/
      model.json      format name and version, dl1 version, kind ("fit", "path" or
                      "multiclass"), loss,
                      alpha(s), l1_ratio, tol, gaps, converged flags, intercept(s), n_samples,
                      n_features, a classifier's two labels ``classes`` (optional: a model
                      saved without them predicts -1 / +1); every float as a ``float.hex``
                      string (exact, NaN included); ``digest``, the SHA-256 of every other
                      field and of the arrays
                      optional ``estimator``, the record of the dl1 estimator a fit was saved
                      from (:meth:`dl1.Lasso.save`, read by :func:`dl1.load_estimator`): its
                      ``class`` name, ``params`` (its JSON-able parameters: JSON scalars or
                      lists of them), a classifier's ``classes`` (``dtype`` and the two
                      ``values``: strings, bools, integers, or floats as ``float.hex``) and
                      ``class_weight``, and ``feature_names`` (fitted on a DataFrame)
      coef.npy        float64 (p,)                      kind "fit"
      coefs_data.npy, coefs_indices.npy, coefs_indptr.npy
                      float64 / int64 / int64: the CSC matrix ``coefs_`` (p, n_alphas), kind "path"
      coef_data.npy, coef_indices.npy, coef_indptr.npy
                      float64 / int64 / int64: the CSR matrix ``coef_`` (K, p) of a multiclass
                      fit, kind "multiclass" (a class a row, sorted column indices; its
                      model.json: ``multi_class``, the scheme: "multinomial" (absent in the
                      files of dl1 before one-vs-rest) with ``loss`` "multinomial" and
                      ``penalty`` "l1" or "grouped", or "ovr" with the binary ``loss``
                      ("logistic", "squared_hinge" or "hinge": the pure L1 penalty only),
                      ``penalty`` "l1" and ``gaps``, each class's relative gap (K float.hex
                      strings); ``n_classes`` K, ``classes`` as the estimator record's
                      (``dtype`` and the K sorted ``values``), ``intercept`` (K float.hex
                      strings), ``n_epochs``, and the other fields of a fit but ``dual_gap``
                      and ``p0``: ``gap`` is relative to the loss at the best constant, the
                      largest class's for one-vs-rest)

It is written in a temporary directory beside ``MODEL`` and renamed into place, so a killed
writer leaves no half model; an existing path is replaced only with ``overwrite=True`` and
only if it is a saved model (nothing else a user wrote is deleted). Loading treats the files
as untrusted: the JSON is size-limited and checked as a schema (types, ranges, lengths), the
arrays' headers (dtype, shape, order, file size) are checked before they are read, with
``allow_pickle=False``, and their values after (finite, indices in range); last, the digest
(:func:`content_digest`), so that a field edited to another valid value (a loss, an alpha)
is refused too. A model of format version 1 (before the digest) loads unchecked by it. A
loaded model predicts bit for bit as the saved one. Not saved: histories, timings,
screening masks and a path's per-alpha ``extra_`` records.

The ``estimator`` record came without a version bump: it is optional (a model without it
loads, as the estimator of its loss), and a dl1 reading version 2 without knowing it loads
such a model as its FitResult (the digest covers the record as any other field).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from dl1 import __version__
from dl1.errors import ModelFileError
from dl1.objective.datafits import datafit_class
from dl1.store.location import open_regular

FORMAT_NAME = "dl1-model"
FORMAT_VERSION = 2
#: Format versions this dl1 reads: 1 has no digest.
READABLE_VERSIONS = (1, 2)
MODEL_JSON = "model.json"
#: model.json larger than this is refused unread (a path of 10,000 alphas takes ~2 MiB).
MAX_JSON_BYTES = 16 << 20
#: Float scalars of a fit, as (JSON key, FitResult attribute).
FIT_FLOATS = (
    ("alpha", "alpha"),
    ("intercept", "intercept_"),
    ("gap", "gap_"),
    ("dual_gap", "dual_gap_"),
    ("primal", "primal_"),
    ("dual", "dual_"),
    ("p0", "p0_"),
    ("passes", "passes_"),
)
FIT_INTS = (("n_rounds", "n_rounds_"), ("n_partitions", "n_partitions"))
#: Per-alpha vectors of a path, as (JSON key, PathResult attribute, kind, optional).
PATH_VECTORS = (
    ("alphas", "alphas_", "float", False),
    ("intercepts", "intercepts_", "float", False),
    ("gaps", "gaps_", "float", False),
    ("converged", "converged_", "bool", False),
    ("n_active", "n_active_", "int", False),
    ("passes", "passes_", "float", False),
    ("seconds", "seconds_", "float", False),
    ("rounds", "rounds_", "int", False),
    ("test_mse", "test_mse_", "float", True),
    ("test_logloss", "test_logloss_", "float", True),
    ("test_accuracy", "test_accuracy_", "float", True),
    ("deltas", "deltas_", "float", True),
)
#: Float scalars of a multinomial fit, as (JSON key, attribute).
MULTICLASS_FLOATS = (
    ("alpha", "alpha"),
    ("l1_ratio", "l1_ratio"),
    ("tol", "tol"),
    ("gap", "gap_"),
    ("primal", "primal_"),
    ("dual", "dual_"),
)
MULTICLASS_INTS = (("n_rounds", "n_rounds_"), ("n_epochs", "n_epochs_"))
ARRAYS = {
    "fit": {"coef": "<f8"},
    "path": {"coefs_data": "<f8", "coefs_indices": "<i8", "coefs_indptr": "<i8"},
    "multiclass": {"coef_data": "<f8", "coef_indices": "<i8", "coef_indptr": "<i8"},
}
#: dtypes a classifier's saved labels may have (besides strings, ``<U{n}``): bool, integers,
#: floats and object (strings in it).
LABEL_DTYPES = {
    np.dtype(t).str: np.dtype(t)
    for t in ("?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "O")
}
_STR_DTYPE = re.compile(r"[<>|]U[0-9]{1,6}")


# -- saving -----------------------------------------------------------------------------------
def save_model(
    model: Any,
    path: str | os.PathLike,
    *,
    overwrite: bool = False,
    estimator: dict[str, Any] | None = None,
) -> Path:
    """Write a :class:`dl1.FitResult`, :class:`dl1.paths.PathResult` or multinomial
    :class:`dl1.models.MulticlassModel` to the directory ``path`` (JSON and ``.npy``; the
    module docstring gives the layout).

    Parameters
    ----------
    model : FitResult, PathResult or MulticlassModel
    path : str or PathLike
        The directory to create.
    overwrite : bool
        Replace ``path`` if it holds a saved model. Anything else at ``path`` is never
        replaced.
    estimator : dict, optional
        The record of the estimator ``model`` is the ``result_`` of
        (:func:`dl1.estimators.record.estimator_record`), written as the field
        ``estimator``.

    Returns
    -------
    Path
        The directory written.

    Raises
    ------
    FileExistsError
        ``path`` exists and ``overwrite`` is False, or it is not a saved model.
    """
    writers = {"path": path_content, "multiclass": multiclass_content}
    meta, arrays = writers.get(model.saved_kind, fit_content)(model)
    meta = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "dl1_version": __version__,
        **meta,
    }
    if estimator is not None:
        meta["estimator"] = estimator
    meta["digest"] = content_digest(meta, arrays)
    return _write_dir(Path(path), meta, arrays, overwrite)


def content_digest(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> str:
    """SHA-256 (hex) of a saved model's content: its JSON fields but ``digest`` (canonical:
    sorted keys, no spaces) and each array's name, dtype, shape and bytes."""
    h = hashlib.sha256()
    fields = {k: v for k, v in meta.items() if k != "digest"}
    h.update(json.dumps(fields, sort_keys=True, separators=(",", ":"), allow_nan=False).encode())
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"\0{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def hex_float(x: Any) -> str:
    return float(x).hex()


def _common(model: Any, kind: str) -> dict[str, Any]:
    n = model.n_samples_
    meta = {
        "kind": kind,
        "loss": str(model.loss),
        "l1_ratio": hex_float(model.l1_ratio),
        "tol": hex_float(model.tol),
        "fit_intercept": None if model.fit_intercept is None else bool(model.fit_intercept),
        "n_samples": None if n is None else int(n),
        "n_features": int(model.n_features_in_),
    }
    classes = getattr(model, "classes_", None)
    if classes is not None:  # a classifier's labels (written only when known)
        meta["classes"] = [hex_float(c) for c in np.asarray(classes).tolist()]
    return meta


def fit_content(res: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    meta = _common(res, "fit")
    for key, attr in FIT_FLOATS:
        meta[key] = hex_float(getattr(res, attr))
    for key, attr in FIT_INTS:
        meta[key] = int(getattr(res, attr))
    meta["converged"] = bool(res.converged_)
    if res.loss_params:  # a loss's own parameters (Huber's epsilon)
        meta["loss_params"] = {k: hex_float(v) for k, v in res.loss_params.items()}
    return meta, {"coef": np.ascontiguousarray(res.coef_, dtype="<f8")}


def path_content(res: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    meta = _common(res, "path")
    meta["n_alphas"] = res.n_alphas
    for key, attr, kind, _ in PATH_VECTORS:
        v = getattr(res, attr)
        meta[key] = None if v is None else [_to_json(x, kind) for x in v.tolist()]
    C = res.coefs_.copy()
    C.sort_indices()
    arrays = {
        "coefs_data": np.ascontiguousarray(C.data, dtype="<f8"),
        "coefs_indices": np.ascontiguousarray(C.indices, dtype="<i8"),
        "coefs_indptr": np.ascontiguousarray(C.indptr, dtype="<i8"),
    }
    return meta, arrays


def multiclass_content(model: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The fields and arrays of a multiclass fit (a :class:`dl1.models.MulticlassModel`):
    its problem (scheme and loss, penalty, alpha, l1_ratio, intercept fitted or not, sizes),
    its labels, its certificate (one-vs-rest: each class's gap too), and ``coef_`` (K, p) as
    a CSR matrix with sorted indices."""
    n = model.n_samples_
    meta: dict[str, Any] = {
        "kind": "multiclass",
        "multi_class": str(model.multi_class),
        "loss": str(model.loss),
        "penalty": str(model.penalty),
        "fit_intercept": bool(model.fit_intercept),
        "n_samples": None if n is None else int(n),
        "n_features": int(model.n_features_in_),
        "n_classes": int(model.n_classes),
        "classes": labels_json(model.classes_),
        "intercept": [hex_float(b) for b in np.asarray(model.intercept_).tolist()],
        "converged": bool(model.converged_),
    }
    for key, attr in MULTICLASS_FLOATS:
        meta[key] = hex_float(getattr(model, attr))
    for key, attr in MULTICLASS_INTS:
        meta[key] = int(getattr(model, attr))
    if model.multi_class == "ovr":
        meta["gaps"] = [hex_float(g) for g in np.asarray(model.gaps_).tolist()]
    C = model.coef_.tocsr(copy=True)
    C.sum_duplicates()  # canonical: sorted, distinct indices in each row
    arrays = {
        "coef_data": np.ascontiguousarray(C.data, dtype="<f8"),
        "coef_indices": np.ascontiguousarray(C.indices, dtype="<i8"),
        "coef_indptr": np.ascontiguousarray(C.indptr, dtype="<i8"),
    }
    return meta, arrays


def labels_json(classes: Any, n: int | None = None) -> dict[str, Any]:
    """A classifier's labels as ``{"dtype": ..., "values": [...]}``: strings, bools and
    integers as JSON has them, floats as ``float.hex``; ``n`` of them (None: two or more).

    Raises
    ------
    ValueError
        Not that many labels, or not bools, numbers or strings (or not finite).
    """
    c = np.asarray(classes)
    c = c.astype(c.dtype.newbyteorder("="))
    dt, values = c.dtype.str, c.tolist()
    ok = c.ndim == 1 and (c.shape[0] == n if n is not None else c.shape[0] >= 2)
    ok = ok and is_label_dtype(dt)
    if ok and dt == "|O":
        ok = all(isinstance(x, str) for x in values)
    elif ok and c.dtype.kind == "f":
        ok = bool(np.isfinite(c).all())
        values = [hex_float(x) for x in values]
    if not ok:
        count = "two" if n == 2 else "two or more" if n is None else str(n)
        raise ValueError(
            f"classes_ {values!r} (dtype {c.dtype}) cannot be saved: {count} finite numbers, "
            "bools or strings can"
        )
    return {"dtype": dt, "values": values}


def is_label_dtype(dt: str) -> bool:
    """``dt`` one of :data:`LABEL_DTYPES` or a native string dtype (``<U{n}``), as
    ``dtype.str`` spells it."""
    if dt in LABEL_DTYPES:
        return True
    return bool(_STR_DTYPE.fullmatch(dt)) and np.dtype(dt).isnative and np.dtype(dt).str == dt


def _to_json(x: Any, kind: str) -> Any:
    return hex_float(x) if kind == "float" else bool(x) if kind == "bool" else int(x)


def _write_dir(path: Path, meta: dict[str, Any], arrays: dict[str, np.ndarray], overwrite: bool):
    exists = os.path.lexists(path)
    if exists and not overwrite:
        raise FileExistsError(f"{path} exists; pass overwrite=True to replace a saved model")
    if exists and not _is_saved_model(path):
        raise FileExistsError(
            f"{path} exists and is not a saved dl1 model (a directory holding only "
            f"{MODEL_JSON} and its arrays): it is not replaced, even with overwrite=True"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        for name, a in arrays.items():
            with open(tmp / f"{name}.npy", "wb") as fh:
                np.save(fh, a, allow_pickle=False)
                _sync(fh)
        with open(tmp / MODEL_JSON, "w", encoding="utf-8") as fh:
            json.dump(meta, fh, indent=1, allow_nan=False)
            _sync(fh)
        _fsync_dir(tmp)
        _move_into_place(tmp, path, exists)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(path.parent)
    return path


def _move_into_place(tmp: Path, path: Path, exists: bool) -> None:
    if not exists:
        os.rename(tmp, path)  # fails if something appeared at path meanwhile (not empty)
        return
    old = path.parent / f".{path.name}.{uuid.uuid4().hex}.old"
    os.rename(path, old)
    try:
        os.rename(tmp, path)
    except BaseException:
        os.rename(old, path)
        raise
    shutil.rmtree(old)


def _is_saved_model(path: Path) -> bool:
    """A real directory holding only what :func:`save_model` writes, with its format name."""
    if path.is_symlink() or not path.is_dir():
        return False
    known = {MODEL_JSON} | {f"{n}.npy" for names in ARRAYS.values() for n in names}
    if not {p.name for p in path.iterdir()} <= known:
        return False
    try:
        return read_json(path / MODEL_JSON).get("format") == FORMAT_NAME
    except (ModelFileError, AttributeError):
        return False


def _sync(fh: Any) -> None:
    fh.flush()
    os.fsync(fh.fileno())


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- scikit-learn -----------------------------------------------------------------------------
def to_sklearn(res: Any) -> Any:
    """The fitted scikit-learn estimator equivalent to a :class:`dl1.FitResult`: the one
    its loss's datafit names (``sklearn_estimator``; :mod:`dl1.objective.datafits`):

    - ``"squared"``: :class:`sklearn.linear_model.Lasso` (``l1_ratio == 1``) or
      :class:`~sklearn.linear_model.ElasticNet`, the same objective;
    - ``"logistic"``: :class:`~sklearn.linear_model.LogisticRegression` with
      ``C = 1 / (n_samples * alpha)`` and ``solver="saga"``, the same objective without
      sample weights;
    - ``"hinge"``, ``"squared_hinge"``: :class:`~sklearn.linear_model.SGDClassifier` with
      that loss and the elastic net, the same objective; ``"smooth_hinge"`` the hinge one,
      whose predictions are dl1's but whose objective is not.

    ``coef_``, ``intercept_``, ``n_features_in_``, ``n_iter_`` (dl1's rounds) and, for the
    classifiers, ``classes_`` (the model's two labels; ``[-1.0, 1.0]`` for a model without
    them) are set, so that ``predict``, ``decision_function``, ``score`` (and
    ``predict_proba``) work, pickle with joblib and convert with skops or ONNX tools.
    Labels agree with dl1's except at a decision value of exactly 0 (scikit-learn:
    ``classes_[0]``, dl1: ``classes_[1]``).
    """
    coef = np.array(res.coef_, dtype=np.float64)
    b = float(res.intercept_)
    datafit = datafit_class(res.loss)(**res.loss_params)
    est = datafit.sklearn_estimator(res)
    if not datafit.classifies:
        est.coef_, est.intercept_ = coef, b
        est.dual_gap_, est.n_iter_ = res.dual_gap_, int(res.n_rounds_)
    else:
        est.coef_, est.intercept_ = coef[None, :], np.array([b])
        classes = getattr(res, "classes_", None)
        est.classes_ = np.array([-1.0, 1.0] if classes is None else classes, dtype=np.float64)
        est.n_iter_ = np.array([int(res.n_rounds_)], dtype=np.int32)
    est.n_features_in_ = coef.shape[0]
    return est


def multiclass_to_sklearn(model: Any) -> Any:
    """The fitted scikit-learn model predicting as a :class:`dl1.models.MulticlassModel`
    (``coef_``, ``intercept_``, ``classes_``, ``n_features_in_``, ``n_iter_`` set):

    - multinomial: :class:`~sklearn.linear_model.LogisticRegression` with
      ``C = 1 / (n_samples * alpha)`` and ``solver="saga"``, the same objective without
      sample weights (the grouped penalty, which scikit-learn lacks, as the L1 one);
    - one-vs-rest logistic: :class:`~sklearn.multiclass.OneVsRestClassifier` of ``K``
      binary ``LogisticRegression`` (class ``k`` against the rest, as it fits them): its
      ``predict_proba`` is each class's sigmoid, rows normalised, as dl1's;
    - one-vs-rest hinges: :class:`~sklearn.linear_model.SGDClassifier` of that loss and
      the elastic net (one-vs-rest itself: the same objective for every class).

    Labels agree with dl1's (the first class of the largest decision value).
    """
    # local: scikit-learn (~1 s, ~120 MiB) only to convert to it
    from sklearn.linear_model import LogisticRegression

    n, alpha = model.n_samples_, float(model.alpha)
    C = 1.0 / (n * alpha) if n and alpha > 0 else 1.0
    coef, b = model.coef_.toarray(), np.array(model.intercept_, dtype=np.float64)
    if model.multi_class == "ovr" and model.loss != "logistic":
        est = datafit_class(model.loss)().sklearn_estimator(model)
        est.coef_, est.intercept_, est.classes_ = coef, b, model.classes_.copy()
    elif model.multi_class == "ovr":
        return _ovr_logistic(model, coef, b, C)
    else:
        l1_ratio = model.l1_ratio if model.penalty == "l1" else 1.0
        est = LogisticRegression(C=C, l1_ratio=l1_ratio, solver="saga",
                                 fit_intercept=bool(model.fit_intercept))  # fmt: skip
        est.classes_, est.coef_, est.intercept_ = model.classes_.copy(), coef, b
    est.n_features_in_, est.n_iter_ = coef.shape[1], np.array([int(model.n_rounds_)])
    return est


def _ovr_logistic(model: Any, coef: np.ndarray, b: np.ndarray, C: float) -> Any:
    """A fitted ``OneVsRestClassifier`` of one binary ``LogisticRegression`` a class (labels
    0 / 1: the rest / the class), as its ``fit`` leaves it."""
    # local: scikit-learn (~1 s, ~120 MiB) only to convert to it
    from sklearn.base import clone
    from sklearn.linear_model import LogisticRegression
    from sklearn.multiclass import OneVsRestClassifier
    from sklearn.preprocessing import LabelBinarizer

    binary = LogisticRegression(C=C, l1_ratio=float(model.l1_ratio), solver="saga",
                                fit_intercept=bool(model.fit_intercept))  # fmt: skip
    ovr = OneVsRestClassifier(binary)
    ovr.estimators_ = []
    for k in range(coef.shape[0]):
        est = clone(binary)
        est.classes_, est.coef_, est.intercept_ = np.array([0, 1]), coef[k : k + 1], b[k : k + 1]
        est.n_features_in_, est.n_iter_ = coef.shape[1], np.array([int(model.n_rounds_)])
        ovr.estimators_.append(est)
    # as fit sets it; "multiclass" for K = 2 too (one estimator a class) and for labels
    # scikit-learn's type_of_target would call continuous (dl1 takes any sortable ones)
    lb = ovr.label_binarizer_ = LabelBinarizer(sparse_output=True)
    lb.classes_, lb.y_type_, lb.sparse_input_ = model.classes_.copy(), "multiclass", False
    ovr.classes_, ovr.n_features_in_ = lb.classes_, coef.shape[1]
    return ovr


def read_json(f: Path) -> Any:
    try:
        size = f.stat().st_size
        if size > MAX_JSON_BYTES:
            raise ModelFileError(f"{f} holds {size} bytes, more than {MAX_JSON_BYTES} (refused)")
        with open_regular(f) as fh:
            text = fh.read(MAX_JSON_BYTES + 1)
        if len(text) > MAX_JSON_BYTES:
            raise ModelFileError(f"{f} is larger than {MAX_JSON_BYTES} bytes (refused)")
        return json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_unique_keys)
    except OSError as e:
        raise ModelFileError(f"{f} is missing or unreadable: {e}") from e
    except (ValueError, RecursionError) as e:
        if isinstance(e, ModelFileError):
            raise
        raise ModelFileError(f"{f} is not valid JSON: {e}") from e


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (floats are float.hex strings)")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = [k for k, _ in pairs]
        raise ValueError(f"duplicate key {next(k for k in seen if seen.count(k) > 1)!r}")
    return out


__all__ = [
    "FORMAT_VERSION",
    "content_digest",
    "multiclass_to_sklearn",
    "save_model",
    "to_sklearn",
]
