"""L1 logistic regression in process: dl1.fit(..., client=None) against skglm's ProxNewton,
and the logistic datafit's kernels against NumPy ufuncs, with and without Dask's mmap
threshold.

Dask's worker environment sets ``MALLOC_MMAP_THRESHOLD_=65536``: every length-n temporary is
then a fresh mapping, page-faulted afresh. Each measurement runs in a child process started
with that variable (``mmap``) and without it (``plain``), so both are quoted.

``--kernels``: the datafit's hot paths (value, dual point with the intercept refitted,
intercept Newton step, conjugate) by dl1 (:mod:`dl1.kernels.margins`) and by NumPy ufuncs
(the implementation they replace, kept below as the reference), on ``n`` random rows.

``--fit``: one alpha (``alpha_max / ratio``) of a short-text classification store (the
``short`` preset with ``task="classification"`` unless ``--store``), loaded into memory
(not timed); dl1 and skglm (``GeneralizedLinearEstimator(Logistic(), L1(alpha),
ProxNewton(fit_intercept=True))``) each asked for relative duality gap 1e-6; every answer is
checked by dl1's gap computed in NumPy on the full data (a peer not certified is rerun with a
10x tighter tol, up to three times). Medians of ``--repeat`` runs after one warm-up.

    python benchmarks/bench_logistic.py --kernels --fit --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

TARGET = 1e-6
MMAP_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}


# ---------------------------------------------------------------- NumPy reference kernels
def numpy_kernels(y, z, s=None):
    """The datafit's quantities by NumPy ufuncs (value, theta with the intercept refitted
    by Newton's method on four ufunc sums, conjugate)."""
    from scipy.special import expit, xlogy

    n = y.shape[0]
    value = float(np.logaddexp(0.0, -y * z).sum()) / n
    db = 0.0
    for _ in range(50):
        m = -y * (z + db)
        q = expit(m)
        t_sum, t_abs, curv = float(y @ q), float(q.sum()), float((q * (1 - q)).sum())
        if abs(t_sum) <= 1e-13 * t_abs:
            break
        db += t_sum / curv
    theta = y * expit(-y * (z + db))
    pos = theta > 0
    mp, mn = theta[pos].sum(), -theta[~pos].sum()
    theta[pos if mp > mn else ~pos] *= min(mp, mn) / max(mp, mn)
    t = np.clip(y * theta, 0.0, 1.0)
    conj = float((xlogy(t, t) + xlogy(1 - t, 1 - t)).sum()) / n
    return value, theta, conj


def dl1_kernels(y, z, s=None):
    """The same quantities by the datafit (fused numba loops)."""
    from dl1.objective.datafits import Logistic

    df = Logistic()
    theta = df.dual_point(y, z, s, True)
    return df.value(y, z, s), theta, df.conjugate(y, theta, s)


def time_kernels(n: int, repeat: int) -> dict[str, float]:
    """Median seconds of one call of each implementation (this process)."""
    rng = np.random.default_rng(0)
    y = np.where(rng.random(n) < 0.1, 1.0, -1.0)
    z = rng.normal(-2.0, 1.5, n)
    out = {}
    ref = numpy_kernels(y, z)
    got = dl1_kernels(y, z)
    assert abs(ref[0] - got[0]) <= 1e-12 * abs(ref[0]) and abs(ref[2] - got[2]) <= 1e-9
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-9, atol=1e-15)
    for name, fn in (("numpy", numpy_kernels), ("dl1", dl1_kernels)):
        times = []
        for _ in range(repeat):
            t0 = time.process_time()  # CPU seconds: the machine may be shared
            fn(y, z)
            times.append(time.process_time() - t0)
        out[name] = float(np.median(times))
    return out


# ----------------------------------------------------------------------------- the fits
def load(path: str):
    import scipy.sparse as sp

    import dl1

    store = dl1.open_store(path)
    X = sp.csc_matrix(store.to_dask().compute(scheduler="sync"))
    return X, np.asarray(store.read("y"), dtype=np.float64)


def certify(X, y, coef, b, alpha) -> float:
    """Relative duality gap of ``(coef, b)`` by dl1's gap, in NumPy on the full data."""
    from dl1.objective.datafits import Logistic
    from dl1.objective.gap import duality_gap
    from dl1.objective.penalties.elastic_net import ElasticNet

    df = Logistic()
    z = X @ coef + b
    theta = df.dual_point(y, z, None, True)
    _, _, gap = duality_gap(df, ElasticNet(alpha), y, z, coef, X.T @ theta, theta=theta)
    p0 = df.value(y, np.full(y.shape[0], df.initial_intercept(y)))
    return gap / p0


def fit_dl1(X, y, alpha, tol):
    import dl1

    res = dl1.fit(X, y, alpha=alpha, loss="logistic", tol=tol, client=None)
    return res.coef_, res.intercept_, {"rounds": res.n_rounds_}


