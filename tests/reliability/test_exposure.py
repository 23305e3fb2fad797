"""Exposure: the clusters dl1 starts listen on 127.0.0.1 only and serve no HTTP unless
asked (then on 127.0.0.1 only), and dl1 warns before it works on a plain-TCP scheduler on
another machine.

Sockets are read from the processes themselves (psutil), not from the arguments passed,
and every one of them is tried with HTTP requests, in clear and over TLS.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import socket
import ssl
import subprocess
import sys
import textwrap
import threading
import types
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest

import dl1
from dl1.runtime.exposure import InsecureClusterWarning, check_scheduler_address
from dl1.runtime.localcluster import loopback_addresses
from tests.helpers import random_csr

#: Processes killed, frozen or started: the full tier (CI), not the everyday one.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def listening(pids: list[int]) -> list[tuple[int, str, int]]:
    """(pid, ip, port) of every listening inet socket of ``pids`` and their children."""
    procs = []
    for pid in pids:
        p = psutil.Process(pid)
        procs += [p, *p.children(recursive=True)]
    out = []
    for p in {p.pid: p for p in procs}.values():
        for c in p.net_connections(kind="inet"):
            if c.status == psutil.CONN_LISTEN:
                out.append((p.pid, c.laddr.ip, c.laddr.port))
    return out


def is_loopback(ip: str) -> bool:
    return ipaddress.ip_address(ip).is_loopback


#: What the scheduler's HTTP server gives any local user (the issue's list), and /health.
PATHS = ["/health", "/json/identity.json", "/info/logs/w1", "/info/call-stacks/w1",
         "/eventstream"]  # fmt: skip


def http_status(ip: str, port: int, path: str = "/health", timeout: float = 5.0) -> str | None:
    """The status line answered to ``GET path`` at ``ip:port``, sent in clear or, failing
    that, over TLS with no client certificate (as any local user could); None: no HTTP
    answer either way."""
    request = f"GET {path} HTTP/1.0\r\nHost: {ip}\r\n\r\n".encode()
    for tls in (False, True):
        try:
            with socket.create_connection((ip, port), timeout=timeout) as raw:
                if tls:
                    ctx = ssl.create_default_context()
                    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
                    with ctx.wrap_socket(raw) as sock:
                        sock.sendall(request)
                        head = sock.recv(256)
                else:
                    raw.sendall(request)
                    head = raw.recv(256)
        except OSError:  # refused, reset, timed out, TLS handshake failed
            continue
        if head.startswith(b"HTTP/"):
            return head.split(b"\r\n")[0].decode()
    return None


def http_served(socks: list[tuple[int, str, int]]) -> dict[tuple[str, int], dict[str, str]]:
    """For every listening socket that answers HTTP (any path gets an answer from an HTTP
    server, so ``/health`` decides): the status line of each of :data:`PATHS`."""
    out = {}
    for _, ip, port in socks:
        if http_status(ip, port) is not None:
            out[ip, port] = {path: http_status(ip, port, path) for path in PATHS}
    return out


CLI_CLUSTER = textwrap.dedent(
    """
    import json, sys, psutil
    from dl1.cli import _client
    if __name__ == "__main__":
        stack, client = _client(None, 2, None, dashboard=sys.argv[1] == "1")
        me = psutil.Process()
        socks = []
        for p in [me, *me.children(recursive=True)]:
            for c in p.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN:
                    socks.append([p.pid, c.laddr.ip, c.laddr.port])
        print(json.dumps({"socks": socks, "link": client.dashboard_link}), flush=True)
        sys.stdin.readline()
        stack.close()
    """
)


@pytest.mark.parametrize("dashboard", [False, True], ids=["no-http", "dashboard"])
def test_cli_local_cluster_listens_on_loopback_only(dashboard):
    """Pass: every listening socket of the cluster the command line starts (scheduler,
    nannies, workers: the CLI's process and all its children) is on a loopback address,
    and there are at least 2 per worker plus the scheduler's (so the check saw the
    cluster). Without ``--dashboard`` none of them answers an HTTP request (in clear or
    TLS; /health, /json/identity.json, /info/logs, /info/call-stacks, /eventstream); with
    it, the scheduler's dashboard port answers /json/identity.json with 200 and so do the
    workers' /health, all on 127.0.0.1."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CLI_CLUSTER, str(int(dashboard))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    watchdog = threading.Timer(180, proc.kill)
    watchdog.start()
    try:
        line = next((line for line in proc.stdout if line.startswith("{")), None)
        assert line is not None, "the CLI's cluster did not start"
        info = json.loads(line)
        socks = [tuple(s) for s in info["socks"]]
        served = http_served(socks)
    finally:
        proc.communicate("\n", timeout=120)
        watchdog.cancel()
    assert len(socks) >= 5, socks  # scheduler + 2 x (nanny + worker)
    assert all(is_loopback(ip) for _, ip, _ in socks), socks
    if not dashboard:
        assert served == {}
        assert not info["link"]
        return
    port = int(info["link"].split(":")[2].split("/")[0])
    assert served[("127.0.0.1", port)]["/json/identity.json"].split()[1] == "200", served
    health = [a["/health"] for a in served.values()]
    assert len(served) == 3 and all(h.split()[1] == "200" for h in health), served


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({}, "127.0.0.1:0"),
        ({"dashboard_address": ":0"}, "127.0.0.1:0"),
        ({"dashboard_address": ":8787"}, "127.0.0.1:8787"),
        ({"dashboard_address": 8787}, "127.0.0.1:8787"),
        ({"dashboard_address": "10.0.0.5:8787"}, "10.0.0.5:8787"),  # the caller's explicit choice
    ],
)
def test_local_cluster_addresses_default_to_loopback(given, expected):
    """Pass: dl1's LocalCluster arguments put the scheduler on 127.0.0.1 and a dashboard
    port given without a host on 127.0.0.1 (Dask binds ":port" on every interface), for
    the scheduler and for the workers."""
    out = loopback_addresses(given)
    assert out["dashboard_address"] == expected
    assert out["host"] == "127.0.0.1"
    worker = {"worker_" + k: v for k, v in given.items()}
    assert loopback_addresses(worker).get("worker_dashboard_address") == (
        expected if given else None
    )


