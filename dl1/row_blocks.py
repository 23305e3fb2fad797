"""The row blocks the sample-wise solvers read: loaded, checked, and ``X^T theta`` from them.

:func:`load_rows` puts the row blocks (CSR, global columns) in worker memory or makes them
sources read from the store by every task; :func:`checked_rows` refuses the data the
feature blocks would refuse, whatever the layout; :func:`rows_xt_theta` is the one product
the solvers need from all rows. The column layout is loaded by :mod:`dl1.loading`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import dask
import dask.array as da
import numpy as np

from dl1.chunks import matrix_nbytes
from dl1.errors import StoreCorruptError, ValidationError
from dl1.inputs import SQUARES_MIN, Inputs
from dl1.runtime.compute import graph_carrying
from dl1.runtime.tree import tree_reduce
from dl1.solvers.base import RowData
from dl1.store import Store
from dl1.tasks.rows import (
    RowSource,
    RowStats,
    add_row_stats,
    assemble_rows,
    column_extreme_task,
    loaded_rows,
    rows_stats_task,
)


class RowSquares(NamedTuple):
    """What the loading's checks keep of the row blocks' squares (:class:`RowData`'s
    last fields)."""

    row_sqnorm_max: float
    col_sq: np.ndarray


def load_rows(ex: Any, inputs: Inputs, n_partitions: int, streamed: bool) -> RowData:
    """The row blocks (CSR, global columns), at least one per partition: in worker memory,
    the blocks of partition ``q`` on the worker of partition ``q``, or (``streamed``)
    sources read from the store by every task. A store's row blocks are its own (read as
    CSR when it has them); an in-memory X is split into one block per partition."""
    if inputs.dataset is not None:
        return inputs.dataset.row_blocks(ex)
    if not streamed:
        return held_rows(ex, inputs, n_partitions)
    blocks, rb = row_sources(inputs.store, inputs.split)
    parts = row_parts(len(blocks), n_partitions)
    return RowData(blocks, rb, parts, *checked_rows(ex, blocks, rb, parts, inputs.sample_weight,
                                                    stored_squares(inputs)))  # fmt: skip


def held_rows(ex: Any, inputs: Inputs, n_partitions: int) -> RowData:
    """The row blocks in worker memory (a store's own CSR blocks when it has them), checked
    by :func:`checked_rows` as every layout's data is."""
    if inputs.local is not None and not ex.in_process:
        blocks, rb = spread_rows(ex, inputs.local, n_partitions)
    elif inputs.store is not None:
        blocks, rb = rows_read_in_place(ex, inputs.store, inputs.split, n_partitions)
    else:
        blocks, rb = rows_in_memory(ex, inputs.X, n_partitions)
    parts = row_parts(len(blocks), n_partitions)
    return RowData(blocks, rb, parts, *checked_rows(ex, blocks, rb, parts, inputs.sample_weight,
                                                    stored_squares(inputs)))  # fmt: skip


#: Relative agreement asked of a column's sum of squares from the row blocks and from the
#: store's statistics: the row blocks square in the data's dtype (float32 rounds each term
#: by 6e-8), the writer in float64; a layout rewritten with other values differs by far more.
SQUARES_RTOL = 1e-5


def stored_squares(inputs: Inputs) -> tuple[str, np.ndarray] | None:
    """The store's column sums of squares (written with the store, from the data every
    layout holds) and where they come from, to tie the row layout to; None for other data
    or a store without them."""
    store, split = inputs.store, inputs.split
    if store is None or "stats/col_sqsum" not in store.entry(split)["arrays"]:
        return None
    return f"{store.root} [{split}]", np.asarray(store.read("stats/col_sqsum", split))


def check_squares_tie(raw: np.ndarray, stored: tuple[str, np.ndarray]) -> None:
    """Refuse a store whose row blocks' column sums of squares are not its statistics':
    its CSR layout holds other values than those it was written with (its blocks' digests
    in the manifest may have been rewritten to match), which the sample-wise solvers, which
    read only that layout, would otherwise fit silently."""
    where, expected = stored
    with np.errstate(invalid="ignore"):
        bad = ~np.isclose(raw, expected, rtol=SQUARES_RTOL, atol=0.0)
    if bad.any():
        c = int(np.flatnonzero(bad)[0])
        raise StoreCorruptError(
            f"store {where}: column {c}'s sum of squares is {raw[c]:.9g} in the row blocks "
            f"and {expected[c]:.9g} in the store's statistics: its layouts disagree "
            f"({int(bad.sum())} column(s)); write the store again"
        )


def row_parts(n_blocks: int, n_partitions: int) -> list[list[int]]:
    """The row blocks of each partition: consecutive runs, as even as they split."""
    split = np.array_split(np.arange(n_blocks), max(1, min(n_partitions, n_blocks)))
    return [[int(i) for i in a] for a in split]


def checked_rows(
    ex: Any, blocks: list[Any], rb: np.ndarray, parts: list[list[int]], sw: np.ndarray,
    stored: tuple[str, np.ndarray] | None = None,
) -> RowSquares:  # fmt: skip
    """The largest squared row norm of the row blocks and each column's sum of squares
    (unweighted), after the checks the feature blocks
    make (:func:`dl1.tasks.blocks.check_column_squares`: every column's sum of squares,
    raw and weighted, neither overflowing float64 nor, for a nonzero column, underflowing
    it) and that of the steps of the sample-wise solvers (every row's squared norm finite):
    the same data is refused whatever the layout, before any solver runs. Given a store's
    sums of squares (``stored``), the row blocks' must be them (:func:`check_squares_tie`)."""

    def part_stats(q: int, part: list[int]) -> Any:
        lo, hi = int(rb[part[0]]), int(rb[part[-1] + 1])
        return ex.submit_to(q, rows_stats_task, [blocks[i] for i in part],
                            sw[lo:hi] if sw.shape[0] else sw, lo)  # fmt: skip

    # summed along a tree of the workers: the coordinator receives one set of length-p sums
    each = [(q, part_stats(q, part)) for q, part in enumerate(parts)]
    stats: RowStats = ex.gather([tree_reduce(ex, each, add_row_stats)])[0]
    raw = stats.col_sq
    wsq = stats.col_wsq if sw.shape[0] else raw
    over = ~(np.isfinite(raw) & np.isfinite(wsq))
    under = (raw < SQUARES_MIN) & stats.col_any
    for bad, kind in ((over, "overflows"), (under, "underflows")):
        if bad.any():
            c = int(np.flatnonzero(bad)[0])
            top = max(ex.gather([ex.submit_to(q, column_extreme_task, [blocks[i] for i in part], c)
                                 for q, part in enumerate(parts)]))  # fmt: skip
            raise ValidationError(
                f"X column {c}: its sum of squares {kind} float64 (largest value {top[0]:.3g}, "
                f"row {top[1]}; {int(bad.sum())} column(s) in all); rescale the column"
            )
    if stored is not None:
        check_squares_tie(raw, stored)
    if stats.bad_row[0] >= 0:
        raise ValidationError(
            f"X row {stats.bad_row[0]}: its sum of squares overflows float64 (largest value "
            f"{stats.bad_row[1]:.3g}), which leaves the sample-wise solvers no step; rescale X"
        )
    return RowSquares(float(stats.row_sqnorm_max), raw)


def rows_in_memory(ex: Any, Xd: da.Array, n_partitions: int) -> tuple[list[Any], np.ndarray]:
    """Futures of the row blocks of ``Xd`` (its row chunks, split further when there are
    fewer than partitions) on their partitions' workers, and the blocks' first rows."""
    n = Xd.shape[0]
    if Xd.numblocks[0] < n_partitions:
        Xd = Xd.rechunk({0: max(1, -(-n // n_partitions))})
    rb = np.concatenate([[0], np.cumsum(Xd.chunks[0])]).astype(np.int64)
    dl = Xd.to_delayed()
    tasks = [
        dask.delayed(assemble_rows, pure=True)(i, int(rb[i]), *dl[i, :].tolist())
        for i in range(len(rb) - 1)
    ]
    split = np.array_split(np.arange(len(tasks)), max(1, min(n_partitions, len(tasks))))
    part_of = [q for q, a in enumerate(split) for _ in a]
    blocks = ex.compute(tasks, workers=part_of)
    ex.wait(blocks)
    return blocks, rb


def rows_read_in_place(ex: Any, store: Store, split: str, n_partitions: int) -> tuple[
    list[Any], np.ndarray
]:
    """Futures of a store's row blocks, each read (and verified) by one task on its
    partition's worker (:meth:`RowSource.load`), and the blocks' first rows. A store with
    fewer row blocks than partitions has each cut into pieces, each piece's worker reading
    the block's chunks and keeping its rows. Reading a block's chunks as tasks of their own
    would let Dask run them on any worker and move them to the partition's (a row layout's
    whole data, measured at 0.5 GB a worker)."""
    n_blocks = len(store.row_bounds(split)) - 1
    sources, rb = row_sources(store, split, -(-n_partitions // max(1, n_blocks)))
    blocks: list[Any] = [None] * len(sources)
    for q, part in enumerate(row_parts(len(sources), n_partitions)):
        for i in part:
            blocks[i] = ex.submit_to(q, loaded_rows, sources[i])
    ex.wait(blocks)
    return blocks, rb


def spread_rows(ex: Any, local: Any, n_partitions: int) -> tuple[list[Any], np.ndarray]:
    """Futures of one row block per partition of the in-memory matrix ``local``, the rows
    of each in its own task (as :func:`dl1.loading.spread_blocks` does columns), on its
    partition's worker; and the blocks' first rows."""
    n = local.shape[0]
    size = max(1, -(-n // n_partitions))  # the rows of rows_in_memory's chunks
    rb = np.r_[np.arange(0, n, size), n].astype(np.int64)
    tasks = [
        # rows of CSC: a copy of those rows only (they are spread over its whole arrays)
        dask.delayed(assemble_rows, pure=False)(i, int(rb[i]), local[int(rb[i]):int(rb[i + 1])])
        for i in range(len(rb) - 1)
    ]
    with graph_carrying(matrix_nbytes(local)):
        blocks = ex.compute(tasks, workers=list(range(len(tasks))))
    ex.wait(blocks)
    return blocks, rb


def row_sources(store: Store, split: str, pieces: int = 1) -> tuple[list[RowSource], np.ndarray]:
    """The store's row blocks as sources (CSR chunks when the store has them), each cut into
    ``pieces`` runs of rows as even as they split; and the sources' first rows."""
    e = store.entry(split)
    fmt = "csr" if "csr" in e["formats"] else e["formats"][0]
    rb, cb = store.row_bounds(split), store.col_bounds(split)
    sources: list[RowSource] = []
    for b in range(len(rb) - 1):
        reads = tuple((j, e["blocks"][fmt][b][j], store.block_shape(split, b, j))
                      for j in range(len(cb) - 1))  # fmt: skip
        n_b = int(rb[b + 1] - rb[b])
        cuts = np.linspace(0, n_b, max(1, min(pieces, n_b)) + 1).round().astype(np.int64)
        for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):
            sources.append(RowSource(len(sources), int(rb[b] + lo), int(hi - lo), store.root,
                                     split, fmt, reads, b, int(lo)))  # fmt: skip
    starts = [s.r0 for s in sources] + [int(rb[-1])]
    return sources, np.asarray(starts, dtype=np.int64)
