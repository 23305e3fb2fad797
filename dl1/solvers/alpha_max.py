"""``alpha_max`` of a loaded problem: the smallest penalty whose solution has every
penalised coefficient 0, from one pass over the data."""

from __future__ import annotations

import numpy as np

from dl1.loading import rows_xt_theta, xt_theta_absmax
from dl1.objective.penalties import ElasticNet
from dl1.solvers.base import Problem
from dl1.solvers.unpenalised import FreeColumns


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
        pen, bounds = pb.penalty, pb.col_bounds
        factors = None if pen.uniform else [pen.block(int(bounds[j]), int(bounds[j + 1]))
                                            for j in range(len(pb.blocks))]  # fmt: skip
        absmax = xt_theta_absmax(pb.executor, pb.blocks, theta0, len(pb.partitions), factors,
                                 pen.positive)  # fmt: skip
    return ElasticNet.alpha_max(absmax / pb.n, l1_ratio)
