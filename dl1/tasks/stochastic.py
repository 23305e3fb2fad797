"""The epochs of the sample-wise solvers on one partition's row blocks.

Every epoch visits the partition's blocks in a seeded random order and the rows of each in
a seeded random order, one block in memory at a time (out of core, each block is read when
its turn comes), and calls the solver's kernel on the block: lazy SGD / FoBoS
(:mod:`dl1.kernels.lazy`), l1-RDA (:mod:`dl1.kernels.rda`), SMIDAS
(:mod:`dl1.kernels.smidas`) or Prox-SDCA (:mod:`dl1.kernels.sdca`). Each returns what the
coordinator combines, and the progressive validation loss of its rows (the weighted sum of
each example's loss at the prediction made before its step). Before the first epoch, the
step calibration (:mod:`dl1.solvers.calibration`) runs the same epochs on a sample of the
partition's rows (:func:`calibration_task`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp

from dl1.kernels.lazy import FORM_CODES, lazy_pass, rows_loss
from dl1.kernels.rda import rda_pass, rda_state, rda_weights
from dl1.kernels.sdca import sdca_epoch
from dl1.kernels.smidas import smidas_pass
from dl1.tasks.rows import RowBlock, RowSource, loaded_rows


@dataclass
class Visit:
    """One block's turn in an epoch: the block, its rows in visiting order, its targets
    and sample weights (ones when there are none). Emptied when the turn ends, so that the
    block is freed before the next one is read."""

    block: RowBlock | None
    rows: np.ndarray | None
    y: np.ndarray | None
    sw: np.ndarray | None

    def release(self) -> None:
        self.block = self.rows = self.y = self.sw = None


def link_inverse(theta: np.ndarray, p: float) -> np.ndarray:
    """``w = f^-1(theta)``, Eq. (12): ``sign(theta) |theta|^(p-1) / ||theta||_p^(p-2)``,
    computed as ``N (|theta| / N)^(p-1)`` with ``N = ||theta||_p`` (no overflow at p ~ 30)."""
    a = np.abs(theta)
    M = a.max(initial=0.0)
    if M == 0.0:
        return np.zeros_like(theta)
    N = M * float(np.sum((a / M) ** p)) ** (1.0 / p)
    return np.sign(theta) * N * (a / N) ** (p - 1.0)


def link(w: np.ndarray, p: float) -> np.ndarray:
    """``theta = f(w)``, the inverse of :func:`link_inverse` (the gradient of
    ``||w||_q^2 / 2``, ``1/p + 1/q = 1``)."""
    q = p / (p - 1.0)
    a = np.abs(w)
    M = a.max(initial=0.0)
    if M == 0.0:
        return np.zeros_like(w)
    N = M * float(np.sum((a / M) ** q)) ** (1.0 / q)
    return np.sign(w) * N * (a / N) ** (q - 1.0)


def visits(
    blocks: list[RowBlock | RowSource], y: np.ndarray, sample_weight: np.ndarray,
    seed: int | None, n_passes: int = 1,
) -> Iterator[Visit]:  # fmt: skip
    """The blocks in a seeded random order, each read when its turn comes (out of core: one
    block in memory at a time), its rows shuffled (``n_passes`` shuffles in a row); with
    ``seed=None`` the blocks and rows in their stored order (data read as a stream)."""
    rng = None if seed is None else np.random.default_rng(seed)
    order = range(len(blocks)) if rng is None else rng.permutation(len(blocks))
    for k in order:
        blk = loaded_rows(blocks[k])
        sl = slice(blk.r0, blk.r0 + blk.n_rows)
        sw = np.ones(blk.n_rows) if sample_weight.shape[0] == 0 else sample_weight[sl]
        if rng is None:
            rows = np.tile(np.arange(blk.n_rows), n_passes)
        else:
            rows = np.concatenate([rng.permutation(blk.n_rows) for _ in range(n_passes)])
        visit = Visit(blk, rows.astype(np.int64), y[sl], sw)
        del blk, rows, sw
        yield visit
        visit.release()  # out of core: this block goes before the next one is read


# ---------------------------------------------------------------------- SGD / FoBoS
@dataclass(frozen=True)
class SGDSettings:
    """What one stochastic epoch needs besides the data and the model."""

    form: str
    loss: int  # the datafit's kernel code (dl1.kernels.codes)
    l1: float
    l2: float
    fit_intercept: bool
    eta0: float
    learning_rate: str
    decay: float
    gamma: float = 1.0


@dataclass(frozen=True)
class SGDOutput:
    """A partition's epoch: its model, its progressive loss, the steps taken and the
    kernel's seconds."""

    w: np.ndarray
    b: float
    progressive: float
    steps: int
    kernel_s: float
    block_losses: tuple = ()


