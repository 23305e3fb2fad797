"""The partition server: one per solve on each worker, running the routed task functions on
the blocks its worker holds and keeping the working set's columns between rounds (see
:mod:`dl1.runtime.rpc`)."""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from dl1.runtime.calls import (
    Call,
    Packed,
    pack_result,
    start_call,
    start_calls_in_turn,
    unpack,
)
from dl1.runtime.warm import warm_up
from dl1.runtime.wire import (
    SERVED,
    BlockMissing,
    BlockMoved,
    RowPlan,
    ScanPlan,
    WireBlock,
    WireGroup,
    WireValue,
    like,
)
from dl1.tasks.columns import compact_task, extract_task
from dl1.tasks.gram import SERVER_MEMORY_LIMIT
from dl1.tasks.growth import next_ws_size
from dl1.tasks.passes import coef_parts, pass_dual_point, scan_task
from dl1.tasks.records import SubproblemCall


class PartitionServer:
    """The server of one solve on one worker: runs routed task functions on the blocks held
    there, one method at a time, in a thread of its own (the worker's event loop goes on).
    ``client``: the id of the Dask client that opened it (its server lives as long);
    ``sent`` and ``served``: where to count the calls it makes to peers and those it
    serves, by method."""

    def __init__(
        self, worker: Any, session: str, client: str | None = None, sent: Counter | None = None,
        served: Counter | None = None,
    ) -> None:
        warm_up()
        self._worker = worker
        self.session = session
        #: the id of the Dask client whose solve this serves (None: not known)
        self.client = client
        #: calls made to peers, by method
        self.sent: Counter[str] = Counter() if sent is None else sent
        #: calls served, by method
        self.served: Counter[str] = Counter() if served is None else served
        # one method at a time, in the calls' thread
        self.calls = server_thread("dl1-server", worker.memory_manager.memory_limit)
        self._groups: dict[str, tuple] = {}
        self._values: dict[str, Any] = {}
        self._rows: dict[str, HeldRows] = {}

    def serve(self, payload: Packed) -> Packed:
        """The packed result of the call ``payload`` packs: ``(method, args)``."""
        method, args = unpack(payload)
        if method not in SERVED:
            raise ValueError(f"a partition server has no method {method!r}")
        self.served[method] += 1
        return pack_result(getattr(self, method)(*args))

    def close(self) -> None:
        """Let the thread and the caches go (a call running finishes first, calls waiting
        are cancelled)."""
        self.calls.shutdown(wait=False, cancel_futures=True)
        self._groups, self._values, self._rows = {}, {}, {}

    def held_groups(self) -> list[str]:
        """Ids of the column groups cached here (the last subproblem's)."""
        return list(self._groups)

    def _block(self, b: Any) -> Any:
        if not isinstance(b, WireBlock):
            return b  # a block source: read here
        try:
            # Worker.data: the worker's store of task results (documented as its data
            # attribute; a read, which brings a spilled block back). Upstream: no public
            # "value of a key held here" API other than this mapping (no issue found; the
            # request to file is quoted in issue 31's note).
            return self._worker.data[b.key]
        except KeyError:
            where = self._worker.address
            raise BlockMoved(f"block {b.key!r} is not in the memory of {where}") from None

    def _ask(self, holder: str, method: str, *args: Any) -> Call:
        """A call of this solve's server on the peer ``holder``; its reply is read by the
        worker's event loop as soon as it comes (a peer lost closes the connection: its
        ``result()`` raises)."""
        loop = self._worker.loop.asyncio_loop
        msg = (method, args)
        self.sent[method] += 1
        return start_call(loop, self._worker.rpc, holder, "dl1_call", msg, session=self.session)

    def _ask_in_turn(self, asked: list[tuple[str, tuple[str, tuple]]]) -> list[Call]:
        """Calls ``(holder, (method, args))`` of peers' servers, each request sent once the
        one before is written (:func:`~dl1.runtime.calls.start_calls_in_turn`)."""
        loop = self._worker.loop.asyncio_loop
        for _, (method, _) in asked:
            self.sent[method] += 1
        return start_calls_in_turn(
            loop, self._worker.rpc, asked, "dl1_call", session=self.session
        )

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
        remote: dict[str, list[WireGroup]] = {}
        self._remote_groups(args, remote)
        asked = [
            (groups, self._ask(holder, "extract", [(g.block, g.local) for g in groups]))
            for holder, groups in remote.items()
        ]
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
        resolved = self._resolve(args, used)
        out = fn(*resolved)
        if used:
            self._groups = used
        if then_scan is not None:
            t0 = time.perf_counter()
            # the working set holds every nonzero: the coordinator's quota for its next
            # round (the largest size it may choose, :meth:`dl1.solvers.ws.Run.ws_size`)
            ws_size = next_ws_size(int(np.count_nonzero(out.w_ws)), out.w_ws.shape[0],
                                   then_scan.ws_start, slow=True)  # fmt: skip
            scans = self._scan_after(out, resolved, then_scan, ws_size)
            out = (out, scans, time.perf_counter() - t0)
        return out

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
        return self.scan_pass(plan, theta, w_parts, ws_size)

    def scan_pass(
        self, plan: ScanPlan, theta: np.ndarray, w_parts: list[Any], ws_size: int
    ) -> list[Any]:
        """:func:`~dl1.tasks.passes.scan_task` of each partition of ``plan`` at the
        coordinator's dual point ``theta`` (``w_parts``: each partition's coefficients by
        block), this worker's here, the peers' by one call to each subtree of peers
        (:func:`broadcast_tree`), whose first server runs this method on its subtree's
        partitions: ``theta`` leaves this worker ``ceil(log2(peers + 1))`` times, not once
        a peer, and the results come back the same way. Returns each partition's results."""
        me = self._worker.address
        peers = list(dict.fromkeys(h for h in plan.holders if h != me))
        tree = theta.nbytes >= plan.tree_bytes
        subtrees = broadcast_tree(peers) if tree else [[p] for p in peers]
        parts = [[q for q, h in enumerate(plan.holders) if h in sub] for sub in subtrees]
        asked = [
            (sub[0], ("scan_pass", (plan.only(ps), theta, [w_parts[q] for q in ps], ws_size)))
            for sub, ps in zip(subtrees, parts, strict=True)
        ]
        # the largest subtree's head first, with all of this link, then the next
        calls = (
            self._ask_in_turn(asked) if tree
            else [self._ask(h, m, *a) for h, (m, a) in asked]
        )  # fmt: skip
        calls = list(zip(parts, calls, strict=True))
        for _, call in calls:
            call.wait_sent()
        done = {}
        for q, holder in enumerate(plan.holders):  # this worker's while the peers scan
            if holder == me:
                scan = [plan.blocks[q], theta, plan.threshold, w_parts[q], ws_size, plan.alive[q]]
                done[q] = scan_task(*self._resolve(scan, {}))
        for parts, call in calls:
            done.update(zip(parts, call.result(), strict=True))
        return [done[q] for q in range(len(plan.holders))]

    # -- row partitions (dl1.runtime.row_parts) ------------------------------------------
    def row_start(self, plan: RowPlan, fn: Any, starts: dict[int, tuple], shared: tuple,
                  version: int) -> None:  # fmt: skip
        """Start this worker's partitions of ``plan``: partition ``q``'s part is ``fn(its
        blocks, *starts[q], *shared)``, kept as ``version``."""
        held = self._rows.setdefault(plan.key, HeldRows(plan))
        held.keep(version, {q: fn(self._resolve(plan.blocks[q], {}), *args, *shared)
                            for q, args in starts.items()})  # fmt: skip

    def row_call(self, key: str, among: list[str], base: int, new: int, fn: Any,
                 args: tuple) -> Any:  # fmt: skip
        """``fn(part, blocks, *args)`` on the partitions of the workers ``among`` (this one
        first), from their parts of version ``base``, kept as ``new``; the sum of their
        small results. The peers' are asked of one head a subtree (:func:`broadcast_tree`),
        which does the same: a call reaches every worker after ``ceil(log2 W)`` hops and
        the sums come back the same way, each added on the way."""
        held = self._rows.get(key)
        if held is None:
            raise BlockMissing(f"row partitions {key} are not on {self._worker.address}")
        peers = [h for h in among if h != self._worker.address]
        calls = [self._ask(sub[0], "row_call", key, sub, base, new, fn, args)
                 for sub in broadcast_tree(peers)]  # fmt: skip
        for call in calls:
            call.wait_sent()
        plan, parts = held.plan, {}
        for q, part in held.version(base).items():
            parts[q] = fn(part, self._resolve(plan.blocks[q], {}), *args)
        held.keep(new, parts)
        outs = [plan.out(parts[q]) for q in sorted(parts)] + [c.result() for c in calls]
        total = outs[0]
        for out in outs[1:]:
            total = plan.add(total, out)
        return total

    def _remote_groups(self, a: Any, remote: dict[str, list[WireGroup]]) -> None:
        """The uncached groups to extract from a peer's blocks, by the peer's address."""
        if isinstance(a, (list, tuple)):
            for x in a:
                self._remote_groups(x, remote)
        elif isinstance(a, WireGroup) and a.gid not in self._groups:
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
        elif g.parent is not None:
            parent = self._group(g.parent, used, local_only, record=False)
            if parent is None:
                return None
            e = compact_task(parent, g.keep)
        elif g.holder is None or g.holder == self._worker.address:
            e = extract_task(self._block(WireBlock(g.block) if g.holder else g.block), g.local)
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
            return like(a, (self._resolve(x, used, local_only) for x in a))
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


