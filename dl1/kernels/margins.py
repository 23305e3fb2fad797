"""Fused numba loops for the margin losses ``phi(y z)`` (logistic, squared hinge, smoothed
hinge), without length-n temporaries.

A NumPy expression over length-n vectors allocates a temporary per operation; on a Dask
worker (whose environment sets glibc's ``MALLOC_MMAP_THRESHOLD_``) each one is a fresh
mapping, page-faulted afresh, which made the logistic datafit about twice as slow on a worker
as in a plain process. Here every datafit quantity is one pass over ``y``, ``z`` (and the
sample weights), writing at most into a caller's buffer. Measured on this machine (no SVML),
the scalar ``exp``/``log1p`` loops are also faster than NumPy's ufuncs even in a plain
process (``benchmarks/bench_logistic.py --kernels``).

A loss is named by its integer ``code`` (:mod:`dl1.kernels.codes`: logistic, squared
hinge; any other code is the smoothed hinge of smoothing ``gamma``, the hinge at 0) so that
one compiled kernel serves all.
With ``m = y z`` the margin, ``c = -phi'(m)`` and ``theta = s y c`` (the dual point,
``-n grad F``). Sums are blocked (:data:`BLOCK` terms, then the blocks' sums).

Flags: ``fastmath`` without ``nnan``/``ninf``, so NaN and inf still propagate to the
solver's checks (:mod:`dl1.solvers.numerics`).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from dl1.kernels.codes import LOGISTIC, SQUARED_HINGE
from dl1.kernels.vectors import neumaier_add

#: Terms summed in order before a partial sum is added to the total.
BLOCK = 1024

#: ``fastmath`` flags: reassociation (vectorised sums), no NaN/inf assumptions.
FASTMATH = {"nsz", "arcp", "contract", "afn", "reassoc"}

#: Rounding tolerated outside the conjugate's domain (clipped).
ROUNDING = 1e-12

_JIT = {"nogil": True, "cache": True, "fastmath": FASTMATH}


@njit(**_JIT)
def margin_terms(code, gamma, m):
    """``(phi(m), -phi'(m), phi''(m))`` of loss ``code`` at margin ``m``.

    Logistic: ``log(1 + exp(-m))``, ``sigmoid(-m)``, ``c (1 - c)``. Squared hinge:
    ``(1 - m)_+^2``, ``2 (1 - m)_+``, ``2 [m < 1]``. Smoothed hinge (``gamma > 0``): 0 for
    ``m >= 1``, ``(1 - m)^2 / (2 gamma)`` down to ``1 - gamma``, ``1 - m - gamma / 2`` below.
    """
    if code == LOGISTIC:
        e = math.exp(-abs(m))
        q = 1.0 / (1.0 + e)
        if m >= 0.0:  # sigmoid(-m) = e / (1 + e)
            return math.log1p(e), e * q, e * q * q
        return math.log1p(e) - m, q, e * q * q
    d = 1.0 - m
    if code == SQUARED_HINGE:
        if d > 0.0:
            return d * d, 2.0 * d, 2.0
        if d <= 0.0:
            return 0.0, 0.0, 0.0
        return d, d, d  # NaN
    if d >= gamma:
        return d - 0.5 * gamma, 1.0, 0.0
    if d > 0.0:
        return 0.5 * d * d / gamma, d / gamma, 1.0 / gamma
    if d <= 0.0:
        return 0.0, 0.0, 0.0
    return d, d, d  # NaN


@njit(**_JIT)
def margin_value(code, gamma, y, z, sw, u, shift, t):
    """``sum_i s_i phi(y_i (z_i + t (u_i + shift)))``; ``u`` empty for ``t (u + shift) =
    t shift`` (the value at ``z``: ``t = 0``; an intercept step: ``u`` empty).

    Parameters
    ----------
    code, gamma : int, float
        The loss.
    y, z : ndarray of float64, shape (n,)
    sw : ndarray of float64, shape (n,) or (0,)
        Sample weights; empty for unit weights.
    u : ndarray of float64, shape (n,) or (0,)
        A direction of ``z`` (a line search's), or empty.
    shift, t : float
    """
    none = np.empty(0)
    return margin_value_grad_hess(code, gamma, y, z, sw, u, shift, t, none, none)


@njit(**_JIT)
def margin_value_grad_hess(code, gamma, y, z, sw, u, shift, t, g, h):
    """:func:`margin_value` at ``z + t (u + shift)``, and the per-sample derivatives there
    written as :func:`margin_grad_hess` does (``g = -s y c``, ``h = s phi''``): a line
    search's trial, whose derivatives are the next Newton step's once it is accepted, in one
    pass and one ``exp`` a sample.

    Parameters
    ----------
    code, gamma, y, z, sw, u, shift, t
        As in :func:`margin_value`.
    g, h : ndarray of float64, shape (n,) or (0,)
        Overwritten; both empty for the value alone (:func:`margin_value`).
    """
    n = y.shape[0]
    weighted = sw.shape[0] > 0
    has_u = u.shape[0] > 0
    derivatives = g.shape[0] > 0
    total = 0.0
    for lo in range(0, n, BLOCK):
        part = 0.0
        for i in range(lo, min(lo + BLOCK, n)):
            zi = z[i] + t * ((u[i] if has_u else 0.0) + shift)
            loss, c, curv = margin_terms(code, gamma, y[i] * zi)
            s = sw[i] if weighted else 1.0
            part += s * loss if weighted else loss
            if derivatives:
                g[i] = -s * y[i] * c
                h[i] = s * curv
        total += part
    return total


@njit(**_JIT)
def margin_shift_sums(code, gamma, y, z, sw, shift):
    """At ``z + shift``: ``(sum s phi, sum theta, sum |theta|, sum s phi'')``, the four
    sums of a Newton step on the intercept (``theta = s y c``, ``|theta| = s c``)."""
    n = y.shape[0]
    weighted = sw.shape[0] > 0
    t_val = 0.0
    t_sum = 0.0
    t_abs = 0.0
    t_curv = 0.0
    for lo in range(0, n, BLOCK):
        p_val = 0.0
        p_sum = 0.0
        p_abs = 0.0
        p_curv = 0.0
        for i in range(lo, min(lo + BLOCK, n)):
            loss, c, curv = margin_terms(code, gamma, y[i] * (z[i] + shift))
            s = sw[i] if weighted else 1.0
            p_val += s * loss
            p_sum += s * y[i] * c
            p_abs += s * c
            p_curv += s * curv
        t_val += p_val
        t_sum += p_sum
        t_abs += p_abs
        t_curv += p_curv
    return t_val, t_sum, t_abs, t_curv


@njit(**_JIT)
def margin_slope_sums(code, gamma, y, z, sw, shift):
    """At ``z + shift``: ``(sum theta, sum |theta|, sum s phi'')``, the sums of a Newton
    step on the intercept's optimality condition ``sum theta = 0`` (no loss values: no
    ``log``): :func:`margin_theta_sums` without writing ``theta`` (its loop, the sums
    rounded as the compiler vectorises each caller)."""
    t_sum, t_abs, t_curv, _, _ = margin_theta_sums(code, gamma, y, z, sw, shift, np.empty(0))
    return t_sum, t_abs, t_curv


@njit(**_JIT)
def margin_theta_sums(code, gamma, y, z, sw, shift, out):
    """``out = s y c(y (z + shift))`` (the dual point, as :func:`margin_theta` writes it;
    ``out`` empty: not written) and, in the same pass, ``(sum theta, sum |theta|, sum s
    phi'', sum theta_+, sum theta_-)``: the intercept's optimality sums of
    :func:`intercept_root` and the two sides :func:`balance` weighs."""
    n = y.shape[0]
    weighted = sw.shape[0] > 0
    writing = out.shape[0] > 0
    t_sum = 0.0
    t_abs = 0.0
    t_curv = 0.0
    t_pos = 0.0
    t_neg = 0.0
    for lo in range(0, n, BLOCK):
        p_sum = 0.0
        p_abs = 0.0
        p_curv = 0.0
        p_pos = 0.0
        p_neg = 0.0
        for i in range(lo, min(lo + BLOCK, n)):
            _, c, curv = margin_terms(code, gamma, y[i] * (z[i] + shift))
            s = sw[i] if weighted else 1.0
            v = s * y[i] * c if weighted else y[i] * c
            p_sum += v
            p_abs += s * c
            p_curv += s * curv
            if writing:
                out[i] = v
                if v > 0.0:
                    p_pos += v
                else:
                    p_neg -= v
        t_sum += p_sum
        t_abs += p_abs
        t_curv += p_curv
        t_pos += p_pos
        t_neg += p_neg
    return t_sum, t_abs, t_curv, t_pos, t_neg


@njit(**_JIT)
def intercept_root(code, gamma, y, z, sw, beta, rtol, max_iter):
    """The intercept shift ``db`` with ``sum_i theta_i(z + db) = 0`` to ``|sum theta| <=
    rtol sum |theta|``: Newton's method on the (nondecreasing) derivative of ``F(z + db)``,
    kept inside the bracket of its sign change; where a Newton step leaves the bracket (or
    the curvature vanishes), bisection of a finite bracket or the majorant step
    ``sum theta / (beta sum s)``, which never passes the root.
    """
    t_sum, t_abs, curv = margin_slope_sums(code, gamma, y, z, sw, 0.0)
    return intercept_root_from(code, gamma, y, z, sw, beta, rtol, max_iter, t_sum, t_abs, curv)


@njit(**_JIT)
def intercept_root_from(code, gamma, y, z, sw, beta, rtol, max_iter, t_sum, t_abs, curv):
    """:func:`intercept_root` given the sums of :func:`margin_slope_sums` at ``db = 0``
    (from a pass that also wrote the dual point, :func:`margin_theta_sums`)."""
    s_sum = float(y.shape[0]) if sw.shape[0] == 0 else 0.0
    for i in range(sw.shape[0]):
        s_sum += sw[i]
    db = 0.0
    lo = -math.inf
    hi = math.inf
    for _ in range(max_iter):
        if not abs(t_sum) > rtol * t_abs:  # NaN too: the caller's checks name it
            break
        if t_sum > 0.0:  # the derivative -t_sum / n < 0: the root is to the right
            lo = db
        else:
            hi = db
        nxt = db + t_sum / curv if curv > 0.0 else math.nan
        if not (lo < nxt < hi):
            if lo > -math.inf and hi < math.inf:
                nxt = 0.5 * (lo + hi)
            else:
                nxt = db + t_sum / (beta * s_sum)
        if nxt == db:
            break
        db = nxt
        t_sum, t_abs, curv = margin_slope_sums(code, gamma, y, z, sw, db)
    return db


@njit(**_JIT)
def margin_theta(code, gamma, y, z, sw, shift, out):
    """``out = s y c(y (z + shift))``, the dual point ``-n grad F(z + shift)``."""
    weighted = sw.shape[0] > 0
    for i in range(y.shape[0]):
        _, c, _ = margin_terms(code, gamma, y[i] * (z[i] + shift))
        out[i] = sw[i] * y[i] * c if weighted else y[i] * c


@njit(**_JIT)
def margin_grad_hess(code, gamma, y, z, sw, g, h):
    """Per-sample derivatives of ``s_i phi(y_i z_i)`` in ``z_i``: ``g = -s y c`` and
    ``h = s phi''`` (the gradient and diagonal Hessian of ``n F``)."""
    weighted = sw.shape[0] > 0
    for i in range(y.shape[0]):
        _, c, curv = margin_terms(code, gamma, y[i] * z[i])
        s = sw[i] if weighted else 1.0
        g[i] = -s * y[i] * c
        h[i] = s * curv


@njit(**_JIT)
def balance(theta):
    """Shrink the heavier sign side of ``theta`` in place by a common factor so that it
    sums to 0 (the dual constraint of an unpenalised intercept)."""
    n = theta.shape[0]
    pos = 0.0
    neg = 0.0
    for lo in range(0, n, BLOCK):
        p_pos = 0.0
        p_neg = 0.0
        for i in range(lo, min(lo + BLOCK, n)):
            v = theta[i]
            if v > 0.0:
                p_pos += v
            else:
                p_neg -= v
        pos += p_pos
        neg += p_neg
    balance_sides(theta, pos, neg)


@njit(**_JIT)
def balance_sides(theta, pos, neg):
    """:func:`balance` given the sums of ``theta``'s positive entries and of its negative
    entries' magnitudes (from the pass that wrote it, :func:`margin_theta_sums`)."""
    n = theta.shape[0]
    if pos > neg:
        f = neg / pos
        for i in range(n):
            if theta[i] > 0.0:
                theta[i] *= f
    elif neg > pos:
        f = pos / neg
        for i in range(n):
            if theta[i] <= 0.0:
                theta[i] *= f


@njit(**_JIT)
def margin_conjugate(code, gamma, y, theta, sw, scale=1.0):
    """``sum_i s_i phi^*(-c_i)`` with ``c_i = y_i (scale theta_i) / s_i`` (``n F^*(-scale
    theta / n)``), or ``inf`` outside the domain (``c`` in ``[0, 1]``; ``[0, inf)`` for the
    squared hinge; ``theta_i = 0`` where ``s_i = 0``); rounding of :data:`ROUNDING` is
    clipped. ``scale theta_i`` is rounded as NumPy's ``scale * theta`` would be, so a scale
    costs no pass and no temporary of its own.

    Logistic: ``c log c + (1 - c) log(1 - c)``; squared hinge: ``c^2 / 4 - c``; smoothed
    hinge: ``gamma c^2 / 2 - c``.
    """
    n = y.shape[0]
    weighted = sw.shape[0] > 0
    total = 0.0
    for lo in range(0, n, BLOCK):
        part = 0.0
        for i in range(lo, min(lo + BLOCK, n)):
            s = sw[i] if weighted else 1.0
            th = scale * theta[i]
            if s <= 0.0:
                if th != 0.0:
                    return math.inf
                continue
            c = clipped_dual(code, y[i], th, s)
            if c != c:  # outside the domain, or NaN
                return math.inf
            part += s * conjugate_term(code, gamma, c)
        total += part
    return total


@njit(**_JIT)
def conjugate_term(code, gamma, c):
    """``phi^*(-c)`` at a ``c`` already clipped into the domain (see
    :func:`margin_conjugate`)."""
    if code == LOGISTIC:
        v = 0.0
        if c > 0.0:
            v += c * math.log(c)
        if c < 1.0:
            v += (1.0 - c) * math.log1p(-c)
        return v
    if code == SQUARED_HINGE:
        return 0.25 * c * c - c
    return 0.5 * gamma * c * c - c


@njit(**_JIT)
def clipped_dual(code, y, th, s):
    """``c = y th / s`` clipped into the conjugate's domain, or NaN when it lies outside by
    more than :data:`ROUNDING` (or is NaN); ``s > 0``."""
    top = math.inf if code == SQUARED_HINGE else 1.0 + ROUNDING
    c = y * th / s
    if not (c >= -ROUNDING and c <= top):
        return math.nan
    return min(max(c, 0.0), 1.0) if code != SQUARED_HINGE else max(c, 0.0)


@njit(**_JIT)
def margin_gap_sums(code, gamma, y, z, theta, sw, scale, scale2, two):
    """The datafit's terms of a duality gap in one pass: ``n F(z) = sum_i s_i phi(y_i z_i)``
    and ``n F^*(-a theta / n) = sum_i s_i phi^*(-c_i)``, ``c_i = y_i (a theta_i) / s_i``, at
    ``a = scale`` and, when ``two``, at ``a = scale2`` (else 0.0): the terms of
    :func:`margin_value` and :func:`margin_conjugate` (``inf`` outside the domain), each
    computed once per sample.

    Sums: :data:`BLOCK` terms in order (vectorised), then the blocks' sums compensated
    (Neumaier, :func:`dl1.kernels.vectors.neumaier_add`), so rounding grows like ``BLOCK``,
    not ``n / BLOCK``. A compensated add per term, as the squared loss's
    (:func:`dl1.kernels.vectors.dual_sums`) has, cost this pass 5-10% more at
    n = 842,000: it is bound by ``log`` and ``log1p``, and the dependent adds do not
    vectorise.
    """
    n = y.shape[0]
    weighted = sw.shape[0] > 0
    tv, cv, t1, c1, t2, c2 = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    out1 = False
    out2 = False
    for lo in range(0, n, BLOCK):
        pv = 0.0
        p1 = 0.0
        p2 = 0.0
        for i in range(lo, min(lo + BLOCK, n)):
            s = sw[i] if weighted else 1.0
            loss, _, _ = margin_terms(code, gamma, y[i] * z[i])
            pv += s * loss if weighted else loss
            th = scale * theta[i]
            if s <= 0.0:
                out1 = out1 or th != 0.0
                out2 = out2 or (two and scale2 * theta[i] != 0.0)
                continue
            c = clipped_dual(code, y[i], th, s)
            out1 = out1 or c != c  # outside the domain, or NaN
            p1 += s * conjugate_term(code, gamma, c)
            if two:
                c = clipped_dual(code, y[i], scale2 * theta[i], s)
                out2 = out2 or c != c
                p2 += s * conjugate_term(code, gamma, c)
        tv, cv = neumaier_add(tv, cv, pv)
        t1, c1 = neumaier_add(t1, c1, p1)
        t2, c2 = neumaier_add(t2, c2, p2)
    conj = math.inf if out1 else t1 + c1
    conj2 = (math.inf if out2 else t2 + c2) if two else 0.0
    return tv + cv, conj, conj2


@njit(**_JIT)
def move_along(z, u, shift, t):
    """``z += t (u + shift)`` in place (``u`` empty: ``z += t shift``), rounded as the
    trial points of :func:`margin_value` and :func:`margin_value_grad_hess` are."""
    has_u = u.shape[0] > 0
    for i in range(z.shape[0]):
        z[i] = z[i] + t * ((u[i] if has_u else 0.0) + shift)


@njit(**_JIT)
def abs_max(v):
    """``max_i |v_i|`` (0 for an empty ``v``; NaN propagates)."""
    out = 0.0
    for i in range(v.shape[0]):
        a = abs(v[i])
        if a != a:
            return a
        if a > out:
            out = a
    return out


NO_WEIGHTS = np.empty(0, dtype=np.float64)
