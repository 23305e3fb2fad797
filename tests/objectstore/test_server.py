"""The session's S3 server answers as an object store: what is put is read back; the
helper that starts it (:func:`dl1.testing.s3_server`) fails clearly."""

import importlib.util
import os
import socket
import subprocess
import sys

import pytest
import s3fs

import dl1.testing as testing


def test_the_local_s3_server_stores_and_returns_objects(s3_bucket):
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    fs.pipe(f"{s3_bucket}/a/b.bin", b"\x00\x01dl1")
    assert fs.cat(f"{s3_bucket}/a/b.bin") == b"\x00\x01dl1"
    assert fs.ls(f"{s3_bucket}/a", detail=False) == [f"{s3_bucket[5:]}/a/b.bin"]


def test_the_server_helper_names_what_is_missing_and_bounds_its_wait(monkeypatch):
    """A missing ``moto[server]`` is named with the extra that brings it; a server process
    that exits, or does not answer within the timeout, is an error, not a hang."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda m: None if m == "flask" else real(m))
    with pytest.raises(ImportError, match=r'pip install "dl1\[test\]"'):
        with testing.s3_server():
            pass
    monkeypatch.undo()
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    exits = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    exits.wait(timeout=60)
    with pytest.raises(RuntimeError, match="exited with code 3"):
        testing._wait_until_up(url, exits, 10.0)
    silent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(RuntimeError, match="did not answer within 0.3 s"):
            testing._wait_until_up(url, silent, 0.3)
    finally:
        silent.kill()
        silent.wait()


def test_the_environment_is_restored(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "before")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    with testing.s3_server(key="during") as url:
        assert os.environ["AWS_ACCESS_KEY_ID"] == "during"
        assert os.environ["AWS_ENDPOINT_URL"] == url
        os.environ["AWS_SESSION_TOKEN"] = "t"  # set inside the block: gone after it too
    assert os.environ["AWS_ACCESS_KEY_ID"] == "before" and "AWS_SESSION_TOKEN" not in os.environ
    assert os.environ.get("AWS_ENDPOINT_URL") != url
