"""Hostile files: decompression bombs, oversized manifests, absurd svmlight widths, and
stores whose two layouts disagree.

Every test states its pass criterion (issue 32, "Exposure to hostile files" and "Wrong
answers without an error"). Memory is measured in child processes (peak RSS above the
baseline after imports), so one test's allocations cannot hide another's.
"""

import json
import textwrap

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_svmlight_file

import dl1
from dl1.errors import IncompleteStoreError, StoreCorruptError, SvmlightFormatError
from dl1.io.svmlight import from_svmlight
from dl1.store import open_store
from dl1.store.arrays import read_array
from dl1.store.format import block_digest
from dl1.store.manifest import MAX_MANIFEST_BYTES, MAX_METADATA_BYTES
from tests.reliability.faults import worker_pids
from tests.reliability.untrusted import (
    as_zstd,
    copy_store,
    make_store,
    manifest,
    put_chunk,
    put_manifest,
    results,
    rewrite_array,
    run_child,
    zstd_rle_frame,
)

GiB = 1 << 30


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return make_store(tmp_path_factory.mktemp("hostile") / "s", formats=("csc", "csr"))


@pytest.fixture
def store(pristine, tmp_path):
    return copy_store(pristine, tmp_path / "s")


def test_forged_zstd_frames_are_real_bombs():
    """Pass: the forged frames the bomb tests use are valid zstd (numcodecs decodes a small
    one to zeros), and the size they declare is read from their headers without decoding
    (4 GiB declared by 128 KiB; a frame without a declared size is refused)."""
    import numcodecs

    from dl1.store.frames import zstd_content_size

    small = zstd_rle_frame(1 << 20)
    assert bytes(numcodecs.Zstd().decode(small)) == bytes(1 << 20)
    bomb = zstd_rle_frame(4 * GiB)
    assert len(bomb) < 140_000
    assert zstd_content_size(bomb) == 4 * GiB
    with pytest.raises(ValueError, match="does not declare its decoded size"):
        zstd_content_size(zstd_rle_frame(1 << 20, declare=False))
    with pytest.raises(ValueError, match="truncated"):
        zstd_content_size(bomb[:-2])


def _blosc_bomb(chunk: bytes) -> bytes:
    """A real Blosc chunk whose header declares 2**32 - 1 bytes decoded (the most it can)."""
    raw = bytearray(chunk[:-4])  # without the CRC32C
    raw[4:8] = (2**32 - 1).to_bytes(4, "little")
    return bytes(raw)


def _forge(store, kind: str, key: str = "train/stats/col_nnz") -> None:
    m = manifest(store)
    entry = m["splits"]["train"]["arrays"][key.removeprefix("train/")]
    if kind == "blosc":
        body = _blosc_bomb((store / key / "c" / "0").read_bytes())
    else:
        as_zstd(store, key, entry)
        body = zstd_rle_frame(4 * GiB, declare=(kind == "zstd declared"))
    put_chunk(store, key, entry, 0, body)
    put_manifest(store, m)


INFO_CHILD = textwrap.dedent(
    """
    import json, resource, sys, time
    from dl1.cli import summary
    from dl1.store import open_store

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for path in sys.argv[1:]:
        t = time.perf_counter()
        try:
            summary(open_store(path))
            out = {"error": None}
        except Exception as e:
            out = {"error": type(e).__name__, "text": str(e)}
        out["seconds"] = time.perf_counter() - t
        out["peak_mib"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
        print(json.dumps(out), flush=True)
    """
)
BOMBS = ("blosc", "zstd declared", "zstd undeclared")


