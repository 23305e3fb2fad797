"""Reading a store in one process: each stored block read once, array metadata parsed once
(without opening the array through zarr), and a rewritten metadata file seen at once."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp
import zarr

import dl1
import dl1.store.arrays as stored_arrays
import dl1.store.reader as reader
from dl1.errors import StoreCorruptError
from dl1.runtime.executor import LocalExecutor
from tests.solving import load_blocks_for_test


@pytest.fixture
def one_block(tmp_path):
    rng = np.random.default_rng(4)
    X = sp.random(200, 30, density=0.2, format="csc", random_state=rng)
    y = rng.standard_normal(200)
    path = tmp_path / "one.zarr"
    dl1.from_scipy(X, y, path, n_feature_blocks=1)
    return X, y, path


def test_a_stored_block_cut_for_two_partitions_is_read_once_in_process(one_block, monkeypatch):
    """Pass: in process the one stored block is read once (not once per piece) and the two
    pieces hold exactly X's columns."""
    X, _, path = one_block
    calls = []
    original = reader.read_block_arrays
    monkeypatch.setattr(
        reader, "read_block_arrays", lambda *a: calls.append(a[1:5]) or original(*a)
    )
    blocks, cb, *_ = load_blocks_for_test(LocalExecutor(), path)
    assert calls == [("train", "csc", 0, 0)]
    assert len(blocks) == 2 and cb[0] == 0 and cb[-1] == X.shape[1]
    for b, lo, hi in zip(blocks, cb[:-1], cb[1:], strict=True):
        piece = sp.csc_matrix((b.data, b.indices, b.indptr), shape=(X.shape[0], hi - lo))
        assert (piece != X[:, lo:hi]).nnz == 0


def test_arrays_are_read_without_zarr_and_their_metadata_parsed_once(one_block, monkeypatch):
    """Pass: with ``zarr.open_array`` failing, every array of dl1's codec chain still reads
    to the values written, and a second read parses no metadata."""
    X, y, path = one_block
    st = dl1.open_store(path)

    def refuse(*a, **k):
        raise AssertionError("zarr.open_array called")

    monkeypatch.setattr(zarr, "open_array", refuse)
    stored_arrays._ARRAY_META.clear()
    np.testing.assert_array_equal(st.read("y"), y)
    assert (st.read_block() != X).nnz == 0
    parsed = dict(stored_arrays._ARRAY_META)
    assert len(parsed) == 4  # y, indptr, indices, data
    st.read("y")
    st.read_block()
    assert stored_arrays._ARRAY_META.keys() == parsed.keys()


def test_rewritten_metadata_is_read_again(one_block):
    """Pass: an array's zarr.json changed after a read (another codec) is refused on the
    next read, not served from the parsed copy."""
    _, y, path = one_block
    st = dl1.open_store(path)
    np.testing.assert_array_equal(st.read("y"), y)
    meta = path / "train" / "y" / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["codecs"][1] = {"name": "gzip", "configuration": {"level": 5}}
    meta.write_text(json.dumps(doc))
    with pytest.raises(StoreCorruptError, match=r"array 'train/y' uses the codecs .*GzipCodec"):
        st.read("y")
