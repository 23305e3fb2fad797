"""Row partitions that keep state on their workers, called all together: by Dask tasks, or
by direct calls to the partition servers.

A partition's *part* (a solver's per-row state: labels, predictions) never leaves its
worker. A call applies ``fn(part, blocks, *args)`` to every partition and returns the sum
of the new parts' small results (``out``, added by ``add``); handles are values: a call
returns a new handle, and an older one still names its parts (a line search goes back to
the parts before a step).

* :class:`TaskParts`: each call is a task a partition, a task taking its ``out``, and a
  binomial tree of sum tasks (:func:`~dl1.runtime.tree.tree_reduce`): ``3 P - 1`` tasks
  the scheduler dispatches; a lost part is recomputed from its lineage.
* :class:`ServerParts`: the parts live on the partition servers
  (:mod:`dl1.runtime.rpc`); a call is one message to the first holder, which forwards it
  along a binomial tree of its peers and adds their sums on the way back: no scheduler,
  ``ceil(log2 W)`` hops each way. A server keeps the last few versions; a call that fails
  (a worker lost, a version let go) raises :class:`PartsLost`, the executor runs tasks
  from then on, and the caller starts its parts again from what it knows (its
  coefficients): the parts are derived state.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Protocol

from dl1.runtime.rpc import RpcExecutor
from dl1.runtime.tree import tree_reduce
from dl1.runtime.wire import BlockMissing, RowPlan


class PartsLost(BlockMissing):
    """Parts held by the servers are gone (a worker lost, a server closed, a version let
    go, or the call failed on a server): start them again from the caller's state; calls
    run as tasks from now on."""


class RowParts(Protocol):
    """Row partitions' parts, as a value: a call returns the next one."""

    #: ``"direct"`` (partition servers) or ``"tasks"``
    transport: str

    def call(self, fn: Callable, *args: Any) -> tuple[RowParts, Any]:
        """The parts ``fn(part, blocks, *args)`` of every partition, and the sum of their
        small results."""
        ...


@dataclass(frozen=True)
class Partitions:
    """What every handle of one set of row partitions shares: the executor, each
    partition's row blocks, a part's small result ``out`` and the sum ``add`` of two."""

    ex: Any
    blocks: list[list[Any]]
    out: Callable[[Any], Any]
    add: Callable[[Any, Any], Any]


@dataclass(frozen=True)
class TaskParts:
    """Parts as Dask futures, one a partition (see the module)."""

    of: Partitions
    parts: tuple[Any, ...]
    transport: str = "tasks"

    def call(self, fn: Callable, *args: Any) -> tuple[TaskParts, Any]:
        ex, blocks = self.of.ex, self.of.blocks
        parts = tuple(ex.submit_to(q, fn, part, blocks[q], *args)
                      for q, part in enumerate(self.parts))  # fmt: skip
        outs = [(q, ex.submit_to(q, self.of.out, part)) for q, part in enumerate(parts)]
        return replace(self, parts=parts), ex.gather([tree_reduce(ex, outs, self.of.add)])[0]


@dataclass(frozen=True)
class ServerParts:
    """Parts held by the partition servers, version ``version`` of the plan ``plan``
    (see the module); ``versions`` numbers new ones (0: the parts started). The first
    partition's worker receives the calls."""

    of: Partitions
    plan: RowPlan
    version: int
    versions: Iterator[int]
    transport: str = "direct"

    def call(self, fn: Callable, *args: Any) -> tuple[ServerParts, Any]:
        ex: RpcExecutor = self.of.ex
        if ex.broken:
            raise PartsLost("the partition servers were let go")
        new = next(self.versions)
        among = list(dict.fromkeys(self.plan.holders))  # the first partition's worker first
        try:
            total = ex.ask(among[0], "row_call", self.plan.key, among, self.version, new, fn,
                           args)  # fmt: skip
        except Exception as exc:
            if ex.watch.failed is not None:  # a stalled cluster: its error stands
                raise ex.watch.failed from exc
            ex.fall_back()
            raise PartsLost(f"a direct call to the row partitions failed: {exc!r}") from exc
        return replace(self, version=new), total


def start_parts(of: Partitions, start: Callable, starts: list[tuple], shared: tuple) -> (
    RowParts
):
    """Every partition's first part, ``start(blocks_q, *starts[q], *shared)``: on the
    partition servers when the executor has them and each partition's blocks are all on
    one of their workers, else by tasks (the executor's own choice of worker)."""
    placed = _server_plan(of) if isinstance(of.ex, RpcExecutor) else None
    if placed is not None:
        try:
            return _start_on_servers(of, placed, start, starts, shared)
        except Exception:
            if of.ex.watch.failed is not None:
                raise of.ex.watch.failed from None
            of.ex.fall_back()
    parts = tuple(of.ex.submit_to(q, start, of.blocks[q], *starts[q], *shared)
                  for q in range(len(of.blocks)))  # fmt: skip
    return TaskParts(of, parts)


def _server_plan(of: Partitions) -> RowPlan | None:
    """The plan naming each partition's holder, or None when a partition's blocks are not
    all on one worker with a server (the servers cannot serve them)."""
    ex: RpcExecutor = of.ex
    if ex.broken:
        return None
    try:
        holders = [ex.holder_of(part) for part in of.blocks]
    except Exception:
        ex.fall_back()
        return None
    if None in holders:
        return None
    blocks = [ex.wire_blocks(part) for part in of.blocks]
    return RowPlan(uuid.uuid4().hex, holders, blocks, of.out, of.add)


def _start_on_servers(of: Partitions, plan: RowPlan, start: Callable, starts: list[tuple],
                      shared: tuple) -> ServerParts:  # fmt: skip
    """Each holder's partitions started by one call to it (their labels sent straight)."""
    ex: RpcExecutor = of.ex
    mine: dict[str, dict[int, tuple]] = {}
    for q, holder in enumerate(plan.holders):
        mine.setdefault(holder, {})[q] = starts[q]
    calls = [ex.invoke(h, "row_start", plan, start, qs, shared, 0) for h, qs in mine.items()]
    for call in calls:
        ex.wait_call(call)
    return ServerParts(of, plan, 0, itertools.count(1))
