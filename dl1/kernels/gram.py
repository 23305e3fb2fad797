"""Coordinate descent on a Gram matrix (covariance updates) for the squared loss.

For a working set of ``m`` columns with ``Q = X_W^T (S - s s^T / sum(s)) X_W / n`` (the
intercept profiled out) and ``h = -grad F(w)``, coordinate ``j`` is minimised exactly and ``h``
kept current with one row of ``Q``: an epoch costs ``O(m * changes)`` instead of the nonzeros
of ``X_W`` (Friedman, Hastie & Tibshirani, "Regularization paths for generalized linear
models via coordinate descent", J. Stat. Softw. 2010, Sec. 2.2, covariance updates).
"""

from __future__ import annotations

from numba import njit

from dl1.kernels.cd import soft_threshold


@njit(nogil=True, cache=True)
def gram_cd_epochs(Q, h, w, alpha_l1, alpha_l2, n_epochs):  # pragma: no cover - compiled
    """Cyclic coordinate-descent epochs with covariance updates.

    Parameters
    ----------
    Q : ndarray of float64, shape (m, m), C-contiguous, symmetric
        Hessian of the datafit on the working set.
    h : ndarray of float64, shape (m,)
        ``-grad F`` at ``w``; updated in place.
    w : ndarray of float64, shape (m,)
        Coefficients; updated in place.
    alpha_l1, alpha_l2 : float
        Penalty ``alpha_l1 |w_j| + alpha_l2 / 2 w_j^2``.
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
            new = soft_threshold(L * old + h[j], alpha_l1) / (L + alpha_l2)
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
