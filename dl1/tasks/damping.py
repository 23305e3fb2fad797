"""Levenberg-Marquardt damping of proximal Newton models, shared by the binary
(:mod:`dl1.tasks.prox_newton`) and multinomial (:mod:`dl1.solvers.multinomial_newton`)
solvers.

Where a problem is nearly separable (a working set at weak regularisation, or the first
small working sets of a multiclass fit), ``p (1 - p)`` vanishes on the rows already fitted
and the quadratic model is too flat: its minimiser lies far beyond where the model holds,
and the line search cuts the step by orders of magnitude, so every coordinate's progress is
lost with it. Adding ``damping`` times each column's curvature bound to the model's
curvatures (Levenberg-Marquardt: Moré, "The Levenberg-Marquardt algorithm: implementation
and theory", 1978) shortens the model's step where it was refused and is taken back as
full steps are accepted.
"""

from __future__ import annotations

#: The smallest non-zero damping, in units of a column's curvature bound.
MIN_DAMPING = 1e-3


def next_damping(damping: float, t: float) -> float:
    """The next Newton step's damping after a step whose line search accepted ``t``:
    raised when the step had to be shortened (to the ratio the step was cut by, at most 1),
    lowered fourfold after a full step, and 0 below :data:`MIN_DAMPING`."""
    if t < 1.0:
        return min(max(damping, MIN_DAMPING) / t, 1.0)
    return 0.0 if damping <= MIN_DAMPING else damping / 4.0
