"""Out-of-core regularisation path: a store several times bigger than the workers' memory.

Generates (once) ``make_e2006_like(preset="log1p", row_multiplier=k)``, starts a 2-worker
LocalCluster whose total ``memory_limit`` is a given fraction of the store's size on disk
(default: under a third), and runs the 100-alpha Lasso path to relative gap 1e-6 (gap-safe
screening with ``--screen``), the blocks streamed from the store (``dl1.path(..., stream=None)``
decides from the memory limits and is reported). While it runs, the resident memory of each
worker process is sampled every 50 ms; afterwards the workers' logs are searched for pauses
and their process ids compared with those at the start (a restarted worker has a new one).

    python benchmarks/bench_path_ooc.py --row-multiplier 8 --store /data/log1p-x8.zarr

Printed: store size and nnz, memory limit (total and per worker, as a fraction of the store),
generation time, the path's time, alphas certified, passes over the data (in total and per
alpha), mean active features, peak RSS per worker, pauses and restarts.
"""

from __future__ import annotations

import argparse
import os
import re
import threading
import time
from pathlib import Path

import numpy as np
import psutil


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _managed_by_task(dask_worker=None, top: int = 4) -> list[tuple[str, int, int, int]]:
    """The task names (key prefixes) holding the most managed memory on a worker: name,
    number of results, bytes in memory and bytes spilled to disk (as Dask sizes them)."""
    from dask.utils import key_split

    slow = getattr(dask_worker.data, "slow", {})
    sizes: dict[str, list[int]] = {}
    for ts in list(dask_worker.state.tasks.values()):
        if ts.state != "memory":
            continue
        entry = sizes.setdefault(key_split(ts.key), [0, 0, 0])
        entry[0] += 1
        entry[2 if ts.key in slow else 1] += int(ts.nbytes or 0)
    ranked = sorted(sizes.items(), key=lambda kv: -(kv[1][1] + kv[1][2]))[:top]
    return [(name, count, mem, disk) for name, (count, mem, disk) in ranked]