def test_decompression_bombs_are_refused_before_decoding(pristine, tmp_path):
    """Pass: `dl1 info` (its summary, which decodes the column counts) on a store whose
    chunk is a bomb with a valid CRC32C and manifest size (Blosc declaring 4 GiB; a 128 KiB
    zstd frame declaring 4 GiB; a zstd frame of unknown size streaming 4 GiB) fails with a
    StoreCorruptError naming the chunk and the declared against expected size (or the
    missing size), in under 2 s and with under 64 MiB of peak memory above the baseline;
    the pristine store is read in the same child. Before: 4.3 GB and 17 s (declared), 8.5
    GB (undeclared)."""
    paths = []
    for kind in BOMBS:
        path = copy_store(pristine, tmp_path / kind.replace(" ", "-"))
        _forge(path, kind)
        paths.append(str(path))
    got = results(run_child(INFO_CHILD, timeout=300, args=(str(pristine), *paths)))
    assert len(got) == 4
    assert got[0]["error"] is None, got[0]
    for kind, r in zip(BOMBS, got[1:], strict=True):
        assert r["error"] == "StoreCorruptError", (kind, r)
        assert "chunk 0 of array 'train/stats/col_nnz'" in r["text"], (kind, r)
        if kind == "zstd undeclared":
            assert "does not declare its decoded size" in r["text"], r
        else:
            assert "declares" in r["text"] and "make 240" in r["text"], (kind, r)
        assert r["seconds"] < 2.0, (kind, r)
    assert max(r["peak_mib"] for r in got) < 64, got


def test_bomb_in_a_block_fails_the_fit_on_the_workers_without_a_restart(store, local_cluster):
    """Pass: a fit on a two-worker cluster whose store holds a Blosc bomb (valid CRC32C and
    size) in a block's values fails with a StoreCorruptError naming the chunk and the
    declared size, and no worker was restarted (same worker processes before and after).
    Before: four worker restarts, then WorkerMemoryError advising 2,541 MiB."""
    key = "train/X/csc/b0.1/data"
    m = manifest(store)
    entry = m["splits"]["train"]["blocks"]["csc"][0][1]["arrays"]["data"]
    put_chunk(store, key, entry, 0, _blosc_bomb((store / key / "c" / "0").read_bytes()))
    put_manifest(store, m)
    before = worker_pids(local_cluster)
    with pytest.raises(
        StoreCorruptError,
        match=r"chunk 0 of array 'train/X/csc/b0\.1/data' "
        r"declares 4,294,967,295 bytes",
    ):
        dl1.fit(str(store), alpha=0.05, client=local_cluster)
    assert worker_pids(local_cluster) == before


def test_sliced_reads_check_sizes_too(store):
    """Pass: reading a slice of an array (as the per-row-block reads of y do) checks each
    chunk's declared size as a whole read does (a Blosc bomb is a StoreCorruptError), and
    the slices of an intact array equal the whole array's, edge chunk included."""
    m = manifest(store)
    entry = m["splits"]["train"]["arrays"]["y"]
    whole = read_array(store, "train/y", entry)
    c = entry["chunk"]
    for lo, hi in ((0, 1), (3, c + 5), (c - 1, whole.shape[0]), (5, 5)):
        np.testing.assert_array_equal(
            read_array(store, "train/y", entry, slice(lo, hi)), whole[lo:hi]
        )
    put_chunk(store, "train/y", entry, 1, _blosc_bomb((store / "train/y/c/1").read_bytes()))
    with pytest.raises(StoreCorruptError, match=r"chunk 1 of array 'train/y' declares"):
        read_array(store, "train/y", entry, slice(c + 1, c + 2))


def test_other_codecs_are_refused_naming_them(store):
    """Pass: an array whose zarr metadata names a codec chain dl1 does not read (gzip,
    whose frames do not bound their decoded size) is refused with a StoreCorruptError
    naming the array and the codecs, before any chunk is decoded."""
    meta = store / "train" / "y" / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["codecs"][1] = {"name": "gzip", "configuration": {"level": 5}}
    meta.write_text(json.dumps(doc))
    with pytest.raises(StoreCorruptError, match=r"array 'train/y' uses the codecs .*GzipCodec"):
        open_store(store).read("y")


def test_oversized_manifest_and_metadata_are_refused_before_parsing(store):
    """Pass: a manifest of valid JSON one byte above the stated limit (64 MiB) is refused
    with a StoreCorruptError stating the limit before it is parsed (under 1 MiB of Python
    allocations, under 0.5 s); a deeply nested one is refused as unreadable, not a
    RecursionError; an array's zarr.json above 64 KiB is refused naming the array. Before:
    a 500 MB manifest was parsed (40 s, 2.7 GB)."""
    import time
    import tracemalloc

    m = manifest(store)
    text = json.dumps(m)
    pad = MAX_MANIFEST_BYTES + 1 - len(text) - len(', "pad": ""')
    (store / "dl1-manifest.json").write_text(text[:-1] + ', "pad": "' + "x" * pad + '"}')
    assert (store / "dl1-manifest.json").stat().st_size == MAX_MANIFEST_BYTES + 1
    tracemalloc.start()
    t = time.perf_counter()
    with pytest.raises(StoreCorruptError, match=r"more than the 67,108,864 a dl1 manifest"):
        dl1.open(store)
    elapsed = time.perf_counter() - t
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert elapsed < 0.5 and peak < 1 << 20, (elapsed, peak)
    (store / "dl1-manifest.json").write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(IncompleteStoreError, match="unreadable"):
        dl1.open(store)
    put_manifest(store, m)
    meta = store / "train" / "y" / "zarr.json"
    meta.write_text(meta.read_text() + " " * MAX_METADATA_BYTES)
    with pytest.raises(StoreCorruptError, match=r"metadata of array 'train/y' has .* bytes"):
        dl1.open(store)


