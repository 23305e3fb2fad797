"""Poisson and Huber: each datafit against its definition, and fits and paths against an
independent reference (a dense accelerated proximal-gradient solver written here, and
scikit-learn's PoissonRegressor where its objective is the same), in process, in one
piece and distributed, in memory and out of core."""

from __future__ import annotations

import dask
import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import minimize_scalar

import dl1
from dl1.errors import ValidationError
from dl1.objective.datafits import Huber, Poisson

EPS = 0.8


def loss_poisson(y, z):
    return np.exp(z) - y * z


def loss_huber(y, z, eps=EPS):
    r = np.abs(y - z)
    return np.where(r <= eps, 0.5 * r * r, eps * r - 0.5 * eps * eps)


def grad_poisson(y, z):
    return np.exp(z) - y


def grad_huber(y, z, eps=EPS):
    return -np.clip(y - z, -eps, eps)


LOSSES = {
    "poisson": (Poisson(), loss_poisson, grad_poisson),
    "huber": (Huber(EPS), loss_huber, grad_huber),
}


def problem(kind, n=150, p=25, seed=0, density=0.3):
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=density, random_state=seed, format="csr")
    w = np.zeros(p)
    w[:4] = [1.5, -1.0, 0.8, 0.5]
    z = X @ w + 0.4
    if kind == "poisson":
        y = rng.poisson(np.exp(z)).astype(np.float64)
    else:
        y = z + rng.standard_t(2, size=n)
    return X, y


def samples(kind, n=30, seed=1):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=n)
    y = rng.poisson(2.0, size=n).astype(float) if kind == "poisson" else 2 * rng.normal(size=n)
    return y, z, rng.uniform(0.5, 2.0, n)


# -- the datafits ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", LOSSES)
@pytest.mark.parametrize("weighted", [False, True])
def test_value_gradient_and_curvature_match_the_definition(kind, weighted):
    """Pass: F = (1/n) sum s loss; the gradient equals central finite differences to 1e-7;
    grad_hess and value_along write n grad F and the curvature at the moved point."""
    F, loss, grad = LOSSES[kind]
    y, z, s = samples(kind)
    s = s if weighted else None
    n = y.shape[0]
    w = np.ones(n) if s is None else s
    assert F.value(y, z, s) == pytest.approx((w * loss(y, z)).sum() / n, rel=1e-13)
    h = 1e-6
    fd = [(F.value(y, z + h * e, s) - F.value(y, z - h * e, s)) / (2 * h) for e in np.eye(n)]
    np.testing.assert_allclose(F.gradient(y, z, s), fd, atol=1e-7)
    u, g, hh = np.linspace(-1, 1, n), np.empty(n), np.empty(n)
    sw = np.zeros(0) if s is None else s
    total = F.value_along(y, z, u, 0.3, 0.5, sw, g, hh)
    moved = z + 0.5 * (u + 0.3)
    assert total == pytest.approx((w * loss(y, moved)).sum(), rel=1e-13)
    np.testing.assert_allclose(g, w * grad(y, moved), rtol=1e-13)
    fd2 = (grad(y, moved + h) - grad(y, moved - h)) / (2 * h)
    np.testing.assert_allclose(hh, w * fd2, atol=1e-6)


