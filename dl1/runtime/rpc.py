"""Direct calls to the workers for the latency-bound steps of the working-set solver.

A round's steps (every partition scans, the coordinator chooses, one worker solves the
subproblem) are short and dependent: through the scheduler each costs a task round trip.
:class:`RpcExecutor` sends them instead to a :class:`~dl1.runtime.partition_server.
PartitionServer` on each worker, which runs the very same task functions (same inputs, same
results, bit for bit) on the blocks its worker holds, keeps the working set's columns
between rounds and runs the pass that follows a subproblem (see ``docs/design.md``). The
servers live in a Dask worker plugin and the calls are messages of Dask's own rpc
(:mod:`dl1.runtime.calls`), so Dask's TLS and authentication apply. Nothing a server holds
is irreplaceable: a call that fails (a worker lost, a block moved) is re-issued as ordinary
tasks, and so is every later step; the fit goes on.
"""

from __future__ import annotations

import asyncio
import uuid
from concurrent.futures import Future
from typing import Any

import dask
import numpy as np

from dl1.errors import ValidationError
from dl1.runtime.calls import Call, send_call, start_call
from dl1.runtime.executor import PROBE_S, DistributedExecutor, PassRequest
from dl1.runtime.wire import (
    OPENER,
    ROUTED,
    BlockMissing,
    BlockMoved,
    GroupRef,
    ScanPlan,
    ServerClosed,
    ValueRef,
    WireBlock,
    WireGroup,
    WireValue,
    like,
)
from dl1.tasks.blocks import identity
from dl1.tasks.columns import compact_task, extract_task

#: Dask configuration: whether a pass's dual point goes from the subproblem's server to its
#: peers along a binomial tree (True) or straight to each (False); "auto" (the default):
#: along the tree from :data:`TREE_BYTES` up.
TREE_KEY = "dl1.scan-tree"

#: The smallest dual point (bytes) "auto" sends along the tree: 1 MiB, 131,072 rows. A
#: send fewer saves A's link 0.8 ms of a 10 Gbit/s link, about what a hop more costs (a
#: round trip and a server's forwarding); smaller vectors go straight, in one hop.
TREE_BYTES = 2**20


def tree_setting() -> int:
    """``dl1.scan-tree`` from Dask's configuration (see :data:`TREE_KEY`), as the smallest
    dual point, in bytes, sent along the tree."""
    value = dask.config.get(TREE_KEY, "auto")
    if isinstance(value, str) and value.lower() in ("true", "false", "auto"):
        value = {"true": True, "false": False}.get(value.lower(), "auto")
    if value is True:
        return 0
    if value is False:
        return 2**63 - 1
    if value == "auto":
        return TREE_BYTES
    raise ValidationError(f"{TREE_KEY} must be 'auto', True or False; got {value!r}")


def no_result() -> None:
    return None


class RpcFuture:
    """The result of a call to a server; ``fallback()``'s (the same step by tasks) if the
    call fails."""

    def __init__(self, ex: RpcExecutor, fut: Any, fallback: Any) -> None:
        self._ex, self._fut, self._fallback = ex, fut, fallback

    def result(self) -> Any:
        try:
            return self._ex.wait_call(self._fut)
        except BlockMoved:
            # this step by tasks; the next ones go where the scheduler now has the blocks
            self._ex.forget_holders()
            return self._fallback()
        except Exception:
            # a lost worker, a moved block, or the function's own error: the task path
            # recomputes what the servers held, and raises the function's own errors itself
            # (a stalled cluster does not: the watchdog's error stands)
            self._ex.fall_back()
            return self._fallback()


