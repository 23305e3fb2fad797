"""Hinge and smoothed-hinge datafits ``F(z) = (1/n) sum_i s_i phi(y_i z_i)``, labels ``+-1``.

``phi`` of the margin ``m = y z`` (Shalev-Shwartz & Zhang, Prox-SDCA, Sec. 5's smoothed
hinge, ``gamma > 0``; the hinge is ``gamma = 0``)::

    phi(m) = 0                       if m >= 1
             1 - m - gamma / 2       if m <= 1 - gamma
             (1 - m)^2 / (2 gamma)   otherwise.

Dual convention (see :mod:`dl1.objective.gap`): ``theta = -n grad F(z) = s * y * c`` with
``c = -phi'(m)`` in ``[0, 1]`` (for the hinge, the subgradient ``c = 1`` where ``m <= 1``, 0
elsewhere), and ``F^*(-theta / n) = -(1/n) sum_i s_i (c_i - gamma c_i^2 / 2)`` for
``c_i = y_i theta_i / s_i`` in ``[0, 1]`` (``+inf`` outside). The hinge is not smooth
(``beta = inf``): only the sample-wise solvers take it.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dl1.objective.datafits.quadratic import balanced, optional_weights, validate_labels

_C_ROUNDING = 1e-12
#: Bisection steps of the intercept's 1-D problem (bracket halved each time: 2^-200).
_BISECTIONS = 200


class SmoothHinge:
    """Smoothed hinge loss (``gamma`` > 0; ``beta = 1 / gamma``), labels in ``{-1, +1}``.

    Parameters
    ----------
    gamma : float, default=1.0
        Width of the quadratic part near the margin.
    """

    quadratic = False

    def __init__(self, gamma: float = 1.0) -> None:
        self.gamma = float(gamma)
        self.beta = math.inf if self.gamma == 0.0 else 1.0 / self.gamma

    def __repr__(self) -> str:
        return f"{type(self).__name__}(gamma={self.gamma!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.gamma == self.gamma

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.gamma))

    def validate_y(self, y: ArrayLike) -> NDArray[np.float64]:
        """Labels exactly -1 or +1 (the first bad index named)."""
        return validate_labels(y, "hinge")

    def _phi(self, m: NDArray[np.float64]) -> NDArray[np.float64]:
        g = self.gamma
        if g == 0.0:
            return np.maximum(0.0, 1.0 - m)
        return np.where(m >= 1.0, 0.0,
                        np.where(m <= 1.0 - g, 1.0 - m - 0.5 * g, (1.0 - m) ** 2 / (2 * g)))

    def _c(self, m: NDArray[np.float64]) -> NDArray[np.float64]:
        """``-phi'(m)`` in ``[0, 1]``; for the hinge the subgradient 1 where ``m <= 1``: at
        the kink any value in ``[0, 1]`` is a subgradient, and taking 1 there lets
        :func:`balanced` reach the one that makes ``sum theta = 0``."""
        if self.gamma == 0.0:
            return (m <= 1.0).astype(np.float64)
        return np.clip((1.0 - m) / self.gamma, 0.0, 1.0)

    def value(self, y: ArrayLike, z: ArrayLike, s: ArrayLike | None = None) -> float:
        """``F(z)``."""
        y, z = np.asarray(y, np.float64), np.asarray(z, np.float64)
        losses = self._phi(y * z)
        s = optional_weights(s, losses.shape[0])
        return float(losses.sum() if s is None else s @ losses) / losses.shape[0]

    def gradient(self, y: ArrayLike, z: ArrayLike, s: ArrayLike | None = None) -> (
        NDArray[np.float64]
    ):
        """``grad F(z) = -theta / n`` (a subgradient for the hinge)."""
        theta = self.dual_point(y, z, s)
        return -theta / theta.shape[0]

    def initial_intercept(self, y: ArrayLike, s: ArrayLike | None = None) -> float:
        """The intercept minimising ``F`` at ``w = 0``."""
        y = np.asarray(y, np.float64)
        return self.intercept_update(y, np.zeros_like(y), s)

    def intercept_update(self, y: ArrayLike, z: ArrayLike, s: ArrayLike | None = None,
                         max_iter: int = 1) -> float:  # fmt: skip
        """``db`` minimising ``F(z + db)`` (``max_iter`` is ignored: the 1-D convex problem
        is solved by bisection on its nondecreasing (sub)derivative, to 2^-200 of a
        bracket that holds every sign change)."""
        y, z = np.asarray(y, np.float64), np.asarray(z, np.float64)
        s = optional_weights(s, y.shape[0])
        wts = np.ones_like(y) if s is None else s

        def slope(db: float) -> float:  # d/db of n F(z + db), nondecreasing
            return float(-(wts * y * self._c(y * (z + db))).sum())

        # every margin y (z + db) crosses [1 - gamma, 1] inside this bracket
        span = float(np.abs(z).max(initial=0.0)) + 1.0 + self.gamma
        lo, hi = -span, span
        if slope(lo) >= 0.0:
            return lo
        if slope(hi) <= 0.0:
            return hi
        for _ in range(_BISECTIONS):
            mid = 0.5 * (lo + hi)
            if mid in (lo, hi):
                break
            if slope(mid) < 0.0:
                lo = mid
            else:
                hi = mid
        return 0.5 * (lo + hi)

    def dual_point(self, y: ArrayLike, z: ArrayLike, s: ArrayLike | None = None,
                   intercept: bool = False) -> NDArray[np.float64]:  # fmt: skip
        """``theta = s * y * c(y z)``; with ``intercept``, at the refitted intercept and with
        the heavier label side shrunk so that ``sum_i theta_i = 0`` (``c`` stays in
        ``[0, 1]``)."""
        y, z = np.asarray(y, np.float64), np.asarray(z, np.float64)
        s = optional_weights(s, y.shape[0])
        if intercept:
            z = z + self.intercept_update(y, z, s)
        theta = y * self._c(y * z)
        if s is not None:
            theta = theta * s
        if intercept:
            theta = balanced(theta)
        return theta

    def conjugate(self, y: ArrayLike, theta: ArrayLike, s: ArrayLike | None = None) -> float:
        """``F^*(-theta / n) = -(1/n) sum_i s_i (c_i - gamma c_i^2 / 2)``, ``c_i = y_i theta_i
        / s_i`` in ``[0, 1]`` (``inf`` outside; rounding of 1e-12 clipped)."""
        y, theta = np.asarray(y, np.float64), np.asarray(theta, np.float64)
        n = theta.shape[0]
        s = optional_weights(s, n)
        if s is None:
            c, weight = y * theta, None
        else:
            pos = s > 0
            if np.any(theta[~pos] != 0.0):
                return math.inf
            weight = s[pos]
            c = y[pos] * theta[pos] / weight
        if np.any(c < -_C_ROUNDING) or np.any(c > 1.0 + _C_ROUNDING):
            return math.inf
        c = np.clip(c, 0.0, 1.0)
        gain = c - 0.5 * self.gamma * c * c
        return -float(gain.sum() if weight is None else weight @ gain) / n


class Hinge(SmoothHinge):
    """Hinge loss ``max(0, 1 - y z)`` (the smoothed hinge with ``gamma = 0``): not smooth,
    for the sample-wise solvers (SGD, FoBoS, RDA, SMIDAS, Prox-SDCA)."""

    def __init__(self) -> None:
        super().__init__(0.0)

    def __repr__(self) -> str:
        return "Hinge()"
