"""L1-logistic where users tune: weak regularisation (large C) and the default CV grid, on
real short text, dl1 against liblinear, skglm and celer.

The data is built on this machine from Debian's package descriptions (``debian_text.py``:
TF-IDF of ``apt-cache dumpavail``'s descriptions); the label is one section against the
rest (``--label libs``, the largest: 10.5% positives) or ``optional`` priority against the
rest (99.5%); ``--store`` takes a dl1 store's training rows and labels instead (the
``shortclf`` preset, ``dl1.datasets.make_e2006_like(path, preset="shortclf", seed=0)``:
842,000 x 400,000, 14 words a row, 10% positives). The objective is scikit-learn's
``C sum log(1 + exp(-y z)) + ||w||_1`` divided by ``C n`` (dl1's ``alpha = 1 / (C n)``),
with an unpenalised intercept.

Every answer's relative duality gap is computed by the same certificate (:func:`certify`:
dl1's gap function, NumPy, on the full data, at the answer's own coefficients and
intercept). dl1
runs at ``--tol``; each peer is run at tolerance 1e-4, then 10x tighter until its answer
certifies at dl1's gap or better (down to 1e-12): the time quoted is that run's, with its
gap. liblinear penalises its intercept (scikit-learn's ``intercept_scaling``, here 100, so
the penalty on it is 100x weaker); celer fits no intercept for the logistic loss (its
answer is certified as the model it is, with intercept 0, against the problem with one).
Each fit runs in a child process of its own (its peak RSS measured there), ``--repeat``
times: medians; in process each engine first fits 500 rows untimed, so that imports and
compiled kernels (dl1's numba cache, skglm's) are not timed.

``--cv`` also times ``LogisticRegressionCV(Cs=10, cv=5)``, liblinear's (L1) and dl1's,
with their chosen ``C`` and training accuracy (the estimators' own calls, each at its
``tol=1e-4``: dl1's bounds every fit's relative gap, liblinear's does not), then the same
grid fit by fit (:func:`_grid`), every fit certified on its fold: liblinear's, dl1's path
at each of ``--cv-tols`` (one tolerance for the grid, as a user sets it; dl1's estimator
is timed at each too), and dl1 with each fit's ``tol`` at liblinear's gap on that fold and
``C``; dl1's fits looser than liblinear's on their fold and ``C`` are counted. Where a
peer's best answer is looser than ``--tol``, dl1 is timed again with ``tol`` at that gap
(rows "dl1 at <peer>'s gap", with the ratio; ``--no-equal-gap`` skips them).

    python benchmarks/bench_weak_logistic.py --label libs --Cs 1 100 10000 --repeat 3 --cv
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
import warnings

import numpy as np
from bench_cv import in_child

#: A peer's tolerances, tried in turn until its answer certifies at dl1's gap (or its gap
#: stops falling: liblinear's penalised intercept and the peers' own stopping rules leave
#: a floor of their own).
PEER_TOLS = [1e-4, 1e-6, 1e-8, 1e-10]


def certify(X, y, coef, b, alpha) -> float:
    """Relative duality gap of ``(coef, b)`` for the L1-logistic problem with an unpenalised
    intercept: dl1's gap function (NumPy) on the full data, as ``bench_logistic.py``, at the
    answer's own point; relative to ``P`` at the best constant."""
    from dl1.objective.datafits import Logistic
    from dl1.objective.gap import duality_gap
    from dl1.objective.penalties.elastic_net import ElasticNet

    df = Logistic()
    z = X @ coef + b
    theta = df.dual_point(y, z, None, True)
    _, _, gap = duality_gap(df, ElasticNet(alpha), y, z, coef, X.T @ theta, theta=theta)
    p0 = df.value(y, np.full(y.shape[0], df.initial_intercept(y)))
    return float(gap / p0)


