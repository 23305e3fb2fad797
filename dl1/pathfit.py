"""``dl1.path``: regularisation paths, warm-started and certified, with checkpoint/resume."""

from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np

from dl1.errors import ValidationError
from dl1.fit import direct_calls, make_solver
from dl1.loading import (
    col_scales,
    decide_stream,
    load_problem,
    read_inputs,
    xt_theta_absmax,
)
from dl1.params import PATH, validate_params
from dl1.penalties.elastic_net import ElasticNet
from dl1.regpath.checkpoint import PathCheckpoint
from dl1.regpath.loop import AlphaStep, walk
from dl1.regpath.result import PathResult
from dl1.solvers.base import Problem, WarmState
from dl1.solvers.executor import coordinating, executor_for
from dl1.solvers.result import ConvergenceWarning
from dl1.store import Store, open_store


def fingerprint(X: Any, y: np.ndarray, split: str) -> dict[str, Any]:
    """What identifies the data of a checkpoint: store checksums, or a token of the input."""
    from dask.base import tokenize

    from dl1.store.format import checksum

    if isinstance(X, (str, os.PathLike)):
        X = open_store(X)
    if isinstance(X, Store):
        e = X.entry(split)
        return {
            "kind": "store",
            "split": split,
            "shape": list(e["shape"]),
            "nnz": int(e["nnz"]),
            "blocks": tokenize(e["blocks"]),
            "y_crc32c": checksum(y),
        }
    return {"kind": type(X).__name__, "token": tokenize(X), "y_crc32c": checksum(y)}


def alpha_grid(alpha_max: float, n_alphas: int = 100, eps: float = 1e-2) -> np.ndarray:
    """``n_alphas`` values from ``alpha_max`` down to ``eps * alpha_max``, geometrically."""
    if n_alphas < 1 or not 0 < eps < 1:
        raise ValueError(f"need n_alphas >= 1 and 0 < eps < 1, got {n_alphas}, {eps}")
    return np.geomspace(alpha_max, alpha_max * eps, n_alphas)


