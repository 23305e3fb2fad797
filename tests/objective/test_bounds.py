"""Box constraints ``lower_j <= w_j <= upper_j`` (``bounds=``, glmnet's ``lower.limits`` /
``upper.limits``): the penalty against its definition, its kernels against NumPy, the
certificate as a lower bound of the optimum, and fits, paths and CV against independent
references (a dense coordinate descent and SciPy's L-BFGS-B on the split ``w = u - v``), in
process, in one piece, distributed and out of core."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import minimize, minimize_scalar
from scipy.special import expit

import dl1
from dl1.errors import ValidationError
from dl1.kernels.cd import penalised_step
from dl1.kernels.linalg import DUAL_SIDES, KKT_SIDES, csc_xt_theta_stats
from dl1.kernels.screen import violation_scores
from dl1.objective.datafits import make_datafit
from dl1.objective.gap import duality_gap
from dl1.objective.penalties import WeightedElasticNet
from tests.helpers import fit_in_mode


def regression(n=150, p=30, seed=0):
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=0.3, random_state=seed, format="csr")
    w = 3.0 * rng.normal(size=p) * (rng.random(p) < 0.5)
    return X, X @ w + 0.3 + 0.1 * rng.normal(size=n)


def mixed_box(p, seed):
    """Per-feature bounds of every kind: finite on both sides, one side, 0 on one side, none."""
    rng = np.random.default_rng(seed)
    lower = rng.choice([-np.inf, -0.5, 0.0, -2.0], size=p)
    upper = rng.choice([np.inf, 0.4, 0.0, 1.5], size=p)
    return lower, upper


# -- the penalty ------------------------------------------------------------------------------
@pytest.mark.parametrize("l1_ratio", [1.0, 0.4])
def test_prox_and_conjugate_are_those_of_the_definition(l1_ratio):
    """Pass: with mixed per-feature bounds, the prox is each coordinate's constrained
    minimiser and the conjugate sum_j sup_{l_j <= w <= u_j} (v_j w - g_j(w)) (scalar
    optimisation, 1e-6), inf where an unbounded side's indicator says so; the box part
    equals the kernel's third statistic."""
    rng = np.random.default_rng(1)
    p = 12
    f = rng.uniform(0.3, 3.0, p)
    lower, upper = mixed_box(p, 2)
    pen = WeightedElasticNet(0.5, l1_ratio, f, bounds=(lower, upper))

    def g(j, w):
        return f[j] * (pen.alpha_l1 * abs(w) + 0.5 * pen.alpha_l2 * w * w)

    def box(j):
        return max(lower[j], -1e4), min(upper[j], 1e4)

    v = rng.normal(scale=2.0, size=p)
    prox = pen.prox(v, step=0.7)
    for j in range(p):
        ref = minimize_scalar(lambda w, j=j: (w - v[j]) ** 2 / (2 * 0.7) + g(j, w),
                              bounds=box(j), method="bounded", options={"xatol": 1e-12})
        assert prox[j] == pytest.approx(ref.x, abs=1e-7)
    # small enough on the unbounded sides: finite for the L1 penalty too
    unbounded = np.where(v > 0, upper == np.inf, lower == -np.inf)
    point = np.where(unbounded, 0.9 * pen.alpha_l1 * f * np.sign(v), v)
    for pt in (v, point):
        terms = []
        for j in range(p):
            lo, hi = box(j)
            if lo == hi:
                terms.append(0.0)
                continue
            res = minimize_scalar(lambda w, j=j, pt=pt: g(j, w) - pt[j] * w, bounds=(lo, hi),
                                  method="bounded", options={"xatol": 1e-11})
            terms.append(-res.fun)
        conj = pen.conjugate(pt)
        excess = np.abs(pt) - pen.alpha_l1 * f
        if l1_ratio == 1.0 and np.any(unbounded & (excess > 1e-12)):
            assert conj == np.inf
        else:
            assert conj == pytest.approx(sum(terms), abs=1e-6)
    # the kernel's box statistic is the penalty's box conjugate
    X = sp.random(40, p, density=0.5, random_state=3, format="csc")
    theta = rng.normal(size=40)
    c = X.T @ theta
    am, ex, bx = csc_xt_theta_stats(X.indptr.astype(np.int64), X.indices.astype(np.int32),
                                    X.data, np.zeros(0), theta, 40 * pen.alpha_l1, f,
                                    pen.bounds, 40.0, pen.alpha_l2, DUAL_SIDES)  # fmt: skip
    assert bx == pytest.approx(pen.box_conjugate(c, 40), rel=1e-12, abs=1e-15)
    assert (am, ex) == pytest.approx(pen.xt_theta_stats(c, 40), rel=1e-12)
    assert pen.value(np.clip(rng.normal(size=p), lower, upper)) < np.inf
    j = int(np.flatnonzero(np.isfinite(upper))[0])
    w = np.zeros(p)
    w[j] = upper[j] + 1e-9
    assert pen.value(w) == np.inf


