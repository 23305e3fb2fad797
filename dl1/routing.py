"""A call's route, decided once before any solving (:func:`plan_execution`): the checks that
refuse it early; whether it is solved in one piece on a worker (:mod:`dl1.runtime.one_piece`,
the worker running the entry point's core function on the call's record) or its inputs are
read here; out of core or not; with direct calls to the workers or tasks only."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import dask
import numpy as np

from dl1.errors import ValidationError
from dl1.inputs import read_inputs
from dl1.loading import decide_stream
from dl1.objective.datafits import make_datafit
from dl1.runtime import one_piece
from dl1.runtime.executor import executor_for
from dl1.runtime.memory import DataFloor
from dl1.runtime.rpc import rpc_executor
from dl1.specs import Call


def check_call(inputs: Any, client: Any, solver: Any, loss: str, n_partitions: int) -> None:
    """Refuse before any work a non-smooth loss for the solvers that need a curvature
    bound, and a data handle of another cluster or partitioning."""
    check_solver(inputs.datafit, solver, loss)
    check_dataset(inputs, client, n_partitions)


def check_solver(datafit: Any, solver: Any, loss: str) -> None:
    """Refuse a non-smooth loss for the solvers that need a curvature bound, and a loss
    whose curvature has no bound (Poisson) for all but the working-set solver without
    screening (its proximal Newton steps need no bound)."""
    smooths = getattr(solver, "smooths", False)  # it smooths the loss itself
    if solver.layout == "columns" and not smooths and not datafit.smooth:
        raise ValidationError(
            f"loss={loss!r} is not smooth: solver={solver.name!r} needs a bound on "
            "its curvature; use 'smoothing' or a sample-wise solver ('sdca', 'sgd', 'fobos', "
            "'rda', 'smidas'), or loss='smooth_hinge'"
        )
    if datafit.smooth and not np.isfinite(datafit.beta):
        if solver.name != "ws" or getattr(solver, "screen", False):
            raise ValidationError(
                f"loss={loss!r} has no bound on its curvature: only solver='ws' without "
                f"screening fits it (its proximal Newton steps need none), not "
                f"solver={solver.name!r}" + (" with screen=True" if solver.name == "ws" else "")
            )
        if getattr(solver, "spread", None) == "cocoa":
            raise ValidationError(f"loss={loss!r} has no bound on its curvature: "
                                  "spread='cocoa' needs one")  # fmt: skip


def check_dataset(inputs: Any, client: Any, n_partitions: int) -> None:
    """Refuse a fit on a :class:`~dl1.dataset.Dataset` held by another cluster (or by this
    process while the fit runs on a cluster), or placed for other partitions."""
    ds = inputs.dataset
    if ds is None:
        return
    if ds.client is not client:
        where = lambda c: "this process" if c is None else repr(c)  # noqa: E731
        raise ValidationError(
            f"the Dataset is held by {where(ds.client)}, the fit would run on {where(client)}; "
            "pass the Dataset's client (or persist the data on this one)"
        )
    if ds.n_partitions != n_partitions:
        raise ValidationError(
            f"the Dataset was persisted for n_partitions={ds.n_partitions}, the fit asks "
            f"for {n_partitions}; use the same (or persist again)"
        )


@dataclass(frozen=True)
class StoreDecision:
    """What :func:`store_in_one_piece` found: the executor it made to decide (None when the
    data is no store) and, when the solve ran in one piece, its answer."""

    ex: Any = None
    shipped: bool = False
    result: Any = None


def store_in_one_piece(solve: Callable[[Any], Any], call: Call) -> StoreDecision:
    """``solve(call)`` on a store run in one piece, when the rule chooses it from the
    store's manifest alone: the worker opens, checks and reads the store (its errors are
    raised here as they are). Other inputs are decided once read."""
    X, split, loss = call.data.X, call.data.split, call.model.loss
    if not one_piece.names_store(X):
        return StoreDecision()
    ex = executor_for(call.execution.client)
    refusal = call.execution.refusal()
    if not one_piece.chosen(ex, lambda: one_piece.manifest_bytes(X, split), refusal):
        return StoreDecision(ex)
    check_solver(make_datafit(loss), call.solver, loss)
    return StoreDecision(ex, True, shipped(ex, solve, call))


class Plan(NamedTuple):
    """How a call runs, decided once before it is solved: in one piece on a worker
    (``shipped``, with its ``answer``), or here with its ``inputs`` read and checked, on
    executor ``ex`` (with direct calls to the workers where the solver gains from them),
    out of core (``streamed``) or not."""

    shipped: bool = False
    answer: Any = None
    inputs: Any = None
    ex: Any = None
    streamed: bool = False


def plan_execution(solve: Callable[[Any], Any], call: Call) -> Plan:
    """The :class:`Plan` of ``call``, whose core function is ``solve``: shipped in one piece
    when the rule chooses it (a store from its manifest alone, other data once read), and
    ``solve(call)``'s answer then; else its inputs read and checked, and how it runs."""
    early = store_in_one_piece(solve, call)
    if early.shipped:
        return Plan(True, early.result)
    data, execution = call.data, call.execution
    inputs = read_inputs(data.X, data.y, data.sample_weight, call.model.loss, data.split)
    check_call(inputs, execution.client, call.solver, call.model.loss, execution.n_partitions)
    call.model.penalty.check_features(int(inputs.X.shape[1]))
    ex = executor_for(execution.client) if early.ex is None else early.ex
    nbytes = functools.cache(lambda: one_piece.data_bytes(data.X, inputs))  # asked at most once
    if one_piece.chosen(ex, nbytes, execution.refusal()):
        if inputs.local is not None:  # one worker receives the matrix and cuts its blocks
            ex.check_memory(DataFloor((2.0 * (nbytes() or 0.0),)))
        return Plan(True, shipped(ex, solve, call, inputs.dataset))
    streamed = decide_stream(execution.stream, inputs.store, data.split, ex, inputs.dataset)
    return Plan(False, None, inputs, direct_calls(ex, call.solver, streamed), streamed)


def direct_calls(ex: Any, solver: Any, streamed: bool) -> Any:
    """``ex`` with direct calls to the workers' partition servers when the solver's rounds
    gain from them (blocks in worker memory, gathered subproblems), unless Dask's
    configuration says ``dl1.direct-calls: False`` (every step a Dask task)."""
    if streamed or not solver.direct_calls or not dask.config.get("dl1.direct-calls", True):
        return ex
    return rpc_executor(ex)


def shipped(ex: Any, solve: Callable[[Any], Any], call: Call, dataset: Any = None) -> Any:
    """``solve(call)`` computed in one piece on ``ex``'s cluster (its callback called here)."""
    travelling = {"call": call.travelling(), "solve": solve, **call.data.arrays()}
    return one_piece.ship(ex, solved_here, call.data.X, travelling, call.callback, dataset)


def solved_here(
    X: Any, *, client: Any, call: Call, solve: Callable[[Any], Any], callback: Any = None,
    **arrays: Any,
) -> Any:  # fmt: skip
    """A one-piece task's entry: ``solve`` (an entry point's core function) of ``call`` on
    the data as it arrived in this worker, with the relayed ``callback``."""
    data = dataclasses.replace(call.data, X=X, **arrays)
    return solve(call.arrived(data, client, callback))