class RpcExecutor(DistributedExecutor):
    """A :class:`DistributedExecutor` that runs the working-set solver's per-round steps by
    direct calls to a :class:`PartitionServer` on each worker (see the module docstring).

    :meth:`submit` of a routed function calls the server of the worker holding the call's
    blocks (the first worker for the subproblem, whose server caches the working set's
    columns); ``extract_task``, ``compact_task`` and ``identity`` return lazy references
    made on first use. Anything else, and everything once a call has failed, runs as tasks.
    """

    def __init__(self, base: DistributedExecutor) -> None:
        self.client = base.client
        self.workers = base.workers
        self.n_workers = base.n_workers
        self.watch, self.limits, self.baselines = base.watch, base.limits, base.baselines
        self.broken = False
        self.session = uuid.uuid4().hex
        # whether calls go straight to the workers (else through the scheduler)
        self.direct_calls = False
        self._servers: list[str] = []
        self._holder: dict[Any, str | None] = {}
        self._sent: dict[str, set[str]] = {}
        # the servers start while the caller loads its blocks; first use waits for them
        self._opening = OPENER.submit(self._open_servers)

    @property
    def transport(self) -> str:
        """How steps run now: ``"direct"`` (calls to the servers) or ``"tasks"``."""
        return "tasks" if self.broken else "direct"

    def _ready(self) -> list[str]:
        """The workers with a server of this solve (sorted addresses); raises if none
        could be started."""
        if not self._servers and not self.broken:
            self._servers = self.watch.poll(
                self._opening.result,
                lambda: "the partition servers to start",
                depends_on=lambda: list(self.workers),
            )
        return self._servers

    def _open_servers(self) -> list[str]:
        """Register the plugin (once per cluster) and start a server of this solve on every
        worker alive, straight or through the scheduler (:meth:`_reachable`)."""
        # local: dl1.runtime.servers imports distributed (a WorkerPlugin), which import
        # dl1.runtime.rpc (and so dl1.penalised, the CLI) does without until a solve
        from dl1.runtime.servers import PartitionServers

        self.client.register_plugin(PartitionServers())
        alive = set(self.client.scheduler_info()["workers"])
        workers = [w for w in self.workers if w in alive]
        if not workers:
            raise BlockMissing("no worker to start a server on")
        self.direct_calls = self._reachable(workers)
        if not self.direct_calls:
            opens = [
                self._send(addr, "dl1_open", session=self.session, peers=workers,
                           client=self.client.id)
                for addr in workers
            ]  # fmt: skip
            for fut in opens:
                fut.result()
        return workers

    def _reachable(self, workers: list[str]) -> bool:
        """Whether this client calls the servers directly: as its ``direct_to_workers`` says,
        or, when that is unset (Dask's default), if every worker answers a direct call (the
        opening of its server) within :data:`PROBE_S` seconds."""
        if self.client.direct_to_workers is not None and not self.client.direct_to_workers:
            return False
        try:
            for addr in workers:
                probe = asyncio.wait_for(self._direct_open(addr, workers), PROBE_S)
                fut = asyncio.run_coroutine_threadsafe(probe, self.client.loop.asyncio_loop)
                if fut.result() != addr:
                    return False
        except Exception:
            return False
        return True

    async def _direct_open(self, addr: str, workers: list[str]) -> str:
        """Start this solve's server on ``addr`` by a direct call (its peers: ``workers``);
        the worker's address."""
        reply = await send_call(
            self.client.rpc, addr, "dl1_open", session=self.session, peers=workers,
            client=self.client.id,
        )  # fmt: skip
        if "closed" in reply:
            raise ServerClosed(reply["closed"])
        return reply["address"]

    def _via(self) -> Any:
        """The scheduler's rpc when calls go through it, else None (straight to workers)."""
        return None if self.direct_calls else self.client.scheduler

    def _send(self, addr: str, op: str, **msg: Any) -> Future:
        """Handler ``op`` of ``addr`` with ``msg``, as a future of its reply."""
        coro = send_call(self.client.rpc, addr, op, self._via(), **msg)
        return asyncio.run_coroutine_threadsafe(coro, self.client.loop.asyncio_loop)

    def invoke(self, addr: str, method: str, *args: Any) -> Call:
        """A call of ``method(*args)`` of this solve's server on ``addr`` (its result:
        :meth:`wait_call`)."""
        loop = self.client.loop.asyncio_loop
        msg = (method, args)
        via = self._via()
        return start_call(loop, self.client.rpc, addr, "dl1_call", msg, via, session=self.session)

    def ask(self, addr: str, method: str, *args: Any) -> Any:
        """The result of ``method(*args)`` of the server on ``addr`` (e.g. its
        ``held_groups``)."""
        return self.wait_call(self.invoke(addr, method, *args))

    def wait_call(self, call: Any) -> Any:
        """The result of a call to a server, or BlockMissing once the scheduler no longer
        lists a server's worker (a call to a worker that vanished without closing its
        connections could wait long); the watchdog bounds the wait
        (:mod:`dl1.runtime.watchdog`: a call is alive while its servers' workers are
        listed)."""
        if self.watch.failed is not None:
            raise self.watch.failed
        return self.watch.poll(
            lambda t: call.result(timeout=t),
            lambda: "a direct call to the partition servers",
            depends_on=lambda: list(self._servers) or list(self.workers),
            on_lost=lambda lost: BlockMissing(f"worker {lost[0]} was lost during a call"),
        )

    def _close_servers(self, wait: bool) -> None:
        """Close this solve's servers (waiting for their answers with ``wait``); those
        still starting once they have."""
        self._servers = []
        if not self._opening.done():
            self._opening.add_done_callback(lambda _: self._close_servers(wait=False))
            return
        if self._opening.exception() is not None:
            return
        opened = self._opening.result()
        futs = [self._send(addr, "dl1_close", session=self.session) for addr in opened]
        for fut in futs if wait else []:
            try:
                fut.result(timeout=PROBE_S)
            except Exception:
                pass

    def close(self) -> None:
        """Close the servers of this solve (their caches go with them): at its end, and
        when it is interrupted (``finally``); servers still starting are closed once they
        have. A server its client could not close (a killed process) closes itself once
        the scheduler no longer lists that client (:mod:`dl1.runtime.servers`)."""
        if not self.broken:
            self._close_servers(wait=True)

    def fall_back(self) -> None:
        """Run everything as tasks from now on, and let the servers go."""
        self.broken = True
        try:
            self._close_servers(wait=False)
        except Exception:
            pass

    # -- where things are ------------------------------------------------------------------
    def forget_holders(self) -> None:
        """Look the blocks up again at the next call (Dask moved one: :class:`BlockMoved`)."""
        self._holder.clear()

    def _holders(self, futures: list[Any]) -> list[str | None]:
        unknown = [f for f in futures if f.key not in self._holder]
        if unknown:
            who = self.client.who_has(unknown)
            for f in unknown:
                addrs = [a for a in who.get(f.key, ()) if a in self._ready()]
                self._holder[f.key] = addrs[0] if addrs else None
        return [self._holder[f.key] for f in futures]

    def holder_of(self, blocks: list[Any]) -> str | None:
        """The worker with a server holding every one of ``blocks`` (futures), or None when
        they are not all on one such worker (or one is not a future)."""
        # local: distributed (~0.3 s to import), which import dl1.runtime.rpc does without
        from distributed import Future

        if not blocks or not all(isinstance(b, Future) for b in blocks):
            return None
        where = set(self._holders(blocks))
        return where.pop() if len(where) == 1 and None not in where else None

    def wire_blocks(self, blocks: list[Any]) -> list[Any]:
        """``blocks`` as a server names them: futures by their keys (sources as they are)."""
        # local: distributed (~0.3 s to import), which import dl1.runtime.rpc does without
        from distributed import Future

        return [WireBlock(b.key) if isinstance(b, Future) else b for b in blocks]

    def _block_futures(self, a: Any, out: list[Any]) -> None:
        # local: distributed (~0.3 s to import), which import dl1.runtime.rpc does without
        from distributed import Future

        if isinstance(a, (list, tuple)):
            for x in a:
                self._block_futures(x, out)
        elif isinstance(a, Future):
            out.append(a)

    def _wire(self, a: Any, addr: str) -> Any:
        # local: distributed (~0.3 s to import), which import dl1.runtime.rpc does without
        from distributed import Future

        if isinstance(a, list):
            return [self._wire(x, addr) for x in a]
        if isinstance(a, tuple):
            return like(a, (self._wire(x, addr) for x in a))
        if isinstance(a, Future):
            return WireBlock(a.key)
        if isinstance(a, GroupRef):
            return self._wire_group(a)
        if isinstance(a, ValueRef):
            sent = self._sent.setdefault(addr, set())
            value = None if a.vid in sent else a.value
            sent.add(a.vid)
            return WireValue(a.vid, value)
        return a

    def _wire_group(self, g: GroupRef) -> WireGroup:
        # local: distributed (~0.3 s to import), which import dl1.runtime.rpc does without
        from distributed import Future

        if g.parent is not None:
            return WireGroup(g.gid, None, None, None, self._wire_group(g.parent), g.keep)
        if isinstance(g.block, Future):
            holder = self._holders([g.block])[0]
            if holder is None:
                raise BlockMissing(f"block {g.block.key!r} is on no worker with a server")
            return WireGroup(g.gid, holder, g.block.key, g.local, None, None)
        return WireGroup(g.gid, None, g.block, g.local, None, None)

    # -- the task path ---------------------------------------------------------------------
    def _as_task_arg(self, a: Any) -> Any:
        if isinstance(a, list):
            return [self._as_task_arg(x) for x in a]
        if isinstance(a, tuple):
            return like(a, (self._as_task_arg(x) for x in a))
        if isinstance(a, ValueRef):
            if a.future is None:
                a.future = DistributedExecutor.submit(self, identity, a.value)
            return a.future
        if isinstance(a, GroupRef):
            if a.future is None:
                if a.parent is not None:
                    a.future = DistributedExecutor.submit(
                        self, compact_task, self._as_task_arg(a.parent), a.keep
                    )
                else:
                    a.future = DistributedExecutor.submit(self, extract_task, a.block, a.local)
            return a.future
        return a

    def task_submit(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` as a task, the references among its arguments made tasks too."""
        return DistributedExecutor.submit(self, fn, *[self._as_task_arg(a) for a in args])

    def by_task(self, fn: Any, *args: Any) -> Any:
        """The result of ``fn(*args)`` run as a task (a failed call's fallback)."""
        if self.watch.failed is not None:
            raise self.watch.failed
        return DistributedExecutor.gather(self, [self.task_submit(fn, *args)])[0]

    # -- the executor interface ------------------------------------------------------------
    def submit(self, fn: Any, *args: Any) -> Any:
        if not self.broken:
            if fn is identity:
                return ValueRef(args[0])
            if fn is extract_task:
                return GroupRef(block=args[0], local=args[1])
            if fn is compact_task and isinstance(args[0], GroupRef):
                return GroupRef(parent=args[0], keep=args[1])
            if fn in ROUTED:
                try:
                    blocks: list[Any] = []
                    self._block_futures(args, blocks)
                    # the subproblem (no blocks) runs on the first server, which caches
                    # its columns between rounds
                    holders = set(self._holders(blocks)) if blocks else {min(self._ready())}
                    if len(holders) == 1 and None not in holders:
                        (addr,) = holders
                        wire = [self._wire(a, addr) for a in args]
                        fut = self.invoke(addr, "call", fn, wire)
                        return RpcFuture(self, fut, lambda: self.by_task(fn, *args))
                except Exception:  # no server, or a block on none: tasks from now on
                    self.fall_back()
        return self.task_submit(fn, *args)

    def submit_then_scan(self, request: PassRequest, fn: Any, *args: Any) -> RpcFuture | None:
        """``fn(*args)`` (a working-set subproblem) on its server, which then runs the
        ``request``ed pass as the coordinator would (:meth:`PartitionServer.call`). A
        handle whose ``result()`` is ``(fn's result, each partition's scan results or None,
        the pass's seconds)``; None when a partition's blocks are not all held by one
        server (then submit ``fn`` alone)."""
        return self._home_call(
            request,
            "call",
            lambda home, plan: (fn, [self._wire(a, home) for a in args], plan),
            # by tasks: the subproblem alone (the coordinator then runs the pass)
            lambda: (self.by_task(fn, *args), None, 0.0),
        )

    def submit_pass(self, request: PassRequest, theta: np.ndarray, w_parts: list[Any],
                    ws_size: int) -> RpcFuture | None:  # fmt: skip
        """The ``request``ed pass at ``theta`` run by the subproblem's server, its peers'
        partitions by its calls to them (:meth:`PartitionServer.scan_pass`). A handle whose
        ``result()`` is each partition's scan results, or None if the call failed (the
        executor then runs tasks); None when a partition's blocks are not all held by one
        server."""
        return self._home_call(
            request,
            "scan_pass",
            lambda home, plan: (plan, theta, w_parts, int(ws_size)),
            no_result,
        )

    def _home_call(self, request: PassRequest, method: str, args: Any, fallback: Any) -> Any:
        """``method(*args(home, plan))`` of the subproblem's server (``home``), ``plan``
        the wire form of the pass :meth:`_plan` makes of ``request``: an
        :class:`RpcFuture` falling back to ``fallback()``; None when there is no such plan
        or server."""
        if self.broken:
            return None
        try:
            plan = self._plan(request)
            if plan is None:
                return None
            home = min(self._ready())
            return RpcFuture(self, self.invoke(home, method, *args(home, plan)), fallback)
        except Exception:  # no server, or a block on none: tasks from now on
            self.fall_back()
            return None

    def _plan(self, request: PassRequest) -> ScanPlan | None:
        """The wire form of the ``request``ed pass (None: a partition's blocks are not all
        futures held by one server)."""
        # local: distributed (~0.3 s to import), which import dl1.runtime.rpc does without
        from distributed import Future

        holders = []
        for part in request.parts:
            if not all(isinstance(b, Future) for b in part):
                return None
            where = set(self._holders(part))
            if len(where) != 1 or None in where:
                return None
            holders.append(where.pop())
        blocks = [[WireBlock(b.key) for b in part] for part in request.parts]
        return ScanPlan(holders, blocks, request.bounds, request.alive, float(request.threshold),
                        int(request.ws_start), tree_setting())  # fmt: skip

    def submit_to(self, part: int, fn: Any, *args: Any) -> Any:
        if not self.broken and fn is extract_task:
            return GroupRef(block=args[0], local=args[1])
        return DistributedExecutor.submit_to(self, part, fn, *[self._as_task_arg(a) for a in args])

    def wait(self, handles: list[Any]) -> None:
        """Wait for ``handles`` (the blocks) and for the servers, started meanwhile."""
        DistributedExecutor.wait(self, handles)
        if not self.broken:
            try:
                self._ready()
            except Exception:
                self.fall_back()

    def broadcast(self, fn: Any, *args: Any) -> None:
        if not self.broken:
            try:
                for fut in [self.invoke(a, "call", fn, list(args)) for a in self._ready()]:
                    self.wait_call(fut)
                return
            except Exception:
                self.fall_back()
        DistributedExecutor.broadcast(self, fn, *args)

    def gather(self, handles: list[Any]) -> list[Any]:
        out: list[Any] = [None] * len(handles)
        tasks = [i for i, h in enumerate(handles) if not isinstance(h, RpcFuture)]
        for i, h in enumerate(handles):
            if isinstance(h, RpcFuture):
                out[i] = h.result()
        if tasks:
            got = DistributedExecutor.gather(self, [self._as_task_arg(handles[i]) for i in tasks])
            for i, v in zip(tasks, got, strict=True):
                out[i] = v
        return out


def rpc_executor(ex: Any) -> Any:
    """``ex`` with direct calls to its workers (a :class:`DistributedExecutor`), else ``ex``;
    servers that cannot start fall back to the task path at first use."""
    if type(ex) is not DistributedExecutor:
        return ex
    try:
        return RpcExecutor(ex)
    except Exception:
        return ex
