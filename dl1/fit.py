"""``dl1.fit`` and ``dl1.alpha_max``: the functional core of the estimators."""

from __future__ import annotations

import os
import time
from typing import Any

import dask
import dask.array as da
import numpy as np
import scipy.sparse as sp

from dl1.datafits import Logistic, Quadratic, normalize_sample_weight
from dl1.errors import ValidationError
from dl1.penalties.elastic_net import ElasticNet
from dl1.solvers import _tasks as T
from dl1.solvers.cd import FitResult, solve
from dl1.solvers.executor import coordinating, executor_for
from dl1.solvers.fw import FWProblem, FWResult, sample_size, solve_fw
from dl1.solvers.rpc import rpc_executor
from dl1.solvers.ws import solve_ws
from dl1.store import Store, open_store
from dl1.worker import WORKER_BASELINE

LOSSES = {"squared": Quadratic, "logistic": Logistic}


def _as_dask(X: Any, split: str) -> tuple[da.Array, np.ndarray | None, np.ndarray | None]:
    """(X as a 2-D dask array, y from a store or None, sample weights from a store or None)."""
    if isinstance(X, (str, os.PathLike)):
        X = open_store(X)
    if isinstance(X, Store):
        y = X.read("y", split)
        sw = X.read("sample_weight", split) if X.entry(split)["has_sample_weight"] else None
        return X.to_dask(split, "csc" if "csc" in X.entry(split)["formats"] else None), y, sw
    if isinstance(X, da.Array):
        if X.ndim != 2:
            raise ValidationError(f"X must be 2-D, got {X.ndim} dimensions")
        if any(np.isnan(c) for cs in X.chunks for c in cs):
            raise ValidationError("X has unknown chunk sizes; call X.compute_chunk_sizes()")
        return X, None, None
    if sp.issparse(X) or isinstance(X, np.ndarray):
        n, p = X.shape
        X = sp.csc_matrix(X) if sp.issparse(X) else np.asarray(X)
        return da.from_array(X, chunks=(n, max(1, -(-p // 4))), asarray=False), None, None
    raise ValidationError(
        f"X must be a dask array, a dl1 Store or store path, a scipy.sparse matrix or a "
        f"NumPy array; got {type(X).__name__}"
    )


def _vector(v: Any, n: int, what: str) -> np.ndarray:
    v = v.compute() if isinstance(v, da.Array) else v
    v = np.asarray(v, dtype=np.float64).ravel()
    if v.shape[0] != n:
        raise ValidationError(f"{what} has {v.shape[0]} values for {n} rows of X")
    bad = ~np.isfinite(v)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise ValidationError(f"{what}[{k}] is {v[k]} (not finite)")
    return v


def _problem(X, y, sample_weight, loss, split):
    """(X as dask, y, normalised sample weights (empty: none), datafit, the Store or None)."""
    store = open_store(X) if isinstance(X, (str, os.PathLike)) else X
    store = store if isinstance(store, Store) else None
    Xd, y_store, sw_store = _as_dask(X if store is None else store, split)
    n, p = Xd.shape
    if np.dtype(Xd.dtype) not in (np.float32, np.float64):
        raise ValidationError(f"X has dtype {Xd.dtype}; use float32 or float64")
    if y is None:
        if y_store is None:
            raise ValidationError("y is required unless X is a dl1 store")
        y = y_store
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {sorted(LOSSES)}, got {loss!r}")
    datafit = LOSSES[loss]()
    y = datafit.validate_y(_vector(y, n, "y"))
    if sample_weight is None:
        sample_weight = sw_store
    sw = np.zeros(0)
    if sample_weight is not None:
        s = _vector(sample_weight, n, "sample_weight")
        if (s < 0).any():
            raise ValidationError(f"sample_weight[{int(np.flatnonzero(s < 0)[0])}] is negative")
        sw = normalize_sample_weight(s, n)
    return Xd, y, sw, datafit, store


def block_memory(store: Store, split: str) -> int:
    """Bytes the feature blocks of ``split`` take in worker memory (CSC, int32 indices)."""
    p = store.shape(split)[1]
    return store.nnz(split) * (store.dtype(split).itemsize + 4) + 16 * (p + 1)


def dense_max(streamed: bool) -> int:
    """Largest working set (rows x columns) densified for its Gram matrix: 16 MiB out of core
    (workers with little memory), 256 MiB otherwise."""
    return (1 << 21) if streamed else T.GRAM_DENSE_MAX


def gather_budget(ex: Any, streamed: bool) -> float:
    """Bytes of working-set columns one worker may gather (out of core: a quarter of the
    smallest worker's memory limit beyond :data:`WORKER_BASELINE`; in memory: no bound)."""
    if not streamed:
        return float("inf")
    import psutil

    total = psutil.virtual_memory().total
    if hasattr(ex, "client"):
        limits = [
            w.get("memory_limit") or total for w in ex.client.scheduler_info()["workers"].values()
        ]
    else:
        limits = [psutil.virtual_memory().available]
    return max(min(limits or [total]) - WORKER_BASELINE, 0) / 4


def working_set_limits(
    ex: Any, store: Store | None, split: str, streamed: bool
) -> tuple[np.ndarray | None, float]:
    """``(col_bytes, cache_max)`` for :func:`dl1.solvers.ws.solve_ws`: out of core, the bytes
    of each column once extracted (per nonzero an int32 row and a value in the store's
    dtype, from the store's column counts) and what the workers may hold of a working set's
    columns (the sum of their :func:`gather_budget`, a quarter of their memory beyond the
    baseline: the cached groups may hold up to twice a working set, and the rest is for the
    pass's block, the Gram matrix and transients); in memory, no bound."""
    if not streamed or store is None:
        return None, float("inf")
    per_nnz = 4 + store.dtype(split).itemsize  # an int32 row and a value in the store's dtype
    col_bytes = per_nnz * store.read("stats/col_nnz", split).astype(np.float64) + 8
    return col_bytes, gather_budget(ex, streamed) * max(1, ex.n_workers)


def decide_stream(stream: bool | None, store: Store | None, split: str, ex: Any) -> bool:
    """Whether blocks are re-read from the store by every task instead of kept in memory.

    ``None`` (auto) streams when the blocks would take more than half of the memory the
    workers have for data: the sum over workers of ``memory_limit`` minus
    :data:`WORKER_BASELINE` (in-process: half of the available RAM).
    """
    if stream is False:
        return False
    if store is None:
        if stream:
            raise ValidationError(
                "stream=True reads blocks from a dl1 store: X must be a Store or a store path "
                "(convert a dask array with dl1.from_dask)"
            )
        return False
    if stream:
        return True
    import psutil

    need = block_memory(store, split)
    if hasattr(ex, "client"):
        limits = [
            w.get("memory_limit") or 0 for w in ex.client.scheduler_info()["workers"].values()
        ]
        total = psutil.virtual_memory().total
        budget = sum(max((lim or total) - WORKER_BASELINE, 0) for lim in limits)
    else:
        budget = psutil.virtual_memory().available
    return need > 0.5 * budget


def _sources(store: Store, split: str, sw: np.ndarray, standardize: bool, center: bool):
    e = store.entry(split)
    fmt = "csc" if "csc" in e["formats"] else e["formats"][0]
    rb, cb = store.row_bounds(split), store.col_bounds(split)
    nnz = store.block_nnz(split, fmt)
    root = os.fspath(store.path)
    return [
        T.BlockSource(
            j,
            int(cb[j]),
            int(cb[j + 1] - cb[j]),
            int(nnz[:, j].sum()),
            root,
            split,
            fmt,
            tuple(
                (i, e["blocks"][fmt][i][j], store.block_shape(split, i, j))
                for i in range(len(rb) - 1)
            ),
            sw,
            standardize,
            center,
        )
        for j in range(len(cb) - 1)
    ], cb.astype(np.int64)


def _load(
    ex,
    Xd: da.Array,
    sw: np.ndarray,
    standardize: bool,
    center: bool,
    n_partitions: int,
    store: Store | None = None,
    split: str = "train",
    stream: bool = False,
):
    """The feature blocks: futures of blocks in worker memory, or (``stream``) their sources."""
    if stream:
        assert store is not None
        return _sources(store, split, sw, standardize, center)
    cb = np.concatenate([[0], np.cumsum(Xd.chunks[1])]).astype(np.int64)
    K = len(cb) - 1
    dl = Xd.to_delayed()
    tasks = [
        dask.delayed(T.assemble_block, pure=True)(
            j, int(cb[j]), sw, standardize, center, *dl[:, j].tolist(), verified=store is not None
        )
        for j in range(K)
    ]
    part_of = np.concatenate(
        [
            np.full(len(a), q)
            for q, a in enumerate(np.array_split(np.arange(K), max(1, min(n_partitions, K))))
        ]
    )
    return ex.compute(tasks, workers=part_of.tolist()), cb


def _check_params(alpha: float, l1_ratio: float, tol: float, spread: Any = None) -> None:
    if spread is not None and spread is not True and spread is not False and spread != "cocoa":
        raise ValueError(f"spread must be None, True, False or 'cocoa', got {spread!r}")
    if not (np.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha!r}")
    if not 0.0 <= l1_ratio <= 1.0:
        raise ValueError(f"l1_ratio must be in [0, 1], got {l1_ratio!r}")
    if alpha == 0 or alpha * l1_ratio == 0 and alpha * (1 - l1_ratio) == 0:
        raise ValueError("alpha must be > 0 (an unregularised fit is not certified here)")
    if not tol > 0:
        raise ValueError(f"tol must be > 0, got {tol!r}")


@coordinating
def fit(
    X: Any,
    y: Any = None,
    *,
    alpha: float | None = None,
    l1_ratio: float = 1.0,
    loss: str = "squared",
    fit_intercept: bool = True,
    standardize: bool = False,
    sample_weight: Any = None,
    tol: float = 1e-4,
    max_rounds: int | None = None,
    n_partitions: int = 2,
    n_epochs: int = 1,
    random_order: bool = False,
    seed: int = 0,
    solver: str = "ws",
    screen: bool = False,
    stream: bool | None = None,
    spread: bool | str | None = None,
    client: Any = None,
    split: str = "train",
    verbose: bool = False,
    callback: Any = None,
    l1_ball: float | None = None,
    sample: float | tuple[float, int] = 0.01,
    stop: str = "paper",
    step_tol: float = 1e-3,
    certify: bool = True,
    l2: float = 0.0,
) -> FitResult | FWResult:
    """Fit an L1 / elastic-net linear model, certified by its duality gap.

    Minimises ``F(X w + b) + alpha * (l1_ratio ||w||_1 + (1 - l1_ratio) / 2 ||w||_2^2)`` with
    ``F`` the mean squared loss ``1/(2n) ||y - X w - b||^2`` (scikit-learn's ElasticNet
    convention) or the mean logistic loss (labels in {-1, +1}), weighted by
    ``sample_weight`` (normalised to sum to n).

    Parameters
    ----------
    X : dask array (scipy.sparse, pydata sparse or dense chunks), dl1 Store, store path,
        scipy.sparse matrix or ndarray
        Each column chunk of a dask array is a feature block.
    y : array_like or dask array, optional
        Targets; read from the store when X is a store.
    alpha, l1_ratio : float
        Penalty strength and mix (1.0: Lasso / L1 logistic). Not used by ``solver="fw"``.
    loss : {"squared", "logistic"}
    fit_intercept : bool
        Fit an unpenalised intercept.
    standardize : bool
        Penalise coefficients of features scaled to unit (weighted) standard deviation,
        implicitly (never densifying X); ``coef_`` is returned in the input's scale.
    sample_weight : array_like, optional
    tol : float
        Stop when the duality gap is ``<= tol * P(0)``.
    max_rounds : int, optional
        Round limit; reaching it warns (ConvergenceWarning) with the gap reached. Default
        1000 (for ``"fw"``, where a round is one Frank-Wolfe iteration: 10000).
    n_partitions : int
        Groups of feature blocks whose updates are added each round (CoCoA+ sigma').
        Fixed by the caller, not by the cluster, so results do not depend on the number of
        workers.
    n_epochs : int
        Local coordinate-descent epochs per round.
    random_order : bool
        Uniformly random coordinate order (stochastic coordinate descent) instead of cyclic.
    seed : int
        Seed of the random order.
    solver : {"ws", "cd", "fw"}
        ``"ws"``: working sets (:mod:`dl1.solvers.ws`): each round is one full pass that
        certifies the current point and picks the features to gather; the restricted problem
        is solved on one worker. ``"cd"``: every round runs coordinate descent on all
        features of every partition (:mod:`dl1.solvers.cd`). ``"fw"``: randomized
        Frank-Wolfe for the *constrained* Lasso ``min 1/2 ||y - X w - b||^2`` s.t.
        ``||w||_1 <= l1_ball`` (:mod:`dl1.solvers.fw`; also the summed logistic loss and,
        with ``l2``, the elastic net; no sample weights; blocks held in worker memory);
        returns a :class:`dl1.solvers.fw.FWResult`.
    screen : bool
        Gap-safe sphere screening during the passes of the ``"ws"`` solver (Lasso and
        L1-logistic): screened columns are skipped by later passes. Off by default: on the
        log1p preset at alpha_max/20 its extra gather per column cost more than it saved.
    stream : bool, optional
        Out-of-core mode (X a store): every task reads the blocks it needs from the store
        and drops them when done, so a worker holds one block at a time, instead of the
        blocks being kept in worker memory. ``None`` (default) streams when the blocks would
        take more than half of the workers' memory for data (:func:`decide_stream`).
    spread : bool or "cocoa", optional
        ``"ws"`` solver: solve the working-set subproblem where its columns were extracted,
        instead of gathering them on one worker (which then holds about 24 bytes per nonzero
        of the working set): for the squared loss on a Gram matrix formed across the
        partitions and held by one worker (when its ~16 m^2 bytes fit the gather budget),
        otherwise (or with ``"cocoa"``) by CoCoA+ rounds over the partitions. ``None``
        (default): out of core, when the working set's columns could exceed
        :func:`gather_budget`. The answers agree to the requested tolerance either way.
    client : distributed.Client, optional
        The cluster to run on; without it everything runs in this process. A global client
        is never picked up implicitly.
    split : str
        Split of a store to fit on.
    verbose : bool
        Print one line per round.
    callback : callable, optional
        Called with each round's history entry (for progress display).
    l1_ball : float, optional
        ``solver="fw"`` only: radius ``delta`` of the l1 ball.
    sample : float or (float, int)
        ``solver="fw"`` only: columns scored per iteration, as a fraction of p (the paper's
        0.01, 0.02, 0.03; 1.0 is deterministic FW) or ``(rho, s)`` for the sample size of
        Frandi et al.'s Eq. (12) (confidence ``rho`` of sampling one of ``s`` relevant
        features); see :func:`dl1.solvers.fw.sample_size`.
    stop : {"paper", "gap"}
        ``solver="fw"`` only: ``"paper"`` stops when ``||w_{k+1} - w_k||_inf <= step_tol``
        (the paper's rule); ``"gap"`` when the exact FW gap is ``<= tol * f(0)``.
    step_tol : float
        ``solver="fw"``, ``stop="paper"``: the step threshold (paper: 1e-3).
    certify : bool
        ``solver="fw"`` only: finish with one full pass so that the reported FW gap (and the
        duality gap of the corresponding penalised problem) is exact, not a sample estimate.
    l2 : float
        ``solver="fw"`` only: ridge term ``l2/2 ||w||^2`` added to the objective (the
        elastic net in constrained form; in the scale of ``1/2 ||y - X w - b||^2``).

    Returns
    -------
    FitResult, or FWResult for ``solver="fw"``
    """
    if solver not in ("ws", "cd", "fw"):
        raise ValueError(f"solver must be 'ws', 'cd' or 'fw', got {solver!r}")
    if solver == "fw":
        if alpha is not None:
            raise ValueError(
                "solver='fw' solves the constrained Lasso: give l1_ball (the radius delta), "
                "not alpha"
            )
        if l1_ball is None:
            raise TypeError("fit() with solver='fw' needs l1_ball")
        if not tol > 0:
            raise ValueError(f"tol must be > 0, got {tol!r}")
        prob, t_load = fw_problem(
            X,
            y,
            loss=loss,
            fit_intercept=fit_intercept,
            standardize=standardize,
            sample_weight=sample_weight,
            n_partitions=n_partitions,
            sample=sample,
            stream=stream,
            client=client,
            split=split,
            l2=l2,
        )
        res_fw, _ = solve_fw(
            prob,
            float(l1_ball),
            stop=stop,
            step_tol=step_tol,
            tol=tol,
            max_iter=10000 if max_rounds is None else max_rounds,
            seed=seed,
            certify=certify,
            verbose=verbose,
            callback=callback,
        )
        res_fw.load_seconds_ = t_load
        return res_fw
    if l1_ball is not None:
        raise ValueError("l1_ball is the constraint of solver='fw'; penalised solvers take alpha")
    if alpha is None:
        raise TypeError(f"fit() with solver={solver!r} needs alpha")
    _check_params(alpha, l1_ratio, tol, spread)
    max_rounds = 1000 if max_rounds is None else max_rounds
    Xd, y, sw, datafit, store = _problem(X, y, sample_weight, loss, split)
    ex = executor_for(client)
    streamed = decide_stream(stream, store, split, ex)
    if solver == "ws" and not streamed and not spread:
        ex = rpc_executor(ex)  # blocks in memory: per-round steps by direct calls
    t0 = time.perf_counter()
    blocks, cb = _load(ex, Xd, sw, standardize, fit_intercept, n_partitions, store, split, streamed)
    if not streamed:
        ex.wait(blocks)
    t_load = time.perf_counter() - t0
    common = dict(
        fit_intercept=fit_intercept,
        tol=tol,
        max_rounds=max_rounds,
        n_partitions=n_partitions,
        random_order=random_order,
        seed=seed,
        loss_name=loss,
        verbose=verbose,
        callback=callback,
    )
    penalty = ElasticNet(alpha, l1_ratio)
    if solver == "ws":
        col_bytes, cache_max = working_set_limits(ex, store, split, streamed)
        res, _, _ = solve_ws(
            ex,
            blocks,
            cb,
            y,
            sw,
            datafit,
            penalty,
            screen=screen,
            dense_max=dense_max(streamed),
            spread=spread,
            gather_max=gather_budget(ex, streamed),
            col_bytes=col_bytes,
            cache_max=cache_max,
            **common,
        )
    else:
        res, _ = solve(ex, blocks, cb, y, sw, datafit, penalty, n_epochs=n_epochs, **common)
    ex.close()
    res.streamed_ = streamed
    res.load_seconds_ = t_load
    res.solve_seconds_ = time.perf_counter() - t0 - t_load
    if standardize:
        scales = np.concatenate(ex.gather([ex.submit(_scale, b) for b in blocks]))
        res.coef_ = res.coef_ * scales
    return res


def fw_problem(
    X: Any,
    y: Any,
    *,
    loss: str,
    fit_intercept: bool,
    standardize: bool,
    sample_weight: Any,
    n_partitions: int,
    sample: float | tuple[float, int],
    stream: bool | None,
    client: Any,
    split: str,
    l2: float = 0.0,
) -> tuple[FWProblem, float]:
    """The blocks in worker memory and the fixed data of the FW solver (``sigma = X^T y``).

    Returns the problem and the seconds spent loading the blocks.
    """
    if sample_weight is not None:
        raise ValidationError("solver='fw' does not take sample weights (use solver='ws')")
    Xd, yv, sw, _, store = _problem(X, y, None, loss, split)
    if sw.shape[0]:
        raise ValidationError(
            "the store holds sample weights, which solver='fw' does not take (use solver='ws')"
        )
    ex = executor_for(client)
    if decide_stream(stream, store, split, ex):
        raise ValidationError(
            "solver='fw' needs the feature blocks in worker memory: every iteration scores a "
            "random sample of columns of every block, so out of core it would read the whole "
            f"store per iteration ({block_memory(store, split) / 2**30:.2f} GiB of blocks "
            "against the workers' memory limits); use solver='ws' or workers with more memory"
        )
    t0 = time.perf_counter()
    blocks, cb = _load(ex, Xd, sw, standardize, fit_intercept, n_partitions, store, split, False)
    ex.wait(blocks)
    t_load = time.perf_counter() - t0
    kappa = sample_size(int(cb[-1]), sample)
    prob = FWProblem(
        ex,
        blocks,
        cb,
        yv,
        fit_intercept=fit_intercept,
        n_partitions=n_partitions,
        kappa=kappa,
        l2=l2,
        loss=loss,
    )
    return prob, t_load


def _scale(block: T.Block | T.BlockSource) -> np.ndarray:
    return T.loaded(block).col_scale


def alpha_max(
    X: Any,
    y: Any = None,
    *,
    l1_ratio: float = 1.0,
    loss: str = "squared",
    fit_intercept: bool = True,
    standardize: bool = False,
    sample_weight: Any = None,
    client: Any = None,
    split: str = "train",
    stream: bool | None = None,
) -> float:
    """Smallest ``alpha`` whose solution is ``w = 0``: ``||X^T grad F(b0)||_inf / l1_ratio``.

    One pass over the data (per-block reductions on the workers; ``stream`` as in
    :func:`fit`).
    """
    Xd, y, sw, datafit, store = _problem(X, y, sample_weight, loss, split)
    ex = executor_for(client)
    streamed = decide_stream(stream, store, split, ex)
    n_parts = max(1, ex.n_workers)
    blocks, _ = _load(ex, Xd, sw, standardize, fit_intercept, n_parts, store, split, streamed)
    s = None if sw.shape[0] == 0 else sw
    b0 = datafit.initial_intercept(y, s) if fit_intercept else 0.0
    theta = datafit.dual_point(y, np.full(y.shape[0], b0), s, fit_intercept)
    absmax = xt_theta_absmax(ex, blocks, theta, n_parts)
    return ElasticNet.alpha_max(absmax / y.shape[0], l1_ratio)


def xt_theta_absmax(ex: Any, blocks: list[Any], theta: np.ndarray, n_partitions: int) -> float:
    """``||X^T theta||_inf``: one task per partition, so ``theta`` travels once per partition
    (a task per block would ship a copy of ``theta`` with each of thousands of blocks)."""
    parts = np.array_split(np.arange(len(blocks)), max(1, min(n_partitions, len(blocks))))
    stats = ex.gather(
        [ex.submit(T.xt_theta_task, [blocks[j] for j in part], theta, np.inf) for part in parts]
    )
    return max((st[0] for res in stats for st in res), default=0.0)
