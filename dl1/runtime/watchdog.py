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

No progress for ``dl1.stall-timeout`` seconds (Dask configuration, default
:data:`DEFAULT_STALL_TIMEOUT`) raises :class:`~dl1.errors.ClusterStalledError` saying what
was seen: paused workers and their memory, lost workers, the scheduler not answering, what
the coordinator waited for. A client that closed (its scheduler lost for good) fails at
once. A path's checkpoint holds every alpha finished before, so the path resumes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future as ConcurrentFuture
from dataclasses import dataclass, field
from typing import Any, TypeVar

import dask

from dl1.errors import ClusterStalledError, MemoryStallError

T = TypeVar("T")

#: Dask configuration key of the stall timeout (seconds, or a string such as ``"2 min"``).
STALL_TIMEOUT_KEY = "dl1.stall-timeout"

#: Seconds without progress before a wait fails: long enough for Dask to spill and resume a
#: paused worker, restart a lost one and recompute its results (seconds on a LocalCluster).
DEFAULT_STALL_TIMEOUT = 60.0

#: Seconds between checks of the cluster while a wait has not ended.
POLL_S = 1.0

#: Seconds the scheduler has to answer a check (it answers in milliseconds when alive).
ASK_S = 5.0

#: Task states of a worker that count as progress (Dask's ``task_counts``).
BUSY_STATES = ("executing", "long-running", "flight")

MiB = 2**20


def stall_timeout() -> float:
    """Seconds of no progress before a wait fails: ``dl1.stall-timeout`` (Dask config)."""
    from dask.utils import parse_timedelta

    value = dask.config.get(STALL_TIMEOUT_KEY, default=None)
    if value is None:
        return DEFAULT_STALL_TIMEOUT
    try:
        seconds = parse_timedelta(value, default="s")
    except (KeyError, ValueError, TypeError):
        seconds = None
    if seconds is None or not seconds > 0:
        raise ValueError(f"{STALL_TIMEOUT_KEY} must be a positive duration, got {value!r}")
    return float(seconds)


@dataclass(frozen=True)
class WorkerView:
    """One worker as the scheduler last heard of it."""

    address: str
    status: str
    memory: int  # resident bytes of the worker's process
    limit: int  # its memory_limit (0: none)
    tasks: dict[str, int] = field(default_factory=dict)  # Dask's task_counts

    @property
    def busy(self) -> bool:
        """Whether it executes a task or receives a task's data."""
        return any(self.tasks.get(s, 0) > 0 for s in BUSY_STATES)

    def describe(self) -> str:
        limit = f" of its {self.limit / MiB:.0f} MiB limit" if self.limit else ""
        return f"{self.address} {self.status} at {self.memory / MiB:.0f} MiB{limit}"


@dataclass(frozen=True)
class ClusterView:
    """What the scheduler said of the cluster (``reachable`` False: it did not answer)."""

    reachable: bool
    workers: dict[str, WorkerView]

    @property
    def busy(self) -> bool:
        return any(w.busy for w in self.workers.values())

    def paused(self) -> list[WorkerView]:
        return [w for w in self.workers.values() if w.status == "paused"]


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
        )
    return ClusterView(True, workers)


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
        is called before the error (to cancel the wait)."""
        last, count = time.monotonic(), finished()
        while True:
            try:
                return step(POLL_S)
            except TimeoutError:
                pass
            self._closed_client(what)
            view = cluster_view(self.client)
            n = finished()
            alive = False
            if depends_on is not None and view.reachable:
                needed = depends_on()
                lost = [w for w in needed if w not in view.workers]
                if lost and on_lost is not None:
                    on_stall()
                    raise on_lost(lost)
                alive = bool(needed) and not lost
            if n != count or view.busy or alive or self._released_stranded(view):
                last, count = time.monotonic(), n
            elif time.monotonic() - last > self.timeout:
                on_stall()
                raise self._fail(self.stalled(view, what(), time.monotonic() - last))

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
        workers (see :func:`dl1.runtime.dask_workarounds.release_stranded`)."""
        from dl1.runtime.dask_workarounds import release_stranded

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

    def lost_scheduler(self, what: str) -> ClusterStalledError:
        return ClusterStalledError(
            f"the client lost its scheduler (client {self.client.status}) while waiting "
            f"for {what}; a path's checkpoint keeps every alpha finished so far: resume it "
            "on a working cluster"
        )

    def stalled(self, view: ClusterView, what: str, seconds: float) -> ClusterStalledError:
        """The error of a stall of ``seconds`` while waiting for ``what``."""
        seen = []
        if not view.reachable:
            seen.append("the scheduler did not answer")
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
            others = [w for w in view.workers.values() if w.status != "paused"]
            if others:
                seen.append("other workers idle: " + "; ".join(w.describe() for w in others))
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
    client: Any, watch: Watchdog | None, fn: Callable, *args: Any, what: str, bound: float | None
) -> dict:
    """``client.run(fn, *args)`` on the workers the scheduler lists now (Dask's broadcast
    to a worker lost since would wait out its connect timeout), each one's result or error
    by address. Waited for by ``watch`` (alive while those workers are listed), or for at
    most ``bound`` seconds, after which it is cancelled and ``{}`` returned (optimisations
    that may be skipped)."""
    view = cluster_view(client)
    targets = sorted(view.workers) if view.reachable else None
    if targets == []:
        return {}
    coro = client.run(fn, *args, workers=targets, on_error="return", asynchronous=True)
    if bound is None and watch is not None:
        return watch.run_on_loop(coro, lambda: what, depends_on=lambda: targets or [])
    return bounded(client, coro, bound or ASK_S) or {}


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


async def _awaited(coro: Any) -> Any:
    return await coro


def pending_keys(futures: list[Any], limit: int = 3) -> str:
    """``n tasks (key, key, ...)``: the futures not finished, for an error message."""
    pending = [f for f in futures if not f.done()]
    keys = ", ".join(str(f.key) for f in pending[:limit])
    more = ", ..." if len(pending) > limit else ""
    return f"{len(pending)} of {len(futures)} task(s) ({keys}{more})"
