"""Prox-SDCA local epochs over CSR rows (elastic net), with the CoCoA+ ``sigma_prime``.

Shalev-Shwartz & Zhang, "Proximal Stochastic Dual Coordinate Ascent" (2012; the text in
``papers/prox-sdca_shalev-shwartz-zhang.txt``), for our objective

    P(w) = (1/n) sum_i phi_i(x_i.w) + lambda g(w),    phi_i(a) = s_i loss(y_i, a),

written as the paper's Eq. (1) with Sec. 3.1's Eq. (7): ``g(w) = |w|^2/2 + (sigma/lambda)
|w|_1``, ``lambda = l2``, ``sigma = l1`` (so ``lambda g = l1 |w|_1 + l2/2 |w|^2``).

Dual (Eq. (2)) and primal-dual map (Eq. (3)):

    D(alpha) = (1/n) sum_i -phi_i*(-alpha_i) - lambda g*(v),  v = (1/(lambda n)) sum_i alpha_i x_i,
    w = grad g*(v) = sign(v) [|v| - sigma/lambda]_+            (Sec. 3.1, the last display),
    g*(v) = 1/2 |grad g*(v)|^2.

Sample weights. ``phi_i = s_i loss`` has ``phi_i*(u) = s_i loss*(u / s_i)``; writing
``alpha_i = s_i beta_i`` gives ``-phi_i*(-alpha_i) = s_i (-loss*(-beta_i))``: each example's
dual term is the unweighted one scaled by ``s_i`` at ``beta_i = alpha_i / s_i`` (``s_i = 0``
forces ``alpha_i = 0``; such rows are skipped). ``-loss*(-beta)``, with ``c = y beta``:

* squared ``(y - a)^2/2``: ``y beta - beta^2/2``;
* logistic: ``-c log c - (1 - c) log(1 - c)``, ``c`` in [0, 1];
* hinge: ``c``, ``c`` in [0, 1];
* smoothed hinge (gamma): ``c - gamma c^2 / 2``, ``c`` in [0, 1] (the conjugate of the
  Huber-like hinge of :mod:`dl1.kernels.lazy`; derived here, this paper's text has none).

Dual step: Option I of the Procedure Prox-SDCA (Fig. 1), with ``|.|_D' = |.|_2``
(Sec. 3.1), scaled by ``sigma_prime`` (below): maximise over ``Delta``

    -phi_i*(-(alpha_i + Delta)) - z Delta - (sigma_prime |x_i|^2 / (2 lambda n)) Delta^2,

``z = x_i.w + b`` at the current local point. In ``beta`` units (``q = s_i sigma_prime
|x_i|^2 / (lambda n)``) the maximiser is, in closed form,

* squared: ``beta += (y - z - beta) / (1 + q)``;
* hinge / smoothed hinge: ``c = clip(c + (1 - y z - gamma c) / (gamma + q), 0, 1)``
  (``gamma = 0`` for the hinge: the usual SDCA hinge step, clipped to the domain);
* logistic: the root of ``log((1 - c)/c) - y z - q (c - c_old) = 0``, solved as
  ``c = sigmoid(s)``, ``F(s) = -s - y z - q (sigmoid(s) - c_old) = 0`` by Newton's method,
  safeguarded by bisection on the bracket ``[-y z - q (1 - c_old), -y z + q c_old]``
  (``F`` is decreasing, ``-1 - q/4 <= F' <= -1``); at most :data:`NEWTON_MAX_ITER` steps,
  stopped at machine precision (so Option I exactly, up to rounding).

Local subproblem (CoCoA+). The kernel works on one worker's rows given the global
``(alpha_[k], v)``; it accumulates ``u = (1/(lambda n)) sum_{i in block} Delta_i x_i`` and
runs Prox-SDCA (Option I, re-linearised at every step as in Fig. 1) on

    H_k(Delta) = -(1/n) sum_{i in k} phi_i*(-(alpha_i + Delta_i))
                 - (lambda/sigma') g*(v + sigma' u),

whose Option-I surrogate at ``u`` is Smith et al. (2018) Eq. (8)'s quadratic term
``lambda sigma'/2 |u|^2`` linearised at the local point: the step uses
``w_loc = grad g*(v + sigma' u)`` and ``q`` scaled by ``sigma'``. For ``sigma' >= K`` blocks
the updates can be added: ``v + sum_k u_k`` is the convex combination
``sum_k (1/sigma') (v + sigma' u_k) + (1 - K/sigma') v``, so by convexity of ``g*``
``D(alpha + Delta) >= sum_k H_k(Delta_k) - lambda (1 - K/sigma') g*(v)``, with equality at
``Delta = 0``: every local ascent is a global ascent. With ``sigma' = 1`` and one block,
``H = D`` and the steps are exactly sequential Prox-SDCA.

Intercept. ``b = c + kappa v_b``: an offset ``c`` plus the weight of a constant feature of
value ``kappa = intercept_scale`` appended to every row, inside ``g``'s ridge part and outside
its l1 part, ``v_b = (1/(lambda n)) sum_i kappa alpha_i``. It costs O(1) per step and keeps
the dual unconstrained (an unpenalised intercept would add the constraint ``sum_i alpha_i =
0``, which single-coordinate steps cannot keep). The problem solved is the proximal one
``P(w, b) + lambda (b - c)^2 / (2 kappa^2)``; :class:`dl1.solvers.sdca.SDCASolver` moves
``c`` to ``b`` after every round (the method of multipliers on that constraint), so at its
fixed point the penalty vanishes and the intercept is unpenalised.

Pure Lasso (``l2 = 0``): Sec. 3.1 adds the ridge ``lambda = epsilon / B^2`` with
``B >= |w*|_2`` (:func:`lasso_ridge`); an ``epsilon/2``-accurate solution of the ridged
problem is ``epsilon``-accurate for the Lasso. The paper's default ``B = 1/sigma`` assumes
``(1/n) sum phi_i(0) <= 1``; in general ``|w*|_2 <= |w*|_1 <= P(0)/sigma``, which
:func:`lasso_ridge` uses. The kernel refuses ``l2 = 0``.

Cost: per step O(nnz(x_i)): ``w_j = grad_j g*(v_j + sigma' u_j)`` is computed only for the
example's features, ``u`` changes only there. The O(d) work is allocating/returning the
dense ``delta_v`` once per call (the caller may sparsify it).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from dl1.kernels.cd import soft_threshold
from dl1.kernels.codes import HINGE, LOGISTIC, SMOOTH_HINGE, SQUARED
from dl1.kernels.lazy import loss_value

#: Newton steps (with bisection safeguard) for the logistic dual step.
NEWTON_MAX_ITER = 60
#: Tolerance on the dual feasibility ``c = y alpha / s`` in [0, 1] when evaluating conjugates.
FEASIBILITY_TOL = 1e-12


@njit(nogil=True, cache=True)
def _sigmoid(s):
    if s >= 0:
        return 1.0 / (1.0 + math.exp(-s))
    e = math.exp(s)
    return e / (1.0 + e)


@njit(nogil=True, cache=True)
def logistic_dual_root(yz, q, c_old):
    """``c = sigmoid(s)`` with ``-s - yz - q (sigmoid(s) - c_old) = 0`` (see module)."""
    lo = -yz - q * (1.0 - c_old)
    hi = -yz + q * c_old
    s = -yz
    if s < lo:
        s = lo
    if s > hi:
        s = hi
    for _ in range(NEWTON_MAX_ITER):
        c = _sigmoid(s)
        F = -s - yz - q * (c - c_old)
        if F == 0.0:
            break
        if F > 0.0:
            lo = s
        else:
            hi = s
        s_new = s - F / (-1.0 - q * c * (1.0 - c))
        if not (lo < s_new < hi):
            s_new = 0.5 * (lo + hi)
        if abs(s_new - s) <= 4e-16 * max(1.0, abs(s)):
            s = s_new
            break
        s = s_new
    return _sigmoid(s)


@njit(nogil=True, cache=True)
def dual_step(loss, y, z, beta, q, gamma):
    """New ``beta_i`` (``alpha_i / s_i``) of Option I (module docstring), from the margin
    ``z``, the old ``beta`` and ``q = s_i sigma' |x_i|^2 / (lambda n)``."""
    if loss == SQUARED:
        return beta + (y - z - beta) / (1.0 + q)
    c_old = y * beta
    if loss == LOGISTIC:
        return y * logistic_dual_root(y * z, q, c_old)
    g = gamma if loss == SMOOTH_HINGE else 0.0
    num = 1.0 - y * z - g * c_old
    den = g + q
    if den > 0.0:
        c = c_old + num / den
    elif num > 0.0:
        c = 1.0
    elif num < 0.0:
        c = 0.0
    else:
        c = c_old
    c = min(1.0, max(0.0, c))
    return y * c


