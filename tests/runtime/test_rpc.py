"""Direct calls to the workers (dl1.runtime.rpc): same answers as tasks, bit for bit; a
lost server or block falls back to tasks; bounded caches."""

import dataclasses
import logging
import time

import dask
import numpy as np
import pytest
from distributed import Client
from distributed.active_memory_manager import ActiveMemoryManagerPolicy

import dl1
from dl1.objective.datafits import Logistic, Quadratic
from dl1.objective.penalties.elastic_net import ElasticNet
from dl1.runtime.executor import DistributedExecutor, LocalExecutor
from dl1.runtime.partition_server import broadcast_tree
from dl1.runtime.rpc import TREE_BYTES, TREE_KEY, RpcExecutor, rpc_executor, tree_setting
from dl1.runtime.servers import CLIENT_CHECK_S, connected_by_events
from dl1.runtime.wire import PLUGIN_NAME
from dl1.tasks.blocks import loaded
from dl1.tasks.columns import extract_task
from dl1.tasks.gram import drop_gram
from dl1.tasks.subproblem import SubproblemSettings, subproblem_task
from tests.solving import load_blocks_for_test, solve_ws
from tests.test_penalised import _cluster, as_dask, make_classification, make_regression

KW = dict(fit_intercept=True, tol=1e-9, max_rounds=200, n_partitions=2, ws_start=8)


def _blocks(client, X, y, sw=None, n_blocks=5):
    ex = DistributedExecutor(client)
    blocks, cb, yv, swv, _, _ = load_blocks_for_test(ex, as_dask(X, n_blocks), y, sw)
    return ex, blocks, cb, yv, swv


@pytest.fixture
def rpc():
    """Makes :class:`RpcExecutor` s on the shared cluster and closes them after the test
    (the servers of its long-lived client would otherwise outlive the test)."""
    made: list[RpcExecutor] = []

    def make(ex: DistributedExecutor, kind: type[RpcExecutor] = RpcExecutor) -> RpcExecutor:
        made.append(kind(ex))
        return made[-1]

    yield make
    for rx in made:
        rx.close()


def calls_served(dask_worker) -> int:
    """Calls the partition servers of a worker have answered so far."""
    plugin = dask_worker.plugins.get(PLUGIN_NAME)
    return 0 if plugin is None else plugin.calls_served


def methods_served(dask_worker) -> dict[str, int]:
    """The calls a worker's partition servers have served, by method."""
    plugin = dask_worker.plugins.get(PLUGIN_NAME)
    return {} if plugin is None else dict(plugin.methods_served)


def servers_held(dask_worker) -> list[str]:
    """The sessions of the partition servers a worker holds."""
    plugin = dask_worker.plugins.get(PLUGIN_NAME)
    return [] if plugin is None else list(plugin.servers)


def drop_server(session: str, dask_worker) -> None:
    """Close a solve's server on a worker, as a worker restarted without it would."""
    dask_worker.plugins[PLUGIN_NAME].servers.pop(session).close()


def _same(a, b):
    np.testing.assert_array_equal(a.coef_, b.coef_)
    assert a.intercept_ == b.intercept_ and a.gap_ == b.gap_ and a.n_rounds_ == b.n_rounds_


