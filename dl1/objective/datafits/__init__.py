"""Datafits ``F(z) = (1/n) sum_i s_i loss(y_i, z_i)`` (plain picklable classes), one loss
per module, and the registry of losses built from them.

Each datafit exposes ``beta`` (bound on ``loss''``), ``validate_y``, ``value``, ``gradient``,
``initial_intercept``, ``intercept_update``, ``dual_point`` and ``conjugate``; see
:mod:`dl1.objective.gap` for the dual scaling. What it declares about its loss (name, code,
scoring, scikit-learn equivalent): :class:`~dl1.objective.datafits.base.Datafit`. A new
loss is a new module and one line of :data:`DATAFITS`.
"""

from __future__ import annotations

from typing import Any

from dl1.errors import ValidationError
from dl1.objective.datafits.base import Datafit
from dl1.objective.datafits.hinge import Hinge, SmoothHinge
from dl1.objective.datafits.huber import Huber
from dl1.objective.datafits.logistic import Logistic
from dl1.objective.datafits.poisson import Poisson
from dl1.objective.datafits.quadratic import Quadratic, normalize_sample_weight
from dl1.objective.datafits.squared_hinge import SquaredHinge

#: The losses, by the name users pass (``loss=``).
DATAFITS: dict[str, type] = {
    cls.name: cls for cls in (Quadratic, Logistic, Hinge, SmoothHinge, SquaredHinge, Poisson, Huber)
}
#: Every loss name, and those that classify (labels in {-1, +1}).
LOSSES: tuple[str, ...] = tuple(DATAFITS)
CLASSIFICATION_LOSSES: tuple[str, ...] = tuple(n for n, c in DATAFITS.items() if c.classifies)


def datafit_class(loss: Any) -> type:
    """The datafit class of loss ``loss`` (a name, or a datafit of a registered class); an
    unknown one is refused, listing the losses."""
    if type(loss) in DATAFITS.values():
        return type(loss)
    cls = DATAFITS.get(loss) if isinstance(loss, str) else None
    if cls is None:
        raise ValidationError(f"loss must be one of {', '.join(map(repr, LOSSES))}; got {loss!r}")
    return cls


def make_datafit(loss: Any) -> Any:
    """The datafit of ``loss``: a loss name (the datafit's defaults) or a datafit with its
    own parameters (such as ``Huber(epsilon=2.0)``), refused as :func:`datafit_class`."""
    cls = datafit_class(loss)
    return loss if isinstance(loss, cls) else cls()


def loss_name(loss: Any) -> str:
    """The name of ``loss`` (a name or a datafit), refused as :func:`datafit_class`."""
    return datafit_class(loss).name


__all__ = [
    "CLASSIFICATION_LOSSES",
    "DATAFITS",
    "Datafit",
    "Hinge",
    "Huber",
    "LOSSES",
    "Logistic",
    "Poisson",
    "Quadratic",
    "SmoothHinge",
    "SquaredHinge",
    "datafit_class",
    "loss_name",
    "make_datafit",
    "normalize_sample_weight",
]
