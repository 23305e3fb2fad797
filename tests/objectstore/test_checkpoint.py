"""Path checkpoints on S3 (a moto server on 127.0.0.1): the local result bit for bit, a
resume after a killed client, one writer at a time by a lease, bounded untrusted reads."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import s3fs
import scipy.sparse as sp

import dl1
import dl1.paths.remote as remote
from dl1.errors import CheckpointCorruptError, CheckpointLockedError
from dl1.paths import CheckpointMismatchError, PathCheckpoint
from tests.paths.test_checkpoint import ALPHAS, gen, open_ck, same_bits
from tests.reliability.faults import assert_same_path

REPO = Path(__file__).resolve().parents[2]
PATH_KW = dict(n_alphas=6, tol=1e-9)
SECRET = "dl1-test-secret"


def _fs() -> s3fs.S3FileSystem:
    return s3fs.S3FileSystem(skip_instance_cache=True)


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }


@pytest.fixture(scope="module")
def data(tmp_path_factory, local_cluster):
    """A small store and its checkpointed path on local disk (the reference)."""
    rng = np.random.default_rng(5)
    X = sp.random(150, 90, density=0.15, format="csr", random_state=rng)
    w = np.zeros(90)
    w[rng.choice(90, 8, replace=False)] = rng.standard_normal(8)
    y = X @ w + 0.1 * rng.standard_normal(150)
    root = tmp_path_factory.mktemp("data")
    store = root / "s.zarr"
    dl1.from_scipy(X, y, store, n_feature_blocks=3)
    ref = dl1.path(store, client=local_cluster, checkpoint=root / "ck", **PATH_KW)
    return store, ref


def test_path_checkpointed_on_s3_equals_local(data, local_cluster, s3_bucket):
    store, ref = data
    url = f"{s3_bucket}/runs/ck"
    res = dl1.path(store, client=local_cluster, checkpoint=url, **PATH_KW)
    assert_same_path(res, ref)
    names = {k.rsplit("/", 1)[-1] for k in _fs().find(url.removeprefix("s3://"))}
    assert {"dl1-checkpoint.json", "dl1-progress.json"} <= names


KILLED_CLIENT = """
import os, signal
import dl1
from distributed import Client

def cb(k, alpha, res):
    if k == 2:
        os.kill(os.getpid(), signal.SIGKILL)

with Client({address!r}) as client:
    dl1.path({store!r}, client=client, checkpoint={url!r}, callback=cb, **{kw!r})
