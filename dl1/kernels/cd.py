"""Block-local coordinate descent: the CoCoA+ subproblem of one column block.

The objective is ``P(w, b) = F(X w + b) + alpha_l1 ||w||_1 + alpha_l2 / 2 ||w||_2^2`` with
``F(z) = (1/n) sum_i s_i loss(y_i, z_i)`` and ``loss'' <= beta`` (Shalev-Shwartz & Tewari,
"Stochastic Methods for l1-regularized Loss Minimization", JMLR 2011, Eq. (7): ``beta = 1``
for the squared loss, ``beta = 1/4`` for the logistic loss).

Block ``k`` (columns ``X_k``) minimises, over its own coordinates, the local model at the
current ``z`` (gradient ``g = grad F(z)``)

    Q_k(dw) = g^T u + sigma * beta / (2 n) * sum_i s_i u_i^2 + sum_{j in k} pen(w_j + dw_j),
    u = X_k dw,

an upper bound of ``F`` along ``X_k`` once multiplied by ``sigma`` = the number of blocks whose
updates are added (CoCoA+ ``sigma'``). Coordinate ``j`` of ``Q_k`` has gradient
``x_j^T (g + sigma beta s * u / n)`` and curvature ``L_j = sigma beta ||x_j||_s^2 / n``; its
exact minimiser is the soft-thresholding step of Algorithm 1 of the paper with ``beta``
replaced by ``L_j`` and the elastic-net term added to the denominator.

With one block, ``sigma = 1`` and the squared loss (``beta = 1``) the model is exact and the
kernel is plain cyclic coordinate descent (scikit-learn's ``enet_coordinate_descent``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from dl1.kernels.linalg import bound_at


@njit(nogil=True, cache=True)
def soft_threshold(x, tau):
    """Scalar soft-thresholding ``sign(x) * max(|x| - tau, 0)``.

    Parameters
    ----------
    x : float
    tau : float
        Non-negative threshold.

    Returns
    -------
    float
    """
    if x > tau:
        return x - tau
    if x < -tau:
        return x + tau
    return 0.0


@njit(nogil=True, cache=True)
def penalised_step(x, lj, alpha_l1, alpha_l2, factors, j, bounds):  # pragma: no cover
    """The exact coordinate step ``argmin_v lj v^2 / 2 - x v + f_j (alpha_l1 |v| + alpha_l2
    v^2 / 2)`` over ``lower_j <= v <= upper_j``: ``soft_threshold(x, f_j alpha_l1) / (lj +
    f_j alpha_l2)`` clipped to the bounds (a one-dimensional convex problem: clipping its
    minimiser gives the constrained one). ``f_j = factors[j]`` (glmnet's
    ``penalty.factor``), 1 when ``factors`` is empty; ``bounds`` as
    :func:`dl1.kernels.linalg.bound_at` takes them (empty for none)."""
    f = factors[j] if factors.shape[0] > 0 else 1.0
    d = lj + f * alpha_l2
    if d <= 0.0:  # an empty unpenalised column: any value is optimal, keep 0
        return 0.0
    v = soft_threshold(x, f * alpha_l1) / d
    if bounds.shape[1] > 0:
        v = min(max(v, bound_at(bounds, 0, j)), bound_at(bounds, 1, j))
    return v


@njit(nogil=True, cache=True)
def _splitmix64(state):
    """One step of the SplitMix64 generator.

    Parameters
    ----------
    state : uint64

    Returns
    -------
    state : uint64
        Advanced state.
    value : uint64
        Uniform 64-bit output.
    """
    state = state + np.uint64(0x9E3779B97F4A7C15)
    x = state
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return state, x ^ (x >> np.uint64(31))


@njit(nogil=True, cache=True)
def shuffle_order(order, state):
    """Fisher-Yates shuffle of ``order`` in place; returns the advanced generator state."""
    for i in range(order.shape[0] - 1, 0, -1):
        state, r = _splitmix64(state)
        k = np.int64(r % np.uint64(i + 1))
        tmp = order[i]
        order[i] = order[k]
        order[k] = tmp
    return state


@njit(nogil=True, cache=True)
def cd_block_epochs(
    indptr,
    indices,
    data,
    col_scale,
    w,
    g,
    u,
    sw,
    col_sqnorm,
    sigma,
    beta,
    n,
    alpha_l1,
    alpha_l2,
    factors,
    bounds,
    n_epochs,
    random_order,
    seed,
    active,
    col_sum,
    shift,
):
    """Run ``n_epochs`` coordinate-descent epochs on the local subproblem of one block.

    Parameters
    ----------
    indptr : ndarray of int64, shape (ncols + 1,)
    indices : ndarray of int32, shape (nnz,)
    data : ndarray of float32 or float64, shape (nnz,)
        CSC arrays of the block ``X_k`` (all ``n`` rows, ``ncols`` columns).
    col_scale : ndarray of float64, shape (ncols,) or (0,)
        Column ``j`` is used as ``x_j * col_scale[j]``; empty for no scaling.
    w : ndarray of float64, shape (ncols,)
        Block coefficients, updated in place.
    g : ndarray of float64, shape (n,)
        ``grad F(z)`` at the start of the round: ``g_i = s_i loss'(y_i, z_i) / n``. Not modified.
    u : ndarray of float64, shape (n,)
        Accumulates ``X_k (w_new - w_old)`` in place; pass zeros at the start of a round.
    sw : ndarray of float64, shape (n,) or (0,)
        Sample weights ``s`` (the same ones folded into ``g``); empty for unit weights.
    col_sqnorm : ndarray of float64, shape (ncols,)
        ``||x_j||_s^2`` from :func:`dl1.kernels.linalg.csc_col_sqnorms` with the same
        ``col_scale`` and ``sw``.
    sigma : float
        CoCoA+ ``sigma'``: 1 for a single block, the number of blocks when their updates are
        added.
    beta : float
        Upper bound of ``loss''``: 1 (squared), 0.25 (logistic).
    n : float
        Number of samples (the ``1/n`` of ``F``).
    alpha_l1, alpha_l2 : float
        Penalty ``f_j (alpha_l1 |w_j| + alpha_l2 / 2 w_j^2)``.
    factors : ndarray of float64, shape (ncols,) or (0,)
        Per-column penalty factors ``f_j``; empty for 1 (:func:`penalised_step`).
    bounds : ndarray of float64, shape (2, ncols), (2, 1) or (2, 0)
        Lower and upper bounds of the coefficients (:func:`dl1.kernels.linalg.bound_at`);
        (2, 0) for none.
    n_epochs : int
        Passes over ``active``.
    random_order : bool
        False: visit ``active`` in the given order. True: a fresh uniformly random permutation
        of ``active`` every epoch (Fisher-Yates with a SplitMix64 generator private to the
        call, so the result depends only on ``seed``; vary it between rounds).
    seed : int
        Non-negative seed, used only when ``random_order``.
    active : ndarray of int64, shape (n_active,)
        Block-local column indices to visit (working set / screening survivors); pass
        ``np.arange(ncols)`` for all columns. Columns not listed keep their ``w_j``.
    col_sum : ndarray of float64, shape (ncols,) or (0,)
        Empty: the intercept is left alone. Otherwise ``sum_i s_i x_ij`` (unscaled) and the
        intercept is profiled out: every coordinate step is exact for the pair
        (``w_j``, intercept) of the quadratic model, with the centred curvature
        ``||x_j||_s^2 - (s^T x_j)^2 / sum(s)``, and is followed by the intercept shift that
        keeps ``sum_i d F / d z_i = 0`` (Friedman, Hastie & Tibshirani, J. Stat. Softw.
        2010, Sec. 2: coordinate descent on implicitly centred columns). Positive features
        (counts, tf-idf, log1p) are nearly collinear with the intercept, and alternating
        between them converges very slowly. Requires ``sum(g) = 0`` on entry (the intercept
        optimal for the model at the start).
    shift : ndarray of float64, shape (2,)
        ``shift[0]`` accumulates the intercept shift (``X w + b`` changes by
        ``u + shift[0]``); ``shift[1]`` is ``sum(s)`` (``n`` for unit weights). Ignored when
        ``col_sum`` is empty.

    Returns
    -------
    n_changed : int
        Number of coordinate updates that changed ``w_j``, over all epochs.
    max_dz : float
        ``max_j |dw_j| ||x_j||_s / sqrt(n)`` over all updates: the largest root-mean-square
        change of the linear predictor caused by one update (0.0 at a fixed point).

    Notes
    -----
    A column with ``col_sqnorm[j] == 0`` (empty, or only zero-weight rows) cannot change
    ``F``; its coefficient is set to 0, the minimiser of the penalty. The only allocation is a
    copy of ``active`` (the visiting order); the inner loops only read ``g``, ``sw`` and
    update ``u`` and ``w`` in place.
    """
    has_scale = col_scale.shape[0] > 0
    has_sw = sw.shape[0] > 0
    profile = col_sum.shape[0] > 0
    coef = sigma * beta / n
    order = active.copy()
    n_active = order.shape[0]
    state = np.uint64(seed)
    n_changed = 0
    max_dz = 0.0
    for _ in range(n_epochs):
        if random_order:
            state = shuffle_order(order, state)
        for t in range(n_active):
            j = order[t]
            w_old = w[j]
            sq = col_sqnorm[j]
            cj = col_scale[j] if has_scale else 1.0
            cs = col_sum[j] * cj if profile else 0.0
            if profile:
                # centred (the intercept absorbs the mean); constant columns, up to rounding, 0
                centred = sq - cs * cs / shift[1]
                sq = centred if centred > 1e-12 * sq else 0.0
            start = indptr[j]
            end = indptr[j + 1]
            if sq <= 0.0:
                # no effect on F (empty, or constant when centred): the penalty's minimiser
                if w_old == 0.0:
                    continue
                w_new = 0.0
            else:
                acc = 0.0
                if has_sw:
                    for k in range(start, end):
                        i = indices[k]
                        acc += data[k] * (g[i] + coef * sw[i] * u[i])
                else:
                    for k in range(start, end):
                        i = indices[k]
                        acc += data[k] * (g[i] + coef * u[i])
                grad = acc * cj
                if profile:
                    grad += coef * shift[0] * cs
                lj = coef * sq
                # Exact minimiser of grad*d + L_j d^2/2 + a1|w+d| + a2/2 (w+d)^2 (paper, Eq. (10)).
                w_new = penalised_step(lj * w_old - grad, lj, alpha_l1, alpha_l2, factors, j,
                                       bounds)  # fmt: skip
                if w_new == w_old:
                    continue
            w[j] = w_new
            n_changed += 1
            dw = w_new - w_old
            if sq > 0.0 or profile:
                step = dw * cj
                for k in range(start, end):
                    u[indices[k]] += data[k] * step
                if profile:
                    shift[0] -= dw * cs / shift[1]
            dz = abs(dw) * np.sqrt(sq / n)
            if dz > max_dz:
                max_dz = dz
    return n_changed, max_dz


@njit(nogil=True, cache=True)
def weighted_col_stats(indptr, indices, data, col_scale, h, lj, hx, hdata):
    """Per column ``lj[j] = sum_i h_i x_ij^2`` and ``hx[j] = sum_i h_i x_ij`` (columns
    scaled by ``col_scale``; empty for none): the curvatures of a diagonally weighted
    quadratic model and its coupling with the intercept; per nonzero ``hdata[k] = h_i x_ij``
    (unscaled, rounded to ``hdata``'s dtype; an empty ``hdata`` is left alone)."""
    has_scale = col_scale.shape[0] > 0
    keep = hdata.shape[0] > 0
    for j in range(indptr.shape[0] - 1):
        a2 = 0.0
        a1 = 0.0
        for k in range(indptr[j], indptr[j + 1]):
            x = np.float64(data[k])
            hxk = h[indices[k]] * x
            a1 += hxk
            a2 += hxk * x
            if keep:
                hdata[k] = hxk
        cj = col_scale[j] if has_scale else 1.0
        lj[j] = a2 * cj * cj
        hx[j] = a1 * cj


@njit(nogil=True, cache=True)
def weighted_cd_epochs(
    indptr, indices, data, col_scale, w, dw, r, hdata, lj, hx, floor, damping, reach, n,
    alpha_l1, alpha_l2, factors, bounds, shift, order, max_epochs, rtol, progress,
):  # fmt: skip
    """Cyclic coordinate descent on the proximal Newton model of a working set.

    Minimises over ``d`` (and an intercept step ``e`` when ``shift[1] > 0``)

        (1/n) (g^T v + v^T H v / 2 + sum_j E_j d_j^2 / 2) + sum_j pen(w_j + d_j),
        v = X d + e,   |d_j| <= reach_j,

    ``H = diag(h)``, ``pen(x) = alpha_l1 |x| + alpha_l2 x^2 / 2``. The intercept is profiled
    out as in :func:`cd_block_epochs`: with ``sum_i (g + H v)_i = 0`` kept, every step is exact
    for the pair (``d_j``, ``e``), with the centred curvature ``lj - hx^2 / sum(h)``.

    The model's per-sample gradient without the intercept step, ``r = g + H X d``, is kept in
    one vector: coordinate ``j``'s gradient is ``(x_j^T r + e hx_j) / n`` and a step
    ``delta`` adds ``delta H x_j`` (``hdata``, read in order) to ``r``. A coordinate's
    gradient then gathers one length-n vector, not three (``g``, ``h`` and ``X d``), and a
    step updates one: the gathers are the cost of an epoch, and their vectors' footprint
    against the cache decides it. ``hdata`` in float32 makes the model's Hessian ``X^T H X``
    exact to float32's rounding (a relative 6e-8), which leaves Newton's directions descent
    directions and its convergence to any target: the line search and the gap use the true
    objective.

    Parameters
    ----------
    indptr, indices, data, col_scale : the working set's CSC columns and their scaling.
    w : ndarray of float64, shape (m,)
        The point of the model (not modified).
    dw : ndarray of float64, shape (m,)
        The step ``d``, updated in place (pass zeros).
    r : ndarray of float64, shape (n,)
        ``n grad F`` at the point on entry (``d = 0``); ``g + H X d`` on return.
    hdata : ndarray of float32 or float64, shape (nnz,)
        ``h_i x_ij`` per nonzero (:func:`weighted_col_stats`), ``h = n diag(hess F)`` at the
        point.
    lj, hx : ndarray of float64, shape (m,)
        :func:`weighted_col_stats` of ``h``.
    floor : ndarray of float64, shape (m,)
        Least curvature of a coordinate (times ``n``), where ``h`` vanishes on a column (the
        squared hinge's inactive rows) or it is constant there when centred; a column with
        ``floor[j] = 0`` and no curvature is left alone.
    damping : ndarray of float64, shape (m,) or (0,)
        ``E``, the Levenberg-Marquardt term's curvature per column (times ``n``; empty for
        none), added to the floored curvature.
    reach : ndarray of float64, shape (m,) or (0,)
        The trust region's box on the step, ``|d_j| <= reach_j`` (empty for none): each
        coordinate's step is the model's exact minimiser on its interval (the model is
        convex in ``d_j``), so the box only stops a step short.
    n, alpha_l1, alpha_l2 : float
    factors, bounds : per-column penalty factors (empty for 1) and bounds (empty for none), as
        in :func:`cd_block_epochs`.
    shift : ndarray of float64, shape (2,)
        ``shift[0]`` the intercept step ``e`` (start with the one giving ``sum(g + h e) =
        0``); ``shift[1] = sum(h)``, or 0 to leave the intercept alone.
    order : ndarray of int64
        The columns an epoch visits, in order (all of them, or an active set).
    max_epochs : int
    rtol : float
        Stop once the model's remaining decrease is estimated at most ``rtol`` times its
        decrease so far: an epoch's steps decrease the model by about ``mv = sum_j L_j d_j^2
        / 2``; with the rate ``q`` of two epochs' ``mv`` (linear convergence), about
        ``mv q / (1 - q)`` remains.
    progress : ndarray of float64, shape (3,)
        The rule's state, carried between calls on one model (pass ``[inf, 0, 0]`` for a new
        one): the last epoch's ``mv``, their sum, and 1 once the rule has stopped.

    Returns
    -------
    int
        Epochs run.
    """
    has_scale = col_scale.shape[0] > 0
    damped = damping.shape[0] > 0
    boxed = reach.shape[0] > 0
    profile = shift[1] > 0.0
    epochs = 0
    prev = progress[0]
    total = progress[1]
    for _ in range(max_epochs):
        epochs += 1
        moved = 0.0
        for jj in range(order.shape[0]):
            j = order[jj]
            cj = col_scale[j] if has_scale else 1.0
            lc = lj[j]
            if profile:
                centred = lc - hx[j] * hx[j] / shift[1]
                lc = centred if centred > 1e-12 * lc else 0.0
            lc = max(lc, floor[j])
            if damped:
                lc += damping[j]
            if lc <= 0.0:
                continue
            start = indptr[j]
            end = indptr[j + 1]
            acc = 0.0
            for k in range(start, end):
                acc += data[k] * r[indices[k]]
            grad = acc * cj + shift[0] * hx[j]
            if damped:
                grad += damping[j] * dw[j]
            grad /= n
            curv = lc / n
            v_old = w[j] + dw[j]
            v_new = penalised_step(curv * v_old - grad, curv, alpha_l1, alpha_l2, factors, j,
                                   bounds)  # fmt: skip
            delta = v_new - v_old
            if boxed:
                delta = min(max(dw[j] + delta, -reach[j]), reach[j]) - dw[j]
            if delta == 0.0:
                continue
            dw[j] += delta
            step = delta * cj
            for k in range(start, end):
                r[indices[k]] += hdata[k] * step
            if profile:
                shift[0] -= delta * hx[j] / shift[1]
            moved += 0.5 * curv * delta * delta
        total += moved
        # 0 after the first epoch: no estimate yet; inf after an epoch that moved nothing
        # (an active set's last, before an epoch over every column)
        rate = moved / prev if prev > 0.0 else np.inf
        prev = moved
        if moved == 0.0 or (0.0 < rate < 1.0 and moved * rate <= rtol * total * (1.0 - rate)):
            progress[2] = 1.0
            break
    progress[0] = prev
    progress[1] = total
    return epochs
