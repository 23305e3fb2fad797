"""The chunks of a dask array ``X`` as SciPy sparse matrices, whatever they hold.

Dask's documented ways to hold sparse data are pydata ``sparse`` arrays (``COO``, ``GCXS``)
or SciPy matrices; dense ndarrays are accepted too. Every task reading a chunk converts it
here, so each kind is accepted by every entry point alike.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import scipy.sparse as sp

from dl1.errors import ValidationError


def is_pydata_sparse(x: Any) -> bool:
    """Whether ``x`` is a pydata ``sparse`` array (``COO``, ``GCXS``, ``DOK``, ...)."""
    return type(x).__module__.split(".")[0] == "sparse" and hasattr(x, "nnz")


def as_scipy(chunk: Any, fmt: Literal["csc", "csr"]) -> sp.csc_matrix | sp.csr_matrix:
    """``chunk`` (a SciPy sparse matrix or array, a pydata ``sparse`` array or a dense
    array) as a 2-D SciPy matrix in format ``fmt``; not copied when it already is one.

    Raises
    ------
    ValidationError
        When the chunk is not 2-D.
    """
    if is_pydata_sparse(chunk):
        _check_2d(chunk)
        if chunk.fill_value != 0:
            raise ValidationError(f"a chunk of X is a sparse array of fill value "
                                  f"{chunk.fill_value}; only 0 is supported")  # fmt: skip
        if not hasattr(chunk, "to_scipy_sparse"):  # DOK
            chunk = chunk.to_coo()
        chunk = chunk.to_scipy_sparse()
    elif not sp.issparse(chunk):
        chunk = _check_2d(np.asarray(chunk))
    else:
        check_structure(chunk)
        kind = sp.csc_matrix if fmt == "csc" else sp.csr_matrix
        if type(chunk) is kind:  # the constructor would copy ("prune") a sliced chunk
            return chunk
    return sp.csc_matrix(chunk) if fmt == "csc" else sp.csr_matrix(chunk)


def check_structure(m: Any) -> None:
    """Refuse a SciPy sparse matrix whose index arrays are not its shape's: SciPy's
    compiled conversions trust them, and an index out of range reads or writes outside
    memory (a crash, or a wrong answer). One vectorised pass over the indices; the error
    names the row (CSR, COO) or column (CSC) and the index.

    Raises
    ------
    ValidationError
    """
    fmt = m.format
    if fmt in ("csr", "csc"):
        _check_compressed(m, "row" if fmt == "csr" else "column")
    elif fmt == "coo":
        for axis, idx, size in (("row", m.row, m.shape[0]), ("column", m.col, m.shape[1])):
            bad = np.flatnonzero((idx < 0) | (idx >= size))
            if bad.size:
                raise ValidationError(f"X (COO) entry {int(bad[0])} has {axis} index "
                                      f"{int(idx[bad[0]])} outside [0, {size})")  # fmt: skip


def _check_compressed(m: Any, major: str) -> None:
    minor = "column" if major == "row" else "row"
    n_major, n_minor = (m.shape[0], m.shape[1]) if major == "row" else (m.shape[1], m.shape[0])
    indptr, indices = np.asarray(m.indptr), np.asarray(m.indices)
    where = f"X ({m.format.upper()}, shape {m.shape})"
    if indptr.ndim != 1 or indptr.shape[0] != n_major + 1:
        raise ValidationError(f"{where}: indptr has {indptr.shape[0]} entries, expected "
                              f"{n_major + 1} (one per {major}, plus one)")  # fmt: skip
    if indptr[0] != 0:
        raise ValidationError(f"{where}: indptr[0] = {int(indptr[0])}, expected 0")
    step = np.flatnonzero(np.diff(indptr) < 0)
    if step.size:
        raise ValidationError(f"{where}: indptr decreases at {major} {int(step[0])}")
    nnz = int(indptr[-1])
    if nnz > indices.shape[0] or nnz > np.asarray(m.data).shape[0]:
        raise ValidationError(f"{where}: indptr ends at {nnz}, beyond the "
                              f"{min(indices.shape[0], m.data.shape[0])} stored entries")
    bad = np.flatnonzero((indices[:nnz] < 0) | (indices[:nnz] >= n_minor))
    if bad.size:
        k = int(bad[0])
        at = int(np.searchsorted(indptr, k, side="right") - 1)
        raise ValidationError(f"{where}: {major} {at} has {minor} index {int(indices[k])} "
                              f"outside [0, {n_minor})")  # fmt: skip


def _check_2d(chunk: Any) -> Any:
    if chunk.ndim != 2:
        raise ValidationError(f"a chunk of X has {chunk.ndim} dimensions, expected 2")
    return chunk


def as_csc(chunk: Any) -> sp.csc_matrix:
    """``chunk`` as a CSC matrix (see :func:`as_scipy`)."""
    return as_scipy(chunk, "csc")


def as_csr(chunk: Any) -> sp.csr_matrix:
    """``chunk`` as a CSR matrix (see :func:`as_scipy`)."""
    return as_scipy(chunk, "csr")


def column_range(local: Any, lo: int, hi: int) -> Any:
    """Columns ``lo:hi`` of an in-memory ``local`` (CSC, as :func:`dl1.inputs.as_dask`
    keeps it, or a NumPy array) without copying: a CSC matrix over slices of its arrays,
    or a view. Pickled, it carries only those columns (NumPy pickles a view's own data)."""
    if not sp.issparse(local):
        return local[:, lo:hi]
    s, e = int(local.indptr[lo]), int(local.indptr[hi])
    m = sp.csc_matrix((local.shape[0], hi - lo), dtype=local.dtype)
    # the arrays set, not passed to the constructor: its format check copies a slice of
    # less than half an array ("pruning" it)
    m.indptr = local.indptr[lo : hi + 1] - s
    m.indices, m.data = local.indices[s:e], local.data[s:e]
    return m


class ColumnSliced:
    """An in-memory matrix (CSC or NumPy) as :func:`dask.array.from_array` slices it,
    without copying: its column ranges over all rows are :func:`column_range` views
    (``from_array`` copies an array that has a ``copy`` method, and SciPy's slicing copies
    each chunk again: twice the caller's matrix for nothing, a fit's blocks being
    read-only)."""

    def __init__(self, local: Any) -> None:
        self.local = local
        self.shape = local.shape
        self.dtype = local.dtype
        self.ndim = 2

    def __getitem__(self, index: Any) -> Any:
        rows, cols = index if isinstance(index, tuple) and len(index) == 2 else (None, None)
        if _whole(rows, self.shape[0]) and isinstance(cols, slice) and cols.step in (None, 1):
            lo, hi, _ = cols.indices(self.shape[1])
            return column_range(self.local, lo, max(lo, hi))
        return self.local[index]


def _whole(rows: Any, n: int) -> bool:
    """Whether ``rows`` is a slice over all ``n`` rows."""
    return isinstance(rows, slice) and rows.step in (None, 1) and rows.indices(n)[:2] == (0, n)


def matrix_nbytes(local: Any) -> int:
    """Bytes of an in-memory matrix's values and structure (a NumPy array's, or a SciPy
    sparse matrix's ``data``, ``indices`` and ``indptr``)."""
    if not sp.issparse(local):
        return int(np.asarray(local).nbytes)
    return int(local.data.nbytes + local.indices.nbytes + local.indptr.nbytes)
