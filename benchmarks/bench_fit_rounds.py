"""One alpha, every solver in turn: dl1 and its peers interleaved in rounds.

``bench_matrix.py`` runs each solver's repeats back to back in its own child process, one
solver after another; on a shared or drifting machine (the same fit 1.1 s in one minute and
1.7 s in the next, ``benchmarks/RESULTS.md``) a ratio of two such medians carries the drift
between them. Here every round runs each solver once (each round starting one solver
later, every timed call after a pause of ``--settle`` seconds), so that each round's ratio
compares runs seconds apart; the speed-up quoted is the median over rounds of (fastest
certified peer's seconds in the round) / (dl1's seconds in the round), beside each
solver's median seconds. The pause matters: after a fit, celer and scikit-learn leave a
thread of this process spinning for about 0.1 s (their OpenMP or OpenBLAS threads waiting
for work), which on two cores takes one from whatever runs next.

- ``dl1``: ``dl1.fit`` on a cluster of a real ``dask scheduler`` and ``--workers``
  single-threaded ``dask worker`` processes on 127.0.0.1 (this process holds only the
  client, as a user's would), or with ``--cluster local`` on Dask's ``LocalCluster`` of
  as many worker processes (its scheduler in this process, as ``bench_matrix.py`` runs
  dl1), its store read in every run;
- ``dl1-inproc``: ``dl1.fit(..., client=None)`` in this process under ``dask.config``'s
  scheduler ``sync`` (the client stays connected, unused);
- the peers (``bench_matrix.Peer``): ``X`` in memory (loading not timed), at the tol that
  certifies their warm-up fit (``PEER_TOL``, else 100x tighter), certified by the same
  NumPy gap as ``bench_matrix.py``; a peer whose warm-up fit takes more than
  ``--peer-limit-factor`` x dl1's warm-up (and ``--peer-limit-min`` seconds) is left out of
  the rounds and reported as "> t s (once)". A warm-up is not stopped: ``--peers`` leaves
  out a peer known to take minutes (``bench_matrix.py`` stops its runs).

Memory, per solver, the largest over its timed calls: the growth of this process's RSS
during the call (Linux's high-water mark, restarted before each call), and for ``dl1`` its
workers' peak RSS (the peers and ``dl1-inproc`` hold their data in this process from the
start; ``bench_matrix.py`` reports whole-process peaks, each solver in its own child).

    python benchmarks/bench_fit_rounds.py --presets small short --losses squared logistic \\
        --rounds 7 --data-dir bench-out --json bench-out/fit-rounds.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import bench_matrix
import cloudpickle
import numpy as np
from bench_matrix import (
    PEER_TOL,
    PEERS,
    RETRY_FACTOR,
    TARGET,
    Peer,
    _load,
    _peak_mb,
    _reset_peak,
    local_cluster,
    p_zero,
    rel_gap,
    store_for,
)
from bench_matrix import alpha_max as np_alpha_max


@contextlib.contextmanager
def dask_cluster(n_workers: int) -> Iterator[Any]:
    """A client of a ``dask scheduler`` and ``n_workers`` one-thread ``dask worker``
    processes on 127.0.0.1, stopped on exit."""
    from distributed import Client

    with tempfile.TemporaryDirectory(prefix="dl1-rounds-") as tmp:
        sched_file = os.path.join(tmp, "scheduler.json")
        procs = [subprocess.Popen(
            ["dask", "scheduler", "--host", "127.0.0.1", "--port", "0",
             "--dashboard-address", "127.0.0.1:0", "--scheduler-file", sched_file],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while not os.path.exists(sched_file):
                if time.monotonic() > deadline:
                    raise RuntimeError("the scheduler did not start within 60 s")
                time.sleep(0.1)
            procs.append(subprocess.Popen(
                ["dask", "worker", "--scheduler-file", sched_file, "--nworkers",
                 str(n_workers), "--nthreads", "1", "--host", "127.0.0.1"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))  # fmt: skip
            with Client(scheduler_file=sched_file, set_as_default=False) as client:
                client.wait_for_workers(n_workers, timeout=120)
                yield client
        finally:
            for p in reversed(procs):
                p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()


class Dl1:
    """``dl1.fit`` on the cluster (``client``) or in this process (``client=None``)."""

    def __init__(self, name: str, loss: str, store: str, client: Any) -> None:
        self.name, self.loss, self.store, self.client = name, loss, store, client

    def fit(self, alpha: float) -> tuple[np.ndarray, float, float]:
        import dask

        import dl1

        scheduler = {} if self.client is not None else {"scheduler": "sync"}
        with dask.config.set(**scheduler):
            t0 = time.perf_counter()
            res = dl1.fit(self.store, alpha=alpha, tol=TARGET, loss=self.loss,
                          client=self.client)  # fmt: skip
            dt = time.perf_counter() - t0
        return np.asarray(res.coef_, dtype=np.float64), float(res.intercept_), dt


class PeerFit:
    """A peer's one-alpha fit on ``X`` in memory, at the tol its warm-up certified."""

    def __init__(self, name: str, loss: str, X: Any, y: np.ndarray) -> None:
        self.peer = Peer(name, loss, warm=False)
        self.name, self.loss, self.X, self.y = name, loss, X, y
        self.Xp = self.peer.prepare(X)
        self.tol = PEER_TOL[(name, loss)]

    def fit(self, alpha: float) -> tuple[np.ndarray, float, float]:
        return self.peer.fit(self.Xp, self.X, self.y, alpha, self.tol)


