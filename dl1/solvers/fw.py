"""Randomized Frank-Wolfe for the constrained Lasso, distributed over feature blocks.

Frandi, Nanculef, Lodi, Sartori & Suykens, *Fast and Scalable Lasso via Stochastic
Frank-Wolfe Methods with a Convergence Guarantee* (``../shared/papers/
stochastic-frank-wolfe-lasso_frandi.txt``), Algorithm 2, for

    min_a f(a) = 1/2 ||y - X a - b||^2   s.t.  ||a||_1 <= delta

(``b`` the unpenalised intercept: with ``fit_intercept`` the columns of ``X`` and ``y`` are
centred implicitly, which is the paper's "without loss of generality alpha_0 = 0").

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
deterministic FW vertex search. The same pass certifies the penalised Lasso at the
corresponding ``lambda = a^T X^T r / ||a||_1`` (the multiplier of the constraint at the
optimum): its duality gap follows from ``S``, ``F``, ``y^T y`` and ``||X^T r||_inf`` alone.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dl1.solvers import _fw_tasks as FT
from dl1.solvers.cd import ConvergenceWarning, overhead_fraction

#: Stopping rules: the paper's ``||a_{k+1} - a_k||_inf <= step_tol`` (glmnet's default), or
#: the exact FW gap ``<= tol * f(0)`` (checked by a full pass when the sampled estimate
#: falls below it).
STOP_RULES = ("paper", "gap")


def sample_size(p: int, sample: float | tuple[float, int]) -> int:
    """Size ``kappa`` of the random sample of columns scored per iteration.

    Parameters
    ----------
    p : int
        Number of features.
    sample : float or (float, int)
        A fraction of ``p`` in (0, 1] (the paper uses 1%, 2% and 3%), or a pair
        ``(rho, s)``: the confidence ``rho`` that the sample holds at least one of ``s``
        relevant features, ``kappa >= ln(1 - rho) / ln(1 - s / p)`` (Eq. 12).

    Returns
    -------
    int
        ``kappa`` in [1, p].
    """
    if isinstance(sample, tuple):
        if len(sample) != 2:
            raise ValueError(f"sample=(rho, s) needs two values, got {sample!r}")
        rho, s = float(sample[0]), int(sample[1])
        if not 0.0 < rho < 1.0:
            raise ValueError(f"sample confidence rho must be in (0, 1), got {rho!r}")
        if not 1 <= s <= p:
            raise ValueError(f"sample sparsity s must be in [1, p={p}], got {s!r}")
        if s == p:
            return 1
        return max(1, min(p, math.ceil(math.log1p(-rho) / math.log1p(-s / p))))
    frac = float(sample)
    if not (0.0 < frac <= 1.0):
        raise ValueError(f"sample must be a fraction in (0, 1] or a pair (rho, s), got {sample!r}")
    return max(1, min(p, math.ceil(frac * p)))


def split_sample(kappa: int, widths: np.ndarray) -> np.ndarray:
    """``kappa`` split over blocks in proportion to their widths (largest remainders; the
    parts sum to ``kappa`` and never exceed a block's width)."""
    widths = np.asarray(widths, dtype=np.int64)
    p = int(widths.sum())
    exact = kappa * widths / p
    base = np.minimum(np.floor(exact).astype(np.int64), widths)
    rest = kappa - int(base.sum())
    frac = exact - base
    frac[base >= widths] = -1.0
    for j in np.argsort(-frac, kind="stable")[:rest]:
        base[j] += 1
    return base


@dataclass
class FWResult:
    """Result of :func:`dl1.fit` with ``solver="fw"``: the constrained Lasso at ``delta``.

    Attributes
    ----------
    coef_ : ndarray (p,)
        Coefficients in the input's scale.
    intercept_ : float
    delta : float
        Radius of the l1 ball (on the standardised coefficients with ``standardize``).
    l1_norm_ : float
        ``||a||_1`` of the solution (``<= delta``).
    loss_ : float
        ``f(a) = 1/2 ||y - X a - b||^2``.
    f0_ : float
        ``f(0)`` (intercept only): the scale of the relative gaps.
    fw_gap_ : float
        Frank-Wolfe duality gap ``a^T grad f + delta ||grad f||_inf >= f(a) - f*``.
    gap_ : float
        ``fw_gap_ / f0_``.
    gap_kind_ : {"full pass", "sample estimate"}
        Whether ``fw_gap_`` is exact (all columns scored) or estimated on the last sample
        (a lower bound, not a certificate).
    lasso_alpha_ : float
        ``alpha`` of the penalised problem ``1/(2n) ||y - X w - b||^2 + alpha ||w||_1``
        that ``coef_`` solves when the FW gap is 0 (``a^T X^T r / (n ||a||_1)``); NaN if
        ``a = 0``.
    lasso_gap_ : float
        Relative duality gap of that penalised problem at ``coef_`` (NaN without a full
        pass).
    converged_ : bool
        The stopping rule was met (``stop="gap"``: the exact gap reached ``tol``).
    stop : {"paper", "gap"}
    n_iter_ : int
        FW iterations (rounds).
    n_full_passes_ : int
        Iterations that scored every column (exact gaps).
    dot_products_ : int
        Columns scored (the paper's count of dot products).
    nnz_visited_ : int
        Nonzeros read by the scoring.
    kappa_ : int
        Columns sampled per iteration.
    history_ : list of dict
        Per iteration: objective, gap estimate (or exact gap), support size, step, seconds.
    """

    coef_: np.ndarray
    intercept_: float
    delta: float
    l1_norm_: float
    loss_: float
    f0_: float
    fw_gap_: float
    gap_: float
    gap_kind_: str
    lasso_alpha_: float
    lasso_gap_: float
    converged_: bool
    stop: str
    tol: float
    n_iter_: int
    n_full_passes_: int
    dot_products_: int
    nnz_visited_: int
    kappa_: int
    history_: list[dict[str, Any]] = field(default_factory=list)
    load_seconds_: float = float("nan")
    solve_seconds_: float = float("nan")
    streamed_: bool = False

    @property
    def n_active_(self) -> int:
        return int(np.count_nonzero(self.coef_))

    @property
    def certified_(self) -> bool:
        """The exact (full-pass) FW gap is ``<= tol``."""
        return self.gap_kind_ == "full pass" and self.gap_ <= self.tol

    @property
    def overhead_fraction_(self) -> float:
        """``1 - kernel time / wall time`` over all rounds (kernel: the slowest partition's)."""
        return overhead_fraction(self.history_)

    def __repr__(self) -> str:
        return (
            f"FWResult(delta={self.delta:.6g}, nnz={self.n_active_}, loss={self.loss_:.6g}, "
            f"gap={self.gap_:.3e} ({self.gap_kind_}), converged={self.converged_}, "
            f"iterations={self.n_iter_})"
        )


class FWProblem:
    """What stays fixed along a path: centred ``y``, partitions, sample split and the
    ``sigma = X^T y`` futures (computed once on the workers holding the blocks)."""

    def __init__(
        self,
        ex: Any,
        blocks: list[Any],
        col_bounds: np.ndarray,
        y: np.ndarray,
        *,
        fit_intercept: bool,
        n_partitions: int,
        kappa: int,
    ) -> None:
        self.ex = ex
        self.n = int(y.shape[0])
        self.p = int(col_bounds[-1])
        self.intercept = fit_intercept
        self.ybar = float(y.mean()) if fit_intercept else 0.0
        self.yc = y - self.ybar
        self.yy = float(self.yc @ self.yc)
        self.kappa = int(kappa)
        widths = np.diff(col_bounds)
        kap = split_sample(self.kappa, widths)
        K = len(blocks)
        groups = np.array_split(np.arange(K), max(1, min(n_partitions, K)))
        self.parts = [[blocks[j] for j in g] for g in groups]
        self.offsets = [[int(col_bounds[j]) for j in g] for g in groups]
        self.kappas = [[int(kap[j]) for j in g] for g in groups]
        self.sigmas = [ex.submit(FT.sigma_task, part, self.yc) for part in self.parts]
        counts = ex.gather([ex.submit(FT.nnz_task, part) for part in self.parts])
        self.nnz = int(sum(sum(c) for c in counts))

    def round(self, p: np.ndarray, seed: int, it: int, full: bool):
        """The best candidate over all partitions (ties: the smallest column), with counts."""
        t0 = time.perf_counter()
        outs = self.ex.gather(
            [
                self.ex.submit(FT.round_task, part, off, sig, p, kap, seed, it, full)
                for part, off, sig, kap in zip(
                    self.parts, self.offsets, self.sigmas, self.kappas, strict=True
                )
            ]
        )
        wall = time.perf_counter() - t0
        best = None
        for cand, _, _, _ in outs:
            if cand is not None and (best is None or abs(cand[1]) > abs(best[1])):
                best = cand
        scored = sum(o[1] for o in outs)
        visited = sum(o[2] for o in outs)
        busy = max(o[3] for o in outs)
        return best, scored, visited, wall, busy


class FWState:
    """The iterate: ``a = c * a_tilde`` on ``support``, ``p = X a`` (centred), ``S``, ``F``.

    ``colsum`` and ``scale`` keep, for every column ever chosen, its (scaled) sum and
    column scale: enough to recover the intercept and the input-scale coefficients.
    """

    def __init__(self, n: int, p: int) -> None:
        self.c = 1.0
        self.at = np.zeros(p)
        self.support = np.zeros(0, dtype=np.int64)
        self.pvec = np.zeros(n)
        self.S = 0.0
        self.F = 0.0
        self.colsum: dict[int, float] = {}
        self.scale: dict[int, float] = {}

    def coef(self) -> np.ndarray:
        return self.c * self.at

    def l1(self) -> float:
        return self.c * float(np.abs(self.at[self.support]).sum())

    def rescale(self, factor: float) -> None:
        """Multiply ``a`` by ``factor`` (the paper's warm start onto a new ball)."""
        self.c *= factor
        self.pvec *= factor
        self.S *= factor * factor
        self.F *= factor

    def refresh(self, yc: np.ndarray) -> None:
        """Recompute ``S`` and ``F`` from ``p`` (drops the rounding of the recursion)."""
        self.S = float(self.pvec @ self.pvec)
        self.F = float(yc @ self.pvec)

    def step(self, i: int, dt: float, lam: float, cand, n: int, intercept: bool) -> float:
        """``a <- (1 - lam) a + lam dt e_i`` with ``p``, ``S``, ``F`` (Eq. 8, 10); returns
        ``||a_new - a_old||_inf``."""
        _, g, s, rows, vals, total, sq, scale = cand
        sqc = sq - total * total / n if intercept else sq
        G = g + s
        ai = self.c * self.at[i]
        others = self.support[self.support != i]
        mx = float(np.abs(self.at[others]).max()) * self.c if others.shape[0] else 0.0
        change = lam * max(abs(dt - ai), mx)
        self.S = (1 - lam) ** 2 * self.S + 2 * dt * lam * (1 - lam) * G + (dt * lam) ** 2 * sqc
        self.F = (1 - lam) * self.F + dt * lam * s
        self.pvec *= 1 - lam
        self.pvec[rows] += lam * dt * vals
        if intercept:
            self.pvec -= lam * dt * total / n
        c_new = (1 - lam) * self.c
        if c_new == 0.0:  # lam = 1: a is the vertex
            self.at[self.support] = 0.0
            self.support = np.zeros(0, dtype=np.int64)
            c_new = 1.0
        elif c_new < 1e-100:  # keep a_tilde representable
            self.at[self.support] *= c_new
            c_new = 1.0
        self.c = c_new
        if i not in self.colsum:
            self.colsum[i] = total
            self.scale[i] = scale
        if not np.any(self.support == i):
            self.support = np.append(self.support, i)
        self.at[i] += lam * dt / c_new
        return change


def _lasso_certificate(prob: FWProblem, st: FWState, absmax: float) -> tuple[float, float]:
    """``(alpha, relative gap)`` of the penalised Lasso that the current ``a`` would solve,
    from scalars only: ``r = y - X a``, ``||r||^2 = y^T y - 2 F + S``, ``a^T X^T r = F - S``,
    dual point ``theta = min(1, lambda / ||X^T r||_inf) r``."""
    n = prob.n
    l1 = st.l1()
    if l1 <= 0.0 or prob.yy <= 0.0:
        return float("nan"), float("nan")
    lam = (st.F - st.S) / l1
    if lam <= 0.0:
        return float("nan"), float("nan")
    rr = max(prob.yy - 2 * st.F + st.S, 0.0)
    primal = rr / (2 * n) + lam / n * l1
    cth = min(1.0, lam / absmax) if absmax > 0 else 1.0
    dual = (cth * (prob.yy - st.F) - 0.5 * cth * cth * rr) / n
    return lam / n, (primal - dual) / (prob.yy / (2 * n))


def solve_fw(
    prob: FWProblem,
    delta: float,
    *,
    stop: str = "paper",
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
    stop : {"paper", "gap"}
        ``"paper"``: stop when ``||a_{k+1} - a_k||_inf <= step_tol`` (the rule of the
        paper's experiments). ``"gap"``: stop when the exact FW gap is ``<= tol * f(0)``.
    step_tol, tol : float
    max_iter : int
        Iteration limit (a ConvergenceWarning states the gap reached).
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
        raise ValueError(f"l1_ball (delta) must be a finite number > 0, got {delta!r}")
    n, intercept = prob.n, prob.intercept
    st = state if state is not None else FWState(n, prob.p)
    f0 = 0.5 * prob.yy
    full_all = prob.kappa >= prob.p
    history: list[dict[str, Any]] = []
    scored_total = visited_total = n_full = 0
    exact: tuple[float, float] | None = None  # (gap, ||grad||_inf) at the current point
    converged = False
    full_next = False
    cooldown = 1
    wait = 0
    t_start = time.perf_counter()
    k = 0
    gap = float("nan")
    kind = "sample estimate"
    while k < max_iter:
        full = full_all or full_next
        cand, scored, visited, wall, busy = prob.round(st.pvec, seed, it0 + k, full)
        scored_total += scored
        visited_total += visited
        if full and not full_all:
            n_full += 1
        full_next = False
        if cand is None:  # no columns at all
            converged = True
            break
        g = cand[1]
        if full:
            st.refresh(prob.yc)
        gap = st.S - st.F + delta * abs(g)
        kind = "full pass" if full else "sample estimate"
        if full:
            exact = (gap, abs(g))
        if stop == "gap":
            if full and gap <= tol * f0:
                converged = True
                history.append(_entry(k, st, f0, gap, kind, 0.0, wall, busy, t_start))
                break
            if not full:
                wait -= 1
                if gap <= tol * f0 and wait <= 0:
                    full_next = True
                    wait = cooldown
                    # back off after failed checks, but no further than one full pass per
                    # p / kappa sampled rounds: the checks then cost at most half the work
                    cooldown = min(2 * cooldown, max(1, prob.p // max(prob.kappa, 1)))
        i = int(cand[0])
        dt = -delta if g > 0 else delta
        G = g + cand[2]
        sqc = cand[6] - cand[5] ** 2 / n if intercept else cand[6]
        num = -dt * g - st.F + st.S
        den = dt * dt * sqc - 2 * dt * G + st.S
        lam = min(1.0, max(0.0, num / den)) if den > 0 else 0.0
        change = st.step(i, dt, lam, cand, n, intercept) if lam > 0 else 0.0
        exact = None if lam > 0 else exact
        k += 1
        history.append(_entry(k, st, f0, gap, kind, lam, wall, busy, t_start))
        if verbose:
            h = history[-1]
            print(
                f"iter {k:6d}  f {h['objective']:.6e}  gap {h['gap']:.3e} ({kind})  "
                f"nnz {h['nnz']:5d}  step {lam:.3e}"
            )
        if callback is not None:
            callback(history[-1])
        if stop == "paper" and change <= step_tol:
            converged = True
            break
    if certify and exact is None and not (converged and stop == "gap"):
        cand, scored, visited, wall, busy = prob.round(st.pvec, seed, it0 + k, True)
        scored_total += scored
        visited_total += visited
        n_full += 0 if full_all else 1
        st.refresh(prob.yc)
        absmax = abs(cand[1]) if cand is not None else 0.0
        exact = (st.S - st.F + delta * absmax, absmax)
    if exact is not None:
        gap, kind = exact[0], "full pass"
        if stop == "gap" and gap <= tol * f0:
            converged = True
    if stop == "gap" and not converged:
        warnings.warn(
            f"Frank-Wolfe stopped at max_iter={max_iter} with relative FW gap "
            f"{gap / f0 if f0 > 0 else 0.0:.3e} ({kind}) > tol {tol:.3e}",
            ConvergenceWarning,
            stacklevel=3,
        )
    lasso_alpha, lasso_gap = (
        _lasso_certificate(prob, st, exact[1]) if exact is not None else (float("nan"),) * 2
    )
    a = st.coef()
    scale = np.array([st.scale[i] for i in st.support])
    coef = np.zeros(prob.p)
    coef[st.support] = a[st.support] * scale
    intercept_ = prob.ybar - sum(a[i] * st.colsum[i] for i in st.support) / n if intercept else 0.0
    res = FWResult(
        coef_=coef,
        intercept_=float(intercept_),
        delta=float(delta),
        l1_norm_=st.l1(),
        loss_=float(0.5 * prob.yy + 0.5 * st.S - st.F),
        f0_=f0,
        fw_gap_=float(gap),
        gap_=float(gap / f0) if f0 > 0 else 0.0,
        gap_kind_=kind,
        lasso_alpha_=lasso_alpha,
        lasso_gap_=lasso_gap,
        converged_=converged,
        stop=stop,
        tol=tol,
        n_iter_=k,
        n_full_passes_=n_full,
        dot_products_=scored_total,
        nnz_visited_=visited_total,
        kappa_=prob.kappa,
        history_=history,
    )
    res.solve_seconds_ = time.perf_counter() - t_start
    return res, st


def _entry(k, st, f0, gap, kind, lam, wall, busy, t_start) -> dict[str, Any]:
    return {
        "iteration": k,
        "objective": f0 + 0.5 * st.S - st.F,
        "gap": gap / f0 if f0 > 0 else 0.0,
        "gap_kind": kind,
        "nnz": int(np.count_nonzero(st.at[st.support])),
        "step": lam,
        "seconds": time.perf_counter() - t_start,
        "wall_s": wall,
        "busy_s": busy,
    }
