"""The path loop: one solver, a grid of penalties, warm starts from one alpha to the next.

It knows nothing of the solver beyond :class:`dl1.solvers.base.Solver`: each alpha is
``solver.solve(problem.at(penalty), state)``, and the state it returns starts the next. The
constrained problem walks its radii the same way (``problem.at(delta)``).
With a checkpoint, every state is made :meth:`~dl1.solvers.base.WarmState.reproducible`
first, so that a resumed run (starting from the state the checkpoint saved) repeats the
interrupted one bit for bit.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dl1.solvers.base import Problem, Solver, WarmState
from dl1.solvers.result import FitResult, convergence_warning


@dataclass(frozen=True)
class AlphaStep:
    """One alpha of a path as the loop hands it on: its index and value, the solver's
    result and end state, and the seconds the solve took."""

    k: int
    alpha: float
    result: FitResult
    state: WarmState
    seconds: float


def walk(
    solver: Solver,
    problem: Problem | Any,
    alphas: np.ndarray,
    penalty_at: Callable[[float], Any],
    on_alpha: Callable[[AlphaStep], None],
    *,
    state: WarmState | None = None,
    start: int = 0,
    reproducible: bool = False,
) -> WarmState | None:
    """Solve ``problem`` at ``penalty_at(alphas[k])`` for ``k = start, ...``, each warm-started
    from the previous state (``state``: where alpha ``start - 1`` ended); ``on_alpha`` gets
    every :class:`AlphaStep`. An alpha not certified does not warn here (the caller
    collects them); the workers' caches are released at the end. Returns the last state.
    """
    try:
        for k in range(start, alphas.shape[0]):
            alpha = float(alphas[k])
            if reproducible and state is not None:
                state = state.reproducible()
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", convergence_warning())
                res, state = solver.solve(problem.at(penalty_at(alpha)), state)
            on_alpha(AlphaStep(k, alpha, res, state, time.perf_counter() - t0))
    finally:
        solver.release(problem, state)
    return state
