"""What a call of ``solver="row-newton"`` costs: the figures its scaling model needs
(issue 48, item 3; ``benchmarks/scaling_model.py rows``).

Each round of the row-partitioned solver is a sequence of *calls*: a task on every
partition, the partitions' small results added along a binomial tree of tasks, one result
to the client (:mod:`dl1.solvers.row_newton`). A call's cost grows with the partitions
(the scheduler handles ``3 P - 1`` tasks) and with the rows a partition holds (its
length-n work). This script times row-newton fits on a 2-worker cluster:

- on each store of ``--stores`` (different row counts, one partition a worker), and
- on ``--small`` with ``--partitions`` 2, 4, 8, 16 (the same rows in more partitions: the
  scheduler's cost a task),

each after an untimed warm-up, ``--repeat`` times, interleaved, by each of ``--transports``:
``direct`` (calls to the partition servers, the default) and ``tasks`` (``dl1.direct-calls:
False``); per run the seconds, rounds, calls, Newton steps, working sets, and the store's
shape. ``--scheduler`` runs on an
existing cluster (``dask scheduler`` / ``dask worker --nthreads 1 --no-nanny`` on
127.0.0.1, as ``bench_network.py``'s loopback); without it a LocalCluster of processes.

    python benchmarks/bench_row_calls.py --stores S300K S1M --small S20K --json rows.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import dl1


def shape(store: str) -> dict[str, int]:
    """The train split's rows, features and nonzeros (the store's manifest)."""
    doc = json.loads((Path(store) / "dl1-manifest.json").read_text())
    tr = doc["splits"]["train"]
    n, p = (int(x) for x in tr["shape"])
    return {"n": n, "p": p, "nnz": int(tr["nnz"])}


def one_fit(store: str, partitions: int, ratio: float, tol: float, client: Any,
            series: str, transport: str = "direct") -> dict:  # fmt: skip
    """A timed row-newton fit at ``alpha_max / ratio`` by ``transport``; its figures
    (``series``: "rows" for ``--stores``, "partitions" for ``--small``)."""
    import dask

    amax = dl1.alpha_max(store, client=client)
    with dask.config.set({"dl1.direct-calls": transport == "direct"}):
        t0 = time.perf_counter()
        res = dl1.fit(store, alpha=amax / ratio, tol=tol, solver="row-newton", client=client,
                      n_partitions=partitions)  # fmt: skip
        seconds = time.perf_counter() - t0
    hist = res.history_
    return {"store": store, "series": series, "partitions": partitions, "seconds": seconds,
            "transport": transport, "workers": len(client.scheduler_info()["workers"]),
            "rounds": res.n_rounds_, "gap": res.gap_, "calls": hist[-1]["calls"],
            "newton_steps": sum(h.get("newton_steps", 0) for h in hist),
            "ws_sizes": [h["ws_size"] for h in hist if "ws_size" in h],
            "fit_seconds": hist[-1]["seconds"], **shape(store)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stores", nargs="+", required=True)
    ap.add_argument("--small", required=True)
    ap.add_argument("--partitions", nargs="+", type=int, default=[2, 4, 8, 16])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--ratio", type=float, default=20.0)
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--scheduler", default=None)
    ap.add_argument("--transports", nargs="+", choices=["direct", "tasks"],
                    default=["direct", "tasks"])
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import dask
    from distributed import Client, LocalCluster

    plan = [(s, 2, "rows", t) for t in args.transports for s in args.stores]
    plan += [(args.small, q, "partitions", t) for t in args.transports for q in args.partitions]
    runs = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(dask.config.set({"dl1.one-piece": False}))
        if args.scheduler:
            client = stack.enter_context(Client(args.scheduler, set_as_default=False))
        else:
            cluster = stack.enter_context(LocalCluster(
                n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                host="127.0.0.1"))  # fmt: skip
            client = stack.enter_context(Client(cluster, set_as_default=False))
        for store, q, series, how in plan:  # warm-up
            one_fit(store, q, args.ratio, args.tol, client, series, how)
        for k in range(args.repeat):
            for store, q, series, how in plan[k % len(plan) :] + plan[: k % len(plan)]:
                run = one_fit(store, q, args.ratio, args.tol, client, series, how)
                print(f"{Path(store).name} P={q} {how}: {run['seconds']:.3f} s, "
                      f"{run['calls']} calls, {run['rounds']} rounds", flush=True)  # fmt: skip
                runs.append(run)
    for store, q, series, how in plan:
        key = (store, q, series, how)
        mine = [r for r in runs
                if (r["store"], r["partitions"], r["series"], r["transport"]) == key]  # fmt: skip
        median = statistics.median(r["seconds"] for r in mine)
        print(f"{Path(store).name} P={q} {how}: median {median:.3f} s, calls {mine[0]['calls']}")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
