"""Test helpers: a working-set solve on loaded blocks, as dl1.fit would run it."""

from __future__ import annotations

from typing import Any

import numpy as np

from dl1.inputs import read_inputs
from dl1.loading import load_blocks
from dl1.solvers.base import Problem, WarmState, WorkingSetBudget
from dl1.solvers.ws import WorkingSetSolver

BUDGET_KEYS = ("col_bytes", "cache_max", "gather_max", "dense_max")


def load_blocks_for_test(ex: Any, X: Any, y: Any = None, sw: Any = None, *, stream: bool = False):
    """``(blocks, col_bounds, y, sample weights, datafit)`` of ``X`` loaded by ``ex`` in two
    partitions (in worker memory, or as sources read by every task with ``stream``)."""
    inputs = read_inputs(X, y, sw, "squared", "train")
    blocks, cb = load_blocks(
        ex, inputs.X, inputs.sample_weight, False, True, 2, inputs.store, "train", stream
    )
    if not stream:
        ex.wait(blocks)
    return blocks, cb, inputs.y, inputs.sample_weight, inputs.datafit, inputs.store


def solve_ws(
    ex: Any,
    blocks: list[Any],
    cb: np.ndarray,
    y: np.ndarray,
    sw: np.ndarray,
    datafit: Any,
    penalty: Any,
    *,
    fit_intercept: bool = True,
    tol: float = 1e-4,
    n_partitions: int = 2,
    warm: WarmState | None = None,
    **kw: Any,
):
    """A :class:`WorkingSetSolver` solve: the keywords of :class:`WorkingSetBudget` build the
    problem's budget, the others configure the solver. Returns ``(result, state)``."""
    budget = WorkingSetBudget(**{k: kw.pop(k) for k in BUDGET_KEYS if k in kw})
    problem = Problem(
        ex, blocks, cb, y, sw, datafit, penalty, fit_intercept, tol, n_partitions,
        budget=budget,
    )  # fmt: skip
    return WorkingSetSolver(**kw).solve(problem, warm)
