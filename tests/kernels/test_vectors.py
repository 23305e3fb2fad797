"""The vector reductions against NumPy."""

import numpy as np
import pytest

from dl1.kernels.vectors import BLOCK, dual_sums, residual_sums


@pytest.mark.parametrize("n", [0, 1, BLOCK - 1, BLOCK, 3 * BLOCK + 17])
@pytest.mark.parametrize("weighted", [False, True])
def test_residual_sums_match_numpy(n, weighted):
    rng = np.random.default_rng(n)
    y, z = rng.standard_normal(n), rng.standard_normal(n)
    s = rng.uniform(0.0, 3.0, n) if weighted else np.ones(n)
    r = y - z
    got = residual_sums(y, z, s if weighted else np.zeros(0))
    want = (float(s @ r), float(s @ (r * r)), float(s.sum()))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_blocked_sums_keep_rounding_small():
    # 2M residuals of 0.1: the blocked sum stays within a few ulps of the exact value, where
    # a plain running sum drifts by about 3e-11 relative (measured)
    n = 2_000_000
    y, z = np.full(n, 0.1), np.zeros(n)
    s1, s2, _ = residual_sums(y, z, np.zeros(0))
    assert abs(s1 - n * 0.1) / (n * 0.1) < 1e-13
    assert abs(s2 - n * 0.01) / (n * 0.01) < 1e-13


@pytest.mark.parametrize("n", [0, 1, BLOCK - 1, 3 * BLOCK + 17])
@pytest.mark.parametrize("weighted", [False, True])
def test_dual_sums_match_numpy(n, weighted):
    rng = np.random.default_rng(n + 1)
    y, theta = rng.standard_normal(n), rng.standard_normal(n)
    s = rng.uniform(0.5, 3.0, n) if weighted else np.ones(n)
    got = dual_sums(y, theta, s if weighted else np.zeros(0))
    want = (float(theta @ (theta / s)), float(theta @ y))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_dual_sums_zero_weight_domain():
    y, s = np.ones(3), np.array([1.0, 0.0, 2.0])
    assert dual_sums(y, np.array([1.0, 0.0, 2.0]), s)[0] == 3.0  # 1 + 0 + 4 / 2
    assert dual_sums(y, np.array([1.0, 0.5, 2.0]), s)[0] == np.inf
