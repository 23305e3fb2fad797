"""Per-feature penalty factors and the sign constraint (``penalty_factor=``,
``positive=``): the penalty against its definition, its kernels against NumPy, fits and
paths against scikit-learn (``positive=True``), an equivalent rescaled problem and a dense
coordinate-descent reference, in process, in one piece, distributed and out of core."""

from __future__ import annotations

import dask
import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import minimize_scalar
from sklearn import linear_model as sk

import dl1
from dl1.errors import ValidationError
from dl1.kernels.cd import penalised_step
from dl1.kernels.linalg import DUAL_SIDES, csc_xt_theta_stats
from dl1.kernels.screen import violation_scores
from dl1.objective.penalties import ElasticNet, WeightedElasticNet
from tests.helpers import fit_in_mode


def regression(n=150, p=30, seed=0):
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=0.3, random_state=seed, format="csr")
    w = rng.normal(size=p) * (rng.random(p) < 0.4)
    return X, X @ w + 0.3 + 0.1 * rng.normal(size=n)


# -- the penalty ------------------------------------------------------------------------------
@pytest.mark.parametrize("positive", [False, True])
@pytest.mark.parametrize("l1_ratio", [1.0, 0.4])
def test_prox_and_conjugate_are_those_of_the_definition(positive, l1_ratio):
    """Pass: the prox is each coordinate's minimiser (scalar minimisation, 1e-7); the
    conjugate is sum_j sup_w (v_j w - g_j(w)) (scalar maximisation, 1e-7; inf where the
    L1-only conjugate's indicator says so); the block statistics give the same conjugate and
    the dual norm max_j e_j / f_j."""
    rng = np.random.default_rng(1)
    f = rng.uniform(0.3, 3.0, 8)
    pen = WeightedElasticNet(0.5, l1_ratio, f, positive)
    lo = 0.0 if positive else -50.0

    def g(j, w):
        return f[j] * (pen.alpha_l1 * abs(w) + 0.5 * pen.alpha_l2 * w * w)

    v = rng.normal(scale=2.0, size=8)
    prox = pen.prox(v, step=0.7)
    for j in range(8):
        ref = minimize_scalar(lambda w, j=j: (w - v[j]) ** 2 / (2 * 0.7) + g(j, w),
                              bounds=(lo, 50.0), method="bounded", options={"xatol": 1e-12})
        assert prox[j] == pytest.approx(ref.x, abs=1e-7)
    small = 0.9 * pen.alpha_l1 * f * np.sign(v)
    for point in (v, small):
        sup = sum(-minimize_scalar(lambda w, j=j, pt=point: g(j, w) - pt[j] * w,
                                   bounds=(lo, 1e4),
                                   method="bounded", options={"xatol": 1e-10}).fun
                  for j in range(8))  # fmt: skip
        conj = pen.conjugate(point)
        if l1_ratio == 1.0 and not np.all(np.maximum(point, 0) <= pen.alpha_l1 * f + 1e-12
                                          if positive else np.abs(point) <= pen.alpha_l1 * f):
            assert conj == np.inf
        else:
            assert conj == pytest.approx(sup, abs=1e-6)
        n = 7
        absmax, excess = pen.xt_theta_stats(n * point, n)
        e = np.maximum(point, 0) if positive else np.abs(point)
        assert absmax == pytest.approx(n * (e / f).max(), rel=1e-14)
        assert pen.conjugate_from_stats(excess, n) == pytest.approx(conj, rel=1e-12)
    assert pen.value(-np.ones(8)) == (np.inf if positive else pytest.approx(
        np.sum(f) * (pen.alpha_l1 + 0.5 * pen.alpha_l2)))  # fmt: skip


