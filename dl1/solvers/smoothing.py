"""The hinge loss certified at ``tol``: exact LP working sets, or smoothing with
continuation.

The hinge is not smooth, so the working-set solver cannot take it as it is.
:class:`SmoothingSolver` certifies every point it reaches by the hinge's own duality gap:
the hinge objective at ``(w, b)`` (the intercept refitted for the hinge) against the hinge
dual at a dual point feasible for it (``c = y theta / s`` in ``[0, 1]``, ``sum theta = 0``
with an intercept, rescaled for the L1 part from a pass over every column).

1. **Pure L1 (``l1_ratio = 1``): exact working sets.** The problem is a linear program
   (Zhu et al.'s 1-norm SVM). Each round solves the LP restricted to a working set exactly
   (:func:`dl1.tasks.hinge_lp.hinge_lp_task`, HiGHS on the columns gathered on one
   worker); its multipliers are the hinge's dual point, and one pass over every column
   certifies it and ranks the violators. The next working set is the support plus the
   worst violators, up to ``max(ws_start, 2 |support|)`` features (the working-set
   solver's rule); the first is chosen at the start point (``w = 0``, or a path's previous
   alpha) by the hinge's subgradient dual point. Every round adds the features whose
   constraints the LP's dual point violates most, so the rounds end at the optimum.
2. **Elastic net (``l1_ratio < 1``, a QP): smoothing with continuation.** The working-set
   solver solves ``SmoothHinge(gamma)`` (between the hinge minus ``gamma / 2`` and the
   hinge), for ``gamma`` decreasing from ``gamma_start``, each stage warm-started from the
   last and solved to ``tol P0 / 2``. The smoothed dual point is feasible for the hinge and,
   with the same ``theta``, the hinge gap exceeds the smoothed one by ``(1/n) sum_i s_i
   [(hinge - smooth)(m_i) - gamma kappa^2 c_i^2 / 2]`` (``kappa`` the rescaling), between 0
   and ``gamma / 2``: ``gamma <= tol P0`` (``gamma_min``) certifies for sure. Before that,
   the excess measured at a stage (about proportional to ``gamma``) predicts the ``gamma``
   whose excess is ``tol P0 / 2``: the next ``gamma`` is that prediction within
   ``[max(gamma_min, shrink gamma), gamma / 2]``, so stages are at most ``1 +
   log2(gamma_start / gamma_min)``.

Other (smooth) losses go to the working-set solver unchanged.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np

from dl1.errors import ValidationError
from dl1.objective.datafits.hinge import Hinge, SmoothHinge
from dl1.objective.gap import duality_gap_from_stats
from dl1.solvers.base import Problem, WarmState
from dl1.solvers.numerics import check_round
from dl1.solvers.options import SolverOptions
from dl1.solvers.result import Certificate, FitResult, convergence_warning, make_result
from dl1.solvers.scans import choose_working_set, scan_pass
from dl1.solvers.subproblems import CachedGroup
from dl1.solvers.ws import WorkingSetSolver, WorkingSetState
from dl1.tasks.blocks import identity
from dl1.tasks.columns import extract_task
from dl1.tasks.growth import WS_START
from dl1.tasks.hinge_lp import hinge_lp_task


class Point(NamedTuple):
    """A certified point: coefficients, intercept, ``z = X w + b``, the hinge's
    certificate, the last pass's blocks (violators) and the smoothed gap it came with."""

    w: np.ndarray
    b: float
    z: np.ndarray
    cert: Certificate
    per_block: list
    smooth_gap: float = 0.0

    @property
    def excess(self) -> float:
        """What smoothing added to the gap at this point (>= 0 up to rounding)."""
        return max(self.cert.gap - self.smooth_gap, 0.0)


