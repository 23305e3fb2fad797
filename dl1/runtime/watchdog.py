"""The coordinator's watchdog: every wait on the cluster ends, with a result or an error.

Dask waits for ever on a cluster that cannot run the tasks it was given (workers paused for
memory, all workers lost, a scheduler gone). The coordinator therefore waits in short
polls (:data:`POLL_S`) and, between them, asks the scheduler what the cluster is doing
(its public ``identity``: each worker's status, memory and task counts). A wait makes
*progress* when, since the last poll,

- one of the futures it waits for finished, or
- a worker is executing a task or receiving a task's data (``executing``,
  ``long-running`` or ``flight`` tasks: a long task on a healthy cluster is progress), or
- for a direct call to partition servers, every worker it depends on is still listed by
  the scheduler (a server answers in a thread of its own, paused or not).

What a worker reports is only as recent as its last heartbeat: a worker whose process is
stopped (SIGSTOP, a paused VM, a hung file-system read, heavy swapping) stays listed, busy
as it last was, until the scheduler's ``worker-ttl`` (5 minutes). So a worker whose
heartbeat (``last_seen`` in the scheduler's identity) has not advanced for
:func:`silent_after` seconds is *silent*: its busy state and presence count as progress
only up to then, and a transfer (``flight``) only up to the time the least recently heard
worker fell silent (it may wait on that one). A worker frozen for less than the stall
timeout resumes its work; one frozen for longer fails the wait.

No progress for ``dl1.stall-timeout`` seconds (Dask configuration, default
:data:`dl1.timeouts.DEFAULT_STALL_TIMEOUT`) raises :class:`~dl1.errors.ClusterStalledError`
saying what was seen: paused workers and their memory, lost workers, workers silent since
a given time, the scheduler not answering, what the coordinator waited for. A client that closed
(its scheduler lost for good) fails at once, and so does a wait whose futures the scheduler
cancelled because it no longer knew them (a scheduler restarted on the same address). A
path's checkpoint holds every alpha finished before, so the path resumes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from concurrent.futures import CancelledError
from concurrent.futures import Future as ConcurrentFuture
from dataclasses import dataclass, field
from typing import Any, TypeVar

import dask

from dl1.errors import ClusterStalledError, MemoryStallError
from dl1.runtime.stranded import release_stranded
from dl1.timeouts import STALL_TIMEOUT_KEY, stall_timeout

T = TypeVar("T")

#: Seconds between checks of the cluster while a wait has not ended.
POLL_S = 1.0

#: Seconds the scheduler has to answer a check (it answers in milliseconds when alive).
ASK_S = 5.0

#: Task states of a worker that count as progress (Dask's ``task_counts``).
BUSY_STATES = ("executing", "long-running", "flight")

#: Of those, the states of a worker running a task (the other: receiving a peer's data).
COMPUTE_STATES = ("executing", "long-running")

#: Reasons of Dask's cancellations of futures a scheduler no longer knows: the client
#: reconnected (to a restarted scheduler), or it sent tasks whose inputs the scheduler forgot.
FORGOTTEN = ("scheduler-connection-lost", "lost dependencies")

#: Seconds without a heartbeat before a worker is silent, at least: many of Dask's
#: heartbeat intervals (0.5 s up to 10 workers, 1 s up to 50, 2 s up to 200), so that late
#: heartbeats on an overloaded machine are not taken for a stopped worker.
SILENT_S = 10.0

MiB = 2**20


@dataclass(frozen=True)
class WorkerView:
    """One worker as the scheduler last heard of it."""

    address: str
    status: str
    memory: int  # resident bytes of the worker's process
    limit: int  # its memory_limit (0: none)
    tasks: dict[str, int] = field(default_factory=dict)  # Dask's task_counts
    last_seen: float = 0.0  # the scheduler's time of its last heartbeat (0: not reported)

    @property
    def busy(self) -> bool:
        """Whether it executes a task or receives a task's data."""
        return any(self.tasks.get(s, 0) > 0 for s in BUSY_STATES)

    @property
    def computing(self) -> bool:
        """Whether it executes a task."""
        return any(self.tasks.get(s, 0) > 0 for s in COMPUTE_STATES)

    @property
    def cancelled(self) -> int:
        """Tasks cancelled while it executed them, whose threads still run (Dask cannot stop
        a thread: a solve in one piece whose caller went away stops at its next epoch, a
        task of other code when it returns)."""
        return int(self.tasks.get("cancelled", 0))

    def describe(self) -> str:
        limit = f" of its {self.limit / MiB:.0f} MiB limit" if self.limit else ""
        return f"{self.address} {self.status} at {self.memory / MiB:.0f} MiB{limit}"


