"""Out of core, gathered or spread subproblems: a tall sparse L1-logistic problem streamed
from a store on 2 x 1 GiB workers, fitted with ``spread=None`` (the working set gathered on
one worker while three times its columns' bytes fit its budget), with ``spread=True``
(spread proximal Newton steps over the partitions, what a working set too big to gather
gets) and with ``spread="cocoa"`` (CoCoA+ over the partitions, what the dense bound
``12 n |ws|`` chose for any working set of this problem before). Time, gap, support,
each round's mode and peak RSS.

    python benchmarks/bench_ooc_modes.py [--rows 300000] [--ratio 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).parent))


def tall_store(path: Path, n: int, p: int = 30_000, per_row: int = 20) -> Path:
    """``n x p``, ``per_row`` nonzeros a row on Zipf-like column frequencies (as text),
    labels of a planted sparse logistic model (600 features)."""
    import dl1

    if (path / "dl1-manifest.json").exists():
        return path
    rng = np.random.default_rng(0)
    rows = np.repeat(np.arange(n), per_row)
    cols = np.minimum((rng.pareto(1.2, n * per_row) * 50).astype(np.int64), p - 1)
    X = sp.csr_matrix((rng.random(n * per_row) + 0.1, (rows, cols)), shape=(n, p))
    X.sum_duplicates()
    w = np.zeros(p)
    w[rng.choice(p, 600, replace=False)] = rng.standard_normal(600) * 2
    z = X @ w
    y = np.where(z + rng.logistic(size=n) > np.median(z), 1.0, -1.0)
    dl1.from_scipy(X, y, path, overwrite=True)
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--ratio", type=float, default=1000.0, help="alpha = alpha_max / ratio")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--memory-limit", default="1GiB")
    ap.add_argument("--data-dir", default="/tmp/dl1-ooc-modes")
    args = ap.parse_args()
    from bench_engines import _cluster, _workers_peak
    from engines_ooc import StoreMatrix, store_alpha_max

    import dl1

    store = tall_store(Path(args.data_dir) / f"tall-{args.rows}.zarr", args.rows)
    X = StoreMatrix(str(store))
    alpha = store_alpha_max(X, X.read_y(), "logistic") / args.ratio
    print(f"{X.shape[0]:,} x {X.shape[1]:,}, {X.nnz:,} nonzeros; alpha_max/{args.ratio:g}, "
          f"tol {args.tol:g}, 2 workers x {args.memory_limit}, stream=True")  # fmt: skip
    for spread in (None, True, "cocoa"):
        times, res = [], None
        for _ in range(args.repeat):
            cluster, client = _cluster(2, args.memory_limit, dl1_setup=True)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dl1.fit(str(store), alpha=alpha, loss="logistic", tol=1e-2, client=client,
                        stream=True, max_rounds=1)  # warm-up: compilation on the workers
                t0 = time.perf_counter()
                res = dl1.fit(str(store), alpha=alpha, loss="logistic", tol=args.tol,
                              client=client, stream=True, spread=spread)  # fmt: skip
                times.append(time.perf_counter() - t0)
            peak = _workers_peak(client)
            client.close()
            cluster.close()
            if times[-1] > 120:
                break  # one run is enough to see it
        modes = [(e.get("mode"), e.get("ws_size")) for e in res.history_ if "mode" in e]
        print(f"spread={spread!s:6}: median {statistics.median(times):7.1f} s of {len(times)} "
              f"({', '.join(f'{t:.1f}' for t in times)}), gap {res.gap_:.2e}, "
              f"{np.count_nonzero(res.coef_):,} nonzeros, rounds {res.n_rounds_}, peak "
              f"{peak:.0f} MB (both workers); rounds' modes: {modes}", flush=True)


if __name__ == "__main__":
    main()