def data(source: str):
    """``(X, y)`` of ``source``: a dl1 store's training rows and its labels (a path holding
    ``dl1-manifest.json``), else Debian's descriptions with that label."""
    from pathlib import Path

    if (Path(source) / "dl1-manifest.json").exists():
        import scipy.sparse as sp

        import dl1

        st = dl1.open_store(source)
        return sp.csc_matrix(st.to_dask().compute(scheduler="sync")), st.read("y")
    from debian_text import binary_label, load

    d = load()
    return d.X.tocsc(), binary_label(d, source)


def _fit(name: str, C: float, tol: float, label: str, workers: int, q) -> None:
    X, y = data(label)
    n = X.shape[0]
    alpha = 1.0 / (C * n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if not workers:  # imports and compiled kernels loaded before the clock starts
            _engine(name, X[:500], y[:500], C, 1.0 / (C * 500), tol, 0)
        t0 = time.perf_counter()
        coef, b, info = _engine(name, X, y, C, alpha, tol, workers)
        # on a cluster, the fit's own seconds: the cluster's start and warm-up untimed
        seconds = info.pop("fit_seconds", time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    q.put({"seconds": seconds, "gap": certify(X, y, coef, b, alpha),
           "nnz": int(np.count_nonzero(coef)), "peak_mb": peak, **info})  # fmt: skip


def _engine(name: str, X, y, C: float, alpha: float, tol: float, workers: int):
    """``(coef, intercept, info)`` of one engine's fit."""
    if name == "dl1":
        return _dl1(X, y, alpha, tol, workers)
    if name == "liblinear":
        from sklearn.linear_model import LogisticRegression

        m = LogisticRegression(C=C, l1_ratio=1.0, solver="liblinear", tol=tol,
                               intercept_scaling=100.0, max_iter=10_000).fit(X, y)  # fmt: skip
        return m.coef_.ravel(), float(m.intercept_[0]), {}
    if name == "skglm":
        from skglm import GeneralizedLinearEstimator
        from skglm.datafits import Logistic
        from skglm.penalties import L1
        from skglm.solvers import ProxNewton

        est = GeneralizedLinearEstimator(Logistic(), L1(alpha),
                                         ProxNewton(tol=tol, fit_intercept=True,
                                                    max_iter=200))  # fmt: skip
        est.fit(X, y)
        return est.coef_.ravel(), float(np.ravel(est.intercept_)[0]), {}
    import celer  # no intercept for the logistic loss

    m = celer.LogisticRegression(C=C, tol=tol, max_iter=200).fit(X, y)
    return m.coef_.ravel(), 0.0, {}


def _dl1(X, y, alpha, tol, workers):
    import dl1

    if workers:
        from distributed import Client, LocalCluster

        cluster = LocalCluster(n_workers=workers, threads_per_worker=1,
                               dashboard_address="127.0.0.1:0")  # fmt: skip
        with cluster, Client(cluster) as c:
            dl1.fit(X[:200], y[:200], alpha=alpha, loss="logistic", client=c)  # warm-up
            t0 = time.perf_counter()
            res = dl1.fit(X, y, alpha=alpha, loss="logistic", tol=tol, client=c)
            info = {"fit_seconds": time.perf_counter() - t0}
    else:
        res = dl1.fit(X, y, alpha=alpha, loss="logistic", tol=tol)
        info = {}
    hist = res.history_
    info |= {
        "rounds": res.n_rounds_,
        "ws_sizes": [h.get("ws_size") for h in hist if h.get("ws_size")],
        "newton_steps": sum(h.get("newton_steps") or 0 for h in hist),
        "inner_epochs": sum(h.get("inner_epochs") or 0 for h in hist),
        "block_steps": sum(h.get("block_steps") or 0 for h in hist),
    }
    return res.coef_, res.intercept_, info


def child(target, *args, limit: float) -> dict:
    """``target(*args, q)`` in a spawned process (``bench_cv.in_child``); no answer within
    ``limit`` seconds (killed, or dead) recorded as the result."""
    out = in_child(target, *args, limit=limit)
    return {"error": f"no answer within {limit:.0f} s"} if out is None else out


def run_peer(name, C, target_gap, label, limit):
    """The first tolerance at which ``name`` certifies at ``target_gap`` or better."""
    best: dict = {}
    for tol in PEER_TOLS:
        out = child(_fit, name, C, tol, label, 0, limit=limit) | {"tol": tol}
        if "error" in out:
            return best | {"note": f"tol {tol:g}: {out['error']}"} if best else out
        if out["gap"] <= target_gap:
            return out
        if best and out["gap"] > best["gap"] / 2:  # no longer falling: its floor
            return best | {"note": f"gap floor {best['gap']:.1e} (tol {tol:g}: {out['gap']:.1e})"}
        best = out
    return best | {"note": "never certified at dl1's gap"}


def _cv(name: str, label: str, tol: float, q) -> None:
    from sklearn.model_selection import StratifiedKFold

    X, y = data(label)
    cv = StratifiedKFold(5, shuffle=True, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        if name == "dl1":
            import dl1

            m = dl1.LogisticRegressionCV(Cs=10, cv=cv, tol=tol).fit(X, y)
        else:
            from sklearn.linear_model import LogisticRegressionCV

            m = LogisticRegressionCV(Cs=10, cv=cv, l1_ratios=(1.0,), solver="liblinear",
                                     tol=1e-4, intercept_scaling=100.0).fit(X, y)  # fmt: skip
        seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    q.put({"seconds": seconds, "C": float(np.ravel(m.C_)[0]), "peak_mb": peak,
           "train_accuracy": float(m.score(X, y))})  # fmt: skip


def _grid(label: str, tols: list[float], q) -> None:
    """The CV grid fit by fit (``Cs = logspace(-4, 4, 10)``, the 5 stratified folds of
    :func:`_cv`), every fit certified on its fold: liblinear's fits as its
    ``LogisticRegressionCV`` runs them (cold, tol 1e-4); dl1's path as its
    ``LogisticRegressionCV`` runs it (``dl1.path``) at each of ``tols`` (one tolerance for
    the whole grid, as a user sets it); and dl1 walking the grid with warm starts, each
    fit's ``tol`` at liblinear's certified gap on that fold and ``C`` (every dl1 fit at an
    equal or tighter gap). Per ``C``: the seconds summed over folds and the largest gap of
    each."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold

    import dl1

    X, y = data(label)
    Cs = np.logspace(-4, 4, 10)
    folds = list(StratifiedKFold(5, shuffle=True, random_state=0).split(X, y))
    dl1.fit(X[:500], y[:500], alpha=1.0 / 500, loss="logistic")  # compiled kernels loaded
    names = ["liblinear", *(f"path {t:g}" for t in tols), "at_gap"]
    cells = {k: np.zeros((len(folds), len(Cs), 3)) for k in names}
    for f, (tr, te) in enumerate(folds):
        Xt, yt, n = X[tr], y[tr], len(tr)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for k, C in enumerate(Cs):
                t0 = time.perf_counter()
                m = LogisticRegression(C=C, l1_ratio=1.0, solver="liblinear", tol=1e-4,
                                       intercept_scaling=100.0).fit(Xt, yt)  # fmt: skip
                sec = time.perf_counter() - t0
                cells["liblinear"][f, k] = (sec, certify(Xt, yt, m.coef_.ravel(),
                                            float(m.intercept_[0]), 1 / (C * n)),
                                            m.score(X[te], y[te]))  # fmt: skip
            for tol in tols:
                p = dl1.path(Xt, yt, alphas=1.0 / (Cs * n), loss="logistic", tol=tol)
                for k, C in enumerate(Cs):
                    coef_k = p.coefs_[:, k].toarray().ravel()
                    cells[f"path {tol:g}"][f, k] = (
                        p.seconds_[k], certify(Xt, yt, coef_k, p.intercepts_[k], 1 / (C * n)),
                        held_out(X[te], y[te], coef_k, p.intercepts_[k]))  # fmt: skip
            coef, b = None, None
            for k, C in enumerate(Cs):
                tol = float(cells["liblinear"][f, k, 1])
                t0 = time.perf_counter()
                r = dl1.fit(Xt, yt, alpha=1.0 / (C * n), loss="logistic", tol=tol,
                            coef_init=coef, intercept_init=b)  # fmt: skip
                sec = time.perf_counter() - t0
                coef, b = r.coef_, r.intercept_
                cells["at_gap"][f, k] = (sec, certify(Xt, yt, coef, b, 1 / (C * n)),
                                         r.score(X[te], y[te]))  # fmt: skip
    q.put({"Cs": Cs.tolist(), "names": names, **{k: v.tolist() for k, v in cells.items()}})


def held_out(X, y, coef, b) -> float:
    """Accuracy of ``sign(X coef + b)`` on ``(X, y)``, the larger label the positive class
    (as dl1 and scikit-learn map two labels)."""
    lo, hi = np.min(y), np.max(y)
    return float(np.mean(np.where(X @ coef + b > 0, hi, lo) == y))


def print_grid(out: dict) -> None:
    """The grid's table: per ``C`` and code, the seconds over the folds, the largest gap
    and (for dl1's) the fits looser than liblinear's on their fold; then the totals and
    the ``C`` each would choose by mean held-out accuracy."""
    Cs, names = out["Cs"], out["names"]
    cells = {k: np.array(out[k]) for k in names}
    label = {n: "dl1 at liblinear's gaps" if n == "at_gap" else n.replace("path", "dl1 path,")
             for n in names}  # fmt: skip
    print("\n| C | " + " | ".join(f"{label[n]}: s, largest gap, looser" for n in names) + " |")
    print("|---|" + "---|" * len(names))
    lib = cells["liblinear"]
    for k, C in enumerate(Cs):
        parts = []
        for n in names:
            c = cells[n][:, k]
            looser = "" if n == "liblinear" else f", {int(np.sum(c[:, 1] > lib[:, k, 1]))}"
            parts.append(f"{c[:, 0].sum():.2f}, {c[:, 1].max():.1e}{looser}")
        print(f"| {C:.3g} | " + " | ".join(parts) + " |")
    tot = []
    for n in names:
        looser = "" if n == "liblinear" else f", {int(np.sum(cells[n][:, :, 1] > lib[:, :, 1]))}"
        best = Cs[int(np.argmax(cells[n][:, :, 2].mean(axis=0)))]
        tot.append(f"**{cells[n][:, :, 0].sum():.2f}**{looser}, C {best:.3g}")
    print("| all (looser fits of 50, chosen C) | " + " | ".join(tot) + " |")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--label", default="libs")
    ap.add_argument("--store", default=None,
                    help="a dl1 store's training rows and labels instead of Debian's")
    ap.add_argument("--Cs", nargs="*", type=float, default=[1.0, 100.0, 1e4])
    ap.add_argument("--tol", type=float, default=1e-6, help="dl1's relative gap")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--peers", nargs="*", default=["liblinear", "skglm", "celer"])
    ap.add_argument("--workers", type=int, default=0, help="dl1 on a LocalCluster too")
    ap.add_argument("--cv", action="store_true")
    ap.add_argument("--cv-tols", nargs="*", type=float, default=[1e-4, 1e-2],
                    help="dl1's tolerances for the CV grid (its estimator's default first)")
    ap.add_argument("--limit", type=float, default=120.0,
                    help="seconds per peer fit at most (dl1's: 10 times)")
    ap.add_argument("--no-equal-gap", dest="equal_gap", action="store_false",
                    help="skip timing dl1 again at each peer's looser gap")  # fmt: skip
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.store:  # the children's data source: the store, or Debian's label
        args.label = args.store
    rows = []
    for C in args.Cs:
        runs = [child(_fit, "dl1", C, args.tol, args.label, 0, limit=10 * args.limit)
                for _ in range(args.repeat)]  # fmt: skip
        rows.append(summary("dl1 (in process)", C, runs))
        target = max(r.get("gap", np.inf) for r in runs)
        if args.workers:
            runs = [child(_fit, "dl1", C, args.tol, args.label, args.workers,
                          limit=10 * args.limit) for _ in range(args.repeat)]  # fmt: skip
            rows.append(summary(f"dl1 ({args.workers} workers)", C, runs))
        for peer in args.peers:
            runs = [run_peer(peer, C, max(target, args.tol), args.label, args.limit)
                    for _ in range(args.repeat)]  # fmt: skip
            rows.append(summary(peer, C, runs))
            rows += at_peer_gap(rows[-1], C, args)
        print(json.dumps(rows[-1 - len(args.peers)]), flush=True)
    print("\n| C | solver | seconds | gap | nnz | child's peak MB (data build included) | notes |"
          "\n|---|---|---|---|---|---|---|")  # fmt: skip
    for r in rows:
        print(f"| {r['C']:g} | {r['solver']} | {r['seconds']} | {r['gap']} | {r['nnz']} | "
              f"{r['peak_mb']} | {r['notes']} |")  # fmt: skip
    if args.cv:
        print("\n| LogisticRegressionCV(Cs=10, cv=5) | seconds | C_ | train accuracy | peak MB |")
        print("|---|---|---|---|---|")
        for name, tol in [*(("dl1", t) for t in args.cv_tols), ("liblinear", 1e-4)]:
            runs = [child(_cv, name, args.label, tol, limit=args.limit * 10)
                    for _ in range(args.repeat)]  # fmt: skip
            ok = [r for r in runs if "seconds" in r]
            med = statistics.median(r["seconds"] for r in ok) if ok else float("nan")
            first = ok[0] if ok else {"C": "-", "train_accuracy": "-", "peak_mb": "-"}
            print(f"| {name}, tol {tol:g} | {med:.2f} | {first['C']} | {first['train_accuracy']} | "
                  f"{first['peak_mb']:.0f} |")  # fmt: skip
            rows.append({"cv": name, "tol": tol, "runs": runs})
        grid = child(_grid, args.label, args.cv_tols, limit=args.limit * 20)
        if "error" not in grid:
            print_grid(grid)
        rows.append({"grid": grid})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)


def at_peer_gap(peer: dict, C: float, args) -> list[dict]:
    """dl1 again with ``tol`` at a peer's certified gap when it is looser than ``--tol`` (the
    issue's comparison: as fast as the peer at an equal or tighter gap), with the ratio of
    the medians."""
    if not args.equal_gap or peer["gap"] == "-" or float(peer["gap"]) <= args.tol:
        return []
    tol = float(peer["gap"])
    runs = [child(_fit, "dl1", C, tol, args.label, 0, limit=10 * args.limit)
            for _ in range(args.repeat)]  # fmt: skip
    row = summary(f"dl1 at {peer['solver']}'s gap", C, runs)
    if row["seconds"] != "-":
        ratio = float(row["seconds"]) / float(peer["seconds"])
        row["notes"] = f"tol {tol:.1e}: {ratio:.2f} x {peer['solver']}; " + row["notes"]
    return [row]


def summary(solver: str, C: float, runs: list[dict]) -> dict:
    """Median seconds of the runs, the largest gap, and what dl1's runs did."""
    ok = [r for r in runs if "seconds" in r]
    if not ok:
        return {"solver": solver, "C": C, "seconds": "-", "gap": "-", "nnz": "-",
                "peak_mb": "-", "notes": runs[0].get("error", ""), "runs": runs}  # fmt: skip
    notes = []
    if "rounds" in ok[0]:
        r = ok[0]
        notes.append(f"{r['rounds']} rounds, working sets {r['ws_sizes']}, "
                     f"{r['newton_steps']} Newton steps, {r.get('block_steps', 0)} block steps, "
                     f"{r['inner_epochs']} epochs")  # fmt: skip
    if "tol" in ok[0]:
        notes.append(f"tol {max(r['tol'] for r in ok):g}")
    notes += [r["note"] for r in ok if "note" in r][:1]
    return {
        "solver": solver, "C": C,
        "seconds": f"{statistics.median(r['seconds'] for r in ok):.2f}",
        "gap": f"{max(r['gap'] for r in ok):.1e}",
        "nnz": ok[0]["nnz"], "peak_mb": f"{max(r['peak_mb'] for r in ok):.0f}",
        "notes": "; ".join(notes), "runs": runs,
    }  # fmt: skip


if __name__ == "__main__":
    main()