@njit(nogil=True, cache=True)
def dual_loss(loss, y, a, s, gamma):
    """``-phi_i*(-a)`` for ``phi_i = s loss(y, .)`` (module docstring); ``-inf`` where
    infeasible (beyond :data:`FEASIBILITY_TOL`)."""
    if s == 0.0:
        return 0.0 if a == 0.0 else -np.inf
    beta = a / s
    if loss == SQUARED:
        return s * (y * beta - 0.5 * beta * beta)
    c = y * beta
    if c < -FEASIBILITY_TOL or c > 1.0 + FEASIBILITY_TOL:
        return -np.inf
    c = min(1.0, max(0.0, c))
    if loss == LOGISTIC:
        h = 0.0
        if c > 0.0:
            h -= c * math.log(c)
        if c < 1.0:
            h -= (1.0 - c) * math.log1p(-c)
        return s * h
    if loss == HINGE:
        return s * c
    return s * (c - 0.5 * gamma * c * c)


@njit(nogil=True, cache=True)
def dual_loss_sum(y, sw, alpha, loss, gamma):
    """``sum_i -phi_i*(-alpha_i)`` over a block's rows (divide by the global n for D)."""
    total = 0.0
    for i in range(y.shape[0]):
        total += dual_loss(loss, y[i], alpha[i], sw[i], gamma)
    return total


