"""Squared-hinge datafit ``F(z) = (1/n) sum_i s_i phi(y_i z_i)``, labels ``+-1``.

``phi(m) = max(0, 1 - m)^2`` of the margin ``m = y z`` (scikit-learn's ``LinearSVC``
default loss): smooth, ``phi'' <= 2`` (``beta = 2``), so every solver of smooth losses takes
it and gap-safe screening applies.

Dual convention (see :mod:`dl1.objective.gap`): ``theta = -n grad F(z) = s * y * c`` with
``c = -phi'(m) = 2 max(0, 1 - m) >= 0``, and ``phi^*(-c) = -c + c^2 / 4`` for ``c >= 0``
(``+inf`` for ``c < 0``), so ``F^*(-theta / n) = -(1/n) sum_i s_i (c_i - c_i^2 / 4)`` with
``c_i = y_i theta_i / s_i``.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dl1.objective.datafits.hinge import SmoothHinge
from dl1.objective.datafits.quadratic import optional_weights, validate_labels

_C_ROUNDING = 1e-12
#: Safeguarded Newton steps of the intercept's 1-D problem at most (its derivative is
#: piecewise linear: Newton is exact once inside the final piece; bisection otherwise).
_MAX_STEPS = 200


class SquaredHinge:
    """Squared hinge loss ``max(0, 1 - y z)^2`` with ``y`` in ``{-1, +1}``.

    All methods take length-``n`` float arrays; ``s`` are optional sample weights (None for
    unit weights), normalised by the caller to sum to ``n``
    (:func:`dl1.objective.datafits.normalize_sample_weight`).
    """

    beta: float = 2.0
    """Upper bound of ``phi''``."""
    quadratic = False

    def __repr__(self) -> str:
        return "SquaredHinge()"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self).__name__)

    def validate_y(self, y: ArrayLike) -> NDArray[np.float64]:
        """Labels exactly -1 or +1 (the first bad index named)."""
        return validate_labels(y, "squared_hinge")

    @staticmethod
    def _c(m: NDArray[np.float64]) -> NDArray[np.float64]:
        """``-phi'(m) = 2 max(0, 1 - m)``."""
        return 2.0 * np.maximum(0.0, 1.0 - m)

    def value(self, y: ArrayLike, z: ArrayLike, s: ArrayLike | None = None) -> float:
        """``F(z) = (1/n) sum_i s_i max(0, 1 - y_i z_i)^2``."""
        y, z = np.asarray(y, np.float64), np.asarray(z, np.float64)
        losses = np.maximum(0.0, 1.0 - y * z) ** 2
        s = optional_weights(s, losses.shape[0])
        return float(losses.sum() if s is None else s @ losses) / losses.shape[0]

    def gradient(self, y: ArrayLike, z: ArrayLike, s: ArrayLike | None = None) -> (
        NDArray[np.float64]
    ):
        """``grad F(z) = -theta / n``: ``g_i = -2 s_i y_i max(0, 1 - y_i z_i) / n``."""
        theta = self.dual_point(y, z, s)
        return -theta / theta.shape[0]

    def initial_intercept(self, y: ArrayLike, s: ArrayLike | None = None) -> float:
        """The intercept minimising ``F`` at ``w = 0`` (finite even with one label: the
        smallest intercept putting every margin at 1)."""
        y = np.asarray(y, np.float64)
        return self.intercept_update(y, np.zeros_like(y), s)

    def intercept_update(self, y: ArrayLike, z: ArrayLike, s: ArrayLike | None = None,
                         max_iter: int = 1) -> float:  # fmt: skip
        """``db`` minimising ``F(z + db)`` (``max_iter`` is ignored: the 1-D problem is solved
        to rounding by Newton steps on its piecewise-linear, nondecreasing derivative,
        safeguarded by bisection of a bracket holding every sign change)."""
        y, z = np.asarray(y, np.float64), np.asarray(z, np.float64)
        s = optional_weights(s, y.shape[0])
        sy = y if s is None else s * y
        wts = np.ones_like(y) if s is None else s

        def slope_curv(db: float) -> tuple[float, float]:  # d/db and d2/db2 of n F(z + db) / 2
            gap = 1.0 - y * (z + db)
            active = gap > 0.0
            return -float(sy[active] @ gap[active]), float(wts[active].sum())

        # at -span every +1 margin is below 1 and every -1 margin above it; at +span the
        # reverse: the bracket holds every sign change of the slope
        span = float(np.abs(z).max(initial=0.0)) + 1.0
        lo, hi = -span, span
        if slope_curv(lo)[0] >= 0.0:  # no weighted +1 label: every -1 margin at 1 or more
            return float(np.min(-1.0 - z[(y < 0) & (wts > 0)]))
        if slope_curv(hi)[0] <= 0.0:  # no weighted -1 label: every +1 margin at 1 or more
            return float(np.max(1.0 - z[(y > 0) & (wts > 0)]))
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
        return db

    #: ``theta = s * y * c(y z)``, balanced with an intercept: the margin losses' rule,
    #: written once (:meth:`SmoothHinge.dual_point`); here ``c = 2 (1 - m)_+ >= 0``.
    dual_point = SmoothHinge.dual_point

    def conjugate(self, y: ArrayLike, theta: ArrayLike, s: ArrayLike | None = None) -> float:
        """``F^*(-theta / n) = -(1/n) sum_i s_i (c_i - c_i^2 / 4)``, ``c_i = y_i theta_i /
        s_i >= 0`` (``inf`` otherwise; rounding of 1e-12 clipped)."""
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
        if np.any(c < -_C_ROUNDING):
            return math.inf
        c = np.maximum(c, 0.0)
        gain = c - 0.25 * c * c
        return -float(gain.sum() if weight is None else weight @ gain) / n
