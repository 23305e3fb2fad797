"""The working-set subproblem: ``min F(X_W w_W + b) + penalty(w_W)`` on a few columns.

Six modes behind one interface (:class:`SubproblemMode`), picked per round by
:func:`choose_mode`:

- :class:`GatheredGram`: the columns gathered on one worker, covariance updates on their
  Gram matrix (squared loss, up to ``GRAM_MAX`` columns), which the worker keeps between
  rounds and alphas;
- :class:`GatheredProxNewton`: gathered likewise, proximal Newton steps (smooth margin
  losses: logistic, squared hinge);
- :class:`ColumnCD`: gathered likewise, coordinate descent on the columns (other losses,
  larger working sets);
- :class:`SpreadGram`: out of core, columns left where they were extracted, the Gram matrix
  formed across the partitions and held by one worker;
- :class:`SpreadNewton`: out of core, proximal Newton steps whose model the shares of the
  working set minimise in turn, each on its own columns, searched along on the coordinator
  (after d-GLMNET; smooth losses other than the squared);
- :class:`SpreadCocoa`: out of core, CoCoA+ rounds over the partitions holding the columns.

A mode moves the run's ``w`` and ``z`` (``X w + b``) in place and reports the new
intercept. Each works on the run's cached column groups (:class:`CachedGroup`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, NamedTuple, Protocol

import numpy as np

from dl1.kernels.margins import NO_WEIGHTS as NO_U
from dl1.kernels.margins import move_along
from dl1.objective.gap import duality_gap_from_stats
from dl1.solvers.numerics import check_round, check_update
from dl1.tasks.columns import group_col_sums
from dl1.tasks.gram import GRAM_MAX, GramGapEstimate
from dl1.tasks.prox_newton import (
    MAX_INNER,
    MAX_NEWTON,
    curvature_bound,
    line_search,
    model_shift,
)
from dl1.tasks.records import PartitionScan, SpreadNewtonOutput, SpreadRoundOutput
from dl1.tasks.spread import (
    cross_gram_task,
    merge_gram_task,
    partition_matvec_task,
    partition_rmatvec_task,
    row_piece_task,
    spread_gram_epochs_task,
    ws_round_task,
)
from dl1.tasks.spread_newton import newton_share_task

#: Local epochs per round of :class:`SpreadCocoa` (more: fewer round trips, each partition
#: further from the others' changes).
SPREAD_EPOCHS = 5

#: A task of a spread subproblem takes at most this fraction of the gather budget (a quarter
#: of a worker's memory beyond its baseline) of cached columns (:func:`spread_plan`).
SHARE_FRACTION = 0.25

#: Worst-case bytes (12 per row and column) of a row piece of new columns sent from one
#: partition to another while a spread Gram matrix is formed (:func:`spread_gram_task`).
SPREAD_PIECE_BYTES = 16 << 20


class CachedGroup(NamedTuple):
    """Columns of one block extracted for a working set and cached on a worker: the task
    handle holding the :class:`~dl1.tasks.records.ColumnGroup`, the feature ids, and
    whether it was made for the current round (its extraction then counts as kernel
    time)."""

    handle: Any
    ids: np.ndarray
    fresh: bool


class Targets(NamedTuple):
    """Gap targets of a subproblem: column epochs stop at ``gap``; Gram-matrix epochs,
    whose every epoch is cheap, at ``gram_gap``; ``loose``, a fraction of the current
    gap, for a working set that left violators out, and ``whole``
    (:data:`WHOLE_RATIO` of the final target) for one holding every feature
    (:class:`GatheredProxNewton`)."""

    gap: float
    gram_gap: float
    loose: float
    whole: float


class SpreadGramHandle(NamedTuple):
    """The task holding a spread working set's Gram matrix, and the feature ids of its
    rows."""

    task: Any
    ids: np.ndarray


class SubproblemReport(NamedTuple):
    """What a mode did: the new intercept, epochs, kernel seconds, mode-specific counts for
    the history, and (gathered modes with direct calls) the next pass, already run by the
    subproblem's server with its seconds there."""

    intercept: float
    epochs: int
    kernel_s: float
    counts: dict[str, int]
    next_scan: tuple[list[PartitionScan], float] | None = None