#: Versions of its row partitions a server keeps (the most recent): a Newton step's line
#: search goes back to the parts before the step at most three calls later.
ROW_VERSIONS = 4


class HeldRows:
    """A server's row partitions of one :class:`RowPlan`: each version's parts, by
    partition, the :data:`ROW_VERSIONS` latest kept."""

    def __init__(self, plan: RowPlan) -> None:
        self.plan = plan
        self._versions: OrderedDict[int, dict[int, Any]] = OrderedDict()

    def keep(self, version: int, parts: dict[int, Any]) -> None:
        self._versions[version] = parts
        while len(self._versions) > ROW_VERSIONS:
            self._versions.popitem(last=False)

    def version(self, version: int) -> dict[int, Any]:
        """The parts of ``version``; BlockMissing when they were let go."""
        if version not in self._versions:
            raise BlockMissing(f"version {version} of row partitions {self.plan.key} is gone")
        return self._versions[version]


def server_thread(name: str, memory_limit: int | None) -> ThreadPoolExecutor:
    """A thread for a server's work, in which ``gram_limit`` sees the worker's memory limit
    (see :data:`dl1.tasks.gram.SERVER_MEMORY_LIMIT`)."""
    return ThreadPoolExecutor(
        1, thread_name_prefix=name, initializer=SERVER_MEMORY_LIMIT.set, initargs=(memory_limit,)
    )


def broadcast_tree(peers: list[str]) -> list[list[str]]:
    """``peers`` split into the subtrees a binomial broadcast sends to, largest first: the
    sender sends to each subtree's first peer, which does the same with the rest of its
    subtree. Each peer receives once; a sender of k peers sends ``ceil(log2(k + 1))`` times,
    and the last peer receives after as many hops (the binomial tree of MPICH's broadcast:
    Thakur, Rabenseifner and Gropp, "Optimization of collective communication operations
    in MPICH", 2005)."""
    subtrees, rest = [], list(peers)
    while rest:
        half = (len(rest) + 1) // 2
        subtrees.append(rest[:half])
        rest = rest[half:]
    return subtrees
