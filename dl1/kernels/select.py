"""Gathering a subset of the columns of a CSC matrix (working sets)."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def csc_select_columns(indptr, indices, data, cols):  # pragma: no cover - compiled
    """CSC arrays ``(indptr, indices, data)`` of the columns ``cols`` in that order.

    Parameters
    ----------
    indptr : ndarray of int64, shape (ncols + 1,)
    indices : ndarray of int32
    data : ndarray of float32 or float64
    cols : ndarray of int64, indices in ``[0, ncols)`` (validated by the caller)

    Returns
    -------
    out_indptr : int64, out_indices : int32, out_data : same dtype as ``data``
    """
    m = cols.shape[0]
    out_indptr = np.zeros(m + 1, dtype=np.int64)
    for t in range(m):
        j = cols[t]
        out_indptr[t + 1] = out_indptr[t] + indptr[j + 1] - indptr[j]
    nnz = out_indptr[m]
    out_indices = np.empty(nnz, dtype=indices.dtype)
    out_data = np.empty(nnz, dtype=data.dtype)
    for t in range(m):
        j = cols[t]
        dst = out_indptr[t]
        for k in range(indptr[j], indptr[j + 1]):
            out_indices[dst] = indices[k]
            out_data[dst] = data[k]
            dst += 1
    return out_indptr, out_indices, out_data


@njit(nogil=True, cache=True)
def csc_copy_columns_into(
    indptr, indices, data, cols, out_indptr, dest, out_indices, out_data
):  # pragma: no cover - compiled
    """Copy columns ``cols[t]`` of a CSC matrix into column ``dest[t]`` of a preallocated one.

    Working sets are assembled from several cached groups of columns in one allocation
    (instead of concatenating the groups and then selecting from the concatenation).

    Parameters
    ----------
    indptr, indices, data : the source CSC arrays.
    cols : ndarray of int64, source columns (validated by the caller).
    out_indptr : ndarray of int64, the result's index pointer, already complete.
    dest : ndarray of int64, the result's columns receiving ``cols`` (same length).
    out_indices, out_data : the result's arrays, filled in place.
    """
    for t in range(cols.shape[0]):
        j = cols[t]
        d = out_indptr[dest[t]]
        for k in range(indptr[j], indptr[j + 1]):
            out_indices[d] = indices[k]
            out_data[d] = data[k]
            d += 1


@njit(nogil=True, cache=True)
def csc_rows_as_csr(indptr, indices, data, scale, cols, r0, r1):  # pragma: no cover - compiled
    """Rows ``[r0, r1)`` of the columns ``cols`` of a CSC matrix, as float64 CSR arrays.

    Column ``t`` of the result is column ``cols[t]``, each value multiplied by
    ``scale[cols[t]]`` when ``scale`` is not empty. This is a transpose of only the wanted
    rows: it costs one read of the columns' nonzeros and allocates only the result, where
    selecting the columns, widening them and slicing their rows copies the columns whole.

    Parameters
    ----------
    indptr : ndarray of int64, shape (ncols + 1,)
    indices : ndarray of int32 (any order within a column)
    data : ndarray of float32 or float64
    scale : ndarray of float64, shape (ncols,) or (0,)
    cols : ndarray of int64, indices in ``[0, ncols)`` (validated by the caller)
    r0, r1 : int, ``0 <= r0 <= r1``

    Returns
    -------
    out_indptr : int64, shape (r1 - r0 + 1,)
    out_indices : int32, result columns, increasing within a row
    out_data : float64
    """
    nr = r1 - r0
    m = cols.shape[0]
    out_indptr = np.zeros(nr + 1, dtype=np.int64)
    for t in range(m):
        j = cols[t]
        for k in range(indptr[j], indptr[j + 1]):
            i = indices[k]
            if r0 <= i < r1:
                out_indptr[i - r0 + 1] += 1
    for i in range(nr):
        out_indptr[i + 1] += out_indptr[i]
    out_indices = np.empty(out_indptr[nr], dtype=np.int32)
    out_data = np.empty(out_indptr[nr], dtype=np.float64)
    fill = out_indptr[:nr].copy()
    scaled = scale.shape[0] > 0
    for t in range(m):
        j = cols[t]
        s = scale[j] if scaled else 1.0
        for k in range(indptr[j], indptr[j + 1]):
            i = indices[k]
            if r0 <= i < r1:
                d = fill[i - r0]
                out_indices[d] = t
                out_data[d] = np.float64(data[k]) * s  # s = 1.0: exact
                fill[i - r0] += 1
    return out_indptr, out_indices, out_data
