"""The gathered working-set subproblem: coordinate descent on the columns, or covariance
updates on their Gram matrix, with Anderson extrapolation."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from dl1.cancellation import check_cancelled
from dl1.kernels.cd import cd_block_epochs
from dl1.kernels.linalg import DUAL_SIDES, csc_matvec, csc_rmatvec, csc_xt_theta_stats
from dl1.objective.gap import duality_gap_from_stats
from dl1.tasks.blocks import NO_PROFILE
from dl1.tasks.columns import col_sums, gather_columns
from dl1.tasks.gram import (
    GRAM_DENSE_MAX,
    GRAM_MAX,
    GramGapEstimate,
    gram_epochs,
    gram_limit,
    working_set_gram,
)
from dl1.tasks.prox_newton import Columns, prox_newton
from dl1.tasks.records import ColumnGroup, SubproblemInfo, SubproblemOutput

#: Range of a column's mean square (its Gram diagonal) that the float32 Gram matrix holds
#: with float32's precision: beyond it (data scaled by more than about 1e15 or less than
#: 1e-15) entries overflow to inf or underflow to zero, and the columns' exact epochs
#: (float64) are used instead.
GRAM_SQNORM_RANGE = (2.0**-100, 2.0**100)


def gram_representable(sqn: np.ndarray, n: int) -> bool:
    """Whether the working set's Gram matrix fits :data:`GRAM_SQNORM_RANGE` (``sqn``, the
    columns' weighted squared norms; empty columns aside)."""
    q = sqn[sqn > 0] / n
    lo, hi = GRAM_SQNORM_RANGE
    return q.shape[0] == 0 or bool(q.min() >= lo and q.max() <= hi)


@dataclass(frozen=True)
class SubproblemSettings:
    """The settings of a gathered working-set subproblem (:func:`subproblem_task`).

    ``target_gap`` stops column epochs, ``gram_target`` (None: ``target_gap``) Gram-matrix
    epochs; ``check_every`` epochs between gap checks; ``anderson`` iterates per
    extrapolation; working sets of at most ``gram_max`` columns (squared loss) are solved on
    their Gram matrix, kept by the worker under ``gram_key``; ``dense_max`` bounds the
    scratch densifying its new columns.
    """

    datafit: Any
    penalty: Any
    fit_intercept: bool
    target_gap: float
    max_epochs: int
    check_every: int = 10
    random_order: bool = False
    seed: int = 0
    anderson: int = 5
    gram_max: int = GRAM_MAX
    dense_max: int = GRAM_DENSE_MAX
    gram_key: str | None = None
    gram_target: float | None = None
    method: str = "auto"
    """``"auto"``: the Gram matrix (above), else proximal Newton for datafits exposing
    ``grad_hess`` (:mod:`dl1.tasks.prox_newton`), else column epochs; ``"cd"``: no
    proximal Newton."""


def subproblem_task(
    extracts: list[ColumnGroup],
    extract_ids: list[np.ndarray],
    fresh: list[bool],
    ws: np.ndarray,
    w_ws: np.ndarray,
    y: np.ndarray,
    z: np.ndarray,
    sample_weight: np.ndarray,
    settings: SubproblemSettings,
) -> SubproblemOutput:
    """Solve the problem restricted to the working set to a gap of ``target_gap``
    (``gram_target``, when given, on the Gram-matrix path).

    Exact coordinate descent on the gathered columns (sigma' = 1; the gradient is refreshed
    every epoch, so for the squared loss every coordinate step is the exact minimiser and for
    the logistic loss the beta = 1/4 majorant of Shalev-Shwartz & Tewari's SCD is re-centred
    every epoch), with the intercept re-fitted after each epoch and, for the squared loss,
    profiled out of every coordinate step (implicitly centred columns; see ``col_sum`` of
    :func:`dl1.kernels.cd.cd_block_epochs`). Every ``anderson + 1``
    epochs the iterates are extrapolated by Anderson acceleration (as in skglm; Bertrand &
    Massias, "Anderson acceleration of coordinate descent", AISTATS 2021, Alg. 1), kept only
    if it lowers the objective.

    ``extracts`` are groups of columns gathered in earlier rounds (cached where this task runs)
    and ``extract_ids`` their global feature ids; the columns of ``ws`` are picked from them.
    ``fresh`` marks the groups made for this call (extracted or compacted): their seconds
    (``ColumnGroup.seconds``) are counted as kernel time.
    Squared-loss working sets of at most ``gram_max`` columns (and :func:`gram_limit`, from
    the worker's memory limit) are solved on their Gram matrix, kept between rounds under
    ``gram_key`` by :func:`working_set_gram`;
    ``dense_max`` bounds the elements (rows x columns) of the scratch densifying its new
    columns (out of core it is kept small, for memory-limited workers). Once the Gram matrix
    is formed an epoch costs ``O(m)`` per changed coordinate, so the caller may ask that
    path for a tighter target (``gram_target``) than the one of column-wise epochs, whose
    every epoch is a pass over the working set's nonzeros.

    Returns
    -------
    w_ws : the new coefficients of the working set.
    dz : ndarray (n,), change of ``X w + b``.
    db : float, change of the intercept.
    info : SubproblemInfo (epochs, restricted gap, kernel seconds).
    """

    t0 = time.perf_counter()
    datafit, penalty, fit_intercept = settings.datafit, settings.penalty, settings.fit_intercept
    target_gap, max_epochs = settings.target_gap, settings.max_epochs
    check_every, anderson = settings.check_every, settings.anderson
    gram_target = settings.gram_target
    extract_s = sum(e.seconds for e, f in zip(extracts, fresh, strict=True) if f)
    n = y.shape[0]
    indptr, indices, data, scale, sqn = gather_columns(extracts, extract_ids, ws)
    w = np.asarray(w_ws, dtype=np.float64).copy()
    z0 = z
    z = z.copy()
    s = None if sample_weight.shape[0] == 0 else sample_weight
    gram_ok = 0 < w.shape[0] <= min(settings.gram_max, gram_limit())
    if datafit.quadratic and gram_ok and gram_representable(sqn, n):
        # squared loss on a small working set: covariance updates
        w, dz, db, info = solve_on_gram(
            indptr,
            indices,
            data,
            scale,
            w,
            y,
            z,
            s,
            sample_weight,
            datafit,
            penalty,
            fit_intercept,
            target_gap if gram_target is None else gram_target,
            max_epochs,
            check_every,
            anderson,
            t0,
            settings.dense_max,
            ws,
            settings.gram_key,
        )
        return SubproblemOutput(w, dz, db, info._replace(kernel_s=info.kernel_s + extract_s))
    if settings.method != "cd" and hasattr(datafit, "grad_hess"):
        w, dz, db, info = prox_newton(
            Columns(indptr, indices, data, scale, sqn), w, y, z0, sample_weight, datafit,
            penalty, fit_intercept, target_gap, max_epochs,
        )  # fmt: skip
        return SubproblemOutput(w, dz, db, info._replace(kernel_s=info.kernel_s + extract_s))
    cols = Columns(indptr, indices, data, scale, sqn)
    return column_cd(cols, w, y, z0, z, s, sample_weight, settings, t0, extract_s)


