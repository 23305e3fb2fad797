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


def columns_of(blocks):
    """The blocks' matrix (dense), column scales and squared norms, in feature order."""
    dense = np.hstack([sp.csc_matrix((b.data, b.indices, b.indptr), shape=(b.n, b.ncols))
                       .toarray() for b in blocks])  # fmt: skip
    scale = np.concatenate([b.col_scale for b in blocks])
    return dense, scale, np.concatenate([b.col_sqnorm for b in blocks])


@pytest.mark.parametrize("n_partitions", [2, 5])
def test_a_store_read_in_process_gives_the_blocks_its_task_graph_gives(tmp_path, n_partitions):
    """Pass criterion: in this process a store's blocks are read without a task graph
    (whole, or as pieces of its stored blocks, each over several row blocks); their columns,
    scales and norms equal those computed through dask from the store's dask array, at
    standardisation with sample weights, and the columns are X's."""
    from dl1.inputs import read_inputs
    from dl1.loading import load_blocks
    from dl1.runtime.executor import LocalExecutor

    X, y = zipf_columns(n=300, p=50)
    sw = np.random.default_rng(1).uniform(0.5, 2.0, X.shape[0])
    path = tmp_path / "pieces.zarr"
    dl1.from_scipy(X, y, path, n_feature_blocks=2, row_block_rows=120)
    inputs = read_inputs(str(path), None, sw, "squared", "train")
    assert len(inputs.X.chunks[0]) == 3 and len(inputs.X.chunks[1]) == 2
    ex = LocalExecutor()
    args = (inputs.sample_weight, True, True, n_partitions)
    here, cb = load_blocks(ex, inputs.X, *args, inputs.store, "train")
    graph, _ = load_blocks(ex, inputs.X, *args, None, "train")  # no store: the dask graph
    assert len(here) == len(cb) - 1 >= n_partitions
    assert [b.j for b in here] == list(range(len(here)))
    got, want = columns_of(here), columns_of(graph)
    for a, b, name in zip(got, want, ("columns", "scales", "norms"), strict=True):
        np.testing.assert_array_equal(a, b, err_msg=name)
    np.testing.assert_array_equal(got[0], X.toarray())
