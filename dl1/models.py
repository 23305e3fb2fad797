"""Saved models of dl1 read back (:func:`load_model`), their files checked as untrusted
input; the format and the writing are :mod:`dl1.saving`'s.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from dl1 import __version__
from dl1.errors import ModelFileError, ValidationError
from dl1.objective.datafits import LOSSES, datafit_class
from dl1.paths.result import PathResult
from dl1.saving import (
    ARRAYS,
    FIT_FLOATS,
    FIT_INTS,
    FORMAT_NAME,
    MODEL_JSON,
    PATH_VECTORS,
    READABLE_VERSIONS,
    content_digest,
    fit_content,
    path_content,
    read_json,
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
    FitResult or PathResult
        It predicts bit for bit as the saved model.

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


def _float(
    ck: FieldChecker,
    meta: dict[str, Any],
    key: str,
    *,
    finite: bool = False,
    lo: float | None = None,
    hi: float | None = None,
) -> float:
    return float_value(ck, ck.key(meta, key, "(root)"), key, finite=finite, lo=lo, hi=hi)


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


__all__ = ["load_model", "read_model"]
