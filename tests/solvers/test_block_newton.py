"""Block Newton steps (:mod:`dl1.tasks.block_newton`) against NumPy: the violations, the
block's choice, the model's minimiser on it, and proximal Newton with block phases against
scikit-learn."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp

import dl1.tasks.prox_newton as prox_newton_module
from dl1.kernels.linalg import csc_col_sqnorms
from dl1.objective.datafits import Logistic
from dl1.objective.penalties import ElasticNet
from dl1.objective.penalties.weighted import WeightedElasticNet
from dl1.tasks.block_newton import BLOCK_MAX, BLOCK_SEEDS, Layout, block_step, choose_block
from dl1.tasks.block_newton import violations as block_violations
from dl1.tasks.prox_newton import Columns, model_shift, prox_newton
from tests.solvers.test_prox_newton import sklearn_logistic
from tests.test_penalised import make_classification


def columns(X: sp.csc_matrix, scale: np.ndarray | None = None) -> Columns:
    X = sp.csc_matrix(X)
    X.sort_indices()
    ip, ix = X.indptr.astype(np.int64), X.indices.astype(np.int32)
    data = X.data.astype(np.float64)
    sc = np.zeros(0) if scale is None else scale
    return Columns(ip, ix, data, sc, csc_col_sqnorms(ip, ix, data, sc, np.zeros(0)))


def point(X, y, seed=0):
    """A point away from the optimum: ``w``, ``z`` and the model's ``g``, ``h``, shift."""
    rng = np.random.default_rng(seed)
    w = np.where(rng.random(X.shape[1]) < 0.5, rng.standard_normal(X.shape[1]), 0.0)
    z = X @ w + 0.2
    g, h = np.empty(X.shape[0]), np.empty(X.shape[0])
    Logistic().grad_hess(y, z, np.zeros(0), g, h)
    shift = np.zeros(2)
    model_shift(g, h, True, shift)
    return w, z, g, h, shift


@pytest.mark.parametrize("factors", [False, True])
def test_violations_are_numpys(factors):
    X, y = make_classification(n=80, p=30, seed=3)
    _, _, g, _, _ = point(X, y)
    f = np.linspace(0.5, 2.0, 30)
    pen = WeightedElasticNet(1e-3, penalty_factor=f) if factors else ElasticNet(1e-3)
    out = np.empty(30)
    excess = block_violations(columns(X), g, pen, out)
    np.testing.assert_allclose(out, X.T @ g, rtol=1e-12, atol=1e-14)
    limit = 80 * 1e-3 * (f if factors else 1.0)
    np.testing.assert_allclose(excess, np.abs(X.T @ g) - limit, rtol=1e-12, atol=1e-14)


def test_the_block_is_the_worst_violators_and_their_row_neighbours():
    rng = np.random.default_rng(4)
    X = sp.random(60, 200, density=0.05, format="csc", random_state=rng)
    cols = columns(X)
    h = rng.random(60) + 0.1
    excess = rng.standard_normal(200)
    block = choose_block(Layout.of(cols, 60), excess, h)
    seeds = np.argsort(-excess)[:BLOCK_SEEDS]
    assert np.isin(seeds, block).all() and block.shape[0] <= BLOCK_MAX
    assert np.all(np.diff(block) > 0)
    rows = np.unique(X[:, seeds].indices)
    dense = X.toarray()
    others = np.setdiff1d(block, seeds)
    assert all(np.any(dense[rows, j] != 0) for j in others)  # each shares a seed's row
    empty = np.flatnonzero(np.diff(X.indptr) == 0)[0]  # a seed without rows stays in
    excess[empty] = 10.0
    assert empty in choose_block(Layout.of(cols, 60), excess, h)
    assert choose_block(Layout.of(cols, 60), -np.abs(excess), h).shape[0] == 0


