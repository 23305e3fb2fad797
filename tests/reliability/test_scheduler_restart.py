"""The scheduler restarted mid-path (killed, and a new one started on the same address, as a
service manager would): a named error, and the checkpoint resumes.

The client reconnects to the new scheduler, which knows none of its futures: Dask cancels
them ("scheduler-connection-lost", then "lost dependencies" for tasks sent on them).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import dask
import pytest

import dl1
from dl1.errors import ClusterStalledError
from dl1.runtime.watchdog import STALL_TIMEOUT_KEY
from tests.reliability.faults import REPO, assert_same_path, process_cluster, scheduler_address

#: Processes killed, frozen or started: the full tier (CI), not the everyday one.
pytestmark = pytest.mark.slow

PATH = dict(n_alphas=6, tol=1e-8)
#: the stall timeout of the test (the default is 60 s)
STALL_S = 10.0
#: seconds the error may take once the new scheduler listens (the client's reconnection,
#: direct calls to the lost workers failing over to tasks), on a loaded machine
SLACK_S = 30.0
#: seconds a new scheduler process may take to listen (imports, on a loaded machine), and
#: the client's reconnection window (its ``timeout``)
START_S = 60.0


def start_scheduler(address: str, log) -> subprocess.Popen:
    """A ``dask scheduler`` process on ``address`` (host:port of a killed one), once it
    accepts connections."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", host]
    proc = subprocess.Popen(
        [*cmd, "--port", port, "--no-dashboard"], env=env, stdout=log, stderr=log
    )
    deadline = time.monotonic() + START_S
    while True:
        assert proc.poll() is None, "the new scheduler exited"
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return proc
        except OSError:
            assert time.monotonic() < deadline, "the new scheduler did not listen"
            time.sleep(0.1)


def test_a_scheduler_restarted_mid_path_is_a_named_error_and_the_checkpoint_resumes(
    tmp_path, store, local_cluster
):
    """SIGKILL the ``dask scheduler`` process after alpha 2 of a checkpointed path and start
    a new one on the same address at once (the path goes on once it listens; its workers,
    without nannies, are gone with the old one). Before: Dask's raw ``FutureCancelledError
    ... lost dependencies``.

    Pass: ClusterStalledError naming the scheduler (its address) and the restart within
    ``SLACK_S`` (30 s) of the new scheduler's start; resuming the checkpoint on a healthy
    cluster gives the uninterrupted path, bit for bit.
    """
    from distributed import Client

    ref = dl1.path(store, client=local_cluster, checkpoint=tmp_path / "ref", **PATH)
    ck = tmp_path / "ck"
    restarted_at: list[float] = []
    new: list[subprocess.Popen] = []
    with open(tmp_path / "new-scheduler.log", "w") as log:
        try:
            with process_cluster(tmp_path, 2) as (scheduler, workers):
                address = scheduler_address(tmp_path)
                with Client(address, timeout=START_S) as client:
                    client.wait_for_workers(2, timeout=60)

                    def restart_at_alpha_2(k, alpha, res):
                        if k == 2:
                            scheduler.send_signal(signal.SIGKILL)
                            scheduler.wait(timeout=30)
                            new.append(start_scheduler(address, log))
                            restarted_at.append(time.monotonic())

                    with dask.config.set({STALL_TIMEOUT_KEY: STALL_S}):
                        with pytest.raises(ClusterStalledError) as err:
                            dl1.path(
                                store,
                                client=client,
                                checkpoint=ck,
                                callback=restart_at_alpha_2,
                                **PATH,
                            )
                    assert restarted_at, f"the error came before the restart: {err.value}"
                    seconds = time.monotonic() - restarted_at[0]
        finally:
            for p in new:
                p.kill()
                p.wait(timeout=30)
    message = str(err.value)
    assert "scheduler" in message and address in message and "restarted" in message, message
    assert "checkpoint" in message
    assert seconds < SLACK_S, (seconds, message)
    resumed = dl1.path(store, client=local_cluster, checkpoint=ck, **PATH)
    assert_same_path(resumed, ref)
