"""The command line fails fast and cleanly: options and the store are checked before a
cluster starts or is joined, and an error is one line on stderr with a meaningful exit
status (2: invalid input, 1: anything else), its traceback only under ``--debug``.

Commands that could reach a cluster are given ``--scheduler`` at an address nobody listens
on, with a 2 s connect timeout: had they tried to join it they would fail with a
connection error instead of the expected message.
"""

import contextlib
import os
import socketserver
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import dl1

REPO = Path(__file__).resolve().parents[2]
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "2s",
}
NOWHERE = ("--scheduler", "tcp://127.0.0.1:9")


def dl1_cli(*args, timeout: float = 120.0) -> tuple[subprocess.CompletedProcess, float]:
    """``python -m dl1 *args`` and its wall seconds."""
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "dl1", *map(str, args)],
        env=ENV, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    return out, time.perf_counter() - t0


def one_line(out: subprocess.CompletedProcess) -> str:
    """The single line of stderr (asserting there is one, and no traceback)."""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert lines[0].startswith("dl1: error: "), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """A regression store and one whose column 3 has a value of 1e200."""
    root = tmp_path_factory.mktemp("cli")
    X = sp.random(60, 20, density=0.3, random_state=0, format="csr")
    y = np.random.default_rng(0).standard_normal(60)
    dl1.from_scipy(X, y, root / "s", n_feature_blocks=2)
    Xh = X.toarray()
    Xh[0, 3] = 1e200
    dl1.from_scipy(sp.csr_matrix(Xh), y, root / "huge", n_feature_blocks=2)
    (root / "empty").mkdir()
    (root / "afile").write_text("a file, not a folder")
    return root


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("fit", "{s}", "--alpha-ratio", "0"), "'alpha_ratio' parameter of dl1 fit"),
        (("fit", "{s}", "--loss", "logistic"), "logistic labels must be exactly -1 or +1"),
        (("fit", "{s}", "--memory-limit", "lots"), "--memory-limit must be a positive size"),
        (("fit", "{huge}"), "X column 3 (split 'train' of"),
        (("path", "{huge}", "--constrained"), "its sum of squares overflows float64"),
        (("path", "{s}", "--eps", "2"), "'eps' parameter of dl1 path"),
        (("demo", "--seed=-1"), "'seed' parameter of dl1 demo"),
        (("fit", "{s}", "--output", "{afile}/m"), "--output {afile}/m: {afile} is not a dir"),
        (("path", "{s}", "--checkpoint", "{afile}/ck"), "--checkpoint {afile}/ck: {afile} is"),
        (("path", "{s}", "--plots", "{afile}/p"), "--plots {afile}/p: {afile} is not a dir"),
        (("path", "{s}", "--output", "{afile}/m"), "--output {afile}/m: {afile} is not a dir"),
        # a folder no one can create files in, root included (permissions would not stop
        # root): /proc
        (("fit", "{s}", "--output", "/proc/m.json"), "--output /proc/m.json: /proc cannot be"),
        (("path", "{s}", "--checkpoint", "/proc/ck"), "--checkpoint /proc/ck: /proc cannot be"),
        (("path", "{s}", "--plots", "/proc/p"), "--plots /proc/p: /proc cannot be written"),
    ],
)
def test_invalid_input_is_one_line_exit_2_before_any_cluster(stores, args, named):
    """Pass criterion: exit status 2, one stderr line 'dl1: error: ...' naming the option or
    the data's problem, no traceback, within 60 s and without trying the (unreachable)
    scheduler (before: --alpha-ratio 0 raised ZeroDivisionError with a traceback after a
    cluster started; --memory-limit lots a ValueError traceback; the logistic labels were
    checked after the cluster had started, exit 1; the store with a 1e200 value never
    returned; an --output, --checkpoint or --plots that cannot be written failed only after
    the whole fit or path)."""
    where = dict(s=stores / "s", huge=stores / "huge", afile=stores / "afile")
    args = [a.format(**where) for a in args]
    out, seconds = dl1_cli(*args, *(NOWHERE if args[0] != "demo" else ()))
    assert out.returncode == 2, out.stderr
    assert named.format(**where) in one_line(out)
    assert "connect" not in out.stderr.lower()
    assert seconds < 60


