"""Proximal Newton on a gathered working set, for the smooth margin losses.

The working-set subproblem ``min_w F(X_W w + b) + pen(w)`` of a smooth non-quadratic datafit
(logistic, squared hinge) is solved by proximal Newton steps, the idea of skglm's
``ProxNewton`` (Bertrand, Klopfenstein, Massias et al., "Beyond L1: faster and better sparse
models with skglm", NeurIPS 2022; after Lee, Sun & Saunders, SIAM J. Optim. 2014):

1. at the current point, the per-sample gradient ``g`` and diagonal Hessian ``h`` of ``n F``
   (computed by the pass that evaluated the point, below);
2. the quadratic model ``(g^T v + v^T diag(h) v / 2) / n + pen(w + d)``, ``v = X_W d + e``,
   minimised approximately by cyclic coordinate descent on the columns
   (:func:`dl1.kernels.cd.weighted_cd_epochs`), the intercept step ``e`` profiled out,
   damped after a shortened step (Levenberg-Marquardt, :mod:`dl1.tasks.damping`), each
   coordinate's step kept in a trust region (:mod:`dl1.tasks.trust`);
3. a backtracking line search on the true objective along ``(d, e)`` (Armijo's rule with the
   model's predicted decrease), the trial points never formed; each trial's pass also
   writes ``g`` and ``h`` there
   (:meth:`~dl1.objective.datafits.margin.MarginLoss.value_along`), so the accepted one
   starts the next step with no pass of its own.

After a step whose decrease of the objective is near the target (:data:`CHECK_DECREASE`)
the restricted duality gap is computed exactly from the columns at the dual point ``-g``
(the coordinator's pass certifies the fit, not this gap); the solve stops at
``target_gap``. A step costs one pass over the samples with ``exp`` (two when the full step
is refused), one with ``log`` (the gap's conjugate) and light ones, besides its epochs.
Where Newton's steps stop decreasing the objective (:data:`STALLED`) with the gap still
above target, block steps (:mod:`dl1.tasks.block_newton`) solve the model exactly on the
worst violators and the columns sharing their rows, until they stop cutting the gap.

Any datafit exposing ``grad_hess``, ``value_along`` (with ``g`` and ``h``) and ``beta``
(bound on the loss's second derivative) besides the usual methods can use it.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import numpy as np

from dl1.cancellation import check_cancelled
from dl1.kernels.cd import weighted_cd_epochs, weighted_col_stats
from dl1.kernels.linalg import DUAL_SIDES, csc_matvec, csc_xt_theta_stats
from dl1.kernels.margins import NO_WEIGHTS as NO_U
from dl1.kernels.margins import balance, move_along
from dl1.objective.gap import dual_from_stats
from dl1.tasks.anderson import anderson_point
from dl1.tasks.block_newton import Layout, block_step, violations
from dl1.tasks.damping import next_damping
from dl1.tasks.records import SubproblemInfo
from dl1.tasks.trust import NO_REACH, TrustBox

#: Armijo's constant of the line search.
ARMIJO = 1e-4
#: Halvings of the line search before a Newton step is given up.
MAX_HALVINGS = 30
#: Relative rounding of the objective (a sum of n terms) below which a full step is taken.
VALUE_ROUNDING = 1e-12
#: Newton steps at most per subproblem.
MAX_NEWTON = 100
#: The restricted gap is computed after a step only when the step decreased the objective
#: by at most this many times the target gap. The gap bounds the suboptimality, hence the
#: next step's decrease, and it is linear in the optimality violation where the
#: suboptimality is quadratic: after a step that still gains much more than the target the
#: gap has not reached it (on shortclf it stayed at least 3 times the step's decrease), and
#: checking (a pass with ``log`` over the samples and one over the columns) would be
#: wasted. A wrong guess costs one more Newton step, never the answer.
CHECK_DECREASE = 1e2
#: Coordinate-descent epochs at most per Newton step: inexact steps cost less in all, each
#: step's gain falling less than its epochs (skglm caps at 20; benchmarks/RESULTS.md,
#: "Issue 31, session 8").
MAX_INNER = 25
#: The model without damping (:class:`Model`'s ``extra``).
NO_DAMPING = np.zeros(0)
#: Epochs between Anderson extrapolations of the model's coordinate descent.
ANDERSON = 5
#: A column's curvature is at least this fraction of its bound ``beta ||x_j||_s^2``.
CURVATURE_FLOOR = 1e-4
#: A Newton step that decreased the objective by at most this fraction of it, 100 times
#: its rounding (:data:`VALUE_ROUNDING`), with the restricted gap still above target, has
#: stalled: the gap is then a few columns' violations of their dual constraints, in a
#: valley the model's coordinate descent crawls along (at weak regularisation, the
#: objective flat to 1e-11 while the gap stays at 1e-3 of it for hundreds of steps);
#: block steps follow (:func:`_block_phase`). Before, Newton's steps still cut the gap,
#: and blocks between them cost more than they gain: the next step's truncated coordinate
#: descent moves the valley's columns again (benchmarks/RESULTS.md, "block Newton steps").
STALLED = 100 * VALUE_ROUNDING
#: A block step that does not cut the restricted gap to this fraction ends a block phase.
BLOCK_GAIN = 0.97
#: Block steps at most in a row.
MAX_BLOCKS = 50
#: The model is minimised until its remaining decrease is estimated below a fraction of its
#: decrease so far, the forcing term of inexact Newton (:func:`forcing_term`): at most this
#: one near the target, where each step gains about three orders of magnitude in
#: suboptimality (the quadratic term smaller).
INNER_RTOL = 1e-3
#: The forcing term while the gap is far from the target (a step's decrease above
#: :data:`CHECK_DECREASE` times it): a model minimised further there is a step the next
#: model replaces, and at weak regularisation on hundreds of thousands of columns the
#: epochs are the fit (benchmarks/RESULTS.md, "shortclf").
INNER_RTOL_FAR = 1e-1


class Model(NamedTuple):
    """The proximal Newton model at a point: ``g`` and ``h`` (``n`` times the datafit's
    per-sample gradient and diagonal Hessian), the columns' statistics of ``h``
    (:func:`~dl1.kernels.cd.weighted_col_stats`), their curvature floor, ``shift``
    (the intercept step and ``sum(h)``; see :func:`~dl1.kernels.cd.weighted_cd_epochs`),
    ``extra``, the damping's curvature per column (empty for none: the model is
    ``... + sum_j extra_j d_j^2 / (2 n)``; :mod:`dl1.tasks.damping`) and ``reach``, the
    trust region's bound on each ``|d_j|`` (empty for none; :mod:`dl1.tasks.trust`)."""

    g: np.ndarray
    h: np.ndarray
    hdata: np.ndarray
    lj: np.ndarray
    hx: np.ndarray
    floor: np.ndarray
    shift: np.ndarray
    extra: np.ndarray
    reach: np.ndarray = NO_REACH


