"""Whether the workers have the memory for a solve, checked before it starts.

A worker whose memory limit is below what dl1 needs does not fail cleanly in Dask: one
paused at 80% of its limit runs no task and the fit waits for ever; one above 95% is
restarted by its nanny until the task ends in a bare ``KilledWorker``. The coordinator
measures each worker's baseline (resident memory with dl1 loaded and its kernels compiled,
minus the data it holds: :func:`warm_baseline`, run once per worker), adds the data the
solve makes it hold (:class:`DataFloor`, from the store's sizes) and raises
:class:`~dl1.errors.WorkerMemoryError` up front, naming the limit each worker needs, when
that exceeds the point where Dask pauses it (or, with pausing off, restarts it). A worker
restarted for memory while the solve runs turns its ``KilledWorker`` into the same error.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any

import dask

from dl1.errors import WorkerMemoryError
from dl1.runtime.warm import warm_up
from dl1.runtime.worker import WORKER_BASELINE, resident

MiB = 2**20

#: A block read from the store takes about this many times its in-memory size at the peak
#: of the read (chunks decoded next to the assembled arrays; ``docs/design.md``).
READ_PEAK = 1.7


async def warm_baseline(dask_worker: Any = None) -> int:
    """Compile (or load) dl1's kernels here, then return this process's resident bytes less
    the task results it holds in memory (Dask may spill those): the memory a worker takes
    before a solve gives it data. Run on every worker by ``client.run``, in the worker's
    event loop, the kernels in a thread: the loop goes on sending heartbeats meanwhile (a
    worker silent for seconds is taken for a stopped one, :mod:`dl1.runtime.watchdog`)."""
    await asyncio.to_thread(warm_up)
    rss = resident()
    return max(rss - _held_in_memory(dask_worker), 0)


def _held_in_memory(dask_worker: Any) -> int:
    """Bytes of task results ``dask_worker`` holds in memory (not spilled); 0 if unknown."""
    try:
        data = dask_worker.data
        fast = getattr(data, "fast", data)  # Dask's spill buffer keeps them in ``fast``
        tasks = dask_worker.state.tasks
        return int(sum(tasks[k].nbytes or 0 for k in list(fast.keys()) if k in tasks))
    except Exception:
        return 0


@dataclass(frozen=True)
class DataFloor:
    """Bytes of data a solve makes a worker hold beside its baseline: per partition, its
    blocks (``held``: kept in worker memory, all of a worker's partitions at once) or the
    peak of reading its largest block (streamed: one block at a time). Partition ``q`` is on
    worker ``q mod n_workers``, as :meth:`DistributedExecutor.submit_to` places it."""

    per_partition: tuple[float, ...] = ()
    held: bool = True

    def of_worker(self, k: int, n_workers: int) -> float:
        mine = [b for q, b in enumerate(self.per_partition) if q % max(n_workers, 1) == k]
        if not mine:
            return 0.0
        return float(sum(mine) if self.held else max(mine))


def stop_fraction() -> tuple[float, str] | None:
    """The fraction of its memory limit at which Dask stops a worker from running tasks
    (it pauses it, or with pausing off its nanny restarts it), and what happens then."""
    pause = dask.config.get("distributed.worker.memory.pause", default=0.8)
    if pause:
        return float(pause), "pauses"
    terminate = dask.config.get("distributed.worker.memory.terminate", default=0.95)
    if terminate:
        return float(terminate), "restarts"
    return None


@dataclass(frozen=True)
class WorkerNeed:
    """One worker's memory: its limit, its measured (or estimated) baseline, its data."""

    address: str
    limit: int
    baseline: float
    measured: bool
    data: float

    def needed_limit(self, fraction: float) -> int:
        """The smallest memory limit under which baseline and data stay below ``fraction``."""
        return int(math.ceil((self.baseline + self.data) / fraction / MiB)) * MiB


def check_worker_memory(
    limits: dict[str, int], baselines: dict[str, int], workers: list[str], floor: DataFloor
) -> None:
    """Raise :class:`WorkerMemoryError` if a worker's baseline and data exceed the point
    where Dask stops it (see :func:`stop_fraction`). ``limits``: each worker's memory limit
    (0: none, not checked); ``baselines``: those measured by :func:`warm_baseline` (a worker
    without one, e.g. restarted meanwhile, is estimated by the others' largest, or
    :data:`~dl1.runtime.worker.WORKER_BASELINE`)."""
    stop = stop_fraction()
    if stop is None:
        return
    fraction, action = stop
    default = max(baselines.values(), default=WORKER_BASELINE)
    short = []
    for k, addr in enumerate(workers):
        limit = int(limits.get(addr) or 0)
        if not limit:
            continue
        need = WorkerNeed(
            addr,
            limit,
            float(baselines.get(addr, default)),
            addr in baselines,
            floor.of_worker(k, len(workers)),
        )
        if need.baseline + need.data > fraction * limit:
            short.append(need)
    if short:
        raise WorkerMemoryError(_too_small(short, fraction, action, floor.held))


def _too_small(short: list[WorkerNeed], fraction: float, action: str, held: bool) -> str:
    w = max(short, key=lambda s: s.needed_limit(fraction))
    how = "measured after loading dl1" if w.measured else "estimated: it did not report"
    data = "its blocks kept in memory" if held else "reading its largest block"
    names = ", ".join(s.address for s in short[:4]) + (", ..." if len(short) > 4 else "")
    return (
        f"the workers' memory is too small for this fit: Dask {action} a worker at "
        f"{fraction:.0%} of its memory_limit, and worker {w.address} (limit "
        f"{w.limit / MiB:.0f} MiB) needs {w.baseline / MiB:.0f} MiB for itself ({how}) plus "
        f"{w.data / MiB:.0f} MiB for {data}. Give the workers a memory_limit of at least "
        f"{w.needed_limit(fraction) / MiB:.0f} MiB (or use more workers). "
        f"Too small: {names}."
    )


def killed_for_memory(restarts: list[dict], limits: dict[str, int]) -> WorkerMemoryError:
    """The error for workers their nannies restarted for memory (Dask's
    ``worker-restart-memory`` events) while a solve ran."""
    last = restarts[-1]
    limit = limits.get(last.get("worker", ""), 0) or max(limits.values(), default=0)
    terminate = dask.config.get("distributed.worker.memory.terminate", default=0.95) or 1.0
    rss = float(last.get("rss") or 0)
    need = int(math.ceil(rss / (stop_fraction() or (terminate, ""))[0] / MiB))
    of_limit = f" ({limit / MiB:.0f} MiB)" if limit else ""
    return WorkerMemoryError(
        f"the workers' memory is too small for this fit: their nannies restarted "
        f"{len(restarts)} worker(s) for exceeding {terminate:.0%} of the memory_limit"
        f"{of_limit}, the last, {last.get('worker')}, at {rss / MiB:.0f} MiB. "
        f"Give the workers a memory_limit of at least {need} MiB (or use more workers)."
    )
