"""Stores written to S3 (a moto server on 127.0.0.1): the same bytes as on local disk,
manifest last, nothing left behind by a failed write, credentials never shown."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
import s3fs
from sklearn.datasets import dump_svmlight_file, load_svmlight_file

import dl1
import dl1.store.upload as upload
from dl1.datasets import PRESETS, make_e2006_like
from dl1.errors import StoreError, ValidationError
from dl1.io.svmlight import from_svmlight
from dl1.store import StoreWriter, open_store
from dl1.store.csr import add_csr
from dl1.store.format import MANIFEST
from tests.helpers import random_csr

SECRET = "dl1-test-secret"
TINY = dataclasses.replace(PRESETS["small"], name="tiny", n_train=300, n_test=60, pilot_rows=256)


def _fs() -> s3fs.S3FileSystem:
    return s3fs.S3FileSystem(skip_instance_cache=True)


def _objects(url: str) -> dict[str, bytes]:
    """Every object under ``url``, by name relative to it."""
    fs = _fs()
    root = url.removeprefix("s3://")
    return {k[len(root) + 1 :]: fs.cat_file(k) for k in fs.find(root)}


def _files(path: Path) -> dict[str, bytes]:
    return {n: (path / n).read_bytes() for n in upload.local_files(path)}


@pytest.fixture
def staging(tmp_path, monkeypatch) -> Path:
    """The system's temporary directory, where staging directories go, made observable."""
    d = tmp_path / "tmp"
    d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    return d


def _untimed(manifest: dict) -> dict:
    """A manifest without the ingest's timings."""
    for rec in manifest["attrs"].get("svmlight", {}).values():
        for k in [k for k in rec if k.startswith("seconds")]:
            del rec[k]
    return manifest


def _assert_same_store(url: str, local: Path) -> None:
    got, want = _objects(url), _files(local)
    assert got.keys() == want.keys()
    assert all(got[k] == want[k] for k in want if k != MANIFEST)
    a, b = open_store(url), open_store(local)
    assert _untimed(a.manifest) == _untimed(b.manifest)
    for i in range(len(b.row_bounds()) - 1):
        for j in range(len(b.col_bounds()) - 1):
            x, y = a.read_block("train", i, j), b.read_block("train", i, j)
            assert (x != y).nnz == 0


def test_svmlight_ingest_to_s3_equals_local(s3_bucket, tmp_path, staging):
    X = random_csr(300, 70, 0.1, seed=1)
    y = np.random.default_rng(1).standard_normal(300)
    src = tmp_path / "a.svm"
    dump_svmlight_file(X, y, str(src), zero_based=True)
    kw = dict(zero_based=True, block_nnz=800, formats=("csc", "csr"), batch_bytes=4096)
    local = tmp_path / "a.zarr"
    from_svmlight(src, local, **kw)
    url = f"{s3_bucket}/data/a.zarr"
    store = from_svmlight(src, url, **kw)
    assert len(store.col_bounds()) > 2  # several blocks travelled
    _assert_same_store(url, local)
    assert list(staging.iterdir()) == []
    Xr, yr = load_svmlight_file(str(src), n_features=70, zero_based=True)  # the reference
    np.testing.assert_array_equal(store.read("y"), yr)
    assert (store.read_block("train", 0, 0) != Xr[:, : store.col_bounds()[1]]).nnz == 0


def test_generated_store_to_s3_equals_local(s3_bucket, tmp_path, staging):
    kw = dict(preset=TINY, seed=3, block_nnz=1 << 14)
    local = tmp_path / "g.zarr"
    make_e2006_like(local, **kw)
    url = f"{s3_bucket}/g.zarr"
    make_e2006_like(url, **kw)
    _assert_same_store(url, local)
    assert list(staging.iterdir()) == []


