"""Randomized Frank-Wolfe for the constrained Lasso (dl1.fit_constrained, dl1.path_constrained),
against NumPy references."""

import math
import warnings

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp

import dl1
from dl1.errors import ValidationError
from dl1.kernels.fw import fw_column, fw_score_columns
from dl1.params import InvalidParameterError
from dl1.solvers.fw_problem import sample_size, split_sample
from dl1.tasks.fw import sample_columns


def _problem(n=70, p=350, seed=0, density=0.08):
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=density, random_state=seed + 1, format="csc")
    w = np.zeros(p)
    w[:6] = rng.standard_normal(6) * 2
    y = X @ w + 0.1 * rng.standard_normal(n)
    return X, y


def _dense_fw(X, y, delta, iters, intercept=True):
    """Textbook deterministic Frank-Wolfe (Algorithm 1, exact line search) on dense arrays."""
    X = X.toarray()
    if intercept:
        X = X - X.mean(0)
        y = y - y.mean()
    a = np.zeros(X.shape[1])
    for _ in range(iters):
        r = y - X @ a
        g = -X.T @ r
        i = int(np.argmax(np.abs(g)))
        u = np.zeros_like(a)
        u[i] = -delta * np.sign(g[i])
        v = X @ (u - a)
        a = a + np.clip((r @ v) / (v @ v), 0.0, 1.0) * (u - a)
    return a


def _centred(X, y, intercept=True):
    Xd = X.toarray()
    if intercept:
        return Xd - Xd.mean(0), y - y.mean()
    return Xd, y


def _fw_gap(X, y, coef, delta, intercept=True):
    Xc, yc = _centred(X, y, intercept)
    g = -Xc.T @ (yc - Xc @ coef)
    return float(coef @ g + delta * np.abs(g).max()), 0.5 * float(np.sum((yc - Xc @ coef) ** 2))


def _csc(seed, n=40, p=30, dtype=np.float64):
    m = sp.random(n, p, density=0.2, random_state=seed, format="csc", dtype=dtype)
    m.sort_indices()
    return m.indptr.astype(np.int64), m.indices.astype(np.int32), m.data, m


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("scaled", [False, True])
def test_score_kernel_matches_numpy(dtype, scaled):
    indptr, indices, data, m = _csc(3, dtype=dtype)
    rng = np.random.default_rng(0)
    n, p = m.shape
    scale = rng.uniform(0.5, 2.0, p) if scaled else np.zeros(0)
    s = scale if scaled else np.ones(p)
    y = rng.standard_normal(n)
    pv = rng.standard_normal(n)
    sigma = s * (m.T @ y)
    c = s * (m.T.astype(np.float64) @ pv) - sigma
    ex_idx = np.array([4, 11], np.int64)
    ex_val = np.array([5.0, -0.5])
    rel = 1e-6 if dtype == np.float32 else 1e-12
    for cols, every in ((np.zeros(0, np.int64), True), (np.array([1, 4, 7, 20], np.int64), False)):
        for extra in (False, True):
            grad = c.copy()
            if extra:
                grad[ex_idx] += ex_val
            thr = float(np.median(np.abs(c)))
            best, g, scored, visited, cmax, excess = fw_score_columns(
                indptr, indices, data, scale, sigma, pv, cols, every,
                ex_idx if extra else np.zeros(0, np.int64), ex_val if extra else np.zeros(0),
                thr,
            )  # fmt: skip
            idx = np.arange(p) if every else cols
            j = idx[int(np.argmax(np.abs(grad[idx])))]
            assert best == j
            assert g == pytest.approx(grad[j], rel=rel)
            assert scored == idx.shape[0]
            assert visited == int(np.diff(indptr)[idx].sum())
            assert cmax == pytest.approx(np.abs(c[idx]).max(), rel=rel)
            ex = np.abs(c[idx]) - thr
            assert excess == pytest.approx(np.square(ex[ex > 0]).sum(), rel=1e-5)
    rows, vals, total, sq = fw_column(indptr, indices, data, scale, 5)
    col = m[:, 5].toarray().ravel().astype(np.float64) * s[5]
    dense = np.zeros(n)
    dense[rows] = vals
    np.testing.assert_allclose(dense, col, rtol=1e-6)
    assert total == pytest.approx(col.sum()) and sq == pytest.approx(col @ col)


