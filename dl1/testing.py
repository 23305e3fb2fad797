"""Helpers for testing code that uses dl1 against local stand-ins of real services.

:func:`s3_server` runs an S3-compatible server (moto's server mode) on 127.0.0.1 for the
duration of a ``with`` block: dl1's tests, ``examples/s3_store.py`` and
``benchmarks/bench_objectstore.py`` use it. It needs the ``test`` extra
(``pip install "dl1[test]"``, which brings ``moto[server]``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from unittest import mock

__all__ = ["s3_server"]

#: Seconds a freshly started server has to answer its first request.
S3_START_TIMEOUT = 30.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_up(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the S3 server at {url} exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/moto-api/", timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"the S3 server at {url} did not answer within {timeout} s")


@contextlib.contextmanager
def s3_server(
    key: str = "dl1-test",
    secret: str = "dl1-test-secret",
    start_timeout: float = S3_START_TIMEOUT,
) -> Iterator[str]:
    """Run an S3-compatible server on 127.0.0.1 and point ``AWS_*`` at it.

    The server (``python -m moto.server``) is a separate process, as a real object store is,
    so the workers of a cluster reach it over HTTP as the client does. While the block runs,
    ``AWS_ENDPOINT_URL``, throwaway credentials and a region are set in ``os.environ``, where
    botocore (s3fs) looks by default; processes started inside the block (the workers of a
    ``LocalCluster``) inherit them. On exit the server is stopped and the environment
    restored.

    Parameters
    ----------
    key, secret : str
        The credentials set in ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (the server
        accepts any).
    start_timeout : float
        Seconds the server has to answer before :class:`RuntimeError` is raised.

    Yields
    ------
    str
        The endpoint's URL, ``http://127.0.0.1:<port>``.
    """
    # the server process imports moto (seconds); here only check that it can
    if any(importlib.util.find_spec(m) is None for m in ("moto", "flask", "flask_cors")):
        raise ImportError(
            'dl1.testing.s3_server needs moto\'s server mode: pip install "dl1[test]" '
            '(or "moto[server]")'
        )
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    env = {
        "AWS_ENDPOINT_URL": url,
        "AWS_ACCESS_KEY_ID": key,
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    try:
        with mock.patch.dict(os.environ, env):
            _wait_until_up(url, proc, start_timeout)
            yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
