"""Side-by-side regularisation paths: dl1.path vs scikit-learn, celer and skglm.

For each preset, in one run on the same data, every solver computes the Lasso (with
intercept) on the same grid of ``n_alphas`` alphas from ``alpha_max`` down to
``eps * alpha_max``, warm-started from one alpha to the next, each alpha to relative duality
gap 1e-6 (gap / P(0)). Each peer's ``(w, b)`` at every alpha is checked with dl1's own gap
(NumPy, full data); an alpha that the check does not certify is re-solved from there with a
10x tighter tol (up to three times), and that time counts. A peer is stopped after
``--time-limit`` seconds; the alphas it finished are reported.

Peers run in child processes with X in memory (loading not timed): scikit-learn's ``Lasso``
(``enet_path`` for each alpha, warm start), celer's and skglm's ``Lasso`` (warm start).
dl1 runs on a 2-worker LocalCluster (blocks in worker memory, screening with ``--screen``;
reading the store is included in its time, numba compilation is not).

    python benchmarks/bench_path.py --presets tfidf log1p --time-limit 3600
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from bench_fit import TARGET, _load, _peak_mb, certify, in_child, preset_data


def _run_dl1(path, grid, tol, screen, q):
    from distributed import Client, LocalCluster

    import dl1

    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster) as client,
    ):
        dl1.runtime.executor.DistributedExecutor(client)  # warm-up, excluded
        t0 = time.perf_counter()
        res = dl1.path(path, alphas=grid, tol=tol, screen=screen, client=client)
        dt = time.perf_counter() - t0
        mem = _peak_mb() + sum(client.run(_peak_mb).values())
    coefs = res.coefs_.tocsc()
    out = [(coefs[:, k].toarray().ravel(), float(res.intercepts_[k])) for k in range(len(grid))]
    q.put((dt, out, mem, float(res.passes_.sum())))


def _estimator(name, alpha, tol):
    if name == "sklearn":
        from sklearn.linear_model import Lasso

        return Lasso(alpha=alpha, tol=tol, max_iter=100_000, warm_start=True)
    if name == "celer":
        from celer import Lasso

        return Lasso(alpha=alpha, tol=tol, max_iter=1000, max_epochs=100_000, warm_start=True)
    if name == "skglm":
        from skglm import Lasso

        return Lasso(alpha=alpha, tol=tol, max_iter=1000, max_epochs=100_000, warm_start=True)
    raise ValueError(name)


def _run_peer(name, path, grid, tol0, time_limit, q):
    import warnings

    X, y = _load(path)
    out = []
    t_total = 0.0
    m = _estimator(name, grid[0], tol0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for alpha in grid:
            tol = tol0
            for _ in range(4):
                m.set_params(alpha=alpha, tol=tol)
                t0 = time.perf_counter()
                m.fit(X, y)
                t_total += time.perf_counter() - t0
                coef, b = np.asarray(m.coef_).ravel().copy(), float(m.intercept_)
                if certify(X, y, coef, b, alpha) <= TARGET or t_total > time_limit:
                    break
                tol /= 10
            out.append((coef, b))
            if t_total > time_limit:
                break
    q.put((t_total, out, _peak_mb(), float("nan")))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", nargs="+", default=["tfidf", "log1p"])
    ap.add_argument("--data-dir", default="bench-out")
    ap.add_argument("--n-alphas", type=int, default=100)
    ap.add_argument("--eps", type=float, default=1e-2)
    ap.add_argument("--time-limit", type=float, default=3600.0, help="seconds per peer")
    ap.add_argument(
        "--peer-limit",
        nargs="*",
        default=[],
        metavar="PEER=SECONDS",
        help="a peer's own time limit (e.g. celer=1500), overriding --time-limit",
    )
    ap.add_argument("--peers", nargs="+", default=["sklearn", "celer", "skglm"])
    ap.add_argument("--screen", action="store_true", help="dl1 with gap-safe screening")
    args = ap.parse_args(argv)
    limits = {}
    for item in args.peer_limit:
        name, _, sec = item.partition("=")
        if name not in args.peers or not sec:
            ap.error(f"--peer-limit {item!r}: expected PEER=SECONDS with PEER in --peers")
        limits[name] = float(sec)

    from dl1.paths.evaluation import alpha_grid

    for preset in args.presets:
        path, X, y, amax = preset_data(preset, args.data_dir)
        grid = alpha_grid(amax, args.n_alphas, args.eps)
        print(
            f"\n{preset}: {X.shape[0]:,} x {X.shape[1]:,}, nnz {X.nnz:,}; {args.n_alphas} alphas"
            f" from alpha_max = {amax:.4g} to {args.eps:g} alpha_max; target relative gap "
            f"{TARGET:g} at every alpha",
            flush=True,
        )
        rows = {}
        for name in ["dl1", *args.peers]:
            if name == "dl1":
                dt, out, mem, passes = in_child(_run_dl1, str(path), grid, TARGET, args.screen)
            else:
                tol = 5e-7 if name in ("sklearn", "celer") else TARGET
                dt, out, mem, passes = in_child(
                    _run_peer, name, str(path), grid, tol, limits.get(name, args.time_limit)
                )
            gaps = np.array([certify(X, y, c, b, a) for (c, b), a in zip(out, grid, strict=False)])
            nnz = np.array([np.count_nonzero(c) for c, _ in out])
            rows[name] = (dt, len(out), int((gaps <= TARGET * 1.0001).sum()), gaps.max(), nnz, mem)
            print(
                f"  {name:8s} {dt:9.1f} s  alphas {len(out):3d}  certified "
                f"{rows[name][2]:3d}  max gap {gaps.max():.2e}  mean nnz {nnz.mean():7.1f}"
                f"  peak {mem:7.0f} MB" + (f"  passes {passes:.1f}" if name == "dl1" else ""),
                flush=True,
            )
        t_dl1 = rows["dl1"][0]
        print(
            f"\n  {'solver':8s} {'seconds':>9s} {'alphas':>6s} {'certified':>9s} {'max gap':>9s}"
            f" {'mean nnz':>8s} {'peak MB':>8s} {'peer/dl1':>8s}"
        )
        for name, (t, k, cert, gmax, nnz, mem) in rows.items():
            ratio = format(t / t_dl1, ".2f")
            ratio = f"{ratio if k == len(grid) else '>' + ratio:>8s}"
            print(
                f"  {name:8s} {t:9.1f} {k:6d} {cert:9d} {gmax:9.2e} {nnz.mean():8.1f}"
                f" {mem:8.0f} {ratio}"
            )
        print(
            "  (a peer stopped by the time limit has done fewer alphas: its ratio is a lower"
            " bound, marked >)"
        )


if __name__ == "__main__":
    main()