def test_sample_size_rules():
    assert sample_size(4272227, 0.01) == 42723  # the paper's Table 3, E2006-log1p
    assert sample_size(150360, 0.03) == 4511  # E2006-tfidf, 3%
    assert sample_size(10, 1.0) == 10
    # Eq. (12): confidence 0.98 of catching one of 2% relevant features: 194 (Sec. 4.5)
    p = 100000
    assert sample_size(p, (0.98, 2000)) == math.ceil(math.log(0.02) / math.log(0.98)) == 194
    for bad in (0.0, 1.5, -0.1, (1.0, 5), (0.9, 0), (0.9, 2 * p)):
        with pytest.raises(ValueError):
            sample_size(p, bad)


def test_split_sample_is_proportional_and_exact():
    widths = np.array([7, 300, 13, 1000, 1])
    for kappa in (1, 5, 50, 1321):
        parts = split_sample(kappa, widths)
        assert parts.sum() == kappa
        assert np.all(parts <= widths) and np.all(parts >= 0)
        assert np.all(np.abs(parts - kappa * widths / widths.sum()) < 1.0 + 1e-12)
    cols = sample_columns(1000, 30, 7, 3, 2)
    assert cols.shape == (30,) and np.unique(cols).shape == (30,) and np.all(np.diff(cols) > 0)
    np.testing.assert_array_equal(cols, sample_columns(1000, 30, 7, 3, 2))
    assert not np.array_equal(cols, sample_columns(1000, 30, 7, 4, 2))


@pytest.mark.parametrize("intercept", [True, False])
def test_full_sample_equals_deterministic_fw(intercept):
    X, y = _problem()
    delta = 4.0
    ref = _dense_fw(X, y, delta, 150, intercept)
    Xd = da.from_array(X, chunks=(X.shape[0], 120), asarray=False)  # 3 blocks, uneven
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dl1.ConvergenceWarning)
        res = dl1.fit_constrained(
            Xd,
            y,
            delta=delta,
            sample=1.0,
            stop="gap",
            tol=1e-300,
            max_iter=150,
            fit_intercept=intercept,
        )
    assert res.n_iter_ == 150
    np.testing.assert_allclose(res.coef_, ref, atol=1e-12)
    # only chosen columns travel, each once (cached by the coordinator)
    assert res.columns_fetched_ == len({h["vertex"] for h in res.history_ if "vertex" in h})
    gap, f = _fw_gap(X, y, res.coef_, delta, intercept)
    assert res.loss_ == pytest.approx(f, rel=1e-10)
    assert res.gap_kind_ == "full pass"
    assert res.fw_gap_ == pytest.approx(gap, rel=1e-8, abs=1e-12)
    pred = X @ res.coef_ + res.intercept_
    assert 0.5 * np.sum((y - pred) ** 2) == pytest.approx(f, rel=1e-10)


def test_fw_gap_goes_to_zero_and_is_exact():
    X, y = _problem(seed=3)
    delta = 6.0  # about half the l1 norm of the least-squares fit: several active features
    gaps = []
    for iters in (20, 200, 2000):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dl1.ConvergenceWarning)
            r = dl1.fit_constrained(
                X, y, delta=delta, sample=1.0, stop="gap", tol=1e-300,
                max_iter=iters,
            )  # fmt: skip
        gaps.append(r.fw_gap_)
    assert gaps[0] > gaps[1] > gaps[2] > 0
    # sublinear rate: the gap after 2000 iterations is far below the one after 20
    assert gaps[2] < gaps[0] / 20
    # sampled FW with the gap rule: certified, and the certificate recomputed in NumPy
    res = dl1.fit_constrained(X, y, delta=delta, sample=0.2, stop="gap", tol=1e-3)
    gap, f = _fw_gap(X, y, res.coef_, delta)
    assert res.certified_ and res.converged_ and res.gap_kind_ == "full pass"
    assert res.fw_gap_ == pytest.approx(gap, rel=1e-6, abs=1e-12)
    assert gap <= 1e-3 * res.f0_ * (1 + 1e-9)
    assert res.l1_norm_ <= delta * (1 + 1e-12)
    assert res.n_full_passes_ >= 1
    assert res.dot_products_ >= res.n_iter_ * sample_size(X.shape[1], 0.2)


