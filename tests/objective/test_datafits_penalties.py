"""Datafits, the elastic-net penalty and the duality gap against brute force and scikit-learn."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest
from scipy.optimize import minimize_scalar
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import ElasticNet as SkElasticNet
from sklearn.linear_model import LogisticRegression

from dl1.errors import ValidationError
from dl1.objective.datafits import Logistic, Quadratic, normalize_sample_weight
from dl1.objective.gap import duality_gap, duality_gap_from_stats
from dl1.objective.penalties import ElasticNet, alpha_max, soft_threshold

N, P = 60, 25


def make_problem(loss, seed=0, n=N, p=P):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p)) * (rng.random((n, p)) < 0.4)
    w_true = np.zeros(p)
    w_true[:5] = 2.0 * rng.standard_normal(5)
    z = X @ w_true + 0.5 * rng.standard_normal(n) + 0.3
    y = z if loss == "quadratic" else np.where(z > 0, 1.0, -1.0)
    s = normalize_sample_weight(rng.uniform(0.1, 3.0, n), n)
    return X, y, s


def datafit_of(loss):
    return Quadratic() if loss == "quadratic" else Logistic()


def alpha_for(datafit, X, y, s, intercept, fraction, l1_ratio):
    n = len(y)
    b0 = datafit.initial_intercept(y, s) if intercept else 0.0
    g0 = datafit.gradient(y, np.full(n, b0), s)
    return fraction * alpha_max(np.abs(X.T @ g0).max(), l1_ratio)


def sklearn_optimum(loss, X, y, s, intercept, alpha, l1_ratio):
    """``(w, b)`` minimising ``F(Xw + b) + penalty(w)``, from scikit-learn."""
    n = len(y)
    if loss == "quadratic":
        est = SkElasticNet(
            alpha=alpha, l1_ratio=l1_ratio, fit_intercept=intercept, tol=1e-14, max_iter=200_000
        )
    else:
        solver = "liblinear" if not intercept and l1_ratio == 1.0 else "saga"
        est = LogisticRegression(
            l1_ratio=l1_ratio,
            C=1.0 / (n * alpha),
            solver=solver,
            fit_intercept=intercept,
            tol=1e-14,
            max_iter=200_000,
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(X, y, sample_weight=s)
    coef = np.ravel(est.coef_)
    return coef, (float(np.ravel(est.intercept_)[0]) if intercept else 0.0)


def gap_at(datafit, penalty, X, y, w, b, s, intercept):
    z = X @ w + b
    theta = datafit.dual_point(y, z, s, intercept)
    return duality_gap(datafit, penalty, y, z, w, X.T @ theta, s=s, intercept=intercept)


# ---------------------------------------------------------------- datafits


@pytest.mark.parametrize("loss", ["quadratic", "logistic"])
@pytest.mark.parametrize("weighted", [False, True])
def test_value_and_gradient(loss, weighted):
    X, y, s = make_problem(loss)
    s = s if weighted else None
    datafit = datafit_of(loss)
    z = np.random.default_rng(1).standard_normal(N) * 3
    sv = np.ones(N) if s is None else s
    if loss == "quadratic":
        losses = 0.5 * (y - z) ** 2
    else:
        losses = np.log1p(np.exp(-y * z))
    np.testing.assert_allclose(datafit.value(y, z, s), (sv * losses).mean(), rtol=1e-13)
    g = datafit.gradient(y, z, s)
    eps = 1e-6
    for i in [0, 7, N - 1]:
        e = np.zeros(N)
        e[i] = eps
        fd = (datafit.value(y, z + e, s) - datafit.value(y, z - e, s)) / (2 * eps)
        np.testing.assert_allclose(g[i], fd, rtol=1e-6, atol=1e-12)


def test_logistic_is_stable_for_large_margins():
    datafit = Logistic()
    y = np.array([1.0, -1.0, 1.0, -1.0])
    z = np.array([1e4, 1e4, -1e4, -1e4])
    np.testing.assert_allclose(datafit.value(y, z), (0 + 1e4 + 1e4 + 0) / 4)
    np.testing.assert_allclose(datafit.gradient(y, z), [0.0, 0.25, -0.25, 0.0])


@pytest.mark.parametrize("loss", ["quadratic", "logistic"])
@pytest.mark.parametrize("weighted", [False, True])
def test_conjugate_fenchel_young_and_brute_force(loss, weighted):
    X, y, s = make_problem(loss, seed=2)
    s = s if weighted else None
    datafit = datafit_of(loss)
    z = np.random.default_rng(2).standard_normal(N)
    theta = datafit.dual_point(y, z, s)
    np.testing.assert_allclose(theta, -N * datafit.gradient(y, z, s), rtol=1e-14)
    # Fenchel-Young equality at phi = grad F(z): F(z) + F^*(phi) = phi^T z.
    np.testing.assert_allclose(
        datafit.value(y, z, s) + datafit.conjugate(y, theta, s), -theta @ z / N, rtol=1e-12
    )
    # -F^*(-theta / n) = min_z F(z) + theta^T z / n, coordinate by coordinate.
    theta = 0.7 * theta
    sv = np.ones(N) if s is None else s
    total = 0.0
    for i in range(N):
        yi, si, ti = y[i : i + 1], sv[i : i + 1], theta[i]

        def h(zi, yi=yi, si=si, ti=ti):
            return datafit.value(yi, np.array([zi]), si) + ti * zi

        total += minimize_scalar(h, bracket=(-5, 5), tol=1e-12).fun / N
    np.testing.assert_allclose(-datafit.conjugate(y, theta, s), total, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("loss", ["quadratic", "logistic"])
@pytest.mark.parametrize("weighted", [False, True])
def test_conjugate_line_is_the_conjugate_of_the_scaled_point(loss, weighted):
    """``conjugate_line(y, theta, s)(c)`` (the form the gap and proximal Newton use) is the
    conjugate at ``c * theta``, computed without forming it."""
    X, y, s = make_problem(loss, seed=2)
    s = s if weighted else None
    datafit = datafit_of(loss)
    z = np.random.default_rng(12).standard_normal(N)
    theta = datafit.dual_point(y, z, s, intercept=True)
    line = datafit.conjugate_line(y, theta, s)
    for c in [1.0, 0.8, 1.0 / 3.0]:
        np.testing.assert_allclose(line(c), datafit.conjugate(y, c * theta, s), rtol=1e-13)
    if loss == "logistic":  # exactly the same operations as forming c * theta
        assert all(line(c) == datafit.conjugate(y, c * theta, s) for c in [0.8, 1.0 / 3.0])
        assert line(1.5) == np.inf


def test_conjugate_domain():
    y = np.array([1.0, -1.0])
    assert Logistic().conjugate(y, np.array([1.5, -0.5])) == np.inf
    assert Logistic().conjugate(y, np.array([-0.1, -0.5])) == np.inf
    assert Logistic().conjugate(y, np.array([1.0, 0.0])) == 0.0
    s = np.array([0.0, 2.0])
    assert Logistic().conjugate(y, np.array([0.1, -0.5]), s) == np.inf
    assert Quadratic().conjugate(y, np.array([0.1, -0.5]), s) == np.inf
    np.testing.assert_allclose(Quadratic().conjugate(y, np.array([0.0, -1.0]), s), (0.25 - 1.0) / 2)


@pytest.mark.parametrize("loss", ["quadratic", "logistic"])
@pytest.mark.parametrize("weighted", [False, True])
def test_initial_intercept_and_intercept_update(loss, weighted):
    X, y, s = make_problem(loss, seed=3)
    s = s if weighted else None
    datafit = datafit_of(loss)
    b0 = datafit.initial_intercept(y, s)
    best = minimize_scalar(lambda b: datafit.value(y, np.full(N, b), s), tol=1e-12).x
    np.testing.assert_allclose(b0, best, atol=1e-6)
    z = np.random.default_rng(3).standard_normal(N)
    best = minimize_scalar(lambda b: datafit.value(y, z + b, s), tol=1e-12).x
    for offset in [0.0, 4.0, -40.0]:
        one = datafit.intercept_update(y, z + offset, s)
        assert datafit.value(y, z + offset + one, s) < datafit.value(y, z + offset, s)
        many = datafit.intercept_update(y, z + offset, s, max_iter=100)
        np.testing.assert_allclose(offset + many, best, atol=1e-6)
        if loss == "quadratic":
            assert one == pytest.approx(many, abs=1e-12)


@pytest.mark.parametrize("loss", ["quadratic", "logistic"])
@pytest.mark.parametrize("weighted", [False, True])
def test_dual_point_with_intercept_sums_to_zero(loss, weighted):
    X, y, s = make_problem(loss, seed=4)
    s = s if weighted else None
    datafit = datafit_of(loss)
    z = np.random.default_rng(4).standard_normal(N) + 2.0
    theta = datafit.dual_point(y, z, s, intercept=True)
    assert abs(theta.sum()) <= 1e-13 * np.abs(theta).sum()
    assert np.isfinite(datafit.conjugate(y, theta, s))
    if loss == "quadratic":
        db = datafit.intercept_update(y, z, s)
        np.testing.assert_allclose(theta, -N * datafit.gradient(y, z + db, s), atol=1e-13)


def test_logistic_single_class_dual_point_is_zero():
    y = np.ones(5)
    theta = Logistic().dual_point(y, np.zeros(5), intercept=True)
    np.testing.assert_array_equal(theta, 0.0)
    with pytest.raises(ValidationError, match="both labels"):
        Logistic().initial_intercept(y)


def test_validate_y():
    np.testing.assert_array_equal(Logistic().validate_y([1, -1, 1]), [1.0, -1.0, 1.0])
    with pytest.raises(ValidationError, match=r"y\[2\] = 0"):
        Logistic().validate_y(np.array([1, -1, 0, 2]))
    with pytest.raises(ValidationError, match=r"y\[1\]"):
        Logistic().validate_y(np.array([1.0, np.nan]))
    with pytest.raises(ValidationError, match="1-D"):
        Logistic().validate_y(np.ones((2, 2)))
    with pytest.raises(ValidationError, match=r"y\[3\]"):
        Quadratic().validate_y(np.array([1.0, 2.0, 3.0, np.inf]))
    assert Quadratic().validate_y([1, 2]).dtype == np.float64


def test_normalize_sample_weight():
    assert normalize_sample_weight(None, 3) is None
    np.testing.assert_allclose(normalize_sample_weight([1, 2, 3], 3), [0.5, 1.0, 1.5])
    with pytest.raises(ValidationError, match=r"sample_weight\[1\]"):
        normalize_sample_weight([1.0, -1.0, 2.0], 3)
    with pytest.raises(ValidationError, match="sums to 0"):
        normalize_sample_weight([0.0, 0.0], 2)
    with pytest.raises(ValidationError, match="shape"):
        normalize_sample_weight([1.0, 1.0], 3)


def test_pickle_roundtrip():
    for obj in [Quadratic(), Logistic(), ElasticNet(0.3, 0.25)]:
        clone = pickle.loads(pickle.dumps(obj))
        assert clone == obj and repr(clone) == repr(obj)
    assert Quadratic() != Logistic()
    assert Logistic.beta == 0.25 and Quadratic.beta == 1.0


# ---------------------------------------------------------------- penalty


def test_penalty_value_prox_conjugate():
    pen = ElasticNet(0.8, 0.25)
    assert pen.alpha_l1 == pytest.approx(0.2) and pen.alpha_l2 == pytest.approx(0.6)
    w = np.array([1.0, -2.0, 0.0, 0.05])
    np.testing.assert_allclose(pen.value(w), 0.2 * 3.05 + 0.3 * (1 + 4 + 0.0025))
    np.testing.assert_allclose(soft_threshold(w, 0.5), [0.5, -1.5, 0.0, 0.0])
    for step in [0.5, 2.0]:
        prox = pen.prox(w, step)
        for j, wj in enumerate(w):
            ref = minimize_scalar(
                lambda x, wj=wj, step=step: 0.5 * (x - wj) ** 2 + step * pen.value([x]),
                bracket=(-3, 3),
                tol=1e-12,
            ).x
            assert prox[j] == pytest.approx(ref, abs=1e-7)
    v = np.array([0.1, -0.9, 2.0])
    ref = sum(
        -minimize_scalar(lambda x, vj=vj: pen.value([x]) - vj * x, bracket=(-3, 3), tol=1e-12).fun
        for vj in v
    )
    np.testing.assert_allclose(pen.conjugate(v), ref, rtol=1e-9)
    lasso = ElasticNet(0.5)
    assert lasso.conjugate([0.5, -0.2]) == 0.0
    assert lasso.conjugate([0.51, -0.2]) == np.inf
    assert lasso.dual_feasible_scale(2.0, 4) == 1.0
    assert lasso.dual_feasible_scale(8.0, 4) == pytest.approx(0.25)
    absmax, excess = pen.xt_theta_stats(v * 10, 10)
    assert absmax == pytest.approx(20.0)
    np.testing.assert_allclose(pen.conjugate_from_stats(excess, 10), pen.conjugate(v))
    with pytest.raises(ValueError, match="l1_ratio"):
        ElasticNet(1.0, 1.5)
    with pytest.raises(ValueError, match="alpha"):
        ElasticNet(-1.0)


@pytest.mark.parametrize("l1_ratio", [1.0, 0.5])
@pytest.mark.parametrize("intercept", [False, True])
def test_alpha_max_matches_sklearn(l1_ratio, intercept):
    X, y, s = make_problem("quadratic", seed=5)
    a_max = alpha_for(Quadratic(), X, y, s, intercept, 1.0, l1_ratio)
    assert ElasticNet.alpha_max(0.0) == 0.0
    assert alpha_max(1.0, 0.0) == np.inf
    for factor, all_zero in [(1.0001, True), (0.99, False)]:
        est = SkElasticNet(
            alpha=factor * a_max, l1_ratio=l1_ratio, fit_intercept=intercept, tol=1e-10
        ).fit(X, y, sample_weight=s)
        assert (not np.any(est.coef_)) == all_zero


# ---------------------------------------------------------------- duality gap


def sklearn_gap_formula(X, y, w, b, s, intercept, alpha, l1_ratio):
    """Transcription of scikit-learn's ``gap_enet`` (formulation A) divided by ``n``.

    scikit-learn centers ``X``, ``y`` with the weighted means when fitting an intercept, then
    multiplies rows by ``sqrt(s)``; ``b`` must be the intercept it would report for ``w``.
    """
    n = len(y)
    sv = np.ones(n) if s is None else s
    if intercept:
        x_mean, y_mean = sv @ X / sv.sum(), sv @ y / sv.sum()
        X, y = X - x_mean, y - y_mean
        assert b == pytest.approx(y_mean - x_mean @ w, abs=1e-12)
    X, y = X * np.sqrt(sv)[:, None], y * np.sqrt(sv)
    l1_reg, l2_reg = alpha * l1_ratio * n, alpha * (1 - l1_ratio) * n
    R = y - X @ w
    xta = X.T @ R - l2_reg * w
    dual_norm = np.abs(xta).max()
    primal = 0.5 * (R @ R + l2_reg * w @ w) + l1_reg * np.abs(w).sum()
    scale = min(1.0, l1_reg / dual_norm) if dual_norm > 0 else 1.0
    dual = -0.5 * scale**2 * (R @ R + l2_reg * w @ w) + scale * (R @ y)
    return (primal - dual) / n


@pytest.mark.parametrize("intercept", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_lasso_gap_is_sklearn_gap(intercept, weighted):
    X, y, s = make_problem("quadratic", seed=6)
    s = s if weighted else None
    datafit, rng = Quadratic(), np.random.default_rng(6)
    alpha = alpha_for(datafit, X, y, s, intercept, 0.2, 1.0)
    pen = ElasticNet(alpha)
    w_opt, b_opt = sklearn_optimum("quadratic", X, y, s, intercept, alpha, 1.0)
    for w in [w_opt, w_opt + 0.01 * rng.standard_normal(P), rng.standard_normal(P)]:
        b = datafit.intercept_update(y, X @ w, s) if intercept else 0.0
        primal, dual, gap = gap_at(datafit, pen, X, y, w, b, s, intercept)
        expected = sklearn_gap_formula(X, y, w, b, s, intercept, alpha, 1.0)
        np.testing.assert_allclose(gap, expected, rtol=1e-9, atol=1e-15)
        assert primal - dual == gap
    est = SkElasticNet(
        alpha=alpha, l1_ratio=1.0, fit_intercept=intercept, tol=1e-14, max_iter=200_000
    ).fit(X, y, sample_weight=s)
    _, _, gap = gap_at(datafit, pen, X, y, est.coef_, est.intercept_, s, intercept)
    assert abs(gap - est.dual_gap_) < 1e-14


@pytest.mark.parametrize("loss", ["quadratic", "logistic"])
@pytest.mark.parametrize("intercept", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("l1_ratio", [1.0, 0.6])
def test_gap_bounds_suboptimality_and_vanishes(loss, intercept, weighted, l1_ratio):
    X, y, s = make_problem(loss, seed=7)
    s = s if weighted else None
    datafit, rng = datafit_of(loss), np.random.default_rng(7)
    alpha = alpha_for(datafit, X, y, s, intercept, 0.15, l1_ratio)
    pen = ElasticNet(alpha, l1_ratio)
    w_opt, b_opt = sklearn_optimum(loss, X, y, s, intercept, alpha, l1_ratio)
    p_opt, d_opt, gap_opt = gap_at(datafit, pen, X, y, w_opt, b_opt, s, intercept)
    assert abs(gap_opt) < 1e-9
    for scale in [1e-3, 1e-1, 1.0, 10.0]:
        w = w_opt + scale * rng.standard_normal(P) * (rng.random(P) < 0.5)
        b = b_opt + scale * rng.standard_normal() if intercept else 0.0
        primal, dual, gap = gap_at(datafit, pen, X, y, w, b, s, intercept)
        assert dual <= p_opt + 1e-12
        assert gap >= primal - p_opt - 1e-12
        assert gap > 0
    zero = np.zeros(P)
    b0 = datafit.initial_intercept(y, s) if intercept else 0.0
    primal, _, _ = gap_at(datafit, pen, X, y, zero, b0, s, intercept)
    assert primal == pytest.approx(datafit.value(y, np.full(N, b0), s))


def test_gap_from_stats_and_given_theta_agree():
    X, y, s = make_problem("logistic", seed=8)
    datafit, pen = Logistic(), ElasticNet(0.01, 0.5)
    w = np.random.default_rng(8).standard_normal(P) * 0.3
    z = X @ w + 0.2
    theta = datafit.dual_point(y, z, s, intercept=True)
    xt = X.T @ theta
    ref = duality_gap(datafit, pen, y, z, w, xt, s=s)
    assert duality_gap(datafit, pen, y, z, w, xt, s=s, theta=theta) == ref
    absmax, excess = pen.xt_theta_stats(xt, N)
    assert duality_gap_from_stats(datafit, pen, y, z, w, absmax, excess, s=s) == ref


@pytest.mark.parametrize("weighted", [False, True])
def test_logistic_shift_sums_match_numpy(weighted):
    """The intercept's Newton sums, computed in reused buffers, equal the NumPy formulas."""
    from scipy.special import expit

    from dl1.objective.datafits.logistic import _ShiftSums

    rng = np.random.default_rng(4)
    n = 500
    y = np.where(rng.random(n) < 0.3, -1.0, 1.0)
    z = 3.0 * rng.standard_normal(n)
    s = rng.uniform(0.1, 2.0, n) if weighted else None
    at = _ShiftSums(y, z, s)
    for shift in (0.0, 0.7, -2.0):
        w = np.ones(n) if s is None else s
        m = -y * (z + shift)
        q = expit(m)
        want = (w @ np.logaddexp(0.0, m) / n, w @ (y * q), w @ q, w @ (q * (1 - q)))
        np.testing.assert_allclose(at(shift), want, rtol=1e-13)