class SubproblemMode(Protocol):
    """One way of solving the subproblem of working set ``ws`` (sorted feature ids);
    ``spread`` modes leave the columns where they were extracted."""

    spread: bool

    def solve(self, run: Any, ws: np.ndarray, targets: Targets, r: int) -> SubproblemReport:
        """Move ``run.w``, ``run.z`` to the subproblem's solution within ``targets``."""
        ...


#: Bytes a gathered proximal Newton subproblem holds on its worker per byte of its working
#: set's extracted columns (their size in the store's dtype): the cached groups moved there,
#: the float64 copy gathered from them and the float32 curvature of every nonzero.
GATHER_COPIES = 3.0


def gathered_bytes(problem: Any, ws: np.ndarray) -> float:
    """Bytes one worker holds to solve ``ws`` gathered: for a loss solved by proximal
    Newton steps, :data:`GATHER_COPIES` times its columns' bytes when the store counts them
    (``budget.col_bytes``); otherwise (and for the squared loss, whose Gram path densifies
    columns) the dense worst case, 12 bytes per row and column."""
    col_bytes = problem.budget.col_bytes
    if col_bytes is None or problem.datafit.quadratic or not hasattr(problem.datafit,
                                                                     "grad_hess"):  # fmt: skip
        return 12.0 * problem.n * ws.shape[0]
    return GATHER_COPIES * float(col_bytes[ws].sum())


def choose_mode(
    spread: bool | str | None, problem: Any, ws: np.ndarray, gram_max: int
) -> SubproblemMode:
    """The mode of a round on working set ``ws``: gathered unless ``spread`` says otherwise
    (None: out of core, when the columns could exceed one worker's gather budget,
    :func:`gathered_bytes`); spread on a Gram matrix when the loss is quadratic and the
    matrix's ~16 m^2 bytes fit the budget, by spread Newton steps for the other smooth
    losses (unless ``spread="cocoa"``: CoCoA+ rounds)."""
    gather_max = problem.budget.gather_max
    ws_size = ws.shape[0]
    use_spread = bool(spread)
    if spread is None:
        use_spread = problem.streamed and gathered_bytes(problem, ws) > gather_max
    if not np.isfinite(problem.datafit.beta) or not problem.penalty.uniform:
        use_spread = False  # CoCoA's steps need a curvature bound; spread modes one penalty
    quadratic = problem.datafit.quadratic
    if not use_spread:
        if quadratic:
            return GatheredGram(gram_max)
        return GatheredProxNewton() if hasattr(problem.datafit, "grad_hess") else ColumnCD()
    fits = ws_size <= min(gram_max, np.sqrt(gather_max / 16.0))
    if spread != "cocoa" and quadratic and fits:
        return SpreadGram()
    if spread != "cocoa" and not quadratic and hasattr(problem.datafit, "grad_hess"):
        return SpreadNewton()
    return SpreadCocoa()


@dataclass(frozen=True)
class GatheredGram:
    """Columns gathered on the subproblem's worker (:func:`subproblem_task`), solved on
    their Gram matrix when at most ``gram_max`` (squared loss), else by column epochs. With
    direct calls the same worker then runs the next pass (:meth:`Run.subproblem_then_scan`)."""

    gram_max: int = GRAM_MAX
    spread = False

    def solve(self, run: Any, ws: np.ndarray, targets: Targets, r: int) -> SubproblemReport:
        return self.run_call(run, ws, run.subproblem_call(ws, targets, r, self.gram_max), r)

    @staticmethod
    def run_call(run: Any, ws: np.ndarray, call: Any, r: int) -> SubproblemReport:
        """Run the subproblem ``call`` and move ``run.w``, ``run.z`` to its answer."""
        out, next_scan = run.subproblem_then_scan(call)
        check_update(
            "working-set solver", r, f"update of the subproblem on {ws.shape[0]} features",
            out.w_ws, out.dz, np.array([out.db]),
        )  # fmt: skip
        run.w[ws] = out.w_ws
        run.z += out.dz
        b = run.b + out.db
        info = out.info
        counts = {} if info.newton_steps is None else {"newton_steps": info.newton_steps,
                                                        "block_steps": info.block_steps}
        return SubproblemReport(b, info.epochs, info.kernel_s, counts, next_scan)


