"""benchmarks/netrelay.py (the emulated links' latency) on 127.0.0.1, and
benchmarks/bench_network.py --quick (Dask's scheduler and workers in network namespaces)
where this process is root and may create namespaces; it skips saying why otherwise."""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_network  # noqa: E402
from netrelay import Relay, Route  # noqa: E402


class _Echo:
    """A TCP server on 127.0.0.1 sending back what it reads (one thread per connection);
    ``closed`` is set when a connection's peer has closed."""

    def __init__(self) -> None:
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.srv.settimeout(0.2)
        self.closed = threading.Event()
        self.conns: list[socket.socket] = []
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> tuple[str, int]:
        return self.srv.getsockname()[:2]

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                c, _ = self.srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.conns.append(c)
            threading.Thread(target=self._echo, args=(c,), daemon=True).start()

    def _echo(self, c: socket.socket) -> None:
        c.settimeout(10)
        try:
            while data := c.recv(65536):
                c.sendall(data)
        except OSError:
            pass
        self.closed.set()

    def stop(self) -> None:
        self._stop.set()
        self.srv.close()
        for c in self.conns:
            c.close()


@pytest.fixture
def echo():
    e = _Echo()
    yield e
    e.stop()


def _relay(echo: _Echo, delay: float) -> Relay:
    return Relay([Route(("127.0.0.1", 0), echo.address)], delay, clients=["127.0.0.1"])


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    parts, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        assert chunk, f"connection closed after {got} of {n} bytes"
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _rtts(address: tuple[str, int], n: int) -> list[float]:
    with socket.create_connection(address, timeout=10) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            s.sendall(b"x")
            _recv_exactly(s, 1)
            out.append(time.perf_counter() - t0)
    return out


def test_relay_forwards_bytes_intact_and_in_order(echo):
    rng = np.random.default_rng(0)
    payload = rng.integers(0, 256, 3 * 2**20 + 17, dtype="uint8").tobytes()
    with _relay(echo, 0.0005) as relay, socket.create_connection(relay.addresses[0]) as s:
        s.settimeout(10)
        sender = threading.Thread(target=s.sendall, args=(payload,))
        sender.start()  # echoed while still being sent: both directions at once
        got = _recv_exactly(s, len(payload))
        sender.join(10)
        stats = relay.totals()
    assert got == payload
    assert stats.connections == 1
    assert stats.bytes_to_target == stats.bytes_from_target == len(payload)


def test_relay_adds_the_configured_round_trip(echo):
    delay = 0.002
    direct = statistics.median(_rtts(echo.address, 30))
    with _relay(echo, delay) as relay:
        relayed = _rtts(relay.addresses[0], 30)
        stats = relay.totals()
    # every round trip waits at least the delay each way, and not far beyond it
    assert min(relayed) >= 2 * delay
    assert statistics.median(relayed) - direct < 2 * delay + 0.005
    assert stats.turns == stats.client_turns == 30  # one request -> response turn per trip


def test_relay_closes_both_sides_when_one_closes(echo):
    with _relay(echo, 0.001) as relay:
        # the client closes: the server's side is closed too
        s = socket.create_connection(relay.addresses[0], timeout=10)
        s.sendall(b"ping")
        assert _recv_exactly(s, 4) == b"ping"
        s.close()
        assert echo.closed.wait(5)
        # the server closes: the client reads EOF, after the data sent before it
        s = socket.create_connection(relay.addresses[0], timeout=10)
        s.sendall(b"pong")
        assert _recv_exactly(s, 4) == b"pong"
        deadline = time.monotonic() + 5
        while len(echo.conns) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        echo.conns[1].shutdown(socket.SHUT_RDWR)
        assert s.recv(16) == b""
        s.close()
        deadline = time.monotonic() + 5
        while relay._links and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not relay._links  # both links' sockets closed, threads done


def test_relay_refuses_a_negative_delay(echo):
    with pytest.raises(ValueError, match="delay must be >= 0"):
        Relay([Route(("127.0.0.1", 0), echo.address)], -1.0)


