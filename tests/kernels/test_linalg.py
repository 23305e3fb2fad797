"""Sparse linear-algebra, column-selection and screening kernels against NumPy references."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp

from dl1.kernels import (
    csc_col_sqnorms,
    csc_matvec,
    csc_rmatvec,
    csc_xt_theta_stats,
    soft_threshold,
)
from dl1.kernels.linalg import DUAL_SIDES, csc_col_absmax
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
def test_csc_col_absmax(shape, dtype, use_scale):
    n, p = shape
    rng = np.random.default_rng(4)
    X = make_csc(n, p, 0.4, dtype, 3)
    col_scale = maybe_scale(p, use_scale, rng)
    out = np.full(p, -1.0)
    csc_col_absmax(X.indptr, X.data, col_scale, out)
    np.testing.assert_allclose(out, np.abs(scaled_dense(X, col_scale)).max(axis=0),
                               rtol=1e-12, atol=0.0)  # fmt: skip
    assert out[0] == 0.0


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
    absmax, excess_sq, box = csc_xt_theta_stats(*arrays(X), col_scale, theta, threshold, EMPTY,
                                                NO_BOX, float(n), 0.0, DUAL_SIDES)
    assert box == 0.0
    np.testing.assert_allclose(absmax, c.max(), rtol=1e-12)
    np.testing.assert_allclose(excess_sq, (np.maximum(c - threshold, 0.0) ** 2).sum(), rtol=1e-12)
    empty_block = csc_xt_theta_stats(
        np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0, dtype), EMPTY, theta, 0.0,
        EMPTY, NO_BOX, 1.0, 0.0, DUAL_SIDES,
    )
    assert empty_block == (0.0, 0.0, 0.0)


def test_soft_threshold():
    assert soft_threshold(3.0, 1.0) == 2.0
    assert soft_threshold(-3.0, 1.0) == -2.0
    assert soft_threshold(0.5, 1.0) == 0.0
    assert soft_threshold(-1.0, 1.0) == 0.0


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


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_csc_cross_gram_matches_scipy(weighted, dtype):
    from dl1.kernels.gram import csc_cross_gram

    rng = np.random.default_rng(7)
    n, m = 300, 25
    A = sp.random(n, m, density=0.1, format="lil", random_state=rng, dtype=dtype)
    A[:, 3] = 0.0  # an empty column
    A = sp.csc_matrix(A)
    new = np.array([0, 3, 4, 11, 24], dtype=np.int64)
    s = rng.uniform(0.1, 2.0, n)
    Ad = A.toarray().astype(np.float64)
    want = Ad.T @ ((s[:, None] if weighted else 1.0) * Ad[:, new])
    out = np.zeros((new.shape[0], m))
    csc_cross_gram(A.indptr.astype(np.int64), A.indices, A.data, n, new,
                   s if weighted else np.zeros(0), out)  # fmt: skip
    np.testing.assert_allclose(out.T, want, rtol=1e-12, atol=1e-12)
