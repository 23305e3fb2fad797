"""Reading a fit's inputs and loading its feature blocks: shared by every entry point.

:func:`read_inputs` checks ``X``, ``y`` and the sample weights before any work starts;
:func:`load_problem` puts the feature blocks where the solvers read them (worker memory, or
sources read from the store by every task, out of core) and builds the
:class:`~dl1.solvers.base.Problem`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import dask.local
import numpy as np
import scipy.sparse as sp

from dl1.chunks import as_csc, is_pydata_sparse
from dl1.errors import StoreCorruptError, ValidationError
from dl1.objective.datafits import make_datafit, normalize_sample_weight
from dl1.runtime import persisted
from dl1.runtime.worker import WORKER_BASELINE
from dl1.solvers.base import DataHandles, Problem, RowData, WorkingSetBudget
from dl1.store import Store, open_store
from dl1.store.location import is_store_source
from dl1.store.reader import csc_column_range
from dl1.tasks.blocks import Block, BlockSource, assemble_block, identity, loaded
from dl1.tasks.gram import GRAM_DENSE_MAX
from dl1.tasks.rows import (
    RowSource,
    RowStats,
    assemble_rows,
    column_extreme_task,
    rows_stats_task,
    rows_xt_task,
)


@dataclass(frozen=True)
class Inputs:
    """A fit's validated inputs: ``X`` as a 2-D dask array (each column chunk a feature
    block), ``y``, the sample weights normalised to sum to n (empty: none), the datafit,
    and the store ``X`` came from (None: not a store)."""

    X: da.Array
    y: np.ndarray
    sample_weight: np.ndarray
    datafit: Any
    store: Store | None
    split: str
    dataset: Any = None  # a dl1.Dataset whose held blocks the fit reads

    @property
    def weights(self) -> np.ndarray | None:
        return None if self.sample_weight.shape[0] == 0 else self.sample_weight


def as_dask(X: Any, split: str) -> tuple[da.Array, np.ndarray | None, np.ndarray | None]:
    """(X as a 2-D dask array, y from a store or None, sample weights from a store or None)."""
    if is_store_source(X):
        X = open_store(X)
    if isinstance(X, Store):
        y = X.read("y", split)
        sw = X.read("sample_weight", split) if X.entry(split)["has_sample_weight"] else None
        return X.to_dask(split, X.column_format(split)), y, sw
    if isinstance(X, da.Array):
        if X.ndim != 2:
            raise ValidationError(f"X must be 2-D, got {X.ndim} dimensions")
        if any(np.isnan(c) for cs in X.chunks for c in cs):
            raise ValidationError("X has unknown chunk sizes; call X.compute_chunk_sizes()")
        return X, None, None
    if sp.issparse(X) or isinstance(X, np.ndarray) or is_pydata_sparse(X):
        if X.ndim != 2:
            raise ValidationError(
                f"X must be 2-D (samples x features); got an array of shape {X.shape}"
                + (" (one feature: X.reshape(-1, 1))" if X.ndim == 1 else "")
            )
        n, p = X.shape
        X = np.asarray(X) if isinstance(X, np.ndarray) else as_csc(X)
        return da.from_array(X, chunks=(n, max(1, -(-p // 4))), asarray=False), None, None
    raise ValidationError(
        f"X must be a dask array, a dl1 Store, store path or URL, a dl1 Dataset, a scipy.sparse "
        f"or pydata sparse matrix or a NumPy array; got {type(X).__name__}"
    )


def computed(*collections: Any, what: str = "a dask input") -> tuple[Any, ...]:
    """``dask.compute(*collections)`` on an explicit scheduler, the one a solve running
    here uses: within a solve in one piece (a task on a worker,
    :func:`dl1.runtime.one_piece.in_task`) this thread (``"sync"``; Dask's default there
    sends the graph to the cluster through the worker's client, from a task that holds one
    of the worker's threads); otherwise the current client
    (:func:`dl1.runtime.executor.current_client`, the one ``dask.compute`` would use) or,
    without one, the local scheduler Dask's configuration names (threads by default). On
    a local scheduler, collections holding persisted chunks (``what``, for the errors)
    get their chunks first (:func:`dl1.runtime.persisted.localized`)."""
    from dl1.runtime import one_piece
    from dl1.runtime.executor import current_client

    in_task = one_piece.in_task()
    client = None if in_task else current_client()
    if client is not None:
        return dask.compute(*collections, scheduler=client)
    # in a task, dask.local.get_sync itself: the name "sync" warns (dask < 2024.12) where a
    # distributed client exists, though this thread is what is meant
    scheduler = dask.local.get_sync if in_task else dask.config.get("scheduler", "threads")
    here = []
    for c in collections:
        held = persisted.held_futures(c, what)
        here.append(persisted.localized(c, what, held) if held else c)
    return dask.compute(*here, scheduler=scheduler)


def as_vector(v: Any, n: int, what: str) -> np.ndarray:
    """``v`` as n finite float64 values, refused (naming ``what`` and the entry) when it is
    not 1-D (or a single column), not real numbers (complex parts are never dropped),
    of another length or not finite. A dask array is computed by :func:`computed`."""
    (v,) = computed(v, what=what) if isinstance(v, da.Array) else (v,)
    v = np.asarray(v)
    if v.ndim > 2 or (v.ndim == 2 and v.shape[1] != 1):
        raise ValidationError(f"{what} must be 1-D; got an array of shape {v.shape}")
    if v.dtype.kind == "c":
        raise ValidationError(
            f"{what} has dtype {v.dtype}: complex values are not supported (pass the real "
            "part explicitly if that is what is meant)"
        )
    try:
        if v.dtype.kind not in "biufO":
            raise TypeError
        v = np.asarray(v, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        raise ValidationError(f"{what} has dtype {v.dtype}; use real numbers") from None
    if v.shape[0] != n:
        raise ValidationError(f"{what} has {v.shape[0]} values for {n} rows of X")
    bad = ~np.isfinite(v)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise ValidationError(f"{what}[{k}] is {v[k]} (not finite)")
    return v


#: Smallest sum of squares of a nonzero vector or column dl1 accepts: below it the squares
#: are subnormal or zero, and norms, gaps and steps lose their precision (or vanish).
SQUARES_MIN = float(np.finfo(np.float64).tiny)


def check_squares(v: np.ndarray, what: str) -> None:
    """Refuse ``v`` when its sum of squares overflows or underflows float64: every norm,
    objective and gap of the fit is made of such sums (naming the largest entry)."""
    with np.errstate(over="ignore", under="ignore"):
        sq = float(np.dot(v, v))
    if np.isfinite(sq) and (sq >= SQUARES_MIN or not v.any()):
        return
    k = int(np.argmax(np.abs(v)))
    kind = "overflows" if not np.isfinite(sq) else "underflows"
    raise ValidationError(
        f"{what}: its sum of squares {kind} float64 (largest value {what}[{k}] = {v[k]:.3g}); "
        f"rescale {what} so that its values' squares are representable"
    )


def check_store_columns(store: Store, split: str) -> None:
    """Refuse a store whose column statistics (squared norms, written with the store) show a
    column whose sum of squares is not finite, before any block is loaded."""
    sq = store.read("stats/col_sqsum", split)
    bad = ~np.isfinite(sq)
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        raise ValidationError(
            f"X column {j} (split {split!r} of {store.path}): its sum of squares overflows "
            f"float64 ({int(bad.sum())} column(s) in all); rescale the column"
        )


def read_inputs(
    X: Any, y: Any, sample_weight: Any, loss: str, split: str, *, y_optional: bool = False
) -> Inputs:
    """The validated :class:`Inputs` of a fit (``y`` and weights read from a store or from
    a :class:`~dl1.dataset.Dataset`; ``y_optional``: an empty ``y`` when there is none)."""
    from dl1.dataset import Dataset

    if isinstance(X, Dataset):
        return dataset_inputs(X, y, sample_weight, loss)
    store = open_store(X) if is_store_source(X) else X
    store = store if isinstance(store, Store) else None
    Xd, y_store, sw_store = as_dask(X if store is None else store, split)
    n, p = Xd.shape
    if n == 0 or p == 0:
        raise ValidationError(
            f"X has {n} rows and {p} columns; a fit needs at least one sample and one feature"
        )
    if np.dtype(Xd.dtype) not in (np.float32, np.float64):
        raise ValidationError(f"X has dtype {Xd.dtype}; use float32 or float64")
    if y is None:
        y = y_store
    if y is None and not y_optional:
        raise ValidationError("y is required unless X is a dl1 store")
    if store is not None:
        check_store_columns(store, split)
    datafit = make_datafit(loss)
    y = np.zeros(0) if y is None else checked_y(datafit, y, n)
    if sample_weight is None:
        sample_weight = sw_store
    return Inputs(Xd, y, normalized_weights(sample_weight, n), datafit, store, split)


def checked_y(datafit: Any, y: Any, n: int) -> np.ndarray:
    """``y`` as n finite values the datafit accepts, its squares representable."""
    y = datafit.validate_y(as_vector(y, n, "y"))
    check_squares(y, "y")
    return y


def dataset_inputs(ds: Any, y: Any, sample_weight: Any, loss: str) -> Inputs:
    """The :class:`Inputs` of a fit on a :class:`~dl1.dataset.Dataset` (or a view of its
    rows): its held data, ``y`` (given for the view's rows, or the handle's), and weights
    over all held rows, zero outside the view."""
    ds._check_live()
    held = ds._inputs
    n = ds.n_total
    if y is not None:
        y_view = as_vector(y, ds.shape[0], "y")
        y = y_view if ds.rows is None else np.zeros(n)
        if ds.rows is not None:
            y[ds.rows] = y_view
    elif held.y.shape[0]:
        y = held.y
    else:
        raise ValidationError("y is required: the Dataset was persisted without y")
    if sample_weight is not None:
        sample_weight = as_vector(sample_weight, ds.shape[0], "sample_weight")
    datafit = make_datafit(loss)
    sw = normalized_weights(ds.row_weights(sample_weight), n)
    return Inputs(held.X, checked_y(datafit, y, n), sw, datafit, held.store, held.split, ds)


def normalized_weights(sample_weight: Any, n: int) -> np.ndarray:
    """Sample weights checked (finite, non-negative) and normalised to sum to n; empty for
    None."""
    sw = np.zeros(0)
    if sample_weight is not None:
        s = as_vector(sample_weight, n, "sample_weight")
        if (s < 0).any():
            raise ValidationError(f"sample_weight[{int(np.flatnonzero(s < 0)[0])}] is negative")
        sw = normalize_sample_weight(s, n)  # divided by their largest first: never overflows
    return sw




def block_memory(store: Store, split: str) -> int:
    """Bytes the feature blocks of ``split`` take in worker memory (CSC, int32 indices)."""
    p = store.shape(split)[1]
    return store.nnz(split) * (store.dtype(split).itemsize + 4) + 16 * (p + 1)


def dense_max(streamed: bool) -> int:
    """Largest working set (rows x columns) densified for its Gram matrix: 16 MiB out of core
    (workers with little memory), 256 MiB otherwise."""
    return (1 << 21) if streamed else GRAM_DENSE_MAX


def gather_budget(ex: Any, streamed: bool) -> float:
    """Bytes of working-set columns one worker may gather (out of core: a quarter of the
    smallest worker's memory limit beyond :data:`WORKER_BASELINE`; in memory: no bound)."""
    if not streamed:
        return float("inf")
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


def memory_floor(store: Store | None, split: str, streamed: bool, n_partitions: int) -> Any:
    """What the solve makes each partition's worker hold, from the store's sizes
    (:class:`~dl1.runtime.memory.DataFloor`): its blocks in memory, or (streamed) the peak
    of reading its largest block; nothing known for other inputs."""
    from dl1.runtime.memory import READ_PEAK, DataFloor

    if store is None:
        return DataFloor()
    fmt = store.column_format(split)
    cb = store.col_bounds(split)
    per_block = store.block_nnz(split, fmt).sum(axis=0) * (store.dtype(split).itemsize + 4)
    per_block = per_block + 8 * (np.diff(cb) + 1)
    parts = np.array_split(np.arange(len(per_block)), max(1, min(n_partitions, len(per_block))))
    if streamed:
        return DataFloor(tuple(READ_PEAK * float(per_block[q].max()) for q in parts), held=False)
    return DataFloor(tuple(float(per_block[q].sum()) for q in parts), held=True)


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
):
    """The feature blocks: futures of blocks in worker memory, or (``stream``) their sources."""
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
    part_of = np.concatenate(
        [
            np.full(len(a), q)
            for q, a in enumerate(np.array_split(np.arange(K), max(1, min(n_partitions, K))))
        ]
    )
    return ex.compute(tasks, workers=part_of.tolist()), cb


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
    ex.check_memory(memory_floor(inputs.store, inputs.split, streamed, n_partitions))
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
            inputs.store, inputs.split, streamed,
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


def check_two_classes(inputs: Inputs, loss: str, fit_intercept: bool) -> None:
    """Refuse a classification loss fitted with an intercept when one label has no positive
    weight: the intercept alone then fits every sample (the logistic loss's is infinite),
    and the solvers' steps and tolerances, relative to the objective at ``w = 0``, are
    undefined. One check for every classification loss and solver, before any loading."""
    y = inputs.y
    if not fit_intercept or not inputs.datafit.classifies or y.shape[0] == 0:
        return
    w = inputs.weights
    for label in (-1.0, 1.0):
        mass = float(np.count_nonzero(y == label) if w is None else w[y == label].sum())
        if mass <= 0.0:
            raise ValidationError(
                f"{loss} fit with an intercept needs both labels -1 and +1 with positive "
                f"weight; label {label:+.0f} has none (the intercept alone fits every sample)"
            )


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
    return RowData(blocks, rb, parts, checked_rows(ex, blocks, rb, parts, inputs.sample_weight,
                                                   stored_squares(inputs)))  # fmt: skip


def held_rows(ex: Any, inputs: Inputs, n_partitions: int) -> RowData:
    """The row blocks in worker memory (a store's own CSR blocks when it has them), checked
    by :func:`checked_rows` as every layout's data is."""
    Xd = inputs.X
    if inputs.store is not None and "csr" in inputs.store.entry(inputs.split)["formats"]:
        Xd = inputs.store.to_dask(inputs.split, "csr")
    blocks, rb = rows_in_memory(ex, Xd, n_partitions, inputs.store is not None)
    parts = row_parts(len(blocks), n_partitions)
    return RowData(blocks, rb, parts, checked_rows(ex, blocks, rb, parts, inputs.sample_weight,
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
) -> float:  # fmt: skip
    """The largest squared row norm of the row blocks, after the checks the feature blocks
    make (:func:`dl1.tasks.blocks.check_column_squares`: every column's sum of squares,
    raw and weighted, neither overflowing float64 nor, for a nonzero column, underflowing
    it) and that of the steps of the sample-wise solvers (every row's squared norm finite):
    the same data is refused whatever the layout, before any solver runs. Given a store's
    sums of squares (``stored``), the row blocks' must be them (:func:`check_squares_tie`)."""

    def part_stats(q: int, part: list[int]) -> Any:
        lo, hi = int(rb[part[0]]), int(rb[part[-1] + 1])
        return ex.submit_to(q, rows_stats_task, [blocks[i] for i in part],
                            sw[lo:hi] if sw.shape[0] else sw, lo)  # fmt: skip

    stats: list[RowStats] = ex.gather([part_stats(q, part) for q, part in enumerate(parts)])
    with np.errstate(over="ignore", invalid="ignore"):
        raw = np.sum([s.col_sq for s in stats], axis=0)
        wsq = np.sum([s.col_wsq for s in stats], axis=0) if sw.shape[0] else raw
        over = ~(np.isfinite(raw) & np.isfinite(wsq))
        under = (raw < SQUARES_MIN) & (np.sum([s.col_nnz for s in stats], axis=0) > 0)
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
    for s in stats:
        if s.bad_row[0] >= 0:
            raise ValidationError(
                f"X row {s.bad_row[0]}: its sum of squares overflows float64 (largest value "
                f"{s.bad_row[1]:.3g}), which leaves the sample-wise solvers no step; rescale X"
            )
    return float(max((s.row_sqnorm_max for s in stats), default=0.0))


def rows_in_memory(ex: Any, Xd: da.Array, n_partitions: int, verified: bool):
    """Futures of the row blocks of ``Xd`` (its row chunks, split further when there are
    fewer than partitions) on their partitions' workers, and the blocks' first rows."""
    n = Xd.shape[0]
    if Xd.numblocks[0] < n_partitions:
        Xd = Xd.rechunk({0: max(1, -(-n // n_partitions))})
    rb = np.concatenate([[0], np.cumsum(Xd.chunks[0])]).astype(np.int64)
    dl = Xd.to_delayed()
    tasks = [
        dask.delayed(assemble_rows, pure=True)(i, int(rb[i]), *dl[i, :].tolist(), verified=verified)
        for i in range(len(rb) - 1)
    ]
    split = np.array_split(np.arange(len(tasks)), max(1, min(n_partitions, len(tasks))))
    part_of = [q for q, a in enumerate(split) for _ in a]
    blocks = ex.compute(tasks, workers=part_of)
    ex.wait(blocks)
    return blocks, rb


def row_sources(store: Store, split: str) -> tuple[list[RowSource], np.ndarray]:
    """The store's row blocks as sources (CSR chunks when the store has them)."""
    e = store.entry(split)
    fmt = "csr" if "csr" in e["formats"] else e["formats"][0]
    rb, cb = store.row_bounds(split), store.col_bounds(split)
    root = store.root
    sources = [
        RowSource(
            i, int(rb[i]), int(rb[i + 1] - rb[i]), root, split, fmt,
            tuple((j, e["blocks"][fmt][i][j], store.block_shape(split, i, j))
                  for j in range(len(cb) - 1)),
        )  # fmt: skip
        for i in range(len(rb) - 1)
    ]
    return sources, rb.astype(np.int64)


def rows_xt_theta(ex: Any, rows: RowData, theta: np.ndarray) -> np.ndarray:
    """``X^T theta`` (length p) from the row blocks: each partition sums its blocks' parts
    on its worker, the coordinator adds the partitions' vectors in order."""
    parts = ex.gather(
        [ex.submit_to(q, rows_xt_task, [rows.blocks[i] for i in part], theta)
         for q, part in enumerate(rows.parts)]
    )  # fmt: skip
    return np.sum(parts, axis=0)



