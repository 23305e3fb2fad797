"""One-vs-rest: ``K`` binary problems solved together, every pass over the data shared.

liblinear's scheme: class ``k`` against the rest, labels ``y_k = +1`` on its samples and
``-1`` elsewhere, each class its own binary problem ``min F_k(X w_k + b_k) + penalty(w_k)``
(logistic, squared-hinge or hinge loss; :class:`dl1.solvers.base.Problem`) with its own
intercept. Each round:

1. every unconverged class's dual point ``theta_k`` (after its intercept's update, as the
   binary working-set solver takes it: :func:`dl1.tasks.passes.pass_dual_point`; for the
   hinge, the multipliers of its last LP) is stacked into ``Theta`` (``n x K``), and ONE
   pass over the feature blocks computes ``X^T Theta`` (:func:`~dl1.tasks.ovr.
   ovr_scan_task`), returning per class the statistics of the binary certificate and the
   class's worst KKT violators;
2. the coordinator certifies each class by its own duality gap
   (:func:`dl1.objective.gap.duality_gap_from_stats`, the binary solver's definitions,
   relative to that class's ``P(0)``); a certified class stops and leaves the later
   passes;
3. each unconverged class's working set is its support plus its worst violators
   (:func:`dl1.solvers.scans.choose_working_set`, the binary growth rule); the columns of
   the union of the working sets are extracted once (cached between rounds), and each
   class's restricted problem is solved by the binary solver's own subproblem
   (:func:`dl1.tasks.subproblem.subproblem_task`; for the hinge with the pure L1 penalty,
   the exact LP of :func:`dl1.tasks.hinge_lp.hinge_lp_task`), one task per class.

A class's rounds are those of its binary working-set solve, so the rounds (passes over X)
of the whole fit are about the largest of the classes' binary rounds, not their sum. The
coordinator holds ``O(n K)`` numbers (the classes' ``z`` and ``theta``) and each class's
support, never a dense ``K x p`` matrix.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import reduce
from typing import Any

import numpy as np
import scipy.sparse as sp

from dl1.errors import ValidationError
from dl1.objective.datafits.hinge import Hinge
from dl1.objective.gap import duality_gap_from_stats
from dl1.objective.penalties.elastic_net import ElasticNet
from dl1.solvers.base import Problem
from dl1.solvers.class_start import WarmStart, decisions_at, gather_ws_columns
from dl1.solvers.numerics import Progress, check_round, check_update
from dl1.solvers.result import UNCERTIFIED, Certificate
from dl1.solvers.scans import choose_working_set, violators_left_out
from dl1.solvers.subproblems import CachedGroup
from dl1.solvers.ws import STALL_ROUNDS
from dl1.tasks.blocks import BlockSource, identity
from dl1.tasks.columns import compact_task, extract_task
from dl1.tasks.gram import GRAM_DENSE_MAX
from dl1.tasks.growth import WS_START, next_ws_size
from dl1.tasks.hinge_lp import hinge_lp_task
from dl1.tasks.ovr import ovr_scan_task
from dl1.tasks.passes import pass_dual_point
from dl1.tasks.subproblem import SubproblemSettings, subproblem_task


@dataclass(frozen=True)
class OvrProblem:
    """What a one-vs-rest solve reads: the executor and its feature blocks (futures or
    sources) with their first columns (and p), the class codes ``0..K-1``, the binary
    datafit and penalty every class shares, the intercept, ``tol`` (each class's relative
    gap) and the sample weights (normalised to sum to n; empty for unit weights)."""

    ex: Any
    blocks: list[Any]
    col_bounds: np.ndarray
    codes: np.ndarray
    n_classes: int
    datafit: Any
    penalty: ElasticNet
    fit_intercept: bool = True
    tol: float = 1e-4
    n_partitions: int = 2
    sample_weight: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        if isinstance(self.datafit, Hinge) and self.penalty.alpha_l2 > 0.0:
            raise ValidationError(
                "the one-vs-rest hinge takes the pure L1 penalty (l1_ratio=1, exact LP "
                f"working sets); got l1_ratio={self.penalty.l1_ratio!r}: use "
                "loss='squared_hinge' or 'logistic' for the elastic net"
            )

    def binary(self, k: int) -> Problem:
        """Class ``k`` against the rest: the binary :class:`Problem` with labels ``+-1``."""
        y = np.where(self.codes == k, 1.0, -1.0)
        return Problem(self.ex, self.blocks, self.col_bounds, y, self.sample_weight,
                       self.datafit, self.penalty, self.fit_intercept, self.tol,
                       self.n_partitions)  # fmt: skip

    @property
    def streamed(self) -> bool:
        """Out of core: the blocks are sources, read from the store by every task."""
        return bool(self.blocks) and isinstance(self.blocks[0], BlockSource)


@dataclass
class OvrResult:
    """A certified one-vs-rest fit. ``coef_`` is sparse ``(K, p)``; row ``k`` (with
    ``intercept_[k]``) is class ``classes_[k]`` against the rest. ``gaps_`` are the
    classes' duality gaps relative to their ``P(0)`` (``gap_``: the largest), ``primals_``
    and ``duals_`` their objectives and dual bounds; ``converged_classes_`` which reached
    ``tol`` and ``rounds_`` the round at which each was certified (or stopped).
    ``n_rounds_`` counts rounds as the binary solver does (the index of the last round: a
    fit certified at its first pass has 0), ``n_passes_`` the passes over X they made."""

    coef_: sp.csr_matrix
    intercept_: np.ndarray
    gaps_: np.ndarray
    primals_: np.ndarray
    duals_: np.ndarray
    tol: float
    converged_classes_: np.ndarray
    rounds_: np.ndarray
    n_rounds_: int
    n_passes_: float
    loss: str
    classes_: np.ndarray | None = None
    history_: list[dict] = field(default_factory=list)

    @property
    def gap_(self) -> float:
        """The largest class's relative gap: what ``tol`` bounds."""
        return float(self.gaps_.max())

    @property
    def converged_(self) -> bool:
        """Whether every class is certified within ``tol``."""
        return bool(self.converged_classes_.all())


