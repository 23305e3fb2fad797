"""Exposure: the clusters dl1 starts listen on 127.0.0.1 only, and dl1 warns before it
works on a plain-TCP scheduler on another machine.

Sockets are read from the processes themselves (psutil), not from the arguments passed.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import textwrap
import types
import warnings
from pathlib import Path

import numpy as np
import psutil
import pytest

import dl1
from dl1.runtime.exposure import InsecureClusterWarning, check_scheduler_address
from dl1.runtime.localcluster import loopback_addresses
from tests.helpers import random_csr

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


def test_cli_local_cluster_listens_on_loopback_only():
    """Pass: every listening socket of the cluster the command line starts (scheduler,
    dashboard, nannies, workers: the CLI's process and all its children) is on a loopback
    address, and there are at least 2 per worker plus the scheduler's (so the check saw
    the cluster)."""
    code = textwrap.dedent(
        """
        import json, psutil
        from dl1.cli import _client
        if __name__ == "__main__":
            stack, client = _client(None, 2, None)
            me = psutil.Process()
            socks = []
            for p in [me, *me.children(recursive=True)]:
                for c in p.net_connections(kind="inet"):
                    if c.status == psutil.CONN_LISTEN:
                        socks.append([p.pid, c.laddr.ip, c.laddr.port])
            print(json.dumps(socks))
            stack.close()
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, check=True
    )
    socks = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(socks) >= 6, socks  # scheduler + dashboard + 2 x (nanny + worker)
    assert all(is_loopback(ip) for _, ip, _ in socks), socks


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
    port given without a host on 127.0.0.1 (Dask binds ":port" on every interface)."""
    out = loopback_addresses(given)
    assert out["dashboard_address"] == expected
    assert out["host"] == "127.0.0.1"


def recipe_env(tmp_path: Path, tls_dir: Path | None) -> dict[str, str]:
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "DL1_SCHEDULER_FILE": str(tmp_path / "scheduler.json"),
    }
    if tls_dir is not None:
        env["DL1_TLS_DIR"] = str(tls_dir)
    return env


def wait_for_workers(client, n: int, timeout: float = 60) -> None:
    client.wait_for_workers(n, timeout=timeout)


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
def test_recipe_scripts_listen_on_loopback_only(tmp_path, tls):
    """Pass: the processes of ``cluster/start-local.sh`` (scheduler, nannies, workers)
    listen on loopback addresses only; with ``DL1_TLS_DIR`` (certificates made by
    ``cluster/make-certs.sh``) the scheduler and workers are on ``tls://`` addresses, a
    client with the client certificate fits there the same model as in-process, and a
    client without certificates is refused."""
    from distributed import Client
    from distributed.security import Security

    tls_dir = None
    if tls:
        tls_dir = tmp_path / "certs"
        subprocess.run(["bash", str(REPO / "cluster" / "make-certs.sh"), str(tls_dir)],
                       check=True, timeout=120, capture_output=True)
    env = recipe_env(tmp_path, tls_dir)
    subprocess.run(["bash", str(REPO / "cluster" / "start-local.sh"), "2"], cwd=tmp_path,
                   env=env, check=True, timeout=300, capture_output=True)
    try:
        address = json.loads((tmp_path / "scheduler.json").read_text())["address"]
        assert address.startswith("tls://" if tls else "tcp://")
        sec = None
        if tls:
            sec = Security(tls_ca_file=str(tls_dir / "ca.pem"),
                           tls_client_cert=str(tls_dir / "client.pem"),
                           tls_client_key=str(tls_dir / "client.key"),
                           require_encryption=True)
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
        local = dl1.fit(X, y, alpha=0.01, tol=1e-10)
        np.testing.assert_allclose(res.coef_, local.coef_, rtol=0, atol=1e-8)
        if tls:
            with pytest.raises((OSError, TypeError)):  # no certificate: no connection
                Client(address.replace("tls://", "tcp://"), timeout=3)
    finally:
        subprocess.run(["bash", str(REPO / "cluster" / "stop-local.sh")], cwd=tmp_path,
                       env=env, timeout=60)


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
