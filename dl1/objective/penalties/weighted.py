"""The elastic net with per-feature penalty factors and bounds on the coefficients.

``value(w) = sum_j f_j (alpha_l1 |w_j| + alpha_l2 / 2 w_j^2)`` over ``lower_j <= w_j <=
upper_j``: glmnet's ``penalty.factor``, ``lower.limits`` and ``upper.limits`` (scikit-learn's
``positive=True`` is ``lower = 0``). Every box holds 0 (``lower <= 0 <= upper``, as glmnet
asks), so ``w = 0`` is feasible and ``alpha_max`` is defined.

Conjugate, at ``v = X^T theta / n``: a sum over features and over each feature's two sides
(``v_j > 0`` meets the upper bound, ``v_j < 0`` the lower one). On a side with an infinite
bound it is ``f_j (e_j / f_j - alpha_l1)_+^2 / (2 alpha_l2)`` with ``e_j = |v_j|``, or with
``alpha_l2 = 0`` the indicator of ``e_j / f_j <= alpha_l1``: the same two block reductions as
the plain elastic net, taken of ``e_j / f_j`` and weighted by ``f_j``
(:func:`dl1.kernels.linalg.csc_xt_theta_stats`), with the dual point rescaled by the same
rule. On a side with a finite bound ``beta`` the conjugate is finite,
``sup_{0 <= w <= beta} (e w - f_j alpha_l2 w^2 / 2)`` with ``e = e_j - f_j alpha_l1``
(:func:`dl1.kernels.linalg.box_conjugate`): a third block sum. Since every ``g_j^*`` is
convex with ``g_j^*(0) = 0``, ``g_j^*(c v) <= c g_j^*(v)`` for the rescaling ``c <= 1``,
which bounds that sum at the rescaled point (:func:`dl1.objective.gap.dual_from_conjugates`).
A side whose bound is 0 takes no part: ``max(v_j, 0)`` under ``positive``.

A factor of 0 leaves its feature unpenalised: its dual constraint ``x_j^T theta = 0`` has no
rescaling that meets it, so the solver minimises exactly over those features before each
certificate (:mod:`dl1.solvers.unpenalised`) and the statistics leave them out.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dl1.errors import ValidationError
from dl1.objective.penalties.elastic_net import ElasticNet, soft_threshold

NO_BOUNDS = np.zeros((2, 0))


def check_factors(penalty_factor: Any) -> NDArray[np.float64]:
    """``penalty_factor`` as a 1-D float64 array of finite values >= 0, naming the first
    bad entry."""
    f = np.asarray(penalty_factor, dtype=np.float64)
    if f.ndim != 1 or f.shape[0] == 0:
        raise ValidationError(f"penalty_factor must be a 1-D array of one factor per feature, "
                              f"got shape {f.shape}")  # fmt: skip
    bad = np.flatnonzero(~(np.isfinite(f) & (f >= 0.0)))
    if bad.size:
        j = int(bad[0])
        raise ValidationError(f"penalty_factor[{j}] = {f[j].item()!r}: factors must be "
                              "finite and >= 0 (0: unpenalised)")  # fmt: skip
    return np.ascontiguousarray(f)


def check_bounds(bounds: Any, positive: bool = False) -> NDArray[np.float64]:
    """``bounds = (lower, upper)`` (each a number or one per feature; None for none) as the
    kernels take them: shape (2, 1) for numbers, (2, p) per feature, (2, 0) for none.
    ``positive`` is ``lower = 0``. Refuses NaN, ``lower > 0``, ``upper < 0`` (every box
    holds 0, as in glmnet) and ``positive`` with a lower bound, naming the first bad one."""
    if bounds is None:
        return np.array([[0.0], [np.inf]]) if positive else NO_BOUNDS
    try:
        lower, upper = bounds
    except (TypeError, ValueError):
        raise ValidationError("bounds must be a pair (lower, upper), each a number or one "
                              f"per feature; got {type(bounds).__name__}") from None  # fmt: skip
    if positive and lower is not None:
        raise ValidationError("give positive=True or a lower bound in bounds, not both "
                              "(positive=True is bounds=(0, upper))")  # fmt: skip
    lo = np.asarray(0.0 if positive else -np.inf if lower is None else lower, dtype=np.float64)
    hi = np.asarray(np.inf if upper is None else upper, dtype=np.float64)
    for name, arr in (("lower", lo), ("upper", hi)):
        if arr.ndim > 1 or (arr.ndim == 1 and arr.shape[0] == 0):
            raise ValidationError(f"bounds: {name} must be a number or a 1-D array of one "
                                  f"bound per feature, got shape {arr.shape}")  # fmt: skip
    try:
        lo, hi = np.broadcast_arrays(np.atleast_1d(lo), np.atleast_1d(hi))
    except ValueError:
        raise ValidationError(f"bounds: lower has {lo.size} entries and upper {hi.size}; "
                              "give as many (or a number)") from None  # fmt: skip
    for name, arr, ok in (("lower", lo, lo <= 0.0), ("upper", hi, hi >= 0.0)):
        bad = np.flatnonzero(~ok)  # NaN fails both comparisons
        if bad.size:
            j = int(bad[0])
            sign = "<= 0" if name == "lower" else ">= 0"
            raise ValidationError(f"bounds: {name}[{j}] = {arr[j].item()!r}; every {name} "
                                  f"bound must be {sign} (the box holds 0)")  # fmt: skip
    if np.all(lo == -np.inf) and np.all(hi == np.inf):
        return NO_BOUNDS
    return np.ascontiguousarray(np.stack([lo, hi]))


class WeightedElasticNet(ElasticNet):
    """Elastic net with per-feature factors ``f_j >= 0`` and bounds on the coefficients.

    Parameters
    ----------
    alpha : float
    l1_ratio : float, default=1.0
    penalty_factor : array_like of shape (p,), optional
        ``f_j``; None for 1.
    positive : bool, default=False
        Coefficients kept ``>= 0`` (``lower = 0``).
    bounds : (lower, upper), optional
        Each a number, an array of one bound per feature or None (unbounded), with
        ``lower <= 0 <= upper`` (:func:`check_bounds`).
    """

    def __init__(
        self,
        alpha: float,
        l1_ratio: float = 1.0,
        penalty_factor: Any = None,
        positive: bool = False,
        bounds: Any = None,
    ) -> None:
        super().__init__(alpha, l1_ratio)
        self.penalty_factor = None if penalty_factor is None else check_factors(penalty_factor)
        self._bounds = check_bounds(bounds, bool(positive))

    def __repr__(self) -> str:
        pf = "None" if self.penalty_factor is None else f"<{self.penalty_factor.shape[0]} factors>"
        k = self._bounds.shape[1]
        box = "None" if k == 0 else f"<{k} pairs>"
        return (f"WeightedElasticNet(alpha={self.alpha!r}, l1_ratio={self.l1_ratio!r}, "
                f"penalty_factor={pf}, bounds={box})")  # fmt: skip

    def _key(self) -> tuple[Any, ...]:
        f = b"" if self.penalty_factor is None else self.penalty_factor.tobytes()
        box = (self._bounds.shape, self._bounds.tobytes())
        return (self.alpha, self.l1_ratio, self.penalty_factor is None, f, box)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WeightedElasticNet):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash((type(self).__name__, *self._key()))

    # -- what the kernels and the solver take -----------------------------------------------
    @property
    def factors(self) -> NDArray[np.float64]:
        """The factors, or an empty array for 1."""
        return np.zeros(0) if self.penalty_factor is None else self.penalty_factor

    @property
    def bounds(self) -> NDArray[np.float64]:
        """Lower and upper bounds, shape (2, p), (2, 1) (the same for every feature) or
        (2, 0) (none)."""
        return self._bounds

    @property
    def positive(self) -> bool:  # type: ignore[override]
        """Every coefficient kept ``>= 0`` and no other bound (scikit-learn's ``positive``)."""
        b = self._bounds
        return b.shape[1] > 0 and bool(np.all(b[0] == 0.0) and np.all(b[1] == np.inf))

    @property
    def boxed(self) -> NDArray[np.bool_]:
        """Per feature (or one for all), whether any of its bounds is finite."""
        return np.isfinite(self._bounds).any(axis=0)

    @property
    def uniform(self) -> bool:
        return False

    @property
    def free(self) -> NDArray[np.int64]:
        if self.penalty_factor is None:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(self.penalty_factor == 0.0)

    def check_features(self, p: int) -> None:
        if self.penalty_factor is not None and self.penalty_factor.shape[0] != p:
            raise ValidationError(f"penalty_factor has {self.penalty_factor.shape[0]} "
                                  f"factors, X has {p} features")  # fmt: skip
        if self._bounds.shape[1] > 1 and self._bounds.shape[1] != p:
            raise ValidationError(f"bounds have {self._bounds.shape[1]} entries, X has {p} "
                                  "features")  # fmt: skip

    def block(self, lo: int, hi: int) -> NDArray[np.float64]:
        return self.factors if self.penalty_factor is None else self.penalty_factor[lo:hi]

    def block_bounds(self, lo: int, hi: int) -> NDArray[np.float64]:
        b = self._bounds
        return b if b.shape[1] <= 1 else np.ascontiguousarray(b[:, lo:hi])

    def _like(
        self, alpha: float, factors: NDArray[np.float64] | None, bounds: NDArray[np.float64]
    ) -> WeightedElasticNet:
        """This penalty at ``alpha`` with ``factors`` and ``bounds`` (already checked)."""
        out = WeightedElasticNet.__new__(WeightedElasticNet)
        out.alpha = ElasticNet(alpha, self.l1_ratio).alpha
        out.l1_ratio, out.penalty_factor, out._bounds = self.l1_ratio, factors, bounds
        return out

    def restricted(self, idx: ArrayLike) -> WeightedElasticNet:
        idx = np.asarray(idx)
        f = None if self.penalty_factor is None else self.penalty_factor[idx]
        b = self._bounds
        return self._like(self.alpha, f, b if b.shape[1] <= 1 else b[:, idx].copy())

    def at(self, alpha: float) -> WeightedElasticNet:
        return self._like(alpha, self.penalty_factor, self._bounds)

    # -- the penalty -----------------------------------------------------------------------
    def _f(self, n: int) -> NDArray[np.float64] | float:
        return 1.0 if self.penalty_factor is None else self.penalty_factor[:n]

    def _box(self, n: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Lower and upper bounds of the first ``n`` features."""
        b = self._bounds
        if b.shape[1] == 0:
            return np.full(n, -np.inf), np.full(n, np.inf)
        if b.shape[1] == 1:
            return np.full(n, b[0, 0]), np.full(n, b[1, 0])
        return b[0, :n], b[1, :n]

    def value(self, w: ArrayLike) -> float:
        """``sum_j f_j (alpha_l1 |w_j| + alpha_l2 / 2 w_j^2)``; ``inf`` for a coefficient
        outside its bounds."""
        w = np.asarray(w, dtype=np.float64)
        lo, hi = self._box(w.shape[0])
        if np.any(w < lo) or np.any(w > hi):
            return math.inf
        f = self._f(w.shape[0])
        return float(np.sum(f * (self.alpha_l1 * np.abs(w) + 0.5 * self.alpha_l2 * w * w)))

    def prox(self, w: ArrayLike, step: float = 1.0) -> NDArray[np.float64]:
        w = np.asarray(w, dtype=np.float64)
        f = self._f(w.shape[0])
        out = soft_threshold(w, step * self.alpha_l1 * f) / (1.0 + step * self.alpha_l2 * f)
        return np.clip(out, *self._box(w.shape[0]))

    def _sides(self, v: NDArray[np.float64], finite: bool) -> tuple[NDArray, NDArray]:
        """Per feature, ``max(v_j, 0)`` and ``max(-v_j, 0)`` on the sides whose bound is
        infinite (``finite=False``: the dual norm's) or finite and not 0 (``finite=True``:
        :meth:`box_conjugate`'s), 0 on the others, and those bounds' magnitudes."""
        lo, hi = self._box(v.shape[0])
        up, down = np.maximum(v, 0.0), np.maximum(-v, 0.0)
        if finite:
            keep_up, keep_down = np.isfinite(hi) & (hi > 0), np.isfinite(lo) & (lo < 0)
        else:
            keep_up, keep_down = hi == np.inf, lo == -np.inf
        return np.where(keep_up, up, 0.0), np.where(keep_down, down, 0.0), hi, -lo

    def _dual(self, v: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64] | float]:
        """``(e_j / f_j, f_j)`` as :func:`dl1.kernels.linalg.weighted_dual` takes them (the
        sides with an infinite bound): an unpenalised feature's ``e`` is -1, left out (its
        constraint ``v_j = 0`` is met by the point the solver certifies,
        :mod:`dl1.solvers.unpenalised`)."""
        v = np.asarray(v, dtype=np.float64)
        up, down, _, _ = self._sides(v, finite=False)
        e = np.maximum(up, down)
        f = self._f(v.shape[0])
        if isinstance(f, float):
            return e / f, f
        return np.divide(e, f, out=np.full_like(e, -1.0), where=f > 0.0), f

    def box_conjugate(self, xt_theta: ArrayLike, n: int) -> float:
        """``sum_j g_j^*(c_j / n)`` over the sides with a finite bound other than 0, at
        ``c = X^T theta`` (:func:`dl1.kernels.linalg.box_conjugate`)."""
        c = np.asarray(xt_theta, dtype=np.float64)
        if not self.boxed.any():
            return 0.0
        up, down, beta_up, beta_down = self._sides(c, finite=True)
        f = np.broadcast_to(self._f(c.shape[0]), c.shape)
        curv = f * self.alpha_l2
        total = 0.0
        for d, beta in ((up, beta_up), (down, beta_down)):
            e = np.maximum(d - f * n * self.alpha_l1, 0.0) / n
            safe = np.where(curv > 0.0, curv, 1.0)
            w = np.where(curv > 0.0, np.minimum(e / safe, beta), beta)
            w = np.where(e > 0.0, w, 0.0)
            total += float(np.sum(e * w - 0.5 * curv * w * w))
        return total

    def conjugate(self, v: ArrayLike) -> float:
        e, f = self._dual(v)
        excess = np.maximum(e - self.alpha_l1, 0.0)
        box = self.box_conjugate(np.asarray(v, dtype=np.float64), 1)
        if self.alpha_l2 > 0.0:
            return float(np.sum(f * excess * excess)) / (2.0 * self.alpha_l2) + box
        return box if not excess.any() else math.inf

    def xt_theta_stats(self, xt_theta: ArrayLike, n: int) -> tuple[float, float]:
        """``(max_j e_j, sum_j f_j (e_j - n alpha_l1)_+^2)`` of ``e = X^T theta`` as the
        dual norm sees it (see the module docstring)."""
        e, f = self._dual(xt_theta)
        if e.size == 0:
            return 0.0, 0.0
        excess = np.maximum(e - n * self.alpha_l1, 0.0)
        return float(e.max()), float(np.sum(f * excess * excess))
