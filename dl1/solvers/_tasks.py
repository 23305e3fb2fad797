"""Worker-side tasks of the distributed coordinate-descent solver.

Plain functions of arrays (picklable by reference), run by Dask workers or in-process. The
numba kernels they call live in :mod:`dl1.kernels`; nothing here knows about the coordinator.
"""

from __future__ import annotations

import contextvars
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from dl1.errors import ValidationError
from dl1.kernels.cd import cd_block_epochs
from dl1.kernels.linalg import csc_col_sqnorms, csc_xt_theta_stats
from dl1.store import _kernels as SK

#: Elements (rows x columns) of the scratch that densifies a batch of working-set columns
#: while their Gram rows are formed (in memory; out of core :func:`dl1.fit.dense_max` is less).
GRAM_DENSE_MAX = 1 << 25

#: Largest working set solved by covariance updates on its Gram matrix (256 MiB in float32);
#: beyond it (or for the logistic loss) the subproblem runs coordinate descent on the columns.
GRAM_MAX = 8192

#: Storage of the Gram matrices. The covariance-update epochs read a row of it per changed
#: coordinate, so they are bound by memory bandwidth: float32 halves that traffic (and the
#: memory). The certificate does not use it: every gap check recomputes ``X_W^T theta``
#: exactly from the columns, and the exact optimum is a fixed point of the epochs whatever
#: the rounding of ``Q`` (a step from it is zero), so the rounding only perturbs the steps.
GRAM_DTYPE = np.float32

