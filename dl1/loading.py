"""Loading a fit's feature blocks and building its :class:`~dl1.solvers.base.Problem`.

:func:`load_problem` puts the feature blocks where the solvers read them (worker memory, or
sources read from the store by every task, out of core), with the memory budgets of the
working set, and builds the Problem. The inputs it loads are read and checked by
:mod:`dl1.inputs`; the row blocks of the sample-wise solvers come from :mod:`dl1.row_blocks`.
"""

from __future__ import annotations

import time
from typing import Any

import dask
import dask.array as da
import numpy as np
import scipy.sparse as sp

from dl1.chunks import column_range, matrix_nbytes
from dl1.errors import ValidationError
from dl1.inputs import Inputs, check_two_classes
from dl1.row_blocks import load_rows
from dl1.runtime.compute import graph_carrying
from dl1.runtime.memory import READ_PEAK, DataFloor
from dl1.runtime.worker import WORKER_BASELINE
from dl1.solvers.base import DataHandles, Problem, WorkingSetBudget
from dl1.store import Store
from dl1.store.reader import block_memory, csc_column_range
from dl1.tasks.blocks import Block, BlockSource, assemble_block, identity, loaded
from dl1.tasks.gram import GRAM_DENSE_MAX


def dense_max(streamed: bool) -> int:
    """Largest working set (rows x columns) densified for its Gram matrix: 16 MiB out of core
    (workers with little memory), 256 MiB otherwise."""
    return (1 << 21) if streamed else GRAM_DENSE_MAX


def gather_budget(ex: Any, streamed: bool) -> float:
    """Bytes of working-set columns one worker may gather (out of core: a quarter of the
    smallest worker's memory limit beyond :data:`WORKER_BASELINE`; in memory: no bound)."""
    if not streamed:
        return float("inf")
    # local: psutil (~0.02 s to import) only to size the budget of an out-of-core fit
    import psutil

    total = psutil.virtual_memory().total
    if hasattr(ex, "client"):
        limits = [
            w.get("memory_limit") or total for w in ex.client.scheduler_info()["workers"].values()
        ]
    else:
        limits = [psutil.virtual_memory().available]
    return max(min(limits or [total]) - WORKER_BASELINE, 0) / 4


def working_set_limits(
    ex: Any, store: Store | None, split: str, streamed: bool
) -> tuple[np.ndarray | None, float]:
    """``(col_bytes, cache_max)`` for :func:`dl1.solvers.ws.solve_ws`: out of core, the bytes
    of each column once extracted (per nonzero an int32 row and a value in the store's
    dtype, from the store's column counts) and what the workers may hold of a working set's
    columns (the sum of their :func:`gather_budget`, a quarter of their memory beyond the
    baseline: the cached groups may hold up to twice a working set, and the rest is for the
    pass's block, the Gram matrix and transients); in memory, no bound."""
    if not streamed or store is None:
        return None, float("inf")
    per_nnz = 4 + store.dtype(split).itemsize  # an int32 row and a value in the store's dtype
    col_bytes = per_nnz * store.read("stats/col_nnz", split).astype(np.float64) + 8
    return col_bytes, gather_budget(ex, streamed) * max(1, ex.n_workers)


def decide_stream(
    stream: bool | None, store: Store | None, split: str, ex: Any, dataset: Any = None
) -> bool:
    """Whether blocks are re-read from the store by every task instead of kept in memory.

    ``None`` (auto) streams when the blocks would take more than half of the memory the
    workers have for data: the sum over workers of ``memory_limit`` minus
    :data:`WORKER_BASELINE` (in-process: half of the available RAM). The blocks of a
    ``dataset`` (:class:`~dl1.dataset.Dataset`) are in memory already.
    """
    if stream is False:
        return False
    if dataset is not None:
        if stream:
            raise ValidationError(
                "stream=True reads blocks from the store: X is a Dataset, whose blocks are "
                "held in memory; pass the store instead"
            )
        return False
    if store is None:
        if stream:
            raise ValidationError(
                "stream=True reads blocks from a dl1 store: X must be a Store or a store path "
                "(convert a dask array with dl1.from_dask)"
            )
        return False
    if stream:
        return True
    # local: psutil (~0.02 s to import) only when streaming is decided from memory (auto)
    import psutil

    need = block_memory(store, split)
    if hasattr(ex, "client"):
        limits = [
            w.get("memory_limit") or 0 for w in ex.client.scheduler_info()["workers"].values()
        ]
        total = psutil.virtual_memory().total
        budget = sum(max((lim or total) - WORKER_BASELINE, 0) for lim in limits)
    else:
        budget = psutil.virtual_memory().available
    return need > 0.5 * budget