def test_bad_factors_are_refused_naming_the_entry(in_process):
    for bad, where in (([1.0, -2.0], r"penalty_factor\[1\] = -2.0"),
                       ([np.inf, 1.0], r"penalty_factor\[0\] = inf"),
                       ([np.nan, 1.0], r"penalty_factor\[0\] = nan")):  # fmt: skip
        with pytest.raises(ValidationError, match=where):
            WeightedElasticNet(0.1, 1.0, bad)
    X, y = regression()
    with pytest.raises(ValidationError, match="penalty_factor has 3 factors, X has 30"):
        dl1.fit(X, y, alpha=0.01, penalty_factor=[1.0, 2.0, 3.0])
    for kw in ({"solver": "cd"}, {"solver": "sdca"}, {"screen": True}):
        with pytest.raises(ValidationError, match="solver='ws' without screening"):
            dl1.fit(X, y, alpha=0.01, positive=True, **kw)
    with pytest.raises(ValidationError, match="solver='ws' without screening"):
        dl1.fit_cv(X, y, positive=True, cv=3, n_alphas=3, screen=True)


# -- kernels against NumPy --------------------------------------------------------------------
@pytest.mark.parametrize("positive", [False, True])
def test_kernels_take_factors_and_signs_as_numpy_does(positive):
    """Pass: penalised_step is the scalar minimiser; csc_xt_theta_stats and
    violation_scores give NumPy's weighted dual norm, excess and scores."""
    rng = np.random.default_rng(3)
    f = rng.uniform(0.2, 4.0, 12)
    box = np.array([[0.0], [np.inf]]) if positive else np.zeros((2, 0))
    for j in range(12):
        x, lj = rng.normal(scale=3), rng.uniform(0.5, 2)
        got = penalised_step(x, lj, 0.7, 0.3, f, j, box)
        def model(v, x=x, lj=lj, fj=f[j]):
            return lj * v * v / 2 - x * v + fj * (0.7 * abs(v) + 0.15 * v * v)

        ref = minimize_scalar(model, bounds=(0.0 if positive else -20, 20), method="bounded",
                              options={"xatol": 1e-12}).x  # fmt: skip
        assert got == pytest.approx(ref, abs=1e-7)
    X = sp.random(40, 12, density=0.4, random_state=2, format="csc")
    theta = rng.normal(size=40)
    c = X.T @ theta
    e = (np.maximum(c, 0) if positive else np.abs(c)) / f
    thr = float(np.median(e))
    am, ex, _ = csc_xt_theta_stats(X.indptr.astype(np.int64), X.indices.astype(np.int32),
                                   X.data, np.zeros(0), theta, thr, f, box, 40.0, 0.3,
                                   DUAL_SIDES)  # fmt: skip
    assert am == pytest.approx(e.max(), rel=1e-13)
    assert ex == pytest.approx(np.sum(f * np.maximum(e - thr, 0) ** 2), rel=1e-12)
    cols = np.arange(12, dtype=np.int64)
    support = np.array([3], dtype=np.int64)
    scores = c.copy()
    am2, ex2, _ = violation_scores(scores, thr, cols, np.ones(12), support, f, box, 40.0, 0.3)
    assert (am2, ex2) == (pytest.approx(am, rel=1e-13), pytest.approx(ex, rel=1e-12))
    want = e - thr
    want[3] = -np.inf
    np.testing.assert_allclose(scores, want, rtol=1e-13)


# -- fits against references ------------------------------------------------------------------
def dense_cd(X, y, alpha, l1_ratio, f, positive, sweeps=20_000):
    """Coordinate descent on centred dense data (the intercept profiled out)."""
    A = X.toarray()
    xm, ym = A.mean(0), y.mean()
    A, yc = A - xm, y - ym
    n, p = A.shape
    w, r = np.zeros(p), yc.copy()
    sq = (A * A).sum(0) / n
    a1, a2 = alpha * l1_ratio * f, alpha * (1 - l1_ratio) * f
    for _ in range(sweeps):
        delta = 0.0
        for j in range(p):
            if sq[j] == 0:
                continue
            rho = A[:, j] @ r / n + sq[j] * w[j]
            new = np.sign(rho) * max(abs(rho) - a1[j], 0) / (sq[j] + a2[j])
            new = max(new, 0.0) if positive else new
            if new != w[j]:
                r -= A[:, j] * (new - w[j])
                delta = max(delta, abs(new - w[j]))
                w[j] = new
        if delta < 1e-15:
            break
    return w, ym - xm @ w