@pytest.mark.parametrize("intercept", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("l1_ratio", [1.0, 0.6])
def test_logistic_gap_in_one_pass_agrees_with_the_separate_passes(intercept, weighted, l1_ratio):
    """The certificate's datafit terms from one fused pass (value_conjugates) agree with the
    value, the conjugate at each scale and the dual point computed pass by pass (the
    computation before the fusion), to rounding relative to the objective."""
    from scipy.optimize import brentq
    from scipy.special import expit

    from dl1.objective.gap import dual_from_stats

    X, y, s = make_problem("logistic", seed=11, n=3000)
    s = s if weighted else None
    sv = np.ones(y.shape[0]) if s is None else s
    datafit, rng = Logistic(), np.random.default_rng(11)
    pen = ElasticNet(alpha_for(datafit, X, y, s, intercept, 0.3, l1_ratio), l1_ratio)
    for step in [1.0, 1e-3, 0.0]:  # a shifted point: its intercept is not optimal
        w = rng.standard_normal(P) * 0.2
        z = X @ w + 0.3 * step
        if intercept and step == 0.0:  # the coordinator updates the intercept first
            z = z + datafit.intercept_update(y, z, s, max_iter=20)
        theta = datafit.dual_point(y, z, s, intercept)
        # the dual point: the optimal intercept shift's, then balanced
        shift = 0.0
        if intercept:
            shift = brentq(lambda b, z=z: sv @ (y * expit(-y * (z + b))), -20, 20, xtol=1e-15)
        ref = sv * y * expit(-y * (z + shift))
        if intercept:
            pos = ref > 0
            big, small = (pos, ~pos) if ref[pos].sum() > -ref[~pos].sum() else (~pos, pos)
            ref[big] *= abs(ref[small].sum() / ref[big].sum())
        np.testing.assert_allclose(theta, ref, rtol=1e-9, atol=1e-15)
        xt = X.T @ theta
        absmax, excess = pen.xt_theta_stats(xt, y.shape[0])
        primal, dual, gap = duality_gap_from_stats(
            datafit, pen, y, z, w, absmax, excess, s=s, intercept=intercept, theta=theta
        )
        old_primal = datafit.value(y, z, s) + pen.value(w)
        line = datafit.conjugate_line(y, theta, s)
        old_dual = dual_from_stats(pen, line, absmax, excess, y.shape[0])
        assert abs(primal - old_primal) <= 1e-13 * abs(old_primal)
        assert abs(dual - old_dual) <= 1e-13 * abs(old_primal)
        assert abs(gap - (old_primal - old_dual)) <= 1e-12 * abs(old_primal)
        value, conj = datafit.value_conjugates(y, z, theta, s, (0.5, 1.0))
        assert value == pytest.approx(datafit.value(y, z, s), rel=1e-13)
        np.testing.assert_allclose(conj, [line(0.5), line(1.0)], rtol=1e-13)


def test_quadratic_value_conjugates_are_its_value_and_line():
    X, y, s = make_problem("quadratic", seed=12)
    datafit = Quadratic()
    z = X @ np.random.default_rng(12).standard_normal(P) * 0.1
    theta = datafit.dual_point(y, z, s, True)
    value, conj = datafit.value_conjugates(y, z, theta, s, (0.25, 1.0))
    line = datafit.conjugate_line(y, theta, s)
    assert value == datafit.value(y, z, s) and conj == (line(0.25), line(1.0))
