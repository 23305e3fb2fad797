"""A matrix in this process's memory is read by the fit's blocks without copies, left as
it was, and copied once by a data handle held in process."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import dl1
from dl1.chunks import ColumnSliced
from dl1.inputs import as_dask
from dl1.loading import load_blocks
from dl1.runtime.executor import LocalExecutor
from tests.helpers import random_csr


def _chunks(Xd):
    """The chunks as the fit's blocks take them (:func:`dl1.loading.load_blocks`)."""
    return [d.compute(scheduler="sync") for d in Xd.to_delayed()[0]]


@pytest.mark.parametrize("kind", ["csc", "dense"])
def test_the_dask_array_of_a_matrix_in_memory_slices_it_without_copies(kind):
    X = random_csr(50, 23, 0.3, seed=1).tocsc()
    X = X.toarray() if kind == "dense" else X
    Xd, _, _, local = as_dask(X, "train")
    data = (lambda a: a) if kind == "dense" else (lambda m: m.data)
    assert np.shares_memory(data(local), data(X)) and Xd.numblocks == (1, 4)
    pieces = _chunks(Xd)
    assert all(np.shares_memory(data(c), data(X)) for c in pieces if c.shape[1])
    whole = np.hstack(pieces) if kind == "dense" else sp.hstack(pieces).toarray()
    np.testing.assert_array_equal(whole, X if kind == "dense" else X.toarray())
    if kind == "csc":  # and the fit's blocks made of them
        blocks, _ = load_blocks(LocalExecutor(), Xd, np.zeros(0), False, False, 2, local=local)
        assert all(np.shares_memory(b.data, X.data) for b in blocks)


def test_other_slices_than_column_ranges_are_scipys():
    X = random_csr(30, 10, 0.4, seed=2).tocsc()
    cs = ColumnSliced(X)
    np.testing.assert_array_equal(cs[2:9, 1:4].toarray(), X[2:9, 1:4].toarray())
    np.testing.assert_array_equal(cs[:, 1:8:2].toarray(), X[:, 1:8:2].toarray())
    np.testing.assert_array_equal(cs[:, 3:3].toarray(), np.zeros((30, 0)))
    assert cs.shape == X.shape and cs.dtype == X.dtype and cs.ndim == 2


def test_a_fit_leaves_the_matrix_and_a_handle_holds_its_own_copy():
    X = random_csr(200, 40, 0.2, seed=4).tocsc()
    y = X @ np.r_[np.ones(5), np.zeros(35)] + 0.1 * np.random.default_rng(4).standard_normal(200)
    before = X.copy()
    ref = dl1.fit(X, y, alpha=0.01, tol=1e-10)
    for a in ("data", "indices", "indptr"):
        np.testing.assert_array_equal(getattr(X, a), getattr(before, a))
    with dl1.persist(X, y) as ds:
        X.data *= 3.0  # the caller's matrix changes; the handle's blocks do not
        res = dl1.fit(ds, alpha=0.01, tol=1e-10)
    np.testing.assert_allclose(res.coef_, ref.coef_, rtol=0, atol=1e-10)
