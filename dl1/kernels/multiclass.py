"""Kernels of the multiclass models: a CSC block times an ``n x K`` matrix, and block
coordinate descent in which a feature's ``K`` coefficients move together.

One pass over a column serves every class: ``x_j^T Theta`` is a ``K``-vector, and a step
on feature ``j`` updates the ``K`` decision values of each of its rows at once.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit

#: Newton / bisection steps of the grouped proximal operator's root, at most.
PROX_STEPS = 100
#: A dual value within this relative margin of the bound is left to the uniform rescaling
#: (a repaired entry lands on the bound, where rounding alone would repair it again).
REPAIR_SLACK = 1e-12



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
def mc_model_stats(indptr, indices, data, SG, SPQ, G0, C):  # pragma: no cover - numba
    """The quadratic model's per-coefficient gradient and curvature at ``dW = 0``:
    ``G0 = X^T SG`` and ``C = (X o X)^T SPQ`` (``SG = S (P - Y) / n``, ``SPQ = S P o (1 - P)
    / n``, both ``n x K``): the diagonal of the block ``x_j^T (diag(p_i) - p_i p_i^T) x_j``."""
    m = indptr.shape[0] - 1
    K = SG.shape[1]
    for j in range(m):
        for k in range(K):
            G0[j, k] = 0.0
            C[j, k] = 0.0
        for q in range(indptr[j], indptr[j + 1]):
            i = indices[q]
            v = data[q]
            for k in range(K):
                G0[j, k] += v * SG[i, k]
                C[j, k] += v * v * SPQ[i, k]


@njit(nogil=True, cache=True)
def mc_model_epoch(
    indptr, indices, data, order, visit, SP, P, G0, C, E, W, dW, dZ, r, a1, a2, grouped, reach
):  # pragma: no cover - numba
    """One sweep of coordinate descent on the proximal Newton model of the multinomial loss
    over the columns ``order``, of each only the entries ``visit`` marks (an active set of
    coefficients: the elastic net's classes of a feature move alone); returns the model's
    decrease.

    The model at ``Z`` is ``<SG, D> + (1/2) sum_i s_i D_i^T (diag(p_i) - p_i p_i^T) D_i / n +
    penalty(W + dW)``, ``D = X dW`` (``dZ``), with the full row Hessian, cross-class terms
    included: ``r_i = p_i . D_i`` is kept, so the gradient of entry ``(j, k)`` is
    ``G0_jk + sum_i x_ij SP_ik (D_ik - r_i)`` (``SP = S P / n``) and its curvature ``C_jk``
    (:func:`mc_model_stats`), each entry minimised exactly (the elastic net's prox). ``E``
    (``<= C``) is a curvature the model adds to the entries' own (a floor, a damping): the
    model minimised is the loss's plus ``sum E dW^2 / 2``. The grouped penalty steps a
    feature's ``K`` entries together in the metric ``L I``, ``L = max_k C_jk``, which
    majorises its block when ``C`` is taken from ``S P`` (``diag(p) - p p^T <= diag(p)``);
    its decrease is the majoriser's, a lower bound of the model's. The elastic net's
    entries of column ``j`` stay within ``reach[j]`` of ``W`` (a trust region: the model
    is minimised on the box, each entry's minimiser clipped to it)."""
    K = P.shape[1]
    g = np.empty(K)
    new = np.empty(K)
    d = np.empty(K)
    longest = 0
    for jj in range(order.shape[0]):
        longest = max(longest, indptr[order[jj] + 1] - indptr[order[jj]])
    buf = _Gathered(np.empty(K, np.int64), np.empty((K, longest)), np.empty((K, longest)),
                    np.empty((K, longest)), np.empty(longest))  # fmt: skip
    fall = 0.0
    for jj in range(order.shape[0]):
        j = order[jj]
        if indptr[j + 1] == indptr[j]:
            continue
        if grouped:
            fall += _group_step(indptr, indices, data, j, SP, P, G0, C, E, W, dW, dZ, r,
                                a1, a2, g, new, d)
        else:
            fall += _entries_step(indptr, indices, data, j, visit, SP, P, G0, C, E, W, dW, dZ,
                                  r, a1, a2, reach[j], buf)
    return fall


class _Gathered(NamedTuple):
    """Buffers of :func:`_entries_step`: the visited classes of a column and, class by class,
    its rows' ``SP``, ``P`` and ``dZ`` values, and their ``r``."""

    ks: np.ndarray
    SP: np.ndarray
    P: np.ndarray
    dZ: np.ndarray
    r: np.ndarray


@njit(nogil=True, cache=True)
def _entry_prox(C, W, dW, j, k, gk, a1, a2, reach):  # pragma: no cover - numba
    """Entry ``(j, k)``'s exact minimiser of the model along it within ``reach`` of
    ``W[j, k]`` (the elastic net's prox, clipped: the 1-D model is convex), from its
    gradient ``gk``: ``(delta, the model's decrease)``."""
    w = W[j, k] + dW[j, k]
    h = C[j, k]
    mag = max(abs(h * w - gk) - a1, 0.0)
    w_new = math.copysign(mag, h * w - gk) / (h + a2)
    w_new = min(max(w_new, W[j, k] - reach), W[j, k] + reach)
    delta = w_new - w
    fall = -(gk * delta + 0.5 * h * delta * delta + a1 * (abs(w_new) - abs(w))
             + 0.5 * a2 * (w_new * w_new - w * w))  # fmt: skip
    return delta, fall


@njit(nogil=True, cache=True)
def _entries_step(
    indptr, indices, data, j, visit, SP, P, G0, C, E, W, dW, dZ, r, a1, a2, reach, buf
):  # pragma: no cover - numba
    """Feature ``j``'s visited entries of :func:`mc_model_epoch` for the elastic net, one
    class after another, each minimised exactly; returns the model's decrease.

    Each class reads the column's rows twice (its gradient, then its step on ``dZ`` and
    ``r``). With two classes or more, the rows' values are first gathered class by class
    into ``buf`` (a row's ``K`` values are contiguous in the ``n x K`` arrays, so one
    gather reads each row once), the classes run on the gathered copies, and ``dZ`` and
    ``r`` are written back: the same arithmetic, in the same order."""
    K = P.shape[1]
    lo, length = indptr[j], indptr[j + 1] - indptr[j]
    nv = 0
    for k in range(K):
        if C[j, k] > 0.0 and visit[j, k]:
            buf.ks[nv] = k
            nv += 1
    if nv == 0:
        return 0.0
    fall = 0.0
    if nv == 1:  # nothing to share: read the rows in place
        k = buf.ks[0]
        grad = G0[j, k] + E[j, k] * dW[j, k]
        for q in range(lo, lo + length):
            i = indices[q]
            grad += data[q] * SP[i, k] * (dZ[i, k] - r[i])
        delta, drop = _entry_prox(C, W, dW, j, k, grad, a1, a2, reach)
        if delta != 0.0:
            fall += drop
            dW[j, k] += delta
            for q in range(lo, lo + length):
                i = indices[q]
                step = data[q] * delta
                dZ[i, k] += step
                r[i] += P[i, k] * step
        return fall
    for q in range(length):
        i = indices[lo + q]
        buf.r[q] = r[i]
        for t in range(nv):
            k = buf.ks[t]
            buf.SP[t, q] = SP[i, k]
            buf.P[t, q] = P[i, k]
            buf.dZ[t, q] = dZ[i, k]
    for t in range(nv):
        k = buf.ks[t]
        grad = G0[j, k] + E[j, k] * dW[j, k]
        for q in range(length):
            grad += data[lo + q] * buf.SP[t, q] * (buf.dZ[t, q] - buf.r[q])
        delta, drop = _entry_prox(C, W, dW, j, k, grad, a1, a2, reach)
        if delta == 0.0:
            continue
        fall += drop
        dW[j, k] += delta
        for q in range(length):
            step = data[lo + q] * delta
            buf.dZ[t, q] += step
            buf.r[q] += buf.P[t, q] * step
    for q in range(length):
        i = indices[lo + q]
        r[i] = buf.r[q]
        for t in range(nv):
            dZ[i, buf.ks[t]] = buf.dZ[t, q]
    return fall


@njit(nogil=True, cache=True)
def group_prox_diag(u, h, a1, a2, out):  # pragma: no cover - numba
    """``out = argmin_w sum_k h_k (w_k - u_k)^2 / 2 + a1 ||w|| + a2 ||w||^2 / 2`` (``h > 0``):
    the grouped penalty's proximal operator in the metric ``diag(h)``.

    Zero when ``||h u|| <= a1``; else ``w_k = h_k u_k / (h_k + a2 + mu)`` with ``mu = a1 /
    ||w||``, the root of ``psi(mu) = sum_k (h_k u_k mu / (h_k + a2 + mu))^2 - a1^2``
    (increasing in ``mu``; bracketed by the smallest and largest ``h_k + a2``), found by
    Newton's method safeguarded by bisection."""
    K = u.shape[0]
    hu2 = 0.0
    cmin = np.inf
    cmax = 0.0
    for k in range(K):
        hu2 += (h[k] * u[k]) ** 2
        cmin = min(cmin, h[k] + a2)
        cmax = max(cmax, h[k] + a2)
    if hu2 <= a1 * a1:
        for k in range(K):
            out[k] = 0.0
        return
    rho = a1 / math.sqrt(hu2)
    lo = cmin * rho / (1.0 - rho)
    hi = cmax * rho / (1.0 - rho)
    mu = 0.5 * (lo + hi)
    for _ in range(PROX_STEPS):
        psi = -a1 * a1
        slope = 0.0
        for k in range(K):
            c = h[k] + a2
            t = h[k] * u[k] / (c + mu)
            psi += t * t * mu * mu
            slope += 2.0 * t * t * mu * c / (c + mu)
        if psi > 0.0:
            hi = mu
        else:
            lo = mu
        if abs(psi) <= 1e-15 * a1 * a1 or hi - lo <= 1e-15 * hi:
            break
        step = mu - psi / slope if slope > 0.0 else -1.0
        mu = step if lo < step < hi else 0.5 * (lo + hi)
    for k in range(K):
        out[k] = h[k] * u[k] / (h[k] + a2 + mu)


@njit(nogil=True, cache=True)
def _group_step(
    indptr, indices, data, j, SP, P, G0, C, E, W, dW, dZ, r, a1, a2, g, new, d
):  # pragma: no cover - numba
    """Feature ``j``'s block step of :func:`mc_model_epoch` for the grouped penalty: the
    majoriser ``diag(C_j)`` of its block (``C`` from ``S P``) minimised exactly with the
    penalty (:func:`group_prox_diag`)."""
    K = P.shape[1]
    for k in range(K):
        if C[j, k] <= 0.0:
            return 0.0
        g[k] = G0[j, k] + E[j, k] * dW[j, k]
    for q in range(indptr[j], indptr[j + 1]):
        i = indices[q]
        v = data[q]
        ri = r[i]
        for k in range(K):
            g[k] += v * SP[i, k] * (dZ[i, k] - ri)
    old = 0.0
    for k in range(K):
        w = W[j, k] + dW[j, k]
        old += w * w
        d[k] = w - g[k] / C[j, k]  # the unpenalised minimiser, prox'ed below
    group_prox_diag(d, C[j], a1, a2, new)
    lin = 0.0
    quad = 0.0
    sq = 0.0
    moved = False
    for k in range(K):
        d[k] = new[k] - W[j, k] - dW[j, k]
        moved = moved or d[k] != 0.0
        lin += g[k] * d[k]
        quad += C[j, k] * d[k] * d[k]
        sq += new[k] * new[k]
    if not moved:
        return 0.0
    fall = -(lin + 0.5 * quad + a1 * (math.sqrt(sq) - math.sqrt(old)) + 0.5 * a2 * (sq - old))
    for k in range(K):
        dW[j, k] += d[k]
    for q in range(indptr[j], indptr[j + 1]):
        i = indices[q]
        v = data[q]
        shift = 0.0
        for k in range(K):
            step = v * d[k]
            dZ[i, k] += step
            shift += P[i, k] * step
        r[i] += shift
    return fall


@njit(nogil=True, cache=True)
def mc_intercept_step(SG, SP, P, Hinv, db, dZ, r):  # pragma: no cover - numba
    """The intercepts' step of the proximal Newton model, minimised exactly over the ``K``
    of them together: ``delta = -Hinv g`` with ``g_k = sum_i SG_ik + SP_ik (dZ_ik - r_i)``
    and ``Hinv`` the inverse of the intercepts' block ``sum_i s_i (diag(p_i) - p_i
    p_i^T) / n`` (closed along the all-ones direction, which changes no probability);
    ``db``, ``dZ`` and ``r`` follow. Returns the model's decrease ``g^T Hinv g / 2``."""
    n, K = P.shape
    g = np.zeros(K)
    for i in range(n):
        for k in range(K):
            g[k] += SG[i, k] + SP[i, k] * (dZ[i, k] - r[i])
    delta = np.zeros(K)
    fall = 0.0
    for k in range(K):
        for m in range(K):
            delta[k] -= Hinv[k, m] * g[m]
        fall -= 0.5 * g[k] * delta[k]
    if fall <= 0.0:
        return 0.0
    for k in range(K):
        db[k] += delta[k]
    for i in range(n):
        shift = 0.0
        for k in range(K):
            dZ[i, k] += delta[k]
            shift += P[i, k] * delta[k]
        r[i] += shift
    return fall


@njit(nogil=True, cache=True)
def mc_loss_along(Z, dZ, t, codes, sw):  # pragma: no cover - numba
    """``F(Z + t dZ)``: the mean (``sw``-weighted; empty for unit weights) cross-entropy of
    the row softmax, without forming the trial point."""
    n, K = Z.shape
    total = 0.0
    for i in range(n):
        top = Z[i, 0] + t * dZ[i, 0]
        for k in range(1, K):
            top = max(top, Z[i, k] + t * dZ[i, k])
        e = 0.0
        for k in range(K):
            e += math.exp(Z[i, k] + t * dZ[i, k] - top)
        c = codes[i]
        ce = top + math.log(e) - Z[i, c] - t * dZ[i, c]
        total += ce if sw.shape[0] == 0 else sw[i] * ce
    return total / n



@njit(nogil=True, cache=True)
def _dual_rows(codes, sw, Q, theta):  # pragma: no cover - numba
    """``theta = S (Y - Q)``: the multinomial dual point of the probabilities ``Q`` (``sw``
    the sample weights; empty for unit ones)."""
    for i in range(Q.shape[0]):
        s = 1.0 if sw.shape[0] == 0 else sw[i]
        for k in range(Q.shape[1]):
            theta[i, k] = s * ((1.0 if codes[i] == k else 0.0) - Q[i, k])


@njit(nogil=True, cache=True)
def _shrink_toward_labels(indptr, indices, data, codes, sw, Q, j, k, lam):  # pragma: no cover
    """Bring ``|x_j^T S (y_k - q_k)|`` down to ``lam`` by moving probability mass of the
    rows of column ``j`` to their labels (see :func:`repair_dual`); returns whether the
    entry was over ``lam``."""
    K = Q.shape[1]
    v = 0.0
    for q in range(indptr[j], indptr[j + 1]):
        i = indices[q]
        x = data[q] if sw.shape[0] == 0 else data[q] * sw[i]
        v += x * ((1.0 if codes[i] == k else 0.0) - Q[i, k])
    if abs(v) <= lam * (1.0 + REPAIR_SLACK):
        return False
    sign = 1.0 if v > 0.0 else -1.0
    # the most each row can give: a row of class k its off-label mass, another row its q_ik,
    # each only where that lowers |v|
    give = 0.0
    for q in range(indptr[j], indptr[j + 1]):
        i = indices[q]
        x = sign * (data[q] if sw.shape[0] == 0 else data[q] * sw[i])
        if codes[i] == k and x > 0.0:
            give += x * (1.0 - Q[i, k])
        elif codes[i] != k and x < 0.0:
            give -= x * Q[i, k]
    if give <= 0.0:
        return False
    cut = min((abs(v) - lam) / give, 1.0)
    for q in range(indptr[j], indptr[j + 1]):
        i = indices[q]
        x = sign * (data[q] if sw.shape[0] == 0 else data[q] * sw[i])
        c = codes[i]
        if c == k and x > 0.0:
            off = 0.0
            for kk in range(K):
                if kk != c:
                    Q[i, kk] *= 1.0 - cut
                    off += Q[i, kk]
            Q[i, c] = 1.0 - off
        elif c != k and x < 0.0:
            moved = cut * Q[i, k]
            Q[i, k] -= moved
            Q[i, c] += moved
    return True


@njit(nogil=True, cache=True)
def repair_dual(indptr, indices, data, codes, sw, Q, lam, sweeps, V):  # pragma: no cover
    """Make the dual point ``S (Y - Q)`` feasible on the columns of a CSC block (``|x_j^T
    S (y_k - q_k)| <= lam``) by moving probability mass of the violating columns' rows
    to their labels; ``Q`` changes in place, ``V`` ends as ``X^T S (Y - Q)``.

    Every row of ``Q`` stays on the simplex, so ``S (Y - Q)`` stays in the conjugate's
    domain; an entry over ``lam`` is brought to it exactly by the smallest common fraction
    ``cut`` of what its rows can give (a row of class ``k`` its off-label mass, scaled by
    ``1 - cut``; another row its ``q_ik``), both moves lowering ``|v|`` where ``x_ij`` has
    the sign that helps. A repair shifts other columns' values a little, so ``sweeps``
    passes (fewer once none is over); what remains over is left to the uniform rescaling
    of the certificate. Near an answer the violations sit on columns whose rows' mass is
    tiny (a coefficient still growing where the probabilities vanish), so the repair
    costs the dual far less than rescaling every row by the largest violation."""
    m = indptr.shape[0] - 1
    K = Q.shape[1]
    theta = np.empty_like(Q)
    for _ in range(sweeps):
        _dual_rows(codes, sw, Q, theta)
        csc_xt_mat(indptr, indices, data, theta, V)
        fixed = 0
        for j in range(m):
            for k in range(K):
                over = abs(V[j, k]) > lam * (1.0 + REPAIR_SLACK)
                if over and _shrink_toward_labels(indptr, indices, data, codes, sw, Q, j, k, lam):
                    fixed += 1
        if fixed == 0:
            break
    _dual_rows(codes, sw, Q, theta)
    csc_xt_mat(indptr, indices, data, theta, V)