@pytest.mark.parametrize("kind", LOSSES)
def test_conjugate_is_the_supremum_of_its_definition_and_fenchel_young_holds(kind):
    """Pass: F*(-theta/n) equals sum_i sup_z (-theta_i z - s_i loss(y_i, z)) / n by scalar
    maximisation to 1e-7; a theta outside the domain gives inf; Fenchel-Young is an
    equality at theta = dual_point(z) and strict elsewhere."""
    F, loss, _ = LOSSES[kind]
    y, z, s = samples(kind)
    n = y.shape[0]
    theta = 0.7 * F.dual_point(y, z + 0.3, s)
    expected = 0.0
    for i in range(n):
        def neg(t, i=i):
            return theta[i] * t + s[i] * loss(y[i : i + 1], np.array([t]))[0]

        expected -= minimize_scalar(neg, bounds=(-30, 30), method="bounded",
                                    options={"xatol": 1e-12}).fun  # fmt: skip
    assert F.conjugate(y, theta, s) == pytest.approx(expected / n, abs=1e-7)
    bad = theta.copy()
    bad[0] = s[0] * (y[0] + 1.0) if kind == "poisson" else s[0] * 2 * EPS
    assert F.conjugate(y, bad, s) == np.inf
    at = F.dual_point(y, z, s)
    assert F.value(y, z, s) + F.conjugate(y, at, s) == pytest.approx(-(at @ z) / n, abs=1e-12)
    assert F.value(y, z, s) + F.conjugate(y, theta, s) > -(theta @ z) / n + 1e-6


@pytest.mark.parametrize("kind", LOSSES)
@pytest.mark.parametrize("weighted", [False, True])
def test_intercept_update_minimises_and_the_dual_point_is_feasible(kind, weighted):
    """Pass: z + intercept_update minimises F along the intercept (scalar minimisation's
    value matched to 1e-12, the derivative 0 to 1e-12, also from far away); the intercept
    dual point sums to 0 and lies in the conjugate's domain."""
    F, _, _ = LOSSES[kind]
    y, z, s = samples(kind, seed=3)
    s = s if weighted else None
    for start in (z, z + 25.0, z - 25.0):
        db = F.intercept_update(y, start, s)
        ref = minimize_scalar(lambda t, z0=start: F.value(y, z0 + t, s), bounds=(-60, 60),
                              method="bounded", options={"xatol": 1e-12})  # fmt: skip
        assert F.value(y, start + db, s) <= ref.fun + 1e-12
        assert abs(F.gradient(y, start + db, s).sum()) < 1e-12
    theta = F.dual_point(y, z, s, intercept=True)
    assert abs(theta.sum()) < 1e-12 and np.isfinite(F.conjugate(y, theta, s))


def test_each_loss_refuses_what_it_cannot_fit():
    """Pass: negative counts name their index; epsilon <= 0 is refused; an all-zero count
    vector with an intercept is refused (the intercept would be -inf)."""
    with pytest.raises(ValidationError, match=r"y\[1\] = -1.0"):
        Poisson().validate_y([0.0, -1.0])
    with pytest.raises(ValidationError, match="epsilon"):
        Huber(0.0)
    with pytest.raises(ValidationError, match="-inf"):
        Poisson().initial_intercept(np.zeros(4))


# -- fits against a reference -----------------------------------------------------------------
def objective(kind, X, y, w, b, alpha, l1_ratio):
    _, loss, _ = LOSSES[kind]
    z = X @ w + b
    pen = alpha * (l1_ratio * np.abs(w).sum() + 0.5 * (1 - l1_ratio) * w @ w)
    return loss(y, z).mean() + pen


def reference(kind, X, y, alpha, l1_ratio, iters=30_000):
    """FISTA with backtracking and restarts on dense X: the intercept unpenalised."""
    _, loss, grad = LOSSES[kind]
    A = np.hstack([X.toarray(), np.ones((X.shape[0], 1))])
    n, m = A.shape
    a1, a2 = alpha * l1_ratio, alpha * (1 - l1_ratio)

    def smooth(v):
        z = A @ v
        return loss(y, z).mean() + 0.5 * a2 * v[:-1] @ v[:-1]

    def smooth_grad(v):
        g = A.T @ grad(y, A @ v) / n
        g[:-1] += a2 * v[:-1]
        return g

    def prox(v, step):
        out = v.copy()
        out[:-1] = np.sign(v[:-1]) * np.maximum(np.abs(v[:-1]) - step * a1, 0.0)
        return out

    def total(v):
        return smooth(v) + a1 * np.abs(v[:-1]).sum()

    x = np.zeros(m)
    x[-1] = np.log(y.mean()) if kind == "poisson" else np.median(y)
    yk, t, L = x.copy(), 1.0, 1.0
    for _ in range(iters):
        f, g = smooth(yk), smooth_grad(yk)
        while True:
            nxt = prox(yk - g / L, 1.0 / L)
            d = nxt - yk
            if smooth(nxt) <= f + g @ d + 0.5 * L * d @ d + 1e-15:
                break
            L *= 2.0
        if total(nxt) > total(x):  # restart
            yk, t = x.copy(), 1.0
            continue
        t_next = 0.5 * (1 + np.sqrt(1 + 4 * t * t))
        yk = nxt + (t - 1) / t_next * (nxt - x)
        x, t = nxt, t_next
        L *= 0.9
    return x[:-1], x[-1], total(x)


