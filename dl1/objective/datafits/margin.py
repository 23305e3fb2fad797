"""Shared part of the margin datafits ``F(z) = (1/n) sum_i s_i phi(y_i z_i)``, labels ``+-1``.

Every length-n quantity is one fused numba loop (:mod:`dl1.kernels.margins`), so that a Dask
worker computes them as fast as a plain process. A subclass names its loss by ``code`` and
``gamma`` (see :func:`dl1.kernels.margins.margin_terms`) and provides ``intercept_update``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dl1.kernels.margins import (
    NO_WEIGHTS,
    balance,
    balance_sides,
    margin_conjugate,
    margin_gap_sums,
    margin_grad_hess,
    margin_theta,
    margin_theta_sums,
    margin_value,
    margin_value_grad_hess,
)
from dl1.objective.datafits.quadratic import optional_weights


@runtime_checkable
class ShiftFromSums(Protocol):
    """A margin loss whose dual point's intercept shift starts from the sums of the pass
    that writes the dual point at ``z`` (:func:`~dl1.kernels.margins.margin_theta_sums`):
    that point is then kept when the shift is 0, one pass instead of three."""

    def _dual_shift_from(
        self, y: NDArray, z: NDArray, sw: NDArray, sums: tuple[float, float, float]
    ) -> float:
        """The shift :meth:`MarginLoss._dual_shift` finds, given the intercept's optimality
        sums at ``z``."""
        ...


def as_vector(a: ArrayLike) -> NDArray[np.float64]:
    """``a`` as a contiguous float64 array (no copy when it already is one)."""
    return np.ascontiguousarray(a, dtype=np.float64)


def kernel_weights(s: ArrayLike | None, n: int) -> NDArray[np.float64]:
    """Sample weights for a kernel: contiguous float64 of shape (n,), or empty for unit
    weights."""
    s = optional_weights(s, n)
    return NO_WEIGHTS if s is None else np.ascontiguousarray(s)


class MarginLoss:
    """Base of the margin losses: value, gradient, dual point, conjugate and the
    per-sample derivatives of the proximal Newton subproblem
    (:mod:`dl1.tasks.prox_newton`)."""

    code: int
    gamma: float = 0.0
    quadratic = False
    newton_reach: float = math.inf

    @property
    def smooth(self) -> bool:
        """Differentiable: every loss here but the hinge (``beta = inf``)."""
        return math.isfinite(self.beta)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def params(self) -> dict[str, float]:
        """None saved (a smoothed hinge's ``gamma`` is its solver's, not the model's)."""
        return {}

    @staticmethod
    def response(z: Any) -> Any:
        """Decision values ``z`` as they are (a classifier predicts their sign)."""
        return z

    def __hash__(self) -> int:
        return hash(type(self).__name__)

    def intercept_update(
        self, y: ArrayLike, z: ArrayLike, s: ArrayLike | None = None, max_iter: int = 1
    ) -> float:
        raise NotImplementedError

    def _dual_shift(self, y: NDArray, z: NDArray, s: NDArray | None) -> float:
        """The intercept shift at which the dual point of a fit with an intercept is
        taken."""
        return self.intercept_update(y, z, s)

    def value(self, y: ArrayLike, z: ArrayLike, s: ArrayLike | None = None) -> float:
        """``F(z) = (1/n) sum_i s_i phi(y_i z_i)``.

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
        y, z = as_vector(y), as_vector(z)
        sw = kernel_weights(s, y.shape[0])
        return margin_value(self.code, self.gamma, y, z, sw, NO_WEIGHTS, 0.0, 0.0) / y.shape[0]

    def value_along(
        self,
        y: NDArray,
        z: NDArray,
        u: NDArray,
        shift: float,
        t: float,
        sw: NDArray,
        g: NDArray | None = None,
        h: NDArray | None = None,
    ) -> float:
        """``n F(z + t (u + shift))`` (a line search's trial point, not formed); ``sw`` as
        :func:`kernel_weights` returns it. Given ``g`` and ``h``, also fills them as
        :meth:`grad_hess` does at the trial point, in the same pass."""
        if g is None or h is None:
            return margin_value(self.code, self.gamma, y, z, sw, u, shift, t)
        return margin_value_grad_hess(self.code, self.gamma, y, z, sw, u, shift, t, g, h)

    def grad_hess(self, y: NDArray, z: NDArray, sw: NDArray, g: NDArray, h: NDArray) -> None:
        """Fill ``g = n grad F(z)`` and ``h = n diag(hess F(z))`` (per-sample ``s_i
        phi'``-terms; ``sw`` as :func:`kernel_weights` returns it)."""
        margin_grad_hess(self.code, self.gamma, y, z, sw, g, h)

    def gradient(
        self, y: ArrayLike, z: ArrayLike, s: ArrayLike | None = None
    ) -> NDArray[np.float64]:
        """``grad F(z) = -theta / n``, ``theta = s y c`` (see :meth:`dual_point`).

        Parameters
        ----------
        y, z : array_like of shape (n,)
        s : array_like of shape (n,), optional

        Returns
        -------
        ndarray of float64 of shape (n,)
        """
        g = self.dual_point(y, z, s)
        g *= -1.0 / g.shape[0]
        return g

    def dual_point(
        self,
        y: ArrayLike,
        z: ArrayLike,
        s: ArrayLike | None = None,
        intercept: bool = False,
        out: NDArray[np.float64] | None = None,
    ) -> NDArray[np.float64]:
        """Dual candidate ``theta = -n grad F(z) = s y c(y z)``, ``c = -phi'``.

        Parameters
        ----------
        y, z : array_like of shape (n,)
        s : array_like of shape (n,), optional
        intercept : bool, default=False
            If True, ``theta`` is taken at the optimal intercept shift ``z + db``, then the
            entries of the heavier label side are shrunk by a common factor so that
            ``sum_i theta_i = 0`` holds to rounding (the dual constraint of the unpenalised
            intercept); shrinking keeps ``c`` in the conjugate's domain.
        out : ndarray of float64 of shape (n,), optional
            Where to write ``theta`` (a buffer kept by the caller), not aliasing ``z``.

        Returns
        -------
        ndarray of float64 of shape (n,)
            Not yet rescaled for L1 feasibility (:func:`dl1.objective.gap.duality_gap` does that).
        """
        y, z = as_vector(y), as_vector(z)
        if z.shape != y.shape:
            raise ValueError(f"z has shape {z.shape}, expected {y.shape}")
        s = optional_weights(s, y.shape[0])
        sw = kernel_weights(s, y.shape[0])
        theta = np.empty_like(y) if out is None else out
        if intercept and isinstance(self, ShiftFromSums):  # theta at z and its sums, one pass
            *sums, pos, neg = margin_theta_sums(self.code, self.gamma, y, z, sw, 0.0, theta)
            shift = self._dual_shift_from(y, z, sw, (sums[0], sums[1], sums[2]))
            if shift == 0.0:  # z's intercept is already optimal (a pass just updated it)
                balance_sides(theta, pos, neg)
                return theta
        else:
            shift = self._dual_shift(y, z, s) if intercept else 0.0
        margin_theta(self.code, self.gamma, y, z, sw, shift, theta)
        if intercept:
            balance(theta)
        return theta

    def value_conjugates(
        self,
        y: ArrayLike,
        z: ArrayLike,
        theta: ArrayLike,
        s: ArrayLike | None = None,
        scales: tuple[float, ...] = (1.0,),
    ) -> tuple[float, tuple[float, ...]]:
        """``F(z)`` and ``conjugate(y, c * theta, s)`` for each ``c`` of ``scales`` (one or
        two): a duality gap's datafit terms, in one pass over the samples
        (:func:`~dl1.kernels.margins.margin_gap_sums`, compensated sums)."""
        y, z, theta = as_vector(y), as_vector(z), as_vector(theta)
        if not 1 <= len(scales) <= 2:
            raise ValueError(f"one or two scales, not {len(scales)}")
        n = y.shape[0]
        sw = kernel_weights(s, n)
        two = len(scales) == 2
        value, conj, conj2 = margin_gap_sums(
            self.code, self.gamma, y, z, theta, sw, float(scales[0]),
            float(scales[-1]), two,
        )  # fmt: skip
        return value / n, (conj / n, conj2 / n)[: len(scales)]

    def conjugate(self, y: ArrayLike, theta: ArrayLike, s: ArrayLike | None = None) -> float:
        """``F^*(-theta / n) = (1/n) sum_i s_i phi^*(-c_i)``, ``c_i = y_i theta_i / s_i``.

        The dual objective is ``D(theta) = -conjugate - penalty^*(X^T theta / n)``.

        Parameters
        ----------
        y, theta : array_like of shape (n,)
        s : array_like of shape (n,), optional
            Where ``s_i = 0``, ``theta_i`` must be 0.

        Returns
        -------
        float
            ``inf`` outside the domain (rounding of 1e-12 clipped).
        """
        y, theta = as_vector(y), as_vector(theta)
        sw = kernel_weights(s, y.shape[0])
        return margin_conjugate(self.code, self.gamma, y, theta, sw) / y.shape[0]

    def conjugate_line(
        self, y: ArrayLike, theta: ArrayLike, s: ArrayLike | None = None
    ) -> Callable[[float], float]:
        """``c -> conjugate(y, c * theta, s)``: a pass over ``theta`` per scale (the
        conjugate of a margin loss is not a polynomial in ``c``), without forming ``c *
        theta``. ``theta`` is read when the function is called, not copied: it must not
        change in between."""
        y, theta = as_vector(y), as_vector(theta)
        sw = kernel_weights(s, y.shape[0])
        code, gamma, n = self.code, self.gamma, y.shape[0]
        return lambda c: margin_conjugate(code, gamma, y, theta, sw, float(c)) / n
