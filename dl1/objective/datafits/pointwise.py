"""The datafit methods of a smooth loss ``loss(y, z)`` from its per-sample terms.

A loss that is neither the squared loss nor a margin loss (Poisson, Huber) states three
things in its own module: its terms ``(loss, loss', loss'')`` in ``z``, the per-sample
conjugate ``loss^*(v) = sup_z v z - loss(y, z)`` (``inf`` outside its domain), and what it
declares as every datafit does (:class:`~dl1.objective.datafits.base.Datafit`). This base
derives the rest in NumPy: value, gradient, the dual point (at the optimal intercept shift,
balanced), the conjugate ``F^*(-theta / n) = (1/n) sum_i s_i loss_i^*(-theta_i / s_i)``
(see :mod:`dl1.objective.gap`), and the per-sample derivatives proximal Newton needs
(:mod:`dl1.tasks.prox_newton`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dl1.errors import ValidationError
from dl1.objective.datafits.quadratic import balanced, optional_weights

#: The intercept's root is found to this relative precision of ``sum_i s_i |loss'_i|``.
ROOT_RTOL = 1e-13
#: Newton / bisection steps at most of the intercept's root (each halves a bracket at
#: worst; 200 halvings reach any float64 from any other).
ROOT_MAX_ITER = 200
#: Rounding tolerated outside a conjugate's domain (relative), clipped.
ROUNDING = 1e-12

Terms = tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]


def weights_or_ones(sw: NDArray[np.float64], n: int) -> NDArray[np.float64] | float:
    """A kernel's weights (empty for unit weights) as an array or the scalar 1."""
    return 1.0 if sw.shape[0] == 0 else sw