def test_paper_stopping_rule_and_sample_estimate():
    X, y = _problem(seed=4)
    # the step rule does not look at the gap: it stops short of the default tol, and says so
    with pytest.warns(dl1.ConvergenceWarning, match=r"paper's step rule .* > tol 1e-04"):
        res = dl1.fit_constrained(X, y, delta=3.0, sample=0.1, stop="paper", step_tol=1e-3)
    assert res.converged_ and res.gap_kind_ == "full pass" and res.stopped_by_ == "step"
    gap, _ = _fw_gap(X, y, res.coef_, 3.0)
    assert res.fw_gap_ == pytest.approx(gap, rel=1e-6, abs=1e-12)
    with pytest.warns(dl1.ConvergenceWarning, match="sample estimate: certify=False"):
        est = dl1.fit_constrained(X, y, delta=3.0, sample=0.1, stop="paper", certify=False)
    np.testing.assert_array_equal(est.coef_, res.coef_)  # same seed, same run
    assert est.gap_kind_ == "sample estimate" and not est.certified_
    assert est.fw_gap_ <= gap * (1 + 1e-9)  # a sampled estimate is a lower bound
    assert math.isnan(est.lasso_gap_)


def test_lasso_certificate_of_constrained_solution():
    X, y = _problem(seed=5)
    res = dl1.fit_constrained(X, y, delta=1.5, sample=1.0, stop="gap", tol=1e-8)
    Xc, yc = _centred(X, y)
    n = X.shape[0]
    alpha = res.lasso_alpha_
    r = yc - Xc @ res.coef_
    # the penalised problem's gap, recomputed as scikit-learn defines it (divided by n)
    primal = 0.5 * r @ r / n + alpha * np.abs(res.coef_).sum()
    theta = r * min(1.0, n * alpha / np.abs(Xc.T @ r).max())
    dual = (theta @ yc - 0.5 * theta @ theta) / n
    assert res.lasso_gap_ == pytest.approx((primal - dual) / (0.5 * yc @ yc / n), rel=1e-6)
    from sklearn.linear_model import Lasso

    ref = Lasso(alpha=alpha, tol=1e-14, max_iter=100000).fit(X.toarray(), y)
    assert np.abs(ref.coef_).sum() == pytest.approx(res.l1_norm_, rel=1e-4)
    np.testing.assert_allclose(res.coef_, ref.coef_, atol=1e-4 * np.abs(ref.coef_).max())
    assert res.intercept_ == pytest.approx(ref.intercept_, abs=1e-4)


def test_elastic_net_in_constrained_form_matches_scikit_learn():
    X, y = _problem(seed=8)
    mu = 0.5
    res = dl1.fit_constrained(X, y, delta=1.5, l2=mu, sample=0.5, stop="gap", tol=1e-9,
                  max_iter=100000)  # fmt: skip
    Xc, yc = _centred(X, y)
    a = res.coef_
    r = yc - Xc @ a
    grad = -Xc.T @ r + mu * a
    assert res.loss_ == pytest.approx(0.5 * r @ r + 0.5 * mu * a @ a, rel=1e-10)
    assert res.fw_gap_ == pytest.approx(a @ grad + 1.5 * np.abs(grad).max(), abs=1e-9)
    assert res.certified_ and res.l1_norm_ == pytest.approx(1.5, rel=1e-9)
    n = X.shape[0]
    assert res.lasso_alpha_ * (1 - res.lasso_l1_ratio_) * n == pytest.approx(mu)
    from sklearn.linear_model import ElasticNet

    ref = ElasticNet(
        alpha=res.lasso_alpha_, l1_ratio=res.lasso_l1_ratio_, tol=1e-14, max_iter=100000
    ).fit(X.toarray(), y)
    np.testing.assert_allclose(a, ref.coef_, atol=1e-5 * np.abs(ref.coef_).max())
    assert np.abs(ref.coef_).sum() == pytest.approx(1.5, rel=1e-5)
    assert res.lasso_gap_ < 1e-8
    # a larger ridge shrinks the same ball's solution towards equal weights: different answer
    other = dl1.fit_constrained(X, y, delta=1.5, l2=50.0, sample=0.5, stop="gap", tol=1e-3,
                    max_iter=100000)  # fmt: skip
    assert np.abs(other.coef_ - a).max() > 1e-3


