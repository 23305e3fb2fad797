"""Huber datafit: ``F(z) = (1/n) sum_i s_i H(y_i - z_i)``, ``H(r) = r^2 / 2`` for ``|r| <=
epsilon`` and ``epsilon |r| - epsilon^2 / 2`` beyond (skglm's ``Huber``, scikit-learn's
``SGDRegressor(loss="huber")``; residuals are not rescaled, unlike ``HuberRegressor``).

Dual point ``theta = s clip(y - z, -epsilon, epsilon)``; one sample's conjugate is
``loss^*(v) = v y + v^2 / 2`` on ``|v| <= epsilon`` (``inf`` beyond), so every ``c theta``
with ``c`` in ``[0, 1]`` stays in the domain. ``loss'' <= 1``: ``beta = 1``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dl1.errors import ValidationError
from dl1.kernels.codes import HUBER
from dl1.objective.datafits.pointwise import ROUNDING, PointwiseLoss, Terms
from dl1.objective.datafits.quadratic import _check_finite_y


class Huber(PointwiseLoss):
    """Huber loss of the residual ``y - z`` with threshold ``epsilon``.

    Parameters
    ----------
    epsilon : float, default=1.35
        Residuals beyond ``epsilon`` in absolute value count linearly.
    """

    name = "huber"
    code = HUBER
    metrics = ("mse",)
    beta: float = 1.0

    def __init__(self, epsilon: float = 1.35) -> None:
        epsilon = float(epsilon)
        if not (math.isfinite(epsilon) and epsilon > 0.0):
            raise ValidationError(f"huber's epsilon must be finite and > 0, got {epsilon!r}")
        self.epsilon = epsilon

    def __repr__(self) -> str:
        return f"Huber(epsilon={self.epsilon!r})"

    def terms(self, y: NDArray, z: NDArray) -> Terms:
        eps = self.epsilon
        r = y - z
        inside = np.abs(r) <= eps
        clipped = np.clip(r, -eps, eps)
        loss = np.where(inside, 0.5 * r * r, eps * np.abs(r) - 0.5 * eps * eps)
        return loss, -clipped, inside.astype(np.float64)

    def conjugate_terms(self, y: NDArray, v: NDArray) -> NDArray[np.float64]:
        eps = self.epsilon
        out = np.where(np.abs(v) > eps * (1.0 + ROUNDING), math.inf, 0.0)
        v = np.clip(v, -eps, eps)
        return out + v * y + 0.5 * v * v

    def validate_y(self, y: ArrayLike) -> NDArray[np.float64]:
        """Check the targets: 1-D and finite (naming the first bad index)."""
        return _check_finite_y(y)

    def sklearn_estimator(self, res: Any) -> Any:
        """scikit-learn's ``SGDRegressor(loss="huber")`` with this ``epsilon`` and the
        elastic-net penalty: the same objective (``t_`` set: it is fitted)."""
        # local: scikit-learn (~1 s, ~120 MiB) only to compare with it; workers import datafits
        from sklearn.linear_model import SGDRegressor

        est = SGDRegressor(loss="huber", epsilon=self.epsilon, penalty="elasticnet",
                           alpha=res.alpha, l1_ratio=res.l1_ratio,
                           fit_intercept=bool(res.fit_intercept), tol=res.tol)  # fmt: skip
        est.t_ = 1.0
        return est
