"""Frandi et al.'s Table 4/5 setting: CD, SCD and stochastic Frank-Wolfe Lasso paths.

For each preset, in one run on the same data (train split; test split for the MSE):

* **CD (dl1)**: ``dl1.path`` (working sets), 100 alphas from ``lambda_max`` to
  ``lambda_max / 100``, relative duality gap ``--cd-tol`` at every alpha;
* **CD (scikit-learn)**: ``Lasso`` warm-started along the same grid, ``tol=--cd-tol``;
* **SCD**: dl1's feature-partitioned coordinate descent with uniformly random coordinate
  order (Shalev-Shwartz & Tewari), warm-started along the same grid, same gap;
* **FW 1%, 2%, 3%**: ``dl1.path_constrained`` on 100 radii from ``delta_max / 100`` to
  ``delta_max = ||w(lambda_min)||_1`` (the paper's mapping, from the last solution of dl1's
  CD path, as the paper took glmnet's), warm-started with the paper's rescaling, stopped by
  the paper's rule ``||a_{k+1} - a_k||_inf <= 1e-3``; every radius is then certified by one
  full pass (exact FW gap), which counts in the time. One FW iteration is one round trip to
  the workers; with ``--fw-in-process`` FW also runs in a single process (no Dask, one
  core: the paper's setting), labelled "local".

Printed per method: seconds, iterations (CD: rounds / epochs; FW: iterations), dot products
(columns scored; CD methods: passes x p, an undercount of their inner updates), passes over
the nonzeros, mean active features along the path, the least test MSE and the l1 norm where
it is reached, speed-ups relative to both CD paths, and peak memory (client + workers). FW's
gaps are reported as measured: the paper's stopping rule does not aim at a small gap.
dl1's methods run on a 2-worker LocalCluster (blocks in worker memory; loading the store is
included, numba compilation is not); scikit-learn in a child process with X in memory.
A figure of test MSE against the l1 norm (the paper's Fig. 5/6) is written per preset.

    python benchmarks/bench_fw_path.py --presets tfidf log1p --data-dir bench-out
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import numpy as np
from bench_fit import _load, _peak_mb, in_child, preset_data


def _cluster():
    from distributed import Client, LocalCluster

    import dl1

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address="127.0.0.1:0")
    client = Client(cluster)
    dl1.runtime.executor.DistributedExecutor(client)  # numba warm-up, excluded
    return cluster, client


def _close(cluster, client):
    mem = _peak_mb() + sum(client.run(_peak_mb).values())
    client.close()
    cluster.close()
    return mem


def _sparse(coef):
    """(indices, values) of a coefficient vector: 100 dense vectors of p = 4.3M would take
    3.4 GB per method."""
    idx = np.flatnonzero(coef)
    return idx, np.asarray(coef)[idx].astype(np.float64)


def _path_out(res):
    C = res.coefs_.tocsc()
    return [
        ((C.indices[C.indptr[k] : C.indptr[k + 1]], C.data[C.indptr[k] : C.indptr[k + 1]]),
         float(res.intercepts_[k]))
        for k in range(C.shape[1])
    ]  # fmt: skip


def _run_dl1_cd(path, grid, tol, q):
    import dl1

    cluster, client = _cluster()
    t0 = time.perf_counter()
    res = dl1.path(path, alphas=grid, tol=tol, client=client)
    dt = time.perf_counter() - t0
    mem = _close(cluster, client)
    stats = {
        "iterations": int(res.rounds_.sum()),
        "passes": float(res.passes_.sum()),
        "certified": int(res.converged_.sum()),
    }
    q.put((dt, _path_out(res), mem, stats))


def _run_scd(path, grid, tol, time_limit, q):
    from dl1.inputs import read_inputs
    from dl1.loading import load_problem
    from dl1.objective.penalties.elastic_net import ElasticNet
    from dl1.runtime.executor import executor_for
    from dl1.solvers.cd import CoordinateDescentSolver

    cluster, client = _cluster()
    t0 = time.perf_counter()
    ex = executor_for(client)
    problem, _ = load_problem(
        read_inputs(path, None, None, "squared", "train"), ex, penalty=ElasticNet(1.0),
        fit_intercept=True, standardize=False, tol=tol, n_partitions=2, loss="squared",
        streamed=False,
    )  # fmt: skip
    solver = CoordinateDescentSolver(max_rounds=2000, n_epochs=1, random_order=True, seed=0)
    state, out, epochs, cert = None, [], 0, 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for alpha in grid:
            res, state = solver.solve(problem.at(ElasticNet(float(alpha))), state)
            w, b = res.coef_, res.intercept_
            out.append((_sparse(w), float(b)))
            epochs += res.n_rounds_
            cert += int(res.converged_)
            if time.perf_counter() - t0 > time_limit:
                break
    dt = time.perf_counter() - t0
    mem = _close(cluster, client)
    q.put((dt, out, mem, {"iterations": epochs, "passes": float(epochs), "certified": cert}))


def _run_sklearn(path, grid, tol, time_limit, q):
    from sklearn.linear_model import Lasso

    X, y = _load(path)
    m = Lasso(alpha=grid[0], tol=tol, max_iter=100_000, warm_start=True)
    out, t, epochs = [], 0.0, 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for alpha in grid:
            m.set_params(alpha=alpha)
            t0 = time.perf_counter()
            m.fit(X, y)
            t += time.perf_counter() - t0
            epochs += int(m.n_iter_)
            out.append((_sparse(np.asarray(m.coef_).ravel()), float(m.intercept_)))
            if t > time_limit:
                break
    q.put((t, out, _peak_mb(), {"iterations": epochs, "passes": float(epochs)}))


class _TimeUp(Exception):
    pass


def _run_fw(path, deltas, sample, local, certify, time_limit, nnz, q):
    """FW path, stopped after the radius that crosses ``time_limit`` (the callback keeps
    each finished radius; warm starts are unaffected)."""
    import dl1

    if local:
        from dl1.runtime.executor import warm_up

        warm_up()
        cluster = client = None
    else:
        cluster, client = _cluster()
    out, st = [], []

    def keep(k, delta, res):
        out.append((_sparse(res.coef_), float(res.intercept_)))
        st.append(res)
        if time.perf_counter() - t0 > time_limit:
            raise _TimeUp

    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            dl1.path_constrained(
                path, deltas=deltas, sample=sample, stop="paper", certify=certify,
                client=client, callback=keep,
            )  # fmt: skip
        except _TimeUp:
            pass
    dt = time.perf_counter() - t0
    mem = _peak_mb() if local else _close(cluster, client)
    stats = {
        "iterations": int(sum(r.n_iter_ for r in st)),
        "dot_products": int(sum(r.dot_products_ for r in st)),
        "passes": float(sum(r.nnz_visited_ for r in st)) / max(nnz, 1),
        "fw_gaps": np.array([r.gap_ for r in st]),
        "lasso_gaps": np.array([r.lasso_gap_ for r in st]),
        "full_passes": int(sum(r.n_full_passes_ for r in st)),
    }
    q.put((dt, out, mem, stats))


def _report(name, runs, curves, Xt, yt, p) -> None:
    """Print a method's row as soon as it has run: a run stopped midway keeps what it printed."""
    dt, out, mem, st = runs[name]
    t_cd = runs["CD (dl1)"][0]
    t_skl = runs["CD (sklearn)"][0] if "CD (sklearn)" in runs else float("nan")
    l1 = np.array([np.abs(v).sum() for (_, v), _ in out])
    mse = np.array([np.mean((yt - Xt[:, i] @ v - b) ** 2) for (i, v), b in out])
    nz = np.array([np.count_nonzero(v) for (_, v), _ in out])
    curves[name] = (l1, mse)
    k = int(np.argmin(mse))
    n = len(runs["CD (dl1)"][1])
    # a run stopped by the time limit would have taken longer than it ran: its speed-ups
    # are upper bounds; scikit-learn stopped by it likewise: speed-ups over it, lower bounds
    skl_part = "CD (sklearn)" in runs and len(runs["CD (sklearn)"][1]) < n
    part = len(out) < n
    sp_cd = ("<" if part else "") + f"{t_cd / dt:.2f}"
    sp_skl = "-" if part and skl_part else ("<" if part else ">" if skl_part else "")
    if sp_skl != "-":
        sp_skl += f"{t_skl / dt:.2f}"
    dots = st.get("dot_products", st["passes"] * p)
    print(
        f"  {name:13s} {dt:8.1f} {len(out):4d} {st['iterations']:8d} {dots:10.3g} "
        f"{st['passes']:8.1f} {nz.mean():8.1f} {mse[k]:12.6g} {l1[k]:8.3g} "
        f"{sp_cd:>11s} {sp_skl:>11s} {mem:8.0f}"
        + (f"  (time limit: {len(out)} of {n} points)" if len(out) < n else ""),
        flush=True,
    )


