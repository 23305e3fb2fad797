"""The elastic net with per-feature penalty factors and a sign constraint.

``value(w) = sum_j f_j (alpha_l1 |w_j| + alpha_l2 / 2 w_j^2)``, over ``w >= 0`` when
``positive``: glmnet's ``penalty.factor`` and ``lower.limits = 0``, scikit-learn's
``positive=True``. Its conjugate, at ``v = X^T theta / n``, is the sum over features of
``f_j (e_j / f_j - alpha_l1)_+^2 / (2 alpha_l2)`` with ``e_j = |v_j|`` (``max(v_j, 0)`` when
``positive``); with ``alpha_l2 = 0`` it is the indicator of ``max_j e_j / f_j <=
alpha_l1``. So the gap needs the same two block reductions as the plain elastic net, taken
of ``e_j / f_j`` and weighted by ``f_j`` (:func:`dl1.kernels.linalg.csc_xt_theta_stats`),
and the dual point is rescaled by the same rule. A factor of 0 leaves its feature
unpenalised: its dual constraint ``x_j^T theta = 0`` has no rescaling that meets it, so the
solver minimises exactly over those features before each certificate
(:mod:`dl1.solvers.unpenalised`) and the statistics leave them out.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dl1.errors import ValidationError
from dl1.objective.penalties.elastic_net import ElasticNet, soft_threshold


def check_factors(penalty_factor: Any) -> NDArray[np.float64]:
    """``penalty_factor`` as a 1-D float64 array of finite values >= 0, naming the first
    bad entry."""
    f = np.asarray(penalty_factor, dtype=np.float64)
    if f.ndim != 1 or f.shape[0] == 0:
        raise ValidationError(f"penalty_factor must be a 1-D array of one factor per feature, "
                              f"got shape {f.shape}")  # fmt: skip
    bad = np.flatnonzero(~(np.isfinite(f) & (f >= 0.0)))
    if bad.size:
        j = int(bad[0])
        raise ValidationError(f"penalty_factor[{j}] = {f[j].item()!r}: factors must be "
                              "finite and >= 0 (0: unpenalised)")  # fmt: skip
    return np.ascontiguousarray(f)


class WeightedElasticNet(ElasticNet):
    """Elastic net with per-feature factors ``f_j >= 0`` and, optionally, ``w >= 0``.

    Parameters
    ----------
    alpha : float
    l1_ratio : float, default=1.0
    penalty_factor : array_like of shape (p,), optional
        ``f_j``; None for 1 (only the sign constraint).
    positive : bool, default=False
        Coefficients kept ``>= 0``.
    """

    def __init__(
        self,
        alpha: float,
        l1_ratio: float = 1.0,
        penalty_factor: Any = None,
        positive: bool = False,
    ) -> None:
        super().__init__(alpha, l1_ratio)
        self.penalty_factor = None if penalty_factor is None else check_factors(penalty_factor)
        self.positive = bool(positive)

    def __repr__(self) -> str:
        pf = "None" if self.penalty_factor is None else f"<{self.penalty_factor.shape[0]} factors>"
        return (f"WeightedElasticNet(alpha={self.alpha!r}, l1_ratio={self.l1_ratio!r}, "
                f"penalty_factor={pf}, positive={self.positive})")  # fmt: skip

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WeightedElasticNet):
            return NotImplemented
        same_f = (self.penalty_factor is None and other.penalty_factor is None) or (
            self.penalty_factor is not None and other.penalty_factor is not None
            and np.array_equal(self.penalty_factor, other.penalty_factor)
        )  # fmt: skip
        return same_f and (self.alpha, self.l1_ratio, self.positive) == (
            other.alpha, other.l1_ratio, other.positive)  # fmt: skip

    def __hash__(self) -> int:
        f = b"" if self.penalty_factor is None else self.penalty_factor.tobytes()
        return hash((type(self).__name__, self.alpha, self.l1_ratio, self.positive, f))

    # -- what the kernels and the solver take -----------------------------------------------
    @property
    def factors(self) -> NDArray[np.float64]:
        """The factors, or an empty array for 1."""
        return np.zeros(0) if self.penalty_factor is None else self.penalty_factor

    @property
    def uniform(self) -> bool:
        return False

    @property
    def free(self) -> NDArray[np.int64]:
        if self.penalty_factor is None:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(self.penalty_factor == 0.0)

    def check_features(self, p: int) -> None:
        if self.penalty_factor is not None and self.penalty_factor.shape[0] != p:
            raise ValidationError(f"penalty_factor has {self.penalty_factor.shape[0]} "
                                  f"factors, X has {p} features")  # fmt: skip

    def block(self, lo: int, hi: int) -> NDArray[np.float64]:
        return self.factors if self.penalty_factor is None else self.penalty_factor[lo:hi]

    def _like(self, alpha: float, factors: NDArray[np.float64] | None) -> WeightedElasticNet:
        """This penalty at ``alpha`` with ``factors`` (already checked: not again)."""
        out = WeightedElasticNet.__new__(WeightedElasticNet)
        out.alpha = ElasticNet(alpha, self.l1_ratio).alpha
        out.l1_ratio, out.positive, out.penalty_factor = self.l1_ratio, self.positive, factors
        return out

    def restricted(self, idx: ArrayLike) -> WeightedElasticNet:
        f = None if self.penalty_factor is None else self.penalty_factor[np.asarray(idx)]
        return self._like(self.alpha, f)

    def at(self, alpha: float) -> WeightedElasticNet:
        return self._like(alpha, self.penalty_factor)

    # -- the penalty -----------------------------------------------------------------------
    def _f(self, n: int) -> NDArray[np.float64] | float:
        return 1.0 if self.penalty_factor is None else self.penalty_factor[:n]

    def value(self, w: ArrayLike) -> float:
        """``sum_j f_j (alpha_l1 |w_j| + alpha_l2 / 2 w_j^2)``; ``inf`` for a negative
        coefficient under ``positive``."""
        w = np.asarray(w, dtype=np.float64)
        if self.positive and np.any(w < 0.0):
            return math.inf
        f = self._f(w.shape[0])
        return float(np.sum(f * (self.alpha_l1 * np.abs(w) + 0.5 * self.alpha_l2 * w * w)))

    def prox(self, w: ArrayLike, step: float = 1.0) -> NDArray[np.float64]:
        w = np.asarray(w, dtype=np.float64)
        f = self._f(w.shape[0])
        out = soft_threshold(w, step * self.alpha_l1 * f) / (1.0 + step * self.alpha_l2 * f)
        return np.maximum(out, 0.0) if self.positive else out

    def _dual(self, v: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64] | float]:
        """``(e_j / f_j, f_j)`` as :func:`dl1.kernels.linalg.weighted_dual` takes them: an
        unpenalised feature's ``e`` is -1, left out (its constraint ``v_j = 0`` is met by
        the point the solver certifies, :mod:`dl1.solvers.unpenalised`)."""
        v = np.asarray(v, dtype=np.float64)
        e = np.maximum(v, 0.0) if self.positive else np.abs(v)
        f = self._f(v.shape[0])
        if isinstance(f, float):
            return e / f, f
        return np.divide(e, f, out=np.full_like(e, -1.0), where=f > 0.0), f

    def conjugate(self, v: ArrayLike) -> float:
        e, f = self._dual(v)
        excess = np.maximum(e - self.alpha_l1, 0.0)
        if self.alpha_l2 > 0.0:
            return float(np.sum(f * excess * excess)) / (2.0 * self.alpha_l2)
        return 0.0 if not excess.any() else math.inf

    def xt_theta_stats(self, xt_theta: ArrayLike, n: int) -> tuple[float, float]:
        """``(max_j e_j, sum_j f_j (e_j - n alpha_l1)_+^2)`` of ``e = X^T theta`` as the
        dual norm sees it (see the module docstring)."""
        e, f = self._dual(xt_theta)
        if e.size == 0:
            return 0.0, 0.0
        excess = np.maximum(e - n * self.alpha_l1, 0.0)
        return float(e.max()), float(np.sum(f * excess * excess))