def learning_rates(settings: SGDSettings, t0: int, T: int) -> np.ndarray:
    """``eta_t`` of steps ``t0 .. t0 + T - 1``: constant ``eta0``, ``eta0 / sqrt(1 + decay t)``
    (``invsqrt``) or ``eta0 / (1 + decay t)`` (``inverse``)."""
    t = np.arange(t0, t0 + T, dtype=np.float64)
    if settings.learning_rate == "constant":
        return np.full(T, settings.eta0)
    if settings.learning_rate == "invsqrt":
        return settings.eta0 / np.sqrt(1.0 + settings.decay * t)
    return settings.eta0 / (1.0 + settings.decay * t)


def sgd_epoch_task(
    blocks: list[RowBlock | RowSource],
    w: np.ndarray,
    b: float,
    y: np.ndarray,
    sample_weight: np.ndarray,
    settings: SGDSettings,
    t0: int,
    seed: int,
) -> SGDOutput:
    """One pass of lazy SGD / FoBoS over a partition's rows from ``(w, b)`` (O(nnz) per
    example; every weight current at the end of each block)."""
    w = np.array(w, dtype=np.float64)
    progressive, steps, kernel_s, by_block = 0.0, t0, 0.0, []
    for v in visits(blocks, y, sample_weight, seed):
        eta = learning_rates(settings, steps, v.rows.shape[0])
        tk = time.perf_counter()
        b, prog = lazy_pass(
            v.block.indptr, v.block.indices, v.block.data, v.y, v.sw, v.rows, eta, w, b,
            settings.fit_intercept, settings.l1, settings.l2, FORM_CODES[settings.form],
            settings.loss, settings.gamma,
        )  # fmt: skip
        kernel_s += time.perf_counter() - tk
        progressive += prog
        steps += v.rows.shape[0]
        by_block.append((v.block.i, prog / max(1, v.rows.shape[0])))
    return SGDOutput(w, float(b), float(progressive), steps - t0, kernel_s, tuple(by_block))


# ---------------------------------------------------------------------------- l1-RDA
@dataclass(frozen=True)
class RDASettings:
    """Xiao's parameters: ``beta_t = gamma sqrt(t)``, the sparsity-enhancing ``rho``, and
    the intercept's own ``gamma_b``."""

    loss: int  # the datafit's kernel code (dl1.kernels.codes)
    l1: float
    l2: float
    fit_intercept: bool
    gamma: float
    rho: float
    gamma_b: float
    smoothing: float = 1.0


@dataclass(frozen=True)
class RDAOutput:
    """A partition's epoch: the change of the gradient sums ``G`` and ``G_b``, the steps
    taken and the progressive loss."""

    dG: np.ndarray
    dGb: float
    steps: int
    progressive: float
    block_losses: tuple = ()