def warm_up(solver: Any, alpha: float, gap: Any) -> tuple[float, float]:
    """One untimed fit (numba compilation, imports, a worker's first solve); a peer whose
    fit the check does not certify moves to a 100x tighter tol, fitted once more. Returns
    (seconds of the last warm-up fit, its gap)."""
    coef, b, dt = solver.fit(alpha)
    g = gap(coef, b)
    if g > TARGET and isinstance(solver, PeerFit):
        solver.tol /= RETRY_FACTOR
        coef, b, dt = solver.fit(alpha)
        g = gap(coef, b)
    return dt, g


def reset_peaks(client: Any) -> float:
    """Restart the high-water RSS of this process (and of ``client``'s workers, if given);
    returns this process's RSS now, in MB."""
    _reset_peak()
    if client is not None:
        client.run(_reset_peak)
    return _peak_mb()


def peaks(client: Any, before: float) -> dict[str, Any]:
    """Memory of the call since :func:`reset_peaks`: this process's peak RSS above its RSS
    ``before`` (MB), and the peak RSS of each of ``client``'s workers (MB), if given."""
    out: dict[str, Any] = {"here_mb": _peak_mb() - before}
    if client is not None:
        out["workers_mb"] = sorted(client.run(_peak_mb).values())
    return out


def cell(preset: str, loss: str, args: argparse.Namespace, client: Any) -> dict[str, Any]:
    """One (preset, loss): the solvers warmed up, then ``args.rounds`` rounds."""
    store = str(store_for(preset, loss, Path(args.data_dir), False))
    X, y = _load(store)
    p0 = p_zero(y, loss)
    alpha = np_alpha_max(X, y, loss) / args.ratio

    def gap(coef: np.ndarray, b: float) -> float:
        return rel_gap(X, y, loss, coef, b, alpha, p0)

    solvers: dict[str, Any] = {"dl1": Dl1("dl1", loss, store, client),
                               "dl1-inproc": Dl1("dl1-inproc", loss, store, None)}  # fmt: skip
    peers = [name for name in PEERS[loss] if name in args.peers]
    solvers.update({name: PeerFit(name, loss, X, y) for name in peers})
    rec: dict[str, Any] = {"preset": preset, "loss": loss, "alpha": alpha, "shape": X.shape,
                           "nnz": int(X.nnz), "solvers": {}}  # fmt: skip
    limit = None
    for name, solver in list(solvers.items()):
        dt, g = warm_up(solver, alpha, gap)
        if name == "dl1":  # again: a solve in one piece compiles in the worker it runs on
            dt, g = warm_up(solver, alpha, gap)
            limit = max(args.peer_limit_min, args.peer_limit_factor * dt)
        left_out = name not in ("dl1", "dl1-inproc") and dt > limit
        rec["solvers"][name] = {"warmup_s": dt, "gap": g, "left_out": left_out,
                                "tol": getattr(solver, "tol", TARGET), "times": [],
                                "peaks": []}  # fmt: skip
        if left_out:
            del solvers[name]
        print(f"  {preset}/{loss} warm-up {name:10s} {dt:8.3f} s  gap {g:.1e}"
              + ("  (left out)" if left_out else ""), file=sys.stderr, flush=True)  # fmt: skip
    names = list(solvers)
    for r in range(args.rounds):
        # each round starts one solver later, and each timed call after a pause: no
        # solver always runs right after the same one
        for name in names[r % len(names) :] + names[: r % len(names)]:
            on = client if name == "dl1" else None
            before = reset_peaks(on)
            time.sleep(args.settle)
            coef, b, dt = solvers[name].fit(alpha)
            rec["solvers"][name]["times"].append(dt)
            rec["solvers"][name]["peaks"].append(peaks(on, before))
            if r == args.rounds - 1:
                rec["solvers"][name]["gap"] = gap(coef, b)
    return rec


