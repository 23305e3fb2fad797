"""Block Newton steps: the model solved exactly on a few coupled columns.

At weak regularisation the proximal Newton model's coordinate descent crawls along
valleys of columns that share a few rows (words of a handful of short documents): a
coordinate's step there is limited by its partner's, the steps zig-zag, and the restricted
gap sits on a plateau for tens of Newton steps while a handful of columns violate their
dual constraint ``|x_j^T theta| <= n alpha_l1`` by a few percent (benchmarks/RESULTS.md,
"Weakly regularised L1-logistic: block Newton steps"). One such valley is small: the
worst violators and the columns sharing their rows. On it the model's Hessian is a small
dense matrix, on which coordinate descent can afford the thousands of epochs the valley
needs (covariance updates, :func:`~dl1.kernels.gram.gram_cd_epochs`: an epoch costs
``O(m^2)`` for ``m`` columns, not the columns' nonzeros): the block's step is the model's
minimiser over it, taken with the proximal Newton line search on the true objective.
This is block coordinate descent with a second-order model on the blocks (Tseng & Yun,
Math. Program. 2009, whose coordinate gradient descent chooses a block by its violation).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import scipy.sparse as sp

from dl1.kernels.gram import gram_cd_epochs
from dl1.kernels.linalg import csc_rmatvec

#: Columns violating their dual constraint most that seed a block.
BLOCK_SEEDS = 2
#: Columns of a block at most: the seeds and the neighbours most coupled to them.
BLOCK_MAX = 64
#: Multiply-adds of a block's epochs at most, in units of its columns' nonzeros: a block
#: step costs about what the coordinate descent of one Newton step does.
BLOCK_WORK = 25
#: Epochs of a block at least, whatever its columns' nonzeros (a few milliseconds).
BLOCK_EPOCHS = 1000
#: Epochs between checks of the block's convergence (its largest scaled step).
BLOCK_CHECK = 50


class Layout(NamedTuple):
    """The working set's columns as a SciPy matrix over the gathered arrays (no copy) and
    their scaling (empty for none), applied to the few columns a block takes."""

    csc: sp.csc_matrix
    scale: np.ndarray

    @classmethod
    def of(cls, cols: Any, n: int) -> Layout:
        m = cols.indptr.shape[0] - 1
        return cls(sp.csc_matrix((cols.data, cols.indices, cols.indptr), shape=(n, m)),
                   cols.scale)  # fmt: skip

    def take(self, idx: np.ndarray) -> sp.csc_matrix:
        """Columns ``idx``, scaled."""
        x = self.csc[:, idx]
        return (x @ sp.diags(self.scale[idx])).tocsc() if self.scale.shape[0] else x

    def sharing(self, rows: np.ndarray) -> np.ndarray:
        """The columns with a nonzero in one of ``rows``, sorted (one pass over the
        indices: no row-major copy of the working set)."""
        hit = np.zeros(self.csc.shape[0], dtype=bool)
        hit[rows] = True
        at = np.flatnonzero(hit[self.csc.indices])
        return np.unique(np.searchsorted(self.csc.indptr, at, side="right") - 1)


class Block(NamedTuple):
    """A block step: its columns (positions in the working set), the step ``d`` on them,
    ``u = X_B d`` and the model's intercept step ``e``."""

    cols: np.ndarray
    d: np.ndarray
    u: np.ndarray
    e: float


def violations(cols: Any, g: np.ndarray, penalty: Any, out: np.ndarray) -> np.ndarray:
    """``|x_j^T g| - n alpha_l1 f_j`` of each column: by how much ``theta = -g`` violates
    its dual constraint (positive) or meets it; ``out`` gets ``x_j^T g``."""
    csc_rmatvec(cols.indptr, cols.indices, cols.data, cols.scale, g, out)
    limit = g.shape[0] * penalty.alpha_l1
    factors = penalty.factors
    return np.abs(out) - (limit * factors if factors.shape[0] else limit)