def regulariser_conjugate(v, vb, l1, l2):
    """``lambda g*(v) = l2/2 (|soft(v, l1/l2)|^2 + v_b^2)`` (with the intercept coordinate)."""
    w = np.sign(v) * np.maximum(np.abs(v) - l1 / l2, 0.0)
    return 0.5 * l2 * (float(w @ w) + vb * vb)


def dual_objective(y, sw, alpha, v, vb, l1, l2, loss, gamma, n=None):
    """``D(alpha)`` of Eq. (2) (one block holding all rows unless ``n`` is given)."""
    n = y.shape[0] if n is None else n
    return (dual_loss_sum(y, sw, alpha, loss, gamma) / n
            - regulariser_conjugate(v, vb, l1, l2))


def primal_from_dual(v, vb, l1, l2, intercept_scale=1.0):
    """``w = grad g*(v)`` (Sec. 3.1) and ``b = kappa v_b``."""
    w = np.sign(v) * np.maximum(np.abs(v) - l1 / l2, 0.0)
    return w, intercept_scale * vb


def lasso_ridge(epsilon, l1, p0=1.0):
    """Sec. 3.1's ridge ``lambda = epsilon / B^2`` for a pure Lasso (``l2 = 0``), with
    ``B = p0 / l1 >= |w*|_1 >= |w*|_2`` and ``p0 = P(0) = (1/n) sum_i s_i loss(y_i, 0)``
    (the paper's default ``B = 1/sigma`` is the case ``p0 = 1``). Prox-SDCA on
    ``l2 = lambda`` run to a gap of ``epsilon / 2`` is ``epsilon``-accurate for the Lasso."""
    if epsilon <= 0 or l1 <= 0 or p0 <= 0:
        raise ValueError("lasso_ridge needs epsilon, l1, p0 > 0")
    B = p0 / l1
    return epsilon / (B * B)


