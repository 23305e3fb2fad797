"""Dense NumPy helpers shared by the sample-wise kernel tests (RDA, SMIDAS, Prox-SDCA):
the objective, the losses and a test-local proximal-gradient solver (FISTA) run to
convergence, independent of every kernel."""

from __future__ import annotations

import numpy as np

from tests.helpers import random_csr


def loss_values(loss: str, y, z, gamma: float = 1.0):
    """Per-example losses, in NumPy (squared ``(y - z)^2 / 2``, logistic, hinge, smoothed
    hinge of Shalev-Shwartz & Zhang)."""
    if loss == "squared":
        return 0.5 * (y - z) ** 2
    m = y * z
    if loss == "logistic":
        return np.logaddexp(0.0, -m)
    if loss == "hinge":
        return np.maximum(0.0, 1.0 - m)
    return np.where(m >= 1, 0.0, np.where(m <= 1 - gamma, 1 - m - gamma / 2,
                                          (1 - m) ** 2 / (2 * gamma)))


def loss_derivatives(loss: str, y, z, gamma: float = 1.0):
    if loss == "squared":
        return z - y
    m = y * z
    if loss == "logistic":
        return -y / (1.0 + np.exp(m))
    if loss == "hinge":
        return np.where(m < 1, -y, 0.0)
    return np.where(m >= 1, 0.0, np.where(m <= 1 - gamma, -y, -y * (1 - m) / gamma))


def objective(Xd, y, sw, w, b, l1, l2, loss, gamma=1.0, b_ridge=0.0):
    """``(1/n) sum s_i loss(y_i, x_i.w + b) + l1 |w|_1 + l2/2 |w|^2 (+ b_ridge/2 b^2)``."""
    z = Xd @ w + b
    return (np.mean(sw * loss_values(loss, y, z, gamma)) + l1 * np.abs(w).sum()
            + 0.5 * l2 * w @ w + 0.5 * b_ridge * b * b)


def fista(Xd, y, sw, l1, l2, loss, gamma=1.0, fit_intercept=True, b_ridge=0.0,
          max_iter=200_000, tol=1e-15):
    """Accelerated proximal gradient (Beck & Teboulle) on :func:`objective` for a smooth
    loss, with restart on objective increase, run until the iterates stop moving."""
    n, d = Xd.shape
    curv = {"squared": 1.0, "logistic": 0.25, "smooth_hinge": 1.0 / gamma}[loss]
    Xa = np.hstack([Xd, np.ones((n, 1))]) if fit_intercept else Xd
    L = curv * sw.max() * np.linalg.norm(Xa, 2) ** 2 / n + l2 + b_ridge
    step = 1.0 / L
    x = np.zeros(d + 1)
    yk, tk = x.copy(), 1.0
    f_old = np.inf
    for _ in range(max_iter):
        w, b = yk[:d], yk[d]
        gz = sw * loss_derivatives(loss, y, Xd @ w + b, gamma) / n
        grad = np.empty(d + 1)
        grad[:d] = Xd.T @ gz + l2 * w
        grad[d] = gz.sum() + b_ridge * b if fit_intercept else 0.0
        new = yk - step * grad
        new[:d] = np.sign(new[:d]) * np.maximum(np.abs(new[:d]) - step * l1, 0.0)
        f_new = objective(Xd, y, sw, new[:d], new[d], l1, l2, loss, gamma, b_ridge)
        if f_new > f_old:  # restart the momentum
            yk, tk = x.copy(), 1.0
            f_old = np.inf
            continue
        t_next = 0.5 * (1 + np.sqrt(1 + 4 * tk * tk))
        yk = new + (tk - 1) / t_next * (new - x)
        moved = np.abs(new - x).max()
        x, tk, f_old = new, t_next, f_new
        if moved <= tol:
            break
    return x[:d].copy(), float(x[d])


def problem(loss: str, seed: int = 0, n: int = 60, p: int = 40, density: float = 0.15):
    """Random CSR rows, targets for ``loss`` and sample weights normalised to sum to n."""
    X = random_csr(n, p, density, seed=seed)
    rng = np.random.default_rng(seed)
    z = X @ rng.standard_normal(p)
    if loss == "squared":
        y = z + 0.1 * rng.standard_normal(n)
    else:
        y = np.where(z + 0.3 * rng.standard_normal(n) > 0, 1.0, -1.0)
    sw = rng.uniform(0.5, 1.5, n)
    sw *= n / sw.sum()
    return X, y, sw, rng
