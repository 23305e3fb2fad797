"""The hinge's intercept kernel and the hinge datafits' fused paths against NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from dl1.kernels.hinge import hinge_intercept, weighted_quantile
from dl1.objective.datafits import Hinge, SmoothHinge

NO_WEIGHTS = np.empty(0)


def hinge_sum(y, z, s, b):
    return float(s @ np.maximum(0.0, 1.0 - y * (z + b)))


@pytest.mark.parametrize("seed", range(4))
def test_weighted_quantile_is_numpys_sorted_cumulative_sum(seed):
    """Pass: the weighted quantile equals the first sorted value whose cumulative weight
    reaches the target (ties and zero weights included), for targets across the range."""
    rng = np.random.default_rng(seed)
    n = 300
    t = rng.integers(0, 40, n).astype(float)  # many ties
    w = rng.uniform(0, 2, n) * (rng.random(n) < 0.8)
    order = np.argsort(t, kind="stable")
    cum = np.cumsum(w[order])
    for target in [w[w > 0].min(), 0.3 * w.sum(), 0.5 * w.sum(), w.sum()]:
        expected = t[order][np.searchsorted(cum, target * (1 - 1e-15))]
        assert weighted_quantile(t.copy(), w.copy(), target) == expected


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ties", [False, True])
def test_hinge_intercept_minimises_over_every_breakpoint(weighted, ties):
    """Pass: the kernel's intercept attains the minimum of the weighted hinge sum over all
    breakpoints (where a piecewise-linear convex function attains its minimum), to 1e-12,
    with ties among the breakpoints and zero weights."""
    rng = np.random.default_rng(1)
    n = 200
    y = np.where(rng.random(n) < 0.4, 1.0, -1.0)
    z = rng.integers(-3, 4, n).astype(float) if ties else rng.standard_normal(n)
    s = rng.uniform(0, 2, n) * (rng.random(n) < 0.9) if weighted else np.ones(n)
    db = hinge_intercept(y, z, s if weighted else NO_WEIGHTS)
    best = min(hinge_sum(y, z, s, b) for b in y - z)
    assert hinge_sum(y, z, s, db) <= best + 1e-12 * max(1.0, best)


def test_hinge_intercept_with_one_label_puts_every_margin_past_one():
    """Pass: with only -1 (or only +1) labels weighted, the intercept makes every margin at
    least 1 (a zero loss)."""
    rng = np.random.default_rng(2)
    z = rng.standard_normal(50)
    for label in (-1.0, 1.0):
        y = np.full(50, label)
        db = hinge_intercept(y, z, NO_WEIGHTS)
        assert np.all(y * (z + db) >= 1.0)


def numpy_reference(gamma, y, z, s):
    """Value, dual point and conjugate of the smoothed hinge (the hinge for gamma = 0) by
    their definitions, in NumPy."""
    d = 1.0 - y * z
    if gamma == 0.0:
        loss, c = np.maximum(d, 0.0), (d >= 0).astype(float)
    else:
        loss = np.where(d <= 0, 0.0, np.where(d >= gamma, d - gamma / 2, d * d / (2 * gamma)))
        c = np.clip(d / gamma, 0.0, 1.0)
    theta = s * y * c
    conj = -float(s @ (c - gamma * c * c / 2)) / y.shape[0]
    return float(s @ loss) / y.shape[0], theta, conj


@pytest.mark.parametrize("datafit", [Hinge(), SmoothHinge(0.3), SmoothHinge(1.0)])
@pytest.mark.parametrize("weighted", [False, True])
def test_datafit_paths_match_numpy(datafit, weighted):
    """Pass: value, gradient, dual point and conjugate (fused kernels) equal their NumPy
    definitions to 1e-12; the dual point with an intercept is taken at the intercept that
    minimises F (no shift of 1e-7 does better), sums to 0 and keeps c in [0, 1]."""
    rng = np.random.default_rng(3)
    n = 5000
    y = np.where(rng.random(n) < 0.55, 1.0, -1.0)
    z = 2.0 * rng.standard_normal(n)
    s = rng.uniform(0.2, 1.8, n) if weighted else np.ones(n)
    s *= n / s.sum()
    sw = s if weighted else None
    value, theta, conj = numpy_reference(datafit.gamma, y, z, s)
    assert datafit.value(y, z, sw) == pytest.approx(value, rel=1e-12)
    np.testing.assert_allclose(datafit.dual_point(y, z, sw), theta, rtol=0, atol=1e-12)
    np.testing.assert_allclose(datafit.gradient(y, z, sw), -theta / n, rtol=0, atol=1e-15)
    assert datafit.conjugate(y, theta, sw) == pytest.approx(conj, rel=1e-12)
    db = datafit.intercept_update(y, z, sw)
    best = datafit.value(y, z + db, sw)
    assert best <= min(datafit.value(y, z + db + h, sw) for h in (1e-7, -1e-7)) + 1e-15
    th_b = datafit.dual_point(y, z, sw, intercept=True)
    assert abs(th_b.sum()) <= 1e-12 * np.abs(th_b).sum()
    c = y * th_b / s
    assert c.min() >= -1e-15 and c.max() <= 1 + 1e-15
