"""The coordinator's check that a solve's numbers are finite, once per round.

Validation (:mod:`dl1.inputs`, :mod:`dl1.row_blocks`,
:func:`dl1.tasks.blocks.check_column_squares`) refuses data whose sums of squares overflow,
but products of valid data can still overflow (a residual
times a column, an extrapolated step). A NaN compares false with every tolerance, so a solve
that met one would run to its round limit, each subproblem to its epoch limit, and return
NaN. The coordinator instead checks the scalars it already reduced each round (gap
statistics, objective, intercept, the norm of a subproblem's update) and stops the solve
with :class:`~dl1.errors.NumericalError` naming the round, the block and the quantity.

Rounding also bounds how far a gap can fall: at an alpha far below any useful value (``n
alpha`` within the rounding of ``X^T theta``), no point's gap gets under the tolerance, each
subproblem runs to its epoch limit and the solve would run to its round limit. The
coordinator stops a solve whose gap has stopped falling (:class:`Progress`) and says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from dl1.cancellation import check_cancelled
from dl1.errors import NumericalError

#: What to do about it, appended to every message.
ADVICE = (
    "X or y holds values whose products overflow float64; rescale them (e.g. standardize "
    "the columns and centre y)"
)


def first_non_finite(quantities: Mapping[str, float]) -> str | None:
    """The name of the first quantity that is not a finite number (None: all finite)."""
    for name, value in quantities.items():
        if not math.isfinite(float(value)):
            return name
    return None


def check_round(
    where: str, r: int, quantities: Mapping[str, float], block_stats: Sequence | None = None
) -> None:
    """Raise :class:`NumericalError` if a scalar of round ``r`` of ``where`` (a solver's
    name) is NaN or infinite; ``block_stats`` (per feature block, ``absmax`` and ``excess``
    attributes) name the first block whose statistics are not finite. A solve whose task
    was cancelled stops here (:func:`dl1.cancellation.check_cancelled`)."""
    check_cancelled(where, r)
    bad = first_non_finite(quantities)
    if bad is None:
        return
    values = ", ".join(f"{k} {float(v):.3g}" for k, v in quantities.items())
    block = ""
    for j, st in enumerate(block_stats or ()):
        if not (math.isfinite(float(st.absmax)) and math.isfinite(float(st.excess))):
            block = f" (first in feature block {j}: max |x_j^T theta| {float(st.absmax):.3g})"
            break
    raise NumericalError(
        f"{where}, round {r}: the {bad} is not finite{block} ({values}); {ADVICE}"
    )


def check_update(where: str, r: int, name: str, *arrays: np.ndarray) -> None:
    """Raise :class:`NumericalError` if an update of round ``r`` (``arrays``, e.g. a
    subproblem's new coefficients and its change of ``X w``) holds a NaN or an infinity."""
    for a in arrays:
        a = np.asarray(a)
        if a.size and not np.isfinite(a).all():
            k = int(np.flatnonzero(~np.isfinite(a.ravel()))[0])
            raise NumericalError(
                f"{where}, round {r}: the {name} is not finite (entry {k} is "
                f"{a.ravel()[k]}); {ADVICE}"
            )


#: The relative fall of a solve's best duality gap that counts as progress.
PROGRESS = 0.01


class Progress:
    """Whether a solve still lowers its duality gap: :meth:`stalled` once the best gap has
    not fallen by :data:`PROGRESS` (relative) for ``patience`` rounds in a row."""

    def __init__(self, patience: int) -> None:
        self.patience = int(patience)
        self.best = math.inf
        self.idle = 0

    def stalled(self, gap: float) -> bool:
        """Record a round's (relative) gap; whether the solve should stop."""
        if gap < (1.0 - PROGRESS) * self.best:
            self.best, self.idle = gap, 0
        else:
            self.idle += 1
        return self.idle >= self.patience

    def reason(self, tol: float) -> str:
        """Why the solve stopped, for its warning and its history."""
        return (
            f"stopped: the duality gap has not fallen by {PROGRESS:.0%} in {self.idle} rounds "
            f"(from {self.best:.3e}; tol {tol:.3e}); rounding or ill-conditioning keeps it "
            "above tol at this alpha: raise alpha or tol"
        )
