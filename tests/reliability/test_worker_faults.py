"""Lost processes: workers SIGKILLed, killed at random by Dask's chaos plugin, all workers
or the scheduler lost, and a path resumed on another number of workers.

Every cluster here is real (worker processes under nannies, or ``dask scheduler`` and
``dask worker`` processes); kills are SIGKILLs of their pids or ``distributed.chaos``.
"""

from __future__ import annotations

import os
import signal
import time

import dask
import numpy as np
import pytest
from distributed import get_task_stream

import dl1
from dl1.errors import ClusterStalledError
from tests.helpers import stop_path_after
from tests.reliability.faults import (
    CONNECT_TIMEOUT_S,
    RECOVERY_S,
    assert_same_path,
    nanny_cluster,
    process_cluster,
    scheduler_address,
    timed,
    worker_pids,
)
from tests.test_penalised import as_dask, make_regression

#: Processes killed, frozen or started: the full tier (CI), not the everyday one.
pytestmark = pytest.mark.slow

#: the fit of ``tests/test_penalised.py``'s kill test: long enough (tens of rounds) that a
#: worker killed at round 3 is lost mid-fit
FIT = dict(alpha=1e-4, tol=1e-9, n_partitions=2, max_rounds=100_000)
PATH = dict(n_alphas=10, tol=1e-8)
#: the stall timeout of the tests that lose the whole cluster (the default is 60 s)
STALL_S = 3.0


@pytest.fixture(scope="module")
def fit_data():
    return make_regression(n=3000, p=4000, density=0.01, seed=9)


@pytest.fixture
def slow_connect():
    """Dask's connect timeout at ``CONNECT_TIMEOUT_S``: a stall on a dead worker shows."""
    with dask.config.set({"distributed.comm.timeouts.connect": f"{CONNECT_TIMEOUT_S}s"}):
        yield


@pytest.mark.parametrize("n_workers", [2, 3])
@pytest.mark.usefixtures("slow_connect")
def test_sigkill_one_worker_mid_fit_and_mid_path(n_workers, store, fit_data):
    """SIGKILL one of ``n_workers`` worker processes at round 3 of a fit and after alpha 3
    of a path (on a nanny LocalCluster, so it comes back).

    Pass: the fit's coefficients and intercept and the path's coefficients, intercepts and
    gaps equal those of the undisturbed runs on the same cluster, bit for bit (a lost
    block is recomputed from its task, and direct calls fall back to the same task
    functions); each disturbed run takes at most twice the undisturbed one plus
    ``RECOVERY_S`` (Dask's recovery: noticing the loss and recomputing the lost blocks),
    which a stall waited out on the dead worker (Dask's connect timeout, 60 s here) fails.
    """
    X, y = fit_data
    with nanny_cluster(n_workers) as (_, client):
        dl1.fit(as_dask(X, 4), y, client=client, **FIT)  # warm: kernels loaded, timings fair
        ref_fit, t_fit = timed(lambda: dl1.fit(as_dask(X, 4), y, client=client, **FIT))
        with dask.config.set({"dl1.one-piece": False}):  # the path's own tasks are lost
            ref_path, t_path = timed(lambda: dl1.path(store, client=client, **PATH))
        assert ref_fit.n_rounds_ > 3

        def kill_at_round_3(entry):
            if entry["round"] == 3:
                os.kill(next(iter(worker_pids(client).values())), signal.SIGKILL)

        def kill_at_alpha_3(k, alpha, res):
            if k == 3:
                os.kill(list(worker_pids(client).values())[-1], signal.SIGKILL)

        got_fit, s_fit = timed(
            lambda: dl1.fit(as_dask(X, 4), y, client=client, callback=kill_at_round_3, **FIT)
        )
        # the killed worker's replacement joins first: the path loses one of n_workers, not
        # the only one left while its nanny is still starting the other
        client.wait_for_workers(n_workers, timeout=120)
        with dask.config.set({"dl1.one-piece": False}):
            got_path, s_path = timed(
                lambda: dl1.path(store, client=client, callback=kill_at_alpha_3, **PATH)
            )
    np.testing.assert_array_equal(got_fit.coef_, ref_fit.coef_)
    assert got_fit.intercept_ == ref_fit.intercept_
    assert got_fit.history_[-1]["transport"] == "tasks"  # a call failed: the kill was felt
    assert_same_path(got_path, ref_path)
    assert s_fit < 2 * t_fit + RECOVERY_S, (s_fit, t_fit)
    assert s_path < 2 * t_path + RECOVERY_S, (s_path, t_path)