def test_a_wide_neighbourhood_keeps_the_most_coupled_columns():
    """Every column shares rows with the seeds: the block keeps the seeds and the
    ``BLOCK_MAX - seeds`` columns with the largest ``|x_k^T H x_s|``."""
    rng = np.random.default_rng(5)
    X = sp.csc_matrix(rng.random((40, 150)) * (rng.random((40, 150)) < 0.5))
    h = rng.random(40) + 0.1
    excess = -np.ones(150)
    excess[[7, 90]] = [2.0, 1.0]
    block = choose_block(Layout.of(columns(X), 40), excess, h)
    coupling = np.abs(X.T @ (h[:, None] * X[:, [7, 90]].toarray())).max(axis=1)
    coupling[[7, 90]] = np.inf
    expected = np.sort(np.argsort(-coupling, kind="stable")[:BLOCK_MAX])
    np.testing.assert_array_equal(block, expected)


@pytest.mark.parametrize("scaled", [False, True])
def test_the_block_step_minimises_the_model_on_its_block(scaled):
    """At ``w_B + d`` the model's subgradient condition holds on the block, with the
    Hessian formed in NumPy: ``(X_B^T H X_B - hx hx^T / sum h) / n`` and the gradient at
    ``d = 0`` with the intercept step profiled out."""
    X, y = make_classification(n=120, p=40, seed=6)
    scale = np.linspace(0.5, 1.5, 40) if scaled else None
    cols = columns(X, scale)
    Xs = X @ sp.diags(scale) if scaled else X
    w, _, g, h, shift = point(Xs, y)
    alpha = 2e-3
    pen = ElasticNet(alpha)
    xtg = np.empty(40)
    excess = block_violations(cols, g, pen, xtg)
    step = block_step(Layout.of(cols, 120), w, g, h, shift, pen, excess, xtg)
    assert step is not None
    B, d = step.cols, step.d
    XB = Xs[:, B].toarray()
    hx = XB.T @ h
    Q = (XB.T @ (h[:, None] * XB) - np.outer(hx, hx) / h.sum()) / 120
    grad = (XB.T @ g - hx * g.sum() / h.sum()) / 120 + Q @ d
    new = w[B] + d
    on = new != 0
    np.testing.assert_allclose(grad[on], -alpha * np.sign(new[on]), atol=1e-8 * alpha)
    assert np.all(np.abs(grad[~on]) <= alpha * (1 + 1e-8))
    np.testing.assert_allclose(step.u, XB @ d, rtol=1e-12, atol=1e-14)
    assert step.e == pytest.approx(-(g.sum() + hx @ d) / h.sum(), rel=1e-12)


def test_block_phases_reach_the_answer_of_newton_steps_alone(monkeypatch):
    """Block phases after every checked step (``STALLED`` raised so that each step counts
    as stalled): the solve still stops at its target, at scikit-learn's answer."""
    X, y = make_classification(n=200, p=60, seed=9)
    alpha = 1e-3
    n = X.shape[0]
    cols = columns(X)
    z0 = np.zeros(n)
    monkeypatch.setattr(prox_newton_module, "STALLED", np.inf)
    w, dz, db, info = prox_newton(cols, np.zeros(60), y, z0, np.zeros(0), Logistic(),
                                  ElasticNet(alpha), True, 1e-12, 50_000)  # fmt: skip
    assert info.block_steps > 0 and info.gap <= 1e-12
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        coef, b = sklearn_logistic(X, y, alpha, 1.0, True)
    np.testing.assert_allclose(w, coef, atol=2e-4)
    np.testing.assert_allclose(dz, X @ w + db, atol=1e-9)
    assert db == pytest.approx(b, abs=2e-4)


def test_newton_steps_alone_take_no_block_steps_before_a_stall():
    X, y = make_classification(n=200, p=60, seed=9)
    cols = columns(X)
    _, _, _, info = prox_newton(cols, np.zeros(60), y, np.zeros(200), np.zeros(0),
                                Logistic(), ElasticNet(1e-2), True, 1e-10, 50_000)  # fmt: skip
    assert info.block_steps == 0 and info.gap <= 1e-10
