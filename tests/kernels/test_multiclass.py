"""The multiclass kernels against NumPy references."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.special import logsumexp, softmax

from dl1.kernels.multiclass import (
    REPAIR_SLACK,
    csc_mat_add,
    csc_xt_mat,
    group_prox_diag,
    mc_intercept_step,
    mc_loss_along,
    mc_model_epoch,
    mc_model_stats,
    repair_dual,
    softmax_rows,
)
from dl1.objective.datafits.multinomial import Multinomial, restore_class_sums


def _csc(n=40, p=12, seed=0):
    return sp.random(n, p, density=0.3, format="csc", random_state=seed)


def test_xt_mat_and_mat_add_match_numpy():
    X = _csc()
    rng = np.random.default_rng(1)
    M = rng.standard_normal((40, 5))
    out = np.empty((12, 5))
    csc_xt_mat(X.indptr, X.indices, X.data, M, out)
    np.testing.assert_allclose(out, X.T @ M, rtol=1e-13, atol=1e-13)
    W = rng.standard_normal((12, 5))
    Z = M.copy()
    csc_mat_add(X.indptr, X.indices, X.data, W, Z)
    np.testing.assert_allclose(Z, M + X @ W, rtol=1e-13, atol=1e-13)


def test_softmax_rows_match_scipy_without_overflow():
    Z = np.random.default_rng(2).standard_normal((30, 4)) * 400  # exp would overflow
    P, lse = np.empty_like(Z), np.empty(30)
    softmax_rows(Z, P, lse)
    np.testing.assert_allclose(P, softmax(Z, axis=1), rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(lse, logsumexp(Z, axis=1), rtol=1e-13)


class Model:
    """A proximal Newton model written densely: at probabilities ``P`` with sample weights
    ``s``, ``q(D) = <SG, D> + (1/2) sum_i s_i D_i^T (diag(p_i) - p_i p_i^T) D_i / n``."""

    def __init__(self, X, codes, seed, K=3, weighted=True):
        rng = np.random.default_rng(seed)
        n, m = X.shape
        self.X, self.codes = X, codes
        self.P = softmax(rng.standard_normal((n, K)), axis=1)
        self.s = rng.uniform(0, 2, n) if weighted else np.ones(n)
        self.SP = self.P * (self.s / n)[:, None]
        self.SG = self.SP - np.eye(K)[codes] * (self.s / n)[:, None]
        self.W = rng.standard_normal((m, K)) * (rng.random((m, K)) < 0.5)
        self.E = rng.uniform(0, 1e-3, (m, K))

    def hess_times(self, D):
        return self.SP * D - self.SP * (self.P * D).sum(axis=1, keepdims=True)

    def D(self, dW, db):
        return self.X @ dW + db

    def value(self, dW, db, pen):
        D = self.D(dW, db)
        quad = (self.SG * D).sum() + 0.5 * (D * self.hess_times(D)).sum()
        return quad + 0.5 * (self.E * dW * dW).sum() + pen(self.W + dW)

    def grad(self, dW, db):
        """The smooth part's gradient in ``dW`` and ``db``."""
        R = self.SG + self.hess_times(self.D(dW, db))
        return self.X.T @ R + self.E * dW, R.sum(axis=0)


def _elastic(a1, a2):
    return lambda W: a1 * np.abs(W).sum() + 0.5 * a2 * (W * W).sum()


def _grouped(a1, a2):
    return lambda W: a1 * np.linalg.norm(W, axis=1).sum() + 0.5 * a2 * (W * W).sum()