def memory_floor(inputs: Inputs, streamed: bool, n_partitions: int) -> Any:
    """What the solve makes each partition's worker hold (:class:`~dl1.runtime.memory.
    DataFloor`): from a store's sizes, its blocks in memory or (streamed) the peak of
    reading its largest block; for a matrix in this process's memory, its blocks and the
    whole matrix, which every worker cutting blocks from it receives
    (:func:`local_floor`); nothing known for other inputs (a dask array)."""
    store, split = inputs.store, inputs.split
    if store is None:
        return DataFloor() if inputs.local is None else local_floor(inputs.local, n_partitions)
    fmt = store.column_format(split)
    cb = store.col_bounds(split)
    per_block = store.block_nnz(split, fmt).sum(axis=0) * (store.dtype(split).itemsize + 4)
    per_block = per_block + 8 * (np.diff(cb) + 1)
    parts = np.array_split(np.arange(len(per_block)), max(1, min(n_partitions, len(per_block))))
    if streamed:
        return DataFloor(tuple(READ_PEAK * float(per_block[q].max()) for q in parts), held=False)
    return DataFloor(tuple(float(per_block[q].sum()) for q in parts), held=True)


def local_floor(local: Any, n_partitions: int) -> Any:
    """:class:`~dl1.runtime.memory.DataFloor` of a matrix in this process's memory (CSC or
    a NumPy array): per partition (a share of its columns), its blocks (CSC, int32 indices)
    plus the columns they are cut from, which the worker receives (:func:`spread_blocks`)."""
    if sp.issparse(local):
        nnz = np.diff(local.indptr)
        given = nnz * (local.dtype.itemsize + local.indices.itemsize) + local.indptr.itemsize
    else:  # dense: its nonzeros become the blocks
        nnz = np.count_nonzero(local, axis=0)
        given = np.full(local.shape[1], local.shape[0] * local.dtype.itemsize)
    per_col = (nnz * (local.dtype.itemsize + 4) + given).astype(np.float64) + 8.0
    parts = np.array_split(per_col, max(1, min(n_partitions, per_col.shape[0])))
    return DataFloor(tuple(float(q.sum()) for q in parts), held=True)


def block_sources(store: Store, split: str, sw: np.ndarray, standardize: bool, center: bool):
    e = store.entry(split)
    fmt = store.column_format(split)
    rb, cb = store.row_bounds(split), store.col_bounds(split)
    nnz = store.block_nnz(split, fmt)
    root = store.root
    return [
        BlockSource(
            j,
            int(cb[j]),
            int(cb[j + 1] - cb[j]),
            int(nnz[:, j].sum()),
            root,
            split,
            fmt,
            tuple(
                (i, e["blocks"][fmt][i][j], store.block_shape(split, i, j))
                for i in range(len(rb) - 1)
            ),
            sw,
            standardize,
            center,
        )
        for j in range(len(cb) - 1)
    ], cb.astype(np.int64)


