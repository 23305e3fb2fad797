"""Coordinate-descent kernels (on columns and on Gram matrices) against NumPy references."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from dl1.kernels import (
    cd_block_epochs,
    csc_col_sqnorms,
)
from dl1.kernels.cd import shuffle_order
from tests.kernel_helpers import (
    DTYPES,
    EMPTY,
    NO_BOX,
    SHAPES,
    arrays,
    make_csc,
    maybe_scale,
    scaled_dense,
)


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
        EMPTY, NO_BOX,
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
        EMPTY, NO_BOX,
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
        EMPTY, NO_BOX,
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
            EMPTY, NO_BOX,
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


def test_shuffle_order_is_uniform_permutation():
    counts = {}
    state = np.uint64(12345)
    for _ in range(6000):
        order = np.arange(3, dtype=np.int64)
        state = shuffle_order(order, state)
        counts[tuple(order)] = counts.get(tuple(order), 0) + 1
    assert len(counts) == 6
    # Binomial(6000, 1/6): mean 1000, sd ~29.
    assert all(850 < c < 1150 for c in counts.values())
    order = np.arange(50, dtype=np.int64)
    shuffle_order(order, np.uint64(0))
    np.testing.assert_array_equal(np.sort(order), np.arange(50))


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
    gram_cd_epochs(Q32, h, w, 0.05, 0.0, EMPTY, NO_BOX, 4)
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
    gram_cd_epochs(Q, h, w, 0.05, 0.01, EMPTY, NO_BOX, 3)
    h_ref, w_ref = _gram_reference(Q, h0, w0, 0.05, 0.01, 3)
    np.testing.assert_allclose(w, w_ref, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(h, h_ref, rtol=1e-12, atol=1e-14)
    # h stays -grad F(w): X^T (y - X w) / n
    np.testing.assert_allclose(h, X.T @ (y - X @ w) / n, atol=1e-12)
    # run to convergence: scikit-learn's elastic net (alpha_l1 = a l1, alpha_l2 = a (1 - l1))
    gram_cd_epochs(Q, h, w, 0.05, 0.01, EMPTY, NO_BOX, 5000)
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
        EMPTY, NO_BOX,
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
