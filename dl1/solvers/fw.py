"""Randomized Frank-Wolfe for the constrained Lasso, distributed over feature blocks.

Frandi, Nanculef, Lodi, Sartori & Suykens, *Fast and Scalable Lasso via Stochastic
Frank-Wolfe Methods with a Convergence Guarantee* (``../shared/papers/
stochastic-frank-wolfe-lasso_frandi.txt``), Algorithm 2, for

    min_a f(a) = 1/2 ||y - X a - b||^2 + l2/2 ||a||^2   s.t.  ||a||_1 <= delta

(``l2 = 0``: the Lasso; ``l2 > 0``: the elastic net in constrained form, the extension the
paper calls straightforward: the gradient gains ``l2 a_i`` on the support, the line search
``l2 ||d||^2``, and ``Q = ||a||^2`` is kept alongside ``S`` and ``F``; ``b`` the
unpenalised intercept: with ``fit_intercept`` the columns of ``X`` and ``y`` are
centred implicitly, which is the paper's "without loss of generality alpha_0 = 0").

Other differentiable losses (L1-logistic regression, the other extension the paper names;
also Poisson, Huber and the smooth hinges: any datafit with ``smooth``): ``f`` is the summed
loss of ``X a + b``; the workers score ``grad_i = z_i^T psi`` with ``psi`` the loss
derivative (sent instead of ``p``), the step is a safeguarded Newton line search on the
coordinator (O(n), using the chosen column and the datafit's ``grad_hess``), and the
intercept is re-fitted exactly after each step so that the FW gap in ``a`` stays a bound.

One iteration is one round: every partition of feature blocks scores its share of a random
sample of ``kappa`` columns (split over blocks in proportion to their widths) against
``p = X a`` and returns its best candidate with that column's nonzeros; the coordinator picks
the vertex ``u = -delta sign(grad_i) e_i`` of largest ``|grad_i|`` (Eq. 9) and takes the
closed-form line-search step of Eq. (8), keeping the paper's state:

* ``sigma_i = z_i^T y`` precomputed once (it stays with the blocks on the workers), so that
  ``grad_i = z_i^T p - sigma_i`` (Eq. 7, the "method of residuals" with ``p = X a``);
* the scalars ``S = ||X a||^2`` and ``F = y^T X a``, updated recursively (Eq. 8), which give
  the objective ``f = 1/2 y^T y + 1/2 S - F`` and the step without touching the data;
* ``a`` as ``c * a_tilde`` so that the update ``(1 - lambda) a + lambda delta~ e_i`` costs
  O(1) instead of O(p) (the support is kept as an index array).

Certificate. The FW duality gap ``g(a) = a^T grad f + delta ||grad f||_inf`` bounds
``f(a) - f*`` (paper, Eq. 17-18); ``a^T grad f = S - F``. On a sample,
``S - F + delta max_{i in S} |grad_i|`` is only an estimate (a lower bound of ``g``); the
exact gap needs ``||grad f||_inf``, one full pass (every column scored), which is also a
deterministic FW vertex search. The same pass certifies the penalised problem at the
corresponding ``lambda_1 = -a^T grad f / ||a||_1`` (the multiplier of the constraint at the
optimum), by dl1's duality gap from the pass's statistics of ``X^T r``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from dl1.solvers.fw_problem import (
    FWProblem,
    FWResult,
    FWState,
    penalised_certificate,
    scoring_threshold,
)
from dl1.solvers.numerics import check_round
from dl1.tasks.records import FWRound

#: Stopping rules: the exact FW gap ``<= tol * f(0)`` (checked by a full pass when the
#: sampled estimate falls below it), or the paper's ``||a_{k+1} - a_k||_inf <= step_tol``
#: (glmnet's default), which does not look at the gap.
STOP_RULES = ("gap", "paper")

def solve_fw(
    prob: FWProblem,
    delta: float,
    *,
    stop: str = "gap",
    step_tol: float = 1e-3,
    tol: float = 1e-4,
    max_iter: int = 10000,
    seed: int = 0,
    certify: bool = True,
    state: FWState | None = None,
    it0: int = 0,
    verbose: bool = False,
    callback: Any = None,
) -> tuple[FWResult, FWState]:
    """Randomized FW (Algorithm 2) on the ball of radius ``delta``.

    Parameters
    ----------
    prob : FWProblem
    delta : float
        Radius of the l1 ball (> 0).
    stop : {"gap", "paper"}
        ``"gap"``: stop when the exact FW gap is ``<= tol * f(0)``. ``"paper"``: stop when
        ``||a_{k+1} - a_k||_inf <= step_tol`` (the rule of the paper's experiments).
    step_tol, tol : float
    max_iter : int
        Iteration limit. The result's ``stopped_by_`` says which rule ended the run; the
        callers warn when the gap is above ``tol`` (:mod:`dl1.constrained`).
    seed : int
        Seed of the samples (iteration ``it0 + k`` uses ``(seed, it0 + k, block)``).
    certify : bool
        End with a full pass so that ``fw_gap_`` and ``lasso_gap_`` are exact.
    state : FWState, optional
        Warm start (rescaled onto the new ball by the caller).
    it0 : int
        Index of the first iteration in the sample streams.
    """
    if stop not in STOP_RULES:
        raise ValueError(f"stop must be one of {STOP_RULES}, got {stop!r}")
    if not (np.isfinite(delta) and delta > 0):
        raise ValueError(f"delta (the l1 ball's radius) must be a finite number > 0, got {delta!r}")
    st = state if state is not None else FWState(prob.n, prob.p)
    if state is None:
        st.b = prob.b0
    # the centring of p (squared loss with an intercept) stands for the intercept there;
    # another loss's intercept is re-fitted after each step instead
    center = prob.intercept and prob.quadratic
    run = FWRun(prob, t_start=time.perf_counter(), fetched0=prob.n_fetched)
    checks = GapChecks(max_wait=max(1, prob.p // max(prob.kappa, 1)))
    target = tol * prob.f0
    k = 0
    while k < max_iter:
        full = run.full_all or checks.full_next
        rnd, thr = run.round(st, seed, it0 + k, full)
        cand, stats, wall, busy = rnd.candidate, rnd.stats, rnd.wall, rnd.busy
        if cand is None:  # no columns at all
            run.converged, run.stopped_by = True, "no columns"
            break
        g = cand.grad
        run.gap = prob.a_grad(st) + delta * abs(g)
        check_round("Frank-Wolfe", k, {"Frank-Wolfe gap": run.gap, "gradient": g,
                                       "intercept": st.b})
        run.kind = "full pass" if full else "sample estimate"
        if full:
            run.exact, run.cert = (run.gap, abs(g)), (thr, stats)
        if stop == "gap":
            if full and run.gap <= target:
                run.converged, run.stopped_by = True, "gap"
                run.record(k, st, 0.0, wall, busy)
                break
            checks.after(full, run.gap <= target)
        i = int(cand.col)
        dt = -delta if g > 0 else delta
        lam = prob.line_search(st, dt, cand)
        change = st.step(i, dt, lam, cand, prob.n, center, prob.l2) if lam > 0 else 0.0
        if lam > 0:
            prob.refit_intercept(st)
            run.exact = run.cert = None
        k += 1
        entry = run.record(k, st, lam, wall, busy)
        entry["vertex"] = i
        if verbose:
            print(
                f"iter {k:6d}  f {entry['objective']:.6e}  gap {entry['gap']:.3e} ({run.kind})"
                f"  nnz {entry['nnz']:5d}  step {lam:.3e}"
            )
        if callback is not None:
            callback(entry)
        if stop == "paper" and change <= step_tol:
            run.converged, run.stopped_by = True, "step"
            break
    if certify and run.exact is None and not (run.converged and stop == "gap"):
        run.certify(st, seed, it0 + k, delta)
    if run.exact is not None:
        run.gap, run.kind = run.exact[0], "full pass"
        if stop == "gap" and run.gap <= target:
            run.converged, run.stopped_by = True, "gap"
    res = run.result(st, delta, stop=stop, tol=tol, n_iter=k)
    return res, st


@dataclass
class GapChecks:
    """When to check a sampled gap estimate by a full pass (``stop="gap"``): the iteration
    after the estimate falls below the target; after a failed check, back off (doubling),
    but no further than one full pass per ``max_wait = p / kappa`` sampled rounds, so the
    checks cost at most half the work."""

    max_wait: int
    full_next: bool = False
    cooldown: int = 1
    wait: int = 0

    def after(self, full: bool, below: bool) -> None:
        """Update after an iteration (a full pass, or a sample whose estimate is ``below``
        the target or not)."""
        self.full_next = False
        if full:
            return
        self.wait -= 1
        if below and self.wait <= 0:
            self.full_next = True
            self.wait = self.cooldown
            self.cooldown = min(2 * self.cooldown, self.max_wait)


@dataclass
class FWRun:
    """The bookkeeping of one :func:`solve_fw`: counters, the current gap and its kind, the
    exact gap and penalised certificate of the current point when a full pass gave them,
    how the run stopped, and the history."""

    prob: FWProblem
    t_start: float
    fetched0: int
    scored: int = 0
    visited: int = 0
    n_full: int = 0
    gap: float = float("nan")
    kind: str = "sample estimate"
    exact: tuple[float, float] | None = None  # (gap, ||grad||_inf) at the current point
    cert: tuple[float, Any] | None = None  # (lambda_1, stats) of ``exact``
    converged: bool = False
    stopped_by: str = "max_iter"
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def full_all(self) -> bool:
        """Every iteration scores every column (deterministic FW)."""
        return self.prob.kappa >= self.prob.p

    def round(
        self, st: FWState, seed: int, it: int, full: bool, fetch: bool = True
    ) -> tuple[FWRound, float]:
        """One scoring round (a full pass refreshes the residual and the screening
        threshold first), and the threshold it used."""
        thr = -1.0
        if full:
            st.refresh(self.prob.yc)
            thr = scoring_threshold(self.prob, st)
        rnd = self.prob.round(st, seed, it, full, thr, fetch=fetch)
        self.scored += rnd.scored
        self.visited += rnd.visited
        self.n_full += int(full and not self.full_all)
        return rnd, thr

    def certify(self, st: FWState, seed: int, it: int, delta: float) -> None:
        """A full pass at the final point: its exact FW gap and penalised certificate."""
        rnd, thr = self.round(st, seed, it, True, fetch=False)
        absmax = abs(rnd.candidate.grad) if rnd.candidate is not None else 0.0
        self.exact = (self.prob.a_grad(st) + delta * absmax, absmax)
        self.cert = (thr, rnd.stats)

    def record(self, k: int, st: FWState, lam: float, wall: float, busy: float) -> dict:
        entry = _entry(k, st, self.prob, self.gap, self.kind, lam, wall, busy, self.t_start)
        self.history.append(entry)
        return entry

    def result(self, st: FWState, delta: float, *, stop: str, tol: float, n_iter: int):
        """The :class:`FWResult` of the run at ``st``."""
        prob = self.prob
        nan = float("nan")
        pen_alpha, pen_ratio, pen_gap = (
            penalised_certificate(prob, st, *self.cert) if self.cert is not None else (nan,) * 3
        )
        a = st.coef()
        scale = np.array([st.scale[i] for i in st.support])
        coef = np.zeros(prob.p)
        coef[st.support] = a[st.support] * scale
        if not prob.quadratic:
            intercept_ = st.b
        elif prob.intercept:
            intercept_ = prob.ybar - sum(a[i] * st.colsum[i] for i in st.support) / prob.n
        else:
            intercept_ = 0.0
        f0 = prob.f0
        res = FWResult(
            coef_=coef, intercept_=float(intercept_), delta=float(delta), l1_norm_=st.l1(),
            loss_=float(prob.objective(st)), f0_=f0, fw_gap_=float(self.gap),
            gap_=float(self.gap / f0) if f0 > 0 else 0.0, gap_kind_=self.kind,
            lasso_alpha_=pen_alpha, lasso_l1_ratio_=pen_ratio, lasso_gap_=pen_gap,
            l2=prob.l2, converged_=self.converged, stop=stop, stopped_by_=self.stopped_by,
            tol=tol, n_iter_=n_iter, n_full_passes_=self.n_full, dot_products_=self.scored,
            nnz_visited_=self.visited, kappa_=prob.kappa,
            columns_fetched_=prob.n_fetched - self.fetched0, history_=self.history,
            n_samples_=int(prob.n), n_features_in_=int(prob.p),
        )  # fmt: skip
        res.solve_seconds_ = time.perf_counter() - self.t_start
        return res


def _entry(k, st, prob, gap, kind, lam, wall, busy, t_start) -> dict[str, Any]:
    f0 = prob.f0
    return {
        "iteration": k,
        "objective": prob.objective(st),
        "gap": gap / f0 if f0 > 0 else 0.0,
        "gap_kind": kind,
        "nnz": int(np.count_nonzero(st.at[st.support])),
        "step": lam,
        "seconds": time.perf_counter() - t_start,
        "wall_s": wall,
        "busy_s": busy,
    }


class ConstrainedProblem(NamedTuple):
    """The constrained problem at one radius: the data that stay fixed along a path and
    the radius ``delta`` of the l1 ball."""

    data: FWProblem
    delta: float

    def at(self, delta: float) -> ConstrainedProblem:
        """The same data with another radius (the path loop's ``problem.at``)."""
        return ConstrainedProblem(self.data, float(delta))


@dataclass(frozen=True)
class FWWarmState:
    """Where a Frank-Wolfe run ended (its iterate, mutable) and the iterations made so far
    along the path (they seed the next run's samples)."""

    fw: FWState
    iterations: int


class FrankWolfeSolver:
    """Randomized Frank-Wolfe on the l1 ball (Frandi et al., Algorithm 2), behind the
    solvers' interface (:class:`dl1.solvers.base.Solver`) with a
    :class:`ConstrainedProblem` in place of a penalised one.

    Parameters
    ----------
    stop : {"gap", "paper"}
        ``"gap"``: stop when the exact FW gap is ``<= tol * f(0)`` (checked by a full pass
        when the sampled estimate falls below it); ``"paper"``: when
        ``||w_{k+1} - w_k||_inf <= step_tol``, which does not look at the gap.
    tol, step_tol, max_iter : float, float, int
    seed : int
        Seed of the column samples.
    certify : bool
        Finish with a full pass, so that the reported gap is exact.
    verbose, callback : a line, or a call with the history entry, per iteration.
    """

    name = "fw"
    direct_calls = False

    def __init__(
        self,
        *,
        stop: str = "gap",
        tol: float = 1e-4,
        step_tol: float = 1e-3,
        max_iter: int = 10000,
        seed: int = 0,
        certify: bool = True,
        verbose: bool = False,
        callback: Any = None,
    ) -> None:
        self.stop, self.tol, self.step_tol = stop, tol, step_tol
        self.max_iter, self.seed, self.certify = max_iter, seed, certify
        self.verbose, self.callback = verbose, callback

    def solve(
        self, problem: ConstrainedProblem, warm: FWWarmState | None = None
    ) -> tuple[FWResult, FWWarmState]:
        """One radius; a warm start is first rescaled onto the new ball (the paper's
        heuristic, Sec. 5) and its intercept refitted."""
        state, it0 = (None, 0) if warm is None else (warm.fw, warm.iterations)
        if state is not None and state.l1() > 0:
            state.rescale(problem.delta / state.l1())
            problem.data.refit_intercept(state)
        res, state = solve_fw(
            problem.data, problem.delta, stop=self.stop, step_tol=self.step_tol, tol=self.tol,
            max_iter=self.max_iter, seed=self.seed, certify=self.certify, state=state,
            it0=it0, verbose=self.verbose, callback=self.callback,
        )  # fmt: skip
        return res, FWWarmState(state, it0 + res.n_iter_ + 1)

    def restore(self, problem: ConstrainedProblem, arrays: Any, intercept: float) -> Any:
        raise NotImplementedError("constrained paths are not checkpointed")

    def release(self, problem: ConstrainedProblem, state: Any) -> None:
        """Nothing is cached on the workers beyond the problem's own futures."""

    def describe(self, stopped_by: str) -> str:
        """The rule that ended a run, in words (for warnings)."""
        if stopped_by == "step":
            return f"the paper's step rule (||w_k+1 - w_k||_inf <= {self.step_tol:g})"
        if stopped_by == "max_iter":
            return f"max_iter={self.max_iter}"
        return f"the {stopped_by} rule"

    def shortfall(self, res: FWResult) -> str | None:
        """Why ``res`` is not certified at ``tol`` (None if it is): the relative gap, the
        tolerance and the rule that stopped it, saying whether the gap is exact."""
        if res.certified_ or res.stopped_by_ == "no columns":
            return None
        if res.gap_kind_ == "full pass":
            reached = f"relative FW gap {res.gap_:.1e} > tol {self.tol:.0e}"
        else:
            reached = (
                f"relative FW gap {res.gap_:.1e} (a sample estimate: certify=False; a lower "
                f"bound), not certified at tol {self.tol:.0e}"
            )
        return f"stopped by {self.describe(res.stopped_by_)} at {reached}"
