"""Stores read where they are kept: an S3 server (moto, on 127.0.0.1), ``memory://``,
``file://`` and zarr store objects give what the same store gives on a local disk, with
the same integrity checks, and the workers, not the client, read the blocks."""

from __future__ import annotations

import pickle
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import s3fs
import scipy.sparse as sp
import zarr

import dl1
from dl1.errors import IncompleteStoreError, StoreCorruptError, ValidationError
from dl1.predict import decision_function
from dl1.store import StoreWriter, open_store
from dl1.store.location import Location, as_location
from tests.helpers import random_csr

REPO = Path(__file__).resolve().parents[2]
SECRET = "dl1-not-a-real-secret-7f3a"
BLOCK = "train/X/csc/b0.1/data"


def _write(path: Path, X: sp.csr_matrix, y: np.ndarray, chunk_elems: int = 64, **split) -> Path:
    with StoreWriter(path, chunk_elems=chunk_elems) as wr:
        sw = wr.split(**split)
        sw.append(X, y)
        sw.close()
    return path


@pytest.fixture(scope="module")
def local_store(tmp_path_factory) -> tuple[Path, sp.csr_matrix]:
    """A store of 2 row blocks x 3 feature blocks in both layouts, arrays in several chunks."""
    X = random_csr(240, 45, 0.15, seed=33)
    w = np.zeros(45)
    w[:6] = [3.0, -2.0, 1.5, 4.0, -1.0, 2.5]
    y = X @ w + np.random.default_rng(1).normal(scale=0.1, size=240)
    path = tmp_path_factory.mktemp("objectstore") / "s.zarr"
    _write(path, X, y, n_feature_blocks=3, row_block_rows=120, formats=("csc", "csr"))
    return path, X


@pytest.fixture(scope="module")
def s3_store(s3_endpoint, local_store) -> Iterator[str]:
    """``local_store`` uploaded once for the module's tests that only read it."""
    fs = _fs()
    bucket = f"dl1-read-{uuid.uuid4().hex[:12]}"
    fs.mkdir(bucket)
    try:
        fs.put(str(local_store[0]), f"s3://{bucket}/s.zarr", recursive=True)
        yield f"s3://{bucket}/s.zarr"
    finally:
        fs.rm(bucket, recursive=True)


@pytest.fixture(scope="module")
def small_local(tmp_path_factory) -> Path:
    """A store of one row block x 2 feature blocks, CSC only, the arrays of ``BLOCK`` in two
    chunks (few objects to upload)."""
    X = random_csr(100, 20, 0.3, seed=34)
    path = tmp_path_factory.mktemp("objectstore-small") / "s.zarr"
    return _write(path, X, np.arange(100.0), chunk_elems=160, n_feature_blocks=2)


@pytest.fixture
def mutable_store(s3_bucket, small_local) -> str:
    """``small_local`` uploaded to a fresh bucket, for a test that damages it."""
    url = f"{s3_bucket}/s.zarr"
    _fs().put(str(small_local), url, recursive=True)
    return url


def _fs() -> s3fs.S3FileSystem:
    return s3fs.S3FileSystem(skip_instance_cache=True)


def _blocks(store) -> list[sp.spmatrix]:
    rb, cb = store.row_bounds(), store.col_bounds()
    return [
        store.read_block("train", i, j, fmt)
        for fmt in store.entry()["formats"]
        for i in range(len(rb) - 1)
        for j in range(len(cb) - 1)
    ]


def _assert_same_store(got, ref) -> None:
    assert got.manifest == ref.manifest
    assert got.shape() == ref.shape() and got.nnz() == ref.nnz()
    for a, b in zip(_blocks(got), _blocks(ref), strict=True):
        assert a.format == b.format and (a != b).nnz == 0
    for name in ("y", "stats/col_sqsum", "stats/row_nnz"):
        np.testing.assert_array_equal(got.read(name), ref.read(name))
    Xg, Xr = got.to_dask().compute(), ref.to_dask().compute()
    assert (Xg != Xr).nnz == 0


# ------------------------------------------------------------------ the same store


