"""Feature-partitioned distributed coordinate descent, certified by duality gaps.

The coordinator (this module, on the client) holds the small state: ``w`` (length p), the
intercept, ``z = X w + b`` and the gradient (length n). The data lives on the workers as
feature blocks (:class:`dl1.solvers._tasks.Block`), loaded once from the store or the dask
array and recomputed from there if a worker is lost; they are never scattered.

A round:

1. the coordinator fits the intercept for the current ``w`` and forms the gradient
   ``g = grad F(z)`` and the dual point ``theta``;
2. each partition (a fixed group of consecutive feature blocks) receives ``g``, ``theta``
   and its nonzero coefficients, computes the gap statistics of ``X_k^T theta`` at the
   start point (the certificate of that point), then runs local coordinate-descent epochs
   on the CoCoA+ subproblem with ``sigma' = number of partitions`` (Smith et al., CoCoA: a
   general framework for communication-efficient distributed optimization, JMLR 2018,
   Eq. (8) with gamma = 1): adding the partitions' updates is then safe for any number of
   partitions, because ``sigma'`` bounds ``||X dw||^2 <= sigma' sum_k ||X_k dw_k||^2``;
3. the coordinator adds the returned ``u_k = X_k dw_k`` in partition order (deterministic
   aggregation) and certifies the start point if its relative gap is below ``tol``.

Within a partition the blocks share ``u``, so the local epochs are exact coordinate
descent on the partition's subproblem (Shalev-Shwartz & Tewari's SCD when the order is
random, with beta = 1 for the squared and 1/4 for the logistic loss). The partition count is
a property of the algorithm, not of the cluster: the answer does not depend on the number of
workers.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dl1.gap import duality_gap_from_stats
from dl1.solvers import _tasks as T


class ConvergenceWarning(UserWarning):
    """The solver stopped at its round limit before reaching the requested gap."""


@dataclass
class FitResult:
    """Result of :func:`dl1.fit`.

    Attributes
    ----------
    coef_ : ndarray (p,)
        Coefficients in the scale of the input features.
    intercept_ : float
    gap_ : float
        Relative duality gap ``(P - D) / P(0)`` of the returned point.
    dual_gap_ : float
        Absolute duality gap ``P - D``.
    primal_, dual_ : float
    p0_ : float
        ``P(0)``: the objective at ``w = 0`` with the intercept fitted.
    converged_ : bool
        ``gap_ <= tol``.
    n_rounds_ : int
        Rounds run (each is one pass over the data on the workers).
    history_ : list of dict
        Per round: objective, gap (relative), nnz, seconds since start, kernel and overhead
        seconds; for the working-set solver also how its steps ran (``transport``: "local",
        "tasks" through the scheduler, or "direct" calls to the workers, see
        :mod:`dl1.solvers.rpc`).
    alpha, l1_ratio, loss, tol : the problem solved.
    passes_ : float
        Passes over the data, in units of the whole matrix (screened columns are skipped).
    screened_ : bool ndarray (p,) or None
        Features proven zero by gap-safe screening during the solve (working-set solver).
    load_seconds_, solve_seconds_ : float
        Time to read the feature blocks into worker memory, and to solve afterwards.
    streamed_ : bool
        Out-of-core mode: blocks were read from the store by every task that used them.
    """

    coef_: np.ndarray
    intercept_: float
    gap_: float
    dual_gap_: float
    primal_: float
    dual_: float
    p0_: float
    converged_: bool
    n_rounds_: int
    alpha: float
    l1_ratio: float
    loss: str
    tol: float
    n_partitions: int
    history_: list[dict[str, Any]] = field(default_factory=list)
    passes_: float = float("nan")
    screened_: np.ndarray | None = None
    load_seconds_: float = float("nan")
    solve_seconds_: float = float("nan")
    streamed_: bool = False

    @property
    def overhead_fraction_(self) -> float:
        """``1 - kernel time / wall time`` over all rounds (kernel: the slowest partition's).

        Wall time is the coordinator's, from sending a round's work to holding its result:
        what remains after the kernels is scheduling, serialization and transfer.
        """
        return overhead_fraction(self.history_)

    def __repr__(self) -> str:
        return (
            f"FitResult(loss={self.loss!r}, alpha={self.alpha:.6g}, l1_ratio={self.l1_ratio}, "
            f"nnz={int(np.count_nonzero(self.coef_))}, gap={self.gap_:.3e}, "
            f"converged={self.converged_}, rounds={self.n_rounds_})"
        )


def overhead_fraction(history: list[dict[str, Any]]) -> float:
    """``1 - sum(busy_s) / sum(wall_s)`` over the rounds of a history that timed them."""
    rounds = [h for h in history if "wall_s" in h]
    wall = sum(h["wall_s"] for h in rounds)
    busy = sum(h["busy_s"] for h in rounds)
    return max(0.0, 1.0 - busy / wall) if wall > 0 else float("nan")


def _sparse_parts(w: np.ndarray, bounds: np.ndarray, blocks: list[int]):
    """The nonzero coefficients of each of ``blocks`` (:func:`dl1.solvers._tasks.coef_parts`)."""
    if not blocks:
        return []
    ranges = [(int(bounds[j]), int(bounds[j + 1])) for j in blocks]
    lo, hi = min(a for a, _ in ranges), max(b for _, b in ranges)
    ids = np.flatnonzero(w[lo:hi]) + lo
    return T.coef_parts(ids, w[ids], ranges)


def solve(
    ex: Any,
    blocks: list[Any],
    col_bounds: np.ndarray,
    y: np.ndarray,
    sw: np.ndarray,
    datafit: Any,
    penalty: Any,
    *,
    fit_intercept: bool,
    tol: float,
    max_rounds: int,
    n_partitions: int,
    n_epochs: int,
    random_order: bool,
    seed: int,
    w0: np.ndarray | None = None,
    b0: float | None = None,
    loss_name: str = "",
    verbose: bool = False,
    callback: Any = None,
) -> tuple[FitResult, np.ndarray]:
    """Run the rounds; returns the result (coef in the solver's scaled space) and ``z``.

    ``ex`` is an executor (:mod:`dl1.solvers.executor`): ``submit(fn, *args)`` and
    ``gather(handles)``; ``blocks`` are its handles of the loaded feature blocks.
    """
    n = y.shape[0]
    p = int(col_bounds[-1])
    K = len(blocks)
    n_partitions = max(1, min(n_partitions, K))
    parts = [list(a) for a in np.array_split(np.arange(K), n_partitions)]
    s_arg = None if sw.shape[0] == 0 else sw
    sigma = float(n_partitions)
    threshold = n * penalty.alpha_l1

    b_zero = datafit.initial_intercept(y, s_arg) if fit_intercept else 0.0
    p0 = datafit.value(y, np.full(n, b_zero), s_arg)
    w = np.zeros(p) if w0 is None else np.asarray(w0, dtype=np.float64).copy()
    b = (b_zero if b0 is None else float(b0)) if fit_intercept else 0.0
    z = np.full(n, b)
    if w.any():
        us = ex.gather(
            [
                ex.submit(
                    T.matvec_task, [blocks[j] for j in part], _sparse_parts(w, col_bounds, part), n
                )
                for part in parts
            ]
        )
        for u in us:
            z += u

    history: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    primal = dual = gap = np.inf
    converged = False
    rounds = 0
    for r in range(max_rounds + 1):
        if fit_intercept:
            db = datafit.intercept_update(y, z, s_arg, max_iter=20)
            b += db
            z += db
        g = datafit.gradient(y, z, s_arg)
        theta = datafit.dual_point(y, z, s_arg, fit_intercept)
        last = r == max_rounds
        t0 = time.perf_counter()
        handles = [
            ex.submit(
                T.round_task if not last else T.xt_theta_task,
                *(
                    (
                        [blocks[j] for j in part],
                        _sparse_parts(w, col_bounds, part),
                        g,
                        theta,
                        sw,
                        sigma,
                        datafit.beta,
                        penalty.alpha_l1,
                        penalty.alpha_l2,
                        n_epochs,
                        random_order,
                        seed * 7919 + r * n_partitions + q,
                        threshold,
                        True,
                    )
                    if not last
                    else ([blocks[j] for j in part], theta, threshold)
                ),
            )
            for q, part in enumerate(parts)
        ]
        results = ex.gather(handles)
        wall = time.perf_counter() - t0
        if last:
            stats = [s for res in results for s in res]
        else:
            stats = [s for res in results for s in res[2]]
        absmax = max((s[0] for s in stats), default=0.0)
        excess = float(sum(s[1] for s in stats))
        primal, dual, gap = duality_gap_from_stats(
            datafit,
            penalty,
            y,
            z,
            w,
            absmax,
            excess,
            s=s_arg,
            intercept=fit_intercept,
            theta=theta,
        )
        rel = gap / p0 if p0 > 0 else gap
        entry = {
            "round": r,
            "objective": primal,
            "gap": rel,
            "nnz": int(np.count_nonzero(w)),
            "seconds": time.perf_counter() - t_start,
        }
        if not last:
            kern = max(res[3]["kernel_s"] for res in results)
            entry.update(wall_s=wall, kernel_s=kern, busy_s=kern)
            entry["overhead_fraction"] = max(0.0, 1.0 - kern / wall) if wall > 0 else 0.0
        history.append(entry)
        if verbose:
            print(f"round {r:4d}  objective {primal:.10g}  gap {rel:.3e}  nnz {entry['nnz']}")
        if callback is not None:
            callback(entry)
        rounds = r
        if rel <= tol:
            converged = True
            break
        if last:
            break
        # apply the round's updates (partition order: deterministic)
        for q, part in enumerate(parts):
            w_new, u, _, _ = results[q]
            for j, (idx, val) in zip(part, w_new, strict=True):
                seg = w[col_bounds[j] : col_bounds[j + 1]]
                seg[:] = 0.0
                seg[idx] = val
            z += u
    res = finish(
        w,
        b,
        gap,
        primal,
        dual,
        p0,
        converged,
        rounds,
        penalty,
        loss_name,
        tol,
        n_partitions,
        history,
    )
    return res, z


def finish(
    w,
    b,
    gap,
    primal,
    dual,
    p0,
    converged,
    rounds,
    penalty,
    loss_name,
    tol,
    n_partitions,
    history,
    **extra: Any,
) -> FitResult:
    """The :class:`FitResult` of a solve, warning (ConvergenceWarning) if it is not certified."""
    rel = gap / p0 if p0 > 0 else gap
    res = FitResult(
        coef_=w,
        intercept_=float(b),
        gap_=float(rel),
        dual_gap_=float(gap),
        primal_=float(primal),
        dual_=float(dual),
        p0_=float(p0),
        converged_=converged,
        n_rounds_=rounds,
        alpha=penalty.alpha,
        l1_ratio=penalty.l1_ratio,
        loss=loss_name,
        tol=tol,
        n_partitions=n_partitions,
        history_=history,
        **extra,
    )
    if not converged:
        warnings.warn(
            f"dl1 did not converge: relative duality gap {rel:.3e} > tol {tol:.3e} after "
            f"{rounds} rounds (alpha={penalty.alpha:.6g}); raise max_rounds or tol",
            ConvergenceWarning,
            stacklevel=4,
        )
    return res
