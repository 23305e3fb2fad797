"""How a distributed solve's steps travel: direct calls to the workers against plain Dask tasks.

Issue 31 asks whether dl1's direct-call layer (``dl1/runtime/rpc.py`` and its servers)
still pays for itself once solves that fit one worker run in one piece: this script times
the same fit and path, distributed (``dl1.one-piece: False``), with ``dl1.direct-calls``
True (partition servers reached over Dask's comm) and False (every step a Dask task with
worker restrictions, data kept in worker memory by Dask). And, for reference, the one-piece
solve of the same call (``dl1.one-piece: True``).

Each configuration runs in its own child process with its own LocalCluster of
``--workers`` single-threaded workers; one untimed warm-up run, then ``--repeat`` timed runs
(the store read in each); the medians are printed as a markdown table and written to
``--json``.

    python benchmarks/bench_transport.py --presets tfidf log1p --repeat 3

``--fixed-cost`` times instead what shipping a solve in one piece costs: on one warm
LocalCluster, the fit in one piece and the same fit in the calling process (no client),
interleaved ``--repeat`` times; it prints both medians, the median of their differences,
the median shipping cost (the fit's time less its task's time in the worker, which
includes the worker's read of the store) and the load average.

    python benchmarks/bench_transport.py --fixed-cost --presets small short --repeat 40
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

CONFIGS = {
    "tasks": {"dl1.one-piece": False, "dl1.direct-calls": False},
    "direct calls": {"dl1.one-piece": False, "dl1.direct-calls": True},
    "one piece": {"dl1.one-piece": True},
}


def _child(config: dict, store: str, kind: str, args: argparse.Namespace, out: mp.Queue):
    import dask
    from distributed import Client, LocalCluster

    import dl1

    with (
        LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                     host="127.0.0.1", dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster) as client,
        dask.config.set(config),
    ):  # fmt: skip
        loss = args.loss
        amax = dl1.alpha_max(store, loss=loss, client=client)

        def once() -> tuple[float, float]:
            t0 = time.perf_counter()
            if kind == "fit":
                res = dl1.fit(store, alpha=amax / args.ratio, tol=args.tol, loss=loss,
                              client=client)  # fmt: skip
                gap = res.gap_
            else:
                res = dl1.path(store, n_alphas=args.n_alphas, eps=args.eps, tol=args.tol,
                               loss=loss, client=client)  # fmt: skip
                gap = float(res.gaps_.max())
            return time.perf_counter() - t0, gap

        once()  # warm-up
        runs = [once() for _ in range(args.repeat)]
    out.put([r[0] for r in runs] + [max(r[1] for r in runs)])


def _fixed_cost(store: str, args: argparse.Namespace) -> dict:
    """Seconds of the fit in one piece on a warm cluster and in this process, interleaved."""
    import dask
    from distributed import Client, LocalCluster

    import dl1
    from dl1.runtime import one_piece

    with (
        LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                     host="127.0.0.1", dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster) as client,
    ):  # fmt: skip
        kw = {"alpha": dl1.alpha_max(store, loss=args.loss, client=client) / args.ratio,
              "tol": args.tol, "loss": args.loss}  # fmt: skip

        tasks: list[float] = []  # seconds of each one-piece task in its worker
        submitted = one_piece._submitted

        def seen(*a: object) -> list:
            answers = submitted(*a)
            tasks.append(answers[0].seconds)
            return answers

        def timed(where: object) -> float:
            t0 = time.perf_counter()
            if where is None:  # the calling process, whatever the default client
                with dask.config.set(scheduler="sync"):
                    dl1.fit(store, client=None, **kw)
            else:
                with dask.config.set({"dl1.one-piece": True}):
                    dl1.fit(store, client=where, **kw)
            return time.perf_counter() - t0

        one_piece._submitted = seen
        try:
            for _ in range(3):  # warm: both workers and this process
                timed(client), timed(None)
            del tasks[:]
            pairs = [(timed(client), timed(None)) for _ in range(args.repeat)]
        finally:
            one_piece._submitted = submitted
    return {
        "one piece": statistics.median(a for a, _ in pairs),
        "in process": statistics.median(b for _, b in pairs),
        "difference": statistics.median(a - b for a, b in pairs),
        "shipping": statistics.median(a - t for (a, _), t in zip(pairs, tasks, strict=True)),
        "runs": len(pairs),
        "load": os.getloadavg(),
        "seconds": {
            "one piece": [a for a, _ in pairs],
            "in process": [b for _, b in pairs],
            "task": tasks,
        },  # fmt: skip
    }


def fixed_cost(args: argparse.Namespace, store_for: object) -> None:
    """Print (and write to ``--json``) :func:`_fixed_cost` of each preset."""
    rows = []
    print("| preset | one piece | in process | difference | shipping | runs | load |")
    print("|---|---|---|---|---|---|---|")
    for preset in args.presets:
        store = str(store_for(preset, args.loss, Path(args.data_dir), False))
        r = {"preset": preset, **_fixed_cost(store, args)}
        rows.append(r)
        load = " ".join(f"{x:.1f}" for x in r["load"])
        print(f"| {preset} | {r['one piece']:.3f} s | {r['in process']:.3f} s "
              f"| {r['difference']:+.3f} s | {r['shipping']:.3f} s | {r['runs']} | {load} |",
              flush=True)  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", nargs="+", default=["tfidf", "log1p"])
    ap.add_argument("--kinds", nargs="+", default=["fit", "path"])
    ap.add_argument("--data-dir", default="bench-out")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--ratio", type=float, default=20.0)
    ap.add_argument("--n-alphas", type=int, default=20)
    ap.add_argument("--eps", type=float, default=1e-2)
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--loss", default="squared", choices=["squared", "logistic"])
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--fixed-cost",
        action="store_true",
        help="time one piece against the calling process (module docstring)",
    )
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_matrix import store_for

    if args.fixed_cost:
        fixed_cost(args, store_for)
        return

    rows = []
    ctx = mp.get_context("spawn")
    for preset in args.presets:
        store = str(store_for(preset, args.loss, Path(args.data_dir), False))
        for kind in args.kinds:
            row = {"preset": preset, "kind": kind, "loss": args.loss}
            for name, config in CONFIGS.items():
                q = ctx.Queue()
                p = ctx.Process(target=_child, args=(config, store, kind, args, q))
                p.start()
                got = q.get()
                p.join()
                row[name] = statistics.median(got[:-1])
                row[f"{name} gap"] = got[-1]
                print(f"{preset} {kind} {name}: {got[:-1]} (gap <= {got[-1]:.1e})", flush=True)
            rows.append(row)
    print("\n| preset | loss | kind | tasks | direct calls | gain | one piece |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        gain = 1 - r["direct calls"] / r["tasks"]
        print(f"| {r['preset']} | {r['loss']} | {r['kind']} | {r['tasks']:.2f} s "
              f"| {r['direct calls']:.2f} s "
              f"| {gain:+.1%} | {r['one piece']:.2f} s |")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
