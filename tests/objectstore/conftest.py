"""An S3-compatible server (moto's server mode) on 127.0.0.1 for the test session, and a
fresh bucket per test.

The server is a separate process, as a real object store is: the workers of a test's
LocalCluster reach it over HTTP like the client does. Credentials and the endpoint are set
in the environment (``AWS_*``), where botocore looks by default, before any cluster starts,
so worker processes inherit them and no test passes a credential in ``storage_options``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

#: Seconds the server has to answer its first request.
START_TIMEOUT = 30.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_up(url: str, proc: subprocess.Popen) -> None:
    import urllib.request

    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto server exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/moto-api/", timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"moto server at {url} did not answer within {START_TIMEOUT} s")


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """The URL of a moto S3 server on 127.0.0.1, with ``AWS_*`` set to reach it."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    env = {
        "AWS_ACCESS_KEY_ID": "dl1-test",
        "AWS_SECRET_ACCESS_KEY": "dl1-test-secret",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": url,
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        _wait_until_up(url, proc)
        yield url
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> Iterator[str]:
    """A fresh, empty bucket (``s3://<name>``), deleted with its objects afterwards."""
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    name = f"dl1-{uuid.uuid4().hex[:12]}"
    fs.mkdir(name)
    try:
        yield f"s3://{name}"
    finally:
        fs.rm(name, recursive=True)