class Columns(NamedTuple):
    """The working set's CSC columns: arrays, column scaling (empty for none) and the
    columns' sample-weighted squared norms."""

    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    scale: np.ndarray
    sqnorm: np.ndarray


def prox_newton(
    cols: Columns,
    w: np.ndarray,
    y: np.ndarray,
    z: np.ndarray,
    sample_weight: np.ndarray,
    datafit: Any,
    penalty: Any,
    fit_intercept: bool,
    target_gap: float,
    max_epochs: int,
) -> tuple[np.ndarray, np.ndarray, float, dict[str, Any]]:
    """Solve the working-set subproblem to a restricted gap of ``target_gap``.

    Parameters
    ----------
    cols : Columns
    w : ndarray of shape (m,)
        The working set's coefficients (copied).
    y, z : ndarray of shape (n,)
        Labels and the current ``X w + b`` (not modified).
    sample_weight : ndarray of shape (n,) or (0,)
        Normalised sample weights; empty for unit weights.
    datafit, penalty, fit_intercept
        The problem.
    target_gap : float
        Absolute restricted duality gap at which to stop.
    max_epochs : int
        Coordinate-descent epochs at most, over all Newton steps.

    Returns
    -------
    w : ndarray of shape (m,)
    dz : ndarray of shape (n,)
        The change of ``X w + b``.
    db : float
        The change of the intercept.
    info : SubproblemInfo
        The epochs, the last restricted gap, the kernel seconds and the Newton steps taken.
    """
    t0 = time.perf_counter()
    n, m = y.shape[0], w.shape[0]
    w = np.array(w, dtype=np.float64)
    z_start = z
    z = np.array(z, dtype=np.float64)
    s = None if sample_weight.shape[0] == 0 else sample_weight
    sw = np.ascontiguousarray(sample_weight, dtype=np.float64)
    g, h, u, r, tmp = np.empty(n), np.empty(n), np.empty(n), np.empty(n), np.empty(n)
    dw, lj, hx = np.empty(m), np.empty(m), np.empty(m)
    hdata = np.empty(cols.indices.shape[0], dtype=np.float32)  # see weighted_cd_epochs
    shift = np.zeros(2)
    db_total, epochs, steps, blocks = 0.0, 0, 0, 0
    layout = None  # the working set as a SciPy matrix for block steps (at the first stall)
    # the first step is taken without a check: the caller's pass found the gap above target
    gap, checked = np.inf, True
    damping = 0.0  # Levenberg-Marquardt's, in units of the columns' curvature bounds
    primal = datafit.value_along(y, z, NO_U, 0.0, 0.0, sw, g, h) / n + penalty.value(w)
    floor = CURVATURE_FLOOR * curvature_bound(datafit, h, sw) * cols.sqnorm
    trust = TrustBox.of(cols.indptr, cols.data, cols.scale, datafit)
    while epochs < max_epochs and steps < MAX_NEWTON:
        # g, h: n grad F and n diag(hess F) at z, from the last accepted trial point
        weighted_col_stats(cols.indptr, cols.indices, cols.data, cols.scale, h, lj, hx, hdata)
        model_shift(g, h, fit_intercept, shift)
        dw[:] = 0.0
        r[:] = g
        extra = (damping / CURVATURE_FLOOR) * floor if damping else NO_DAMPING
        model = Model(g, h, hdata, lj, hx, floor, shift, extra, trust.reach())
        epochs += minimise_model(cols, w, model, penalty, dw, r, u, tmp,
                                 min(MAX_INNER, max_epochs - epochs),
                                 forcing_term(gap if checked else np.inf, target_gap))  # fmt: skip
        u[:] = 0.0  # the step's X d, from the columns it moved
        csc_matvec(cols.indptr, cols.indices, cols.data, cols.scale, dw, u)
        t, f_t = line_search(datafit, penalty, y, z, sw, w, dw, g, h, u, shift[0], primal)
        if t == 0.0:  # no decrease along the model's step: rounding level reached
            break
        damping = next_damping(damping, t)
        trust.update(t)
        w += t * dw
        move_along(z, u, shift[0], t)  # the accepted trial point, rounded alike
        db_total += t * shift[0]
        steps += 1
        decrease, primal = primal - f_t, f_t
        checked = not decrease > CHECK_DECREASE * target_gap
        if checked:
            gap = _restricted_gap(cols, w, y, g, s, datafit, penalty, fit_intercept, primal, u)
            if gap <= target_gap or not np.isfinite(gap):  # the coordinator names a NaN
                break
            if decrease <= STALLED * abs(primal):  # Newton's steps gain nothing now
                layout = layout or Layout.of(cols, n)
                sub = Subproblem(cols, layout, y, sw, s, datafit, penalty, fit_intercept)
                gap, db, primal, k = _block_phase(sub, w, z, primal, gap, target_gap,
                                                  (g, h, u, dw, shift))  # fmt: skip
                db_total, blocks = db_total + db, blocks + k
                if gap <= target_gap:
                    break
    if not checked:  # the point's gap, for the caller (g may hold a refused trial's)
        datafit.grad_hess(y, z, sw, g, h)
        gap = _restricted_gap(cols, w, y, g, s, datafit, penalty, fit_intercept, primal, u)
    np.subtract(z, z_start, out=z)
    info = SubproblemInfo(epochs, float(gap), time.perf_counter() - t0, steps, blocks)
    return w, z, db_total, info


