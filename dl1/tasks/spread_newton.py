"""A proximal Newton step of a working-set subproblem spread over the partitions holding its
columns (out of core), for the smooth losses: the shares of the working set minimise the
quadratic model of the loss in turn, each over its own columns where they are cached, and
the coordinator searches along the joined step.

After d-GLMNET (Trofimov and Genkin, "Distributed coordinate descent for L1-regularized
logistic regression", AIST 2015; "Distributed coordinate descent for generalized linear
models with regularization", Pattern Recognit. Image Anal. 2017), whose blocks minimise the
model independently (its Hessian ``X_W^T diag(h) X_W`` block-diagonal): here each share
sees the ``X d`` of the shares before it, one block Gauss-Seidel sweep of the model, and
the line search on the true objective makes the step a descent step, as in Tseng and Yun's
block coordinate gradient descent (Math. Program. 2009). Each share runs the gathered
solver's model minimisation (:func:`dl1.tasks.prox_newton.minimise_model`), its intercept
step profiled out as there, on its own columns, joined on its worker.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from dl1.kernels.cd import weighted_col_stats
from dl1.kernels.linalg import csc_matvec
from dl1.tasks.columns import gather_columns
from dl1.tasks.prox_newton import (
    CURVATURE_FLOOR,
    MAX_INNER,
    NO_DAMPING,
    Columns,
    Model,
    minimise_model,
    model_shift,
)
from dl1.tasks.records import ColumnGroup, SpreadNewtonOutput
from dl1.tasks.spread import restricted_gap_stats


def newton_share_task(
    extracts: list[ColumnGroup],
    extract_ids: list[np.ndarray],
    keeps: list[np.ndarray],
    w_share: np.ndarray,
    g: np.ndarray,
    h: np.ndarray,
    theta: np.ndarray,
    threshold: float,
    penalty: Any,
    curvature: float,
    max_epochs: int,
    intercept: bool,
    before: SpreadNewtonOutput | None = None,
    own: SpreadNewtonOutput | None = None,
) -> SpreadNewtonOutput:
    """One visit of a share to a spread Newton step, on its cached column groups.

    The shares visit the step one after another (``before``, the previous visit's
    output), in several sweeps (``own``, this share's output of the sweep before): each
    visit minimises the model over the share's columns given the step so far, whose
    ``X d`` moves the model's gradient to ``g + h X d`` (block Gauss-Seidel on the
    model, where d-GLMNET's independent blocks are block Jacobi). A few epochs a visit
    and several sweeps, not one long visit each: on correlated columns blocks solved
    in turn converge slowly, coordinates interleaved fast (see ``docs/design.md``).

    Parameters
    ----------
    extracts, extract_ids, keeps : the share's cached groups, their feature ids and the
        positions of their live columns.
    w_share : the live columns' coefficients, in group order.
    g, h : ``n grad F`` and ``n diag(hess F)`` at the point (length n).
    theta : the dual point at the point, for the restricted gap's statistics.
    threshold : ``n alpha_l1``.
    penalty : the (uniform) penalty.
    curvature : ``beta``, the loss's curvature bound, for the columns' curvature floor.
    max_epochs : epochs of the model at most (0: the statistics only).
    intercept : whether the model has an intercept step. It is profiled out of the share's
        coordinate steps, as in the gathered mode; without it every share's columns, all
        of one sign in text, would stand in for the intercept, and the steps zig-zag
        against the coordinator's exact intercept refits.
    before : the previous visit's output, or None for the step's first.
    own : this share's output of the previous sweep, or None in the first: the visit
        goes on from its step (its statistics are kept, not computed again).

    Returns
    -------
    SpreadNewtonOutput
        ``dw`` is the share's step over all its visits so far; ``u`` is ``X d`` of the
        whole step so far, this visit's included.
    """
    t0 = time.perf_counter()
    if own is None:
        stats = restricted_gap_stats(extracts, keeps, theta, threshold)
    else:
        stats, w_share = own.stats, w_share + own.dw
    wanted = np.concatenate([ids[np.asarray(k, dtype=np.int64)]
                             for ids, k in zip(extract_ids, keeps, strict=True)])  # fmt: skip
    cols = Columns(*gather_columns(extracts, extract_ids, wanted))
    m, n = wanted.shape[0], g.shape[0]
    dw, u = np.zeros(m), np.zeros(n)
    epochs = 0
    if before is not None and max_epochs > 0:
        g = g + h * before.u  # the model's gradient after the step so far
    if max_epochs > 0 and m:
        lj, hx = np.empty(m), np.empty(m)
        hdata = np.empty(cols.indices.shape[0], dtype=np.float32)  # see weighted_cd_epochs
        weighted_col_stats(cols.indptr, cols.indices, cols.data, cols.scale, h, lj, hx, hdata)
        floor = CURVATURE_FLOOR * curvature * cols.sqnorm
        shift = np.zeros(2)  # the coordinator takes its own intercept step for the step
        model_shift(g, h, intercept, shift)
        model = Model(g, h, hdata, lj, hx, floor, shift, NO_DAMPING)
        r, scratch = g.copy(), np.empty(n)
        w = np.ascontiguousarray(w_share, dtype=np.float64)
        epochs = minimise_model(cols, w, model, penalty, dw, r, u, scratch,
                                min(MAX_INNER, max_epochs))  # fmt: skip
        u[:] = 0.0
        csc_matvec(cols.indptr, cols.indices, cols.data, cols.scale, dw, u)
    if before is not None:
        u += before.u
    if own is not None:
        dw += own.dw
        epochs += own.epochs
    return SpreadNewtonOutput(dw, u, stats, epochs, time.perf_counter() - t0)
