"""Anderson extrapolation of coordinate-descent iterates (Bertrand & Massias, "Anderson
acceleration of coordinate descent", AISTATS 2021, Alg. 1), shared by the subproblems'
epochs: each caller keeps the extrapolated point only if it lowers its objective."""

from __future__ import annotations

import numpy as np


def anderson_point(hist: np.ndarray) -> np.ndarray | None:
    """The extrapolation ``sum_k c_k x_k`` of the iterates ``hist`` (rows ``x_0 .. x_m``),
    ``c`` the normalised solution of ``(U U^T) c = 1`` for the differences ``U``; None when
    that system is singular or its solution not finite."""
    U = np.diff(hist, axis=0)
    try:
        c = np.linalg.solve(U @ U.T, np.ones(U.shape[0]))
    except np.linalg.LinAlgError:
        return None
    if not np.isfinite(c).all() or c.sum() == 0.0:
        return None
    return (c / c.sum()) @ hist[1:]