#: Gram matrices of the last working sets, per solve (a key drawn by the coordinator), kept
#: by the worker process between rounds: consecutive working sets share most columns, so
#: only the rows of new columns are computed. Purely a cache: an entry agrees with a fresh
#: computation to rounding (BLAS may sum a product's entry in an order that depends on the
#: product's shape), which is why a checkpointed path starts each alpha's Gram matrix afresh,
#: as its resumed run must.
_GRAM_CACHE: OrderedDict[str, tuple[np.ndarray, np.ndarray]] = OrderedDict()
_GRAM_CACHE_ENTRIES = 2
_NO_PROFILE = np.zeros(0)
_NO_SHIFT = np.zeros(2)


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

    @property
    def ncols(self) -> int:
        return self.indptr.shape[0] - 1

    @property
    def nbytes(self) -> int:
        return self.indptr.nbytes + self.indices.nbytes + self.data.nbytes


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
    sw: np.ndarray
    standardize: bool
    center: bool

    def load(self) -> Block:
        from dl1.store.format import block_key
        from dl1.store.reader import _read_block_task, read_array, read_block_arrays

        if self.fmt != "csc" or len(self.reads) == 1:
            chunks = [
                _read_block_task(self.root, self.split, self.fmt, i, self.j, blk, shape, "scipy")
                for i, blk, shape in self.reads
            ]
            return assemble_block(
                self.j, self.c0, self.sw, self.standardize, self.center, *chunks, verified=True
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
            SK.csc_append_rows(ip, ix, dx, offset, indices, data, cursor)
            offset += shape[0]
        # each row chunk verified, stacked in row order: sorted and unique
        m = sp.csc_matrix((data, indices, indptr), shape=(offset, self.ncols))
        m.has_canonical_format = True
        return assemble_block(
            self.j, self.c0, self.sw, self.standardize, self.center, m, verified=True
        )


def loaded(block: Block | BlockSource) -> Block:
    """The block itself, or the block read from its store."""
    return block.load() if isinstance(block, BlockSource) else block


def _to_csc(chunk) -> sp.csc_matrix:
    if sp.issparse(chunk):
        m = chunk
    elif hasattr(chunk, "to_scipy_sparse"):  # pydata sparse
        m = chunk.to_scipy_sparse()
    else:
        m = np.asarray(chunk)
        if m.ndim != 2:
            raise ValidationError(f"a chunk of X has {m.ndim} dimensions, expected 2")
        m = sp.csc_matrix(m)
    return sp.csc_matrix(m)


def assemble_block(
    j: int,
    c0: int,
    sw: np.ndarray,
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
    mats = [_to_csc(c) for c in row_chunks]
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
        status, c, k = SK.check_compressed(indptr, indices, m.data, m.shape[0])
        if status != SK.OK:
            raise ValidationError(f"feature block {j}, column {c0 + c}: {SK.PROBLEMS[status]}")
    n = m.shape[0]
    scale = np.zeros(0)
    if standardize:
        wts = np.ones(n) if sw.shape[0] == 0 else sw
        mw = sp.csc_matrix((m.data.astype(np.float64), indices, indptr), shape=m.shape)
        mean = np.asarray(mw.T @ wts).ravel() / n
        sq = np.asarray(mw.multiply(mw).T @ wts).ravel() / n
        var = sq - mean**2 if center else sq
        std = np.sqrt(np.maximum(var, 0.0))
        scale = np.where(
            std > 1e-12 * np.sqrt(np.maximum(sq, 1e-300)), 1.0 / np.where(std > 0, std, 1.0), 0.0
        )
    sqn = csc_col_sqnorms(indptr, indices, m.data, scale, sw)
    return Block(j, indptr, indices, m.data, scale, sqn, n)


def block_info(block: Block | BlockSource) -> tuple[int, int, int]:
    """(columns, nonzeros, bytes) of a loaded block."""
    block = loaded(block)
    return block.ncols, int(block.indices.shape[0]), block.nbytes


def xt_theta_task(blocks: list[Block | BlockSource], theta: np.ndarray, threshold: float):
    """Per-block ``(||X_k^T theta||_inf, sum_j (|x_j^T theta| - threshold)_+^2)``."""
    out = []
    for b in blocks:
        b = loaded(b)
        out.append(csc_xt_theta_stats(b.indptr, b.indices, b.data, b.col_scale, theta, threshold))
    return out


def round_task(
    blocks: list[Block | BlockSource],
    w_parts: list[tuple[np.ndarray, np.ndarray]],
    g: np.ndarray,
    theta: np.ndarray,
    sw: np.ndarray,
    sigma: float,
    beta: float,
    alpha_l1: float,
    alpha_l2: float,
    n_epochs: int,
    random_order: bool,
    seed: int,
    threshold: float,
    with_stats: bool,
):
    """One round on a partition (a list of blocks sharing one local model).

    First the gap statistics of ``X_k^T theta`` at the start point (when ``with_stats``),
    then ``n_epochs`` epochs of the CoCoA+ local subproblem over the partition's blocks in
    order, all accumulating into one ``u = X_part dw`` (exact within the partition).

    Returns
    -------
    w_new : list of (indices, values) of the nonzero coefficients of each block.
    u : ndarray (n,), the partition's change of ``X w``.
    stats : list of per-block gap statistics (or None).
    info : dict with kernel seconds, coordinate updates and the largest change.
    """
    t0 = time.perf_counter()
    stats = None
    if with_stats:
        stats = xt_theta_task(blocks, theta, threshold)
    n = g.shape[0]
    u = np.zeros(n)
    ws = []
    for b, (idx, val) in zip(blocks, w_parts, strict=True):
        w = np.zeros(b.ncols)
        w[idx] = val
        ws.append(w)
    active = [np.arange(b.ncols, dtype=np.int64) for b in blocks]
    n_changed = 0
    max_dz = 0.0
    for epoch in range(n_epochs):
        for k, b in enumerate(blocks):
            b = loaded(b)  # out-of-core: read again each epoch, one block in memory at a time
            ch, dz = cd_block_epochs(
                b.indptr,
                b.indices,
                b.data,
                b.col_scale,
                ws[k],
                g,
                u,
                sw,
                b.col_sqnorm,
                sigma,
                beta,
                float(n),
                alpha_l1,
                alpha_l2,
                1,
                random_order,
                (seed * 1000003 + epoch * 1009 + k) % (2**32),
                active[k],
                _NO_PROFILE,
                _NO_SHIFT,
            )
            n_changed += ch
            max_dz = max(max_dz, dz)
    w_new = []
    for w in ws:
        nz = np.flatnonzero(w)
        w_new.append((nz.astype(np.int64), w[nz]))
    info = {"kernel_s": time.perf_counter() - t0, "n_changed": n_changed, "max_dz": max_dz}
    return w_new, u, stats, info


def matvec_task(
    blocks: list[Block | BlockSource], w_parts: list[tuple[np.ndarray, np.ndarray]], n: int
):
    """``X_part w_part`` (used to rebuild ``X w`` from a warm start)."""
    from dl1.kernels.linalg import csc_matvec

    out = np.zeros(n)
    for b, (idx, val) in zip(blocks, w_parts, strict=True):
        if idx.shape[0] == 0:
            continue  # nothing to add (and, out of core, nothing to read)
        b = loaded(b)
        w = np.zeros(b.ncols)
        w[idx] = val
        csc_matvec(b.indptr, b.indices, b.data, b.col_scale, w, out)
    return out


def coef_parts(
    ids: np.ndarray, values: np.ndarray, ranges: list[tuple[int, int]]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per column range ``[lo, hi)`` (a block), the local indices (int64) and values of the
    nonzero coefficients among ``values`` at the sorted feature ids ``ids``: the form in
    which passes and products receive a block's coefficients."""
    out = []
    for lo, hi in ranges:
        a, b = np.searchsorted(ids, [lo, hi])
        val = values[a:b]
        nz = val != 0
        out.append(((ids[a:b][nz] - lo).astype(np.int64), val[nz]))
    return out


def pass_dual_point(
    datafit: Any, y: np.ndarray, z: np.ndarray, s: np.ndarray | None, fit_intercept: bool
) -> tuple[float, np.ndarray]:
    """The steps before a pass: the intercept's update (``z`` is moved by it in place) and
    the dual point at the new ``z``. Returned: the update and the dual point."""
    db = 0.0
    if fit_intercept:
        db = datafit.intercept_update(y, z, s, max_iter=20)
        z += db
    return db, datafit.dual_point(y, z, s, fit_intercept)


def scan_task(
    blocks: list[Block | BlockSource],
    theta: np.ndarray,
    threshold: float,
    w_parts: list[tuple[np.ndarray, np.ndarray]],
    n_candidates: int,
    alive: list[np.ndarray | None] | None = None,
    prev: tuple[np.ndarray, float, float] | None = None,
    norms: bool = False,
):
    # ``alive``: per block, None (all columns) or the alive columns as packed bits.
    """One pass over a partition: gap statistics, working-set candidates, screening.

    For every block, ``c = X_k^T theta`` (scaled columns) on its alive columns gives the
    certificate statistics ``(max |c_j|, sum_j (|c_j| - threshold)_+^2)`` and the KKT
    violation of each zero coefficient, ``|c_j| - threshold`` (``threshold = n alpha_l1``).
    With ``prev = (theta_prev, scale, radius)`` the same pass applies the gap-safe sphere test
    of the previous point (:mod:`dl1.kernels.screen`); screened columns are dropped from the
    alive set (the support is always kept). Returned per block: the statistics, the local
    indices and scores of the ``n_candidates`` most violating zero coefficients, the new alive
    set (None: all columns), the nonzeros visited and, with ``norms``, the largest
    (unweighted) column norm of the block (-1 otherwise, or for a block not read). Only these
    few numbers travel.
    """
    from dl1.kernels.screen import csc_scan_screen

    t0 = time.perf_counter()
    out = []
    theta_prev, prev_scale, radius = prev if prev is not None else (np.zeros(0), 1.0, 0.0)
    for k_blk, (b, (idx, _)) in enumerate(zip(blocks, w_parts, strict=True)):
        packed = None if alive is None else alive[k_blk]
        cols = (
            None
            if packed is None
            else np.flatnonzero(np.unpackbits(packed, count=b.ncols)).astype(np.int64)
        )
        if cols is not None and cols.shape[0] == 0:
            # every column screened: the block is not read at all
            out.append(((0.0, 0.0), np.zeros(0, np.int64), np.zeros(0), packed, 0, -1.0))
            continue
        b = loaded(b)
        nmax = -1.0
        if norms and b.ncols:
            sq = csc_col_sqnorms(b.indptr, b.indices, b.data, b.col_scale, np.zeros(0))
            nmax = float(np.sqrt(sq.max()))
        visit = np.arange(b.ncols, dtype=np.int64) if cols is None else cols
        c, keep = csc_scan_screen(
            b.indptr,
            b.indices,
            b.data,
            b.col_scale,
            visit,
            theta,
            theta_prev,
            prev_scale,
            radius,
            threshold,
        )
        visited = int((b.indptr[visit + 1] - b.indptr[visit]).sum())
        new_alive = packed
        if not keep.all():
            keep[np.isin(visit, idx)] = True  # never screen the support
            if not keep.all():
                c = c[keep]
                visit = visit[keep]
                mask = np.zeros(b.ncols, dtype=bool)
                mask[visit] = True
                new_alive = np.packbits(mask)  # 1 bit per column travels, not an index list
        a = np.abs(c)
        absmax = float(a.max()) if a.size else 0.0
        ex = a - threshold
        excess = float(np.square(ex[ex > 0]).sum())
        score = ex.copy()
        score[np.isin(visit, idx)] = -np.inf  # the support is in the working set anyway
        score[b.col_sqnorm[visit] == 0] = -np.inf
        kk = min(n_candidates, visit.shape[0])
        if kk:
            top = np.argpartition(-score, kk - 1)[:kk]
            top = top[score[top] > -np.inf]
        else:
            top = np.zeros(0, dtype=np.int64)
        out.append(
            ((absmax, excess), visit[top].astype(np.int64), score[top], new_alive, visited, nmax)
        )
    return out, time.perf_counter() - t0


def _select_columns(indptr, indices, data, cols):
    """CSC arrays of the columns ``cols`` (in that order) of a CSC matrix."""
    from dl1.kernels.select import csc_select_columns

    return csc_select_columns(indptr, indices, data, np.asarray(cols, dtype=np.int64))


def extract_task(block: Block | BlockSource, local: np.ndarray):
    """CSC arrays, scales and squared norms of the chosen columns of a block.

    Values keep the block's dtype (a float32 store's columns cost 8 bytes per nonzero to
    cache and to move, not 12); every consumer widens them to float64 exactly, in its
    kernels or in the copy it makes."""
    t0 = time.perf_counter()
    block = loaded(block)
    local = np.asarray(local, dtype=np.int64)
    indptr, indices, data = _select_columns(block.indptr, block.indices, block.data, local)
    scale = block.col_scale[local] if block.col_scale.shape[0] else np.zeros(0)
    return (
        indptr,
        indices,
        data,
        scale,
        block.col_sqnorm[local],
        block.col_scale.shape[0] > 0,
        time.perf_counter() - t0,
    )


def compact_task(extract: tuple, keep: np.ndarray):
    """The columns ``keep`` of a gathered group (:func:`extract_task`), run where the group
    is held: a working set that has moved on frees its stale columns without rereading."""
    t0 = time.perf_counter()
    keep = np.asarray(keep, dtype=np.int64)
    indptr, indices, data = _select_columns(extract[0], extract[1], extract[2], keep)
    scale = extract[3][keep] if extract[5] else np.zeros(0)
    return indptr, indices, data, scale, extract[4][keep], extract[5], time.perf_counter() - t0


def ws_round_task(
    extracts: list[tuple],
    keeps: list[np.ndarray],
    w_parts: list[np.ndarray],
    g: np.ndarray,
    theta: np.ndarray,
    sw: np.ndarray,
    sigma: float,
    beta: float,
    alpha_l1: float,
    alpha_l2: float,
    n_epochs: int,
    threshold: float,
    col_sums: list[np.ndarray] | None,
):
    """One CoCoA+ round of a working-set subproblem spread over partitions, on one
    partition's cached column groups (:func:`extract_task` results, held where they were
    extracted): nothing is gathered or copied.

    First the restricted gap's statistics of ``X_W^T theta`` over the live columns ``keeps``
    of every group, then ``n_epochs`` epochs of the ``sigma``-scaled local model (as
    :func:`round_task`) over those columns, accumulating one ``u`` for the partition. With
    ``col_sums`` (:func:`group_col_sums`; squared loss with an intercept) the intercept is
    profiled out of every step
    (:func:`dl1.kernels.cd.cd_block_epochs`, ``col_sum``): the partition's intercept shift is
    returned with ``u``, and shifts of partitions add like their ``u`` (the optimal intercept
    is linear in ``w``), which keeps the CoCoA+ bound of the sum.

    Returns
    -------
    w_new : list of ndarray, the new coefficients of each group's live columns.
    u : ndarray (n,), the partition's change of ``X w`` (without the shift).
    shift : float, the partition's intercept change (0.0 without ``col_sums``).
    stats : (max |c_j|, sum_j (|c_j| - threshold)_+^2) over the live columns.
    info : dict with kernel seconds.
    """
    from dl1.kernels.screen import csc_scan_screen

    t0 = time.perf_counter()
    n = g.shape[0]
    u = np.zeros(n)
    s = None if sw.shape[0] == 0 else sw
    shift = np.array([0.0, n if s is None else float(s.sum())])
    absmax, excess = 0.0, 0.0
    ws, args = [], []
    for i, (e, keep, wp) in enumerate(zip(extracts, keeps, w_parts, strict=True)):
        keep = np.asarray(keep, dtype=np.int64)
        scale = e[3] if e[5] else np.zeros(0)
        c, _ = csc_scan_screen(
            e[0], e[1], e[2], scale, keep, theta, np.zeros(0), 1.0, 0.0, threshold
        )
        if c.size:
            a = np.abs(c)
            absmax = max(absmax, float(a.max()))
            ex = a[a > threshold] - threshold
            excess += float(ex @ ex)
        w = np.zeros(e[0].shape[0] - 1)
        w[keep] = wp
        ws.append(w)
        args.append((e, scale, keep, _NO_PROFILE if col_sums is None else col_sums[i]))
    for _ in range(n_epochs):
        for (e, scale, keep, col_sum), w in zip(args, ws, strict=True):
            cd_block_epochs(
                e[0],
                e[1],
                e[2],
                scale,
                w,
                g,
                u,
                sw,
                e[4],
                sigma,
                beta,
                float(n),
                alpha_l1,
                alpha_l2,
                1,
                False,
                0,
                keep,
                col_sum,
                _NO_SHIFT if col_sums is None else shift,
            )
    w_new = [w[np.asarray(k, dtype=np.int64)] for w, k in zip(ws, keeps, strict=True)]
    info = {"kernel_s": time.perf_counter() - t0}
    return w_new, u, 0.0 if col_sums is None else float(shift[0]), (absmax, excess), info


def group_col_sums(extracts: list[tuple], sw: np.ndarray) -> list[np.ndarray]:
    """``sum_i s_i x_ij`` of every column of each cached group (unscaled), for the profiled
    steps of :func:`ws_round_task`: computed once per subproblem, where the groups live."""
    s = None if sw.shape[0] == 0 else sw
    return [_col_sums(e[0], e[1], e[2], s) for e in extracts]


def identity(x):
    """A task holding a value: unlike ``scatter``, the scheduler can recompute it."""
    return x


def _gather_ws(extracts: list[tuple], extract_ids: list[np.ndarray], ws: np.ndarray):
    """CSC arrays, scales and squared norms of the columns ``ws`` (in that order), copied
    from the cached groups into arrays allocated once (one copy of the working set)."""
    from dl1.kernels.select import csc_copy_columns_into

    if not extracts:
        return np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0), np.zeros(0), np.zeros(0)
    goff = np.concatenate([[0], np.cumsum([ids.shape[0] for ids in extract_ids])])
    ids = np.concatenate(extract_ids)
    order = np.argsort(ids, kind="stable")
    pos = order[np.searchsorted(ids[order], ws)]  # every ws column is in some group
    group = np.searchsorted(goff, pos, side="right") - 1
    local = pos - goff[group]
    lens = np.zeros(ws.shape[0], dtype=np.int64)
    # the working set's columns by group, each group's in working-set order
    by = np.argsort(group, kind="stable")
    starts = np.flatnonzero(np.diff(group[by], prepend=-1))
    ends = [*starts[1:], by.shape[0]]
    runs = [(int(group[by[a]]), by[a:b]) for a, b in zip(starts, ends, strict=True)]
    for g, dest in runs:
        ip = extracts[g][0]
        lens[dest] = ip[local[dest] + 1] - ip[local[dest]]
    indptr = np.zeros(ws.shape[0] + 1, dtype=np.int64)
    np.cumsum(lens, out=indptr[1:])
    indices = np.empty(indptr[-1], dtype=np.int32)
    data = np.empty(indptr[-1], dtype=np.float64)
    for g, dest in runs:
        e = extracts[g]
        csc_copy_columns_into(e[0], e[1], e[2], local[dest], indptr, dest, indices, data)
    sqn = np.concatenate([e[4] for e in extracts])[pos]
    scale = np.zeros(0)
    if any(e[5] for e in extracts):
        scale = np.concatenate([e[3] if e[5] else np.ones(e[0].shape[0] - 1) for e in extracts])
        scale = scale[pos]
    return indptr, indices, data, scale, sqn


def subproblem_task(
    extracts: list[tuple],
    extract_ids: list[np.ndarray],
    fresh: list[bool],
    ws: np.ndarray,
    w_ws: np.ndarray,
    y: np.ndarray,
    z: np.ndarray,
    sw: np.ndarray,
    datafit,
    penalty,
    fit_intercept: bool,
    target_gap: float,
    max_epochs: int,
    check_every: int,
    random_order: bool,
    seed: int,
    anderson: int = 5,
    gram_max: int = GRAM_MAX,
    dense_max: int = GRAM_DENSE_MAX,
    gram_key: str | None = None,
    gram_target: float | None = None,
):
    """Solve the problem restricted to the working set to a gap of ``target_gap``
    (``gram_target``, when given, on the Gram-matrix path).

    Exact coordinate descent on the gathered columns (sigma' = 1; the gradient is refreshed
    every epoch, so for the squared loss every coordinate step is the exact minimiser and for
    the logistic loss the beta = 1/4 majorant of Shalev-Shwartz & Tewari's SCD is re-centred
    every epoch), with the intercept re-fitted after each epoch and, for the squared loss,
    profiled out of every coordinate step (implicitly centred columns; see ``col_sum`` of
    :func:`dl1.kernels.cd.cd_block_epochs`). Every ``anderson + 1``
    epochs the iterates are extrapolated by Anderson acceleration (as in skglm; Bertrand &
    Massias, "Anderson acceleration of coordinate descent", AISTATS 2021, Alg. 1), kept only
    if it lowers the objective.

    ``extracts`` are groups of columns gathered in earlier rounds (cached where this task runs)
    and ``extract_ids`` their global feature ids; the columns of ``ws`` are picked from them.
    ``fresh`` marks the groups made for this call (extracted or compacted): their seconds
    (``extract[6]``) are counted as kernel time.
    Squared-loss working sets of at most ``gram_max`` columns (and :func:`gram_limit`, from
    the worker's memory limit) are solved on their Gram matrix, kept between rounds under
    ``gram_key`` by :func:`working_set_gram`;
    ``dense_max`` bounds the elements (rows x columns) of the scratch densifying its new
    columns (out of core it is kept small, for memory-limited workers). Once the Gram matrix
    is formed an epoch costs ``O(m)`` per changed coordinate, so the caller may ask that
    path for a tighter target (``gram_target``) than the one of column-wise epochs, whose
    every epoch is a pass over the working set's nonzeros.

    Returns
    -------
    w_ws : the new coefficients of the working set.
    dz : ndarray (n,), change of ``X w + b``.
    db : float, change of the intercept.
    info : dict (epochs, restricted gap, kernel seconds).
    """
    from dl1.gap import duality_gap_from_stats
    from dl1.kernels.linalg import csc_xt_theta_stats

    t0 = time.perf_counter()
    extract_s = sum(e[6] for e, f in zip(extracts, fresh, strict=True) if f)
    n = y.shape[0]
    indptr, indices, data, scale, sqn = _gather_ws(extracts, extract_ids, ws)
    w = np.asarray(w_ws, dtype=np.float64).copy()
    z0 = z
    z = z.copy()
    s = None if sw.shape[0] == 0 else sw
    if datafit.beta == 1.0 and 0 < w.shape[0] <= min(gram_max, gram_limit()):
        # squared loss on a small working set: covariance updates
        w, dz, db, info = _solve_gram(
            indptr,
            indices,
            data,
            scale,
            w,
            y,
            z,
            s,
            sw,
            datafit,
            penalty,
            fit_intercept,
            target_gap if gram_target is None else gram_target,
            max_epochs,
            check_every,
            anderson,
            t0,
            dense_max,
            ws,
            gram_key,
        )
        info["kernel_s"] += extract_s
        return w, dz, db, info
    active = np.arange(w.shape[0], dtype=np.int64)
    u = np.zeros(n)
    db_total = 0.0
    gap = np.inf
    epochs = 0
    threshold = n * penalty.alpha_l1
    hist: list[np.ndarray] = []
    # squared loss: the intercept is profiled out of every coordinate step (implicit centring)
    profile = fit_intercept and datafit.beta == 1.0
    col_sum, shift = _NO_PROFILE, np.zeros(2)
    if profile:
        col_sum = _col_sums(indptr, indices, data, s)
        shift[1] = n if s is None else float(s.sum())
    for epoch in range(max_epochs):
        if fit_intercept:
            db = datafit.intercept_update(y, z, s)
            z += db
            db_total += db
        if epoch % check_every == 0:
            theta = datafit.dual_point(y, z, s, fit_intercept)
            am, ex = csc_xt_theta_stats(indptr, indices, data, scale, theta, threshold)
            _, _, gap = duality_gap_from_stats(
                datafit, penalty, y, z, w, am, ex, s=s, intercept=fit_intercept, theta=theta
            )
            if gap <= target_gap:
                break
        g = datafit.gradient(y, z, s)
        u[:] = 0.0
        cd_block_epochs(
            indptr,
            indices,
            data,
            scale,
            w,
            g,
            u,
            sw,
            sqn,
            1.0,
            datafit.beta,
            float(n),
            penalty.alpha_l1,
            penalty.alpha_l2,
            1,
            random_order,
            (seed * 1000003 + epoch) % (2**32),
            active,
            col_sum,
            shift,
        )
        z += u
        if profile:
            z += shift[0]
            db_total += shift[0]
            shift[0] = 0.0
        epochs += 1
        hist.append(np.append(w, db_total))
        if len(hist) == anderson + 1:
            w, db_total = _anderson_step(
                hist, w, db_total, z, y, s, datafit, penalty, indptr, indices, data, scale
            )
            hist = []
    info = {"epochs": epochs, "gap": float(gap), "kernel_s": time.perf_counter() - t0 + extract_s}
    return w, z - z0, db_total, info


class _GramGapEstimate:
    """The restricted duality gap at ``w``, from Gram-matrix quantities only (squared loss).

    At an exact check point ``w0`` (residual ``r0 = y - z``, intercept refitted, ``theta =
    S r0``, ``h0 = X_W^T theta``), moving to ``w = w0 + d`` with the intercept profiled
    changes the residual by ``-P X_W d`` (``P`` the weighted centring), so, with ``h`` the
    epochs' running ``X_W^T theta / n``:

    * ``sum_i s_i r_i^2 = A0 - d . (h0 + n h)``,
    * ``sum_i s_i r_i y_i = B0 - d . X_W^T S (y - mean_s(y))``,

    which give the primal value and, through :func:`dl1.gap.dual_from_stats`, the dual value
    that :func:`dl1.gap.duality_gap_from_stats` would compute. ``h`` carries the epochs'
    rounding (float32 ``Q``), so this only decides when to compute the exact gap, never
    certifies.
    """

    def __init__(self, datafit, penalty, y, z, theta, h0, w0, s, g_y):
        self.n = y.shape[0]
        self.penalty = penalty
        self.a0 = 2.0 * self.n * datafit.value(y, z, s)
        self.b0 = float(theta @ y)
        self.h0 = h0.copy()
        self.w0 = w0.copy()
        self.g_y = g_y

    def gap(self, w: np.ndarray, h: np.ndarray) -> float:
        from dl1.gap import dual_from_stats

        n, pen = self.n, self.penalty
        d = w - self.w0
        xt = n * h
        a = self.a0 - float(d @ (self.h0 + xt))
        b = self.b0 - float(d @ self.g_y)
        primal = 0.5 * a / n + pen.value(w)
        # F*(-c theta / n) for theta = S r: (c^2 sum s r^2 / 2 - c sum s r y) / n
        dual = dual_from_stats(
            pen, lambda c: (0.5 * c * c * a - c * b) / n, *pen.xt_theta_stats(xt, n), n
        )
        return primal - dual


def _gram_epochs(
    Q: np.ndarray,
    h: np.ndarray,
    w: np.ndarray,
    penalty,
    est: _GramGapEstimate,
    target_gap: float,
    min_between: int,
    max_between: int,
    max_epochs: int,
    anderson: int,
    hist: list[np.ndarray] | None = None,
) -> tuple[int, bool]:
    """Covariance-update epochs (``w`` and ``h = -grad F`` updated in place) with Anderson
    extrapolation every ``anderson + 1`` epochs (kept if it lowers the objective, computed
    exactly from ``Q``), until the gap estimate ``est`` falls within ``target_gap`` (tested
    from the ``min_between``-th epoch), ``max_between`` epochs, or ``max_epochs``. ``hist``
    carries the extrapolation's iterates across calls. Returns the epochs run and whether
    the estimate stopped them."""
    from dl1.kernels.gram import gram_cd_epochs, gram_matvec

    a1, a2 = penalty.alpha_l1, penalty.alpha_l2
    hist = [] if hist is None else hist
    qd = np.empty(w.shape[0])
    epochs = 0
    for since in range(1, max_between + 1):
        if epochs >= max_epochs:
            break
        gram_cd_epochs(Q, h, w, a1, a2, 1)
        epochs += 1
        hist.append(w.copy())
        if len(hist) == anderson + 1:
            H = np.asarray(hist)
            U = np.diff(H, axis=0)
            try:
                c = np.linalg.solve(U @ U.T, np.ones(anderson))
            except np.linalg.LinAlgError:
                c = None
            if c is not None and np.isfinite(c).all() and c.sum() != 0:
                d = (c / c.sum()) @ H[1:] - w
                # F(w + d) - F(w) = -h.d + d.Q.d / 2 (exact: F is quadratic)
                gram_matvec(Q, d, qd)
                delta = -h @ d + 0.5 * d @ qd + penalty.value(w + d) - penalty.value(w)
                if delta < 0:
                    w += d
                    h -= qd
            hist.clear()
        if epochs >= max_epochs:
            break
        if since >= min_between and est.gap(w, h) <= target_gap:
            return epochs, True
    return epochs, False


def _col_sums(indptr, indices, vals, s) -> np.ndarray:
    """``sum_i s_i x_ij`` per column of CSC arrays (no per-nonzero column index array)."""
    out = np.zeros(indptr.shape[0] - 1)
    nz = np.flatnonzero(np.diff(indptr))
    if nz.shape[0]:
        v = vals if s is None else vals * s[indices]
        out[nz] = np.add.reduceat(v, indptr[nz])
    return out


def _anderson_step(hist, w, db_total, z, y, s, datafit, penalty, indptr, indices, data, scale):
    """Anderson extrapolation of the last iterates ``(w, b)``; accepted if it decreases P.

    ``z`` is updated in place when the extrapolated point is accepted.
    """
    from dl1.kernels.linalg import csc_matvec

    H = np.asarray(hist)
    U = np.diff(H, axis=0)
    C = U @ U.T
    try:
        c = np.linalg.solve(C, np.ones(C.shape[0]))
    except np.linalg.LinAlgError:
        return w, db_total
    if not np.isfinite(c).all() or c.sum() == 0:
        return w, db_total
    c /= c.sum()
    ext = c @ H[1:]
    w_e, b_e = ext[:-1], ext[-1]
    dz = np.full(z.shape[0], b_e - db_total)
    csc_matvec(indptr, indices, data, scale, w_e - w, dz)
    z_e = z + dz
    if datafit.value(y, z_e, s) + penalty.value(w_e) < datafit.value(y, z, s) + penalty.value(w):
        z[:] = z_e
        return w_e, float(b_e)
    return w, db_total


#: The memory limit of the worker whose partition server runs in this thread
#: (:class:`dl1.solvers.rpc.PartitionServer`): ``get_worker`` answers in tasks only.
SERVER_MEMORY_LIMIT: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "dl1_server_memory_limit", default=None
)


def gram_limit() -> int:
    """Largest Gram matrix this process may hold: a worker with a ``memory_limit`` keeps its
    m x m matrices (two cached entries, the one being built, temporaries) within a quarter of
    the limit; without a limit (in process), no bound besides ``gram_max``."""
    limit = SERVER_MEMORY_LIMIT.get()
    if limit is None:
        try:
            from distributed import get_worker

            limit = get_worker().memory_manager.memory_limit
        except (ImportError, ValueError, AttributeError):
            return GRAM_MAX
    if not limit:
        return GRAM_MAX
    return int(np.sqrt(limit / (4 * 4 * np.dtype(GRAM_DTYPE).itemsize)))


def drop_gram(prefix: str) -> None:
    """Forget the Gram matrices cached under keys starting with ``prefix`` (end of a solve)."""
    for key in [k for k in _GRAM_CACHE if k.startswith(prefix)]:
        del _GRAM_CACHE[key]


def working_set_gram(
    indptr: np.ndarray,
    indices: np.ndarray,
    vals: np.ndarray,
    n: int,
    s: np.ndarray,
    ws: np.ndarray,
    key: str | None,
    scratch_max: int,
    factor: float = 1.0,
    c: np.ndarray | None = None,
) -> np.ndarray:
    """``factor * X_W^T S X_W - c c^T`` of the working set ``ws`` (sorted global ids of the
    columns given by the CSC arrays, values already scaled; ``c`` a per-column vector, e.g.
    the intercept's profile), reusing the entries of columns cached under ``key`` by the
    previous call: only the rows and columns of new columns are computed (an entry depends
    on its two columns only; the caller keeps ``factor`` and ``c``'s rule fixed per key).

    Dense enough working sets go through BLAS on row blocks densified in a scratch of at
    most ``scratch_max`` elements (rows x columns); sparse ones through a sparse product.
    Either way the result is a deterministic function of the inputs and the cache. The
    result, of :data:`GRAM_DTYPE` (entries formed in float64, then rounded), is cached under
    ``key`` (replacing the previous entry) and must not be modified by the caller.
    """
    from dl1.kernels.gram import csc_dense_rows, take_submatrix

    m = ws.shape[0]
    hit = _GRAM_CACHE.pop(key, None) if key is not None else None
    if hit is not None and np.array_equal(hit[0], ws):  # the same working set again
        _GRAM_CACHE[key] = hit
        return hit[1]
    G = np.empty((m, m), dtype=GRAM_DTYPE)
    if hit is not None:
        old_ids, old_G = hit
        del hit
        kpos = np.flatnonzero(np.isin(ws, old_ids, assume_unique=True))
        opos = np.searchsorted(old_ids, ws[kpos])
        take_submatrix(old_G, opos, G, kpos)
        del old_G
        new = np.setdiff1d(np.arange(m), kpos, assume_unique=True)
    else:
        new = np.arange(m, dtype=np.int64)
    if new.shape[0]:
        k = new.shape[0]
        nnz_new = int(np.diff(indptr)[new].sum())
        weighted = s.shape[0] > 0
        if indices.shape[0] / (n * m) * nnz_new / (n * k) > 0.01:
            # the products of dense-enough columns are far cheaper through BLAS
            rows = int(max(1, min(n, scratch_max // m)))
            cursor = indptr[:-1].copy()
            part = np.zeros((m, k))
            for r0 in range(0, n, rows):
                r1 = min(n, r0 + rows)
                chunk = np.zeros((m, r1 - r0))  # column i's rows r0..r1 in chunk[i]
                csc_dense_rows(indptr, indices, vals, cursor, r1, chunk)
                # a copy even when every column is new: NumPy would take chunk @ chunk.T as a
                # SYRK, whose rounding differs from the GEMM of later, partly cached calls
                right = chunk[new]
                if weighted:
                    right *= s[None, r0:r1]
                part += chunk @ right.T
                del chunk, right
        else:
            Xs = sp.csc_matrix((vals, indices, indptr), shape=(n, m))
            right = Xs[:, new]
            if weighted:
                right = sp.csc_matrix(right.multiply(s[:, None]))
            part = (Xs.T @ right).toarray()
        if factor != 1.0:
            part *= factor
        if c is not None:
            part -= np.outer(c, c[new])
        G[:, new] = part
        G[new, :] = part.T
    if key is not None:
        _GRAM_CACHE[key] = (ws.copy(), G)
        while len(_GRAM_CACHE) > _GRAM_CACHE_ENTRIES:
            _GRAM_CACHE.popitem(last=False)
    return G


def _solve_gram(
    indptr,
    indices,
    data,
    scale,
    w,
    y,
    z,
    s,
    sw,
    datafit,
    penalty,
    fit_intercept,
    target_gap,
    max_epochs,
    check_every,
    anderson,
    t0,
    dense_max,
    ws,
    gram_key,
):
    """The squared-loss subproblem by covariance updates (:mod:`dl1.kernels.gram`), on the
    Gram matrix of the working set ``ws`` (cached under ``gram_key``, see
    :func:`working_set_gram`).

    ``Q = X_W^T (S - s s^T / sum(s)) X_W / n`` profiles the intercept out; ``h = -grad F`` is
    refreshed exactly from the residual at every gap check, so rounding cannot accumulate.
    """
    from dl1.gap import duality_gap_from_stats
    from dl1.kernels.linalg import csc_matvec, csc_rmatvec

    n, m = y.shape[0], w.shape[0]
    vals = data if scale.shape[0] == 0 else data * np.repeat(scale, np.diff(indptr))
    c = None
    if fit_intercept:
        c = _col_sums(indptr, indices, vals, s) / np.sqrt(n * (n if s is None else float(s.sum())))
    # Q itself is cached (read-only here): its entries, like G's, depend on two columns only
    Q = working_set_gram(indptr, indices, vals, n, sw, ws, gram_key, dense_max, 1.0 / n, c)
    z_start = z.copy()
    w_start = w.copy()
    h = np.empty(m)
    # X_W^T S (y - mean_s(y)): how the weighted residual's inner product with y moves
    yc = y - (datafit.initial_intercept(y, s) if fit_intercept else 0.0)
    g_y = np.empty(m)
    csc_rmatvec(indptr, indices, data, scale, yc if s is None else s * yc, g_y)
    estimate_ok = False
    min_between = 1
    gap = np.inf
    epochs = 0
    hist: list[np.ndarray] = []
    zc = z
    db_total = 0.0
    while True:
        # exact state: z from w, intercept refitted, h = X^T theta / n
        zc = z_start.copy()
        csc_matvec(indptr, indices, data, scale, w - w_start, zc)
        db_total = 0.0
        if fit_intercept:
            db_total = datafit.intercept_update(y, zc, s)
            zc += db_total
        theta = datafit.dual_point(y, zc, s, fit_intercept)
        # one pass gives X^T theta for the gap's statistics and the next epochs' gradient
        csc_rmatvec(indptr, indices, data, scale, theta, h)
        _, _, gap = duality_gap_from_stats(
            datafit,
            penalty,
            y,
            zc,
            w,
            *penalty.xt_theta_stats(h, n),
            s=s,
            intercept=fit_intercept,
            theta=theta,
        )
        if gap <= target_gap or epochs >= max_epochs:
            break
        if estimate_ok:  # the estimate said "within the target", the exact gap did not
            min_between = check_every
        est = _GramGapEstimate(datafit, penalty, y, zc, theta, h, w, s, g_y)
        h /= n
        # the exact gap costs two passes over the working set's nonzeros: it is computed
        # when the Gram-matrix estimate (O(m) per epoch) falls within the target, or after
        # 10 * check_every epochs at the latest
        done, estimate_ok = _gram_epochs(
            Q, h, w, penalty, est, target_gap, min_between, 10 * check_every,
            max_epochs - epochs, anderson, hist,
        )  # fmt: skip
        epochs += done
    info = {"epochs": epochs, "gap": float(gap), "kernel_s": time.perf_counter() - t0}
    return w, zc - z, db_total, info


# --- the working-set subproblem on a Gram matrix formed across partitions -----------------
# Out of core, a working set too big to gather on one worker stays where its columns were
# extracted (each partition's cached groups). Its Gram matrix is formed there: each partition
# computes the products of its columns with the new columns (another partition's arrive in
# row pieces of bounded size), and one worker assembles ``Q`` and runs the covariance updates
# on it; exact gap checks are partition reductions (``X_W^T theta``) and the residual moves by
# the partitions' ``X_q d_q``. See :func:`dl1.solvers.ws.spread_gram_subproblem`.


def _group_rows(e: tuple, cols: np.ndarray, r0: int, r1: int) -> sp.csr_matrix:
    """Rows ``[r0, r1)`` of the columns ``cols`` (local positions) of a cached group, scaled,
    in float64 (products through BLAS and scipy), as CSR; the group is not copied."""
    from dl1.kernels.select import csc_rows_as_csr

    scale = e[3] if e[5] else np.zeros(0)
    cols = np.asarray(cols, dtype=np.int64)
    indptr, indices, data = csc_rows_as_csr(e[0], e[1], e[2], scale, cols, r0, r1)
    return sp.csr_matrix((data, indices, indptr), shape=(r1 - r0, cols.shape[0]))


def partition_rmatvec_task(
    extracts: list[tuple], keeps: list[np.ndarray], vecs: list[np.ndarray]
) -> list[np.ndarray]:
    """``X_q^T v`` (scaled columns) over a partition's live columns (each group's ``keeps``,
    in group order), for every ``v`` of ``vecs``."""
    from dl1.kernels.linalg import csc_rmatvec

    outs: list[list[np.ndarray]] = [[] for _ in vecs]
    for e, keep in zip(extracts, keeps, strict=True):
        keep = np.asarray(keep, dtype=np.int64)
        scale = e[3] if e[5] else np.zeros(0)
        tmp = np.empty(e[0].shape[0] - 1)
        for out, v in zip(outs, vecs, strict=True):
            csc_rmatvec(e[0], e[1], e[2], scale, v, tmp)
            out.append(tmp[keep])
    return [np.concatenate(o) if o else np.zeros(0) for o in outs]


def partition_matvec_task(
    extracts: list[tuple], keeps: list[np.ndarray], d: np.ndarray, n: int
) -> np.ndarray:
    """``X_q d`` (scaled columns) over a partition's live columns (``d`` in their order)."""
    from dl1.kernels.linalg import csc_matvec

    u = np.zeros(n)
    k = 0
    for e, keep in zip(extracts, keeps, strict=True):
        keep = np.asarray(keep, dtype=np.int64)
        full = np.zeros(e[0].shape[0] - 1)
        full[keep] = d[k : k + keep.shape[0]]
        k += keep.shape[0]
        if full.any():
            csc_matvec(e[0], e[1], e[2], e[3] if e[5] else np.zeros(0), full, u)
    return u


def row_piece_task(
    extracts: list[tuple], cols: list[np.ndarray], r0: int, r1: int, after=None
) -> sp.csr_matrix:
    """Rows ``[r0, r1)`` of the columns ``cols`` of a partition's groups (scaled; groups in
    order), as CSR: a bounded piece of new columns sent to another partition. ``after`` (the
    consumer's previous result, unused) orders the pieces: one is made when the previous one
    has been used, so they are never all held at once."""
    mats = [_group_rows(e, c, r0, r1) for e, c in zip(extracts, cols, strict=True) if len(c)]
    return sp.hstack(mats, format="csr") if mats else sp.csr_matrix((r1 - r0, 0))


def _cross(left: sp.csr_matrix, right: sp.csr_matrix, s: np.ndarray | None, scratch_max: int):
    """``left^T S right`` (rows of both aligned) in float64: through BLAS on densified row
    blocks of at most ``scratch_max`` elements when dense enough (the rule of
    :func:`working_set_gram`), else by a sparse product."""
    rows, a = left.shape
    b = right.shape[1]
    if rows == 0 or a == 0 or b == 0:
        return np.zeros((a, b))
    if left.nnz / (rows * a) * right.nnz / (rows * b) > 0.01:
        out = np.zeros((a, b))
        step = max(1, scratch_max // (a + b))
        for i in range(0, rows, step):
            lft = left[i : i + step].toarray()
            rgt = right[i : i + step].toarray()
            if s is not None:
                rgt *= s[i : i + step, None]
            out += lft.T @ rgt
        return out
    rgt = right if s is None else sp.csr_matrix(right.multiply(s[:, None]))
    return (left.T @ rgt).toarray()


def cross_gram_task(
    acc: np.ndarray | None,
    extracts: list[tuple],
    keeps: list[np.ndarray],
    piece: sp.csr_matrix | None,
    own_cols: list[np.ndarray] | None,
    ranges: list[tuple[int, int]],
    sw: np.ndarray,
    scratch_max: int,
) -> np.ndarray:
    """``acc + sum over ranges [r0, r1) of X_q[r0:r1]^T S X_new[r0:r1]``: a partition's live
    columns (rows of the result, group order) against new columns, given as a row ``piece``
    from another partition (one range) or, with ``own_cols``, this partition's own (taken a
    range at a time, so no copy of them all is made)."""
    for r0, r1 in ranges:
        right = piece if piece is not None else row_piece_task(extracts, own_cols, r0, r1)
        s = None if sw.shape[0] == 0 else sw[r0:r1]
        # one group's rows at a time: no copy of all the partition's columns
        parts = [
            _cross(_group_rows(e, keep, r0, r1), right, s, scratch_max)
            for e, keep in zip(extracts, keeps, strict=True)
        ]
        out = np.concatenate(parts, axis=0) if parts else np.zeros((0, right.shape[1]))
        acc = out if acc is None else acc + out
    return acc


def merge_gram_task(
    prev: tuple[np.ndarray, np.ndarray] | None,
    ids: np.ndarray,
    new_pos: np.ndarray,
    blocks: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
    c: np.ndarray | None,
    factor: float,
) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, Q)``: ``Q = factor X_W^T S X_W - c c^T`` over the columns ``ids`` (any order),
    entries of columns already in ``prev`` copied, those of the new columns (positions
    ``new_pos`` of ``ids``) from ``blocks``: ``(row positions, new-column positions,
    X_rows^T S X_new)``. Held as a task result (recomputable), not in a worker cache."""
    from dl1.kernels.gram import take_submatrix

    m = ids.shape[0]
    Q = np.empty((m, m), dtype=GRAM_DTYPE)
    if prev is not None:
        old_ids, old_Q = prev
        kpos = np.setdiff1d(np.arange(m), new_pos, assume_unique=True)
        order = np.argsort(old_ids, kind="stable")
        opos = order[np.searchsorted(old_ids[order], ids[kpos])]
        take_submatrix(old_Q, opos, Q, kpos)
    for rows, cols, part in blocks:
        part = factor * part
        if c is not None:
            part -= np.outer(c[rows], c[cols])
        Q[np.ix_(rows, cols)] = part
        Q[np.ix_(cols, rows)] = part.T
    return ids, Q


def spread_gram_epochs_task(
    gram: tuple[np.ndarray, np.ndarray],
    w: np.ndarray,
    h: np.ndarray,
    est: _GramGapEstimate,
    penalty,
    target_gap: float,
    min_between: int,
    max_between: int,
    max_epochs: int,
    anderson: int,
):
    """Covariance-update epochs on an assembled ``Q`` (:func:`merge_gram_task`) from an exact
    check point (``h = X_W^T theta / n``), until the O(m) gap estimate falls within the
    target (see :func:`_gram_epochs`). Returns the new ``w``, the epochs run, whether the
    estimate stopped them, and the kernel seconds."""
    t0 = time.perf_counter()
    w = np.asarray(w, dtype=np.float64).copy()
    h = np.asarray(h, dtype=np.float64).copy()
    epochs, ok = _gram_epochs(
        gram[1], h, w, penalty, est, target_gap, min_between, max_between, max_epochs, anderson
    )
    return w, epochs, ok, time.perf_counter() - t0