def alpha_of(kind, X, y, frac):
    """``frac`` times the smallest alpha with w = 0 optimal (l1_ratio 1)."""
    F = LOSSES[kind][0]
    b0 = F.initial_intercept(y)
    return frac * float(np.abs(X.T @ F.gradient(y, np.full(y.shape[0], b0))).max())


@pytest.mark.parametrize("kind", LOSSES)
@pytest.mark.parametrize("l1_ratio", [1.0, 0.5])
@pytest.mark.slow
def test_fit_agrees_with_the_reference_to_1e_6_and_is_certified(in_process, kind, l1_ratio):
    """Pass: dl1's objective (recomputed here from coef_ and intercept_) is within 1e-6
    (relative) of the reference's, its gap certified below tol, the support the same."""
    X, y = problem(kind)
    alpha = alpha_of(kind, X, y, 0.1)
    res = dl1.fit(X, y, loss=LOSSES[kind][0], alpha=alpha, l1_ratio=l1_ratio, tol=1e-10)
    w, b, ref = reference(kind, X, y, alpha, l1_ratio)
    ours = objective(kind, X, y, res.coef_, res.intercept_, alpha, l1_ratio)
    assert res.converged_ and res.gap_ <= 1e-10
    assert ours == pytest.approx(ref, rel=1e-6)
    assert ours <= ref + 1e-9  # the certified point is at least as good
    assert set(np.flatnonzero(res.coef_)) == set(np.flatnonzero(np.abs(w) > 1e-8))
    assert res.primal_ == pytest.approx(ours, rel=1e-12)


def test_poisson_l2_equals_scikit_learns_poisson_regressor(in_process):
    """Pass: with l1_ratio=0 the objective is PoissonRegressor's: coefficients agree to
    1e-6, and to_sklearn() predicts as dl1 does."""
    from sklearn.linear_model import PoissonRegressor

    X, y = problem("poisson", seed=4)
    est = dl1.PoissonRegressor(alpha=0.02, l1_ratio=0.0, tol=1e-12).fit(X, y)
    ref = PoissonRegressor(alpha=0.02, solver="newton-cholesky", tol=1e-12, max_iter=1000)
    ref.fit(X.toarray(), y)
    np.testing.assert_allclose(est.coef_, ref.coef_, atol=1e-6)
    assert est.intercept_ == pytest.approx(ref.intercept_, abs=1e-6)
    np.testing.assert_allclose(est.predict(X), ref.predict(X.toarray()), rtol=1e-5)
    np.testing.assert_allclose(est.result_.to_sklearn().predict(X), est.predict(X), rtol=1e-12)
    assert est.score(X, y) == pytest.approx(ref.score(X.toarray(), y), abs=1e-6)


