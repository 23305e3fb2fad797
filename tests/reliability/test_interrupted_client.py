"""Interrupted clients leave nothing on the workers: a fit interrupted in a client that goes on
(KeyboardInterrupt in the coordinating thread), and client processes interrupted (SIGINT) or
killed (SIGKILL) mid-fit.

A solve's partition servers (:mod:`dl1.runtime.servers`: a thread and its cached columns on
every worker) are closed by the coordinator when the solve ends or is interrupted, and by
their worker once the scheduler no longer has the client that opened them.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import dask
import pytest

import dl1
from dl1.runtime.servers import CLIENT_CHECK_S
from dl1.runtime.wire import PLUGIN_NAME
from tests.reliability.faults import REPO, nanny_cluster
from tests.test_penalised import as_dask, make_regression

#: Processes killed, frozen or started: the full tier (CI), not the everyday one.
pytestmark = pytest.mark.slow

#: a fit of tens of rounds (as in ``test_worker_faults``), with its servers (not one piece)
FIT = dict(alpha=1e-4, tol=1e-9, n_partitions=2, max_rounds=100_000)

#: a client process fitting until it is stopped; it prints its client id, then "round 1"
#: at the second round of each fit
CLIENT = textwrap.dedent(
    """
    import faulthandler
    import signal
    import sys

    import dask
    from distributed import Client

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test's view of a hang

    import dl1
    from tests.test_penalised import as_dask, make_regression

    client = Client(sys.argv[1])
    print(client.id, flush=True)
    X, y = make_regression(n=2000, p=1500, density=0.01, seed=9)

    def tell(entry):
        if entry["round"] == 1:
            print("round 1", flush=True)

    with dask.config.set({"dl1.one-piece": False}):
        while True:
            dl1.fit(as_dask(X, 4), y, client=client, callback=tell, **eval(sys.argv[2]))
    """
)


def _held(dask_worker=None) -> dict:
    """The clients of a worker's partition servers, the threads serving them, and its
    resident memory (after a collection)."""
    import threading

    import psutil

    gc.collect()
    plugin = dask_worker.plugins.get(PLUGIN_NAME)
    servers = [] if plugin is None else [s.client for s in plugin.servers.values()]
    names = [t.name for t in threading.enumerate()]
    return {
        "servers": servers,
        "server_threads": sum(n.startswith("dl1-server") for n in names),
        "threads": len(names),
        "rss": psutil.Process().memory_info().rss,
    }


def _wait_for(client, done, timeout: float) -> dict:
    """The workers' :func:`_held` once ``done`` of it holds on all, or after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    held = client.run(_held)
    while not all(done(h) for h in held.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
        held = client.run(_held)
    return held


class Stop(KeyboardInterrupt):
    """The interrupt a user's Ctrl-C raises in the coordinating thread."""


@pytest.mark.parametrize("entry", ["fit", "path"])
def test_keyboard_interrupt_in_a_surviving_client_closes_its_servers(local_cluster, entry):
    """A fit (at its round 2) or a path (at its alpha 2) interrupted by KeyboardInterrupt
    raised in the coordinating thread, whose client stays connected.

    Pass: the interrupt reaches the caller, and when it does no worker holds a partition
    server of this client (the coordinator closed them; its worker would not, the client
    being connected); the next fit on the cluster is certified.
    """
    X, y = make_regression(n=2000, p=1500, density=0.01, seed=5)

    def stop_at_round_2(e):
        if e["round"] == 2:
            raise Stop

    def stop_at_alpha_2(k, alpha, res):
        if k == 2:
            raise Stop

    with dask.config.set({"dl1.one-piece": False}), pytest.raises(Stop):
        if entry == "fit":
            dl1.fit(as_dask(X, 4), y, client=local_cluster, callback=stop_at_round_2, **FIT)
        else:
            dl1.path(as_dask(X, 4), y, client=local_cluster, n_alphas=6, tol=1e-8,
                     callback=stop_at_alpha_2)  # fmt: skip
    held = local_cluster.run(_held)
    assert all(local_cluster.id not in h["servers"] for h in held.values()), held
    with dask.config.set({"dl1.one-piece": False}):
        res = dl1.fit(as_dask(X, 4), y, client=local_cluster, alpha=1e-3)
    assert res.converged_


def _client_process(address: str, stderr: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    with stderr.open("w") as err:
        return subprocess.Popen(
            [sys.executable, "-c", CLIENT, address, repr(FIT)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )


def _wait_or_show_stacks(p: subprocess.Popen, stderr: Path, timeout: float) -> None:
    """Wait for ``p``; if it outlives ``timeout``, fail with its threads' stacks (its
    faulthandler, on SIGUSR1) and what it wrote to stderr."""
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGUSR1)
        time.sleep(2.0)
        pytest.fail(f"client process {p.pid} still running {timeout} s after its signal; "
                    f"its stderr and stacks:\n{stderr.read_text()[-20000:]}")  # fmt: skip


def test_interrupted_client_processes_leave_nothing_on_the_workers(tmp_path):
    """Five client processes on a two-worker cluster, each fitting in a loop, interrupted
    once a fit of theirs reaches round 1 (servers started, columns cached): three by SIGINT
    (Ctrl-C), two by SIGKILL (no cleanup at all). Before: each left a server (a thread and
    its cached columns) on every worker, for ever.

    Pass: within ``CLIENT_CHECK_S`` + 15 s of the last interrupt, no worker holds a
    partition server or a server thread; each worker's thread count is at most its count
    after one warm-up fit (plus 2: Dask's thread pools grow on demand) and its resident
    memory at most 10% above it.
    """
    X, y = make_regression(n=2000, p=1500, density=0.01, seed=9)
    with nanny_cluster(2) as (cluster, client):
        with dask.config.set({"dl1.one-piece": False}):
            dl1.fit(as_dask(X, 4), y, client=client, alpha=1e-3)  # warm: kernels loaded
        before = _wait_for(client, lambda h: not h["servers"], 10)
        errs = [tmp_path / f"client{i}.err" for i in range(5)]
        procs = [_client_process(cluster.scheduler_address, e) for e in errs]
        try:
            ids = [p.stdout.readline().strip() for p in procs]
            for p in procs:  # each past round 1 of a fit: servers and caches on both workers
                assert p.stdout.readline().strip() == "round 1"
            during = client.run(_held)  # (a client may be between two fits)
            assert all(set(ids) & set(h["servers"]) for h in during.values()), during
            for i, p in enumerate(procs):
                p.send_signal(signal.SIGINT if i < 3 else signal.SIGKILL)
            for p, e in zip(procs, errs, strict=True):
                _wait_or_show_stacks(p, e, 60)
        finally:
            for p in procs:
                p.kill()
                p.wait()
        after = _wait_for(
            client, lambda h: not h["servers"] and not h["server_threads"], CLIENT_CHECK_S + 15
        )
    for w, h in after.items():
        assert h["servers"] == [] and h["server_threads"] == 0, (w, h)
        assert h["threads"] <= before[w]["threads"] + 2, (w, before[w], h)
        assert h["rss"] <= 1.10 * before[w]["rss"], (w, before[w]["rss"] >> 20, h["rss"] >> 20)