@dataclass(frozen=True)
class ClusterView:
    """What the scheduler said of the cluster (``reachable`` False: it did not answer)."""

    reachable: bool
    workers: dict[str, WorkerView]
    scheduler_id: str = ""  # the scheduler's identity (a restarted scheduler has another)

    @property
    def busy(self) -> bool:
        return any(w.busy for w in self.workers.values())

    def paused(self) -> list[WorkerView]:
        return [w for w in self.workers.values() if w.status == "paused"]


def silent_after(n_workers: int) -> float:
    """Seconds without a heartbeat after which a worker of a cluster of ``n_workers`` is
    silent: :data:`SILENT_S`, or three of Dask's heartbeat intervals if longer."""
    try:
        # local: distributed (~0.3 s to import) only when a cluster's workers are watched
        from distributed.scheduler import heartbeat_interval

        interval = float(heartbeat_interval(n_workers))
    except Exception:
        interval = 0.0
    return max(SILENT_S, 3 * interval)


def quiet_for(seconds: float, n_workers: int) -> str:
    """A hint for a worker not heard from for ``seconds``, shorter than
    :func:`silent_after` (a frozen process not yet counted silent): its heartbeat's age
    when past four of Dask's heartbeat intervals (at least 2 s), else nothing."""
    try:
        # local: distributed (~0.3 s to import) only when a cluster's workers are watched
        from distributed.scheduler import heartbeat_interval

        interval = float(heartbeat_interval(n_workers))
    except Exception:
        interval = 0.5
    return f", no heartbeat for {seconds:.0f} s" if seconds > max(2.0, 4 * interval) else ""


def ask_scheduler(client: Any, method: str, timeout: float = ASK_S, **kwargs: Any) -> Any:
    """The answer of the scheduler's handler ``method`` (through ``client.scheduler``, the
    rpc Dask's documentation names for on-demand queries), or None if it did not answer
    within ``timeout`` seconds or the client is not connected."""
    if getattr(client, "status", "running") != "running":
        return None
    coro = asyncio.wait_for(getattr(client.scheduler, method)(**kwargs), timeout)
    try:
        return asyncio.run_coroutine_threadsafe(coro, client.loop.asyncio_loop).result()
    except Exception:
        return None


def cluster_view(client: Any) -> ClusterView:
    """The workers' status, memory and task counts from the scheduler's identity."""
    # every worker: identity's default (distributed < 2024.11 takes no n_workers)
    info = ask_scheduler(client, "identity")
    if not isinstance(info, dict):
        return ClusterView(False, {})
    workers = {}
    for addr, w in (info.get("workers") or {}).items():
        metrics = w.get("metrics") or {}
        workers[addr] = WorkerView(
            addr,
            str(w.get("status", "unknown")),
            int(metrics.get("memory") or 0),
            int(w.get("memory_limit") or 0),
            dict(metrics.get("task_counts") or {}),
            float(w.get("last_seen") or 0.0),
        )
    return ClusterView(True, workers, str(info.get("id") or ""))


def memory_restarts(client: Any, since: float) -> list[dict]:
    """Workers the nannies restarted for exceeding their memory since ``since`` (Unix time):
    Dask's ``worker-restart-memory`` events (worker, pid, rss)."""
    events = ask_scheduler(client, "events", topic="worker-restart-memory")
    return [msg for t, msg in (events or ()) if t >= since and isinstance(msg, dict)]