def rda_epoch_task(
    blocks: list[RowBlock | RowSource],
    G: np.ndarray,
    Gb: float,
    t: float,
    y: np.ndarray,
    sample_weight: np.ndarray,
    settings: RDASettings,
    seed: int,
) -> RDAOutput:
    """One pass of l1-RDA over a partition's rows from the pooled state ``(G, G_b, t)``
    (O(nnz) per example: a weight is computed from ``(G_j, t)`` when its feature appears)."""
    G0 = np.array(G, dtype=np.float64)
    Gk, Gbk, tk = G0.copy(), float(Gb), t
    w = np.empty_like(Gk)
    progressive, by_block = 0.0, []
    for v in visits(blocks, y, sample_weight, seed):
        Gbk, tk, _, prog = rda_pass(
            v.block.indptr, v.block.indices, v.block.data, v.y, v.sw, v.rows, Gk, Gbk, tk, w,
            settings.fit_intercept, settings.l1, settings.l2, settings.gamma, settings.rho,
            settings.gamma_b, settings.loss, settings.smoothing,
        )  # fmt: skip
        progressive += prog
        by_block.append((v.block.i, prog / max(1, v.rows.shape[0])))
    return RDAOutput(Gk - G0, Gbk - float(Gb), int(tk - t), float(progressive), tuple(by_block))


# ---------------------------------------------------------------------------- SMIDAS
@dataclass(frozen=True)
class SMIDASSettings:
    """The step ``eta`` (constant, as the paper's), ``p`` of the link and the penalty."""

    loss: int  # the datafit's kernel code (dl1.kernels.codes)
    l1: float
    fit_intercept: bool
    eta: float
    p: float
    smoothing: float = 1.0


@dataclass(frozen=True)
class SMIDASOutput:
    """A partition's epoch: its mirror variable ``theta``, intercept, steps and
    progressive loss."""

    theta: np.ndarray
    b: float
    steps: int
    progressive: float
    block_losses: tuple = ()


def smidas_epoch_task(
    blocks: list[RowBlock | RowSource],
    theta: np.ndarray,
    b: float,
    y: np.ndarray,
    sample_weight: np.ndarray,
    settings: SMIDASSettings,
    seed: int,
) -> SMIDASOutput:
    """One pass of SMIDAS over a partition's rows from ``(theta, b)``."""
    theta = np.array(theta, dtype=np.float64)
    w = np.empty_like(theta)
    progressive, steps, by_block = 0.0, 0, []
    for v in visits(blocks, y, sample_weight, seed):
        eta = np.full(v.rows.shape[0], settings.eta)
        b, prog = smidas_pass(
            v.block.indptr, v.block.indices, v.block.data, v.y, v.sw, v.rows, eta, theta, w,
            b, settings.fit_intercept, settings.l1, settings.p, settings.loss,
            settings.smoothing,
        )  # fmt: skip
        progressive += prog
        steps += v.rows.shape[0]
        by_block.append((v.block.i, prog / max(1, v.rows.shape[0])))
    return SMIDASOutput(theta, float(b), steps, float(progressive), tuple(by_block))


# ------------------------------------------------------------------------- Prox-SDCA
@dataclass(frozen=True)
class SDCASettings:
    """The penalty (``l2 > 0``: the ridge the dual needs), the CoCoA+ ``sigma'`` and the
    local passes per round."""

    loss: int  # the datafit's kernel code (dl1.kernels.codes)
    l1: float
    l2: float
    sigma_prime: float
    n_passes: int
    n: int
    smoothing: float = 1.0
    #: The intercept's feature value ``kappa`` (0: no intercept feature; the intercept
    #: ``b`` passed to the task is then held fixed)
    kappa: float = 0.0


@dataclass(frozen=True)
class SDCAOutput:
    """A partition's round: the dual changes of its blocks (first row, changes), the
    change of ``v`` and the progressive loss."""

    d_alpha: list[tuple[int, np.ndarray]]
    dv: np.ndarray
    progressive: float
    block_losses: tuple = ()
    #: change of the intercept feature's dual coordinate ``v_b``
    dvb: float = 0.0


