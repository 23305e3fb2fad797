"""Numba kernels against NumPy references, and end-to-end coordinate descent vs scikit-learn."""

from __future__ import annotations

import itertools
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
    csc_matvec,
    csc_rmatvec,
    csc_xt_theta_stats,
    soft_threshold,
)
from dl1.kernels.cd import _shuffle
from dl1.objective.datafits import Logistic, Quadratic, normalize_sample_weight
from dl1.objective.gap import duality_gap_from_stats
from dl1.objective.penalties import ElasticNet

EMPTY = np.empty(0, dtype=np.float64)
SHAPES = [(1, 2), (7, 5), (30, 12), (64, 40)]
DTYPES = [np.float32, np.float64]


def make_csc(n, p, density, dtype, seed):
    """Random CSC matrix with column 0 empty and column 1 holding a single nonzero."""
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((n, p)) * (rng.random((n, p)) < density)
    dense[:, 0] = 0.0
    if p > 1:
        dense[:, 1] = 0.0
        dense[rng.integers(n), 1] = 1.5
    return sp.csc_matrix(dense.astype(dtype))


def arrays(X):
    """Raw CSC arrays with the kernels' index types."""
    X = sp.csc_matrix(X)
    X.sort_indices()
    return X.indptr.astype(np.int64), X.indices.astype(np.int32), X.data


def scaled_dense(X, col_scale):
    """Dense float64 ``X`` with ``col_scale`` applied (empty = none)."""
    dense = X.toarray().astype(np.float64)
    return dense if col_scale.size == 0 else dense * col_scale


def maybe_scale(p, use, rng):
    return rng.uniform(0.5, 2.0, p) if use else EMPTY


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("use_scale", [False, True])
def test_csc_matvec(shape, dtype, use_scale):
    n, p = shape
    rng = np.random.default_rng(1)
    X = make_csc(n, p, 0.4, dtype, 0)
    col_scale = maybe_scale(p, use_scale, rng)
    w = rng.standard_normal(p)
    w[p // 2] = 0.0
    out = rng.standard_normal(n)
    expected = out + scaled_dense(X, col_scale) @ w
    csc_matvec(*arrays(X), col_scale, w, out)
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("use_scale", [False, True])
def test_csc_rmatvec(shape, dtype, use_scale):
    n, p = shape
    rng = np.random.default_rng(2)
    X = make_csc(n, p, 0.4, dtype, 1)
    col_scale = maybe_scale(p, use_scale, rng)
    v = rng.standard_normal(n)
    out = np.full(p, 123.0)
    csc_rmatvec(*arrays(X), col_scale, v, out)
    np.testing.assert_allclose(out, scaled_dense(X, col_scale).T @ v, rtol=1e-12, atol=1e-12)
    if p > 1:
        assert out[0] == 0.0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("use_scale", [False, True])
@pytest.mark.parametrize("use_sw", [False, True])
def test_csc_col_sqnorms(shape, dtype, use_scale, use_sw):
    n, p = shape
    rng = np.random.default_rng(3)
    X = make_csc(n, p, 0.4, dtype, 2)
    col_scale = maybe_scale(p, use_scale, rng)
    sw = rng.uniform(0.0, 3.0, n) if use_sw else EMPTY
    dense = scaled_dense(X, col_scale)
    expected = ((sw[:, None] if use_sw else 1.0) * dense**2).sum(axis=0)
    got = csc_col_sqnorms(*arrays(X), col_scale, sw)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14)
    assert got[0] == 0.0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("use_scale", [False, True])
def test_csc_xt_theta_stats(shape, dtype, use_scale):
    n, p = shape
    rng = np.random.default_rng(4)
    X = make_csc(n, p, 0.4, dtype, 3)
    col_scale = maybe_scale(p, use_scale, rng)
    theta = rng.standard_normal(n)
    c = np.abs(scaled_dense(X, col_scale).T @ theta)
    threshold = float(np.median(c))
    absmax, excess_sq = csc_xt_theta_stats(*arrays(X), col_scale, theta, threshold)
    np.testing.assert_allclose(absmax, c.max(), rtol=1e-12)
    np.testing.assert_allclose(excess_sq, (np.maximum(c - threshold, 0.0) ** 2).sum(), rtol=1e-12)
    empty_block = csc_xt_theta_stats(
        np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0, dtype), EMPTY, theta, 0.0
    )
    assert empty_block == (0.0, 0.0)


