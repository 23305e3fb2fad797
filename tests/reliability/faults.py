"""Helpers of the runtime's reliability tests: real clusters, killed processes, timings."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]

#: Seconds Dask may take to recover from a SIGKILLed worker: notice the loss and recompute
#: its blocks on the workers left while its nanny starts a new process, whose imports and
#: kernel loading compete for the same cores. Well under a second on a quiet machine; up to
#: 15 s beyond twice the undisturbed run with four busy processes on two cores (a loaded CI
#: machine).
RECOVERY_S = 25.0
#: Dask's connect timeout in the kill tests (``slow_connect``): a call that waits out a dead
#: worker stalls this long, beyond twice an undisturbed run plus ``RECOVERY_S``.
CONNECT_TIMEOUT_S = 60


@contextlib.contextmanager
def nanny_cluster(n_workers: int, **kwargs: Any) -> Iterator[tuple[Any, Any]]:
    """A LocalCluster of ``n_workers`` single-threaded worker processes under nannies (a
    killed worker is restarted), and its client."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=n_workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            **kwargs,
        ) as cluster,
        Client(cluster) as client,
    ):
        yield cluster, client


def worker_pids(client: Any) -> dict[str, int]:
    """The pid of every worker process, by address."""
    return client.run(os.getpid)


def kill_when(event: threading.Event, pid: int, delay: float = 0.0) -> threading.Thread:
    """A started thread that SIGKILLs ``pid`` once ``event`` is set (after ``delay`` s)."""

    def kill() -> None:
        if event.wait(timeout=300):
            time.sleep(delay)
            os.kill(pid, signal.SIGKILL)

    t = threading.Thread(target=kill, daemon=True)
    t.start()
    return t


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """``fn()`` and the seconds it took."""
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def assert_same_path(got: Any, ref: Any) -> None:
    """Two paths with the same coefficients, intercepts and gaps, bit for bit."""
    assert (got.coefs_ != ref.coefs_).nnz == 0
    np.testing.assert_array_equal(got.intercepts_, ref.intercepts_)
    np.testing.assert_array_equal(got.gaps_, ref.gaps_)


@contextlib.contextmanager
def process_cluster(tmp: Path, n_workers: int) -> Iterator[tuple[subprocess.Popen, list]]:
    """A ``dask scheduler`` process and ``n_workers`` ``dask worker --no-nanny`` processes on
    127.0.0.1 (nothing restarts them), as the deployment recipe starts them; yields the
    processes once the workers are connected; all are killed on exit."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "DASK_DISTRIBUTED__SCHEDULER__WORK_STEALING": "False",
    }
    file = tmp / "scheduler.json"
    logs = open(tmp / "cluster.log", "w")  # noqa: SIM115 (closed below)
    procs: list[subprocess.Popen] = []
    try:
        cmd = [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1"]
        procs.append(
            subprocess.Popen(
                [*cmd, "--port", "0", "--no-dashboard", "--scheduler-file", str(file)],
                env=env,
                stdout=logs,
                stderr=logs,
            )
        )
        deadline = time.monotonic() + 60
        while not (file.exists() and file.read_text()):
            assert time.monotonic() < deadline, "the scheduler did not start"
            time.sleep(0.1)
        json.loads(file.read_text())
        for _ in range(n_workers):
            worker = [sys.executable, "-m", "distributed.cli.dask_worker", "--no-nanny"]
            procs.append(
                subprocess.Popen(
                    [*worker, "--scheduler-file", str(file), "--nthreads", "1", "--no-dashboard"],
                    env=env,
                    stdout=logs,
                    stderr=logs,
                )
            )
        yield procs[0], procs[1:]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(timeout=30)
        logs.close()


def scheduler_address(tmp: Path) -> str:
    """The address :func:`process_cluster`'s scheduler wrote."""
    return json.loads((tmp / "scheduler.json").read_text())["address"]
