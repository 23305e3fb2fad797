"""Worker preload (``dask worker --preload dl1.runtime.worker``): give freed heap memory back,
and keep room for a running task (see :func:`dask_setup`).

glibc keeps the memory of freed small allocations in its arenas and returns pages only from
the top of the main heap, so a worker that has read, spilled and freed many blocks and
column groups holds free memory that Dask counts as unmanaged and can neither spill nor
free, until the worker pauses. ``malloc_trim(0)`` releases the free pages of every arena:
the remedy of Dask's documentation ("Memory not released back to the OS"), run by each
worker on itself whenever its memory is high and has grown since its last trim.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import multiprocessing
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import dask
from dask.utils import parse_bytes

from dl1.runtime.dask_workarounds import set_spill_target

#: A worker trims once its resident memory exceeds this fraction of its ``memory_limit``
#: (Dask spills at 0.7 and pauses at 0.8 by default).
TRIM_FRACTION = 0.5

#: ... and has grown by this many bytes since its last trim (a trim costs a walk of the heaps).
TRIM_GROWTH = 16 * 2**20

#: Milliseconds between checks.
TRIM_INTERVAL_MS = 200

#: Memory of a worker process before it holds any data (interpreter, dask, compiled kernels).
WORKER_BASELINE = 256 * 2**20

#: Resident memory a worker keeps free for its running task, beyond its baseline and the
#: task results it holds in memory (the largest rise measured during one task: 61 MiB).
TASK_HEADROOM = 96 * 2**20

_LIBC: Any = None


def _libc() -> Any:
    """The C library if it has ``malloc_trim`` (glibc), else None."""
    global _LIBC
    if _LIBC is None:
        name = ctypes.util.find_library("c")
        try:
            lib = ctypes.CDLL(name) if name else None
        except OSError:
            lib = None
        _LIBC = lib if lib is not None and hasattr(lib, "malloc_trim") else False
    return _LIBC or None


#: glibc's ``mallopt`` parameters (``malloc.h``).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3

#: While a whole solve runs in a worker, allocations up to this size come from the heap:
#: glibc's largest mmap threshold on 64-bit systems, which its dynamic threshold reaches.
SOLVE_MMAP_THRESHOLD = 32 * 2**20

#: glibc's thresholds when its environment variables do not set them.
GLIBC_DEFAULT_THRESHOLD = 128 * 2**10

#: The environment variables that fix glibc's thresholds.
_THRESHOLD_VARS = {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"}

#: A solve's freed heap stays with the worker, for the next solve's temporaries (their
#: pages already faulted in), when the worker's resident memory is at most this many bytes
#: above what it was when the solve began; more is returned to the system.
HEAP_KEPT = 128 * 2**20

_heap_lock = threading.Lock()
_heap_users = 0
_heap_start_rss = 0


@contextlib.contextmanager
def heap_for_solve() -> Iterator[None]:
    """Serve a whole solve's allocations from glibc's heap, and keep some of it for the next.

    Dask starts workers with ``MALLOC_TRIM_THRESHOLD_`` (and dl1's with
    ``MALLOC_MMAP_THRESHOLD_``) set, which fixes glibc's mmap threshold at 64-128 KiB: every
    larger temporary of a solve (vectors of n or p, blocks being decoded, Gram matrices) is
    then a fresh mapping, zeroed by the kernel and unmapped when freed, which made a solve
    in a worker 1.4-2x slower than in a plain process (``benchmarks/RESULTS.md``). For the
    duration of a solve in one piece (:mod:`dl1.runtime.one_piece`) the thresholds are
    raised. Afterwards the mmap threshold is set back to the environment's value and the
    trim threshold to at least :data:`HEAP_KEPT`, so that glibc keeps that much freed heap
    for the next solve; the freed heap is returned to the system (:func:`trim_memory`) if
    the worker then holds more than :data:`HEAP_KEPT` bytes beyond what it held before.
    Nested or concurrent solves restore when the last ends. Nothing where glibc is absent
    or where neither variable is set (glibc's own threshold then adapts, and setting any
    would fix it).
    """
    global _heap_users, _heap_start_rss
    lib = _libc()
    if lib is None or not hasattr(lib, "mallopt") or not _THRESHOLD_VARS & set(os.environ):
        yield  # glibc's dynamic thresholds (no variable set), which setting one would end
        return
    with _heap_lock:
        _heap_users += 1
        if _heap_users == 1:
            _heap_start_rss = resident()
            lib.mallopt(M_MMAP_THRESHOLD, SOLVE_MMAP_THRESHOLD)
            lib.mallopt(M_TRIM_THRESHOLD, 2 * SOLVE_MMAP_THRESHOLD)
    try:
        yield
    finally:
        with _heap_lock:
            _heap_users -= 1
            if _heap_users == 0:
                lib.mallopt(M_MMAP_THRESHOLD, _env_threshold("MALLOC_MMAP_THRESHOLD_"))
                # at the environment's trim threshold glibc would give the heap's freed top
                # back at the next free, and the next solve would fault its pages in again
                kept = max(_env_threshold("MALLOC_TRIM_THRESHOLD_"), HEAP_KEPT)
                lib.mallopt(M_TRIM_THRESHOLD, kept)
                if resident() > _heap_start_rss + HEAP_KEPT:
                    trim_memory()


def resident() -> int:
    """This process's resident memory, bytes."""
    return int(_process(os.getpid()).memory_info().rss)


