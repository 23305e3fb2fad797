"""Past 2^31 nonzeros, once: a store written out of core and fitted out of core.

Writes ``make_e2006_like(preset="log1p", row_multiplier=k, dtype=float32)`` (k = 24 by
default: 386,088 x 4,272,227 in train, about 2.2e9 nonzeros, past the 2^31 - 1 that 32-bit
offsets can count), then fits one Lasso at ``alpha_max / ratio`` to relative gap ``tol`` on a
2-worker LocalCluster of ``--memory-limit`` each (default 2 GiB), the blocks streamed from
the store. The store is deleted after the fit unless ``--keep``.

    python benchmarks/bench_past_2e31.py --store /data/log1p-x24.zarr

Printed: nonzeros (train, total) against 2^31, the write time and the writing process's
peak RSS, alpha_max's time, the fit's time, rounds, passes over the data, the certified gap,
and each process's peak RSS (the client and both workers). The store is deleted after a
fit that ends, kept after one that fails. An opt-in benchmark: it needs
about 20 GB of disk for the store and as much again for the writer's spill files, and hours.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

import numpy as np
import psutil

#: Nonzeros a 32-bit signed offset can count.
INT32_LIMIT = 2**31 - 1


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _write(args: argparse.Namespace) -> float:
    """Writes the store (unless it is complete already); its seconds, NaN if not written."""
    from dl1.datasets import make_e2006_like
    from dl1.runtime.monitor import PeakRSS

    if (args.store / "dl1-manifest.json").exists():
        return float("nan")
    args.store.parent.mkdir(parents=True, exist_ok=True)
    with PeakRSS([os.getpid()], period=0.2) as rss:
        t0 = time.perf_counter()
        make_e2006_like(
            args.store, preset="log1p", seed=0, row_multiplier=args.row_multiplier,
            dtype=np.float32, overwrite=True,
        )  # fmt: skip
        seconds = time.perf_counter() - t0
    print(f"written in {seconds:.0f} s; writer's peak RSS {rss.peak[os.getpid()] / 2**20:.0f} MiB")
    return seconds


def _fit(args: argparse.Namespace) -> None:
    from distributed import Client

    import dl1
    from dl1.runtime.localcluster import local_cluster
    from dl1.runtime.monitor import PeakRSS

    with (
        local_cluster(
            n_workers=2, threads_per_worker=1, processes=True,
            memory_limit=args.memory_limit, dashboard_address="127.0.0.1:0",
        ) as cluster,
        Client(cluster) as client,
    ):  # fmt: skip
        pids = client.run(os.getpid)
        with PeakRSS([*pids.values(), os.getpid()], period=0.1) as rss:
            t0 = time.perf_counter()
            amax = dl1.alpha_max(args.store, client=client, stream=True)
            t_amax = time.perf_counter() - t0
            t0 = time.perf_counter()
            res = dl1.fit(
                args.store, alpha=amax / args.ratio, tol=args.tol, client=client, stream=True
            )
            t_fit = time.perf_counter() - t0
    print(f"alpha_max {amax:.4e} in {t_amax:.0f} s (one pass)")
    print(
        f"fit at alpha_max / {args.ratio:g}: {t_fit:.0f} s, {res.n_rounds_} rounds, "
        f"{res.passes_:.1f} passes, gap {res.gap_:.2e} (tol {args.tol:g}), certified "
        f"{res.converged_}, {np.count_nonzero(res.coef_)} nonzero coefficients"
    )
    for addr, pid in pids.items():
        print(f"worker {addr}: peak RSS {rss.peak[pid] / 2**20:.0f} MiB")
    print(f"client: peak RSS {rss.peak[os.getpid()] / 2**20:.0f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", type=Path, default=Path("/tmp/dl1-bench/log1p-x24-f32.zarr"))
    ap.add_argument("--row-multiplier", type=int, default=24)
    ap.add_argument("--memory-limit", default="2GiB")
    ap.add_argument("--ratio", type=float, default=20.0)
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--keep", action="store_true", help="keep the store afterwards")
    args = ap.parse_args()

    import dl1

    t_write = _write(args)
    store = dl1.open_store(args.store)
    train, total = store.nnz("train"), sum(store.nnz(s) for s in store.splits)
    n, p = store.shape("train")
    print(
        f"store {args.store}: train {n:,} x {p:,}, {train:,} nonzeros in train, {total:,} in "
        f"all ({total / INT32_LIMIT:.2f} x 2^31), {_du(args.store) / 2**30:.1f} GiB on disk; "
        f"write {t_write:.0f} s; host RAM {psutil.virtual_memory().total / 2**30:.0f} GiB"
    )
    _fit(args)  # a failed fit keeps the store, to be fitted again without the hour of writing
    if not args.keep:
        shutil.rmtree(args.store, ignore_errors=True)


if __name__ == "__main__":
    main()