@pytest.mark.slow
def test_runtime_errors_are_one_line_exit_1(stores):
    """Pass criterion: an existing destination and an unreachable scheduler each exit
    with status 1 and one line naming the problem (before: the unreachable scheduler
    printed a 60-line OSError traceback); a folder that is not a complete store is invalid
    input, status 2."""
    out, _ = dl1_cli("fit", stores / "empty", *NOWHERE)  # not a store: invalid input
    assert out.returncode == 2 and "has no dl1-manifest.json" in one_line(out)
    out, _ = dl1_cli("generate", stores / "s")
    assert out.returncode == 1 and str(stores / "s") in one_line(out)
    out, _ = dl1_cli("fit", stores / "s", *NOWHERE)
    assert out.returncode == 1, out.stderr
    assert "tcp://127.0.0.1:9" in one_line(out)


def test_debug_prints_the_traceback_as_well(stores):
    """Pass criterion: with --debug (before or after the command) the same error prints its
    traceback, then the same one line, and the same exit status."""
    for args in (("--debug", "fit", stores / "s"), ("fit", stores / "s", "--debug")):
        out, _ = dl1_cli(*args, "--tol", "0", *NOWHERE)
        assert out.returncode == 2
        assert "Traceback (most recent call last)" in out.stderr
        assert "InvalidParameterError" in out.stderr
        assert out.stderr.strip().splitlines()[-1].startswith("dl1: error: the 'tol' parameter")


class _Chatty(socketserver.BaseRequestHandler):
    """A service that answers any connection with HTTP text at once (as an HTTP server does
    to bytes that are no request), then closes it."""

    def handle(self) -> None:
        self.request.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")


class _Silent(socketserver.BaseRequestHandler):
    """A service that reads and never answers (an HTTP server waiting for a request line)."""

    def handle(self) -> None:
        self.request.settimeout(30)
        with contextlib.suppress(OSError):
            while self.request.recv(1024):
                pass


@pytest.mark.parametrize("handler", [_Chatty, _Silent], ids=["answers text", "never answers"])
@pytest.mark.slow
def test_an_address_that_is_no_scheduler_is_one_line_naming_it(stores, handler):
    """Pass criterion: ``--scheduler`` at a port whose service is not Dask (an HTTP server,
    the dashboard's port) exits 1 within the connect timeout (2 s here) and a few seconds,
    with one line naming the address (before: ``MemoryError: Unable to allocate 3.07 EiB``,
    Dask reading the text as a frame length, or a wait for ever)."""
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler) as server:
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        address = f"tcp://127.0.0.1:{server.server_address[1]}"
        try:
            out, seconds = dl1_cli("fit", stores / "s", "--scheduler", address)
        finally:
            server.shutdown()
    assert out.returncode == 1, out.stderr
    assert f"no Dask scheduler answers at {address}" in one_line(out)
    assert seconds < 30


def test_the_scheduler_check_leaves_the_calling_threads_event_loop_alone():
    """Pass criterion: after the check of ``--scheduler`` in a process (as ``CliRunner`` runs
    the commands in the tests' own process), that thread can still get its event loop
    (``asyncio.run`` there would unset it, and Dask's nanny kills then fail)."""
    code = (
        "import asyncio\n"
        "from dl1.runtime.connection import check_scheduler_answers\n"
        "try:\n"
        "    check_scheduler_answers('tcp://127.0.0.1:9', None)\n"
        "except ConnectionError:\n"
        "    pass\n"
        "asyncio.get_event_loop_policy().get_event_loop()\n"
        "print('loop ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0 and "loop ok" in done.stdout, done.stderr
