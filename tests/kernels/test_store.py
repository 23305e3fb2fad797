"""Store kernels against NumPy references."""

import numpy as np
import pytest
import scipy.sparse as sp

from dl1.kernels import store as store_kernels
from tests.helpers import random_csr


def reference_check(indptr, indices, data, limit):
    n = len(indptr) - 1
    if indptr[0] != 0 or indptr[-1] != len(indices) or len(data) != len(indices):
        return store_kernels.BAD_INDPTR, 0, 0
    for r in range(n):
        if indptr[r + 1] < indptr[r]:
            return store_kernels.BAD_INDPTR, r, indptr[r]
        for k in range(indptr[r], indptr[r + 1]):
            if indices[k] < 0:
                return store_kernels.NEGATIVE_INDEX, r, k
            if 0 <= limit <= indices[k]:
                return store_kernels.INDEX_TOO_LARGE, r, k
            if k > indptr[r] and indices[k] == indices[k - 1]:
                return store_kernels.DUPLICATE, r, k
            if k > indptr[r] and indices[k] < indices[k - 1]:
                return store_kernels.UNSORTED, r, k
            if not np.isfinite(data[k]):
                return store_kernels.NOT_FINITE, r, k
    return store_kernels.OK, 0, 0


@pytest.mark.parametrize("seed", range(30))
def test_check_compressed_matches_reference(seed):
    rng = np.random.default_rng(seed)
    X = random_csr(6, 9, 0.4, seed=seed, dtype=rng.choice([np.float32, np.float64]))
    indptr, indices, data = X.indptr.astype(np.int64), X.indices.copy(), X.data.copy()
    if len(indices):
        k = rng.integers(len(indices))
        fault = rng.integers(6)
        if fault == 1:
            indices[k] = -1
        elif fault == 2:
            indices[k] = 9
        elif fault == 3 and k > 0:
            indices[k] = indices[k - 1]
        elif fault == 4:
            data[k] = rng.choice([np.nan, np.inf, -np.inf])
        elif fault == 5:
            indices[::-1].sort()
    assert store_kernels.check_compressed(indptr, indices, data, 9) == reference_check(
        indptr, indices, data, 9
    )
    bad = indptr.copy()
    bad[-1] += 1
    assert store_kernels.check_compressed(bad, indices, data, 9)[0] == store_kernels.BAD_INDPTR


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("base", [0, 1])
def test_csr_to_col_sorted_is_a_stable_transpose(seed, base):
    X = random_csr(20, 15, 0.3, seed=seed)
    rows, cols, vals, counts = store_kernels.csr_to_col_sorted(
        X.indptr.astype(np.int64), X.indices + base, X.data, base, 15
    )
    C = X.tocoo()
    order = np.lexsort((C.row, C.col))
    np.testing.assert_array_equal(rows, C.row[order])
    np.testing.assert_array_equal(cols, C.col[order])
    np.testing.assert_array_equal(vals, C.data[order])
    np.testing.assert_array_equal(counts, X.getnnz(axis=0))


@pytest.mark.parametrize("seed", range(5))
def test_coo_to_csc_matches_scipy(seed):
    X = random_csr(25, 11, 0.3, seed=seed, dtype=np.float32)
    C = X.tocoo()
    indptr, indices, data = store_kernels.coo_to_csc(
        C.row.astype(np.int32), C.col.astype(np.int32), C.data, 11
    )
    ref = sp.csc_matrix(X)
    ref.sort_indices()
    np.testing.assert_array_equal(indptr, ref.indptr)
    np.testing.assert_array_equal(indices, ref.indices)
    np.testing.assert_array_equal(data, ref.data)
    assert data.dtype == np.float32


@pytest.mark.parametrize("seed", [0, 1])
def test_csc_append_rows_equals_vstack(seed):
    rng = np.random.default_rng(seed)
    chunks = [
        sp.csc_matrix(random_csr(int(rng.integers(1, 30)), 17, 0.3, seed + k, empty_cols=[3]))
        for k in range(4)
    ]
    ref = sp.vstack(chunks, format="csc")
    counts = sum(np.diff(c.indptr) for c in chunks)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    indices = np.full(indptr[-1], -1, dtype=np.int32)
    data = np.zeros(indptr[-1])
    cursor = indptr[:-1].copy()
    offset = 0
    for c in chunks:
        store_kernels.csc_append_rows(c.indptr, c.indices, c.data, offset, indices, data, cursor)
        offset += c.shape[0]
    np.testing.assert_array_equal(cursor, indptr[1:])
    np.testing.assert_array_equal(indptr, ref.indptr)
    np.testing.assert_array_equal(indices, ref.indices)
    np.testing.assert_array_equal(data, ref.data)
