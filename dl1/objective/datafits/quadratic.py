"""Least-squares datafit ``F(z) = (1/n) sum_i s_i (y_i - z_i)^2 / 2``.

Also holds the sample-weight helpers shared by the datafits.

Dual convention (see :mod:`dl1.objective.gap`):
``theta = -n grad F(z) = s * (y - z)``, the (weighted)
residual, and the datafit part of the dual objective is ``-conjugate(y, theta, s)`` with
``conjugate(y, theta, s) = F^*(-theta / n)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dl1.errors import ValidationError
from dl1.kernels.codes import SQUARED
from dl1.kernels.vectors import dual_sums, residual_sums


def normalize_sample_weight(sample_weight: ArrayLike | None, n: int) -> NDArray[np.float64] | None:
    """Validate sample weights and rescale them to sum to ``n``.

    Parameters
    ----------
    sample_weight : array_like of shape (n,) or None
        Non-negative finite weights with a positive sum; None for unit weights.
    n : int
        Number of samples.

    Returns
    -------
    ndarray of float64 of shape (n,) or None
        ``sample_weight * n / sum(sample_weight)``; None if ``sample_weight`` is None.

    Raises
    ------
    ValidationError
        Wrong shape, a negative or non-finite weight (naming the first bad index), or a zero
        sum.
    """
    if sample_weight is None:
        return None
    s = np.asarray(sample_weight, dtype=np.float64)
    if s.shape != (n,):
        raise ValidationError(f"sample_weight has shape {s.shape}, expected ({n},)")
    bad = np.flatnonzero(~np.isfinite(s) | (s < 0))
    if bad.size:
        i = int(bad[0])
        raise ValidationError(
            f"sample_weight[{i}] = {s[i].item()!r} is not a finite non-negative number"
        )
    top = s.max(initial=0.0)
    if top <= 0.0:
        raise ValidationError("sample_weight sums to 0")
    s = s / top  # in [0, 1] first: the sum of weights near 1e308 overflows, theirs cannot
    return s * (n / s.sum())


def optional_weights(s: ArrayLike | None, n: int) -> NDArray[np.float64] | None:
    """Sample weights as float64 of shape (n,), or None for unit weights."""
    if s is None:
        return None
    s = np.asarray(s, dtype=np.float64)
    if s.shape != (n,):
        raise ValidationError(f"sample weights have shape {s.shape}, expected ({n},)")
    return s


def _residual_sums(y: ArrayLike, z: ArrayLike, s: ArrayLike | None) -> tuple[float, float, float]:
    """``(sum s r, sum s r^2, sum s)`` of ``r = y - z`` in one pass, without temporaries
    (:func:`dl1.kernels.vectors.residual_sums`)."""
    y = np.ascontiguousarray(y, dtype=np.float64)
    z = np.ascontiguousarray(z, dtype=np.float64)
    if z.shape != y.shape:
        raise ValidationError(f"z has shape {z.shape}, expected {y.shape}")
    s = optional_weights(s, y.shape[0])
    return residual_sums(y, z, np.zeros(0) if s is None else np.ascontiguousarray(s))


def _check_finite_y(y: ArrayLike) -> NDArray[np.float64]:
    """``y`` as a 1-D finite float64 array."""
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValidationError(f"y must be 1-D, got shape {y.shape}")
    y = y.astype(np.float64, copy=False)
    bad = np.flatnonzero(~np.isfinite(y))
    if bad.size:
        i = int(bad[0])
        raise ValidationError(f"y[{i}] = {y[i].item()!r} is not finite")
    return y


def validate_labels(y: ArrayLike, loss: str) -> NDArray[np.float64]:
    """Labels of a classification loss: 1-D, exactly -1 or +1 (the first bad index named)."""
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValidationError(f"y must be 1-D, got shape {y.shape}")
    bad = np.flatnonzero((y != 1) & (y != -1))
    if bad.size:
        i = int(bad[0])
        raise ValidationError(f"y[{i}] = {y[i].item()!r}: {loss} labels must be exactly -1 or +1")
    return y.astype(np.float64, copy=False)


def balanced(theta: NDArray[np.float64]) -> NDArray[np.float64]:
    """``theta`` with its heavier sign side shrunk by a common factor so that it sums to 0
    (the dual constraint of an unpenalised intercept)."""
    theta = theta.copy()
    pos = theta > 0
    mass_pos, mass_neg = float(theta[pos].sum()), -float(theta[~pos].sum())
    if mass_pos > mass_neg:
        theta[pos] *= mass_neg / mass_pos
    elif mass_neg > mass_pos:
        theta[~pos] *= mass_pos / mass_neg
    return theta


class Quadratic:
    """Squared loss ``loss(y, z) = (y - z)^2 / 2`` (scikit-learn ``ElasticNet`` convention).

    All methods take length-``n`` float arrays; ``s`` are optional sample weights (None for
    unit weights), normalised by the caller to sum to ``n``
    (:func:`normalize_sample_weight`).
    """

    name = "squared"
    code = SQUARED
    classifies = False
    log_odds = False
    metrics = ("mse",)
    row_steps = True
    beta: float = 1.0
    """Upper bound of ``loss''`` (Shalev-Shwartz & Tewari 2011, Eq. (7))."""
    newton_reach: float = math.inf
    smooth = True
    quadratic = True
    """The loss is a quadratic: a Gram matrix gives its exact local model."""

    def __repr__(self) -> str:
        return "Quadratic()"

    def sklearn_estimator(self, res: Any) -> Any:
        """scikit-learn's ``Lasso`` (``l1_ratio == 1``) or ``ElasticNet``, same ``alpha`` and
        ``l1_ratio``: the same objective."""
        # local: scikit-learn (~1 s, ~120 MiB) only to compare with it; workers import datafits
        from sklearn.linear_model import ElasticNet, Lasso

        kw = dict(alpha=res.alpha, fit_intercept=bool(res.fit_intercept), tol=res.tol)
        if res.l1_ratio == 1.0:
            return Lasso(**kw)
        return ElasticNet(l1_ratio=res.l1_ratio, **kw)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def params(self) -> dict[str, float]:
        """No parameters."""
        return {}

    @staticmethod
    def response(z: Any) -> Any:
        """The prediction at decision values ``z``: ``z`` itself."""
        return z

    def __hash__(self) -> int:
        return hash(type(self).__name__)

    def validate_y(self, y: ArrayLike) -> NDArray[np.float64]:
        """Check the targets.

        Parameters
        ----------
        y : array_like of shape (n,)

        Returns
        -------
        ndarray of float64

        Raises
        ------
        ValidationError
            ``y`` is not 1-D or has a NaN/inf (naming the first bad index).
        """
        return _check_finite_y(y)

    def value(self, y: ArrayLike, z: ArrayLike, s: ArrayLike | None = None) -> float:
        """``F(z) = (1/n) sum_i s_i (y_i - z_i)^2 / 2``.

        Parameters
        ----------
        y, z : array_like of shape (n,)
            Targets and linear predictor ``X w + b``.
        s : array_like of shape (n,), optional
            Sample weights.

        Returns
        -------
        float
        """
        _, sq, _ = _residual_sums(y, z, s)
        return 0.5 * sq / len(y)

    def gradient(
        self, y: ArrayLike, z: ArrayLike, s: ArrayLike | None = None
    ) -> NDArray[np.float64]:
        """``grad F(z)``: ``g_i = s_i (z_i - y_i) / n``.

        Parameters
        ----------
        y, z : array_like of shape (n,)
        s : array_like of shape (n,), optional

        Returns
        -------
        ndarray of float64 of shape (n,)
        """
        g = np.asarray(z, dtype=np.float64) - np.asarray(y, dtype=np.float64)
        s = optional_weights(s, g.shape[0])
        if s is not None:
            g *= s
        g /= g.shape[0]
        return g

    def initial_intercept(self, y: ArrayLike, s: ArrayLike | None = None) -> float:
        """Optimal intercept at ``w = 0``: the weighted mean of ``y``.

        Parameters
        ----------
        y : array_like of shape (n,)
        s : array_like of shape (n,), optional

        Returns
        -------
        float
        """
        y = np.asarray(y, dtype=np.float64)
        s = optional_weights(s, y.shape[0])
        if s is None:
            return float(y.mean())
        return float(s @ y) / float(s.sum())

    def intercept_update(
        self, y: ArrayLike, z: ArrayLike, s: ArrayLike | None = None, max_iter: int = 1
    ) -> float:
        """Intercept step minimising ``F(z + db)`` exactly.

        Parameters
        ----------
        y, z : array_like of shape (n,)
            ``z`` includes the current intercept.
        s : array_like of shape (n,), optional
        max_iter : int, default=1
            Ignored (one step is exact); kept for API symmetry with :class:`Logistic`.

        Returns
        -------
        float
            ``db = sum_i s_i (y_i - z_i) / sum_i s_i``; the new intercept is ``b + db``.
        """
        total, _, weight = _residual_sums(y, z, s)
        return total / weight

    def dual_point(
        self, y: ArrayLike, z: ArrayLike, s: ArrayLike | None = None, intercept: bool = False
    ) -> NDArray[np.float64]:
        """Dual candidate ``theta = -n grad F(z) = s * (y - z)`` (the weighted residual).

        Parameters
        ----------
        y, z : array_like of shape (n,)
        s : array_like of shape (n,), optional
        intercept : bool, default=False
            If True, ``theta`` is the weighted residual at the optimal intercept shift
            ``z + db`` (:meth:`intercept_update`), i.e. ``theta - s sum(theta) / sum(s)``, so
            that ``sum_i theta_i = 0`` (the dual constraint of the unpenalised intercept). For
            unit weights this is the residual minus its mean.

        Returns
        -------
        ndarray of float64 of shape (n,)
            Not yet rescaled for L1 feasibility (:func:`dl1.objective.gap.duality_gap` does that).
        """
        theta = np.asarray(y, dtype=np.float64) - np.asarray(z, dtype=np.float64)
        s = optional_weights(s, theta.shape[0])
        if s is not None:
            theta *= s
        if intercept:
            if s is None:
                theta -= theta.mean()
            else:
                theta -= s * (theta.sum() / s.sum())
        return theta

    def conjugate(self, y: ArrayLike, theta: ArrayLike, s: ArrayLike | None = None) -> float:
        """``F^*(-theta / n) = (1/n) sum_i (theta_i^2 / (2 s_i) - theta_i y_i)``.

        The dual objective is ``D(theta) = -conjugate(y, theta, s) - penalty^*(X^T theta / n)``.

        Parameters
        ----------
        y, theta : array_like of shape (n,)
        s : array_like of shape (n,), optional
            Where ``s_i = 0`` the term is 0 if ``theta_i = 0`` and ``inf`` otherwise.

        Returns
        -------
        float
        """
        return self.conjugate_line(y, theta, s)(1.0)

    def value_conjugates(
        self,
        y: ArrayLike,
        z: ArrayLike,
        theta: ArrayLike,
        s: ArrayLike | None = None,
        scales: tuple[float, ...] = (1.0,),
    ) -> tuple[float, tuple[float, ...]]:
        """``F(z)`` and ``conjugate(y, c * theta, s)`` for each ``c`` of ``scales``: a
        duality gap's datafit terms (one pass for the value, one for every scale)."""
        line = self.conjugate_line(y, theta, s)
        return self.value(y, z, s), tuple(line(c) for c in scales)

    def conjugate_line(
        self, y: ArrayLike, theta: ArrayLike, s: ArrayLike | None = None
    ) -> Callable[[float], float]:
        """``c -> conjugate(y, c * theta, s)``, from one pass over ``theta``: the conjugate
        is ``(c^2 q / 2 - c l) / n`` with ``q = sum_i theta_i^2 / s_i`` and ``l = theta . y``
        (:func:`dl1.kernels.vectors.dual_sums`; no temporaries, no BLAS threads).

        Parameters
        ----------
        y, theta : array_like of shape (n,)
        s : array_like of shape (n,), optional

        Returns
        -------
        callable
            float -> float (``inf`` where ``theta`` leaves the domain, as :meth:`conjugate`).
        """
        y = np.ascontiguousarray(y, dtype=np.float64)
        theta = np.ascontiguousarray(theta, dtype=np.float64)
        n = theta.shape[0]
        s = optional_weights(s, n)
        quad, lin = dual_sums(y, theta, np.zeros(0) if s is None else np.ascontiguousarray(s))

        def at(c: float) -> float:
            if math.isinf(quad) and c != 0.0:
                return math.inf
            return (0.5 * c * c * quad - c * lin) / n if c != 0.0 else 0.0

        return at
