"""SMIDAS (Stochastic MIrror Descent Algorithm made Sparse) over CSR rows, l1 penalty.

Shalev-Shwartz & Tewari, "Stochastic Methods for l1-regularized Loss Minimization" (JMLR
2011), Sec. 3, Algorithm 3, on ``(1/n) sum_i s_i loss(y_i, x_i.w + b) + l1 |w|_1`` (their
Eq. (11), ``lambda = l1``; the method is for l1 alone: ``l2 = 0``). Step ``t`` on example
``i`` with step size ``eta_t`` (the paper: a constant ``eta``):

    w = f^-1(theta),  f^-1_j(theta) = sign(theta_j) |theta_j|^(p-1) / |theta|_p^(p-2)   (Eq. (12))
    v = s_i loss'(y_i, x_i.w + b) x_i                          (Algorithm 3, gradient estimate)
    theta~ = theta - eta v                                      (Algorithm 3, mirror step)
    theta_j = sign(theta~_j) max(0, |theta~_j| - eta lambda)    (Algorithm 3, truncation, all j)

with ``p = 2 ln(d)`` (Algorithm 3's parameter; :func:`smidas_p`), ``f`` the gradient of
``|w|_q^2 / 2`` and ``f^-1`` that of ``|theta|_p^2 / 2``, ``1/p + 1/q = 1``. ``p = 2`` is
the identity link (truncated SGD). Any loss with a (sub)derivative runs; the paper's
analysis covers the squared and logistic losses and the hinge (Theorem 3: Eq. (13)
``|L'| <= rho`` holds for the logistic loss and the hinge with ``rho = 1``, Eq. (14)
``L'^2 <= rho L`` for our squared loss ``(y - z)^2 / 2`` with ``rho = 2``; the paper states
4, loose for its own Eq. (6) ``L' = a - y``). Sample weights scale ``rho``:
``|s L'| <= s_max rho``. Theorem 3 also needs ``|x_ij| <= 1``: its Eq. (18) bounds
``|v_t|_inf`` by ``rho``.

Intercept (our choice; the paper has none): ``b`` lives outside the p-norm geometry and
the l1 term: ``b <- b - eta_t s_i loss'`` (plain SGD with the same step).

Cost per step: O(nnz(x_i) + |supp(theta)|), NOT O(nnz(x_i)). The gradient step touches
nnz(x_i) entries, and the truncation, though a constant ``eta lambda`` per step (so it
could be applied lazily with a per-feature step count, as in :mod:`dl1.kernels.lazy`),
changes every nonzero ``theta_j`` every step, and ``w`` depends on all of them through
``|theta|_p``: ``sum_j (|theta_j| - k eta lambda)_+^p`` has no incremental update for
non-integer ``p``; for integer ``p`` a binomial expansion into ``p + 1`` power sums plus a
sorted structure for the clipping at 0 would be incremental, but its alternating sums
cancel catastrophically, so it is not exact. The kernel therefore sweeps the support of
``theta`` once per step (kept as a compact index list, so the sweep is over nonzero
entries, not all d), truncating and recomputing ``|theta|_p`` in it; with the sweep paid
anyway, lazy truncation would save nothing. SMIDAS keeps ``theta`` sparse (the point of the
truncation), so ``|supp(theta)|`` is the number of currently selected features. O(d) work:
rebuilding the support list at the start of a call and writing ``w`` at its end.

``|theta|_p`` is computed as ``M (sum_j (|theta_j| / M)^p)^(1/p)`` with ``M = max |theta_j|``
and ``w_j = sign(theta_j) N (|theta_j| / N)^(p-1)`` with ``N = |theta|_p`` (equal to Eq.
(12), and safe from over/underflow for ``p = 2 ln d`` ~ 30).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from dl1.kernels.lazy import loss_derivative, loss_value


def smidas_p(d):
    """Algorithm 3's ``p = 2 ln(d)``, floored at 2 (``d <= e``: the identity link)."""
    return max(2.0, 2.0 * math.log(d))


def smidas_eta(B, rho, p, T):
    """Theorem 3, case (13) (``|L'| <= rho``, ``|x_i|_inf <= 1``): the step
    ``eta = (B / rho) sqrt(2 / ((p - 1) e T))`` with ``B >= |w*|_1``, which gives
    ``E P(w_o) - P* <= rho B sqrt(12 ln(d) / T)``."""
    return B / rho * math.sqrt(2.0 / ((p - 1.0) * math.e * T))