class Subproblem(NamedTuple):
    """What a block step needs of the subproblem: its columns (and :class:`~dl1.tasks.
    block_newton.Layout`), labels, weights (normalised, and None for unit) and problem."""

    cols: Columns
    layout: Layout
    y: np.ndarray
    sw: np.ndarray
    s: np.ndarray | None
    datafit: Any
    penalty: Any
    intercept: bool


def _block_phase(sub, w, z, primal, gap, target_gap, bufs):
    """Block Newton steps (:mod:`dl1.tasks.block_newton`) while each cuts the restricted
    gap by :data:`BLOCK_GAIN` at least, up to :data:`MAX_BLOCKS`: the gap, the intercept's
    change, the objective and the steps taken. Newton steps resume after: their truncated
    coordinate descent undoes part of a block's gain, but finds what no block holds."""
    g, h, u, dw, shift = bufs
    db_total = 0.0
    for k in range(MAX_BLOCKS):
        moved = _block_step(sub, w, z, primal, (g, h, dw, shift))
        if moved is None:
            return gap, db_total, primal, k
        db, primal = moved
        db_total += db
        before, gap = gap, _restricted_gap(sub.cols, w, sub.y, g, sub.s, sub.datafit,
                                           sub.penalty, sub.intercept, primal, u)  # fmt: skip
        if gap <= target_gap or gap > BLOCK_GAIN * before:
            return gap, db_total, primal, k + 1
    return gap, db_total, primal, MAX_BLOCKS