@njit(nogil=True, cache=True)
def sdca_epoch(indptr, indices, data, y, sw, rows, alpha, v, vb, n, l1, l2, sigma_prime,
               fit_intercept, intercept_scale, loss, gamma, offset=0.0):
    """Prox-SDCA steps (Option I) on the rows ``rows`` of one block, from the global ``v``.

    Parameters
    ----------
    indptr, indices, data : CSR arrays of the row block (column indices global).
    y, sw : float64 arrays (n_rows,)
        Targets and sample weights (normalised to sum to the global n).
    rows : int64 array (T,)
        Rows to visit (several local epochs: rows repeat).
    alpha : float64 array (n_rows,)
        The block's dual variables at the start (read only).
    v : float64 array (d,)
        The global ``v = (1/(lambda n)) sum_i alpha_i x_i`` at the start (read only).
    vb : float
        Its intercept coordinate ``(1/(lambda n)) sum_i kappa alpha_i``.
    n : int
        The global number of examples.
    l1, l2 : float
        ``alpha * l1_ratio``, ``alpha * (1 - l1_ratio)`` (``l2 > 0``; see :func:`lasso_ridge`).
    sigma_prime : float
        CoCoA+ subproblem scaling (1: sequential Prox-SDCA; ``>= K`` to add K blocks).
    fit_intercept : bool
    intercept_scale : float
        ``kappa``, the constant feature's value.
    loss : int
        :mod:`dl1.kernels.codes` value.
    gamma : float
        Smoothing of the smoothed hinge.
    offset : float
        A fixed intercept ``b`` added to every prediction: the steps are then those of
        ``phi_i(a) = s_i loss(y_i, a + b)`` (whose conjugate is ``loss*(u) - u b``, so the
        Option-I step in terms of the prediction ``z = x.w + b`` is unchanged): the centre
        ``c`` of the intercept (module docstring), or a held intercept when
        ``fit_intercept`` is False.

    Returns
    -------
    delta_alpha : float64 array (n_rows,)
    delta_v : float64 array (d,)
        ``(1/(lambda n)) sum_i delta_alpha_i x_i``.
    delta_vb : float
    progressive : float
        ``sum_t sw * loss(y, z_t)`` at the local predictions before each step.
    """
    if l2 <= 0.0:
        raise ValueError("Prox-SDCA needs l2 > 0 (add lasso_ridge for a pure Lasso)")
    d = v.shape[0]
    delta_alpha = np.zeros(y.shape[0])
    u = np.zeros(d)
    ub = 0.0
    kappa = intercept_scale if fit_intercept else 0.0
    thr = l1 / l2
    ln = l2 * n
    progressive = 0.0
    for k in range(rows.shape[0]):
        r = rows[k]
        s = sw[r]
        lo, hi = indptr[r], indptr[r + 1]
        # w_loc = grad g*(v + sigma' u) on nnz(x_r) only, and |x_r|^2
        z = offset + kappa * (vb + sigma_prime * ub)
        sq = kappa * kappa
        for q in range(lo, hi):
            j = indices[q]
            x = data[q]
            z += x * soft_threshold(v[j] + sigma_prime * u[j], thr)
            sq += x * x
        progressive += s * loss_value(loss, y[r], z, gamma)
        if s == 0.0:
            continue
        a = alpha[r] + delta_alpha[r]
        beta = a / s
        beta_new = dual_step(loss, y[r], z, beta, s * sigma_prime * sq / ln, gamma)
        da = s * (beta_new - beta)
        if da == 0.0:
            continue
        delta_alpha[r] += da
        f = da / ln
        for q in range(lo, hi):
            u[indices[q]] += f * data[q]
        ub += f * kappa
    return delta_alpha, u, ub, progressive
