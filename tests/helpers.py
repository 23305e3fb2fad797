"""Helpers shared by the tests: random sparse data."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def random_csr(n, p, density, seed, dtype=np.float64, empty_rows=(), empty_cols=()):
    """Random CSR with chosen empty rows and columns."""
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=density, format="lil", random_state=rng, dtype=dtype)
    for r in empty_rows:
        X[r, :] = 0
    for c in empty_cols:
        X[:, c] = 0
    X = sp.csr_matrix(X)
    X.eliminate_zeros()
    return X


def store_reads(task_stream) -> int:
    """Tasks of a Dask task stream that read blocks from a dl1 store (whole blocks, keys
    ``dl1-<split>-...``, or pieces, ``read_columns_task``)."""

    def name(key):
        return str(key[0] if isinstance(key, tuple) else key)

    return sum(1 for e in task_stream
               if name(e["key"]).startswith(("dl1-train-", "read_columns_task")))  # fmt: skip
