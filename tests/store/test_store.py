"""Round trips, statistics, validation and integrity of the dl1 store."""

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
import sparse

import dl1
from dl1.errors import IncompleteStoreError, StoreCorruptError, ValidationError
from dl1.store import StoreWriter, open_store
from dl1.store.format import MANIFEST
from tests.helpers import random_csr


def assert_same(A, B):
    A, B = sp.csr_matrix(A), sp.csr_matrix(B)
    assert A.shape == B.shape
    assert A.dtype == B.dtype
    assert (A != B).nnz == 0


GRIDS = [
    dict(),
    dict(n_feature_blocks=2),
    dict(n_feature_blocks=7, row_block_rows=45),
    dict(col_bounds=[0, 1, 50, 51, 97]),
    dict(block_nnz=64, formats=("csc", "csr")),
]


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_scipy_store_dask_roundtrip_is_exact(tmp_path, grid, dtype):
    X = random_csr(130, 97, 0.07, seed=3, dtype=dtype, empty_rows=(0, 64), empty_cols=(5, 96))
    y = np.random.default_rng(0).standard_normal(130)
    store = dl1.from_scipy(X, y, tmp_path / "s", **grid)
    for fmt in store.entry()["formats"]:
        Xd, yd = dl1.open(tmp_path / "s", fmt=fmt)
        assert Xd.chunks == (
            tuple(np.diff(store.row_bounds())),
            tuple(np.diff(store.col_bounds())),
        )
        assert_same(Xd.compute(), X)
        np.testing.assert_array_equal(yd.compute(), y)
    if "col_bounds" in grid:
        assert store.col_bounds().tolist() == grid["col_bounds"]
    if "n_feature_blocks" in grid:
        assert len(store.col_bounds()) - 1 == grid["n_feature_blocks"]
    assert store.nnz() == X.nnz
    assert store.block_nnz().sum() == X.nnz
    # per-column statistics
    np.testing.assert_array_equal(store.read("stats/col_nnz"), X.getnnz(axis=0))
    Xd64 = X.astype(np.float64)
    np.testing.assert_allclose(store.read("stats/col_sum"), Xd64.sum(0).A1, rtol=1e-12)
    np.testing.assert_allclose(
        store.read("stats/col_sqsum"), Xd64.multiply(Xd64).sum(0).A1, rtol=1e-12
    )
    np.testing.assert_array_equal(store.read("stats/row_nnz"), X.getnnz(axis=1))


def test_row_blocks_added_when_a_column_exceeds_block_nnz(tmp_path):
    X = random_csr(200, 30, 0.05, seed=1)
    X = sp.lil_matrix(X)
    X[:, 7] = 1.0  # one dense column of 200 nonzeros
    X = sp.csr_matrix(X)
    store = dl1.from_scipy(X, np.zeros(200), tmp_path / "s", block_nnz=50)
    assert len(store.row_bounds()) - 1 >= 4
    assert store.block_nnz().max() <= 50 + 50
    assert_same(dl1.open(tmp_path / "s")[0].compute(), X)


@pytest.mark.parametrize("chunk_type", ["sparse", "dense"])
@pytest.mark.slow
def test_other_chunk_types(tmp_path, chunk_type):
    X = random_csr(60, 40, 0.1, seed=2)
    dl1.from_scipy(X, np.ones(60), tmp_path / "s", n_feature_blocks=3)
    Xd, _ = dl1.open(tmp_path / "s", chunk_type=chunk_type)
    out = Xd.compute()
    dense = out.todense() if chunk_type == "sparse" else out
    if chunk_type == "sparse":
        assert isinstance(out, sparse.SparseArray)
    np.testing.assert_array_equal(np.asarray(dense), X.toarray())


