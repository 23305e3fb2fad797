"""Gram matrices of working sets, cached by the worker process between rounds and alphas,
and the covariance-update epochs on them."""

from __future__ import annotations

import contextvars
from collections import OrderedDict

import numpy as np

from dl1.cancellation import check_cancelled
from dl1.kernels.gram import (
    csc_cross_gram,
    csc_dense_rows,
    gram_cd_epochs,
    gram_matvec,
    take_submatrix,
)
from dl1.kernels.vectors import dual_sums
from dl1.objective.gap import dual_from_stats
from dl1.tasks.anderson import anderson_point

#: Elements (rows x columns) of the scratch that densifies a batch of working-set columns
#: while their Gram rows are formed (in memory; out of core :func:`dl1.loading.dense_max` is less).
GRAM_DENSE_MAX = 1 << 25

#: Largest working set solved by covariance updates on its Gram matrix (256 MiB in float32);
#: beyond it (or for the logistic loss) the subproblem runs coordinate descent on the columns.
GRAM_MAX = 8192

#: Storage of the Gram matrices. The covariance-update epochs read a row of it per changed
#: coordinate, so they are bound by memory bandwidth: float32 halves that traffic (and the
#: memory). The certificate does not use it: every gap check recomputes ``X_W^T theta``
#: exactly from the columns, and the exact optimum is a fixed point of the epochs whatever
#: the rounding of ``Q`` (a step from it is zero), so the rounding only perturbs the steps.
GRAM_DTYPE = np.float32

#: Gram matrices of the last working sets, per solve (a key drawn by the coordinator), kept
#: by the worker process between rounds: consecutive working sets share most columns, so
#: only the rows of new columns are computed. Purely a cache: an entry agrees with a fresh
#: computation to rounding (BLAS may sum a product's entry in an order that depends on the
#: product's shape), which is why a checkpointed path starts each alpha's Gram matrix afresh,
#: as its resumed run must.
GRAM_CACHE: OrderedDict[str, tuple[np.ndarray, np.ndarray]] = OrderedDict()
GRAM_CACHE_ENTRIES = 2


class GramGapEstimate:
    """The restricted duality gap at ``w``, from Gram-matrix quantities only (squared loss).

    At an exact check point ``w0`` (residual ``r0 = y - z``, intercept refitted, ``theta =
    S r0``, ``h0 = X_W^T theta``), moving to ``w = w0 + d`` with the intercept profiled
    changes the residual by ``-P X_W d`` (``P`` the weighted centring), so, with ``h`` the
    epochs' running ``X_W^T theta / n``:

    * ``sum_i s_i r_i^2 = A0 - d . (h0 + n h)``,
    * ``sum_i s_i r_i y_i = B0 - d . X_W^T S (y - mean_s(y))``,

    which give the primal value and, through :func:`dl1.objective.gap.dual_from_stats`, the
    dual value
    that :func:`dl1.objective.gap.duality_gap_from_stats` would compute. ``h`` carries the epochs'
    rounding (float32 ``Q``), so this only decides when to compute the exact gap, never
    certifies.
    """

    def __init__(self, datafit, penalty, y, z, theta, h0, w0, s, g_y):
        self.n = y.shape[0]
        self.penalty = penalty
        self.a0 = 2.0 * self.n * datafit.value(y, z, s)
        self.b0 = dual_sums(y, theta, np.zeros(0))[1]  # theta . y, without BLAS threads
        self.h0 = h0.copy()
        self.w0 = w0.copy()
        self.g_y = g_y

    def gap(self, w: np.ndarray, h: np.ndarray) -> float:
        n, pen = self.n, self.penalty
        d = w - self.w0
        xt = n * h
        a = self.a0 - float(d @ (self.h0 + xt))
        b = self.b0 - float(d @ self.g_y)
        primal = 0.5 * a / n + pen.value(w)
        # F*(-c theta / n) for theta = S r: (c^2 sum s r^2 / 2 - c sum s r y) / n
        dual = dual_from_stats(
            pen, lambda c: (0.5 * c * c * a - c * b) / n, *pen.xt_theta_stats(xt, n), n,
            box=pen.box_conjugate(xt, n),
        )
        return primal - dual


def gram_epochs(
    Q: np.ndarray,
    h: np.ndarray,
    w: np.ndarray,
    penalty,
    est: GramGapEstimate,
    target_gap: float,
    min_between: int,
    max_between: int,
    max_epochs: int,
    anderson: int,
    hist: list[np.ndarray] | None = None,
) -> tuple[int, bool]:
    """Covariance-update epochs (``w`` and ``h = -grad F`` updated in place) with Anderson
    extrapolation every ``anderson + 1`` epochs (kept if it lowers the objective, computed
    exactly from ``Q``), until the gap estimate ``est`` falls within ``target_gap`` (tested
    from the ``min_between``-th epoch), ``max_between`` epochs, or ``max_epochs``. ``hist``
    carries the extrapolation's iterates across calls. Returns the epochs run and whether
    the estimate stopped them."""
    a1, a2 = penalty.alpha_l1, penalty.alpha_l2
    hist = [] if hist is None else hist
    qd = np.empty(w.shape[0])
    epochs = 0
    for since in range(1, max_between + 1):
        if epochs >= max_epochs:
            break
        check_cancelled("Gram subproblem", epochs)
        gram_cd_epochs(Q, h, w, a1, a2, penalty.factors, penalty.bounds, 1)
        epochs += 1
        hist.append(w.copy())
        if len(hist) == anderson + 1:
            ext = anderson_point(np.asarray(hist))
            if ext is not None:
                d = ext - w
                # F(w + d) - F(w) = -h.d + d.Q.d / 2 (exact: F is quadratic)
                gram_matvec(Q, d, qd)
                delta = -h @ d + 0.5 * d @ qd + penalty.value(w + d) - penalty.value(w)
                if delta < 0:
                    w += d
                    h -= qd
            hist.clear()
        if epochs >= max_epochs:
            break
        if since >= min_between and est.gap(w, h) <= target_gap:
            return epochs, True
    return epochs, False


