"""Datafits ``F(z) = (1/n) sum_i s_i loss(y_i, z_i)`` (plain picklable classes).

Each datafit exposes ``beta`` (bound on ``loss''``), ``validate_y``, ``value``, ``gradient``,
``initial_intercept``, ``intercept_update``, ``dual_point`` and ``conjugate``; see
:mod:`dl1.objective.gap` for the dual scaling.
"""

from dl1.objective.datafits.hinge import Hinge, SmoothHinge
from dl1.objective.datafits.logistic import Logistic
from dl1.objective.datafits.quadratic import Quadratic, normalize_sample_weight
from dl1.objective.datafits.squared_hinge import SquaredHinge

__all__ = [
    "Hinge", "Logistic", "Quadratic", "SmoothHinge", "SquaredHinge", "normalize_sample_weight",
]
