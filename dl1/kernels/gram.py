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

from dl1.kernels.cd import penalised_step


@njit(nogil=True, cache=True)
def gram_cd_epochs(Q, h, w, alpha_l1, alpha_l2, factors, bounds, n_epochs):  # pragma: no cover
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
        Penalty ``f_j (alpha_l1 |w_j| + alpha_l2 / 2 w_j^2)``.
    factors, bounds : per-column factors ``f_j`` (empty for 1) and bounds (empty for none)
        (:func:`dl1.kernels.cd.penalised_step`).
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
            new = penalised_step(L * old + h[j], L, alpha_l1, alpha_l2, factors, j, bounds)
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


#: Rows :func:`csc_cross_gram` lays out at a time: their CSR copy (16 bytes a nonzero)
#: stays in the L2 cache for rows of a few dozen nonzeros in the working set.
ROW_TILE = 4096


@njit(nogil=True, cache=True)
def csc_cross_gram(indptr, indices, data, n, new, sw, out, tile=ROW_TILE):  # pragma: no cover
    """``out[t, a] += sum_i x_new[t][i] s_i x_a[i]`` for the columns ``new`` and every column
    ``a`` of a sparse CSC matrix (``n`` rows, ``m`` columns, rows sorted within a column):
    ``X_new^T S X``.

    The rows are taken ``tile`` at a time: the tile's entries are laid out by rows (a CSR
    copy small enough to stay in cache, filled by one sequential pass over each column's
    range), then each row adds the outer product of its nonzeros among the new columns with
    its nonzeros. The cost is ``nnz + sum_i k_i knew_i`` (``k_i``, ``knew_i`` the row's
    nonzeros among all and new columns), with the matrix read once in order: walking the
    columns instead and looking up each nonzero's row misses the cache on every nonzero,
    7x slower on working sets of short rows whose columns are long (short texts' frequent
    words). A row's products with one new column go to one row of ``out``, at increasing
    positions (its nonzeros' columns): an ``(m, len(new))`` target, written a column at a
    time, missed the cache on every product and was 2-2.5x slower on long rows (tf-idf).
    Every entry sums its rows in increasing order, whatever ``tile`` and whichever other
    columns are new. ``sw`` empty means unit weights; ``out`` has shape ``(len(new), m)``
    and is added to (zero it for the product alone).
    """
    m = indptr.shape[0] - 1
    slot = np.full(m, -1, np.int64)  # a column's position among the new ones
    for t in range(new.shape[0]):
        slot[new[t]] = t
    cursor = indptr[:-1].copy()
    weighted = sw.shape[0] > 0
    count = np.zeros(tile + 1, np.int64)
    fill = np.zeros(tile, np.int64)
    cols = np.empty(0, np.int64)
    vals = np.empty(0, np.float64)
    for r0 in range(0, n, tile):
        r1 = min(n, r0 + tile)
        rows = r1 - r0
        count[:] = 0
        for a in range(m):  # the tile's entries, counted by row
            t = cursor[a]
            while t < indptr[a + 1] and indices[t] < r1:
                count[indices[t] - r0 + 1] += 1
                t += 1
        for i in range(rows):
            count[i + 1] += count[i]
        if count[rows] > cols.shape[0]:
            cols = np.empty(max(count[rows], 2 * cols.shape[0]), np.int64)
            vals = np.empty(cols.shape[0], np.float64)
        fill[:rows] = count[:rows]
        for a in range(m):  # in column order: each row lists its columns increasing
            t = cursor[a]
            while t < indptr[a + 1] and indices[t] < r1:
                i = indices[t] - r0
                cols[fill[i]] = a
                vals[fill[i]] = data[t]
                fill[i] += 1
                t += 1
            cursor[a] = t
        for i in range(rows):
            lo, hi = count[i], count[i + 1]
            wi = sw[r0 + i] if weighted else 1.0
            for u in range(lo, hi):
                tu = slot[cols[u]]
                if tu < 0:
                    continue
                vu = vals[u] * wi
                row = out[tu]
                for v in range(lo, hi):
                    row[cols[v]] += vals[v] * vu


@njit(nogil=True, cache=True)
def csr_weighted_gram(indptr, indices, data, h, out):  # pragma: no cover - compiled
    """``out = X^T diag(h) X`` for a CSR ``X`` (``n x m``), row by row: each row adds
    ``h_i x_a x_b`` for its pairs of nonzeros, ``O(sum_i nnz_i^2)`` (a proximal Newton
    model's Hessian on a working set, :mod:`dl1.tasks.row_newton`). A sparse-sparse product
    costs several times more on frequent columns.

    Parameters
    ----------
    indptr, indices, data : the CSR arrays of ``X``, column indices sorted within a row.
    h : ndarray of float64, shape (n,)
    out : ndarray of float64, shape (m, m), C-contiguous
        Overwritten with the (symmetric) result.
    """
    m = out.shape[0]
    for a in range(m):
        for b in range(m):
            out[a, b] = 0.0
    for i in range(indptr.shape[0] - 1):
        hi = h[i]
        if hi == 0.0:
            continue
        for k in range(indptr[i], indptr[i + 1]):
            a = indices[k]
            v = hi * data[k]
            row = out[a]
            for q in range(k, indptr[i + 1]):
                row[indices[q]] += v * data[q]
    for a in range(m):  # the pairs were added with a <= b: mirror them
        for b in range(a + 1, m):
            out[b, a] = out[a, b]
