"""Feature-partitioned distributed coordinate descent, certified by duality gaps.

The coordinator (this module, on the client) holds the small state: ``w`` (length p), the
intercept, ``z = X w + b`` and the gradient (length n). The data lives on the workers as
feature blocks (:class:`dl1.tasks.blocks.Block`), loaded once from the store or the dask
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
from typing import Any

import numpy as np

from dl1.objective.gap import duality_gap_from_stats
from dl1.solvers.base import Problem, WarmState
from dl1.solvers.numerics import Progress, check_round
from dl1.solvers.options import SolverOptions
from dl1.solvers.result import (
    UNCERTIFIED,
    Certificate,
    FitResult,
    coef_by_block,
    make_result,
)
from dl1.tasks.passes import matvec_task, round_task, xt_theta_task
from dl1.tasks.records import GapStats, RoundOutput

#: Rounds without progress after which a solve stops (:class:`~dl1.solvers.numerics.
#: Progress`): a gap falling by less than 1% in as many rounds would not reach tol within
#: the default round limit from any useful start.
STALL_ROUNDS = 100


class CoordinateDescentSolver:
    """CoCoA+ rounds of local coordinate descent on every partition (see the module).

    Parameters
    ----------
    max_rounds : int
        Rounds at most; the last only certifies. Reaching it warns with the gap reached. A
        solve whose gap has not fallen by 1% in :data:`STALL_ROUNDS` rounds stops before,
        and warns why.
    n_epochs : int
        Local epochs per round.
    random_order, seed : uniformly random coordinate order (stochastic coordinate descent).
    verbose, callback : a line, or a call with the history entry, per round.
    """

    name = "cd"
    layout = "columns"
    returns_z = True
    #: every round is partition tasks: direct calls would not shorten it
    direct_calls = False

    @classmethod
    def from_options(cls, o: SolverOptions) -> CoordinateDescentSolver:
        """This solver configured from the entry points' keywords (those it has)."""
        return cls(
            max_rounds=o.rounds, n_epochs=o.n_epochs, random_order=o.random_order, seed=o.seed,
            verbose=o.verbose, callback=o.callback,
        )  # fmt: skip

    def __init__(
        self,
        *,
        max_rounds: int = 1000,
        n_epochs: int = 1,
        random_order: bool = False,
        seed: int = 0,
        verbose: bool = False,
        callback: Any = None,
    ) -> None:
        self.max_rounds = max_rounds
        self.n_epochs = n_epochs
        self.random_order = random_order
        self.seed = seed
        self.verbose = verbose
        self.callback = callback

    def solve(
        self, problem: Problem, warm: WarmState | None = None
    ) -> tuple[FitResult, WarmState]:
        """Rounds until the start point of one is certified within ``problem.tol``."""
        pb = problem
        w, b, z = self._start(pb, warm)
        history: list[dict[str, Any]] = []
        t_start = time.perf_counter()
        cert, converged, rounds = UNCERTIFIED, False, 0
        progress = Progress(STALL_ROUNDS)
        for r in range(self.max_rounds + 1):
            last = r == self.max_rounds
            if pb.fit_intercept:
                db = pb.datafit.intercept_update(pb.y, z, pb.weights, max_iter=20)
                b += db
                z += db
            t0 = time.perf_counter()
            results, stats = self._round(pb, w, z, r, last)
            wall = time.perf_counter() - t0
            absmax = max((st.absmax for st in stats), default=0.0)
            excess = float(sum(st.excess for st in stats))
            theta = pb.datafit.dual_point(pb.y, z, pb.weights, pb.fit_intercept)
            cert = Certificate(*duality_gap_from_stats(
                pb.datafit, pb.penalty, pb.y, z, w, absmax, excess, s=pb.weights,
                intercept=pb.fit_intercept, theta=theta,
            ))  # fmt: skip
            check_round(
                "coordinate descent", r,
                {"duality gap": cert.gap, "objective": cert.primal, "max |X^T theta|": absmax,
                 "intercept": b},
                stats,
            )  # fmt: skip
            entry = self._entry(r, cert, pb.relative_gap(cert.gap), w, t_start, wall, results)
            history.append(entry)
            rounds = r
            if entry["gap"] <= pb.tol:
                converged = True
                break
            if last:
                break
            if progress.stalled(entry["gap"]):
                entry["stopped"] = progress.reason(pb.tol)
                break
            self._apply(pb, w, z, results)
        res = make_result(pb, w, b, cert, converged, rounds, history, streamed_=pb.streamed)
        return res, WarmState(w, b, z)

    def _start(self, pb: Problem, warm: WarmState | None) -> tuple[np.ndarray, float, np.ndarray]:
        """``(w, b, z = X w + b)`` of the warm start, ``z`` recomputed on the workers."""
        w = np.zeros(pb.p) if warm is None else np.asarray(warm.coef, dtype=np.float64).copy()
        b = pb.initial_intercept() if warm is None else float(warm.intercept)
        b = b if pb.fit_intercept else 0.0
        z = np.full(pb.n, b)
        if w.any():
            ex = pb.executor
            for u in ex.gather(
                [
                    ex.submit(matvec_task, [pb.blocks[j] for j in part],
                              coef_by_block(w, pb.col_bounds, part), pb.n)
                    for part in pb.partitions
                ]
            ):  # fmt: skip
                z += u
        return w, b, z

    def _round(
        self, pb: Problem, w: np.ndarray, z: np.ndarray, r: int, last: bool
    ) -> tuple[list[RoundOutput] | None, list[GapStats]]:
        """Every partition's round (:func:`round_task`), or on the last round only the
        certificate's statistics (:func:`xt_theta_task`)."""
        ex, datafit = pb.executor, pb.datafit
        g = datafit.gradient(pb.y, z, pb.weights)
        theta = datafit.dual_point(pb.y, z, pb.weights, pb.fit_intercept)
        threshold = pb.n * pb.penalty.alpha_l1
        parts = pb.partitions
        if last:
            stats = ex.gather(
                [ex.submit(xt_theta_task, [pb.blocks[j] for j in part], theta, threshold)
                 for part in parts]
            )  # fmt: skip
            return None, [st for part in stats for st in part]
        sigma = float(len(parts))
        results = ex.gather(
            [
                ex.submit(
                    round_task, [pb.blocks[j] for j in part],
                    coef_by_block(w, pb.col_bounds, part), g, theta, pb.sample_weight, sigma,
                    datafit.beta, pb.penalty.alpha_l1, pb.penalty.alpha_l2, self.n_epochs,
                    self.random_order, self.seed * 7919 + r * len(parts) + q, threshold, True,
                )
                for q, part in enumerate(parts)
            ]
        )  # fmt: skip
        return results, [st for res in results for st in res.stats]

    def _entry(self, r, cert, gap, w, t_start, wall, results) -> dict[str, Any]:
        entry = {
            "round": r,
            "objective": cert.primal,
            "gap": gap,
            "nnz": int(np.count_nonzero(w)),
            "seconds": time.perf_counter() - t_start,
        }
        if results is not None:
            kern = max(res.kernel_s for res in results)
            entry.update(wall_s=wall, kernel_s=kern, busy_s=kern)
            entry["overhead_fraction"] = max(0.0, 1.0 - kern / wall) if wall > 0 else 0.0
        if self.verbose:
            print(f"round {r:4d}  objective {cert.primal:.10g}  gap {entry['gap']:.3e}"
                  f"  nnz {entry['nnz']}")  # fmt: skip
        if self.callback is not None:
            self.callback(entry)
        return entry

    @staticmethod
    def _apply(pb: Problem, w: np.ndarray, z: np.ndarray, results: list[RoundOutput]) -> None:
        """Add the partitions' updates in partition order (deterministic aggregation)."""
        for part, res in zip(pb.partitions, results, strict=True):
            for j, (idx, val) in zip(part, res.coef, strict=True):
                seg = w[pb.col_bounds[j] : pb.col_bounds[j + 1]]
                seg[:] = 0.0
                seg[idx] = val
            z += res.u

    def restore(
        self, problem: Problem, arrays: dict[str, np.ndarray], intercept: float
    ) -> WarmState:
        """The state a checkpoint saved."""
        return WarmState(arrays["w"], intercept, arrays["z"])

    def release(self, problem: Problem, state: WarmState | None) -> None:
        """Nothing is cached on the workers."""