def test_cli_dashboard_is_refused_with_a_running_scheduler():
    """Pass: ``--dashboard`` with ``--scheduler`` is a usage error naming both options
    (the dashboard is that of the LocalCluster dl1 starts), raised before any connection."""
    import click

    from dl1.cli import _client

    with pytest.raises(click.UsageError, match="--dashboard.*--scheduler"):
        _client("tcp://127.0.0.1:9", 2, None, dashboard=True)


def recipe_env(tmp_path: Path, tls_dir: Path | None, dashboard: bool = False) -> dict[str, str]:
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "DL1_SCHEDULER_FILE": str(tmp_path / "scheduler.json"),
    }
    env.pop("DL1_DASHBOARD", None)
    if tls_dir is not None:
        env["DL1_TLS_DIR"] = str(tls_dir)
    if dashboard:
        env["DL1_DASHBOARD"] = "0"
    return env


def wait_for_workers(client, n: int, timeout: float = 60) -> None:
    client.wait_for_workers(n, timeout=timeout)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    """Certificates made by ``cluster/make-certs.sh``."""
    tls_dir = tmp_path_factory.mktemp("exposure") / "certs"
    subprocess.run(["bash", str(REPO / "cluster" / "make-certs.sh"), str(tls_dir)],
                   check=True, timeout=120, capture_output=True)
    return tls_dir


@contextlib.contextmanager
def recipe(tmp_path: Path, tls_dir: Path | None, dashboard: bool = False) -> Iterator[dict]:
    """``cluster/start-local.sh 2`` run in ``tmp_path``; yields the scheduler's identity."""
    env = recipe_env(tmp_path, tls_dir, dashboard)
    subprocess.run(["bash", str(REPO / "cluster" / "start-local.sh"), "2"], cwd=tmp_path,
                   env=env, check=True, timeout=300, capture_output=True)
    try:
        yield json.loads((tmp_path / "scheduler.json").read_text())
    finally:
        subprocess.run(["bash", str(REPO / "cluster" / "stop-local.sh")], cwd=tmp_path,
                       env=env, timeout=60)


