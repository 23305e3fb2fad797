"""The solvers of the penalised problem, by name (``solver=`` of :func:`dl1.fit`,
:func:`dl1.path` and the estimators). A new solver is a module and an entry here."""

from __future__ import annotations

from dl1.solvers.cd import CoordinateDescentSolver
from dl1.solvers.rda import RDASolver
from dl1.solvers.sdca import SDCASolver
from dl1.solvers.sgd import FobosSolver, StochasticGradientSolver
from dl1.solvers.smidas import SMIDASSolver
from dl1.solvers.smoothing import SmoothingSolver
from dl1.solvers.ws import WorkingSetSolver

SOLVERS: dict[str, type] = {
    WorkingSetSolver.name: WorkingSetSolver,
    CoordinateDescentSolver.name: CoordinateDescentSolver,
    StochasticGradientSolver.name: StochasticGradientSolver,
    FobosSolver.name: FobosSolver,
    RDASolver.name: RDASolver,
    SDCASolver.name: SDCASolver,
    SMIDASSolver.name: SMIDASSolver,
    SmoothingSolver.name: SmoothingSolver,
}


def solver_class(name: str) -> type:
    """The registered solver class called ``name``."""
    return SOLVERS[name]