@pytest.mark.usefixtures("slow_connect")
def test_all_workers_killed_mid_fit_and_restarted_by_their_nannies(fit_data):
    """SIGKILL both workers at round 3 of a fit; their nannies start new ones.

    Before, the fit waited for ever: the tasks placed on the lost workers (loose
    restrictions) went to Dask's no-worker state, which Dask does not leave for a worker
    that joins later. Pass: the fit's coefficients and intercept equal the undisturbed
    ones, bit for bit, within twice the undisturbed time plus ``RECOVERY_S`` plus 15 s
    (two new worker processes starting and importing Dask and dl1 on two cores).
    """
    X, y = fit_data
    with nanny_cluster(2) as (_, client):
        dl1.fit(as_dask(X, 4), y, client=client, **FIT)
        ref, t_ref = timed(lambda: dl1.fit(as_dask(X, 4), y, client=client, **FIT))

        def kill_both_at_round_3(entry):
            if entry["round"] == 3:
                for pid in worker_pids(client).values():
                    os.kill(pid, signal.SIGKILL)

        got, seconds = timed(
            lambda: dl1.fit(as_dask(X, 4), y, client=client, callback=kill_both_at_round_3, **FIT)
        )
    np.testing.assert_array_equal(got.coef_, ref.coef_)
    assert got.intercept_ == ref.intercept_
    assert seconds < 2 * t_ref + RECOVERY_S + 15, (seconds, t_ref)


async def _add_chaos(delay: str, mode: str, dask_worker=None) -> None:
    """Give this worker alone Dask's KillWorker plugin (``client.run`` of it)."""
    from distributed.chaos import KillWorker

    await dask_worker.plugin_add(KillWorker(delay=delay, mode=mode), name="dl1-test-chaos")


@pytest.mark.parametrize("mode", ["sys.exit", "graceful"])
def test_a_path_under_dask_chaos_kill_worker(mode, store):
    """A 20-alpha path on three workers while ``distributed.chaos.KillWorker`` kills
    workers after exponentially distributed lifetimes (mean 5 s), in its ``mode``:

    - ``graceful`` (the worker closes; its nanny starts a new one, which gets the plugin
      again from the scheduler: kills go on for the whole path);
    - ``sys.exit`` (the process exits; Dask's nanny does not replace it): two of the three
      workers get the plugin, so the path has a worker left.

    At alpha 5 the coordinator waits (at most 30 s) until a worker has been lost, so at
    least one kill falls mid-path. Pass: the path equals the undisturbed one on the same
    cluster, bit for bit.
    """
    from distributed.chaos import KillWorker

    kw = dict(n_alphas=20, tol=1e-8)
    with nanny_cluster(3) as (_, client):
        ref = dl1.path(store, client=client, **kw)
        start = set(client.scheduler_info()["workers"])

        def after_a_kill(k, alpha, res):
            deadline = time.monotonic() + 30
            while k == 5 and set(client.scheduler_info()["workers"]) == start:
                assert time.monotonic() < deadline, "KillWorker killed no worker in 30 s"
                time.sleep(0.1)

        if mode == "graceful":
            client.register_plugin(KillWorker(delay="5 s", mode=mode), name="dl1-test-chaos")
        else:
            client.run(_add_chaos, "5 s", mode, workers=sorted(start)[:2])
        with dask.config.set({"dl1.one-piece": False}):  # kills fall among its tasks
            got = dl1.path(store, client=client, callback=after_a_kill, **kw)
    assert_same_path(got, ref)


def _kill_and_resume(tmp_path, store, local_cluster, kill) -> tuple[float, str]:
    """Start a checkpointed path on a process cluster, ``kill(scheduler, workers)`` after
    alpha 3; return the seconds from the kill to the error (which must be
    ClusterStalledError), after checking that resuming on ``local_cluster`` gives the
    uninterrupted path."""
    from distributed import Client

    ref = dl1.path(store, client=local_cluster, checkpoint=tmp_path / "ref", **PATH)
    ck = tmp_path / "ck"
    killed_at: list[float] = []
    with process_cluster(tmp_path, 2) as (scheduler, workers):
        with Client(scheduler_address(tmp_path), timeout=30) as client:
            client.wait_for_workers(2, timeout=60)

            def kill_at_alpha_3(k, alpha, res):
                if k == 3:
                    kill(scheduler, workers)
                    killed_at.append(time.monotonic())

            with dask.config.set({"dl1.stall-timeout": STALL_S}):
                with pytest.raises(ClusterStalledError) as err:
                    dl1.path(store, client=client, checkpoint=ck, callback=kill_at_alpha_3, **PATH)
            seconds = time.monotonic() - killed_at[0]
    assert "checkpoint" in str(err.value)
    resumed = dl1.path(store, client=local_cluster, checkpoint=ck, **PATH)
    assert_same_path(resumed, ref)
    return seconds, str(err.value)


def test_all_workers_lost_is_an_error_and_the_checkpoint_resumes(tmp_path, store, local_cluster):
    """SIGKILL both ``dask worker --no-nanny`` processes after alpha 3 of a checkpointed
    path (nothing restarts them).

    Pass: ClusterStalledError naming the lost workers within ``STALL_S`` (the stall
    timeout set for the test) plus 10 s (polls of 1 s, the scheduler's answers, and a
    direct call's fallback to tasks before the wait that stalls), instead of waiting for
    ever; resuming the checkpoint on a healthy cluster gives the uninterrupted path, bit
    for bit.
    """

    def kill_workers(scheduler, workers):
        for w in workers:
            w.send_signal(signal.SIGKILL)

    seconds, message = _kill_and_resume(tmp_path, store, local_cluster, kill_workers)
    assert "workers lost" in message or "no worker" in message, message
    assert seconds < STALL_S + 10, seconds


