"""Stochastic gradient passes over CSR rows with lazy elastic-net updates.

One step ``t`` on example ``i`` (row ``x_i``, learning rate ``eta_t``) is, densely,

    z = x_i . w + b;   g = s_i loss'(y_i, z)
    w_j <- w_j - eta_t g x_ij   (j in nnz(x_i));   b <- b - eta_t g
    w_j <- reg_t(w_j)           (every j)

with ``reg_t`` the elastic-net step of Lipton & Elkan, "Efficient Elastic Net
Regularization for Sparse Linear Models" (2015), ``l1 = alpha * l1_ratio``,
``l2 = alpha * (1 - l1_ratio)``:

* SGD (their Eq. (3)): ``u <- a_t u - eta_t l1`` on ``u = |w_j|``, clipped at 0, with
  ``a_t = 1 - eta_t l2`` (scale, then shrink);
* FoBoS (their Eq. (2), the proximal step): ``u <- a_t (u - eta_t l1)``, clipped at 0, with
  ``a_t = 1 / (1 + eta_t l2)`` (shrink, then scale).

Weights outside ``nnz(x_i)`` only see ``reg_t``, so each feature keeps the number of steps
``psi_j`` already applied to it and is brought current when its feature next appears, in
O(1) (Algorithm 1 of the paper): with cached partial products ``P[t] = a_0 ... a_{t-1}`` and
partial sums ``C[t] = sum_{tau < t} eta_tau / D_tau``,

    |w_j| <- [ |w_j| P[k] / P[psi_j] - l1 P[k] (C[k] - C[psi_j]) ]_+

brings it from step ``psi_j`` to step ``k``. Unrolling the two recurrences gives
``D_tau = P[tau]`` (= ``P(tau - 1)`` in the paper's notation) for FoBoS, as in their
Theorem 2, and ``D_tau = P[tau + 1]`` (``P(tau)``) for SGD, where their Theorem 1 writes
``P(tau - 1)``: with the scale-then-shrink step of their Eq. (3) the shrink of step ``tau`` is
scaled only by the later ``a``s. The clip at 0 is exact once applied at the end: a weight
that reaches 0 stays there, and the unclipped recurrence stays negative.

Per example the cost is proportional to ``nnz(x_i)``, not to the number of features. ``P``
decays geometrically, so when it falls below :data:`RESCALE_BELOW` every weight is brought
current and the products restart (the paper's footnote 1; O(d), rare); every weight is also
brought current at the end of each pass.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from dl1.kernels.codes import HINGE, LOGISTIC, SQUARED

#: Forms of the regularisation step: plain stochastic (sub)gradient, or FoBoS's prox.
SGD, FOBOS = 0, 1
FORM_CODES = {"sgd": SGD, "fobos": FOBOS}

#: When the partial product falls below this, every weight is brought current and the
#: caches restart (keeps ``P`` and ``C = sum eta / P`` far from under- and overflow).
RESCALE_BELOW = 1e-100


@njit(nogil=True, cache=True)
def loss_value(loss, y, z, gamma):
    """``loss(y, z)`` of the kernel code ``loss`` (``gamma``: smoothing of the smoothed hinge)."""
    if loss == SQUARED:
        return 0.5 * (y - z) * (y - z)
    m = y * z
    if loss == LOGISTIC:
        if m > 0:
            return math.log1p(math.exp(-m))
        return -m + math.log1p(math.exp(m))
    if loss == HINGE:
        return max(0.0, 1.0 - m)
    if m >= 1.0:
        return 0.0
    if m <= 1.0 - gamma:
        return 1.0 - m - 0.5 * gamma
    return (1.0 - m) * (1.0 - m) / (2.0 * gamma)


@njit(nogil=True, cache=True)
def loss_derivative(loss, y, z, gamma):
    """``d loss(y, z) / dz`` (a subgradient for the hinge: ``-y`` where ``y z < 1``)."""
    if loss == SQUARED:
        return z - y
    m = y * z
    if loss == LOGISTIC:
        if m > 0:
            e = math.exp(-m)
            return -y * e / (1.0 + e)
        return -y / (1.0 + math.exp(m))
    if loss == HINGE:
        return -y if m < 1.0 else 0.0
    if m >= 1.0:
        return 0.0
    if m <= 1.0 - gamma:
        return -y
    return -y * (1.0 - m) / gamma


@njit(nogil=True, cache=True)
def scale_factor(form, eta, l2):
    """``a_t`` of one regularisation step (see the module docstring)."""
    if form == SGD:
        return 1.0 - eta * l2
    return 1.0 / (1.0 + eta * l2)


@njit(nogil=True, cache=True)
def regularize(form, u, eta, l1, l2):
    """One regularisation step of a signed weight ``u`` (the dense form of the step)."""
    a = scale_factor(form, eta, l2)
    mag = abs(u)
    if form == SGD:
        mag = a * mag - eta * l1
    else:
        mag = a * (mag - eta * l1)
    if mag <= 0.0:
        return 0.0
    return mag if u > 0 else -mag


@njit(nogil=True, cache=True)
def catch_up(wj, psi_j, k, P, C, l1):
    """``w_j`` brought from step ``psi_j`` to step ``k`` in O(1) (the module's formula)."""
    if psi_j == k or wj == 0.0:
        return wj
    mag = abs(wj) * (P[k] / P[psi_j]) - l1 * P[k] * (C[k] - C[psi_j])
    if mag <= 0.0:
        return 0.0
    return mag if wj > 0 else -mag


@njit(nogil=True, cache=True)
def bring_current(w, psi, k, P, C, l1):
    """Every weight brought to step ``k``; ``psi`` set to ``k``."""
    for j in range(w.shape[0]):
        w[j] = catch_up(w[j], psi[j], k, P, C, l1)
        psi[j] = k


@njit(nogil=True, cache=True)
def lazy_pass(indptr, indices, data, y, sw, rows, eta, w, b, fit_intercept, l1, l2, form,
              loss, gamma):
    """One pass of lazy SGD / FoBoS over the CSR rows ``rows`` (in that order).

    Parameters
    ----------
    indptr, indices, data : CSR arrays of the row block (column indices global).
    y, sw : float64 arrays (n_rows,)
        Targets and sample weights of the block's rows.
    rows : int64 array (T,)
        Rows to visit, step by step.
    eta : float64 array (T,)
        Learning rate of each step.
    w : float64 array (d,)
        Weights, updated in place and current on return.
    b : float
        Intercept.
    fit_intercept : bool
    l1, l2 : float
        ``alpha * l1_ratio`` and ``alpha * (1 - l1_ratio)``.
    form, loss : int
        :data:`FORM_CODES` and :mod:`dl1.kernels.codes` values.
    gamma : float
        Smoothing of the smoothed hinge.

    Returns
    -------
    b : float
        The updated intercept.
    progressive : float
        ``sum_t sw * loss(y, z_t)`` with ``z_t`` the prediction made before step ``t``
        (progressive validation loss).
    """
    T = rows.shape[0]
    d = w.shape[0]
    psi = np.zeros(d, dtype=np.int64)
    P = np.empty(T + 1)
    C = np.empty(T + 1)
    P[0] = 1.0
    C[0] = 0.0
    progressive = 0.0
    for t in range(T):
        r = rows[t]
        lo, hi = indptr[r], indptr[r + 1]
        z = b
        for q in range(lo, hi):
            j = indices[q]
            w[j] = catch_up(w[j], psi[j], t, P, C, l1)
            psi[j] = t
            z += data[q] * w[j]
        progressive += sw[r] * loss_value(loss, y[r], z, gamma)
        g = sw[r] * loss_derivative(loss, y[r], z, gamma)
        et = eta[t]
        for q in range(lo, hi):
            j = indices[q]
            w[j] = regularize(form, w[j] - et * g * data[q], et, l1, l2)
            psi[j] = t + 1
        if fit_intercept:
            b -= et * g
        a = scale_factor(form, et, l2)
        P[t + 1] = P[t] * a
        C[t + 1] = C[t] + et / (P[t + 1] if form == SGD else P[t])
        if P[t + 1] < RESCALE_BELOW:
            bring_current(w, psi, t + 1, P, C, l1)
            P[t + 1] = 1.0
            C[t + 1] = 0.0
    bring_current(w, psi, T, P, C, l1)
    return b, progressive


@njit(nogil=True, cache=True)
def rows_loss(indptr, indices, data, y, sw, w, b, loss, gamma):
    """``sum_i sw_i loss(y_i, x_i . w + b)`` over the CSR rows (no temporary of length n)."""
    total = 0.0
    for r in range(indptr.shape[0] - 1):
        z = b
        for q in range(indptr[r], indptr[r + 1]):
            z += data[q] * w[indices[q]]
        total += sw[r] * loss_value(loss, y[r], z, gamma)
    return total


@njit(nogil=True, cache=True)
def dense_pass(indptr, indices, data, y, sw, rows, eta, w, b, fit_intercept, l1, l2, form,
               loss, gamma):
    """:func:`lazy_pass` with the regularisation step applied to every weight at every
    step (O(d) per example): the baseline the lazy updates are measured against."""
    T = rows.shape[0]
    progressive = 0.0
    for t in range(T):
        r = rows[t]
        lo, hi = indptr[r], indptr[r + 1]
        z = b
        for q in range(lo, hi):
            z += data[q] * w[indices[q]]
        progressive += sw[r] * loss_value(loss, y[r], z, gamma)
        g = sw[r] * loss_derivative(loss, y[r], z, gamma)
        et = eta[t]
        for q in range(lo, hi):
            w[indices[q]] -= et * g * data[q]
        if fit_intercept:
            b -= et * g
        for j in range(w.shape[0]):
            w[j] = regularize(form, w[j], et, l1, l2)
    return b, progressive