@pytest.mark.parametrize(
    "loss, l1_ratio, gram_max, weighted",
    [
        ("squared", 1.0, 4096, False),  # working sets on their Gram matrix
        ("squared", 0.5, 0, True),  # column-wise epochs, sample weights
        ("logistic", 1.0, 4096, False),
    ],
)
def test_direct_calls_give_the_answers_of_tasks_bit_for_bit(
    local_cluster, rpc, loss, l1_ratio, gram_max, weighted
):
    """The same solve (and a second one warm-started from it, reusing its gathered columns as
    a path does) through tasks and through the servers: identical results, every step of the
    latter a direct call, every pass after a subproblem run by the subproblem's server (its
    own steps of the coordinator's, on the same values); the subproblem's server holds the
    last working set's groups only."""
    X, y = make_classification(n=160, p=70) if loss == "logistic" else make_regression(p=90)
    sw = np.random.default_rng(3).uniform(0.5, 2.0, y.shape[0]) if weighted else None
    ex, blocks, cb, yv, swv = _blocks(local_cluster, X, y, sw)
    datafit = Logistic() if loss == "logistic" else Quadratic()
    amax = dl1.alpha_max(as_dask(X, 5), y, loss=loss, l1_ratio=l1_ratio, sample_weight=sw)
    out = {}
    before = local_cluster.run(calls_served)
    for name, e in (("tasks", ex), ("direct", rpc(ex))):
        common = dict(gram_max=gram_max, **KW)
        args = (e, blocks, cb, yv, swv, datafit)
        first, state = solve_ws(*args, ElasticNet(amax / 5, l1_ratio), **common)
        # warm-started from the first solve's point and cached columns (not its last pass)
        warm = dataclasses.replace(state, last_scan=None)
        second, last2 = solve_ws(*args, ElasticNet(amax / 30, l1_ratio), warm=warm, **common)
        out[name] = (first, second, e, last2)
        e.broadcast(drop_gram, last2.gram_prefix)  # the solves' own Gram matrices
    for a, b in zip(out["tasks"][:2], out["direct"][:2], strict=True):
        _same(a, b)
        assert a.converged_ and a.n_rounds_ >= 1
    for r in (*out["tasks"][:2],):
        assert {h["transport"] for h in r.history_} == {"tasks"}
    for r in out["direct"][:2]:
        assert {h["transport"] for h in r.history_} == {"direct"}
        # every pass was run by the subproblem's server
        assert all(h["scan_by_server"] for h in r.history_)
    for r in out["tasks"][:2]:
        assert not any(h["scan_by_server"] for h in r.history_)
    e, last2 = out["direct"][2], out["direct"][3]
    # the calls went to every worker's servers, on Dask's comm
    after = local_cluster.run(calls_served)
    assert set(after) == set(e._ready()) and all(after[w] > before.get(w, 0) for w in after)
    home = min(e._ready())
    held = set(e.ask(home, "held_groups"))
    assert held == {g.gid for g, _, _ in last2.groups}
    assert sum(int(np.asarray(ids).shape[0]) for _, ids, _ in last2.groups) <= 2 * max(
        h.get("ws_size", 0) for h in out["direct"][1].history_
    )


def test_a_lost_server_falls_back_to_tasks_mid_solve(local_cluster, rpc):
    """A server that disappears between two rounds (closed on its worker, as with a worker
    restarted): the failing call and every later step run as tasks, the answer is
    unchanged."""
    X, y = make_regression(n=200, p=120, seed=4)
    ex, blocks, cb, yv, swv = _blocks(local_cluster, X, y)
    pen = ElasticNet(dl1.alpha_max(as_dask(X, 5), y) / 50)
    ref, _ = solve_ws(ex, blocks, cb, yv, swv, Quadratic(), pen, **KW)
    assert ref.n_rounds_ >= 3
    rx = rpc(ex)
    rx.wait(blocks)

    def lose_one(entry):
        if entry["round"] == 1:
            local_cluster.run(drop_server, rx.session, workers=[rx._ready()[1]])

    res, _ = solve_ws(rx, blocks, cb, yv, swv, Quadratic(), pen, callback=lose_one, **KW)
    _same(res, ref)
    transports = [h["transport"] for h in res.history_]
    assert transports[0] == "direct" and transports[-1] == "tasks"
    assert rx.broken


def test_a_block_on_no_server_runs_as_a_task(local_cluster):
    """A block whose worker has no server (here: the servers could not start) is read by a
    task; the executor says so and answers as the task path does."""

    class NoServers(RpcExecutor):
        def _open_servers(self):
            raise OSError("no server could start")

    X, y = make_regression(n=150, p=60, seed=5)
    ex, blocks, cb, yv, swv = _blocks(local_cluster, X, y)
    pen = ElasticNet(dl1.alpha_max(as_dask(X, 5), y) / 20)
    ref, _ = solve_ws(ex, blocks, cb, yv, swv, Quadratic(), pen, **KW)
    rx = NoServers(ex)
    res, _ = solve_ws(rx, blocks, cb, yv, swv, Quadratic(), pen, **KW)
    _same(res, ref)
    assert {h["transport"] for h in res.history_} == {"tasks"}