def load_blocks(
    ex,
    Xd: da.Array,
    sw: np.ndarray,
    standardize: bool,
    center: bool,
    n_partitions: int,
    store: Store | None = None,
    split: str = "train",
    stream: bool = False,
    *,
    local: Any = None,
):
    """The feature blocks: futures of blocks in worker memory, or (``stream``) their sources.

    ``local``, the in-memory matrix ``Xd`` wraps (None: none): on a cluster each block's
    columns travel in its own task, to its partition's worker only (:func:`spread_blocks`).
    """
    if stream:
        assert store is not None
        return block_sources(store, split, sw, standardize, center)
    stored = np.concatenate([[0], np.cumsum(Xd.chunks[1])]).astype(np.int64)
    col_nnz = None  # read only when a stored block is to be cut
    if store is not None and len(stored) - 1 < n_partitions:
        col_nnz = store.read("stats/col_nnz", split)
    cb = finer_bounds(stored, n_partitions, col_nnz)
    if store is not None and ex.in_process:
        return blocks_here(store, split, stored, cb, sw, standardize, center), cb
    K = len(cb) - 1
    part_of = np.concatenate(
        [
            np.full(len(a), q)
            for q, a in enumerate(np.array_split(np.arange(K), max(1, min(n_partitions, K))))
        ]
    ).tolist()
    if local is not None and not ex.in_process:
        return spread_blocks(ex, local, cb, part_of, sw, standardize, center), cb
    dl = Xd.to_delayed()
    tasks = []
    for j in range(K):
        s, piece = stored_piece(stored, cb, j)
        chunks = dl[:, s].tolist()
        if piece is not None:
            lo, hi = piece
            if store is not None and ex.n_workers > 1:  # each piece read where it is kept
                fmt = store.column_format(split)
                chunks = [store.column_piece(split, fmt, i, s, lo, hi) for i in range(len(chunks))]
            else:
                chunks = [dask.delayed(csc_column_range, pure=True)(c, lo, hi) for c in chunks]
        tasks.append(
            dask.delayed(assemble_block, pure=True)(
                j, int(cb[j]), sw, standardize, center, *chunks, verified=store is not None
            )
        )
    return ex.compute(tasks, workers=part_of), cb


def spread_blocks(ex: Any, local: Any, cb: np.ndarray, part_of: list[int], sw: np.ndarray,
                  standardize: bool, center: bool) -> list[Any]:  # fmt: skip
    """Futures of the blocks of the in-memory matrix ``local`` (of column bounds ``cb``),
    the columns of each in its own task, placed on partition ``part_of[j]``'s worker: a
    worker receives its blocks' columns only (a dask array wrapping the whole matrix
    sends it whole to every worker that computes one of its chunks), and the scheduler,
    which keeps each task's arguments, can compute a block again if its worker is lost."""
    tasks = [
        dask.delayed(assemble_block, pure=False)(
            j, int(cb[j]), sw, standardize, center, column_range(local, int(cb[j]), int(cb[j + 1]))
        )
        for j in range(len(cb) - 1)
    ]
    with graph_carrying(matrix_nbytes(local)):
        return ex.compute(tasks, workers=part_of)


def stored_piece(
    stored: np.ndarray, cb: np.ndarray, j: int
) -> tuple[int, tuple[int, int] | None]:
    """The stored block (of column bounds ``stored``) holding block ``j`` of bounds ``cb``,
    and ``j``'s columns ``(lo, hi)`` within it; None for a block stored whole."""
    s = int(np.searchsorted(stored, cb[j], side="right") - 1)
    if (cb[j], cb[j + 1]) == (stored[s], stored[s + 1]):
        return s, None
    return s, (int(cb[j] - stored[s]), int(cb[j + 1] - stored[s]))


def blocks_here(
    store: Store,
    split: str,
    stored: np.ndarray,
    cb: np.ndarray,
    sw: np.ndarray,
    standardize: bool,
    center: bool,
) -> list[Block]:
    """The feature blocks of columns ``cb`` read from ``store`` in this process, as
    :func:`load_blocks` would compute them, without a task graph: building and running one
    costs a small in-process fit (or a solve in one piece) as much as the read itself. A
    stored block cut into pieces is read once, its pieces views of it (together they keep
    all of it)."""
    n_row_blocks = len(store.row_bounds(split)) - 1
    fmt = store.column_format(split)
    blocks, read, chunks = [], -1, []
    for j in range(len(cb) - 1):
        s, piece = stored_piece(stored, cb, j)
        if s != read:
            chunks = [store.read_block(split, i, s, fmt) for i in range(n_row_blocks)]
            read = s
        pieces = chunks
        if piece is not None:
            pieces = [csc_column_range(c, *piece, copy=False) for c in chunks]
        blocks.append(
            assemble_block(j, int(cb[j]), sw, standardize, center, *pieces, verified=True)
        )
    return blocks