@pytest.mark.slow
def test_a_store_on_s3_reads_as_on_disk(s3_store, local_store):
    store = open_store(s3_store)
    assert store.path == s3_store and str(store.location) == s3_store
    assert not store.location.is_local and store.root == store.location
    _assert_same_store(store, open_store(local_store[0]))
    again = pickle.loads(pickle.dumps(store))
    assert again.location == store.location and len(pickle.dumps(store)) < 20_000


def test_memory_and_file_urls_and_zarr_store_objects(s3_store, local_store, tmp_path):
    path, _ = local_store
    ref = open_store(path)
    fs = as_location("memory://dl1-read-test").fs
    fs.put(str(path), "/dl1-read-test/s.zarr", recursive=True)
    try:
        _assert_same_store(open_store("memory://dl1-read-test/s.zarr"), ref)
    finally:
        fs.rm("/dl1-read-test", recursive=True)
    # file:// is the local path: same Path, same graph names, so the same dask results
    st = open_store(path.as_uri())
    assert st.path == path and st.root == str(path)
    assert st.to_dask().name == ref.to_dask().name
    _assert_same_store(open_store(zarr.storage.LocalStore(path)), ref)
    _assert_same_store(open_store(zarr.storage.FsspecStore.from_url(s3_store)), ref)
    with pytest.raises(ValidationError, match="MemoryStore cannot hold a dl1 store"):
        open_store(zarr.storage.MemoryStore())
    with pytest.raises(ValidationError, match="storage_options apply to URLs"):
        open_store(path, storage_options={"anon": True})


def test_estimators_take_a_zarr_store_object_and_a_url(s3_store, local_store):
    """A scikit-learn estimator fitted on a zarr store object or a URL (no cluster: in this
    process) equals the fit on the store's path."""
    from dl1.estimators import Lasso

    path, _ = local_store
    ref = Lasso(alpha=0.05, tol=1e-10).fit(path)
    est = Lasso(alpha=0.05, tol=1e-10).fit(zarr.storage.FsspecStore.from_url(s3_store))
    np.testing.assert_array_equal(est.coef_, ref.coef_)
    assert est.intercept_ == ref.intercept_
    np.testing.assert_array_equal(Lasso(alpha=0.05, tol=1e-10).fit(s3_store).coef_, ref.coef_)


def _record_remote_reads(dask_worker=None) -> None:
    """Record, in this process, the keys read from remote stores (for the test)."""
    import dl1.store.location as location

    real = location.Location.read
    log: list[str] = []

    def counted(self, rel, max_bytes):
        if not self.is_local:
            log.append(rel)
        return real(self, rel, max_bytes)

    location.Location.read, location.recorded_reads, location.real_read = counted, log, real


def _recorded_reads(dask_worker=None) -> list[str]:
    """The keys recorded since :func:`_record_remote_reads`, which is undone."""
    import dl1.store.location as location

    location.Location.read = location.real_read
    log = location.recorded_reads
    del location.recorded_reads, location.real_read
    return log


