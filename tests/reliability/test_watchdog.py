"""The coordinator's watchdog (dl1.runtime.watchdog): a stalled cluster is an error, a busy
one is not."""

from __future__ import annotations

import time

import dask
import pytest

import dl1
from dl1.datasets import make_e2006_like
from dl1.errors import ClusterStalledError
from dl1.runtime.executor import DistributedExecutor
from dl1.runtime.rpc import RpcExecutor
from dl1.timeouts import DEFAULT_STALL_TIMEOUT, STALL_TIMEOUT_KEY, stall_timeout
from tests.reliability.faults import assert_same_path, nanny_cluster

#: Processes killed, frozen or started: the full tier (CI), not the everyday one.
pytestmark = pytest.mark.slow

#: the stall timeout of these tests (the default is 60 s)
STALL_S = 3.0
#: seconds an error may take beyond the stall timeout: polls of 1 s, the scheduler's
#: answers (milliseconds), a wait that ended just before the stall began
SLACK_S = 10.0


def test_the_stall_timeout_comes_from_dask_config():
    """Pass: the documented default when unset; ``dl1.stall-timeout`` read as seconds or
    as a Dask duration string; a value that is not a positive duration is refused, naming
    the key."""
    assert stall_timeout() == DEFAULT_STALL_TIMEOUT
    with dask.config.set({STALL_TIMEOUT_KEY: "2 minutes"}):
        assert stall_timeout() == 120.0
    with dask.config.set({STALL_TIMEOUT_KEY: 7}):
        assert stall_timeout() == 7.0
    for bad in (0, -1, "soon"):
        with dask.config.set({STALL_TIMEOUT_KEY: bad}):
            with pytest.raises(ValueError, match=STALL_TIMEOUT_KEY):
                stall_timeout()


def _slow(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_long_tasks_and_calls_on_a_healthy_cluster_are_not_stalls(local_cluster):
    """A task and a direct call to the partition servers that each run for longer than
    the stall timeout (1 s here), on a healthy cluster.

    Pass: both return their result, no ClusterStalledError (a worker executing a task, or
    serving a call while listed by the scheduler, is progress), and the call does not fall
    back to tasks.
    """
    with dask.config.set({STALL_TIMEOUT_KEY: 1}):
        ex = DistributedExecutor(local_cluster)
        assert ex.gather([ex.submit(_slow, 3.5)]) == [3.5]
        rx = RpcExecutor(ex)
        rx.broadcast(_slow, 3.5)  # one call per server, each 3.5 s
        assert not rx.broken
        rx.close()


def _hog(fraction: float, dask_worker=None) -> int:
    """Hold touched memory (which Dask cannot spill) until the worker's resident memory is
    ``fraction`` of its limit; the bytes held."""
    import numpy as np
    import psutil

    target = fraction * dask_worker.memory_manager.memory_limit
    nbytes = max(int(target - psutil.Process().memory_info().rss), 0)
    dask_worker.dl1_test_hog = np.ones(nbytes // 8)
    return nbytes


def _free(dask_worker=None) -> None:
    dask_worker.dl1_test_hog = None


def _statuses(client) -> set[str]:
    return {w["status"] for w in client.scheduler_info()["workers"].values()}


def test_workers_paused_for_memory_stall_the_path_and_its_checkpoint_resumes(tmp_path):
    """A streamed path (every step a task) with a checkpoint on two workers of 600 MiB;
    after alpha 3 each worker's memory is filled past Dask's pause threshold (80%) by
    memory Dask cannot spill, so the workers pause and run no task.

    Pass: ClusterStalledError within ``STALL_S`` (the stall timeout set) + ``SLACK_S`` of
    the pause (Dask alone waits for ever), naming the paused workers and their memory;
    once the memory is freed the workers resume and the checkpoint, resumed on the same
    cluster, gives the uninterrupted path bit for bit (computed first on the same cluster:
    the workers' memory limit sets the column budget, hence the working sets, so a
    cluster of other limits may take another certified trajectory).
    """
    store = tmp_path / "small.zarr"
    make_e2006_like(store, preset="small", seed=5)
    kw = dict(n_alphas=8, tol=1e-8, stream=True)
    limit = 600 * 2**20
    ck = tmp_path / "ck"
    paused_at: list[float] = []
    with nanny_cluster(2, memory_limit=limit) as (_, client):
        ref = dl1.path(store, client=client, checkpoint=tmp_path / "ref", **kw)

        def pause_workers(k, alpha, res):
            if k == 3:
                # between Dask's pause (80%) and terminate (95%) thresholds
                client.run(_hog, 0.88)
                deadline = time.monotonic() + 30
                while _statuses(client) != {"paused"}:
                    assert time.monotonic() < deadline, "the workers did not pause"
                    time.sleep(0.1)
                paused_at.append(time.monotonic())

        with dask.config.set({STALL_TIMEOUT_KEY: STALL_S}):
            with pytest.raises(ClusterStalledError) as err:
                dl1.path(store, client=client, checkpoint=ck, callback=pause_workers, **kw)
        seconds = time.monotonic() - paused_at[0]
        message = str(err.value)
        assert "paused for memory" in message and "MiB" in message, message
        assert isinstance(err.value, dl1.errors.WorkerMemoryError)  # also a memory error
        assert "checkpoint" in message
        assert seconds < STALL_S + SLACK_S, seconds
        client.run(_free)
        deadline = time.monotonic() + 30
        while _statuses(client) != {"running"}:
            assert time.monotonic() < deadline, "the workers did not resume"
            time.sleep(0.1)
        resumed = dl1.path(store, client=client, checkpoint=ck, **kw)
    assert_same_path(resumed, ref)


def _sleep_through_cancel(seconds: float) -> float:
    time.sleep(seconds)  # a thread Dask cannot stop: cancelling the task leaves it running
    return seconds


def test_a_stall_behind_a_cancelled_task_names_the_busy_worker():
    """A single-threaded worker still running a task its client cancelled (as a one-piece
    solve whose caller went away does until its next epoch), and a new call that waits
    for that thread.

    Pass: ClusterStalledError within the stall timeout plus slack, naming the worker as
    busy with a cancelled task, not as idle.
    """
    with nanny_cluster(1) as (_, client), dask.config.set({STALL_TIMEOUT_KEY: STALL_S}):
        (addr,) = client.scheduler_info()["workers"]
        fut = client.submit(_sleep_through_cancel, 60.0, pure=False)
        t0 = time.monotonic()
        while not client.processing()[addr] and time.monotonic() - t0 < 30:
            time.sleep(0.05)
        fut.cancel()
        t0 = time.monotonic()
        with pytest.raises(ClusterStalledError) as err:
            ex = DistributedExecutor(client)
            ex.gather([ex.submit(_slow, 0.1)])
        assert time.monotonic() - t0 <= STALL_S + SLACK_S
        message = str(err.value)
        assert f"{addr} running at" in message and "1 cancelled task(s) running" in message
        assert "idle" not in message


def test_a_quiet_worker_is_described_with_its_heartbeats_age():
    """Pass: a worker not heard from for longer than four heartbeat intervals (at least
    2 s) gets its heartbeat's age in a stall message; one heard from recently nothing."""
    from dl1.runtime.watchdog import quiet_for

    assert quiet_for(5.2, 2) == ", no heartbeat for 5 s"
    assert quiet_for(1.5, 2) == ""
    assert quiet_for(3.0, 500) == ""  # 500 workers: a heartbeat every few seconds
