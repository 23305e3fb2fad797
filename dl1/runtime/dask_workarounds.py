"""Where dl1 works around Dask: settings Dask offers neither as configuration nor as public
API, set on its live objects. Each names the Dask behaviour it works around; everything else
in dl1 goes through Dask's configuration and public interfaces.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from dl1.runtime.watchdog import bounded, run_listed

# -- batching intervals -----------------------------------------------------------------------
# Dask batches the messages of its long-lived streams (client to scheduler, scheduler to
# worker, worker to scheduler) in BatchedSend objects whose intervals are fixed in its code
# (10, 5 and 2 ms; ``distributed.client``, ``distributed.scheduler``, ``distributed.worker``):
# no configuration key sets them. A solve's latency-bound chain of tasks sets the ``interval``
# of the live BatchedSend objects for its duration.
# Upstream: dask/distributed#5036 (making the worker's interval configurable, closed
# unmerged) and the measurements in dask/distributed#4881.

#: Seconds between batched messages while a fit runs (Dask: 10 ms client to scheduler, 5 ms
#: scheduler to worker, 2 ms worker to scheduler).
LOW_LATENCY_INTERVAL = 0.0005


@dataclass
class _Shortened:
    """A client's stream while shortened: the interval Dask gave it, and how many users
    hold it shortened (a solve's :class:`LowLatency` and :func:`client_low_latency` may
    overlap)."""

    comm: Any
    dask_interval: float
    users: int = 0


#: The client streams shortened now, by ``id(client)``.
_CLIENT_HELD: dict[int, _Shortened] = {}
_client_lock = threading.Lock()


def _shorten_client(client: Any, interval: float) -> bool:
    """Shorten ``client``'s batched-send interval to the scheduler (counted: the last of
    overlapping users restores Dask's); whether its stream has one."""
    comm = getattr(client, "scheduler_comm", None)
    if comm is None or not hasattr(comm, "interval"):
        return False
    with _client_lock:
        held = _CLIENT_HELD.setdefault(id(client), _Shortened(comm, comm.interval))
        held.users += 1
        comm.interval = min(interval, comm.interval)
    return True


def _restore_client(client: Any) -> None:
    """Undo one :func:`_shorten_client` of ``client``."""
    with _client_lock:
        held = _CLIENT_HELD.get(id(client))
        if held is None:
            return
        held.users -= 1
        if held.users == 0:
            del _CLIENT_HELD[id(client)]
            held.comm.interval = held.dask_interval


def held_short(client: Any) -> bool:
    """Whether dl1 holds ``client``'s stream shortened now (a solve, or the linger after
    one in one piece)."""
    with _client_lock:
        return id(client) in _CLIENT_HELD


#: Seconds a client's stream stays shortened after a solve: the release of the solve's
#: futures, which the client's event loop sends after the solve has returned, leaves at
#: once too, and a fit that follows within it (a search's next) finds the stream still
#: short.
CLIENT_LINGER_S = 0.05


@contextlib.contextmanager
def client_low_latency(client: Any) -> Iterator[None]:
    """The client's batching interval shortened while a solve in one piece is sent and
    answered, and :data:`CLIENT_LINGER_S` after: its messages (the task, then the release
    of its futures) leave at once, and the next fit's task is not held behind the last
    one's release for up to Dask's 10 ms. Only the client's own stream changes: no call to
    the scheduler or the workers."""
    shortened = _shorten_client(client, LOW_LATENCY_INTERVAL)
    try:
        yield
    finally:
        if shortened:
            _restore_client_later(client)


def _restore_client_later(client: Any) -> None:
    """Undo one :func:`_shorten_client` of ``client`` :data:`CLIENT_LINGER_S` from now, on
    the client's loop: after the releases of the solve's futures that the loop has queued
    (at once if the loop is closed, and the client with it)."""
    loop = client.loop
    try:
        loop.add_callback(loop.call_later, CLIENT_LINGER_S, _restore_client, client)
    except RuntimeError:
        _restore_client(client)


def _scheduler_interval(interval: float, dask_scheduler: Any = None) -> float | None:
    """Set the scheduler's batched-send interval to its workers; return the previous one."""
    old = None
    for comm in getattr(dask_scheduler, "stream_comms", {}).values():
        if hasattr(comm, "interval"):
            old, comm.interval = comm.interval, interval
    return old


def _worker_interval(interval: float, dask_worker: Any = None) -> float | None:
    """Set a worker's batched-send interval to the scheduler; return the previous one."""
    comm = getattr(dask_worker, "batched_stream", None)
    if comm is None or not hasattr(comm, "interval"):
        return None
    old, comm.interval = comm.interval, interval
    return old


#: Seconds each change of the intervals may take (an optimisation: skipped if it takes
#: longer, e.g. while the scheduler is lost).
INTERVAL_CALL_S = 5.0


