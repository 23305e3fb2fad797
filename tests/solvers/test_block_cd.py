"""Coordinate descent on blocks, run to convergence, against scikit-learn."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import ElasticNet as SkElasticNet
from sklearn.linear_model import LogisticRegression

from dl1.kernels import (
    cd_block_epochs,
    csc_col_sqnorms,
    csc_xt_theta_stats,
)
from dl1.kernels.linalg import DUAL_SIDES
from dl1.objective.datafits import Logistic, Quadratic, normalize_sample_weight
from dl1.objective.gap import duality_gap_from_stats
from dl1.objective.penalties import ElasticNet
from tests.kernel_helpers import DTYPES, EMPTY, NO_BOX, arrays, make_csc


def block_arrays(X, n_blocks):
    """Split the columns of ``X`` into contiguous CSC blocks."""
    splits = np.array_split(np.arange(X.shape[1]), n_blocks)
    return splits, [arrays(X[:, cols]) for cols in splits]


def solve(
    X,
    y,
    datafit,
    penalty,
    n_blocks=1,
    s=None,
    col_scale=EMPTY,
    intercept=False,
    n_epochs=1,
    random_order=False,
    gap_tol=1e-15,
    max_rounds=50_000,
):
    """CoCoA+ with added updates: every block solves its subproblem from the same ``g``."""
    n, p = X.shape
    sw = EMPTY if s is None else s
    splits, blocks = block_arrays(sp.csc_matrix(X), n_blocks)
    scales = [col_scale[cols] if col_scale.size else EMPTY for cols in splits]
    sqs = [csc_col_sqnorms(*b, c, sw) for b, c in zip(blocks, scales, strict=True)]
    actives = [np.arange(len(cols), dtype=np.int64) for cols in splits]
    w = np.zeros(p)
    b = datafit.initial_intercept(y, s) if intercept else 0.0
    z = np.full(n, b)
    sigma = float(n_blocks)
    gap = np.inf
    for r in range(max_rounds):
        g = datafit.gradient(y, z, s)
        dz = np.zeros(n)
        for k, cols in enumerate(splits):
            wk = w[cols]
            u = np.zeros(n)
            cd_block_epochs(
                *blocks[k],
                scales[k],
                wk,
                g,
                u,
                sw,
                sqs[k],
                sigma,
                datafit.beta,
                float(n),
                penalty.alpha_l1,
                penalty.alpha_l2,
                EMPTY, NO_BOX,
                n_epochs,
                random_order,
                r * n_blocks + k,
                actives[k],
                EMPTY,
                np.zeros(2),
            )
            w[cols] = wk
            dz += u
        z += dz
        if intercept:
            db = datafit.intercept_update(y, z, s)
            b += db
            z += db
        if r % 10 == 9:
            theta = datafit.dual_point(y, z, s, intercept)
            stats = [
                csc_xt_theta_stats(*blk, c, theta, n * penalty.alpha_l1, EMPTY, NO_BOX,
                                   float(n), 0.0, DUAL_SIDES)[:2]
                for blk, c in zip(blocks, scales, strict=True)
            ]
            absmax = max(st[0] for st in stats)
            excess = sum(st[1] for st in stats)
            _, _, gap = duality_gap_from_stats(
                datafit, penalty, y, z, w, absmax, excess, s=s, intercept=intercept, theta=theta
            )
            if gap < gap_tol:
                break
    return w, b, z, gap


def regression_problem(n=80, p=40, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    X = make_csc(n, p, 0.3, dtype, seed)
    w_true = np.zeros(p)
    w_true[2:8] = rng.standard_normal(6) * 2
    y = X.astype(np.float64) @ w_true + 0.3 * rng.standard_normal(n)
    return X, y


def quadratic_alpha(X, y, fraction, l1_ratio):
    g0 = Quadratic().gradient(y, np.zeros(len(y)))
    return fraction * ElasticNet.alpha_max(np.abs(X.T @ g0).max(), l1_ratio)


@pytest.mark.parametrize("l1_ratio", [1.0, 0.5])
@pytest.mark.parametrize("dtype", DTYPES)
def test_quadratic_single_block_is_sklearn_enet(l1_ratio, dtype):
    X, y = regression_problem(dtype=dtype)
    alpha = quadratic_alpha(X, y, 0.1, l1_ratio)
    sk = SkElasticNet(
        alpha=alpha, l1_ratio=l1_ratio, fit_intercept=False, tol=1e-12, max_iter=100_000
    ).fit(X.toarray().astype(np.float64), y)
    w, _, _, gap = solve(X, y, Quadratic(), ElasticNet(alpha, l1_ratio))
    assert gap < 1e-15
    assert np.count_nonzero(sk.coef_) < X.shape[1]
    np.testing.assert_allclose(w, sk.coef_, rtol=0, atol=1e-8)


@pytest.mark.parametrize("n_blocks", [2, 3])
@pytest.mark.parametrize("l1_ratio", [1.0, 0.7])
def test_quadratic_blocks_converge_to_sklearn(n_blocks, l1_ratio):
    X, y = regression_problem(seed=1)
    alpha = quadratic_alpha(X, y, 0.1, l1_ratio)
    sk = SkElasticNet(
        alpha=alpha, l1_ratio=l1_ratio, fit_intercept=False, tol=1e-12, max_iter=100_000
    ).fit(X.toarray(), y)
    w, _, _, gap = solve(
        X,
        y,
        Quadratic(),
        ElasticNet(alpha, l1_ratio),
        n_blocks=n_blocks,
        n_epochs=3,
        random_order=True,
    )
    assert gap < 1e-15
    np.testing.assert_allclose(w, sk.coef_, rtol=0, atol=1e-8)


def test_quadratic_weights_scaling_intercept_match_sklearn():
    X, y = regression_problem(seed=2)
    n, p = X.shape
    rng = np.random.default_rng(2)
    s = normalize_sample_weight(rng.uniform(0.1, 3.0, n), n)
    col_scale = rng.uniform(0.5, 2.0, p)
    Xs = X.toarray() * col_scale
    alpha, l1_ratio = quadratic_alpha(X, y, 0.05, 0.9), 0.9
    sk = SkElasticNet(
        alpha=alpha, l1_ratio=l1_ratio, fit_intercept=True, tol=1e-12, max_iter=100_000
    ).fit(Xs, y, sample_weight=s)
    w, b, _, gap = solve(
        X,
        y,
        Quadratic(),
        ElasticNet(alpha, l1_ratio),
        n_blocks=2,
        s=s,
        col_scale=col_scale,
        intercept=True,
        n_epochs=2,
    )
    assert gap < 1e-15
    np.testing.assert_allclose(w, sk.coef_, rtol=0, atol=1e-8)
    np.testing.assert_allclose(b, sk.intercept_, rtol=0, atol=1e-8)


def classification_problem(n=100, p=30, seed=0):
    rng = np.random.default_rng(seed)
    X = make_csc(n, p, 0.3, np.float64, seed + 10)
    w_true = np.zeros(p)
    w_true[2:7] = 2 * rng.standard_normal(5)
    y = np.where(X @ w_true + 0.5 * rng.standard_normal(n) > 0, 1.0, -1.0)
    return X, y


def sklearn_logistic(X, y, alpha, l1_ratio, intercept, solver, s=None):
    """sklearn solves min C sum_i s_i loss_i + r(w); ours is that divided by C n."""
    n = X.shape[0]
    clf = LogisticRegression(
        l1_ratio=l1_ratio,
        C=1.0 / (n * alpha),
        fit_intercept=intercept,
        solver=solver,
        tol=1e-14,
        max_iter=100_000,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(X, y, sample_weight=s)
    return clf.coef_[0], (clf.intercept_[0] if intercept else 0.0)


@pytest.mark.parametrize("n_blocks", [1, 2, 3])
def test_logistic_l1_matches_liblinear(n_blocks):
    X, y = classification_problem()
    n = X.shape[0]
    g0 = Logistic().gradient(y, np.zeros(n))
    alpha = 0.1 * ElasticNet.alpha_max(np.abs(X.T @ g0).max())
    w_ref, _ = sklearn_logistic(X, y, alpha, 1.0, False, "liblinear")
    w, _, _, gap = solve(X, y, Logistic(), ElasticNet(alpha, 1.0), n_blocks=n_blocks, n_epochs=2)
    assert gap < 1e-14
    assert 0 < np.count_nonzero(w) < X.shape[1]
    np.testing.assert_allclose(w, w_ref, rtol=0, atol=1e-8)


def test_logistic_enet_weights_intercept_match_saga():
    X, y = classification_problem(seed=3)
    n = X.shape[0]
    rng = np.random.default_rng(3)
    s = normalize_sample_weight(rng.uniform(0.2, 2.0, n), n)
    datafit = Logistic()
    z0 = np.full(n, datafit.initial_intercept(y, s))
    alpha = 0.1 * ElasticNet.alpha_max(np.abs(X.T @ datafit.gradient(y, z0, s)).max(), 0.6)
    w_ref, b_ref = sklearn_logistic(X, y, alpha, 0.6, True, "saga", s=s)
    w, b, _, gap = solve(
        X,
        y,
        datafit,
        ElasticNet(alpha, 0.6),
        n_blocks=2,
        s=s,
        intercept=True,
        n_epochs=2,
        gap_tol=1e-14,
    )
    assert gap < 1e-14
    np.testing.assert_allclose(w, w_ref, rtol=0, atol=1e-7)
    np.testing.assert_allclose(b, b_ref, rtol=0, atol=1e-7)
