"""Fused numba loops for the margin losses ``phi(y z)`` (logistic, squared hinge, smoothed
hinge), without length-n temporaries.

A NumPy expression over length-n vectors allocates a temporary per operation; on a Dask
worker (whose environment sets glibc's ``MALLOC_MMAP_THRESHOLD_``) each one is a fresh
mapping, page-faulted afresh, which made the logistic datafit about twice as slow on a worker
as in a plain process. Here every datafit quantity is one pass over ``y``, ``z`` (and the
sample weights), writing at most into a caller's buffer. Measured on this machine (no SVML),
the scalar ``exp``/``log1p`` loops are also faster than NumPy's ufuncs even in a plain
process (``benchmarks/bench_logistic.py --kernels``).

A loss is named by an integer ``code`` (:data:`LOGISTIC`, :data:`SQUARED_HINGE`,
:data:`SMOOTH_HINGE`, whose smoothing is ``gamma``) so that one compiled kernel serves all.
With ``m = y z`` the margin, ``c = -phi'(m)`` and ``theta = s y c`` (the dual point,
``-n grad F``). Sums are blocked (:data:`BLOCK` terms, then the blocks' sums).

Flags: ``fastmath`` without ``nnan``/``ninf``, so NaN and inf still propagate to the
solver's checks (:mod:`dl1.solvers.numerics`).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

#: Loss codes.
LOGISTIC, SQUARED_HINGE, SMOOTH_HINGE = 0, 1, 2

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
    ``log``)."""
    n = y.shape[0]
    weighted = sw.shape[0] > 0
    t_sum = 0.0
    t_abs = 0.0
    t_curv = 0.0
    for lo in range(0, n, BLOCK):
        p_sum = 0.0
        p_abs = 0.0
        p_curv = 0.0
        for i in range(lo, min(lo + BLOCK, n)):
            _, c, curv = margin_terms(code, gamma, y[i] * (z[i] + shift))
            s = sw[i] if weighted else 1.0
            p_sum += s * y[i] * c
            p_abs += s * c
            p_curv += s * curv
        t_sum += p_sum
        t_abs += p_abs
        t_curv += p_curv
    return t_sum, t_abs, t_curv


@njit(**_JIT)
def intercept_root(code, gamma, y, z, sw, beta, rtol, max_iter):
    """The intercept shift ``db`` with ``sum_i theta_i(z + db) = 0`` to ``|sum theta| <=
    rtol sum |theta|``: Newton's method on the (nondecreasing) derivative of ``F(z + db)``,
    kept inside the bracket of its sign change; where a Newton step leaves the bracket (or
    the curvature vanishes), bisection of a finite bracket or the majorant step
    ``sum theta / (beta sum s)``, which never passes the root.
    """
    s_sum = float(y.shape[0]) if sw.shape[0] == 0 else 0.0
    for i in range(sw.shape[0]):
        s_sum += sw[i]
    db = 0.0
    lo = -math.inf
    hi = math.inf
    t_sum, t_abs, curv = margin_slope_sums(code, gamma, y, z, sw, db)
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
    top = math.inf if code == SQUARED_HINGE else 1.0 + ROUNDING
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
            c = y[i] * th / s
            if not (c >= -ROUNDING and c <= top):  # NaN included
                return math.inf
            c = min(max(c, 0.0), 1.0) if code != SQUARED_HINGE else max(c, 0.0)
            if code == LOGISTIC:
                v = 0.0
                if c > 0.0:
                    v += c * math.log(c)
                if c < 1.0:
                    v += (1.0 - c) * math.log1p(-c)
            elif code == SQUARED_HINGE:
                v = 0.25 * c * c - c
            else:
                v = 0.5 * gamma * c * c - c
            part += s * v
        total += part
    return total


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