def test_kernels_clip_to_the_bounds_and_score_the_open_sides():
    """Pass: penalised_step is the constrained scalar minimiser; violation_scores' scores
    count every side whose bound is not 0 (a finite upper bound of 0.4 still lets a
    coefficient leave 0), its dual norm only the unbounded sides."""
    rng = np.random.default_rng(4)
    p = 16
    f = rng.uniform(0.2, 4.0, p)
    lower, upper = mixed_box(p, 5)
    bounds = np.stack([lower, upper])
    for j in range(p):
        x, lj = rng.normal(scale=3), rng.uniform(0.5, 2)
        got = penalised_step(x, lj, 0.7, 0.3, f, j, bounds)

        def model(v, x=x, lj=lj, fj=f[j]):
            return lj * v * v / 2 - x * v + fj * (0.7 * abs(v) + 0.15 * v * v)

        lo, hi = max(lower[j], -20), min(upper[j], 20)
        ref = 0.0 if lo == hi else minimize_scalar(model, bounds=(lo, hi), method="bounded",
                                                   options={"xatol": 1e-12}).x  # fmt: skip
        assert got == pytest.approx(ref, abs=1e-7)
    c = rng.normal(scale=2.0, size=p)
    thr = 0.8
    kkt = np.maximum(np.where(upper > 0, c, 0), np.where(lower < 0, -c, 0)) / f
    dual = np.maximum(np.where(upper == np.inf, c, 0), np.where(lower == -np.inf, -c, 0)) / f
    scores = c.copy()
    cols = np.arange(p, dtype=np.int64)
    am, ex, _ = violation_scores(scores, thr, cols, np.ones(p), np.zeros(0, np.int64), f,
                                 bounds, 10.0, 0.0)  # fmt: skip
    np.testing.assert_allclose(scores, kkt - thr, rtol=1e-13)
    assert am == pytest.approx(dual.max(), rel=1e-13)
    assert ex == pytest.approx(np.sum(f * np.maximum(dual - thr, 0) ** 2), rel=1e-12)
    X = sp.identity(p, format="csc")
    am_kkt = csc_xt_theta_stats(X.indptr.astype(np.int64), X.indices.astype(np.int32), X.data,
                                np.zeros(0), c, np.inf, f, bounds, 1.0, 0.0, KKT_SIDES)[0]
    assert am_kkt == pytest.approx(kkt.max(), rel=1e-13)


# -- references -------------------------------------------------------------------------------
def lbfgsb(X, y, alpha, l1_ratio, lower, upper, loss="squared"):
    """The bounded elastic net by L-BFGS-B on ``w = u - v`` with ``0 <= u <= upper``,
    ``0 <= v <= -lower`` (a smooth problem with simple bounds) and a free intercept."""
    A = X.toarray()
    n, p = A.shape
    a1, a2 = alpha * l1_ratio, alpha * (1 - l1_ratio)

    def fun(x):
        u, v, b = x[:p], x[p:2 * p], x[-1]
        w = u - v
        z = A @ w + b
        if loss == "squared":
            r = z - y
            val, dz = r @ r / (2 * n), r / n
        else:
            m = y * z
            val, dz = np.mean(np.logaddexp(0, -m)), -y * expit(-m) / n
        gw = A.T @ dz + a2 * w
        val += a1 * (u.sum() + v.sum()) + 0.5 * a2 * w @ w
        return val, np.concatenate([gw + a1, -gw + a1, [dz.sum()]])

    box = ([(0, None if h == np.inf else h) for h in upper]
           + [(0, None if lo == -np.inf else -lo) for lo in lower] + [(None, None)])
    res = minimize(fun, np.zeros(2 * p + 1), jac=True, method="L-BFGS-B", bounds=box,
                   options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 50_000, "maxcor": 30})
    return res.x[:p] - res.x[p:2 * p], res.x[-1], res.fun