@pytest.mark.parametrize("intercept", [True, False])
def test_l1_logistic_in_constrained_form_matches_scikit_learn(intercept):
    from tests.test_penalised import logistic_reference

    X, y = _problem(n=120, p=300, seed=9)
    yl = np.where(y > np.median(y), 1.0, -1.0)
    res = dl1.fit_constrained(X, yl, loss="logistic", delta=3.0, sample=0.5, stop="gap",
                  tol=1e-8, max_iter=100000, fit_intercept=intercept)  # fmt: skip
    assert res.certified_ and res.l1_norm_ == pytest.approx(3.0, rel=1e-9)
    z = X @ res.coef_ + res.intercept_
    psi = -yl / (1.0 + np.exp(yl * z))
    assert res.loss_ == pytest.approx(np.logaddexp(0, -yl * z).sum(), rel=1e-10)
    if intercept:
        assert abs(psi.sum()) < 1e-8  # the intercept is optimal for the coefficients
    grad = X.T @ psi
    assert res.fw_gap_ == pytest.approx(res.coef_ @ grad + 3.0 * np.abs(grad).max(), abs=1e-9)
    coef, b = logistic_reference(X, yl, res.lasso_alpha_, intercept)
    assert np.abs(coef).sum() == pytest.approx(3.0, rel=1e-5)
    np.testing.assert_allclose(res.coef_, coef, atol=1e-4 * np.abs(coef).max())
    assert res.intercept_ == pytest.approx(b, abs=1e-4)
    assert res.lasso_gap_ < 1e-7
    path = dl1.path_constrained(X, yl, loss="logistic", deltas=[1.0, 2.0, 3.0], sample=0.5,
                    stop="gap", tol=1e-6, max_iter=100000, X_test=X, y_test=yl,
                    fit_intercept=intercept)  # fmt: skip
    assert path.converged_.all() and path.test_logloss_ is not None
    np.testing.assert_allclose(path.coefs_[:, 2].toarray().ravel(), res.coef_, atol=1e-3)


@pytest.mark.slow
def test_path_matches_penalised_lasso_with_same_l1_norm():
    X, y = _problem(n=80, p=400, seed=1)
    pen = dl1.path(X, y, n_alphas=8, eps=0.3, tol=1e-12)
    l1 = np.asarray(np.abs(pen.coefs_).sum(axis=0)).ravel()
    keep = l1 > 0
    fw = dl1.path_constrained(
        X, y, deltas=l1[keep], sample=0.5, stop="gap", tol=1e-5, max_iter=50000
    )
    assert fw.converged_.all()
    np.testing.assert_array_equal(fw.deltas_, l1[keep])
    Xc, yc = _centred(X, y)
    for k, kp in enumerate(np.flatnonzero(keep)):
        wp = pen.coefs_[:, kp].toarray().ravel()
        wf = fw.coefs_[:, k].toarray().ravel()
        fp = 0.5 * np.sum((yc - Xc @ wp) ** 2)
        ff = 0.5 * np.sum((yc - Xc @ wf) ** 2)
        # FW gap <= 1e-5 f(0) bounds f(a) - f*; f(0) < 3 f* here
        assert fp * (1 - 1e-9) <= ff <= fp * (1 + 3e-5)
        np.testing.assert_allclose(wf, wp, atol=1e-2 * np.abs(wp).max())
        assert fw.alphas_[k] == pytest.approx(pen.alphas_[kp], rel=1e-2)
        assert fw.intercepts_[k] == pytest.approx(pen.intercepts_[kp], abs=1e-2)
        assert fw.extra_[k]["lasso_gap"] < 1e-4


def test_path_grid_warm_starts_and_delta_max(tmp_path):
    X, y = _problem(seed=2)
    dmax = dl1.delta_max(X, y, eps=0.05)
    amax = dl1.alpha_max(X, y)
    ref = dl1.fit(X, y, alpha=0.05 * amax, tol=1e-10)
    assert dl1.delta_max(X, y, eps=0.05, tol=1e-10) == pytest.approx(
        np.abs(ref.coef_).sum(), rel=1e-8
    )
    assert dmax == pytest.approx(np.abs(ref.coef_).sum(), rel=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dl1.ConvergenceWarning)
        res = dl1.path_constrained(X, y, n_deltas=12, eps=0.05, sample=0.3, stop="paper")
    np.testing.assert_allclose(res.deltas_, np.geomspace(0.05 * dmax, dmax, 12))
    l1 = np.asarray(np.abs(res.coefs_).sum(axis=0)).ravel()
    assert np.all(l1 <= res.deltas_ * (1 + 1e-12))
    # warm starts: most deltas need few iterations once the path is under way
    its = np.array([e["iterations"] for e in res.extra_])
    assert res.rounds_.tolist() == its.tolist()
    assert all(e["gap_kind"] == "full pass" for e in res.extra_)
    files = res.plot(tmp_path)
    assert all(f.stat().st_size > 0 for f in files)
    assert "delta" in res.summary().splitlines()[0]