def test_fit_uses_direct_calls_where_blocks_are_in_memory(local_cluster):
    X, y = make_regression(seed=6)
    before = local_cluster.run(servers_held)
    during: list[dict] = []

    def watch(entry):
        during.append(local_cluster.run(servers_held))

    res = dl1.fit(as_dask(X, 3), y, alpha=0.01, client=local_cluster, callback=watch)
    assert {h["transport"] for h in res.history_} == {"direct"}
    # the fit had one server on each worker, closed once it returned
    (session,) = {s for w, held in during[0].items() for s in held if s not in before[w]}
    assert all(session in held for seen in during for held in seen.values())
    assert not any(session in held for held in local_cluster.run(servers_held).values())
    assert {h["transport"] for h in dl1.fit(as_dask(X, 3), y, alpha=0.01).history_} == {"local"}
    # spread subproblems (and out of core) keep their tasks
    spread = dl1.fit(as_dask(X, 3), y, alpha=0.01, spread=True, client=local_cluster)
    assert {h["transport"] for h in spread.history_} == {"tasks"}
    np.testing.assert_allclose(spread.coef_, res.coef_, atol=1e-6 * np.abs(res.coef_).max())
    assert rpc_executor(LocalExecutor()).transport == "local"


@pytest.mark.slow
def test_calls_to_a_removed_worker_fall_back_instead_of_waiting():
    """A worker killed and removed by the scheduler while the coordinator still routes calls
    to its server (blocks it held, the subproblem's server): the calls fail over to tasks
    (a call waiting for a worker that vanished would otherwise wait long)."""
    X, y = make_regression(n=300, p=200, seed=7)
    cluster, client = _cluster(2)
    with cluster, client:
        ex, blocks, cb, yv, swv = _blocks(client, X, y)
        pen = ElasticNet(dl1.alpha_max(as_dask(X, 5), y) / 50)
        ref, _ = solve_ws(ex, blocks, cb, yv, swv, Quadratic(), pen, **KW)
        rx = RpcExecutor(ex)
        rx.wait(blocks)
        home = min(rx._ready())
        held = rx._holders(blocks)  # where the blocks are: cached, as during a solve
        assert home in held
        nanny = next(n for n in cluster.workers.values() if n.worker_address == home)
        nanny.process.process.kill()
        deadline = time.monotonic() + 60
        while home in client.scheduler_info()["workers"]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        res, _ = solve_ws(rx, blocks, cb, yv, swv, Quadratic(), pen, **KW)
    _same(res, ref)
    assert rx.broken and {h["transport"] for h in res.history_} == {"tasks"}


@pytest.mark.slow
def test_a_peer_lost_while_the_subproblem_server_waits_for_its_columns():
    """The subproblem's server asks a peer for columns of a block it holds, but the peer's
    worker is gone: the call fails (the coordinator gives up at the latest once the scheduler
    no longer lists the peer), and re-runs as tasks, which recompute the block."""
    X, y = make_regression(n=300, p=200, seed=8)
    cluster, client = _cluster(2)
    with cluster, client:
        ex, blocks, cb, yv, swv = _blocks(client, X, y)
        rx = RpcExecutor(ex)
        rx.wait(blocks)
        home = min(rx._ready())
        held = rx._holders(blocks)
        j = next(k for k, h in enumerate(held) if h != home)  # a block on the peer
        ws = cb[j] + np.arange(3)
        settings = SubproblemSettings(Quadratic(), ElasticNet(0.01), True, 1e-12, 1000)
        args = (np.zeros(3), yv, np.zeros(yv.shape[0]), swv, settings)
        expected = subproblem_task(
            [extract_task(loaded(blocks[j].result()), np.arange(3))], [ws], [True], ws, *args
        )
        group = rx.submit(extract_task, blocks[j], np.arange(3))
        peer = next(n for n in cluster.workers.values() if n.worker_address == held[j])
        peer.process.process.kill()
        deadline = time.monotonic() + 60
        while held[j] in client.scheduler_info()["workers"]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        (got,) = rx.gather([rx.submit(subproblem_task, [group], [ws], [True], ws, *args)])
    assert rx.broken
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])


