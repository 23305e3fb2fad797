"""Every executor implements the declared Executor protocol (dl1.runtime.executor)."""

from __future__ import annotations

import inspect

from dl1.runtime.executor import DistributedExecutor, Executor, LocalExecutor
from dl1.runtime.rpc import RpcExecutor


def test_every_executor_implements_the_protocol(local_cluster):
    local = LocalExecutor()
    tasks = DistributedExecutor(local_cluster)
    direct = RpcExecutor(tasks)
    try:
        declared = [n for n, _ in inspect.getmembers(Executor, inspect.isfunction)
                    if not n.startswith("_")]  # fmt: skip
        assert "submit_pass" in declared and "gather" in declared
        for ex, transport in ((local, "local"), (tasks, "tasks"), (direct, "direct")):
            assert isinstance(ex, Executor), type(ex)
            assert ex.transport == transport
            assert ex.n_workers == (1 if ex is local else 2)
        assert local.submit_pass() is None and tasks.submit_then_scan() is None
    finally:
        direct.close()


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
