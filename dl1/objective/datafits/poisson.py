"""Poisson datafit with the log link: ``F(z) = (1/n) sum_i s_i (exp(z_i) - y_i z_i)``.

Half the Poisson deviance up to a constant in ``y`` (glmnet's and glum's
``family="poisson"``, scikit-learn's ``PoissonRegressor``); counts ``y >= 0`` and the
mean ``mu = exp(z)``. Dual point ``theta = s (y - mu)``; the conjugate of one sample,
``loss^*(v) = m log m - m`` with ``m = y + v >= 0``, keeps every ``c theta`` with ``c`` in
``[0, 1]`` in its domain (``m = (1 - c) y + c mu``), so the gap's rescaling is safe. The
curvature ``mu`` has no bound (``beta = inf``): the working-set solver's proximal Newton
steps fit it; solvers that need a bound refuse it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import scipy.sparse as sp
from numpy.typing import ArrayLike, NDArray
from scipy.special import xlogy

from dl1.errors import ValidationError
from dl1.kernels.codes import POISSON
from dl1.objective.datafits.pointwise import ROUNDING, PointwiseLoss, Terms
from dl1.objective.datafits.quadratic import _check_finite_y


class Poisson(PointwiseLoss):
    """Poisson loss ``loss(y, z) = exp(z) - y z``, counts ``y >= 0``, mean ``exp(z)``."""

    name = "poisson"
    code = POISSON
    metrics = ("mse",)

    def __repr__(self) -> str:
        return "Poisson()"

    def terms(self, y: NDArray, z: NDArray) -> Terms:
        mu = np.exp(z)
        return mu - y * z, mu - y, mu

    def conjugate_terms(self, y: NDArray, v: NDArray) -> NDArray[np.float64]:
        m = y + v
        out = np.where(m < -ROUNDING * np.maximum(1.0, y), math.inf, 0.0)
        m = np.maximum(m, 0.0)
        return out + xlogy(m, m) - m

    @staticmethod
    def response(z: Any) -> Any:
        """The predicted mean ``exp(z)``."""
        return np.exp(z)

    def _root(self, y: NDArray, z: NDArray, s: NDArray | float) -> float:
        # the intercept's equation sum s (exp(z + b) - y) = 0 in closed form
        total = float(np.sum(s * y))
        if total <= 0.0:
            raise ValidationError(
                "poisson fit with an intercept needs a target with positive (weighted) sum; "
                "with y all 0 the optimal intercept is -inf"
            )
        top = float(z.max())  # log-sum-exp: exp(z) may overflow where exp(z - top) does not
        return math.log(total) - (top + math.log(float(np.sum(s * np.exp(z - top)))))

    def validate_y(self, y: ArrayLike) -> NDArray[np.float64]:
        """Check the counts: 1-D, finite, non-negative (naming the first bad index)."""
        y = _check_finite_y(y)
        bad = np.flatnonzero(y < 0.0)
        if bad.size:
            i = int(bad[0])
            raise ValidationError(f"loss='poisson' needs y >= 0; y[{i}] = {y[i].item()!r}")
        return y

    def sklearn_estimator(self, res: Any) -> Any:
        """scikit-learn's ``PoissonRegressor`` (L2 only: ``l1_ratio == 0``), whose
        objective is the same: half the mean deviance plus ``alpha / 2 ||w||^2``."""
        # local: scikit-learn (~1 s, ~120 MiB) only to compare with it; workers import datafits
        from sklearn.linear_model import PoissonRegressor

        if res.l1_ratio != 0.0:
            raise ValueError(
                "scikit-learn's PoissonRegressor has an L2 penalty only: no equivalent of a "
                f"Poisson fit with l1_ratio={res.l1_ratio}"
            )
        est = PoissonRegressor(alpha=res.alpha, fit_intercept=bool(res.fit_intercept),
                               tol=res.tol)  # fmt: skip
        # fitted (public API only) on one row of zeros, so that its link is set; the caller
        # sets the coefficients
        return est.fit(sp.csr_matrix((1, int(res.n_features_in_))), np.ones(1))
