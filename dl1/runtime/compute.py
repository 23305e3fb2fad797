"""Where a dask collection given to dl1 is computed: in this thread within a solve in one
piece (a task on a worker, :func:`in_task`), else on the current client, as
``dask.compute`` decides, or on the local scheduler Dask's configuration names."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dask
import dask.local
from dask.utils import parse_bytes

from dl1.runtime import persisted

#: Set while this thread runs a solve in one piece (:func:`in_worker`).
_IN_TASK: contextvars.ContextVar[bool] = contextvars.ContextVar("dl1_one_piece", default=False)


def in_task() -> bool:
    """Whether the calling thread runs a solve in one piece: it then solves in this process
    (no client, no nested shipment), whatever Dask's configuration says."""
    return _IN_TASK.get()


@contextmanager
def solving_here() -> Iterator[None]:
    """Within: :func:`in_task` is true in this thread (and only there)."""
    token = _IN_TASK.set(True)
    try:
        yield
    finally:
        _IN_TASK.reset(token)


#: ``dask.config`` schedulers that keep ``dask.compute`` in this process even when a client
#: exists; dl1's entry points follow them likewise.
LOCAL_SCHEDULERS = frozenset(
    {"sync", "synchronous", "single-threaded", "threads", "threading", "processes",
     "multiprocessing"}
)  # fmt: skip


def current_client() -> Any:
    """The current Dask client (``distributed.default_client()``: the last one created, or
    the one of a ``with Client(...)`` block), or None when there is none or when
    ``dask.config`` names a local scheduler (``dask.config.set(scheduler="sync")``), as
    ``dask.compute`` decides; None within a solve in one piece (:func:`in_task`)."""
    if dask.config.get("scheduler", None) in LOCAL_SCHEDULERS or in_task():
        return None
    # local: distributed (~0.3 s to import), which import dl1.runtime.compute does without
    from distributed import default_client

    try:
        return default_client()
    except ValueError:  # "No clients found"
        return None


def computed(*collections: Any, what: str = "a dask input") -> tuple[Any, ...]:
    """``dask.compute(*collections)`` on an explicit scheduler, the one a solve running
    here uses: within a solve in one piece (a task on a worker,
    :func:`in_task`) this thread (``"sync"``; Dask's default there
    sends the graph to the cluster through the worker's client, from a task that holds one
    of the worker's threads); otherwise the current client
    (:func:`current_client`, the one ``dask.compute`` would use) or,
    without one, the local scheduler Dask's configuration names (threads by default). On
    a local scheduler, collections holding persisted chunks (``what``, for the errors)
    get their chunks first (:func:`dl1.runtime.persisted.localized`)."""
    here = in_task()
    client = None if here else current_client()
    if client is not None:
        return dask.compute(*collections, scheduler=client)
    # in a task, dask.local.get_sync itself: the name "sync" warns (dask < 2024.12) where a
    # distributed client exists, though this thread is what is meant
    scheduler = dask.local.get_sync if here else dask.config.get("scheduler", "threads")
    here = []
    for c in collections:
        held = persisted.held_futures(c, what)
        here.append(persisted.localized(c, what, held) if held else c)
    return dask.compute(*here, scheduler=scheduler)


def computed_here(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with its dask collections (targets, weights, test data given as dask
    arrays) computed in this thread: within a task, Dask's default would send them to the
    cluster through the worker's client."""
    lazy = {k: v for k, v in kwargs.items() if dask.is_dask_collection(v)}
    if not lazy:
        return kwargs
    values = computed(*lazy.values())  # in this thread: called within solving_here()
    return {**kwargs, **dict(zip(lazy, values, strict=True))}


@contextmanager
def graph_carrying(nbytes: int) -> Iterator[None]:
    """Within: graphs up to ``nbytes`` (plus 10%) submitted without Dask's "Sending large
    graph" warning (``distributed.admin.large-graph-warning-threshold``), for a graph that
    carries the caller's in-memory data on purpose: each block's values in its own task,
    which the scheduler keeps so that it can compute a lost block again (scattered data
    it cannot)."""
    key = "distributed.admin.large-graph-warning-threshold"
    threshold = max(parse_bytes(dask.config.get(key, "10MB")), int(1.1 * nbytes))
    with dask.config.set({key: threshold}):
        yield
