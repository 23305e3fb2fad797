"""Logistic datafit ``F(z) = (1/n) sum_i s_i log(1 + exp(-y_i z_i))``, labels ``y_i = +-1``.

Dual convention (see :mod:`dl1.objective.gap`):
``theta = -n grad F(z) = s * y * sigmoid(-y z)``, and the
datafit part of the dual objective is ``-conjugate(y, theta, s)`` with
``conjugate(y, theta, s) = F^*(-theta / n)``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dl1.errors import ValidationError
from dl1.kernels.codes import LOGISTIC
from dl1.kernels.margins import (
    intercept_root,
    intercept_root_from,
    margin_shift_sums,
)
from dl1.objective.datafits.margin import MarginLoss, as_vector, kernel_weights
from dl1.objective.datafits.quadratic import optional_weights, validate_labels

_ARMIJO = 1e-4
_MAX_HALVINGS = 40
#: Relative change of ``F`` below its rounding (a sum of n terms): not evidence against a
#: Newton step. Near the optimum the decrease ``~grad^2 / hess`` is below it, and an Armijo
#: test on rounding noise would pass at a random tiny step instead of the Newton step.
_VALUE_ROUNDING = 1e-12


class Logistic(MarginLoss):
    """Logistic loss ``loss(y, z) = log(1 + exp(-y z))`` with ``y`` in ``{-1, +1}``.

    All methods take length-``n`` float arrays; ``s`` are optional sample weights (None for
    unit weights), normalised by the caller to sum to ``n``
    (:func:`dl1.objective.datafits.normalize_sample_weight`).
    """

    name = "logistic"
    code = LOGISTIC
    classifies = True
    log_odds = True
    metrics = ("logloss", "accuracy")
    row_steps = True
    beta: float = 0.25
    """Upper bound of ``loss''`` (Shalev-Shwartz & Tewari 2011, Eq. (7))."""
    newton_reach: float = 4.0
    """Within a margin change of 4, ``loss''`` changes by at most ``e^4`` (``|loss'''| <=
    loss''``): the trust region's first radius (:mod:`dl1.tasks.trust`)."""

    def __repr__(self) -> str:
        return "Logistic()"

    def sklearn_estimator(self, res: Any) -> Any:
        """scikit-learn's ``LogisticRegression`` with ``C = 1 / (n_samples * alpha)``,
        ``l1_ratio`` and ``solver="saga"``: the same objective without sample weights (with
        weights ``w``, dl1's is ``C = 1 / (alpha * sum(w))``)."""
        # local: scikit-learn (~1 s, ~120 MiB) only to compare with it; workers import datafits
        from sklearn.linear_model import LogisticRegression

        if not res.n_samples_ or res.alpha <= 0:
            raise ValueError("the logistic model needs n_samples_ and alpha > 0 for C")
        return LogisticRegression(C=1.0 / (res.n_samples_ * res.alpha), l1_ratio=res.l1_ratio,
                                  solver="saga", fit_intercept=bool(res.fit_intercept),
                                  tol=res.tol)  # fmt: skip

    def validate_y(self, y: ArrayLike) -> NDArray[np.float64]:
        """Check that the labels are exactly -1 or +1.

        Parameters
        ----------
        y : array_like of shape (n,)

        Returns
        -------
        ndarray of float64

        Raises
        ------
        ValidationError
            ``y`` is not 1-D or has a label other than -1/+1 (naming the first bad index).
        """
        return validate_labels(y, self.name)

    def initial_intercept(self, y: ArrayLike, s: ArrayLike | None = None) -> float:
        """Optimal intercept at ``w = 0``: the log-odds ``log(p / (1 - p))``.

        Parameters
        ----------
        y : array_like of shape (n,)
        s : array_like of shape (n,), optional

        Returns
        -------
        float
            With ``p`` the (weighted) fraction of ``+1`` labels.

        Raises
        ------
        ValidationError
            Only one class has positive weight (the optimal intercept is infinite).
        """
        y = np.asarray(y, dtype=np.float64)
        s = optional_weights(s, y.shape[0])
        pos = y > 0
        if s is None:
            n_pos, n_neg = float(pos.sum()), float((~pos).sum())
        else:
            n_pos, n_neg = float(s[pos].sum()), float(s[~pos].sum())
        if n_pos <= 0.0 or n_neg <= 0.0:
            raise ValidationError(
                "logistic fit with an intercept needs both labels -1 and +1 with positive "
                "weight; the optimal intercept is infinite"
            )
        return math.log(n_pos / n_neg)

    def intercept_update(
        self, y: ArrayLike, z: ArrayLike, s: ArrayLike | None = None, max_iter: int = 1
    ) -> float:
        """Safeguarded Newton steps on the intercept: ``db`` decreasing ``F(z + db)``.

        Each step is the Newton step ``-h'(db) / h''(db)`` of ``h(db) = F(z + db)``, halved
        until the Armijo condition holds; if that fails (flat curvature), the majorisation step
        ``-h'(db) / (beta sum(s) / n)``, which always decreases ``h`` since
        ``h'' <= beta sum(s) / n``, is taken instead.

        Parameters
        ----------
        y, z : array_like of shape (n,)
            ``z`` includes the current intercept.
        s : array_like of shape (n,), optional
        max_iter : int, default=1
            Number of steps; stops earlier once ``|sum_i theta_i| <= 1e-13 sum_i |theta_i|``.

        Returns
        -------
        float
            ``db``; the new intercept is ``b + db``.
        """
        y = np.asarray(y, dtype=np.float64)
        z = np.asarray(z, dtype=np.float64)
        return self._newton_shift(y, z, optional_weights(s, y.shape[0]), max_iter, 1e-13)

    def _dual_shift(self, y: NDArray, z: NDArray, s: NDArray | None) -> float:
        """The optimal intercept shift to relative precision 1e-13 (bracketed Newton on the
        derivative, :func:`dl1.kernels.margins.intercept_root`: no loss values needed)."""
        sw = kernel_weights(s, y.shape[0])
        return intercept_root(LOGISTIC, 0.0, as_vector(y), as_vector(z), sw, self.beta, 1e-13, 50)

    def _dual_shift_from(
        self, y: NDArray, z: NDArray, sw: NDArray, sums: tuple[float, float, float]
    ) -> float:
        """:meth:`_dual_shift` from its first sums (:class:`~.margin.ShiftFromSums`): the
        pass that wrote the dual point at ``z`` is its first step, and the point is kept when
        the shift is 0 (the coordinator's passes update the intercept just before)."""
        return intercept_root_from(LOGISTIC, 0.0, y, z, sw, self.beta, 1e-13, 50, *sums)

    def _newton_shift(
        self,
        y: NDArray[np.float64],
        z: NDArray[np.float64],
        s: NDArray[np.float64] | None,
        max_iter: int,
        rtol: float,
    ) -> float:
        """Safeguarded Newton iterations on ``h(db) = F(z + db)``; see :meth:`intercept_update`."""
        n = y.shape[0]
        s_sum = float(n if s is None else s.sum())
        db = 0.0
        at = _ShiftSums(y, z, s)
        h, theta_sum, theta_abs, curv_sum = at(db)
        for _ in range(max_iter):
            if abs(theta_sum) <= rtol * theta_abs:
                break
            grad = -theta_sum / n
            hess = curv_sum / n
            accepted = False
            if hess > 0.0:
                step = -grad / hess
                for _ in range(_MAX_HALVINGS):
                    h_new, theta_sum, theta_abs, curv_sum = at(db + step)
                    if h_new <= h + _ARMIJO * step * grad + _VALUE_ROUNDING * abs(h):
                        accepted = True
                        break
                    step *= 0.5
            if not accepted:
                step = -grad / (self.beta * s_sum / n)
                h_new, theta_sum, theta_abs, curv_sum = at(db + step)
            db += step
            h = h_new
        return db


class _ShiftSums:
    """At ``z + shift``: ``(F, sum theta, sum |theta|, n F'')`` of the intercept's Newton
    steps, one fused pass (:func:`dl1.kernels.margins.margin_shift_sums`)."""

    def __init__(self, y: NDArray[np.float64], z: NDArray[np.float64], s: Any) -> None:
        self.y, self.z = as_vector(y), as_vector(z)
        self.sw = kernel_weights(s, self.y.shape[0])

    def __call__(self, shift: float) -> tuple[float, float, float, float]:
        value, theta_sum, theta_abs, curv = margin_shift_sums(
            LOGISTIC, 0.0, self.y, self.z, self.sw, shift
        )
        return value / self.y.shape[0], theta_sum, theta_abs, curv
