"""Where a fit of ``K`` classes starts, shared by the multinomial and one-vs-rest solvers:
a support with its rows of ``W`` and the intercepts, and the columns of a set of features
gathered from their blocks to compute ``Z = X W + 1 b^T`` there."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import scipy.sparse as sp

from dl1.kernels.multiclass import csc_mat_add
from dl1.tasks.columns import extract_task, gather_columns


class WarmStart(NamedTuple):
    """Where a solve starts: the support (sorted features), its rows of ``W`` (``m x K``)
    and the intercepts (None: the solver's own start, those of ``W = 0``)."""

    support: np.ndarray
    W: np.ndarray
    b: np.ndarray | None

    @classmethod
    def of(cls, res: Any) -> WarmStart:
        """The start at a result's answer (its sparse ``(K, p)`` ``coef_``, ``intercept_``)."""
        return cls.from_coef(res.coef_, res.intercept_)

    @classmethod
    def from_coef(cls, coef: Any, intercept: Any) -> WarmStart:
        """The start at coefficients ``(K, p)`` (dense or sparse) and intercepts ``(K,)``
        (or None): the features with a nonzero coefficient in some class."""
        cols = sp.csc_matrix(coef, dtype=np.float64)
        cols.eliminate_zeros()
        support = np.flatnonzero(np.diff(cols.indptr)).astype(np.int64)
        b = None if intercept is None else np.asarray(intercept, np.float64)
        return cls(support, cols[:, support].T.toarray(), b)


class GatheredColumns(NamedTuple):
    """The columns of features ``ws`` (in that order) as one CSC matrix on the coordinator,
    with their (weighted) squared norms."""

    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    sqnorm: np.ndarray


def gather_ws_columns(ex: Any, blocks: list[Any], col_bounds: np.ndarray,
                      ws: np.ndarray) -> GatheredColumns:  # fmt: skip
    """Extract the sorted features ``ws`` where their blocks are (one task per block that
    holds some) and join them into one CSC matrix here (:func:`~dl1.tasks.columns.
    gather_columns`), standardised columns scaled."""
    blk = np.searchsorted(col_bounds, ws, side="right") - 1
    owners = np.unique(blk)
    groups = ex.gather([ex.submit(extract_task, blocks[k], ws[blk == k] - col_bounds[k])
                        for k in owners])  # fmt: skip
    indptr, indices, data, scale, sqn = gather_columns(groups, [ws[blk == k] for k in owners],
                                                       ws)  # fmt: skip
    if scale.shape[0]:
        data *= np.repeat(scale, np.diff(indptr))
    return GatheredColumns(indptr, indices.astype(np.int64), data, sqn.astype(np.float64))


def decisions_at(cols: GatheredColumns, W: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
    """``Z = X_S W + 1 b^T`` (``n x K``) from the support's gathered columns."""
    Z = np.tile(np.asarray(b, np.float64), (n, 1))
    csc_mat_add(cols.indptr, cols.indices, cols.data, np.ascontiguousarray(W, np.float64), Z)
    return Z
