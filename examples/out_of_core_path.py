"""An out-of-core regularisation path: a store read block by block on memory-limited workers.

python examples/out_of_core_path.py [--rows 4000] [--features 400] [--n-alphas 8]
                                    [--memory-limit 1GiB] [STORE_DIR]

The store is written out of core (dl1.from_scipy here; ``dl1 convert`` for svmlight files),
then the path runs with ``stream=True``: every pass reads the blocks it needs from the
store and drops them, so the workers' memory does not hold the data. Each alpha is
certified by its duality gap; the answer equals the in-memory one.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from distributed import Client

import dl1
from dl1.paths import PathResult
from dl1.runtime.localcluster import local_cluster


def make_store(path: Path, rows: int, features: int, seed: int = 0) -> dl1.Store:
    """A sparse regression problem with 10 true features, in 4 x 4 blocks."""
    rng = np.random.default_rng(seed)
    X = sp.random(rows, features, density=0.05, format="csr", random_state=rng)
    w = np.zeros(features)
    w[:10] = rng.standard_normal(10)
    y = X @ w + 0.01 * rng.standard_normal(rows)
    return dl1.from_scipy(X, y, path, row_block_rows=-(-rows // 4), n_feature_blocks=4)


def main(out: Path, rows: int, features: int, n_alphas: int, memory_limit: str) -> PathResult:
    store = make_store(out / "data.zarr", rows, features)
    with (
        local_cluster(n_workers=2, threads_per_worker=1, memory_limit=memory_limit) as cluster,
        Client(cluster) as client,
    ):
        result = dl1.path(
            store,
            n_alphas=n_alphas,
            tol=1e-6,
            stream=True,  # out of core: blocks read from the store by every pass
            client=client,
            callback=lambda k, alpha, res: print(
                f"alpha {k + 1}/{n_alphas} {alpha:.4g}: nnz {np.count_nonzero(res.coef_)}, "
                f"relative gap {res.gap_:.1e}",
                flush=True,
            ),
        )
    print(result.summary())
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store_dir", nargs="?", type=Path, default=None)
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--features", type=int, default=400)
    parser.add_argument("--n-alphas", type=int, default=8)
    parser.add_argument("--memory-limit", default="1GiB")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        main(args.store_dir or Path(tmp), args.rows, args.features, args.n_alphas,
             args.memory_limit)  # fmt: skip