def _plot(curves, out: Path, title: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for name, (l1, mse) in curves.items():
        ax.plot(l1, mse, lw=1, label=name)
    ax.set_xlabel("l1 norm of the solution")
    ax.set_ylabel("test MSE")
    ax.set_title(title)
    ax.legend(fontsize="small")
    fig.savefig(out, dpi=100)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", nargs="+", default=["tfidf", "log1p"])
    ap.add_argument("--data-dir", default="bench-out")
    ap.add_argument("--n-alphas", type=int, default=100)
    ap.add_argument("--eps", type=float, default=1e-2)
    ap.add_argument("--cd-tol", type=float, default=1e-4, help="relative gap of CD and SCD")
    ap.add_argument("--samples", nargs="+", type=float, default=[0.01, 0.02, 0.03])
    ap.add_argument(
        "--time-limit", type=float, default=1800.0, help="seconds per method (sklearn, SCD, FW)"
    )
    ap.add_argument("--skip", nargs="*", default=[], help="methods to skip: sklearn scd")
    ap.add_argument(
        "--fw-uncertified",
        action="store_true",
        help="also run FW without the certifying full pass per delta (the paper's setting)",
    )
    ap.add_argument(
        "--fw-in-process",
        action="store_true",
        help="also run FW in one process without Dask (no round trip per iteration)",
    )
    args = ap.parse_args(argv)

    import dl1
    from dl1.paths.evaluation import alpha_grid

    for preset in args.presets:
        path, X, y, amax = preset_data(preset, args.data_dir)
        store = dl1.open_store(path)
        import scipy.sparse as sp

        Xt = sp.csc_matrix(store.to_dask("test").compute(scheduler="sync"))
        yt = store.read("y", "test")
        grid = alpha_grid(amax, args.n_alphas, args.eps)
        runs = {}
        runs["CD (dl1)"] = in_child(_run_dl1_cd, str(path), grid, args.cd_tol)
        # as in the paper (glmnet's solution at lambda_min): the CD path's last solution
        dmax = float(np.abs(runs["CD (dl1)"][1][-1][0][1]).sum())
        deltas = np.geomspace(args.eps * dmax, dmax, args.n_alphas)
        p, nnz = X.shape[1], X.nnz
        print(
            f"\n{preset}: train {X.shape[0]:,} x {p:,} ({nnz:,} nnz), test {Xt.shape[0]:,}; "
            f"{args.n_alphas} alphas alpha_max={amax:.4g} .. {args.eps:g} alpha_max; "
            f"{args.n_alphas} deltas {deltas[0]:.4g} .. delta_max={dmax:.4g}",
            flush=True,
        )
        head = (
            f"  {'method':13s} {'seconds':>8s} {'pts':>4s} {'iters':>8s} {'dot prod':>10s} "
            f"{'passes':>8s} {'mean nnz':>8s} {'min test MSE':>12s} {'at l1':>8s} "
            f"{'x vs dl1 CD':>11s} {'x vs skl CD':>11s} {'peak MB':>8s}"
        )
        curves = {}
        if "sklearn" not in args.skip:
            runs["CD (sklearn)"] = in_child(
                _run_sklearn, str(path), grid, args.cd_tol, args.time_limit
            )
        print(head)
        _report("CD (dl1)", runs, curves, Xt, yt, p)
        if "CD (sklearn)" in runs:
            _report("CD (sklearn)", runs, curves, Xt, yt, p)
        if "scd" not in args.skip:
            runs["SCD (dl1)"] = in_child(_run_scd, str(path), grid, args.cd_tol, args.time_limit)
            _report("SCD (dl1)", runs, curves, Xt, yt, p)
        for s in args.samples:
            kinds = [("", False, True)]
            if args.fw_uncertified:
                kinds.append((" uncert.", False, False))
            if args.fw_in_process:
                kinds.append((" local", True, True))
            for label, local, certify in kinds:
                name = f"FW {s:.0%}{label}"
                runs[name] = in_child(
                    _run_fw, str(path), deltas, s, local, certify, args.time_limit, nnz
                )
                _report(name, runs, curves, Xt, yt, p)
        yc = y - y.mean()
        f0 = 0.5 * yc @ yc
        for name, (_, out, _, st) in runs.items():
            if "fw_gaps" in st:
                # exact FW gaps recomputed here in NumPy (not timed), for every FW run
                g = []
                for ((i, v), _), d in zip(out, deltas[: len(out)], strict=True):
                    r = yc - X[:, i] @ v
                    grad = -(X.T @ (r - r.mean()))
                    g.append((v @ grad[i] + d * np.abs(grad).max()) / f0)
                g = np.array(g)
                lg = st["lasso_gaps"]
                lgs = f"{np.nanmedian(lg):.2e}" if np.isfinite(lg).any() else "n/a (no full pass)"
                print(
                    f"  {name}: relative FW gap (recomputed) median {np.median(g):.2e}, max "
                    f"{g.max():.2e}; penalised-Lasso gap at the implied alpha median {lgs}; "
                    f"{st['full_passes']} full passes"
                )
            elif "certified" in st:
                print(f"  {name}: {st['certified']} of {len(runs[name][1])} alphas certified")
        fig = Path(args.data_dir) / f"fw_path_{preset}.png"
        _plot(curves, fig, f"{preset}: test MSE along the path")
        print(f"  figure: {fig}")


if __name__ == "__main__":
    main()
