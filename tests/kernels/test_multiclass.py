"""The multiclass kernels against NumPy references."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.special import logsumexp, softmax

from dl1.kernels.multiclass import csc_mat_add, csc_xt_mat, mc_cd_epoch, softmax_rows


def _csc(n=40, p=12, seed=0):
    return sp.random(n, p, density=0.3, format="csc", random_state=seed)


def test_xt_mat_and_mat_add_match_numpy():
    X = _csc()
    rng = np.random.default_rng(1)
    M = rng.standard_normal((40, 5))
    out = np.empty((12, 5))
    csc_xt_mat(X.indptr, X.indices, X.data, M, out)
    np.testing.assert_allclose(out, X.T @ M, rtol=1e-13, atol=1e-13)
    W = rng.standard_normal((12, 5))
    Z = M.copy()
    csc_mat_add(X.indptr, X.indices, X.data, W, Z)
    np.testing.assert_allclose(Z, M + X @ W, rtol=1e-13, atol=1e-13)


def test_softmax_rows_match_scipy_without_overflow():
    Z = np.random.default_rng(2).standard_normal((30, 4)) * 400  # exp would overflow
    P, lse = np.empty_like(Z), np.empty(30)
    softmax_rows(Z, P, lse)
    np.testing.assert_allclose(P, softmax(Z, axis=1), rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(lse, logsumexp(Z, axis=1), rtol=1e-13)


def _reference_epoch(X, W, Z, codes, a1, a2, grouped, s):
    """One sweep of block proximal gradient, a feature's K coefficients at a time, with
    the kernel's step rule written plainly: the metric diag(h), ``h_k = sum_i s_i x_ij^2
    P_ik / n`` (its largest for every class when grouped), doubled until majorised, each
    entry capped by sum_i s_i x_ij^2 / (2n); ``s`` the sample weights."""
    n, K = Z.shape
    Y = np.eye(K)[codes]

    def f(Zt):
        return s @ (logsumexp(Zt, axis=1) - Zt[np.arange(n), codes]) / n

    for j in range(X.shape[1]):
        col = X[:, [j]].toarray().ravel()
        if not col.any():
            continue
        P = softmax(Z, axis=1)
        g = (s * col) @ (P - Y) / n
        l_max = 0.5 * (s * col) @ col / n
        h = np.clip((s * col**2) @ P / n, 1e-4 * l_max, l_max)
        if grouped:
            h[:] = h.max()
        scale = 1.0
        while True:
            D = np.minimum(scale * h, l_max)
            u = W[j] - g / D
            if grouped:
                norm = np.linalg.norm(u)
                new = u * max(0.0, 1 - a1 / (D[0] * norm)) / (1 + a2 / D[0]) if norm else 0 * u
            else:
                new = np.sign(u) * np.maximum(np.abs(u) - a1 / D, 0) / (1 + a2 / D)
            d = new - W[j]
            if not d.any() or (D >= l_max).all():
                break
            if f(Z + np.outer(col, d)) - f(Z) <= g @ d + 0.5 * D @ (d * d):
                break
            scale *= 2
        W[j] = new
        Z = Z + np.outer(col, d)
    return W, Z


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("grouped", [False, True])
def test_cd_epoch_matches_a_numpy_sweep(grouped, weighted):
    X = _csc(n=60, p=10, seed=3)
    rng = np.random.default_rng(4)
    K = 3
    codes = rng.integers(0, K, 60)
    W0 = rng.standard_normal((10, K)) * 0.5
    Z0 = X @ W0 + rng.standard_normal(K)
    a1, a2 = 0.01, 0.005
    s = rng.uniform(0, 2, 60) if weighted else np.ones(60)
    W_ref, Z_ref = _reference_epoch(X, W0.copy(), Z0.copy(), codes, a1, a2, grouped, s)
    W, Z = W0.copy(), Z0.copy()
    P, lse = np.empty_like(Z), np.empty(60)
    softmax_rows(Z, P, lse)
    sq = s @ X.multiply(X).toarray()
    sw = s if weighted else np.zeros(0)
    big = mc_cd_epoch(X.indptr, X.indices.astype(np.int64), X.data, sw, sq, W, Z, P, lse,
                      codes, a1, a2, grouped)  # fmt: skip
    np.testing.assert_allclose(W, W_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(Z, Z_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(P, softmax(Z, axis=1), rtol=1e-12)
    assert big == pytest.approx(np.abs(W - W0).max(), rel=1e-12)