def choose_block(layout: Layout, excess: np.ndarray, h: np.ndarray) -> np.ndarray:
    """The :data:`BLOCK_SEEDS` worst violators (positive ``excess`` only) and the columns
    sharing rows with them, the most coupled (``|x_k^T H x_s|``) first, up to
    :data:`BLOCK_MAX`; sorted. Empty when no column violates."""
    k = min(BLOCK_SEEDS, excess.shape[0])
    seeds = np.argpartition(-excess, k - 1)[:k]
    seeds = seeds[excess[seeds] > 0.0]
    if seeds.shape[0] == 0:
        return seeds
    seed_rows = np.unique(layout.csc[:, seeds].indices)
    near = np.union1d(seeds, layout.sharing(seed_rows))
    if near.shape[0] > BLOCK_MAX:
        weighted = layout.take(seeds).multiply(h[:, None]).tocsc()
        coupling = abs(layout.take(near).T @ weighted).max(axis=1)
        coupling = np.asarray(coupling.todense()).ravel()
        coupling[np.isin(near, seeds)] = np.inf
        near = near[np.argsort(-coupling, kind="stable")[:BLOCK_MAX]]
    return np.sort(near)


def block_step(layout: Layout, w: np.ndarray, g: np.ndarray, h: np.ndarray,
               shift: np.ndarray, penalty: Any, excess: np.ndarray,
               xtg: np.ndarray) -> Block | None:  # fmt: skip
    """The proximal Newton model's minimiser over a block (:func:`choose_block`) by
    covariance-update coordinate descent, the intercept step profiled out (as
    :func:`~dl1.kernels.cd.weighted_cd_epochs` does); None without a violator.

    ``g``, ``h`` and ``shift`` are the model's at ``w`` (:class:`~dl1.tasks.prox_newton.
    Model`); ``xtg`` the columns' ``x_j^T g``.
    """
    block = choose_block(layout, excess, h)
    if block.shape[0] == 0:
        return None
    n = g.shape[0]
    xb = layout.take(block)
    hessian = (xb.T @ xb.multiply(h[:, None])).toarray()
    grad = xtg[block].copy()
    h_sum = float(shift[1])
    hx = np.asarray(xb.T @ h).ravel()
    if h_sum > 0.0:  # e = -(sum g + hx^T d) / sum h
        hessian -= np.outer(hx, hx) / h_sum
        grad -= hx * (float(g.sum()) / h_sum)
    w_b = w[block].copy()
    _minimise(np.ascontiguousarray(hessian / n), -grad / n, w_b, penalty, block,
              BLOCK_WORK * layout.csc.nnz)  # fmt: skip
    d = w_b - w[block]
    u = np.asarray(xb @ d).ravel()
    e = -(float(g.sum()) + float(hx @ d)) / h_sum if h_sum > 0.0 else 0.0
    return Block(block, d, u, e)


def _minimise(q: np.ndarray, neg_grad: np.ndarray, w_b: np.ndarray, penalty: Any,
              block: np.ndarray, work: int) -> None:  # fmt: skip
    """Coordinate descent on ``q`` (``neg_grad`` = ``-grad``, both updated in place) until
    its largest scaled step is below a millionth of ``alpha_l1``'s scale, or ``work``
    multiply-adds."""
    factors = penalty.factors[block] if penalty.factors.shape[0] else penalty.factors
    bounds = penalty.bounds[:, block] if penalty.bounds.shape[1] else penalty.bounds
    budget = max(BLOCK_EPOCHS, work // block.shape[0] ** 2)
    tol = 1e-6 * penalty.alpha_l1 / np.sqrt(max(float(np.diag(q).max()), 1e-300))
    epochs = 0
    while epochs < budget:
        run = min(BLOCK_CHECK, budget - epochs)
        moved = gram_cd_epochs(q, neg_grad, w_b, penalty.alpha_l1, penalty.alpha_l2, factors,
                               bounds, run)  # fmt: skip
        epochs += run
        if moved <= tol:
            break