def test_path_validation_error_per_delta():
    X, y = _problem(n=120, seed=6)
    Xt, yt = X[80:], y[80:]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dl1.ConvergenceWarning)
        res = dl1.path_constrained(
            X[:80], y[:80], n_deltas=5, sample=0.5, stop="paper", X_test=Xt, y_test=yt
        )
    for k in range(5):
        pred = Xt @ res.coefs_[:, k].toarray().ravel() + res.intercepts_[k]
        assert res.test_mse_[k] == pytest.approx(np.mean((yt - pred) ** 2), rel=1e-10)
    assert res.best_delta_ == res.deltas_[res.best_index_]


def test_fw_on_local_cluster_is_deterministic(local_cluster):
    X, y = _problem(n=90, p=500, seed=7)
    Xd = da.from_array(X, chunks=(90, 130), asarray=False)
    kw = dict(delta=1.0, sample=0.05, stop="gap", tol=1e-6)
    local = dl1.fit_constrained(Xd, y, **kw)
    remote = dl1.fit_constrained(Xd, y, client=local_cluster, **kw)
    remote3 = dl1.fit_constrained(Xd, y, client=local_cluster, n_partitions=3, **kw)
    for r in (remote, remote3):
        np.testing.assert_array_equal(r.coef_, local.coef_)
        assert r.n_iter_ == local.n_iter_ and r.fw_gap_ == local.fw_gap_
    assert local.certified_ and local.n_active_ >= 2
    pkw = dict(deltas=[0.5, 1.0], sample=0.05, stop="gap", tol=1e-6)
    path = dl1.path_constrained(Xd, y, client=local_cluster, **pkw)
    path_local = dl1.path_constrained(Xd, y, **pkw)
    assert path.converged_.all()
    assert (path.coefs_ != path_local.coefs_).nnz == 0
    np.testing.assert_array_equal(path.gaps_, path_local.gaps_)


def test_fw_refuses_what_it_does_not_solve(tmp_path):
    X, y = _problem()
    # the constrained problem has entry points of its own: the penalised ones refuse its
    # parameters, and it refuses theirs
    with pytest.raises(TypeError, match="alpha"):
        dl1.fit_constrained(X, y, delta=1.0, alpha=0.1)
    with pytest.raises(TypeError, match="delta"):
        dl1.fit_constrained(X, y)
    with pytest.raises(TypeError, match="l1_ball"):
        dl1.fit(X, y, alpha=0.1, l1_ball=1.0)
    with pytest.raises(ValueError, match="solver"):
        dl1.fit(X, y, alpha=0.1, solver="fw")
    with pytest.raises(TypeError, match="deltas"):
        dl1.path(X, y, deltas=[1.0])
    with pytest.raises(ValueError, match="delta"):
        dl1.fit_constrained(X, y, delta=-1.0)
    with pytest.raises(ValidationError, match="label"):
        dl1.fit_constrained(X, y, delta=1.0, loss="logistic")
    with pytest.raises(TypeError, match="sample_weight"):
        dl1.fit_constrained(X, y, delta=1.0, sample_weight=np.ones(X.shape[0]))
    weighted = dl1.from_scipy(X, y, tmp_path / "w.zarr", sample_weight=np.ones(X.shape[0]))
    with pytest.raises(ValidationError, match="sample weights"):
        dl1.fit_constrained(weighted, delta=1.0)
    with pytest.raises(ValueError, match="sample"):
        dl1.fit_constrained(X, y, delta=1.0, sample=0.0)
    with pytest.raises(ValueError, match="stop"):
        dl1.fit_constrained(X, y, delta=1.0, stop="never")
    with pytest.raises(TypeError, match="checkpoint"):
        dl1.path_constrained(X, y, deltas=[1.0], checkpoint=tmp_path / "ck")
    with pytest.raises(TypeError, match="l1_ratio"):
        dl1.path_constrained(X, y, deltas=[1.0], l1_ratio=0.5)
    with pytest.raises(ValueError, match="l2"):
        dl1.fit_constrained(X, y, delta=1.0, l2=-1.0)
    with pytest.raises(ValueError, match="deltas"):
        dl1.path_constrained(X, y, deltas=[1.0, -1.0])
    store = dl1.from_scipy(X, y, tmp_path / "s.zarr")
    with pytest.raises(ValidationError, match="worker memory"):
        dl1.fit_constrained(store, delta=1.0, stream=True)