def test_sample_weight_and_test_split(tmp_path):
    X = random_csr(50, 20, 0.2, seed=4)
    Xt = random_csr(11, 20, 0.2, seed=5)
    w = np.linspace(0.5, 2, 50)
    store = dl1.from_scipy(
        X, np.arange(50.0), tmp_path / "s", sample_weight=w, X_test=Xt, y_test=np.arange(11.0)
    )
    np.testing.assert_array_equal(store.read("sample_weight"), w)
    np.testing.assert_array_equal(store.vector_dask("sample_weight").compute(), w)
    Xtd, ytd = dl1.open(tmp_path / "s", split="test")
    assert_same(Xtd.compute(), Xt)
    np.testing.assert_array_equal(ytd.compute(), np.arange(11.0))


def test_from_scipy_does_not_modify_input(tmp_path):
    X = sp.csr_matrix(
        (np.array([1.0, 2.0, 3.0]), np.array([2, 0, 1]), np.array([0, 2, 3])), shape=(2, 3)
    )
    before = (X.data.copy(), X.indices.copy(), X.indptr.copy())
    dl1.from_scipy(X, np.zeros(2), tmp_path / "s")
    for a, b in zip(before, (X.data, X.indices, X.indptr), strict=True):
        np.testing.assert_array_equal(a, b)
    assert_same(dl1.open(tmp_path / "s")[0].compute(), X)


@pytest.mark.parametrize("kind", ["scipy", "sparse", "dense"])
def test_from_dask_on_a_process_cluster(tmp_path, local_cluster, kind):
    X = random_csr(90, 64, 0.1, seed=6, empty_cols=(3,))
    y = np.random.default_rng(1).standard_normal(90)
    if kind == "scipy":
        src = dl1.from_scipy(X, y, tmp_path / "src", n_feature_blocks=3, row_block_rows=40)
        Xd = src.to_dask()
    elif kind == "sparse":
        Xd = da.from_array(sparse.COO.from_scipy_sparse(X), chunks=(50, 30), asarray=False)
    else:
        Xd = da.from_array(X.toarray(), chunks=(50, 30))
    store = dl1.from_dask(
        Xd,
        da.from_array(y, chunks=50),
        tmp_path / "dst",
        client=local_cluster,
        formats=("csc", "csr"),
    )
    for fmt in ("csc", "csr"):
        Xr, yr = dl1.open(tmp_path / "dst", fmt=fmt)
        assert_same(local_cluster.compute(Xr).result(), X)
        np.testing.assert_array_equal(local_cluster.compute(yr).result(), y)
    np.testing.assert_array_equal(store.read("stats/col_nnz"), X.getnnz(axis=0))
    np.testing.assert_allclose(store.read("stats/col_sqsum"), X.multiply(X).sum(0).A1)


def test_dense_zarr_array_in(tmp_path):
    import zarr

    X = random_csr(40, 25, 0.2, seed=7).toarray()
    z = zarr.create_array(tmp_path / "dense.zarr", shape=X.shape, chunks=(16, 10), dtype="f8")
    z[:] = X
    store = dl1.from_dask(da.from_zarr(z), np.ones(40), tmp_path / "s")
    np.testing.assert_array_equal(store.to_dask(chunk_type="dense").compute(), X)


# ---------------------------------------------------------------- validation


def test_nan_in_X_names_the_row(tmp_path):
    X = random_csr(30, 10, 0.3, seed=8)
    X.data[X.indptr[17]] = np.nan
    with pytest.raises(ValidationError, match="row 17.*NaN or infinite"):
        dl1.from_scipy(X, np.zeros(30), tmp_path / "s")
    with pytest.raises(IncompleteStoreError):
        open_store(tmp_path / "s")


def test_inf_in_y_and_length_mismatch(tmp_path):
    X = random_csr(30, 10, 0.3, seed=8)
    y = np.zeros(30)
    y[21] = np.inf
    with pytest.raises(ValidationError, match="row 21: y is inf"):
        dl1.from_scipy(X, y, tmp_path / "a")
    with pytest.raises(ValidationError, match="y has 29 values for 30 rows"):
        dl1.from_scipy(X, np.zeros(29), tmp_path / "b")
    with pytest.raises(ValidationError, match="y has 29 values for 30 rows"):
        dl1.from_dask(da.from_array(X.toarray(), chunks=10), np.zeros(29), tmp_path / "c")


