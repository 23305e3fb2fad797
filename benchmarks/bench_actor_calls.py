"""Could Dask's public Actors replace dl1's own rpc handlers (``dl1_open`` / ``dl1_call``)?

Round-trip latency, on one LocalCluster of two single-threaded worker processes, of:

* ``tasks``: ``client.submit(identity, x, pure=False).result()`` (the task path; the
  client's default ``direct_to_workers=None``, so the result comes through the scheduler;
  ``tasks, direct gather`` sets ``direct_to_workers=True``);
* ``dl1 direct``: dl1's own call, ``start_call(..., "dl1_call", ("call", (identity, [x])))``
  on a partition server opened with ``send_call(..., "dl1_open", ...)`` (as
  ``RpcExecutor.invoke`` / ``_direct_open`` do);
* ``actor sync`` / ``actor async``: ``actor.echo(x).result()`` of an Actor on worker A (a
  plain method, run in the worker's "actor" thread, and an ``async def`` one, run on the
  worker's event loop), with the client's default ``direct_to_workers=None`` (which makes
  the Actor send through the scheduler's ``proxy`` handler) and with ``True`` (straight to
  the worker);
* peer calls: an actor on A calls an actor on B and returns what it got; the A->B leg is
  timed inside A, the total from the client; and, for reference, the same with dl1's
  servers (a function run by A's server that calls B's server with ``start_call`` on the
  worker's pool, as ``PartitionServer._ask`` does).

Each with a ~100 byte payload (12 float64) and an 8 MB one (1e6 float64), sent and
returned. Modes are interleaved in ``--rounds`` rounds (a background load then weighs on
all of them alike); medians and 90th percentiles in ms. Then two checks: the deadlock of
the one "actor" thread a worker shares among its actors (A -> B -> A), and what becomes of
an actor when its future is released or its client disconnects.

    python benchmarks/bench_actor_calls.py --calls 200
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
import uuid

import numpy as np


class Echo:
    """The actor: echoes, and calls a peer actor."""

    def __init__(self) -> None:
        self.peer = None

    def echo(self, x):
        return x

    async def aecho(self, x):
        return x

    def set_peer(self, peer) -> str:
        self.peer = peer
        return repr(peer)

    def via_peer(self, x):
        """x echoed by the peer (a sync call from this worker's actor thread); the leg's s."""
        t0 = time.perf_counter()
        y = self.peer.echo(x).result()
        return y, time.perf_counter() - t0

    async def avia_peer(self, x):
        """x echoed by the peer's async method, awaited on this worker's event loop."""
        t0 = time.perf_counter()
        y = await self.peer.aecho(x)
        return y, time.perf_counter() - t0

    def chain(self, hops, timeout: float):
        """Call ``hops[0].chain(hops[1:])`` and wait at most ``timeout`` s for it."""
        if not hops:
            return "end"
        try:
            return "via " + hops[0].chain(hops[1:], timeout).result(timeout=timeout)
        except Exception as exc:  # TimeoutError: the peer's actor thread never took it
            return f"{type(exc).__name__} after {timeout} s"


def dl1_peer_echo(peer: str, session: str, x):
    """Run by a partition server (cloudpickled by value: it is __main__'s): x echoed by the
    server of ``session`` on ``peer``, called from here as PartitionServer._ask does."""
    import time

    from distributed.worker import Worker

    from dl1.runtime.calls import start_call
    from dl1.tasks.blocks import identity

    (w,) = list(Worker._instances)
    t0 = time.perf_counter()
    call = start_call(w.loop.asyncio_loop, w.rpc, peer, "dl1_call",
                      ("call", (identity, [x])), session=session)  # fmt: skip
    y = call.result()
    return y, time.perf_counter() - t0


def actors_on(dask_worker) -> list:
    return list(dask_worker.state.actors)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=200, help="timed calls per mode and payload")
    p.add_argument("--warm", type=int, default=20, help="untimed calls per mode first")
    p.add_argument("--rounds", type=int, default=4, help="interleaved rounds")
    args = p.parse_args()

    import dask
    from distributed import Client, LocalCluster

    from dl1.runtime.calls import send_call, start_call
    from dl1.runtime.servers import PartitionServers
    from dl1.tasks.blocks import identity

    dask.config.set({"distributed.admin.large-graph-warning-threshold": "1GB"})
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                     dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):  # fmt: skip
        import logging

        logging.getLogger("distributed.client").setLevel(logging.ERROR)
        a, b = sorted(client.scheduler_info()["workers"])
        loop = client.loop.asyncio_loop

        def on_loop(coro):
            return asyncio.run_coroutine_threadsafe(coro, loop).result()

        # dl1's servers, as RpcExecutor._open_servers / _direct_open open them
        client.register_plugin(PartitionServers())
        session = uuid.uuid4().hex
        for addr in (a, b):
            reply = on_loop(send_call(client.rpc, addr, "dl1_open", session=session,
                                      peers=[a, b], client=client.id))  # fmt: skip
            assert reply["address"] == addr, reply

        def dl1_call(addr, fn, fargs):
            return start_call(loop, client.rpc, addr, "dl1_call", ("call", (fn, fargs)),
                              session=session).result()  # fmt: skip

        # actors: one per worker, pinned; A holds a handle of B
        fa = client.submit(Echo, actor=True, workers=[a], pure=False)
        fb = client.submit(Echo, actor=True, workers=[b], pure=False)
        actor_a, actor_b = fa.result(), fb.result()
        client.direct_to_workers = True
        actor_a.set_peer(actor_b).result()
        client.direct_to_workers = None

        legs: dict[str, list[float]] = {}
        all_legs: dict[str, None] = {}

        def task(x):
            return client.submit(identity, x, pure=False, workers=[a]).result()

        def with_direct(flag, fn):
            def run(x):
                client.direct_to_workers = flag
                try:
                    return fn(x)
                finally:
                    client.direct_to_workers = None

            return run

        def leg(name, fn):
            def run(x):
                y, s = fn(x)
                legs.setdefault(name, []).append(s)
                all_legs[name] = None
                return y

            return run

        modes = {
            "(a) tasks": task,
            "(a') tasks, direct gather": with_direct(True, task),
            "(b) dl1 direct call": lambda x: dl1_call(a, identity, [x]),
            "(c) actor sync, via scheduler": lambda x: actor_a.echo(x).result(),
            "(c') actor sync, direct": with_direct(True, lambda x: actor_a.echo(x).result()),
            "(d) actor async, via scheduler": lambda x: actor_a.aecho(x).result(),
            "(d') actor async, direct": with_direct(True, lambda x: actor_a.aecho(x).result()),
            "(e) actor sync A->B, total": with_direct(
                True, leg("(e) actor sync A->B, leg in A", lambda x: actor_a.via_peer(x).result())
            ),
            "(e') actor async A->B, total": with_direct(
                True,
                leg("(e') actor async A->B, leg in A", lambda x: actor_a.avia_peer(x).result()),
            ),
            "(b') dl1 server A->B, total": leg(
                "(b') dl1 server A->B, leg in A",
                lambda x: dl1_call(a, dl1_peer_echo, [b, session, x]),
            ),
        }
        payloads = {"100 B": np.arange(12.0), "8 MB": np.random.default_rng(0).random(10**6)}

        times: dict[tuple[str, str], list[float]] = {}
        for pname, x in payloads.items():
            for name, fn in modes.items():  # warm-up, and a check of the echo
                for _ in range(args.warm):
                    y = fn(x)
                assert np.array_equal(y, x), name
            legs = {}
            per_round = -(-args.calls // args.rounds)
            for _ in range(args.rounds):
                for name, fn in modes.items():
                    ts = times.setdefault((name, pname), [])
                    for _ in range(per_round):
                        t0 = time.perf_counter()
                        fn(x)
                        ts.append(time.perf_counter() - t0)
            for name, ss in legs.items():
                times[(name, pname)] = list(ss)
            print(f"payload {pname}: done", flush=True)

        names = []
        for name in modes:
            names.append(name)
            for ln in all_legs:
                if ln.startswith(name.split(",")[0]) and ln not in names and "leg" in ln:
                    names.append(ln)

        def q(ts, f):
            s = sorted(ts)
            return s[min(len(s) - 1, int(f * len(s)))] * 1e3

        print()
        print(f"{'mode':36s} | " + " | ".join(f"{p:>8s} med  p90" for p in payloads))
        print("-" * 37 + "|" + "|".join("-" * 19 for _ in payloads))
        for name in names:
            cells = []
            for pname in payloads:
                ts = times.get((name, pname), [])
                cells.append(f"{statistics.median(ts) * 1e3:8.2f} {q(ts, 0.9):8.2f}"
                             if ts else " " * 17)  # fmt: skip
            n = len(times.get((name, "100 B"), []))
            print(f"{name:36s} | " + " | ".join(cells) + f"   (n={n})")

        # -- the one actor thread of a worker: A -> B -> A deadlocks ----------------------
        client.direct_to_workers = True
        fa2 = client.submit(Echo, actor=True, workers=[a], pure=False)
        actor_a2 = fa2.result()
        print()
        print("actor thread of a worker (ThreadPoolExecutor(1), shared by its actors):")
        t0 = time.perf_counter()
        out = actor_a.chain([actor_b, actor_a2], 3.0).result(timeout=30)
        print(f"  A1.chain -> B.chain -> A2.chain (another actor on A): {out!r},"
              f" {time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        out = actor_b.chain([actor_a2], 3.0).result(timeout=30)
        print(f"  B.chain -> A2.chain (A's thread free): {out!r}, {time.perf_counter() - t0:.2f} s")

        # -- lifetime: a released future, a disconnected client ----------------------------
        def wanted(key):
            me = client.id

            def f(dask_scheduler):
                ts = dask_scheduler.tasks.get(key)
                if ts is None:
                    return "gone"
                who = ["this client" if c.client_key == me else c.client_key
                       for c in ts.who_wants]  # fmt: skip
                return f"{ts.state}, wanted by {who}"

            return client.run_on_scheduler(f)

        def on_a():
            return len(client.run(actors_on, workers=[a])[a])

        print()
        print("actor lifetime (actors held by worker A's state.actors; the key at the scheduler):")
        k2 = fa2.key
        print(f"  A2 (its handle passed to A and B above): {on_a()} on A; {wanted(k2)}")
        del actor_a2, fa2
        deadline = time.time() + 3
        while wanted(k2) != "gone" and time.time() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)
        print(f"  3 s after the client dropped A2's future and handle: {on_a()} on A; {wanted(k2)}")
        if wanted(k2) != "gone":
            # a handle passed as an argument can stay referenced from a cycle in the
            # client's rpc machinery until the garbage collector runs
            gc.collect()
            deadline = time.time() + 5
            while wanted(k2) != "gone" and time.time() < deadline:
                time.sleep(0.2)
            time.sleep(0.5)
            print(f"  after gc.collect() in the client: {on_a()} on A; {wanted(k2)}")
        with Client(cluster.scheduler_address) as other:
            fo = other.submit(Echo, actor=True, workers=[a], pure=False)
            ho, ko = fo.result(), fo.key
            print(f"  a second client's actor on A: {on_a()} on A; {wanted(ko)}")
        time.sleep(1.0)
        print(f"  after that client closed: {on_a()} on A; {wanted(ko)}")
        try:
            r = ho.echo(1).result(timeout=5)
            print(f"  its handle still answers: {r!r}")
        except Exception as exc:
            print(f"  its handle: {type(exc).__name__}: {exc}")

        # a peer's handle to an actor that was released: the peer's call never returns
        # (actor.py catches only OSError; the worker's KeyError leaves the ActorFuture unset)
        f3 = client.submit(Echo, actor=True, workers=[a], pure=False)
        actor_a3 = f3.result()
        actor_b.set_peer(actor_a3).result()
        print(f"  B calls A3 through its handle: {actor_b.via_peer(7).result(timeout=5)[0]!r}")
        k3 = f3.key
        del actor_a3, f3
        gc.collect()
        deadline = time.time() + 5
        while wanted(k3) != "gone" and time.time() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)
        print("  A3 released by the client; B calls it again (the worker logs a KeyError):")
        for what, call in [("B.via_peer -> A3", lambda: actor_b.via_peer(8)),
                           ("B.echo after that", lambda: actor_b.echo(9))]:  # fmt: skip
            t0 = time.perf_counter()
            try:
                r = call().result(timeout=5)
                print(f"    {what}: {r!r}")
            except Exception as exc:
                print(f"    {what}: {type(exc).__name__} after {time.perf_counter() - t0:.1f} s")
        client.direct_to_workers = None


if __name__ == "__main__":
    main()
