"""``dl1.path``: regularisation paths, warm-started and certified, with checkpoint/resume."""

from __future__ import annotations

import os
import time
import uuid
import warnings
from typing import Any

import numpy as np

from dl1.errors import ValidationError
from dl1.fit import (
    _check_params,
    _load,
    _problem,
    decide_stream,
    dense_max,
    gather_budget,
    working_set_limits,
    xt_theta_absmax,
)
from dl1.penalties.elastic_net import ElasticNet
from dl1.solvers import _tasks as T
from dl1.solvers.cd import ConvergenceWarning
from dl1.solvers.executor import coordinating, executor_for
from dl1.solvers.rpc import rpc_executor
from dl1.solvers.ws import rescan, solve_ws
from dl1.store import Store, open_store


def _fingerprint(X: Any, y: np.ndarray, split: str) -> dict[str, Any]:
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
):
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
    Returns
    -------
    dl1.regpath.PathResult
    """
    from dl1.regpath import PathCheckpoint, PathResult

    max_rounds = 1000 if max_rounds is None else max_rounds
    _check_params(1.0, l1_ratio, tol, spread)
    Xd, yv, sw, datafit, store = _problem(X, y, sample_weight, loss, split)
    ex = executor_for(client)
    streamed = decide_stream(stream, store, split, ex)
    if not streamed and not spread:
        ex = rpc_executor(ex)  # blocks in memory: per-round steps by direct calls
    budget = gather_budget(ex, streamed)
    col_bytes, cache_max = working_set_limits(ex, store, split, streamed)
    blocks, cb = _load(ex, Xd, sw, standardize, fit_intercept, n_partitions, store, split, streamed)
    if not streamed:
        ex.wait(blocks)
    n = yv.shape[0]
    s = None if sw.shape[0] == 0 else sw
    b_zero = datafit.initial_intercept(yv, s) if fit_intercept else 0.0
    theta0 = datafit.dual_point(yv, np.full(n, b_zero), s, fit_intercept)
    amax = ElasticNet.alpha_max(xt_theta_absmax(ex, blocks, theta0, n_partitions) / n, l1_ratio)
    if alphas is None:
        if not np.isfinite(amax) or amax <= 0:
            raise ValidationError(f"alpha_max is {amax}; give the alphas explicitly")
        grid = alpha_grid(amax, n_alphas, eps)
    else:
        grid = np.asarray(alphas, dtype=np.float64).ravel()
        if grid.size == 0 or not np.all(np.isfinite(grid)) or np.any(grid <= 0):
            raise ValueError("alphas must be finite and > 0")

    test = _test_data(X, X_test, y_test)

    p = int(cb[-1])
    settings = {
        "l1_ratio": l1_ratio,
        "loss": loss,
        "fit_intercept": fit_intercept,
        "standardize": standardize,
        "tol": tol,
        "max_rounds": max_rounds,
        "n_partitions": n_partitions,
        "solver": "ws",
        "screen": screen,
        "sample_weight": None if s is None else _crc(sw),
        "test": None if test is None else _crc(np.asarray(test[1])),
    }
    ck = None
    if checkpoint is not None:
        ck = PathCheckpoint.open_or_create(
            checkpoint,
            fingerprint=_fingerprint(X, yv, split),
            settings=settings,
            alphas=grid,
            n_features=p,
        )
    handles = (ex.submit(T.identity, yv), ex.submit(T.identity, sw))
    w = np.zeros(p)
    b: float | None = None
    z: np.ndarray | None = None  # X w + b, carried from one alpha to the next
    last = None  # the last pass of the previous alpha (reused as the next one's first)
    reuse = not screen and l1_ratio == 1.0
    seq = None  # with screening: (theta, bound) of the previous alpha's solution
    start = 0
    if ck is not None and ck.n_done:
        start = ck.n_done
        b = float(ck.load()["intercepts"][start - 1])
        state = ck.state(start - 1)
        if state is None:  # pragma: no cover - written by every version that reads it
            w = ck.coef(start - 1)
        else:
            # the solver's own w (standardized scale) and X w + b, bit for bit, and the
            # pass the interrupted run would have reused: resuming is bit-identical
            w, z = state["w"], state["z"]
            if "xt_bound" in state:
                theta = datafit.dual_point(yv, z, s, fit_intercept)  # as the last pass had it
                seq = (theta, float(state["xt_bound"][0]))
            if reuse:
                last = rescan(
                    ex,
                    blocks,
                    cb,
                    n_partitions,
                    yv,
                    sw,
                    datafit,
                    fit_intercept,
                    n * float(grid[start - 1]) * l1_ratio,
                    w,
                    z,
                )
    records: list[dict[str, Any]] = []
    gram_key = uuid.uuid4().hex
    for k in range(start, grid.shape[0]):
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            res, z, last = solve_ws(
                ex,
                blocks,
                cb,
                yv,
                sw,
                datafit,
                ElasticNet(float(grid[k]), l1_ratio),
                fit_intercept=fit_intercept,
                tol=tol,
                max_rounds=max_rounds,
                n_partitions=n_partitions,
                loss_name=loss,
                w0=w,
                b0=b,
                handles=handles,
                screen=screen,
                dense_max=dense_max(streamed),
                spread=spread,
                gather_max=budget,
                col_bytes=col_bytes,
                cache_max=cache_max,
                # the working sets of neighbouring alphas share their Gram matrix; with a
                # checkpoint each alpha starts afresh, as a resumed run does (bit-identical)
                gram_key=gram_key if ck is None else f"{gram_key}-{k}",
                z0=z,
                reuse=last if reuse else None,
                groups0=None if last is None else last.groups,
                spread_gram0=None if last is None or ck is not None else last.spread_gram,
                seq=seq,
                # warm-started from the previous alpha, the working set is usually right: its
                # subproblem is solved to the target gap at once (one pass per alpha, not two)
                tight_inner=True,
            )
        if screen:
            seq = (last.theta, last.xt_bound)
        res.streamed_ = streamed
        w = res.coef_
        b = res.intercept_
        metric = None
        if test is not None:
            coef = w if not standardize else w * _scales(ex, blocks)
            metric = _test_metric(test, coef, b, client, loss)
        rec = dict(
            coef=w if not standardize else w * _scales(ex, blocks),
            intercept=b,
            gap=res.gap_,
            converged=res.converged_,
            n_active=int(np.count_nonzero(w)),
            passes=res.passes_,
            seconds=time.perf_counter() - t0,
            rounds=res.n_rounds_,
            test_metric=metric,
        )
        if ck is not None:
            state = {"w": w, "z": z}
            if seq is not None:
                state["xt_bound"] = np.array([seq[1]])
            ck.record(k, **rec, state=state)
        records.append(_sparse_coef(rec))
        if not res.converged_:
            warnings.warn(
                f"alpha[{k}] = {grid[k]:.6g} is not certified: relative duality gap "
                f"{res.gap_:.3e} > tol {tol:.3e} after {res.n_rounds_} rounds",
                ConvergenceWarning,
                stacklevel=2,
            )
        if verbose:
            print(
                f"alpha[{k:3d}] {grid[k]:.4e}  nnz {rec['n_active']:6d}  gap {res.gap_:.2e}"
                f"  passes {rec['passes']}"
            )
        if callback is not None:
            callback(k, float(grid[k]), res)
    ex.broadcast(T.drop_gram, gram_key)  # the workers' cached Gram matrices die with the path
    ex.close()
    if ck is not None:
        d = ck.load()
    else:
        d = _as_arrays(records, p)
    return PathResult.from_checkpoint_arrays(d, alphas=grid, l1_ratio=l1_ratio, loss=loss, tol=tol)


def _test_data(X: Any, X_test: Any, y_test: Any) -> tuple[Any, np.ndarray] | None:
    if X_test is None:
        return None
    if isinstance(X_test, str) and isinstance(X, (str, os.PathLike, Store)):
        st = X if isinstance(X, Store) else open_store(X)
        return (st.to_dask(X_test), st.read("y", X_test))
    if y_test is None:
        raise ValidationError("y_test is required with X_test")
    return (X_test, np.asarray(y_test, dtype=np.float64).ravel())


def _test_metric(test, coef: np.ndarray, b: float, client: Any, loss: str) -> dict[str, float]:
    from dl1.predict import decision_function

    pred = decision_function(test[0], coef, b)
    pred = client.compute(pred).result() if client is not None else pred.compute(scheduler="sync")
    return _metrics(loss, test[1], pred)


def _sparse_coef(rec: dict[str, Any]) -> dict[str, Any]:
    """The record with its coefficients kept as (indices, values): a path's memory on the
    client grows with its supports, not with n_alphas x p."""
    coef = np.asarray(rec["coef"], dtype=np.float64)
    nz = np.flatnonzero(coef)
    return {**rec, "coef": (nz, coef[nz])}


def _as_arrays(records: list[dict[str, Any]], p: int) -> dict[str, Any]:
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


def _crc(a: np.ndarray) -> int:
    from dl1.store.format import checksum

    return checksum(np.ascontiguousarray(a, dtype=np.float64))


def _scales(ex, blocks) -> np.ndarray:
    from dl1.fit import _scale

    return np.concatenate(ex.gather([ex.submit(_scale, b) for b in blocks]))


def _metrics(loss: str, y: np.ndarray, pred: np.ndarray) -> dict[str, float]:
    if loss == "squared":
        return {"mse": float(np.mean((y - pred) ** 2))}
    margin = y * pred
    return {
        "logloss": float(np.mean(np.logaddexp(0.0, -margin))),
        "accuracy": float(np.mean(margin > 0)),
    }
