"""The solvers of the penalised problem, by name (``solver=`` of :func:`dl1.fit`,
:func:`dl1.path` and the estimators). A new solver is a module and an entry here."""

from __future__ import annotations

from typing import Any

from dl1.solvers.auto import choose_solver
from dl1.solvers.cd import CoordinateDescentSolver
from dl1.solvers.options import SolverOptions
from dl1.solvers.rda import RDASolver
from dl1.solvers.row_newton import RowNewtonSolver
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
    RowNewtonSolver.name: RowNewtonSolver,
}


def solver_class(name: str) -> type:
    """The registered solver class called ``name``."""
    return SOLVERS[name]


def make_solver(solver: Any, options: SolverOptions, datafit: Any = None) -> Any:
    """The solver called ``solver`` (``"auto"``: :func:`~dl1.solvers.auto.choose_solver`'s
    for ``datafit``) configured from the entry points' ``options``, each class taking those
    it has (its ``from_options``); a solver object is used as it is configured."""
    if not isinstance(solver, str):
        return solver
    if solver == "auto":
        solver = choose_solver(datafit)
    return solver_class(solver).from_options(options)