"""


@pytest.mark.slow
def test_killed_client_resumes_bit_for_bit(data, local_cluster, s3_bucket):
    store, ref = data
    url = f"{s3_bucket}/ck"
    script = KILLED_CLIENT.format(
        address=local_cluster.scheduler.address, store=str(store), url=url, kw=PATH_KW
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], env=_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    fs = _fs()
    key = url.removeprefix("s3://")
    assert fs.exists(f"{key}/dl1-lock.json")  # the dead client's lease is still there
    assert len(json.loads(fs.cat_file(f"{key}/dl1-progress.json"))["done"]) == 3
    resumed = dl1.path(store, client=local_cluster, checkpoint=url, **PATH_KW)
    assert_same_path(resumed, ref)


HOLDER = """
import sys, time
from tests.paths.test_checkpoint import gen, open_ck
ck = open_ck({url!r})
ck.record(0, **gen(0))
print("held", flush=True)
time.sleep(120)
"""


def test_second_writer_is_refused_until_the_holder_dies(s3_bucket):
    url = f"{s3_bucket}/held"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER.format(url=url)],
        env=_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(CheckpointLockedError, match=rf"{url}.*pid {proc.pid}"):
            open_ck(url)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    ck = open_ck(url)  # its process is gone: the lease is taken over at once
    assert ck.n_done == 1 and same_bits(ck.coef(0), gen(0)["coef"])
    ck.close()
    assert not _fs().exists(f"{url.removeprefix('s3://')}/dl1-lock.json")


@pytest.mark.slow
def test_lease_taken_over_stops_recording(s3_bucket, monkeypatch):
    monkeypatch.setattr(remote, "LEASE_SECONDS", 1.0)
    url = f"{s3_bucket}/lease"
    key = f"{url.removeprefix('s3://')}/dl1-lock.json"
    ck = open_ck(url)
    ck.record(0, **gen(0))
    other = {"owner": "x", "host": "elsewhere", "pid": 1, "started": 0.0}
    _fs().pipe_file(key, json.dumps(other).encode())  # another process took it over
    time.sleep(0.8)
    with pytest.raises(CheckpointLockedError, match="no longer holds its lease"):
        ck.record(1, **gen(1))
    # a lease of another host is respected while fresh, taken over once stale
    monkeypatch.setattr(remote, "LEASE_SECONDS", 3.0)
    with pytest.raises(CheckpointLockedError, match="host elsewhere, pid 1"):
        open_ck(url)
    time.sleep(4.5)
    again = open_ck(url)
    assert again.n_done == 1
    again.close()


def test_untrusted_objects_are_bounded_and_checked(s3_bucket):
    url = f"{s3_bucket}/bad"
    key = url.removeprefix("s3://")
    ck = open_ck(url)
    for k in range(3):
        ck.record(k, **gen(k))
    ck.close()
    fs = _fs()
    chunk = f"{key}/coef/1/values/c/0"
    good = fs.cat_file(chunk)
    fs.pipe_file(chunk, good + b"\0" * 64)  # larger than recorded: never read whole
    with pytest.raises(CheckpointCorruptError, match="more than"):
        open_ck(url)
    fs.pipe_file(chunk, good[:-1] + bytes([good[-1] ^ 1]))  # a flipped bit
    with pytest.raises(CheckpointCorruptError, match="alpha 1"):
        open_ck(url)
    fs.pipe_file(chunk, good)
    assert open_ck(url).n_done == 3


def test_credentials_are_never_shown(s3_bucket, s3_endpoint):
    so = {"key": "dl1-test", "secret": SECRET, "client_kwargs": {"endpoint_url": s3_endpoint}}
    url = f"{s3_bucket}/creds"
    kw = dict(fingerprint={"a": 1}, settings={"tol": 1e-6}, alphas=ALPHAS, n_features=40)
    ck = PathCheckpoint.open_or_create(url, storage_options=so, **kw)
    ck.record(0, **gen(0))
    assert SECRET not in repr(ck) and SECRET not in ck.where
    with pytest.raises(CheckpointMismatchError, match="settings.tol") as e:
        PathCheckpoint.open_or_create(url, storage_options=so, **{**kw, "settings": {"tol": 1.0}})
    assert SECRET not in str(e.value)


def test_memory_filesystem_lease_without_etags(monkeypatch):
    """A filesystem without conditional writes on an ETag: the lease is compared by owner."""
    import fsspec

    url, fs = "memory://dl1-ck-test/ck", fsspec.filesystem("memory")
    try:
        ck = open_ck(url)
        ck.record(0, **gen(0))
        ck.close()
        assert not fs.exists("/dl1-ck-test/ck/dl1-lock.json")
        stale = {"owner": "x", "host": "elsewhere", "pid": 1, "started": None}
        fs.pipe_file("/dl1-ck-test/ck/dl1-lock.json", json.dumps(stale).encode())
        with pytest.raises(CheckpointLockedError, match="host elsewhere"):
            open_ck(url)
        monkeypatch.setattr(remote, "LEASE_SECONDS", 0.05)
        time.sleep(0.1)  # the lease is now older than LEASE_SECONDS
        again = open_ck(url)
        assert again.n_done == 1 and same_bits(again.coef(0), gen(0)["coef"])
        again.close()
    finally:
        fs.rm("/dl1-ck-test", recursive=True)
