"""Prox-SDCA local epochs against a dense NumPy transcription of the Procedure Prox-SDCA
(Shalev-Shwartz & Zhang 2012, Fig. 1, Option I; Sec. 3.1's g), duality certificates and a
converged reference (scikit-learn / a test-local FISTA)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import brentq, minimize_scalar
from sklearn.linear_model import ElasticNet, Lasso

from dl1.kernels.sdca import (
    dual_loss,
    dual_objective,
    dual_step,
    lasso_ridge,
    primal_from_dual,
    sdca_epoch,
)
from tests.kernel_helpers import LOSS_CODES
from tests.kernels.row_reference import fista, loss_values, objective, problem

GAMMA = 0.5  # smoothing of the smoothed hinge


def neg_conjugate(loss, y, a, s, gamma=GAMMA):
    """``-phi*(-a)`` for ``phi = s loss(y, .)``, in alpha units (written independently of
    the kernel's beta units)."""
    if loss == "squared":
        return a * y - a * a / (2 * s)
    c = y * a / s
    assert -1e-9 <= c <= 1 + 1e-9, c
    c = min(max(c, 0.0), 1.0)
    if loss == "logistic":
        return -s * sum(p * np.log(p) for p in (c, 1 - c) if p > 0)
    if loss == "hinge":
        return y * a
    return y * a - gamma * a * a / (2 * s)


def option_one(loss, y, s, a, z, q, gamma=GAMMA):
    """argmax_Delta of ``-phi*(-(a + Delta)) - z Delta - q Delta^2 / 2`` (Fig. 1, Option I),
    by the first-order condition in alpha units."""
    if loss == "squared":
        return (s * (y - z) - a) / (1 + q * s)
    if loss in ("hinge", "smooth_hinge"):
        g = gamma if loss == "smooth_hinge" else 0.0
        new = y * a + (1 - y * z - g * y * a / s) / (g / s + q)
        return y * np.clip(new, 0.0, s) - a

    def cond(c):  # d/dDelta with c = y (a + Delta) / s
        return np.log((1 - c) / c) - y * z - q * (s * c - y * a)

    c = brentq(cond, 1e-300, 1 - 1e-16, xtol=1e-300, rtol=1e-15, maxiter=500)
    return y * s * c - a


def reference_epoch(Xd, y, sw, rows, alpha, v, vb, n, l1, l2, sp, fit_intercept, kappa, loss):
    """Fig. 1 with w = grad g*(v) of Sec. 3.1, on the local point ``v + sigma' u``."""
    alpha = alpha.copy()
    start = alpha.copy()
    kap = kappa if fit_intercept else 0.0
    vloc, vbloc = v.copy(), vb
    prog = 0.0
    for r in rows:
        w = np.sign(vloc) * np.maximum(np.abs(vloc) - l1 / l2, 0.0)
        z = Xd[r] @ w + kap * vbloc
        prog += sw[r] * loss_values(loss, y[r], z, GAMMA)
        q = sp * (Xd[r] @ Xd[r] + kap * kap) / (l2 * n)
        delta = option_one(loss, y[r], sw[r], alpha[r], z, q)
        alpha[r] += delta
        vloc = vloc + sp * delta * Xd[r] / (l2 * n)
        vbloc += sp * delta * kap / (l2 * n)
    return alpha - start, (vloc - v) / sp, (vbloc - vb) / sp, prog


def feasible_alpha(loss, y, sw, rng):
    if loss == "squared":
        return rng.normal(0, 0.5, y.size)
    return sw * y * rng.uniform(0, 1, y.size)


def dual_state(Xd, alpha, l2, n, kappa):
    return Xd.T @ alpha / (l2 * n), kappa * alpha.sum() / (l2 * n)


@pytest.mark.parametrize("sigma_prime", [1.0, 2.5])
@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("penalty", [(0.02, 0.05), (0.0, 0.1)])
@pytest.mark.parametrize("loss", sorted(LOSS_CODES))
def test_sdca_epoch_equals_dense_reference(loss, penalty, fit_intercept, sigma_prime):
    """Local epochs: three shuffled epochs from a random feasible alpha give the reference's
    delta_alpha, delta_v, delta_vb and progressive loss to 1e-10."""
    X, y, sw, rng = problem(loss, seed=4)
    Xd = X.toarray()
    n = X.shape[0]
    l1, l2 = penalty
    kappa = 1.3
    alpha = feasible_alpha(loss, y, sw, rng)
    v, vb = dual_state(Xd, alpha, l2, n, kappa if fit_intercept else 0.0)
    rows = np.concatenate([rng.permutation(n) for _ in range(3)]).astype(np.int64)
    ea, ev, evb, eprog = reference_epoch(Xd, y, sw, rows, alpha, v, vb, n, l1, l2, sigma_prime,
                                         fit_intercept, kappa, loss)
    da, dv, dvb, prog = sdca_epoch(X.indptr, X.indices, X.data, y, sw, rows, alpha, v, vb, n,
                                   l1, l2, sigma_prime, fit_intercept, kappa, LOSS_CODES[loss],
                                   GAMMA)
    np.testing.assert_allclose(da, ea, rtol=0, atol=1e-10)
    np.testing.assert_allclose(dv, ev, rtol=0, atol=1e-10)
    assert abs(dvb - evb) <= 1e-10
    assert abs(prog - eprog) <= 1e-10 * max(1.0, eprog)
    # delta_v is (1/(lambda n)) sum delta_alpha_i x_i
    np.testing.assert_allclose(dv, Xd.T @ da / (l2 * n), rtol=0, atol=1e-12)


@pytest.mark.parametrize("loss", sorted(LOSS_CODES))
def test_dual_step_maximises_option_one(loss):
    """Definition: the kernel's dual step attains the maximum of Option I's objective
    (compared with a bounded scalar maximisation over the feasible interval)."""
    rng = np.random.default_rng(5)
    for _ in range(100):
        y = rng.choice([-1.0, 1.0]) if loss != "squared" else rng.normal()
        s, z, q = rng.uniform(0.2, 2), rng.normal(0, 2), rng.choice([0.0, rng.uniform(0, 5)])
        if loss == "logistic" and q == 0.0:
            q = 1e-3
        a = feasible_alpha(loss, np.array([y]), np.array([s]), rng)[0]
        beta_new = dual_step(LOSS_CODES[loss], y, z, a / s, s * q, GAMMA)
        mine = s * beta_new - a

        def neg(delta, y=y, s=s, z=z, q=q, a=a):
            return -(neg_conjugate(loss, y, a + delta, s) - z * delta - 0.5 * q * delta * delta)

        if loss == "squared":
            box = (-50.0, 50.0)
        else:  # feasible: y (a + delta) in [0, s]
            box = tuple(sorted((-a, y * s - a)))
        if loss == "hinge" and q == 0.0:  # linear: an end of the interval
            best = min(box, key=neg)
        else:
            best = minimize_scalar(neg, bounds=box, method="bounded",
                                   options={"xatol": 1e-13}).x
        assert -neg(mine) >= -neg(best) - 1e-11


def primal_tilde(Xd, y, sw, w, b, l1, l2, loss, kappa):
    """``P~ = P + lambda b^2 / (2 kappa^2)``: the problem the intercept-as-feature solves."""
    br = l2 / kappa**2 if kappa else 0.0
    return objective(Xd, y, sw, w, b, l1, l2, loss, GAMMA, b_ridge=br)


def run_sdca(X, y, sw, l1, l2, loss, fit_intercept, kappa, epochs, seed=0, check=None):
    n, d = X.shape
    rng = np.random.default_rng(seed)
    alpha, v, vb = np.zeros(n), np.zeros(d), 0.0
    for _ in range(epochs):
        rows = rng.permutation(n).astype(np.int64)
        da, dv, dvb, _ = sdca_epoch(X.indptr, X.indices, X.data, y, sw, rows, alpha, v, vb, n,
                                    l1, l2, 1.0, fit_intercept, kappa, LOSS_CODES[loss], GAMMA)
        alpha += da
        v += dv
        vb += dvb
        if check is not None:
            check(alpha, v, vb)
    return alpha, v, vb


def gap_checker(Xd, y, sw, l1, l2, loss, kappa, record):
    def check(alpha, v, vb):
        w, b = primal_from_dual(v, vb, l1, l2, kappa)
        P = primal_tilde(Xd, y, sw, w, b, l1, l2, loss, kappa)
        D = dual_objective(y, sw, alpha, v, vb, l1, l2, LOSS_CODES[loss], GAMMA)
        assert P >= D - 1e-12 * max(1.0, abs(P)), (P, D)  # weak duality
        record.append((P - D) / abs(P))
    return check


def test_squared_elastic_net_gap_closes_and_matches_sklearn():
    """Convergence (squared loss, elastic net, no intercept): weak duality at every epoch;
    the relative gap falls below 1e-8 (Theorem 1: linear rate for a 1-smooth loss, about
    ``(n + R^2 / lambda) log(1/eps)`` steps, i.e. a few dozen epochs here; 150 are run) and
    w equals scikit-learn's ElasticNet (same objective with alpha, l1_ratio, sample weights
    summing to n) to 1e-6."""
    X, y, sw, _ = problem("squared", seed=6)
    Xd = X.toarray()
    alpha_, l1_ratio = 0.05, 0.6
    l1, l2 = alpha_ * l1_ratio, alpha_ * (1 - l1_ratio)
    gaps = []
    alpha, v, vb = run_sdca(X, y, sw, l1, l2, "squared", False, 0.0, 150,
                            check=gap_checker(Xd, y, sw, l1, l2, "squared", 0.0, gaps))
    assert gaps[-1] <= 1e-8
    w, _ = primal_from_dual(v, vb, l1, l2)
    sk = ElasticNet(alpha=alpha_, l1_ratio=l1_ratio, fit_intercept=False, tol=1e-14,
                    max_iter=1_000_000).fit(Xd, y, sample_weight=sw)
    np.testing.assert_allclose(w, sk.coef_, rtol=0, atol=1e-6)


@pytest.mark.parametrize("loss", ["logistic", "smooth_hinge", "squared"])
def test_gap_closes_with_intercept_and_matches_fista(loss):
    """Convergence with the intercept as a constant feature (kappa = 1): weak duality at
    every epoch, relative gap <= 1e-8 after 300 epochs (Theorem 1's linear rate for smooth
    losses: ``1/gamma``-smooth with gamma = 4 (logistic), 0.5, 1; ``R^2 <= 1 + max |x_i|^2``)
    and (w, b) equal to FISTA on ``P~ = P + l2 b^2 / 2`` to 1e-6."""
    X, y, sw, _ = problem(loss, seed=7)
    Xd = X.toarray()
    l1, l2 = 0.01, 0.05
    gaps = []
    alpha, v, vb = run_sdca(X, y, sw, l1, l2, loss, True, 1.0, 300,
                            check=gap_checker(Xd, y, sw, l1, l2, loss, 1.0, gaps))
    assert gaps[-1] <= 1e-8
    w, b = primal_from_dual(v, vb, l1, l2, 1.0)
    wf, bf = fista(Xd, y, sw, l1, l2, loss, GAMMA, fit_intercept=True, b_ridge=l2)
    np.testing.assert_allclose(w, wf, rtol=0, atol=1e-6)
    assert abs(b - bf) <= 1e-6


def test_hinge_keeps_weak_duality_and_the_gap_shrinks():
    """Non-smooth loss (hinge, Theorem 2: O(1/(lambda eps)) steps, sublinear): weak duality
    at every epoch and the gap after 200 epochs is below a tenth of the first epoch's."""
    X, y, sw, _ = problem("hinge", seed=8)
    Xd = X.toarray()
    gaps = []
    run_sdca(X, y, sw, 0.01, 0.05, "hinge", True, 1.0, 200,
             check=gap_checker(Xd, y, sw, 0.01, 0.05, "hinge", 1.0, gaps))
    assert gaps[-1] <= 0.1 * gaps[0]


def test_lasso_through_the_papers_added_ridge():
    """Sec. 3.1: for a pure Lasso, lambda = eps / B^2 with B = P(0)/l1; Prox-SDCA run to a
    gap <= eps/2 on the ridged problem gives a Lasso objective within eps of scikit-learn's
    Lasso optimum."""
    X, y, sw, _ = problem("squared", seed=9)
    Xd = X.toarray()
    n = X.shape[0]
    l1, eps = 0.05, 1e-2
    p0 = np.mean(sw * 0.5 * y * y)
    lam = lasso_ridge(eps, l1, p0)
    assert lam == pytest.approx(eps * (l1 / p0) ** 2)
    rng = np.random.default_rng(0)
    alpha, v = np.zeros(n), np.zeros(X.shape[1])
    for _ in range(5000):
        da, dv, _, _ = sdca_epoch(X.indptr, X.indices, X.data, y, sw,
                                  rng.permutation(n).astype(np.int64), alpha, v, 0.0, n, l1,
                                  lam, 1.0, False, 0.0, LOSS_CODES["squared"], GAMMA)
        alpha += da
        v += dv
        w, _ = primal_from_dual(v, 0.0, l1, lam)
        gap = (objective(Xd, y, sw, w, 0.0, l1, lam, "squared")
               - dual_objective(y, sw, alpha, v, 0.0, l1, lam, LOSS_CODES["squared"], GAMMA))
        if gap <= eps / 2:
            break
    assert gap <= eps / 2
    sk = Lasso(alpha=l1, fit_intercept=False, tol=1e-14, max_iter=1_000_000).fit(
        Xd, y, sample_weight=sw)
    lasso_star = objective(Xd, y, sw, sk.coef_, 0.0, l1, 0.0, "squared")
    assert objective(Xd, y, sw, w, 0.0, l1, 0.0, "squared") - lasso_star <= eps


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_cocoa_blocks_added_with_sigma_prime_k_never_decrease_the_dual(loss):
    """CoCoA+: two blocks run from the same (alpha, v) with sigma' = K = 2, their updates
    added, increase D (the module docstring's convexity bound) round after round; with
    sigma' = 1 a single block is sequential Prox-SDCA (covered by the reference test)."""
    X, y, sw, rng = problem(loss, seed=10)
    Xd = X.toarray()
    n, d = X.shape
    l1, l2 = 0.01, 0.05
    blocks = [np.arange(0, 25), np.arange(25, n)]
    alpha, v, vb = np.zeros(n), np.zeros(d), 0.0
    D_old = dual_objective(y, sw, alpha, v, vb, l1, l2, LOSS_CODES[loss], GAMMA)
    for _ in range(30):
        total_da, total_dv, total_dvb = np.zeros(n), np.zeros(d), 0.0
        for rows_k in blocks:
            Xk = X[rows_k]
            local = np.concatenate([rng.permutation(rows_k.size) for _ in range(2)])
            da, dv, dvb, _ = sdca_epoch(Xk.indptr, Xk.indices, Xk.data, y[rows_k], sw[rows_k],
                                        local.astype(np.int64), alpha[rows_k], v, vb, n, l1, l2,
                                        2.0, True, 1.0, LOSS_CODES[loss], GAMMA)
            total_da[rows_k] += da
            total_dv += dv
            total_dvb += dvb
        alpha += total_da
        v += total_dv
        vb += total_dvb
        D_new = dual_objective(y, sw, alpha, v, vb, l1, l2, LOSS_CODES[loss], GAMMA)
        assert D_new >= D_old - 1e-13
        D_old = D_new
    np.testing.assert_allclose(v, Xd.T @ alpha / (l2 * n), rtol=0, atol=1e-12)
    w, b = primal_from_dual(v, vb, l1, l2, 1.0)
    P = primal_tilde(Xd, y, sw, w, b, l1, l2, loss, 1.0)
    assert P >= D_old and (P - D_old) / P <= 1e-3


def test_dual_loss_is_minus_the_conjugate():
    """Definition: ``-phi*(-a) = min_z [phi(z) + a z]`` (Fenchel), checked numerically for
    each loss at feasible a, and -inf outside the domain."""
    rng = np.random.default_rng(11)
    for loss in sorted(LOSS_CODES):
        for _ in range(20):
            y = rng.choice([-1.0, 1.0]) if loss != "squared" else rng.normal()
            s = rng.uniform(0.3, 2)
            a = feasible_alpha(loss, np.array([y]), np.array([s]), rng)[0]

            def f(z, y=y, s=s, a=a, loss=loss):
                return s * loss_values(loss, y, z, GAMMA) + a * z

            zs = np.linspace(-60, 60, 240_001)
            num = f(zs).min()
            assert dual_loss(LOSS_CODES[loss], y, a, s, GAMMA) == pytest.approx(num, abs=1e-6)
            assert neg_conjugate(loss, y, a, s) == pytest.approx(num, abs=1e-6)
        if loss != "squared":
            assert dual_loss(LOSS_CODES[loss], 1.0, -0.1, 1.0, GAMMA) == -np.inf


@pytest.mark.parametrize("loss", sorted(LOSS_CODES))
def test_zero_weight_rows_keep_a_zero_dual_variable(loss):
    """Sample weights: a row with s_i = 0 has phi_i = 0, whose conjugate forces alpha_i = 0;
    the kernel skips it, so the epoch equals one over the other rows only."""
    X, y, sw, rng = problem(loss, seed=16)
    n, d = X.shape
    sw = sw.copy()
    zero = np.array([3, 17, 40])
    sw[zero] = 0.0
    rows = np.concatenate([rng.permutation(n) for _ in range(2)]).astype(np.int64)
    args = (np.zeros(n), np.zeros(d), 0.0, n, 0.01, 0.05, 1.0, True, 1.0, LOSS_CODES[loss],
            GAMMA)
    da, dv, dvb, _ = sdca_epoch(X.indptr, X.indices, X.data, y, sw, rows, *args)
    kept = rows[~np.isin(rows, zero)]
    da2, dv2, dvb2, _ = sdca_epoch(X.indptr, X.indices, X.data, y, sw, kept, *args)
    assert np.all(da[zero] == 0.0)
    np.testing.assert_array_equal(da, da2)
    np.testing.assert_array_equal(dv, dv2)
    assert dvb == dvb2
    assert dual_loss(LOSS_CODES[loss], y[3], 0.0, 0.0, GAMMA) == 0.0
