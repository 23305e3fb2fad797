"""Working-set solver: full distributed passes certify, small subproblems solve.

Each round makes one pass over the data on the workers (per partition
:func:`dl1.tasks.passes.scan_task`): it yields the duality gap of the current point (the
certificate, from block-reduced statistics of ``X^T theta``) and each block's worst KKT
violators. The coordinator keeps the support and adds the worst violators, up to
``max(ws_start, 2 |support|)`` features (the growth rule of skglm and celer); the chosen
columns are extracted on the workers holding them, cached between rounds, and the
restricted problem is solved by one of the modes of :mod:`dl1.solvers.subproblems`. Only
``theta`` (length n), index lists and the restricted solution pass through the coordinator;
the columns move from worker to worker.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from dl1.objective.gap import duality_gap_from_stats
from dl1.runtime.executor import PassRequest, PassServer
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
from dl1.solvers.scans import (
    LastScan,
    SphereSeed,
    choose_working_set,
    every_column_joined,
    scan_pass,
    sequential_sphere,
    violators_left_out,
)
from dl1.solvers.subproblems import (
    SHARE_FRACTION,
    WHOLE_RATIO,
    CachedGroup,
    SpreadGramHandle,
    SubproblemReport,
    Targets,
    choose_mode,
    spread_plan,
)
from dl1.solvers.unpenalised import FreeColumns
from dl1.tasks.blocks import identity
from dl1.tasks.columns import compact_task, extract_task
from dl1.tasks.gram import GRAM_MAX, drop_gram
from dl1.tasks.growth import WS_SLOW_GAP, WS_START, next_ws_size
from dl1.tasks.passes import matvec_task, pass_dual_point
from dl1.tasks.records import PartitionScan, SubproblemCall, SubproblemOutput
from dl1.tasks.subproblem import SubproblemSettings, subproblem_task

#: Rounds without progress after which a solve stops (:class:`~dl1.solvers.numerics.
#: Progress`), besides those its working set takes to grow to every feature.
STALL_ROUNDS = 5


@dataclass(frozen=True)
class WorkingSetState(WarmState):
    """A :class:`WarmState` with the working-set solver's caches: the certifying pass at
    this point (reused as the next alpha's first pass), the cached column groups, the
    screening seed, and the workers' Gram matrices (``gram_prefix`` for the path,
    ``gram_key`` for this solve's; ``spread_gram`` out of core)."""

    last_scan: LastScan | None = None
    groups: tuple[CachedGroup, ...] = ()
    sphere: SphereSeed | None = None
    gram_prefix: str = ""
    gram_key: str = ""
    spread_gram: SpreadGramHandle | None = None

    def checkpoint_arrays(self) -> dict[str, np.ndarray]:
        arrays = super().checkpoint_arrays()
        if self.sphere is not None:
            arrays["xt_bound"] = np.array([self.sphere.xt_bound])
        return arrays

    def reproducible(self) -> WorkingSetState:
        # a Gram matrix agrees with a fresh one to rounding only (BLAS's summation order
        # depends on the product's shape): a resumable path starts each alpha's afresh
        fresh_key = f"{self.gram_prefix}-{uuid.uuid4().hex[:8]}"
        return replace(self, gram_key=fresh_key, spread_gram=None)


class WorkingSetSolver:
    """Working sets with certified passes (see the module docstring).

    Parameters
    ----------
    max_rounds : int
        Passes at most; reaching the limit warns with the gap reached. A solve whose gap
        stops falling (:meth:`patience` rounds without progress: at an alpha whose gap
        rounding keeps above ``tol``) stops before, and warns why.
    ws_start : int
        Working-set size of the first round.
    inner_ratio : float
        A subproblem is solved to this fraction of the current gap (of the target gap with
        ``tight_inner``, which paths use: warm-started, the working set is usually right).
    max_inner_epochs : int
        Epochs of one subproblem at most.
    screen : bool
        Gap-safe sphere screening (Lasso and L1-logistic; Ndiaye et al., JMLR 2017):
        screened columns are skipped by later passes.
    spread : bool, "cocoa" or None
        Solve subproblems where their columns were extracted (see
        :func:`dl1.solvers.subproblems.choose_mode`).
    random_order, seed : coordinate order of column epochs.
    gram_max : int
        Largest working set solved on its Gram matrix.
    verbose, callback : a line, or a call with the history entry, per round.
    """

    name = "ws"
    layout = "columns"
    returns_z = True

    @classmethod
    def from_options(cls, o: SolverOptions) -> WorkingSetSolver:
        """This solver configured from the entry points' keywords (those it has)."""
        return cls(
            max_rounds=o.rounds, screen=o.screen, spread=o.spread, tight_inner=o.tight_inner,
            random_order=o.random_order, seed=o.seed, verbose=o.verbose, callback=o.callback,
        )  # fmt: skip

    def __init__(
        self,
        *,
        max_rounds: int = 1000,
        ws_start: int = WS_START,
        inner_ratio: float = 0.3,
        max_inner_epochs: int = 50_000,
        screen: bool = False,
        spread: bool | str | None = None,
        tight_inner: bool = False,
        random_order: bool = False,
        seed: int = 0,
        gram_max: int = GRAM_MAX,
        verbose: bool = False,
        callback: Any = None,
    ) -> None:
        self.max_rounds = max_rounds
        self.ws_start = ws_start
        self.inner_ratio = inner_ratio
        self.max_inner_epochs = max_inner_epochs
        self.screen = screen
        self.spread = spread
        self.tight_inner = tight_inner
        self.random_order = random_order
        self.seed = seed
        self.gram_max = gram_max
        self.verbose = verbose
        self.callback = callback

    def solve(
        self, problem: Problem, warm: WarmState | None = None
    ) -> tuple[FitResult, WorkingSetState]:
        """Rounds of scan-and-certify, choose the working set, solve the subproblem, until
        the relative gap is at most ``problem.tol``."""
        run = Run(self, problem, warm)
        progress = Progress(self.patience(problem))
        for r in range(self.max_rounds + 1):
            scan = run.scan(r)
            entry = run.certify(r, scan)
            if entry["gap"] <= problem.tol:
                run.converged = True
                break
            if r == self.max_rounds:
                break
            why = run.stop_reason(progress, entry["gap"])
            if why is not None:
                entry["stopped"] = why
                break
            ws = self._next_working_set(run, scan)
            joined = ws.shape[0] - run.support.shape[0]
            run.crowded = violators_left_out(scan.per_block, joined)
            run.whole = ws.shape[0] >= problem.p or every_column_joined(
                scan.per_block, scan.ws_size, joined)  # fmt: skip
            run.cache_columns(ws)
            t0 = time.perf_counter()
            mode = choose_mode(self.spread, problem, ws, self.gram_max)
            entry["mode"] = type(mode).__name__
            report = mode.solve(run, ws, run.targets(mode.spread), r)
            run.b = report.intercept
            run.pending = report.next_scan
            run.account(entry, ws, report, t0)
            run.spent.append((ws, report.epochs >= self.max_inner_epochs))
        return run.finish()

    def _next_working_set(self, run: Run, scan: LastScan) -> np.ndarray:
        """The round's working set (:func:`~dl1.solvers.scans.choose_working_set`) at the
        size the growth rule gives; the faster growth after a round that cut the gap
        little only while its set still gathers on one worker (a spread subproblem costs
        a round of tasks per step, and its shares follow the cached groups)."""
        pb = run.problem

        def choose(size: int) -> np.ndarray:
            return choose_working_set(run.support, scan.per_block, pb.col_bounds,
                                      min(scan.ws_size, size), pb.budget.col_bytes,
                                      pb.budget.cache_max)  # fmt: skip

        ws = choose(run.ws_size(run.gap_fell_little()))
        plain = run.ws_size(False)
        if ws.shape[0] > plain and choose_mode(self.spread, pb, ws, self.gram_max).spread:
            ws = choose(plain)
        return ws

    def patience(self, problem: Problem) -> int:
        """Rounds without progress before a solve stops: :data:`STALL_ROUNDS`, plus the
        rounds a working set doubling from ``ws_start`` takes to hold every feature (its
        gap may pause while it grows)."""
        return STALL_ROUNDS + math.ceil(math.log2(max(1.0, problem.p / self.ws_start)))

    def restore(
        self, problem: Problem, arrays: dict[str, np.ndarray], intercept: float
    ) -> WorkingSetState:
        """The state a checkpoint saved at ``problem``'s alpha: the same pass the interrupted
        run would have reused, bit for bit (``theta`` depends on ``z`` only)."""
        w, z = arrays["w"], arrays["z"]
        pb = problem
        sphere = None
        if "xt_bound" in arrays:
            theta = pb.datafit.dual_point(pb.y, z, pb.weights, pb.fit_intercept)
            sphere = SphereSeed(theta, float(arrays["xt_bound"][0]))
        last = None
        if self._reuses_passes(pb):
            theta = pb.datafit.dual_point(pb.y, z, pb.weights, pb.fit_intercept)
            ws_size = next_ws_size(int(np.count_nonzero(w)), 0, self.ws_start)
            alive: list[np.ndarray | None] = [None] * len(pb.blocks)
            threshold = pb.n * pb.penalty.alpha_l1
            scans = scan_pass(pb, theta, threshold, w, ws_size, alive, None)
            per_block = [blk for part in scans for blk in part.blocks]
            block_nnz = np.array([blk.visited for blk in per_block], dtype=np.int64)
            last = LastScan(per_block, theta, threshold, ws_size, block_nnz)
        prefix = uuid.uuid4().hex
        return WorkingSetState(
            w, intercept, z, last_scan=last, sphere=sphere, gram_prefix=prefix, gram_key=prefix
        )

    def release(self, problem: Problem, state: WarmState | None) -> None:
        """Drop the Gram matrices the workers cached for this solve or path."""
        if isinstance(state, WorkingSetState) and state.gram_prefix:
            problem.executor.broadcast(drop_gram, state.gram_prefix)

    @property
    def direct_calls(self) -> bool:
        """Whether rounds gain from direct calls to the workers (gathered subproblems)."""
        return not self.spread

    def _screens(self, problem: Problem) -> bool:
        pen = problem.penalty
        return self.screen and pen.uniform and pen.alpha_l2 == 0.0 and pen.alpha_l1 > 0

    def _reuses_passes(self, problem: Problem) -> bool:
        """Lasso and L1-logistic without screening: ``X^T theta`` does not depend on alpha,
        only the thresholds do, so an alpha's certifying pass is the next one's first."""
        return not self.screen and problem.penalty.alpha_l2 == 0.0


class Run:
    """The mutable state of one :meth:`WorkingSetSolver.solve`: the point ``(w, b, z)``,
    the alive columns, the cached groups, the screening sphere, the history."""

    def __init__(self, solver: WorkingSetSolver, problem: Problem, warm: WarmState | None):
        self.solver, self.problem = solver, problem
        self.max_epochs = solver.max_inner_epochs
        ex, pb = problem.executor, problem
        self.threshold = pb.n * pb.penalty.alpha_l1
        self.screen = solver._screens(pb)
        self.passes = 0.0
        self._start_point(warm)
        state = warm if isinstance(warm, WorkingSetState) else None
        prefix = state.gram_prefix if state is not None else uuid.uuid4().hex
        self.gram_prefix = prefix
        self.gram_key = state.gram_key if state is not None else prefix
        self.groups: list[CachedGroup] = list(state.groups) if state is not None else []
        self.spread_gram = state.spread_gram if state is not None else None
        self.reuse = None
        if state is not None and solver._reuses_passes(pb):
            self.reuse = state.last_scan
        k = len(pb.blocks)
        self.alive: list[np.ndarray | None] = [None] * k
        self.block_nnz = np.full(k, -1, dtype=np.int64)
        self.max_s = 1.0 if pb.weights is None else float(pb.sample_weight.max())
        self.sphere: tuple[np.ndarray, float, float] | None = None
        seed = state.sphere if state is not None else None
        if self.screen and seed is not None and np.isfinite(seed.xt_bound):
            self.sphere = sequential_sphere(pb, self.z, self.w, self.max_s, seed)
        self.col_norm_max = -1.0  # from the first pass, which reads every block
        self.free = FreeColumns.gather(pb)
        self.handles = pb.handles or (ex.submit(identity, pb.y),
                                      ex.submit(identity, pb.sample_weight))
        self.pending: tuple[list[PartitionScan], float] | None = None
        self.history: list[dict[str, Any]] = []
        self.t_start = time.perf_counter()
        self.converged = False
        self.cert = UNCERTIFIED
        self.last: LastScan | None = None
        self.rounds = 0
        # each round's working set, and whether its subproblem ran to its epoch limit
        self.spent: list[tuple[np.ndarray, bool]] = []
        # whether the round's working set left out violators its pass found
        self.crowded = False
        self.whole = False  # the working set holds every column that can move

    def _start_point(self, warm: WarmState | None) -> None:
        """``w``, ``b`` and ``z = X w + b`` of the warm start (zero: the intercept of
        ``w = 0``); ``z`` is recomputed on the workers when the state has none."""
        pb = self.problem
        b_zero = pb.initial_intercept()
        self.w = np.zeros(pb.p) if warm is None else np.asarray(warm.coef, np.float64).copy()
        self.b = (b_zero if warm is None else float(warm.intercept)) if pb.fit_intercept else 0.0
        if warm is not None and warm.z is not None:
            self.z = np.asarray(warm.z, dtype=np.float64).copy()
            return
        self.z = np.full(pb.n, self.b)
        if not self.w.any():
            return
        ex = pb.executor
        for u in ex.gather(
            [
                ex.submit(
                    matvec_task, [pb.blocks[j] for j in part],
                    coef_by_block(self.w, pb.col_bounds, part), pb.n,
                )
                for part in pb.partitions
            ]
        ):  # fmt: skip
            self.z += u
        if pb.streamed:  # out of core, rebuilding z read the blocks of the support
            owners = np.searchsorted(pb.col_bounds, np.flatnonzero(self.w), side="right") - 1
            total = sum(blk.nnz for blk in pb.blocks)
            self.passes = sum(pb.blocks[j].nnz for j in np.unique(owners)) / max(1, total)

    # -- scan and certify ------------------------------------------------------------------
    def scan(self, r: int) -> LastScan:
        """The round's pass at the current point: the previous alpha's last pass when it is
        this very point, the pass a server ran after the last subproblem, or a new one."""
        self.t_scan0 = time.perf_counter()
        self.server_s = 0.0
        self.by_server = False
        # the round's support: w moves only in the subproblem (an O(p) scan, once a round)
        self.support = np.flatnonzero(self.w)
        ws_size = self.ws_size(slow=True)
        if r == 0 and self.reuse is not None and self.reuse.ws_size >= ws_size:
            last = self._shifted(self.reuse, ws_size)
            self.scan_kernel = 0.0
        else:
            if self.free is not None:  # their constraints x_j^T theta = 0, met exactly
                self.b = self.free.refit(self.problem, self.z, self.w, self.b)
                self.support = np.flatnonzero(self.w)
                ws_size = self.ws_size(slow=True)
            db, theta = pass_dual_point(
                self.problem.datafit, self.problem.y, self.z, self.problem.weights,
                self.problem.fit_intercept,
            )  # fmt: skip
            self.b += db
            scans = self._server_pass(theta, ws_size)
            if scans is None:
                norms = self.screen and r == 0
                scans = scan_pass(
                    self.problem, theta, self.threshold, self.w, ws_size, self.alive,
                    self.sphere, norms, self.support,
                )  # fmt: skip
            per_block = [blk for part in scans for blk in part.blocks]
            self.scan_kernel = max(part.seconds for part in scans)
            last = LastScan(per_block, theta, self.threshold, ws_size, self.block_nnz)
            if self.screen and r == 0:
                self.col_norm_max = max((blk.norm_max for blk in per_block), default=-1.0)
        self.t_scan = time.perf_counter() - self.t_scan0 + self.server_s
        self.pending = None
        self.last = last
        return last

    def ws_size(self, slow: bool) -> int:
        """This round's working-set size (:func:`~dl1.tasks.growth.next_ws_size`), from
        the support, the last round's working set and ``slow``. The pass's quota of
        candidates per block is the size with ``slow`` (the largest): whether the gap fell
        little is known once the pass has certified the last round."""
        last = self.spent[-1][0].shape[0] if self.spent else 0
        return next_ws_size(self.support.shape[0], last, self.solver.ws_start, slow)

    def gap_fell_little(self) -> bool:
        """Whether the last round cut the gap to more than :data:`~dl1.tasks.growth.
        WS_SLOW_GAP` of the one before (the history's last two entries)."""
        gaps = [entry["gap"] for entry in self.history[-2:]]
        return len(gaps) == 2 and gaps[1] > WS_SLOW_GAP * gaps[0]

    def _shifted(self, reuse: LastScan, ws_size: int) -> LastScan:
        """The previous alpha's last pass at this alpha: scores shift with the threshold
        (``|c_j| - n alpha_l1``); the order and ``||X^T theta||_inf`` do not. Each block's
        candidates are cut to ``ws_size`` (best first, ties to the lower position: the
        pass a quota of ``ws_size`` gives, as a checkpoint's restored pass has it)."""
        shift = reuse.threshold - self.threshold
        per_block = [
            blk._replace(candidates=blk.candidates[:ws_size],
                         scores=blk.scores[:ws_size] + shift, visited=0)
            for blk in reuse.per_block
        ]  # fmt: skip
        self.block_nnz = reuse.block_nnz.copy()
        return LastScan(per_block, reuse.theta, self.threshold, ws_size, self.block_nnz)

    def _server_pass(self, theta: np.ndarray, ws_size: int) -> list[PartitionScan] | None:
        """The pass as run by the subproblem's server (direct calls; not with screening):
        already run after the last subproblem, or run now. None: the coordinator runs
        it."""
        if self.pending is not None:
            scans, self.server_s = self.pending
            self.by_server = True
            return scans
        if self.screen or not self.problem.penalty.uniform:  # the servers pass the plain one
            return None
        pb = self.problem
        if not isinstance(pb.executor, PassServer):
            return None
        handle = pb.executor.submit_pass(
            self.pass_request(), theta,
            [coef_by_block(self.w, pb.col_bounds, q, self.support) for q in pb.partitions],
            ws_size,
        )  # fmt: skip
        scans = None if handle is None else handle.result()
        self.by_server = scans is not None
        return scans

    def pass_request(self) -> PassRequest:
        """The next pass, as the subproblem's server runs it: each partition's blocks,
        column ranges and alive sets, the threshold and the working set's minimum size."""
        pb = self.problem
        blocks = [[pb.blocks[j] for j in part] for part in pb.partitions]
        bounds = [
            [(int(pb.col_bounds[j]), int(pb.col_bounds[j + 1])) for j in part]
            for part in pb.partitions
        ]
        alive = [[self.alive[j] for j in part] for part in pb.partitions]
        return PassRequest(blocks, bounds, alive, self.threshold, self.solver.ws_start)

    def certify(self, r: int, last: LastScan) -> dict[str, Any]:
        """The gap of the current point from the pass's block statistics; the round's
        history entry."""
        pb = self.problem
        for j, blk in enumerate(last.per_block):
            self.alive[j] = blk.alive
            if self.block_nnz[j] < 0:  # the first scan visits every column of the block
                self.block_nnz[j] = blk.visited
        self.passes += sum(blk.visited for blk in last.per_block) / max(
            1, int(self.block_nnz.sum())
        )
        absmax = max((blk.stats.absmax for blk in last.per_block), default=0.0)
        excess = float(sum(blk.stats.excess for blk in last.per_block))
        box = float(sum(blk.stats.box for blk in last.per_block))
        self.absmax = absmax
        support = self.support
        self.cert = Certificate(*duality_gap_from_stats(
            pb.datafit, pb.penalty.restricted(support), pb.y, self.z, self.w[support], absmax,
            excess,
            s=pb.weights, intercept=pb.fit_intercept, theta=last.theta, box=box,
        ))  # fmt: skip
        check_round(
            "working-set solver", r,
            {"duality gap": self.cert.gap, "objective": self.cert.primal,
             "max |X^T theta|": absmax, "intercept": self.b},
            [blk.stats for blk in last.per_block],
        )  # fmt: skip
        if self.screen:  # gap-safe sphere of this point, applied during the next pass
            radius = float(np.sqrt(max(self.cert.gap, 0.0) * 2.0 * pb.n * self.max_s
                                   * pb.datafit.beta))  # fmt: skip
            self.sphere = (last.theta, pb.penalty.dual_feasible_scale(absmax, pb.n), radius)
        entry = self._entry(r, support.shape[0])
        self.history.append(entry)
        self.rounds = r
        if self.solver.verbose:
            print(f"outer {r:3d}  objective {self.cert.primal:.10g}  gap {entry['gap']:.3e}"
                  f"  nnz {entry['nnz']}")  # fmt: skip
        if self.solver.callback is not None:
            self.solver.callback(entry)
        return entry

    def _entry(self, r: int, nnz: int) -> dict[str, Any]:
        """The history entry of round ``r`` (its subproblem's figures are added later)."""
        pb = self.problem
        widths = np.diff(pb.col_bounds)
        alive = sum(
            int(widths[j]) if a is None else int(np.unpackbits(a, count=int(widths[j])).sum())
            for j, a in enumerate(self.alive)
        )
        gap = pb.relative_gap(self.cert.gap)
        return {
            "round": r,
            "objective": self.cert.primal,
            "gap": gap,
            "nnz": nnz,
            "seconds": time.perf_counter() - self.t_start,
            "scan_s": self.t_scan,
            "scan_kernel_s": self.scan_kernel,
            "alive": alive,
            "passes": self.passes,
            "transport": pb.executor.transport,
            "scan_by_server": self.by_server,
        }

    def stop_reason(self, progress: Progress, gap: float) -> str | None:
        """Why the solve stops before its round limit at a (relative) ``gap`` above tol, or
        None: the gap has stopped falling (``progress``), or the last two subproblems, on
        the same working set, ran to their epoch limit and the gap fell by less than half
        (the next would go on where they stopped, as slowly)."""
        tol = self.problem.tol
        if progress.stalled(gap):
            return progress.reason(tol)
        if len(self.spent) < 2 or len(self.history) < 2:
            return None
        (ws0, spent0), (ws1, spent1) = self.spent[-2:]
        before = self.history[-2]["gap"]
        if spent0 and spent1 and np.array_equal(ws0, ws1) and gap > 0.5 * before:
            return (
                f"stopped: two subproblems on the same {ws1.shape[0]} features ran to their "
                f"epoch limit ({self.max_epochs}) and the gap fell only from {before:.3e} to "
                f"{gap:.3e} (tol {tol:.3e}); the problem is too ill-conditioned at this alpha "
                "for its gap to reach tol: raise alpha or tol"
            )
        return None

    # -- the working set's columns ---------------------------------------------------------
    def cache_columns(self, ws: np.ndarray) -> None:
        """Cache the columns of ``ws`` where the subproblem runs: only new ones move; a group
        mostly stale is compacted where it lives, so the cache never holds more than twice
        the working set's columns."""
        pb, ex = self.problem, self.problem.executor
        kept: list[CachedGroup] = []
        if self.groups:
            flags = np.isin(np.concatenate([g.ids for g in self.groups]), ws)
            lives = np.split(flags, np.cumsum([g.ids.shape[0] for g in self.groups])[:-1])
            for group, live in zip(self.groups, lives, strict=True):
                if 2 * live.sum() >= group.ids.shape[0]:
                    kept.append(group._replace(fresh=False))
                elif live.any():  # made for this round: its compaction is kernel time
                    handle = ex.submit(compact_task, group.handle, np.flatnonzero(live))
                    kept.append(CachedGroup(handle, group.ids[live], True))
        self.groups = kept
        cached = np.concatenate([g.ids for g in kept] or [np.zeros(0, np.int64)])
        new = np.setdiff1d(ws, cached)
        owner = np.searchsorted(pb.col_bounds, new, side="right") - 1
        for j in np.unique(owner):
            ids = new[owner == j]
            local = ids - pb.col_bounds[j]
            if pb.streamed:  # read where its partition's share would run
                handle = ex.submit_to(int(pb.part_of_block[j]), extract_task, pb.blocks[j],
                                      local)  # fmt: skip
                self.passes += pb.blocks[j].nnz / max(1, int(self.block_nnz.sum()))
            else:
                handle = ex.submit(extract_task, pb.blocks[j], local)
            self.groups.append(CachedGroup(handle, ids, True))

    def spread_plan(self, ws: np.ndarray) -> list:
        """The cached groups of ``ws`` in per-task shares (:func:`spread_plan`)."""
        pb = self.problem
        share = pb.budget.gather_max * SHARE_FRACTION
        return spread_plan(self.groups, ws, pb.part_of_block, pb.col_bounds,
                           pb.budget.col_bytes, share)  # fmt: skip

    # -- the subproblem --------------------------------------------------------------------
    def targets(self, spread: bool) -> Targets:
        """Gap targets of this round's subproblem: ``inner_ratio`` times the current gap, or
        times the final target when tight (paths; a ``spread`` subproblem, whose rounds cost
        most, goes to it at once). Gram epochs are cheap: always the final target."""
        final = self.problem.tol * self.problem.p_zero
        ratio, gap = self.solver.inner_ratio, self.cert.gap
        tight = self.solver.tight_inner or spread
        return Targets(ratio * (min(gap, final) if tight else gap), ratio * min(gap, final),
                       ratio * gap, WHOLE_RATIO * final)  # fmt: skip

    def subproblem_call(
        self, ws: np.ndarray, targets: Targets, r: int, gram_max: int
    ) -> SubproblemCall:
        """The arguments of :func:`subproblem_task` for working set ``ws``."""
        pb, solver = self.problem, self.solver
        settings = SubproblemSettings(
            pb.datafit, pb.penalty.restricted(ws), pb.fit_intercept, targets.gap,
            solver.max_inner_epochs,
            random_order=solver.random_order, seed=solver.seed * 7919 + r, gram_max=gram_max,
            dense_max=pb.budget.dense_max, gram_key=self.gram_key, gram_target=targets.gram_gap,
        )  # fmt: skip
        y_h, sw_h = self.handles
        return SubproblemCall(
            [g.handle for g in self.groups], [g.ids for g in self.groups],
            [g.fresh for g in self.groups], ws, self.w[ws], y_h, self.z, sw_h, settings,
        )  # fmt: skip

    def subproblem_then_scan(
        self, call: SubproblemCall
    ) -> tuple[SubproblemOutput, tuple[list[PartitionScan], float] | None]:
        """The subproblem, and with direct calls (no screening) the next pass run by its
        server in the same call; else the subproblem alone as a task."""
        ex = self.problem.executor
        served = isinstance(ex, PassServer) and not self.screen and self.problem.penalty.uniform
        fused = None if not served else ex.submit_then_scan(
            self.pass_request(), subproblem_task, *call
        )
        if fused is None:
            (out,) = ex.gather([ex.submit(subproblem_task, *call)])
            return SubproblemOutput(*out), None
        out, scans, scan_s = fused.result()
        return SubproblemOutput(*out), (None if scans is None else (scans, scan_s))

    def account(self, entry: dict[str, Any], ws: np.ndarray, rep: SubproblemReport, t0: float):
        """The subproblem's figures in the round's history entry."""
        col_bytes = self.problem.budget.col_bytes
        if col_bytes is not None:
            entry["ws_bytes"] = float(col_bytes[ws].sum())
        # the pass the server ran after the subproblem is the next round's
        server_s = rep.next_scan[1] if rep.next_scan else 0.0
        entry.update(
            ws_size=int(ws.shape[0]), crowded=self.crowded, inner_epochs=rep.epochs,
            **rep.counts,
            inner_s=time.perf_counter() - t0 - server_s, inner_kernel_s=rep.kernel_s,
        )  # fmt: skip
        entry["transport"] = self.problem.executor.transport  # "tasks" once a call failed
        entry["wall_s"] = wall = entry["scan_s"] + entry["inner_s"]
        entry["busy_s"] = busy = entry["scan_kernel_s"] + entry["inner_kernel_s"]
        entry["overhead_fraction"] = max(0.0, 1.0 - busy / wall) if wall > 0 else 0.0

    # -- the end ---------------------------------------------------------------------------
    def finish(self) -> tuple[FitResult, WorkingSetState]:
        """The result and the state the next alpha starts from."""
        pb = self.problem
        screened = np.zeros(pb.p, dtype=bool)
        for j, a in enumerate(self.alive):
            if a is not None:
                lo, hi = int(pb.col_bounds[j]), int(pb.col_bounds[j + 1])
                screened[lo:hi] = np.unpackbits(a, count=hi - lo) == 0
        res = make_result(
            pb, self.w, self.b, self.cert, self.converged, self.rounds, self.history,
            passes_=self.passes, screened_=screened, streamed_=pb.streamed,
        )  # fmt: skip
        assert self.last is not None
        self.last.block_nnz = self.block_nnz
        sphere = None
        if self.screen and self.sphere is not None and self.col_norm_max >= 0:
            sphere = SphereSeed(self.last.theta, self._xt_bound())
        state = WorkingSetState(
            self.w, self.b, self.z, last_scan=self.last, groups=tuple(self.groups),
            sphere=sphere, gram_prefix=self.gram_prefix, gram_key=self.gram_key,
            spread_gram=self.spread_gram,
        )  # fmt: skip
        return res, state

    def _xt_bound(self) -> float:
        """An upper bound on ``||X^T theta||_inf`` over every column: the pass's maximum, or
        where screened columns were not visited, their bound from the last sphere (see
        :func:`sequential_sphere`)."""
        if any(a is not None for a in self.alive):
            _, scale_k, radius_k = self.sphere
            return (self.threshold + self.col_norm_max * radius_k) / scale_k
        return self.absmax


