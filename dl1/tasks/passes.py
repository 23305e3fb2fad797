"""Passes over a partition's blocks: the certificate's statistics of ``X^T theta``, the
working set's candidates, screening, products with ``w``, and CoCoA+ rounds."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from dl1.kernels.cd import cd_block_epochs
from dl1.kernels.linalg import DUAL_SIDES, csc_col_sqnorms, csc_matvec, csc_xt_theta_stats
from dl1.kernels.screen import csc_scan_screen, top_scores, violation_scores
from dl1.tasks.blocks import (
    NO_BOUNDS,
    NO_FACTORS,
    NO_PROFILE,
    NO_SHIFT,
    PLAIN,
    Block,
    BlockPenalty,
    BlockSource,
    loaded,
)
from dl1.tasks.records import (
    BlockScan,
    GapStats,
    PartitionScan,
    RoundOutput,
)


def xt_theta_task(
    blocks: list[Block | BlockSource],
    theta: np.ndarray,
    threshold: float,
    penalties: list[BlockPenalty] | None = None,
    sides: float = DUAL_SIDES,
):
    """Per-block ``(||X_k^T theta||_inf, sum_j (|x_j^T theta| - threshold)_+^2)``, or with
    per-block ``penalties`` the weighted penalty's statistics
    (:func:`~dl1.kernels.linalg.csc_xt_theta_stats`): the dual norm's sides, or with
    ``sides=KKT_SIDES`` those the KKT conditions at 0 see (``alpha_max``)."""
    out = []
    for k, b in enumerate(blocks):
        b = loaded(b)
        pen = PLAIN if penalties is None else penalties[k]
        stats = csc_xt_theta_stats(b.indptr, b.indices, b.data, b.col_scale, theta, threshold,
                                   pen.factors, pen.bounds, pen.n, pen.alpha_l2,
                                   sides)  # fmt: skip
        out.append(GapStats(*stats))
    return out


def round_task(
    blocks: list[Block | BlockSource],
    w_parts: list[tuple[np.ndarray, np.ndarray]],
    g: np.ndarray,
    theta: np.ndarray,
    sample_weight: np.ndarray,
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
    kernel_s : float, the seconds the round took.
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
    for epoch in range(n_epochs):
        for k, b in enumerate(blocks):
            b = loaded(b)  # out-of-core: read again each epoch, one block in memory at a time
            cd_block_epochs(
                b.indptr,
                b.indices,
                b.data,
                b.col_scale,
                ws[k],
                g,
                u,
                sample_weight,
                b.col_sqnorm,
                sigma,
                beta,
                float(n),
                alpha_l1,
                alpha_l2,
                NO_FACTORS,
                NO_BOUNDS,
                1,
                random_order,
                (seed * 1000003 + epoch * 1009 + k) % (2**32),
                active[k],
                NO_PROFILE,
                NO_SHIFT,
            )
    w_new = []
    for w in ws:
        nz = np.flatnonzero(w)
        w_new.append((nz.astype(np.int64), w[nz]))
    return RoundOutput(w_new, u, stats, time.perf_counter() - t0)


def matvec_task(
    blocks: list[Block | BlockSource], w_parts: list[tuple[np.ndarray, np.ndarray]], n: int
):
    """``X_part w_part`` (used to rebuild ``X w`` from a warm start)."""
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
    penalties: list[BlockPenalty] | None = None,
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
    few numbers travel. ``penalties`` (per block) give a weighted penalty's statistics and
    violations (:func:`~dl1.kernels.screen.violation_scores`).
    """
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
            none = np.zeros(0, np.int64)
            out.append(BlockScan(GapStats(0.0, 0.0), none, np.zeros(0), packed, 0, -1.0))
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
        visited = (
            int(b.indptr[-1] - b.indptr[0])
            if cols is None
            else int((b.indptr[visit + 1] - b.indptr[visit]).sum())
        )
        new_alive = packed
        if not keep.all():
            keep[np.isin(visit, idx)] = True  # never screen the support
            if not keep.all():
                c = c[keep]
                visit = visit[keep]
                mask = np.zeros(b.ncols, dtype=bool)
                mask[visit] = True
                new_alive = np.packbits(mask)  # 1 bit per column travels, not an index list
        # c becomes the scores: violations, -inf for the support and empty columns
        pen = PLAIN if penalties is None else penalties[k_blk]
        stats = violation_scores(c, threshold, visit, b.col_sqnorm, idx, pen.factors,
                                 pen.bounds, pen.n, pen.alpha_l2)  # fmt: skip
        score = c
        top = top_scores(score, n_candidates)
        out.append(
            BlockScan(
                GapStats(*stats),
                visit[top].astype(np.int64),
                score[top],
                new_alive,
                visited,
                nmax,
            )
        )
    return PartitionScan(out, time.perf_counter() - t0)