def speed_ups(rec: dict[str, Any], dl1: str) -> list[float]:
    """Per round: the fastest certified peer's seconds / ``dl1``'s seconds."""
    peers = [s for n, s in rec["solvers"].items()
             if n not in ("dl1", "dl1-inproc") and s["times"] and s["gap"] <= TARGET]  # fmt: skip
    ours = rec["solvers"][dl1]["times"]
    if not peers or not ours:
        return []
    return [min(p["times"][r] for p in peers) / ours[r] for r in range(len(ours))]


NAMES = ["dl1", "dl1-inproc", "celer", "skglm", "sklearn", "liblinear", "snapml"]


def table(records: list[dict[str, Any]]) -> str:
    head = ("| preset | loss | " + " | ".join(NAMES)
            + " | speed-up (cluster) | speed-up (in process) |")  # fmt: skip
    lines = [head, "|" + "---|" * (len(NAMES) + 4)]
    for rec in records:
        cells = []
        for n in NAMES:
            s = rec["solvers"].get(n)
            if s is None:
                cells.append("")
            elif s["left_out"]:
                cells.append(f"> {s['warmup_s']:.2f} s (once)")
            else:
                mark = "" if s["gap"] <= TARGET else f" ✗ ({s['gap']:.1e})"
                cells.append(f"{statistics.median(s['times']):.3f}{mark}")
        ratio = []
        for d in ("dl1", "dl1-inproc"):
            su = speed_ups(rec, d)
            ratio.append(f"{statistics.median(su):.2f}x ({min(su):.2f}-{max(su):.2f})"
                         if su else "")  # fmt: skip
        lines.append(f"| {rec['preset']} | {rec['loss']} | " + " | ".join(cells + ratio) + " |")
    return "\n".join(lines)


def memory_table(records: list[dict[str, Any]]) -> str:
    """The largest memory of each solver's timed calls: ``+x``, the growth of this process's
    RSS during the call (the peers and ``dl1-inproc`` run here, on data loaded beforehand;
    ``dl1`` holds only the client here); for ``dl1``, its workers' peak RSS after it."""
    lines = ["| preset | loss | " + " | ".join(NAMES) + " |", "|" + "---|" * (len(NAMES) + 2)]
    for rec in records:
        cells = []
        for n in NAMES:
            got = (rec["solvers"].get(n) or {}).get("peaks") or []
            cell = f"+{max(p['here_mb'] for p in got):.0f}" if got else ""
            if got and "workers_mb" in got[0]:
                each = np.max([p["workers_mb"] for p in got], axis=0)
                cell += "; workers " + ", ".join(f"{v:.0f}" for v in each)
            cells.append(cell)
        lines.append(f"| {rec['preset']} | {rec['loss']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["small", "short"])
    ap.add_argument("--losses", nargs="+", default=["squared", "logistic"],
                    choices=["squared", "logistic"])  # fmt: skip
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--ratio", type=float, default=20.0, help="alpha = alpha_max / ratio")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cluster", choices=["scheduler", "local"], default="scheduler",
                    help="dl1's cluster: dask scheduler and worker processes, or Dask's "
                    "LocalCluster")  # fmt: skip
    ap.add_argument("--settle", type=float, default=0.5,
                    help="seconds of pause before each timed call")
    ap.add_argument("--peers", nargs="+", default=sorted({p for ps in PEERS.values() for p in ps}),
                    help="a subset of the peers (a warm-up fit is never stopped: leave out a "
                    "peer known to take minutes)")  # fmt: skip
    ap.add_argument("--peer-limit-factor", type=float, default=10.0)
    ap.add_argument("--peer-limit-min", type=float, default=5.0)
    ap.add_argument("--data-dir", default="bench-out")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the cluster on the way out
    # the workers cannot import bench_matrix: its functions they run travel by value
    cloudpickle.register_pickle_by_value(bench_matrix)
    records = []
    local = partial(local_cluster, as_default=False)
    start = dask_cluster if args.cluster == "scheduler" else local
    with start(args.workers) as client:
        for preset in args.presets:
            for loss in args.losses:
                records.append(cell(preset, loss, args, client))
    print("Seconds, medians of", args.rounds, "interleaved rounds; speed-up: median over"
          " rounds of the fastest certified peer's seconds / dl1's (range in brackets)\n")
    print(table(records))
    print("\nMemory, MB, the largest over the rounds: +x, this process's RSS growth during"
          " the call; dl1's workers: their peak RSS\n")
    print(memory_table(records))
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": vars(args), "records": records},
                                              indent=1, default=list))  # fmt: skip


if __name__ == "__main__":
    main()
