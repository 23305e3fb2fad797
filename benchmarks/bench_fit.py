"""Side-by-side: dl1.fit vs scikit-learn, celer and skglm on E2006-like data.

For each preset, in one run on the same data: every solver is asked for the Lasso at
``alpha = alpha_max / ratio`` (default 20) to relative duality gap 1e-6 (gap / P(0)); each
returned ``(w, b)`` is then checked with dl1's own gap computation, in NumPy, on the full
data. Every solver runs in its own child process, so peak memory (max RSS) is per solver;
dl1's figure adds its two workers' peaks. Peers receive the data in memory (not timed);
dl1's time includes reading its store on the workers (numba compilation is warmed up
first and excluded); its solve time alone is reported too.

    python benchmarks/bench_fit.py --presets tfidf log1p --repeat 3

Peers' tolerances are set to their documented stopping rules' equivalent of 1e-6:
scikit-learn and celer stop on ``gap <= tol * ||y||^2 / n`` (with centred y, i.e.
``2 P(0)``), so they get ``tol = 5e-7``; skglm stops on a KKT violation and starts at
``tol = 1e-6``.
Any peer whose answer dl1's check does not certify is rerun with a 10x tighter tol (up to
three times); the time of the last run is reported.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import sys
import time
from pathlib import Path

import numpy as np

TARGET = 1e-6


def _peak_mb() -> float:
    """Peak RSS of this process (VmHWM; ru_maxrss would include a forking parent's peak)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _load(path):
    import scipy.sparse as sp

    import dl1

    store = dl1.open_store(path)
    X = sp.csc_matrix(store.to_dask().compute(scheduler="sync"))
    return X, store.read("y")


def _run_peer(name, path, alpha, tol, q):
    X, y = _load(path)
    base = _peak_mb()
    if name == "sklearn":
        from sklearn.linear_model import Lasso

        m = Lasso(alpha=alpha, tol=tol, max_iter=100_000)
    elif name == "celer":
        from celer import Lasso

        m = Lasso(alpha=alpha, tol=tol, max_iter=1000, max_epochs=100_000)
    elif name == "skglm":
        from skglm import Lasso

        m = Lasso(alpha=alpha, tol=tol, max_iter=1000, max_epochs=100_000)
    elif name == "snapml":
        # Snap ML minimises 1/2 ||y - X w||^2 + regularizer ||w||_1 (a sum, not a mean); its
        # intercept is a penalised constant feature (scaled up to make the penalty
        # negligible) and is recomputed exactly below
        from snapml import LinearRegression

        m = LinearRegression(regularizer=alpha * X.shape[0], penalty="l1", dual=False,
                             fit_intercept=True, intercept_scaling=1e4, tol=tol,
                             max_iter=100_000)  # fmt: skip
    elif name == "sgd":
        from sklearn.linear_model import SGDRegressor

        m = SGDRegressor(penalty="l1", alpha=alpha, tol=tol, max_iter=1000, random_state=0)
    else:
        raise ValueError(name)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        m.fit(X, y)
        dt = time.perf_counter() - t0
    coef = np.asarray(m.coef_, dtype=np.float64).ravel()
    b = float(np.mean(y - X @ coef)) if name == "snapml" else float(np.ravel(m.intercept_)[0])
    q.put((dt, coef, b, _peak_mb(), base))


def _run_dl1(path, alpha, tol, n_workers, solver, q):
    from distributed import Client, LocalCluster

    import dl1

    with (
        LocalCluster(
            n_workers=n_workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address="127.0.0.1:0",
        ) as cluster,
        Client(cluster) as client,
    ):
        # warm-up (numba compilation / cache load) on every worker, excluded from timing
        dl1.runtime.executor.DistributedExecutor(client)
        t0 = time.perf_counter()
        res = dl1.fit(path, alpha=alpha, tol=tol, client=client, solver=solver)
        dt = time.perf_counter() - t0
        workers = client.run(_peak_mb)
    q.put((dt, res.coef_, res.intercept_, _peak_mb() + sum(workers.values()), res))


def in_child(target, *args):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, q))
    p.start()
    out = q.get()
    p.join()
    return out


def certify(X, y, coef, b, alpha):
    """Relative duality gap of (coef, b) by dl1's gap, computed in NumPy on the full data."""
    from dl1.objective.datafits import Quadratic
    from dl1.objective.gap import duality_gap
    from dl1.objective.penalties.elastic_net import ElasticNet

    df = Quadratic()
    z = X @ coef + b
    theta = df.dual_point(y, z, None, True)
    _, _, gap = duality_gap(df, ElasticNet(alpha), y, z, coef, X.T @ theta, theta=theta)
    p0 = df.value(y, np.full(y.shape[0], y.mean()))
    return gap / p0


