"""Drawing the rows and labels of an E2006-like store, batch by batch, from its seed.

:func:`_make_plan` fixes everything that does not depend on the rows (the column
permutation, the true coefficients, the noise level or intercept from a pilot sample);
:func:`_batch` draws one batch of rows and labels from its own random stream, with the
numba kernels below. The model is described in :mod:`dl1.datasets.e2006`, its parameters
and probabilities are in :mod:`dl1.datasets.e2006_model`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
from numba import njit
from scipy.special import expit

from dl1.datasets.e2006_model import E2006Preset, _zipf_consts, draws_median

# Spawn keys of the independent random streams.
_TRAIN, _TEST, _PILOT, _GLOBAL = 0, 1, 2, 3
_SPLIT_IDS = {"train": _TRAIN, "test": _TEST}
# Counts below this are found by table look-up in :func:`_log1p_counts`.
_N_COUNT_TABLE = 64


# --------------------------------------------------------------------------- kernels
@njit(nogil=True, cache=True)
def _sample_rows(draws, u, perm, mode, c1, c2, e, shift, n_pass):  # pragma: no cover
    """CSR structure of rows whose ranks are drawn by inverse CDF from uniforms ``u``.

    Row ``i`` consumes ``draws[i]`` consecutive uniforms; ranks map to column ids through
    ``perm``; each row's ids are sorted (LSD radix sort, ``n_pass`` passes of ``shift`` bits,
    which must cover the bits of ``p - 1``) and duplicates merged.
    """
    n_rows = draws.shape[0]
    p = perm.shape[0]
    indptr = np.empty(n_rows + 1, dtype=np.int64)
    indices = np.empty(u.shape[0], dtype=np.int32)
    max_draws = 0
    for i in range(n_rows):
        max_draws = max(max_draws, draws[i])
    buf_a = np.empty(max_draws, dtype=np.int32)
    buf_b = np.empty(max_draws, dtype=np.int32)
    n_buckets = 1 << shift
    mask = n_buckets - 1
    hist = np.empty(n_buckets, dtype=np.int64)
    indptr[0] = 0
    k = 0
    pos = 0
    for i in range(n_rows):
        n_d = draws[i]
        for t in range(n_d):
            # inverse of F: mode 0 is a = 1 (c1 = s, c2 = log1p(p / s))
            if mode == 0:
                x = c1 * np.expm1(u[k + t] * c2)
            else:
                x = (c1 + u[k + t] * c2) ** e - c1**e
            r = int(x)
            if r >= p:
                r = p - 1
            elif r < 0:
                r = 0
            buf_a[t] = perm[r]
        k += n_d
        src = buf_a
        dst = buf_b
        for ps in range(n_pass):
            sh = ps * shift
            hist[:] = 0
            for t in range(n_d):
                hist[(src[t] >> sh) & mask] += 1
            acc = 0
            for b in range(n_buckets):
                h = hist[b]
                hist[b] = acc
                acc += h
            for t in range(n_d):
                v = src[t]
                d = (v >> sh) & mask
                dst[hist[d]] = v
                hist[d] += 1
            src, dst = dst, src
        last = -1
        for t in range(n_d):
            c = src[t]
            if c != last:
                indices[pos] = c
                pos += 1
                last = c
        indptr[i + 1] = pos
    return indptr, indices[:pos].copy()


@njit(nogil=True, cache=True)
def _log1p_counts(u, thresholds, log1p_table, inv_tail, out):  # pragma: no cover - compiled
    """``out = log1p(c)``, ``c = floor(u^-inv_tail)`` for ``u`` in (0, 1]: discrete Pareto counts.

    ``c >= j`` iff ``u <= j^-tail``, so small counts are found by comparing ``u`` with
    ``thresholds[j] = (j + 1)^-tail`` (no ``pow``); ``log1p_table[j] = log1p(j)``.
    """
    n_tab = thresholds.shape[0]
    for k in range(u.shape[0]):
        x = u[k]
        c = 1
        while c < n_tab and x <= thresholds[c]:
            c += 1
        if c == n_tab:
            out[k] = np.log1p(np.floor(x ** (-inv_tail)))
        else:
            out[k] = log1p_table[c]


# ------------------------------------------------------------------------ generation
@dataclass
class _Plan:
    pr: E2006Preset
    seed: int
    task: str
    dtype: np.dtype
    median: float
    perm: np.ndarray
    coef: np.ndarray  # dense, length p, or (p, K) for task "multiclass" (float64)
    zipf: tuple[int, float, float, float]
    radix: tuple[int, int]
    thresholds: np.ndarray
    log1p_table: np.ndarray
    noise_sigma: float = 0.0
    intercept: float | np.ndarray = 0.0  # (K,) for task "multiclass"
    pilot: dict[str, Any] = dataclasses.field(default_factory=dict)
    n_classes: int = 0  # K, task "multiclass" only


def _batch_rows(plan: _Plan, split_id: int, b: int):
    """Batch ``b`` of a split: ``(data, indices, indptr, xw, rng)`` for ``batch_rows`` rows.

    ``rng`` is left positioned after the rows, for drawing the noise of the labels.
    """
    pr = plan.pr
    rng = np.random.default_rng(np.random.SeedSequence(plan.seed, spawn_key=(split_id, b)))
    z = rng.standard_normal(pr.batch_rows)
    draws = np.maximum(1.0, np.rint(plan.median * np.exp(pr.row_sigma * z))).astype(np.int64)
    u = rng.random(int(draws.sum()))
    indptr, indices = _sample_rows(draws, u, plan.perm, *plan.zipf, *plan.radix)
    del u
    data = np.empty(indices.shape[0], dtype=np.float64)
    u = 1.0 - rng.random(indices.shape[0])
    _log1p_counts(u, plan.thresholds, plan.log1p_table, 1.0 / pr.count_tail, data)
    data = data.astype(plan.dtype, copy=False)
    X = sp.csr_matrix((data, indices, indptr), shape=(pr.batch_rows, pr.n_features))
    xw = X @ plan.coef  # from the stored (possibly float32) values
    return data, indices, indptr, xw, rng


def _labels(plan: _Plan, xw: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    if plan.task == "regression":
        return xw + plan.noise_sigma * rng.standard_normal(xw.shape[0])
    if plan.task == "multiclass":
        # Gumbel-max: argmax_k (t_k + G_k), G_k iid standard Gumbel, is class k with
        # probability softmax(t)_k (Gumbel 1954; e.g. Maddison et al. 2014, sec. 2)
        t = xw + plan.intercept + rng.gumbel(size=xw.shape)
        return np.argmax(t, axis=1).astype(np.float64)
    t = xw + plan.intercept + rng.logistic(size=xw.shape[0])
    return np.where(t > 0, 1.0, -1.0)


def _batch(plan: _Plan, split_id: int, b: int, n_keep: int):
    """The first ``n_keep`` rows of batch ``b``: ``((data, indices, indptr), y)``."""
    data, indices, indptr, xw, rng = _batch_rows(plan, split_id, b)
    y = _labels(plan, xw, rng)[:n_keep]
    end = int(indptr[n_keep])
    return (data[:end], indices[:end], indptr[: n_keep + 1]), y


def _make_plan(
    pr: E2006Preset, seed: int, task: str, snr: float, dtype: np.dtype, n_classes: int = 0
) -> _Plan:
    p = pr.n_features
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(_GLOBAL,)))
    perm = rng.permutation(p).astype(np.int32)
    n_inf = min(pr.n_informative, p)
    ranks = np.zeros(0, dtype=np.int64)
    while ranks.shape[0] < n_inf:
        # log-uniform ranks: rank + 1 = floor((p + 1)^U), kept in draw order, distinct
        new = np.floor(np.exp(rng.random(n_inf) * math.log(p + 1.0))).astype(np.int64) - 1
        new = np.clip(new, 0, p - 1)
        allr = np.concatenate([ranks, new])
        _, first = np.unique(allr, return_index=True)
        ranks = allr[np.sort(first)][:n_inf]
    values = rng.choice([-1.0, 1.0], size=n_inf) * rng.uniform(0.5, 1.5, size=n_inf)
    if task == "multiclass":  # each informative feature is one class's (drawn after the rest)
        coef = np.zeros((p, n_classes), dtype=np.float64)
        coef[perm[ranks], rng.integers(n_classes, size=n_inf)] = values
    else:
        coef = np.zeros(p, dtype=np.float64)
        coef[perm[ranks]] = values
    nbits = max(1, int(p - 1).bit_length())
    n_pass = -(-nbits // 12)
    table = np.arange(_N_COUNT_TABLE, dtype=np.float64)
    plan = _Plan(
        pr,
        seed,
        task,
        dtype,
        draws_median(pr),
        perm,
        coef,
        _zipf_consts(pr),
        radix=(-(-nbits // n_pass), n_pass),
        thresholds=(table + 1.0) ** -pr.count_tail,
        log1p_table=np.log1p(table),
        n_classes=n_classes,
    )
    # pilot: var and median of X w* over pilot_rows rows of an independent stream
    n_pb = max(1, -(-pr.pilot_rows // pr.batch_rows))
    xw = np.concatenate([_batch_rows(plan, _PILOT, b)[3] for b in range(n_pb)])
    xw = xw[: max(pr.pilot_rows, 2)]
    var = float(np.mean(np.var(xw, axis=0, ddof=1)))  # multiclass: the classes' mean
    if not var > 0:
        raise ValueError("the pilot sample has var(X w*) = 0; cannot set the noise level")
    median = np.median(xw, axis=0)
    plan.pilot = {"rows": int(xw.shape[0]), "var_xw": var, "median_xw": median.tolist()}
    if task == "multiclass":
        # the mean variance of a class's logit snr times the Gumbel noise's, pi^2 / 6; each
        # logit centred at its median, so that no class dominates
        scale = math.sqrt(snr * math.pi**2 / 6.0 / var)
        plan.coef *= scale
        plan.intercept = -scale * median
    elif task == "regression":
        plan.noise_sigma = math.sqrt(var / snr)
    else:
        scale = math.sqrt(snr * math.pi**2 / 3.0 / var)
        plan.coef *= scale
        plan.intercept = _intercept(scale * xw, pr.positive_fraction)
    return plan


def _intercept(logits: np.ndarray, positive_fraction: float) -> float:
    """``b`` with ``mean(sigmoid(logits + b)) = positive_fraction`` (``-median`` for 1/2)."""
    if positive_fraction == 0.5:
        return -float(np.median(logits))
    # local: scipy.optimize takes about a second to import, which `dl1 --help` would pay
    from scipy.optimize import brentq

    lo, hi = -float(logits.max()) - 50.0, -float(logits.min()) + 50.0
    return float(brentq(lambda b: expit(logits + b).mean() - positive_fraction, lo, hi))
