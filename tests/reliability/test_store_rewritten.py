"""A store rewritten in place between two fits on one cluster is read again: its blocks'
Dask keys carry the manifest's checksums of every chunk, so the cluster's memory of the
first store's blocks cannot answer for the second.

Pass: the second fit equals a fit of the second data in process, bit for bit, in one piece
and distributed; and the keys of the two stores' blocks differ.
"""

from __future__ import annotations

import shutil

import dask
import numpy as np
import pytest
import scipy.sparse as sp

import dl1


def _write(path, seed):
    X = sp.random(300, 40, density=0.2, format="csr", random_state=seed)
    y = X @ np.random.default_rng(seed).standard_normal(40)
    shutil.rmtree(path, ignore_errors=True)
    dl1.from_scipy(X, y, path, n_feature_blocks=4)
    return X, y


def _keys(path):
    """The Dask keys of the store's blocks."""
    from dask.core import flatten

    return set(flatten(dl1.open_store(path).to_dask().__dask_keys__()))


@pytest.mark.parametrize("one_piece", [True, False], ids=["one piece", "distributed"])
def test_a_store_rewritten_in_place_is_read_again(local_cluster, tmp_path, one_piece):
    path = tmp_path / "s.zarr"
    with dask.config.set({"dl1.one-piece": one_piece}):
        _write(path, 0)
        first_keys = _keys(path)
        first = dl1.fit(path, alpha=0.01, tol=1e-8, client=local_cluster)
        X, y = _write(path, 1)
        second = dl1.fit(path, alpha=0.01, tol=1e-8, client=local_cluster)
    assert first_keys and not first_keys & _keys(path)
    ref = dl1.fit(X, y, alpha=0.01, tol=1e-8, client=None)
    assert np.abs(first.coef_ - ref.coef_).max() > 0.1  # the two stores' answers differ
    np.testing.assert_array_equal(second.coef_, ref.coef_)
