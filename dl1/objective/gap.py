"""Duality gap of ``P(w, b) = F(X w + b) + penalty(w)``.

Scaling. The dual variable is ``theta = -n grad F(z)`` (length ``n``): the weighted residual
``s * (y - z)`` for the squared loss, ``s * y * sigmoid(-y z)`` for the logistic loss. Fenchel
duality gives, for any ``theta`` (with ``sum_i theta_i = 0`` when there is an unpenalised
intercept),

    D(theta) = -F^*(-theta / n) - penalty^*(X^T theta / n) <= P(w, b),

with equality at the optimum for ``theta = -n grad F(z*)``. ``datafit.conjugate(y, theta, s)``
returns ``F^*(-theta / n)``. For the squared loss without weights,
``D(theta) = (theta^T y - ||theta||^2 / 2) / n``: scikit-learn's Lasso dual divided by ``n``,
so the gap equals ``sklearn.linear_model.Lasso(...).dual_gap_``.

Feasibility. ``theta = datafit.dual_point(y, z, s, intercept)``; with an intercept it already
satisfies ``sum_i theta_i = 0`` (see the datafits). The penalty conjugate is the indicator of
``||X^T theta / n||_inf <= alpha_l1`` for the Lasso, so ``theta`` is rescaled by
``c = min(1, n alpha_l1 / ||X^T theta||_inf)`` as in scikit-learn and celer. For
``alpha_l2 > 0`` the conjugate ``sum_j (|x_j^T theta| / n - alpha_l1)_+^2 / (2 alpha_l2)`` is
finite everywhere and the better of ``D(theta)`` and ``D(c theta)`` is used. A penalty with
finite bounds adds ``box``, the conjugate's finite terms at ``theta`` (see
:mod:`dl1.objective.penalties.weighted`); at ``c theta`` they are bounded by ``c box``
(each term is convex and 0 at 0), which keeps ``D(c theta)`` a lower bound.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dl1.objective.penalties.elastic_net import ElasticNet


class Datafit(Protocol):
    """What :func:`duality_gap` needs from a datafit."""

    def value(self, y: ArrayLike, z: ArrayLike, s: ArrayLike | None = None) -> float: ...

    def dual_point(
        self, y: ArrayLike, z: ArrayLike, s: ArrayLike | None = None, intercept: bool = False
    ) -> NDArray[np.float64]: ...

    def conjugate(self, y: ArrayLike, theta: ArrayLike, s: ArrayLike | None = None) -> float: ...

    def conjugate_line(
        self, y: ArrayLike, theta: ArrayLike, s: ArrayLike | None = None
    ) -> Callable[[float], float]: ...

    def value_conjugates(
        self,
        y: ArrayLike,
        z: ArrayLike,
        theta: ArrayLike,
        s: ArrayLike | None = None,
        scales: tuple[float, ...] = (1.0,),
    ) -> tuple[float, tuple[float, ...]]: ...


def duality_gap(
    datafit: Datafit,
    penalty: ElasticNet,
    y: ArrayLike,
    z: ArrayLike,
    w: ArrayLike,
    xt_theta: ArrayLike,
    s: ArrayLike | None = None,
    intercept: bool = True,
    theta: ArrayLike | None = None,
) -> tuple[float, float, float]:
    """Primal value, dual value and duality gap at ``(w, b)``.

    Parameters
    ----------
    datafit : Quadratic or Logistic
    penalty : ElasticNet
    y : array_like of shape (n,)
        Targets (validated).
    z : array_like of shape (n,)
        Linear predictor ``X w + b`` at the current iterate (``b = 0`` without intercept).
    w : array_like of shape (p,)
        Coefficients (in the column-scaled space if ``col_scale`` is used).
    xt_theta : array_like of shape (p,)
        ``X^T theta`` for ``theta = datafit.dual_point(y, z, s, intercept)`` (unscaled), with
        the same column scaling as ``w``; possibly assembled from column blocks with
        :func:`dl1.kernels.csc_rmatvec`.
    s : array_like of shape (n,), optional
        Sample weights normalised to sum to ``n``; None for unit weights.
    intercept : bool, default=True
        Whether ``b`` is a free unpenalised intercept (imposes ``sum_i theta_i = 0``).
    theta : array_like of shape (n,), optional
        The dual point used for ``xt_theta``, to avoid recomputing it.

    Returns
    -------
    primal : float
        ``F(z) + penalty(w)``.
    dual : float
        ``D`` at the rescaled dual point (a lower bound of the optimum).
    gap : float
        ``primal - dual`` (non-negative up to rounding).
    """
    n = np.asarray(y).shape[0]
    absmax, excess_sq = penalty.xt_theta_stats(xt_theta, n)
    return duality_gap_from_stats(
        datafit, penalty, y, z, w, absmax, excess_sq, s=s, intercept=intercept, theta=theta,
        box=penalty.box_conjugate(xt_theta, n),
    )


def duality_gap_from_stats(
    datafit: Datafit,
    penalty: ElasticNet,
    y: ArrayLike,
    z: ArrayLike,
    w: ArrayLike,
    xt_theta_absmax: float,
    xt_theta_excess_sq: float,
    s: ArrayLike | None = None,
    intercept: bool = True,
    theta: ArrayLike | None = None,
    box: float = 0.0,
) -> tuple[float, float, float]:
    """:func:`duality_gap` from block-reduced statistics of ``X^T theta``.

    The datafit's terms (``F(z)`` and its conjugate at each of :func:`dual_scales`) come
    from one :meth:`Datafit.value_conjugates` call: one pass over the samples for the
    margin losses (:func:`dl1.kernels.margins.margin_gap_sums`).

    Parameters
    ----------
    datafit, penalty, y, z, w, s, intercept, theta
        As in :func:`duality_gap`.
    xt_theta_absmax : float
        ``||X^T theta||_inf`` (max over blocks of :func:`dl1.kernels.csc_xt_theta_stats`).
    xt_theta_excess_sq : float
        ``sum_j (|x_j^T theta| - n alpha_l1)_+^2`` (sum over blocks of
        :func:`dl1.kernels.csc_xt_theta_stats` with ``threshold = n * penalty.alpha_l1``).
    box : float, default=0.0
        The finite bounds' conjugate terms at ``theta`` (sum over blocks of the third
        statistic of :func:`dl1.kernels.csc_xt_theta_stats`; 0 without bounds).

    Returns
    -------
    primal, dual, gap : float
    """
    y = np.asarray(y, dtype=np.float64)
    n = y.shape[0]
    if theta is None:
        theta = datafit.dual_point(y, z, s, intercept)
    theta = np.asarray(theta, dtype=np.float64)
    scales = dual_scales(penalty, xt_theta_absmax, n)
    value, conjugates = datafit.value_conjugates(y, z, theta, s, scales)
    primal = value + penalty.value(w)
    dual = dual_from_conjugates(penalty, scales, conjugates, xt_theta_excess_sq, n, box)
    return primal, dual, primal - dual


def dual_scales(penalty: ElasticNet, xt_theta_absmax: float, n: int) -> tuple[float, ...]:
    """The scales ``c`` of ``theta`` whose dual values certify a point: ``theta`` rescaled
    to be feasible for the L1 part (the scikit-learn / celer rule) and, with an L2 part
    (for which ``theta`` itself is feasible too), 1 when the rescaling shrinks it."""
    scale = penalty.dual_feasible_scale(xt_theta_absmax, n)
    if penalty.alpha_l2 > 0.0 and scale < 1.0:
        return (scale, 1.0)
    return (scale,)


def dual_from_conjugates(
    penalty: ElasticNet,
    scales: tuple[float, ...],
    conjugates: tuple[float, ...],
    xt_theta_excess_sq: float,
    n: int,
    box: float = 0.0,
) -> float:
    """The dual value from the datafit's conjugates at :func:`dual_scales`: the better of
    the two when there are two. At the first scale ``c <= 1`` the infinite sides' conjugate
    is 0 and the finite bounds' at most ``c box``; at ``c = 1`` both are exact."""
    dual = -conjugates[0] - scales[0] * box
    if len(conjugates) > 1:
        unscaled = -conjugates[1] - penalty.conjugate_from_stats(xt_theta_excess_sq, n) - box
        dual = max(dual, unscaled)
    return dual


def dual_from_stats(
    penalty: ElasticNet,
    conjugate_at: Callable[[float], float],
    xt_theta_absmax: float,
    xt_theta_excess_sq: float,
    n: int,
    box: float = 0.0,
) -> float:
    """The dual value certifying a point, from ``X^T theta``'s statistics.

    ``conjugate_at(c)`` is the datafit's conjugate term at ``c * theta``. The dual point is
    ``theta`` rescaled to be feasible for the L1 part (the scikit-learn / celer rule); with
    an L2 part, ``theta`` itself is feasible too and the better of the two is kept.
    """
    scales = dual_scales(penalty, xt_theta_absmax, n)
    conjugates = tuple(conjugate_at(c) for c in scales)
    return dual_from_conjugates(penalty, scales, conjugates, xt_theta_excess_sq, n, box)
