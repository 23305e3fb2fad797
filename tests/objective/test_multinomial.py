"""The multinomial datafit and the grouped penalty against direct formulas."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import logsumexp, softmax

from dl1.errors import ValidationError
from dl1.objective.datafits.multinomial import Multinomial
from dl1.objective.penalties.group import GroupElasticNet


def _case(n=50, K=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, K, n), rng.standard_normal((n, K)) * 2


def test_conjugate_meets_fenchel_young_at_the_gradient():
    """``F(Z) + F^*(grad F(Z)) = <grad F(Z), Z>``: the conjugate (negative entropy) at the
    dual point of scale 1 is exact."""
    codes, Z = _case()
    df = Multinomial()
    P = df.probabilities(Z)
    theta = df.dual_point(codes, P)
    (conj,) = df.conjugates(codes, P, (1.0,))
    n = Z.shape[0]
    grad = -theta / n
    assert df.value(codes, Z) + conj == pytest.approx((grad * Z).sum(), rel=1e-12)
    # a scaled point is a convex combination inside the simplex: finite, below the
    # conjugate's value at 0 (the loss's infimum bound) and convex in the scale
    c = df.conjugates(codes, P, (0.0, 0.5, 1.0))
    assert c[0] == 0.0 and c[1] <= 0.5 * (c[0] + c[2])


def test_value_is_the_mean_cross_entropy():
    codes, Z = _case(seed=1)
    ref = (logsumexp(Z, axis=1) - Z[np.arange(50), codes]).mean()
    assert Multinomial.value(codes, Z) == pytest.approx(ref, rel=1e-14)
    np.testing.assert_allclose(Multinomial.probabilities(Z), softmax(Z, axis=1))


def test_the_fitted_intercept_zeroes_every_class_column_of_theta():
    codes, Z = _case(seed=2)
    df = Multinomial()
    b0 = np.zeros(4)
    Z2, b = df.fit_intercept(codes, Z, b0)
    np.testing.assert_allclose(Z2 - Z, np.tile(b, (50, 1)), atol=1e-12)
    theta = df.dual_point(codes, df.probabilities(Z2))
    assert np.abs(theta.sum(axis=0)).max() < 1e-10
    assert df.value(codes, Z2) < df.value(codes, Z)
    # at W = 0 the optimum is the log class frequencies
    Zc = np.tile(df.initial_intercept(codes, 4), (50, 1))
    theta0 = df.dual_point(codes, df.probabilities(Zc))
    assert np.abs(theta0.sum(axis=0)).max() < 1e-12


def test_encode_sorts_classes_and_refuses_one_class():
    classes, codes = Multinomial.encode(np.array(["b", "a", "c", "a"]))
    np.testing.assert_array_equal(classes, ["a", "b", "c"])
    np.testing.assert_array_equal(codes, [1, 0, 2, 0])
    with pytest.raises(ValidationError, match="two classes"):
        Multinomial.encode(np.ones(5))


def test_group_penalty_prox_and_conjugate_from_stats():
    rng = np.random.default_rng(3)
    pen = GroupElasticNet(0.3, l1_ratio=0.7)
    U = rng.standard_normal((6, 3))
    step = 0.8
    out = pen.prox_rows(U, step)
    for u, o in zip(U, out, strict=True):  # block soft-thresholding, then the ridge shrink
        norm = np.linalg.norm(u)
        expect = u * max(0, 1 - step * pen.alpha_l1 / norm) / (1 + step * pen.alpha_l2)
        np.testing.assert_allclose(o, expect, rtol=1e-14)
    n = 10
    V = rng.standard_normal((6, 3)) * 3
    absmax, excess = pen.xt_theta_stats(V, n)
    assert absmax == pytest.approx(np.linalg.norm(V, axis=1).max())
    ex = np.maximum(np.linalg.norm(V, axis=1) - n * pen.alpha_l1, 0)
    # the conjugate of the grouped elastic net at V / n, directly
    direct = (np.maximum(np.linalg.norm(V / n, axis=1) - pen.alpha_l1, 0) ** 2).sum() / (
        2 * pen.alpha_l2
    )
    assert pen.conjugate_from_stats(excess, n) == pytest.approx(direct, rel=1e-12)
    assert excess == pytest.approx(ex @ ex)
    assert pen.value(U) == pytest.approx(
        pen.alpha_l1 * np.linalg.norm(U, axis=1).sum() + 0.5 * pen.alpha_l2 * (U * U).sum()
    )