def sdca_round_task(
    blocks: list[RowBlock | RowSource],
    alpha: np.ndarray,
    r_lo: int,
    v: np.ndarray,
    vb: float,
    b: float,
    y: np.ndarray,
    sample_weight: np.ndarray,
    settings: SDCASettings,
    seed: int,
) -> SDCAOutput:
    """Prox-SDCA's local passes on a partition's rows from the global ``(alpha, v, v_b)``
    (``alpha``: the partition's rows, from row ``r_lo``), predictions offset by ``b``
    (with ``settings.kappa > 0``, plus the intercept feature ``kappa v_b``). The blocks
    share one local subproblem (each starts where the previous left ``v + sigma' u``), so
    their changes add up to the partition's CoCoA+ update."""
    v0 = np.asarray(v, dtype=np.float64)
    dv = np.zeros_like(v0)
    dvb = 0.0
    d_alpha, progressive, by_block = [], 0.0, []
    s = settings
    for vis in visits(blocks, y, sample_weight, seed, n_passes=s.n_passes):
        r0, n_rows = vis.block.r0, vis.block.n_rows
        a = alpha[r0 - r_lo : r0 - r_lo + n_rows]
        da, u, ub, prog = sdca_epoch(
            vis.block.indptr, vis.block.indices, vis.block.data, vis.y, vis.sw, vis.rows, a,
            v0 + s.sigma_prime * dv, vb + s.sigma_prime * dvb, s.n, s.l1, s.l2,
            s.sigma_prime, s.kappa > 0.0, s.kappa, s.loss, s.smoothing, b,
        )  # fmt: skip
        d_alpha.append((r0, da))
        dv += u
        dvb += ub
        progressive += prog
        by_block.append((vis.block.i, prog / max(1, vis.rows.shape[0])))
    return SDCAOutput(d_alpha, dv, float(progressive), tuple(by_block), float(dvb))


# ------------------------------------------------------------------ step calibration
@dataclass(frozen=True)
class SGDTrial:
    """One SGD / FoBoS pass from ``(w, b)`` with ``eta0`` set to a candidate."""

    settings: SGDSettings
    w: np.ndarray
    b: float

    def run(self, block: RowBlock, y: np.ndarray, sw: np.ndarray, value: float, seed: int,
            n_rows: int) -> tuple[np.ndarray, float]:  # fmt: skip
        out = sgd_epoch_task([block], self.w, self.b, y, sw,
                             replace(self.settings, eta0=value), 0, seed)  # fmt: skip
        return out.w, out.b


@dataclass(frozen=True)
class RDATrial:
    """One l1-RDA pass with ``gamma`` set to a candidate, from the state whose weights are
    ``(w, b)`` after ``t`` steps (``t = 0``: from zero). The ``m`` sampled rows stand for
    the partition's ``n_rows``: the pass runs with ``gamma sqrt((t + n_rows) / (t + m))``,
    so that its last step is the epoch's, ``1 / (gamma sqrt(t + n_rows))`` (unscaled, the
    sample's first steps, ``1 / (gamma sqrt(k))`` for small ``k``, make it prefer large
    ``gamma``: measured, 4 to 8 times the best ``gamma`` after 50 epochs)."""

    settings: RDASettings
    w: np.ndarray
    b: float
    t: float

    def run(self, block: RowBlock, y: np.ndarray, sw: np.ndarray, value: float, seed: int,
            n_rows: int) -> tuple[np.ndarray, float]:  # fmt: skip
        scale = np.sqrt((self.t + n_rows) / (self.t + block.n_rows))
        st = replace(self.settings, gamma=value * scale)
        G, Gb = rda_state(self.w, self.b, self.t, st.l1, st.l2, st.gamma, st.rho, st.gamma_b)
        out = rda_epoch_task([block], G, Gb, self.t, y, sw, st, seed)
        return rda_weights(G + out.dG, self.t + out.steps, st.l1, st.l2, st.gamma, st.rho,
                           Gb + out.dGb, st.gamma_b)  # fmt: skip


@dataclass(frozen=True)
class SMIDASTrial:
    """One SMIDAS pass from ``(theta, b)`` with ``eta`` set to a candidate."""

    settings: SMIDASSettings
    theta: np.ndarray
    b: float

    def run(self, block: RowBlock, y: np.ndarray, sw: np.ndarray, value: float, seed: int,
            n_rows: int) -> tuple[np.ndarray, float]:  # fmt: skip
        out = smidas_epoch_task([block], self.theta, self.b, y, sw,
                                replace(self.settings, eta=value), seed)  # fmt: skip
        return link_inverse(out.theta, self.settings.p), out.b


