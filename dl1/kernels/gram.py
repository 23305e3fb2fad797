"""Coordinate descent on a Gram matrix (covariance updates) for the squared loss.

For a working set of ``m`` columns with ``Q = X_W^T (S - s s^T / sum(s)) X_W / n`` (the
intercept profiled out) and ``h = -grad F(w)``, coordinate ``j`` is minimised exactly and ``h``
kept current with one row of ``Q``: an epoch costs ``O(m * changes)`` instead of the nonzeros
of ``X_W`` (Friedman, Hastie & Tibshirani, "Regularization paths for generalized linear
models via coordinate descent", J. Stat. Softw. 2010, Sec. 2.2, covariance updates).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from dl1.kernels.cd import soft_threshold


@njit(nogil=True, cache=True)
def gram_cd_epochs(Q, h, w, alpha_l1, alpha_l2, n_epochs):  # pragma: no cover - compiled
    """Cyclic coordinate-descent epochs with covariance updates.

    Parameters
    ----------
    Q : ndarray of float32 or float64, shape (m, m), C-contiguous, symmetric
        Hessian of the datafit on the working set (the steps are computed in float64).
    h : ndarray of float64, shape (m,)
        ``-grad F`` at ``w``; updated in place.
    w : ndarray of float64, shape (m,)
        Coefficients; updated in place.
    alpha_l1, alpha_l2 : float
        Penalty ``alpha_l1 |w_j| + alpha_l2 / 2 w_j^2``.
    n_epochs : int

    Returns
    -------
    max_dw : float
        Largest ``|dw_j| sqrt(Q_jj)`` of the last epoch (0.0 at a fixed point).
    """
    m = w.shape[0]
    max_dw = 0.0
    for _ in range(n_epochs):
        max_dw = 0.0
        for j in range(m):
            L = Q[j, j]
            if L <= 0.0:
                continue
            old = w[j]
            new = soft_threshold(L * old + h[j], alpha_l1) / (L + alpha_l2)
            if new == old:
                continue
            d = new - old
            w[j] = new
            row = Q[j]
            for k in range(m):
                h[k] -= row[k] * d
            a = abs(d) * L**0.5
            if a > max_dw:
                max_dw = a
    return max_dw


@njit(nogil=True, cache=True)
def gram_matvec(Q, d, out):  # pragma: no cover - compiled
    """``out = Q @ d`` for a symmetric ``Q``, as a sum of the rows of ``d``'s nonzeros.

    Rows are added in index order with float64 accumulation, whatever the dtype of ``Q`` and
    the number of threads: unlike a BLAS ``gemv`` (whose float32 kernels sum in an order that
    depends on the thread count) the result is the same in every process. Costs one row of
    ``Q`` per nonzero of ``d``.

    Parameters
    ----------
    Q : ndarray of float32 or float64, shape (m, m), C-contiguous, symmetric
    d : ndarray of float64, shape (m,)
    out : ndarray of float64, shape (m,)
        Overwritten with the result.
    """
    m = d.shape[0]
    for i in range(m):
        out[i] = 0.0
    for k in range(m):
        dk = d[k]
        if dk == 0.0:
            continue
        row = Q[k]
        for i in range(m):
            out[i] += row[i] * dk


@njit(nogil=True, cache=True)
def csc_dense_rows(indptr, indices, data, cursor, row_end, out):  # pragma: no cover
    """Densify the next rows of a CSC matrix, transposed: rows ``[r0, row_end)`` of column
    ``i`` into ``out[i]``.

    ``cursor[i]`` points at the first entry of column ``i`` not yet densified (row ``>= r0``,
    rows increasing within a column) and is advanced past the block; ``out`` (shape
    ``(m, row_end - r0)``) must be all zero. Each column is written to one contiguous row of
    ``out`` (a row-major ``(rows, m)`` target took a cache miss per nonzero, 3-5x slower on
    dense working sets). Walking the row blocks of a working set in order costs one pass
    over its nonzeros in all.

    Parameters
    ----------
    indptr, indices, data : CSC arrays (n x m).
    cursor : ndarray of int64, shape (m,), updated in place.
    row_end : int
    out : ndarray of float64, shape (m, rows), C-contiguous.
    """
    m = indptr.shape[0] - 1
    r0 = row_end - out.shape[1]
    for i in range(m):
        t = cursor[i]
        end = indptr[i + 1]
        col = out[i]
        while t < end and indices[t] < row_end:
            col[indices[t] - r0] = data[t]
            t += 1
        cursor[i] = t


@njit(nogil=True, cache=True)
def take_submatrix(src, src_idx, dst, dst_idx):  # pragma: no cover - compiled
    """``dst[dst_idx[a], dst_idx[b]] = src[src_idx[a], src_idx[b]]`` for all ``a, b``.

    The cached Gram entries of the columns a working set keeps (one pass over the entries,
    where NumPy's ``np.ix_`` indexing makes two).
    """
    k = src_idx.shape[0]
    for a in range(k):
        srow = src[src_idx[a]]
        drow = dst[dst_idx[a]]
        for b in range(k):
            drow[dst_idx[b]] = srow[src_idx[b]]


@njit(nogil=True, cache=True)
def csc_cross_gram(indptr, indices, data, n, new, sw, out):  # pragma: no cover - compiled
    """``out[a, t] = sum_i x_a[i] s_i x_new[t][i]`` for every column ``a`` of a sparse CSC
    matrix (``n`` rows, ``m`` columns) and the columns ``new``: ``X^T S X_new``.

    The new columns are laid out by rows once (``O(n + nnz_new)``); each nonzero ``(a, i)``
    then meets row ``i``'s entries in the new columns, so the cost is ``nnz + sum_{(a, i)}
    knew_i`` (``knew_i`` the row's nonzeros among the new columns): a general sparse product
    does the same arithmetic but spends most of its time building its sparse result. Every
    entry sums its rows in increasing order. ``sw`` empty means unit weights; ``out`` (shape
    ``(m, len(new))``) must be zero.
    """
    m = indptr.shape[0] - 1
    count = np.zeros(n + 1, np.int64)
    for t in range(new.shape[0]):
        c = new[t]
        for k in range(indptr[c], indptr[c + 1]):
            count[indices[k] + 1] += 1
    for i in range(n):
        count[i + 1] += count[i]
    fill = count[:-1].copy()
    slots = np.empty(count[n], np.int64)
    vals = np.empty(count[n], np.float64)
    weighted = sw.shape[0] > 0
    for t in range(new.shape[0]):  # in order, so each row lists its new columns in order
        c = new[t]
        for k in range(indptr[c], indptr[c + 1]):
            i = indices[k]
            slots[fill[i]] = t
            vals[fill[i]] = data[k] * sw[i] if weighted else data[k]
            fill[i] += 1
    for a in range(m):
        for k in range(indptr[a], indptr[a + 1]):
            i = indices[k]
            v = data[k]
            for u in range(count[i], count[i + 1]):
                out[a, slots[u]] += v * vals[u]