@dataclass(frozen=True)
class ColumnCD(GatheredGram):
    """Gathered columns, coordinate descent on the columns (no Gram matrix)."""

    gram_max: int = 0

    def solve(self, run: Any, ws: np.ndarray, targets: Targets, r: int) -> SubproblemReport:
        call = run.subproblem_call(ws, targets, r, self.gram_max)
        settings = replace(call.settings, method="cd")
        return self.run_call(run, ws, call._replace(settings=settings), r)


#: A working set holding every feature that can move (empty and screened columns stay at 0)
#: is the whole problem: its restricted gap is the fit's (the coordinator's certificate, at
#: the intercept's optimal shift, is at most it), so proximal Newton steps on it go to this
#: fraction of ``tol``, not to ``inner_ratio`` of it; the rest keeps the next pass under
#: ``tol`` through rounding. A crowded working set's steps (``inner_ratio`` times the
#: current gap) stop there too: at a loose ``tol`` that fraction of the gap can be tighter
#: than the fit needs. At weak regularisation the gap falls slowly in the last steps, so
#: each step spared counts (benchmarks/RESULTS.md, "a working set of every feature" and
#: "grow faster where the gap stalls").
WHOLE_RATIO = 0.99


@dataclass(frozen=True)
class GatheredProxNewton(GatheredGram):
    """Gathered columns, proximal Newton steps (:mod:`dl1.tasks.prox_newton`), for smooth
    datafits exposing ``grad_hess`` (logistic, squared hinge).

    A Newton step costs a few passes over ``n`` and the working set, and converges
    quadratically once the working set is right, so the subproblem goes to the final
    target at once (``tight``; as the Gram mode does), and the fit usually ends at the
    next pass, its gap a little below ``tol`` (:data:`WHOLE_RATIO` of it for a working set
    of every feature, and never below that). The target is ``inner_ratio`` times the
    current gap instead with screening (``run.screen``: the rounds between shrink the
    problem) and when the working set left out violators (``run.crowded``, as at weak
    regularisation while it grows: its exact solution would be the next round's start
    only, and the Newton steps spent on a certificate of it wasted).
    """

    gram_max: int = 0
    tight: bool = True

    def solve(self, run: Any, ws: np.ndarray, targets: Targets, r: int) -> SubproblemReport:
        call = run.subproblem_call(ws, targets, r, self.gram_max)
        tight = self.tight and not getattr(run, "screen", False)
        target = targets.loose if run.crowded else targets.gram_gap if tight else targets.gap
        if run.whole or run.crowded:  # never past the fit's need
            target = max(target, targets.whole)
        settings = replace(call.settings, method="prox_newton", target_gap=target)
        return self.run_call(run, ws, call._replace(settings=settings), r)


def spread_plan(groups, ws, part_of_block, col_bounds, col_bytes=None, share_bytes=np.inf):
    """The cached groups holding live columns of ``ws`` in shares: ``[(q, [(handle, ids,
    keep), ...]), ...]``, ``q`` the partition whose worker holds the share's groups (sorted),
    ``keep`` the positions of the live columns in a group.

    A partition's groups are cut into consecutive shares of at most ``share_bytes`` (by
    ``col_bytes``, the bytes of each cached column; a larger group is a share of its own),
    and every task takes one share: a worker then needs one share's groups in memory at a
    time, and Dask may keep its other cached groups spilled to disk.
    """
    by_part: dict[int, list[tuple[Any, np.ndarray, np.ndarray]]] = {}
    ids_all = np.concatenate([g.ids for g in groups])
    live = np.isin(ids_all, ws)
    offs = np.cumsum([0] + [g.ids.shape[0] for g in groups])
    for g_i, group in enumerate(groups):
        keep = np.flatnonzero(live[offs[g_i] : offs[g_i + 1]])
        if keep.shape[0]:  # a group holds columns of one block
            block = np.searchsorted(col_bounds, group.ids[0], side="right") - 1
            by_part.setdefault(int(part_of_block[block]), []).append(
                (group.handle, group.ids, keep)
            )
    plan: list[tuple[int, list[tuple[Any, np.ndarray, np.ndarray]]]] = []
    for q, grp in sorted(by_part.items()):
        share: list[tuple[Any, np.ndarray, np.ndarray]] = []
        size = 0.0
        for g in grp:
            nbytes = float(col_bytes[g[1]].sum()) if col_bytes is not None else 0.0
            if share and size + nbytes > share_bytes:
                plan.append((q, share))
                share, size = [], 0.0
            share.append(g)
            size += nbytes
        plan.append((q, share))
    return plan