@pytest.mark.parametrize("kind", LOSSES)
@pytest.mark.slow
def test_path_agrees_with_the_reference_at_each_alpha(in_process, kind):
    """Pass: every alpha of a 6-alpha path is certified and within 1e-6 of the reference's
    objective; the path starts at alpha_max with w = 0."""
    X, y = problem(kind, seed=2)
    path = dl1.path(X, y, loss=LOSSES[kind][0], n_alphas=6, eps=0.05, tol=1e-10)
    assert path.converged_.all()
    assert path.coefs_[:, 0].nnz == 0
    assert path.alphas_[0] == pytest.approx(alpha_of(kind, X, y, 1.0), rel=1e-10)
    for k in (2, 5):
        a = float(path.alphas_[k])
        coef = path.coefs_[:, k].toarray().ravel()
        ours = objective(kind, X, y, coef, path.intercepts_[k], a, 1.0)
        assert ours == pytest.approx(reference(kind, X, y, a, 1.0)[2], rel=1e-6)


def test_solvers_that_need_a_curvature_bound_refuse_poisson(in_process):
    X, y = problem("poisson")
    for kw in ({"solver": "cd"}, {"solver": "sdca"}, {"screen": True}, {"spread": "cocoa"}):
        with pytest.raises(ValidationError, match="poisson"):
            dl1.fit(X, y, loss="poisson", alpha=0.01, **kw)


# -- on a cluster, in memory and out of core --------------------------------------------------
@pytest.mark.parametrize("kind", LOSSES)
@pytest.mark.parametrize("mode", ["one piece", "distributed", "streamed"])
def test_fit_on_a_cluster_equals_the_fit_in_process(local_cluster, tmp_path, kind, mode):
    """Pass: on a 2-worker LocalCluster, in one piece, distributed (one piece off) and out of
    core from a store read in every pass, the fit is certified and its objective within
    1e-9 of the in-process fit's (the reference's agreement is checked above)."""
    X, y = problem(kind, n=400, p=60, seed=6)
    alpha = alpha_of(kind, X, y, 0.05)
    here = dl1.fit(X, y, loss=LOSSES[kind][0], alpha=alpha, tol=1e-9, client=None)
    data, extra = X, {}
    if mode == "streamed":
        data = dl1.from_scipy(X, y, tmp_path / "s.zarr", n_feature_blocks=4)
        extra = {"stream": True}
    with dask.config.set({"dl1.one-piece": mode == "one piece"}):
        res = dl1.fit(data, None if mode == "streamed" else y, loss=LOSSES[kind][0],
                      alpha=alpha, tol=1e-9, client=local_cluster, **extra)  # fmt: skip
    assert res.converged_ and res.gap_ <= 1e-9
    assert res.streamed_ == (mode == "streamed")
    ours = objective(kind, X, y, res.coef_, res.intercept_, alpha, 1.0)
    assert ours == pytest.approx(objective(kind, X, y, here.coef_, here.intercept_, alpha, 1.0),
                                 rel=1e-9)  # fmt: skip


def test_estimators_predict_through_the_link_and_save_their_loss(in_process, tmp_path):
    """Pass: PoissonRegressor predicts exp(X w + b); HuberRegressor's epsilon reaches the
    fit, the saved model and to_sklearn (SGDRegressor with that epsilon)."""
    X, y = problem("poisson")
    est = dl1.PoissonRegressor(alpha=0.01).fit(X, y)
    np.testing.assert_allclose(est.predict(X), np.exp(X @ est.coef_ + est.intercept_))
    Xh, yh = problem("huber")
    hub = dl1.HuberRegressor(epsilon=0.5, alpha=0.01, tol=1e-8).fit(Xh, yh)
    direct = dl1.fit(Xh, yh, loss=Huber(0.5), alpha=0.01, tol=1e-8)
    np.testing.assert_allclose(hub.coef_, direct.coef_, atol=1e-10)
    assert hub.result_.loss_params == {"epsilon": 0.5}
    hub.result_.save(tmp_path / "m")
    back = dl1.load_model(tmp_path / "m")
    assert back.loss == "huber" and back.loss_params == {"epsilon": 0.5}
    sk = back.to_sklearn()
    assert sk.loss == "huber" and sk.epsilon == 0.5
    np.testing.assert_allclose(sk.predict(Xh), hub.predict(Xh), rtol=1e-12)
