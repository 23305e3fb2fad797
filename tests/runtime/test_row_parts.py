"""Row partitions called together (dl1.runtime.row_parts): on the partition servers the
answers of tasks, older handles still served (a line search's way back), a version let go
or a lost server raising PartsLost and tasks from then on."""

from collections import Counter

import numpy as np
import pytest
from distributed import get_task_stream

from dl1.runtime.executor import DistributedExecutor
from dl1.runtime.partition_server import ROW_VERSIONS
from dl1.runtime.row_parts import (
    Partitions,
    PartsLost,
    ServerParts,
    TaskParts,
    start_parts,
)
from tests.runtime.test_rpc import drop_server, methods_served, rpc  # noqa: F401 (a fixture)

N_PARTS = 5


def block(q: int) -> np.ndarray:
    return np.random.default_rng(q).standard_normal(40 + q)


def start(blocks, scale, offset):
    """A part: its rows' values, and no result yet."""
    return (scale * np.concatenate(blocks) + offset, None)


def step(part, blocks, k):
    """The part moved by ``k`` times its block; its result: the values' sum."""
    v = part[0] + k * np.concatenate(blocks)
    return (v, np.array([v.sum(), float(v.shape[0])]))


def part_result(part):
    return part[1]


def add(a, b):
    return a + b


def reference(ks: list[float], scales: list[float], offset: float) -> np.ndarray:
    total = np.zeros(2)
    for q in range(N_PARTS):
        v = scales[q] * block(q) + offset + sum(ks) * block(q)
        total += [v.sum(), v.shape[0]]
    return total


def _partitions(ex):
    blocks = [[ex.submit_to(q, block, q)] for q in range(N_PARTS)]
    ex.wait([b for part in blocks for b in part])
    return Partitions(ex, blocks, part_result, add)


SCALES = [1.0 + q for q in range(N_PARTS)]


def _started(ex):
    of = _partitions(ex)
    return start_parts(of, start, [(s,) for s in SCALES], (0.5,))


def test_calls_on_servers_give_the_tasks_sums(local_cluster, rpc):  # noqa: F811
    """The same calls by tasks and on the servers: the same sums (to rounding: the servers
    add in another order), an older handle called again as if the later calls had not
    happened, and on the servers no task: one ``row_start`` a worker, each call one
    ``row_call`` a worker."""
    base = DistributedExecutor(local_cluster)
    before = local_cluster.run(methods_served)
    got = {}
    for name, ex in (("tasks", base), ("direct", rpc(base))):
        with get_task_stream(local_cluster) as ts:
            parts = _started(ex)
            first, s1 = parts.call(step, 0.25)
            later, s2 = first.call(step, -1.5)
            _, again = first.call(step, 2.0)  # from the parts before the second call
        got[name] = (s1, s2, again)
        names = Counter(str(t["key"]).split("-")[0] for t in ts.data)
        assert (names["step"] > 0) == (name == "tasks"), names
        assert isinstance(parts, ServerParts if name == "direct" else TaskParts)
        assert later.transport == name
    for name in got:
        s1, s2, again = got[name]
        np.testing.assert_allclose(s1, reference([0.25], SCALES, 0.5), rtol=1e-12)
        np.testing.assert_allclose(s2, reference([0.25, -1.5], SCALES, 0.5), rtol=1e-12)
        np.testing.assert_allclose(again, reference([0.25, 2.0], SCALES, 0.5), rtol=1e-12)
    served = [Counter(v) - Counter(before.get(k, {}))
              for k, v in local_cluster.run(methods_served).items()]  # fmt: skip
    assert [c["row_start"] for c in served] == [1, 1]
    assert [c["row_call"] for c in served] == [3, 3]


def test_a_version_let_go_raises_parts_lost_and_tasks_follow(local_cluster, rpc):  # noqa: F811
    """A handle older than the servers' last ``ROW_VERSIONS`` versions raises PartsLost;
    the executor then runs tasks, and parts started again are tasks' with the same sums."""
    ex = rpc(DistributedExecutor(local_cluster))
    oldest = parts = _started(ex)
    for _ in range(ROW_VERSIONS):
        parts, _ = parts.call(step, 1.0)
    with pytest.raises(PartsLost, match="version 0 .* is gone"):
        oldest.call(step, 1.0)
    assert ex.broken
    again = _started(ex)
    assert isinstance(again, TaskParts)
    np.testing.assert_allclose(again.call(step, 1.0)[1], reference([1.0], SCALES, 0.5))


def test_a_lost_server_raises_parts_lost(local_cluster, rpc):  # noqa: F811
    """A server closed under the parts (its worker restarted): the next call raises
    PartsLost, and calls run as tasks from then on."""
    ex = rpc(DistributedExecutor(local_cluster))
    parts = _started(ex)
    parts, _ = parts.call(step, 1.0)
    local_cluster.run(drop_server, ex.session, workers=[ex._ready()[-1]])
    with pytest.raises(PartsLost):
        parts.call(step, 1.0)
    with pytest.raises(PartsLost, match="let go"):
        parts.call(step, 1.0)
    assert ex.broken and ex.transport == "tasks"