def test_dl1s_local_cluster_starts_its_workers_with_the_malloc_setting(monkeypatch):
    """Workers of dl1's LocalCluster get WORKER_ENV before they start (glibc reads it then),
    its scheduler steals no work, its workers run no statistical profiler and preload
    dl1.runtime.worker; the caller's Dask configuration is left as it was."""
    import os

    from dl1.runtime.localcluster import WORKER_ENV

    for k in WORKER_ENV:  # not inherited (Dask's nanny also sets it in its own process)
        monkeypatch.delenv(k, raising=False)

    import dask
    from distributed import Client

    from dl1.runtime.localcluster import local_cluster

    before = dask.config.get("distributed.nanny.pre-spawn-environ")
    stealing = dask.config.get("distributed.scheduler.work-stealing")
    profiling = dask.config.get("distributed.worker.profile.enabled")
    preload = dask.config.get("distributed.worker.preload")
    with (
        local_cluster(
            n_workers=1, threads_per_worker=1, dashboard_address="127.0.0.1:0"
        ) as cluster,
        Client(cluster) as client,
    ):
        env = next(iter(client.run(lambda: dict(os.environ)).values()))
        steals = client.run_on_scheduler(
            lambda dask_scheduler: "stealing" in dask_scheduler.extensions
        )
        profiles = client.run(lambda dask_worker: "profile" in dask_worker.periodic_callbacks)
        trims = client.run(lambda dask_worker: "dl1-trim-memory" in dask_worker.periodic_callbacks)
    assert all(env.get(k) == v for k, v in WORKER_ENV.items())
    assert not steals
    assert not any(profiles.values())
    assert all(trims.values())
    assert dask.config.get("distributed.worker.preload") == preload
    assert dask.config.get("distributed.nanny.pre-spawn-environ") == before
    assert dask.config.get("distributed.scheduler.work-stealing") == stealing
    assert dask.config.get("distributed.worker.profile.enabled") == profiling


def _count_proxied(dask_scheduler) -> None:
    """Count the calls the scheduler forwards to workers (its ``proxy`` handler)."""
    handler = dask_scheduler.handlers["proxy"]
    if getattr(handler, "dl1_counter", None) is None:

        async def proxy(*args, **kwargs):
            proxy.dl1_counter[0] += 1
            return await handler(*args, **kwargs)

        proxy.dl1_counter = [0]
        dask_scheduler.handlers["proxy"] = proxy
    dask_scheduler.handlers["proxy"].dl1_counter[0] = 0


def _proxied(dask_scheduler) -> int:
    return dask_scheduler.handlers["proxy"].dl1_counter[0]


def test_calls_go_straight_to_reachable_workers_unless_the_client_says_not(local_cluster, rpc):
    """A client that can reach the workers calls the servers directly (once they are set up,
    the scheduler forwards nothing); one made with ``direct_to_workers=False`` has its calls
    forwarded by the scheduler. Both give the answer of tasks, bit for bit."""
    from distributed import Client

    X, y = make_regression(n=150, p=80, seed=6)
    ex, blocks, cb, yv, swv = _blocks(local_cluster, X, y)
    pen = ElasticNet(dl1.alpha_max(as_dask(X, 5), y) / 30)
    ref, _ = solve_ws(ex, blocks, cb, yv, swv, Quadratic(), pen, **KW)
    rx = rpc(ex)
    rx.wait(blocks)  # the servers start
    local_cluster.run_on_scheduler(_count_proxied)
    res, _ = solve_ws(rx, blocks, cb, yv, swv, Quadratic(), pen, **KW)
    _same(res, ref)
    assert rx.direct_calls and {h["transport"] for h in res.history_} == {"direct"}
    assert local_cluster.run_on_scheduler(_proxied) == 0
    with Client(local_cluster.scheduler.address, direct_to_workers=False) as via:
        vex = DistributedExecutor(via)
        vblocks, vcb, yv2, swv2, datafit, _ = load_blocks_for_test(vex, as_dask(X, 5), y)
        vx = RpcExecutor(vex)  # its servers close with its client
        vx.wait(vblocks)
        local_cluster.run_on_scheduler(_count_proxied)
        res2, _ = solve_ws(vx, vblocks, vcb, yv2, swv2, datafit, pen, **KW)
        _same(res2, ref)
        assert not vx.direct_calls and {h["transport"] for h in res2.history_} == {"direct"}
        assert local_cluster.run_on_scheduler(_proxied) >= res2.n_rounds_