def test_explicit_credentials_and_overwrite(s3_bucket, s3_endpoint, tmp_path):
    so = {
        "key": "dl1-test",
        "secret": SECRET,
        "client_kwargs": {"endpoint_url": s3_endpoint},
    }
    X, y = random_csr(60, 30, 0.2, seed=2), np.arange(60.0)
    url = f"{s3_bucket}/o.zarr"
    store = dl1.from_scipy(X, y, url, storage_options=so, n_feature_blocks=3)
    assert SECRET not in repr(store) and SECRET not in str(store.path)
    with pytest.raises(FileExistsError, match="overwrite=True") as e:
        dl1.from_scipy(X, y, url, storage_options=so)
    assert SECRET not in str(e.value)
    # overwrite: the old store's files that the new one lacks are gone
    dl1.from_scipy(X[:10], y[:10], url, storage_options=so, overwrite=True)
    local = tmp_path / "o.zarr"
    dl1.from_scipy(X[:10], y[:10], local)
    assert _objects(url) == _files(local)
    # a prefix holding anything else is never written over
    _fs().pipe_file(f"{s3_bucket.removeprefix('s3://')}/other/keep.txt", b"keep")
    with pytest.raises(FileExistsError, match="not a dl1 store"):
        dl1.from_scipy(X, y, f"{s3_bucket}/other", overwrite=True)
    assert _objects(f"{s3_bucket}/other") == {"keep.txt": b"keep"}


def test_failed_write_uploads_nothing_and_leaves_no_staging(s3_bucket, staging):
    X = random_csr(80, 20, 0.3, seed=3)
    y = np.arange(80.0)
    url = f"{s3_bucket}/f.zarr"
    with pytest.raises(ValidationError, match="not finite"):
        with StoreWriter(url) as w:
            s = w.split("train", n_features=20)
            s.append(X[:40], y[:40])
            s.append(X[40:], np.r_[y[40:-1], np.nan])
    assert _objects(s3_bucket) == {}
    assert list(staging.iterdir()) == []


@pytest.mark.parametrize("error", [OSError("connection reset"), KeyboardInterrupt()])
def test_interrupted_upload_leaves_no_manifest(s3_bucket, staging, monkeypatch, error):
    X, y = random_csr(80, 40, 0.3, seed=4), np.arange(80.0)
    url = f"{s3_bucket}/u.zarr"
    monkeypatch.setattr(upload, "UPLOAD_BATCH", 3)
    real = upload.put_batch
    calls = []

    def put_batch(*args):
        calls.append(1)
        if len(calls) == 3:  # some files are uploaded, not all
            raise error
        return real(*args)

    monkeypatch.setattr(upload, "put_batch", put_batch)
    with pytest.raises(type(error)):
        dl1.from_scipy(X, y, url, n_feature_blocks=4)
    got = _objects(s3_bucket)
    assert got and MANIFEST not in {n.rsplit("/", 1)[-1] for n in got}
    assert list(staging.iterdir()) == []
    with pytest.raises(StoreError):
        open_store(url)


@pytest.mark.slow
def test_dask_array_to_s3_blocks_uploaded_by_workers(
    local_cluster, s3_bucket, s3_endpoint, tmp_path, staging, monkeypatch
):
    # explicit options: the session's workers may predate the server's environment
    so = {"key": "dl1-test", "secret": SECRET, "client_kwargs": {"endpoint_url": s3_endpoint}}
    X = random_csr(90, 50, 0.2, seed=6)
    y = np.random.default_rng(6).standard_normal(90)
    Xd = da.from_array(X.toarray(), chunks=(45, 25))
    local = tmp_path / "d.zarr"
    dl1.from_dask(Xd, y, local, client=local_cluster, formats=("csc", "csr"))

    def client_upload(*args):
        raise AssertionError("a block went through the client")

    monkeypatch.setattr(dl1.convert, "upload_tree", client_upload)
    url = f"{s3_bucket}/d.zarr"
    store = dl1.from_dask(
        Xd, y, url, client=local_cluster, formats=("csc", "csr"), storage_options=so
    )
    assert _objects(url) == _files(local)
    assert (store.read_block("train", 1, 1) != X[45:, 25:]).nnz == 0
    assert list(staging.iterdir()) == []


def test_add_csr_to_a_store_on_s3(s3_bucket, tmp_path, staging):
    X, y = random_csr(70, 40, 0.2, seed=7), np.arange(70.0)
    url = f"{s3_bucket}/c.zarr"
    dl1.from_scipy(X, y, url, n_feature_blocks=2)
    local = tmp_path / "c.zarr"
    dl1.from_scipy(X, y, local, n_feature_blocks=2)
    store = add_csr(url)
    add_csr(local)
    assert store.entry()["formats"] == ["csc", "csr"]
    assert _objects(url) == _files(local)
    assert (store.read_block("train", 0, 1, "csr") != X[:, store.col_bounds()[1] :]).nnz == 0
    assert list(staging.iterdir()) == []