def test_standardized_ball_and_input_scale_coefficients():
    X, y = _problem(seed=10)
    X = sp.csc_matrix(X.multiply(np.linspace(0.2, 5.0, X.shape[1])[None, :]))
    res = dl1.fit_constrained(X, y, delta=0.3, sample=0.5, stop="gap", tol=1e-6,
                  standardize=True, max_iter=100000)  # fmt: skip
    Xd = X.toarray()
    std = Xd.std(axis=0)
    # the ball constrains the standardised coefficients; coef_ is in the input's scale
    assert np.abs(res.coef_ * std).sum() == pytest.approx(0.3, rel=1e-9)
    r = y - Xd @ res.coef_ - res.intercept_
    assert abs(r.sum()) < 1e-8 * np.abs(y).sum()
    assert res.loss_ == pytest.approx(0.5 * r @ r, rel=1e-9)
    # the same problem solved by dense FW on explicitly standardised columns
    Z = sp.csc_matrix((Xd - Xd.mean(0)) / np.where(std > 0, std, 1.0))
    ref = dl1.fit_constrained(Z, y, delta=0.3, sample=0.5, stop="gap", tol=1e-6,
                  max_iter=100000)  # fmt: skip
    assert res.loss_ == pytest.approx(ref.loss_, rel=1e-5)


def _project_l1_ball(v, delta):
    """Euclidean projection onto ``||w||_1 <= delta`` (Duchi et al., 2008)."""
    if np.abs(v).sum() <= delta:
        return v
    u = np.sort(np.abs(v))[::-1]
    css = np.cumsum(u)
    k = np.flatnonzero(u * np.arange(1, u.size + 1) > css - delta)[-1]
    theta = (css[k] - delta) / (k + 1.0)
    return np.sign(v) * np.maximum(np.abs(v) - theta, 0.0)


def _constrained_optimum(X, y, delta, iters=5000):
    """``min 1/2 ||y - X w - b||^2`` s.t. ``||w||_1 <= delta`` by accelerated projected
    gradient (FISTA) on dense centred arrays: a reference independent of Frank-Wolfe."""
    Xc, yc = _centred(X, y)
    step = 1.0 / np.linalg.norm(Xc, 2) ** 2
    w = z = np.zeros(Xc.shape[1])
    t = 1.0
    for _ in range(iters):
        w_next = _project_l1_ball(z + step * Xc.T @ (yc - Xc @ z), delta)
        t_next = 0.5 * (1 + math.sqrt(1 + 4 * t * t))
        z = w_next + (t - 1) / t_next * (w_next - w)
        w, t = w_next, t_next
    return w


def _issue_problem():
    """Issue 23's case in small: few relevant features among many, a ball smaller than the
    true coefficients' l1 norm (2 active features at the optimum)."""
    rng = np.random.default_rng(0)
    n, p = 300, 1003
    X = sp.random(n, p, density=0.1, random_state=1, format="csc")
    w = np.zeros(p)
    w[:5] = rng.standard_normal(5) * 3
    y = X @ w + 0.1 * rng.standard_normal(n)
    return X, y, 0.3 * np.abs(w).sum()


