"""Calls to the partition servers on Dask's comm (dl1.runtime.calls, dl1.runtime.rpc):
messages arrive whole and writable, errors reach the caller, a TLS cluster gets the same
direct calls and answer, and no worker listens on a port of its own."""

import asyncio
import os
import threading

import numpy as np
import pytest
from distributed.protocol import deserialize, serialize, to_serialize

import dl1
from dl1.runtime.calls import (
    OUT_OF_BAND_BYTES,
    PackingError,
    pack,
    start_calls_in_turn,
    unpack,
)
from dl1.runtime.executor import DistributedExecutor
from dl1.runtime.rpc import RpcExecutor
from dl1.runtime.wire import ServerClosed
from dl1.tasks.passes import scan_task
from tests.runtime.test_rpc import calls_served, drop_server
from tests.test_penalised import as_dask, make_regression


def test_a_packed_message_arrives_whole_and_writable():
    """Through Dask's serialization (the families its comm uses): arrays of every layout
    come back equal and writable; large ones travel as frames of their own, small ones
    inside the pickle."""
    big = np.random.default_rng(0).normal(size=OUT_OF_BAND_BYTES // 8 + 1)
    msg = {
        "x": np.arange(10.0),
        "big": big,
        "empty": np.zeros(0, np.int64),
        "strided": np.arange(20.0)[::3],
        "f32": np.linspace(0, 1, 7, dtype=np.float32),
        "nested": [("t", np.ones((3, 2)), None), 1.5],
        "fn": scan_task,
    }
    packed = pack(msg)
    assert len(packed.buffers) == 1  # "big" only
    header, frames = serialize(to_serialize(packed), serializers=("dask", "pickle"))
    assert len(frames) == 2  # the pickle, then the large array's own frame
    got = unpack(deserialize(header, [bytearray(f) for f in frames]))
    for k in ("x", "big", "empty", "strided", "f32"):
        np.testing.assert_array_equal(got[k], msg[k])
        assert got[k].dtype == msg[k].dtype and got[k].flags.writeable
    np.testing.assert_array_equal(got["nested"][0][1], msg["nested"][0][1])
    assert got["nested"][0][2] is None and got["nested"][1] == 1.5
    assert got["fn"] is scan_task
    # received from another process, a writable frame is used in place ...
    frames = [bytearray(f) for f in frames]
    moved = deserialize(header, frames)
    moved.pid = -1
    got = unpack(moved)
    assert np.shares_memory(got["big"], np.frombuffer(frames[1], np.float64))
    # ... but unpacked where it was packed (Dask's in-process comm passes objects as they
    # are), the arrays are copies, not the sender's memory
    shared = unpack(packed)
    assert shared["big"].flags.writeable and not np.shares_memory(shared["big"], big)


def _fail(message):
    raise ValueError(message)


def _unpicklable():
    return threading.Lock()


def _echo(*args):
    return args


def test_errors_and_unpicklable_results_reach_the_caller(local_cluster):
    """A server's call raises the function's own error at the caller; a result that cannot be
    pickled, a method a server does not have and a server closed meanwhile are errors too,
    and the server goes on answering."""
    rx = RpcExecutor(DistributedExecutor(local_cluster))
    addr = rx._ready()[0]
    x = np.random.default_rng(1).normal(size=16_087)
    got = rx.ask(addr, "call", _echo, [x, "a"])
    np.testing.assert_array_equal(got[0], x)
    assert got[1] == "a"
    with pytest.raises(ValueError, match="boom"):
        rx.ask(addr, "call", _fail, ["boom"])
    with pytest.raises(PackingError, match="lock"):
        rx.ask(addr, "call", _unpicklable, [])
    with pytest.raises(ValueError, match="no method"):
        rx.ask(addr, "close")
    assert rx.ask(addr, "held_groups") == []
    local_cluster.run(drop_server, rx.session, workers=[addr])
    with pytest.raises(ServerClosed):
        rx.ask(addr, "held_groups")
    rx.close()


@pytest.mark.slow
def test_a_fit_on_a_tls_cluster_makes_direct_calls_and_gives_the_same_answer(local_cluster):
    """On a LocalCluster whose comm is TLS with client certificates, a fit's steps are direct
    calls (served by every worker's servers) and its answer is the plain cluster's."""
    from distributed import Client, LocalCluster
    from distributed.security import Security

    X, y = make_regression(n=300, p=200, seed=11)
    plain = dl1.fit(as_dask(X, 4), y, alpha=0.01, tol=1e-10, client=local_cluster)
    sec = Security.temporary()
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            security=sec,
            protocol="tls://",
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
        ) as cluster,
        Client(cluster, security=sec) as client,
    ):
        assert all(w.startswith("tls://") for w in client.scheduler_info()["workers"])
        before = client.run(calls_served)
        res = dl1.fit(as_dask(X, 4), y, alpha=0.01, tol=1e-10, client=client)
        after = client.run(calls_served)
    assert {h["transport"] for h in res.history_} == {"direct"}
    assert all(after[w] > before[w] for w in after)
    assert res.converged_ and plain.converged_
    np.testing.assert_array_equal(res.coef_, plain.coef_)
    assert res.intercept_ == plain.intercept_ and res.n_rounds_ == plain.n_rounds_


