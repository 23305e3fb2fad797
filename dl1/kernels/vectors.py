"""Numba reductions over length-n vectors, without temporaries.

A NumPy expression such as ``((y - z) ** 2).sum()`` allocates a length-n temporary per
operation; on a Dask worker, whose allocator Dask configures to return memory early
(``MALLOC_TRIM_THRESHOLD_``), every such temporary of more than 64 KiB is mapped and
page-faulted afresh, which made these reductions about 3x slower on workers than in a
plain process (``benchmarks/RESULTS.md``). A NumPy dot product of two length-n vectors goes
to BLAS, whose threads (OpenBLAS: one per core) spin waiting for each other when the cores
are busy: on a loaded machine that made a path's gap computations several times slower.
Sums are blocked (:data:`BLOCK` terms summed in order, then the blocks' sums), so rounding
grows like ``BLOCK + n / BLOCK``, not ``n``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: Terms summed in order before a partial sum is added to the total.
BLOCK = 1024


@njit(nogil=True, cache=True)
def residual_sums(y, z, sw):
    """``(sum_i s_i r_i, sum_i s_i r_i^2, sum_i s_i)`` of the residual ``r = y - z``.

    Parameters
    ----------
    y, z : ndarray of float64, shape (n,)
    sw : ndarray of float64, shape (n,) or (0,)
        Sample weights; empty for unit weights (the last sum is then ``n``).
    """
    n = y.shape[0]
    weighted = sw.shape[0] > 0
    t1 = 0.0
    t2 = 0.0
    ts = 0.0
    for lo in range(0, n, BLOCK):
        p1 = 0.0
        p2 = 0.0
        ps = 0.0
        for i in range(lo, min(lo + BLOCK, n)):
            r = y[i] - z[i]
            if weighted:
                s = sw[i]
                p1 += s * r
                p2 += s * r * r
                ps += s
            else:
                p1 += r
                p2 += r * r
        t1 += p1
        t2 += p2
        ts += ps
    if not weighted:
        ts = float(n)
    return t1, t2, ts


@njit(nogil=True, cache=True, fastmath=False)
def neumaier_add(total, comp, v):
    """``total + v`` and the updated compensation ``comp`` (Neumaier's summation).

    ``fastmath=False`` is stated, not left to the default: numba compiles a callee with the
    fast-math flags of its first caller unless it sets its own, and reassociation reduces
    the compensation ``(total - u) + v`` to 0 (the fused margin kernels that call this one
    are fast-math)."""
    u = total + v
    if abs(total) >= abs(v):
        comp += (total - u) + v
    else:
        comp += (v - u) + total
    return u, comp


@njit(nogil=True, cache=True)
def dual_sums(y, theta, sw):
    """``(sum_i theta_i^2 / s_i, sum_i theta_i y_i)``: the squared loss's conjugate at
    ``c theta`` is ``(c^2 q / 2 - c l) / n`` for every ``c`` (``F^*``, see
    :meth:`dl1.objective.datafits.quadratic.Quadratic.conjugate`).

    Both sums are compensated (Neumaier): near the optimum the dual value nearly cancels
    the primal one, and the gap's rounding floor is then that of the last few operations
    (tests require gaps below 1e-15 on small problems).

    Parameters
    ----------
    y, theta : ndarray of float64, shape (n,)
    sw : ndarray of float64, shape (n,) or (0,)
        Sample weights; empty for unit weights. A term with ``s_i = 0`` is 0 when
        ``theta_i = 0`` and makes the first sum ``inf`` otherwise (outside ``F^*``'s domain).
    """
    n = y.shape[0]
    weighted = sw.shape[0] > 0
    tq, cq, tl, cl = 0.0, 0.0, 0.0, 0.0
    for i in range(n):
        t = theta[i]
        tl, cl = neumaier_add(tl, cl, t * y[i])
        if not weighted:
            tq, cq = neumaier_add(tq, cq, t * t)
        elif sw[i] > 0.0:
            tq, cq = neumaier_add(tq, cq, t * t / sw[i])
        elif t != 0.0:
            return np.inf, tl + cl
    return tq + cq, tl + cl
