"""The partition server: one per solve on each worker, running the routed task functions on
the blocks its worker holds and keeping the working set's columns between rounds (see
:mod:`dl1.runtime.rpc`)."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from dl1.runtime.calls import Call, Packed, pack_result, start_call, unpack
from dl1.runtime.wire import SERVED, BlockMissing, ScanPlan, WireBlock, WireGroup, WireValue
from dl1.solvers.records import SubproblemCall
from dl1.tasks.columns import compact_task, extract_task
from dl1.tasks.gram import SERVER_MEMORY_LIMIT, drop_gram
from dl1.tasks.passes import coef_parts, pass_dual_point, scan_task


class PartitionServer:
    """The server of one solve on one worker: runs routed task functions on the blocks held
    there, one method at a time, in a thread of its own (the worker's event loop goes on)."""

    def __init__(self, worker: Any, session: str) -> None:
        from dl1.runtime.executor import warm_up

        warm_up()
        self._worker = worker
        self.session = session
        limit = worker.memory_manager.memory_limit
        # one method at a time: the calls' thread; and the next round's columns, fetched
        # while the coordinator turns around (:meth:`_fetch_ahead`), in a thread of their own
        self.calls = server_thread("dl1-server", limit)
        self._pool = server_thread("dl1-ahead", limit)
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
        if not isinstance(b, WireBlock):
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
        return [extract_task(self._block(WireBlock(key)), local) for key, local in wanted]

    def call(self, fn: Any, args: list[Any], then_scan: ScanPlan | None = None) -> Any:
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
        if fn is drop_gram or has_groups(args):
            self._got_ahead, ahead_wait = self._take_ahead(time.perf_counter())
        remote: dict[str, list[WireGroup]] = {}
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
        plan: ScanPlan,
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
        plan: ScanPlan,
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
        plan: ScanPlan,
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
            ahead[(key, local.tobytes())] = extract_task(self._block(WireBlock(key)), local)
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

    def _from_ahead(self, g: WireGroup) -> tuple | None:
        """Group ``g`` from the columns fetched in advance (None: not among them), its
        extraction seconds zeroed (the call counts those it waited for, see
        :meth:`_take_ahead`)."""
        e = self._got_ahead.get(ahead_key(g))
        if e is None:
            return None
        self._served_ahead += 1
        return e._replace(seconds=0.0)

    def _scan_after(self, out: tuple, args: list[Any], plan: ScanPlan, ws_size: int) -> list:
        """The pass after a subproblem (``args`` those of
        :func:`~dl1.tasks.subproblem.subproblem_task`, ``out`` its result), with the
        coordinator's own steps on the same values, so bit for bit the pass it would run:
        ``z + dz``, the intercept's update, the dual point and the coefficients by block
        (the working set holds every nonzero); ``ws_size`` candidates per block."""
        call = SubproblemCall(*args)
        sample_weight, settings = call.sample_weight, call.settings
        z = call.z + out.dz
        weights = None if sample_weight.shape[0] == 0 else sample_weight
        _, theta = pass_dual_point(settings.datafit, call.y, z, weights, settings.fit_intercept)
        w_parts = [coef_parts(call.ws, out.w_ws, bounds) for bounds in plan.bounds]
        return self._scan(plan, theta, w_parts, ws_size)

    def _scan(
        self, plan: ScanPlan, theta: np.ndarray, w_parts: list[Any], ws_size: int
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

    def _remote_groups(self, a: Any, remote: dict[str, list[WireGroup]]) -> None:
        """The uncached groups to extract from a peer's blocks, by the peer's address."""
        if isinstance(a, (list, tuple)):
            for x in a:
                self._remote_groups(x, remote)
        elif isinstance(a, WireGroup) and a.gid not in self._groups:
            if ahead_key(a) in self._got_ahead:
                return  # fetched in advance
            if a.parent is not None:
                self._remote_groups(a.parent, remote)
            elif a.holder is not None and a.holder != self._worker.address:
                remote.setdefault(a.holder, []).append(a)

    def _group(
        self, g: WireGroup, used: dict[str, tuple], local_only: bool, record: bool = True
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
            e = extract_task(self._block(WireBlock(g.block) if g.holder else g.block), g.local)
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
        if isinstance(a, WireBlock):
            return self._block(a)
        if isinstance(a, WireGroup):
            return self._group(a, used, local_only)
        if isinstance(a, WireValue):
            if a.value is not None:
                self._values[a.vid] = a.value
            elif a.vid not in self._values:
                raise BlockMissing(f"constant {a.vid} is not on {self._worker.address}")
            return self._values[a.vid]
        return a


def server_thread(name: str, memory_limit: int | None) -> ThreadPoolExecutor:
    """A thread for a server's work, in which ``gram_limit`` sees the worker's memory limit
    (see :data:`dl1.tasks.gram.SERVER_MEMORY_LIMIT`)."""
    return ThreadPoolExecutor(
        1, thread_name_prefix=name, initializer=SERVER_MEMORY_LIMIT.set, initargs=(memory_limit,)
    )


def ahead_key(g: WireGroup) -> tuple | None:
    """How columns fetched in advance are found: block key and local ids (None: a group
    not extracted from a block held by a worker)."""
    if g.holder is None or g.local is None:
        return None
    return (g.block, g.local.tobytes())


def has_groups(a: Any) -> bool:
    if isinstance(a, (list, tuple)):
        return any(has_groups(x) for x in a)
    return isinstance(a, WireGroup)


