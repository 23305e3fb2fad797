"""Numba kernels of the randomized Frank-Wolfe Lasso solver on one CSC column block.

Frandi et al., *Fast and Scalable Lasso via Stochastic Frank-Wolfe Methods with a
Convergence Guarantee* (``../shared/papers/stochastic-frank-wolfe-lasso_frandi.txt``). The
gradient of ``f(a) = 1/2 ||y - X a||^2`` is computed by the "method of residuals" with the
precomputed ``sigma_j = z_j^T y`` and ``p = X a`` (Sec. 4.2):
``grad_j = -z_j^T (y - p) = z_j^T p - sigma_j`` (Eq. 7), only on the sampled columns.
Conventions as in :mod:`dl1.kernels.linalg` (``col_scale``: empty means no scaling).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def fw_score_columns(
    indptr, indices, data, col_scale, sigma, p, cols, all_cols, extra_idx, extra_val, threshold
):
    """The column of largest ``|grad_j|`` among ``cols``, with the certificate statistics.

    ``c_j = col_scale_j x_j^T p - sigma_j`` is the least-squares part of the gradient and
    ``grad_j = c_j + extra_j``, where ``extra`` is nonzero on a few columns only (``mu a_j``
    for the elastic-net term on the support).

    Parameters
    ----------
    indptr, indices, data : CSC arrays of the block.
    col_scale : ndarray of float64, shape (ncols,) or (0,)
        Column scaling; empty for none.
    sigma : ndarray of float64, shape (ncols,)
        ``col_scale_j x_j^T y`` (Sec. 4.2: precomputed once per problem).
    p : ndarray of float64, shape (n,)
        ``X a`` (centred when the model has an intercept).
    cols : ndarray of int64
        Local indices of the sampled columns (ignored when ``all_cols``).
    all_cols : bool
        Score every column of the block (the deterministic FW vertex search, Eq. 6).
    extra_idx : ndarray of int64 (sorted), extra_val : ndarray of float64
        Sparse ``extra`` (local indices and values).
    threshold : float
        For ``excess``; negative to skip it.

    Returns
    -------
    best : int
        Local index of the column of largest ``|grad_j|`` (-1 if nothing was scored); ties
        go to the first column scored.
    grad : float
        ``grad_best``.
    scored : int
        Columns scored (dot products).
    visited : int
        Nonzeros read.
    cmax : float
        ``max |c_j|`` over the scored columns.
    excess : float
        ``sum_j (|c_j| - threshold)_+^2`` over the scored columns (0 if ``threshold < 0``).
    """
    has_scale = col_scale.shape[0] > 0
    n_extra = extra_idx.shape[0]
    m = indptr.shape[0] - 1 if all_cols else cols.shape[0]
    best = -1
    best_abs = -1.0
    best_g = 0.0
    visited = 0
    cmax = 0.0
    excess = 0.0
    for t in range(m):
        j = t if all_cols else cols[t]
        acc = 0.0
        for k in range(indptr[j], indptr[j + 1]):
            acc += data[k] * p[indices[k]]
        visited += indptr[j + 1] - indptr[j]
        if has_scale:
            acc *= col_scale[j]
        c = acc - sigma[j]
        ac = abs(c)
        if ac > cmax:
            cmax = ac
        if threshold >= 0.0 and ac > threshold:
            excess += (ac - threshold) * (ac - threshold)
        g = c
        if n_extra > 0:
            q = np.searchsorted(extra_idx, j)
            if q < n_extra and extra_idx[q] == j:
                g += extra_val[q]
        if abs(g) > best_abs:
            best_abs = abs(g)
            best_g = g
            best = j
    return best, best_g, m, visited, cmax, excess


@njit(nogil=True, cache=True)
def fw_column(indptr, indices, data, col_scale, j):
    """Row indices, values (scaled, float64), sum and squared norm of column ``j``."""
    k0 = indptr[j]
    k1 = indptr[j + 1]
    s = col_scale[j] if col_scale.shape[0] > 0 else 1.0
    rows = np.empty(k1 - k0, dtype=np.int64)
    vals = np.empty(k1 - k0, dtype=np.float64)
    total = 0.0
    sq = 0.0
    for k in range(k0, k1):
        v = np.float64(data[k]) * s
        rows[k - k0] = indices[k]
        vals[k - k0] = v
        total += v
        sq += v * v
    return rows, vals, total, sq
