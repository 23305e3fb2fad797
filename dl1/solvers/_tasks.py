"""Worker-side tasks of the distributed coordinate-descent solver.

Plain functions of arrays (picklable by reference), run by Dask workers or in-process. The
numba kernels they call live in :mod:`dl1.kernels`; nothing here knows about the coordinator.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dl1.errors import ValidationError
from dl1.kernels.cd import cd_block_epochs
from dl1.kernels.linalg import csc_col_sqnorms, csc_xt_theta_stats
from dl1.store import _kernels as SK


@dataclass
class Block:
    """A feature block held in worker memory: CSC arrays and per-column constants."""

    j: int
    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    col_scale: np.ndarray  # empty: no scaling
    col_sqnorm: np.ndarray  # ||x_j * col_scale_j||_s^2
    n: int

    @property
    def ncols(self) -> int:
        return self.indptr.shape[0] - 1

    @property
    def nbytes(self) -> int:
        return self.indptr.nbytes + self.indices.nbytes + self.data.nbytes


def _to_csc(chunk) -> sp.csc_matrix:
    if sp.issparse(chunk):
        m = chunk
    elif hasattr(chunk, "to_scipy_sparse"):  # pydata sparse
        m = chunk.to_scipy_sparse()
    else:
        m = np.asarray(chunk)
        if m.ndim != 2:
            raise ValidationError(f"a chunk of X has {m.ndim} dimensions, expected 2")
        m = sp.csc_matrix(m)
    return sp.csc_matrix(m)


def assemble_block(
    j: int,
    c0: int,
    sw: np.ndarray,
    standardize: bool,
    center: bool,
    *row_chunks,
) -> Block:
    """Stack the row chunks of feature block ``j`` into one validated CSC block.

    Validation (index pointer, indices in range, sorted unique, finite values) happens here,
    before any kernel sees the arrays. With ``standardize``, ``col_scale`` is
    ``1 / std_j`` (weighted; centred when ``center``, i.e. with an intercept, else the root
    mean square); constant columns get scale 0 and stay out of the model.
    """
    mats = [_to_csc(c) for c in row_chunks]
    m = mats[0] if len(mats) == 1 else sp.vstack(mats, format="csc")
    if m.dtype not in (np.float32, np.float64):
        raise ValidationError(
            f"feature block {j} has dtype {m.dtype}; X must be float32 or float64"
        )
    if not m.has_canonical_format:
        m = m.copy()
        m.sum_duplicates()
    indptr = m.indptr.astype(np.int64)
    indices = m.indices.astype(np.int32)
    status, c, k = SK.check_compressed(indptr, indices, m.data, m.shape[0])
    if status != SK.OK:
        raise ValidationError(f"feature block {j}, column {c0 + c}: {SK.PROBLEMS[status]}")
    n = m.shape[0]
    scale = np.zeros(0)
    if standardize:
        wts = np.ones(n) if sw.shape[0] == 0 else sw
        mw = sp.csc_matrix((m.data.astype(np.float64), indices, indptr), shape=m.shape)
        mean = np.asarray(mw.T @ wts).ravel() / n
        sq = np.asarray(mw.multiply(mw).T @ wts).ravel() / n
        var = sq - mean**2 if center else sq
        std = np.sqrt(np.maximum(var, 0.0))
        scale = np.where(
            std > 1e-12 * np.sqrt(np.maximum(sq, 1e-300)), 1.0 / np.where(std > 0, std, 1.0), 0.0
        )
    sqn = csc_col_sqnorms(indptr, indices, m.data, scale, sw)
    return Block(j, indptr, indices, m.data, scale, sqn, n)


def block_info(block: Block) -> tuple[int, int, int]:
    """(columns, nonzeros, bytes) of a loaded block."""
    return block.ncols, int(block.indices.shape[0]), block.nbytes


def xt_theta_task(blocks: list[Block], theta: np.ndarray, threshold: float):
    """Per-block ``(||X_k^T theta||_inf, sum_j (|x_j^T theta| - threshold)_+^2)``."""
    return [
        csc_xt_theta_stats(b.indptr, b.indices, b.data, b.col_scale, theta, threshold)
        for b in blocks
    ]


def round_task(
    blocks: list[Block],
    w_parts: list[tuple[np.ndarray, np.ndarray]],
    g: np.ndarray,
    theta: np.ndarray,
    sw: np.ndarray,
    sigma: float,
    beta: float,
    alpha_l1: float,
    alpha_l2: float,
    n_epochs: int,
    random_order: bool,
    seed: int,
    threshold: float,
    with_stats: bool,
):
    """One round on a partition (a list of blocks sharing one local model).

    First the gap statistics of ``X_k^T theta`` at the start point (when ``with_stats``),
    then ``n_epochs`` epochs of the CoCoA+ local subproblem over the partition's blocks in
    order, all accumulating into one ``u = X_part dw`` (exact within the partition).

    Returns
    -------
    w_new : list of (indices, values) of the nonzero coefficients of each block.
    u : ndarray (n,), the partition's change of ``X w``.
    stats : list of per-block gap statistics (or None).
    info : dict with kernel seconds, coordinate updates and the largest change.
    """
    t0 = time.perf_counter()
    stats = None
    if with_stats:
        stats = xt_theta_task(blocks, theta, threshold)
    n = g.shape[0]
    u = np.zeros(n)
    ws = []
    for b, (idx, val) in zip(blocks, w_parts, strict=True):
        w = np.zeros(b.ncols)
        w[idx] = val
        ws.append(w)
    active = [np.arange(b.ncols, dtype=np.int64) for b in blocks]
    n_changed = 0
    max_dz = 0.0
    for epoch in range(n_epochs):
        for k, b in enumerate(blocks):
            ch, dz = cd_block_epochs(
                b.indptr,
                b.indices,
                b.data,
                b.col_scale,
                ws[k],
                g,
                u,
                sw,
                b.col_sqnorm,
                sigma,
                beta,
                float(n),
                alpha_l1,
                alpha_l2,
                1,
                random_order,
                (seed * 1000003 + epoch * 1009 + k) % (2**32),
                active[k],
            )
            n_changed += ch
            max_dz = max(max_dz, dz)
    w_new = []
    for w in ws:
        nz = np.flatnonzero(w)
        w_new.append((nz.astype(np.int64), w[nz]))
    info = {"kernel_s": time.perf_counter() - t0, "n_changed": n_changed, "max_dz": max_dz}
    return w_new, u, stats, info


def matvec_task(blocks: list[Block], w_parts: list[tuple[np.ndarray, np.ndarray]], n: int):
    """``X_part w_part`` (used to rebuild ``X w`` from a warm start)."""
    from dl1.kernels.linalg import csc_matvec

    out = np.zeros(n)
    for b, (idx, val) in zip(blocks, w_parts, strict=True):
        w = np.zeros(b.ncols)
        w[idx] = val
        csc_matvec(b.indptr, b.indices, b.data, b.col_scale, w, out)
    return out
