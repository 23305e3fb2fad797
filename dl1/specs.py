"""One call of an entry point as a frozen record, built once its keywords are validated: what
is minimised (:class:`Model`), on what data (:class:`Data`), by which solver object, where
and how it runs (:class:`Execution`). Everything after the entry point reads the record;
a call solved in one piece travels as its record, and the worker runs the same core
function on it (:func:`dl1.routing.solved_here`), not the public entry point again."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

from dl1.objective.penalties.elastic_net import ElasticNet
from dl1.runtime.one_piece import Refusal, excluded


@dataclass(frozen=True)
class Data:
    """The data of a call: ``X`` and, beside it, the arrays that may be large (they travel
    to a worker as a task's arguments or dependencies, :meth:`arrays`)."""

    X: Any
    y: Any = None
    sample_weight: Any = None
    split: str = "train"
    X_test: Any = None
    y_test: Any = None

    def arrays(self) -> dict[str, Any]:
        """The arrays beside ``X``, by name."""
        return {"y": self.y, "sample_weight": self.sample_weight, "X_test": self.X_test,
                "y_test": self.y_test}  # fmt: skip


@dataclass(frozen=True)
class Model:
    """What is minimised: the loss (a name or a datafit), the penalty (a path's at alpha 1),
    the unpenalised intercept, the implicit standardisation, and the relative duality gap
    that certifies a solution."""

    loss: Any
    penalty: ElasticNet
    fit_intercept: bool = True
    standardize: bool = False
    tol: float = 1e-4


@dataclass(frozen=True)
class Grid:
    """A path's alphas: given, or ``n_alphas`` from ``alpha_max`` down to ``eps`` times it
    (geometric)."""

    alphas: Any = None
    n_alphas: int = 100
    eps: float = 1e-2


@dataclass(frozen=True)
class Execution:
    """Where and how a call runs: its cluster (None: this process), the partitions of the
    feature blocks, out of core or not (None: the rule), a line per round or alpha, a
    path's per-alpha callback and checkpoint."""

    client: Any = None
    n_partitions: int = 2
    stream: bool | None = None
    verbose: bool = False
    callback: Any = None
    checkpoint: Any = None

    def refusal(self) -> Refusal | None:
        """What keeps the call in the coordinating process (not solved in one piece)."""
        return excluded(stream=self.stream, checkpoint=self.checkpoint, verbose=self.verbose)


@dataclass(frozen=True)
class Call:
    """A validated call: the fields every entry point's record has (see the module)."""

    data: Data
    model: Model
    solver: Any
    execution: Execution

    @property
    def callback(self) -> Any:
        """The call's progress callback (a fit's is its solver's, called per round)."""
        return self.execution.callback

    def travelling(self) -> Call:
        """This call as it travels to a worker: without its data (which travels beside it),
        its client and its callback (relayed, :class:`dl1.runtime.one_piece.Listener`)."""
        return self.arrived(Data(None, split=self.data.split), client=None, callback=None)

    def arrived(self, data: Data, client: Any, callback: Any) -> Call:
        """This call on ``data`` and ``client``, with ``callback`` as its progress callback."""
        execution = dataclasses.replace(self.execution, client=client)
        return dataclasses.replace(self, data=data, execution=execution).with_callback(callback)

    def with_callback(self, callback: Any) -> Call:
        """This call with ``callback`` as its progress callback."""
        execution = dataclasses.replace(self.execution, callback=callback)
        return dataclasses.replace(self, execution=execution)


def solver_with_callback(solver: Any, callback: Any) -> Any:
    """A copy of ``solver`` calling ``callback`` per round (the caller's object keeps its
    own)."""
    solver = copy.copy(solver)
    solver.callback = callback
    return solver