def _block_step(sub, w, z, primal, bufs):
    """A block Newton step at the current point, ``w`` and ``z`` moved along it as far as
    the line search takes it: the intercept's change and the new objective, or None (no
    violator, or no decrease). ``bufs`` are ``g`` and ``h`` at the point (updated to the
    new one), and scratch of lengths m and 2."""
    g, h, dw, shift = bufs
    excess = violations(sub.cols, g, sub.penalty, dw)
    model_shift(g, h, sub.intercept, shift)
    step = block_step(sub.layout, w, g, h, shift, sub.penalty, excess, dw)
    if step is None:
        return None
    dw[:] = 0.0
    dw[step.cols] = step.d
    t, f_t = line_search(sub.datafit, sub.penalty, sub.y, z, sub.sw, w, dw, g, h, step.u,
                         step.e, primal)  # fmt: skip
    if t == 0.0:  # g, h hold a refused trial's: back to the point's
        sub.datafit.grad_hess(sub.y, z, sub.sw, g, h)
        return None
    w += t * dw
    move_along(z, step.u, step.e, t)
    return t * step.e, f_t


def model_shift(g: np.ndarray, h: np.ndarray, intercept: bool, out: np.ndarray) -> None:
    """Fill :class:`Model`'s ``shift`` (``out``): the model's optimal intercept step at
    ``d = 0`` and ``sum(h)``, or zeros without an intercept (or without curvature)."""
    out[:] = 0.0
    h_sum = float(h.sum()) if intercept else 0.0
    if h_sum > 0.0:
        out[:] = (-float(g.sum()) / h_sum, h_sum)


def curvature_bound(datafit: Any, h: np.ndarray, sw: np.ndarray) -> float:
    """``beta``, or for a loss without a bound (Poisson) the largest per-sample curvature
    at the subproblem's start, for the floor of the columns' curvatures."""
    if np.isfinite(datafit.beta):
        return float(datafit.beta)
    per_sample = h if sw.shape[0] == 0 else h[sw > 0.0] / sw[sw > 0.0]
    top = float(per_sample.max()) if per_sample.shape[0] else 0.0
    return top if np.isfinite(top) and top > 0.0 else 1.0


def forcing_term(gap: float, target_gap: float) -> float:
    """The model's relative accuracy for the next Newton step: the reduction the gap still
    needs (``target_gap / gap``) within ``[INNER_RTOL, INNER_RTOL_FAR]``, and the loosest
    while the gap is not known (far from the target). A step need only gain what is left
    to gain (Dembo, Eisenstat & Steihaug, SIAM J. Numer. Anal. 1982: inexact Newton
    converges for any forcing term below 1, faster as it falls)."""
    if not gap > 0.0 or not np.isfinite(gap):
        return INNER_RTOL_FAR
    return min(INNER_RTOL_FAR, max(INNER_RTOL, target_gap / gap))


