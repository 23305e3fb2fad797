"""Anderson extrapolation against the fixed point of a linear iteration."""

from __future__ import annotations

import numpy as np

from dl1.tasks.anderson import anderson_point


def test_the_extrapolation_is_the_least_residual_combination_and_nears_the_fixed_point():
    """The combination of the iterates whose combined step ``sum c_k (x_{k+1} - x_k)`` is
    smallest, subject to ``sum c = 1`` (the constrained least squares solved by its KKT
    system); on a contracting linear iteration it lands far nearer the fixed point."""
    rng = np.random.default_rng(0)
    Q = np.linalg.qr(rng.standard_normal((6, 6)))[0]
    A = Q @ np.diag([0.95, 0.9, 0.5, 0.3, 0.1, 0.0]) @ Q.T  # symmetric contraction
    b = rng.standard_normal(6)
    xs = [np.zeros(6)]
    for _ in range(5):
        xs.append(A @ xs[-1] + b)
    hist = np.array(xs)
    U = np.diff(hist, axis=0)
    m = U.shape[0]
    kkt = np.block([[2 * U @ U.T, np.ones((m, 1))], [np.ones((1, m)), np.zeros((1, 1))]])
    c = np.linalg.solve(kkt, np.r_[np.zeros(m), 1.0])[:m]
    ext = anderson_point(hist)
    np.testing.assert_allclose(ext, c @ hist[1:], rtol=1e-9, atol=1e-12)
    fixed = np.linalg.solve(np.eye(6) - A, b)
    assert np.linalg.norm(ext - fixed) < 0.5 * np.linalg.norm(hist[-1] - fixed)


def test_a_stalled_history_has_no_extrapolation():
    assert anderson_point(np.ones((4, 3))) is None
