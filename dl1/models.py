"""Saved models of dl1 read back (:func:`load_model`), their files checked as untrusted
input; the format and the writing are :mod:`dl1.saving`'s. A multiclass fit, multinomial
or one-vs-rest, saves and loads as a :class:`MulticlassModel` (the
:class:`~dl1.solvers.multiclass.MulticlassResult` or :class:`~dl1.solvers.ovr.OvrResult`
with the problem it solved), which predicts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp
from scipy.special import expit, log_expit, log_softmax, logsumexp, softmax

from dl1 import __version__
from dl1.entry_labels import stored_labels
from dl1.errors import ModelFileError, ValidationError
from dl1.objective.datafits import LOSSES, datafit_class
from dl1.paths.result import PathResult
from dl1.predict import as_input, check_n_features, decision_function
from dl1.runtime.compute import computed
from dl1.runtime.executor import Held
from dl1.saving import (
    ARRAYS,
    FIT_FLOATS,
    FIT_INTS,
    FORMAT_NAME,
    MODEL_JSON,
    MULTICLASS_FLOATS,
    MULTICLASS_INTS,
    PATH_VECTORS,
    READABLE_VERSIONS,
    content_digest,
    fit_content,
    is_label_dtype,
    multiclass_content,
    multiclass_to_sklearn,
    path_content,
    read_json,
    save_model,
)
from dl1.solvers.result import FitResult
from dl1.store.location import open_regular
from dl1.store.manifest import FieldChecker, check_inside


# -- loading ----------------------------------------------------------------------------------
def load_model(path: str | os.PathLike) -> Any:
    """Read a model written by :meth:`dl1.FitResult.save` or
    :meth:`dl1.paths.PathResult.save` (or by an estimator's ``save``), checking its files as
    untrusted input.

    Returns
    -------
    FitResult, PathResult or MulticlassModel
        It predicts bit for bit as the saved model (a :class:`MulticlassModel`: a
        multinomial or one-vs-rest fit saved by :meth:`MulticlassModel.save`, or by a
        ``dl1.LogisticRegression`` or ``dl1.LinearSVC`` of more than two classes).

    Raises
    ------
    ModelFileError
        A file is missing, too large, malformed, of another format version, or
        inconsistent; the message names the file and the field.

    See Also
    --------
    load_estimator : the same files read back as a fitted scikit-learn-style estimator
        (``dl1.Lasso``, ``dl1.LogisticRegression``, ...).
    """
    return read_model(path)[0]


def read_model(path: str | os.PathLike) -> tuple[Any, dict[str, Any], FieldChecker]:
    """:func:`load_model`'s model, with the checked JSON and the checker naming its file."""
    path = Path(path).absolute()
    if not path.is_dir():
        raise ModelFileError(f"{path} is not a directory holding a saved dl1 model")
    ck = FieldChecker(f"model at {path}", ModelFileError, f"{MODEL_JSON} field")
    meta = ck.obj(read_json(path / MODEL_JSON), "(root)")
    if ck.key(meta, "format", "(root)") != FORMAT_NAME:
        ck.fail("format", f"is not {FORMAT_NAME!r}", meta["format"])
    version = ck.integer(ck.key(meta, "format_version", "(root)"), "format_version")
    if version not in READABLE_VERSIONS:
        ck.fail(
            "format_version",
            f"is {version}: this dl1 ({__version__}) reads versions "
            f"{READABLE_VERSIONS} (the model was saved by dl1 {meta.get('dl1_version')!r})",
        )
    kind = ck.key(meta, "kind", "(root)")
    if kind not in ARRAYS:
        ck.fail("kind", f"is not one of {sorted(ARRAYS)}", kind)
    if kind == "multiclass":
        model = _load_multiclass(ck, path, meta)
        _check_digest(ck, meta, multiclass_content(model)[1])  # no version 1 of this kind
        return model, meta, ck
    common = _check_common(ck, meta)
    if kind == "fit":
        model = _load_fit(ck, path, meta, common)
        arrays = fit_content(model)[1]
    else:
        model = _load_path(ck, path, meta, common)
        arrays = path_content(model)[1]
    if version >= 2:
        _check_digest(ck, meta, arrays)
    return model, meta, ck


def _check_digest(ck: FieldChecker, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Refuse a model whose content is not the one its digest was computed from (a field
    or an array edited, even to a valid value)."""
    digest = ck.key(meta, "digest", "(root)")
    if not isinstance(digest, str) or len(digest) != 64:
        ck.fail("digest", "is not a SHA-256 hex string", digest)
    if content_digest(meta, arrays) != digest:
        ck.fail("digest", "does not match the model's fields and arrays (edited or damaged)",
                digest)  # fmt: skip


def _float(ck: FieldChecker, meta: dict[str, Any], key: str, **bounds: Any) -> float:
    """The field ``key`` as :func:`float_value` checks it (``finite``, ``lo``, ``hi``)."""
    return float_value(ck, ck.key(meta, key, "(root)"), key, **bounds)


def float_value(
    ck: FieldChecker,
    v: Any,
    field: str,
    *,
    finite: bool = False,
    lo: float | None = None,
    hi: float | None = None,
) -> float:
    if not isinstance(v, str):
        ck.fail(field, "is not a float.hex string", v)
    try:
        x = float.fromhex(v)
    except (ValueError, OverflowError):
        ck.fail(field, "is not a float.hex string", v)
    if (finite or lo is not None or hi is not None) and not np.isfinite(x):
        ck.fail(field, "is not finite", v)
    if (lo is not None and x < lo) or (hi is not None and x > hi):
        ck.fail(field, f"is out of range [{lo}, {hi}]", x)
    return x


def check_bool(ck: FieldChecker, v: Any, field: str) -> bool:
    if not isinstance(v, bool):
        ck.fail(field, "is not true or false", v)
    return v


def _check_common(ck: FieldChecker, meta: dict[str, Any]) -> dict[str, Any]:
    loss = ck.key(meta, "loss", "(root)")
    if loss not in LOSSES:
        ck.fail("loss", f"is not one of {LOSSES}", loss)
    fi = ck.key(meta, "fit_intercept", "(root)")
    n = ck.key(meta, "n_samples", "(root)")
    return {
        "loss": loss,
        "l1_ratio": _float(ck, meta, "l1_ratio", lo=0.0, hi=1.0),
        "tol": _float(ck, meta, "tol"),
        "fit_intercept": None if fi is None else check_bool(ck, fi, "fit_intercept"),
        "n_samples_": None if n is None else ck.integer(n, "n_samples", 1),
        "p": ck.integer(ck.key(meta, "n_features", "(root)"), "n_features"),
        "classes_": _classes(ck, meta, loss),
    }


def _classes(ck: FieldChecker, meta: dict[str, Any], loss: str) -> np.ndarray | None:
    """A classifier's two labels (optional: None without them), finite, distinct and
    sorted; refused on a model of a regression loss."""
    if "classes" not in meta:
        return None
    raw = ck.seq(meta["classes"], "classes", 2)
    if not datafit_class(loss).classifies:
        ck.fail("classes", f"is given for loss {loss!r}, which does not classify", raw)
    c = np.array([float_value(ck, x, f"classes[{k}]", finite=True) for k, x in enumerate(raw)])
    if not c[0] < c[1]:
        ck.fail("classes", "are not two distinct labels in increasing order", raw)
    return c


def _load_fit(ck: FieldChecker, path: Path, meta: dict[str, Any], common: dict[str, Any]):
    kw: dict[str, Any] = {}
    for key, attr in FIT_FLOATS:
        kw[attr] = _float(ck, meta, key)
    _float(ck, meta, "alpha", lo=0.0)
    _float(ck, meta, "intercept", finite=True)
    for key, attr in FIT_INTS:
        kw[attr] = ck.integer(ck.key(meta, key, "(root)"), key)
    p = common.pop("p")
    coef = _read_npy(path, "coef", "<f8", (p,))
    _finite(path, "coef", coef)
    fi = common.pop("fit_intercept")
    kw["loss_params"] = _loss_params(ck, meta, common["loss"])
    return FitResult(
        coef_=coef,
        converged_=check_bool(ck, ck.key(meta, "converged", "(root)"), "converged"),
        fit_intercept=True if fi is None else fi,
        n_features_in_=p,
        **common,
        **kw,
    )


def _loss_params(ck: FieldChecker, meta: dict[str, Any], loss: str) -> dict[str, float]:
    """The loss's own parameters (optional: none for most losses), each a float its
    datafit accepts."""
    raw = meta.get("loss_params", {})
    if not isinstance(raw, dict) or not all(isinstance(k, str) for k in raw):
        ck.fail("loss_params", "is not an object of named floats", raw)
    params = {k: _float(ck, raw, k, finite=True) for k in raw}
    try:
        datafit_class(loss)(**params)
    except (TypeError, ValidationError) as e:
        ck.fail("loss_params", f"are not parameters of loss {loss!r} ({e})", raw)
    return params


def _load_path(ck: FieldChecker, path: Path, meta: dict[str, Any], common: dict[str, Any]):
    n = ck.integer(ck.key(meta, "n_alphas", "(root)"), "n_alphas")
    kw: dict[str, Any] = {}
    for key, attr, kind, optional in PATH_VECTORS:
        v = ck.key(meta, key, "(root)")
        kw[attr] = None if v is None and optional else _vector(ck, v, key, kind, n)
    for key in ("alphas", "intercepts"):
        bad = np.flatnonzero(
            ~np.isfinite(kw[f"{key}_"]) | (kw[f"{key}_"] < 0 if key == "alphas" else False)
        )
        if bad.size:
            ck.fail(
                f"{key}[{bad[0]}]",
                "is not finite" + (" and >= 0" if key == "alphas" else ""),
                meta[key][bad[0]],
            )
    p = common.pop("p")
    coefs = _read_coefs(path, p, n)
    return PathResult(coefs_=coefs, **kw, **common)


def _vector(ck: FieldChecker, v: Any, field: str, kind: str, n: int) -> np.ndarray:
    v = ck.seq(v, field, n)
    if kind == "float":
        return np.array(
            [float_value(ck, x, f"{field}[{k}]") for k, x in enumerate(v)], dtype=np.float64
        )
    if kind == "bool":
        return np.array([check_bool(ck, x, f"{field}[{k}]") for k, x in enumerate(v)], dtype=bool)
    return np.array([ck.integer(x, f"{field}[{k}]") for k, x in enumerate(v)], dtype=np.int64)


def _read_coefs(path: Path, p: int, n: int) -> sp.csc_matrix:
    indptr = _read_npy(path, "coefs_indptr", "<i8", (n + 1,))
    nnz = int(indptr[-1])
    if indptr[0] != 0 or (np.diff(indptr) < 0).any() or nnz > p * n:
        raise ModelFileError(
            f"model at {path}: coefs_indptr.npy does not run up from 0 "
            f"to at most p * n_alphas = {p * n}"
        )
    indices = _read_npy(path, "coefs_indices", "<i8", (nnz,))
    data = _read_npy(path, "coefs_data", "<f8", (nnz,))
    if nnz and (indices.min() < 0 or indices.max() >= p):
        raise ModelFileError(f"model at {path}: coefs_indices.npy holds indices outside [0, {p})")
    _finite(path, "coefs_data", data)
    C = sp.csc_matrix((data, indices, indptr), shape=(p, n))
    if not C.has_canonical_format:
        raise ModelFileError(
            f"model at {path}: coefs_indices.npy is not strictly increasing within each column"
        )
    return C


def _read_npy(path: Path, name: str, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """An array file checked before it is read: plain file inside the model, the expected
    dtype, shape and C order, and exactly the bytes they imply."""
    f = path / f"{name}.npy"
    where = f"model at {path}: {f.name}"
    check_inside(path, f, f.name, ModelFileError)
    try:
        with open_regular(f) as fh:
            version = np.lib.format.read_magic(fh)
            read_header = {
                (1, 0): np.lib.format.read_array_header_1_0,
                (2, 0): np.lib.format.read_array_header_2_0,
            }.get(version)
            if read_header is None:
                raise ModelFileError(f"{where} has .npy version {version}, not 1.0 or 2.0")
            got_shape, fortran, got_dtype = read_header(fh)
            if got_dtype.str != dtype or got_dtype.hasobject:
                raise ModelFileError(f"{where} has dtype {got_dtype.str}, expected {dtype}")
            if got_shape != shape or fortran:
                raise ModelFileError(
                    f"{where} has shape {got_shape}"
                    f"{' (Fortran order)' if fortran else ''}, expected {shape}"
                )
            expected = fh.tell() + int(np.prod(shape)) * got_dtype.itemsize
            size = os.fstat(fh.fileno()).st_size
            if size != expected:
                raise ModelFileError(f"{where} holds {size} bytes, its header implies {expected}")
            fh.seek(0)
            return np.load(fh, allow_pickle=False)
    except OSError as e:
        raise ModelFileError(f"{where} is missing or unreadable: {e}") from e
    except ValueError as e:
        if isinstance(e, ModelFileError):
            raise
        raise ModelFileError(f"{where} is not a valid .npy file: {e}") from e


def _finite(path: Path, name: str, a: np.ndarray) -> None:
    bad = np.flatnonzero(~np.isfinite(a))
    if bad.size:
        raise ModelFileError(
            f"model at {path}: {name}.npy holds {a[bad[0]]} at position {bad[0]} "
            f"({bad.size} non-finite values)"
        )


# -- multiclass fits --------------------------------------------------------------------------
#: Penalties of a saved multinomial fit (:func:`dl1.fit_multiclass`'s ``penalty``).
MULTICLASS_PENALTIES = ("l1", "grouped")
#: The binary losses of a one-vs-rest fit (``multi_class="ovr"``).
OVR_LOSSES = ("logistic", "squared_hinge", "hinge")


def _load_multiclass(ck: FieldChecker, path: Path, meta: dict[str, Any]) -> MulticlassModel:
    """A ``kind`` "multiclass" model: every field checked (types, ranges, the scheme against
    its loss and penalty, the class count against the labels, the intercepts, the classes'
    gaps and the rows of ``coef``), then ``coef``'s arrays."""
    scheme = meta.get("multi_class", "multinomial")  # absent: saved before one-vs-rest
    if scheme not in ("multinomial", "ovr"):
        ck.fail("multi_class", "is not 'multinomial' or 'ovr'", scheme)
    loss, penalty = ck.key(meta, "loss", "(root)"), ck.key(meta, "penalty", "(root)")
    if scheme == "multinomial" and loss != "multinomial":
        ck.fail("loss", "is not 'multinomial' (the loss of a multinomial model of kind "
                "'multiclass')", loss)  # fmt: skip
    if scheme == "ovr" and loss not in OVR_LOSSES:
        ck.fail("loss", f"is not one of {OVR_LOSSES} (a one-vs-rest model's)", loss)
    allowed = MULTICLASS_PENALTIES if scheme == "multinomial" else ("l1",)
    if penalty not in allowed:
        ck.fail("penalty", f"is not one of {allowed}", penalty)
    n = ck.key(meta, "n_samples", "(root)")
    p = ck.integer(ck.key(meta, "n_features", "(root)"), "n_features")
    K = ck.integer(ck.key(meta, "n_classes", "(root)"), "n_classes", 2)
    classes = check_labels(ck, ck.key(meta, "classes", "(root)"), "classes", K)
    kw: dict[str, Any] = {attr: _float(ck, meta, key) for key, attr in MULTICLASS_FLOATS}
    for key, lo, hi in (("alpha", 0.0, None), ("l1_ratio", 0.0, 1.0)):
        _float(ck, meta, key, lo=lo, hi=hi)
    if loss == "hinge" and kw["l1_ratio"] != 1.0:
        ck.fail("l1_ratio", "is not 1 (the one-vs-rest hinge takes the pure L1 penalty)",
                meta["l1_ratio"])  # fmt: skip
    for key, attr in MULTICLASS_INTS:
        kw[attr] = ck.integer(ck.key(meta, key, "(root)"), key)
    if scheme == "ovr":
        kw["gaps_"] = _floats(ck, ck.key(meta, "gaps", "(root)"), "gaps", K, lo=-GAP_ROUNDING)
    return MulticlassModel(
        coef_=_read_csr(path, "coef", K, p),
        intercept_=_floats(ck, ck.key(meta, "intercept", "(root)"), "intercept", K),
        classes_=classes,
        penalty=penalty,
        fit_intercept=check_bool(ck, ck.key(meta, "fit_intercept", "(root)"), "fit_intercept"),
        converged_=check_bool(ck, ck.key(meta, "converged", "(root)"), "converged"),
        n_samples_=None if n is None else ck.integer(n, "n_samples", 1),
        multi_class=scheme,
        loss=loss,
        **kw,
    )


#: A relative gap computed in floating point rounds below 0 at an exact answer (-2.2e-16
#: for a squared-hinge class): saved as computed, read back if no further below.
GAP_ROUNDING = 1e-12


def _floats(ck: FieldChecker, raw: Any, field: str, n: int, lo: float | None = None) -> Any:
    """``n`` finite ``float.hex`` values (at least ``lo``) of the list ``field``."""
    return np.array([float_value(ck, x, f"{field}[{k}]", finite=True, lo=lo)
                     for k, x in enumerate(ck.seq(raw, field, n))])  # fmt: skip


def _read_csr(path: Path, name: str, rows: int, cols: int) -> sp.csr_matrix:
    """The CSR matrix ``rows x cols`` of ``{name}_data``, ``_indices`` and ``_indptr``:
    pointers running up from 0, indices in range and strictly increasing in a row, values
    finite."""
    indptr = _read_npy(path, f"{name}_indptr", "<i8", (rows + 1,))
    nnz = int(indptr[-1])
    if indptr[0] != 0 or (np.diff(indptr) < 0).any() or nnz > rows * cols:
        raise ModelFileError(
            f"model at {path}: {name}_indptr.npy does not run up from 0 to at most "
            f"n_classes * n_features = {rows * cols}"
        )
    indices = _read_npy(path, f"{name}_indices", "<i8", (nnz,))
    data = _read_npy(path, f"{name}_data", "<f8", (nnz,))
    if nnz and (indices.min() < 0 or indices.max() >= cols):
        raise ModelFileError(
            f"model at {path}: {name}_indices.npy holds indices outside [0, {cols})"
        )
    _finite(path, f"{name}_data", data)
    M = sp.csr_matrix((data, indices, indptr), shape=(rows, cols))
    if not M.has_canonical_format:
        raise ModelFileError(
            f"model at {path}: {name}_indices.npy is not strictly increasing within each row"
        )
    return M


def check_labels(ck: FieldChecker, raw: Any, field: str, n: int) -> np.ndarray:
    """A classifier's ``n`` labels (``{"dtype", "values"}``, as
    :func:`dl1.saving.labels_json` writes them): a label dtype, ``n`` values of it, distinct
    and sorted (as ``np.unique`` gives ``classes_``)."""
    raw = ck.obj(raw, field)
    allowed = ("dtype", "values")
    extra = sorted(set(raw) - set(allowed))
    if extra:
        ck.fail(f"{field}.{extra[0]}", f"is not a field of the record (fields: {allowed})")
    dt = ck.key(raw, "dtype", field)
    if not isinstance(dt, str) or not is_label_dtype(dt):
        ck.fail(f"{field}.dtype", "is not a label dtype (bool, integer, float, str or object)",
                dt)  # fmt: skip
    dtype = np.dtype(dt)
    raw_values = ck.seq(ck.key(raw, "values", field), f"{field}.values", n)
    values = [_label(ck, dtype, x, f"{field}.values[{k}]") for k, x in enumerate(raw_values)]
    c = np.empty(n, dtype=dtype)
    c[:] = values
    if c.tolist() != values:
        ck.fail(f"{field}.values", f"do not fit dtype {dt}", raw_values)
    if not (c[:-1] < c[1:]).all():
        count = "two" if n == 2 else str(n)
        ck.fail(f"{field}.values", f"are not {count} distinct labels in increasing order",
                raw_values)  # fmt: skip
    return c


def _label(ck: FieldChecker, dtype: np.dtype, x: Any, field: str) -> Any:
    if dtype.kind == "b":
        return check_bool(ck, x, field)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return ck.integer(x, field, int(info.min), int(info.max))
    if dtype.kind == "f":
        return float_value(ck, x, field, finite=True)
    if not isinstance(x, str):
        ck.fail(field, "is not a string", x)
    return x


def multiclass_decisions(X: Any, coef: np.ndarray, intercept: np.ndarray, *,
                         split: str = "test") -> Any:  # fmt: skip
    """``X @ coef.T + intercept`` (n, K) for a dense ``coef`` (K, p): an ndarray for an
    in-memory ``X``, else a lazy dask array, one column a class computed blockwise over the
    same row blocks (:func:`dl1.predict.decision_function`), a block holding every class."""
    # local: dask.array (~0.2 s with its integrations) only for lazy inputs, as dl1.predict's
    import dask.array as da

    if not isinstance(X, Held):
        X = as_input(X, split)
        check_n_features(X, coef.shape[1])
        if not type(X).__module__.startswith("dask."):
            return np.asarray(X @ coef.T, dtype=np.float64) + intercept
    cols = [decision_function(X, coef[k], float(intercept[k]), split=split)
            for k in range(coef.shape[0])]  # fmt: skip
    if all(isinstance(c, np.ndarray) for c in cols):
        return np.stack(cols, axis=1)
    return da.stack(cols, axis=1).rechunk({1: -1})


def labels_of_decisions(d: Any, classes: np.ndarray) -> Any:
    """The class of the largest decision value of each row of ``d`` (n, K) (the first on a
    tie, as scikit-learn's), blockwise on a dask array."""
    if isinstance(d, np.ndarray):
        return classes[np.argmax(d, axis=1)]
    return d.map_blocks(lambda b: classes[np.argmax(b, axis=1)], dtype=classes.dtype,
                        drop_axis=1)  # fmt: skip


def probabilities_of_decisions(d: Any, log: bool = False, scheme: str = "multinomial") -> Any:
    """The class probabilities (or their logs) of decision values ``d`` (n, K), blockwise
    on dask: the row softmax of a multinomial model; of a one-vs-rest logistic one, each
    class's sigmoid with the rows normalised to sum to 1 (scikit-learn's
    ``OneVsRestClassifier.predict_proba``)."""
    fn = (log_softmax if log else softmax) if scheme == "multinomial" else (
        _ovr_log_proba if log else _ovr_proba)  # fmt: skip
    if isinstance(d, np.ndarray):
        return fn(d, axis=1)
    return d.map_blocks(lambda b: fn(b, axis=1), dtype=np.float64)


def _ovr_proba(d: np.ndarray, axis: int = 1) -> np.ndarray:
    P = expit(d)
    return P / P.sum(axis=axis, keepdims=True)


def _ovr_log_proba(d: np.ndarray, axis: int = 1) -> np.ndarray:
    """``log(sigmoid(d_k) / sum_j sigmoid(d_j))``, from ``log sigmoid`` (no underflow)."""
    L = log_expit(d)
    return L - logsumexp(L, axis=axis, keepdims=True)


@dataclass
class MulticlassModel:
    """A multiclass fit (:func:`dl1.fit_multiclass`, ``dl1.LogisticRegression`` or
    ``dl1.LinearSVC`` of more than two classes) with the problem it solved: it predicts (in
    memory, or lazily on a dask array, store or Dataset), scores, saves itself
    (:meth:`save`, read back by :func:`load_model` bit for bit) and converts to
    scikit-learn (:meth:`to_sklearn`).

    Attributes
    ----------
    coef_ : scipy.sparse.csr_matrix (K, p)
        A class a row (sparse: a text model's dense ``K x p`` would not fit in memory).
    intercept_ : ndarray (K,)
    classes_ : ndarray (K,)
        The labels, sorted; row ``k`` of ``coef_`` is ``classes_[k]``'s.
    multi_class : {"multinomial", "ovr"}
        One softmax model, or ``K`` one-vs-rest binary problems (liblinear's scheme).
    loss : str
        "multinomial", or the one-vs-rest binary loss ("logistic", "squared_hinge",
        "hinge").
    alpha, l1_ratio, penalty, tol, fit_intercept
        The problem solved (``penalty``: "l1", the elastic net, or "grouped"); one-vs-rest:
        every class's.
    gap_, primal_, dual_, converged_, n_rounds_, n_epochs_
        The certificate, as :class:`~dl1.solvers.multiclass.MulticlassResult`'s (``gap_``
        relative to the loss at the best constant; ``dual_gap_`` is the same). One-vs-rest:
        ``gap_`` is the largest class's relative gap, ``primal_`` and ``dual_`` the sums of
        the classes' objectives and dual bounds (those of the sum of the ``K`` problems).
    gaps_ : ndarray (K,) or None
        One-vs-rest: each class's relative duality gap (None for a multinomial model).
    n_samples_ : int or None
        Rows of the training data.
    history_ : list of dict
        The solver's rounds (empty for a loaded model: not saved).
    """

    #: The kind of a saved model (:func:`dl1.saving.save_model`).
    saved_kind: ClassVar[str] = "multiclass"
    coef_: sp.csr_matrix
    intercept_: np.ndarray
    classes_: np.ndarray
    alpha: float
    l1_ratio: float
    penalty: str
    tol: float
    fit_intercept: bool
    gap_: float
    primal_: float
    dual_: float
    converged_: bool
    n_rounds_: int
    n_epochs_: int
    n_samples_: int | None = None
    history_: list[dict[str, Any]] = field(default_factory=list)
    multi_class: str = "multinomial"
    loss: str = "multinomial"
    gaps_: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.coef_ = sp.csr_matrix(self.coef_, dtype=np.float64)
        self.intercept_ = np.asarray(self.intercept_, dtype=np.float64)
        self.classes_ = np.asarray(self.classes_)
        K = self.coef_.shape[0]
        if K < 2 or self.intercept_.shape != (K,) or self.classes_.shape != (K,):
            raise ValueError(
                f"a multiclass model needs K >= 2 rows of coef_ ({K}), K intercepts "
                f"({self.intercept_.shape}) and K classes ({self.classes_.shape})"
            )
        ovr = self.multi_class == "ovr"
        if (self.loss in OVR_LOSSES) != ovr or (self.loss == "multinomial") == ovr:
            raise ValueError(
                f"multi_class={self.multi_class!r} with loss={self.loss!r}: a multinomial "
                f"model's loss is 'multinomial', a one-vs-rest one's one of {OVR_LOSSES}"
            )
        if ovr and np.shape(self.gaps_) != (K,):
            raise ValueError(f"a one-vs-rest model needs gaps_ of shape ({K},), one a class")
        if ovr:
            self.gaps_ = np.asarray(self.gaps_, dtype=np.float64)

    @classmethod
    def from_result(
        cls,
        res: Any,
        *,
        alpha: float,
        l1_ratio: float,
        penalty: str = "l1",
        fit_intercept: bool = True,
        n_samples: int | None = None,
    ) -> MulticlassModel:
        """The model of a :class:`~dl1.solvers.multiclass.MulticlassResult` or of a
        one-vs-rest :class:`~dl1.solvers.ovr.OvrResult` (its ``classes_`` set, as
        :func:`dl1.fit_multiclass` returns it) and the problem it was solved for (what the
        result does not record)."""
        if hasattr(res, "gaps_"):  # one-vs-rest (an OvrResult): K certificates, summed
            cert = {"primal_": float(np.sum(res.primals_)), "dual_": float(np.sum(res.duals_)),
                    "n_epochs_": sum(int(h.get("inner_epochs", 0)) for h in res.history_),
                    "multi_class": "ovr", "loss": str(res.loss),
                    "gaps_": np.array(res.gaps_, dtype=np.float64)}  # fmt: skip
        else:
            cert = {"primal_": float(res.primal_), "dual_": float(res.dual_),
                    "n_epochs_": int(res.n_epochs_)}  # fmt: skip
        return cls(
            coef_=res.coef_, intercept_=res.intercept_, classes_=res.classes_,
            alpha=float(alpha), l1_ratio=float(l1_ratio), penalty=penalty, tol=float(res.tol),
            fit_intercept=bool(fit_intercept), gap_=float(res.gap_),
            converged_=bool(res.converged_), n_rounds_=int(res.n_rounds_),
            n_samples_=n_samples, history_=list(res.history_), **cert,
        )  # fmt: skip

    @property
    def n_features_in_(self) -> int:
        return int(self.coef_.shape[1])

    @property
    def n_classes(self) -> int:
        return int(self.coef_.shape[0])

    @property
    def dual_gap_(self) -> float:
        return self.gap_

    @property
    def has_proba(self) -> bool:
        """Whether the model gives probabilities: multinomial, or one-vs-rest logistic."""
        return self.loss in ("multinomial", "logistic")

    def decision_function(self, X: Any, *, split: str = "test") -> Any:
        """``X @ coef_.T + intercept_`` (n, K) (:func:`multiclass_decisions`)."""
        return multiclass_decisions(X, self.coef_.toarray(), self.intercept_, split=split)

    def predict(self, X: Any, *, split: str = "test") -> Any:
        """The class of the largest decision value of each row, in ``classes_`` (the most
        probable one)."""
        return labels_of_decisions(self.decision_function(X, split=split), self.classes_)

    def predict_proba(self, X: Any, *, split: str = "test") -> Any:
        """The class probabilities (n, K), columns in ``classes_`` order, rows summing to 1
        (:func:`probabilities_of_decisions`).

        Raises
        ------
        ValidationError
            A one-vs-rest hinge model: its margins are no probabilities.
        """
        if not self.has_proba:
            raise ValidationError(
                f"a one-vs-rest {self.loss} model gives no probabilities (its decision values "
                "are margins): use decision_function or predict"
            )
        d = self.decision_function(X, split=split)
        return probabilities_of_decisions(d, scheme=self.multi_class)

    def score(self, X: Any, y: Any = None, *, sample_weight: Any = None,
              split: str = "test") -> float:  # fmt: skip
        """Accuracy of :meth:`predict`; ``y=None`` takes a store's labels of ``split`` or a
        Dataset's."""
        # local: scikit-learn (~1 s, ~120 MiB to import) only to score, as dl1.predict's
        from sklearn.metrics import accuracy_score

        y = stored_labels(X, split) if y is None else y
        if y is None:
            raise ValidationError("y is required unless X is a store or a Dataset with y")
        pred = self.predict(X, split=split)
        y, pred = (np.asarray(computed(a)[0] if hasattr(a, "compute") else a).ravel()
                   for a in (y, pred))  # fmt: skip
        if y.shape[0] != pred.shape[0]:
            raise ValidationError(f"y has {y.shape[0]} values, X has {pred.shape[0]} rows")
        sw = None if sample_weight is None else np.asarray(sample_weight, np.float64).ravel()
        return float(accuracy_score(y, pred, sample_weight=sw))

    def to_sklearn(self) -> Any:
        """The fitted scikit-learn model with the same predictions
        (:func:`dl1.saving.multiclass_to_sklearn`): multinomial, a ``LogisticRegression``;
        one-vs-rest, a ``OneVsRestClassifier`` of binary logistic regressions, or an
        ``SGDClassifier`` of the hinge's loss."""
        return multiclass_to_sklearn(self)

    def save(self, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
        """Write the model to the directory ``path`` (JSON and ``.npy``, no pickle: kind
        "multiclass" of :mod:`dl1.saving`, with its scheme and loss), read back by
        :func:`load_model`."""
        return save_model(self, path, overwrite=overwrite)

    def __repr__(self) -> str:
        return (
            f"MulticlassModel(multi_class={self.multi_class!r}, loss={self.loss!r}, "
            f"penalty={self.penalty!r}, alpha={self.alpha:.6g}, "
            f"l1_ratio={self.l1_ratio}, classes={self.n_classes}, nnz={self.coef_.nnz}, "
            f"gap={self.gap_:.3e}, converged={self.converged_}, rounds={self.n_rounds_})"
        )


__all__ = ["MulticlassModel", "load_model", "read_model"]
