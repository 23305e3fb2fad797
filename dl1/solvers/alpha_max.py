"""``alpha_max`` of a loaded problem: the smallest penalty whose solution has every
penalised coefficient 0, from one pass over the data."""

from __future__ import annotations

from typing import Any

import numpy as np

from dl1.kernels.linalg import KKT_SIDES
from dl1.objective.penalties import ElasticNet
from dl1.solvers.base import Problem
from dl1.solvers.rowwise import rows_xt_theta
from dl1.solvers.scans import block_penalties
from dl1.solvers.unpenalised import FreeColumns
from dl1.tasks.blocks import BlockPenalty
from dl1.tasks.passes import xt_theta_task


def problem_alpha_max(problem: Problem, l1_ratio: float) -> float:
    """``alpha_max`` of a loaded problem: one pass, ``||X^T theta_0||_inf / (n l1_ratio)``
    with ``theta_0`` the dual point of ``w = 0`` and its intercept (and the unpenalised
    features' optimal coefficients, the penalised ones 0)."""
    pb = problem
    z0 = np.full(pb.n, pb.initial_intercept())
    free = FreeColumns.gather(pb)  # unpenalised features: at their optimum with w = 0
    if free is not None:
        free.refit(pb, z0, np.zeros(pb.p), 0.0)
    theta0 = pb.datafit.dual_point(pb.y, z0, pb.weights, pb.fit_intercept)
    if pb.rows is not None:
        absmax = float(np.abs(rows_xt_theta(pb.executor, pb.rows, theta0)).max(initial=0.0))
    else:
        penalties = block_penalties(pb, list(range(len(pb.blocks))))
        absmax = xt_theta_absmax(pb.executor, pb.blocks, theta0, len(pb.partitions), penalties)
    return ElasticNet.alpha_max(absmax / pb.n, l1_ratio)


def xt_theta_absmax(
    ex: Any,
    blocks: list[Any],
    theta: np.ndarray,
    n_partitions: int,
    penalties: list[BlockPenalty] | None = None,
) -> float:
    """``||X^T theta||_inf`` (with per-block ``penalties``, the weighted penalty's norm over
    the sides the KKT conditions at 0 see): one task per partition, so ``theta`` travels
    once per partition (a task per block would ship a copy of ``theta`` with each of
    thousands of blocks)."""
    parts = np.array_split(np.arange(len(blocks)), max(1, min(n_partitions, len(blocks))))
    stats = ex.gather(
        [ex.submit(xt_theta_task, [blocks[j] for j in part], theta, np.inf,
                   None if penalties is None else [penalties[j] for j in part], KKT_SIDES)
         for part in parts]
    )  # fmt: skip
    return max((st.absmax for res in stats for st in res), default=0.0)