@pytest.mark.slow
def test_a_fit_and_a_path_from_s3_equal_the_local_ones_bit_for_bit(
    s3_store, local_store, s3_cluster
):
    path, _ = local_store
    kw = dict(client=s3_cluster, tol=1e-10)
    ref_fit = dl1.fit(path, alpha=0.05, **kw)
    ref_streamed = dl1.fit(path, alpha=0.02, stream=True, **kw)
    ref_path = dl1.path(path, n_alphas=4, eps=0.05, **kw)
    ref_pred = s3_cluster.compute(
        decision_function(path, ref_fit.coef_, ref_fit.intercept_, split="train")
    ).result()
    _record_remote_reads()
    s3_cluster.run(_record_remote_reads)
    try:
        fit = dl1.fit(s3_store, alpha=0.05, **kw)
        streamed = dl1.fit(s3_store, alpha=0.02, stream=True, **kw)
        got_path = dl1.path(s3_store, n_alphas=4, eps=0.05, **kw)
        pred = s3_cluster.compute(
            decision_function(s3_store, fit.coef_, fit.intercept_, split="train")
        )
        pred = pred.result()
    finally:
        on_workers = s3_cluster.run(_recorded_reads)
        on_client = _recorded_reads()
    np.testing.assert_array_equal(fit.coef_, ref_fit.coef_)
    assert fit.intercept_ == ref_fit.intercept_ and fit.gap_ == ref_fit.gap_
    assert streamed.streamed_ and streamed.converged_
    np.testing.assert_array_equal(streamed.coef_, ref_streamed.coef_)
    np.testing.assert_array_equal(pred, ref_pred)
    np.testing.assert_allclose(pred, local_store[1] @ fit.coef_ + fit.intercept_, rtol=1e-12)
    assert (got_path.coefs_ != ref_path.coefs_).nnz == 0
    np.testing.assert_array_equal(got_path.intercepts_, ref_path.intercepts_)
    np.testing.assert_array_equal(got_path.gaps_, ref_path.gaps_)
    # every worker read chunks of X from the bucket; the client read the manifest and the
    # split's vectors (y, column statistics) but not one chunk of X
    assert len(on_workers) == 2
    assert all(any("/X/csc/" in r for r in reads) for reads in on_workers.values())
    assert on_client and not [r for r in on_client if "/X/" in r]


# ------------------------------------------------------------------ integrity


def _chunk(url: str, key: str, k: int) -> str:
    return f"{url}/{key}/c/{k}"


def test_a_corrupt_chunk_on_s3_is_named(mutable_store):
    fs = _fs()
    obj = _chunk(mutable_store, BLOCK, 0)
    raw = bytearray(fs.cat(obj))
    raw[len(raw) // 2] ^= 0xFF  # same size: only the checksum sees it
    fs.pipe(obj, bytes(raw))
    store = open_store(mutable_store)
    with pytest.raises(StoreCorruptError, match=rf"chunk 0 of array '{BLOCK}' is corrupt"):
        store.read_block("train", 0, 1, "csc")


def test_a_truncated_or_missing_chunk_on_s3_is_named(mutable_store):
    fs = _fs()
    obj = _chunk(mutable_store, BLOCK, 1)
    fs.pipe(obj, fs.cat(obj)[:-3])
    with pytest.raises(StoreCorruptError, match=rf"chunk 1 of array '{BLOCK}' has \d+ bytes"):
        open_store(mutable_store)
    fs.rm(obj)
    with pytest.raises(StoreCorruptError, match=rf"chunk 1 of array '{BLOCK}' is missing"):
        open_store(mutable_store)


def test_a_chunk_replaced_after_opening_is_refused_by_its_size(mutable_store):
    store = open_store(mutable_store)
    fs = _fs()
    obj = _chunk(mutable_store, BLOCK, 0)
    fs.pipe(obj, fs.cat(obj) + b"\0" * 100)
    with pytest.raises(StoreCorruptError, match=rf"chunk 0 of array '{BLOCK}' has more bytes"):
        store.read_block("train", 0, 1, "csc")
    fs.rm(obj)
    with pytest.raises(StoreCorruptError, match=rf"chunk 0 of array '{BLOCK}' is missing"):
        store.read_block("train", 0, 1, "csc")


def test_a_store_without_manifest_on_s3_is_incomplete(mutable_store):
    _fs().rm(f"{mutable_store}/dl1-manifest.json")
    with pytest.raises(IncompleteStoreError, match="has no dl1-manifest.json"):
        open_store(mutable_store)
    with pytest.raises(FileNotFoundError, match="no dl1 store at s3://"):
        open_store(mutable_store + "-elsewhere")


def test_an_oversize_manifest_is_refused_before_it_is_read(s3_store, monkeypatch):
    import dl1.store.reader as reader

    size = _fs().size(f"{s3_store}/dl1-manifest.json")
    monkeypatch.setattr(reader, "MAX_MANIFEST_BYTES", size - 1)
    read = []
    monkeypatch.setattr(Location, "read", lambda self, rel, n: read.append(rel))
    with pytest.raises(StoreCorruptError, match="refused before parsing"):
        open_store(s3_store)
    assert read == []


def test_oversize_metadata_and_keys_outside_the_store_are_refused(s3_store, monkeypatch):
    import dl1.store.arrays as stored_arrays

    monkeypatch.setattr(stored_arrays, "MAX_METADATA_BYTES", 100)
    with pytest.raises(StoreCorruptError, match="the metadata of array .* more than the 100"):
        open_store(s3_store)
    loc = as_location(s3_store)
    for key in ("../other/dl1-manifest.json", "/etc/passwd", "train/../../x", "a//b"):
        with pytest.raises(StoreCorruptError, match="not a relative name inside the store"):
            loc.read(key, 10)


def test_credentials_never_show(mutable_store, s3_endpoint):
    options = {"key": "dl1-test", "secret": SECRET, "client_kwargs": {"endpoint_url": s3_endpoint}}
    store = open_store(mutable_store, storage_options=options)
    assert store.location.storage_options == options
    shown = [str(store), repr(store), str(store.location), repr(store.location), store.path]
    shown.append(store.to_dask().name)
    with pytest.raises(KeyError) as missing:
        store.entry("test")
    shown.append(str(missing.value))
    _fs().rm(_chunk(mutable_store, BLOCK, 0))
    with pytest.raises(StoreCorruptError) as corrupt:
        store.read_block("train", 0, 1, "csc")
    shown.append(str(corrupt.value))
    assert not [s for s in shown if SECRET in s]
    url = as_location(f"s3://user:{SECRET}@bucket/x.zarr?token={SECRET}")
    assert SECRET not in str(url) and SECRET not in repr(url)


# ------------------------------------------------------------------ the example


@pytest.mark.slow
def test_the_s3_example_runs(s3_cluster, tmp_path):
    """The example as a script, on the session's cluster (its workers reach the server)."""
    address = s3_cluster.scheduler.address
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "s3_store.py"), "--tiny", "--scheduler", address],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "the same coefficients" in out.stdout


