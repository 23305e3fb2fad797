"""The interface every solver of the penalised problem implements.

A solver is an object configured by its constructor. ``solve(problem, warm)`` runs one
penalty (one alpha) to the problem's tolerance and returns the :class:`FitResult` and the
:class:`WarmState` the next alpha of a path starts from; the path loop
(:func:`dl1.paths.loop.walk`) and :func:`dl1.fit` know nothing else about it. A new solver
is a module defining such a class, registered in
:data:`dl1.solvers.registry.SOLVERS`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, NamedTuple, Protocol

import numpy as np

from dl1.solvers.options import SolverOptions
from dl1.solvers.result import FitResult
from dl1.tasks.blocks import BlockSource


class DataHandles(NamedTuple):
    """Task handles of the constants every subproblem reads (``y`` and the sample
    weights), made once per problem so they travel to a worker once."""

    y: Any
    sample_weight: Any


class RowData(NamedTuple):
    """The row blocks of the solvers that work by samples: their handles, first rows (and
    n), the blocks of each partition (one worker's share), the largest squared row norm and
    each column's sum of squares (unweighted; both from the loading's checks)."""

    blocks: list[Any]
    row_bounds: np.ndarray
    parts: list[list[int]]
    row_sqnorm_max: float
    col_sq: np.ndarray


@dataclass(frozen=True)
class WorkingSetBudget:
    """What the workers can hold, for solvers that gather columns.

    ``dense_max``: elements of the scratch densifying new columns for a Gram matrix.
    ``gather_max``: bytes of columns one worker may gather. ``col_bytes``: bytes of each
    column once extracted (None: no bound); ``cache_max``: bytes of a working set's columns
    the workers may cache together.
    """

    dense_max: int = 1 << 25
    gather_max: float = np.inf
    col_bytes: np.ndarray | None = None
    cache_max: float = np.inf


@dataclass(frozen=True)
class Problem:
    """One penalised problem on loaded data: ``datafit(X w + b) + penalty(w)``.

    ``blocks`` are the executor's handles of the feature blocks (in worker memory or
    sources read from the store), ``col_bounds`` their first columns (and p);
    ``sample_weight`` is normalised to sum to n, empty when there are none. Solvers that
    work by samples (``layout = "rows"``) get ``rows`` instead of feature blocks. The
    penalty changes along a path (:meth:`at`); everything else stays.
    """

    executor: Any
    blocks: list[Any]
    col_bounds: np.ndarray
    y: np.ndarray
    sample_weight: np.ndarray
    datafit: Any
    penalty: Any
    fit_intercept: bool = True
    tol: float = 1e-4
    n_partitions: int = 2
    budget: WorkingSetBudget = field(default_factory=WorkingSetBudget)
    handles: DataHandles | None = None
    rows: RowData | None = None

    def at(self, penalty: Any) -> Problem:
        """The same data and settings with another penalty."""
        return replace(self, penalty=penalty)

    @property
    def loss(self) -> str:
        """The loss's name (its datafit's)."""
        return str(self.datafit.name)

    @property
    def n(self) -> int:
        return int(self.y.shape[0])

    @property
    def p(self) -> int:
        return int(self.col_bounds[-1])

    @property
    def streamed(self) -> bool:
        """Out of core: the blocks are sources, read from the store by every task."""
        return bool(self.blocks) and isinstance(self.blocks[0], BlockSource)

    @property
    def weights(self) -> np.ndarray | None:
        """The sample weights, or None (the datafits' convention)."""
        return None if self.sample_weight.shape[0] == 0 else self.sample_weight

    @cached_property
    def partitions(self) -> list[list[int]]:
        """Consecutive groups of blocks sharing one local model (CoCoA+ sigma')."""
        k = len(self.blocks)
        count = max(1, min(self.n_partitions, k))
        return [[int(j) for j in part] for part in np.array_split(np.arange(k), count)]

    @cached_property
    def part_of_block(self) -> np.ndarray:
        out = np.zeros(len(self.blocks), dtype=np.int64)
        for q, part in enumerate(self.partitions):
            out[part] = q
        return out

    def initial_intercept(self) -> float:
        """The intercept of ``w = 0`` (0 without one)."""
        if not self.fit_intercept:
            return 0.0
        return float(self.datafit.initial_intercept(self.y, self.weights))

    @cached_property
    def p_zero(self) -> float:
        """``P(0)``, the objective at ``w = 0`` with the intercept fitted: tolerances are
        relative to it."""
        z = np.full(self.n, self.initial_intercept())
        return float(self.datafit.value(self.y, z, self.weights))

    def relative_gap(self, gap: float) -> float:
        """``gap / P(0)``, the figure ``tol`` bounds (the gap itself when ``P(0) = 0``)."""
        return gap / self.p_zero if self.p_zero > 0 else gap


@dataclass(frozen=True)
class WarmState:
    """Where a solve ended, for the next one to start from: the coefficients (in the
    solver's scale), the intercept and ``z = X w + b``. Solvers extend it with their own
    caches (see :class:`dl1.solvers.ws.WorkingSetState`)."""

    coef: np.ndarray
    intercept: float
    z: np.ndarray

    def checkpoint_arrays(self) -> dict[str, np.ndarray]:
        """The arrays a checkpoint keeps so that a resumed path continues bit for bit."""
        return {"w": self.coef, "z": self.z}

    def reproducible(self) -> WarmState:
        """This state without caches whose rounding a resumed run could not repeat."""
        return self


class Solver(Protocol):
    """What :func:`dl1.fit` and the path loop need of a solver."""

    name: str
    #: whether the rounds gain from direct calls to the workers (:mod:`dl1.runtime.rpc`)
    direct_calls: bool
    #: the data it reads: feature blocks (``"columns"``) or row blocks (``"rows"``)
    layout: str
    #: whether its states carry ``z = X w + b`` on the coordinator (a data handle's
    #: cross-validation scores the held-out rows from it)
    returns_z: bool

    @classmethod
    def from_options(cls, options: SolverOptions) -> Solver:
        """The solver configured from the entry points' keywords (those it has)."""
        ...

    def solve(self, problem: Problem, warm: WarmState | None = None) -> tuple[
        FitResult, WarmState
    ]:
        """Solve ``problem`` to its tolerance, starting from ``warm`` (None: from zero)."""
        ...

    def restore(self, problem: Problem, arrays: dict[str, np.ndarray], intercept: float) -> (
        WarmState
    ):
        """The state a checkpoint's ``arrays`` (:meth:`WarmState.checkpoint_arrays`) saved,
        at ``problem`` (the penalty of the alpha they ended)."""
        ...

    def release(self, problem: Problem, state: WarmState | None) -> None:
        """Free what the workers cache for ``state`` (end of a fit or a path)."""
        ...
