"""Hinge and smoothed-hinge datafits ``F(z) = (1/n) sum_i s_i phi(y_i z_i)``, labels ``+-1``.

``phi`` of the margin ``m = y z`` (Shalev-Shwartz & Zhang, Prox-SDCA, Sec. 5's smoothed
hinge, ``gamma > 0``; the hinge is ``gamma = 0``)::

    phi(m) = 0                       if m >= 1
             1 - m - gamma / 2       if m <= 1 - gamma
             (1 - m)^2 / (2 gamma)   otherwise.

Dual convention (see :mod:`dl1.objective.gap`): ``theta = -n grad F(z) = s * y * c`` with
``c = -phi'(m)`` in ``[0, 1]`` (for the hinge, the subgradient ``c = 1`` where ``m <= 1``, 0
elsewhere: at the kink any value in ``[0, 1]`` is a subgradient, and taking 1 there lets the
balancing of an intercept's dual point reach the one that makes ``sum theta = 0``), and
``F^*(-theta / n) = -(1/n) sum_i s_i (c_i - gamma c_i^2 / 2)`` for ``c_i = y_i theta_i / s_i``
in ``[0, 1]`` (``+inf`` outside). Every length-n quantity is one fused loop of
:mod:`dl1.kernels.margins` (no NumPy temporaries). The hinge is not smooth (``beta =
inf``): the sample-wise solvers take it, and the smoothing solver
(:mod:`dl1.solvers.smoothing`) through smoothed hinges of decreasing ``gamma``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dl1.errors import ValidationError
from dl1.kernels.codes import HINGE, SMOOTH_HINGE
from dl1.kernels.hinge import hinge_intercept
from dl1.kernels.margins import abs_max, margin_shift_sums
from dl1.objective.datafits.base import sgd_classifier
from dl1.objective.datafits.margin import MarginLoss, as_vector, kernel_weights
from dl1.objective.datafits.quadratic import optional_weights, validate_labels

#: Safeguarded Newton steps of the intercept's 1-D problem at most (its derivative is
#: piecewise linear for ``gamma > 0``, a step function for the hinge: Newton is exact once
#: inside the final piece, bisection halves the bracket otherwise, to rounding).
_MAX_STEPS = 200


class SmoothHinge(MarginLoss):
    """Smoothed hinge loss (``gamma`` > 0; ``beta = 1 / gamma``), labels in ``{-1, +1}``.

    Parameters
    ----------
    gamma : float, default=1.0
        Width of the quadratic part near the margin; the loss lies between the hinge minus
        ``gamma / 2`` and the hinge.
    """

    name = "smooth_hinge"
    code = SMOOTH_HINGE
    classifies = True
    log_odds = False
    metrics = ("accuracy",)
    row_steps = True

    def __init__(self, gamma: float = 1.0) -> None:
        gamma = float(gamma)
        if not gamma >= 0.0 or math.isinf(gamma):
            raise ValidationError(f"gamma = {gamma!r}: the smoothing must be finite and >= 0")
        self.gamma = gamma
        self.beta = math.inf if gamma == 0.0 else 1.0 / gamma

    def __repr__(self) -> str:
        return f"{type(self).__name__}(gamma={self.gamma!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.gamma == self.gamma

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.gamma))

    def validate_y(self, y: ArrayLike) -> NDArray[np.float64]:
        """Labels exactly -1 or +1 (the first bad index named)."""
        return validate_labels(y, self.name)

    def sklearn_estimator(self, res: Any) -> Any:
        """scikit-learn's ``SGDClassifier(loss="hinge")``: the hinge's objective, and for a
        smoothed hinge (which scikit-learn lacks) its predictions but not its objective."""
        return sgd_classifier("hinge", res)

    def _phi(self, m: NDArray[np.float64]) -> NDArray[np.float64]:
        """``phi(m)`` by its definition in NumPy (the tests' reference)."""
        g = self.gamma
        if g == 0.0:
            return np.maximum(0.0, 1.0 - m)
        return np.where(
            m >= 1.0, 0.0, np.where(m <= 1.0 - g, 1.0 - m - 0.5 * g, (1.0 - m) ** 2 / (2 * g))
        )

    def initial_intercept(self, y: ArrayLike, s: ArrayLike | None = None) -> float:
        """The intercept minimising ``F`` at ``w = 0``."""
        y = as_vector(y)
        return self.intercept_update(y, np.zeros_like(y), s)

    def intercept_update(self, y: ArrayLike, z: ArrayLike, s: ArrayLike | None = None,
                         max_iter: int = 1) -> float:  # fmt: skip
        """``db`` minimising ``F(z + db)`` (``max_iter`` is ignored: the 1-D convex problem
        is solved to rounding by Newton steps on its nondecreasing derivative, safeguarded by
        bisection of a bracket that holds every sign change)."""
        y, z = as_vector(y), as_vector(z)
        sw = kernel_weights(optional_weights(s, y.shape[0]), y.shape[0])

        def slope_curv(db: float) -> tuple[float, float]:  # d/db, d2/db2 of n F(z + db)
            _, theta_sum, _, curv = margin_shift_sums(SMOOTH_HINGE, self.gamma, y, z, sw, db)
            return -theta_sum, curv

        # every margin y (z + db) crosses [1 - gamma, 1] inside this bracket
        span = float(abs_max(z)) + 1.0 + self.gamma
        lo, hi = -span, span
        if slope_curv(lo)[0] >= 0.0:
            return lo
        if slope_curv(hi)[0] <= 0.0:
            return hi
        db = 0.0
        for _ in range(_MAX_STEPS):
            g, h = slope_curv(db)
            if g == 0.0:
                return db
            if g < 0.0:
                lo = db
            else:
                hi = db
            step = db - g / h if h > 0.0 else math.nan
            nxt = step if lo < step < hi else 0.5 * (lo + hi)
            if nxt in (lo, hi, db):
                break
            db = nxt
        # the bracket is down to rounding: its middle, which puts the margins at a kink of
        # the hinge at 1 (c = 1 there: the subgradient the dual point's balancing needs)
        return 0.5 * (lo + hi)


class Hinge(SmoothHinge):
    """Hinge loss ``max(0, 1 - y z)`` (the smoothed hinge with ``gamma = 0``): not smooth,
    for the sample-wise solvers (SGD, FoBoS, RDA, SMIDAS, Prox-SDCA) and the smoothing
    solver."""

    name = "hinge"
    code = HINGE  # the margin kernels' smoothed hinge at gamma = 0

    def __init__(self) -> None:
        super().__init__(0.0)

    def __repr__(self) -> str:
        return "Hinge()"

    def intercept_update(self, y: ArrayLike, z: ArrayLike, s: ArrayLike | None = None,
                         max_iter: int = 1) -> float:  # fmt: skip
        """``db`` minimising ``F(z + db)``: the weighted quantile of the breakpoints at which
        the slope reaches 0, exactly (:func:`dl1.kernels.hinge.hinge_intercept`;
        ``max_iter`` is ignored)."""
        y, z = as_vector(y), as_vector(z)
        return float(hinge_intercept(y, z, kernel_weights(optional_weights(s, y.shape[0]),
                                                          y.shape[0])))  # fmt: skip