@pytest.mark.parametrize(
    "indices, message",
    [
        ([0, -3], "row 1, column index -3: negative index"),
        ([4, 2], "row 1, column index 2: indices are not sorted"),
        ([2, 2], "row 1, column index 2: duplicate index"),
    ],
)
def test_bad_indices_name_the_row(tmp_path, indices, message):
    data = np.ones(3)
    with pytest.raises(ValidationError, match=message), StoreWriter(tmp_path / "s") as w:
        sw = w.split(n_features=10)
        sw.append((data, np.array([1] + indices), np.array([0, 1, 3])), np.zeros(2))
    assert not (tmp_path / "s" / MANIFEST).exists()


def test_out_of_range_index_names_the_row(tmp_path):
    with pytest.raises(ValidationError, match="row 3: column index 12 is out of range"):
        with StoreWriter(tmp_path / "s") as w:
            sw = w.split(n_features=12)
            X = sp.csr_matrix((np.ones(4), np.array([0, 1, 2, 12]), np.arange(5)), shape=(4, 13))
            sw.append((X.data, X.indices, X.indptr), np.zeros(4))
            sw.close()


@pytest.mark.parametrize("dtype", [np.int64, np.complex128, np.bool_])
def test_unsupported_dtypes(tmp_path, dtype):
    X = sp.csr_matrix(np.eye(3, dtype=dtype))
    with pytest.raises(ValidationError, match="unsupported"):
        dl1.from_scipy(X, np.zeros(3), tmp_path / "s")
    with pytest.raises(ValidationError, match="unsupported dtype"):
        dl1.from_dask(da.from_array(np.eye(3, dtype=dtype)), np.zeros(3), tmp_path / "t")


def test_from_dask_nan_names_block_row_and_column(tmp_path):
    X = np.zeros((20, 12))
    X[13, 9] = np.nan
    with pytest.raises(ValidationError, match=r"block \(1, 2\), row 13, column 9: value is NaN"):
        dl1.from_dask(da.from_array(X, chunks=(10, 4)), np.zeros(20), tmp_path / "s")


def test_bad_block_grid_arguments(tmp_path):
    X = random_csr(10, 10, 0.3, seed=9)
    with pytest.raises(ValueError, match="col_bounds must increase strictly"):
        dl1.from_scipy(X, np.zeros(10), tmp_path / "a", col_bounds=[0, 5, 5, 10])
    with pytest.raises(ValueError, match="formats"):
        dl1.from_scipy(X, np.zeros(10), tmp_path / "b", formats=("coo",))


# ---------------------------------------------------------------- fresh path and overwrite


def test_write_refuses_existing_paths(tmp_path):
    X = random_csr(10, 10, 0.3, seed=9)
    dl1.from_scipy(X, np.zeros(10), tmp_path / "s")
    with pytest.raises(FileExistsError, match="fresh path"):
        dl1.from_scipy(X, np.ones(10), tmp_path / "s")
    np.testing.assert_array_equal(open_store(tmp_path / "s").read("y"), np.zeros(10))
    dl1.from_scipy(X, np.ones(10), tmp_path / "s", overwrite=True)
    np.testing.assert_array_equal(open_store(tmp_path / "s").read("y"), np.ones(10))
    precious = tmp_path / "mine"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a dl1 store"):
        dl1.from_scipy(X, np.zeros(10), precious, overwrite=True)
    assert (precious / "notes.txt").read_text() == "keep me"


# ---------------------------------------------------------------- integrity


@pytest.fixture
def small_store(tmp_path):
    X = random_csr(300, 80, 0.2, seed=10)
    y = np.arange(300.0)
    path = tmp_path / "s"
    # small chunks so that blocks have several chunks
    with StoreWriter(path, chunk_elems=256) as w:
        sw = w.split(n_feature_blocks=3)
        sw.append(X, y)
        sw.close()
    return path, X


def _chunk(path, key, k):
    return Path(path) / key / "c" / str(k)