def test_soft_threshold():
    assert soft_threshold(3.0, 1.0) == 2.0
    assert soft_threshold(-3.0, 1.0) == -2.0
    assert soft_threshold(0.5, 1.0) == 0.0
    assert soft_threshold(-1.0, 1.0) == 0.0


def reference_cd(dense, w, g, u, sw, sigma, beta, n, a1, a2, n_epochs, active):
    """NumPy transcription of the local subproblem's cyclic coordinate descent."""
    s = np.ones(dense.shape[0]) if sw.size == 0 else sw
    coef = sigma * beta / n
    sq = (s[:, None] * dense**2).sum(axis=0)
    n_changed, max_dz = 0, 0.0
    for _ in range(n_epochs):
        for j in active:
            if sq[j] == 0.0:
                n_changed += w[j] != 0.0
                w[j] = 0.0
                continue
            grad = dense[:, j] @ (g + coef * s * u)
            lj = coef * sq[j]
            x = lj * w[j] - grad
            new = np.sign(x) * max(abs(x) - a1, 0.0) / (lj + a2)
            u += dense[:, j] * (new - w[j])
            n_changed += new != w[j]
            max_dz = max(max_dz, abs(new - w[j]) * np.sqrt(sq[j] / n))
            w[j] = new
    return w, u, n_changed, max_dz


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    ("use_scale", "use_sw", "sigma", "beta", "l1_ratio"),
    [
        (False, False, 1.0, 1.0, 1.0),
        (True, False, 3.0, 0.25, 0.5),
        (False, True, 2.0, 1.0, 0.8),
        (True, True, 1.0, 0.25, 1.0),
    ],
)
def test_cd_block_epochs_matches_reference(shape, dtype, use_scale, use_sw, sigma, beta, l1_ratio):
    n, p = shape
    rng = np.random.default_rng(5)
    X = make_csc(n, p, 0.5, dtype, 4)
    col_scale = maybe_scale(p, use_scale, rng)
    sw = rng.uniform(0.2, 2.0, n) if use_sw else EMPTY
    dense = scaled_dense(X, col_scale)
    w0 = rng.standard_normal(p) * (rng.random(p) < 0.5)
    w0[0] = 0.7
    g = rng.standard_normal(n) / n
    alpha = 0.3 * np.abs(dense.T @ g).max() + 1e-3
    a1, a2 = alpha * l1_ratio, alpha * (1.0 - l1_ratio)
    active = rng.permutation(p)[: max(1, (3 * p) // 4)].astype(np.int64)
    active = np.union1d(active, [0]).astype(np.int64)[::-1].copy()
    sq = csc_col_sqnorms(*arrays(X), col_scale, sw)

    w = w0.copy()
    u = np.zeros(n)
    n_changed, max_dz = cd_block_epochs(
        *arrays(X),
        col_scale,
        w,
        g,
        u,
        sw,
        sq,
        sigma,
        beta,
        float(n),
        a1,
        a2,
        3,
        False,
        0,
        active,
        EMPTY,
        np.zeros(2),
    )
    w_ref, u_ref, n_changed_ref, max_dz_ref = reference_cd(
        dense, w0.copy(), g, np.zeros(n), sw, sigma, beta, n, a1, a2, 3, active
    )
    np.testing.assert_allclose(w, w_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(u, u_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(u, dense @ (w - w0), rtol=1e-10, atol=1e-12)
    assert w[0] == 0.0
    untouched = np.setdiff1d(np.arange(p), active)
    np.testing.assert_array_equal(w[untouched], w0[untouched])
    assert 1 <= n_changed_ref <= 3 * len(active)
    assert 1 <= n_changed <= 3 * len(active)
    np.testing.assert_allclose(max_dz, max_dz_ref, rtol=1e-10)


def test_cd_block_epochs_fixed_point_and_empty_active():
    X = make_csc(20, 6, 0.5, np.float64, 7)
    indptr, indices, data = arrays(X)
    sq = csc_col_sqnorms(indptr, indices, data, EMPTY, EMPTY)
    w = np.zeros(6)
    g = np.zeros(20)
    u = np.zeros(20)
    result = cd_block_epochs(
        indptr,
        indices,
        data,
        EMPTY,
        w,
        g,
        u,
        EMPTY,
        sq,
        1.0,
        1.0,
        20.0,
        0.1,
        0.0,
        5,
        True,
        3,
        np.arange(6, dtype=np.int64),
        EMPTY,
        np.zeros(2),
    )
    assert result == (0, 0.0)
    result = cd_block_epochs(
        indptr,
        indices,
        data,
        EMPTY,
        w,
        g + 1.0,
        u,
        EMPTY,
        sq,
        1.0,
        1.0,
        20.0,
        0.0,
        0.0,
        5,
        False,
        0,
        np.zeros(0, dtype=np.int64),
        EMPTY,
        np.zeros(2),
    )
    assert result == (0, 0.0)
    assert not w.any() and not u.any()


def test_cd_block_epochs_random_order_is_seeded():
    n, p = 40, 15
    X = make_csc(n, p, 0.4, np.float64, 8)
    indptr, indices, data = arrays(X)
    rng = np.random.default_rng(0)
    g = rng.standard_normal(n) / n
    sq = csc_col_sqnorms(indptr, indices, data, EMPTY, EMPTY)
    active = np.arange(p, dtype=np.int64)

    def run(seed, random_order=True):
        w, u = np.zeros(p), np.zeros(n)
        cd_block_epochs(
            indptr,
            indices,
            data,
            EMPTY,
            w,
            g,
            u,
            EMPTY,
            sq,
            1.0,
            1.0,
            float(n),
            1e-3,
            0.0,
            1,
            random_order,
            seed,
            active,
            EMPTY,
            np.zeros(2),
        )
        return w

    np.testing.assert_array_equal(run(11), run(11))
    cyclic = run(0, random_order=False)
    assert any(not np.array_equal(run(seed), cyclic) for seed in range(5))


def test_shuffle_is_uniform_permutation():
    counts = {}
    state = np.uint64(12345)
    for _ in range(6000):
        order = np.arange(3, dtype=np.int64)
        state = _shuffle(order, state)
        counts[tuple(order)] = counts.get(tuple(order), 0) + 1
    assert len(counts) == 6
    # Binomial(6000, 1/6): mean 1000, sd ~29.
    assert all(850 < c < 1150 for c in counts.values())
    order = np.arange(50, dtype=np.int64)
    _shuffle(order, np.uint64(0))
    np.testing.assert_array_equal(np.sort(order), np.arange(50))


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
                csc_xt_theta_stats(*blk, c, theta, n * penalty.alpha_l1)
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


def _gram_reference(Q, h, w, a1, a2, n_epochs):
    h, w = h.copy(), w.copy()
    for _ in range(n_epochs):
        for j in range(len(w)):
            if Q[j, j] <= 0:
                continue
            z = Q[j, j] * w[j] + h[j]
            new = np.sign(z) * max(abs(z) - a1, 0.0) / (Q[j, j] + a2)
            h -= Q[:, j] * (new - w[j])
            w[j] = new
    return h, w


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gram_matvec_matches_numpy(dtype):
    from dl1.kernels.gram import gram_matvec

    rng = np.random.default_rng(3)
    A = rng.standard_normal((11, 11))
    Q = np.ascontiguousarray(A + A.T, dtype=dtype)
    d = rng.standard_normal(11)
    d[[0, 4, 5]] = 0.0  # rows skipped
    out = np.full(11, np.nan)
    gram_matvec(Q, d, out)
    np.testing.assert_allclose(out, Q.astype(np.float64) @ d, rtol=1e-13, atol=1e-13)
    gram_matvec(Q, np.zeros(11), out)
    assert not out.any()


def test_gram_cd_on_float32_gram_steps_in_float64():
    """A float32 Q (the solver's storage) is read as its float64 value: the epochs equal the
    NumPy reference run on the rounded matrix."""
    from dl1.kernels.gram import gram_cd_epochs

    rng = np.random.default_rng(7)
    X = rng.standard_normal((50, 9))
    y = rng.standard_normal(50)
    Q32 = np.ascontiguousarray(X.T @ X / 50, dtype=np.float32)
    h0 = X.T @ y / 50
    h, w = h0.copy(), np.zeros(9)
    gram_cd_epochs(Q32, h, w, 0.05, 0.0, 4)
    h_ref, w_ref = _gram_reference(Q32.astype(np.float64), h0, np.zeros(9), 0.05, 0.0, 4)
    np.testing.assert_allclose(w, w_ref, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(h, h_ref, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("seed", range(4))
def test_gram_cd_matches_numpy_reference_and_residual_cd(seed):
    from sklearn.linear_model import ElasticNet as SkEnet

    from dl1.kernels.gram import gram_cd_epochs

    rng = np.random.default_rng(seed)
    n, m = 40, 12
    X = rng.standard_normal((n, m))
    X[:, 3] = 0.0  # an empty column stays at zero
    y = rng.standard_normal(n)
    Q = np.ascontiguousarray(X.T @ X / n)
    h0 = X.T @ y / n
    w0 = np.zeros(m)
    h, w = h0.copy(), w0.copy()
    gram_cd_epochs(Q, h, w, 0.05, 0.01, 3)
    h_ref, w_ref = _gram_reference(Q, h0, w0, 0.05, 0.01, 3)
    np.testing.assert_allclose(w, w_ref, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(h, h_ref, rtol=1e-12, atol=1e-14)
    # h stays -grad F(w): X^T (y - X w) / n
    np.testing.assert_allclose(h, X.T @ (y - X @ w) / n, atol=1e-12)
    # run to convergence: scikit-learn's elastic net (alpha_l1 = a l1, alpha_l2 = a (1 - l1))
    gram_cd_epochs(Q, h, w, 0.05, 0.01, 5000)
    sk = SkEnet(
        alpha=0.06, l1_ratio=0.05 / 0.06, fit_intercept=False, tol=1e-14, max_iter=100_000
    ).fit(X, y)
    np.testing.assert_allclose(w, sk.coef_, atol=1e-9)


def reference_profiled_cd(dense, w, g, sw, beta, n, a1, a2, n_epochs):
    """Coordinate descent with the intercept re-optimised after every step (NumPy).

    Each step minimises the quadratic model exactly over ``(w_j, b)``: brute force over a
    2 x 2 system instead of the kernel's centred column, then the intercept's own optimum is
    recomputed from scratch (not accumulated).
    """
    s = np.ones(dense.shape[0]) if sw.size == 0 else sw
    coef = beta / n
    u, shift = np.zeros(dense.shape[0]), 0.0
    for _ in range(n_epochs):
        for j in range(dense.shape[1]):
            x = dense[:, j]
            # model: g.(d x + e) + coef/2 ||d x + e||_s^2 + penalty(w_j + d); e eliminated
            gz = g + coef * s * (u + shift)
            S, cs, sq = s.sum(), s @ x, s @ x**2
            lj = coef * (sq - cs**2 / S)
            if lj <= 1e-12 * coef * sq or sq == 0.0:
                new = 0.0
            else:
                grad = x @ gz - cs / S * gz.sum()
                z = lj * w[j] - grad
                new = np.sign(z) * max(abs(z) - a1, 0.0) / (lj + a2)
            u += x * (new - w[j])
            w[j] = new
            shift = -(g.sum() + coef * s @ u) / (coef * S)  # intercept optimal for the model
    return w, u, shift


@pytest.mark.parametrize("use_sw", [False, True])
@pytest.mark.parametrize("use_scale", [False, True])
def test_cd_block_epochs_profiled_intercept_matches_reference(use_sw, use_scale):
    rng = np.random.default_rng(11)
    n, p = 30, 12
    X = make_csc(n, p, 0.6, np.float64, 3)
    X = sp.csc_matrix(np.abs(X.toarray()))  # positive features: collinear with the intercept
    dense_c = X.toarray()
    dense_c[:, 5] = 2.0  # a constant column: no effect once centred
    X = sp.csc_matrix(dense_c)
    col_scale = maybe_scale(p, use_scale, rng)
    sw = rng.uniform(0.2, 2.0, n) if use_sw else EMPTY
    s = np.ones(n) if sw.size == 0 else sw
    dense = scaled_dense(X, col_scale)
    g = rng.standard_normal(n) / n
    g -= s * g.sum() / s.sum()  # intercept optimal at the start: sum(g) = 0
    w0 = rng.standard_normal(p) * (rng.random(p) < 0.5)
    w0[5] = 0.7
    a1, a2 = 0.02, 0.01
    sq = csc_col_sqnorms(*arrays(X), col_scale, sw)
    col_sum = np.asarray(X.multiply(s[:, None]).sum(axis=0)).ravel()
    w, u, shift = w0.copy(), np.zeros(n), np.array([0.0, s.sum()])
    cd_block_epochs(
        *arrays(X),
        col_scale,
        w,
        g,
        u,
        sw,
        sq,
        1.0,
        1.0,
        float(n),
        a1,
        a2,
        4,
        False,
        0,
        np.arange(p, dtype=np.int64),
        col_sum,
        shift,
    )
    w_ref, u_ref, shift_ref = reference_profiled_cd(dense, w0.copy(), g, sw, 1.0, n, a1, a2, 4)
    np.testing.assert_allclose(w, w_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(u, u_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(shift[0], shift_ref, rtol=1e-9, atol=1e-12)
    assert w[5] == 0.0


def test_sparse_subproblem_with_intercept_matches_sklearn():
    """The working-set subproblem without a Gram matrix (profiled intercept) on positive
    features converges to scikit-learn's Lasso with intercept."""
    from dl1.tasks.blocks import assemble_block
    from dl1.tasks.columns import extract_task
    from dl1.tasks.subproblem import SubproblemSettings, subproblem_task

    rng = np.random.default_rng(2)
    n, p = 80, 30
    dense = np.abs(rng.standard_normal((n, p))) * (rng.random((n, p)) < 0.4) + 0.5 * (
        rng.random((n, p)) < 0.5
    )
    y = dense[:, :5] @ rng.standard_normal(5) + 0.1 * rng.standard_normal(n) + 3.0
    alpha = 0.01 * np.abs(dense.T @ (y - y.mean())).max() / n
    blk = assemble_block(0, 0, np.zeros(0), False, True, sp.csc_matrix(dense))
    ids = np.arange(p, dtype=np.int64)
    ext = extract_task(blk, ids)
    z = np.full(n, y.mean())
    res = subproblem_task(
        [ext],
        [ids],
        [True],
        ids,
        np.zeros(p),
        y,
        z,
        EMPTY,
        SubproblemSettings(Quadratic(), ElasticNet(alpha), True, 1e-12, 100_000, gram_max=0),
    )
    w, dz = res.w_ws, res.dz
    sk = SkElasticNet(alpha=alpha, l1_ratio=1.0, tol=1e-14, max_iter=1_000_000).fit(dense, y)
    np.testing.assert_allclose(w, sk.coef_, atol=1e-6)
    np.testing.assert_allclose(z + dz, dense @ sk.coef_ + sk.intercept_, atol=1e-6)


@pytest.mark.parametrize("use_scale", [False, True])
def test_compact_task_equals_extracting_the_subset(use_scale):
    from dl1.tasks.blocks import assemble_block
    from dl1.tasks.columns import compact_task, extract_task

    rng = np.random.default_rng(4)
    X = make_csc(20, 15, 0.4, np.float32, 1)
    blk = assemble_block(0, 0, np.zeros(0), use_scale, True, X)
    cols = np.array([1, 3, 4, 8, 9, 14])
    keep = np.sort(rng.choice(cols.shape[0], 3, replace=False))
    got = compact_task(extract_task(blk, cols), keep)
    want = extract_task(blk, cols[keep])
    for a, b in zip(got[:6], want[:6], strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 3, 7, 50])
def test_csc_dense_rows_matches_numpy(dtype, rows):
    from dl1.kernels.gram import csc_dense_rows

    rng = np.random.default_rng(rows)
    dense = sp.random(23, 9, density=0.3, random_state=rng, dtype=dtype).toarray()
    dense[:, 4] = 0.0  # an empty column
    A = sp.csc_matrix(dense)
    cursor = A.indptr[:-1].astype(np.int64)
    for r0 in range(0, 23, rows):
        r1 = min(23, r0 + rows)
        out = np.zeros((9, r1 - r0))
        csc_dense_rows(A.indptr.astype(np.int64), A.indices, A.data, cursor, r1, out)
        np.testing.assert_array_equal(out, dense[r0:r1].T)
    # every cursor has walked past its column
    np.testing.assert_array_equal(cursor, A.indptr[1:])


def test_take_submatrix_matches_numpy():
    from dl1.kernels.gram import take_submatrix

    rng = np.random.default_rng(0)
    src = rng.standard_normal((9, 9))
    src_idx = np.array([7, 0, 3, 4], dtype=np.int64)
    dst_idx = np.array([1, 2, 5, 0], dtype=np.int64)
    dst = np.full((6, 6), np.nan)
    take_submatrix(src, src_idx, dst, dst_idx)
    want = np.full((6, 6), np.nan)
    want[np.ix_(dst_idx, dst_idx)] = src[np.ix_(src_idx, src_idx)]
    np.testing.assert_array_equal(dst, want)


@pytest.mark.parametrize("density", [0.02, 0.6])  # the sparse product and the BLAS branch
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("profiled", [False, True])  # factor * G - c c^T (the subproblem's Q)
def test_working_set_gram_cached_equals_numpy(density, weighted, profiled):
    from dl1.tasks.gram import GRAM_CACHE, GRAM_DTYPE, working_set_gram

    rng = np.random.default_rng(int(density * 100) + weighted)
    n, p = 60, 40
    X = sp.random(n, p, density=density, format="csc", random_state=rng)
    X.sort_indices()
    s = rng.uniform(0.5, 2.0, n) if weighted else np.zeros(0)
    full = X.T @ (X.multiply(s[:, None]) if weighted else X)
    full = np.asarray(full.todense())
    factor, c_all = 1.0, None
    if profiled:
        factor, c_all = 1.0 / n, rng.standard_normal(p)
        full = factor * full - np.outer(c_all, c_all)
    key = f"test-{density}-{weighted}-{profiled}"
    GRAM_CACHE.pop(key, None)

    def gram(ws, scratch_max=10**6):
        A = X[:, ws]
        ip, ix, v = A.indptr.astype(np.int64), A.indices, A.data
        c = None if c_all is None else c_all[ws]
        return working_set_gram(ip, ix, v, n, s, ws, key, scratch_max, factor, c)

    # a first working set, then one that drops some columns and adds others: the rows of
    # the kept columns come from the cache, the new ones are computed (row blocks of 7)
    ws1 = np.sort(rng.choice(p, 15, replace=False))
    G1 = gram(ws1)
    # formed in float64, stored as GRAM_DTYPE: each entry is the float64 one, rounded
    assert G1.dtype == GRAM_DTYPE
    want = full[np.ix_(ws1, ws1)].astype(GRAM_DTYPE)
    np.testing.assert_allclose(G1, want, rtol=2.0**-23, atol=1e-12)  # one float32 ulp
    ws2 = np.union1d(ws1[::2], np.sort(rng.choice(p, 12, replace=False)))
    G2 = gram(ws2, scratch_max=7 * ws2.shape[0])
    want = full[np.ix_(ws2, ws2)].astype(GRAM_DTYPE)
    np.testing.assert_allclose(G2, want, rtol=2.0**-23, atol=1e-12)
    kept = np.isin(ws2, ws1)
    # cached entries are reused as they were
    sel1 = np.searchsorted(ws1, ws2[kept])
    np.testing.assert_array_equal(G2[np.ix_(kept, kept)], G1[np.ix_(sel1, sel1)])
    assert GRAM_CACHE[key][0].tolist() == ws2.tolist()
    assert gram(ws2) is G2  # the same working set again: the cached matrix, no work
    GRAM_CACHE.pop(key)


def _csc_with_empty_column(n, p, density, empty, dtype, rng) -> sp.csc_matrix:
    """A random CSC matrix whose column ``empty`` has no entries (explicit zeros removed)."""
    X = sp.random(n, p, density=density, format="lil", random_state=rng, dtype=dtype)
    X[:, empty] = 0
    X = sp.csc_matrix(X)
    X.eliminate_zeros()
    return X


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_csc_select_columns_matches_scipy(dtype):
    from dl1.kernels.select import csc_select_columns

    X = _csc_with_empty_column(30, 17, 0.3, 4, dtype, np.random.default_rng(0))
    for cols in ([], [4], [16, 0, 4, 3], list(range(17))[::-1], [2, 2]):
        cols = np.asarray(cols, dtype=np.int64)
        ip, ind, dat = csc_select_columns(
            X.indptr.astype(np.int64), X.indices.astype(np.int32), X.data, cols
        )
        ref = X[:, cols] if len(cols) else sp.csc_matrix((30, 0), dtype=dtype)
        got = sp.csc_matrix((dat, ind, ip), shape=(30, len(cols)))
        assert dat.dtype == dtype
        np.testing.assert_array_equal(got.toarray(), ref.toarray())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_csc_rows_as_csr_matches_numpy(dtype):
    from dl1.kernels.select import csc_rows_as_csr

    rng = np.random.default_rng(3)
    X = _csc_with_empty_column(40, 11, 0.35, 5, dtype, rng)
    # row indices out of order within the columns: the kernel must not rely on their order
    spans = itertools.pairwise(X.indptr)
    perm = np.concatenate([rng.permutation(np.arange(a, b)) for a, b in spans])
    ind, dat = X.indices[perm].astype(np.int32), X.data[perm]
    dense = X.toarray().astype(np.float64)
    scale = rng.uniform(0.5, 2.0, 11)
    for cols, r0, r1 in (([3, 0, 5, 10], 7, 29), ([], 0, 40), ([2, 2, 9], 0, 40), ([1], 13, 13)):
        cols = np.asarray(cols, dtype=np.int64)
        for sc in (scale, np.zeros(0)):
            ip, ci, vals = csc_rows_as_csr(X.indptr.astype(np.int64), ind, dat, sc, cols, r0, r1)
            assert vals.dtype == np.float64 and ci.dtype == np.int32 and ip.shape == (r1 - r0 + 1,)
            got = sp.csr_matrix((vals, ci, ip), shape=(r1 - r0, cols.shape[0]))
            ref = dense[r0:r1][:, cols] * (sc[cols] if sc.shape[0] else 1.0)
            np.testing.assert_array_equal(got.toarray(), ref)
            assert got.has_sorted_indices and got.nnz == np.count_nonzero(ref)


def test_csc_copy_columns_into_matches_scipy():
    from dl1.kernels.select import csc_copy_columns_into

    rng = np.random.default_rng(1)
    A = sp.csc_matrix(sp.random(30, 9, density=0.3, random_state=rng))
    B = sp.csc_matrix(sp.random(30, 6, density=0.5, random_state=rng))
    # result columns: A[:, 7], B[:, 0], A[:, 2], B[:, 5], B[:, 3]
    src = [(A, [7, 2], [0, 2]), (B, [0, 5, 3], [1, 3, 4])]
    ref = sp.hstack([A[:, 7], B[:, 0], A[:, 2], B[:, 5], B[:, 3]], format="csc")
    lens = np.zeros(5, dtype=np.int64)
    for M, cols, dest in src:
        lens[dest] = np.diff(M.indptr)[cols]
    ip = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    ind = np.full(ip[-1], -1, dtype=np.int32)
    dat = np.full(ip[-1], np.nan)
    for M, cols, dest in src:
        csc_copy_columns_into(
            M.indptr.astype(np.int64),
            M.indices.astype(np.int32),
            M.data,
            np.array(cols, dtype=np.int64),
            ip,
            np.array(dest, dtype=np.int64),
            ind,
            dat,
        )
    np.testing.assert_array_equal(ip, ref.indptr)
    np.testing.assert_array_equal(ind, ref.indices)
    np.testing.assert_array_equal(dat, ref.data)


def test_csc_scan_screen_matches_numpy():
    from dl1.kernels.screen import csc_scan_screen

    rng = np.random.default_rng(5)
    X = sp.random(40, 25, density=0.3, format="csc", random_state=rng)
    scale = rng.uniform(0.5, 2, 25)
    theta, prev = rng.standard_normal(40), rng.standard_normal(40)
    cols = np.array([3, 0, 24, 7, 7], dtype=np.int64)
    Xs = X.toarray() * scale
    for sc in (scale, np.zeros(0)):
        A = Xs if sc.size else X.toarray()
        c, keep = csc_scan_screen(
            X.indptr.astype(np.int64), X.indices, X.data, sc, cols, theta, prev, 0.7, 0.3, 1.5
        )
        np.testing.assert_allclose(c, A[:, cols].T @ theta, rtol=1e-12)
        ref = 0.7 * np.abs(A[:, cols].T @ prev) + 0.3 * np.linalg.norm(A[:, cols], axis=0) >= 1.5
        np.testing.assert_array_equal(keep, ref)
        c, keep = csc_scan_screen(
            X.indptr.astype(np.int64),
            X.indices,
            X.data,
            sc,
            cols,
            theta,
            np.zeros(0),
            0.7,
            0.3,
            1.5,
        )
        assert keep.all()


@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("l1_ratio", [1.0, 0.4])
def test_gram_gap_estimate_equals_the_exact_gap(fit_intercept, weighted, l1_ratio):
    """Moved from an exact check point with the true ``X^T theta``, the Gram-matrix estimate
    of the restricted gap is the gap dl1.objective.gap computes from the residual."""
    from dl1.objective.datafits import Quadratic
    from dl1.objective.gap import duality_gap
    from dl1.objective.penalties.elastic_net import ElasticNet
    from dl1.tasks.gram import GramGapEstimate

    rng = np.random.default_rng(int(fit_intercept) + 2 * int(weighted) + int(10 * l1_ratio))
    n, m = 80, 12
    X = rng.standard_normal((n, m))
    y = rng.standard_normal(n) + 2.0
    s = rng.uniform(0.5, 2.0, n) if weighted else None
    df, pen = Quadratic(), ElasticNet(0.05, l1_ratio)

    def state(w):
        z = X @ w
        if fit_intercept:
            z = z + df.intercept_update(y, z, s)
        theta = df.dual_point(y, z, s, fit_intercept)
        return z, theta, X.T @ theta

    w0 = rng.standard_normal(m) * (rng.random(m) < 0.5)
    z0, th0, h0 = state(w0)
    ybar = (y.mean() if s is None else s @ y / s.sum()) if fit_intercept else 0.0
    g_y = X.T @ ((y - ybar) * (1.0 if s is None else s))
    est = GramGapEstimate(df, pen, y, z0, th0, h0, w0, s, g_y)
    for step in (0.0, 1e-3, 0.3):
        w1 = w0 + step * rng.standard_normal(m) * (rng.random(m) < 0.7)
        z1, th1, h1 = state(w1)
        _, _, want = duality_gap(df, pen, y, z1, w1, h1, s=s, intercept=fit_intercept, theta=th1)
        assert want > 0
        assert est.gap(w1, h1 / n) == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("density", [0.05, 0.6])  # the sparse product and the BLAS branch
@pytest.mark.parametrize(("weighted", "shares"), [(False, False), (True, False), (True, True)])
def test_spread_gram_across_partitions_equals_numpy(density, weighted, shares):
    """The Gram matrix of a working set spread over two partitions (products of new columns
    sent in row pieces of 7 rows, scaled columns, weights, intercept profile), then updated
    for a second working set: equal to NumPy's, with the kept entries reused bit for bit.
    With ``shares`` every group is a share of its own (a one-byte share budget), so shares
    of the same partition exchange row pieces too."""
    from dl1.solvers.executor import LocalExecutor
    from dl1.solvers.subproblems import CachedGroup, spread_gram_task, spread_plan
    from dl1.tasks.blocks import assemble_block
    from dl1.tasks.columns import extract_task
    from dl1.tasks.gram import GRAM_DTYPE

    rng = np.random.default_rng(int(density * 100) + weighted)
    n, p = 50, 36
    X = sp.random(n, p, density=density, format="csc", random_state=rng)
    s = rng.uniform(0.5, 2.0, n) if weighted else np.zeros(0)
    sv = np.ones(n) if not weighted else s
    cb = np.array([0, 17, p])
    blocks = [assemble_block(j, cb[j], s, True, True, X[:, cb[j] : cb[j + 1]]) for j in range(2)]
    scale = np.concatenate([b.col_scale for b in blocks])
    Xs = X.toarray() * scale
    c_all = Xs.T @ sv / np.sqrt(n * sv.sum())
    full = Xs.T @ (sv[:, None] * Xs) / n - np.outer(c_all, c_all)
    ex = LocalExecutor()

    def groups_for(ids):
        out = []
        for j in range(2):
            g = ids[(ids >= cb[j]) & (ids < cb[j + 1])]
            if g.shape[0]:
                out.append(CachedGroup(extract_task(blocks[j], g - cb[j]), g, True))
        return out

    def gram(groups, ws, prev):
        if shares:
            plan = spread_plan(groups, ws, np.array([0, 1]), cb, np.ones(p), 1.0)
            assert len(plan) == sum(np.isin(g, ws).any() for _, g, _ in groups)
        else:
            plan = spread_plan(groups, ws, np.array([0, 1]), cb)
            assert len(plan) == 2
        ids = np.concatenate([gids[keep] for _, grp in plan for _, gids, keep in grp])
        got = spread_gram_task(ex, plan, ids, prev, c_all[ids], n, s, 12 * 7 * p, 10 * p)
        return got, ids

    ws1 = np.sort(rng.choice(p, 14, replace=False))
    groups = groups_for(ws1)
    g1, ids1 = gram(groups, ws1, None)
    Q1 = g1[0][1]
    assert Q1.dtype == GRAM_DTYPE and g1[0][0] is ids1
    tol = dict(rtol=2.0**-22, atol=1e-7 * np.abs(full).max())
    np.testing.assert_allclose(Q1, full[np.ix_(ids1, ids1)], **tol)
    ws2 = np.union1d(ws1[::2], np.sort(rng.choice(p, 12, replace=False)))
    groups += groups_for(np.setdiff1d(ws2, ws1))
    g2, ids2 = gram(groups, ws2, g1)
    Q2 = g2[0][1]
    np.testing.assert_allclose(Q2, full[np.ix_(ids2, ids2)], **tol)
    kept = np.flatnonzero(np.isin(ids2, ids1))
    old = np.searchsorted(ids1, ids2[kept], sorter=np.argsort(ids1))
    old = np.argsort(ids1)[old]
    np.testing.assert_array_equal(Q2[np.ix_(kept, kept)], Q1[np.ix_(old, old)])
    assert gram(groups, ws2, g2)[0] is g2  # the same working set: no work