def minimise_model(
    cols: Columns, w: np.ndarray, model: Model, penalty: Any, dw: np.ndarray, r: np.ndarray,
    u: np.ndarray, tmp: np.ndarray, max_epochs: int, rtol: float | None = None,
) -> int:  # fmt: skip
    """Minimise the model over the step ``dw`` (zeros on entry) by coordinate descent
    (:func:`~dl1.kernels.cd.weighted_cd_epochs`, ``r`` = ``g`` on entry), one epoch at a time
    up to ``max_epochs`` or its stopping rule (the model's remaining decrease at most
    ``rtol`` times its decrease so far; None: :data:`INNER_RTOL`), and return the epochs
    run.

    After an epoch over every column, epochs visit only the active ones (``w + d != 0``)
    until the rule stops them, then one over every column decides (glmnet's active-set
    cycling, Friedman, Hastie & Tibshirani, J. Stat. Softw. 2010, section 2.6): a working set
    holds about twice the support, and its zero columns, whose gathers cost as much as
    the others', mostly stay zero. Every :data:`ANDERSON` epochs of one kind the last steps
    are extrapolated (Anderson acceleration of coordinate descent, Bertrand & Massias,
    AISTATS 2021, Alg. 1, as skglm does) and the extrapolated step kept if it lowers the
    model: on ill-conditioned working sets (TF-IDF columns, small alphas) plain epochs
    converge slowly. ``u`` and ``tmp`` are length-n scratch."""
    progress = np.array([np.inf, 0.0, 0.0])
    hist = np.empty((ANDERSON + 1, dw.shape[0] + 1))
    every = np.arange(dw.shape[0], dtype=np.int64)
    order, epochs, k = every, 0, 0
    while epochs < max_epochs:
        check_cancelled("Newton subproblem", epochs)
        epochs += weighted_cd_epochs(
            cols.indptr, cols.indices, cols.data, cols.scale, w, dw, r, model.hdata, model.lj,
            model.hx, model.floor, model.extra, model.reach, float(r.shape[0]),
            penalty.alpha_l1, penalty.alpha_l2, penalty.factors, penalty.bounds, model.shift,
            order, 1, INNER_RTOL if rtol is None else rtol, progress,
        )  # fmt: skip
        full = order is every
        if progress[2] != 0.0:
            if full:
                break
            order, k, progress[2] = every, 0, 0.0  # the active set done: check every column
            continue
        if full:
            active = np.flatnonzero(w + dw)
            if active.shape[0] < every.shape[0]:
                order, k = active, 0
        hist[k, :-1], hist[k, -1] = dw, model.shift[0]
        k += 1
        if k == ANDERSON + 1:
            _extrapolate(cols, w, model, penalty, hist, dw, r, u, tmp)
            k = 0
    return epochs


def _extrapolate(cols, w, model, penalty, hist, dw, r, u, tmp) -> None:
    """Replace the step ``(dw, e)`` (``e = model.shift[0]``) and ``r = g + H X dw`` by the
    Anderson extrapolation of the iterates in ``hist`` (rows ``(d, e)``) if it lowers the
    model. The model is a quadratic plus the penalty and ``e`` and ``r`` are affine in
    ``d``, so the extrapolation keeps the intercept step optimal. The model's change is
    taken along ``delta = d_e - dw`` from ``r`` (:func:`_model_change`): one product ``X
    delta`` (``tmp``), no history of length n; ``u`` is scratch."""
    ext = anderson_point(hist)
    if ext is None:
        return
    d_e, e_e = ext[:-1], float(ext[-1])
    if model.reach.shape[0]:  # an extrapolation may leave the trust region's box
        np.clip(d_e, -model.reach, model.reach, out=d_e)
    delta = d_e - dw
    tmp[:] = 0.0
    csc_matvec(cols.indptr, cols.indices, cols.data, cols.scale, delta, tmp)
    if _model_change(model, r, tmp, e_e - float(model.shift[0]), u) + (
        penalty.value(w + d_e) - penalty.value(w + dw)
    ) + _damping_change(model, dw, d_e) < 0.0:
        dw[:] = d_e
        np.multiply(model.h, tmp, out=u)
        r += u
        # the intercept step optimal for d_e (sum(r + h e) = 0), which the extrapolated e_e
        # is up to rounding, amplified by ill-conditioned coefficients c: the model only
        # falls further
        model.shift[0] = -float(r.sum()) / model.shift[1] if model.shift[1] > 0.0 else e_e


