"""Dask collections that hold persisted chunks (``X.persist()``, ``client.persist(X)``, or
arrays derived from those): solved where their cluster's scheduler does not compute them.

A persisted collection's graph holds Dask futures in place of its chunks' tasks. Only the
scheduler that holds them resolves those keys: Dask's local scheduler, which computes a
collection in this process (a solve without a cluster) or inside a task (a solve in one
piece, :mod:`dl1.runtime.one_piece`), finds them missing ("Missing dependency"). So a
solve that runs there takes the chunks' values first, with Dask's own machinery:

- the collection is persisted as a whole by its cluster (``Client.persist``: chunks
  already persisted are not computed again, those derived from them, ``X[:, :30]`` or
  ``X * 2``, are computed where their inputs are), so that every chunk is a future;
- in this process, their values are gathered under the watchdog (:func:`localized`);
- in one piece, they travel as the task's dependencies (:func:`detached`: the scheduler
  moves them to the task's worker) and are put back in place there
  (:meth:`Detached.attached`).

Either way the collection the solver sees has the same chunks (the same feature blocks,
so the same answer) and a graph without futures. A collection whose chunks were released
(cancelled, its client closed or its scheduler restarted) or that another cluster holds is
refused by :func:`held_futures`, naming the argument, before any work; the functions that
follow take the futures it found rather than walk the graph again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dask

from dl1.errors import ValidationError
from dl1.runtime.watchdog import Watchdog, pending_keys


def scheduler_of(client: Any) -> str | None:
    """The address of ``client``'s scheduler (None when it has none, e.g. closed)."""
    scheduler = getattr(client, "scheduler", None)
    return getattr(scheduler, "address", None)


def held_futures(value: Any, what: str, client: Any = None) -> list[Any]:
    """The Dask futures in the graph of ``value`` (argument ``what``; none when it is no
    dask collection), refused when they were released or, given the ``client`` a solve runs
    on, when another cluster holds them: Dask would fail later with a missing key, or wait
    for a key no scheduler will compute."""
    if not dask.is_dask_collection(value):
        return []
    from distributed import futures_of  # distributed: imported only for dask collections

    futures = futures_of(value)
    gone = [f for f in futures if f.status == "cancelled"]
    if gone:
        raise ValidationError(
            f"{what} is a dask collection persisted on a cluster, and {len(gone)} of its "
            f"{len(futures)} persisted chunks were released (key {gone[0].key!r} is "
            "cancelled: the collection was cancelled, its client closed or its scheduler "
            f"restarted); persist {what} again"
        )
    if client is not None and futures:
        here, there = scheduler_of(client), scheduler_of(futures[0].client)
        if here != there:
            raise ValidationError(
                f"{what} is persisted on the cluster of scheduler {there}, the solve runs on "
                f"{here}; pass that cluster's client, or persist {what} on this one"
            )
    return futures


@dataclass(frozen=True)
class Detached:
    """A dask collection whose chunks travel apart from it: ``keys``, the keys of its
    chunks (their values come in this order), and its rebuild recipe (Dask's
    ``__dask_postpersist__``); ``what``, the argument it was given as."""

    what: str
    keys: tuple[Any, ...]
    rebuild: Callable[..., Any]
    args: tuple[Any, ...]

    def attached(self, values: list[Any]) -> Any:
        """The collection, its chunks the given ``values`` (a graph without futures)."""
        return self.rebuild(dict(zip(self.keys, values, strict=True)), *self.args)


def detached(value: Any, what: str, client: Any) -> tuple[Detached, list[Any]]:
    """``value`` (holding futures that :func:`held_futures` accepted, argument ``what``) as
    it travels to a task of ``client``'s cluster: its recipe, and the futures of its chunks
    (the task's dependencies, in the recipe's order)."""
    whole = client.persist(value)  # every chunk a future, keyed as in its graph
    graph = dict(whole.__dask_graph__())
    rebuild, args = whole.__dask_postpersist__()
    keys = tuple(graph)
    return Detached(what, keys, rebuild, tuple(args)), [graph[k] for k in keys]


def localized(value: Any, what: str, held: list[Any]) -> Any:
    """``value`` (argument ``what``, holding the futures ``held`` that
    :func:`held_futures` found) with its chunks' values in place of its futures, gathered
    into this process from its own cluster under the watchdog (a stalled cluster raises
    :class:`~dl1.errors.ClusterStalledError`, not a hang)."""
    client = held[0].client
    recipe, futures = detached(value, what, client)
    try:
        coro = client.gather(futures, asynchronous=True)
        values = Watchdog(client).run_on_loop(
            coro,
            lambda: f"the persisted chunks of {what}: {pending_keys(futures)}",
            finished=lambda: sum(f.done() for f in futures),
        )
    finally:
        for f in futures:
            f.release()
    return recipe.attached(values)
