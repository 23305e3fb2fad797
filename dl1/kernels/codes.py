"""The kernels' loss codes: one table for every numba kernel that dispatches on a loss.

A compiled kernel cannot take a Python object, so a loss reaches it as an integer; each
datafit declares its own (``code``, :mod:`dl1.objective.datafits`). Numba caches a kernel
with these values folded in, keyed by the kernel's own file: a code, once given, never
changes (append new ones).
"""

#: Squared ``(y - z)^2 / 2``.
SQUARED = 0
#: Logistic ``log(1 + exp(-y z))``.
LOGISTIC = 1
#: Hinge ``max(0, 1 - y z)``.
HINGE = 2
#: Smoothed hinge (Shalev-Shwartz & Zhang, Prox-SDCA, Sec. 5.3), smoothing ``gamma``.
SMOOTH_HINGE = 3
#: Squared hinge ``max(0, 1 - y z)^2``.
SQUARED_HINGE = 4
#: Poisson ``exp(z) - y z`` (log link).
POISSON = 5
#: Huber: ``(y - z)^2 / 2`` within ``epsilon``, linear beyond.
HUBER = 6