def fit_skglm(X, y, alpha, tol):
    from skglm import GeneralizedLinearEstimator
    from skglm.datafits import Logistic
    from skglm.penalties import L1
    from skglm.solvers import ProxNewton

    est = GeneralizedLinearEstimator(
        Logistic(), L1(alpha), ProxNewton(tol=tol, fit_intercept=True, max_iter=50)
    )
    est.fit(X, y)
    return est.coef_.ravel(), float(est.intercept_), {}


def time_fits(store: str, ratio: float, repeat: int, peers: list[str]) -> dict:
    """Median seconds and certified gaps of each solver (this process)."""
    import dl1

    X, y = load(store)
    alpha = dl1.alpha_max(X, y, loss="logistic", client=None) / ratio
    out = {"shape": list(X.shape), "nnz": int(X.nnz), "alpha": alpha}
    for name in peers:
        fn = {"dl1": fit_dl1, "skglm": fit_skglm}[name]
        tol = TARGET
        fn(X, y, alpha, tol)  # warm-up: numba compilation / cache loading
        attempts = []
        for _ in range(4):
            times, cpus, gaps, extra = [], [], [], {}
            for _ in range(repeat):
                t0, c0 = time.perf_counter(), time.process_time()
                coef, b, extra = fn(X, y, alpha, tol)
                times.append(time.perf_counter() - t0)
                cpus.append(time.process_time() - c0)
                gaps.append(certify(X, y, coef, b, alpha))
            attempts.append((tol, round(float(np.median(times)), 3), max(gaps)))
            if max(gaps) <= TARGET or name == "dl1":
                break
            tol /= 10
        out[name] = {"seconds": float(np.median(times)), "all": times,
                     "cpu": float(np.median(cpus)), "gap": max(gaps),
                     "tol": tol, "nnz_coef": int((coef != 0).sum()), **extra}  # fmt: skip
        if len(attempts) > 1:  # (tol, median seconds, gap) of the uncertified attempts too
            out[name]["attempts"] = attempts
    return out


# --------------------------------------------------------------------------- the driver
def child(args: list[str], mmap: bool) -> dict:
    """Run this script's ``--child`` part in a fresh process, with or without the mmap
    threshold; its JSON answer."""
    env = {k: v for k, v in os.environ.items() if k not in MMAP_ENV}
    if mmap:
        env.update(MMAP_ENV)
    cmd = [sys.executable, __file__, "--child", *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def default_store(data_dir: str) -> str:
    """The ``short`` preset's classification store, generated once into ``data_dir``."""
    from dl1.datasets import make_e2006_like

    path = Path(data_dir) / "short-classification.zarr"
    if not (path / "dl1-manifest.json").exists():
        print(f"generating short (classification) -> {path}", flush=True)
        make_e2006_like(path, preset="short", task="classification", seed=0, overwrite=True)
    return str(path)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernels", action="store_true", help="time the datafit's kernels")
    ap.add_argument("--fit", action="store_true", help="time dl1 and skglm fits")
    ap.add_argument("--n", type=int, default=850_000, help="rows of the kernel timing")
    ap.add_argument("--store", default=None, help="a classification store (default: short)")
    ap.add_argument("--data-dir", default="bench-out")
    ap.add_argument("--ratio", type=float, default=20.0, help="alpha = alpha_max / ratio")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--peers", nargs="+", default=["dl1", "skglm"])
    ap.add_argument("--env", nargs="+", default=["plain", "mmap"], choices=["plain", "mmap"],
                    help="child processes without / with MALLOC_MMAP_THRESHOLD_=65536")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        kind = args.child[0]
        if kind == "kernels":
            res = time_kernels(args.n, args.repeat)
        else:
            res = time_fits(args.child[1], args.ratio, args.repeat, args.peers)
        print(json.dumps(res))
        return
    common = ["--repeat", str(args.repeat), "--ratio", str(args.ratio), "--n", str(args.n)]
    envs = [e == "mmap" for e in args.env]
    if args.kernels:
        for mmap in envs:
            res = child(["kernels", *common], mmap)
            label = "mmap " if mmap else "plain"
            print(f"kernels n={args.n} {label}: NumPy ufuncs {res['numpy'] * 1e3:7.1f} ms, "
                  f"dl1 {res['dl1'] * 1e3:7.1f} ms CPU (value, dual point, conjugate)")  # fmt: skip
    if args.fit:
        store = args.store or default_store(args.data_dir)
        for mmap in envs:
            res = child(["fit", store, *common, "--peers", *args.peers], mmap)
            label = "mmap " if mmap else "plain"
            print(f"fit {res['shape']} nnz={res['nnz']} alpha={res['alpha']:.3g} {label}:")
            for name in args.peers:
                r = res[name]
                extra = {k: v for k, v in r.items() if k not in ("seconds", "all", "cpu")}
                print(f"  {name:6s} median {r['seconds']:.3f} s (CPU {r['cpu']:.3f} s)  runs "
                      f"{[round(t, 3) for t in r['all']]}  {extra}")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
