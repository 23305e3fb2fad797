"""Feature blocks on the workers: held in memory (:class:`Block`) or read from the store by
every task that uses them (:class:`BlockSource`, out of core)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
from dask.sizeof import sizeof

from dl1.chunks import as_csc
from dl1.errors import ValidationError
from dl1.kernels import store as store_kernels
from dl1.kernels.linalg import csc_col_sqnorms

#: ``cd_block_epochs``'s arguments for "no intercept profile" (the columns' sums and the
#: running shift): the steps are then plain coordinate descent.
NO_PROFILE = np.zeros(0)
NO_SHIFT = np.zeros(2)
#: The kernels' penalty factors for "1 on every column" (the plain elastic net).
NO_FACTORS = np.zeros(0)
#: The kernels' bounds for "no bounds" (:func:`dl1.kernels.linalg.bound_at`).
NO_BOUNDS = np.zeros((2, 0))


class BlockPenalty(NamedTuple):
    """A weighted penalty as one block's kernels take it
    (:mod:`dl1.objective.penalties.weighted`): the block's factors (empty for 1) and
    bounds (:data:`NO_BOUNDS` for none), with ``n`` and ``alpha_l2`` for the finite bounds'
    conjugate terms (:func:`dl1.kernels.linalg.box_conjugate`)."""

    factors: np.ndarray
    bounds: np.ndarray
    n: float
    alpha_l2: float


#: The plain elastic net's :class:`BlockPenalty` (no factors, no bounds).
PLAIN = BlockPenalty(NO_FACTORS, NO_BOUNDS, 1.0, 0.0)


@dataclass
class Block:
    """A feature block held in worker memory: CSC arrays and per-column constants."""

    j: int
    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    col_scale: np.ndarray  # empty: no scaling
    col_sqnorm: np.ndarray  # ||x_j * col_scale_j||_s^2
    n: int
    #: the CSC arrays belong to another held block (:func:`reweight_block`)
    shares_arrays: bool = False

    @property
    def ncols(self) -> int:
        return self.indptr.shape[0] - 1

    @property
    def nbytes(self) -> int:
        return self.indptr.nbytes + self.indices.nbytes + self.data.nbytes


@sizeof.register(Block)
def _block_sizeof(block: Block) -> int:
    """What a held block takes, for Dask's memory accounting (spilling, the dashboard);
    Dask's default for an object, ``sys.getsizeof``, would count a few hundred bytes. A
    block sharing another's arrays counts its own constants only."""
    own = block.col_scale.nbytes + block.col_sqnorm.nbytes
    return own if block.shares_arrays else own + block.nbytes