@dataclass
class _Class:
    """One class's binary solve: its problem, its point (support, coefficients, intercept,
    ``z = X w + b``), the last pass's dual point and per-block scans, its certificate."""

    pb: Problem
    y_handle: Any
    support: np.ndarray
    coef: np.ndarray
    b: float
    z: np.ndarray
    progress: Progress
    theta: np.ndarray | None = None
    lp_theta: np.ndarray | None = None  # the hinge LP's multipliers: the next pass's theta
    per_block: list = field(default_factory=list)
    cert: Certificate = UNCERTIFIED
    gap: float = np.inf
    last_ws: np.ndarray | None = None
    converged: bool = False
    stopped: str | None = None
    rounds: int = 0

    @property
    def done(self) -> bool:
        return self.converged or self.stopped is not None

    def ws_size(self, ws_start: int, hinge: bool) -> int:
        """The working set's size, its binary solver's rule: ``max(ws_start, 2 |support|)``
        for the hinge (:class:`~dl1.solvers.smoothing.SmoothingSolver`), else
        :func:`~dl1.tasks.growth.next_ws_size` (growing faster after a filled set)."""
        if hinge:
            return max(ws_start, 2 * self.support.shape[0])
        last = 0 if self.last_ws is None else self.last_ws.shape[0]
        return next_ws_size(self.support.shape[0], last, ws_start)


