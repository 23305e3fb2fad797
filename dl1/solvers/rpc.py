"""Direct calls to the workers for the latency-bound steps of the working-set solver.

A working-set round is a chain of short dependent steps: every partition scans its blocks
with the current dual point, the coordinator picks the working set, one worker solves the
subproblem on the gathered columns. Through the scheduler each step costs a task round
trip, a fixed cost per round that is a large part of a short fit's time.

So :class:`RpcExecutor` sends those steps to a :class:`PartitionServer` on each worker,
which runs the very same task functions (same inputs, same results, bit for bit) on the
blocks its worker holds (futures of the solve, looked up by key in the worker's memory) and
keeps the working set's gathered columns between rounds. The columns travel from worker to
worker (the server solving the subproblem asks its peers), never through the client. After
a subproblem, its server runs the next pass itself (the coordinator's own steps on the same
values: ``z + dz``, the intercept's update, the dual point), its peers' partitions by direct
calls, and returns the pass's results with the subproblem's: one call from the coordinator
per round instead of two; the coordinator still computes every gap and picks every working
set. The coordinator's first pass goes through that server too.

After each pass it ran, the server also repeats the coordinator's choice of the next
working set (:func:`~dl1.solvers.scans.choose_working_set`, on the same values) and fetches the
columns it does not hold yet, its own and its peers', while the coordinator turns around.
The next call takes those it names; a choice that differed would only cost the work
(``test_rpc`` asserts that none does).

The servers live in a worker plugin (:class:`~dl1.solvers.servers.PartitionServers`, one
server per solve, named by the executor's session), and the calls are messages of Dask's
own rpc (:mod:`dl1.solvers.calls`): sent straight to the workers on the client's
connection pool when it can reach them, else forwarded by the scheduler; from server to
server on the worker's pool. Dask's comm brings its TLS and authentication.

Nothing a server holds is irreplaceable: the blocks stay task results the scheduler can
recompute, and the gathered columns and constants are caches whose lineage (block, columns)
the coordinator keeps. When a call fails (a worker died, a block moved after one did), the
executor re-issues it, and every later step, as ordinary tasks; the fit goes on.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from dl1.solvers.calls import Call, Packed, pack_result, send_call, start_call, unpack
from dl1.solvers.executor import DistributedExecutor
from dl1.solvers.records import SubproblemCall
from dl1.tasks.blocks import identity
from dl1.tasks.columns import compact_task, extract_task
from dl1.tasks.gram import SERVER_MEMORY_LIMIT, drop_gram
from dl1.tasks.passes import coef_parts, matvec_task, pass_dual_point, scan_task, xt_theta_task
from dl1.tasks.subproblem import subproblem_task

#: Task functions a server runs (the others go through the scheduler).
ROUTED = (scan_task, matvec_task, xt_theta_task, subproblem_task)

#: Methods of a :class:`PartitionServer` a call may name.
SERVED = frozenset({"call", "scan_pass", "extract", "held_groups", "ahead_stats"})

#: Name of the worker plugin holding the servers (see :mod:`dl1.solvers.servers`).
PLUGIN_NAME = "dl1-partition-servers"

#: Connections a server's worker opens to each peer as the server starts: a peer's scan and
#: the columns fetched ahead may be asked at once.
PEER_CONNECTIONS = 2

#: Servers a worker keeps at most (the least recently used is closed first): solves close
#: theirs, this bounds those of coordinators that died first.
MAX_SERVERS = 8


class BlockMissing(RuntimeError):
    """A block the coordinator expected in a worker's memory is not there (or the worker)."""


class ServerClosed(RuntimeError):
    """A call named a server that its worker does not hold (closed, or never opened)."""


#: Threads starting the servers of solves while their blocks load (:class:`RpcExecutor`).
_OPENER = ThreadPoolExecutor(4, thread_name_prefix="dl1-open")

#: Seconds between checks that the workers of a call are alive while it runs.
POLL_S = 1.0

#: Seconds the client waits for a worker to answer a first direct call before it sends its
#: calls through the scheduler instead (a client that cannot reach the workers' addresses).
PROBE_S = 5.0


