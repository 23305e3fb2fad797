"""Hinge and smoothed-hinge datafits against their definitions."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from dl1.objective.datafits import Hinge, SmoothHinge


def labels(n=40, seed=0):
    rng = np.random.default_rng(seed)
    return np.where(rng.random(n) < 0.6, 1.0, -1.0), rng.standard_normal(n), rng.uniform(0.5, 2, n)


@pytest.mark.parametrize("datafit", [Hinge(), SmoothHinge(1.0), SmoothHinge(0.3)])
def test_conjugate_is_the_supremum_of_its_definition(datafit):
    """Pass: for dual points ``theta = s y c`` with c in [0, 1], ``F*(-theta/n)`` equals
    ``sup_z <-theta/n, z> - F(z)`` computed coordinate by coordinate (bounded scalar
    maximisation) to 1e-7; outside the domain it is +inf."""
    y, _, s = labels()
    n = y.shape[0]
    c = np.random.default_rng(1).uniform(0, 1, n)
    theta = s * y * c
    expected = 0.0
    for i in range(n):
        def neg(z, i=i):
            return -((-theta[i]) * z - s[i] * datafit._phi(np.array([y[i] * z]))[0])
        expected += -minimize_scalar(neg, bounds=(-50, 50), method="bounded",
                                     options={"xatol": 1e-12}).fun
    assert datafit.conjugate(y, theta, s) == pytest.approx(expected / n, abs=1e-7)
    theta_bad = theta.copy()
    theta_bad[0] = 1.5 * s[0] * y[0]
    assert datafit.conjugate(y, theta_bad, s) == np.inf


@pytest.mark.parametrize("datafit", [Hinge(), SmoothHinge(1.0)])
def test_intercept_update_minimises_and_dual_point_is_feasible(datafit):
    """Pass: ``z + intercept_update`` minimises ``F`` along the intercept (no shift of
    1e-6 either way does better), and the dual point with an intercept sums to 0 with ``c``
    in [0, 1]."""
    y, z, s = labels(seed=2)
    db = datafit.intercept_update(y, z, s)
    best = datafit.value(y, z + db, s)
    for h in (1e-6, -1e-6):
        assert best <= datafit.value(y, z + db + h, s) + 1e-15
    theta = datafit.dual_point(y, z, s, intercept=True)
    assert abs(theta.sum()) <= 1e-12 * np.abs(theta).sum()
    c = y * theta / s
    assert c.min() >= -1e-15 and c.max() <= 1 + 1e-15


def test_hinge_at_w_zero_has_a_nonzero_dual_point():
    """Pass: at w = 0 with the intercept fitted, the hinge's dual point is the balanced
    subgradient (not all zero), so alpha_max is positive."""
    y, _, _ = labels(seed=3)
    d = Hinge()
    b = d.initial_intercept(y)
    theta = d.dual_point(y, np.full(y.shape[0], b), None, intercept=True)
    assert np.abs(theta).sum() > 0 and abs(theta.sum()) < 1e-12