@functools.cache
def _process(pid: int) -> Any:
    """The ``psutil.Process`` of ``pid``, made once (a forked child asks with its own)."""
    # local: psutil (~0.02 s to import) only once this process's memory is measured
    import psutil

    return psutil.Process(pid)


def _env_threshold(name: str) -> int:
    """A glibc threshold as the process's environment set it (glibc's default if not)."""
    try:
        return int(os.environ.get(name, GLIBC_DEFAULT_THRESHOLD))
    except ValueError:
        return GLIBC_DEFAULT_THRESHOLD


def trim_memory() -> bool:
    """Return the free pages of every heap of this process to the system (glibc's
    ``malloc_trim(0)``); False where there is no such call (not glibc) or nothing was freed."""
    lib = _libc()
    return bool(lib.malloc_trim(0)) if lib is not None else False


class MemoryTrimmer:
    """Trims a worker's heaps (:func:`trim_memory`) when its resident memory is above
    ``fraction`` of ``limit`` and ``growth`` bytes above what it was after the last trim."""

    def __init__(
        self, limit: float, fraction: float = TRIM_FRACTION, growth: float = TRIM_GROWTH
    ) -> None:
        self.threshold = fraction * limit
        self.growth = growth
        self.floor: float | None = None  # resident memory after the last trim
        self.trims = 0
        self.freed = 0.0  # bytes
        self.seconds = 0.0

    def __call__(self) -> None:
        rss = float(resident())
        if rss < self.threshold or (self.floor is not None and rss < self.floor + self.growth):
            return
        t0 = time.perf_counter()
        trim_memory()
        self.seconds += time.perf_counter() - t0
        self.floor = float(resident())
        self.freed += max(rss - self.floor, 0.0)
        self.trims += 1


def managed_target(limit: float, pause_fraction: float, target: float) -> float:
    """Bytes of task results a worker may hold in memory before it spills the least recently
    used to disk: Dask's ``target`` (by default 60% of ``limit``), lowered so that the
    baseline of a dl1 worker (:data:`WORKER_BASELINE`, the interpreter and the
    compiled kernels), those results and a running task's :data:`TASK_HEADROOM` stay under
    the pause threshold, but not below a tenth of ``limit``."""
    room = pause_fraction * limit - WORKER_BASELINE - TASK_HEADROOM
    return min(target, max(room, 0.1 * limit))


def managed_target_of(limit: float) -> float:
    """:func:`managed_target` of a worker with ``limit`` bytes, under Dask's configured
    target and pause fractions."""
    pause = dask.config.get("distributed.worker.memory.pause") or 1.0
    target = dask.config.get("distributed.worker.memory.target") or 1.0
    return managed_target(limit, pause, target * limit)


def spill_buffer(worker_local_directory: str, memory_limit: int) -> Any:
    """Dask's spill buffer (as a worker makes it: in ``storage`` of its local directory,
    under the configured ``max-spill``) holding :func:`managed_target_of` its memory limit
    in memory: a worker's ``data=`` argument, ``(spill_buffer, {"memory_limit": limit})``."""
    # local: distributed (~0.3 s to import) is loaded in a worker, which calls this
    from distributed.spill import SpillBuffer

    max_spill = dask.config.get("distributed.worker.memory.max-spill")
    return SpillBuffer(
        os.path.join(worker_local_directory, "storage"),
        target=managed_target_of(memory_limit),
        max_spill=False if max_spill is False else parse_bytes(max_spill),
    )


def dask_setup(worker: Any) -> None:
    """Dask's preload hook, for a worker with a memory limit.

    - Its spill buffer's target becomes :func:`managed_target` (unless lower already, as
      with :func:`spill_buffer`): Dask's default target (60% of the limit) leaves no room
      for dl1's baseline of about 256 MiB, and Dask spills by process memory only every
      100 ms, so tasks reading spilled columns back could pass the pause threshold.
    - It checks every :data:`TRIM_INTERVAL_MS` whether to trim (:class:`MemoryTrimmer`,
      kept as ``worker.dl1_trimmer``).
    """
    # local: tornado (~0.05 s, a dependency of distributed) only in a worker, which loads it
    from tornado.ioloop import PeriodicCallback

    memory = worker.memory_manager
    limit = memory.memory_limit
    if not limit:
        return
    data = worker.data
    pause = memory.memory_pause_fraction or 1.0
    target = getattr(data, "n", None)
    if isinstance(target, (int, float)) and managed_target(limit, pause, target) < target:
        set_spill_target(worker, managed_target(limit, pause, target))
    if _libc() is None:
        return
    worker.dl1_trimmer = MemoryTrimmer(limit)
    # started by the worker with its other periodic callbacks, after the preloads
    worker.periodic_callbacks["dl1-trim-memory"] = PeriodicCallback(
        worker.dl1_trimmer, TRIM_INTERVAL_MS
    )


def dask_teardown(worker: Any) -> None:
    """Dask's preload hook at worker close: the objects alive now are frozen
    (:func:`gc.freeze`), so the process exits without a final garbage collection of its
    whole heap (numba's and the data's objects), which takes seconds and, on a loaded
    machine, more than the 8 s a nanny waits before it kills the worker ("Worker process
    still alive after 8.0 seconds, killing"). Only in a worker process a nanny started: a
    worker in its client's process (``processes=False``) leaves that process alone."""
    if multiprocessing.parent_process() is not None:
        gc.freeze()
