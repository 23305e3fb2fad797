"""Numba linear-algebra kernels on one CSC column block.

A block is given by raw CSC arrays: ``indptr`` (int64, length ``ncols + 1``), ``indices``
(int32 row indices) and ``data`` (float32 or float64). Vectors (``w``, ``v``, ``theta``,
``out``) are float64.

Conventions shared by every kernel of :mod:`dl1.kernels`:

* ``col_scale`` (float64) implements implicit column scaling (e.g. standardisation): column
  ``j`` is used as ``x_j * col_scale[j]``. An **empty** array means no scaling; an array of
  ones gives the same result at the cost of one multiplication per column.
* ``sw`` (float64, length ``n``) are sample weights; an **empty** array means unit weights.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def csc_matvec(indptr, indices, data, col_scale, w, out):
    """Accumulate ``out += X_k @ (col_scale * w)``.

    Parameters
    ----------
    indptr : ndarray of int64, shape (ncols + 1,)
    indices : ndarray of int32, shape (nnz,)
    data : ndarray of float32 or float64, shape (nnz,)
    col_scale : ndarray of float64, shape (ncols,) or (0,)
        Column scaling; empty for none.
    w : ndarray of float64, shape (ncols,)
        Coefficients of the block; zero entries are skipped.
    out : ndarray of float64, shape (n,)
        Accumulator, updated in place.
    """
    ncols = indptr.shape[0] - 1
    has_scale = col_scale.shape[0] > 0
    for j in range(ncols):
        wj = w[j]
        if wj == 0.0:
            continue
        if has_scale:
            wj *= col_scale[j]
        for k in range(indptr[j], indptr[j + 1]):
            out[indices[k]] += data[k] * wj


@njit(nogil=True, cache=True)
def csc_rmatvec(indptr, indices, data, col_scale, v, out):
    """Compute ``out = col_scale * (X_k.T @ v)``.

    Parameters
    ----------
    indptr, indices, data : CSC arrays of the block.
    col_scale : ndarray of float64, shape (ncols,) or (0,)
        Column scaling; empty for none.
    v : ndarray of float64, shape (n,)
    out : ndarray of float64, shape (ncols,)
        Overwritten with the result.
    """
    ncols = indptr.shape[0] - 1
    has_scale = col_scale.shape[0] > 0
    for j in range(ncols):
        acc = 0.0
        for k in range(indptr[j], indptr[j + 1]):
            acc += data[k] * v[indices[k]]
        if has_scale:
            acc *= col_scale[j]
        out[j] = acc


@njit(nogil=True, cache=True)
def csc_col_absmax(indptr, data, col_scale, out):
    """``out[j] = max_i |x_ij col_scale_j|``, the largest entry of each column (0 for an
    empty one)."""
    has_scale = col_scale.shape[0] > 0
    for j in range(indptr.shape[0] - 1):
        top = 0.0
        for k in range(indptr[j], indptr[j + 1]):
            top = max(top, abs(np.float64(data[k])))
        out[j] = top * abs(col_scale[j]) if has_scale else top


@njit(nogil=True, cache=True)
def csc_col_sqnorms(indptr, indices, data, col_scale, sw):
    """Weighted squared column norms ``sum_i sw_i (x_ij col_scale_j)^2``.

    Parameters
    ----------
    indptr, indices, data : CSC arrays of the block.
    col_scale : ndarray of float64, shape (ncols,) or (0,)
        Column scaling; empty for none.
    sw : ndarray of float64, shape (n,) or (0,)
        Sample weights; empty for unit weights.

    Returns
    -------
    ndarray of float64, shape (ncols,)
        The ``col_sqnorm`` argument expected by :func:`dl1.kernels.cd.cd_block_epochs`.
    """
    ncols = indptr.shape[0] - 1
    has_scale = col_scale.shape[0] > 0
    has_sw = sw.shape[0] > 0
    out = np.zeros(ncols, dtype=np.float64)
    for j in range(ncols):
        acc = 0.0
        if has_sw:
            for k in range(indptr[j], indptr[j + 1]):
                x = np.float64(data[k])
                acc += sw[indices[k]] * x * x
        else:
            for k in range(indptr[j], indptr[j + 1]):
                x = np.float64(data[k])
                acc += x * x
        if has_scale:
            acc *= col_scale[j] * col_scale[j]
        out[j] = acc
    return out


#: ``reach``'s ``limit`` for the KKT conditions at 0: a side counts unless its bound is 0.
KKT_SIDES = 0.0
#: ``reach``'s ``limit`` for the dual norm: a side counts only if its bound is infinite (a
#: finite bound makes that side's conjugate finite: :func:`box_conjugate`).
DUAL_SIDES = np.finfo(np.float64).max


@njit(nogil=True, cache=True)
def bound_at(bounds, side, j):  # pragma: no cover - compiled
    """Column ``j``'s lower (``side`` 0) or upper (1) bound. ``bounds`` has shape (2, 0)
    for none (``-inf`` / ``inf``), (2, 1) for one pair for every column, (2, ncols) for a
    pair per column; every pair holds 0 (``lower <= 0 <= upper``)."""
    k = bounds.shape[1]
    if k == 0:
        return -np.inf if side == 0 else np.inf
    return bounds[side, 0 if k == 1 else j]


@njit(nogil=True, cache=True)
def reach(c, j, bounds, limit):  # pragma: no cover - compiled
    """``c`` as a coefficient's sides see it: the largest of ``c`` (when the upper bound
    exceeds ``limit``), ``-c`` (when the lower bound is below ``-limit``) and 0. With no
    bounds it is ``|c|``; with ``lower = 0`` (``positive``) it is ``max(c, 0)``."""
    a = 0.0
    if bound_at(bounds, 1, j) > limit and c > a:
        a = c
    if -bound_at(bounds, 0, j) > limit and -c > a:
        a = -c
    return a


@njit(nogil=True, cache=True)
def weighted_dual(c, j, factors, bounds, limit):  # pragma: no cover - compiled
    """``(e_j, f_j)``: ``c = x_j^T theta`` as the penalty sees it (:func:`reach`, with
    ``limit`` :data:`KKT_SIDES` or :data:`DUAL_SIDES`) divided by column ``j``'s penalty
    factor ``f_j`` (1 when ``factors`` is empty), and ``f_j``; ``e_j = -1`` for an
    unpenalised column (``f_j = 0``), which the dual norm does not constrain."""
    f = factors[j] if factors.shape[0] > 0 else 1.0
    if f <= 0.0:
        return -1.0, 0.0
    return reach(c, j, bounds, limit) / f, f


@njit(nogil=True, cache=True)
def box_conjugate(c, j, factors, bounds, threshold, n, alpha_l2):  # pragma: no cover
    """Column ``j``'s penalty conjugate ``g_j^*(c / n)`` on its sides with a finite bound
    ``beta > 0``: ``sup_{0 <= w <= beta} (e w - f_j alpha_l2 w^2 / 2)`` with ``e = (|c| -
    f_j threshold) / n`` (``threshold = n alpha_l1``), i.e. ``e w* - f_j alpha_l2 w*^2 / 2``
    at ``w* = min(e / (f_j alpha_l2), beta)``, or ``e beta`` without an L2 part; 0 where
    ``e <= 0``. Sides with an infinite bound are the dual norm's (:func:`weighted_dual`)."""
    f = factors[j] if factors.shape[0] > 0 else 1.0
    curv = f * alpha_l2
    out = 0.0
    for side in range(2):
        beta = bound_at(bounds, 1, j) if side == 1 else -bound_at(bounds, 0, j)
        d = c if side == 1 else -c
        if beta <= 0.0 or beta == np.inf or d <= f * threshold:
            continue
        e = (d - f * threshold) / n
        w = beta if curv <= 0.0 else min(e / curv, beta)
        out += e * w - 0.5 * curv * w * w
    return out