def refit_intercept(run: Any, b: float) -> tuple[float, Any]:
    """The intercept ``b`` refitted exactly at the run's point (``z`` moved with it) and
    the dual point there: what a spread mode does before each of its rounds or steps."""
    pb = run.problem
    if pb.fit_intercept:
        db = pb.datafit.intercept_update(pb.y, run.z, pb.weights, max_iter=20)
        b += db
        run.z += db
    return b, pb.datafit.dual_point(pb.y, run.z, pb.weights, pb.fit_intercept)


class SpreadCocoa:
    """CoCoA+ rounds over the partitions holding the working set's columns
    (:func:`ws_round_task`, each task one share of a partition's groups; ``sigma'`` =
    the number of shares taking part, whose updates are added), so no worker holds more
    than its share. The restricted gap, from the same tasks' statistics at the start of a
    round, stops the rounds at the target."""

    max_rounds = 2000
    spread = True

    def solve(self, run: Any, ws: np.ndarray, targets: Targets, r: int) -> SubproblemReport:
        pb, ex = run.problem, run.problem.executor
        datafit, penalty, s = pb.datafit, pb.penalty, pb.weights
        plan = run.spread_plan(ws)
        sigma = float(len(plan))
        profile = pb.fit_intercept and datafit.quadratic
        threshold = pb.n * penalty.alpha_l1
        # per-column sums for the profiled intercept: computed once, kept where the groups are
        sums = [
            ex.submit_to(q, group_col_sums, [h for h, _, _ in grp], pb.sample_weight)
            if profile
            else None
            for q, grp in plan
        ]
        kern, b, rounds = 0.0, run.b, 0
        for rounds in range(self.max_rounds + 1):
            b, theta = refit_intercept(run, b)
            g = datafit.gradient(pb.y, run.z, s)
            epochs = SPREAD_EPOCHS if rounds < self.max_rounds else 0
            results: list[SpreadRoundOutput] = ex.gather(
                [
                    ex.submit_to(
                        q, ws_round_task, [h for h, _, _ in grp], [k for _, _, k in grp],
                        [run.w[ids[keep]] for _, ids, keep in grp], g, theta, pb.sample_weight,
                        sigma, datafit.beta, penalty.alpha_l1, penalty.alpha_l2, epochs,
                        threshold, sums[i],
                    )
                    for i, (q, grp) in enumerate(plan)
                ]
            )  # fmt: skip
            kern += max(res.kernel_s for res in results)
            absmax = max(res.stats.absmax for res in results)
            excess = float(sum(res.stats.excess for res in results))
            _, _, gap = duality_gap_from_stats(
                datafit, penalty, pb.y, run.z, run.w[ws], absmax, excess, s=s,
                intercept=pb.fit_intercept, theta=theta,
            )  # fmt: skip
            check_round(f"working-set solver (spread subproblem of round {r})", rounds,
                        {"restricted duality gap": gap}, [res.stats for res in results])
            if gap <= targets.gap or rounds == self.max_rounds:
                break
            for (_, grp), res in zip(plan, results, strict=True):
                for (_, ids, keep), w_new in zip(grp, res.coef, strict=True):
                    run.w[ids[keep]] = w_new
                run.z += res.u
                run.z += res.shift
                b += res.shift
        return SubproblemReport(b, rounds * SPREAD_EPOCHS, kern, {"inner_rounds": rounds})


