"""Working-set subproblems spread over the partitions holding their columns (out of core):
CoCoA+ rounds, partition products and a Gram matrix formed across partitions."""

from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp

from dl1.kernels.cd import cd_block_epochs
from dl1.kernels.gram import take_submatrix
from dl1.kernels.linalg import csc_matvec, csc_rmatvec
from dl1.kernels.screen import csc_scan_screen
from dl1.kernels.select import csc_rows_as_csr
from dl1.tasks.blocks import NO_BOUNDS, NO_FACTORS, NO_PROFILE, NO_SHIFT
from dl1.tasks.gram import GRAM_DTYPE, GramGapEstimate, gram_epochs
from dl1.tasks.records import (
    ColumnGroup,
    GapStats,
    SpreadRoundOutput,
)


def ws_round_task(
    extracts: list[ColumnGroup],
    keeps: list[np.ndarray],
    w_parts: list[np.ndarray],
    g: np.ndarray,
    theta: np.ndarray,
    sample_weight: np.ndarray,
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
    kernel_s : float, the seconds the round took.
    """
    t0 = time.perf_counter()
    n = g.shape[0]
    u = np.zeros(n)
    s = None if sample_weight.shape[0] == 0 else sample_weight
    shift = np.array([0.0, n if s is None else float(s.sum())])
    stats = restricted_gap_stats(extracts, keeps, theta, threshold)
    ws, args = [], []
    for i, (e, keep, wp) in enumerate(zip(extracts, keeps, w_parts, strict=True)):
        keep = np.asarray(keep, dtype=np.int64)
        scale = e.col_scale
        w = np.zeros(e.ncols)
        w[keep] = wp
        ws.append(w)
        args.append((e, scale, keep, NO_PROFILE if col_sums is None else col_sums[i]))
    for _ in range(n_epochs):
        for (e, scale, keep, col_sum), w in zip(args, ws, strict=True):
            cd_block_epochs(
                e.indptr,
                e.indices,
                e.data,
                scale,
                w,
                g,
                u,
                sample_weight,
                e.sqnorm,
                sigma,
                beta,
                float(n),
                alpha_l1,
                alpha_l2,
                NO_FACTORS,
                NO_BOUNDS,
                1,
                False,
                0,
                keep,
                col_sum,
                NO_SHIFT if col_sums is None else shift,
            )
    w_new = [w[np.asarray(k, dtype=np.int64)] for w, k in zip(ws, keeps, strict=True)]
    shift_b = 0.0 if col_sums is None else float(shift[0])
    kernel_s = time.perf_counter() - t0
    return SpreadRoundOutput(w_new, u, shift_b, stats, kernel_s)


def restricted_gap_stats(
    extracts: list[ColumnGroup], keeps: list[np.ndarray], theta: np.ndarray, threshold: float
) -> GapStats:
    """The restricted gap's statistics of ``X_W^T theta`` over the live columns ``keeps`` of
    a partition's cached groups: ``max |c_j|`` and ``sum_j (|c_j| - threshold)_+^2``."""
    absmax, excess = 0.0, 0.0
    for e, keep in zip(extracts, keeps, strict=True):
        keep = np.asarray(keep, dtype=np.int64)
        c, _ = csc_scan_screen(
            e.indptr, e.indices, e.data, e.col_scale, keep, theta, np.zeros(0), 1.0, 0.0,
            threshold,
        )  # fmt: skip
        if c.size:
            a = np.abs(c)
            absmax = max(absmax, float(a.max()))
            ex = a[a > threshold] - threshold
            excess += float(ex @ ex)
    return GapStats(absmax, excess)


# --- the working-set subproblem on a Gram matrix formed across partitions -----------------
# Out of core, a working set too big to gather on one worker stays where its columns were
# extracted (each partition's cached groups). Its Gram matrix is formed there: each partition
# computes the products of its columns with the new columns (another partition's arrive in
# row pieces of bounded size), and one worker assembles ``Q`` and runs the covariance updates
# on it; exact gap checks are partition reductions (``X_W^T theta``) and the residual moves by
# the partitions' ``X_q d_q``. See :func:`dl1.solvers.ws.spread_gram_subproblem`.


def _group_rows(e: ColumnGroup, cols: np.ndarray, r0: int, r1: int) -> sp.csr_matrix:
    """Rows ``[r0, r1)`` of the columns ``cols`` (local positions) of a cached group, scaled,
    in float64 (products through BLAS and scipy), as CSR; the group is not copied."""
    cols = np.asarray(cols, dtype=np.int64)
    indptr, indices, data = csc_rows_as_csr(e.indptr, e.indices, e.data, e.col_scale, cols, r0, r1)
    return sp.csr_matrix((data, indices, indptr), shape=(r1 - r0, cols.shape[0]))


def partition_rmatvec_task(
    extracts: list[ColumnGroup], keeps: list[np.ndarray], vecs: list[np.ndarray]
) -> list[np.ndarray]:
    """``X_q^T v`` (scaled columns) over a partition's live columns (each group's ``keeps``,
    in group order), for every ``v`` of ``vecs``."""
    outs: list[list[np.ndarray]] = [[] for _ in vecs]
    for e, keep in zip(extracts, keeps, strict=True):
        keep = np.asarray(keep, dtype=np.int64)
        scale = e.col_scale
        tmp = np.empty(e.ncols)
        for out, v in zip(outs, vecs, strict=True):
            csc_rmatvec(e.indptr, e.indices, e.data, scale, v, tmp)
            out.append(tmp[keep])
    return [np.concatenate(o) if o else np.zeros(0) for o in outs]


def partition_matvec_task(
    extracts: list[ColumnGroup], keeps: list[np.ndarray], d: np.ndarray, n: int
) -> np.ndarray:
    """``X_q d`` (scaled columns) over a partition's live columns (``d`` in their order)."""
    u = np.zeros(n)
    k = 0
    for e, keep in zip(extracts, keeps, strict=True):
        keep = np.asarray(keep, dtype=np.int64)
        full = np.zeros(e.ncols)
        full[keep] = d[k : k + keep.shape[0]]
        k += keep.shape[0]
        if full.any():
            csc_matvec(e.indptr, e.indices, e.data, e.col_scale, full, u)
    return u


def row_piece_task(
    extracts: list[ColumnGroup], cols: list[np.ndarray], r0: int, r1: int, after=None
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
    extracts: list[ColumnGroup],
    keeps: list[np.ndarray],
    piece: sp.csr_matrix | None,
    own_cols: list[np.ndarray] | None,
    ranges: list[tuple[int, int]],
    sample_weight: np.ndarray,
    scratch_max: int,
) -> np.ndarray:
    """``acc + sum over ranges [r0, r1) of X_q[r0:r1]^T S X_new[r0:r1]``: a partition's live
    columns (rows of the result, group order) against new columns, given as a row ``piece``
    from another partition (one range) or, with ``own_cols``, this partition's own (taken a
    range at a time, so no copy of them all is made)."""
    for r0, r1 in ranges:
        right = piece if piece is not None else row_piece_task(extracts, own_cols, r0, r1)
        s = None if sample_weight.shape[0] == 0 else sample_weight[r0:r1]
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
    est: GramGapEstimate,
    penalty,
    target_gap: float,
    min_between: int,
    max_between: int,
    max_epochs: int,
    anderson: int,
):
    """Covariance-update epochs on an assembled ``Q`` (:func:`merge_gram_task`) from an exact
    check point (``h = X_W^T theta / n``), until the O(m) gap estimate falls within the
    target (see :func:`gram_epochs`). Returns the new ``w``, the epochs run, whether the
    estimate stopped them, and the kernel seconds."""
    t0 = time.perf_counter()
    w = np.asarray(w, dtype=np.float64).copy()
    h = np.asarray(h, dtype=np.float64).copy()
    epochs, ok = gram_epochs(
        gram[1], h, w, penalty, est, target_gap, min_between, max_between, max_epochs, anderson
    )
    return w, epochs, ok, time.perf_counter() - t0
