"""The LocalCluster dl1 starts for itself (command line, benchmarks, examples).

Set up as a dl1 cluster should be (``cluster/`` does the same for clusters started by hand;
the measurements behind each setting are in ``benchmarks/RESULTS.md``):

- workers start with ``MALLOC_MMAP_THRESHOLD_=65536``: blocks read and freed every pass then
  live in their own mappings, returned to the system when freed, instead of staying in
  glibc's heap as memory Dask can neither spill nor free (glibc reads it at start-up, so it
  goes in ``distributed.nanny.pre-spawn-environ``);
- the scheduler steals no work: dl1 places its tasks next to their data, and a stolen task
  copies its inputs (a partition's cached columns) to the thief;
- workers run no statistical profiler, whose history of call trees grows a busy worker's
  memory for its first ~17 minutes;
- everything listens on 127.0.0.1 only (Dask's ``":8787"`` would bind every interface and
  serve an unauthenticated dashboard to the network), and no HTTP is served unless asked
  (``dashboard=True``): the HTTP servers Dask always starts get no routes and are closed
  as they start (:mod:`dl1.runtime.nohttp`), since any user of the machine can reach
  loopback and they answer without authentication, TLS cluster or not;
- workers preload :mod:`dl1.runtime.worker` (trims glibc's free heap pages when memory is
  high) and get a spill buffer sized to leave room for dl1's baseline and a running task
  (Dask's ``data=`` argument, :func:`dl1.runtime.worker.spill_buffer`).
"""

from __future__ import annotations

import logging
from typing import Any

import dask

from dl1.runtime.worker import spill_buffer

logger = logging.getLogger(__name__)

#: Environment of dl1's worker processes, set before they start.
WORKER_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}

#: Dask settings of dl1's scheduler and workers (read when they start).
CLUSTER_CONFIG = {
    "distributed.scheduler.work-stealing": False,
    "distributed.worker.profile.enabled": False,
}

#: Module every dl1 worker preloads (:mod:`dl1.runtime.worker`: freed heap memory goes back
#: to the system when a worker's memory is high).
WORKER_PRELOAD = "dl1.runtime.worker"

#: Module the scheduler and workers preload when no HTTP is asked for
#: (:mod:`dl1.runtime.nohttp`: closes the HTTP server Dask always starts).
NO_HTTP_PRELOAD = "dl1.runtime.nohttp"

#: Dask settings under which a scheduler or worker started without a dashboard serves no
#: HTTP route (the server still starts: :data:`NO_HTTP_PRELOAD` closes it).
NO_HTTP_CONFIG = {
    "distributed.scheduler.http.routes": [],
    "distributed.worker.http.routes": [],
}


def local_cluster(*, dashboard: bool = False, **kwargs: Any) -> Any:
    """``distributed.LocalCluster(**kwargs)`` set up as a dl1 cluster.

    Its worker processes start with :data:`WORKER_ENV` (added to Dask's own pre-spawn
    environment) and preload :data:`WORKER_PRELOAD`; its scheduler and workers have
    :data:`CLUSTER_CONFIG` (no work stealing, no worker profiler); workers with a memory
    limit hold :func:`dl1.runtime.worker.spill_buffer`; everything listens on 127.0.0.1
    only (:func:`loopback_addresses`). The caller's Dask config is unchanged.

    Parameters
    ----------
    dashboard : bool
        Serve Dask's HTTP endpoints (the scheduler's dashboard at ``dashboard_address``,
        the workers' ``/health`` and ``/metrics``) on 127.0.0.1. By default none is served:
        they have no authentication and any local user can reach loopback.
    **kwargs
        Arguments of ``distributed.LocalCluster``.
    """
    # local: distributed (~0.3 s to import) only once a LocalCluster is started
    from distributed import LocalCluster

    kwargs = loopback_addresses(kwargs)
    env = {**dask.config.get("distributed.nanny.pre-spawn-environ", default={}), **WORKER_ENV}
    off = [] if dashboard else [NO_HTTP_PRELOAD]
    config = {
        "distributed.nanny.pre-spawn-environ": env,
        "distributed.worker.preload": _preloads("worker", WORKER_PRELOAD, *off),
        **CLUSTER_CONFIG,
    }
    if not dashboard:
        config |= {**NO_HTTP_CONFIG, "distributed.scheduler.preload": _preloads("scheduler", *off)}
        kwargs = {
            **kwargs,
            "scheduler_kwargs": {**(kwargs.get("scheduler_kwargs") or {}), "dashboard": False},
            "worker_dashboard_address": None,
        }
    limit = _worker_memory_limit(kwargs)
    if limit and "data" not in kwargs:
        kwargs = {**kwargs, "memory_limit": limit, "data": (spill_buffer, {"memory_limit": limit})}
    with dask.config.set(config):
        return LocalCluster(**kwargs)


def _preloads(role: str, *modules: str) -> list[str]:
    """The configured preloads of ``role`` ("scheduler", "worker") with ``modules`` added."""
    preload = list(dask.config.get(f"distributed.{role}.preload", default=[]) or [])
    return preload + [m for m in modules if m not in preload]


def loopback_addresses(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``LocalCluster`` arguments with the scheduler, workers and HTTP servers on 127.0.0.1
    unless the caller named another host: a dashboard port given without a host (``":0"``,
    ``8787``), which Dask binds on every interface, is put on 127.0.0.1, for the scheduler
    (``dashboard_address``) and the workers (``worker_dashboard_address``)."""
    out = {"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0", **kwargs}
    for key in ("dashboard_address", "worker_dashboard_address"):
        dash = out.get(key)
        if isinstance(dash, int) or (isinstance(dash, str) and dash.startswith(":")):
            out[key] = f"127.0.0.1:{str(dash).lstrip(':')}"
    return out


def _worker_memory_limit(kwargs: dict[str, Any]) -> int | None:
    """The memory limit of each worker of ``LocalCluster(**kwargs)``, as Dask parses it
    (None: no limit, or one this function does not foresee, ``n_workers`` left to Dask)."""
    # local: distributed (~0.3 s to import) only once a LocalCluster is started
    from distributed.worker_memory import parse_memory_limit

    if "memory_limit" in kwargs:
        nthreads = kwargs.get("threads_per_worker") or 1
        return parse_memory_limit(kwargs["memory_limit"], nthreads, logger=logger)
    if kwargs.get("n_workers"):
        return parse_memory_limit("auto", 1, kwargs["n_workers"], logger=logger)
    return None