#: The memory limit of the worker whose partition server runs in this thread
#: (:class:`dl1.runtime.partition_server.PartitionServer`): ``get_worker`` answers in tasks only.
SERVER_MEMORY_LIMIT: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "dl1_server_memory_limit", default=None
)


def gram_limit() -> int:
    """Largest Gram matrix this process may hold: a worker with a ``memory_limit`` keeps its
    m x m matrices (two cached entries, the one being built, temporaries) within a quarter of
    the limit; without a limit (in process), no bound besides ``gram_max``."""
    limit = SERVER_MEMORY_LIMIT.get()
    if limit is None:
        try:
            # local: distributed (~0.3 s to import), loaded in a worker, not by import dl1.tasks
            from distributed import get_worker

            limit = get_worker().memory_manager.memory_limit
        except (ImportError, ValueError, AttributeError):
            return GRAM_MAX
    if not limit:
        return GRAM_MAX
    return int(np.sqrt(limit / (4 * 4 * np.dtype(GRAM_DTYPE).itemsize)))


def drop_gram(prefix: str) -> None:
    """Forget the Gram matrices cached under keys starting with ``prefix`` (end of a solve)."""
    for key in [k for k in GRAM_CACHE if k.startswith(prefix)]:
        del GRAM_CACHE[key]


def working_set_gram(
    indptr: np.ndarray,
    indices: np.ndarray,
    vals: np.ndarray,
    n: int,
    s: np.ndarray,
    ws: np.ndarray,
    key: str | None,
    scratch_max: int,
    factor: float = 1.0,
    c: np.ndarray | None = None,
) -> np.ndarray:
    """``factor * X_W^T S X_W - c c^T`` of the working set ``ws`` (sorted global ids of the
    columns given by the CSC arrays, values already scaled; ``c`` a per-column vector, e.g.
    the intercept's profile), reusing the entries of columns cached under ``key`` by the
    previous call: only the rows and columns of new columns are computed (an entry depends
    on its two columns only; the caller keeps ``factor`` and ``c``'s rule fixed per key).

    Dense enough working sets go through BLAS on row blocks densified in a scratch of at
    most ``scratch_max`` elements (rows x columns); sparse ones through a sparse product.
    Either way the result is a deterministic function of the inputs and the cache. The
    result, of :data:`GRAM_DTYPE` (entries formed in float64, then rounded), is cached under
    ``key`` (replacing the previous entry) and must not be modified by the caller.
    """
    m = ws.shape[0]
    hit = GRAM_CACHE.pop(key, None) if key is not None else None
    if hit is not None and np.array_equal(hit[0], ws):  # the same working set again
        GRAM_CACHE[key] = hit
        return hit[1]
    G = np.empty((m, m), dtype=GRAM_DTYPE)
    if hit is not None:
        old_ids, old_G = hit
        del hit
        kpos = np.flatnonzero(np.isin(ws, old_ids, assume_unique=True))
        opos = np.searchsorted(old_ids, ws[kpos])
        take_submatrix(old_G, opos, G, kpos)
        del old_G
        new = np.setdiff1d(np.arange(m), kpos, assume_unique=True)
    else:
        new = np.arange(m, dtype=np.int64)
    if new.shape[0]:
        # the rows of the new columns: X_new^T S X (k x m), then scaled and profiled
        part_t = _new_rows(indptr, indices, vals, n, s, new, scratch_max)
        if factor != 1.0:
            part_t *= factor
        if c is not None:
            part_t -= np.outer(c[new], c)
        G[:, new] = part_t.T
        G[new, :] = part_t  # last: entry (a, b) of the new block is sum x_b (s x_a) either way
    if key is not None:
        GRAM_CACHE[key] = (ws.copy(), G)
        while len(GRAM_CACHE) > GRAM_CACHE_ENTRIES:
            GRAM_CACHE.popitem(last=False)
    return G


def _new_rows(
    indptr: np.ndarray,
    indices: np.ndarray,
    vals: np.ndarray,
    n: int,
    s: np.ndarray,
    new: np.ndarray,
    scratch_max: int,
) -> np.ndarray:
    """``X_new^T S X`` (``len(new) x m``, float64) of the working set's CSC columns, ``new``
    the positions of its new columns (:func:`working_set_gram`): by BLAS on row blocks when
    the columns are dense enough, else by the sparse product
    :func:`dl1.kernels.gram.csc_cross_gram`."""
    m, k = indptr.shape[0] - 1, new.shape[0]
    nnz_new = int(np.diff(indptr)[new].sum())
    if indices.shape[0] / (n * m) * nnz_new / (n * k) <= 0.01:
        part_t = np.zeros((k, m))
        csc_cross_gram(indptr, indices, vals, n, new.astype(np.int64), s, part_t)
        return part_t
    # the products of dense-enough columns are far cheaper through BLAS
    rows = int(max(1, min(n, scratch_max // m)))
    cursor = indptr[:-1].copy()
    part = np.zeros((m, k))
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        chunk = np.zeros((m, r1 - r0))  # column i's rows r0..r1 in chunk[i]
        csc_dense_rows(indptr, indices, vals, cursor, r1, chunk)
        # a copy even when every column is new: NumPy would take chunk @ chunk.T as a
        # SYRK, whose rounding differs from the GEMM of later, partly cached calls
        right = chunk[new]
        if s.shape[0] > 0:
            right *= s[None, r0:r1]
        part += chunk @ right.T
        del chunk, right
    return part.T