def preset_data(preset: str, data_dir: str):
    """(store path, X in memory, y, alpha_max) of a preset, generated once into ``data_dir``."""
    from dl1.datasets import make_e2006_like

    path = Path(data_dir) / f"{preset}.zarr"
    if not (path / "dl1-manifest.json").exists():
        print(f"generating {preset} -> {path}", flush=True)
        make_e2006_like(path, preset=preset, seed=0, overwrite=True)
    X, y = _load(path)
    return path, X, y, np.abs(X.T @ (y - y.mean())).max() / X.shape[0]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", nargs="+", default=["tfidf", "log1p"])
    ap.add_argument("--data-dir", default="bench-out")
    ap.add_argument("--ratio", type=float, default=20.0, help="alpha = alpha_max / ratio")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--peers", nargs="+", default=["sklearn", "celer", "skglm"],
                    help="also: snapml (Snap ML's LinearRegression, L1), sgd (scikit-learn's "
                    "SGDRegressor, L1)")  # fmt: skip
    ap.add_argument("--solver", default="auto", help="dl1's solver= (default auto)")
    args = ap.parse_args(argv)

    for preset in args.presets:
        path, X, y, amax = preset_data(preset, args.data_dir)
        alpha = amax / args.ratio
        print(
            f"\n{preset}: {X.shape[0]:,} x {X.shape[1]:,}, nnz {X.nnz:,}; alpha = alpha_max/"
            f"{args.ratio:g} = {alpha:.4g}; target relative gap {TARGET:g}",
            flush=True,
        )
        rows = {}
        solves: list[float] = []
        overheads: list[float] = []
        for name in ["dl1", *args.peers]:
            times, mems = [], []
            for _ in range(args.repeat):
                if name == "dl1":
                    dt, coef, b, mem, res = in_child(
                        _run_dl1, str(path), alpha, TARGET, args.workers, args.solver
                    )
                    solves.append(res.solve_seconds_)
                    overheads.append(res.overhead_fraction_)
                    print(
                        f"  dl1 run: load {res.load_seconds_:.2f} s + solve "
                        f"{res.solve_seconds_:.2f} s, {res.n_rounds_} rounds, overhead "
                        f"fraction {res.overhead_fraction_:.1%} (steps: "
                        f"{'/'.join(sorted({h['transport'] for h in res.history_}))})",
                        flush=True,
                    )
                else:
                    tol = {"sklearn": 5e-7, "celer": 5e-7, "snapml": 1e-6, "sgd": 1e-6}.get(
                        name, TARGET
                    )
                    for _ in range(4):  # tighten until dl1's check certifies the answer
                        dt, coef, b, mem, _ = in_child(_run_peer, name, str(path), alpha, tol)
                        if certify(X, y, coef, b, alpha) <= TARGET:
                            break
                        tol /= 10
                times.append(dt)
                mems.append(mem)
            gap = certify(X, y, coef, b, alpha)
            rows[name] = (
                float(np.median(times)),
                gap,
                int(np.count_nonzero(coef)),
                float(np.median(mems)),
            )
            print(
                f"  {name:8s} {rows[name][0]:9.2f} s   gap {gap:.2e}   nnz {rows[name][2]:6d}"
                f"   peak {rows[name][3]:8.0f} MB",
                flush=True,
            )
        print(
            f"  dl1 overhead fraction, median of {len(overheads)} runs: "
            f"{float(np.median(overheads)):.1%}"
        )
        t_dl1 = rows["dl1"][0]
        s_dl1 = float(np.median(solves))
        print(
            f"\n  {'solver':8s} {'seconds':>9s} {'rel. gap':>9s} {'certified':>9s} {'nnz':>6s}"
            f" {'peak MB':>8s} {'peer/dl1':>8s} {'peer/dl1-solve':>14s}"
        )
        for name, (t, gap, nnz, mem) in rows.items():
            print(
                f"  {name:8s} {t:9.2f} {gap:9.2e} {str(gap <= TARGET * 1.0001):>9s} {nnz:6d}"
                f" {mem:8.0f} {t / t_dl1:8.2f} {t / s_dl1:14.2f}"
            )
        print(
            "  (peer/dl1 counts dl1's reading of its store from disk; peers get X in memory;"
            " peer/dl1-solve compares with dl1's solve time alone)"
        )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