class Watchdog:
    """Bounds the waits of one coordinator on ``client``'s cluster (see the module
    docstring). ``workers``: the workers the solve started with (to name the lost ones)."""

    def __init__(self, client: Any, workers: Iterable[str] = ()) -> None:
        self.client = client
        self.workers = list(workers)
        self.timeout = stall_timeout()
        self.since = time.time()  # for Dask's events of this solve
        #: the error a wait raised: later waits of the solve (releasing caches) are skipped
        self.failed: Exception | None = None
        #: each worker's last heartbeat as reported, and when (monotonic) it was first seen
        self._heard: dict[str, tuple[float, float]] = {}
        #: the cluster as the solve starts; its scheduler's id (another one: restarted)
        self.first = cluster_view(client)
        self.scheduler_id = self.first.scheduler_id

    def poll(
        self,
        step: Callable[[float], T],
        what: Callable[[], str],
        *,
        finished: Callable[[], int] = lambda: 0,
        depends_on: Callable[[], list[str]] | None = None,
        on_lost: Callable[[list[str]], Exception] | None = None,
        on_stall: Callable[[], None] = lambda: None,
    ) -> T:
        """``step(POLL_S)`` until it returns (it raises TimeoutError while the wait goes
        on), checking progress between calls: ``finished()`` counts the futures done,
        ``depends_on()`` lists the workers a direct call needs (``on_lost(lost)``, if
        given, is raised as soon as the scheduler no longer lists one of them). ``on_stall``
        is called before the error (to cancel the wait). Futures the scheduler cancelled
        because it no longer knew them raise ClusterStalledError naming the scheduler."""
        last, count = time.monotonic(), finished()
        while True:
            try:
                return step(POLL_S)
            except TimeoutError:
                pass
            except Exception as exc:
                if forgotten(exc):
                    raise self._fail(self.forgetful_scheduler(what())) from exc
                raise
            self._closed_client(what)
            view = cluster_view(self.client)
            if self.scheduler_id and view.scheduler_id not in ("", self.scheduler_id):
                on_stall()  # a new scheduler: the solve's tasks and data went with the old one
                raise self._fail(self.forgetful_scheduler(what()))
            n, now = finished(), time.monotonic()
            seen = [now] if n != count else []
            count = n
            if depends_on is not None and view.reachable:
                needed = depends_on()
                lost = [w for w in needed if w not in view.workers]
                if lost and on_lost is not None:
                    on_stall()
                    raise on_lost(lost)
                if needed and not lost:  # as of the worker heard from least recently
                    seen.append(min(self.alive_until(view)[w] for w in needed))
            seen += self._busy(view)
            if max(seen, default=last) > last:
                last = max(seen)
            elif self._released_stranded(view):
                last = now
            if now - last > self.timeout:
                on_stall()
                raise self._fail(self.stalled(view, what(), now - last))

    def heard(self, view: ClusterView) -> dict[str, float]:
        """When (``time.monotonic``) each worker of ``view`` was last heard from: when its
        reported heartbeat was first seen to have its current value (this clock's, so no
        two machines' clocks are compared); a worker first seen, or not reporting its
        heartbeat, counts as heard now."""
        now = time.monotonic()
        out = {}
        for addr, w in view.workers.items():
            before = self._heard.get(addr)
            if before is None or before[0] != w.last_seen or not w.last_seen:
                before = self._heard[addr] = (w.last_seen, now)
            out[addr] = before[1]
        return out

    def alive_until(self, view: ClusterView) -> dict[str, float]:
        """Up to when (``time.monotonic``) each worker of ``view`` counts as alive: now,
        unless it is silent (heard from more than :func:`silent_after` seconds ago), then
        until it fell silent."""
        now, grace = time.monotonic(), silent_after(len(view.workers))
        return {a: min(now, t + grace) for a, t in self.heard(view).items()}

    def _busy(self, view: ClusterView) -> list[float]:
        """Up to when the busy workers of ``view`` count as busy: one executing a task as
        long as it is alive (:meth:`alive_until`), one receiving data as long as every
        worker is (a transfer from a worker that stopped waits for ever)."""
        alive = self.alive_until(view)
        first = min(alive.values(), default=0.0)
        return [alive[a] if w.computing else first for a, w in view.workers.items() if w.busy]

    def wait_future(self, fut: ConcurrentFuture, what: Callable[[], str], **kw: Any) -> Any:
        """The result of ``fut`` (a coroutine run on the client's loop), polled; cancelled
        when the cluster stalls. An error of a closed client becomes ClusterStalledError."""
        try:
            return self.poll(fut.result, what, on_stall=fut.cancel, **kw)
        except ClusterStalledError:
            raise
        except Exception as exc:
            if getattr(self.client, "status", "running") in ("closing", "closed"):
                raise self._fail(self.lost_scheduler(what())) from exc
            raise

    def run_on_loop(self, coro: Any, what: Callable[[], str], **kw: Any) -> Any:
        """Run ``coro`` (e.g. ``client.gather(..., asynchronous=True)``) on the client's
        event loop and wait for it as :meth:`wait_future`."""
        fut = asyncio.run_coroutine_threadsafe(_awaited(coro), self.client.loop.asyncio_loop)
        return self.wait_future(fut, what, **kw)

    def _released_stranded(self, view: ClusterView) -> bool:
        """Whether the scheduler placed tasks stranded in ``no-worker`` beside idle running
        workers (see :func:`dl1.runtime.stranded.release_stranded`)."""

        if not any(w.status == "running" for w in view.workers.values()):
            return False
        coro = self.client.run_on_scheduler(release_stranded, asynchronous=True)
        return bool(bounded(self.client, coro, ASK_S))

    def _closed_client(self, what: Callable[[], str]) -> None:
        if getattr(self.client, "status", "running") in ("closing", "closed"):
            raise self._fail(self.lost_scheduler(what()))

    def _fail(self, exc: Exception) -> Exception:
        self.failed = exc
        return exc

    def forgetful_scheduler(self, what: str) -> ClusterStalledError:
        """The error of futures Dask cancelled because their scheduler no longer holds them:
        the client lost its connection to it, or reconnected to a new one (restarted)."""
        status = getattr(self.client, "status", "running")
        how = (
            "it was restarted: the client reconnected to a new scheduler"
            if status == "running"
            else f"the client lost its connection to it (client {status})"
        )
        return ClusterStalledError(
            f"the scheduler {self.scheduler_address()} no longer holds this solve's tasks "
            f"and data ({how}) while the coordinator waited for {what}; a path's "
            "checkpoint keeps every alpha finished so far: resume it on a working cluster"
        )

    def scheduler_address(self) -> str:
        """The address of the client's scheduler (for messages)."""
        return str(getattr(getattr(self.client, "scheduler", None), "address", "") or "")

    def lost_scheduler(self, what: str) -> ClusterStalledError:
        return ClusterStalledError(
            f"the client lost its scheduler {self.scheduler_address()} (client "
            f"{self.client.status}) while waiting "
            f"for {what}; a path's checkpoint keeps every alpha finished so far: resume it "
            "on a working cluster"
        )

    def stalled(self, view: ClusterView, what: str, seconds: float) -> ClusterStalledError:
        """The error of a stall of ``seconds`` while waiting for ``what``."""
        seen = []
        if not view.reachable:
            seen.append(f"the scheduler {self.scheduler_address()} did not answer")
        else:
            paused = view.paused()
            if paused:
                pause = dask.config.get("distributed.worker.memory.pause", default=0.8)
                seen.append(
                    f"workers paused for memory (Dask pauses a worker at "
                    f"{pause:.0%} of its memory_limit): " + "; ".join(w.describe() for w in paused)
                )
            lost = [w for w in self.workers if w not in view.workers]
            if lost:
                seen.append("workers lost: " + ", ".join(lost))
            if not view.workers:
                seen.append("no worker is connected to the scheduler")
            heard, now = self.heard(view), time.monotonic()
            grace = silent_after(len(view.workers))
            silent = {a for a, t in heard.items() if now - t > grace}
            if silent:
                seen.append(
                    "workers listed but silent (no heartbeat: a stopped or frozen process, "
                    "or one cut off from the scheduler): "
                    + "; ".join(f"{a} for {now - heard[a]:.0f} s" for a in sorted(silent))
                )
            others = [
                w for a, w in view.workers.items() if w.status != "paused" and a not in silent
            ]
            stuck = [w for w in others if w.cancelled]
            if stuck:
                seen.append(
                    "workers busy with cancelled tasks (their threads still run, holding the "
                    "worker's threads; a solve whose caller went away stops at its next "
                    "epoch, other code when its task returns): "
                    + "; ".join(f"{w.describe()}, {w.cancelled} cancelled task(s) running"
                                for w in stuck)
                )  # fmt: skip
            idle = [w for w in others if not w.cancelled]
            if idle:
                seen.append("other workers idle: " + "; ".join(
                    w.describe() + quiet_for(now - heard[w.address], len(view.workers))
                    for w in idle))  # fmt: skip
        restarts = memory_restarts(self.client, self.since)
        if restarts:
            seen.append(
                f"{len(restarts)} worker restart(s) for exceeding the memory limit "
                f"(last at {restarts[-1].get('rss', 0) / MiB:.0f} MiB)"
            )
        memory = view.reachable and (view.paused() or restarts)
        return (MemoryStallError if memory else ClusterStalledError)(
            f"the cluster made no progress for {seconds:.0f} s ({STALL_TIMEOUT_KEY} = "
            f"{self.timeout:g} s) while the coordinator waited for {what}: "
            + ("; ".join(seen) or "no task running")
            + ". A path's checkpoint keeps every alpha finished so far: resume it on a "
            "working cluster."
        )