class OneVsRestSolver:
    """``K`` one-vs-rest binary problems sharing every pass (see the module docstring).

    Parameters
    ----------
    max_rounds : int
        Rounds (passes over X) at most; a class not certified by then is reported with
        its gap.
    ws_start : int
        Working-set size of a class's first round.
    inner_ratio : float
        A class's subproblem is solved to this fraction of its current gap or of its final
        target (``tol P(0)``), whichever is smaller (the binary solver's gathered proximal
        Newton mode).
    max_inner_epochs : int
        Epochs of one subproblem at most.
    seed : int
        Seeds the subproblems' coordinate orders (cyclic unless asked otherwise).
    verbose, callback : a line, or a call with the history entry, per round.
    """

    name = "ovr"

    def __init__(
        self,
        *,
        max_rounds: int = 1000,
        ws_start: int = WS_START,
        inner_ratio: float = 0.3,
        max_inner_epochs: int = 50_000,
        seed: int = 0,
        verbose: bool = False,
        callback: Any = None,
    ) -> None:
        self.max_rounds = max_rounds
        self.ws_start = ws_start
        self.inner_ratio = inner_ratio
        self.max_inner_epochs = max_inner_epochs
        self.seed = seed
        self.verbose = verbose
        self.callback = callback

    def solve(self, prob: OvrProblem, start: WarmStart | None = None) -> OvrResult:
        """Rounds of one shared pass, per-class certificates and the unconverged classes'
        subproblems, until every class is certified (or stopped); from ``start`` (each
        class from its column of ``W`` and its intercept) or from ``w = 0``."""
        run = _Run(self, prob, start)
        for r in range(self.max_rounds + 1):
            active = [c for c in run.classes if not c.done]
            if not active:
                break
            run.scan_and_certify(active, r)
            todo = [c for c in active if not c.done]
            if not todo or r == self.max_rounds:
                break
            run.subproblems(todo, r)
        return run.finish()

    def patience(self, p: int) -> int:
        """Rounds without progress before a class stops (the binary solver's rule)."""
        return STALL_ROUNDS + int(np.ceil(np.log2(max(1.0, p / self.ws_start))))