def _wait(call: Any, workers: Any, client: Any) -> Any:
    """``call.result()``, checking every :data:`POLL_S` that the ``workers()`` it depends on
    are still in ``client``'s cluster: a call to a worker that vanished without closing its
    connections could otherwise wait for a long time."""
    while True:
        try:
            return call.result(timeout=POLL_S)
        except TimeoutError:
            alive = set(client.scheduler_info()["workers"])
            lost = [w for w in workers() if w not in alive]
            if lost:
                raise BlockMissing(f"worker {lost[0]} was lost during a call") from None


@dataclass(frozen=True)
class _Block:
    """Wire form of a block held in the receiving server's worker memory."""

    key: Any


@dataclass(frozen=True)
class _Group:
    """Wire form of a gathered column group: its id and lineage (``holder`` and ``block``:
    the worker and block key to extract ``local`` from, or ``parent`` and ``keep``)."""

    gid: str
    holder: str | None
    block: Any
    local: np.ndarray | None
    parent: _Group | None
    keep: np.ndarray | None


@dataclass(frozen=True)
class _ScanPlan:
    """Wire form of the pass that follows a subproblem on its server (see
    :meth:`PartitionServer.call`): per partition, the worker holding its blocks, the blocks,
    their column ranges and alive sets; the pass's threshold and the working set's minimum
    size."""

    holders: list[str]
    blocks: list[list[Any]]
    bounds: list[list[tuple[int, int]]]
    alive: list[list[Any]]
    threshold: float
    ws_start: int


@dataclass(frozen=True)
class _Value:
    """Wire form of a constant of the solve; ``value`` is None once the server holds it."""

    vid: str
    value: Any


class ValueRef:
    """A constant input of the solve (``y``, sample weights): sent to a server once."""

    def __init__(self, value: Any) -> None:
        self.vid = uuid.uuid4().hex
        self.value = value
        self.future: Any = None


class GroupRef:
    """Columns of one block gathered for the subproblem (as
    :func:`~dl1.tasks.columns.extract_task`, or :func:`~dl1.tasks.columns.compact_task` of a
    parent group), made on
    first use by the server solving the subproblem and cached there."""

    def __init__(
        self,
        block: Any = None,
        local: np.ndarray | None = None,
        parent: GroupRef | None = None,
        keep: np.ndarray | None = None,
    ) -> None:
        self.gid = uuid.uuid4().hex
        self.block = block
        self.local = None if local is None else np.asarray(local, dtype=np.int64)
        self.parent = parent
        self.keep = None if keep is None else np.asarray(keep, dtype=np.int64)
        self.future: Any = None