def _restore_worker_interval(saved: dict[str, Any], dask_worker: Any = None) -> None:
    """Give a worker back the interval :func:`_worker_interval` saved for its address
    (a worker that joined since has Dask's own)."""
    old = saved.get(getattr(dask_worker, "address", None))
    if isinstance(old, float):
        _worker_interval(old, dask_worker)


class LowLatency:
    """Dask's message batching intervals shortened while a solve runs (:func:`low_latency`),
    from :meth:`engage` on; :meth:`restore` gives them back.

    A solve is a chain of short dependent rounds (send ``theta``, gather the blocks' scores,
    send the subproblem, ...), so its overhead is latency: Dask holds messages for up to its
    batching interval (10 ms from the client) before sending them, about half of a task's
    round trip on a small cluster. The intervals are restored on the workers the scheduler
    still lists (Dask's broadcast to a lost one waits out its connect timeout, 30 s); each
    change is bounded by :data:`INTERVAL_CALL_S`, and a cluster refusing one runs as it is
    (an optimisation only). The client's own interval comes back
    :data:`CLIENT_LINGER_S` later, so that the release of the solve's futures leaves at
    once too. Where a Dask version lacks the intervals, nothing changes.
    """

    def __init__(self, client: Any, interval: float = LOW_LATENCY_INTERVAL) -> None:
        self.client, self.interval = client, interval
        self.saved: dict[str, Any] | None = None  # None: not engaged

    def engage(self) -> None:
        """Shorten the intervals (once; nothing without a client)."""
        if self.saved is not None or self.client is None:
            return
        self.saved = saved = {}
        client, interval = self.client, self.interval
        try:
            if _shorten_client(client, interval):
                saved["client"] = True
            on_scheduler = client.run_on_scheduler(_scheduler_interval, interval,
                                                   asynchronous=True)  # fmt: skip
            saved["scheduler"] = bounded(client, on_scheduler, INTERVAL_CALL_S)
            saved["workers"] = run_listed(
                client, None, _worker_interval, interval, what="", bound=INTERVAL_CALL_S
            )
        except Exception:  # an optimisation only: a cluster refusing it runs as it is
            pass

    def restore(self) -> None:
        """Give back the intervals :meth:`engage` changed."""
        saved, client = self.saved, self.client
        self.saved = None
        if not saved:
            return
        with contextlib.suppress(Exception):
            if saved.get("client"):
                _restore_client_later(client)
            if client.status == "running" and saved.get("scheduler") is not None:
                old = client.run_on_scheduler(
                    _scheduler_interval, saved["scheduler"], asynchronous=True
                )
                bounded(client, old, INTERVAL_CALL_S)
            if client.status == "running" and saved.get("workers"):
                run_listed(
                    client, None, _restore_worker_interval, saved["workers"], what="",
                    bound=INTERVAL_CALL_S,
                )  # fmt: skip


#: The :class:`LowLatency` of the solve this context runs (:func:`low_latency`).
_ACTIVE: contextvars.ContextVar[LowLatency | None] = contextvars.ContextVar(
    "dl1_low_latency", default=None
)


@contextlib.contextmanager
def low_latency(client: Any, *, lazy: bool = False) -> Iterator[LowLatency]:
    """Shorten Dask's batching intervals for the duration of a solve (:class:`LowLatency`):
    at once, or (``lazy``) at the solve's first task (:func:`engage_low_latency`), so that a
    solve run as one task (:mod:`dl1.runtime.one_piece`) skips the four round trips."""
    latency = LowLatency(client)
    if not lazy:
        latency.engage()
    token = _ACTIVE.set(latency)
    try:
        yield latency
    finally:
        _ACTIVE.reset(token)
        latency.restore()


def engage_low_latency() -> None:
    """Engage the current :func:`low_latency` (a solve's rounds begin); nothing outside one."""
    latency = _ACTIVE.get()
    if latency is not None:
        latency.engage()


# -- spill target -----------------------------------------------------------------------------
# A worker's spill buffer holds ``distributed.worker.memory.target`` of its memory limit in
# memory; that fraction also sets the memory monitor's hysteresis (it spills until the
# *process* memory is under it), which a dl1 worker's unmanageable baseline would turn into
# spilling everything. Dask's public way to size the buffer alone is the worker's ``data=``
# argument (dl1's LocalCluster passes :func:`dl1.runtime.worker.spill_buffer`), which
# ``dask worker`` does not take: the preload of such workers sets the live buffer's target.
# Upstream: dask/distributed#5367 (changing a live worker's memory limit and the thresholds
# chained to it, the spill buffer's target among them; open).


def set_spill_target(worker: Any, target: float) -> bool:
    """Set ``worker``'s spill buffer (zict's Buffer) to hold ``target`` bytes in memory;
    whether it has such a buffer."""
    data = worker.data
    if not hasattr(data, "fast") or not isinstance(getattr(data, "n", None), (int, float)):
        return False
    data.n = target
    return True