class SpreadNewton:
    """Proximal Newton steps spread over the partitions holding the working set's columns
    (after d-GLMNET, :mod:`dl1.tasks.spread_newton`): the shares minimise the loss's
    quadratic model in turn, each on its own columns given the steps before it; the
    coordinator takes the step Armijo's rule accepts along the joined step, with the
    model's intercept step for it (:func:`~dl1.tasks.prox_newton.line_search`), and refits
    the intercept exactly between steps. A step costs one task per share, as a CoCoA+
    round does, but follows the loss's curvature, not its bound scaled by the number of
    shares. The restricted gap, from the same tasks' statistics, stops the steps: at the
    final target, or while the working set left violators out (``run.crowded``) at a
    fraction of the current gap, as :class:`GatheredProxNewton` does (that solution only
    starts the next round)."""

    max_steps = MAX_NEWTON
    spread = True
    #: Sweeps of the shares over a step's model, and each visit's epochs: about the
    #: gathered mode's ``MAX_INNER`` epochs a step, interleaved.
    sweeps = 8
    visit_epochs = 3

    def solve(self, run: Any, ws: np.ndarray, targets: Targets, r: int) -> SubproblemReport:
        pb = run.problem
        plan = run.spread_plan(ws)
        cols = np.concatenate([ids[keep] for _, grp in plan for _, ids, keep in grp])
        sw = np.ascontiguousarray(pb.sample_weight, dtype=np.float64)
        g, h = np.empty(pb.n), np.empty(pb.n)
        kern, b, epochs, steps = 0.0, run.b, 0, 0
        target = targets.loose if run.crowded else targets.gap
        for steps in range(self.max_steps + 1):
            b, theta = refit_intercept(run, b)
            pb.datafit.grad_hess(pb.y, run.z, sw, g, h)
            parts = self._shares(run, plan, g, h, theta, steps < self.max_steps)
            kern += max(p.kernel_s for p in parts)
            epochs += max(p.epochs for p in parts)
            gap = self._gap(run, ws, theta, parts)
            check_round(f"working-set solver (spread Newton step of round {r})", steps,
                        {"restricted duality gap": gap}, [p.stats for p in parts])
            if gap <= target or steps == self.max_steps:
                break
            moved = self._step(run, cols, parts, g, h, sw)
            if moved is None:
                break  # no decrease along the step: rounding level reached
            b += moved
        return SubproblemReport(b, epochs, kern, {"inner_rounds": steps, "newton_steps": steps})

    def _shares(self, run, plan, g, h, theta, step: bool) -> list[SpreadNewtonOutput]:
        """Every share's part of a step at the current point (statistics only if not
        ``step``): ``sweeps`` sweeps of the shares in turn, ``visit_epochs`` epochs a visit
        (:func:`newton_share_task`); one share, or a crowded working set (solved loosely,
        its steps' accuracy not worth a chain of sweeps), visits once for ``MAX_INNER``
        epochs. The last share's ``u`` is the whole step's ``X d``."""
        pb, ex = run.problem, run.problem.executor
        curvature = curvature_bound(pb.datafit, h, pb.sample_weight)
        many = step and len(plan) > 1 and not run.crowded
        epochs = (self.visit_epochs if many else MAX_INNER) if step else 0
        shares = [  # each share's groups, ids, live positions and coefficients
            ([hd for hd, _, _ in grp], [ids for _, ids, _ in grp], [k for _, _, k in grp],
             np.concatenate([run.w[ids[k]] for _, ids, k in grp]))
            for _, grp in plan
        ]  # fmt: skip
        last: list[Any] = [None] * len(plan)
        before = None
        for _ in range(self.sweeps if many else 1):
            for i, (q, _) in enumerate(plan):
                last[i] = before = ex.submit_to(
                    q, newton_share_task, *shares[i], g, h, theta, pb.n * pb.penalty.alpha_l1,
                    pb.penalty, curvature, epochs, pb.fit_intercept,
                    before if step else None, last[i],
                )  # fmt: skip
        return ex.gather(last)

    @staticmethod
    def _gap(run, ws, theta, parts) -> float:
        pb = run.problem
        absmax = max(p.stats.absmax for p in parts)
        excess = float(sum(p.stats.excess for p in parts))
        return duality_gap_from_stats(
            pb.datafit, pb.penalty, pb.y, run.z, run.w[ws], absmax, excess, s=pb.weights,
            intercept=pb.fit_intercept, theta=theta,
        )[2]  # fmt: skip

    @staticmethod
    def _step(run, cols, parts, g, h, sw) -> float | None:
        """Move ``w`` and ``z`` along the shares' step, with the
        model's optimal intercept step for it, as far as Armijo's rule on the true objective
        accepts; the intercept's change, or None when it accepts no step."""
        pb = run.problem
        dw, u = np.concatenate([p.dw for p in parts]), parts[-1].u
        w = run.w[cols]
        shift = np.zeros(2)  # the model's intercept step at d: its gradient is g + h X d
        model_shift(g + h * u, h, pb.fit_intercept, shift)
        e = float(shift[0])
        f0 = pb.datafit.value_along(pb.y, run.z, NO_U, 0.0, 0.0, sw) / pb.n + pb.penalty.value(w)
        t, _ = line_search(pb.datafit, pb.penalty, pb.y, run.z, sw, w, dw, g, h, u, e, f0)
        if t == 0.0:
            return None
        run.w[cols] = w + t * dw
        move_along(run.z, u, e, t)
        return t * e


