"""``csc_cross_gram`` by tiles of rows: against a dense NumPy product, for any tile."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from dl1.kernels.gram import csc_cross_gram


def _short_rows(n: int, m: int, seed: int) -> sp.csc_matrix:
    """Rows of a few nonzeros over Zipf-like columns (long first columns), some rows empty,
    one row with a nonzero in every column."""
    rng = np.random.default_rng(seed)
    per_row = rng.poisson(3.0, n)
    p = 1.0 / np.arange(1, m + 1)
    rows, cols = [], []
    for i, k in enumerate(per_row):
        c = np.unique(rng.choice(m, size=min(k, m), p=p / p.sum()))
        rows += [i] * c.shape[0]
        cols += c.tolist()
    rows += [n // 2] * m
    cols += list(range(m))
    A = sp.coo_matrix((rng.standard_normal(len(rows)), (rows, cols)), shape=(n, m)).tocsc()
    A.sum_duplicates()
    return A


@pytest.mark.parametrize("weighted", [False, True])
def test_tiles_match_a_dense_product_and_each_other_bit_for_bit(weighted):
    rng = np.random.default_rng(3)
    n, m = 1000, 40
    A = _short_rows(n, m, 5)
    new = np.array([39, 0, 7, 8, 21], dtype=np.int64)  # any order
    s = rng.uniform(0.1, 2.0, n) if weighted else np.zeros(0)
    Ad = A.toarray()
    want = Ad.T @ ((s[:, None] if weighted else 1.0) * Ad[:, new])
    outs = []
    for tile in (1, 7, 256, 4096):  # one row, a few, uneven, one tile for all
        out = np.zeros((new.shape[0], m))
        csc_cross_gram(A.indptr.astype(np.int64), A.indices, A.data, n, new, s, out, tile)
        np.testing.assert_allclose(out.T, want, rtol=1e-12, atol=1e-12)
        outs.append(out)
    for out in outs[1:]:  # every entry sums its rows in the same order
        np.testing.assert_array_equal(out, outs[0])


def test_the_product_is_added_to_out_and_columns_outside_new_are_only_read():
    A = _short_rows(300, 12, 9)
    new = np.array([2, 5], dtype=np.int64)
    Ad = A.toarray()
    out = np.ones((2, 12))
    csc_cross_gram(A.indptr.astype(np.int64), A.indices, A.data, 300, new, np.zeros(0), out, 16)
    np.testing.assert_allclose(out.T, 1.0 + Ad.T @ Ad[:, new], rtol=1e-12, atol=1e-12)