def test_bench_network_refuses_without_root(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    code = bench_network.main(["--quick", "--data-dir", str(tmp_path)])
    assert code == 2
    assert "network namespaces need root" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before generating any data


def test_bench_network_names_the_failing_command():
    with pytest.raises(bench_network.NetError, match="`ip netns add dl1n-/bad` failed"):
        bench_network.sh("ip", "netns", "add", "dl1n-/bad")


def _namespaces_work() -> str | None:
    """None if this process can create a network namespace, else why not."""
    if os.geteuid() != 0:
        return "not root: network namespaces need root"
    name = f"dl1n-probe-{uuid.uuid4().hex[:8]}"
    try:
        add = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True,
                             timeout=30)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`ip netns add` failed: {e}"
    if add.returncode != 0:
        return f"`ip netns add` failed: {add.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
    return None


def _dl1n_namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    return [line.split()[0] for line in out.stdout.splitlines() if line.startswith("dl1n-")]


@pytest.mark.slow
def test_bench_network_quick_runs_in_namespaces(tmp_path):
    why = _namespaces_work()
    if why:
        pytest.skip(why)
    before = set(_dl1n_namespaces())
    out = tmp_path / "net.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_network.py"), "--quick",
         "--data-dir", str(tmp_path / "data"), "--json", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(out.read_text())
    rows, calib = doc["runs"], doc["calibration"]
    profiles = {r["profile"] for r in rows}
    assert "loopback" in profiles and len(profiles) == 2
    assert {r["task"] for r in rows} == {"fit", "path", "cv"}
    for r in rows:
        # certified by dl1's own duality gap (a CV: its refit, and no fold's alpha uncertified)
        assert r["gap"] <= r["tol"] and r["certified"], r
        assert r["rounds"] > 0 and r["seconds"] > 0, r
    for c in calib:
        if c["profile"] == "loopback":
            continue
        # the relay adds at least the configured round trip; tbf caps near the rate
        assert c["rtt_s"] >= 2 * c["latency_s"], c
        assert c["direct_rtt_s"] < c["latency_s"], c  # the latency is the relay's
        assert c["throughput_bps"] <= 1.1 * c["rate_bps"], c
        assert c["direct_throughput_bps"] <= 1.1 * c["rate_bps"], c
    for r in rows:
        if r["profile"] != "loopback":
            assert r["rtt_s"] >= 2 * r["latency_s"], r
            assert r["bytes_per_run_per_worker"] > 0, r
            assert 0 < r["client_round_trips"] <= r["round_trips"], r
            if r["task"] != "cv":
                assert r["bytes_per_round_per_worker"] > 0, r
    assert "| preset | task | profile |" in proc.stdout
    assert set(_dl1n_namespaces()) - before == set()  # torn down


@pytest.mark.parametrize(("solver", "direct"), [("row-newton", True),
                                                ("row-newton-tasks", False), ("ws", True)])
def test_each_solver_runs_as_named(monkeypatch, solver, direct):
    """``--solvers row-newton-tasks`` runs row-newton with its calls as Dask tasks
    (``dl1.direct-calls: False``); the others with dl1's default, direct calls."""
    import types

    import dask

    import dl1

    seen = {}

    def fit(store, **kw):
        seen.update(solver=kw["solver"], direct=dask.config.get("dl1.direct-calls"))
        return types.SimpleNamespace(n_rounds_=1, gap_=0.0)

    monkeypatch.setattr(dl1, "fit", fit)
    args = types.SimpleNamespace(tol=1e-6, loss="squared", partitions=None, workers=2,
                                 n_alphas=3, eps=0.1, ratio=20.0, folds=2)  # fmt: skip
    assert bench_network._solve("fit", "S", 1.0, args, None, solver) == (1, 0.0)
    assert seen == {"solver": solver.removesuffix("-tasks"), "direct": direct}
