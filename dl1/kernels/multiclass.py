"""Kernels of the multiclass models: a CSC block times an ``n x K`` matrix, and block
coordinate descent in which a feature's ``K`` coefficients move together.

One pass over a column serves every class: ``x_j^T Theta`` is a ``K``-vector, and a step
on feature ``j`` updates the ``K`` decision values of each of its rows at once.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

#: Backtracking halvings of a feature's step, at most (then the global bound is taken).
MAX_BACKTRACK = 30


@njit(nogil=True, cache=True)
def csc_xt_mat(indptr, indices, data, M, out):  # pragma: no cover - numba
    """``out = X^T M`` for a CSC block ``X`` (``n x p``) and ``M`` (``n x K``)."""
    p = indptr.shape[0] - 1
    K = M.shape[1]
    for j in range(p):
        for k in range(K):
            out[j, k] = 0.0
        for q in range(indptr[j], indptr[j + 1]):
            i = indices[q]
            v = data[q]
            for k in range(K):
                out[j, k] += v * M[i, k]


@njit(nogil=True, cache=True)
def csc_mat_add(indptr, indices, data, W, Z):  # pragma: no cover - numba
    """``Z += X W`` for a CSC block ``X`` (``n x m``) and ``W`` (``m x K``)."""
    m = indptr.shape[0] - 1
    K = W.shape[1]
    for j in range(m):
        for q in range(indptr[j], indptr[j + 1]):
            i = indices[q]
            v = data[q]
            for k in range(K):
                Z[i, k] += v * W[j, k]


@njit(nogil=True, cache=True)
def _row_softmax(Z, P, lse, i):  # pragma: no cover - numba
    """``P[i] = softmax(Z[i])`` and ``lse[i] = log-sum-exp(Z[i])``."""
    K = Z.shape[1]
    top = Z[i, 0]
    for k in range(1, K):
        top = max(top, Z[i, k])
    s = 0.0
    for k in range(K):
        P[i, k] = math.exp(Z[i, k] - top)
        s += P[i, k]
    for k in range(K):
        P[i, k] /= s
    lse[i] = top + math.log(s)


@njit(nogil=True, cache=True)
def softmax_rows(Z, P, lse):  # pragma: no cover - numba
    """Every row's softmax and log-sum-exp (see :func:`_row_softmax`)."""
    for i in range(Z.shape[0]):
        _row_softmax(Z, P, lse, i)


@njit(nogil=True, cache=True)
def _prox(u, D, a1, a2, grouped, out):  # pragma: no cover - numba
    """The proximal operator of the penalty in the metric ``diag(D)`` at ``u``: the elastic
    net entry-wise (``soft(u_k, a1 / D_k) / (1 + a2 / D_k)``), or the grouped one row-wise
    (``D`` then constant)."""
    K = u.shape[0]
    if grouped:
        norm = 0.0
        for k in range(K):
            norm += u[k] * u[k]
        norm = math.sqrt(norm)
        shrink = 0.0 if norm == 0.0 else max(0.0, 1.0 - a1 / (D[0] * norm))
        for k in range(K):
            out[k] = u[k] * shrink / (1.0 + a2 / D[0])
    else:
        for k in range(K):
            mag = max(abs(u[k]) - a1 / D[k], 0.0)
            out[k] = math.copysign(mag, u[k]) / (1.0 + a2 / D[k])


@njit(nogil=True, cache=True)
def _rows_change(indptr, indices, data, sw, j, Z, lse, codes, d):  # pragma: no cover - numba
    """``n (F(Z + x_j d^T) - F(Z))`` over the rows of column ``j`` (``sw`` the sample
    weights, empty for unit ones)."""
    K = Z.shape[1]
    total = 0.0
    for q in range(indptr[j], indptr[j + 1]):
        i = indices[q]
        v = data[q]
        s = 1.0 if sw.shape[0] == 0 else sw[i]
        top = Z[i, 0] + v * d[0]
        for k in range(1, K):
            top = max(top, Z[i, k] + v * d[k])
        e = 0.0
        for k in range(K):
            e += math.exp(Z[i, k] + v * d[k] - top)
        total += s * (top + math.log(e) - lse[i] - v * d[codes[i]])
    return total


@njit(nogil=True, cache=True)
def mc_cd_epoch(
    indptr, indices, data, sw, sqnorm, W, Z, P, lse, codes, a1, a2, grouped
):  # pragma: no cover - numba
    """One sweep of block coordinate descent over the ``m`` columns of a CSC matrix.

    Feature ``j``'s ``K`` coefficients ``W[j]`` take one proximal gradient step on
    ``F(Z) + penalty`` in a diagonal metric: gradient ``g = x_j^T S (P - Y) / n`` (``S`` the
    sample weights ``sw``, empty for unit ones) and curvatures ``h_k = sum_i s_i x_ij^2
    P_ik / n``, the block Hessian's majoriser at the current point (``diag(p) - p p^T <=
    diag(p)``): a rare class takes a step as long as its own curvature allows. The grouped
    penalty takes the largest ``h_k`` for all (its prox needs one scale). The metric is
    doubled until the loss over the column's rows is majorised (backtracking), each entry
    capped by the global bound ``sqnorm_j / (2 n)`` (``sqnorm_j = sum_i s_i x_ij^2``;
    ``lambda_max(diag(p) - p p^T) <= 1/2``), which is always accepted. ``Z``, ``P`` and
    ``lse`` (the rows' log-sum-exp) follow. Returns the largest coefficient change."""
    m = indptr.shape[0] - 1
    n = Z.shape[0]
    K = Z.shape[1]
    g = np.empty(K)
    h = np.empty(K)
    D = np.empty(K)
    u = np.empty(K)
    new = np.empty(K)
    d = np.empty(K)
    biggest = 0.0
    for j in range(m):
        if sqnorm[j] == 0.0:
            continue
        l_max = 0.5 * sqnorm[j] / n
        for k in range(K):
            g[k] = 0.0
            h[k] = 0.0
        for q in range(indptr[j], indptr[j + 1]):
            i = indices[q]
            v = data[q] if sw.shape[0] == 0 else data[q] * sw[i]
            vv = v * data[q]
            for k in range(K):
                g[k] += v * P[i, k]
                h[k] += vv * P[i, k]
            g[codes[i]] -= v
        top = 0.0
        for k in range(K):
            g[k] /= n
            h[k] = min(max(h[k] / n, 1e-4 * l_max), l_max)
            top = max(top, h[k])
        if grouped:
            for k in range(K):
                h[k] = top
        scale = 1.0
        for _ in range(MAX_BACKTRACK + 1):
            capped = True
            for k in range(K):
                D[k] = min(scale * h[k], l_max)
                capped = capped and D[k] >= l_max
                u[k] = W[j, k] - g[k] / D[k]
            _prox(u, D, a1, a2, grouped, new)
            gd = 0.0
            dDd = 0.0
            for k in range(K):
                d[k] = new[k] - W[j, k]
                gd += g[k] * d[k]
                dDd += D[k] * d[k] * d[k]
            if dDd == 0.0 or capped:
                break
            change = _rows_change(indptr, indices, data, sw, j, Z, lse, codes, d) / n
            if change <= gd + 0.5 * dDd:
                break
            scale *= 2.0
        if dDd == 0.0:
            continue
        for k in range(K):
            W[j, k] = new[k]
            biggest = max(biggest, abs(d[k]))
        for q in range(indptr[j], indptr[j + 1]):
            i = indices[q]
            v = data[q]
            for k in range(K):
                Z[i, k] += v * d[k]
            _row_softmax(Z, P, lse, i)
    return biggest
