"""Numba kernels of the store: validation and counting-sort transposition.

They take raw compressed-sparse arrays and scalars only, and are tested against NumPy
references in ``tests/kernels/test_store.py``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# Status codes returned by :func:`check_compressed`.
OK = 0
BAD_INDPTR = 1
NEGATIVE_INDEX = 2
INDEX_TOO_LARGE = 3
UNSORTED = 4
DUPLICATE = 5
NOT_FINITE = 6

PROBLEMS = {
    BAD_INDPTR: "index pointer decreases, passes or does not end at the number of nonzeros",
    NEGATIVE_INDEX: "negative index",
    INDEX_TOO_LARGE: "index out of range",
    UNSORTED: "indices are not sorted",
    DUPLICATE: "duplicate index",
    NOT_FINITE: "value is NaN or infinite",
}


@njit(nogil=True, cache=True)
def check_compressed(indptr, indices, data, limit):  # pragma: no cover - compiled
    """First structural problem of a compressed-sparse matrix, safe on any input.

    The index pointer is checked whole (starts at 0, never decreases, never passes the
    number of nonzeros, ends there) before it is used as an index, so hostile arrays can
    make this kernel report a problem but never read outside them.

    Parameters
    ----------
    indptr, indices, data : arrays of a CSR (or CSC) matrix.
    limit : int
        Indices must be ``< limit``; a negative ``limit`` disables the upper check.

    Returns
    -------
    (status, major, pos) : the status code (``OK`` when valid), the row (column) and the
        position in ``indices`` of the first problem (for ``BAD_INDPTR``: the row of the
        index pointer at fault, ``pos`` 0; :func:`indptr_problem` says what is wrong).
    """
    n_major = indptr.shape[0] - 1
    nnz = indices.shape[0]
    if n_major < 0 or data.shape[0] != nnz or indptr[0] != 0:
        return BAD_INDPTR, 0, 0
    for r in range(n_major):
        if indptr[r + 1] < indptr[r] or indptr[r + 1] > nnz:
            return BAD_INDPTR, r, 0
    if indptr[n_major] != nnz:
        return BAD_INDPTR, n_major, 0
    for r in range(n_major):
        start = indptr[r]
        end = indptr[r + 1]
        for k in range(start, end):
            c = indices[k]
            if c < 0:
                return NEGATIVE_INDEX, r, k
            if limit >= 0 and c >= limit:
                return INDEX_TOO_LARGE, r, k
            if k > start:
                prev = indices[k - 1]
                if c == prev:
                    return DUPLICATE, r, k
                if c < prev:
                    return UNSORTED, r, k
            if not np.isfinite(data[k]):
                return NOT_FINITE, r, k
    return OK, 0, 0


def indptr_problem(indptr: np.ndarray, n_indices: int, n_data: int) -> str:
    """What is wrong with an index pointer :func:`check_compressed` refused (NumPy, for
    the error message only)."""
    if indptr.shape[0] == 0:
        return "index pointer is empty"
    if n_data != n_indices:
        return f"{n_indices} indices but {n_data} values"
    if indptr[0] != 0:
        return f"index pointer starts at {int(indptr[0])}, not 0"
    bad = (np.diff(indptr) < 0) | (indptr[1:] > n_indices)
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        a, b = int(indptr[r]), int(indptr[r + 1])
        if b > n_indices:
            return f"index pointer entry {r + 1} is {b}, past the {n_indices} nonzeros"
        return f"index pointer decreases after entry {r} ({a} to {b})"
    return f"index pointer ends at {int(indptr[-1])}, not at the {n_indices} nonzeros"


@njit(nogil=True, cache=True)
def csr_to_col_sorted(indptr, indices, data, index_base, n_cols):  # pragma: no cover
    """Entries of a CSR batch sorted by column, rows ascending inside a column.

    A stable counting sort, O(nnz + n_cols). ``indices - index_base`` must lie in
    ``[0, n_cols)``.

    Returns
    -------
    rows : int32, row of each entry inside the batch.
    cols : int32, column of each entry (``indices - index_base``).
    vals : values, same dtype as ``data``.
    counts : int64, number of entries per column (length ``n_cols``).
    """
    nnz = indices.shape[0]
    counts = np.zeros(n_cols, dtype=np.int64)
    for k in range(nnz):
        counts[indices[k] - index_base] += 1
    starts = np.empty(n_cols + 1, dtype=np.int64)
    starts[0] = 0
    for c in range(n_cols):
        starts[c + 1] = starts[c] + counts[c]
    fill = starts[:-1].copy()
    rows = np.empty(nnz, dtype=np.int32)
    cols = np.empty(nnz, dtype=np.int32)
    vals = np.empty(nnz, dtype=data.dtype)
    for r in range(indptr.shape[0] - 1):
        for k in range(indptr[r], indptr[r + 1]):
            c = indices[k] - index_base
            dst = fill[c]
            fill[c] = dst + 1
            rows[dst] = r
            cols[dst] = c
            vals[dst] = data[k]
    return rows, cols, vals, counts


@njit(nogil=True, cache=True)
def coo_to_csc(rows, cols, vals, n_cols):  # pragma: no cover - compiled
    """CSC arrays of COO entries by a stable counting sort on the column.

    Entries of one column keep their input order, so rows given in ascending order per
    column stay sorted. ``cols`` must lie in ``[0, n_cols)``.
    """
    nnz = cols.shape[0]
    indptr = np.zeros(n_cols + 1, dtype=np.int64)
    for k in range(nnz):
        indptr[cols[k] + 1] += 1
    for c in range(n_cols):
        indptr[c + 1] += indptr[c]
    fill = indptr[:-1].copy()
    indices = np.empty(nnz, dtype=np.int32)
    data = np.empty(nnz, dtype=vals.dtype)
    for k in range(nnz):
        c = cols[k]
        dst = fill[c]
        fill[c] = dst + 1
        indices[dst] = rows[k]
        data[dst] = vals[k]
    return indptr, indices, data


@njit(nogil=True, cache=True)
def csc_append_rows(indptr, indices, data, offset, out_idx, out_data, cursor):  # pragma: no cover
    """Copy a CSC row chunk under the rows already placed in a preallocated CSC matrix.

    Stacking a feature block's row chunks one at a time keeps one chunk besides the result
    in memory (scipy's ``vstack`` of CSC matrices goes through COO, several copies).

    Parameters
    ----------
    indptr, indices, data : CSC arrays of the chunk (same number of columns as the result).
    offset : int
        Row of the result where the chunk's row 0 goes.
    out_idx, out_data : the result's arrays (``nnz`` long).
    cursor : int64 array (ncols,)
        Next free position of each column in the result, advanced in place; start it at the
        result's ``indptr[:-1]``. Chunks appended in row order keep the columns sorted.
    """
    for j in range(indptr.shape[0] - 1):
        c = cursor[j]
        for k in range(indptr[j], indptr[j + 1]):
            out_idx[c] = indices[k] + offset
            out_data[c] = data[k]
            c += 1
        cursor[j] = c


@njit(nogil=True, cache=True)
def _mix64(z):  # pragma: no cover - compiled
    """The splitmix64 finaliser: a bijection of uint64 whose output bits all depend on all
    input bits."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@njit(nogil=True, cache=True)
def content_digest(indptr, indices, bits, n_cols, column_major):  # pragma: no cover
    """Order-independent 64-bit digest of the entries of a compressed-sparse block.

    The sum (mod 2**64) over entries of a hash of (position ``row * n_cols + col``, value
    bits): the same for the CSC and the CSR layout of one matrix, different (but for a
    2**-64 chance) for any other matrix. ``bits`` is the values viewed as unsigned integers
    of their width; the index pointer must have passed :func:`check_compressed`.
    """
    total = np.uint64(0)
    width = np.uint64(n_cols)
    for m in range(indptr.shape[0] - 1):
        for k in range(indptr[m], indptr[m + 1]):
            if column_major:
                pos = np.uint64(indices[k]) * width + np.uint64(m)
            else:
                pos = np.uint64(m) * width + np.uint64(indices[k])
            total += _mix64(pos ^ _mix64(np.uint64(bits[k]) + np.uint64(0x9E3779B97F4A7C15)))
    return total