def test_model_stats_match_numpy():
    X = _csc(n=50, p=9, seed=5)
    mdl = Model(X, np.arange(50) % 3, seed=6)
    SPQ = mdl.SP * (1 - mdl.P)
    G0, C = np.empty((9, 3)), np.empty((9, 3))
    mc_model_stats(X.indptr, X.indices, X.data, mdl.SG, SPQ, G0, C)
    np.testing.assert_allclose(G0, X.T @ mdl.SG, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(C, X.multiply(X).T @ SPQ, rtol=1e-12, atol=1e-15)


def _run_epochs(X, mdl, a1, a2, grouped, epochs, intercept, reach=np.inf):
    """Epochs of the kernel from ``dW = 0`` (entries within ``reach`` of ``W``); returns
    ``(dW, dZ, db, r, falls)``."""
    n, K = mdl.P.shape
    m = X.shape[1]
    reach = np.full(m, reach)
    G0, C = np.empty((m, K)), np.empty((m, K))
    mc_model_stats(X.indptr, X.indices, X.data, mdl.SG,
                   mdl.SP if grouped else mdl.SP * (1 - mdl.P), G0, C)  # fmt: skip
    C += mdl.E
    Hb = np.diag(mdl.SP.sum(0)) - mdl.SP.T @ mdl.P + np.full((K, K), 1.0 / K)
    dW, dZ, db, r = np.zeros((m, K)), np.zeros((n, K)), np.zeros(K), np.zeros(n)
    order = np.arange(m, dtype=np.int64)
    visit = np.ones((m, K), dtype=np.bool_)
    falls = []
    for _ in range(epochs):
        fall = mc_model_epoch(X.indptr, X.indices.astype(np.int64), X.data, order, visit, mdl.SP,
                              mdl.P, G0, C, mdl.E, mdl.W, dW, dZ, r, a1, a2, grouped,
                              reach)  # fmt: skip
        if intercept:
            fall += mc_intercept_step(mdl.SG, mdl.SP, mdl.P, np.linalg.pinv(Hb), db, dZ, r)
        falls.append(fall)
    return dW, dZ, db, r, falls


def test_model_epochs_minimise_the_model_on_the_trust_region():
    """With ``reach``, coordinate descent converges to the model's minimiser on the box
    ``|dW| <= reach`` (an L-BFGS-B reference on the dense model, no L1 part so it is
    smooth), entries on the box's faces included, and each epoch's reported decrease is the
    model's."""
    from scipy.optimize import minimize

    X = _csc(n=80, p=12, seed=7)
    mdl = Model(X, np.arange(80) % 3, seed=8)
    a2 = 1e-3
    free = _run_epochs(X, mdl, 0.0, a2, False, 3000, False)[0]
    reach = 0.3 * np.abs(free).max()
    dW, dZ, _, _, falls = _run_epochs(X, mdl, 0.0, a2, False, 3000, False, reach)
    assert np.abs(dW).max() <= reach * (1 + 1e-12)
    assert (np.abs(dW) >= reach * (1 - 1e-9)).sum() >= 2  # the box binds
    pen = _elastic(0.0, a2)

    def f(v):
        dWv = v.reshape(dW.shape)
        g = mdl.grad(dWv, np.zeros(3))[0] + a2 * (mdl.W + dWv)
        return mdl.value(dWv, np.zeros(3), pen), g.ravel()

    ref = minimize(f, np.zeros(dW.size), jac=True, method="L-BFGS-B",
                   bounds=[(-reach, reach)] * dW.size,
                   options={"ftol": 1e-15, "gtol": 1e-13, "maxiter": 20000}).x  # fmt: skip
    np.testing.assert_allclose(dW.ravel(), ref, atol=1e-6 * reach)
    before = mdl.value(np.zeros_like(dW), np.zeros(3), pen)
    assert before - mdl.value(dW, np.zeros(3), pen) == pytest.approx(sum(falls), rel=1e-9)


@pytest.mark.parametrize("intercept", [False, True])
@pytest.mark.parametrize("grouped", [False, True])
def test_an_epoch_tracks_its_step_and_lowers_the_model_by_what_it_reports(grouped, intercept):
    X = _csc(n=60, p=10, seed=3)
    mdl = Model(X, np.arange(60) % 3, seed=4)
    a1, a2 = 2e-3, 1e-3
    pen = (_grouped if grouped else _elastic)(a1, a2)
    before = mdl.value(np.zeros((10, 3)), np.zeros(3), pen)
    dW, dZ, db, r, falls = _run_epochs(X, mdl, a1, a2, grouped, 1, intercept)
    np.testing.assert_allclose(dZ, mdl.D(dW, db), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(r, (mdl.P * dZ).sum(axis=1), rtol=1e-12, atol=1e-14)
    drop = before - mdl.value(dW, db, pen)
    assert falls[0] > 0
    if grouped:  # the majoriser's decrease: a lower bound of the model's
        assert drop >= falls[0] * (1 - 1e-10)
    else:
        assert drop == pytest.approx(falls[0], rel=1e-9)


@pytest.mark.parametrize("grouped", [False, True])
def test_model_epochs_converge_to_the_models_minimiser(grouped):
    """At convergence the step satisfies the model's optimality conditions, written with
    the dense Hessian: the penalty's subgradient balances the gradient."""
    X = _csc(n=80, p=12, seed=7)
    mdl = Model(X, np.arange(80) % 3, seed=8)
    a1, a2 = (8e-3 if grouped else 3e-3), 1e-3
    dW, dZ, db, r, _ = _run_epochs(X, mdl, a1, a2, grouped, 3000, True)
    g, gb = mdl.grad(dW, db)
    W = mdl.W + dW
    np.testing.assert_allclose(gb, 0, atol=1e-12)
    if grouped:
        norms = np.linalg.norm(W, axis=1)
        on = norms > 0
        resid = g[on] + a1 * W[on] / norms[on, None] + a2 * W[on]
        np.testing.assert_allclose(resid, 0, atol=1e-10)
        assert (np.linalg.norm(g[~on], axis=1) <= a1 * (1 + 1e-9)).all()
        assert on.any() and (~on).any()
    else:
        on = W != 0
        np.testing.assert_allclose((g + a1 * np.sign(W) + a2 * W)[on], 0, atol=1e-10)
        assert (np.abs(g[~on]) <= a1 * (1 + 1e-9)).all()
        assert on.any() and (~on).any()


@pytest.mark.parametrize("seed", range(5))
def test_group_prox_in_a_diagonal_metric_meets_its_optimality_conditions(seed):
    rng = np.random.default_rng(seed)
    K = 6
    u = rng.standard_normal(K)
    h = rng.uniform(0.01, 5, K)  # curvatures spread over orders of magnitude
    a2 = 0.3
    out = np.empty(K)
    a1 = 0.5 * np.linalg.norm(h * u)  # a group that stays in
    group_prox_diag(u, h, a1, a2, out)
    norm = np.linalg.norm(out)
    assert norm > 0
    np.testing.assert_allclose(h * (out - u) + a1 * out / norm + a2 * out, 0, atol=1e-12)
    group_prox_diag(u, h, 1.01 * np.linalg.norm(h * u), a2, out)  # one that goes out
    assert not out.any()


def test_loss_along_matches_scipy():
    rng = np.random.default_rng(9)
    Z, dZ = rng.standard_normal((40, 4)) * 300, rng.standard_normal((40, 4))
    codes = rng.integers(0, 4, 40)
    s = rng.uniform(0, 2, 40)
    Zt = Z + 0.3 * dZ
    ce = logsumexp(Zt, axis=1) - Zt[np.arange(40), codes]
    assert mc_loss_along(Z, dZ, 0.3, codes, s) == pytest.approx(s @ ce / 40, rel=1e-13)
    assert mc_loss_along(Z, dZ, 0.3, codes, np.zeros(0)) == pytest.approx(ce.mean(), rel=1e-13)


def test_an_epoch_moves_only_the_entries_it_visits():
    X = _csc(n=60, p=10, seed=12)
    mdl = Model(X, np.arange(60) % 3, seed=13)
    G0, C = np.empty((10, 3)), np.empty((10, 3))
    mc_model_stats(X.indptr, X.indices, X.data, mdl.SG, mdl.SP * (1 - mdl.P), G0, C)
    C += mdl.E
    visit = np.random.default_rng(14).random((10, 3)) < 0.4
    dW, dZ, r = np.zeros((10, 3)), np.zeros((60, 3)), np.zeros(60)
    order = np.arange(10, dtype=np.int64)
    mc_model_epoch(X.indptr, X.indices.astype(np.int64), X.data, order, visit, mdl.SP, mdl.P,
                   G0, C, mdl.E, mdl.W, dW, dZ, r, 1e-4, 0.0, False,
                   np.full(10, np.inf))  # fmt: skip
    assert not dW[~visit].any() and dW[visit].any()
    np.testing.assert_allclose(dZ, X @ dW, rtol=1e-12, atol=1e-14)


def _repair_reference(X, codes, s, Q, lam, sweeps):
    """One entry at a time, as the kernel orders them: the entries over ``lam`` at a
    sweep's start, each re-read and brought to ``lam`` by the rows that lower it."""
    Q = Q.copy()
    K = Q.shape[1]
    Y = np.eye(K)[codes]
    for _ in range(sweeps):
        V = X.T @ (s[:, None] * (Y - Q))
        for j, k in np.argwhere(np.abs(V) > lam * (1 + REPAIR_SLACK)):
            rows = X.indices[X.indptr[j]:X.indptr[j + 1]]
            x = X.data[X.indptr[j]:X.indptr[j + 1]] * s[rows]
            v = x @ (Y[rows, k] - Q[rows, k])
            if abs(v) <= lam * (1 + REPAIR_SLACK):
                continue
            sx = np.sign(v) * x
            mine, other = (codes[rows] == k) & (sx > 0), (codes[rows] != k) & (sx < 0)
            give = sx[mine] @ (1 - Q[rows[mine], k]) - sx[other] @ Q[rows[other], k]
            cut = min((abs(v) - lam) / give, 1.0)
            for i in rows[mine]:
                off = np.arange(K) != k
                Q[i, off] *= 1 - cut
                Q[i, k] = 1 - Q[i, off].sum()
            for i in rows[other]:
                Q[i, codes[i]] += cut * Q[i, k]
                Q[i, k] -= cut * Q[i, k]
    return Q


def _repair_problem(weighted, n=80, p=15, K=4):
    X = sp.random(n, p, density=0.3, format="csc", random_state=21)
    X.data -= 0.3  # both signs: only the rows that lower |v| give
    rng = np.random.default_rng(22)
    codes = np.arange(n) % K
    s = rng.uniform(0.2, 2.0, n) if weighted else np.ones(n)
    P = softmax(rng.standard_normal((n, K)), axis=1)
    V0 = X.T @ (s[:, None] * (np.eye(K)[codes] - P))
    return X, codes, s, P, V0, 0.5 * np.abs(V0).max()


@pytest.mark.parametrize("weighted", [False, True])
def test_repair_dual_matches_numpy_and_makes_the_dual_point_feasible(weighted):
    X, codes, s, P, V0, lam = _repair_problem(weighted)
    sw = s if weighted else np.zeros(0)
    idx = X.indices.astype(np.int64)
    out = np.empty(V0.shape)
    Q = P.copy()
    repair_dual(X.indptr, idx, X.data, codes, sw, Q, lam, 0, out)  # no sweep: V of P
    np.testing.assert_array_equal(Q, P)
    np.testing.assert_allclose(out, V0, rtol=1e-12, atol=1e-13)
    for sweeps in (1, 3):
        Q = P.copy()
        repair_dual(X.indptr, idx, X.data, codes, sw, Q, lam, sweeps, out)
        np.testing.assert_allclose(Q, _repair_reference(X, codes, s, P, lam, sweeps),
                                   rtol=1e-12, atol=1e-15)  # fmt: skip
        assert (Q >= 0).all() and np.allclose(Q.sum(axis=1), 1.0, rtol=0, atol=1e-14)
        V = X.T @ (s[:, None] * (np.eye(4)[codes] - Q))
        np.testing.assert_allclose(out, V, rtol=1e-12, atol=1e-13)
    # what one repair shifts elsewhere, the next sweeps take back
    assert np.abs(V).max() < np.abs(V0).max() and np.abs(V).max() <= lam * 1.05


@pytest.mark.parametrize("weighted", [False, True])
def test_repaired_with_an_intercept_keeps_the_classes_sums_at_zero(weighted):
    """At an optimal intercept the classes' sums of ``S (Y - P)`` are 0; a repair of a few
    violations moves them and the restoration brings them back, rows still on the simplex.
    Sums far from 0 cannot be restored (the caller then keeps ``P``)."""
    X, codes, s, P, V0, lam = _repair_problem(weighted)
    Y = np.eye(4)[codes]
    Z, _ = Multinomial().fit_intercept(codes, np.log(P), np.zeros(4), s * 80 / s.sum())
    P = softmax(Z, axis=1)  # at the optimal intercept: the classes' sums are 0
    np.testing.assert_allclose(s @ (Y - P), 0.0, atol=1e-12)
    before = np.abs(X.T @ (s[:, None] * (Y - P))).max()
    sw = s if weighted else None
    cols = (X.indptr, X.indices, X.data)
    Q, V = Multinomial.repaired(codes, P, cols, 0.9 * before, sw, intercept=True)
    assert not np.array_equal(Q, P)  # repaired, not given up
    assert (Q >= 0).all() and np.allclose(Q.sum(axis=1), 1.0, rtol=0, atol=1e-14)
    np.testing.assert_allclose(s @ (Y - Q), 0.0, atol=1e-12)
    np.testing.assert_allclose(V, X.T @ (s[:, None] * (Y - Q)), rtol=1e-12, atol=1e-13)
    assert np.abs(V).max() < before
    # far from an optimal intercept (random probabilities) no scaling restores the sums
    assert restore_class_sums(codes, _repair_problem(weighted)[3], sw) is None
