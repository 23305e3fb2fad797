"""Predictions of a fitted linear model on a (possibly out-of-core) dask array."""

from __future__ import annotations

import os
from typing import Any

import dask
import dask.array as da
import numpy as np

from dl1.store import Store, open_store


def _block_dot(chunk: Any, width: int, idx: np.ndarray, vals: np.ndarray) -> np.ndarray:
    if hasattr(chunk, "to_scipy_sparse"):
        chunk = chunk.to_scipy_sparse()
    coef = np.zeros(width)
    coef[idx] = vals
    return np.asarray(chunk @ coef).ravel()


def decision_function(X: Any, coef: np.ndarray, intercept: float, split: str = "test") -> da.Array:
    """``X @ coef + intercept`` as a lazy dask array, block by block (chunks stay on workers).

    ``X`` is a dask array, a Store or a store path (``split`` chooses the split).
    """
    if isinstance(X, (str, os.PathLike)):
        X = open_store(X)
    if isinstance(X, Store):
        X = X.to_dask(split)
    if not isinstance(X, da.Array):  # in memory already (scipy.sparse or ndarray)
        return da.from_array(np.asarray(X @ coef).ravel() + float(intercept))
    cb = np.concatenate([[0], np.cumsum(X.chunks[1])]).astype(np.int64)
    dl = X.to_delayed()
    # each block's nonzero coefficients travel as (indices, values): the graph grows with
    # the support, not with the width of the blocks it touches
    nz = np.flatnonzero(coef)
    owner = np.searchsorted(cb, nz, side="right") - 1
    by_block = {
        int(j): (nz[owner == j] - cb[j], np.asarray(coef, dtype=np.float64)[nz[owner == j]])
        for j in np.unique(owner)
    }
    rows = []
    for i, n_i in enumerate(X.chunks[0]):
        parts = [
            dask.delayed(_block_dot)(dl[i, j], int(cb[j + 1] - cb[j]), *by_block[j])
            for j in sorted(by_block)
        ]
        total = dask.delayed(sum)(parts, np.full(n_i, float(intercept)))
        rows.append(da.from_delayed(total, shape=(n_i,), dtype=np.float64))
    return da.concatenate(rows) if rows else da.zeros(0)
