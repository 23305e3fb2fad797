"""Connecting by scheduler file: how a job reaches a cluster started elsewhere.

python examples/scheduler_file.py [WORK_DIR]

Starts ``dask scheduler --scheduler-file`` and one ``dask worker`` on 127.0.0.1 (as a batch
job or cluster/start-local.sh would), connects with ``Client(scheduler_file=...)``, fits a
certified Lasso on a small store, and shuts the cluster down cleanly: the worker first,
while the scheduler still runs, then the scheduler (no CommClosedError in their logs).
The command line does the same with ``dl1 fit STORE --scheduler-file FILE``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from distributed import Client

import dl1

#: Seconds to wait for the scheduler file, the worker, and each process to exit.
TIMEOUT = 120.0


def spawn(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    """``python -m *args`` with its stderr (Dask's log) in the file ``log``."""
    with open(log, "wb") as fh:
        return subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.DEVNULL,
                                stderr=fh, env=env)  # fmt: skip


def start(work: Path) -> tuple[subprocess.Popen, subprocess.Popen, Path]:
    """A scheduler and a worker on 127.0.0.1, their logs in ``work``."""
    file = work / "scheduler.json"
    no_http = ["--no-dashboard", "--dashboard-address", "127.0.0.1:0",
               "--preload", "dl1.runtime.nohttp"]  # fmt: skip
    env = {**os.environ, "DASK_DISTRIBUTED__SCHEDULER__WORK_STEALING": "False"}
    scheduler = spawn(
        ["distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
         "--scheduler-file", str(file), *no_http],
        work / "scheduler.log", env,
    )  # fmt: skip
    deadline = time.monotonic() + TIMEOUT
    while not (file.exists() and file.stat().st_size) and time.monotonic() < deadline:
        time.sleep(0.1)
    if not file.exists():
        scheduler.kill()
        raise RuntimeError(f"the scheduler wrote no {file}; see {work / 'scheduler.log'}")
    worker = spawn(
        ["distributed.cli.dask_worker", "--scheduler-file", str(file), "--host", "127.0.0.1",
         "--nthreads", "1", "--preload", "dl1.runtime.worker", *no_http],
        work / "worker.log", {**env, "MALLOC_MMAP_THRESHOLD_": "65536"},
    )  # fmt: skip
    return scheduler, worker, file


def stop(process: subprocess.Popen) -> None:
    """SIGTERM, then wait (bounded), then SIGKILL."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def main(work: Path) -> float:
    rng = np.random.default_rng(0)
    X = sp.random(400, 60, density=0.1, format="csr", random_state=rng)
    y = X @ np.r_[np.ones(5), np.zeros(55)] + 0.01 * rng.standard_normal(400)
    store = dl1.from_scipy(X, y, work / "data.zarr", n_feature_blocks=2)
    scheduler, worker, file = start(work)
    try:
        with Client(scheduler_file=str(file), timeout=TIMEOUT) as client:
            client.wait_for_workers(1, timeout=TIMEOUT)
            amax = dl1.alpha_max(store, client=client)
            res = dl1.fit(store, alpha=amax / 10, tol=1e-6, client=client)
        print(f"fit by scheduler file: nnz {np.count_nonzero(res.coef_)}, relative gap "
              f"{res.gap_:.1e} (certified: {res.converged_})")  # fmt: skip
    finally:
        stop(worker)  # first, while the scheduler runs: the worker says goodbye
        stop(scheduler)
    return res.gap_


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:  # used when no folder is given
        main(Path(sys.argv[1] if len(sys.argv) > 1 else tmp))
