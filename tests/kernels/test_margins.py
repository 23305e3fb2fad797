"""The margin-loss kernels against NumPy / SciPy references."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import expit, xlogy

from dl1.kernels.codes import LOGISTIC, SMOOTH_HINGE, SQUARED_HINGE
from dl1.kernels.margins import (
    abs_max,
    balance,
    margin_conjugate,
    margin_grad_hess,
    margin_shift_sums,
    margin_theta,
    margin_value,
    margin_value_grad_hess,
    move_along,
)
from tests.kernel_helpers import EMPTY

GAMMA = 0.7
LOSSES = [(LOGISTIC, 0.0), (SQUARED_HINGE, 0.0), (SMOOTH_HINGE, GAMMA), (SMOOTH_HINGE, 0.0)]


def reference_terms(code, gamma, m):
    """``(phi, -phi', phi'')`` of the margin ``m`` by NumPy."""
    if code == LOGISTIC:
        c = expit(-m)
        return np.logaddexp(0.0, -m), c, c * expit(m)
    d = 1.0 - m
    if code == SQUARED_HINGE:
        return np.maximum(d, 0.0) ** 2, 2.0 * np.maximum(d, 0.0), 2.0 * (d > 0)
    if gamma == 0.0:
        return np.maximum(d, 0.0), (d >= 0).astype(float), np.zeros_like(m)
    mid = (d > 0) & (d < gamma)
    phi = np.where(d >= gamma, d - gamma / 2, np.where(mid, d * d / (2 * gamma), 0.0))
    c = np.clip(d / gamma, 0.0, 1.0)
    return phi, c, mid / gamma


def data(n, seed, weighted):
    rng = np.random.default_rng(seed)
    y = np.where(rng.random(n) < 0.4, 1.0, -1.0)
    z = rng.normal(0.0, 3.0, n)
    z[:3] = [40.0, -40.0, 1.0 / y[2]]  # saturated margins and a margin exactly at 1
    sw = rng.uniform(0.0, 2.0, n) if weighted else EMPTY
    if weighted:
        sw[5] = 0.0
    return y, z, sw


def weights(sw, n):
    return np.ones(n) if sw.size == 0 else sw


@pytest.mark.parametrize(("code", "gamma"), LOSSES)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("n", [6, 37, 3001])
def test_sums_theta_and_derivatives_match_numpy(code, gamma, weighted, n):
    y, z, sw = data(n, 3, weighted)
    s = weights(sw, n)
    u = np.random.default_rng(1).normal(size=n)
    shift, t = 0.3, 0.6
    phi, c, curv = reference_terms(code, gamma, y * (z + t * (u + shift)))
    assert margin_value(code, gamma, y, z, sw, u, shift, t) == pytest.approx(s @ phi, rel=1e-12)
    phi, c, curv = reference_terms(code, gamma, y * (z + shift))
    assert margin_value(code, gamma, y, z, sw, EMPTY, shift, 1.0) == pytest.approx(
        s @ phi, rel=1e-12
    )
    sums = margin_shift_sums(code, gamma, y, z, sw, shift)
    expected = (s @ phi, s @ (y * c), s @ c, s @ curv)
    np.testing.assert_allclose(sums, expected, rtol=1e-12, atol=1e-12)
    theta = np.empty(n)
    margin_theta(code, gamma, y, z, sw, shift, theta)
    np.testing.assert_allclose(theta, s * y * c, rtol=1e-13, atol=1e-300)
    g, h = np.empty(n), np.empty(n)
    margin_grad_hess(code, gamma, y, z + shift, sw, g, h)
    np.testing.assert_allclose(g, -s * y * c, rtol=1e-13, atol=1e-300)
    np.testing.assert_allclose(h, s * curv, rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize(("code", "gamma"), LOSSES)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("n", [6, 3001])
def test_trial_value_and_derivatives_match_numpy(code, gamma, weighted, n):
    y, z, sw = data(n, 4, weighted)
    s = weights(sw, n)
    u = np.random.default_rng(2).normal(size=n)
    shift, t = -0.2, 0.75
    g, h = np.full(n, np.nan), np.full(n, np.nan)
    value = margin_value_grad_hess(code, gamma, y, z, sw, u, shift, t, g, h)
    # summed in another (vectorised) order than margin_value's
    assert value == pytest.approx(margin_value(code, gamma, y, z, sw, u, shift, t), rel=1e-14)
    phi, c, curv = reference_terms(code, gamma, y * (z + t * (u + shift)))
    assert value == pytest.approx(s @ phi, rel=1e-12)
    np.testing.assert_allclose(g, -s * y * c, rtol=1e-13, atol=1e-300)
    np.testing.assert_allclose(h, s * curv, rtol=1e-12, atol=1e-300)
    # the point a line search moves to is its trial point, to the last bit
    moved = z.copy()
    move_along(moved, u, shift, t)
    g_at, h_at = np.empty(n), np.empty(n)
    margin_grad_hess(code, gamma, y, moved, sw, g_at, h_at)
    np.testing.assert_array_equal(g_at, g)
    np.testing.assert_array_equal(h_at, h)
    value = margin_value_grad_hess(code, gamma, y, z, sw, EMPTY, shift, t, g, h)
    phi, c, curv = reference_terms(code, gamma, y * (z + t * shift))
    assert value == pytest.approx(s @ phi, rel=1e-12)
    np.testing.assert_allclose(g, -s * y * c, rtol=1e-13, atol=1e-300)


def reference_conjugate(code, gamma, y, theta, s):
    pos = s > 0
    if np.any(theta[~pos] != 0):
        return math.inf
    c = y[pos] * theta[pos] / s[pos]
    top = math.inf if code == SQUARED_HINGE else 1.0 + 1e-12
    if np.any(c < -1e-12) or np.any(c > top):
        return math.inf
    c = np.maximum(c, 0.0) if code == SQUARED_HINGE else np.clip(c, 0.0, 1.0)
    if code == LOGISTIC:
        v = xlogy(c, c) + xlogy(1 - c, 1 - c)
    elif code == SQUARED_HINGE:
        v = c * c / 4 - c
    else:
        v = gamma * c * c / 2 - c
    return float(s[pos] @ v)


@pytest.mark.parametrize(("code", "gamma"), LOSSES)
@pytest.mark.parametrize("weighted", [False, True])
def test_conjugate_matches_numpy_and_its_domain(code, gamma, weighted):
    n = 500
    y, z, sw = data(n, 4, weighted)
    s = weights(sw, n)
    theta = np.empty(n)
    margin_theta(code, gamma, y, z, sw, 0.0, theta)
    theta[7] = 0.0  # c = 0 exactly
    theta[8] = s[8] * y[8]  # c = 1 exactly
    expected = reference_conjugate(code, gamma, y, theta, s)
    assert margin_conjugate(code, gamma, y, theta, sw) == pytest.approx(expected, rel=1e-12)
    bad = theta.copy()
    bad[9] = -0.1 * y[9]
    assert margin_conjugate(code, gamma, y, bad, sw) == math.inf
    if code != SQUARED_HINGE:
        bad = theta.copy()
        bad[9] = 1.5 * s[9] * y[9]
        assert margin_conjugate(code, gamma, y, bad, sw) == math.inf
    bad = theta.copy()
    bad[10] = math.nan
    assert margin_conjugate(code, gamma, y, bad, sw) == math.inf
    if weighted:
        bad = theta.copy()
        bad[5] = 1e-3  # nonzero where the weight is 0
        assert margin_conjugate(code, gamma, y, bad, sw) == math.inf


@pytest.mark.parametrize(("code", "gamma"), LOSSES)
@pytest.mark.parametrize("weighted", [False, True])
def test_conjugate_at_a_scale_is_the_conjugate_of_the_scaled_point(code, gamma, weighted):
    n = 3000
    y, z, sw = data(n, 5, weighted)
    s = weights(sw, n)
    theta = np.empty(n)
    margin_theta(code, gamma, y, z, sw, 0.0, theta)
    for scale in [1.0, 0.3, 1.0 / 3.0, 0.999999]:
        expected = reference_conjugate(code, gamma, y, scale * theta, s)
        got = margin_conjugate(code, gamma, y, theta, sw, scale)
        assert got == pytest.approx(expected, rel=1e-12)
        # the scaled entries are rounded as NumPy's product: the same sum, bit for bit
        assert got == margin_conjugate(code, gamma, y, scale * theta, sw)
    if code != SQUARED_HINGE:  # scaled out of the domain
        assert margin_conjugate(code, gamma, y, theta, sw, 2.0) == math.inf


@pytest.mark.parametrize("n", [1, 50, 2500])
def test_balance_and_vector_helpers_match_numpy(n):
    rng = np.random.default_rng(n)
    theta = rng.normal(0.3, 1.0, n)
    expected = theta.copy()
    pos = expected > 0
    mp, mn = expected[pos].sum(), -expected[~pos].sum()
    if mp > mn:
        expected[pos] *= mn / mp
    elif mn > mp:
        expected[~pos] *= mp / mn
    balance(theta)
    np.testing.assert_allclose(theta, expected, rtol=1e-13)
    if n > 1:
        assert abs(theta.sum()) <= 1e-12 * np.abs(theta).sum()
    z, u = rng.normal(size=n), rng.normal(size=n)
    z0 = z.copy()
    move_along(z, u, -2.0, 0.25)
    np.testing.assert_allclose(z, z0 + 0.25 * u - 0.5, rtol=1e-14, atol=1e-15)
    move_along(z, EMPTY, 8.0, 0.25)
    np.testing.assert_allclose(z, z0 + 0.25 * u + 1.5, rtol=1e-14, atol=1e-15)
    assert abs_max(u) == np.abs(u).max()
    u[-1] = math.nan
    assert math.isnan(abs_max(u))
    assert abs_max(EMPTY) == 0.0


def test_nonfinite_inputs_propagate():
    y = np.array([1.0, -1.0])
    for code, gamma in LOSSES:
        z = np.array([math.nan, 0.0])
        assert math.isnan(margin_value(code, gamma, y, z, EMPTY, EMPTY, 0.0, 0.0))
        theta = np.empty(2)
        margin_theta(code, gamma, y, z, EMPTY, 0.0, theta)
        assert math.isnan(theta[0])
    z = np.array([math.inf, math.inf])  # margins +inf and -inf
    assert margin_value(LOGISTIC, 0.0, y, z, EMPTY, EMPTY, 0.0, 0.0) == math.inf


@pytest.mark.parametrize(("code", "gamma"), LOSSES[:3])
@pytest.mark.parametrize("weighted", [False, True])
def test_slope_sums_and_intercept_root_match_scipy(code, gamma, weighted):
    from scipy.optimize import brentq

    from dl1.kernels.margins import intercept_root, margin_slope_sums

    n = 400
    y, z, sw = data(n, 6, weighted)
    z = np.clip(z, -5.0, 5.0)
    s = weights(sw, n)
    _, c, curv = reference_terms(code, gamma, y * (z + 0.2))
    np.testing.assert_allclose(
        margin_slope_sums(code, gamma, y, z, sw, 0.2), (s @ (y * c), s @ c, s @ curv),
        rtol=1e-12, atol=1e-12,
    )  # fmt: skip

    def theta_sum(b):
        return s @ (y * reference_terms(code, gamma, y * (z + b))[1])

    beta = {LOGISTIC: 0.25, SQUARED_HINGE: 2.0, SMOOTH_HINGE: 1.0 / gamma if gamma else 1.0}
    db = intercept_root(code, gamma, y, z, sw, beta[code], 1e-13, 200)
    assert db == pytest.approx(brentq(theta_sum, -50.0, 50.0, xtol=1e-14), abs=1e-9)
    assert abs(theta_sum(db)) <= 1e-9 * (s @ reference_terms(code, gamma, y * (z + db))[1])


@pytest.mark.parametrize(("code", "gamma"), LOSSES)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("n", [6, 3001])
def test_theta_with_its_sums_in_one_pass(code, gamma, weighted, n):
    """The dual point written with the intercept's sums and the two sign sides balance
    weighs: NumPy's values, margin_slope_sums' sums to rounding, the root and the balanced
    point those of intercept_root and balance."""
    from dl1.kernels.margins import (
        balance_sides,
        intercept_root,
        intercept_root_from,
        margin_slope_sums,
        margin_theta_sums,
    )

    y, z, sw = data(n, 7, weighted)
    s = weights(sw, n)
    for shift in [0.0, 0.4]:
        theta = np.full(n, np.nan)
        got = margin_theta_sums(code, gamma, y, z, sw, shift, theta)
        _, c, curv = reference_terms(code, gamma, y * (z + shift))
        ref = s * y * c
        np.testing.assert_allclose(theta, ref, rtol=1e-13, atol=1e-300)
        expected = (ref.sum(), s @ c, s @ curv, ref[ref > 0].sum(), -ref[ref <= 0].sum())
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
        slope = margin_slope_sums(code, gamma, y, z, sw, shift)
        np.testing.assert_allclose(slope, got[:3], rtol=1e-13, atol=1e-13)
        unwritten = margin_theta_sums(code, gamma, y, z, sw, shift, EMPTY)
        np.testing.assert_allclose(unwritten[:3], got[:3], rtol=1e-14)
        balanced = theta.copy()
        balance(balanced)
        balance_sides(theta, got[3], got[4])
        np.testing.assert_allclose(theta, balanced, rtol=1e-15, atol=1e-300)
    if code != SMOOTH_HINGE or gamma > 0.0:
        beta = {LOGISTIC: 0.25, SQUARED_HINGE: 2.0, SMOOTH_HINGE: 1.0 / max(gamma, 1e-300)}
        sums = margin_theta_sums(code, gamma, y, np.clip(z, -5, 5), sw, 0.0, EMPTY)[:3]
        root = intercept_root_from(code, gamma, y, np.clip(z, -5, 5), sw, beta[code], 1e-13,
                                   200, *sums)  # fmt: skip
        again = intercept_root(code, gamma, y, np.clip(z, -5, 5), sw, beta[code], 1e-13, 200)
        # the same steps to the same tolerance; fastmath may reassociate a cached kernel's
        # sums differently from a freshly compiled one's, which moves the last steps
        assert root == pytest.approx(again, rel=1e-13, abs=1e-300)


def reference_gap_sums(code, gamma, y, z, theta, s, scales):
    """``(n F(z), n F^*(-a theta / n) for a in scales)`` by NumPy, summed exactly."""
    phi = reference_terms(code, gamma, y * z)[0]
    value = math.fsum(s * phi)
    conj = []
    for a in scales:
        th = a * theta
        pos = s > 0
        if reference_conjugate(code, gamma, y, th, s) == math.inf:
            conj.append(math.inf)
            continue
        c = y[pos] * th[pos] / s[pos]
        c = np.maximum(c, 0.0) if code == SQUARED_HINGE else np.clip(c, 0.0, 1.0)
        if code == LOGISTIC:
            v = xlogy(c, c) + xlogy(1 - c, 1 - c)
        elif code == SQUARED_HINGE:
            v = c * c / 4 - c
        else:
            v = gamma * c * c / 2 - c
        conj.append(math.fsum(s[pos] * v))
    return value, conj


@pytest.mark.parametrize(("code", "gamma"), LOSSES)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("n", [7, 20000])
def test_gap_sums_match_numpy_and_the_separate_kernels(code, gamma, weighted, n):
    from dl1.kernels.margins import margin_gap_sums

    y, z, sw = data(n, 8, weighted)
    s = weights(sw, n)
    theta = np.empty(n)
    margin_theta(code, gamma, y, z + 0.1, sw, 0.0, theta)  # a dual point of another z
    for a, b in [(0.37, 1.0), (1.0, 0.5)]:
        got = margin_gap_sums(code, gamma, y, z, theta, sw, a, b, True)
        value, (ca, cb) = reference_gap_sums(code, gamma, y, z, theta, s, (a, b))
        assert got[0] == pytest.approx(value, rel=1e-14)
        assert got[1] == pytest.approx(ca, rel=1e-12)  # c rounded as margin_conjugate's
        assert got[2] == pytest.approx(cb, rel=1e-12)
        one = margin_gap_sums(code, gamma, y, z, theta, sw, a, b, False)
        assert one[:2] == got[:2] and one[2] == 0.0
        # the separate kernels' blocked sums, to their rounding
        sep = margin_value(code, gamma, y, z, sw, EMPTY, 0.0, 0.0)
        assert got[0] == pytest.approx(sep, rel=1e-13)
        assert got[1] == pytest.approx(margin_conjugate(code, gamma, y, theta, sw, a), rel=1e-13)


@pytest.mark.parametrize(("code", "gamma"), LOSSES)
def test_gap_sums_domain_and_nonfinite(code, gamma):
    from dl1.kernels.margins import margin_gap_sums

    n = 300
    y, z, sw = data(n, 9, True)
    theta = np.empty(n)
    margin_theta(code, gamma, y, z, sw, 0.0, theta)
    value = margin_value(code, gamma, y, z, sw, EMPTY, 0.0, 0.0)
    bad = theta.copy()
    bad[9] = -0.1 * y[9]  # c < 0 at every scale
    got = margin_gap_sums(code, gamma, y, z, bad, sw, 0.5, 1.0, True)
    assert got[1:] == (math.inf, math.inf)
    assert got[0] == pytest.approx(value, rel=1e-13)  # the value is still the value
    bad = theta.copy()
    bad[5] = 1e-3  # nonzero where the weight is 0
    assert margin_gap_sums(code, gamma, y, z, bad, sw, 0.5, 1.0, True)[1:] == (math.inf,) * 2
    assert margin_gap_sums(code, gamma, y, z, bad, sw, 0.0, 1.0, True)[1] < math.inf
    if code != SQUARED_HINGE:  # c > 1 at scale 2 only
        got = margin_gap_sums(code, gamma, y, z, theta, sw, 1.0, 2.0, True)
        assert got[1] < math.inf and got[2] == math.inf
    bad = theta.copy()
    bad[10] = math.nan
    assert margin_gap_sums(code, gamma, y, z, bad, sw, 1.0, 1.0, False)[1] == math.inf
    zn = z.copy()
    zn[3] = math.nan
    assert math.isnan(margin_gap_sums(code, gamma, y, zn, theta, sw, 1.0, 1.0, False)[0])


def test_gap_sums_are_compensated():
    """Exact terms (squared hinge at margin 0: loss 1, conjugate -7/16 at c = 1/2): a first
    block weighing 2^60 per sample, then blocks summing to 2^10 each. Summed in order, every
    later block is lost below the ulp of 2^70; compensated, the total is the exact sum
    rounded once (and the compensation is not optimised away by fast-math flags)."""
    from dl1.kernels.margins import BLOCK, margin_gap_sums

    n = 200 * BLOCK
    y = np.where(np.arange(n) % 2 == 0, 1.0, -1.0)
    z = np.zeros(n)
    sw = np.ones(n)
    sw[:BLOCK] = 2.0**60
    theta = 0.5 * sw * y  # c = 1/2
    got = margin_gap_sums(SQUARED_HINGE, 0.0, y, z, theta, sw, 1.0, 0.5, True)
    assert got[0] == math.fsum(sw) == 2.0**70 + 2.0**18  # 2^70 + 199 * 2^10, rounded
    assert got[0] != 2.0**70
    assert got[1] == math.fsum(-0.4375 * sw)  # c = 1/2
    assert got[2] == math.fsum((0.25 * 0.0625 - 0.25) * sw)  # c = 1/4
