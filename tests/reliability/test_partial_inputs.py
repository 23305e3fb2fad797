"""Reliability round 3, second part (issue 52): a failed write leaves no writer behind, and
an svmlight line past its stated cap is refused in bounded memory."""

from __future__ import annotations

import gzip
import time
import tracemalloc

import dask.array as da
import numpy as np
import pytest
from sklearn.datasets import load_svmlight_file

import dl1
from dl1.errors import SvmlightFormatError, ValidationError
from dl1.io import from_svmlight
from dl1.io.svmlight import memory_bound
from dl1.store import open_store
from tests.io.test_svmlight import assert_not_finalised, write


def _slow_blocks(block: np.ndarray, block_info=None) -> np.ndarray:
    """A chunk computed slowly, except block (0, 0) (which holds the NaN): its error comes
    while the other blocks' writers are still at work."""
    if block_info[0]["chunk-location"] != (0, 0):
        time.sleep(0.3)
    return block


@pytest.mark.parametrize("on_cluster", [False, True])
def test_a_failed_from_dask_leaves_nothing_and_its_retry_writes(tmp_path, on_cluster, request):
    """A NaN in the first of 16 blocks, the others slower: the error names it, raised
    once every writer has ended; what is left at the path is no store (no manifest), and
    the same call with overwrite=True at once, the NaN gone, writes the store (no writer
    of the failed call is still writing into it)."""
    client = request.getfixturevalue("local_cluster") if on_cluster else None
    X = np.arange(1.0, 401.0).reshape(40, 10)
    X[2, 1] = np.nan
    bad = da.from_array(X, chunks=(10, 3)).map_blocks(_slow_blocks, dtype=X.dtype)
    with pytest.raises(ValidationError, match=r"block \(0, 0\), row 2, column 1: value is NaN"):
        dl1.from_dask(bad, np.zeros(40), tmp_path / "s", client=client)
    with pytest.raises(Exception, match="manifest|not a dl1 store|does not exist"):
        open_store(tmp_path / "s")
    X[2, 1] = 0.0
    good = da.from_array(X, chunks=(10, 3)).map_blocks(_slow_blocks, dtype=X.dtype)
    store = dl1.from_dask(good, np.zeros(40), tmp_path / "s", client=client, overwrite=True)
    got = store.to_dask().map_blocks(lambda b: b.toarray(), dtype=X.dtype).compute()
    np.testing.assert_array_equal(got, X)


def test_a_line_past_max_line_bytes_is_refused_in_bounded_memory(tmp_path):
    """A 60 KiB gzip file holding one 8 MiB line: refused by name once the buffer reaches
    max_line_bytes (1 MiB), the parse's allocations peaking under 4 MiB (unbounded, the
    buffer grew to 16 MiB); memory_bound takes the longer of batch and line. A 3 KiB
    line under a 4 KiB max_line_bytes, batches of 512 bytes, is read as scikit-learn reads
    it; max_line_bytes outside [1, 2 GiB) is refused before dst is made."""
    # the kernels compiled (or loaded) first: numba's own allocations are not the parse's
    line = b"1 " + b" ".join(b"%d:0.5" % j for j in range(1, 400)) + b"\n"
    assert 2048 < len(line) < 4096
    ok = write(tmp_path / "ok.svm", b"-1 3:1\n" + line + b"1 2:2\n")
    store = from_svmlight(ok, tmp_path / "t", batch_bytes=512, max_line_bytes=4096)
    X, y = load_svmlight_file(str(ok))
    assert store.nnz() == X.nnz and store.shape() == X.shape
    src = tmp_path / "bomb.svm.gz"
    src.write_bytes(gzip.compress(b"1 " + b"1:1 " * (2 << 20) + b"\n"))
    assert src.stat().st_size < 64 << 10
    tracemalloc.start()
    try:
        with pytest.raises(SvmlightFormatError, match=r"byte 0 is longer than max_line_bytes "
                                                      r"\(1,048,576 bytes\)"):  # fmt: skip
            from_svmlight(src, tmp_path / "s", batch_bytes=64 << 10, max_line_bytes=1 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak
    assert_not_finalised(tmp_path / "s")
    assert memory_bound(64 << 10, 100, 10, max_line_bytes=1 << 20) == memory_bound(1 << 20, 100, 10)
    with pytest.raises(ValueError, match="max_line_bytes must be in"):
        from_svmlight(ok, tmp_path / "u", max_line_bytes=0)
    assert not (tmp_path / "u").exists()
