"""The solver keywords of the entry points (``dl1.fit``, ``dl1.path``, the estimators) as one
record: each solver class takes the ones it has (its ``from_options``), so that a solver's
options live on the solver object, not in the entry points' code."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Rounds at most when the caller gives no ``max_rounds``.
DEFAULT_MAX_ROUNDS = 1000


@dataclass(frozen=True)
class SolverOptions:
    """The entry points' solver keywords; None: the solver's own default."""

    max_rounds: int | None = None
    max_epochs: int | None = None
    n_epochs: int = 1
    random_order: bool = False
    seed: int = 0
    screen: bool = False
    spread: bool | str | None = None
    #: paths: warm-started from the previous alpha, the working set is usually right, so
    #: its subproblem is solved to the target gap at once (one pass per alpha, not two)
    tight_inner: bool = False
    verbose: bool = False
    callback: Any = None

    @property
    def rounds(self) -> int:
        """``max_rounds``, or :data:`DEFAULT_MAX_ROUNDS`."""
        return DEFAULT_MAX_ROUNDS if self.max_rounds is None else self.max_rounds

    @property
    def epochs(self) -> dict[str, int]:
        """``max_epochs`` as a keyword of the sample-wise solvers, when given."""
        return {} if self.max_epochs is None else {"max_epochs": self.max_epochs}
