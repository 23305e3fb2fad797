"""SMIDAS passes against a dense NumPy transcription of Shalev-Shwartz & Tewari (2011),
Algorithm 3 with Eq. (12), and Theorem 3's bounds against a converged solver."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from dl1.kernels.smidas import smidas_eta, smidas_eta_smooth, smidas_p, smidas_pass
from tests.kernel_helpers import LOSS_CODES
from tests.kernels.row_reference import fista, loss_derivatives, loss_values, objective, problem

GAMMA = 0.5


def reference_smidas(Xd, y, sw, rows, eta, theta, b, fit_intercept, l1, p, loss):
    """Algorithm 3, densely: ``w = f^-1(theta)`` by Eq. (12) literally, the mirror step and
    the truncation of every coordinate."""
    theta = theta.copy()

    def link_inv(theta):
        norm = np.linalg.norm(theta, p)
        if norm == 0:
            return np.zeros_like(theta)
        return np.sign(theta) * np.abs(theta) ** (p - 1) / norm ** (p - 2)

    prog = 0.0
    for t, r in enumerate(rows):
        w = link_inv(theta)
        z = Xd[r] @ w + b
        prog += sw[r] * loss_values(loss, y[r], z, GAMMA)
        g = sw[r] * loss_derivatives(loss, y[r], z, GAMMA)
        v = g * Xd[r]
        tilde = theta - eta[t] * v
        theta = np.sign(tilde) * np.maximum(0.0, np.abs(tilde) - eta[t] * l1)
        if fit_intercept:
            b -= eta[t] * g
    return theta, link_inv(theta), b, prog


@pytest.mark.parametrize("start", ["zero", "warm"])
@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("p", ["2 ln d", 2.0, 3.5])
@pytest.mark.parametrize("loss", sorted(LOSS_CODES))
def test_smidas_pass_equals_dense_reference(loss, p, fit_intercept, start):
    """Pass: three shuffled epochs in two chained calls (theta carries the state) give the
    reference's theta, w, intercept and progressive loss to 1e-10; features enter and leave
    the support (l1 large enough to truncate many to 0)."""
    X, y, sw, rng = problem(loss, seed=12)
    Xd = X.toarray()
    d = X.shape[1]
    p = smidas_p(d) if p == "2 ln d" else p
    l1 = 0.02
    rows = np.concatenate([rng.permutation(X.shape[0]) for _ in range(3)]).astype(np.int64)
    eta = np.full(rows.size, 0.3)
    eta[::7] = 0.1  # any schedule
    theta0 = (np.zeros(d) if start == "zero"
              else rng.normal(0, 0.3, d) * (rng.random(d) < 0.4))
    et, ew, eb, eprog = reference_smidas(Xd, y, sw, rows, eta, theta0, 0.2, fit_intercept, l1,
                                         p, loss)
    theta, w, b, prog = theta0.copy(), np.empty(d), 0.2, 0.0
    for part in (slice(0, 50), slice(50, None)):
        b, pr = smidas_pass(X.indptr, X.indices, X.data, y, sw, rows[part], eta[part], theta, w,
                            b, fit_intercept, l1, p, LOSS_CODES[loss], GAMMA)
        prog += pr
    np.testing.assert_allclose(theta, et, rtol=0, atol=1e-10)
    np.testing.assert_allclose(w, ew, rtol=0, atol=1e-10)
    assert abs(b - eb) <= 1e-10
    assert abs(prog - eprog) <= 1e-10 * max(1.0, eprog)
    assert 0 < np.count_nonzero(theta) < d


def random_iterate_objectives(X, y, sw, rows, eta, l1, p, loss):
    """``P(w_r)`` for r = 0 .. T-1 (``w_0 = 0``): Theorem 3 bounds their mean, the
    expectation over the random output index r."""
    d = X.shape[1]
    theta, w = np.zeros(d), np.zeros(d)
    W = np.zeros((rows.size, d))
    for k in range(rows.size - 1):
        smidas_pass(X.indptr, X.indices, X.data, y, sw, rows[k:k + 1], eta[k:k + 1], theta, w,
                    0.0, False, l1, p, LOSS_CODES[loss], GAMMA)
        W[k + 1] = w
    Z = X @ W.T
    losses = (sw[:, None] * loss_values(loss, y[:, None], Z, GAMMA)).mean(axis=0)
    return losses + l1 * np.abs(W).sum(axis=1)


def test_logistic_meets_theorem_3_case_13():
    """Convergence (logistic, l1): with ``|x_ij| <= 1`` and ``|s L'| <= rho = max s``
    (Eq. (13)), the paper's ``eta = (B/rho) sqrt(2/((p-1) e T))``, ``B = |w*|_1``, and
    examples drawn uniformly with replacement, Theorem 3.1 bounds the mean over r of
    ``P(w_r) - P*`` by ``eta (p-1) rho^2 e / 2 + B^2 / (eta T)`` (O(1/sqrt(T))). It bounds
    the expectation; the bound is worst-case in rho, so one run sits below it."""
    X, y, sw, rng = problem("logistic", seed=13)
    Xd = X.toarray()
    assert X.data.max() <= 1.0
    l1 = 0.02
    ws, _ = fista(Xd, y, sw, l1, 0.0, "logistic", fit_intercept=False)
    fstar = objective(Xd, y, sw, ws, 0.0, l1, 0.0, "logistic")
    B, rho, p, T = np.abs(ws).sum(), sw.max(), smidas_p(X.shape[1]), 20_000
    eta = smidas_eta(B, rho, p, T)
    rows = rng.integers(0, X.shape[0], T).astype(np.int64)
    P = random_iterate_objectives(X, y, sw, rows, np.full(T, eta), l1, p, "logistic")
    bound = eta * (p - 1) * rho**2 * np.e / 2 + B**2 / (eta * T)
    assert np.all(P >= fstar - 1e-12)
    assert P.mean() - fstar <= bound


def test_squared_meets_theorem_3_case_14():
    """Convergence (squared loss ``(y - z)^2 / 2``, l1): ``(s L')^2 <= rho s L`` with
    ``rho = 2 max s`` (Eq. (14)); with the paper's eta for this case Theorem 3.2 bounds the
    mean of ``P(w_r) - P*`` by
    ``(1/(1 - c) - 1) P(0) + B^2 / (eta T (1 - c))``, ``c = eta (p-1) rho e / 2``."""
    X, y, sw, rng = problem("squared", seed=14)
    Xd = X.toarray()
    l1 = 0.05
    ws, _ = fista(Xd, y, sw, l1, 0.0, "squared", fit_intercept=False)
    fstar = objective(Xd, y, sw, ws, 0.0, l1, 0.0, "squared")
    P0 = objective(Xd, y, sw, np.zeros(X.shape[1]), 0.0, l1, 0.0, "squared")
    B, rho, p, T = np.abs(ws).sum(), 2 * sw.max(), smidas_p(X.shape[1]), 20_000
    eta = smidas_eta_smooth(B, rho, p, T, P0)
    c = eta * (p - 1) * rho * np.e / 2
    assert c < 1
    rows = rng.integers(0, X.shape[0], T).astype(np.int64)
    P = random_iterate_objectives(X, y, sw, rows, np.full(T, eta), l1, p, "squared")
    bound = (1 / (1 - c) - 1) * P0 + B**2 / (eta * T * (1 - c))
    assert np.all(P >= fstar - 1e-12)
    assert P.mean() - fstar <= bound


def test_link_is_the_inverse_of_the_q_norm_gradient():
    """Definition: ``f(w) = grad |w|_q^2/2`` applied to the kernel's ``w = f^-1(theta)``
    gives theta back (Eq. (12)), for ``p = 2 ln d``."""
    rng = np.random.default_rng(15)
    d = 50
    p = smidas_p(d)
    q = p / (p - 1)
    theta = rng.normal(size=d) * (rng.random(d) < 0.5)
    w = np.empty(d)
    X = np.zeros((1, d))
    Xs = sp.csr_matrix(X)
    smidas_pass(Xs.indptr, Xs.indices, Xs.data, np.zeros(1), np.ones(1),
                np.zeros(0, dtype=np.int64), np.zeros(0), theta, w, 0.0, False, 0.0, p,
                LOSS_CODES["squared"], GAMMA)
    f = np.sign(w) * np.abs(w) ** (q - 1) / np.linalg.norm(w, q) ** (q - 2)
    np.testing.assert_allclose(f, theta, rtol=1e-10, atol=1e-12)