@pytest.mark.parametrize("loss", ["squared", "logistic"])
@pytest.mark.parametrize("l1_ratio", [1.0, 0.5])
def test_a_bounded_fit_is_the_references_optimum(in_process, loss, l1_ratio):
    """Pass: with mixed per-feature bounds (some active at the solution), the fit is
    certified at tol 1e-12, stays in its box, and L-BFGS-B's objective lies in dl1's
    certified interval [primal - gap, primal] (to 1e-9); coefficients agree to 1e-4."""
    X, y = regression(seed=6)
    if loss == "logistic":
        y = np.where(y > np.median(y), 1.0, -1.0)
    lower, upper = mixed_box(X.shape[1], 7)
    alpha = 0.02 * dl1.alpha_max(X, y, loss=loss, l1_ratio=l1_ratio)
    res = dl1.fit(X, y, alpha=alpha, l1_ratio=l1_ratio, loss=loss, bounds=(lower, upper),
                  tol=1e-12)  # fmt: skip
    w, b, ref = lbfgsb(X, y, alpha, l1_ratio, lower, upper, loss)
    assert res.converged_
    assert np.all(res.coef_ >= lower) and np.all(res.coef_ <= upper)
    at_bound = np.isfinite(upper) & (upper > 0) & (res.coef_ == upper)
    at_bound |= np.isfinite(lower) & (lower < 0) & (res.coef_ == lower)
    assert at_bound.sum() >= 2  # the bounds bind: not the unbounded problem
    assert res.primal_ - res.dual_gap_ - 1e-9 <= ref <= res.primal_ + 1e-9
    np.testing.assert_allclose(res.coef_, w, atol=1e-4)
    assert res.intercept_ == pytest.approx(b, abs=1e-4)


def test_the_certificate_is_a_lower_bound_away_from_the_optimum():
    """Pass: at dual points moved from the optimum's along the columns of features held at
    a finite bound, and at random primal points, the dual value never exceeds the optimum
    (L-BFGS-B reference) while the primal value never falls below it: the finite bounds'
    conjugate terms are counted (without them the dual overshoots the optimum here)."""
    X, y = regression(seed=8)
    lower, upper = mixed_box(X.shape[1], 9)
    pen = WeightedElasticNet(0.05, 1.0, bounds=(lower, upper))
    datafit = make_datafit("squared")
    w_opt, b_opt, opt = lbfgsb(X, y, 0.05, 1.0, lower, upper)
    at_bound = (np.abs(w_opt - upper) < 1e-6) | (np.abs(w_opt - lower) < 1e-6)
    held = np.flatnonzero(at_bound & (w_opt != 0))
    assert held.size >= 2
    theta_opt = y - X @ w_opt - b_opt
    A = X.toarray()
    duals = []
    for j in held:
        d = A[:, j] - A[:, j].mean()  # keeps sum(theta) = 0
        for t in (-2.0, -0.5, 0.5, 2.0):
            theta = theta_opt + t * d * np.sign(w_opt[j])
            z = y - theta  # the point whose dual point is theta
            _, dual, _ = duality_gap(datafit, pen, y, z, np.clip(w_opt, lower, upper),
                                     X.T @ theta, theta=theta)  # fmt: skip
            duals.append(dual)
    assert max(duals) <= opt + 1e-10
    rng = np.random.default_rng(10)
    for k in range(20):
        w = np.clip(rng.normal(scale=0.5 * (k % 4), size=X.shape[1]), lower, upper)
        z = X @ w + y.mean()
        theta = datafit.dual_point(y, z, None, True)
        primal, dual, gap = duality_gap(datafit, pen, y, z, w, X.T @ theta, theta=theta)
        assert dual <= opt + 1e-10 and primal >= opt - 1e-10


def test_bounds_that_do_not_bind_and_zero_bounds_are_the_known_problems(in_process):
    """Pass: bounds wider than the solution give the unbounded fit (1e-8), and bounds=(0,
    None) gives positive=True (1e-10)."""
    X, y = regression(seed=11)
    plain = dl1.fit(X, y, alpha=0.05, tol=1e-12)
    wide = np.abs(plain.coef_).max() + 1.0
    res = dl1.fit(X, y, alpha=0.05, bounds=(-wide, wide), tol=1e-12)
    np.testing.assert_allclose(res.coef_, plain.coef_, atol=1e-8)
    pos = dl1.fit(X, y, alpha=0.05, positive=True, tol=1e-12)
    box = dl1.fit(X, y, alpha=0.05, bounds=(0, None), tol=1e-12)
    np.testing.assert_allclose(box.coef_, pos.coef_, atol=1e-10)


