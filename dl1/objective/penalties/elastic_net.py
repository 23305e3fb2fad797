"""The elastic-net penalty ``alpha * (l1_ratio ||w||_1 + (1 - l1_ratio) / 2 ||w||_2^2)``.

Dual quantities use the scaling of :mod:`dl1.objective.gap`:
the dual point ``theta`` (length ``n``) is
``-n`` times a gradient of the datafit, so the penalty part of the dual objective is the
conjugate evaluated at ``X^T theta / n``.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray


def soft_threshold(x: ArrayLike, tau: float) -> NDArray[np.float64]:
    """Elementwise soft-thresholding ``sign(x) * max(|x| - tau, 0)``.

    Parameters
    ----------
    x : array_like
    tau : float
        Non-negative threshold.

    Returns
    -------
    ndarray of float64
    """
    x = np.asarray(x, dtype=np.float64)
    return np.sign(x) * np.maximum(np.abs(x) - tau, 0.0)


def alpha_max(xt_grad0_inf: float, l1_ratio: float = 1.0) -> float:
    """Smallest ``alpha`` for which ``w = 0`` is optimal.

    Parameters
    ----------
    xt_grad0_inf : float
        ``||X^T g0||_inf`` where ``g0 = datafit.gradient(y, z0, s)`` (already divided by
        ``n``) at ``w = 0``, i.e. ``z0 = 0`` without intercept or ``z0 = initial_intercept``
        with one. For the squared loss without intercept this is ``max_j |x_j^T y| / n``, as in
        scikit-learn.
    l1_ratio : float, default=1.0

    Returns
    -------
    float
        ``xt_grad0_inf / l1_ratio``; ``inf`` when ``l1_ratio == 0`` (ridge never zeroes ``w``)
        unless ``xt_grad0_inf == 0``.
    """
    if not 0.0 <= l1_ratio <= 1.0:
        raise ValueError(f"l1_ratio must be in [0, 1], got {l1_ratio!r}")
    if xt_grad0_inf == 0.0:
        return 0.0
    if l1_ratio == 0.0:
        return math.inf
    return float(xt_grad0_inf) / l1_ratio


class ElasticNet:
    """Elastic-net penalty; ``l1_ratio=1`` is the Lasso (L1), ``l1_ratio=0`` ridge.

    ``value(w) = alpha_l1 ||w||_1 + alpha_l2 / 2 ||w||_2^2`` with ``alpha_l1 = alpha * l1_ratio``
    and ``alpha_l2 = alpha * (1 - l1_ratio)`` (scikit-learn's ``ElasticNet`` convention).

    Parameters
    ----------
    alpha : float
        Non-negative regularisation strength.
    l1_ratio : float, default=1.0
        Mixing parameter in ``[0, 1]``.
    """

    def __init__(self, alpha: float, l1_ratio: float = 1.0) -> None:
        alpha = float(alpha)
        l1_ratio = float(l1_ratio)
        if not (math.isfinite(alpha) and alpha >= 0.0):
            raise ValueError(f"alpha must be finite and >= 0, got {alpha!r}")
        if not 0.0 <= l1_ratio <= 1.0:
            raise ValueError(f"l1_ratio must be in [0, 1], got {l1_ratio!r}")
        self.alpha = alpha
        self.l1_ratio = l1_ratio

    def __repr__(self) -> str:
        return f"ElasticNet(alpha={self.alpha!r}, l1_ratio={self.l1_ratio!r})"

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return (self.alpha, self.l1_ratio) == (other.alpha, other.l1_ratio)

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.alpha, self.l1_ratio))

    # -- what the kernels and the solver take (uniform here; see WeightedElasticNet) -------
    positive = False
    """Coefficients kept ``>= 0``."""

    @property
    def factors(self) -> NDArray[np.float64]:
        """Per-feature penalty factors for the kernels: empty, all 1."""
        return np.zeros(0)

    @property
    def bounds(self) -> NDArray[np.float64]:
        """The coefficients' lower and upper bounds for the kernels, shape (2, 0): none
        (:func:`dl1.kernels.linalg.bound_at`)."""
        return np.zeros((2, 0))

    def block_bounds(self, lo: int, hi: int) -> NDArray[np.float64]:
        """The bounds of features ``lo:hi`` for a kernel (none here)."""
        return self.bounds

    def box_conjugate(self, xt_theta: ArrayLike, n: int) -> float:
        """The finite bounds' part of the conjugate at ``X^T theta / n``: none here."""
        return 0.0

    @property
    def uniform(self) -> bool:
        """The same penalty on every feature, no sign constraint."""
        return True

    @property
    def free(self) -> NDArray[np.int64]:
        """The unpenalised features (factor 0): none here."""
        return np.zeros(0, dtype=np.int64)

    def check_features(self, p: int) -> None:
        """Refuse a penalty made for another number of features (none here)."""

    def block(self, lo: int, hi: int) -> NDArray[np.float64]:
        """The factors of features ``lo:hi`` for a kernel (empty: all 1)."""
        return self.factors

    def restricted(self, idx: ArrayLike) -> ElasticNet:
        """The penalty of the features ``idx`` (a working set), in that order."""
        return self

    def at(self, alpha: float) -> ElasticNet:
        """The same penalty at another ``alpha`` (a path's next)."""
        return ElasticNet(alpha, self.l1_ratio)

    @property
    def alpha_l1(self) -> float:
        """Weight of ``||w||_1``: ``alpha * l1_ratio``."""
        return self.alpha * self.l1_ratio

    @property
    def alpha_l2(self) -> float:
        """Weight of ``||w||_2^2 / 2``: ``alpha * (1 - l1_ratio)``."""
        return self.alpha * (1.0 - self.l1_ratio)

    def value(self, w: ArrayLike) -> float:
        """Penalty value ``alpha_l1 ||w||_1 + alpha_l2 / 2 ||w||_2^2``.

        Parameters
        ----------
        w : array_like of shape (p,)

        Returns
        -------
        float
        """
        w = np.asarray(w, dtype=np.float64)
        return float(self.alpha_l1 * np.abs(w).sum() + 0.5 * self.alpha_l2 * (w @ w))

    def prox(self, w: ArrayLike, step: float = 1.0) -> NDArray[np.float64]:
        """Proximal operator of ``step * value``.

        Parameters
        ----------
        w : array_like of shape (p,)
        step : float, default=1.0

        Returns
        -------
        ndarray of float64
            ``soft_threshold(w, step alpha_l1) / (1 + step alpha_l2)``.
        """
        return soft_threshold(w, step * self.alpha_l1) / (1.0 + step * self.alpha_l2)

    def conjugate(self, v: ArrayLike) -> float:
        """Fenchel conjugate of the penalty at ``v``.

        Parameters
        ----------
        v : array_like of shape (p,)

        Returns
        -------
        float
            ``sum_j (|v_j| - alpha_l1)_+^2 / (2 alpha_l2)`` if ``alpha_l2 > 0``; otherwise the
            indicator of ``||v||_inf <= alpha_l1`` (0 or ``inf``).
        """
        excess = np.maximum(np.abs(np.asarray(v, dtype=np.float64)) - self.alpha_l1, 0.0)
        if self.alpha_l2 > 0.0:
            return float(excess @ excess) / (2.0 * self.alpha_l2)
        return 0.0 if not excess.any() else math.inf

    def xt_theta_stats(self, xt_theta: ArrayLike, n: int) -> tuple[float, float]:
        """Reduce ``X^T theta`` to what the duality gap needs.

        Parameters
        ----------
        xt_theta : array_like of shape (p,)
            ``X^T theta`` (with the column scaling applied).
        n : int
            Number of samples.

        Returns
        -------
        absmax : float
            ``||X^T theta||_inf``.
        excess_sq : float
            ``sum_j (|x_j^T theta| - n alpha_l1)_+^2``.

        Notes
        -----
        Both sum/max over column blocks; :func:`dl1.kernels.csc_xt_theta_stats` computes them
        per block with ``threshold = n * alpha_l1``.
        """
        a = np.abs(np.asarray(xt_theta, dtype=np.float64))
        if a.size == 0:
            return 0.0, 0.0
        excess = np.maximum(a - n * self.alpha_l1, 0.0)
        return float(a.max()), float(excess @ excess)

    def conjugate_from_stats(self, xt_theta_excess_sq: float, n: int) -> float:
        """Conjugate at ``X^T theta / n`` from :meth:`xt_theta_stats`.

        Parameters
        ----------
        xt_theta_excess_sq : float
            ``sum_j (|x_j^T theta| - n alpha_l1)_+^2``.
        n : int
            Number of samples.

        Returns
        -------
        float
            ``excess_sq / (2 alpha_l2 n^2)`` if ``alpha_l2 > 0``; for ``alpha_l2 == 0``, 0 if
            ``excess_sq == 0`` else ``inf``.
        """
        if self.alpha_l2 > 0.0:
            return float(xt_theta_excess_sq) / (2.0 * self.alpha_l2 * float(n) ** 2)
        return 0.0 if xt_theta_excess_sq == 0.0 else math.inf

    def dual_feasible_scale(self, xt_theta_inf: float, n: int) -> float:
        """Scale ``c`` making ``c theta`` dual feasible for the L1 part of the penalty.

        Feasible means ``||c X^T theta / n||_inf <= alpha_l1``.

        Parameters
        ----------
        xt_theta_inf : float
            ``||X^T theta||_inf``.
        n : int
            Number of samples.

        Returns
        -------
        float
            ``min(1, n alpha_l1 / ||X^T theta||_inf)`` (1 when ``X^T theta = 0``), the
            scikit-learn / celer rescaling of the residual.
        """
        bound = n * self.alpha_l1
        if xt_theta_inf <= bound:
            return 1.0
        return bound / float(xt_theta_inf)

    @staticmethod
    def alpha_max(xt_grad0_inf: float, l1_ratio: float = 1.0) -> float:
        """Smallest ``alpha`` with ``w = 0`` optimal; see :func:`alpha_max`."""
        return alpha_max(xt_grad0_inf, l1_ratio)