@dataclass(frozen=True)
class BlockSource:
    """A feature block left in its store: read, verified and assembled by each task using it.

    Out-of-core mode: the block's nonzeros never stay in worker memory between tasks, so a
    worker holds one block at a time (plus its n-vectors), whatever the size of the data.
    ``reads`` holds, per row block, the arguments of the store's verified block reader.
    """

    j: int
    c0: int
    ncols: int
    nnz: int
    root: str
    split: str
    fmt: str
    reads: tuple  # ((i, block manifest entry, block shape), ...)
    sample_weight: np.ndarray
    standardize: bool
    center: bool

    def load(self) -> Block:
        # local: dl1.store loads zarr and its codecs; workers on held blocks never need them
        from dl1.store.arrays import read_array
        from dl1.store.format import block_key
        from dl1.store.reader import read_block_arrays, read_block_task

        if self.fmt != "csc" or len(self.reads) == 1:
            chunks = [
                read_block_task(self.root, self.split, self.fmt, i, self.j, blk, shape, "scipy")
                for i, blk, shape in self.reads
            ]
            return assemble_block(
                self.j, self.c0, self.sample_weight, self.standardize, self.center, *chunks,
                verified=True,
            )
        # Row chunks are stacked one at a time into preallocated arrays: besides the block,
        # one chunk is in memory (the column counts come from the small index pointers first).
        counts = np.zeros(self.ncols, dtype=np.int64)
        for i, blk, _ in self.reads:
            key = block_key(self.split, self.fmt, i, self.j)
            counts += np.diff(read_array(self.root, f"{key}/indptr", blk["arrays"]["indptr"]))
        indptr = np.zeros(self.ncols + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        indices = np.empty(indptr[-1], dtype=np.int32)
        data = None
        cursor = indptr[:-1].copy()
        offset = 0
        for i, blk, shape in self.reads:
            ip, ix, dx = read_block_arrays(self.root, self.split, self.fmt, i, self.j, blk, shape)
            if data is None:
                data = np.empty(indptr[-1], dtype=dx.dtype)
            store_kernels.csc_append_rows(ip, ix, dx, offset, indices, data, cursor)
            offset += shape[0]
        # each row chunk verified, stacked in row order: sorted and unique
        m = sp.csc_matrix((data, indices, indptr), shape=(offset, self.ncols))
        m.has_canonical_format = True
        return assemble_block(
            self.j, self.c0, self.sample_weight, self.standardize, self.center, m, verified=True
        )


def loaded(block: Block | BlockSource) -> Block:
    """The block itself, or the block read from its store."""
    return block.load() if isinstance(block, BlockSource) else block


def assemble_block(
    j: int,
    c0: int,
    sample_weight: np.ndarray,
    standardize: bool,
    center: bool,
    *row_chunks,
    verified: bool = False,
) -> Block:
    """Stack the row chunks of feature block ``j`` into one validated CSC block.

    Validation (index pointer, indices in range, sorted unique, finite values) happens here,
    before any kernel sees the arrays, unless ``verified``: the chunks were read from a dl1
    store, whose reader has checked each of them (a single chunk is then taken as is; row
    chunks stacked are still put in canonical order). With ``standardize``, ``col_scale`` is
    ``1 / std_j`` (weighted; centred when ``center``, i.e. with an intercept, else the root
    mean square); constant columns get scale 0 and stay out of the model.
    """
    mats = [as_csc(c) for c in row_chunks]
    m = mats[0] if len(mats) == 1 else sp.vstack(mats, format="csc")
    if m.dtype not in (np.float32, np.float64):
        raise ValidationError(
            f"feature block {j} has dtype {m.dtype}; X must be float32 or float64"
        )
    if not (verified and len(mats) == 1) and not m.has_canonical_format:
        m = m.copy()
        m.sum_duplicates()
    indptr = m.indptr.astype(np.int64, copy=False)
    indices = m.indices.astype(np.int32, copy=False)
    if not verified:
        status, c, k = store_kernels.check_compressed(indptr, indices, m.data, m.shape[0])
        if status != store_kernels.OK:
            raise ValidationError(
                f"feature block {j}, column {c0 + c}: {store_kernels.PROBLEMS[status]}"
            )
    return with_constants(j, c0, indptr, indices, m.data, m.shape, sample_weight, standardize,
                          center)


def reweight_block(
    block: Block, c0: int, sample_weight: np.ndarray, standardize: bool, center: bool
) -> Block:
    """``block`` (held without weights or scales, :mod:`dl1.dataset`) for a fit with
    ``sample_weight`` and ``standardize``: the same arrays, not copied, with that fit's
    column scales and weighted squared norms."""
    shape = (block.n, block.ncols)
    out = with_constants(block.j, c0, block.indptr, block.indices, block.data, shape,
                         sample_weight, standardize, center)
    out.shares_arrays = True
    return out


def with_constants(
    j: int,
    c0: int,
    indptr: np.ndarray,
    indices: np.ndarray,
    data: np.ndarray,
    shape: tuple[int, int],
    sample_weight: np.ndarray,
    standardize: bool,
    center: bool,
) -> Block:
    """The :class:`Block` of validated CSC arrays with its per-column constants: the scales
    of standardisation (see :func:`assemble_block`) and the weighted squared norms, each
    column's squares checked (:func:`check_column_squares`)."""
    n = shape[0]
    scale = np.zeros(0)
    if standardize:
        wts = np.ones(n) if sample_weight.shape[0] == 0 else sample_weight
        mw = sp.csc_matrix((data.astype(np.float64), indices, indptr), shape=shape)
        mean = np.asarray(mw.T @ wts).ravel() / n
        sq = np.asarray(mw.multiply(mw).T @ wts).ravel() / n
        var = sq - mean**2 if center else sq
        std = np.sqrt(np.maximum(var, 0.0))
        scale = np.where(
            std > 1e-12 * np.sqrt(np.maximum(sq, 1e-300)), 1.0 / np.where(std > 0, std, 1.0), 0.0
        )
    sqn = csc_col_sqnorms(indptr, indices, data, scale, sample_weight)
    raw = sqn
    if scale.shape[0] or sample_weight.shape[0]:
        raw = csc_col_sqnorms(indptr, indices, data, NO_PROFILE, NO_PROFILE)
    check_column_squares(j, c0, indptr, data, raw, sqn)
    return Block(j, indptr, indices, data, scale, sqn, n)


#: Smallest squared norm of a nonzero column: below it the squares are subnormal or zero
#: (values under about 1e-154), and its steps, norms and scores lose precision or vanish.
SQNORM_MIN = float(np.finfo(np.float64).tiny)


def check_column_squares(
    j: int, c0: int, indptr: np.ndarray, data: np.ndarray, raw: np.ndarray, sqn: np.ndarray
) -> None:
    """Refuse feature block ``j`` (first column ``c0``) when a column's sum of squares
    (``raw``, or weighted and scaled, ``sqn``) overflows float64, or is below
    :data:`SQNORM_MIN` while the column has a nonzero value: every step and score of the
    solvers divides by or multiplies with these sums, and a column that looks empty would
    be left out silently. The message names the column's global index."""
    with np.errstate(invalid="ignore"):
        over = ~(np.isfinite(raw) & np.isfinite(sqn))
        under = (raw < SQNORM_MIN) & (np.diff(indptr) > 0)
    if over.any():
        c = int(np.flatnonzero(over)[0])
        raise ValidationError(
            f"feature block {j}, column {c0 + c}: its sum of squares overflows float64 "
            f"(largest value {_absmax(indptr, data, c):.3g}); rescale the column"
        )
    for c in np.flatnonzero(under):
        big = _absmax(indptr, data, int(c))
        if big > 0:  # not only explicit zeros
            raise ValidationError(
                f"feature block {j}, column {c0 + int(c)}: its sum of squares underflows "
                f"float64 (largest value {big:.3g}); rescale the column"
            )


def _absmax(indptr: np.ndarray, data: np.ndarray, c: int) -> float:
    vals = data[indptr[c] : indptr[c + 1]]
    return float(np.abs(vals).max()) if vals.shape[0] else 0.0


def block_info(block: Block | BlockSource) -> tuple[int, int, int]:
    """(columns, nonzeros, bytes) of a loaded block."""
    block = loaded(block)
    return block.ncols, int(block.indices.shape[0]), block.nbytes


def identity(x):
    """A task holding a value: unlike ``scatter``, the scheduler can recompute it."""
    return x