def test_workers_a_client_cannot_reach_get_their_calls_through_the_scheduler(local_cluster, rpc):
    """A client whose direct probe fails (a worker address it cannot connect to) falls back to
    Dask's proxy through the scheduler instead of failing: same answer, still direct calls."""

    class Unreachable(RpcExecutor):
        async def _direct_open(self, addr, workers):
            raise OSError(f"cannot connect to {addr}")

    X, y = make_regression(n=150, p=80, seed=7)
    ex, blocks, cb, yv, swv = _blocks(local_cluster, X, y)
    pen = ElasticNet(dl1.alpha_max(as_dask(X, 5), y) / 30)
    ref, _ = solve_ws(ex, blocks, cb, yv, swv, Quadratic(), pen, **KW)
    ux = rpc(ex, Unreachable)
    ux.wait(blocks)
    local_cluster.run_on_scheduler(_count_proxied)
    res, _ = solve_ws(ux, blocks, cb, yv, swv, Quadratic(), pen, **KW)
    _same(res, ref)
    assert not ux.direct_calls and not ux.broken
    assert {h["transport"] for h in res.history_} == {"direct"}
    assert local_cluster.run_on_scheduler(_proxied) >= res.n_rounds_


class RecordedLog(logging.Handler):
    """The lines logged to it, formatted."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


class DropReplica(ActiveMemoryManagerPolicy):
    """An active memory manager policy dropping one replica of one key, once: what Dask's
    ``ReduceReplicas`` does to a block that a task on another worker copied."""

    def __init__(self, key: str, address: str) -> None:
        self.key, self.address = key, address

    def run(self):
        scheduler = self.manager.scheduler
        yield "drop", scheduler.tasks[self.key], {scheduler.workers[self.address]}
        self.manager.policies.discard(self)


def move_block(client, future, to: str) -> None:
    """Copy ``future``'s block to the worker ``to`` (a task there reads it), then let Dask's
    active memory manager drop every other replica. Its automatic runs are stopped
    meanwhile (``client.amm``) and its own policies set aside for ours: their
    ``ReduceReplicas`` may drop the fresh copy instead. Asked again until done: the
    scheduler may not list the copy yet, and the manager never drops a last replica."""

    def drop(dask_scheduler) -> list[str]:
        """One run of the manager with only a drop of every other replica (its own
        ``ReduceReplicas``, run first, may drop the fresh copy: then ours finds one replica
        and keeps it); what its task log says of the key, for the message of a timeout."""
        amm = dask_scheduler.extensions["amm"]
        own = set(amm.policies)
        amm.policies.clear()
        for ws in dask_scheduler.tasks[future.key].who_has:
            if ws.address != to:
                amm.add_policy(DropReplica(future.key, ws.address))
        said = RecordedLog()
        log = logging.getLogger("distributed.active_memory_manager.tasks")
        level = log.level
        log.setLevel(logging.DEBUG)
        log.addHandler(said)
        try:
            amm.run_once()
        finally:
            log.removeHandler(said)
            log.setLevel(level)
            amm.policies.clear()
            amm.policies.update(own)
        return [line for line in said.lines if future.key in line]

    def worker_side(dask_worker) -> tuple[str, list[tuple[str, str]]] | None:
        """The block's state on a worker and its dependents' there."""
        ts = dask_worker.state.tasks.get(future.key)
        if ts is None:
            return None
        return ts.state, [(str(d.key), d.state) for d in ts.dependents]

    def waiters(dask_scheduler) -> list[tuple[str, str, str | None]]:
        """The tasks waiting on the block, where they run (the manager keeps a replica
        that a running dependent needs): said when the move times out."""
        ts = dask_scheduler.tasks[future.key]
        return [(str(w.key), w.state, w.processing_on and w.processing_on.address)
                for w in ts.waiters or ()]  # fmt: skip

    said: list[str] = []
    client.amm.stop()
    try:
        deadline = time.monotonic() + 60
        while (holders := set(client.who_has([future])[future.key])) != {to}:
            assert time.monotonic() < deadline, (
                f"the block is on {holders}, not only {to}; waiting on it: "
                f"{client.run_on_scheduler(waiters)}; the manager said {said}; on the "
                f"workers: {client.run(worker_side)}"
            )
            if to not in holders:
                client.submit(type, future, workers=[to], pure=False).result()
            else:
                said = client.run_on_scheduler(drop)
            time.sleep(0.2)
    finally:
        client.amm.start()


@pytest.mark.slow
def test_a_block_dask_moves_mid_solve_is_looked_up_again(local_cluster, rpc):
    """Dask moves a block after the coordinator looked it up (a copy elsewhere, then its
    memory manager drops the first replica): the step that finds it gone runs by task, the
    later ones go by direct calls to where the block now is, the answer is unchanged, and no
    worker logs an error."""
    X, y = make_regression(n=200, p=120, seed=4)
    ex, blocks, cb, yv, swv = _blocks(local_cluster, X, y)
    pen = ElasticNet(dl1.alpha_max(as_dask(X, 5), y) / 50)
    ref, _ = solve_ws(ex, blocks, cb, yv, swv, Quadratic(), pen, **KW)
    assert ref.n_rounds_ >= 3
    rx = rpc(ex)
    rx.wait(blocks)
    held = rx._holders(blocks)  # cached, as during a solve
    # a block of the worker holding the most (Dask may have placed them unevenly): both
    # workers still hold blocks after the move, so both are called after it
    most = max(set(held) - {None}, key=held.count)
    j = held.index(most)
    to = next(a for a in rx._ready() if a != held[j])
    moved = []

    def move_one(entry):
        if entry["round"] == 1:
            move_block(local_cluster, blocks[j], to)
            moved.append(local_cluster.run(calls_served))

    res, _ = solve_ws(rx, blocks, cb, yv, swv, Quadratic(), pen, callback=move_one, **KW)
    _same(res, ref)
    assert moved and not rx.broken
    assert {h["transport"] for h in res.history_} == {"direct"}
    # the coordinator's holder holds the block now (a task's copy may have come back)
    (holder,) = rx._holders([blocks[j]])
    assert holder in local_cluster.who_has([blocks[j]])[blocks[j].key]
    after = local_cluster.run(calls_served)
    assert all(after[w] > moved[0][w] for w in after)  # calls went on to both workers
    logs = local_cluster.get_worker_logs()
    assert not any("dl1_call" in line for lines in logs.values() for _, line in lines)


def test_connected_by_events_reads_the_last_client_action():
    """The decision the servers' watcher takes from a client's event topic."""
    add, rem, graph = ({"action": a} for a in ("add-client", "remove-client", "update-graph"))
    assert connected_by_events([(0, add), (1, graph)])
    assert not connected_by_events([(0, add), (1, graph), (2, rem)])
    assert connected_by_events([(0, add), (1, rem), (2, add)])
    assert connected_by_events([(0, graph)] * 5)  # add-client fell out of a full log
    assert not connected_by_events([])  # the scheduler dropped a removed client's events


@pytest.mark.slow
def test_a_busy_client_keeps_its_servers_after_its_event_log_overflows():
    """The scheduler keeps only the latest events of a client's topic (one per graph
    submitted): a client that submits more graphs than that keeps its partition servers,
    and a solve's calls still go straight to them; closing the client closes them."""
    X, y = make_regression(n=200, p=120, seed=4)
    with dask.config.set({"distributed.admin.low-level-log-length": 20}):
        cluster, client = _cluster(2)
    with cluster:
        with client:
            ex, blocks, cb, yv, swv = _blocks(client, X, y)
            rx = RpcExecutor(ex)
            rx.wait(blocks)
            for i in range(30):  # a graph of two tasks logs an event: add-client goes
                client.gather(client.map(int, [i, i + 1], pure=False))
            events = client.get_events(client.id)
            assert len(events) == 20
            assert "add-client" not in {e[1].get("action") for e in events}
            time.sleep(2 * CLIENT_CHECK_S + 1)
            assert all(rx.session in held for held in client.run(servers_held).values())
            pen = ElasticNet(dl1.alpha_max(as_dask(X, 5), y) / 50)
            res, _ = solve_ws(rx, blocks, cb, yv, swv, Quadratic(), pen, **KW)
            assert not rx.broken and {h["transport"] for h in res.history_} == {"direct"}
            session = rx.session
        with Client(cluster, set_as_default=False) as other:
            deadline = time.monotonic() + CLIENT_CHECK_S + 15
            while any(session in held for held in other.run(servers_held).values()):
                assert time.monotonic() < deadline, "servers outlived their closed client"
                time.sleep(0.2)


