"""The LocalCluster dl1 starts for itself (command line, benchmarks, examples).

Its workers read feature blocks of tens of megabytes again and again (out of core, every
pass) and free them: glibc serves such allocations from its heap once its dynamic mmap
threshold has risen past their size, and a heap that has held them keeps the pages, so a
worker's resident memory climbs as "unmanaged" memory that Dask's memory manager can
neither spill nor free, until it pauses the worker. A fixed ``MALLOC_MMAP_THRESHOLD_``
keeps large arrays in their own mappings, returned to the system when freed. glibc reads it
when a process starts, so it is set in ``distributed.nanny.pre-spawn-environ`` (for workers
started by hand: ``MALLOC_MMAP_THRESHOLD_=65536 dask worker ...``, see ``cluster/``).
"""

from __future__ import annotations

from typing import Any

import dask

#: Environment of dl1's worker processes, set before they start.
WORKER_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def local_cluster(**kwargs: Any) -> Any:
    """``distributed.LocalCluster(**kwargs)`` whose worker processes start with
    :data:`WORKER_ENV` (added to Dask's own pre-spawn environment)."""
    from distributed import LocalCluster

    env = {**dask.config.get("distributed.nanny.pre-spawn-environ", default={}), **WORKER_ENV}
    with dask.config.set({"distributed.nanny.pre-spawn-environ": env}):
        return LocalCluster(**kwargs)
