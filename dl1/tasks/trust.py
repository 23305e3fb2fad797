"""A trust region for proximal Newton steps on the margin losses: a box on each coordinate's
step, in units of the largest margin change it makes.

Rows deep in the logistic loss's linear part (misclassified by a margin of 9: ``p (1 - p)``
about 1e-4) give a column holding only such rows a curvature 1e4 times too small where the
step leads: the model's minimiser moves that column by thousands, and the line search cuts
the whole step, every other coordinate's progress with it, by 2^8 (Debian's descriptions at
C = 1, the first step after the working set grew). Damping (:mod:`dl1.tasks.damping`) reacts
after such a cut, uniformly; the box prevents it: a coordinate's step is kept to margin
changes of at most ``radius`` (``|d_j| max_i |x_ij| <= radius``), where the logistic loss's
curvature changes by at most ``e^radius`` (its third derivative is bounded by its second:
Bach, "Self-concordant analysis for logistic regression", EJS 2010). The radius starts at
the loss's :attr:`~dl1.objective.datafits.base.Datafit.newton_reach` for each subproblem
(where the columns the working set gained start at 0), halves after a shortened step and
doubles after a whole one (the classical trust-region update; Nocedal & Wright, "Numerical
Optimization", 2006, Alg. 4.1, with the step's acceptance for the ratio of actual to
predicted decrease). Widened rather than dropped, the box keeps the step after a whole
one from overshooting: without it, at weak regularisation, the line search alternates whole
steps and steps cut to 1/4 or 1/8 that gain a few parts in a million each
(benchmarks/RESULTS.md, "a trust region kept").
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dl1.kernels.linalg import csc_col_absmax

#: The radius's divisor after a shortened step and its factor after a whole one.
TRUST_FACTOR = 2.0
#: No box (the kernels' empty array).
NO_REACH = np.zeros(0)


class TrustBox:
    """The box of one subproblem's Newton steps: ``radius`` over each column's largest
    entry (``inv_top``, the inverse; inf for an empty column). An infinite radius is no
    box."""

    def __init__(self, radius: float, inv_top: np.ndarray) -> None:
        self.radius = radius
        self.inv_top = inv_top

    @classmethod
    def of(cls, indptr: np.ndarray, data: np.ndarray, scale: np.ndarray,
           datafit: Any) -> TrustBox:  # fmt: skip
        """The box of a working set's columns for ``datafit``'s first radius."""
        radius = float(datafit.newton_reach)
        if math.isinf(radius):
            return cls(radius, NO_REACH)
        top = np.empty(indptr.shape[0] - 1)
        csc_col_absmax(indptr, data, scale, top)
        with np.errstate(divide="ignore"):
            return cls(radius, 1.0 / top)

    def reach(self) -> np.ndarray:
        """Each column's bound on ``|d_j|`` (empty: none)."""
        return NO_REACH if math.isinf(self.radius) else self.radius * self.inv_top

    def update(self, t: float) -> None:
        """After a step whose line search accepted ``t``: a whole step widens the box by
        :data:`TRUST_FACTOR`, a shortened one narrows it by as much."""
        self.radius = self.radius * TRUST_FACTOR if t == 1.0 else self.radius / TRUST_FACTOR
