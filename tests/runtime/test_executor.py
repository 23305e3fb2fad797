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
