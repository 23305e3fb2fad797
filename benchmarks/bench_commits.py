"""The same distributed fit (or path) at two or more commits, interleaved in rounds.

Speed claims across sessions ("within 10% of the fit when the issue was filed") are only
as good as the conditions of the two runs: this machine's speed drifts by 30-50% over
minutes. This script unpacks each commit's ``dl1/`` (``git archive``) into a temporary
folder and runs the fit there in a child process, commit after commit, ``--rounds`` times;
each child starts its own LocalCluster of ``--workers`` single-threaded workers, fits once
untimed, then ``--repeat`` timed fits (store read included). Wall seconds, the calling
process's CPU seconds and the workers' summed CPU seconds are printed per round, with the
medians per commit.

    python benchmarks/bench_commits.py 2cee1ca HEAD --store bench-out/log1p.zarr
    python benchmarks/bench_commits.py 204a784 HEAD --store bench-out/log1p.zarr --task path

The configuration defaults to the distributed fit with direct calls
(``dl1.one-piece: False``, ``dl1.direct-calls: True``), the one configuration every commit
of issue 31 has; ``--defaults`` runs each commit's defaults instead.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import json, os, sys, time
import dask
from distributed import Client, LocalCluster
import dl1

def cpu():
    import time
    return time.process_time()

store, loss, repeat, workers, defaults, task, n_alphas = sys.argv[1:8]
config = {} if defaults == "1" else {"dl1.one-piece": False, "dl1.direct-calls": True}
with LocalCluster(n_workers=int(workers), threads_per_worker=1, processes=True,
                  host="127.0.0.1", dashboard_address="127.0.0.1:0") as cluster, \\
        Client(cluster) as client, dask.config.set(config):
    alpha = dl1.alpha_max(store, loss=loss, client=client) / 20
    for i in range(int(repeat) + 1):
        w0, c0 = sum(client.run(cpu).values()), time.process_time()
        t0 = time.perf_counter()
        if task == "path":  # alpha_max down to alpha_max / 20, warm-started
            res = dl1.path(store, n_alphas=int(n_alphas), eps=1 / 20, tol=1e-6, loss=loss,
                           client=client)
            gap = max(float(g) for g in res.gaps_)
        else:
            res = dl1.fit(store, alpha=alpha, tol=1e-6, loss=loss, client=client)
            gap = float(res.gap_)
        wall = time.perf_counter() - t0
        run = {"wall": wall, "client_cpu": time.process_time() - c0,
               "worker_cpu": sum(client.run(cpu).values()) - w0, "gap": gap,
               "load": os.getloadavg()[0]}
        if i:
            print("RUN " + json.dumps(run), flush=True)
"""


def unpack(commit: str, root: Path) -> Path:
    """``commit``'s ``dl1/`` package under ``root/<commit>``."""
    out = root / commit
    out.mkdir()
    archive = subprocess.run(["git", "archive", commit, "dl1"], check=True,
                             capture_output=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def one_round(src: Path, commit: str, args: argparse.Namespace) -> list[dict]:
    """The timed fits of one child process running ``src``'s dl1."""
    env = {**os.environ, "PYTHONPATH": str(src),
           "NUMBA_CACHE_DIR": str(src / "numba-cache")}  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-c", CHILD, args.store, args.loss, str(args.repeat),
         str(args.workers), "1" if args.defaults else "0", args.task, str(args.n_alphas)],
        env=env, check=True, capture_output=True, text=True, timeout=args.timeout,
    )  # fmt: skip
    runs = [json.loads(line[4:]) for line in out.stdout.splitlines() if line.startswith("RUN ")]
    print(f"{commit}: " + ", ".join(f"{r['wall']:.2f}" for r in runs), flush=True)
    return runs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("commits", nargs="+")
    ap.add_argument("--store", required=True)
    ap.add_argument("--loss", default="squared", choices=["squared", "logistic"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--task", default="fit", choices=["fit", "path"],
                    help="one fit at alpha_max / 20, or a path down to it")  # fmt: skip
    ap.add_argument("--n-alphas", type=int, default=10, help="the path's alphas")
    ap.add_argument("--defaults", action="store_true", help="each commit's own defaults")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per round")
    args = ap.parse_args(argv)
    args.store = str(Path(args.store).resolve())
    runs: dict[str, list[dict]] = {c: [] for c in args.commits}
    with tempfile.TemporaryDirectory() as tmp:
        srcs = {c: unpack(c, Path(tmp)) for c in args.commits}
        for _ in range(args.rounds):
            for c in args.commits:
                runs[c] += one_round(srcs[c], c, args)
    print(f"\n{args.task}, {Path(args.store).name}, {args.loss}")
    print("\n| commit | fits | wall s | client CPU s | workers' CPU s | largest gap | load |")
    print("|---|---|---|---|---|---|---|")
    for c, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs)
               for k in ("wall", "client_cpu", "worker_cpu", "load")}  # fmt: skip
        print(f"| {c} | {len(rs)} | {med['wall']:.3f} | {med['client_cpu']:.3f} "
              f"| {med['worker_cpu']:.3f} | {max(r['gap'] for r in rs):.2e} "
              f"| {med['load']:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
