"""The grouped elastic net of a ``(p, K)`` coefficient matrix: glmnet's
``type.multinomial = "grouped"``.

``alpha (l1_ratio sum_j ||w_j||_2 + (1 - l1_ratio) / 2 ||W||_F^2)`` with ``w_j`` the ``K``
coefficients of feature ``j`` (a row of ``W``): a feature is in the model for every class or
for none. Its dual norm is ``max_j ||v_j||_2``, so the statistics of ``X^T Theta`` the
duality gap needs are its largest row norm and ``sum_j (||v_j||_2 - n alpha_l1)_+^2``; the
same methods as :class:`~dl1.objective.penalties.elastic_net.ElasticNet` (whose entries are
its own groups) let :mod:`dl1.objective.gap` certify both.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dl1.errors import ValidationError


class GroupElasticNet:
    """The grouped (row-wise l1/l2) elastic net; plain and picklable.

    Parameters
    ----------
    alpha : float
        Overall strength, ``>= 0``.
    l1_ratio : float, default=1.0
        Share of the group-lasso part, in ``[0, 1]``.
    """

    grouped = True

    def __init__(self, alpha: float, l1_ratio: float = 1.0) -> None:
        alpha, l1_ratio = float(alpha), float(l1_ratio)
        if not (math.isfinite(alpha) and alpha >= 0.0):
            raise ValidationError(f"alpha must be finite and >= 0, got {alpha!r}")
        if not 0.0 <= l1_ratio <= 1.0:
            raise ValidationError(f"l1_ratio must be in [0, 1], got {l1_ratio!r}")
        self.alpha, self.l1_ratio = alpha, l1_ratio

    def __repr__(self) -> str:
        return f"GroupElasticNet(alpha={self.alpha!r}, l1_ratio={self.l1_ratio!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.alpha, self.l1_ratio))

    def at(self, alpha: float) -> GroupElasticNet:
        """The same penalty at another ``alpha``."""
        return GroupElasticNet(alpha, self.l1_ratio)

    @property
    def alpha_l1(self) -> float:
        """Weight of ``sum_j ||w_j||_2``."""
        return self.alpha * self.l1_ratio

    @property
    def alpha_l2(self) -> float:
        """Weight of ``||W||_F^2 / 2``."""
        return self.alpha * (1.0 - self.l1_ratio)

    def value(self, W: ArrayLike) -> float:
        """The penalty at ``W`` (shape ``(p, K)``)."""
        W = np.asarray(W, dtype=np.float64)
        return float(self.alpha_l1 * np.linalg.norm(W, axis=1).sum()
                     + 0.5 * self.alpha_l2 * (W * W).sum())  # fmt: skip

    def group_norms(self, V: NDArray[np.float64]) -> NDArray[np.float64]:
        """The dual norm's groups: each row's Euclidean norm."""
        return np.sqrt((V * V).sum(axis=1))

    def xt_theta_stats(self, V: ArrayLike, n: int) -> tuple[float, float]:
        """``(max_j ||v_j||_2, sum_j (||v_j||_2 - n alpha_l1)_+^2)`` of ``V = X^T Theta``."""
        norms = self.group_norms(np.asarray(V, dtype=np.float64))
        if norms.size == 0:
            return 0.0, 0.0
        excess = np.maximum(norms - n * self.alpha_l1, 0.0)
        return float(norms.max()), float(excess @ excess)

    def dual_feasible_scale(self, absmax: float, n: int) -> float:
        """The largest ``c <= 1`` with ``c max_j ||v_j||_2 <= n alpha_l1``."""
        limit = n * self.alpha_l1
        return 1.0 if absmax <= limit else limit / absmax

    def conjugate_from_stats(self, excess_sq: float, n: int) -> float:
        """The conjugate at ``X^T Theta / n``: ``excess / (2 n^2 alpha_l2)`` (``inf`` for a
        pure group lasso with any excess)."""
        if self.alpha_l2 > 0.0:
            return excess_sq / (2.0 * n * n * self.alpha_l2)
        return 0.0 if excess_sq == 0.0 else math.inf

    def prox_rows(self, U: NDArray[np.float64], step: float) -> NDArray[np.float64]:
        """The proximal operator of ``step * value`` (row-wise block soft-thresholding)."""
        norms = self.group_norms(U)
        shrink = np.maximum(1.0 - step * self.alpha_l1 / np.where(norms > 0, norms, 1.0), 0.0)
        return U * (shrink / (1.0 + step * self.alpha_l2))[:, None]
