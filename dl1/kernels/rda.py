"""Regularized dual averaging (l1-RDA, enhanced l1-RDA, mixed l1/l2^2) over CSR rows.

Xiao, "Dual Averaging Method for Regularized Stochastic Learning and Online Optimization"
(NIPS 2009), Algorithm 1, on the objective ``(1/n) sum_i s_i loss(y_i, x_i.w + b) + Psi(w)``
with ``Psi(w) = l1 |w|_1 + l2/2 |w|_2^2`` (``l1 = alpha * l1_ratio``,
``l2 = alpha * (1 - l1_ratio)``). Step ``t = 1, 2, ...`` on example ``i``:

* Step 1: ``g_t = s_i loss'(y_i, x_i.w_t + b_t) x_i`` (a subgradient of the loss at ``w_t``);
* Step 2, Eq. (5): ``gbar_t = ((t - 1) gbar_{t-1} + g_t) / t``, i.e. ``gbar_t = G_t / t``
  with the running sum ``G_t = g_1 + ... + g_t`` kept here;
* Step 3, Eq. (6): ``w_{t+1} = argmin_w <gbar_t, w> + Psi(w) + (beta_t / t) h(w)``.

With ``beta_t = gamma_rda sqrt(t)`` (Eq. (8)) and ``h(w) = |w|^2/2 + rho |w|_1`` (Sec. 2,
the l1 example; ``rho > 0`` is the "enhanced" variant) the minimiser of (6) is, per
coordinate (``beta_t / t = gamma_rda / sqrt(t)``),

    w_{t+1,j} = - sign(gbar_j) [|gbar_j| - lambda_t]_+ / (l2 + gamma_rda / sqrt(t)),
    lambda_t = l1 + gamma_rda rho / sqrt(t).

* ``l2 = 0``: this is Eq. (9), except for the threshold: the paper prints
  ``lambda_t = lambda + rho / sqrt(t)``, but minimising (6) with ``h`` above gives
  ``lambda + gamma rho / sqrt(t)`` (the ``rho |w|_1`` of ``h`` is weighted by
  ``beta_t / t = gamma / sqrt(t)``); the paper's own experiments (Sec. 5: "rho = 0.005
  (effectively gamma rho = 25)") use the product. We implement the minimiser of (6).
* ``l2 > 0``, ``gamma_rda = 0``: the paper's mixed l1/l2^2 case (Sec. 2: ``beta_t = 0``,
  no ``h``): ``w_{t+1,j} = -(1/sigma) (gbar_j - lambda sign(gbar_j))`` where
  ``|gbar_j| > lambda`` (``lambda = l1``, ``sigma = l2``). Sec. 3 allows any nondecreasing
  ``beta_t`` dominated by ``ln t`` for it; ``gamma_rda > 0`` with ``l2 > 0`` is accepted too
  (the same closed form), but the paper's prescription for ``l2 > 0`` is ``gamma_rda = 0``.
  ``l2 = gamma_rda = 0`` has no minimiser and is refused.

Intercept (our choice; the paper has none): ``b`` is one more coordinate with
``Psi_b = 0`` (unpenalised, so no l1 threshold and no ``rho``) and ``h_b(b) = b^2/2`` with
its own ``beta_t = gamma_b sqrt(t)``, so (6) gives ``b_{t+1} = -G_{b,t} / (gamma_b sqrt(t))``.
It needs ``gamma_b > 0`` even in the mixed case (``b`` has no strong convexity of its own).
With ``gamma_b = gamma_rda`` and ``l2 = 0`` this is exactly Algorithm 1 on ``(w, b)`` with
``h(w, b) = h(w) + b^2/2``, so Theorems 1 and 2 cover it.

Laziness, cost: ``w_{t+1}`` depends on ``G_j`` and the step count ``t`` only, and ``G_j``
changes only when feature ``j`` is in the example. So the weights are never stored during a
pass: ``w_j`` is computed from ``(G_j, t)`` in O(1) when its feature appears. Per example
the cost is O(nnz(x_i)) (prediction, loss, ``G`` update); the only O(d) work is writing all
weights at the end of a call (:func:`rda_weights`). The state ``(G, G_b, t)`` is the whole
algorithm: a call continues from it (``t`` keeps counting), so passes and blocks chain, and
the dual averages of several workers combine as ``sum G / sum t`` (:func:`rda_weights`
accepts a real ``t``).

Theorem 2 bounds the averaged iterate ``wbar_t = (1/t) sum_tau w_tau``; the kernel returns
the last iterate ``w_{t+1}`` (the paper's Sec. 5 reports it as robust). Averaging is not
lazy (``w_j`` moves with ``t`` even when ``G_j`` does not, with no closed-form sum), so a
caller that wants ``wbar`` must pay O(d) per step.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from dl1.kernels.lazy import loss_derivative, loss_value


@njit(nogil=True, cache=True)
def rda_weight(Gj, t, l1, l2, gamma_rda, rho):
    """``w_{t+1, j}``: the minimiser of Xiao's Eq. (6) from ``G_j = t gbar_j`` after ``t``
    steps (0 before the first step: ``w_1 = w_0 = argmin h = 0``, Algorithm 1)."""
    if t <= 0:
        return 0.0
    st = math.sqrt(t)
    gbar = Gj / t
    thr = l1 + gamma_rda * rho / st
    a = abs(gbar)
    if a <= thr:
        return 0.0
    mag = (a - thr) / (l2 + gamma_rda / st)
    return -mag if gbar > 0 else mag


@njit(nogil=True, cache=True)
def rda_intercept(Gb, t, gamma_b):
    """``b_{t+1} = -G_b / (gamma_b sqrt(t))`` (Eq. (6) with ``Psi_b = 0``, ``h_b = b^2/2``)."""
    if t <= 0:
        return 0.0
    return -Gb / (gamma_b * math.sqrt(t))


@njit(nogil=True, cache=True)
def rda_weights_into(w, G, t, l1, l2, gamma_rda, rho):
    for j in range(G.shape[0]):
        w[j] = rda_weight(G[j], t, l1, l2, gamma_rda, rho)


def rda_weights(G, t, l1, l2, gamma_rda, rho=0.0, Gb=0.0, gamma_b=1.0):
    """All weights and the intercept from the state ``(G, G_b, t)`` (O(d)).

    ``t`` may be real: workers' states combine as ``G = sum_k G_k``, ``t = sum_k t_k``
    (their dual averages ``gbar = G / t`` pooled), and the weights follow from Eq. (6).
    """
    if l2 == 0.0 and gamma_rda <= 0.0:
        raise ValueError("RDA needs gamma_rda > 0 when l2 == 0")
    G = np.ascontiguousarray(G, dtype=np.float64)
    w = np.empty_like(G)
    rda_weights_into(w, G, float(t), l1, l2, gamma_rda, rho)
    return w, float(rda_intercept(Gb, float(t), gamma_b))


def rda_state(w, b, t, l1, l2, gamma_rda, rho=0.0, gamma_b=1.0):
    """The state ``(G, G_b)`` whose weights after ``t`` steps are ``(w, b)`` (Eq. (6)
    inverted coordinate by coordinate; zeros when ``t = 0``): a warm start."""
    w = np.asarray(w, dtype=np.float64)
    if t <= 0:
        return np.zeros_like(w), 0.0
    st = math.sqrt(t)
    G = -t * (w * (l2 + gamma_rda / st) + np.sign(w) * (l1 + gamma_rda * rho / st))
    return G, -float(b) * gamma_b * st


@njit(nogil=True, cache=True)
def rda_pass(indptr, indices, data, y, sw, rows, G, Gb, t, w, fit_intercept, l1, l2,
             gamma_rda, rho, gamma_b, loss, gamma):
    """Steps of l1-RDA over the CSR rows ``rows`` (in that order), from the state
    ``(G, Gb, t)``.

    Parameters
    ----------
    indptr, indices, data : CSR arrays of the row block (column indices global).
    y, sw : float64 arrays (n_rows,)
        Targets and sample weights (normalised to sum to n) of the block's rows.
    rows : int64 array (T,)
        Rows to visit, step by step.
    G : float64 array (d,)
        Running sum of the loss subgradients, updated in place.
    Gb : float
        Running sum of the intercept's subgradients.
    t : int
        Steps already taken (0 for a fresh start).
    w : float64 array (d,)
        Output: the weights ``w_{t+1}`` after the call's last step (written, O(d)).
    fit_intercept : bool
    l1, l2 : float
        ``alpha * l1_ratio`` and ``alpha * (1 - l1_ratio)``.
    gamma_rda, rho : float
        ``beta_t = gamma_rda sqrt(t)`` (Eq. (8)) and the sparsity-enhancing ``rho`` of ``h``.
    gamma_b : float
        ``beta_t`` scale of the intercept (> 0 when ``fit_intercept``).
    loss : int
        :mod:`dl1.kernels.codes` value.
    gamma : float
        Smoothing of the smoothed hinge.

    Returns
    -------
    Gb : float
    t : int
        The new step count (``t + len(rows)``).
    b : float
        The intercept ``b_{t+1}`` (0 without ``fit_intercept``).
    progressive : float
        ``sum_t sw * loss(y, z_t)`` with ``z_t`` the prediction before step ``t``.
    """
    if l2 == 0.0 and gamma_rda <= 0.0:
        raise ValueError("RDA needs gamma_rda > 0 when l2 == 0")
    if fit_intercept and gamma_b <= 0.0:
        raise ValueError("RDA needs gamma_b > 0 to fit an intercept")
    progressive = 0.0
    for k in range(rows.shape[0]):
        r = rows[k]
        lo, hi = indptr[r], indptr[r + 1]
        # w_t and b_t from the state, only where needed: O(nnz(x_r))
        z = rda_intercept(Gb, t, gamma_b) if fit_intercept else 0.0
        for q in range(lo, hi):
            z += data[q] * rda_weight(G[indices[q]], t, l1, l2, gamma_rda, rho)
        progressive += sw[r] * loss_value(loss, y[r], z, gamma)
        g = sw[r] * loss_derivative(loss, y[r], z, gamma)
        # Eq. (5) as a running sum: G_t = G_{t-1} + g_t
        for q in range(lo, hi):
            G[indices[q]] += g * data[q]
        if fit_intercept:
            Gb += g
        t += 1
    rda_weights_into(w, G, t, l1, l2, gamma_rda, rho)
    b = rda_intercept(Gb, t, gamma_b) if fit_intercept else 0.0
    return Gb, t, b, progressive