class PointwiseLoss:
    """Base of the smooth losses given by their per-sample terms (see the module
    docstring). Subclasses set the declarations of
    :class:`~dl1.objective.datafits.base.Datafit` and define :meth:`terms`,
    :meth:`conjugate_terms` and :meth:`validate_y`."""

    classifies: ClassVar[bool] = False
    log_odds: ClassVar[bool] = False
    row_steps: ClassVar[bool] = False
    smooth: ClassVar[bool] = True
    quadratic = False
    beta: float = math.inf
    newton_reach: float = math.inf

    # -- what a loss defines ---------------------------------------------------------------
    def terms(self, y: NDArray, z: NDArray) -> Terms:
        """``(loss(y, z), d/dz loss, d^2/dz^2 loss)`` per sample."""
        raise NotImplementedError

    def conjugate_terms(self, y: NDArray, v: NDArray) -> NDArray[np.float64]:
        """``loss_i^*(v_i)`` per sample, ``inf`` outside the domain."""
        raise NotImplementedError

    @staticmethod
    def response(z: Any) -> Any:
        """The prediction at decision values ``z`` (the inverse link): ``z`` itself."""
        return z

    def params(self) -> dict[str, float]:
        """The loss's own parameters, as its constructor takes them."""
        return dict(vars(self))

    # -- derived ---------------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple(sorted(vars(self).items()))))

    def value(self, y: ArrayLike, z: ArrayLike, s: ArrayLike | None = None) -> float:
        """``F(z) = (1/n) sum_i s_i loss(y_i, z_i)``."""
        y, z = _vec(y), _vec(z)
        loss = self.terms(y, z)[0]
        s = optional_weights(s, y.shape[0])
        return float(loss.sum() if s is None else s @ loss) / y.shape[0]

    def gradient(
        self, y: ArrayLike, z: ArrayLike, s: ArrayLike | None = None
    ) -> NDArray[np.float64]:
        """``grad F(z)``: ``s_i loss'(y_i, z_i) / n``."""
        y, z = _vec(y), _vec(z)
        g = self.terms(y, z)[1]
        s = optional_weights(s, y.shape[0])
        return (g if s is None else s * g) / y.shape[0]

    def grad_hess(self, y: NDArray, z: NDArray, sw: NDArray, g: NDArray, h: NDArray) -> None:
        """Fill ``g = n grad F(z)`` and ``h = n diag(hess F(z))`` (``sw`` empty for unit
        weights)."""
        _, d1, d2 = self.terms(_vec(y), _vec(z))
        s = weights_or_ones(sw, y.shape[0])
        np.multiply(s, d1, out=g)
        np.multiply(s, d2, out=h)

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
        """``n F(z + t (u + shift))`` (``u`` empty for ``t shift``); given ``g`` and ``h``,
        also fills them at that point as :meth:`grad_hess` does."""
        zt = z + t * shift if u.shape[0] == 0 else z + t * (u + shift)
        loss, d1, d2 = self.terms(_vec(y), zt)
        s = weights_or_ones(sw, y.shape[0])
        if g is not None and h is not None:
            np.multiply(s, d1, out=g)
            np.multiply(s, d2, out=h)
        return float(np.sum(s * loss))

    def intercept_update(
        self, y: ArrayLike, z: ArrayLike, s: ArrayLike | None = None, max_iter: int = 1
    ) -> float:
        """The intercept step minimising ``F(z + db)``: the root of ``sum_i s_i loss'(z_i +
        db)``, increasing in ``db`` (a convex loss), by Newton steps kept inside a bracket
        and bisection where Newton leaves it (``max_iter`` is ignored: the root is found to
        :data:`ROOT_RTOL`)."""
        y, z = _vec(y), _vec(z)
        s = optional_weights(s, y.shape[0])
        return self._root(y, z, 1.0 if s is None else s)

    def _root(self, y: NDArray, z: NDArray, s: NDArray | float) -> float:
        lo, hi, b = -math.inf, math.inf, 0.0
        for _ in range(ROOT_MAX_ITER):
            _, d1, d2 = self.terms(y, z + b)
            f, fp, scale = (
                float(np.sum(s * d1)),
                float(np.sum(s * d2)),
                float(np.sum(s * np.abs(d1))),
            )
            if not math.isfinite(f):
                raise ValidationError(f"{self.name}: the intercept's equation is not finite")
            if abs(f) <= ROOT_RTOL * scale:
                return b
            if f > 0.0:
                hi = b
            else:
                lo = b
            step = -f / fp if fp > 0.0 else math.nan
            nxt = b + step
            if not lo < nxt < hi:  # Newton left the bracket, or no curvature
                if math.isfinite(lo) and math.isfinite(hi):
                    nxt = 0.5 * (lo + hi)
                else:  # expand towards the root
                    nxt = b + math.copysign(2.0 * max(1.0, abs(b)), -f)
            if nxt == b:  # the bracket is a float apart
                return b
            b = nxt
        return b

    def initial_intercept(self, y: ArrayLike, s: ArrayLike | None = None) -> float:
        """The optimal intercept at ``w = 0``."""
        y = _vec(y)
        return self.intercept_update(y, np.zeros_like(y), s)

    def dual_point(
        self, y: ArrayLike, z: ArrayLike, s: ArrayLike | None = None, intercept: bool = False
    ) -> NDArray[np.float64]:
        """``theta = -n grad F`` at ``z`` (at the optimal intercept shift ``z + db`` with an
        intercept, then balanced to ``sum_i theta_i = 0``; shrinking keeps it in the
        conjugate's domain)."""
        y, z = _vec(y), _vec(z)
        if z.shape != y.shape:
            raise ValueError(f"z has shape {z.shape}, expected {y.shape}")
        s = optional_weights(s, y.shape[0])
        shift = self._root(y, z, 1.0 if s is None else s) if intercept else 0.0
        theta = -self.terms(y, z + shift)[1]
        if s is not None:
            theta *= s
        return balanced(theta) if intercept else theta

    def conjugate(self, y: ArrayLike, theta: ArrayLike, s: ArrayLike | None = None) -> float:
        """``F^*(-theta / n) = (1/n) sum_i s_i loss_i^*(-theta_i / s_i)``; where ``s_i = 0``
        the term is 0 if ``theta_i = 0`` and ``inf`` otherwise."""
        return self.conjugate_line(y, theta, s)(1.0)

    def conjugate_line(
        self, y: ArrayLike, theta: ArrayLike, s: ArrayLike | None = None
    ) -> Callable[[float], float]:
        """``c -> conjugate(y, c * theta, s)`` (``theta`` read at each call)."""
        y, theta = _vec(y), _vec(theta)
        s = optional_weights(s, y.shape[0])
        n = y.shape[0]

        def at(c: float) -> float:
            if s is None:
                return float(self.conjugate_terms(y, -c * theta).sum()) / n
            live = s > 0.0
            if np.any(theta[~live] != 0.0):
                return math.inf
            v = -c * theta[live] / s[live]
            return float(s[live] @ self.conjugate_terms(y[live], v)) / n

        return at

    def value_conjugates(
        self,
        y: ArrayLike,
        z: ArrayLike,
        theta: ArrayLike,
        s: ArrayLike | None = None,
        scales: tuple[float, ...] = (1.0,),
    ) -> tuple[float, tuple[float, ...]]:
        """``F(z)`` and ``conjugate(y, c * theta, s)`` for each ``c`` of ``scales``."""
        line = self.conjugate_line(y, theta, s)
        return self.value(y, z, s), tuple(line(c) for c in scales)


def _vec(a: ArrayLike) -> NDArray[np.float64]:
    return np.ascontiguousarray(a, dtype=np.float64)