SVMLIGHT_CHILD = textwrap.dedent(
    """
    import json, resource, sys, time
    from dl1.io.svmlight import from_svmlight

    src, dst, warm_src, warm_dst = sys.argv[1:]
    from_svmlight(warm_src, warm_dst)  # kernels loaded before the baseline
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    store = from_svmlight(src, dst, n_features=10**8)  # a width given: kept
    out = {
        "seconds": time.perf_counter() - t,
        "peak_mib": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024,
        "shape": store.shape(),
        "nnz": store.nnz(),
        "col_bounds": store.col_bounds().tolist(),
    }
    print(json.dumps(out), flush=True)
    """
)


@pytest.mark.slow
def test_svmlight_memory_follows_the_data_not_the_largest_index(tmp_path):
    """Pass: ingesting a svmlight file of two lines naming column 10**8 (``n_features``
    given: without it the width is refused, below) takes under 300 MiB
    of peak memory above the baseline (a counting sort, statistics and block index pointers
    sized by the largest index took 5.2 GB for 22 bytes before) and under 60 s, and gives
    the matrix scikit-learn's load_svmlight_file reads: shape (2, 10**8), every value in
    the block that holds its column, column statistics equal around the last column (read
    as slices), y equal, feature blocks of at most 4 Mi columns."""
    src = tmp_path / "wide.svm"
    src.write_bytes(b"1 100000000:2.5\n-1 7:1 100000000:-1\n")
    warm = tmp_path / "warm.svm"
    warm.write_bytes(b"1 1:1 3:2\n")
    X, y = load_svmlight_file(str(src))  # CSR: cheap however wide
    p = X.shape[1]
    assert p == 10**8
    args = (str(src), str(tmp_path / "s"), str(warm), str(tmp_path / "w"))
    (r,) = results(run_child(SVMLIGHT_CHILD, timeout=300, args=args))
    assert r["peak_mib"] < 300, r
    assert r["seconds"] < 60, r
    assert r["shape"] == [2, p] and r["nnz"] == X.nnz
    cb = np.array(r["col_bounds"])
    assert np.diff(cb).max() <= 1 << 22
    store = open_store(tmp_path / "s")
    coo = X.tocoo()
    for col in np.unique(coo.col):
        j = int(np.searchsorted(cb, col, "right")) - 1
        here = (coo.col >= cb[j]) & (coo.col < cb[j + 1])
        ref = sp.csc_matrix(
            (coo.data[here], (coo.row[here], coo.col[here] - cb[j])), shape=(2, cb[j + 1] - cb[j])
        )
        assert (store.read_block(i=0, j=j) != ref).nnz == 0
    arrays = store.entry()["arrays"]
    lo = p - 3
    tail = coo.col >= lo
    ref = {
        "col_nnz": np.bincount(coo.col[tail] - lo, minlength=3),
        "col_sum": np.bincount(coo.col[tail] - lo, weights=coo.data[tail], minlength=3),
        "col_sqsum": np.bincount(coo.col[tail] - lo, weights=coo.data[tail] ** 2, minlength=3),
    }
    for name, want in ref.items():
        key = f"train/stats/{name}"
        got = read_array(store.path, key, arrays[f"stats/{name}"], slice(lo, p))
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(store.read("y"), y)