class _Run:
    """The mutable state of one :meth:`OneVsRestSolver.solve`: the classes, the cached
    column groups, the history."""

    def __init__(self, solver: OneVsRestSolver, prob: OvrProblem,
                 start: WarmStart | None = None) -> None:  # fmt: skip
        self.solver, self.prob = solver, prob
        ex = prob.ex
        self.hinge = isinstance(prob.datafit, Hinge)
        self.sw_handle = ex.submit(identity, prob.sample_weight)
        patience = solver.patience(int(prob.col_bounds[-1]))
        self.classes = [self._start(prob.binary(k), patience) for k in range(prob.n_classes)]
        if start is not None:
            self._warm(start)
        k = len(prob.blocks)
        count = max(1, min(prob.n_partitions, k))
        self.partitions = [[int(j) for j in part] for part in np.array_split(np.arange(k), count)]
        self.part_of_block = np.zeros(k, np.int64)
        for q, part in enumerate(self.partitions):
            self.part_of_block[part] = q
        self.groups: list[CachedGroup] = []
        self.history: list[dict[str, Any]] = []
        self.passes = 0.0
        self.total_nnz = 0
        self.rounds = 0
        self.t_start = time.perf_counter()

    def _start(self, pb: Problem, patience: int) -> _Class:
        """Class's start point: ``w = 0`` with the intercept of ``w = 0``."""
        b = pb.initial_intercept()
        return _Class(pb, pb.executor.submit(identity, pb.y), np.zeros(0, np.int64),
                      np.zeros(0), b, np.full(pb.n, b), Progress(patience))  # fmt: skip

    def _warm(self, start: WarmStart) -> None:
        """Move each class ``k`` to ``start``'s column ``k`` (its support, coefficients and
        intercept, if given), with ``z`` recomputed exactly from the support's columns."""
        prob = self.prob
        b = np.array([c.b for c in self.classes])  # those of w = 0 (0 without intercept)
        if prob.fit_intercept and start.b is not None:
            b = np.asarray(start.b, np.float64)
        cols = gather_ws_columns(prob.ex, prob.blocks, prob.col_bounds, start.support)
        Z = decisions_at(cols, start.W, b, prob.codes.shape[0])
        for k, c in enumerate(self.classes):
            nz = np.flatnonzero(start.W[:, k])
            c.support, c.coef = start.support[nz], np.asarray(start.W[nz, k], np.float64)
            c.b, c.z = float(b[k]), np.ascontiguousarray(Z[:, k])

    # -- the shared pass -------------------------------------------------------------------
    def scan_and_certify(self, active: list[_Class], r: int) -> None:
        """The round's one pass for every active class, then each class's certificate."""
        t0 = time.perf_counter()
        for c in active:
            self._dual_point(c)
        scans = self._pass(active)
        per_block = [blk for part in scans for blk in part.blocks]
        if not self.total_nnz:
            self.total_nnz = max(1, sum(blk[0].visited for blk in per_block))
        self.passes += 1.0
        for i, c in enumerate(active):
            c.per_block = [blk[i] for blk in per_block]
            self._certify(c, r)
        self.rounds = r
        self._record(r, len(active), time.perf_counter() - t0,
                     max((part.seconds for part in scans), default=0.0))  # fmt: skip

    def _dual_point(self, c: _Class) -> None:
        """Class ``c``'s ``theta`` for the pass: after the intercept's update, the datafit's
        (:func:`pass_dual_point`), or for the hinge the last LP's multipliers (the
        intercept refitted for the hinge: a better primal, and any feasible ``theta``
        bounds the optimum from below; :class:`~dl1.solvers.smoothing.SmoothingSolver`)."""
        prob = self.prob
        if c.lp_theta is not None:
            db = (prob.datafit.intercept_update(c.pb.y, c.z, c.pb.weights)
                  if prob.fit_intercept else 0.0)  # fmt: skip
            c.z = c.z + db
            c.theta, c.lp_theta = c.lp_theta, None
        else:
            db, c.theta = pass_dual_point(prob.datafit, c.pb.y, c.z, c.pb.weights,
                                          prob.fit_intercept)  # fmt: skip
        c.b += db

    def _pass(self, active: list[_Class]) -> list:
        """One :func:`ovr_scan_task` per partition on ``Theta``, the active classes' dual
        points side by side, with each class's support and candidate count."""
        prob, ex = self.prob, self.prob.ex
        theta = np.column_stack([c.theta for c in active])
        threshold = active[0].pb.n * prob.penalty.alpha_l1
        supports = [c.support for c in active]
        sizes = [c.ws_size(self.solver.ws_start, self.hinge) for c in active]
        cb = prob.col_bounds
        return ex.gather([
            ex.submit(ovr_scan_task, [prob.blocks[j] for j in part], [int(cb[j]) for j in part],
                      theta, threshold, supports, sizes)
            for part in self.partitions
        ])  # fmt: skip

    def _certify(self, c: _Class, r: int) -> None:
        """Class ``c``'s duality gap from its statistics of the pass (the binary solver's
        :meth:`~dl1.solvers.ws.Run.certify`); it stops once within ``tol`` or stalled."""
        pb = c.pb
        stats = [blk.stats for blk in c.per_block]
        absmax = max((s.absmax for s in stats), default=0.0)
        excess = float(sum(s.excess for s in stats))
        box = float(sum(s.box for s in stats))
        c.cert = Certificate(*duality_gap_from_stats(
            pb.datafit, pb.penalty, pb.y, c.z, c.coef, absmax, excess, s=pb.weights,
            intercept=pb.fit_intercept, theta=c.theta, box=box,
        ))  # fmt: skip
        check_round("one-vs-rest solver", r,
                    {"duality gap": c.cert.gap, "objective": c.cert.primal,
                     "max |X^T theta|": absmax, "intercept": c.b}, stats)  # fmt: skip
        c.gap, c.rounds = pb.relative_gap(c.cert.gap), r
        if c.gap <= pb.tol:
            c.converged = True
        elif c.progress.stalled(c.gap):
            c.stopped = c.progress.reason(pb.tol)

    def _record(self, r: int, n_active: int, scan_s: float, kernel_s: float) -> None:
        """The round's history entry (its subproblems' figures are added later)."""
        gaps = [c.gap for c in self.classes]
        entry = {
            "round": r, "gaps": gaps, "gap": max(gaps), "active": n_active,
            "nnz": [int(c.support.shape[0]) for c in self.classes],
            "passes": self.passes, "scan_s": scan_s, "scan_kernel_s": kernel_s,
            "seconds": time.perf_counter() - self.t_start,
        }  # fmt: skip
        self.history.append(entry)
        if self.solver.verbose:
            print(f"round {r:3d}  active {n_active:3d}  largest gap {entry['gap']:.3e}")
        if self.solver.callback is not None:
            self.solver.callback(entry)

    # -- the classes' subproblems ----------------------------------------------------------
    def subproblems(self, todo: list[_Class], r: int) -> None:
        """Each unconverged class's working set; the union's columns extracted once; one
        subproblem task per class (gathered together: they run side by side)."""
        t0 = time.perf_counter()
        cb = self.prob.col_bounds
        plans = []
        for c in todo:
            size = c.ws_size(self.solver.ws_start, self.hinge)
            ws = choose_working_set(c.support, c.per_block, cb, size)
            crowded = violators_left_out(c.per_block, ws.shape[0] - c.support.shape[0])
            if self.hinge and c.last_ws is not None and np.array_equal(ws, c.last_ws):
                # the LP's own optimum on every violator: its rounding is the limit
                c.stopped = "stopped: the hinge LP's working set repeats (rounding limit)"
                continue
            c.last_ws = ws
            plans.append((c, ws, crowded))
        if not plans:
            return
        self.cache_columns(reduce(np.union1d, [ws for _, ws, _ in plans]))
        ex = self.prob.ex
        handles = [ex.submit(*self._call(c, ws, r, crowded)) for c, ws, crowded in plans]
        epochs = 0
        for (c, ws, _), out in zip(plans, ex.gather(handles), strict=True):
            epochs += self._update(c, ws, out, r)
        entry = self.history[-1]
        entry.update(ws_sizes=[int(ws.shape[0]) for _, ws, _ in plans],
                     union_size=int(self._cached_ids().shape[0]), inner_epochs=epochs,
                     inner_s=time.perf_counter() - t0)  # fmt: skip

    def _call(self, c: _Class, ws: np.ndarray, r: int, crowded: bool) -> tuple:
        """The task and arguments of class ``c``'s subproblem on ``ws``: the cached groups
        holding its columns, its labels' handle, its point (``crowded``: the working set
        left violators out)."""
        prob, solver = self.prob, self.solver
        groups = [g for g in self.groups if np.isin(g.ids, ws).any()]
        handles, ids = [g.handle for g in groups], [g.ids for g in groups]
        if self.hinge:
            return (hinge_lp_task, handles, ids, ws, c.y_handle, self.sw_handle,
                    prob.penalty.alpha_l1, prob.fit_intercept)  # fmt: skip
        # the binary solver's gathered proximal Newton mode (:class:`~dl1.solvers.
        # subproblems.GatheredProxNewton`): Newton converges quadratically once the working
        # set is right, so the subproblem goes to a fraction of the final target at once,
        # of the current gap while the working set leaves violators out
        final = c.pb.tol * c.pb.p_zero
        target = solver.inner_ratio * (c.cert.gap if crowded else min(c.cert.gap, final))
        settings = SubproblemSettings(
            prob.datafit, prob.penalty.restricted(ws), prob.fit_intercept,
            target, solver.max_inner_epochs,
            seed=solver.seed * 7919 + r, gram_max=0, method="prox_newton",
            dense_max=(1 << 21) if prob.streamed else GRAM_DENSE_MAX,
        )  # fmt: skip
        w_ws = np.zeros(ws.shape[0])
        w_ws[np.searchsorted(ws, c.support)] = c.coef
        return (subproblem_task, handles, ids, [g.fresh for g in groups], ws, w_ws,
                c.y_handle, c.z, self.sw_handle, settings)  # fmt: skip

    def _update(self, c: _Class, ws: np.ndarray, out: Any, r: int) -> int:
        """Class ``c``'s point moved to its subproblem's answer; the epochs it took."""
        if self.hinge:
            check_update("one-vs-rest solver (hinge LP)", r, "LP's answer", out.w, out.z)
            w_ws, c.b, c.z, c.lp_theta = out.w, float(out.intercept), out.z.copy(), out.theta
            epochs = 0
        else:
            check_update("one-vs-rest solver", r, "subproblem's answer", out.w_ws, out.dz)
            w_ws, c.z, c.b = out.w_ws, c.z + out.dz, c.b + float(out.db)
            epochs = int(out.info.epochs)
        nz = np.flatnonzero(w_ws)
        c.support, c.coef = ws[nz], np.asarray(w_ws[nz], np.float64)
        return epochs

    # -- the union's columns ---------------------------------------------------------------
    def _cached_ids(self) -> np.ndarray:
        return np.concatenate([g.ids for g in self.groups] or [np.zeros(0, np.int64)])

    def cache_columns(self, ws: np.ndarray) -> None:
        """Cache the columns of the union ``ws`` of the classes' working sets: only new
        ones are extracted (where their blocks live); a group mostly stale is compacted
        where it is held (the binary solver's :meth:`~dl1.solvers.ws.Run.cache_columns`)."""
        prob, ex = self.prob, self.prob.ex
        kept: list[CachedGroup] = []
        for group in self.groups:
            live = np.isin(group.ids, ws)
            if 2 * live.sum() >= group.ids.shape[0]:
                kept.append(group._replace(fresh=False))
            elif live.any():
                handle = ex.submit(compact_task, group.handle, np.flatnonzero(live))
                kept.append(CachedGroup(handle, group.ids[live], True))
        self.groups = kept
        new = np.setdiff1d(ws, self._cached_ids())
        cb = prob.col_bounds
        owner = np.searchsorted(cb, new, side="right") - 1
        for j in np.unique(owner):
            ids = new[owner == j]
            if prob.streamed:  # read where its partition's scan runs; a part of a pass
                handle = ex.submit_to(int(self.part_of_block[j]), extract_task, prob.blocks[j],
                                      ids - cb[j])  # fmt: skip
                self.passes += prob.blocks[j].nnz / self.total_nnz
            else:
                handle = ex.submit(extract_task, prob.blocks[j], ids - cb[j])
            self.groups.append(CachedGroup(handle, ids, True))

    # -- the end ---------------------------------------------------------------------------
    def finish(self) -> OvrResult:
        """The classes' answers as one record."""
        K, p = self.prob.n_classes, int(self.prob.col_bounds[-1])
        rows = np.concatenate([np.full(c.support.shape[0], k) for k, c in
                               enumerate(self.classes)] or [np.zeros(0, np.int64)])  # fmt: skip
        cols = np.concatenate([c.support for c in self.classes])
        vals = np.concatenate([c.coef for c in self.classes])
        coef = sp.csr_matrix((vals, (rows, cols)), shape=(K, p))
        coef.eliminate_zeros()
        cs = self.classes
        return OvrResult(
            coef, np.array([c.b for c in cs]), np.array([c.gap for c in cs]),
            np.array([c.cert.primal for c in cs]), np.array([c.cert.dual for c in cs]),
            self.prob.tol, np.array([c.converged for c in cs]),
            np.array([c.rounds for c in cs]), self.rounds, self.passes,
            str(self.prob.datafit.name), history_=self.history,
        )  # fmt: skip