def run_listed(
    client: Any, watch: Watchdog | None, fn: Callable, *args: Any, what: str, bound: float | None,
    among: Iterable[str] | None = None,
) -> dict:  # fmt: skip
    """``client.run(fn, *args)`` on the workers the scheduler lists now (Dask's broadcast
    to a worker lost since would wait out its connect timeout), or on those of them
    ``among`` names, each one's result or error by address. Waited for by ``watch`` (alive
    while those workers are listed), or for at most ``bound`` seconds, after which it is
    cancelled and ``{}`` returned (optimisations that may be skipped: these skip the
    workers :func:`lagging` too, which would not answer in time)."""
    view = cluster_view(client)
    targets = sorted(view.workers) if view.reachable else None
    if targets is not None and among is not None:
        wanted = set(among)
        targets = [a for a in targets if a in wanted]
    if targets and bound is not None:
        targets = [a for a in targets if a not in lagging(view)]
    if targets == []:
        return {}
    coro = client.run(fn, *args, workers=targets, on_error="return", asynchronous=True)
    if bound is None and watch is not None:
        return watch.run_on_loop(coro, lambda: what, depends_on=lambda: targets or [])
    return bounded(client, coro, bound or ASK_S) or {}


def lagging(view: ClusterView) -> set[str]:
    """The workers of ``view`` whose last heartbeat is more than :func:`silent_after`
    seconds older than the latest one's (times of the scheduler's clock alone)."""
    seen = [w.last_seen for w in view.workers.values() if w.last_seen]
    if not seen:
        return set()
    latest, grace = max(seen), silent_after(len(view.workers))
    return {a for a, w in view.workers.items() if w.last_seen and latest - w.last_seen > grace}


