"""Tasks of the multiclass working-set solver: one pass over a partition's feature blocks
against the ``n x K`` dual point serves every class."""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

from dl1.kernels.multiclass import csc_xt_mat
from dl1.tasks.blocks import Block, BlockSource, loaded


class MulticlassScan(NamedTuple):
    """A partition's pass: the largest dual-norm group of ``X^T Theta`` and the summed
    squared excess over ``threshold`` (the gap's statistics), the global indices and group
    norms of its ``n_candidates`` largest groups, and the seconds it took."""

    absmax: float
    excess_sq: float
    candidates: np.ndarray
    scores: np.ndarray
    seconds: float


def group_norms(V: np.ndarray, grouped: bool) -> np.ndarray:
    """Each feature's dual-norm group of ``V = X^T Theta`` (rows): its Euclidean norm for the
    grouped penalty, else its largest entry (each entry is a group of its own)."""
    return np.sqrt((V * V).sum(axis=1)) if grouped else np.abs(V).max(axis=1, initial=0.0)


def excess_sq(V: np.ndarray, grouped: bool, threshold: float) -> float:
    """``sum (group - threshold)_+^2`` over the groups of ``V``."""
    groups = np.sqrt((V * V).sum(axis=1)) if grouped else np.abs(V).ravel()
    ex = np.maximum(groups - threshold, 0.0)
    return float(ex @ ex)


def mc_scan_task(
    blocks: list[Block | BlockSource],
    offsets: list[int],
    theta: np.ndarray,
    grouped: bool,
    threshold: float,
    n_candidates: int,
) -> MulticlassScan:
    """``X_b^T Theta`` of every block of a partition (read from disk when streamed), reduced
    to the gap's statistics and the most violating features: ``K`` numbers a feature, never
    sent back."""
    t0 = time.perf_counter()
    absmax, excess = 0.0, 0.0
    cands, scores = [], []
    for blk, off in zip(blocks, offsets, strict=True):
        b = loaded(blk)
        V = np.empty((b.ncols, theta.shape[1]))
        csc_xt_mat(b.indptr, b.indices, b.data, theta, V)
        if b.col_scale.shape[0]:  # standardised: column j is x_j scale_j
            V *= b.col_scale[:, None]
        norms = group_norms(V, grouped)
        if norms.shape[0] == 0:
            continue
        absmax = max(absmax, float(norms.max()))
        excess += excess_sq(V, grouped, threshold)
        top = np.argsort(-norms, kind="stable")[:n_candidates]
        cands.append(top + off)
        scores.append(norms[top])
    if not cands:
        return MulticlassScan(0.0, 0.0, np.zeros(0, np.int64), np.zeros(0),
                              time.perf_counter() - t0)  # fmt: skip
    return MulticlassScan(absmax, excess, np.concatenate(cands).astype(np.int64),
                          np.concatenate(scores), time.perf_counter() - t0)  # fmt: skip