def objective(X, y, w, b, alpha, l1_ratio, f):
    r = y - X @ w - b
    return r @ r / (2 * len(y)) + alpha * np.sum(f * (l1_ratio * np.abs(w)
                                                       + 0.5 * (1 - l1_ratio) * w * w))


@pytest.mark.parametrize("l1_ratio", [1.0, 0.5])
def test_positive_equals_scikit_learns(in_process, l1_ratio):
    """Pass: Lasso / ElasticNet with positive=True equal scikit-learn's (coefficients 1e-6,
    objective 1e-9 relative), certified; no coefficient is negative."""
    X, y = regression()
    ours = dl1.ElasticNet(alpha=0.01, l1_ratio=l1_ratio, positive=True, tol=1e-12).fit(X, y)
    ref = sk.ElasticNet(alpha=0.01, l1_ratio=l1_ratio, positive=True, tol=1e-15,
                        max_iter=1_000_000).fit(X.toarray(), y)  # fmt: skip
    assert ours.gap_ <= 1e-12 and ours.coef_.min() >= 0.0
    np.testing.assert_allclose(ours.coef_, ref.coef_, atol=1e-6)
    one = np.ones(X.shape[1])
    assert objective(X, y, ours.coef_, ours.intercept_, 0.01, l1_ratio, one) == pytest.approx(
        objective(X, y, ref.coef_, ref.intercept_, 0.01, l1_ratio, one), rel=1e-9)
    unconstrained = dl1.fit(X, y, alpha=0.01, l1_ratio=l1_ratio, tol=1e-12)
    assert unconstrained.coef_.min() < 0.0  # the constraint binds on this data


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_factors_equal_the_rescaled_problem(in_process, loss):
    """Pass: an L1 fit with factors f equals the plain fit on the columns x_j / f_j with
    w_j = v_j / f_j (the same problem), for the squared and the logistic loss."""
    X, y = regression(seed=4)
    if loss == "logistic":
        y = np.where(y > np.median(y), 1.0, -1.0)
    f = np.random.default_rng(5).uniform(0.2, 5.0, X.shape[1])
    alpha = 0.05 * dl1.alpha_max(X, y, loss=loss, penalty_factor=f)
    ours = dl1.fit(X, y, alpha=alpha, loss=loss, penalty_factor=f, tol=1e-12)
    plain = dl1.fit(sp.csr_matrix(X @ sp.diags(1 / f)), y, alpha=alpha, loss=loss, tol=1e-12)
    assert ours.converged_ and np.count_nonzero(ours.coef_) > 3
    np.testing.assert_allclose(ours.coef_, plain.coef_ / f, atol=1e-7)
    assert ours.primal_ == pytest.approx(plain.primal_, rel=1e-10)


@pytest.mark.parametrize("positive", [False, True])
def test_elastic_net_with_factors_equals_a_dense_reference(in_process, positive):
    """Pass: factors on both parts of the elastic net (and the sign constraint) give the
    dense coordinate-descent reference's optimum within dl1's certified gap, and its
    coefficients to 1e-5."""
    X, y = regression(seed=6)
    f = np.random.default_rng(7).uniform(0.2, 3.0, X.shape[1])
    res = dl1.fit(X, y, alpha=0.02, l1_ratio=0.3, penalty_factor=f, positive=positive,
                  tol=1e-12)  # fmt: skip
    w, b = dense_cd(X, y, 0.02, 0.3, f, positive)
    assert res.converged_
    ref = objective(X, y, w, b, 0.02, 0.3, f)
    # the certificate: the reference's optimum lies within dl1's gap below its objective
    assert res.primal_ - res.dual_gap_ - 1e-15 <= ref <= res.primal_ + 1e-15
    np.testing.assert_allclose(res.coef_, w, atol=1e-5)  # a gap of 1e-13 pins w to ~1e-6
    assert res.intercept_ == pytest.approx(b, abs=1e-5)