def tls_security(tls_dir: Path):
    from distributed.security import Security

    return Security(tls_ca_file=str(tls_dir / "ca.pem"),
                    tls_client_cert=str(tls_dir / "client.pem"),
                    tls_client_key=str(tls_dir / "client.key"),
                    require_encryption=True)


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
def test_recipe_scripts_listen_on_loopback_only(tmp_path, request, tls):
    """Pass: the processes of ``cluster/start-local.sh`` (scheduler, nannies, workers)
    listen on loopback addresses only; with ``DL1_TLS_DIR`` (certificates made by
    ``cluster/make-certs.sh``) the scheduler and workers are on ``tls://`` addresses, a
    client with the client certificate fits there the same model as in-process, and a
    client without certificates is refused. No listening socket answers an HTTP request
    (in clear or TLS; /health, /json/identity.json, /info/logs, /info/call-stacks,
    /eventstream), the port Dask's scheduler opened for HTTP included."""
    from distributed import Client

    tls_dir = request.getfixturevalue("certs") if tls else None
    with recipe(tmp_path, tls_dir) as identity:
        address, http_port = identity["address"], identity["services"]["dashboard"]
        assert address.startswith("tls://" if tls else "tcp://")
        sec = tls_security(tls_dir) if tls else None
        X = random_csr(200, 60, 0.1, seed=3)
        y = X @ np.r_[np.ones(4), np.zeros(56)]
        with Client(address, security=sec, timeout=30) as client:
            wait_for_workers(client, 2)
            workers = list(client.scheduler_info()["workers"])
            assert all(w.startswith("tls://" if tls else "tcp://") for w in workers)
            res = dl1.fit(X, y, alpha=0.01, tol=1e-10, client=client)
        pids = [int(p) for p in (tmp_path / "dl1-cluster.pids").read_text().split()]
        socks = listening(pids)
        assert len(socks) >= 5, socks  # scheduler + 2 x (nanny + worker)
        assert all(is_loopback(ip) for _, ip, _ in socks), socks
        assert http_served(socks) == {}
        assert http_status("127.0.0.1", http_port) is None  # Dask opened it: now closed
        local = dl1.fit(X, y, alpha=0.01, tol=1e-10)
        np.testing.assert_allclose(res.coef_, local.coef_, rtol=0, atol=1e-8)
        if tls:
            with pytest.raises((OSError, TypeError)):  # no certificate: no connection
                Client(address.replace("tls://", "tcp://"), timeout=3)


def test_recipe_serves_http_on_loopback_only_when_asked(tmp_path, certs):
    """Pass: with ``DL1_DASHBOARD=0`` (and TLS), ``cluster/start-local.sh``'s processes
    still listen on loopback addresses only, the scheduler's dashboard port answers
    /json/identity.json with 200 and each worker's HTTP port /health with 200: three HTTP
    servers, all on 127.0.0.1."""
    from distributed import Client

    with recipe(tmp_path, certs, dashboard=True) as identity:
        with Client(identity["address"], security=tls_security(certs), timeout=30) as client:
            wait_for_workers(client, 2)
        pids = [int(p) for p in (tmp_path / "dl1-cluster.pids").read_text().split()]
        socks = listening(pids)
        served = http_served(socks)
    assert all(is_loopback(ip) for _, ip, _ in socks), socks
    ok = served[("127.0.0.1", identity["services"]["dashboard"])]["/json/identity.json"]
    assert ok.split()[1] == "200", served
    assert len(served) == 3, served  # the scheduler's dashboard, each worker's /health
    assert all(a["/health"].split()[1] == "200" for a in served.values()), served


@pytest.mark.parametrize(
    ("address", "warns"),
    [
        ("tcp://192.0.2.7:8786", True),  # TEST-NET-1: another machine, plain TCP
        ("tcp://[2001:db8::1]:8786", True),
        ("tcp://127.0.0.1:8786", False),
        ("tcp://localhost:8786", False),
        ("tcp://[::1]:8786", False),
        ("tls://192.0.2.7:8786", False),
        ("inproc://192.0.2.7/1/1", False),
    ],
)
def test_warns_on_plain_tcp_beyond_loopback(address, warns):
    """Pass: a ``tcp://`` scheduler address on another machine warns with
    :class:`dl1.InsecureClusterWarning` naming the address and TLS, once per address;
    loopback, ``tls://`` and in-process addresses do not warn."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        check_scheduler_address(address)
        check_scheduler_address(address)
    insecure = [w for w in seen if issubclass(w.category, InsecureClusterWarning)]
    assert len(insecure) == (1 if warns else 0)
    if warns:
        assert address in str(insecure[0].message) and "tls://" in str(insecure[0].message)


def test_fit_warns_before_using_a_remote_plain_tcp_scheduler():
    """Pass: ``dl1.fit`` with a client of a plain-TCP scheduler on another machine warns
    before it sends anything to the cluster (the stand-in client refuses every use)."""

    class Refused(Exception):
        pass

    class Client:
        scheduler = types.SimpleNamespace(address="tcp://198.51.100.9:8786")

        def __getattr__(self, name):
            raise Refused(name)

    X = random_csr(30, 10, 0.3, seed=0)
    with pytest.warns(InsecureClusterWarning, match="198.51.100.9"), pytest.raises(Refused):
        dl1.fit(X, np.ones(30), alpha=0.1, client=Client())
