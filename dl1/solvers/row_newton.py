"""Working sets solved by proximal Newton steps on row partitions: for data far taller than
wide, where nothing as long as the rows may travel.

The working-set solver's blocks are columns holding every row, so each round moves vectors
as long as the rows (``theta``, ``X d``) between workers: 800 MB a round at 100M rows
(``docs/scaling.md``). Here each worker holds row blocks and its rows' predictions
(:mod:`dl1.tasks.row_newton`); what travels is as long as the features or the working set:

Each call applies a step to every partition and returns the sum of their small results:
by one direct call to the partition servers holding the parts, forwarded along a tree of
peers, or by Dask tasks (:mod:`dl1.runtime.row_parts`).

* **Certificate** (each round). The intercept is refitted by Newton steps on the
  partitions' derivative sums; each partition forms its part of the dual point
  ``theta = -n grad F(z)`` and sends its sign sums (the balance an intercept needs),
  then ``X_q^T theta_q`` (length p, added by the coordinator), then its loss and conjugate
  sums at the scales that make the dual point feasible (:mod:`dl1.objective.gap`).
* **Working set**: the support and the features closest to violating ``|x_j^T theta| <=
  n alpha`` (celer's rule, Massias, Gramfort & Salmon, ICML 2018), grown as
  :func:`~dl1.tasks.growth.next_ws_size` says, at most ``max_ws`` features.
* **Subproblem**: proximal Newton steps (glmnet's quadratic approximation, Friedman,
  Hastie & Tibshirani 2010, Sec. 3). Each partition sends its part of the model's
  Hessian on the working set, ``X_W^T diag(h) X_W`` (``m x m``), with the model's
  gradient; the coordinator profiles the intercept out, runs coordinate descent with
  covariance updates on the summed matrix (:func:`dl1.kernels.gram.gram_cd_epochs`), and
  one more call evaluates a ladder of step lengths on every partition (Armijo's rule on
  the penalised objective). The step is applied by the next model call. The squared loss
  needs one step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from dl1.errors import ValidationError
from dl1.kernels.gram import gram_cd_epochs
from dl1.objective.gap import dual_from_conjugates, dual_scales
from dl1.runtime.row_parts import Partitions, PartsLost, RowParts, start_parts
from dl1.solvers.base import Problem, WarmState
from dl1.solvers.numerics import check_round
from dl1.solvers.options import SolverOptions
from dl1.solvers.result import Certificate, FitResult, make_result
from dl1.tasks.growth import WS_START, next_ws_size
from dl1.tasks.row_newton import (
    GapSums,
    ModelSums,
    TrialSums,
    gap_sums,
    model_sums,
    part_out,
    shift_sums,
    start_part,
    sum_outs,
    trial_model,
    unpacked,
    with_theta,
    xt_theta,
)

#: Step lengths a line search tries: 1, 1/2, ..., 2^-15; the first :data:`FIRST_STEPS` in
#: the step's call (each a pass over every partition's rows), the rest in a second call
#: when none of them is accepted.
STEPS = 0.5 ** np.arange(16)
FIRST_STEPS = 4
#: Armijo's sufficient decrease, as a fraction of the model's predicted decrease.
ARMIJO = 1e-4
#: Intercept Newton steps per certificate at most (each a call of tiny sums).
INTERCEPT_STEPS = 50


class RowNewtonSolver:
    """Proximal Newton steps on working sets, the data held by rows (see the module).

    Parameters
    ----------
    max_rounds : int
        Certificates (passes over the data) at most; reaching it warns with the gap.
    ws_start : int
        The first working set's size.
    max_ws : int
        Features a working set holds at most: the coordinator holds its ``m x m`` model
        Hessian (``8 m^2`` bytes; 128 MiB at 4096).
    inner_ratio : float
        A subproblem stops when the model's predicted decrease, and the relative excess of
        its gradient over the L1 bound times ``P(0)``, fall below this fraction of the
        round's duality gap (of the target when the working set holds every violator).
    max_newton : int
        Newton steps per subproblem at most.
    max_cd_epochs : int
        Coordinate-descent epochs on one model at most.
    verbose, callback : a line, or a call with the history entry, per round.

    Notes
    -----
    A round's history entry has, beside the gap and objective, ``calls`` (the partition
    calls made so far: every one a step on every partition and their sums, by a direct
    call to the partition servers or by tasks, :mod:`dl1.runtime.row_parts`),
    ``transport`` (``"direct"`` or ``"tasks"``, as the working-set solver's entries),
    ``ws_size``, ``newton_steps`` and ``cd_epochs``.
    """

    name = "row-newton"
    layout = "rows"
    returns_z = False
    direct_calls = True

    @classmethod
    def from_options(cls, o: SolverOptions) -> RowNewtonSolver:
        """This solver configured from the entry points' keywords (those it has)."""
        return cls(max_rounds=o.rounds, verbose=o.verbose, callback=o.callback)

    def __init__(
        self,
        *,
        max_rounds: int = 1000,
        ws_start: int = WS_START,
        max_ws: int = 4096,
        inner_ratio: float = 0.3,
        max_newton: int = 100,
        max_cd_epochs: int = 1000,
        verbose: bool = False,
        callback: Any = None,
    ) -> None:
        if max_ws < 1 or ws_start < 1:
            raise ValidationError(f"ws_start={ws_start} and max_ws={max_ws} must be >= 1")
        self.max_rounds = max_rounds
        self.ws_start = ws_start
        self.max_ws = max_ws
        self.inner_ratio = inner_ratio
        self.max_newton = max_newton
        self.max_cd_epochs = max_cd_epochs
        self.verbose = verbose
        self.callback = callback

    def solve(self, problem: Problem, warm: WarmState | None = None) -> tuple[
        FitResult, WarmState
    ]:
        """Rounds of certificate, working set and Newton steps until the gap is within
        ``problem.tol``."""
        pb = problem
        if not pb.datafit.smooth:
            raise ValidationError(f"solver={self.name!r} needs a smooth loss, not {pb.loss!r}")
        w = np.zeros(pb.p) if warm is None else warm.coef.copy()
        b = pb.initial_intercept() if warm is None else float(warm.intercept)
        run = _Run(self, pb, self._kept(pb, warm) or self._start(pb, w, b), w, b)
        history: list[dict[str, Any]] = []
        t0 = time.perf_counter()
        converged, ws_size, r = False, 0, 0
        for r in range(self.max_rounds + 1):
            try:
                cert, xt = run.certify()
            except PartsLost:  # once a solve at most: the parts again, by tasks
                run.restart()
                cert, xt = run.certify()
            history.append(self._entry(r, cert, pb, run, t0))
            converged = history[-1]["gap"] <= pb.tol
            if converged or r == self.max_rounds:
                break
            ws, crowded = run.working_set(xt, ws_size)
            ws_size = ws.shape[0]
            target = cert.gap * self.inner_ratio if crowded else pb.tol * pb.p_zero
            try:
                history[-1] |= run.subproblem(ws, target * self.inner_ratio)
            except PartsLost:  # the steps taken are kept; the next round certifies them
                run.restart()
        res = make_result(pb, run.w, run.b, cert, converged, r, history)
        return res, RowNewtonState(run.w, run.b, np.zeros(0), run.parts, _data(pb))

    @staticmethod
    def _kept(pb: Problem, warm: WarmState | None) -> RowParts | None:
        """The partitions a warm state kept, when they hold this problem's rows, labels and
        weights (a path's next alpha: only the penalty changed); else none."""
        if not isinstance(warm, RowNewtonState) or warm.parts is None:
            return None
        same = all(a is b for a, b in zip(warm.data, _data(pb), strict=True))
        return warm.parts if same else None

    def _start(self, pb: Problem, w: np.ndarray, b: float) -> RowParts:
        """Each partition with its rows' labels, weights and ``z = X_q w + b``: on the
        partition servers when the executor has them, else by tasks."""
        rows = pb.rows
        bounds = rows.row_bounds
        support = np.flatnonzero(w)
        blocks, starts = [], []
        for part in rows.parts:
            lo, hi = int(bounds[part[0]]), int(bounds[part[-1] + 1])
            blocks.append([rows.blocks[i] for i in part])
            starts.append((pb.y[lo:hi], pb.weights[lo:hi] if pb.weights is not None else None))
        of = Partitions(pb.executor, blocks, part_out, sum_outs)
        return start_parts(of, start_part, starts, (support, w[support], b))

    def _entry(self, r: int, cert: Certificate, pb: Problem, run: _Run, t0: float) -> dict:
        entry = {
            "round": r,
            "calls": run.calls,
            "transport": run.parts.transport,
            "objective": cert.primal,
            "gap": pb.relative_gap(cert.gap),
            "nnz": int(np.count_nonzero(run.w)),
            "seconds": time.perf_counter() - t0,
        }
        if self.verbose:
            print(f"round {r:4d}  objective {entry['objective']:.10g}  gap "
                  f"{entry['gap']:.3e}  nnz {entry['nnz']}")  # fmt: skip
        if self.callback is not None:
            self.callback(entry)
        return entry

    def restore(self, problem: Problem, arrays: dict[str, np.ndarray], intercept: float) -> (
        WarmState
    ):
        """The state a checkpoint saved (the partitions' predictions are recomputed)."""
        return WarmState(arrays["w"], intercept, np.zeros(0))

    def release(self, problem: Problem, state: WarmState | None) -> None:
        """Nothing is cached beside the state: its partitions go with it (futures) or
        with the solve's partition servers, closed at its end."""


def _data(pb: Problem) -> tuple[Any, Any, Any]:
    """What a partition holds of a problem besides its predictions: its rows, labels and
    weights (compared by identity: a path's problems share them)."""
    return (pb.rows, pb.y, pb.sample_weight)


@dataclass(frozen=True)
class RowNewtonState(WarmState):
    """A :class:`WarmState` with the partitions kept on the workers (each holding its rows'
    labels, weights and ``z`` at this state's coefficients) and the problem data they hold
    (:func:`_data`): the next solve on the same data (a path's next alpha) starts from
    them, sending nothing as long as the rows."""

    parts: RowParts | None = None
    data: tuple[Any, ...] = ()

    def reproducible(self) -> RowNewtonState:
        # the kept z were updated step by step; a resumed run recomputes them as X w + b
        return replace(self, parts=None, data=())


class _Run:
    """One solve's coefficients on the coordinator and partitions on the workers."""

    def __init__(self, solver: RowNewtonSolver, pb: Problem, parts: RowParts, w: np.ndarray,
                 b: float) -> None:  # fmt: skip
        self.solver, self.pb, self.parts = solver, pb, parts
        self.w, self.b = w, b
        # the columns' norms, for the working set's scores (from the loading's checks)
        self.norms = np.sqrt(pb.rows.col_sq)
        #: calls so far (each: every partition's task and their sums, or a direct call)
        self.calls = 0

    def _call(self, fn: Any, *args: Any) -> Any:
        """``fn(part, blocks, *args)`` on every partition; the new parts kept, the sum of
        their ``out`` returned (:mod:`dl1.runtime.row_parts`: the coordinator receives one
        result, not one a worker)."""
        self.calls += 1
        self.parts, total = self.parts.call(fn, *args)
        return total

    def restart(self) -> None:
        """The partitions started again at ``(w, b)`` (by tasks: the servers' were lost)."""
        self.parts = self.solver._start(self.pb, self.w, self.b)

    # -- the certificate ------------------------------------------------------------------
    def refit_intercept(self) -> float:
        """Newton steps on the intercept (halved until the loss decreases; one exact step
        for the squared loss): ``b`` moved, the shift the partitions' ``z`` must take."""
        pb = self.pb
        if not pb.fit_intercept:
            return 0.0
        shift = 0.0
        at = self._call(shift_sums, pb.datafit, shift)
        for _ in range(INTERCEPT_STEPS):
            if at.h <= 0 or abs(at.g) <= 1e-13 * at.g_abs:
                break
            step = -at.g / at.h
            if pb.datafit.quadratic:  # the loss is quadratic in the shift: the step is exact
                shift += step
                break
            for _ in range(40):
                trial = self._call(shift_sums, pb.datafit, shift + step)
                if trial.value <= at.value + 1e-12 * abs(at.value):
                    break
                step *= 0.5
            shift, at = shift + step, trial
        self.b += shift
        return shift

    def certify(self) -> tuple[Certificate, np.ndarray]:
        """The duality gap at ``(w, b)`` (the intercept refitted) and ``X^T theta``."""
        pb, n = self.pb, self.pb.n
        shift = self.refit_intercept()
        sides = self._call(with_theta, pb.datafit, shift)
        sides = sides if pb.fit_intercept else None
        xt = self._call(xt_theta, sides)
        absmax, excess = pb.penalty.xt_theta_stats(xt, n)
        box = pb.penalty.box_conjugate(xt, n)
        scales = dual_scales(pb.penalty, absmax, n)
        sums: GapSums = self._call(gap_sums, pb.datafit, sides, scales)
        value, conj = sums.value / n, tuple(c / n for c in sums.conjugates)
        primal = value + pb.penalty.value(self.w)
        dual = dual_from_conjugates(pb.penalty, scales, conj, excess, n, box)
        check_round(self.solver.name, 0, {"objective": primal, "dual": dual})
        return Certificate(primal, dual, primal - dual), xt

    # -- the working set ------------------------------------------------------------------
    def working_set(self, xt: np.ndarray, last: int) -> tuple[
        np.ndarray, bool
    ]:
        """The next working set (sorted) and whether it leaves violators out."""
        pb, solver = self.pb, self.solver
        bound = pb.n * pb.penalty.alpha_l1
        factors = pb.penalty.factors if pb.penalty.factors.shape[0] else np.ones(pb.p)
        with np.errstate(divide="ignore", invalid="ignore"):
            slack = (bound * factors - np.abs(xt)) / np.where(self.norms > 0, self.norms, 1)
        slack[(self.w != 0) | (factors == 0)] = -np.inf
        support = int(np.count_nonzero(self.w))
        size = min(pb.p, max(next_ws_size(support, last, solver.ws_start), support))
        if size > solver.max_ws and support >= solver.max_ws:
            raise ValidationError(
                f"the solution's support ({support} features) fills max_ws="
                f"{solver.max_ws} and violators remain: raise max_ws (the coordinator holds "
                "an m x m matrix) or use solver='ws'"
            )
        size = min(size, solver.max_ws)
        ws = np.sort(np.argpartition(slack, size - 1)[:size]) if size < pb.p else np.arange(pb.p)
        crowded = bool(np.count_nonzero(slack < 0) > size - support) if size < pb.p else False
        return ws, crowded

    # -- the subproblem -------------------------------------------------------------------
    def subproblem(self, ws: np.ndarray, target: float) -> dict[str, Any]:
        """Newton steps on the working set ``ws`` until the model's predicted decrease is
        below ``target``; the round's record.

        A step's call evaluates the line search's ladder and, speculatively, the next
        model at the full step (glmnet's steps are mostly taken whole): a step costs one
        call, two when the line search cuts it."""
        pb, solver = self.pb, self.solver
        pen = pb.penalty.restricted(ws)
        sums: ModelSums = self._call(model_sums, pb.datafit, ws, None, 0.0)
        steps = epochs = 0
        while steps < solver.max_newton:
            steps += 1
            q, g = self._model(sums)
            w_ws = self.w[ws]
            new = w_ws.copy()
            epochs += self._minimise(q, -g, new, pen)
            d = new - w_ws
            e = -(sums.g0 + sums.c @ d) / sums.h0 if pb.fit_intercept else 0.0
            decrease = float(sums.G @ d + sums.g0 * e) / pb.n + pen.value(new) - pen.value(w_ws)
            if not np.any(d) or self._done(-decrease, g, w_ws, pen, target):
                break
            before, f0 = self.parts, sums.value / pb.n
            trial: TrialSums = self._call(trial_model, pb.datafit, ws, d, e,
                                          STEPS[:FIRST_STEPS])  # fmt: skip
            t = self._armijo(trial.values, STEPS[:FIRST_STEPS], d, f0, pen, w_ws, decrease)
            if t is None:  # the rest of the ladder, from the parts before the step
                self.parts = before
                rest = STEPS[FIRST_STEPS:]
                values = self._call(trial_model, pb.datafit, ws, d, e, rest).values
                t = self._armijo(values, rest, d, f0, pen, w_ws, decrease) or float(rest[-1])
            self.w[ws] = w_ws + t * d
            self.b += t * e
            sums = trial.model
            if t != 1.0:  # cut: the model at the step taken, from the parts before it
                self.parts = before
                sums = self._call(model_sums, pb.datafit, ws, t * d, t * e)
        return {"ws_size": int(ws.shape[0]), "newton_steps": steps, "cd_epochs": epochs}

    def _minimise(self, q: np.ndarray, h: np.ndarray, w: np.ndarray, pen: Any) -> int:
        """Coordinate descent on the model (``h = -`` its gradient at ``w``, both updated in
        place) until an epoch moves no coordinate by more than 1e-12 (in the model's
        norm), at most ``max_cd_epochs``; the epochs run."""
        for k in range(1, self.solver.max_cd_epochs + 1):
            moved = gram_cd_epochs(q, h, w, pen.alpha_l1, pen.alpha_l2, pen.factors,
                                   pen.bounds, 1)  # fmt: skip
            if moved <= 1e-12:
                return k
        return self.solver.max_cd_epochs

    @staticmethod
    def _excess(g: np.ndarray, w: np.ndarray, pen: Any) -> float:
        """How far the model's gradient ``g`` at ``w`` exceeds the L1 bound on the working
        set, relatively (``max_j |g_j + alpha_l2 f_j w_j| / (alpha_l1 f_j) - 1``): the
        rescaling of the dual point certifies a gap about this times the objective, which
        the objective's decrease alone does not bound (a flat loss)."""
        f = pen.factors if pen.factors.shape[0] else np.ones(w.shape[0])
        held = f > 0
        if pen.alpha_l1 <= 0 or not held.any():
            return 0.0
        grad = np.abs(g + pen.alpha_l2 * f * w)[held] / (pen.alpha_l1 * f[held])
        return float(grad.max()) - 1.0

    def _done(self, decrease: float, g: np.ndarray, w: np.ndarray, pen: Any,
              target: float) -> bool:  # fmt: skip
        """Whether the Newton steps stop at ``w``: the model's predicted ``decrease``, the
        excess of its gradient ``g`` over the L1 bound and the nonzero coefficients'
        deficit all below what ``target`` allows."""
        return (decrease <= target and self._excess(g, w, pen) <= target / self.pb.p_zero
                and self._deficit(g, w, pen) <= target)  # fmt: skip

    @staticmethod
    def _deficit(g: np.ndarray, w: np.ndarray, pen: Any) -> float:
        """The gap the nonzero coefficients leave, to first order: ``sum_j |w_j| |g_j +
        alpha_l2 f_j w_j + alpha_l1 f_j sign(w_j)|`` over those inside their bounds (the
        residual's dual point pays it whole). A step's decrease is of second order in it:
        a float32 model's last step can leave 1e-9 of the objective here, unseen."""
        f = pen.factors if pen.factors.shape[0] else np.ones(w.shape[0])
        live = w != 0
        if pen.bounds.shape[1]:
            live &= (w > pen.bounds[0]) & (w < pen.bounds[1])
        dev = g + pen.alpha_l2 * f * w + pen.alpha_l1 * f * np.sign(w)
        return float(np.abs(w[live]) @ np.abs(dev[live]))

    def _model(self, sums: ModelSums) -> tuple[np.ndarray, np.ndarray]:
        """The model's Hessian and gradient on the working set (``F``'s, divided by n),
        the intercept profiled out when there is one."""
        n = self.pb.n
        A = unpacked(sums.A, sums.G.shape[0])
        if not self.pb.fit_intercept or sums.h0 <= 0:
            return A / n, sums.G / n
        q = (A - np.outer(sums.c, sums.c) / sums.h0) / n
        return np.ascontiguousarray(q), (sums.G - sums.c * (sums.g0 / sums.h0)) / n

    def _armijo(self, values: np.ndarray, steps: np.ndarray, d: np.ndarray, f0: float,
                pen: Any, w_ws: np.ndarray, decrease: float) -> float | None:  # fmt: skip
        """The first of ``steps`` whose loss sum (``values``, every partition's added)
        gives Armijo's decrease of the penalised objective; None if none does."""
        p0 = f0 + pen.value(w_ws)
        for t, v in zip(steps, values / self.pb.n, strict=True):
            if v + pen.value(w_ws + t * d) <= p0 + ARMIJO * t * decrease + 1e-12 * abs(p0):
                return float(t)
        return None