def test_scheduler_lost_is_an_error_and_the_checkpoint_resumes(tmp_path, store, local_cluster):
    """SIGKILL the ``dask scheduler`` process after alpha 3 of a checkpointed path.

    Pass: ClusterStalledError saying the scheduler is lost or does not answer within
    ``STALL_S`` plus 10 s (as above) instead of Dask's RuntimeError ("ConnectionPool is
    closed") after its 30 s reconnection attempts; resuming on a healthy cluster gives the
    uninterrupted path, bit for bit.
    """

    def kill_scheduler(scheduler, workers):
        scheduler.send_signal(signal.SIGKILL)

    seconds, message = _kill_and_resume(tmp_path, store, local_cluster, kill_scheduler)
    assert "scheduler" in message, message
    assert seconds < STALL_S + 10, seconds


def test_a_path_started_on_two_workers_resumes_on_three(tmp_path, store, local_cluster):
    """A checkpointed path interrupted after alpha 4 on two workers, resumed on a cluster
    of three.

    Pass: the resumed path equals the uninterrupted one on two workers, bit for bit (the
    partitions, not the workers, fix the arithmetic).
    """
    ref = dl1.path(store, client=local_cluster, **PATH)
    ck = tmp_path / "ck"
    stop_path_after(4, store, client=local_cluster, checkpoint=ck, **PATH)
    with nanny_cluster(3) as (_, client):
        resumed = dl1.path(store, client=client, checkpoint=ck, **PATH)
    assert_same_path(resumed, ref)


def test_a_direct_call_to_a_lost_worker_fails_within_the_connect_bound(monkeypatch):
    """A direct call (dl1.runtime.calls.send_call) to an address nobody listens on any
    more, as a partition server calling a peer that was just lost would make.

    Pass: OSError within the bound of dl1's connect (set to 1 s here; 10 s by default)
    plus 3 s, not Dask's 30 s connect timeout (Dask retries a refused connection until
    then).
    """
    import asyncio
    import socket

    from distributed.core import ConnectionPool

    from dl1.runtime import calls

    monkeypatch.setattr(calls, "CONNECT_S", 1.0)
    with socket.socket() as s:  # a port that was just free: connections are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def call() -> float:
        pool = await ConnectionPool()
        t0 = time.monotonic()
        try:
            with pytest.raises(OSError):
                await calls.send_call(pool, f"tcp://127.0.0.1:{port}", "dl1_call", session="x")
            return time.monotonic() - t0
        finally:
            await pool.close()

    # a loop of its own, not asyncio.run: that would unset the main thread's event loop,
    # which other tests' Dask objects (a nanny's process.kill) take implicitly
    loop = asyncio.new_event_loop()
    try:
        seconds = loop.run_until_complete(call())
    finally:
        loop.close()
    assert seconds < 1.0 + 3.0, seconds


@pytest.mark.usefixtures("slow_connect")
def test_sigkill_a_worker_holding_row_partitions_mid_path(tmp_path):
    """``solver="row-newton"`` keeps its partitions on the partition servers across a
    path's alphas; SIGKILL one of the two workers after alpha 3.

    Pass: the next alpha's direct call fails, the partitions are started again by tasks
    from the coefficients (the rows recomputed from their lineage), and every alpha is
    certified with the undisturbed path's coefficients (to the tolerance's accuracy: the
    predictions restarted from ``X w + b`` round otherwise than those updated step by
    step), within twice its time plus ``RECOVERY_S``."""
    X, y = make_regression(n=4000, p=300, density=0.05, seed=4)
    store = tmp_path / "tall.zarr"
    dl1.from_scipy(X, y, store, n_feature_blocks=2)
    kw = dict(n_alphas=8, eps=0.05, tol=1e-10, solver="row-newton", n_partitions=2)
    with nanny_cluster(2) as (_, client), dask.config.set({"dl1.one-piece": False}):
        dl1.path(store, client=client, **kw)  # warm: kernels loaded, timings fair
        ref, t_ref = timed(lambda: dl1.path(store, client=client, **kw))

        def kill_at_alpha_3(k, alpha, res):
            if k == 3:
                os.kill(list(worker_pids(client).values())[-1], signal.SIGKILL)

        with get_task_stream(client) as ts:
            got, s_got = timed(lambda: dl1.path(store, client=client,
                                                callback=kill_at_alpha_3, **kw))  # fmt: skip
    # the partitions started again by tasks, once: the servers' parts were lost
    assert sum(str(t["key"]).startswith("start_part") for t in ts.data) == 2
    assert got.converged_.all() and (got.gaps_ <= 1e-10).all()
    np.testing.assert_allclose(got.coefs_.toarray(), ref.coefs_.toarray(), atol=1e-6)
    assert s_got < 2 * t_ref + RECOVERY_S, (s_got, t_ref)
