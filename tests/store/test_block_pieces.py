"""A store with fewer feature blocks than partitions is loaded in pieces, one per partition."""

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.linear_model import Lasso

import dl1
from dl1.loading import finer_bounds
from dl1.runtime.executor import DistributedExecutor
from tests.solving import load_blocks_for_test


def zipf_columns(n=400, p=60, seed=0):
    """Columns whose nonzeros fall off like 1/j, as words in text: equal widths would give
    the first piece nearly all the work."""
    rng = np.random.default_rng(seed)
    dens = np.minimum(1.0, 3.0 / (1.0 + np.arange(p)))
    X = sp.csc_matrix((rng.random((n, p)) < dens) * rng.uniform(0.5, 2.0, (n, p)))
    y = X @ np.r_[rng.standard_normal(6), np.zeros(p - 6)] + 0.1 * rng.standard_normal(n)
    return X, y


@pytest.mark.parametrize("pieces", [2, 3, 5])
def test_cuts_balance_nonzeros(pieces):
    nnz = np.asarray(zipf_columns()[0].getnnz(axis=0))
    b = finer_bounds(np.array([0, nnz.shape[0]]), pieces, nnz)
    assert b[0] == 0 and b[-1] == nnz.shape[0] and np.all(np.diff(b) > 0)
    assert len(b) - 1 == pieces
    shares = np.add.reduceat(nnz, b[:-1]) / nnz.sum()
    # each piece within one column's nonzeros of an equal share
    assert np.all(np.abs(shares - 1 / pieces) <= nnz.max() / nnz.sum())


def test_enough_blocks_are_kept_and_cuts_never_cross_stored_blocks():
    stored = np.array([0, 10, 30])
    assert finer_bounds(stored, 2, None) is stored
    b = finer_bounds(stored, 5, None)
    assert set(stored.tolist()) <= set(b.tolist()) and len(b) - 1 == 6


def test_one_block_store_is_shared_by_both_workers_and_fits_right(local_cluster, tmp_path):
    """Pass criterion: a store written as one feature block loads as two pieces held by
    different workers, and the fit from it equals scikit-learn's Lasso to 1e-6."""
    X, y = zipf_columns()
    path = tmp_path / "one.zarr"
    dl1.from_scipy(X, y, path, n_feature_blocks=1)
    assert len(dl1.open_store(path).col_bounds("train")) == 2
    ex = DistributedExecutor(local_cluster)
    blocks, cb, *_ = load_blocks_for_test(ex, path)
    assert len(blocks) == 2 and cb[0] == 0 and cb[-1] == X.shape[1]
    holders = local_cluster.who_has(blocks)
    assert len({w for ws in holders.values() for w in ws}) == 2
    amax = dl1.alpha_max(path, client=local_cluster)
    res = dl1.fit(path, alpha=amax / 10, tol=1e-10, client=local_cluster)
    ref = Lasso(alpha=amax / 10, tol=1e-12, max_iter=100_000).fit(X, y)
    np.testing.assert_allclose(res.coef_, ref.coef_, atol=1e-6)
    assert res.intercept_ == pytest.approx(ref.intercept_, abs=1e-6)