def test_positive_path_starts_at_its_own_alpha_max_and_follows_scikit_learn(in_process):
    """Pass: alpha_max under positive is the largest positive correlation (below the
    unconstrained one on this data); every alpha of the path equals scikit-learn's
    positive Lasso (1e-6)."""
    X, y = regression(seed=8)
    y = -y  # mostly negative correlations: the positive alpha_max is the smaller
    amax = dl1.alpha_max(X, y, positive=True)
    Xc = X.toarray() - X.toarray().mean(0)
    corr = Xc.T @ (y - y.mean()) / len(y)
    assert amax == pytest.approx(max(corr.max(), 0.0), rel=1e-12)
    assert amax < dl1.alpha_max(X, y)
    path = dl1.path(X, y, positive=True, n_alphas=6, eps=0.02, tol=1e-12)
    assert path.converged_.all() and path.coefs_[:, 0].nnz == 0
    assert path.coefs_.min() >= 0.0
    for k in (1, 3, 5):
        ref = sk.Lasso(alpha=path.alphas_[k], positive=True, tol=1e-15,
                       max_iter=1_000_000).fit(X.toarray(), y)  # fmt: skip
        np.testing.assert_allclose(path.coefs_[:, k].toarray().ravel(), ref.coef_, atol=1e-6)


@pytest.mark.parametrize("mode", ["one piece", "distributed", "streamed"])
def test_on_a_cluster_the_fit_is_the_one_in_process(local_cluster, tmp_path, mode):
    """Pass: factors and positive reach the workers: one piece, distributed and out of core
    on a 2-worker LocalCluster give the in-process solution (objective 1e-10)."""
    X, y = regression(n=300, p=50, seed=9)
    f = np.random.default_rng(10).uniform(0.5, 2.0, 50)
    kw = dict(alpha=0.005, l1_ratio=0.7, penalty_factor=f, positive=True, tol=1e-10)
    here = dl1.fit(X, y, client=None, **kw)
    res = fit_in_mode(local_cluster, tmp_path, mode, X, y, **kw)
    assert res.converged_ and res.coef_.min() >= 0.0
    assert res.primal_ == pytest.approx(here.primal_, rel=1e-10)
    np.testing.assert_allclose(res.coef_, here.coef_, atol=1e-6)


def test_the_plain_penalty_is_unchanged():
    """Pass: without factors or signs the penalty is the plain ElasticNet (its kernels take
    empty factors)."""
    from dl1.penalised import make_penalty

    pen = make_penalty(0.1, 0.5, None, False)
    assert type(pen) is ElasticNet and pen.uniform and pen.factors.shape == (0,)
    assert pen.restricted(np.arange(3)) is pen
    assert pen != WeightedElasticNet(0.1, 0.5, None, False)


def test_lasso_cv_with_positive_equals_scikit_learns(in_process):
    """Pass: LassoCV(positive=True) has scikit-learn's grid, choice and refit (1e-9)."""
    from sklearn.model_selection import KFold

    X, y = regression(n=200, seed=11)
    ours = dl1.LassoCV(alphas=10, cv=KFold(4), positive=True, tol=1e-10).fit(X, y)
    ref = sk.LassoCV(alphas=10, cv=KFold(4), positive=True, tol=1e-14,
                     max_iter=1_000_000).fit(X.toarray(), y)  # fmt: skip
    np.testing.assert_allclose(ours.alphas_, ref.alphas_, rtol=1e-10)
    assert ours.alpha_ == pytest.approx(ref.alpha_, rel=1e-12)
    np.testing.assert_allclose(ours.coef_, ref.coef_, atol=1e-9)


def test_cv_with_factors_in_one_piece_on_a_cluster_equals_in_process(local_cluster):
    """Pass: the factors travel with each fold solved in one piece: the held-out scores
    and the refit equal the in-process ones."""
    X, y = regression(n=240, p=40, seed=12)
    f = np.random.default_rng(13).uniform(0.3, 3.0, 40)
    kw = dict(cv=3, n_alphas=6, penalty_factor=f, positive=True, tol=1e-10)
    here = dl1.fit_cv(X, y, client=None, **kw)
    with dask.config.set({"dl1.one-piece": True}):
        there = dl1.fit_cv(X, y, client=local_cluster, **kw)
    np.testing.assert_allclose(there.cv[0].scores, here.cv[0].scores, rtol=1e-8)
    assert there.alpha == here.alpha
    np.testing.assert_allclose(there.fit.coef_, here.fit.coef_, atol=1e-8)
