"""A store's rows are read where their partition runs, whatever its number of row blocks.

A store written as one row block (the writer's default) used to be loaded for the sample-
wise solvers by chunk tasks Dask could run on any worker, then moved: the whole matrix
crossed the network. Each partition's worker now reads its piece of the block itself."""

from __future__ import annotations

import dask
import numpy as np
import pytest
import scipy.sparse as sp
from distributed import get_task_stream

import dl1
from dl1.convert import from_scipy
from dl1.row_blocks import row_sources
from dl1.store import open_store

#: Share of the matrix's bytes the workers may send one another during a fit: partitions'
#: sums (length p) or the labels, never the rows.
LARGEST_SHARE = 0.25


def regression(n: int = 20000, p: int = 300, seed: int = 3):
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=0.05, format="csr", random_state=seed)
    y = X[:, :20] @ rng.standard_normal(20) + 0.01 * rng.standard_normal(n)
    return X, np.asarray(y).ravel()


@pytest.mark.parametrize("formats", [("csc",), ("csc", "csr")])
@pytest.mark.parametrize("pieces", [1, 2, 3, 7])
def test_the_pieces_of_row_blocks_are_their_rows(tmp_path, formats, pieces):
    """Pass: each source's rows, read, are X's rows from its first row on, the sources
    cover X in order, numbered from 0; for one row block or two (400 rows each)."""
    X, y = regression(n=800, p=90)
    for rows in (None, 400):
        path = tmp_path / f"s-{rows}.zarr"
        from_scipy(X, y, path, row_block_rows=rows, formats=formats, n_feature_blocks=3)
        sources, starts = row_sources(open_store(path), "train", pieces)
        blocks = [s.load() for s in sources]
        assert [b.i for b in blocks] == list(range(len(sources)))
        assert starts[0] == 0 and starts[-1] == X.shape[0]
        assert [b.r0 for b in blocks] == list(starts[:-1])
        got = sp.vstack([sp.csr_matrix((b.data, b.indices, b.indptr), shape=(b.n_rows, b.p))
                         for b in blocks])  # fmt: skip
        assert (got != X).nnz == 0
        n_blocks = 1 if rows is None else 2
        assert len(sources) == n_blocks * pieces


@pytest.mark.parametrize("solver", ["row-newton", "sdca"])
def test_a_store_of_one_row_block_is_read_on_every_partitions_worker(local_cluster, tmp_path,
                                                                      solver):  # fmt: skip
    """Pass: with one stored row block and 2 partitions, the rows are read on both workers
    (a ``loaded_rows`` task on each), the workers send one another less than a quarter of
    the matrix's bytes in the whole fit, and the fit equals the one in this process.
    Before: chunk tasks ran anywhere and the rows were moved (all of them, measured)."""
    X, y = regression()
    path = tmp_path / "one-block.zarr"
    from_scipy(X, y, path, formats=("csc", "csr"), n_feature_blocks=4)
    assert len(open_store(path).row_bounds("train")) == 2
    kw = dict(alpha=0.02, tol=1e-10, solver=solver, n_partitions=2)
    if solver == "sdca":
        kw |= dict(l1_ratio=0.5, tol=1e-6, max_epochs=1000)
    here = dl1.fit(str(path), **kw)

    def between_workers() -> int:
        """Bytes of task results the workers have sent one another (not to the client)."""
        logs = local_cluster.run(
            lambda dask_worker: [(d["who"], d["total"]) for d in dask_worker.transfer_outgoing_log]
        )
        return sum(b for log in logs.values() for who, b in log if who in logs)

    before = between_workers()
    with dask.config.set({"dl1.one-piece": False}), get_task_stream(local_cluster) as ts:
        there = dl1.fit(str(path), client=local_cluster, **kw)
    moved = between_workers() - before
    readers = {t["worker"] for t in ts.data if str(t["key"]).startswith("loaded_rows")}
    assert moved < LARGEST_SHARE * (X.data.nbytes + X.indices.nbytes)
    assert len(readers) == 2
    np.testing.assert_allclose(there.coef_, here.coef_, rtol=0, atol=1e-7)
    assert there.gap_ <= kw["tol"]