def finer_bounds(
    stored: np.ndarray, n_partitions: int, col_nnz: np.ndarray | None
) -> np.ndarray:
    """Column bounds of the blocks to load: the stored blocks ``stored``, each cut into
    ``ceil(n_partitions / K)`` pieces of about equal nonzeros (``col_nnz``; equal widths
    without it) when there are fewer (``K``) than partitions, so that every partition, and
    so every worker, gets a share of a store written in one block; never more pieces than
    a block has columns, so the work follows the data, not ``n_partitions``. The cuts
    depend on the data and ``n_partitions`` only, never on the cluster."""
    K = len(stored) - 1
    if K >= n_partitions:
        return stored
    want = -(-n_partitions // K)
    bounds = [0]
    for lo, hi in zip(stored[:-1].tolist(), stored[1:].tolist(), strict=True):
        pieces = max(1, min(want, hi - lo))  # a block of w columns has at most w pieces
        if col_nnz is None or col_nnz[lo:hi].sum() == 0:
            cuts = np.linspace(lo, hi, pieces + 1).round().astype(np.int64)[1:-1]
        else:
            cum = np.cumsum(col_nnz[lo:hi])
            cuts = lo + 1 + np.searchsorted(cum, cum[-1] * np.arange(1, pieces) / pieces)
        bounds += [c for c in np.unique(cuts).tolist() if bounds[-1] < c < hi] + [hi]
    return np.asarray(bounds, dtype=np.int64)


def block_scale(block: Block | BlockSource) -> np.ndarray:
    """A block's column scales (standardisation; empty: none)."""
    return loaded(block).col_scale


def col_scales(ex: Any, blocks: list[Any]) -> np.ndarray:
    """The column scales of all blocks (standardisation), in feature order."""
    return np.concatenate(ex.gather([ex.submit(block_scale, b) for b in blocks]))


def load_problem(
    inputs: Inputs,
    ex: Any,
    *,
    penalty: Any,
    fit_intercept: bool,
    standardize: bool,
    tol: float,
    n_partitions: int,
    loss: str,
    streamed: bool,
    layout: str = "columns",
) -> tuple[Problem, float]:
    """The feature blocks loaded (in worker memory, or as sources when ``streamed``), or
    for ``layout="rows"`` the row blocks, and the :class:`~dl1.solvers.base.Problem` on
    them; returned with the seconds loading took."""
    t0 = time.perf_counter()
    check_two_classes(inputs, loss, fit_intercept)
    ex.check_memory(memory_floor(inputs, streamed, n_partitions))
    rows = None
    if layout == "rows":
        if standardize:
            raise ValidationError("standardize=True is not available with the sample-wise solvers")
        rows = load_rows(ex, inputs, n_partitions, streamed)
        blocks, col_bounds = [], np.array([0, inputs.X.shape[1]], dtype=np.int64)
    elif inputs.dataset is not None:
        blocks, col_bounds = inputs.dataset.feature_blocks(
            ex, inputs.sample_weight, standardize, fit_intercept
        )
    else:
        blocks, col_bounds = load_blocks(
            ex, inputs.X, inputs.sample_weight, standardize, fit_intercept, n_partitions,
            inputs.store, inputs.split, streamed, local=inputs.local,
        )  # fmt: skip
        if not streamed:
            ex.wait(blocks)
    seconds = time.perf_counter() - t0
    col_bytes, cache_max = working_set_limits(ex, inputs.store, inputs.split, streamed)
    budget = WorkingSetBudget(
        dense_max(streamed), gather_budget(ex, streamed), col_bytes, cache_max
    )
    handles = DataHandles(
        ex.submit(identity, inputs.y), ex.submit(identity, inputs.sample_weight)
    )
    problem = Problem(
        ex, blocks, col_bounds, inputs.y, inputs.sample_weight, inputs.datafit, penalty,
        fit_intercept, tol, n_partitions, budget, handles, rows,
    )  # fmt: skip
    return problem, seconds
