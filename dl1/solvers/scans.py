"""Passes of the working-set solver: one scan of every partition certifies the current
point and ranks the violators (:func:`scan_pass`, :class:`LastScan`); the next working set
is chosen from them (:func:`choose_working_set`); gap-safe spheres screen columns out of
later passes (:func:`sequential_sphere`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dl1.solvers.base import Problem
from dl1.solvers.result import coef_by_block
from dl1.tasks.blocks import BlockPenalty
from dl1.tasks.passes import scan_task
from dl1.tasks.records import BlockScan, PartitionScan

#: Violators added per round at least when a column budget (out of core) binds: the larger
#: of this number and :data:`WS_MIN_GROWTH` times the support's size (a support that fills
#: the budget alone would otherwise gain a few features per pass; what exceeds the budget
#: is spilled to disk by the workers).
WS_MIN_NEW = 16
WS_MIN_GROWTH = 0.125


@dataclass
class LastScan:
    """A pass's per-block results with its ``theta``, threshold and candidate count, and
    the blocks' nonzeros (for counting passes)."""

    per_block: list[BlockScan]
    theta: np.ndarray
    threshold: float
    ws_size: int
    block_nnz: np.ndarray


@dataclass(frozen=True)
class SphereSeed:
    """What the next alpha's sequential gap-safe screening starts from: the last pass's dual
    direction and an upper bound on ``||X^T theta||_inf`` over all columns."""

    theta: np.ndarray
    xt_bound: float


def choose_working_set(
    support: np.ndarray,
    per_block: list[BlockScan],
    starts: Any,
    ws_size: int,
    col_bytes: np.ndarray | None = None,
    cache_max: float = np.inf,
) -> np.ndarray:
    """The next working set (sorted feature ids): the support plus the worst violators.

    ``per_block`` holds each block's scan, whose candidates ``starts[j]`` shifts to feature
    ids; the ``ws_size - |support|`` best scores over all blocks join (at least one, ties to
    the lower block and rank). With ``col_bytes``, the violators join while their columns'
    bytes fit ``cache_max``, at least ``max(WS_MIN_NEW, WS_MIN_GROWTH |support|)`` of them.
    The coordinator chooses with it, and the subproblem's server repeats the choice to fetch
    the next round's columns in advance: the same function on the same values.
    """
    cand = np.concatenate(
        [starts[j] + blk.candidates for j, blk in enumerate(per_block)]
        or [np.zeros(0, np.int64)]
    )
    score = np.concatenate([blk.scores for blk in per_block] or [np.zeros(0)])
    n_new = max(ws_size - support.shape[0], 1)
    order = np.argsort(-score, kind="stable")
    if cand.shape[0] > n_new:
        order = order[:n_new]
    cand = cand[order]  # best violators first
    if col_bytes is not None:
        cand = cand[~np.isin(cand, support)]
        room = cache_max - float(col_bytes[support].sum())
        fits = int(np.searchsorted(np.cumsum(col_bytes[cand]), room, side="right"))
        cand = cand[: max(fits, WS_MIN_NEW, int(WS_MIN_GROWTH * support.shape[0]))]
    return np.union1d(support, cand).astype(np.int64)


def every_column_joined(per_block: list[BlockScan], ws_size: int, joined: int) -> bool:
    """Whether the ``joined`` candidates that entered the working set are every column a
    pass could offer (alive, not empty, not in the support): each block offered fewer than
    its ``ws_size`` candidates, hence all it had, and all of them joined. The working set
    is then the whole problem (empty and screened columns stay at 0), though it holds
    fewer than ``p`` features."""
    offered = sum(int(blk.candidates.shape[0]) for blk in per_block)
    return joined >= offered and all(blk.candidates.shape[0] < ws_size for blk in per_block)


def violators_left_out(per_block: list[BlockScan], joined: int) -> bool:
    """Whether a pass found more KKT violators (positive scores) than the ``joined``
    candidates that entered the working set: some were left out, so the working set's
    solution is not the problem's, however exactly it is solved. Each block offers at most
    the round's working-set size of candidates, so a block with more violators than that
    is found out too."""
    found = sum(int(np.count_nonzero(blk.scores > 0.0)) for blk in per_block)
    return found > joined


def sequential_sphere(
    problem: Problem, z: np.ndarray, w: np.ndarray, max_s: float, seed: SphereSeed
) -> tuple[np.ndarray, float, float]:
    """Gap-safe sphere ``(theta, scale, radius)`` of a previous solution at a new penalty.

    Sequential rule (Ndiaye et al., JMLR 2017, Sec. 4.1 and Thm. 6): the previous alpha's
    final point ``(w, z)`` and dual direction ``theta`` are still a primal and a (rescaled)
    dual feasible point at the new alpha; their gap there gives the safe radius.
    ``xt_bound >= ||X^T theta||_inf`` is all the rescaling needs: a larger value keeps
    ``scale * theta`` feasible and the gap an upper bound (a safe, larger sphere).
    """
    pb = problem
    primal = pb.datafit.value(pb.y, z, pb.weights) + pb.penalty.value(w[np.flatnonzero(w)])
    scale = pb.penalty.dual_feasible_scale(seed.xt_bound, pb.n)
    gap = primal + pb.datafit.conjugate(pb.y, scale * seed.theta, pb.weights)
    radius = float(np.sqrt(max(gap, 0.0) * 2.0 * pb.n * max_s * pb.datafit.beta))
    return seed.theta, scale, radius


def block_penalties(problem: Problem, part: list[int]) -> list[BlockPenalty] | None:
    """The weighted penalty of the blocks of partition ``part`` as their kernels take it
    (None: the plain penalty)."""
    pb, pen = problem, problem.penalty
    if pen.uniform:
        return None
    cb = pb.col_bounds
    return [
        BlockPenalty(pen.block(int(cb[j]), int(cb[j + 1])),
                     pen.block_bounds(int(cb[j]), int(cb[j + 1])), float(pb.n), pen.alpha_l2)
        for j in part
    ]  # fmt: skip


def scan_pass(
    problem: Problem,
    theta: np.ndarray,
    threshold: float,
    w: np.ndarray,
    ws_size: int,
    alive: list[np.ndarray | None],
    sphere: tuple[np.ndarray, float, float] | None,
    norms: bool = False,
    support: np.ndarray | None = None,
) -> list[PartitionScan]:
    """One pass: :func:`dl1.tasks.passes.scan_task` per partition, as tasks."""
    pb, ex = problem, problem.executor
    return ex.gather(
        [
            ex.submit(
                scan_task, [pb.blocks[j] for j in part], theta, threshold,
                coef_by_block(w, pb.col_bounds, part, support), ws_size,
                [alive[j] for j in part],
                sphere, norms, block_penalties(pb, part),
            )
            for part in pb.partitions
        ]
    )  # fmt: skip