@dataclass(frozen=True)
class CalibrationOutput:
    """A partition's part of a calibration: per candidate, ``sum sw * loss`` over its sample
    and the penalty of its model; the rows sampled."""

    losses: np.ndarray
    penalties: np.ndarray
    rows: int


def sample_rows(
    blocks: list[RowBlock | RowSource], y: np.ndarray, sample_weight: np.ndarray, m: int,
    rng: np.random.Generator, fraction: float = 0.5,
) -> tuple[RowBlock, np.ndarray, np.ndarray]:  # fmt: skip
    """``m`` rows drawn without replacement from the first blocks of a seeded order of the
    partition's blocks that hold at least ``max(m, fraction * rows)`` rows (out of core,
    at most that share of the data is read, plus one block), as one row block (first row
    0) with their targets and sample weights; only the blocks holding drawn rows are read."""
    sizes = np.array([blk.n_rows for blk in blocks], dtype=np.int64)
    order = rng.permutation(len(blocks))
    enough = max(m, fraction * sizes.sum())
    pool = order[: int(np.searchsorted(np.cumsum(sizes[order]), enough)) + 1]
    pool = np.sort(pool)
    starts = np.concatenate([[0], np.cumsum(sizes[pool])])
    picks = np.sort(rng.choice(int(starts[-1]), size=m, replace=False))
    mats, rows = [], []
    for k, i in enumerate(pool):
        local = picks[(picks >= starts[k]) & (picks < starts[k + 1])] - starts[k]
        if local.size:
            blk = loaded_rows(blocks[i])
            mats.append(sp.csr_matrix((blk.data, blk.indices, blk.indptr),
                                      shape=(blk.n_rows, blk.p))[local])  # fmt: skip
            rows.append(blk.r0 + local)
            del blk  # out of core: freed before the next block is read
    X = sp.vstack(mats, format="csr")
    r = np.concatenate(rows)
    sw = np.ones(m) if sample_weight.shape[0] == 0 else sample_weight[r]
    sq = np.asarray(X.multiply(X).sum(axis=1)).ravel()
    block = RowBlock(-1, 0, X.indptr.astype(np.int64), X.indices.astype(np.int32),
                     X.data.astype(np.float64), X.shape[1], float(sq.max(initial=0.0)))
    return block, y[r], sw


def calibration_task(
    blocks: list[RowBlock | RowSource], y: np.ndarray, sample_weight: np.ndarray, m: int,
    trial: SGDTrial | RDATrial | SMIDASTrial, candidates: list[float], seed: int,
    fraction: float = 0.5,
) -> CalibrationOutput:  # fmt: skip
    """One pass of ``trial`` over ``m`` sampled rows of the partition per candidate (the
    same rows, in the same order), each model's loss on the sample and its penalty: the
    partition's part of :func:`dl1.solvers.calibration.calibrate` (``fraction``: see
    :func:`sample_rows`). A diverging candidate gives inf or NaN."""
    block, ys, sw = sample_rows(blocks, y, sample_weight, m, np.random.default_rng(seed),
                                fraction)  # fmt: skip
    n_rows = sum(blk.n_rows for blk in blocks)
    st = trial.settings
    smoothing = st.gamma if isinstance(st, SGDSettings) else st.smoothing
    l2 = 0.0 if isinstance(st, SMIDASSettings) else st.l2
    losses, penalties = np.empty(len(candidates)), np.empty(len(candidates))
    with np.errstate(all="ignore"):  # a diverging candidate overflows: its objective is inf
        for k, value in enumerate(candidates):
            w, b = trial.run(block, ys, sw, value, seed, n_rows)
            losses[k] = rows_loss(block.indptr, block.indices, block.data, ys, sw, w, b,
                                  st.loss, smoothing)  # fmt: skip
            penalties[k] = st.l1 * np.abs(w).sum() + 0.5 * l2 * (w @ w)
    return CalibrationOutput(losses, penalties, block.n_rows)