def test_deleted_chunk_is_named_on_open(small_store):
    path, _ = small_store
    _chunk(path, "train/X/csc/b0.1/indices", 2).unlink()
    with pytest.raises(
        StoreCorruptError, match=r"chunk 2 of array 'train/X/csc/b0.1/indices' is missing"
    ):
        open_store(path)


def test_truncated_chunk_is_named_on_open(small_store):
    path, _ = small_store
    f = _chunk(path, "train/X/csc/b0.2/data", 1)
    f.write_bytes(f.read_bytes()[:-7])
    with pytest.raises(StoreCorruptError, match=r"chunk 1 of array 'train/X/csc/b0.2/data' has"):
        dl1.open(path)


def test_bit_flip_is_named_when_read(small_store, tmp_path):
    path, _ = small_store
    f = _chunk(path, "train/X/csc/b0.0/data", 3)
    raw = bytearray(f.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    f.write_bytes(bytes(raw))
    X, _ = dl1.open(path)  # same sizes: opening is cheap and cannot see it
    with pytest.raises(
        StoreCorruptError, match=r"chunk 3 of array 'train/X/csc/b0.0/data' is corrupt"
    ):
        X.compute()
    # the other blocks are intact
    X.blocks[0, 1].compute()


def test_bit_flip_in_y_is_detected(small_store):
    path, _ = small_store
    f = _chunk(path, "train/y", 0)
    raw = bytearray(f.read_bytes())
    raw[5] ^= 0x01
    f.write_bytes(bytes(raw))
    _, y = dl1.open(path)
    with pytest.raises(StoreCorruptError, match="chunk 0 of array 'train/y'"):
        y.compute()


def test_chunk_swapped_from_another_store_fails_the_manifest_checksum(tmp_path):
    X = random_csr(300, 80, 0.2, seed=10)
    paths = []
    for value in (3.0, 5.0):
        paths.append(tmp_path / f"s{value:g}")
        with StoreWriter(paths[-1], chunk_elems=256) as w:
            sw = w.split()
            sw.append(X, np.full(300, value))
            sw.close()
    a, b = _chunk(paths[0], "train/y", 0), _chunk(paths[1], "train/y", 0)
    assert a.stat().st_size == b.stat().st_size  # constant runs compress to equal sizes
    a.write_bytes(b.read_bytes())  # a valid chunk with a valid CRC, from the wrong store
    store = open_store(paths[0])
    with pytest.raises(StoreCorruptError, match="'train/y' does not match its manifest checksum"):
        store.read("y")


def test_missing_or_truncated_manifest_is_refused(small_store):
    path, _ = small_store
    mf = path / MANIFEST
    text = mf.read_text()
    mf.write_text(text[: len(text) // 2])
    with pytest.raises(IncompleteStoreError, match="unreadable or truncated"):
        dl1.open(path)
    mf.unlink()
    with pytest.raises(IncompleteStoreError, match="not completely written"):
        dl1.open(path)


def test_newer_format_version_is_refused(small_store):
    path, _ = small_store
    m = json.loads((path / MANIFEST).read_text())
    m["format_version"] = 99
    (path / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(dl1.store.reader.StoreError, match="format version 99"):
        open_store(path)


def test_exception_inside_writer_leaves_no_manifest_and_no_spill(tmp_path):
    with pytest.raises(RuntimeError, match="boom"), StoreWriter(tmp_path / "s") as w:
        sw = w.split(n_features=5)
        sw.append(sp.csr_matrix(np.eye(5)), np.zeros(5))
        raise RuntimeError("boom")
    assert not (tmp_path / "s" / MANIFEST).exists()
    assert not [p for p in (tmp_path / "s").iterdir() if p.name.startswith(".dl1-spill")]
    with pytest.raises(IncompleteStoreError):
        open_store(tmp_path / "s")


def test_process_killed_mid_write_leaves_a_refused_store(tmp_path):
    path = tmp_path / "s"
    code = textwrap.dedent(
        f"""
        import sys, numpy as np, scipy.sparse as sp
        from dl1.store import StoreWriter
        w = StoreWriter({str(path)!r})
        sw = w.split(n_features=50)
        for b in range(10**6):
            sw.append(sp.random(100, 50, density=0.1, format="csr", random_state=b), np.zeros(100))
            if b == 3:
                print("writing", flush=True)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(dl1.__file__).parents[1])},
    )
    assert proc.stdout.readline().strip() == "writing"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    assert path.exists()
    with pytest.raises(IncompleteStoreError, match="not completely written"):
        dl1.open(path)


def test_block_metadata_mismatch_is_named(small_store):
    """A block's manifest entry that disagrees with its arrays or the block grid is refused
    on open (before any block is read), naming the manifest field."""
    path, _ = small_store
    m = json.loads((path / MANIFEST).read_text())
    m["splits"]["train"]["blocks"]["csc"][0][1]["nnz"] += 1
    (path / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(StoreCorruptError, match=r"blocks\.csc\[0\]\[1\]\.arrays\.indices"):
        dl1.open(path)
    m["splits"]["train"]["blocks"]["csc"][0][1]["nnz"] -= 1
    m["splits"]["train"]["col_bounds"][1] += 1  # grid no longer matches the stored blocks
    (path / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(StoreCorruptError, match=r"blocks\.csc\[0\]\[0\]\.arrays\.indptr"):
        dl1.open(path)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int32, np.int64])
def test_direct_chunk_reads_equal_zarr_reads(tmp_path, dtype):
    """Whole-array reads decode chunk files directly; they must equal zarr's own reads,
    for dl1's codecs and zstd (stores of earlier versions), edge chunk included."""
    import zarr
    from zarr.codecs import Crc32cCodec, ZstdCodec

    from dl1.store.arrays import direct_decoder, read_array
    from dl1.store.format import write_array

    rng = np.random.default_rng(3)
    a = (rng.standard_normal(3_500) * 100).astype(dtype)
    entry = write_array(tmp_path, "blosc", a, chunk_elems=1_000)
    assert direct_decoder(zarr.open_array(tmp_path / "blosc", mode="r")) is not None
    got = read_array(tmp_path, "blosc", entry)
    assert got.dtype == a.dtype
    np.testing.assert_array_equal(got, a)
    np.testing.assert_array_equal(got, zarr.open_array(tmp_path / "blosc", mode="r")[:])
    # zstd, as written by earlier versions
    z = zarr.create_array(
        store=os.fspath(tmp_path),
        name="zstd",
        shape=a.shape,
        chunks=(1_000,),
        dtype=a.dtype,
        compressors=[ZstdCodec(level=3, checksum=False), Crc32cCodec()],
        fill_value=0,
    )
    z[:] = a
    entry_z = dict(
        entry, chunk_bytes=[(tmp_path / "zstd" / "c" / str(k)).stat().st_size for k in range(4)]
    )
    np.testing.assert_array_equal(read_array(tmp_path, "zstd", entry_z), a)
    # another codec chain is read through zarr
    o = zarr.create_array(
        store=os.fspath(tmp_path),
        name="other",
        shape=a.shape,
        chunks=(1_000,),
        dtype=a.dtype,
        compressors=[ZstdCodec(level=1)],
        fill_value=0,
    )
    o[:] = a
    assert direct_decoder(zarr.open_array(tmp_path / "other", mode="r")) is None
    entry_o = dict(
        entry, chunk_bytes=[(tmp_path / "other" / "c" / str(k)).stat().st_size for k in range(4)]
    )
    np.testing.assert_array_equal(read_array(tmp_path, "other", entry_o), a)
    # a flipped bit in the edge chunk is named
    f = tmp_path / "blosc" / "c" / "3"
    raw = bytearray(f.read_bytes())
    raw[len(raw) // 2] ^= 0x04
    f.write_bytes(bytes(raw))
    with pytest.raises(StoreCorruptError, match=r"chunk 3 of array 'blosc' is corrupt"):
        read_array(tmp_path, "blosc", entry)