def column_cd(
    cols: Columns,
    w: np.ndarray,
    y: np.ndarray,
    z0: np.ndarray,
    z: np.ndarray,
    s: np.ndarray | None,
    sample_weight: np.ndarray,
    settings: SubproblemSettings,
    t0: float,
    extract_s: float,
) -> SubproblemOutput:
    """:func:`subproblem_task`'s column-wise path: epochs of exact coordinate descent on the
    gathered columns ``cols`` from ``w`` (``z``, a copy of ``z0``, updated in place), the
    intercept refitted each epoch, Anderson extrapolation every ``anderson + 1`` epochs."""
    indptr, indices, data, scale, sqn = cols
    datafit, penalty, fit_intercept = settings.datafit, settings.penalty, settings.fit_intercept
    target_gap, max_epochs = settings.target_gap, settings.max_epochs
    check_every, anderson = settings.check_every, settings.anderson
    n = y.shape[0]
    active = np.arange(w.shape[0], dtype=np.int64)
    u = np.zeros(n)
    db_total = 0.0
    gap = np.inf
    epochs = 0
    threshold = n * penalty.alpha_l1
    hist: list[np.ndarray] = []
    # squared loss: the intercept is profiled out of every coordinate step (implicit centring)
    profile = fit_intercept and datafit.quadratic
    col_sum, shift = NO_PROFILE, np.zeros(2)
    if profile:
        col_sum = col_sums(indptr, indices, data, s)
        shift[1] = n if s is None else float(s.sum())
    for epoch in range(max_epochs):
        check_cancelled("column subproblem", epoch)
        if fit_intercept:
            db = datafit.intercept_update(y, z, s)
            z += db
            db_total += db
        if epoch % check_every == 0:
            theta = datafit.dual_point(y, z, s, fit_intercept)
            am, ex, box = csc_xt_theta_stats(indptr, indices, data, scale, theta, threshold,
                                             penalty.factors, penalty.bounds, float(n),
                                             penalty.alpha_l2, DUAL_SIDES)  # fmt: skip
            _, _, gap = duality_gap_from_stats(
                datafit, penalty, y, z, w, am, ex, s=s, intercept=fit_intercept, theta=theta,
                box=box,
            )
            if gap <= target_gap or not np.isfinite(gap):  # the coordinator names a NaN
                break
        g = datafit.gradient(y, z, s)
        u[:] = 0.0
        cd_block_epochs(
            indptr,
            indices,
            data,
            scale,
            w,
            g,
            u,
            sample_weight,
            sqn,
            1.0,
            datafit.beta,
            float(n),
            penalty.alpha_l1,
            penalty.alpha_l2,
            penalty.factors,
            penalty.bounds,
            1,
            settings.random_order,
            (settings.seed * 1000003 + epoch) % (2**32),
            active,
            col_sum,
            shift,
        )
        z += u
        if profile:
            z += shift[0]
            db_total += shift[0]
            shift[0] = 0.0
        epochs += 1
        hist.append(np.append(w, db_total))
        if len(hist) == anderson + 1:
            w, db_total = anderson_step(
                hist, w, db_total, z, y, s, datafit, penalty, indptr, indices, data, scale
            )
            hist = []
    info = SubproblemInfo(epochs, float(gap), time.perf_counter() - t0 + extract_s)
    return SubproblemOutput(w, z - z0, db_total, info)