@njit(nogil=True, cache=True)
def csc_xt_theta_stats(
    indptr, indices, data, col_scale, theta, threshold, factors, bounds, n, alpha_l2, sides
):  # pragma: no cover - compiled
    """Dual-gap statistics of ``c = col_scale * (X_k.T @ theta)`` without storing ``c``.

    Parameters
    ----------
    indptr, indices, data : CSC arrays of the block.
    col_scale : ndarray of float64, shape (ncols,) or (0,)
        Column scaling; empty for none.
    theta : ndarray of float64, shape (n,)
        Dual point (see :meth:`dl1.objective.datafits.Quadratic.dual_point`).
    threshold : float
        ``n * alpha_l1`` for the elastic-net conjugate (see
        :meth:`dl1.objective.penalties.ElasticNet.xt_theta_stats`).
    factors, bounds
        The block's penalty factors (empty for 1) and bounds (:func:`bound_at`).
    n, alpha_l2 : float
        The number of samples and the L2 part, for :func:`box_conjugate`.
    sides : float
        :data:`DUAL_SIDES` (the certificate) or :data:`KKT_SIDES` (``alpha_max``: every side
        whose bound is not 0), :func:`reach`'s ``limit``.

    Returns
    -------
    absmax : float
        ``max_j e_j`` (0.0 for a block without columns; ``e_j = |c_j|`` without factors or
        signs); the max over blocks is the dual norm of ``X.T theta``.
    excess_sq : float
        ``sum_j f_j (e_j - threshold)_+^2``; sums over blocks.
    box : float
        ``sum_j`` :func:`box_conjugate` (0.0 without finite bounds); sums over blocks.
    """
    ncols = indptr.shape[0] - 1
    has_scale = col_scale.shape[0] > 0
    absmax = 0.0
    excess_sq = 0.0
    box = 0.0
    boxed = bounds.shape[1] > 0
    for j in range(ncols):
        acc = 0.0
        for k in range(indptr[j], indptr[j + 1]):
            acc += data[k] * theta[indices[k]]
        if has_scale:
            acc *= col_scale[j]
        a, f = weighted_dual(acc, j, factors, bounds, sides)
        if a > absmax:
            absmax = a
        if a > threshold:
            excess_sq += f * (a - threshold) * (a - threshold)
        if boxed:
            box += box_conjugate(acc, j, factors, bounds, threshold, n, alpha_l2)
    return absmax, excess_sq, box
