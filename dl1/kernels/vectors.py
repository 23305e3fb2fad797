"""Numba reductions over length-n vectors, without temporaries.

A NumPy expression such as ``((y - z) ** 2).sum()`` allocates a length-n temporary per
operation; on a Dask worker, whose allocator Dask configures to return memory early
(``MALLOC_TRIM_THRESHOLD_``), every such temporary of more than 64 KiB is mapped and
page-faulted afresh, which made these reductions about 3x slower on workers than in a
plain process (``benchmarks/RESULTS.md``). Sums are blocked (:data:`BLOCK` terms summed in
order, then the blocks' sums), so rounding grows like ``BLOCK + n / BLOCK``, not ``n``.
"""

from __future__ import annotations

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
