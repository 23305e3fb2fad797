"""A call's route, decided before any solving: the checks that refuse it early, and whether
it is solved in one piece on a worker (:mod:`dl1.runtime.one_piece`) or its inputs are read
here (:func:`read_or_ship`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dl1.errors import ValidationError
from dl1.inputs import read_inputs
from dl1.objective.datafits import make_datafit
from dl1.runtime import one_piece
from dl1.runtime.executor import executor_for
from dl1.runtime.memory import DataFloor


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


def store_in_one_piece(
    entry: Callable[..., Any], call: dict[str, Any], solver: Any, refusal: Any
) -> StoreDecision:
    """``entry``'s ``call`` on a store solved in one piece, when the rule chooses it from the
    store's manifest alone: the worker opens, checks and reads the store and validates the
    call (its errors are raised here as they are). Other inputs are decided once read."""
    X, loss = call["X"], call["loss"]
    if not one_piece.names_store(X):
        return StoreDecision()
    ex = executor_for(call["client"])
    if not one_piece.chosen(ex, lambda: one_piece.manifest_bytes(X, call["split"]), refusal):
        return StoreDecision(ex)
    check_solver(make_datafit(loss), solver, loss)
    return StoreDecision(ex, True, one_piece.ship(ex, entry, X, call))


@dataclass(frozen=True)
class Ready:
    """A call's inputs read and checked, with its executor; or (``shipped``) its answer,
    computed in one piece."""

    shipped: bool = False
    result: Any = None
    inputs: Any = None
    ex: Any = None


def read_or_ship(
    entry: Callable[..., Any], call: dict[str, Any], solver: Any, refusal: Any
) -> Ready:
    """``entry``'s ``call`` shipped in one piece when the rule chooses it (a store from its
    manifest alone, other data once read); else its inputs read and checked."""
    early = store_in_one_piece(entry, call, solver, refusal)
    if early.shipped:
        return Ready(True, early.result)
    X, loss = call["X"], call["loss"]
    inputs = read_inputs(X, call["y"], call["sample_weight"], loss, call["split"])
    check_call(inputs, call["client"], solver, loss, call["n_partitions"])
    ex = executor_for(call["client"]) if early.ex is None else early.ex
    nbytes = functools.cache(lambda: one_piece.data_bytes(X, inputs))  # asked at most once
    if one_piece.chosen(ex, nbytes, refusal):
        if inputs.local is not None:  # one worker receives the matrix and cuts its blocks
            ex.check_memory(DataFloor((2.0 * (nbytes() or 0.0),)))
        return Ready(True, one_piece.ship(ex, entry, X, call, inputs.dataset))
    return Ready(inputs=inputs, ex=ex)