def test_default_stop_reaches_tol_where_the_paper_rule_stops_short():
    X, y, delta = _issue_problem()
    ref = _constrained_optimum(X, y, delta)
    ref_gap, f_star = _fw_gap(X, y, ref, delta)
    assert ref_gap <= 1e-9 * f_star  # the reference is itself certified
    res = dl1.fit_constrained(X, y, delta=delta, tol=1e-7)  # no warning: tol is reached
    assert res.stopped_by_ == "gap" and res.certified_ and res.gap_kind_ == "full pass"
    gap, f = _fw_gap(X, y, res.coef_, delta)
    assert gap <= 1e-7 * res.f0_ * (1 + 1e-9) and res.gap_ <= 1e-7
    assert res.loss_ == pytest.approx(f, rel=1e-10)
    # the FW gap bounds f - f*: within 1e-7 f(0) of the optimum, f(0) < 10 f* here
    assert res.f0_ < 10 * f_star
    assert f_star * (1 - 1e-9) <= f <= f_star * (1 + 1e-6)
    # the paper's step rule, which ignores tol, stops far from the optimum: it warns with the
    # gap it reached, the tolerance and the rule
    with pytest.warns(dl1.ConvergenceWarning) as rec:
        paper = dl1.fit_constrained(X, y, delta=delta, tol=1e-7, stop="paper")
    assert paper.stopped_by_ == "step" and not paper.certified_ and paper.gap_ > 1e-2
    assert str(rec[0].message) == (
        "Frank-Wolfe stopped by the paper's step rule (||w_k+1 - w_k||_inf <= 0.001) at "
        f"relative FW gap {paper.gap_:.1e} > tol 1e-07"
    )
    assert paper.loss_ > 1.2 * f_star


def test_max_iter_warns_with_the_gap_reached():
    X, y, delta = _issue_problem()
    with pytest.warns(dl1.ConvergenceWarning) as rec:
        res = dl1.fit_constrained(X, y, delta=delta, tol=1e-7, max_iter=1)
    assert res.stopped_by_ == "max_iter" and res.n_iter_ == 1 and not res.certified_
    (w,) = rec
    assert f"stopped by max_iter=1 at relative FW gap {res.gap_:.1e} > tol 1e-07" in str(w.message)
    # without the certifying pass, the gap is the sample's estimate: the warning says so
    with pytest.warns(dl1.ConvergenceWarning, match=r"max_iter=1 .*sample estimate"):
        est = dl1.fit_constrained(X, y, delta=delta, tol=1e-7, max_iter=1, certify=False)
    assert est.gap_kind_ == "sample estimate"


def test_path_warns_once_listing_the_radii_that_missed():
    X, y, delta = _issue_problem()
    deltas = [0.5 * delta, delta, 2 * delta]
    with pytest.warns(dl1.ConvergenceWarning) as rec:
        res = dl1.path_constrained(X, y, deltas=deltas, tol=1e-7, stop="paper")
    (w,) = rec  # one warning for the whole path
    text = str(w.message)
    missed = np.flatnonzero(~res.converged_)
    assert missed.size >= 1 and f"{missed.size} of 3 radii missed tol 1e-07" in text
    for k in missed:
        assert f"delta[{k}] = {deltas[k]:.4g} stopped by the paper's step rule" in text
        assert f"relative FW gap {res.gaps_[k]:.1e} > tol 1e-07" in text
    assert [e["stopped_by"] for e in res.extra_] == ["step"] * 3
    # the default rule certifies every radius: no warning
    ok = dl1.path_constrained(X, y, deltas=deltas[:2], tol=1e-7)
    assert ok.converged_.all() and [e["stopped_by"] for e in ok.extra_] == ["gap"] * 2


def test_parameters_are_checked_before_the_data_is_read(tmp_path):
    missing = tmp_path / "no-such-store"
    for bad in ({"delta": 0.0}, {"delta": 1.0, "sample": (1.0, 5)}, {"delta": 1.0, "sample": 2},
                {"delta": 1.0, "sample": (0.9, 0)}, {"delta": 1.0, "tol": 0.0},
                {"delta": 1.0, "max_iter": 1.5}, {"delta": 1.0, "certify": 1}):  # fmt: skip
        with pytest.raises(InvalidParameterError, match=r"of dl1\.fit_constrained\(\)"):
            dl1.fit_constrained(missing, **bad)
    with pytest.raises(InvalidParameterError, match=r"'sample' .* a pair \(rho, s\)"):
        dl1.fit_constrained(missing, delta=1.0, sample="1%")
    for bad in ({"n_deltas": 0}, {"eps": 1.0}, {"delta_max": -1.0}, {"stop": "step"}):
        with pytest.raises(InvalidParameterError, match=r"of dl1\.path_constrained\(\)"):
            dl1.path_constrained(missing, **bad)
    X, y = _problem()
    res = dl1.fit_constrained(X, y, delta=0.5, sample=(0.9, 3), tol=1e-3)
    assert res.kappa_ == sample_size(X.shape[1], (0.9, 3)) and res.certified_


def _poisson_terms(y, z):
    mu = np.exp(z)
    return (mu - y * z).sum(), mu - y


