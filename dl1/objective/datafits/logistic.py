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
from scipy.special import expit, xlogy

from dl1.errors import ValidationError
from dl1.objective.datafits.quadratic import balanced, optional_weights, validate_labels

_ARMIJO = 1e-4
_MAX_HALVINGS = 40
_T_ROUNDING = 1e-12


class Logistic:
    """Logistic loss ``loss(y, z) = log(1 + exp(-y z))`` with ``y`` in ``{-1, +1}``.

    All methods take length-``n`` float arrays; ``s`` are optional sample weights (None for
    unit weights), normalised by the caller to sum to ``n``
    (:func:`dl1.objective.datafits.normalize_sample_weight`).
    """

    beta: float = 0.25
    """Upper bound of ``loss''`` (Shalev-Shwartz & Tewari 2011, Eq. (7))."""
    quadratic = False

    def __repr__(self) -> str:
        return "Logistic()"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self).__name__)

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
        return validate_labels(y, "logistic")

    def value(self, y: ArrayLike, z: ArrayLike, s: ArrayLike | None = None) -> float:
        """``F(z) = (1/n) sum_i s_i log(1 + exp(-y_i z_i))``.

        Parameters
        ----------
        y, z : array_like of shape (n,)
            Labels and linear predictor ``X w + b``.
        s : array_like of shape (n,), optional
            Sample weights.

        Returns
        -------
        float
        """
        losses = np.logaddexp(0.0, -np.asarray(y, dtype=np.float64) * np.asarray(z, np.float64))
        s = optional_weights(s, losses.shape[0])
        total = losses.sum() if s is None else s @ losses
        return float(total) / losses.shape[0]

    def gradient(
        self, y: ArrayLike, z: ArrayLike, s: ArrayLike | None = None
    ) -> NDArray[np.float64]:
        """``grad F(z)``: ``g_i = -s_i y_i sigmoid(-y_i z_i) / n``.

        Parameters
        ----------
        y, z : array_like of shape (n,)
        s : array_like of shape (n,), optional

        Returns
        -------
        ndarray of float64 of shape (n,)
        """
        theta = self._theta(np.asarray(y, np.float64), np.asarray(z, np.float64), s)
        return -theta / theta.shape[0]

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

    def dual_point(
        self, y: ArrayLike, z: ArrayLike, s: ArrayLike | None = None, intercept: bool = False
    ) -> NDArray[np.float64]:
        """Dual candidate ``theta = -n grad F(z) = s * y * sigmoid(-y z)``.

        Parameters
        ----------
        y, z : array_like of shape (n,)
        s : array_like of shape (n,), optional
        intercept : bool, default=False
            If True, ``theta`` is taken at the optimal intercept shift ``z + db`` (Newton
            iterations of :meth:`intercept_update` to relative precision 1e-13), then the
            entries of the heavier label side are shrunk by a common factor so that
            ``sum_i theta_i = 0`` holds to rounding (the dual constraint of the unpenalised
            intercept). Shrinking keeps ``y_i theta_i / s_i`` in ``[0, 1]``, the domain of the
            conjugate.

        Returns
        -------
        ndarray of float64 of shape (n,)
            Not yet rescaled for L1 feasibility (:func:`dl1.objective.gap.duality_gap` does that).
        """
        y = np.asarray(y, dtype=np.float64)
        z = np.asarray(z, dtype=np.float64)
        s = optional_weights(s, y.shape[0])
        if not intercept:
            return self._theta(y, z, s)
        db = self._newton_shift(y, z, s, 50, 1e-13)
        return balanced(self._theta(y, z + db, s))

    def conjugate(self, y: ArrayLike, theta: ArrayLike, s: ArrayLike | None = None) -> float:
        """``F^*(-theta / n) = (1/n) sum_i s_i (t_i log t_i + (1 - t_i) log(1 - t_i))``.

        With ``t_i = y_i theta_i / s_i``, which must lie in ``[0, 1]`` (rounding of 1e-12 is
        clipped); the dual objective is ``D(theta) = -conjugate - penalty^*(X^T theta / n)``.

        Parameters
        ----------
        y, theta : array_like of shape (n,)
        s : array_like of shape (n,), optional
            Where ``s_i = 0``, ``theta_i`` must be 0.

        Returns
        -------
        float
            ``inf`` outside the domain.
        """
        y = np.asarray(y, dtype=np.float64)
        theta = np.asarray(theta, dtype=np.float64)
        n = theta.shape[0]
        s = optional_weights(s, n)
        if s is None:
            t = y * theta
            weight = None
        else:
            pos = s > 0
            if np.any(theta[~pos] != 0.0):
                return math.inf
            weight = s[pos]
            t = y[pos] * theta[pos] / weight
        if np.any(t < -_T_ROUNDING) or np.any(t > 1.0 + _T_ROUNDING):
            return math.inf
        t = np.clip(t, 0.0, 1.0)
        neg_entropy = xlogy(t, t) + xlogy(1.0 - t, 1.0 - t)
        total = neg_entropy.sum() if weight is None else weight @ neg_entropy
        return float(total) / n

    @staticmethod
    def _theta(
        y: NDArray[np.float64], z: NDArray[np.float64], s: ArrayLike | None
    ) -> NDArray[np.float64]:
        """``s * y * sigmoid(-y z)``."""
        theta = y * expit(-y * z)
        s = optional_weights(s, theta.shape[0])
        if s is not None:
            theta *= s
        return theta

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
                    if h_new <= h + _ARMIJO * step * grad:
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
    steps, by NumPy ufuncs into two buffers made once (a fresh length-n temporary per
    operation is page-faulted afresh on a Dask worker, ``benchmarks/RESULTS.md``)."""

    def __init__(self, y: NDArray[np.float64], z: NDArray[np.float64], s: Any) -> None:
        self.y, self.z, self.s = y, z, s
        self.sy = y if s is None else s * y
        self.m = np.empty_like(z)
        self.q = np.empty_like(z)

    def _sum(self, v: NDArray[np.float64]) -> float:
        return float(v.sum() if self.s is None else self.s @ v)

    def __call__(self, shift: float) -> tuple[float, float, float, float]:
        m, q = self.m, self.q
        np.add(self.z, shift, out=m)
        np.multiply(m, self.y, out=m)
        np.negative(m, out=m)  # m = -y (z + shift)
        np.logaddexp(0.0, m, out=q)
        value = self._sum(q) / q.shape[0]
        expit(m, out=q)  # q = sigmoid(-y (z + shift)); theta = s y q, |theta| = s q
        theta_sum, theta_abs = float(self.sy @ q), self._sum(q)
        np.subtract(1.0, q, out=m)
        np.multiply(m, q, out=m)
        return value, theta_sum, theta_abs, self._sum(m)
