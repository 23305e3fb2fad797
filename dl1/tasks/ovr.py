"""The pass of the one-vs-rest solver: one read of each feature block serves every class.

Each class ``k`` of a one-vs-rest fit is a binary problem with its own dual point
``theta_k`` (length n); the coordinator stacks the unconverged classes' into ``Theta``
(``n x K``). A partition's task computes ``V = X_b^T Theta`` block by block (one read of
the block's nonzeros for all classes, :func:`~dl1.kernels.multiclass.csc_xt_mat`) and
reduces each column ``V[:, k]`` exactly as the binary pass reduces ``X_b^T theta``
(:func:`dl1.tasks.passes.scan_task`): the gap's statistics and the class's worst KKT
violators (:func:`~dl1.kernels.screen.violation_scores`, :func:`~dl1.kernels.screen.
top_scores`). Only these few numbers per class travel back, never ``V``.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

from dl1.kernels.multiclass import csc_xt_mat
from dl1.kernels.screen import top_scores, violation_scores
from dl1.tasks.blocks import PLAIN, Block, BlockSource, loaded
from dl1.tasks.records import BlockScan, GapStats


class OvrScan(NamedTuple):
    """A partition's part of a one-vs-rest pass: ``blocks[b][k]``, the
    :class:`~dl1.tasks.records.BlockScan` of block ``b`` for the ``k``-th column of
    ``Theta`` (what the binary pass would return for that class alone), and the kernel
    seconds."""

    blocks: list[list[BlockScan]]
    seconds: float


def local_support(support: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """The sorted global ids of ``support`` inside ``[lo, hi)``, as local (int64) ids."""
    a, b = np.searchsorted(support, [lo, hi])
    return (support[a:b] - lo).astype(np.int64)


def ovr_scan_task(
    blocks: list[Block | BlockSource],
    offsets: list[int],
    theta: np.ndarray,
    threshold: float,
    supports: list[np.ndarray],
    n_candidates: list[int],
) -> OvrScan:
    """One pass over a partition's blocks (read from the store when streamed) for every
    column of ``theta`` (``n x K``).

    Per block and class ``k``: ``c = X_b^T theta[:, k]``, its statistics ``(max |c_j|,
    sum_j (|c_j| - threshold)_+^2)`` and the local ids and scores ``|c_j| - threshold`` of
    its ``n_candidates[k]`` most violating columns outside ``supports[k]`` (sorted global
    feature ids; ``offsets`` the blocks' first columns). ``threshold = n alpha_l1``, as in
    :func:`dl1.tasks.passes.scan_task`.
    """
    t0 = time.perf_counter()
    theta = np.ascontiguousarray(theta, dtype=np.float64)
    n_classes = theta.shape[1]
    out = []
    for blk, off in zip(blocks, offsets, strict=True):
        b = loaded(blk)
        V = np.empty((b.ncols, n_classes))
        csc_xt_mat(b.indptr, b.indices, b.data, theta, V)
        if b.col_scale.shape[0]:  # scaled columns: x_j col_scale_j
            V *= b.col_scale[:, None]
        visit = np.arange(b.ncols, dtype=np.int64)
        visited = int(b.indptr[-1] - b.indptr[0])
        per_class = []
        for k in range(n_classes):
            c = np.ascontiguousarray(V[:, k])  # becomes the scores, in place
            idx = local_support(supports[k], off, off + b.ncols)
            stats = violation_scores(c, threshold, visit, b.col_sqnorm, idx, PLAIN.factors,
                                     PLAIN.bounds, PLAIN.n, PLAIN.alpha_l2)  # fmt: skip
            top = top_scores(c, int(n_candidates[k]))
            per_class.append(BlockScan(GapStats(*stats), visit[top], c[top], None, visited,
                                       -1.0))  # fmt: skip
        out.append(per_class)
    return OvrScan(out, time.perf_counter() - t0)
