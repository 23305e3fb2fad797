"""Row blocks on the workers, for the solvers that work by samples: CSR arrays of a range
of rows with global column indices (in memory, or read from the store by every task), and
the certificate's passes over them (``X w``, ``X^T theta``). The solvers' epochs are in
:mod:`dl1.tasks.stochastic`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
from dask.sizeof import sizeof

from dl1.chunks import as_csr
from dl1.errors import ValidationError
from dl1.kernels import store as store_kernels
from dl1.kernels.linalg import csc_col_sqnorms

NO_SCALE = np.zeros(0)


@dataclass
class RowBlock:
    """Rows ``r0 .. r0 + n_rows`` of X as CSR (column indices global), with the largest
    squared row norm (which bounds the stable step sizes)."""

    i: int
    r0: int
    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    p: int
    row_sqnorm_max: float

    @property
    def n_rows(self) -> int:
        return self.indptr.shape[0] - 1

    @property
    def nbytes(self) -> int:
        return self.indptr.nbytes + self.indices.nbytes + self.data.nbytes


@sizeof.register(RowBlock)
def _row_block_sizeof(block: RowBlock) -> int:
    """What a held row block takes, for Dask's memory accounting."""
    return block.nbytes


@dataclass(frozen=True)
class RowSource:
    """A range of rows left in its store, read and assembled by each task using it: out of
    core, a worker holds one row block at a time, whatever the size of the data. The rows
    are ``lo .. lo + n_rows`` of the store's row block ``block`` (all of it, or a piece
    when the store has fewer row blocks than partitions); ``reads`` holds, per feature
    block, the arguments of the store's verified reader of that block."""

    i: int
    r0: int
    n_rows: int
    root: str
    split: str
    fmt: str
    reads: tuple  # ((j, block manifest entry, block shape), ...)
    block: int
    lo: int

    def load(self) -> RowBlock:
        # local: dl1.store loads zarr and its codecs; workers on held blocks never need them
        from dl1.store.reader import read_block_task

        if self.fmt == "csr":
            return self._stacked()
        chunks = [
            self._rows_of(read_block_task(self.root, self.split, self.fmt, self.block, j, blk,
                                          shape, "scipy"))
            for j, blk, shape in self.reads
        ]  # fmt: skip
        return assemble_rows(self.i, self.r0, *chunks, verified=True)

    def _rows_of(self, chunk: sp.spmatrix) -> sp.spmatrix:
        """This source's rows of a chunk of its store block: the chunk itself when the
        source is the whole block (no copy: out of core, every pass reads it)."""
        if self.lo == 0 and self.n_rows == chunk.shape[0]:
            return chunk
        return as_csr(chunk)[self.lo : self.lo + self.n_rows]

    def _stacked(self) -> RowBlock:
        """The CSR chunks' rows placed one chunk at a time into preallocated arrays: besides
        the result, one chunk is in memory (the row counts come from the small index
        pointers first; scipy's ``hstack`` holds the chunks, the result and a temporary)."""
        # local: zarr and its codecs only where a store is read (as in load)
        from dl1.store.arrays import read_array
        from dl1.store.format import block_key
        from dl1.store.reader import read_block_arrays

        rows = slice(self.lo, self.lo + self.n_rows + 1)
        counts = np.zeros(self.n_rows, dtype=np.int64)
        for j, blk, _ in self.reads:
            key = block_key(self.split, self.fmt, self.block, j)
            counts += np.diff(read_array(self.root, f"{key}/indptr", blk["arrays"]["indptr"])[rows])
        indptr = np.zeros(self.n_rows + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        indices = np.empty(indptr[-1], dtype=np.int32)
        data = np.empty(indptr[-1], dtype=np.float64)
        cursor = indptr[:-1].copy()
        c0 = 0
        for j, blk, shape in self.reads:
            ip, ix, dx = read_block_arrays(self.root, self.split, self.fmt, self.block, j, blk,
                                           shape)  # fmt: skip
            # the kernel appends segments with an index offset: rows of CSR chunks, columns;
            # its index pointer holds positions in ix / dx, so a piece's rows need no copy
            store_kernels.csc_append_rows(ip[rows], ix, dx, c0, indices, data, cursor)
            c0 += shape[1]
        sq = csc_col_sqnorms(indptr, indices, data, NO_SCALE, NO_SCALE)
        return RowBlock(self.i, self.r0, indptr, indices, data, c0, float(sq.max(initial=0.0)))


def loaded_rows(block: RowBlock | RowSource) -> RowBlock:
    """The row block itself, or the row block read from its store."""
    return block.load() if isinstance(block, RowSource) else block


def assemble_rows(i: int, r0: int, *col_chunks, verified: bool = False) -> RowBlock:
    """Row block ``i`` (first row ``r0``) from its chunks in column order, as one canonical
    CSR matrix, checked (index pointer, indices, finiteness) unless read from a dl1 store."""
    m = sp.hstack([as_csr(c) for c in col_chunks], format="csr")
    if m.dtype not in (np.float32, np.float64):
        raise ValidationError(f"row block {i} has dtype {m.dtype}; X must be float32 or float64")
    if not m.has_canonical_format:
        m.sum_duplicates()
    indptr = m.indptr.astype(np.int64, copy=False)
    indices = m.indices.astype(np.int32, copy=False)
    data = m.data.astype(np.float64, copy=False)
    if not verified:
        status, r, _ = store_kernels.check_compressed(indptr, indices, data, m.shape[1])
        if status != store_kernels.OK:
            raise ValidationError(f"row block {i}, row {r0 + r}: {store_kernels.PROBLEMS[status]}")
    # squared row norms: the CSC column kernel over CSR segments, with no temporary copy
    sq = csc_col_sqnorms(indptr, indices, data, NO_SCALE, NO_SCALE)
    return RowBlock(i, r0, indptr, indices, data, m.shape[1], float(sq.max(initial=0.0)))


def rows_matvec_task(
    blocks: list[RowBlock | RowSource], w: np.ndarray, b: float
) -> list[np.ndarray]:
    """``X_i w + b`` of each block."""
    out = []
    for source in blocks:
        blk = loaded_rows(source)
        m = sp.csr_matrix((blk.data, blk.indices, blk.indptr), shape=(blk.n_rows, blk.p))
        out.append(m @ w + b)
        del blk, m  # out of core: freed before the next block is read
    return out


def rows_xt_task(blocks: list[RowBlock | RowSource], theta: np.ndarray) -> np.ndarray:
    """``sum_i X_i^T theta_i`` over the blocks (length p): a partition's part of ``X^T theta``."""
    out = None
    for source in blocks:
        blk = loaded_rows(source)
        out = np.zeros(blk.p) if out is None else out
        m = sp.csr_matrix((blk.data, blk.indices, blk.indptr), shape=(blk.n_rows, blk.p))
        out += m.T @ theta[blk.r0 : blk.r0 + blk.n_rows]
        del blk, m  # out of core: freed before the next block is read
    return np.zeros(0) if out is None else out


class RowStats(NamedTuple):
    """What a partition's row blocks tell about the data's squares: the largest squared row
    norm, each column's sum of squares over these rows (raw, and weighted: empty without
    weights) and whether it holds a nonzero value (one byte a column: the statistics go
    up a tree of workers), and the first row whose squared norm is not finite, with its
    largest value (``(-1, 0.0)``: none)."""

    row_sqnorm_max: float
    col_sq: np.ndarray
    col_wsq: np.ndarray
    col_any: np.ndarray
    bad_row: tuple[int, float]


#: Nonzeros squared at a time by :func:`rows_stats_task` (at least a row block's width):
#: its temporaries stay small beside the row block, out of core too.
SQUARES_CHUNK = 1 << 18


def rows_stats_task(
    blocks: list[RowBlock | RowSource], sample_weight: np.ndarray, r0: int
) -> RowStats:
    """The :class:`RowStats` of consecutive row blocks whose first row is ``r0``
    (``sample_weight``: the weights of their rows, or empty)."""
    col_sq = col_wsq = col_any = None
    sq_max, bad_row = 0.0, (-1, 0.0)
    for source in blocks:
        blk = loaded_rows(source)
        if col_sq is None:
            col_sq, col_any = np.zeros(blk.p), np.zeros(blk.p, dtype=bool)
            col_wsq = np.zeros(blk.p if sample_weight.shape[0] else 0)
        add_column_squares(blk, sample_weight[blk.r0 - r0 :], col_sq, col_wsq, col_any)
        if not np.isfinite(blk.row_sqnorm_max) and bad_row[0] < 0:
            row_sq = csc_col_sqnorms(blk.indptr, blk.indices, blk.data, NO_SCALE, NO_SCALE)
            r = int(np.argmax(row_sq))  # the first infinite one
            vals = np.abs(blk.data[blk.indptr[r] : blk.indptr[r + 1]])
            bad_row = (blk.r0 + r, float(vals.max(initial=0.0)))
        sq_max = max(sq_max, blk.row_sqnorm_max)
        del blk  # out of core: freed before the next block is read
    empty = np.zeros(0)
    return RowStats(sq_max, empty if col_sq is None else col_sq,
                    empty if col_wsq is None else col_wsq,
                    np.zeros(0, bool) if col_any is None else col_any, bad_row)  # fmt: skip


def add_row_stats(a: RowStats, b: RowStats) -> RowStats:
    """Two partitions' :class:`RowStats` as one (``a``'s rows before ``b``'s: the first bad
    row stays the first); a partition without rows (empty arrays) adds nothing. Sums past
    float64's range are infinite, which the caller reports as overflowing."""

    def add(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        if not x.shape[0] or not y.shape[0]:
            return x if x.shape[0] else y
        with np.errstate(over="ignore", invalid="ignore"):
            return x + y  # on booleans (col_any): or

    return RowStats(max(a.row_sqnorm_max, b.row_sqnorm_max), add(a.col_sq, b.col_sq),
                    add(a.col_wsq, b.col_wsq), add(a.col_any, b.col_any),
                    a.bad_row if a.bad_row[0] >= 0 else b.bad_row)  # fmt: skip


def add_column_squares(
    blk: RowBlock, sw: np.ndarray, col_sq: np.ndarray, col_wsq: np.ndarray, col_any: np.ndarray
) -> None:
    """Add the block's squares to each column's sums (raw; weighted by ``sw``, the weights
    from the block's first row, when ``col_wsq`` is not empty) and mark the columns with a
    nonzero value in ``col_any``, :data:`SQUARES_CHUNK` nonzeros at a time."""
    nnz, step = blk.data.shape[0], max(SQUARES_CHUNK, blk.p)
    for a in range(0, nnz, step):
        b = min(a + step, nnz)
        idx, vals = blk.indices[a:b], blk.data[a:b]
        with np.errstate(over="ignore", under="ignore"):
            sq = vals * vals
            col_sq += np.bincount(idx, weights=sq, minlength=blk.p)
            if col_wsq.shape[0]:
                rows = np.searchsorted(blk.indptr, np.arange(a, b), side="right") - 1
                col_wsq += np.bincount(idx, weights=sq * sw[rows], minlength=blk.p)
        col_any[idx[vals != 0]] = True


def column_extreme_task(blocks: list[RowBlock | RowSource], c: int) -> tuple[float, int]:
    """``(|value|, row)`` of the largest value of column ``c`` in these row blocks
    (``(0.0, -1)``: none): where an error about the column points."""
    best = (0.0, -1)
    for source in blocks:
        blk = loaded_rows(source)
        at = np.flatnonzero(blk.indices == c)
        if at.shape[0]:
            k = int(at[np.argmax(np.abs(blk.data[at]))])
            row = blk.r0 + int(np.searchsorted(blk.indptr, k, side="right") - 1)
            best = max(best, (float(abs(blk.data[k])), row), key=lambda t: t[0])
        del blk
    return best
