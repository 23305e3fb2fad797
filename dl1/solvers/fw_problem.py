"""The data and state of randomized Frank-Wolfe (:mod:`dl1.solvers.fw`): the sample sizes,
the problem fixed along a path (:class:`FWProblem`), the iterate with the paper's recursive
bookkeeping (:class:`FWState`) and the result (:class:`FWResult`)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dl1.objective.datafits import Quadratic
from dl1.objective.datafits.base import Datafit
from dl1.objective.gap import duality_gap_from_stats
from dl1.objective.penalties.elastic_net import ElasticNet
from dl1.solvers.result import overhead_fraction
from dl1.tasks.fw import column_task, fw_round_task, nnz_task, sigma_task
from dl1.tasks.records import (
    FWCandidate,
    FWColumn,
    FWRound,
    GapStats,
    Vertex,
)

#: Columns fetched by the coordinator are cached up to this size (the support always stays).
COLUMN_CACHE_BYTES = 64 * 2**20


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
    """Result of :func:`dl1.fit_constrained`: the constrained Lasso at ``delta``.

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
        ``f(a) = 1/2 ||y - X a - b||^2 + l2/2 ||a||^2``.
    f0_ : float
        ``f(0)`` (intercept only): the scale of the relative gaps.
    fw_gap_ : float
        Frank-Wolfe duality gap ``a^T grad f + delta ||grad f||_inf >= f(a) - f*``.
    gap_ : float
        ``fw_gap_ / f0_``.
    gap_kind_ : {"full pass", "sample estimate"}
        Whether ``fw_gap_`` is exact (all columns scored) or estimated on the last sample
        (a lower bound, not a certificate).
    lasso_alpha_, lasso_l1_ratio_ : float
        The penalised problem ``1/(2n) ||y - X w - b||^2 + alpha (l1_ratio ||w||_1 +
        (1 - l1_ratio)/2 ||w||^2)`` that ``coef_`` solves when the FW gap is 0:
        ``n alpha l1_ratio = lambda_1 = -a^T grad f / ||a||_1`` (the constraint's multiplier)
        and ``n alpha (1 - l1_ratio) = l2``; NaN if ``a = 0`` or without a full pass.
    lasso_gap_ : float
        Relative duality gap of that penalised problem at ``coef_`` (NaN without a full
        pass).
    l2 : float
        Ridge coefficient of the objective (elastic net in constrained form).
    converged_ : bool
        The stopping rule was met (``stop="gap"``: the exact gap reached ``tol``).
    stop : {"gap", "paper"}
    stopped_by_ : {"gap", "step", "max_iter", "no columns"}
        What ended the iterations: the gap rule (``gap_ <= tol``, certified), the paper's
        step rule, the iteration limit, or a problem without columns.
    n_iter_ : int
        FW iterations (rounds).
    n_full_passes_ : int
        Iterations that scored every column (exact gaps).
    dot_products_ : int
        Columns scored (the paper's count of dot products).
    nnz_visited_ : int
        Nonzeros read by the scoring.
    columns_fetched_ : int
        Chosen columns sent to the coordinator (each once while cached).
    kappa_ : int
        Columns sampled per iteration.
    history_ : list of dict
        Per iteration: objective, gap estimate (or exact gap), support size, the vertex
        (column) chosen, step, seconds.
    n_samples_, n_features_in_ : int or None
        Rows and features of the training data (as in :class:`dl1.FitResult`).
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
    lasso_l1_ratio_: float
    lasso_gap_: float
    l2: float
    converged_: bool
    stop: str
    stopped_by_: str
    tol: float
    n_iter_: int
    n_full_passes_: int
    dot_products_: int
    nnz_visited_: int
    kappa_: int
    columns_fetched_: int
    history_: list[dict[str, Any]] = field(default_factory=list)
    load_seconds_: float = float("nan")
    solve_seconds_: float = float("nan")
    streamed_: bool = False
    n_samples_: int | None = None
    n_features_in_: int | None = None

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
        l2: float = 0.0,
        datafit: Datafit | None = None,
    ) -> None:
        if not (np.isfinite(l2) and l2 >= 0):
            raise ValueError(f"l2 must be a finite number >= 0, got {l2!r}")
        datafit = Quadratic() if datafit is None else datafit
        if not datafit.smooth:
            raise ValueError(f"Frank-Wolfe needs a differentiable loss, got {datafit!r}")
        self.ex = ex
        self.l2 = float(l2)
        self.datafit = datafit
        # the squared loss has closed forms (sigma = X^T y, the exact step, the centred
        # intercept); any other smooth loss goes by its gradient and a Newton line search
        self.quadratic = bool(datafit.quadratic)
        self.col_bounds = np.asarray(col_bounds, dtype=np.int64)
        self.n = int(y.shape[0])
        self.p = int(col_bounds[-1])
        self.intercept = fit_intercept
        self.ybar = float(y.mean()) if fit_intercept and self.quadratic else 0.0
        self.yc = y - self.ybar
        self.yy = float(self.yc @ self.yc)
        if self.quadratic:
            self.b0 = 0.0
            self.f0 = 0.5 * self.yy
        else:
            self.b0 = datafit.initial_intercept(y) if fit_intercept else 0.0
            self.f0 = self.n * datafit.value(y, np.full(self.n, self.b0))
        self.kappa = int(kappa)
        widths = np.diff(col_bounds)
        kap = split_sample(self.kappa, widths)
        K = len(blocks)
        groups = np.array_split(np.arange(K), max(1, min(n_partitions, K)))
        self.block_ids = [[int(j) for j in g] for g in groups]
        self.part_of_block = np.concatenate(
            [np.full(len(g), q, dtype=np.int64) for q, g in enumerate(groups)]
        )
        self.cache: dict[int, tuple] = {}
        self.cache_bytes = 0
        self.n_fetched = 0
        self.parts = [[blocks[j] for j in g] for g in groups]
        self.offsets = [[int(col_bounds[j]) for j in g] for g in groups]
        self.kappas = [[int(kap[j]) for j in g] for g in groups]
        # a loss other than the squared: grad_j = x_j^T psi (psi the loss derivative), no
        # sigma term
        ys = self.yc if self.quadratic else np.zeros(self.n)
        self.sigmas = [ex.submit(sigma_task, part, ys) for part in self.parts]
        counts = ex.gather([ex.submit(nnz_task, part) for part in self.parts])
        self.nnz = int(sum(sum(c) for c in counts))

    def psi(self, st: FWState) -> np.ndarray:
        """A loss other than the squared: its derivative ``psi_i = loss'(y_i, z_i)`` at
        ``z = X a + b`` (``grad_a f = X^T psi``)."""
        return self.n * self.datafit.gradient(self.yc, st.pvec + st.b)

    def objective(self, st: FWState) -> float:
        if self.quadratic:
            return st.objective(self.yy, self.l2)
        loss = self.n * self.datafit.value(self.yc, st.pvec + st.b)
        return loss + 0.5 * self.l2 * st.Q

    def a_grad(self, st: FWState) -> float:
        """``a^T grad_a f`` (squared: ``S - F + l2 Q``; else ``(X a)^T psi + l2 Q``)."""
        if self.quadratic:
            return st.a_grad(self.l2)
        return float(st.pvec @ self.psi(st)) + self.l2 * st.Q

    def line_search(self, st: FWState, dt: float, cand) -> float:
        if self.quadratic:
            return st.line_search(dt, cand, self.n, self.intercept, self.l2)
        # no closed form: safeguarded Newton on phi(lam) = f(a + lam d), d = dt e_i - a,
        # with X d = v = dt z_i - p (O(n) per evaluation, on the coordinator)
        i, (rows, vals) = cand.col, cand.column[:2]
        v = -st.pvec
        v[rows] += dt * vals
        ai = st.c * st.at[i]
        ad = dt * ai - st.Q
        dd = st.Q - 2 * dt * ai + dt * dt
        z0 = st.pvec + st.b
        y, l2 = self.yc, self.l2
        g, h, vv, unit = np.empty(self.n), np.empty(self.n), v * v, np.empty(0)

        def derivs(lam: float) -> tuple[float, float]:
            self.datafit.grad_hess(y, z0 + lam * v, unit, g, h)  # loss' and loss''
            return float(g @ v) + l2 * (ad + lam * dd), float(h @ vv) + l2 * dd

        g0, _ = derivs(0.0)
        if g0 >= 0:
            return 0.0
        g1, _ = derivs(1.0)
        if g1 <= 0:
            return 1.0
        lo, hi, lam = 0.0, 1.0, 0.5
        for _ in range(60):
            d1, d2 = derivs(lam)
            if d1 > 0:
                hi = lam
            else:
                lo = lam
            nxt = lam - d1 / d2 if d2 > 0 else 0.5 * (lo + hi)
            if not lo < nxt < hi:
                nxt = 0.5 * (lo + hi)
            if abs(nxt - lam) <= 1e-14 or hi - lo <= 1e-14:
                return nxt
            lam = nxt
        return lam

    def refit_intercept(self, st: FWState) -> None:
        """A loss other than the squared, with an intercept: ``b`` minimising ``f(a, b)``
        for the current ``a`` (Newton), so that ``d f / d b = 0`` and the FW gap in ``a``
        bounds the error."""
        if not self.quadratic and self.intercept:
            for _ in range(50):
                db = self.datafit.intercept_update(self.yc, st.pvec + st.b, None, max_iter=1)
                st.b += db
                if abs(db) <= 1e-13 * max(1.0, abs(st.b)):
                    break

    def _extras(self, st: FWState) -> list[list[Any] | None]:
        """Per partition and block, the elastic-net gradient term ``l2 * a_j`` on the support
        (local indices, values); None when there is none."""
        if self.l2 == 0.0 or st.support.shape[0] == 0:
            return [None] * len(self.parts)
        sup = np.sort(st.support)
        vals = self.l2 * st.c * st.at[sup]
        blk = np.searchsorted(self.col_bounds, sup, side="right") - 1
        out: list[list[Any] | None] = []
        for ids in self.block_ids:
            per = []
            for j in ids:
                sel = blk == j
                per.append((sup[sel] - self.col_bounds[j], vals[sel]) if sel.any() else None)
            out.append(per)
        return out

    def round(
        self,
        st: FWState,
        seed: int,
        it: int,
        full: bool,
        threshold: float = -1.0,
        fetch: bool = True,
    ):
        """The best candidate over all partitions (ties: the smallest column), with counts
        and, for a full pass, the certificate statistics ``(max |c_j|, excess)``."""
        t0 = time.perf_counter()
        extras = self._extras(st)
        vec = st.pvec if self.quadratic else self.psi(st)
        outs = self.ex.gather(
            [
                self.ex.submit(
                    fw_round_task, part, off, sig, vec, kap, seed, it, full, ext, threshold
                )
                for part, off, sig, kap, ext in zip(
                    self.parts, self.offsets, self.sigmas, self.kappas, extras, strict=True
                )
            ]
        )
        best: Vertex | None = None
        for o in outs:
            if o.best is not None and (best is None or abs(o.best.grad) > abs(best.grad)):
                best = o.best
        stats = GapStats(max(o.absmax for o in outs), sum(o.excess for o in outs))
        candidate = None
        if best is not None:
            candidate = FWCandidate(best, self.column(int(best.col), st) if fetch else None)
        return FWRound(
            candidate, sum(o.scored for o in outs), sum(o.visited for o in outs), stats,
            time.perf_counter() - t0, max(o.seconds for o in outs),
        )  # fmt: skip

    def column(self, col: int, st: FWState) -> FWColumn:
        """The chosen column (:class:`~dl1.tasks.records.FWColumn`): from the cache, or
        fetched from the partition holding it (only the chosen column travels, once). Past
        :data:`COLUMN_CACHE_BYTES`, cached columns outside the support are dropped."""
        hit = self.cache.get(col)
        if hit is not None:
            return hit
        q = int(self.part_of_block[np.searchsorted(self.col_bounds, col, side="right") - 1])
        hit = self.ex.gather([self.ex.submit(column_task, self.parts[q], self.offsets[q], col)])[
            0
        ]
        self.n_fetched += 1
        self.cache[col] = hit
        self.cache_bytes += hit.rows.nbytes + hit.vals.nbytes
        if self.cache_bytes > COLUMN_CACHE_BYTES:
            keep = set(st.support.tolist()) | {col}
            for c in list(self.cache):
                if c not in keep:
                    old = self.cache.pop(c)
                    self.cache_bytes -= old.rows.nbytes + old.vals.nbytes
        return hit


class FWState:
    """The iterate: ``a = c * a_tilde`` on ``support``, ``p = X a`` (centred), ``S``, ``F``
    and ``Q = ||a||^2`` (for the elastic-net term).

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
        self.Q = 0.0
        self.b = 0.0
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
        self.Q *= factor * factor

    def refresh(self, yc: np.ndarray) -> None:
        """Recompute ``S``, ``F`` and ``Q`` exactly (drops the rounding of the recursions)."""
        self.S = float(self.pvec @ self.pvec)
        self.F = float(yc @ self.pvec)
        a = self.c * self.at[self.support]
        self.Q = float(a @ a)

    def objective(self, yy: float, l2: float) -> float:
        """``f = 1/2 y^T y + 1/2 S - F + l2/2 Q`` (Eq. 8 with the ridge term)."""
        return 0.5 * yy + 0.5 * self.S - self.F + 0.5 * l2 * self.Q

    def a_grad(self, l2: float) -> float:
        """``a^T grad f = S - F + l2 Q``."""
        return self.S - self.F + l2 * self.Q

    def line_search(self, dt: float, cand, n: int, intercept: bool, l2: float) -> float:
        """Exact step ``lambda`` in [0, 1] towards the vertex ``dt e_i`` (Eq. 8; with the
        ridge term ``l2/2 ||a||^2`` the quadratic in lambda gains ``l2 ||d||^2``)."""
        i, g, s = cand.vertex
        total, sq = cand.column.colsum, cand.column.sqnorm
        ai = self.c * self.at[i]
        G = g - l2 * ai + s  # z_i^T p
        sqc = sq - total * total / n if intercept else sq
        num = dt * (s - G) - self.F + self.S - l2 * (dt * ai - self.Q)
        den = dt * dt * sqc - 2 * dt * G + self.S + l2 * (self.Q - 2 * dt * ai + dt * dt)
        return min(1.0, max(0.0, num / den)) if den > 0 else 0.0

    def step(
        self, i: int, dt: float, lam: float, cand, n: int, intercept: bool, l2: float
    ) -> float:
        """``a <- (1 - lam) a + lam dt e_i`` with ``p``, ``S``, ``F``, ``Q`` (Eq. 8, 10);
        returns ``||a_new - a_old||_inf``."""
        g, s = cand.grad, cand.vertex.sigma
        rows, vals, total, sq, scale = cand.column
        sqc = sq - total * total / n if intercept else sq
        ai = self.c * self.at[i]
        G = g - l2 * ai + s
        others = self.support[self.support != i]
        mx = float(np.abs(self.at[others]).max()) * self.c if others.shape[0] else 0.0
        change = lam * max(abs(dt - ai), mx)
        self.S = (1 - lam) ** 2 * self.S + 2 * dt * lam * (1 - lam) * G + (dt * lam) ** 2 * sqc
        self.F = (1 - lam) * self.F + dt * lam * s
        self.Q = (1 - lam) ** 2 * self.Q + 2 * lam * (1 - lam) * dt * ai + (lam * dt) ** 2
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


def scoring_threshold(prob: FWProblem, st: FWState) -> float:
    """``lambda_1 = -a^T grad f / ||a||_1``: the l1 multiplier the current point implies (at
    the optimum, ``grad_j = -lambda_1 sign(a_j)`` on the support); -1 if undefined."""
    l1 = st.l1()
    lam1 = -prob.a_grad(st) / l1 if l1 > 0 else -1.0
    return lam1 if lam1 > 0 else -1.0


def penalised_certificate(
    prob: FWProblem, st: FWState, lam1: float, stats: tuple[float, float]
) -> tuple[float, float, float]:
    """``(alpha, l1_ratio, relative gap)`` of the penalised problem ``F(X w + b) +
    alpha (l1_ratio ||w||_1 + (1 - l1_ratio)/2 ||w||^2)`` (``F`` the datafit, the mean loss) with
    ``n alpha l1_ratio = lambda_1`` and ``n alpha (1 - l1_ratio) = l2``, at the current point,
    from a full pass's statistics of ``X^T r``
    (:func:`dl1.objective.gap.duality_gap_from_stats`)."""
    nan = float("nan")
    if lam1 <= 0 or prob.f0 <= 0:
        return nan, nan, nan
    n = prob.n
    alpha = (lam1 + prob.l2) / n
    ratio = lam1 / (lam1 + prob.l2)
    _, _, gap = duality_gap_from_stats(
        prob.datafit, ElasticNet(alpha, ratio), prob.yc, st.pvec + st.b, st.coef(), stats.absmax,
        stats.excess, intercept=prob.intercept,
    )  # fmt: skip
    return alpha, ratio, gap / (prob.f0 / n)