def _huber_terms(y, z, eps=1.0):
    r = y - z
    loss = np.where(np.abs(r) <= eps, 0.5 * r * r, eps * np.abs(r) - 0.5 * eps * eps)
    return loss.sum(), -np.clip(r, -eps, eps)


def _constrained_reference(X, y, delta, terms, iters=30000):
    """``min sum_i loss(y_i, x_i w + b)`` s.t. ``||w||_1 <= delta`` (``b`` free) by projected
    gradient with backtracking on dense arrays, stopped when a step no longer moves; with its
    FW gap ``grad_w^T w + delta ||grad_w||_inf`` and ``|d/db|``: a reference independent of
    Frank-Wolfe and of dl1's datafits."""
    Xd = X.toarray()
    w, b, L = np.zeros(Xd.shape[1]), 0.0, 1.0
    for _ in range(iters):
        f, g = terms(y, Xd @ w + b)
        gw, gb = Xd.T @ g, g.sum()
        while True:
            w_new, b_new = _project_l1_ball(w - gw / L, delta), b - gb / L
            d = np.append(w_new - w, b_new - b)
            if terms(y, Xd @ w_new + b_new)[0] <= f + np.append(gw, gb) @ d + 0.5 * L * d @ d:
                break
            L *= 2.0
        w, b, L = w_new, b_new, L / 1.2
        if np.abs(d).max() < 1e-14:
            break
    f, g = terms(y, Xd @ w + b)
    gw = Xd.T @ g
    return w, b, f, gw @ w + delta * np.abs(gw).max(), abs(g.sum())


@pytest.mark.parametrize("loss", [pytest.param("poisson", marks=pytest.mark.slow), "huber"])
def test_poisson_and_huber_in_constrained_form_match_a_dense_reference(loss):
    """Any differentiable datafit is solved by Frank-Wolfe through its gradient and Hessian
    diagonal: the FW gap (recomputed here) bounds the answer's distance to projected
    gradient's objective, 1e-5 of ``f(0)`` (plain FW converges sublinearly: tighter takes
    tens of thousands of iterations), and the penalised certificate holds."""
    rng = np.random.default_rng(3)
    n, p = 150, 60
    X = sp.random(n, p, density=0.15, random_state=4, format="csc")
    w = np.zeros(p)
    w[:6] = rng.uniform(-1.5, 1.5, 6)
    if loss == "poisson":
        y, terms, datafit = rng.poisson(np.exp(X @ w + 0.3)).astype(float), _poisson_terms, loss
    else:
        y = X @ w + 0.2 + rng.standard_t(2, n)
        terms, datafit = _huber_terms, dl1.objective.datafits.Huber(epsilon=1.0)
    delta = 0.5 * np.abs(w).sum()
    res = dl1.fit_constrained(X, y, loss=datafit, delta=delta, sample=0.5, stop="gap",
                              tol=1e-5, max_iter=100000)  # fmt: skip
    assert res.certified_ and np.abs(res.coef_).sum() <= delta * (1 + 1e-12)
    f, g = terms(y, X @ res.coef_ + res.intercept_)
    assert res.loss_ == pytest.approx(f, rel=1e-10)
    assert abs(g.sum()) < 1e-8 * n  # the intercept is optimal for the coefficients
    gw = X.T @ g
    assert res.fw_gap_ == pytest.approx(gw @ res.coef_ + delta * np.abs(gw).max(), abs=1e-8)
    _, _, f_ref, gap_ref, db_ref = _constrained_reference(X, y, delta, terms)
    assert gap_ref < 1e-7 * f_ref and db_ref < 1e-6  # f_ref - f* <= gap_ref
    assert f_ref - gap_ref <= f <= f_ref + res.fw_gap_
    assert res.fw_gap_ <= 1e-5 * res.f0_
    assert res.lasso_gap_ < 1e-3


def test_a_non_differentiable_loss_is_refused_before_the_blocks_load():
    X, y = _problem()
    yl = np.where(y > np.median(y), 1.0, -1.0)
    with pytest.raises(ValidationError, match="differentiable loss.*'hinge'"):
        dl1.fit_constrained(X, yl, delta=1.0, loss="hinge")
    with pytest.raises(ValidationError, match="differentiable loss"):
        dl1.path_constrained(X, yl, deltas=[1.0], loss="hinge")