class PartitionServer:
    """The server of one solve on one worker: runs routed task functions on the blocks held
    there, one method at a time, in a thread of its own (the worker's event loop goes on)."""

    def __init__(self, worker: Any, session: str) -> None:
        from dl1.solvers.executor import warm_up

        warm_up()
        self._worker = worker
        self.session = session
        limit = worker.memory_manager.memory_limit
        # one method at a time: the calls' thread; and the next round's columns, fetched
        # while the coordinator turns around (:meth:`_fetch_ahead`), in a thread of their own
        self.calls = _server_thread("dl1-server", limit)
        self._pool = _server_thread("dl1-ahead", limit)
        self._groups: dict[str, tuple] = {}
        self._values: dict[str, Any] = {}
        # a future of {(block key, local ids): where they are}
        self._ahead: Future | None = None
        self._got_ahead: dict[tuple, tuple] = {}
        self._served_ahead = 0  # column groups taken from those fetched in advance
        self._fetched_late = 0  # ... and groups extracted while a call waited
        # the groups the current call took from those fetched in advance
        self._ahead_gids: set[str] = set()

    def serve(self, payload: Packed) -> Packed:
        """The packed result of the call ``payload`` packs: ``(method, args)``."""
        method, args = unpack(payload)
        if method not in SERVED:
            raise ValueError(f"a partition server has no method {method!r}")
        return pack_result(getattr(self, method)(*args))

    def close(self) -> None:
        """Let the threads and the caches go (a call running finishes first)."""
        self.calls.shutdown(wait=False)
        self._pool.shutdown(wait=False)
        self._groups, self._values, self._got_ahead = {}, {}, {}

    def held_groups(self) -> list[str]:
        """Ids of the column groups cached here (the last subproblem's)."""
        return list(self._groups)

    def ahead_stats(self) -> tuple[int, int]:
        """Column groups a call took so far from those fetched in advance
        (:meth:`_fetch_ahead`), and groups extracted (here or by a peer) while a call
        waited."""
        return self._served_ahead, self._fetched_late

    def _block(self, b: Any) -> Any:
        if not isinstance(b, _Block):
            return b  # a block source: read here
        try:
            return self._worker.data[b.key]
        except KeyError:
            where = self._worker.address
            raise BlockMissing(f"block {b.key!r} is not in the memory of {where}") from None

    def _ask(self, holder: str, method: str, *args: Any) -> Call:
        """A call of this solve's server on the peer ``holder``; its reply is read by the
        worker's event loop as soon as it comes (a peer lost closes the connection: its
        ``result()`` raises)."""
        loop = self._worker.loop.asyncio_loop
        msg = (method, args)
        return start_call(loop, self._worker.rpc, holder, "dl1_call", msg, session=self.session)

    def extract(self, wanted: list[tuple[Any, np.ndarray]]) -> list[tuple]:
        """:func:`~dl1.tasks.columns.extract_task` of blocks held here (for a peer): one
        call per peer and subproblem."""
        return [extract_task(self._block(_Block(key)), local) for key, local in wanted]

    def call(self, fn: Any, args: list[Any], then_scan: _ScanPlan | None = None) -> Any:
        """``fn(*args)`` with blocks, groups and constants resolved here.

        Groups held by peers are asked for first (one call per peer), made here meanwhile.
        A call that uses column groups replaces the cache of groups by the ones it used
        (a working set's next round keeps most of them, and gets the rest from this call).

        ``then_scan`` (a subproblem's call): this server then runs the pass that follows,
        as the coordinator would (:meth:`_scan_after`), and returns ``(fn's result, the
        pass's results per partition, the pass's seconds here)``: a round then costs one
        call from the coordinator instead of two, and the pass's dual point does not travel.
        """
        # the columns fetched in advance are for the next call that uses groups; a solve's
        # end (its Gram matrix dropped) lets them go
        self._got_ahead, ahead_wait, self._ahead_gids = {}, 0.0, set()
        if fn is drop_gram or _has_groups(args):
            self._got_ahead, ahead_wait = self._take_ahead(time.perf_counter())
        remote: dict[str, list[_Group]] = {}
        self._remote_groups(args, remote)
        asked = [
            (groups, self._ask(holder, "extract", [(g.block, g.local) for g in groups]))
            for holder, groups in remote.items()
        ]
        self._fetched_late += sum(len(groups) for groups in remote.values())
        for _, call in asked:
            call.wait_sent()
        used: dict[str, tuple] = {}
        self._resolve(args, used, local_only=True)  # local work while the peers extract
        # the peers extract while this server does: the extraction time on the critical
        # path, the one a fresh group's ``seconds`` reports, is the longest of the two
        local_s = sum(e.seconds for gid, e in used.items() if gid not in self._groups)
        peer_s = 0.0
        for groups, fut in asked:
            got = fut.result()
            peer_s = max(peer_s, sum(e.seconds for e in got))
            for g, e in zip(groups, got, strict=True):
                used[g.gid] = e._replace(seconds=0.0)
        if asked:
            g0 = asked[0][0][0].gid
            used[g0] = used[g0]._replace(seconds=max(0.0, peer_s - local_s))
        served = [gid for gid in used if gid in self._ahead_gids]
        if served:  # new groups, whose extraction seconds the call counts
            used[served[0]] = used[served[0]]._replace(seconds=ahead_wait)
        resolved = self._resolve(args, used)
        self._got_ahead = {}
        out = fn(*resolved)
        if used:
            self._groups = used
        if then_scan is not None:
            t0 = time.perf_counter()
            call = SubproblemCall(*resolved)
            support = call.ws[out.w_ws != 0]  # the working set holds every nonzero
            ws_size = max(then_scan.ws_start, 2 * support.shape[0])
            scans = self._scan_after(out, resolved, then_scan, ws_size)
            self._look_ahead(then_scan, scans, support, ws_size, call.group_ids)
            out = (out, scans, time.perf_counter() - t0)
        return out

    def scan_pass(
        self,
        plan: _ScanPlan,
        theta: np.ndarray,
        w_parts: list[Any],
        ws_size: int,
        support: np.ndarray,
        cached: list[np.ndarray],
    ) -> list[Any]:
        """A pass over the partitions of ``plan`` at the coordinator's dual point ``theta``
        (``w_parts``: each partition's coefficients by block), its peers' partitions by
        direct calls; then, as after a subproblem, the columns of the working set the
        coordinator will choose from it (``support``, ``ws_size``; ``cached``: the ids of
        the column groups it holds) are fetched in advance. Returns each partition's
        results."""
        scans = self._scan(plan, theta, w_parts, ws_size)
        self._look_ahead(plan, scans, support, ws_size, cached)
        return scans

    def _look_ahead(
        self,
        plan: _ScanPlan,
        scans: list[Any],
        support: np.ndarray,
        ws_size: int,
        cached: list[np.ndarray],
    ) -> None:
        """Start :meth:`_fetch_ahead` in this server's own thread: the call returns
        meanwhile."""
        self._ahead = self._pool.submit(self._fetch_ahead, plan, scans, support, ws_size, cached)

    def _fetch_ahead(
        self,
        plan: _ScanPlan,
        scans: list[Any],
        support: np.ndarray,
        ws_size: int,
        cached: list[np.ndarray],
    ) -> tuple[dict[tuple, tuple], tuple[float, float, float, float]]:
        """Fetch the columns the coordinator will ask for next, while it turns around.

        After a pass it ran (``scans``, per partition), this server holds what the
        coordinator chooses the next working set from: the pass's candidates, the support
        and the working set's size. It repeats the choice
        (:func:`~dl1.solvers.scans.choose_working_set`, the coordinator's own function on the
        same values); the chosen columns not among those of the groups held (``cached``,
        their ids: the coordinator keeps them, see :class:`~dl1.solvers.ws.WorkingSetSolver`) are
        asked of the peers holding them and extracted here meanwhile. The next call that
        uses groups takes those it names (by block and columns); a choice that differs only
        costs the work done here. Returned: the groups (by block key and local ids), and
        when this server extracted its share (start, end), when the peers' answers were in,
        and the longest of the peers' extraction seconds."""
        from dl1.solvers.scans import choose_working_set

        keys = [b.key for q in plan.blocks for b in q]
        holders = [h for q, h in enumerate(plan.holders) for _ in plan.blocks[q]]
        edges = np.array([lo for q in plan.bounds for lo, _ in q] + [plan.bounds[-1][-1][1]])
        per_block = [blk for res, _ in scans for blk in res]
        chosen = choose_working_set(support, per_block, edges, ws_size)
        new = np.setdiff1d(chosen, np.concatenate(cached) if cached else np.zeros(0, np.int64))
        owner = np.searchsorted(edges, new, side="right") - 1
        ahead: dict[tuple, tuple] = {}
        asks: dict[str, list] = {}
        for j in np.unique(owner):
            local = (new[owner == j] - edges[j]).astype(np.int64)
            asks.setdefault(holders[j], []).append((keys[j], local))
        here = self._worker.address
        # the peers first: they extract meanwhile
        futs = {h: self._ask(h, "extract", wanted) for h, wanted in asks.items() if h != here}
        for call in futs.values():
            call.wait_sent()
        t0 = time.perf_counter()
        for key, local in asks.get(here, []):
            ahead[(key, local.tobytes())] = extract_task(self._block(_Block(key)), local)
        t1 = time.perf_counter()
        peer_s = 0.0
        for holder, fut in futs.items():  # received here now, not when the call needs them
            try:
                got = fut.result()
            except Exception:  # the call asks for them itself
                continue
            peer_s = max(peer_s, sum(e.seconds for e in got))
            for (key, local), e in zip(asks[holder], got, strict=True):
                ahead[(key, local.tobytes())] = e
        return ahead, (t0, t1, time.perf_counter(), peer_s)

    def _take_ahead(self, t_in: float) -> tuple[dict[tuple, tuple], float]:
        """The columns fetched in advance, once all are in (forgotten here), and the
        seconds of their extraction that count as kernel time: the part a call arriving at
        ``t_in`` waited for, that is, of this server's own extraction the part after
        ``t_in``, and of the wait for the peers' answers after ``t_in`` at most their
        extraction seconds (the rest is transfer)."""
        fut, self._ahead = self._ahead, None
        try:
            if fut is None:
                return {}, 0.0
            ahead, (t0, t1, t2, peer_s) = fut.result()
        except Exception:  # a choice that failed: the call asks for its columns itself
            return {}, 0.0
        return ahead, max(0.0, t1 - max(t0, t_in)) + min(peer_s, max(0.0, t2 - max(t1, t_in)))

    def _from_ahead(self, g: _Group) -> tuple | None:
        """Group ``g`` from the columns fetched in advance (None: not among them), its
        extraction seconds zeroed (the call counts those it waited for, see
        :meth:`_take_ahead`)."""
        e = self._got_ahead.get(_ahead_key(g))
        if e is None:
            return None
        self._served_ahead += 1
        return e._replace(seconds=0.0)

    def _scan_after(self, out: tuple, args: list[Any], plan: _ScanPlan, ws_size: int) -> list:
        """The pass after a subproblem (``args`` those of
        :func:`~dl1.tasks.subproblem.subproblem_task`, ``out`` its result), with the
        coordinator's own steps on the same values, so bit for bit the pass it would run:
        ``z + dz``, the intercept's update, the dual point and the coefficients by block
        (the working set holds every nonzero); ``ws_size`` candidates per block."""
        call = SubproblemCall(*args)
        sw, settings = call.sample_weight, call.settings
        z = call.z + out.dz
        weights = None if sw.shape[0] == 0 else sw
        _, theta = pass_dual_point(settings.datafit, call.y, z, weights, settings.fit_intercept)
        w_parts = [coef_parts(call.ws, out.w_ws, bounds) for bounds in plan.bounds]
        return self._scan(plan, theta, w_parts, ws_size)

    def _scan(
        self, plan: _ScanPlan, theta: np.ndarray, w_parts: list[Any], ws_size: int
    ) -> list[Any]:
        """:func:`~dl1.tasks.passes.scan_task` of each partition of ``plan``: the peers'
        by direct calls, this worker's meanwhile."""
        calls, done = [], {}
        for q, holder in enumerate(plan.holders):
            scan = [plan.blocks[q], theta, plan.threshold, w_parts[q], ws_size, plan.alive[q]]
            if holder == self._worker.address:
                calls.append((q, None, scan))
            else:
                calls.append((q, holder, self._ask(holder, "call", scan_task, scan)))
        for _, holder, call in calls:
            if holder is not None:
                call.wait_sent()
        for q, holder, scan in calls:  # this worker's partitions while the peers scan
            if holder is None:
                done[q] = scan_task(*self._resolve(scan, {}))
        for q, holder, fut in calls:
            if holder is not None:
                done[q] = fut.result()
        return [done[q] for q in range(len(plan.holders))]

    def _remote_groups(self, a: Any, remote: dict[str, list[_Group]]) -> None:
        """The uncached groups to extract from a peer's blocks, by the peer's address."""
        if isinstance(a, (list, tuple)):
            for x in a:
                self._remote_groups(x, remote)
        elif isinstance(a, _Group) and a.gid not in self._groups:
            if _ahead_key(a) in self._got_ahead:
                return  # fetched in advance
            if a.parent is not None:
                self._remote_groups(a.parent, remote)
            elif a.holder is not None and a.holder != self._worker.address:
                remote.setdefault(a.holder, []).append(a)

    def _group(
        self, g: _Group, used: dict[str, tuple], local_only: bool, record: bool = True
    ) -> tuple | None:
        if g.gid in used:
            return used[g.gid]
        if g.gid in self._groups:
            e = self._groups[g.gid]
        elif (ahead := self._from_ahead(g)) is not None:
            e = ahead
            self._ahead_gids.add(g.gid)
        elif g.parent is not None:
            parent = self._group(g.parent, used, local_only, record=False)
            if parent is None:
                return None
            e = compact_task(parent, g.keep)
        elif g.holder is None or g.holder == self._worker.address:
            e = extract_task(self._block(_Block(g.block) if g.holder else g.block), g.local)
            self._fetched_late += 1
        elif local_only:
            return None  # asked of its holder
        else:
            raise BlockMissing(f"group {g.gid} was not delivered by {g.holder}")
        if record:
            used[g.gid] = e
        return e

    def _resolve(self, a: Any, used: dict[str, tuple], local_only: bool = False) -> Any:
        if isinstance(a, list):
            return [self._resolve(x, used, local_only) for x in a]
        if isinstance(a, tuple):
            return tuple(self._resolve(x, used, local_only) for x in a)
        if isinstance(a, _Block):
            return self._block(a)
        if isinstance(a, _Group):
            return self._group(a, used, local_only)
        if isinstance(a, _Value):
            if a.value is not None:
                self._values[a.vid] = a.value
            elif a.vid not in self._values:
                raise BlockMissing(f"constant {a.vid} is not on {self._worker.address}")
            return self._values[a.vid]
        return a