def calls_sent(dask_worker) -> dict[str, int]:
    """Calls a worker's partition servers have made to peers so far, by method."""
    plugin = dask_worker.plugins.get(PLUGIN_NAME)
    return {} if plugin is None else dict(plugin.calls_sent)


def _hops(peers: list[str]) -> tuple[dict[str, int], dict[str, int]]:
    """Each peer's hops from the root and each sender's sends (the root is ``""``), as
    the servers forward along :func:`broadcast_tree`."""
    hops, sends = {}, {}

    def walk(sender: str, rest: list[str], depth: int) -> None:
        subtrees = broadcast_tree(rest)
        sends[sender] = len(subtrees)
        for i, sub in enumerate(subtrees):
            hops[sub[0]] = depth + i + 1  # the i-th send leaves after i others
            walk(sub[0], sub[1:], depth + i + 1)

    walk("", peers, 0)
    return hops, sends


@pytest.mark.parametrize("k", [0, 1, 2, 3, 4, 7, 8, 63, 64, 255])
def test_a_broadcast_tree_reaches_every_peer_once_in_log_hops(k):
    peers = [f"w{i}" for i in range(k)]
    hops, sends = _hops(peers)
    assert sorted(hops) == sorted(peers)  # every peer once (a dict would hide repeats)
    assert sum(len(s) for s in broadcast_tree(peers)) == k
    bound = int(np.ceil(np.log2(k + 1)))
    assert sends[""] == bound and max(sends.values()) == bound
    assert max(hops.values(), default=0) == bound


