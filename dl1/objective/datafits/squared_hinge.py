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
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dl1.kernels.codes import SQUARED_HINGE
from dl1.kernels.margins import abs_max, margin_slope_sums
from dl1.objective.datafits.base import sgd_classifier
from dl1.objective.datafits.margin import MarginLoss, as_vector, kernel_weights
from dl1.objective.datafits.quadratic import optional_weights, validate_labels

#: Safeguarded Newton steps of the intercept's 1-D problem at most (its derivative is
#: piecewise linear: Newton is exact once inside the final piece; bisection otherwise).
_MAX_STEPS = 200


class SquaredHinge(MarginLoss):
    """Squared hinge loss ``max(0, 1 - y z)^2`` with ``y`` in ``{-1, +1}``.

    All methods take length-``n`` float arrays; ``s`` are optional sample weights (None for
    unit weights), normalised by the caller to sum to ``n``
    (:func:`dl1.objective.datafits.normalize_sample_weight`).
    """

    name = "squared_hinge"
    code = SQUARED_HINGE
    classifies = True
    log_odds = False
    metrics = ("accuracy",)
    row_steps = False
    beta: float = 2.0
    """Upper bound of ``phi''``."""

    def __repr__(self) -> str:
        return "SquaredHinge()"

    def sklearn_estimator(self, res: Any) -> Any:
        """scikit-learn's ``SGDClassifier(loss="squared_hinge")``, same elastic net: the same
        objective."""
        return sgd_classifier("squared_hinge", res)

    def validate_y(self, y: ArrayLike) -> NDArray[np.float64]:
        """Labels exactly -1 or +1 (the first bad index named)."""
        return validate_labels(y, self.name)

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
        y, z = as_vector(y), as_vector(z)
        s = optional_weights(s, y.shape[0])
        sw = kernel_weights(s, y.shape[0])

        def slope_curv(db: float) -> tuple[float, float]:  # d/db and d2/db2 of n F(z + db) / 2
            theta_sum, _, curv = margin_slope_sums(SQUARED_HINGE, 0.0, y, z, sw, db)
            return -0.5 * theta_sum, 0.5 * curv

        # at -span every +1 margin is below 1 and every -1 margin above it; at +span the
        # reverse: the bracket holds every sign change of the slope
        span = float(abs_max(z)) + 1.0
        lo, hi = -span, span
        if slope_curv(lo)[0] >= 0.0:  # no weighted +1 label: every -1 margin at 1 or more
            return float(np.min(-1.0 - z[(y < 0) & _weighted(s, y)]))
        if slope_curv(hi)[0] <= 0.0:  # no weighted -1 label: every +1 margin at 1 or more
            return float(np.max(1.0 - z[(y > 0) & _weighted(s, y)]))
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


def _weighted(s: NDArray[np.float64] | None, y: NDArray[np.float64]) -> NDArray[np.bool_]:
    """The rows with a positive weight."""
    return np.ones(y.shape, bool) if s is None else s > 0