def anderson_step(hist, w, db_total, z, y, s, datafit, penalty, indptr, indices, data, scale):
    """Anderson extrapolation of the last iterates ``(w, b)``; accepted if it decreases P.

    ``z`` is updated in place when the extrapolated point is accepted.
    """
    H = np.asarray(hist)
    U = np.diff(H, axis=0)
    C = U @ U.T
    try:
        c = np.linalg.solve(C, np.ones(C.shape[0]))
    except np.linalg.LinAlgError:
        return w, db_total
    if not np.isfinite(c).all() or c.sum() == 0:
        return w, db_total
    c /= c.sum()
    ext = c @ H[1:]
    w_e, b_e = ext[:-1], ext[-1]
    dz = np.full(z.shape[0], b_e - db_total)
    csc_matvec(indptr, indices, data, scale, w_e - w, dz)
    z_e = z + dz
    if datafit.value(y, z_e, s) + penalty.value(w_e) < datafit.value(y, z, s) + penalty.value(w):
        z[:] = z_e
        return w_e, float(b_e)
    return w, db_total


def solve_on_gram(
    indptr,
    indices,
    data,
    scale,
    w,
    y,
    z,
    s,
    sample_weight,
    datafit,
    penalty,
    fit_intercept,
    target_gap,
    max_epochs,
    check_every,
    anderson,
    t0,
    dense_max,
    ws,
    gram_key,
):
    """The squared-loss subproblem by covariance updates (:mod:`dl1.kernels.gram`), on the
    Gram matrix of the working set ``ws`` (cached under ``gram_key``, see
    :func:`working_set_gram`).

    ``Q = X_W^T (S - s s^T / sum(s)) X_W / n`` profiles the intercept out; ``h = -grad F`` is
    refreshed exactly from the residual at every gap check, so rounding cannot accumulate.
    """
    n, m = y.shape[0], w.shape[0]
    vals = data if scale.shape[0] == 0 else data * np.repeat(scale, np.diff(indptr))
    c = None
    if fit_intercept:
        c = col_sums(indptr, indices, vals, s) / np.sqrt(n * (n if s is None else float(s.sum())))
    # Q itself is cached (read-only here): its entries, like G's, depend on two columns only
    Q = working_set_gram(
        indptr, indices, vals, n, sample_weight, ws, gram_key, dense_max, 1.0 / n, c
    )
    z_start = z  # read only: every check starts from it
    w_start = w.copy()
    h = np.empty(m)
    # X_W^T S (y - mean_s(y)): how the weighted residual's inner product with y moves
    yc = y - (datafit.initial_intercept(y, s) if fit_intercept else 0.0)
    g_y = np.empty(m)
    csc_rmatvec(indptr, indices, data, scale, yc if s is None else s * yc, g_y)
    estimate_ok = False
    min_between = 1
    gap = np.inf
    epochs = 0
    hist: list[np.ndarray] = []
    zc = np.empty_like(z_start)  # reused: a fresh n-vector per check costs page faults
    db_total = 0.0
    while True:
        # exact state: z from w, intercept refitted, h = X^T theta / n
        np.copyto(zc, z_start)
        csc_matvec(indptr, indices, data, scale, w - w_start, zc)
        db_total = 0.0
        if fit_intercept:
            db_total = datafit.intercept_update(y, zc, s)
            zc += db_total
        theta = datafit.dual_point(y, zc, s, fit_intercept)
        # one pass gives X^T theta for the gap's statistics and the next epochs' gradient
        csc_rmatvec(indptr, indices, data, scale, theta, h)
        _, _, gap = duality_gap_from_stats(
            datafit,
            penalty,
            y,
            zc,
            w,
            *penalty.xt_theta_stats(h, n),
            s=s,
            intercept=fit_intercept,
            theta=theta,
            box=penalty.box_conjugate(h, n),
        )
        if gap <= target_gap or epochs >= max_epochs or not np.isfinite(gap):
            break  # a non-finite gap: more epochs cannot repair it; the coordinator names it
        if estimate_ok:  # the estimate said "within the target", the exact gap did not
            min_between = check_every
        est = GramGapEstimate(datafit, penalty, y, zc, theta, h, w, s, g_y)
        h /= n
        # the exact gap costs two passes over the working set's nonzeros: it is computed
        # when the Gram-matrix estimate (O(m) per epoch) falls within the target, or after
        # 10 * check_every epochs at the latest
        done, estimate_ok = gram_epochs(
            Q, h, w, penalty, est, target_gap, min_between, 10 * check_every,
            max_epochs - epochs, anderson, hist,
        )  # fmt: skip
        epochs += done
    return w, zc - z, db_total, SubproblemInfo(epochs, float(gap), time.perf_counter() - t0)
