"""Side-by-side cross-validated Lasso: dl1.LassoCV vs scikit-learn's and celer's LassoCV.

For each preset, in one run on the same data: a K-fold ``LassoCV`` (``KFold(K)``, no
shuffle: the same folds for everyone) on the same grid of ``n_alphas`` alphas from the whole
data's ``alpha_max`` down to ``eps * alpha_max``, then the refit at the chosen alpha.

dl1 runs on a 2-worker LocalCluster on a data handle (``dl1.persist`` of the store: reading
the store is timed), every fold's alphas certified at relative duality gap ``--tol`` by
dl1's gap on the fold's rows (an alpha that is not is reported by a ConvergenceWarning,
counted here). The peers run in child processes with X in memory (loading not timed), at
their own ``tol`` (scikit-learn's and celer's duality-gap tolerance, scaled by
``||y||^2 / n``: comparable, not identical); their held-out errors are compared with dl1's
(largest relative difference) and their chosen alphas printed. Peak memory: the child's peak
RSS; for dl1 the client's plus the workers'.

    python benchmarks/bench_cv.py --presets tfidf --folds 5 --n-alphas 100 --eps 1e-2
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import queue
import time
import warnings

import numpy as np
from bench_fit import _load, _peak_mb, preset_data


def in_child(target, *args, limit=None):
    """``target(*args, q)`` in a spawned process; None if it runs past ``limit`` seconds
    (then killed)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, q))
    p.start()
    try:
        out = q.get(timeout=limit)
    except queue.Empty:
        p.kill()
        out = None
    p.join()
    return out


def _run_dl1(path, grid, folds, tol, q):
    from distributed import Client, LocalCluster
    from sklearn.model_selection import KFold

    import dl1

    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster) as client,
    ):
        dl1.runtime.executor.DistributedExecutor(client)  # warm-up, excluded
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", dl1.ConvergenceWarning)
            t0 = time.perf_counter()
            with dl1.persist(path, client=client) as ds:
                est = dl1.LassoCV(alphas=grid, cv=KFold(folds), tol=tol, client=client).fit(ds)
            dt = time.perf_counter() - t0
        mem = _peak_mb() + sum(client.run(_peak_mb).values())
    uncertified = [str(w.message) for w in caught if issubclass(w.category, dl1.ConvergenceWarning)]
    q.put((dt, est.alpha_, est.mse_path_, mem, uncertified, est.alpha_1se_))


def _run_peer(name, path, grid, folds, tol, q):
    from sklearn.model_selection import KFold

    X, y = _load(path)
    if name == "sklearn":
        from sklearn.linear_model import LassoCV

        m = LassoCV(alphas=grid, cv=KFold(folds), tol=tol, max_iter=100_000)
    elif name == "celer":
        # celer's LassoCV passes scikit-learn < 1.9 arguments (n_alphas) and fails with
        # 1.9: its Lasso, warm-started along the grid on each fold, is what it runs
        m = _FoldPaths(grid, KFold(folds), tol)
    else:
        raise ValueError(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        m.fit(X, y)
        dt = time.perf_counter() - t0
    q.put((dt, float(m.alpha_), np.asarray(m.mse_path_), _peak_mb(), [], float("nan")))


class _FoldPaths:
    """celer's ``Lasso`` warm-started along ``grid`` on each fold's training rows, held-out
    MSE per alpha, the least mean chosen, then a refit (what ``LassoCV`` does)."""

    def __init__(self, grid, cv, tol):
        self.grid, self.cv, self.tol = grid, cv, tol

    def fit(self, X, y):
        from celer import Lasso

        mse = np.zeros((len(self.grid), self.cv.get_n_splits()))
        for f, (tr, te) in enumerate(self.cv.split(X)):
            m = Lasso(alpha=self.grid[0], tol=self.tol, max_iter=1000, max_epochs=100_000,
                      warm_start=True)  # fmt: skip
            for k, alpha in enumerate(self.grid):
                m.set_params(alpha=alpha).fit(X[tr], y[tr])
                mse[k, f] = np.mean((y[te] - m.predict(X[te])) ** 2)
        self.mse_path_ = mse
        self.alpha_ = float(self.grid[int(np.argmin(mse.mean(axis=1)))])
        Lasso(alpha=self.alpha_, tol=self.tol, max_iter=1000, max_epochs=100_000).fit(X, y)
        return self


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", nargs="+", default=["tfidf"])
    ap.add_argument("--data-dir", default="bench-out")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--n-alphas", type=int, default=100)
    ap.add_argument("--eps", type=float, default=1e-2)
    ap.add_argument("--tol", type=float, default=1e-6, help="dl1: relative gap of every alpha")
    ap.add_argument("--peer-tol", type=float, default=1e-6)
    ap.add_argument("--peers", nargs="*", default=["celer", "sklearn"])
    ap.add_argument("--time-limit", type=float, default=1800.0, help="seconds per peer")
    args = ap.parse_args(argv)

    from dl1.paths.evaluation import alpha_grid

    for preset in args.presets:
        path, X, y, amax = preset_data(preset, args.data_dir)
        grid = alpha_grid(amax, args.n_alphas, args.eps)
        del X, y
        print(f"\n{preset}: {args.folds}-fold LassoCV, {args.n_alphas} alphas from alpha_max = "
              f"{amax:.4g} to {args.eps:g} alpha_max; dl1 tol {args.tol:g}, peers "
              f"{args.peer_tol:g}", flush=True)  # fmt: skip
        rows = {}
        for name in ["dl1", *args.peers]:
            if name == "dl1":
                out = in_child(_run_dl1, str(path), grid, args.folds, args.tol)
            else:
                out = in_child(_run_peer, name, str(path), grid, args.folds, args.peer_tol,
                               limit=args.time_limit)  # fmt: skip
                if out is None:
                    print(f"  {name:8s} stopped after {args.time_limit:.0f} s", flush=True)
                    rows[name] = (float("inf"), np.nan, None, np.nan, [], np.nan)
                    continue
            rows[name] = out
            dt, alpha, mse, mem, bad, a1se = out
            diff = np.abs(mse - rows["dl1"][2]).max() / np.abs(rows["dl1"][2]).max()
            extra = f"  alpha_1se {a1se:.4g}  uncertified {len(bad)}" if name == "dl1" else ""
            print(f"  {name:8s} {dt:8.1f} s  alpha_ {alpha:.4g}  peak {mem:7.0f} MB  "
                  f"mse_path vs dl1 {diff:.1e}{extra}", flush=True)  # fmt: skip
            for msg in bad[:3]:
                print(f"    {msg}")
        t = rows["dl1"][0]
        print("  ratios (peer / dl1): " + ", ".join(
            f"{k} {v[0] / t:.2f}" if np.isfinite(v[0]) else f"{k} > {args.time_limit / t:.2f}"
            for k, v in rows.items() if k != "dl1"))  # fmt: skip


if __name__ == "__main__":
    main()