def test_alpha_max_and_the_path_follow_the_box(in_process):
    """Pass: a finite upper bound leaves alpha_max unchanged, a zero one removes that
    side; the path starts at 0, stays in the box and is certified at every alpha, and
    three of its alphas equal the reference."""
    X, y = regression(seed=12)
    p = X.shape[1]
    assert dl1.alpha_max(X, y, bounds=(-0.1, 0.1)) == pytest.approx(dl1.alpha_max(X, y),
                                                                     rel=1e-13)  # fmt: skip
    assert dl1.alpha_max(X, y, bounds=(0, 1.0)) == pytest.approx(
        dl1.alpha_max(X, y, positive=True), rel=1e-13)  # fmt: skip
    lower, upper = mixed_box(p, 13)
    path = dl1.path(X, y, bounds=(lower, upper), n_alphas=6, eps=0.01, tol=1e-12)
    assert path.converged_.all() and path.coefs_[:, 0].nnz == 0
    coefs = path.coefs_.toarray()
    assert np.all(coefs >= lower[:, None]) and np.all(coefs <= upper[:, None])
    for k in (2, 4, 5):
        w, _, _ = lbfgsb(X, y, path.alphas_[k], 1.0, lower, upper)
        np.testing.assert_allclose(coefs[:, k], w, atol=1e-4)


def test_fit_cv_keeps_every_fold_and_the_refit_in_the_box(in_process):
    """Pass: fit_cv with bounds refits at its chosen alpha to the bounded fit there."""
    X, y = regression(n=200, seed=14)
    lower, upper = mixed_box(X.shape[1], 15)
    cvfit = dl1.fit_cv(X, y, bounds=(lower, upper), cv=3, n_alphas=5, tol=1e-10)
    ref = dl1.fit(X, y, alpha=cvfit.alpha, bounds=(lower, upper), tol=1e-10)
    np.testing.assert_allclose(cvfit.fit.coef_, ref.coef_, atol=1e-6)
    assert np.all(cvfit.fit.coef_ >= lower) and np.all(cvfit.fit.coef_ <= upper)


@pytest.mark.parametrize("mode", ["one piece", "distributed", "streamed"])
def test_on_a_cluster_the_bounded_fit_is_the_one_in_process(local_cluster, tmp_path, mode):
    """Pass: bounds reach the workers: one piece, distributed and out of core on a 2-worker
    LocalCluster give the in-process solution (objective 1e-10), in the box."""
    X, y = regression(n=300, p=50, seed=16)
    lower, upper = mixed_box(50, 17)
    kw = dict(alpha=0.005, l1_ratio=0.7, bounds=(lower, upper), tol=1e-10)
    here = dl1.fit(X, y, client=None, **kw)
    res = fit_in_mode(local_cluster, tmp_path, mode, X, y, **kw)
    assert res.converged_ and np.all(res.coef_ <= upper) and np.all(res.coef_ >= lower)
    assert res.primal_ == pytest.approx(here.primal_, rel=1e-10)
    np.testing.assert_allclose(res.coef_, here.coef_, atol=1e-6)


# -- refusals ---------------------------------------------------------------------------------
def test_bad_bounds_are_refused_naming_the_entry(in_process):
    """Pass: a box without 0, NaN, a wrong length, positive with a lower bound, a solver
    or standardisation without bounds, and a bounded unpenalised feature are refused before
    any work, each naming its problem."""
    X, y = regression()
    p = X.shape[1]
    for bounds, where in (((0.5, 1.0), r"lower\[0\] = 0.5"),
                          ((-1.0, [1.0, -0.1]), r"upper\[1\] = -0.1"),
                          (([np.nan, 0.0], 1.0), r"lower\[0\] = nan"),
                          ((np.zeros(3), None), "bounds have 3 entries, X has 30"),
                          ((np.zeros((2, 2)), None), "lower must be a number or a 1-D"),
                          (3.0, "bounds must be a pair")):  # fmt: skip
        with pytest.raises(ValidationError, match=where):
            dl1.fit(X, y, alpha=0.01, bounds=bounds)
    with pytest.raises(ValidationError, match="positive=True or a lower bound"):
        dl1.fit(X, y, alpha=0.01, positive=True, bounds=(-1.0, 1.0))
    with pytest.raises(ValidationError, match="standardize=True"):
        dl1.fit(X, y, alpha=0.01, bounds=(-1.0, 1.0), standardize=True)
    for kw in ({"solver": "cd"}, {"screen": True}):
        with pytest.raises(ValidationError, match="solver='ws' without screening"):
            dl1.fit(X, y, alpha=0.01, bounds=(-1.0, 1.0), **kw)
    f = np.ones(p)
    f[3] = 0.0
    with pytest.raises(ValidationError, match="bounded unpenalised feature"):
        dl1.fit(X, y, alpha=0.01, penalty_factor=f, bounds=(-1.0, 1.0))
    # zero factors beside bounds on other features only: fitted
    lower = np.full(p, -np.inf)
    lower[5] = -0.1
    res = dl1.fit(X, y, alpha=0.01, penalty_factor=f, bounds=(lower, None), tol=1e-10)
    assert res.converged_ and res.coef_[5] >= -0.1

