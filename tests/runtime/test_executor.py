"""Every executor implements the declared Executor protocol, and the direct calls the
PassServer one too (dl1.runtime.executor)."""

from __future__ import annotations

import inspect

import pytest

from dl1.runtime.executor import DistributedExecutor, Executor, LocalExecutor, PassServer
from dl1.runtime.rpc import RpcExecutor


def test_every_executor_implements_the_protocol(local_cluster):
    local = LocalExecutor()
    tasks = DistributedExecutor(local_cluster)
    direct = RpcExecutor(tasks)
    try:
        declared = [n for n, _ in inspect.getmembers(Executor, inspect.isfunction)
                    if not n.startswith("_")]  # fmt: skip
        assert "gather" in declared and "submit_pass" not in declared
        for ex, transport in ((local, "local"), (tasks, "tasks"), (direct, "direct")):
            assert isinstance(ex, Executor), type(ex)
            assert ex.transport == transport
            assert ex.in_process is (ex is local)
            assert ex.n_workers == (1 if ex is local else 2)
        # the working-set passes: a separate protocol, which only the direct calls serve
        assert [isinstance(ex, PassServer) for ex in (local, tasks, direct)] == [
            False, False, True]
    finally:
        direct.close()


@pytest.mark.slow
def test_each_worker_is_warmed_once_and_a_late_one_when_first_used(monkeypatch):
    """The first executor on a cluster warms every worker and measures its baseline; the
    next asks the workers nothing; a worker that joins later is warmed alone."""
    from distributed import Client, LocalCluster

    from dl1.runtime.memory import warm_baseline

    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                     dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster, set_as_default=False) as client,
    ):  # fmt: skip
        warmed: list[list[str]] = []
        run = DistributedExecutor.run

        def counted(self, fn, *args, **kw):
            got = run(self, fn, *args, **kw)
            if fn is warm_baseline:
                warmed.append(sorted(got))
            return got

        monkeypatch.setattr(DistributedExecutor, "run", counted)
        first = DistributedExecutor(client)
        second = DistributedExecutor(client)
        cluster.scale(2)
        client.wait_for_workers(2)
        third = DistributedExecutor(client)
    assert warmed == [first.workers, sorted(set(third.workers) - set(first.workers))]
    assert second.baselines == first.baselines and set(third.baselines) == set(third.workers)
    assert all(b > 0 for b in third.baselines.values())


def _blas_threads() -> int:
    from dl1.runtime.executor import blas_controller

    return min(lib.num_threads for lib in blas_controller().select(user_api="blas").lib_controllers)


def _two_blas_threads():
    """BLAS set to two threads within (skips where the library cannot have two)."""
    import pytest

    from dl1.runtime.executor import blas_controller

    limited = blas_controller().limit(limits=2, user_api="blas")
    if _blas_threads() != 2:
        limited.restore_original_limits()
        pytest.skip("this BLAS cannot run two threads here")
    return limited


def test_a_fit_in_process_holds_blas_to_one_thread_and_restores_it():
    """In process (no client) as on a cluster, a solve runs with one BLAS thread (seen by
    its callback), and the process's setting is back afterwards."""
    import numpy as np

    import dl1
    from tests.helpers import random_csr

    X = random_csr(300, 40, 0.2, 0)
    y = X @ np.arange(40.0)
    seen = []
    with _two_blas_threads():
        res = dl1.fit(X, y, alpha=0.1, tol=1e-8, client=None,
                      callback=lambda h: seen.append(_blas_threads()))  # fmt: skip
        after = _blas_threads()
    assert res.converged_ and seen and set(seen) == {1}
    assert after == 2


def test_solves_in_threads_leave_blas_as_they_found_it():
    """Solves entering and leaving in any order (threads): BLAS is held to one thread
    while any runs and restored once the last ends, not left at one by an early leaver."""
    from dl1.runtime.executor import quiet_blas

    with _two_blas_threads():
        first, second = quiet_blas(), quiet_blas()
        first.__enter__()
        second.__enter__()
        assert _blas_threads() == 1
        first.__exit__(None, None, None)  # the first to enter leaves first
        assert _blas_threads() == 1
        second.__exit__(None, None, None)
        assert _blas_threads() == 2


def _scheduler_gathers(client) -> int:
    """Gathers the scheduler has relayed since :func:`_count_gathers`."""
    return client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.handlers["dl1_count"]())


def _count_gathers(dask_scheduler) -> None:
    """Wrap the scheduler's ``gather`` handler to count its calls (read by a handler)."""
    original, count = dask_scheduler.handlers["gather"], [0]

    async def counted(*args, **kwargs):
        count[0] += 1
        return await original(*args, **kwargs)

    dask_scheduler.handlers["gather"] = counted
    dask_scheduler.handlers["dl1_count"] = lambda: count[0]


def test_results_come_from_the_workers_straight_when_they_answer(local_cluster, monkeypatch):
    """Pass: on a cluster whose workers answer the client, a result is fetched from its
    worker, the scheduler relays no gather; with ``direct_to_workers=False``, or a worker
    that does not answer (a closed port in the list), the scheduler relays them. Before:
    every result went through the scheduler (two hops, both on its link)."""
    local_cluster.run_on_scheduler(_count_gathers)
    ex = DistributedExecutor(local_cluster)
    assert ex.direct
    assert ex.gather([ex.submit_to(0, sum, [1, 2]), ex.submit_to(1, max, [3, 4])]) == [3, 4]
    assert _scheduler_gathers(local_cluster) == 0

    monkeypatch.setattr(local_cluster, "direct_to_workers", False)
    ex = DistributedExecutor(local_cluster)
    assert not ex.direct
    assert ex.gather([ex.submit_to(0, sum, [5, 6])]) == [11]
    assert _scheduler_gathers(local_cluster) == 1

    monkeypatch.setattr(local_cluster, "direct_to_workers", None)
    ex = DistributedExecutor(local_cluster)
    ex.workers = [*ex.workers, "tcp://127.0.0.1:1"]
    assert not ex.direct