#: A worker's environment without credentials for the test server (botocore then finds
#: none: empty variables count as unset, no files, no instance metadata).
NO_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_SESSION_TOKEN": "",
                  "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent",
                  "AWS_EC2_METADATA_DISABLED": "true"}  # fmt: skip


@pytest.mark.slow
def test_workers_without_the_credentials_are_named_with_what_to_do(s3_store):
    """Workers started without the bucket's credentials, the client with them, a fit in
    one piece and distributed. Before: in one piece a bare ``NoCredentialsError: Unable to
    locate credentials``; distributed a StoreCorruptError "array ... cannot be opened".

    Pass: StoreAccessError (not StoreCorruptError) naming the object, the worker's address
    (one of the cluster's), the client library's error and what to do (credentials in the
    workers' environment or storage_options).
    """
    import dask
    from distributed import Client, LocalCluster

    from dl1.errors import StoreAccessError

    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                     dashboard_address="127.0.0.1:0", env=NO_CREDENTIALS) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):  # fmt: skip
        workers = set(client.scheduler_info()["workers"])
        for one_piece in (True, False):
            with dask.config.set({"dl1.one-piece": one_piece, "dl1.stall-timeout": 30}):
                with pytest.raises(StoreAccessError) as err:
                    dl1.fit(s3_store, alpha=0.01, client=client)
            message = str(err.value)
            assert s3_store in message and "Unable to locate credentials" in message, message
            assert any(f"on worker {w}" in message for w in workers), message
            assert "storage_options" in message and "environment" in message, message
            assert not isinstance(err.value, StoreCorruptError)


def test_a_refused_read_in_this_process_is_an_access_error(s3_store, monkeypatch):
    """Pass: a read refused for credentials in the calling process is a StoreAccessError
    naming "this process" (not a worker) and the object."""
    from dl1.errors import StoreAccessError

    loc = as_location(s3_store)

    class NoCredentialsError(Exception):  # as botocore names it
        pass

    def refuse(*args, **kwargs):
        raise NoCredentialsError("Unable to locate credentials")

    monkeypatch.setattr(loc.fs, "cat_file", refuse)
    with pytest.raises(StoreAccessError, match=r"manifest\.json cannot be read on this process"):
        loc.read("manifest.json", 1 << 20)
