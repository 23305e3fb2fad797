"""Shared helpers of the kernel and task tests: random CSC blocks and raw arrays."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from dl1.objective.datafits import DATAFITS

EMPTY = np.empty(0, dtype=np.float64)
#: The kernels' bounds for "none" (shape (2, 0)).
NO_BOX = np.zeros((2, 0))
SHAPES = [(1, 2), (7, 5), (30, 12), (64, 40)]
DTYPES = [np.float32, np.float64]


def make_csc(n, p, density, dtype, seed):
    """Random CSC matrix with column 0 empty and column 1 holding a single nonzero."""
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((n, p)) * (rng.random((n, p)) < density)
    dense[:, 0] = 0.0
    if p > 1:
        dense[:, 1] = 0.0
        dense[rng.integers(n), 1] = 1.5
    return sp.csc_matrix(dense.astype(dtype))


def arrays(X):
    """Raw CSC arrays with the kernels' index types."""
    X = sp.csc_matrix(X)
    X.sort_indices()
    return X.indptr.astype(np.int64), X.indices.astype(np.int32), X.data


def scaled_dense(X, col_scale):
    """Dense float64 ``X`` with ``col_scale`` applied (empty = none)."""
    dense = X.toarray().astype(np.float64)
    return dense if col_scale.size == 0 else dense * col_scale


def maybe_scale(p, use, rng):
    return rng.uniform(0.5, 2.0, p) if use else EMPTY


#: The sample-wise kernels' loss codes, by loss name: the registry's losses with row steps.
LOSS_CODES = {name: cls.code for name, cls in DATAFITS.items() if cls.row_steps}