def test_the_tree_setting_is_read_and_checked():
    assert tree_setting() == TREE_BYTES  # "auto": vectors of 1 MiB and more
    with dask.config.set({TREE_KEY: True}):
        assert tree_setting() == 0
    with dask.config.set({TREE_KEY: "false"}):
        assert tree_setting() >= 2**62  # no vector is that large
    with dask.config.set({TREE_KEY: "sometimes"}), pytest.raises(ValueError, match=TREE_KEY):
        tree_setting()


@pytest.mark.slow
def test_peers_forward_the_dual_point_along_a_tree_with_the_same_answers():
    """Four workers: with the tree, the subproblem's server sends each pass to
    ``ceil(log2(peers + 1))`` peers and they forward it; straight, it sends to every peer.
    "auto" sends this small dual point (3.2 kB) straight. The answers are the same bit for
    bit, and the same as tasks'."""
    X, y = make_classification(n=400, p=300, seed=12)
    kw = dict(alpha=0.02, loss="logistic", tol=1e-9, n_partitions=8)
    cluster, client = _cluster(4)
    with cluster, client, dask.config.set({"dl1.one-piece": False}):
        res, sent = {}, {}
        for tree in (True, False, "auto"):
            before = client.run(calls_sent)
            with dask.config.set({TREE_KEY: tree}):
                res[tree] = dl1.fit(as_dask(X, 16), y, client=client, **kw)
            after = client.run(calls_sent)
            sent[tree] = {
                w: after[w].get("scan_pass", 0) - before[w].get("scan_pass", 0) for w in after
            }
    for r in res.values():
        assert {h["transport"] for h in r.history_} == {"direct"} and r.converged_
    _same(res[True], res[False])
    _same(res[True], res["auto"])
    ref = dl1.fit(as_dask(X, 16), y, **kw)
    np.testing.assert_allclose(res[True].coef_, ref.coef_, rtol=1e-12, atol=1e-14)
    # every pass reaches the same peers either way
    assert sum(sent[True].values()) == sum(sent[False].values()) > 0
    # straight: one sender (the subproblem's server), three peers a pass
    (home,) = [w for w, n in sent[False].items() if n]
    assert sent["auto"] == sent[False]
    passes = sent[False][home] / 3
    assert passes == int(passes)
    # the tree: the home sends ceil(log2(3 + 1)) = 2 a pass, the first subtree's head 1
    assert sent[True][home] == 2 * passes
    assert sorted(n for w, n in sent[True].items() if n) == [passes, 2 * passes]