def smidas_eta_smooth(B, rho, p, T, P0):
    """Theorem 3, case (14) (``L'^2 <= rho L``): ``eta = B^2 / (P(0) T)
    (sqrt(1 + 2 P(0) T / ((p - 1) rho e B^2)) - 1)``."""
    return B * B / (P0 * T) * (math.sqrt(1.0 + 2.0 * P0 * T / ((p - 1.0) * rho * math.e * B * B))
                               - 1.0)


@njit(nogil=True, cache=True)
def link_inverse(th, N, p):
    """``f^-1_j(theta)`` of Eq. (12) from ``theta_j`` and ``N = |theta|_p``."""
    if th == 0.0 or N == 0.0:
        return 0.0
    mag = N * (abs(th) / N) ** (p - 1.0)
    return mag if th > 0 else -mag


@njit(nogil=True, cache=True)
def support_norm(theta, supp, m, p):
    """``|theta|_p`` over the ``m`` indices ``supp[:m]`` (the nonzero entries)."""
    M = 0.0
    for k in range(m):
        a = abs(theta[supp[k]])
        if a > M:
            M = a
    if M == 0.0:
        return 0.0
    S = 0.0
    for k in range(m):
        S += (abs(theta[supp[k]]) / M) ** p
    return M * S ** (1.0 / p)


@njit(nogil=True, cache=True)
def smidas_pass(indptr, indices, data, y, sw, rows, eta, theta, w, b, fit_intercept, l1, p,
                loss, gamma):
    """SMIDAS steps over the CSR rows ``rows`` (in that order), continuing from ``theta``.

    Parameters
    ----------
    indptr, indices, data : CSR arrays of the row block (column indices global).
    y, sw : float64 arrays (n_rows,)
        Targets and sample weights (normalised to sum to n).
    rows : int64 array (T,)
        Rows to visit, step by step.
    eta : float64 array (T,)
        Step size of each step (the paper: constant, :func:`smidas_eta`).
    theta : float64 array (d,)
        The mirror (dual) vector, updated in place (0 for a fresh start).
    w : float64 array (d,)
        Output: ``f^-1(theta)`` after the last step.
    b : float
        Intercept.
    fit_intercept : bool
    l1 : float
        The l1 penalty ``lambda``.
    p : float
        The link's norm (>= 2; :func:`smidas_p`).
    loss : int
        :mod:`dl1.kernels.codes` value.
    gamma : float
        Smoothing of the smoothed hinge.

    Returns
    -------
    b : float
    progressive : float
        ``sum_t sw * loss(y, z_t)`` with ``z_t`` the prediction before step ``t``.
    """
    if p < 2.0:
        raise ValueError("SMIDAS needs p >= 2")
    d = theta.shape[0]
    pos = np.full(d, -1, dtype=np.int64)
    supp = np.empty(d, dtype=np.int64)
    m = 0
    for j in range(d):
        if theta[j] != 0.0:
            pos[j] = m
            supp[m] = j
            m += 1
    N = support_norm(theta, supp, m, p)
    progressive = 0.0
    for k in range(rows.shape[0]):
        r = rows[k]
        lo, hi = indptr[r], indptr[r + 1]
        z = b
        for q in range(lo, hi):
            z += data[q] * link_inverse(theta[indices[q]], N, p)
        progressive += sw[r] * loss_value(loss, y[r], z, gamma)
        g = sw[r] * loss_derivative(loss, y[r], z, gamma)
        et = eta[k]
        # theta~ = theta - eta v on nnz(x_r); new nonzeros join the support
        if g != 0.0:
            for q in range(lo, hi):
                j = indices[q]
                theta[j] -= et * g * data[q]
                if pos[j] < 0 and theta[j] != 0.0:
                    pos[j] = m
                    supp[m] = j
                    m += 1
        if fit_intercept:
            b -= et * g
        # truncation of every nonzero theta_j (swap-remove the ones reaching 0), then |theta|_p
        shrink = et * l1
        i = 0
        while i < m:
            j = supp[i]
            a = abs(theta[j]) - shrink
            if a <= 0.0:
                theta[j] = 0.0
                pos[j] = -1
                m -= 1
                if i < m:
                    supp[i] = supp[m]
                    pos[supp[i]] = i
                continue
            theta[j] = a if theta[j] > 0 else -a
            i += 1
        N = support_norm(theta, supp, m, p)
    for j in range(d):
        w[j] = link_inverse(theta[j], N, p)
    return b, progressive