@coordinating
def path(
    X: Any,
    y: Any = None,
    *,
    n_alphas: int = 100,
    eps: float = 1e-2,
    alphas: Any = None,
    l1_ratio: float = 1.0,
    loss: str = "squared",
    fit_intercept: bool = True,
    standardize: bool = False,
    sample_weight: Any = None,
    tol: float = 1e-4,
    max_rounds: int | None = None,
    n_partitions: int = 2,
    client: Any = None,
    screen: bool = False,
    stream: bool | None = None,
    spread: bool | str | None = None,
    checkpoint: str | os.PathLike | None = None,
    X_test: Any = None,
    y_test: Any = None,
    split: str = "train",
    verbose: bool = False,
    callback: Any = None,
    solver: str = "ws",
    random_order: bool = False,
    seed: int = 0,
) -> PathResult:
    """Regularisation path: warm-started, every alpha certified by its duality gap.

    Parameters
    ----------
    X, y, l1_ratio, loss, fit_intercept, standardize, sample_weight, tol, max_rounds,
    n_partitions, client, split
        As in :func:`dl1.fit`.
    stream : bool, optional
        Out-of-core mode, as in :func:`dl1.fit` (default: decided from the size of the
        blocks and the workers' memory limits). Each pass then reads the blocks it visits
        from the store; blocks whose columns are all screened out are not read.
    spread : bool or "cocoa", optional
        Working-set subproblems spread over the partitions' workers, as in :func:`dl1.fit`.
    n_alphas, eps : grid from ``alpha_max`` down to ``eps * alpha_max`` (geometric).
    alphas : array_like, optional
        Explicit grid (sorted decreasing for warm starts to help).
    screen : bool
        Gap-safe screening (Lasso and L1-logistic): sequential between alphas (the first
        pass of an alpha already applies the sphere of the previous alpha's solution) and
        dynamic within one (every pass applies the sphere of the previous pass's point, see
        :func:`dl1.fit`).
    checkpoint : path, optional
        A zarr group where each alpha's result is written atomically before the next starts;
        an interrupted path resumes there (redoing at most the alpha in progress, with
        bit-identical results). A checkpoint of other data, settings or versions is refused.
    X_test, y_test : held-out data for the validation error per alpha (a store's split name,
        e.g. ``X_test="test"`` with a store X, is accepted too).
    callback : callable, optional
        Called after each alpha with ``(k, alpha, result)``.
    solver : {"ws", "cd"}
        As in :func:`dl1.fit`. The constrained path in ``delta`` is
        :func:`dl1.path_constrained`.
    random_order, seed : bool, int
        Coordinate order of the solver's epochs, as in :func:`dl1.fit`.

    Returns
    -------
    dl1.regpath.PathResult
    """
    validate_params(PATH, locals(), "dl1.path()")
    inputs = read_inputs(X, y, sample_weight, loss, split)
    solver_obj = make_solver(
        solver, max_rounds=max_rounds, random_order=random_order, seed=seed, screen=screen,
        spread=spread,
        # warm-started from the previous alpha, the working set is usually right: its
        # subproblem is solved to the target gap at once (one pass per alpha, not two)
        tight_inner=True,
    )  # fmt: skip
    ex = executor_for(client)
    streamed = decide_stream(stream, inputs.store, split, ex)
    ex = direct_calls(ex, solver_obj, streamed)
    problem, _ = load_problem(
        inputs, ex, penalty=ElasticNet(1.0, l1_ratio), fit_intercept=fit_intercept,
        standardize=standardize, tol=tol, n_partitions=n_partitions, loss=loss,
        streamed=streamed,
    )  # fmt: skip
    grid = _grid(problem, alphas, n_alphas, eps, l1_ratio)
    test = test_data(X, X_test, y_test)
    settings = {
        "l1_ratio": l1_ratio, "loss": loss, "fit_intercept": fit_intercept,
        "standardize": standardize, "tol": tol,
        "max_rounds": 1000 if max_rounds is None else max_rounds, "n_partitions": n_partitions,
        "solver": solver, "screen": screen,
        "sample_weight": None if inputs.weights is None else crc(inputs.sample_weight),
        "test": None if test is None else crc(np.asarray(test[1])),
    }  # fmt: skip
    ck = None
    if checkpoint is not None:
        ck = PathCheckpoint.open_or_create(
            checkpoint, fingerprint=fingerprint(X, inputs.y, split), settings=settings,
            alphas=grid, n_features=problem.p,
        )  # fmt: skip
    state, start = _resumed(ck, solver_obj, problem, grid, l1_ratio)
    scales = col_scales(ex, problem.blocks) if standardize else None
    records: list[dict[str, Any]] = []

    def on_alpha(step: AlphaStep) -> None:
        res, w = step.result, step.result.coef_
        coef = w if scales is None else w * scales
        metric = None if test is None else test_metric(test, coef, res.intercept_, client, loss)
        rec = dict(
            coef=coef, intercept=res.intercept_, gap=res.gap_, converged=res.converged_,
            n_active=int(np.count_nonzero(w)), passes=res.passes_, seconds=step.seconds,
            rounds=res.n_rounds_, test_metric=metric,
        )  # fmt: skip
        if ck is not None:
            ck.record(step.k, **rec, state=step.state.checkpoint_arrays())
        records.append(sparse_record(rec))
        _report(step, rec, tol, verbose, callback)

    penalty_at = lambda alpha: ElasticNet(alpha, l1_ratio)  # noqa: E731
    walk(solver_obj, problem, grid, penalty_at, on_alpha, state=state, start=start,
         reproducible=ck is not None)  # fmt: skip
    ex.close()
    d = ck.load() if ck is not None else records_as_arrays(records, problem.p)
    return PathResult.from_checkpoint_arrays(d, alphas=grid, l1_ratio=l1_ratio, loss=loss, tol=tol)


def _grid(problem: Problem, alphas: Any, n_alphas: int, eps: float, l1_ratio: float) -> np.ndarray:
    """The alphas of the path: given, or ``n_alphas`` from ``alpha_max`` down geometrically."""
    if alphas is not None:
        grid = np.asarray(alphas, dtype=np.float64).ravel()
        if grid.size == 0 or not np.all(np.isfinite(grid)) or np.any(grid <= 0):
            raise ValueError("alphas must be finite and > 0")
        return grid
    pb = problem
    theta0 = pb.datafit.dual_point(pb.y, np.full(pb.n, pb.initial_intercept()), pb.weights,
                                   pb.fit_intercept)  # fmt: skip
    absmax = xt_theta_absmax(pb.executor, pb.blocks, theta0, pb.n_partitions)
    amax = ElasticNet.alpha_max(absmax / pb.n, l1_ratio)
    if not np.isfinite(amax) or amax <= 0:
        raise ValidationError(f"alpha_max is {amax}; give the alphas explicitly")
    return alpha_grid(amax, n_alphas, eps)