class SmoothingSolver:
    """The hinge by exact LP working sets (pure L1) or smoothing with continuation in
    ``gamma`` (elastic net), certified by the hinge's duality gap (see the module
    docstring). Other losses go to the working-set solver.

    Parameters
    ----------
    max_rounds : int
        Rounds at most: LP working sets, or those of each smoothed stage.
    gamma_start : float
        ``gamma`` of the first smoothed stage (1: the smoothed hinge's default).
    shrink : float
        Continuation: each stage's ``gamma`` is at least ``shrink`` times the last one.
    ws_start : int
        Working-set size of the first LP round at least.
    max_inner_epochs, spread, random_order, seed
        Passed to :class:`~dl1.solvers.ws.WorkingSetSolver`.
    verbose, callback : a line, or a call with the history entry, per round.
    """

    name = "smoothing"
    layout = "columns"
    returns_z = True
    #: takes a loss without a curvature bound (the hinge), unlike the other column solvers
    smooths = True

    @classmethod
    def from_options(cls, o: SolverOptions) -> SmoothingSolver:
        """This solver configured from the entry points' keywords (those it has)."""
        return cls(
            max_rounds=o.rounds, spread=o.spread, random_order=o.random_order, seed=o.seed,
            verbose=o.verbose, callback=o.callback,
        )  # fmt: skip

    def __init__(
        self,
        *,
        max_rounds: int = 1000,
        gamma_start: float = 1.0,
        shrink: float = 0.1,
        ws_start: int = WS_START,
        max_inner_epochs: int = 50_000,
        spread: bool | str | None = None,
        random_order: bool = False,
        seed: int = 0,
        verbose: bool = False,
        callback: Any = None,
    ) -> None:
        if not (gamma_start > 0.0 and 0.0 < shrink < 1.0):
            raise ValidationError(
                f"gamma_start = {gamma_start!r} must be > 0 and shrink = {shrink!r} in (0, 1)"
            )
        self.max_rounds = max_rounds
        self.gamma_start = gamma_start
        self.shrink = shrink
        self.ws_start = ws_start
        self.max_inner_epochs = max_inner_epochs
        self.spread = spread
        self.random_order = random_order
        self.seed = seed
        self.verbose = verbose
        self.callback = callback

    @property
    def inner(self) -> WorkingSetSolver:
        """The working-set solver of the smoothed stages (no screening: its last pass must
        cover every column for the hinge's certificate)."""
        return WorkingSetSolver(
            max_rounds=self.max_rounds, max_inner_epochs=self.max_inner_epochs,
            spread=self.spread, random_order=self.random_order, seed=self.seed,
            verbose=self.verbose, callback=self.callback,
        )  # fmt: skip

    @property
    def direct_calls(self) -> bool:
        return not self.spread

    def solve(
        self, problem: Problem, warm: WarmState | None = None
    ) -> tuple[FitResult, WorkingSetState]:
        """LP working sets (pure L1) or smoothed stages, until the hinge gap is within
        ``problem.tol``."""
        if not isinstance(problem.datafit, Hinge):
            return self.inner.solve(problem, warm)
        target = problem.tol * problem.p_zero
        history: list[dict[str, Any]] = []
        if problem.penalty.alpha_l2 == 0.0:
            point, groups = self._lp_rounds(problem, self._start(problem, warm), history)
            state = WorkingSetState(point.w, point.b, point.z, groups=tuple(groups))
        else:
            gamma = max(self.gamma_start, target)
            point, state = self._stage(problem, gamma, 0.5 * target, warm, history)
            point, state = self._continue(problem, point, state, gamma, history)
        res = make_result(
            problem, point.w, point.b, point.cert, point.cert.gap <= target,
            len(history) - 1, history,
        )  # fmt: skip
        return res, replace(state, coef=point.w, intercept=point.b, z=point.z, last_scan=None)

    # -- smoothed stages -------------------------------------------------------------------
    def _stage(
        self, problem: Problem, gamma: float, target: float, warm: WarmState | None,
        history: list[dict[str, Any]],
    ) -> tuple[Point, WorkingSetState]:  # fmt: skip
        """The smoothed problem at ``gamma`` solved to the absolute gap ``target`` from
        ``warm`` (without its last pass: another ``gamma``'s dual point), certified for the
        hinge; its rounds appended to ``history``."""
        smooth = replace(problem, datafit=SmoothHinge(gamma))
        smooth = replace(smooth, tol=target / smooth.p_zero)
        if isinstance(warm, WorkingSetState):
            warm = replace(warm, last_scan=None, sphere=None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", convergence_warning())
            res, state = self.inner.solve(smooth, warm)
        last = state.last_scan
        point = self._certify(
            problem, state.coef, state.intercept, state.z, last.theta, last.per_block
        )
        start = len(history)
        history += [dict(e, gamma=gamma) for e in res.history_]
        for r, entry in enumerate(history[start:], start):
            entry["round"] = r
        history[-1]["hinge_gap"] = problem.relative_gap(point.cert.gap)
        return point._replace(smooth_gap=res.dual_gap_), state

    def _continue(
        self, problem: Problem, point: Point, state: WorkingSetState, gamma: float,
        history: list[dict[str, Any]],
    ) -> tuple[Point, WorkingSetState]:  # fmt: skip
        """Smoothed stages of decreasing ``gamma`` until the hinge gap is within tol."""
        target = problem.tol * problem.p_zero
        gamma_min = max(target, np.finfo(float).tiny)
        for _ in range(self.max_stages(gamma, gamma_min)):
            if point.cert.gap <= target or gamma <= gamma_min:
                break
            predicted = gamma * 0.5 * target / point.excess if point.excess > 0 else 0.0
            gamma = max(gamma_min, self.shrink * gamma, min(0.5 * gamma, predicted))
            point, state = self._stage(problem, gamma, 0.5 * target, state, history)
        return point, state

    def max_stages(self, gamma: float, gamma_min: float) -> int:
        """Continuation stages at most: ``gamma`` at least halves each time."""
        return 1 + max(0, math.ceil(math.log2(gamma / gamma_min)))

    def _certify(
        self, problem: Problem, w: np.ndarray, b: float, z: np.ndarray, theta: np.ndarray,
        per_block: list,
    ) -> Point:  # fmt: skip
        """The hinge's gap at ``(w, b)`` (``z = X w + b``), the intercept refitted for the
        hinge, against the dual point ``theta`` (``X^T theta``'s statistics in the pass's
        ``per_block``)."""
        pb = problem
        db = pb.datafit.intercept_update(pb.y, z, pb.weights) if pb.fit_intercept else 0.0
        z = z + db
        absmax = max((blk.stats.absmax for blk in per_block), default=0.0)
        excess = float(sum(blk.stats.excess for blk in per_block))
        cert = Certificate(*duality_gap_from_stats(
            pb.datafit, pb.penalty, pb.y, z, w, absmax, excess, s=pb.weights,
            intercept=pb.fit_intercept, theta=theta,
        ))  # fmt: skip
        return Point(w, b + db, z, cert, per_block)

    # -- exact working sets (pure L1) ------------------------------------------------------
    def _start(self, problem: Problem, warm: WarmState | None) -> Point:
        """The warm start (or ``w = 0`` with its intercept) certified by the hinge's own
        dual point, from a pass that also ranks the violators."""
        pb = problem
        if warm is None:
            w, b = np.zeros(pb.p), pb.initial_intercept()
            z = np.full(pb.n, b)
        else:
            w, b, z = np.asarray(warm.coef, np.float64), float(warm.intercept), warm.z
        theta = pb.datafit.dual_point(pb.y, z, pb.weights, pb.fit_intercept)
        ws_size = max(self.ws_start, 2 * int(np.count_nonzero(w)))
        scans = scan_pass(pb, theta, pb.n * pb.penalty.alpha_l1, w, ws_size,
                          [None] * len(pb.blocks), None)  # fmt: skip
        return self._certify(pb, w, b, z, theta, [blk for part in scans for blk in part.blocks])

    def _lp_rounds(
        self, problem: Problem, point: Point, history: list[dict[str, Any]]
    ) -> tuple[Point, list[CachedGroup]]:
        """LP working sets from ``point`` until the hinge gap is within tol (or
        ``max_rounds``); also the column groups the workers cache."""
        pb, ex = problem, problem.executor
        target = pb.tol * pb.p_zero
        groups: list[CachedGroup] = []
        handles = pb.handles or (ex.submit(identity, pb.y), ex.submit(identity, pb.sample_weight))
        threshold = pb.n * pb.penalty.alpha_l1
        t0 = time.perf_counter()
        self._record(pb, point, history, np.zeros(0), 0.0, t0)
        ws = np.zeros(0, np.int64)
        for _ in range(self.max_rounds):
            if point.cert.gap <= target:
                break
            support = np.flatnonzero(point.w)
            ws_size = max(self.ws_start, 2 * support.shape[0])
            last, ws = ws, choose_working_set(support, point.per_block, pb.col_bounds, ws_size)
            if np.array_equal(ws, last):  # the LP's own optimum: its rounding is the limit
                break
            groups += self._extract(pb, groups, ws)
            (out,) = ex.gather([ex.submit(
                hinge_lp_task, [g.handle for g in groups], [g.ids for g in groups], ws,
                *handles, pb.penalty.alpha_l1, pb.fit_intercept,
            )])  # fmt: skip
            w = np.zeros(pb.p)
            w[ws] = out.w
            scans = scan_pass(pb, out.theta, threshold, w, ws_size, [None] * len(pb.blocks),
                              None)  # fmt: skip
            per_block = [blk for part in scans for blk in part.blocks]
            point = self._certify(pb, w, out.intercept, out.z, out.theta, per_block)
            self._record(pb, point, history, ws, out.seconds, t0)
        return point, groups

    @staticmethod
    def _extract(problem: Problem, groups: list[CachedGroup], ws: np.ndarray) -> (
        list[CachedGroup]
    ):
        """Groups of the columns of ``ws`` not cached yet, extracted where their blocks
        live."""
        pb, ex = problem, problem.executor
        cached = np.concatenate([g.ids for g in groups] or [np.zeros(0, np.int64)])
        new = np.setdiff1d(ws, cached)
        owner = np.searchsorted(pb.col_bounds, new, side="right") - 1
        out = []
        for j in np.unique(owner):
            ids = new[owner == j]
            handle = ex.submit(extract_task, pb.blocks[j], ids - pb.col_bounds[j])
            out.append(CachedGroup(handle, ids, True))
        return out

    def _record(self, pb: Problem, point: Point, history: list[dict[str, Any]],
                ws: np.ndarray, lp_s: float, t0: float) -> None:  # fmt: skip
        """An LP round's history entry (and its line or callback)."""
        r = len(history)
        check_round("smoothing solver (LP round)", r,
                    {"duality gap": point.cert.gap, "objective": point.cert.primal},
                    [blk.stats for blk in point.per_block])  # fmt: skip
        gap = pb.relative_gap(point.cert.gap)
        entry = {"round": r, "objective": point.cert.primal, "gap": gap, "hinge_gap": gap,
                 "nnz": int(np.count_nonzero(point.w)), "ws_size": int(ws.shape[0]),
                 "lp_s": lp_s, "seconds": time.perf_counter() - t0,
                 "transport": pb.executor.transport}  # fmt: skip
        history.append(entry)
        if self.verbose:
            print(f"LP {r:3d}  objective {point.cert.primal:.10g}  gap {gap:.3e}  "
                  f"nnz {entry['nnz']}")  # fmt: skip
        if self.callback is not None:
            self.callback(entry)

    def restore(
        self, problem: Problem, arrays: dict[str, np.ndarray], intercept: float
    ) -> WarmState:
        """The state a checkpoint saved: the point (each solve starts at ``gamma_start`` and
        makes its own first pass, so a resumed path repeats the interrupted one)."""
        return WarmState(arrays["w"], intercept, arrays["z"])

    def release(self, problem: Problem, state: WarmState | None) -> None:
        """Drop what the workers cached for this solve or path."""
        self.inner.release(problem, state)