def bounded(client: Any, coro: Any, seconds: float) -> Any:
    """The result of ``coro`` run on the client's event loop, or None if it failed or took
    more than ``seconds`` (then it is cancelled)."""
    fut = asyncio.run_coroutine_threadsafe(_awaited(coro), client.loop.asyncio_loop)
    try:
        return fut.result(timeout=seconds)
    except Exception:
        fut.cancel()
        return None


def watched_result(client: Any, future: Any, what: str) -> Any:
    """The result of one Dask ``future`` of ``client``, waited for by a :class:`Watchdog`
    (for coordinator code without an executor)."""
    coro = client.gather(future, asynchronous=True)
    return Watchdog(client).run_on_loop(coro, lambda: what, finished=lambda: int(future.done()))


def forgotten(exc: BaseException) -> bool:
    """Whether ``exc`` is Dask's cancellation of futures the scheduler no longer knew
    (:data:`FORGOTTEN`): a ``FutureCancelledError``, or a ``FuturesCancelledError`` of
    ``distributed.wait`` (its groups of futures by reason)."""
    if not isinstance(exc, CancelledError):
        return False
    groups = [exc, *getattr(exc, "error_groups", ())]
    return any(getattr(g, "reason", None) in FORGOTTEN for g in groups)


async def _awaited(coro: Any) -> Any:
    return await coro


def pending_keys(futures: list[Any], limit: int = 3) -> str:
    """``n tasks (key, key, ...)``: the futures not finished, for an error message."""
    pending = [f for f in futures if not f.done()]
    keys = ", ".join(str(f.key) for f in pending[:limit])
    more = ", ..." if len(pending) > limit else ""
    return f"{len(pending)} of {len(futures)} task(s) ({keys}{more})"