def test_wide_sparse_batches_write_the_same_store_as_scipy(tmp_path):
    """Pass: a matrix appended in batches holding few nonzeros over a wide column range
    (the comparison-sort path) and in one batch (the counting sort) give stores whose blocks
    equal the scipy matrix's columns exactly, whose column counts equal scipy's and whose
    column sums equal scipy's to 1e-12."""
    from dl1.store import StoreWriter

    rng = np.random.default_rng(5)
    X = sp.random(300, 20_000, density=2e-3, random_state=6, format="csr")
    X.data = rng.standard_normal(X.nnz)
    y = rng.standard_normal(300)
    # 30 batches: few nonzeros over the range (comparison sort); one: counting sort
    assert 4 * (X.nnz // 30 + 100) + 4096 < X.shape[1] <= 4 * X.nnz + 4096
    for name, batches in (("wide", 30), ("one", 1)):
        path = tmp_path / name
        with StoreWriter(path, chunk_elems=5_000) as w:
            sw = w.split(n_features=X.shape[1], block_nnz=4_000)
            for rows in np.array_split(np.arange(300), batches):
                sw.append(X[rows], y[rows])
            sw.close()
        s = open_store(path)
        rb, cb = s.row_bounds(), s.col_bounds()
        assert len(cb) > 2
        for i in range(len(rb) - 1):
            for j in range(len(cb) - 1):
                ref = X[rb[i] : rb[i + 1], cb[j] : cb[j + 1]].tocsc()
                got = s.read_block(i=i, j=j)
                np.testing.assert_array_equal(got.indptr, ref.indptr)
                np.testing.assert_array_equal(got.indices, ref.indices)
                np.testing.assert_array_equal(got.data, ref.data)
        Xc = X.tocsc()
        np.testing.assert_array_equal(s.read("stats/col_nnz"), np.diff(Xc.indptr))
        sums = np.asarray(Xc.sum(axis=0)).ravel()
        sqsums = np.asarray(Xc.power(2).sum(axis=0)).ravel()
        np.testing.assert_allclose(s.read("stats/col_sum"), sums, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(s.read("stats/col_sqsum"), sqsums, rtol=1e-12, atol=1e-14)


def test_layouts_that_disagree_are_refused(store, tmp_path):
    """Pass: in a store written in both layouts, (a) CSR values x3 with their checksums
    recomputed make the sample-wise fit (sdca) fail with a StoreCorruptError naming the
    block and the layouts' disagreement, while the CSC fit is unaffected; (b) the same with
    the CSR's content digest updated too is refused by dl1.open naming the field
    ``blocks.csr[0][0].content``; (c) a two-layout store without the digests is refused
    naming the missing field. Before: `ws` answered for the CSC data and `sdca` reported
    "converged" for coefficients off by 2.66."""
    m = manifest(store)
    blk = m["splits"]["train"]["blocks"]["csr"][0][0]
    key = "train/X/csr/b0.0/data"
    blk["arrays"]["data"] = rewrite_array(
        store, key, read_array(store, key, blk["arrays"]["data"]) * 3
    )
    put_manifest(store, m)
    dl1.fit(str(store), alpha=0.05, solver="ws")
    with pytest.raises(StoreCorruptError, match=r"block 'train/X/csr/b0\.0' .*layouts disagree"):
        dl1.fit(str(store), alpha=0.05, solver="sdca")
    s = open_store(store)
    ip, ix, dx = s.read_block_arrays(i=0, j=0, fmt="csc")
    blk["content"] = block_digest(ip, ix, dx * 3, s.block_shape("train", 0, 0), "csc")
    put_manifest(store, m)
    with pytest.raises(StoreCorruptError, match=r"blocks\.csr\[0\]\[0\]\.content differs"):
        dl1.open(store)
    for row in m["splits"]["train"]["blocks"]["csr"] + m["splits"]["train"]["blocks"]["csc"]:
        for b in row:
            b.pop("content")
    put_manifest(store, m)
    with pytest.raises(StoreCorruptError, match=r"blocks\.csc\[0\]\[0\]\.content is missing"):
        dl1.open(store)


@pytest.mark.parametrize("solver", ["ws", "sdca", "sgd", "fobos", "rda", "smidas"])
def test_a_row_layout_forged_with_both_digests_is_refused_by_every_solver(store, solver):
    """Pass: CSR values x3 with their checksums recomputed and the block's content digest
    rewritten in both layouts' entries (so dl1.open finds them equal) is refused by every
    solver: the working-set solver by the CSC block's digest, the sample-wise ones, which
    read only the CSR layout, by the tie of its column sums of squares to the store's
    statistics. Before: ``sdca``, ``sgd``, ``fobos`` and ``rda`` fitted 3X silently."""
    m = manifest(store)
    blocks = m["splits"]["train"]["blocks"]
    key = "train/X/csr/b0.0/data"
    blk = blocks["csr"][0][0]
    blk["arrays"]["data"] = rewrite_array(
        store, key, read_array(store, key, blk["arrays"]["data"]) * 3
    )
    s = open_store(store)
    ip, ix, dx = s.read_block_arrays(i=0, j=0, fmt="csc")
    forged = block_digest(ip, ix, dx * 3, s.block_shape("train", 0, 0), "csc")
    blk["content"] = blocks["csc"][0][0]["content"] = forged
    put_manifest(store, m)
    dl1.open(store)  # the manifest is consistent: both layouts record the same digest
    with pytest.raises(StoreCorruptError, match="layouts disagree|digest"):
        dl1.fit(str(store), alpha=0.05, solver=solver, max_epochs=2, client=None)


def test_layout_digest_is_shared_by_csc_and_csr_and_tells_matrices_apart(tmp_path):
    """Pass: the digest of a block computed from its CSC and from its CSR arrays is the
    same, for float64 and float32; a change of one value by one ulp, a moved entry or a
    swapped row gives another; stores written by the writer and by add_csr record equal
    digests for both layouts of every block."""
    from dl1.store.csr import add_csr

    for dtype in (np.float64, np.float32):
        A = sp.random(40, 25, density=0.2, random_state=8, format="csc", dtype=dtype)
        R = A.tocsr()
        R.sort_indices()
        d = block_digest(A.indptr, A.indices, A.data, A.shape, "csc")
        assert d == block_digest(R.indptr.astype(np.int64), R.indices, R.data, A.shape, "csr")
        B = A.copy()
        B.data[3] = np.nextafter(B.data[3], np.inf)
        assert block_digest(B.indptr, B.indices, B.data, A.shape, "csc") != d
        C = A.tolil()
        C[[0, 1]] = C[[1, 0]]
        C = C.tocsc()
        if (C != A).nnz:
            assert block_digest(C.indptr, C.indices, C.data, A.shape, "csc") != d
        T = sp.csc_matrix(A.T.toarray().T[:, ::-1])
        assert block_digest(T.indptr, T.indices, T.data, A.shape, "csc") != d
    plain = make_store(tmp_path / "plain", formats=("csc",))
    both = make_store(tmp_path / "both", formats=("csc", "csr"))
    for path in (add_csr(plain).path, both):
        e = manifest(path)["splits"]["train"]["blocks"]
        for rc, rr in zip(e["csc"], e["csr"], strict=True):
            for bc, br in zip(rc, rr, strict=True):
                assert bc["content"] == br["content"]
    kw = dict(alpha=0.05, l1_ratio=0.5, solver="sdca")
    a, b = dl1.fit(str(plain), **kw), dl1.fit(str(both), **kw)
    np.testing.assert_array_equal(a.coef_, b.coef_)


@pytest.mark.parametrize(
    ("text", "where"),
    [(b"1 100000000:2.5\n-1 7:1 100000000:-1\n", "lines 1-2"),
     (b"1 2147483646:1\n", "line 1")],
)
def test_a_width_the_nonzeros_do_not_justify_is_refused_at_ingest(tmp_path, text, where):
    """A 16- to 36-byte file naming column 10**8 or 2**31 - 2. Before: it ingested, then
    ``dl1 convert`` peaked at 2.57 GB, ``dl1 info`` at 2.47 GB and a fit at 2.0 GB (10**8),
    and ``dl1 info`` needed 16 GiB (2**31 - 2): a store and its fits keep arrays of one
    entry per column. Pass: SvmlightFormatError naming the file, the lines, the width,
    the stated limit and ``n_features``, and no store is left at the destination."""
    src = tmp_path / "wide.svm"
    src.write_bytes(text)
    with pytest.raises(SvmlightFormatError) as err:
        from_svmlight(src, tmp_path / "s")
    msg = str(err.value)
    for part in ("wide.svm", where, "columns wide for", "max(16,777,216, 16 x nonzeros)",
                 "n_features"):  # fmt: skip
        assert part in msg, msg
    assert not (tmp_path / "s" / "dl1-manifest.json").exists()
