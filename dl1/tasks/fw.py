"""Worker-side tasks of the randomized Frank-Wolfe solver (:mod:`dl1.solvers.fw`).

Plain functions of arrays, run by Dask workers next to their feature blocks (or
in-process). Each round a partition scores its share of the random sample against ``p = X a``
and returns its best candidate only: the chosen column travels, the sample does not.
"""

from __future__ import annotations

import time

import numpy as np

from dl1.kernels.fw import fw_column, fw_score_columns
from dl1.kernels.linalg import csc_rmatvec
from dl1.tasks.blocks import Block
from dl1.tasks.records import FWColumn, FWPartitionRound, Vertex


def sigma_task(blocks: list[Block], y: np.ndarray) -> list[np.ndarray]:
    """``sigma_j = z_j^T y`` for every column of every block (Frandi et al., Sec. 4.2)."""
    out = []
    for b in blocks:
        s = np.empty(b.ncols)
        csc_rmatvec(b.indptr, b.indices, b.data, b.col_scale, y, s)
        out.append(s)
    return out


def nnz_task(blocks: list[Block]) -> list[int]:
    """Nonzeros of each block."""
    return [int(b.indices.shape[0]) for b in blocks]


def sample_columns(ncols: int, kappa: int, seed: int, it: int, j: int) -> np.ndarray:
    """The ``kappa`` distinct columns (sorted) block ``j`` scores at iteration ``it``.

    Drawn from a generator seeded by ``(seed, it, j)`` only, so the sample, and hence the
    whole run, does not depend on how blocks are spread over workers or partitions.
    """
    rng = np.random.default_rng((seed, it, j))
    return np.sort(rng.choice(ncols, size=kappa, replace=False)).astype(np.int64)


def fw_round_task(
    blocks: list[Block],
    offsets: list[int],
    sigmas: list[np.ndarray],
    p: np.ndarray,
    kappas: list[int],
    seed: int,
    it: int,
    full: bool,
    extras: list[tuple[np.ndarray, np.ndarray]] | None = None,
    threshold: float = -1.0,
):
    """One FW round on a partition: the best vertex among its sampled (or all) columns.

    Only the candidate's index and gradient travel back; the coordinator fetches the column
    it chooses with :func:`column_task` unless it holds it already.

    ``extras``: per block, the sparse gradient term of the elastic-net penalty (local
    indices, ``mu a_j``) or None; ``threshold``: for the certificate statistics of a full
    pass (see :func:`dl1.kernels.fw.fw_score_columns`).

    Returns
    -------
    FWPartitionRound
        The partition's column of largest ``|grad|`` (global index; None if nothing was
        scored), the columns scored and nonzeros read, the certificate statistics of the
        least-squares gradient over the scored columns, and the task's seconds.
    """
    t0 = time.perf_counter()
    best = None
    best_abs = -1.0
    scored = visited = 0
    cmax = excess = 0.0
    empty = np.zeros(0, dtype=np.int64)
    none = (empty, np.zeros(0))
    for k, (b, c0, sig, kap) in enumerate(zip(blocks, offsets, sigmas, kappas, strict=True)):
        every = full or kap >= b.ncols
        if not every and kap == 0:
            continue
        cols = empty if every else sample_columns(b.ncols, kap, seed, it, b.j)
        ex_idx, ex_val = none if extras is None or extras[k] is None else extras[k]
        j, g, m, v, cm, xs = fw_score_columns(
            b.indptr, b.indices, b.data, b.col_scale, sig, p, cols, every, ex_idx, ex_val,
            threshold,
        )  # fmt: skip
        scored += m
        visited += v
        cmax = max(cmax, cm)
        excess += xs
        if j >= 0 and abs(g) > best_abs:
            best_abs = abs(g)
            best = Vertex(c0 + j, g, float(sig[j]))
    return FWPartitionRound(best, scored, visited, cmax, excess, time.perf_counter() - t0)


def column_task(blocks: list[Block], offsets: list[int], col: int):
    """The :class:`~dl1.tasks.records.FWColumn` of global column ``col`` (scaled values)."""
    for b, c0 in zip(blocks, offsets, strict=True):
        if c0 <= col < c0 + b.ncols:
            j = col - c0
            rows, vals, total, sq = fw_column(b.indptr, b.indices, b.data, b.col_scale, j)
            scale = float(b.col_scale[j]) if b.col_scale.shape[0] else 1.0
            return FWColumn(rows, vals, total, sq, scale)
    raise IndexError(f"column {col} is not in this partition")
