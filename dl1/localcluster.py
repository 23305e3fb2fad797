"""The LocalCluster dl1 starts for itself (command line, benchmarks, examples).

Its workers read feature blocks of tens of megabytes again and again (out of core, every
pass) and free them: glibc serves such allocations from its heap once its dynamic mmap
threshold has risen past their size, and a heap that has held them keeps the pages, so a
worker's resident memory climbs as "unmanaged" memory that Dask's memory manager can
neither spill nor free, until it pauses the worker. A fixed ``MALLOC_MMAP_THRESHOLD_``
keeps large arrays in their own mappings, returned to the system when freed. glibc reads it
when a process starts, so it is set in ``distributed.nanny.pre-spawn-environ`` (for workers
started by hand: ``MALLOC_MMAP_THRESHOLD_=65536 dask worker ...``, see ``cluster/``).

Its scheduler does not steal work. dl1 places its tasks itself, next to the data they use
(a partition's blocks, its cached working-set columns), with ``allow_other_workers`` only so
that a lost worker's tasks can run elsewhere; such tasks are stealable, and a stolen one
copies its inputs to the thief, which keeps the copies as long as the originals live. Out of
core this doubled a worker's cached columns (measured on the out-of-core benchmark at alphas
89-90: up to 197 MiB of cached columns on one worker, the whole working set, against 101 /
96 MiB per worker without stealing; peak RSS 503 / 500 against 402 / 389 MiB).

Its workers do not run Dask's statistical profiler. The profiler samples a worker's stacks
every 10 ms and, every second, files that second's call trees (one per task prefix) in a
history of ``distributed.admin.low-level-log-length`` (1,000) entries: a busy worker's
memory climbs for its first ~17 minutes. On the out-of-core benchmark (log1p x 4, 2 x 650
MiB workers) the workers' unmanaged memory was 344 / 327 MiB at alpha 80 with the profiler
and 279 / 275 MiB at alpha 78 without; pauses at the dense end fell from 338 to 70.

Its workers preload :mod:`dl1.worker`, which returns the free pages of glibc's heaps to the
system when a worker's memory is high: freed allocations below the mmap threshold otherwise
stay in the process, and at the dense end of the out-of-core benchmark a worker stayed
paused, idle, at 521 MiB with all of its task results spilled (337 MiB once trimmed). The
preload also lowers the results a worker keeps in memory before spilling to what its pause
threshold leaves beside dl1's baseline and a running task (:func:`dl1.worker.managed_target`):
its workers get a spill buffer of that size (Dask's ``data=`` argument,
:func:`dl1.worker.spill_buffer`) where their memory limit is known here.
"""

from __future__ import annotations

import logging
from typing import Any

import dask

from dl1.worker import spill_buffer

logger = logging.getLogger(__name__)

#: Environment of dl1's worker processes, set before they start.
WORKER_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}

#: Dask settings of dl1's scheduler and workers (read when they start).
CLUSTER_CONFIG = {
    "distributed.scheduler.work-stealing": False,
    "distributed.worker.profile.enabled": False,
}

#: Module every dl1 worker preloads (:mod:`dl1.worker`: freed heap memory goes back to the
#: system when a worker's memory is high).
WORKER_PRELOAD = "dl1.worker"


def local_cluster(**kwargs: Any) -> Any:
    """``distributed.LocalCluster(**kwargs)`` whose worker processes start with
    :data:`WORKER_ENV` (added to Dask's own pre-spawn environment) and preload
    :data:`WORKER_PRELOAD` (added to the configured preloads), whose scheduler and workers
    have :data:`CLUSTER_CONFIG` (no work stealing, no worker profiler), and whose workers
    with a memory limit hold :func:`dl1.worker.spill_buffer`; the caller's Dask config is
    unchanged."""
    from distributed import LocalCluster

    env = {**dask.config.get("distributed.nanny.pre-spawn-environ", default={}), **WORKER_ENV}
    preload = list(dask.config.get("distributed.worker.preload", default=[]) or [])
    if WORKER_PRELOAD not in preload:
        preload.append(WORKER_PRELOAD)
    config = {
        "distributed.nanny.pre-spawn-environ": env,
        "distributed.worker.preload": preload,
        **CLUSTER_CONFIG,
    }
    limit = _worker_memory_limit(kwargs)
    if limit and "data" not in kwargs:
        kwargs = {**kwargs, "memory_limit": limit, "data": (spill_buffer, {"memory_limit": limit})}
    with dask.config.set(config):
        return LocalCluster(**kwargs)


def _worker_memory_limit(kwargs: dict[str, Any]) -> int | None:
    """The memory limit of each worker of ``LocalCluster(**kwargs)``, as Dask parses it
    (None: no limit, or one this function does not foresee, ``n_workers`` left to Dask)."""
    from distributed.worker_memory import parse_memory_limit

    if "memory_limit" in kwargs:
        nthreads = kwargs.get("threads_per_worker") or 1
        return parse_memory_limit(kwargs["memory_limit"], nthreads, logger=logger)
    if kwargs.get("n_workers"):
        return parse_memory_limit("auto", 1, kwargs["n_workers"], logger=logger)
    return None
