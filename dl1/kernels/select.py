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