def _server_thread(name: str, memory_limit: int | None) -> ThreadPoolExecutor:
    """A thread for a server's work, in which ``gram_limit`` sees the worker's memory limit
    (see :data:`dl1.tasks.gram.SERVER_MEMORY_LIMIT`)."""
    return ThreadPoolExecutor(
        1, thread_name_prefix=name, initializer=SERVER_MEMORY_LIMIT.set, initargs=(memory_limit,)
    )


def _ahead_key(g: _Group) -> tuple | None:
    """How columns fetched in advance are found: block key and local ids (None: a group
    not extracted from a block held by a worker)."""
    if g.holder is None or g.local is None:
        return None
    return (g.block, g.local.tobytes())


def _none() -> None:
    return None


def _has_groups(a: Any) -> bool:
    if isinstance(a, (list, tuple)):
        return any(_has_groups(x) for x in a)
    return isinstance(a, _Group)


class RpcFuture:
    """The result of a call to a server; ``fallback()``'s (the same step by tasks) if the
    call fails."""

    def __init__(self, ex: RpcExecutor, fut: Any, fallback: Any) -> None:
        self._ex, self._fut, self._fallback = ex, fut, fallback

    def result(self) -> Any:
        try:
            return self._ex.wait_call(self._fut)
        except Exception:
            # a lost worker, a moved block, or the function's own error: the task path
            # recomputes what the servers held, and raises the function's own errors itself
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
        self.broken = False
        self.session = uuid.uuid4().hex
        # whether calls go straight to the workers (else through the scheduler)
        self.direct_calls = False
        self._servers: list[str] = []
        self._holder: dict[Any, str | None] = {}
        self._sent: dict[str, set[str]] = {}
        # the servers start while the caller loads its blocks; first use waits for them
        self._opening = _OPENER.submit(self._open_servers)

    @property
    def transport(self) -> str:
        """How steps run now: ``"direct"`` (calls to the servers) or ``"tasks"``."""
        return "tasks" if self.broken else "direct"

    def _ready(self) -> list[str]:
        """The workers with a server of this solve (sorted addresses); raises if none
        could be started."""
        if not self._servers and not self.broken:
            self._servers = self._opening.result()
        return self._servers

    def _open_servers(self) -> list[str]:
        """Register the plugin (once per cluster) and start a server of this solve on every
        worker alive, straight or through the scheduler (:meth:`_reachable`)."""
        from dl1.solvers.servers import PartitionServers

        self.client.register_plugin(PartitionServers())
        alive = set(self.client.scheduler_info()["workers"])
        workers = [w for w in self.workers if w in alive]
        if not workers:
            raise BlockMissing("no worker to start a server on")
        self.direct_calls = self._reachable(workers)
        if not self.direct_calls:
            opens = [
                self._send(addr, "dl1_open", session=self.session, peers=workers)
                for addr in workers
            ]
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
            self.client.rpc, addr, "dl1_open", session=self.session, peers=workers
        )
        return reply["address"]

    def _via(self) -> Any:
        """The scheduler's rpc when calls go through it, else None (straight to workers)."""
        return None if self.direct_calls else self.client.scheduler

    def _send(self, addr: str, op: str, **msg: Any) -> Future:
        """Handler ``op`` of ``addr`` with ``msg``, as a future of its reply."""
        coro = send_call(self.client.rpc, addr, op, self._via(), **msg)
        return asyncio.run_coroutine_threadsafe(coro, self.client.loop.asyncio_loop)

    def _invoke(self, addr: str, method: str, *args: Any) -> Call:
        """A call of ``method(*args)`` of this solve's server on ``addr``."""
        loop = self.client.loop.asyncio_loop
        msg = (method, args)
        via = self._via()
        return start_call(loop, self.client.rpc, addr, "dl1_call", msg, via, session=self.session)

    def ask(self, addr: str, method: str, *args: Any) -> Any:
        """The result of ``method(*args)`` of the server on ``addr`` (e.g. its
        ``ahead_stats``)."""
        return self.wait_call(self._invoke(addr, method, *args))

    def wait_call(self, call: Any) -> Any:
        """The result of a call to a server, or BlockMissing once a server's worker is lost."""
        return _wait(call, lambda: list(self._servers) or self.workers, self.client)

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
        """Close the servers of this solve (their caches go with them)."""
        if not self.broken:
            try:
                self._ready()
            except Exception:
                return
            self._close_servers(wait=True)

    def fall_back(self) -> None:
        """Run everything as tasks from now on, and let the servers go."""
        self.broken = True
        try:
            self._close_servers(wait=False)
        except Exception:
            pass

    # -- where things are ------------------------------------------------------------------
    def _holders(self, futures: list[Any]) -> list[str | None]:
        unknown = [f for f in futures if f.key not in self._holder]
        if unknown:
            who = self.client.who_has(unknown)
            for f in unknown:
                addrs = [a for a in who.get(f.key, ()) if a in self._ready()]
                self._holder[f.key] = addrs[0] if addrs else None
        return [self._holder[f.key] for f in futures]

    def _block_futures(self, a: Any, out: list[Any]) -> None:
        from distributed import Future

        if isinstance(a, (list, tuple)):
            for x in a:
                self._block_futures(x, out)
        elif isinstance(a, Future):
            out.append(a)

    def _wire(self, a: Any, addr: str) -> Any:
        from distributed import Future

        if isinstance(a, list):
            return [self._wire(x, addr) for x in a]
        if isinstance(a, tuple):
            return tuple(self._wire(x, addr) for x in a)
        if isinstance(a, Future):
            return _Block(a.key)
        if isinstance(a, GroupRef):
            return self._wire_group(a)
        if isinstance(a, ValueRef):
            sent = self._sent.setdefault(addr, set())
            value = None if a.vid in sent else a.value
            sent.add(a.vid)
            return _Value(a.vid, value)
        return a

    def _wire_group(self, g: GroupRef) -> _Group:
        from distributed import Future

        if g.parent is not None:
            return _Group(g.gid, None, None, None, self._wire_group(g.parent), g.keep)
        if isinstance(g.block, Future):
            holder = self._holders([g.block])[0]
            if holder is None:
                raise BlockMissing(f"block {g.block.key!r} is on no worker with a server")
            return _Group(g.gid, holder, g.block.key, g.local, None, None)
        return _Group(g.gid, None, g.block, g.local, None, None)

    # -- the task path ---------------------------------------------------------------------
    def _as_task_arg(self, a: Any) -> Any:
        if isinstance(a, list):
            return [self._as_task_arg(x) for x in a]
        if isinstance(a, tuple):
            return tuple(self._as_task_arg(x) for x in a)
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
                        fut = self._invoke(addr, "call", fn, wire)
                        return RpcFuture(self, fut, lambda: self.task_submit(fn, *args).result())
                except Exception:  # no server, or a block on none: tasks from now on
                    self.fall_back()
        return self.task_submit(fn, *args)

    def submit_then_scan(
        self,
        parts: list[list[Any]],
        bounds: list[list[tuple[int, int]]],
        alive: list[list[Any]],
        threshold: float,
        ws_start: int,
        fn: Any,
        *args: Any,
    ) -> RpcFuture | None:
        """``fn(*args)`` (a working-set subproblem) on its server, which then runs the next
        pass over ``parts`` (each partition's block futures, with their column ranges and
        alive sets) as the coordinator would (:meth:`PartitionServer.call`). A handle whose
        ``result()`` is ``(fn's result, each partition's scan results or None, the pass's
        seconds)``; None when a partition's blocks are not all held by one server (then
        submit ``fn`` alone)."""
        return self._home_call(
            (parts, bounds, alive, threshold, ws_start),
            "call",
            lambda home, plan: (fn, [self._wire(a, home) for a in args], plan),
            # by tasks: the subproblem alone (the coordinator then runs the pass)
            lambda: (self.task_submit(fn, *args).result(), None, 0.0),
        )

    def submit_pass(
        self,
        parts: list[list[Any]],
        bounds: list[list[tuple[int, int]]],
        alive: list[list[Any]],
        threshold: float,
        ws_start: int,
        theta: np.ndarray,
        w_parts: list[Any],
        ws_size: int,
        support: np.ndarray,
        cached: list[np.ndarray],
    ) -> RpcFuture | None:
        """A pass over ``parts`` at ``theta`` run by the subproblem's server, which then
        fetches the next working set's columns in advance
        (:meth:`PartitionServer.scan_pass`). A handle whose ``result()`` is each
        partition's scan results, or None if the call failed (the executor then runs
        tasks); None when a partition's blocks are not all held by one server."""
        return self._home_call(
            (parts, bounds, alive, threshold, ws_start),
            "scan_pass",
            lambda home, plan: (plan, theta, w_parts, int(ws_size), support, cached),
            _none,
        )

    def _home_call(self, pass_args: tuple, method: str, args: Any, fallback: Any) -> Any:
        """``method(*args(home, plan))`` of the subproblem's server (``home``), ``plan``
        the wire form of the pass :meth:`_plan` makes of ``pass_args``: an
        :class:`RpcFuture` falling back to ``fallback()``; None when there is no such plan
        or server."""
        if self.broken:
            return None
        try:
            plan = self._plan(*pass_args)
            if plan is None:
                return None
            home = min(self._ready())
            return RpcFuture(self, self._invoke(home, method, *args(home, plan)), fallback)
        except Exception:  # no server, or a block on none: tasks from now on
            self.fall_back()
            return None

    def _plan(
        self,
        parts: list[list[Any]],
        bounds: list[list[tuple[int, int]]],
        alive: list[list[Any]],
        threshold: float,
        ws_start: int,
    ) -> _ScanPlan | None:
        """The wire form of a pass over ``parts`` (None: a partition's blocks are not all
        futures held by one server)."""
        from distributed import Future

        holders = []
        for part in parts:
            if not all(isinstance(b, Future) for b in part):
                return None
            where = set(self._holders(part))
            if len(where) != 1 or None in where:
                return None
            holders.append(where.pop())
        blocks = [[_Block(b.key) for b in part] for part in parts]
        return _ScanPlan(holders, blocks, bounds, alive, float(threshold), int(ws_start))

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
                for fut in [self._invoke(a, "call", fn, list(args)) for a in self._ready()]:
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
            got = self.client.gather([self._as_task_arg(handles[i]) for i in tasks])
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
