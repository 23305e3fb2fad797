"""What travels to the partition servers (:mod:`dl1.runtime.partition_server`): the wire
forms of blocks, column groups, constants and passes, the references the executor hands out
for them, and the errors and limits of direct calls."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from dl1.tasks.passes import matvec_task, scan_task, xt_theta_task
from dl1.tasks.subproblem import subproblem_task

#: Task functions a server runs (the others go through the scheduler).
ROUTED = (scan_task, matvec_task, xt_theta_task, subproblem_task)

#: Methods of a :class:`PartitionServer` a call may name.
SERVED = frozenset({"call", "scan_pass", "extract", "held_groups", "row_start", "row_call"})

#: Name of the worker plugin holding the servers (see :mod:`dl1.runtime.servers`).
PLUGIN_NAME = "dl1-partition-servers"

#: Servers a worker keeps at most (the least recently used is closed first): solves close
#: theirs, this bounds those of coordinators that died first.
MAX_SERVERS = 8


def like(a: tuple, items: Any) -> tuple:
    """``items`` as a tuple of ``a``'s kind: a NamedTuple (a record such as a block's
    penalty) keeps its type across the wire's rewriting of its fields."""
    return type(a)(*items) if hasattr(a, "_fields") else tuple(items)


class BlockMissing(RuntimeError):
    """A block the coordinator expected in a worker's memory is not there (or the worker)."""


class BlockMoved(BlockMissing):
    """A server does not hold a block the coordinator placed on its worker: Dask moved it
    after the coordinator looked it up (its active memory manager drops extra replicas, and
    a task elsewhere that read the block made one). An expected outcome: the handler answers
    it instead of raising (no error in the worker's log) and the coordinator looks its
    blocks up again."""


class ServerClosed(RuntimeError):
    """A call named a server that its worker does not hold (closed, or never opened)."""


#: Threads starting the servers of solves while their blocks load (:class:`RpcExecutor`).
OPENER = ThreadPoolExecutor(4, thread_name_prefix="dl1-open")

@dataclass(frozen=True)
class WireBlock:
    """Wire form of a block held in the receiving server's worker memory."""

    key: Any


@dataclass(frozen=True)
class WireGroup:
    """Wire form of a gathered column group: its id and lineage (``holder`` and ``block``:
    the worker and block key to extract ``local`` from, or ``parent`` and ``keep``)."""

    gid: str
    holder: str | None
    block: Any
    local: np.ndarray | None
    parent: WireGroup | None
    keep: np.ndarray | None


@dataclass(frozen=True)
class ScanPlan:
    """Wire form of the pass that follows a subproblem on its server (see
    :meth:`PartitionServer.call`): per partition, the worker holding its blocks, the blocks,
    their column ranges and alive sets; the pass's threshold and the working set's minimum
    size; ``tree_bytes``: the servers forward a dual point of at least this many bytes
    along a binomial tree (:func:`dl1.runtime.partition_server.broadcast_tree`), and the
    first sends a smaller one to every peer."""

    holders: list[str]
    blocks: list[list[Any]]
    bounds: list[list[tuple[int, int]]]
    alive: list[list[Any]]
    threshold: float
    ws_start: int
    tree_bytes: int = 0

    def only(self, parts: list[int]) -> ScanPlan:
        """This plan's partitions ``parts`` (in that order)."""
        pick = [self.holders, self.blocks, self.bounds, self.alive]
        holders, blocks, bounds, alive = ([x[q] for q in parts] for x in pick)
        return replace(self, holders=holders, blocks=blocks, bounds=bounds, alive=alive)


@dataclass(frozen=True)
class RowPlan:
    """Row partitions held by servers (:mod:`dl1.runtime.row_parts`): ``key`` names them
    on every server; per partition, the worker holding its row blocks and the blocks (wire
    forms, or sources a task reads); ``out`` and ``add``: a part's small result and the sum
    of two, which each server applies to its partitions and adds up its subtree."""

    key: str
    holders: list[str]
    blocks: list[list[Any]]
    out: Any
    add: Any


@dataclass(frozen=True)
class WireValue:
    """Wire form of a constant of the solve; ``value`` is None once the server holds it."""

    vid: str
    value: Any


class ValueRef:
    """A constant input of the solve (``y``, sample weights): sent to a server once."""

    def __init__(self, value: Any) -> None:
        self.vid = uuid.uuid4().hex
        self.value = value
        self.future: Any = None


class GroupRef:
    """Columns of one block gathered for the subproblem (as
    :func:`~dl1.tasks.columns.extract_task`, or :func:`~dl1.tasks.columns.compact_task` of a
    parent group), made on
    first use by the server solving the subproblem and cached there."""

    def __init__(
        self,
        block: Any = None,
        local: np.ndarray | None = None,
        parent: GroupRef | None = None,
        keep: np.ndarray | None = None,
    ) -> None:
        self.gid = uuid.uuid4().hex
        self.block = block
        self.local = None if local is None else np.asarray(local, dtype=np.int64)
        self.parent = parent
        self.keep = None if keep is None else np.asarray(keep, dtype=np.int64)
        self.future: Any = None