def _model_change(model, r, xd, de, hxd) -> float:
    """The quadratic part's change ``(q(v + dv) - q(v)) / n``, ``q(v) = g^T v + v^T H v /
    2``, from ``v = X d + e`` (``r = g + H X d``, ``e = model.shift[0]``) along ``dv = xd +
    de`` (``xd = X delta``): ``(r + h e)^T dv + dv^T H dv / 2``; ``hxd`` gets ``H xd``."""
    h, e, h_sum = model.h, float(model.shift[0]), float(model.shift[1])
    np.multiply(h, xd, out=hxd)
    h_xd = float(hxd.sum())
    first = float(r @ xd) + e * h_xd
    second = float(hxd @ xd)
    if h_sum > 0.0:  # the intercept's terms (without one, e and de are 0)
        first += de * (float(r.sum()) + e * h_sum)
        second += 2.0 * de * h_xd + de * de * h_sum
    return (first + 0.5 * second) / r.shape[0]


def _damping_change(model, d, d_new) -> float:
    """The damping's proximal term's change ``sum_j E_j (d_new_j^2 - d_j^2) / (2 n)``."""
    if not model.extra.shape[0]:
        return 0.0
    return 0.5 * float(model.extra @ (d_new * d_new - d * d)) / model.g.shape[0]


def _restricted_gap(cols, w, y, g, s, datafit, penalty, fit_intercept, primal, out):
    """The gap of the working-set problem at the point whose objective is ``primal`` and
    whose ``n grad F`` is ``g``; ``out`` is a length-n buffer.

    The dual point is ``theta = -g`` (``-n grad F``), balanced to ``sum theta = 0`` with an
    intercept, not taken at the optimal intercept shift as the certificate's is: the Newton
    steps keep the intercept optimal for their model, so the two gaps agree to the first
    digits near the solution, and this one needs no root finding (passes with ``exp``)."""
    n = y.shape[0]
    theta = np.negative(g, out=out)
    if fit_intercept:
        balance(theta)
    am, ex, box = csc_xt_theta_stats(
        cols.indptr, cols.indices, cols.data, cols.scale, theta, n * penalty.alpha_l1,
        penalty.factors, penalty.bounds, float(n), penalty.alpha_l2, DUAL_SIDES,
    )
    conjugate_at = datafit.conjugate_line(y, theta, s)
    return primal - dual_from_stats(penalty, conjugate_at, am, ex, n, box)


def line_search(datafit, penalty, y, z, sw, w, dw, g, h, u, e, f0) -> tuple[float, float]:
    """The step ``t`` (1, 1/2, ...) along ``(d, e)`` satisfying Armijo's rule on the true
    objective (``f0`` at ``t = 0``) with the model's first-order decrease, and the objective
    there; ``(0, f0)`` if none does. Each trial fills ``g`` and ``h`` at its point, so they
    hold the accepted point's for the next step."""
    n = y.shape[0]
    pen0 = penalty.value(w)
    # directional derivative of F plus the penalty's change at t = 1 (convex: an upper
    # bound of its derivative)
    slope = min(0.0, (float(g @ u) + e * float(g.sum())) / n + penalty.value(w + dw) - pen0)
    # near the optimum the decrease falls below the objective's rounding while the duality
    # gap (linear in the optimality violation) is still above the target: a full step that
    # does not raise the objective beyond rounding is taken, as pure Newton would
    rounding = VALUE_ROUNDING * abs(f0)
    t = 1.0
    for _ in range(MAX_HALVINGS):
        f_t = datafit.value_along(y, z, u, e, t, sw, g, h) / n + penalty.value(w + t * dw)
        if f_t <= f0 + ARMIJO * t * slope + (rounding if t == 1.0 else 0.0):
            return t, f_t
        t *= 0.5
    return 0.0, f0