def _memory_report(client, every: float, stop: threading.Event) -> None:
    """Every ``every`` seconds, each worker's status and memory as Dask accounts it: process
    RSS, managed (task results in memory), spilled to disk, and the rest (unmanaged); then
    the task names holding most of each worker's managed memory."""
    while not stop.wait(every):
        try:
            workers = client.scheduler_info()["workers"]
            by_task = client.run(_managed_by_task)
        except Exception:
            return
        parts = []
        for addr, w in sorted(workers.items()):
            m = w.get("metrics", {})
            rss = m.get("memory", 0)
            managed = m.get("managed_bytes", 0)
            spilled = m.get("spilled_bytes", {}).get("disk", 0)
            parts.append(
                f"{addr.rsplit(':', 1)[-1]} {w.get('status', '?')} rss {rss / 2**20:.0f} "
                f"managed {managed / 2**20:.0f} unmanaged {(rss - managed) / 2**20:.0f} "
                f"spilled {spilled / 2**20:.0f} MiB"
            )
        print("memory: " + "; ".join(parts), flush=True)
        for addr, ranked in sorted(by_task.items()):
            held = ", ".join(
                f"{name} {count} x {mem / 2**20:.0f} + {disk / 2**20:.0f} spilled"
                for name, count, mem, disk in ranked
            )
            print(f"  managed on {addr.rsplit(':', 1)[-1]} (MiB): {held}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", type=Path, default=Path("/tmp/dl1-bench/log1p-ooc.zarr"))
    ap.add_argument("--preset", default="log1p")
    ap.add_argument("--row-multiplier", type=int, default=8)
    ap.add_argument("--n-feature-blocks", type=int, default=256)
    ap.add_argument(
        "--memory-fraction",
        type=float,
        default=0.32,
        help="total memory_limit of the workers as a fraction of the store's size (--size-of)",
    )
    ap.add_argument(
        "--size-of",
        choices=["disk", "blocks"],
        default="disk",
        help="the store's size: on disk (compressed) or as the solver's in-memory blocks",
    )
    ap.add_argument("--n-alphas", type=int, default=100)
    ap.add_argument("--eps", type=float, default=1e-2)
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--checkpoint", type=Path, default=None)
    ap.add_argument("--stream", choices=["auto", "yes", "no"], default="auto")
    ap.add_argument(
        "--memory-report",
        type=float,
        default=0.0,
        help="print each worker's status and managed / unmanaged memory every SECONDS",
    )
    ap.add_argument(
        "--screen",
        action="store_true",
        help="gap-safe screening (off: out of core it cannot skip blocks of Zipf-like data, "
        "and without it each alpha's last pass is reused as the next alpha's first)",
    )
    args = ap.parse_args()

    from distributed import Client

    import dl1
    from dl1.datasets import make_e2006_like
    from dl1.loading import block_memory
    from dl1.runtime.localcluster import local_cluster
    from dl1.runtime.monitor import PeakRSS

    t_gen = float("nan")
    if not (args.store / "dl1-manifest.json").exists():
        args.store.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        make_e2006_like(
            args.store,
            preset=args.preset,
            seed=0,
            row_multiplier=args.row_multiplier,
            n_feature_blocks=args.n_feature_blocks,
        )
        t_gen = time.perf_counter() - t0
    store = dl1.open_store(args.store)
    size = _du(args.store)
    n, p = store.shape()
    blocks_size = block_memory(store, "train")
    limit = int(args.memory_fraction * (size if args.size_of == "disk" else blocks_size) / 2)
    print(
        f"store {args.store}: {n} x {p}, {store.nnz():,} nonzeros (train), "
        f"{store.block_nnz().shape[1]} feature blocks, {size / 2**30:.2f} GiB on disk, "
        f"{blocks_size / 2**30:.2f} GiB as in-memory blocks; "
        f"generated in {t_gen:.1f} s"
    )
    print(
        f"workers: 2 x memory_limit {limit / 2**20:.0f} MiB = {2 * limit / 2**20:.0f} MiB "
        f"total = {2 * limit / size:.2f} of the store on disk, "
        f"{2 * limit / blocks_size:.2f} of its in-memory blocks"
    )
    stream = {"auto": None, "yes": True, "no": False}[args.stream]
    with (
        local_cluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            memory_limit=limit,
            dashboard_address="127.0.0.1:0",
        ) as cluster,
        Client(cluster) as client,
    ):
        pids = client.run(os.getpid)
        baseline = client.run(lambda: psutil.Process().memory_info().rss)
        t_last = [time.perf_counter()]

        def progress(k, alpha, res):
            now = time.perf_counter()
            print(
                f"alpha[{k:3d}] {alpha:.4e}  nnz {np.count_nonzero(res.coef_):6d}  "
                f"gap {res.gap_:.2e}  passes {res.passes_:.2f}  streamed {res.streamed_}  "
                f"{now - t_last[0]:.1f} s",
                flush=True,
            )
            t_last[0] = now

        stop = threading.Event()
        if args.memory_report:
            threading.Thread(
                target=_memory_report, args=(client, args.memory_report, stop), daemon=True
            ).start()
        with PeakRSS(pids.values(), period=0.05) as rss:
            t0 = time.perf_counter()
            res = dl1.path(
                args.store,
                n_alphas=args.n_alphas,
                eps=args.eps,
                tol=args.tol,
                screen=args.screen,
                stream=stream,
                client=client,
                checkpoint=args.checkpoint,
                X_test="test",
                callback=progress,
            )
            t_path = time.perf_counter() - t0
        stop.set()
        restarted = client.run(os.getpid) != pids
        logs = "\n".join(m for msgs in client.get_worker_logs().values() for _, m in msgs)
        paused = len(re.findall(r"Pausing worker", logs))
    print()
    print(f"path: {args.n_alphas} alphas in {t_path:.1f} s ({t_path / args.n_alphas:.2f} s/alpha)")
    print(
        f"certified: {int(res.converged_.sum())}/{len(res.alphas_)}, max gap "
        f"{res.gaps_.max():.2e}; passes {res.passes_.sum():.1f} in total, "
        f"{res.passes_.mean():.2f} per alpha; mean active features {res.n_active_.mean():.1f}; "
        f"best alpha {res.best_alpha_:.4e}"
    )
    for pid in pids.values():
        addr = next(a for a, q in pids.items() if q == pid)
        print(
            f"worker pid {pid}: peak RSS {rss.peak[pid] / 2**20:.0f} MiB (start "
            f"{baseline[addr] / 2**20:.0f} MiB, limit {limit / 2**20:.0f} MiB, pause at "
            f"{0.8 * limit / 2**20:.0f} MiB)"
        )
    print(f"workers paused: {paused} times; restarted: {restarted}")


if __name__ == "__main__":
    main()