def _resumed(
    ck: Any, solver: Any, problem: Problem, grid: np.ndarray, l1_ratio: float
) -> tuple[WarmState | None, int]:
    """Where a checkpointed path resumes: the solver's state after the last completed alpha
    (bit for bit) and the next alpha's index; ``(None, 0)`` for a fresh path."""
    if ck is None or not ck.n_done:
        return None, 0
    start = ck.n_done
    intercept = float(ck.load()["intercepts"][start - 1])
    arrays = ck.state(start - 1)
    at = problem.at(ElasticNet(float(grid[start - 1]), l1_ratio))
    return solver.restore(at, arrays, intercept), start


def _report(step: AlphaStep, rec: dict[str, Any], tol: float, verbose: bool, callback: Any):
    """An alpha's warning when not certified, its line, its callback."""
    res = step.result
    if not res.converged_:
        warnings.warn(
            f"alpha[{step.k}] = {step.alpha:.6g} is not certified: relative duality gap "
            f"{res.gap_:.3e} > tol {tol:.3e} after {res.n_rounds_} rounds",
            ConvergenceWarning,
            stacklevel=4,
        )
    if verbose:
        print(f"alpha[{step.k:3d}] {step.alpha:.4e}  nnz {rec['n_active']:6d}  "
              f"gap {res.gap_:.2e}  passes {rec['passes']}")  # fmt: skip
    if callback is not None:
        callback(step.k, step.alpha, res)


def test_data(X: Any, X_test: Any, y_test: Any) -> tuple[Any, np.ndarray] | None:
    if X_test is None:
        return None
    if isinstance(X_test, str) and isinstance(X, (str, os.PathLike, Store)):
        st = X if isinstance(X, Store) else open_store(X)
        return (st.to_dask(X_test), st.read("y", X_test))
    if y_test is None:
        raise ValidationError("y_test is required with X_test")
    return (X_test, np.asarray(y_test, dtype=np.float64).ravel())


def test_metric(test, coef: np.ndarray, b: float, client: Any, loss: str) -> dict[str, float]:
    from dl1.predict import decision_function

    pred = decision_function(test[0], coef, b)
    pred = client.compute(pred).result() if client is not None else pred.compute(scheduler="sync")
    return metrics(loss, test[1], pred)


def sparse_record(rec: dict[str, Any]) -> dict[str, Any]:
    """The record with its coefficients kept as (indices, values): a path's memory on the
    client grows with its supports, not with n_alphas x p."""
    coef = np.asarray(rec["coef"], dtype=np.float64)
    nz = np.flatnonzero(coef)
    return {**rec, "coef": (nz, coef[nz])}


def records_as_arrays(records: list[dict[str, Any]], p: int) -> dict[str, Any]:
    """The per-alpha records of a run without checkpoint, in the checkpoint's load() form."""
    import scipy.sparse as sp

    names = sorted({m for r in records for m in (r["test_metric"] or {})})
    indptr = np.concatenate([[0], np.cumsum([r["coef"][0].shape[0] for r in records])])
    coefs = sp.csc_matrix(
        (
            np.concatenate([r["coef"][1] for r in records] or [np.zeros(0)]),
            np.concatenate([r["coef"][0] for r in records] or [np.zeros(0, np.int64)]),
            indptr,
        ),
        shape=(p, len(records)),
    )
    return {
        "coefs": coefs,
        "intercepts": np.array([r["intercept"] for r in records], dtype=np.float64),
        "gaps": np.array([r["gap"] for r in records], dtype=np.float64),
        "converged": np.array([r["converged"] for r in records], dtype=bool),
        "n_active": np.array([r["n_active"] for r in records], dtype=np.int64),
        "passes": np.array([r["passes"] for r in records], dtype=np.float64),
        "seconds": np.array([r["seconds"] for r in records], dtype=np.float64),
        "rounds": np.array([r["rounds"] for r in records], dtype=np.int64),
        "test_metrics": {
            m: np.array([(r["test_metric"] or {}).get(m, np.nan) for r in records]) for m in names
        },
    }


def crc(a: np.ndarray) -> int:
    from dl1.store.format import checksum

    return checksum(np.ascontiguousarray(a, dtype=np.float64))


def metrics(loss: str, y: np.ndarray, pred: np.ndarray) -> dict[str, float]:
    if loss == "squared":
        return {"mse": float(np.mean((y - pred) ** 2))}
    margin = y * pred
    return {
        "logloss": float(np.mean(np.logaddexp(0.0, -margin))),
        "accuracy": float(np.mean(margin > 0)),
    }