def spread_gram_task(
    ex, plan, ids, prev, c, n, sample_weight, piece_bytes, scratch_max
) -> SpreadGramHandle:
    """The task holding the Gram matrix of a spread working set (:func:`merge_gram_task`):
    only the products with columns new since ``prev`` are formed, by each partition against
    each partition's new columns (sent in row pieces of at most ``piece_bytes`` worst-case
    bytes); assembled on the first partition's worker."""
    prev_task, prev_ids = prev if prev is not None else (None, np.zeros(0, np.int64))
    if prev_task is not None and np.array_equal(prev_ids, ids):
        return prev
    is_new = ~np.isin(ids, prev_ids)
    if not (~is_new).any():
        prev_task = None
    pos, pieces, k = [], [], 0
    for _, grp in plan:
        m_q = sum(keep.shape[0] for _, _, keep in grp)
        pos.append(np.arange(k, k + m_q))
        k += m_q
    for i_r, (r, grp_r) in enumerate(plan):
        new_r = is_new[pos[i_r]]
        if not new_r.any():
            continue
        cols_r, k0 = [], 0
        for _, _, keep in grp_r:  # each group's new columns (local positions)
            cols_r.append(keep[new_r[k0 : k0 + keep.shape[0]]])
            k0 += keep.shape[0]
        k_r = int(new_r.sum())
        step = int(max(1, min(n, piece_bytes // (12 * k_r))))
        ranges = [(r0, min(n, r0 + step)) for r0 in range(0, n, step)]
        hs_r = [h for h, _, _ in grp_r]
        for i_q, (q, grp_q) in enumerate(plan):
            hs_q, keeps_q = [h for h, _, _ in grp_q], [keep for _, _, keep in grp_q]
            if i_q == i_r:
                acc = ex.submit_to(
                    q, cross_gram_task, None, hs_q, keeps_q, None, cols_r, ranges,
                    sample_weight, scratch_max,
                )  # fmt: skip
            else:
                acc = None
                for a, b in ranges:  # each piece made once the previous one has been used
                    piece = ex.submit_to(r, row_piece_task, hs_r, cols_r, a, b, acc)
                    acc = ex.submit_to(
                        q, cross_gram_task, acc, hs_q, keeps_q, piece, None, [(a, b)],
                        sample_weight, scratch_max,
                    )  # fmt: skip
            pieces.append((pos[i_q], pos[i_r][new_r], acc))
    task = ex.submit_to(
        plan[0][0], merge_gram_task, prev_task, ids, np.flatnonzero(is_new), pieces, c, 1.0 / n
    )
    return SpreadGramHandle(task, ids)


class SpreadGram:
    """The squared-loss subproblem on a Gram matrix formed across the partitions holding
    its columns (out of core, when they are too many to gather on one worker).

    ``Q = X_W^T (S - s s^T / sum(s)) X_W / n`` (the intercept profiled out) is formed where
    the columns are cached, only the entries of new columns at each call, and held by one
    worker, which runs the covariance updates until the O(m) gap estimate falls within the
    target. Each exact check is partition reductions: ``X_q (w_q - w_q^0)`` moves the
    residual, ``X_q^T theta`` gives the restricted gap and the next epochs' exact gradient
    (so Q's float32 rounding does not accumulate, and the certificate never uses Q).
    """

    check_every = 10
    anderson = 5
    max_checks = 200
    spread = True

    def solve(self, run: Any, ws: np.ndarray, targets: Targets, r: int) -> SubproblemReport:
        pb, ex = run.problem, run.problem.executor
        plan = run.spread_plan(ws)
        ids = np.concatenate([gids[keep] for _, grp in plan for _, gids, keep in grp])
        pen = pb.penalty.restricted(ids)  # factors and bounds in the order of ``ids``
        hs = [[h for h, _, _ in grp] for _, grp in plan]
        keeps = [[keep for _, _, keep in grp] for _, grp in plan]
        sizes = np.cumsum([0] + [sum(k.shape[0] for k in ks) for ks in keeps])
        w_ids = run.w[ids]
        kern, epochs, checks, b = 0.0, 0, 0, run.b
        profile: tuple[np.ndarray, np.ndarray | None] | None = None
        estimate_ok, min_between = False, 1
        while True:
            b, theta, h, profile = self._exact_check(run, b, plan, hs, keeps, profile)
            _, _, gap = duality_gap_from_stats(
                pb.datafit, pen, pb.y, run.z, w_ids, *pen.xt_theta_stats(h, pb.n),
                s=pb.weights, intercept=pb.fit_intercept, theta=theta,
                box=pen.box_conjugate(h, pb.n),
            )  # fmt: skip
            check_round(f"working-set solver (spread Gram subproblem of round {r})", checks,
                        {"restricted duality gap": gap})
            if gap <= targets.gram_gap or epochs >= run.max_epochs or checks >= self.max_checks:
                break
            run.spread_gram = spread_gram_task(
                ex, plan, ids, run.spread_gram, profile[1], pb.n, pb.sample_weight,
                min(pb.budget.gather_max / 8.0, float(SPREAD_PIECE_BYTES)), pb.budget.dense_max,
            )  # fmt: skip
            if estimate_ok:  # the estimate said "within the target", the exact gap did not
                min_between = self.check_every
            est = GramGapEstimate(
                pb.datafit, pen, pb.y, run.z, theta, h, w_ids, pb.weights, profile[0]
            )
            ((w_new, done, estimate_ok, k),) = ex.gather(
                [
                    ex.submit_to(
                        plan[0][0], spread_gram_epochs_task, run.spread_gram.task, w_ids,
                        h / pb.n, est, pen, targets.gram_gap, min_between,
                        10 * self.check_every, run.max_epochs - epochs, self.anderson,
                    )
                ]
            )  # fmt: skip
            epochs, kern, checks = epochs + done, kern + k, checks + 1
            d = w_new - w_ids
            for u in ex.gather(
                [
                    ex.submit_to(q, partition_matvec_task, hs[i], keeps[i], d[a:b_], pb.n)
                    for i, ((q, _), a, b_) in enumerate(
                        zip(plan, sizes[:-1], sizes[1:], strict=True)
                    )
                ]
            ):
                run.z += u
            w_ids = w_new
            run.w[ids] = w_new
        return SubproblemReport(b, epochs, kern, {"inner_checks": checks})

    @staticmethod
    def _exact_check(run, b, plan, hs, keeps, profile):
        """The intercept's update, the dual point and ``h = X_W^T theta`` from partition
        reductions; the first time also ``X^T S (y - mean_s y)`` (for the estimate) and the
        profile's ``c`` (scaled ``X^T s``). Returns ``(b, theta, h, (g_y, c))``."""
        pb, ex = run.problem, run.problem.executor
        s, n = pb.weights, pb.n
        if pb.fit_intercept:
            db = pb.datafit.intercept_update(pb.y, run.z, s, max_iter=20)
            b += db
            run.z += db
        theta = pb.datafit.dual_point(pb.y, run.z, s, pb.fit_intercept)
        vecs = [theta]
        if profile is None:
            yc = pb.y - pb.initial_intercept()
            vecs.append(yc if s is None else s * yc)
            if pb.fit_intercept:
                vecs.append(np.ones(n) if s is None else s)
        outs = ex.gather(
            [
                ex.submit_to(q, partition_rmatvec_task, hs[i], keeps[i], vecs)
                for i, (q, _) in enumerate(plan)
            ]
        )
        h = np.concatenate([o[0] for o in outs])
        if profile is None:
            g_y = np.concatenate([o[1] for o in outs])
            c = None
            if pb.fit_intercept:
                c = np.concatenate([o[2] for o in outs])
                c /= np.sqrt(n * (n if s is None else float(s.sum())))
            profile = (g_y, c)
        return b, theta, h, profile
