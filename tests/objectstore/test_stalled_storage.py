"""Object storage that stops answering (its server SIGSTOPped) is a named error within the
stall timeout plus 30 s, not a wait of minutes: every request is bounded in time."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import dask
import numpy as np
import psutil
import pytest
import scipy.sparse as sp

import dl1
from dl1.errors import ClusterStalledError
from dl1.store.location import bounded_options

STALL_S = 10.0


@contextlib.contextmanager
def frozen_server(endpoint: str):
    """The S3 server at ``endpoint`` (a child of this process) stopped within."""
    port = endpoint.rsplit(":", 1)[1]
    (server,) = [p for p in psutil.Process().children(recursive=True)
                 if "moto.server" in " ".join(p.cmdline()) and port in p.cmdline()]  # fmt: skip
    os.kill(server.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.pid, signal.SIGCONT)


def test_requests_are_bounded_unless_the_caller_bounds_them():
    """Pass: S3 options get timeouts of an eighth of the stall timeout (at most s3fs's
    5 s / 15 s) and no botocore retries; the caller's own values and other filesystems'
    options are left as given."""
    with dask.config.set({"dl1.stall-timeout": 16}):
        got = bounded_options("s3://b/x.zarr", {"anon": False})
        mine = bounded_options("s3://b/x.zarr", {"config_kwargs": {"read_timeout": 99}})
    assert got["anon"] is False
    assert got["config_kwargs"]["connect_timeout"] == 2.0
    assert got["config_kwargs"]["read_timeout"] == 2.0
    assert got["config_kwargs"]["retries"]["max_attempts"] == 1
    assert mine["config_kwargs"]["read_timeout"] == 99
    assert bounded_options("gs://b/x.zarr", {"token": "t"}) == {"token": "t"}


@pytest.mark.slow
def test_a_stopped_server_is_a_named_stall_for_open_and_fit(s3_endpoint, s3_bucket):
    """Pass: with the server stopped, opening a store and fitting an opened one each raise
    ClusterStalledError naming the object within the stall timeout plus 30 s."""
    X = sp.random(300, 40, density=0.2, format="csr", random_state=0)
    y = np.asarray(X @ np.arange(40.0)).ravel()
    url = f"{s3_bucket}/s.zarr"
    dl1.from_scipy(X, y, url)
    with dask.config.set({"dl1.stall-timeout": STALL_S}):
        store = dl1.open_store(url)
        with frozen_server(s3_endpoint):
            for call in (lambda: dl1.open_store(url),
                         lambda: dl1.fit(store, alpha=0.1, client=None)):  # fmt: skip
                t0 = time.monotonic()
                with pytest.raises(ClusterStalledError, match=r"object storage did not answer.*s3://"):
                    call()
                assert time.monotonic() - t0 <= STALL_S + 30
