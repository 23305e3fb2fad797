"""Fused scan of one block for working sets and gap-safe screening.

Gap-safe sphere test (Ndiaye, Fercoq, Gramfort & Salmon, "Gap safe screening rules for
sparsity enforcing penalties", JMLR 2017, Thm. 6): if ``theta`` is dual feasible with duality
gap ``G`` and the dual is ``mu``-strongly concave, the optimal dual point lies in the ball of
radius ``r = sqrt(2 G / mu)`` around ``theta``, so feature ``j`` is zero at every optimum when
``|x_j^T theta| + r ||x_j|| < n alpha_l1``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from dl1.kernels.linalg import DUAL_SIDES, KKT_SIDES, box_conjugate, weighted_dual
from dl1.kernels.vectors import BLOCK


@njit(nogil=True, cache=True)
def csc_scan_screen(
    indptr, indices, data, col_scale, cols, theta, theta_prev, prev_scale, radius, threshold
):  # pragma: no cover - compiled
    """``c_j = x_j^T theta`` on the columns ``cols`` and the sphere test of the previous point.

    Parameters
    ----------
    indptr, indices, data : CSC arrays of the block.
    col_scale : ndarray of float64, (ncols,) or (0,) for no scaling.
    cols : ndarray of int64, the alive (unscreened) columns to visit.
    theta : ndarray (n,), the current dual point (unscaled).
    theta_prev : ndarray (n,) or (0,), the previous point's dual point; empty: no test.
    prev_scale : float, the factor making ``prev_scale * theta_prev`` dual feasible.
    radius : float, the safe radius of the previous point.
    threshold : float, ``n * alpha_l1``.

    Returns
    -------
    c : ndarray (len(cols),), ``c_j`` of the visited columns (scaled columns).
    keep : bool ndarray (len(cols),), False for columns the test proves to be zero.
    """
    m = cols.shape[0]
    c = np.empty(m)
    keep = np.ones(m, dtype=np.bool_)
    test = theta_prev.shape[0] > 0
    has_scale = col_scale.shape[0] > 0
    for t in range(m):
        j = cols[t]
        a = 0.0
        b = 0.0
        sq = 0.0
        if test:
            for k in range(indptr[j], indptr[j + 1]):
                i = indices[k]
                x = data[k]
                a += x * theta[i]
                b += x * theta_prev[i]
                sq += x * x
        else:
            for k in range(indptr[j], indptr[j + 1]):
                a += data[k] * theta[indices[k]]
        if has_scale:
            s = col_scale[j]
            a *= s
            b *= s
            sq *= s * s
        c[t] = a
        if test and prev_scale * abs(b) + radius * np.sqrt(sq) < threshold:
            keep[t] = False
    return c, keep


@njit(nogil=True, cache=True)
def violation_scores(
    c, threshold, cols, col_sqnorm, support, factors, bounds, n, alpha_l2
):  # pragma: no cover - compiled
    """Turn ``c = X^T theta`` of the visited columns into working-set scores, in place.

    ``c_t`` becomes the KKT violation ``e_t - threshold`` of column ``cols[t]``, where
    ``e_t`` is ``|c_t|`` divided by the column's penalty factor, over the sides its bounds
    leave open at 0 (``max(c_t, 0)`` for coefficients kept ``>= 0``:
    :func:`~dl1.kernels.linalg.weighted_dual` with ``KKT_SIDES``); or
    ``-inf`` for a column of the support (``support``: sorted local ids, already in the
    working set), an empty one (``col_sqnorm == 0``, never worth a place) or an unpenalised
    one (factor 0: the solver keeps those in every working set). ``cols`` is sorted;
    ``factors`` and ``bounds`` are indexed by local column (empty for 1 and for none).

    Returns
    -------
    absmax : float, ``max_t e_t`` over the sides with an infinite bound (the dual norm's
        part of these columns).
    excess : float, ``sum_t f_t (e_t - threshold)_+^2`` over the same sides, summed in
        blocks of :data:`~dl1.kernels.vectors.BLOCK` terms.
    box : float, the finite bounds' conjugate terms
        (:func:`~dl1.kernels.linalg.box_conjugate`).
    """
    absmax = 0.0
    excess = 0.0
    part = 0.0
    box = 0.0
    boxed = bounds.shape[1] > 0
    k = 0
    for t in range(c.shape[0]):
        j = cols[t]
        a, f = weighted_dual(c[t], j, factors, bounds, DUAL_SIDES)
        if a > absmax:
            absmax = a
        e = a - threshold
        if e > 0.0:
            part += f * e * e
        if boxed:
            box += box_conjugate(c[t], j, factors, bounds, threshold, n, alpha_l2)
            a, f = weighted_dual(c[t], j, factors, bounds, KKT_SIDES)
            e = a - threshold
        if (t + 1) % BLOCK == 0:
            excess += part
            part = 0.0
        while k < support.shape[0] and support[k] < j:
            k += 1
        if (k < support.shape[0] and support[k] == j) or col_sqnorm[j] == 0.0 or f == 0.0:
            c[t] = -np.inf
        else:
            c[t] = e
    return absmax, excess + part, box


@njit(nogil=True, cache=True)
def _ranks_before(score, a, b):  # pragma: no cover - compiled
    """Whether position ``a`` ranks before ``b``: a higher score, ties to the lower position."""
    return score[a] > score[b] or (score[a] == score[b] and a < b)


@njit(nogil=True, cache=True)
def _sift_down(heap, size, i, score):  # pragma: no cover - compiled
    """Restore the heap below ``i``: every parent ranks after its children (the root last)."""
    while True:
        worst = i
        for child in (2 * i + 1, 2 * i + 2):
            if child < size and _ranks_before(score, heap[worst], heap[child]):
                worst = child
        if worst == i:
            return
        heap[i], heap[worst] = heap[worst], heap[i]
        i = worst


#: :func:`top_scores` keeps a heap when at most one score in this many is wanted (measured
#: crossover with the partial sort: 1 in 32 to 1 in 128, from 50,000 to a million scores).
HEAP_RATIO = 64


def top_scores(score: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` best finite scores, best first (ties to the lower position).

    ``-inf`` (the support, empty columns) and NaN never join. A few of many (the usual
    working set's share of a block) through a heap (:func:`top_scores_heap`), else by a
    partial sort; both give the same positions in the same order.
    """
    if k * HEAP_RATIO <= score.shape[0]:
        return top_scores_heap(score, k)
    ok = np.flatnonzero(score > -np.inf)
    s = score[ok]
    if ok.shape[0] > k:  # those at least the k-th best: ties at it still to be broken
        keep = s >= np.partition(s, ok.shape[0] - k)[ok.shape[0] - k]
        ok, s = ok[keep], s[keep]
    return ok[np.lexsort((ok, -s))[:k]]


@njit(nogil=True, cache=True)
def top_scores_heap(score, k):  # pragma: no cover - compiled
    """:func:`top_scores` by a heap of the ``k`` best so far, its worst at the root: most
    scores lose to the root in one comparison, so ``m`` scores cost ``O(m)`` plus
    ``O(log k)`` per score that joins, where a partial sort moves them all."""
    k = min(k, score.shape[0])
    heap = np.empty(k, dtype=np.int64)
    size = 0
    for t in range(score.shape[0]):
        if not score[t] > -np.inf:
            continue
        if size < k:  # sift up
            i = size
            heap[i] = t
            size += 1
            while i > 0 and _ranks_before(score, heap[(i - 1) // 2], heap[i]):
                p = (i - 1) // 2
                heap[i], heap[p] = heap[p], heap[i]
                i = p
        elif size and _ranks_before(score, t, heap[0]):
            heap[0] = t
            _sift_down(heap, size, 0, score)
    out = np.empty(size, dtype=np.int64)
    for r in range(size - 1, -1, -1):  # pop the worst into the last free place
        out[r] = heap[0]
        size -= 1
        heap[0] = heap[size]
        _sift_down(heap, size, 0, score)
    return out