def _dask_ports(dask_worker) -> set[int]:
    """Ports this worker's Dask servers listen on: its own address, its services (e.g. a
    dashboard) and its nanny's."""
    from distributed.comm import parse_host_port

    ports = {parse_host_port(dask_worker.address.split("://")[-1])[1]}
    ports |= {int(p) for p in dask_worker.service_ports.values()}
    if dask_worker.nanny:
        ports.add(parse_host_port(dask_worker.nanny.split("://")[-1])[1])
    return ports


def _listening(pid: int) -> set[int]:
    import psutil

    conns = psutil.Process(pid).net_connections(kind="inet")
    return {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN}


def test_workers_listen_on_no_port_of_their_own_during_a_fit(local_cluster):
    """Sampled at every round of a fit making direct calls, the worker processes listen on
    the ports Dask opened for them and no other."""
    pids = local_cluster.run(os.getpid)
    allowed = local_cluster.run(_dask_ports)
    samples: list[dict[str, set[int]]] = []

    def watch(entry):
        samples.append({w: _listening(pid) for w, pid in pids.items()})

    X, y = make_regression(seed=12)
    res = dl1.fit(as_dask(X, 3), y, alpha=0.01, client=local_cluster, callback=watch)
    assert {h["transport"] for h in res.history_} == {"direct"}
    assert samples
    for sample in samples:
        for w, ports in sample.items():
            assert ports and ports <= allowed[w], (w, ports - allowed[w])


def test_calls_to_closed_servers_are_answered_without_a_logged_traceback():
    """A call naming a server its worker no longer holds, and one reaching the worker after
    its servers were torn down (a frozen worker that resumed and closed, say), raise
    ServerClosed at the caller; the worker logs nothing for either. Before: the torn-down
    worker logged "No handler dl1_call found in Worker" with a KeyError traceback."""
    from distributed import Client, LocalCluster

    from dl1.runtime.wire import PLUGIN_NAME

    with (
        LocalCluster(n_workers=1, processes=False, dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        rx = RpcExecutor(DistributedExecutor(client))
        addr = rx._ready()[0]
        client.run(drop_server, rx.session, workers=[addr])
        with pytest.raises(ServerClosed, match="no server"):
            rx.ask(addr, "held_groups")
        client.unregister_worker_plugin(PLUGIN_NAME)  # the servers torn down
        with pytest.raises(ServerClosed, match="closed"):
            rx.ask(addr, "held_groups")
        logs = "\n".join(line for _, line in client.get_worker_logs()[addr])
    assert "No handler" not in logs and "Traceback" not in logs, logs


class _SlowComm:
    """A stand-in for a Dask comm: a write takes ``write_s``, a reply ``reply_s``; both
    logged."""

    deserialize = True

    def __init__(self, address: str, log: list, write_s: float, reply_s: float) -> None:
        self.address, self.log, self.write_s, self.reply_s = address, log, write_s, reply_s
        self.msg: dict = {}

    async def write(self, msg, **kwargs):
        self.log.append(("write", self.address))
        await asyncio.sleep(self.write_s)
        self.msg = msg
        self.log.append(("written", self.address))
        return 1

    async def read(self, **kwargs):
        await asyncio.sleep(self.reply_s)
        self.log.append(("reply", self.address))
        return {"result": pack(("answer of", self.address, unpack(self.msg["payload"].data)))}

    def closed(self) -> bool:
        return False


class _SlowPool:
    """A stand-in for Dask's ConnectionPool handing out :class:`_SlowComm` s; ``"bad"``
    refuses to connect."""

    serializers = deserializers = None

    def __init__(self, log: list, reply_s: dict[str, float]) -> None:
        self.log, self.reply_s = log, reply_s

    async def connect(self, address, timeout=None):
        if address == "bad":
            raise OSError("refused")
        return _SlowComm(address, self.log, 0.05, self.reply_s[address])

    def reuse(self, address, comm) -> None:
        pass


def test_calls_in_turn_write_one_after_the_other_and_read_their_own_replies():
    """Each request is written once the one before is (on one link, the first callee gets
    all of it first); replies are read as they come, each to its own call; a callee that
    cannot be reached fails its call only."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        log: list = []
        pool = _SlowPool(log, {"a": 1.0, "b": 0.0, "c": 0.3})  # replies 0.35 s apart at least
        targets = [("a", ("m", 1)), ("bad", ("m", 2)), ("b", ("m", 3)), ("c", ("m", 4))]
        calls = start_calls_in_turn(loop, pool, targets, "dl1_call", session="s")
        assert calls[0].result(timeout=10) == ("answer of", "a", ("m", 1))
        with pytest.raises(OSError, match="refused"):
            calls[1].result(timeout=10)
        assert calls[2].result(timeout=10) == ("answer of", "b", ("m", 3))
        assert calls[3].result(timeout=10) == ("answer of", "c", ("m", 4))
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    writes = [e for e in log if e[0] in ("write", "written")]
    assert writes == [(k, a) for a in "abc" for k in ("write", "written")]
    # the replies came as they were ready, not in the order sent
    assert [a for k, a in log if k == "reply"] == ["b", "c", "a"]
