"""dl1's multiclass fits against scikit-learn (saga), liblinear and Spark MLlib, certified
by one NumPy certificate.

Problems (each an .npz written once under ``--data-dir``):

* ``debian``: Debian's package descriptions (``debian_text.py``: TF-IDF of ``apt-cache
  dumpavail``'s descriptions), label = ``Section:`` (every section, ~58 classes);
  ``debian10``: the packages of the 10 largest sections only.
* ``synth20``: ``dl1.datasets.make_e2006_like(preset="tfidf", task="multiclass",
  n_classes=20, seed=0)``'s train split (16,087 x 150,360, ~19M nonzeros, E2006-tfidf's
  shape): labels drawn from a planted sparse multinomial model ``W*`` (each informative
  feature speaks for one class) with Gumbel noise, i.e. ``argmax_k (x W*_k + b_k + G_k)``.
* ``tiny`` (``--quick``): 400 x 120 sparse rows, 4 classes, the argmax of a planted sparse
  ``K x p`` model plus Gumbel noise (:func:`tiny_data`); seconds for every engine.

The problem. Every engine fits **without intercepts** (``fit_intercept=False`` for all),
so each answer is certified exactly as returned (with an intercept, liblinear penalises
its own and the dual point's column sums would need a refitted intercept first). The
multinomial objective is ``F(W) + alpha (l1_ratio ||W||_1 + (1 - l1_ratio) / 2 ||W||_F^2)``
with ``F = (1/n) sum_i (lse(z_i) - z_{i, y_i})``, ``Z = X W^T`` (``W`` of shape ``(K, p)``);
one-vs-rest solves, for each class ``k``, ``(1/n) sum_i phi(y_i z_i) + alpha (...)`` with
``y = +1`` on class ``k``, ``-1`` elsewhere, ``phi`` the logistic ``log(1 + e^-m)`` or the
squared hinge ``max(0, 1 - m)^2`` (dl1's binary datafits divide by n,
``dl1/objective/datafits/``). ``alpha`` is ``--alpha`` per problem: ``C=<c>`` means
``alpha = 1 / (c n)``, ``amax/<r>`` means ``alpha_max / r`` with the multinomial
``alpha_max = max |X^T (Y - 1/K)| / n`` (the L1 threshold at ``W = 0``, where every class
has probability ``1/K`` without intercepts). Defaults: ``C=1`` on Debian, ``amax/100`` on
``synth20``.

Engines, each in a spawned child process of its own, bounded by ``--time-limit`` seconds of
fitting (all its tries), data loaded before the clock starts:

* ``dl1``: ``dl1.fit_multiclass(X, y, alpha, l1_ratio, tol=--tol)`` in process; ``dl1-2w``
  the same on a LocalCluster of 2 single-threaded worker processes (127.0.0.1; the time
  includes sending X to the workers); ``dl1-ovr`` / ``dl1-ovr-sqh``:
  ``multi_class="ovr"`` with the logistic / squared-hinge loss. numba is warmed on 200
  rows first (not timed).
* ``saga``: ``sklearn.linear_model.LogisticRegression(solver="saga", C=1/(n alpha),
  l1_ratio=l1_ratio)`` (multinomial for K > 2 in scikit-learn >= 1.5: the same objective
  times ``C n``).
* ``liblinear-ovr``: ``OneVsRestClassifier(LogisticRegression(solver="liblinear",
  l1_ratio=1, C=1/(n alpha)))``; ``linearsvc``: ``LinearSVC(penalty="l1",
  loss="squared_hinge", dual=False, C=1/(n alpha))`` (liblinear's own one-vs-rest):
  liblinear minimises ``C sum_i phi + ||w||_1``, i.e. the objective above times ``C n``.
  L1 only (skipped with ``l1_ratio < 1``).
* ``spark``: Spark MLlib ``LogisticRegression(family="multinomial", regParam=alpha,
  elasticNetParam=l1_ratio, standardization=False, fitIntercept=False)`` on ``local[2]``
  (driver on 127.0.0.1, UI off, the session of ``bench_engines.py``), the data a cached
  DataFrame sent from Python (``load s``). Spark's objective is the mean log-loss plus
  ``regParam (elasticNetParam ||W||_1 + (1 - elasticNetParam)/2 ||W||^2)``: the mapping is
  checked by the certificate itself: with the wrong scale its gap would stall at the
  distance between the two problems' optima, instead it falls with Spark's ``tol`` (on
  ``tiny``: 1e-4, 2e-6, 2e-7 at tol 1e-6, 1e-8, 1e-10; ``tests/test_bench_multiclass.py``).

A peer runs its tolerances in turn (``--peer-tols``, Spark ``--spark-tols``) until its
answer certifies at the gap of dl1's in-process fit of the same model, or at ``--tol``
when dl1 went below it (or its gap stops halving, or the time bound is spent): the row
is that try's (the others are in the JSON's ``tries``). An engine whose package is
missing is recorded as skipped. When no peer reached dl1's gap, dl1 is timed again with
``tol`` set to the closest peer's certified gap (rows ``dl1@<peer>``; ``--no-equal-gap``
skips them), so every model has a ratio at an equal gap.

The certificate (:func:`certify_multinomial`, :func:`certify_ovr`: NumPy, not dl1's code)
takes ``Theta = Y - P`` (binary: ``theta = -n grad F``), rescaled into the dual ball
(``c = min(1, n alpha l1_ratio / max |X^T Theta|)``) and, with an L2 part, unscaled too
(the better dual value of the two, the penalty's conjugate ``sum (|X^T Theta| / n -
alpha l1_ratio)_+^2 / (2 alpha (1 - l1_ratio))`` then finite); dual value ``-(1/n) sum_i
negent(c P_i + (1 - c) e_{y_i}) - conj`` (binary logistic: ``-(1/n) sum negent2(c s_i)``
with ``s_i = sigmoid(-y_i z_i)``; squared hinge ``(1/n) sum (c a_i - c^2 a_i^2 / 4)``,
``a_i = 2 max(0, 1 - y_i z_i)``). Gaps are relative to ``F`` at the best point without
intercept, ``W = 0``: ``log K`` (binary: ``log 2``, squared hinge ``1``), the scale of
dl1's ``tol`` without intercept, so the certificate of dl1's own answer is checked against
its ``gap_`` (``dl1_gap`` in the JSON); one-vs-rest rows quote the largest class's gap.

Reported: fit seconds, relative gap, train accuracy, nonzero coefficients, peak memory (the
sum of the VmHWM of the engine's processes: the child, which holds the data, and its
Dask workers or Spark JVM), and for dl1's rows the ratio of dl1's time to the fastest peer
of the same model certified at an equal or tighter gap. The machine has 2 cores shared
with other work: figures compare within one run.

    python benchmarks/bench_multiclass.py --out multiclass.json
    python benchmarks/bench_multiclass.py --quick      # tiny data, every engine, seconds
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import scipy.sparse as sp

# the engines benchmark's child plumbing (run from the repository: benchmarks/ on sys.path)
from bench_engines import _bounded, _finish, _vmhwm_mb, run_in_child
from scipy.special import expit, logsumexp, softmax, xlogy

#: engine -> the model it fits (rows of a model are compared with each other)
MODELS = {
    "dl1": "multinomial", "dl1-2w": "multinomial", "saga": "multinomial",
    "spark": "multinomial", "dl1-ovr": "ovr logistic", "liblinear-ovr": "ovr logistic",
    "dl1-ovr-sqh": "ovr squared hinge", "linearsvc": "ovr squared hinge",
}  # fmt: skip
#: the dl1 fit whose gap the peers of a model aim at
REFERENCE = {"multinomial": "dl1", "ovr logistic": "dl1-ovr", "ovr squared hinge": "dl1-ovr-sqh"}
#: the package each engine needs
NEEDS = {"saga": "sklearn", "liblinear-ovr": "sklearn", "linearsvc": "sklearn",
         "spark": "pyspark"}  # fmt: skip
DEFAULT_ALPHA = {"debian": "C=1", "debian10": "C=1", "synth20": "amax/100", "tiny": "amax/20"}


# ---------------------------------------------------------------- problems


def tiny_data(n: int = 400, p: int = 120, K: int = 4, seed: int = 0):
    """A planted sparse multinomial problem: X sparse (5% dense, log1p of Pareto counts),
    ``W*`` with 6 nonzeros per class, labels ``argmax(X W*^T + G)`` with Gumbel ``G``."""
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=0.05, format="csr", random_state=seed,
                  data_rvs=lambda m: np.log1p(rng.pareto(1.5, m) + 1))  # fmt: skip
    W = np.zeros((K, p))
    for k in range(K):
        W[k, rng.choice(p, 6, replace=False)] = rng.uniform(1.0, 3.0, 6)
    y = np.argmax(X @ W.T + rng.gumbel(size=(n, K)), axis=1)
    return X, y.astype(np.int64)


def _build(problem: str):
    """``(X, codes)`` of a problem (X CSR float64, codes 0..K-1)."""
    if problem == "tiny":
        return tiny_data()
    if problem.startswith("debian"):
        from debian_text import load, section_classes

        X, labels = section_classes(load(), 10 if problem == "debian10" else None)
        return sp.csr_matrix(X, dtype=np.float64), np.unique(labels, return_inverse=True)[1]
    if problem == "synth20":
        import tempfile

        import dl1
        from dl1.datasets import make_e2006_like

        with tempfile.TemporaryDirectory() as d:
            make_e2006_like(Path(d) / "s.zarr", preset="tfidf", task="multiclass",
                            n_classes=20, seed=0)  # fmt: skip
            store = dl1.open_store(Path(d) / "s.zarr")
            X = sp.csr_matrix(store.to_dask().compute(scheduler="sync"), dtype=np.float64)
            y = np.asarray(store.read("y")).astype(np.int64)
        return X, y
    raise ValueError(f"unknown problem {problem!r} (debian, debian10, synth20, tiny)")


def problem_path(problem: str, data_dir: str) -> str:
    """The problem's .npz (built once)."""
    out = Path(data_dir) / f"multiclass-{problem}.npz"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        print(f"building {problem} -> {out}", flush=True)
        X, y = _build(problem)
        np.savez(out, data=X.data, indices=X.indices, indptr=X.indptr, shape=X.shape, y=y)
    return str(out)


def load(path: str):
    f = np.load(path)
    X = sp.csr_matrix((f["data"], f["indices"], f["indptr"]), shape=tuple(f["shape"]))
    X.sort_indices()  # Spark's SparseVector wants them increasing (TfidfVectorizer's are not)
    return X, f["y"].astype(np.int64)


def alpha_max(X, codes: np.ndarray) -> float:
    """The multinomial L1 threshold without intercepts: ``max |X^T (Y - 1/K)| / n``."""
    n, K = X.shape[0], int(codes.max()) + 1
    return float(np.abs(X.T @ (np.eye(K)[codes] - 1.0 / K)).max() / n)


def resolve_alpha(spec: str, X, codes) -> float:
    """``C=<c>`` -> ``1 / (c n)``; ``amax/<r>`` -> ``alpha_max / r``."""
    kind, _, val = spec.partition("=") if spec.startswith("C=") else spec.partition("/")
    if kind == "C":
        return 1.0 / (float(val) * X.shape[0])
    if kind == "amax":
        return alpha_max(X, codes) / float(val)
    raise ValueError(f"alpha {spec!r}: use C=<c> or amax/<ratio>")


# ---------------------------------------------------------------- the certificate (NumPy)


def _penalty(W: np.ndarray, alpha: float, l1_ratio: float) -> float:
    return alpha * (l1_ratio * np.abs(W).sum() + (1 - l1_ratio) / 2 * (W**2).sum())


def _pen_conj(G: np.ndarray, c, n: int, alpha: float, l1_ratio: float, axis=None):
    """The elastic net's conjugate at ``c X^T Theta / n`` (``G = X^T Theta``): 0 inside the
    L1 ball (pure L1: the dual point is scaled into it), else ``sum (|.| - a1)_+^2 / 2 a2``."""
    a1, a2 = alpha * l1_ratio, alpha * (1 - l1_ratio)
    excess = np.maximum(np.abs(G) * c / n - a1, 0.0)
    return (excess**2).sum(axis=axis) / (2 * a2) if a2 > 0 else 0.0 * excess.sum(axis=axis)


def _dual_scale(G: np.ndarray, n: int, alpha: float, l1_ratio: float, axis=None):
    """``c = min(1, n alpha l1_ratio / max |X^T Theta|)`` (per class along ``axis``)."""
    gmax = np.abs(G).max(axis=axis)
    with np.errstate(divide="ignore"):
        return np.minimum(1.0, n * alpha * l1_ratio / gmax)


def repair_probabilities(X, codes, P: np.ndarray, lam: float, sweeps: int = 3) -> np.ndarray:
    """``Q``: ``P`` with probability mass of the rows of every column violating ``|x_j^T
    (y_k - q_k)| <= lam`` moved to the rows' labels, until none does (``sweeps`` at most):
    a dual point ``Y - Q`` on the simplex, feasible where it could be repaired.

    Per violating entry ``(j, k)``, ``v = x_j^T (y_k - q_k)``: every row of column ``j`` where
    it lowers ``|v|`` gives the same fraction ``cut`` of what it can, a row of class ``k``
    its off-label mass, another row its ``q_ik``, so that ``|v|`` ends at ``lam``."""
    Xc = sp.csc_matrix(X)
    Q = P.copy()
    K = Q.shape[1]
    for _ in range(sweeps):
        V = np.asarray(Xc.T @ (np.eye(K)[codes] - Q))
        bad = np.argwhere(np.abs(V) > lam)
        if not bad.shape[0]:
            break
        for j, k in bad:
            rows = Xc.indices[Xc.indptr[j]:Xc.indptr[j + 1]]
            x = Xc.data[Xc.indptr[j]:Xc.indptr[j + 1]]
            own = codes[rows] == k
            v = float(x @ (own - Q[rows, k]))
            if abs(v) <= lam:
                continue
            sx = np.sign(v) * x
            mine, other = own & (sx > 0), ~own & (sx < 0)
            give = float(sx[mine] @ (1.0 - Q[rows[mine], k]) - sx[other] @ Q[rows[other], k])
            if give <= 0.0:
                continue
            cut = min((abs(v) - lam) / give, 1.0)
            r = rows[mine]  # rows of class k: their off-label mass shrinks
            Q[r] *= 1.0 - cut
            Q[r, k] = 0.0
            Q[r, k] = 1.0 - Q[r].sum(axis=1)
            r = rows[other]  # other rows: q_ik moves to their labels
            moved = cut * Q[r, k]
            Q[r, k] -= moved
            Q[r, codes[r]] += moved
    return Q


def certify_multinomial(X, codes, W, alpha: float, l1_ratio: float = 1.0) -> dict:
    """Primal, dual and relative gap (over ``F(0) = log K``) of ``W`` (``(K, p)``) for the
    multinomial elastic net without intercepts."""
    W = np.asarray(W.toarray() if sp.issparse(W) else W, dtype=np.float64)
    n, K = X.shape[0], W.shape[0]
    rows = np.arange(n)
    Z = np.asarray(X @ W.T)
    primal = float((logsumexp(Z, axis=1) - Z[rows, codes]).mean()) + _penalty(W, alpha, l1_ratio)
    P = softmax(Z, axis=1)
    theta = -P
    theta[rows, codes] += 1.0
    G = np.asarray(X.T @ theta)
    c = float(_dual_scale(G, n, alpha, l1_ratio))

    def dual_at(s: float) -> float:  # -F^*(-s Theta / n) - penalty^*(s X^T Theta / n)
        q = s * P
        q[rows, codes] += 1.0 - s
        return -float(xlogy(q, q).sum() / n) - float(_pen_conj(G, s, n, alpha, l1_ratio))

    dual = dual_at(c)
    if l1_ratio < 1 and c < 1:
        dual = max(dual, dual_at(1.0))
    uniform = dual
    if l1_ratio == 1:  # the dual point repaired on its violating columns, then rescaled
        Q = repair_probabilities(X, codes, P, n * alpha)
        G = np.asarray(X.T @ (np.eye(K)[codes] - Q))
        c = float(_dual_scale(G, n, alpha, l1_ratio))
        q = c * Q
        q[rows, codes] += 1.0 - c
        dual = max(dual, -float(xlogy(q, q).sum() / n))
    pred = np.argmax(Z, axis=1)
    return {"primal": primal, "dual": dual, "gap": (primal - dual) / np.log(K),
            "gap_uniform": (primal - uniform) / np.log(K),
            "accuracy": float((pred == codes).mean()), "nnz": int(np.count_nonzero(W))}  # fmt: skip


def certify_ovr(X, codes, W, alpha: float, l1_ratio: float, loss: str) -> dict:
    """The classes' binary certificates (``W`` row ``k``: class ``k`` against the rest);
    ``gap`` the largest relative gap (over ``F(0)``: ``log 2`` logistic, 1 squared hinge)."""
    W = np.asarray(W.toarray() if sp.issparse(W) else W, dtype=np.float64)
    n, K = X.shape[0], W.shape[0]
    Z = np.asarray(X @ W.T)
    Y = np.where(np.eye(K, dtype=bool)[codes], 1.0, -1.0)
    M = Y * Z
    pen = alpha * (l1_ratio * np.abs(W).sum(1) + (1 - l1_ratio) / 2 * (W**2).sum(1))
    if loss == "logistic":
        primal = np.logaddexp(0.0, -M).mean(0) + pen
        A = expit(-M)  # theta = y * A
    else:
        primal = (np.maximum(0.0, 1.0 - M) ** 2).mean(0) + pen
        A = 2.0 * np.maximum(0.0, 1.0 - M)
    G = np.asarray(X.T @ (Y * A))
    c = _dual_scale(G, n, alpha, l1_ratio, axis=0)

    def dual_at(s):  # per class: -F^*(-s theta / n) - penalty^*(s X^T theta / n)
        if loss == "logistic":
            u = s * A
            neg = (xlogy(u, u) + xlogy(1 - u, 1 - u)).mean(0)
        else:
            neg = -(s * A - (s * A) ** 2 / 4).mean(0)
        return -neg - _pen_conj(G, s, n, alpha, l1_ratio, axis=0)

    dual = dual_at(c)
    if l1_ratio < 1:
        dual = np.maximum(dual, dual_at(np.ones(K)))
    gaps = (primal - dual) / (np.log(2.0) if loss == "logistic" else 1.0)
    return {"primal": float(primal.sum()), "dual": float(dual.sum()), "gap": float(gaps.max()),
            "gaps": gaps.tolist(), "accuracy": float((np.argmax(Z, 1) == codes).mean()),
            "nnz": int(np.count_nonzero(W))}  # fmt: skip


def certify(engine: str, X, codes, W, alpha: float, l1_ratio: float) -> dict:
    model = MODELS[engine]
    if model == "multinomial":
        return certify_multinomial(X, codes, W, alpha, l1_ratio)
    return certify_ovr(X, codes, W, alpha, l1_ratio,
                       "logistic" if model == "ovr logistic" else "squared_hinge")  # fmt: skip


# ---------------------------------------------------------------- children


def _tree_peak_mb() -> float:
    """The child's VmHWM plus its descendants' (Dask workers, Spark's JVM)."""
    import psutil

    kids = psutil.Process().children(recursive=True)
    return _vmhwm_mb() + float(sum(_vmhwm_mb(c.pid) for c in kids))


def _quiet(fn):
    """``fn`` with its warnings silenced (a peer's convergence warnings are results here)."""

    def call():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn()

    return call


def _dl1_fit(X, codes, alpha, cfg, engine, client=None):
    import dl1

    kw = {"alpha": alpha, "l1_ratio": cfg["l1_ratio"], "fit_intercept": False, "client": client}
    if engine in ("dl1-ovr", "dl1-ovr-sqh"):
        kw |= {"multi_class": "ovr", "loss": "logistic" if engine == "dl1-ovr" else "squared_hinge"}
    _bounded(_quiet(lambda: dl1.fit_multiclass(X[:200], codes[:200], **kw)), 300)  # numba warm-up
    t0 = time.perf_counter()
    res, err = _bounded(_quiet(lambda: dl1.fit_multiclass(X, codes, tol=cfg["tol"], **kw)),
                        cfg["time_limit"])  # fmt: skip
    secs = time.perf_counter() - t0
    if err:
        return {"error": err}
    out = {"fit_s": secs, "W": res.coef_, "dl1_gap": float(res.gap_),
           "rounds": int(res.n_rounds_), "settings": f"tol={cfg['tol']:g}"}  # fmt: skip
    if hasattr(res, "n_passes_"):
        out["settings"] += f", {res.n_rounds_} rounds, {res.n_passes_:g} passes over X"
    else:
        out["settings"] += f", {res.n_rounds_} rounds, {res.n_epochs_} epochs"
    return out


def _run_dl1(src, engine, alpha, cfg, q) -> None:
    X, codes = load(src)
    out: dict = {}
    try:
        if engine == "dl1-2w":
            from distributed import Client, LocalCluster

            with (LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                               host="127.0.0.1", dashboard_address="127.0.0.1:0") as cluster,
                  Client(cluster) as client):  # fmt: skip
                out = _dl1_fit(X, codes, alpha, cfg, engine, client)
                out["peak_mb"] = _tree_peak_mb()
                out["settings"] = out.get("settings", "") + ", 2 workers (X sent in the fit)"
        else:
            out = _dl1_fit(X, codes, alpha, cfg, engine)
            out["peak_mb"] = _tree_peak_mb()
        if "W" in out:
            out |= certify(engine, X, codes, out.pop("W"), alpha, cfg["l1_ratio"])
    except Exception as e:  # noqa: BLE001
        out["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    _finish(q, out)


def _sklearn_fitter(engine: str, n: int, alpha: float, l1_ratio: float, max_iter: int):
    """``fit(X, y, tol) -> W`` of a scikit-learn peer (``C = 1 / (n alpha)``)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.multiclass import OneVsRestClassifier
    from sklearn.svm import LinearSVC

    C = 1.0 / (n * alpha)

    def fit(X, y, tol):
        if engine == "saga":
            m = LogisticRegression(solver="saga", C=C, l1_ratio=l1_ratio, tol=tol,
                                   fit_intercept=False, max_iter=max_iter).fit(X, y)  # fmt: skip
            return m.coef_, f"saga, C={C:.4g}, tol={tol:g}, {int(np.max(m.n_iter_))} epochs"
        if engine == "linearsvc":
            m = LinearSVC(penalty="l1", loss="squared_hinge", dual=False, C=C, tol=tol,
                          fit_intercept=False, max_iter=max_iter).fit(X, y)  # fmt: skip
            return m.coef_, f"LinearSVC(l1, dual=False), C={C:.4g}, tol={tol:g}"
        base = LogisticRegression(solver="liblinear", l1_ratio=1.0, C=C, tol=tol,
                                  fit_intercept=False, max_iter=max_iter)  # fmt: skip
        m = OneVsRestClassifier(base).fit(X, y)
        W = np.vstack([e.coef_ for e in m.estimators_])
        return W, f"OneVsRest(liblinear L1), C={C:.4g}, tol={tol:g}"

    return fit


def _spark_fitter(X, codes, alpha, l1_ratio, cfg, out):
    """Spark's session and cached frame (``out["load_s"]``), and ``fit(tol) -> W``."""
    from bench_engines import _spark_frame, _spark_session
    from pyspark.ml.classification import LogisticRegression

    oom = Path(cfg["data_dir"]) / "spark-oom"
    spark = _spark_session({"driver_memory": cfg["driver_memory"]}, str(oom))
    t0 = time.perf_counter()
    df = _spark_frame(spark, X, codes.astype(np.float64), 4)
    out["load_s"] = time.perf_counter() - t0

    def fit(_X, _y, tol):
        m = LogisticRegression(family="multinomial", regParam=alpha, elasticNetParam=l1_ratio,
                               standardization=False, fitIntercept=False, tol=tol,
                               maxIter=cfg["spark_max_iter"]).fit(df)  # fmt: skip
        W = m.coefficientMatrix.toArray()
        return W, (f"regParam={alpha:.4g}, tol={tol:g}, {m.summary.totalIterations} "
                   f"iterations (maxIter {cfg['spark_max_iter']}), driver memory "
                   f"{cfg['driver_memory']}")  # fmt: skip

    return fit


def _run_peer(src, engine, alpha, cfg, q) -> None:
    """A peer's tolerances in turn until it certifies at ``cfg["target"]``."""
    X, codes = load(src)
    out: dict = {"tries": []}
    try:
        if engine == "spark":
            fit, tols = _spark_fitter(X, codes, alpha, cfg["l1_ratio"], cfg, out), cfg["spark_tols"]
        else:
            fit = _sklearn_fitter(engine, X.shape[0], alpha, cfg["l1_ratio"], cfg["max_iter"])
            tols = cfg["peer_tols"]
        deadline = time.perf_counter() + cfg["time_limit"]
        best = None
        for tol in tols:
            left = deadline - time.perf_counter()
            if left <= 1:
                out["note"] = f"time bound spent before tol {tol:g}"
                break
            t0 = time.perf_counter()
            res, err = _bounded(_quiet(lambda tol=tol: fit(X, codes, tol)), left)
            if err:
                out["note"] = f"tol {tol:g}: {err}"
                break
            tri = {"tol": tol, "fit_s": time.perf_counter() - t0, "settings": res[1],
                   **certify(engine, X, codes, res[0], alpha, cfg["l1_ratio"])}  # fmt: skip
            out["tries"].append(tri)
            print(f"    {engine} tol {tol:g}: {tri['fit_s']:.1f} s, gap {tri['gap']:.2e}",
                  flush=True)  # fmt: skip
            if best is not None and tri["gap"] > best["gap"] / 2:
                out["note"] = f"gap floor (tol {tol:g}: {tri['gap']:.1e})"
                best = tri if tri["gap"] < best["gap"] else best
                break
            best = tri
            if tri["gap"] <= cfg["target"]:
                break
        if best is not None:
            out |= {k: v for k, v in best.items() if k != "tol"}
        elif "note" in out:
            out["error"] = out.pop("note")
        out["peak_mb"] = _tree_peak_mb()
    except Exception as e:  # noqa: BLE001
        out["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    _finish(q, out)


def in_child(engine: str, src: str, alpha: float, cfg: dict, limit: float) -> dict:
    """An engine in a spawned child; killed (and said so) past ``limit`` seconds."""
    target = _run_dl1 if engine.startswith("dl1") else _run_peer
    return run_in_child(target, src, engine, alpha, cfg, limit=limit)


def missing(engine: str, l1_ratio: float) -> str | None:
    """Why an engine cannot run here (None if it can)."""
    pkg = NEEDS.get(engine)
    if pkg and importlib.util.find_spec(pkg) is None:
        return f"skipped: {pkg} is not installed"
    if engine == "spark" and shutil.which("java") is None:
        return "skipped: no java on PATH"
    if engine in ("liblinear-ovr", "linearsvc") and l1_ratio < 1:
        return "skipped: liblinear takes the pure L1 penalty only"
    return None


# ---------------------------------------------------------------- main


def closest_peers(rows: list[dict]) -> list[dict]:
    """Per model of the last problem and alpha: the peer answer closest to dl1's gap (the
    lowest certified gap of any peer) when it is looser than dl1's reference fit, so dl1
    can be timed again at that gap (:func:`main`'s equal-gap rows)."""
    out = []
    last = rows[-1]
    here = [r for r in rows if r["problem"] == last["problem"] and r["alpha"] == last["alpha"]]
    for model, ref in REFERENCE.items():
        mine = [r for r in here if r["engine"] == ref and "gap" in r]
        peers = [r for r in here if r["model"] == model and not r["engine"].startswith("dl1")
                 and "gap" in r]  # fmt: skip
        if mine and peers:
            best = min(peers, key=lambda r: r["gap"])
            if best["gap"] > mine[0]["gap"]:
                out.append(best)
    return out


def add_ratios(rows: list[dict], tol: float) -> None:
    """dl1's time over the fastest peer of the same model certified at an equal or tighter
    gap (``vs_peer``), on every dl1 row: a gap at most dl1's, or at most the gap it was
    asked for when it went below it (``tol``, or the peer's gap of an equal-gap row)."""
    for r in rows:
        if not r["engine"].startswith("dl1") or "fit_s" not in r:
            continue
        level = max(r.get("asked_gap", tol), r["gap"])
        peers = [p for p in rows if p["problem"] == r["problem"] and p["alpha"] == r["alpha"]
                 and p["model"] == r["model"] and not p["engine"].startswith("dl1")
                 and "fit_s" in p and p["gap"] <= level]  # fmt: skip
        if peers:
            best = min(peers, key=lambda p: p["fit_s"])
            r["vs_peer"] = f"{r['fit_s'] / best['fit_s']:.2f} x {best['engine']}"
        else:
            r["vs_peer"] = "no peer at its gap"


def _fmt(row: dict, key: str, spec: str = ".2f") -> str:
    v = row.get(key)
    return "-" if v is None else format(v, spec)


def table(rows: list[dict]) -> str:
    lines = ["", "| problem | alpha | model | engine | load s | fit s | rel. gap | train acc. | "
             "nnz | peak MB | dl1 / fastest peer at its gap | settings / result |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        note = "; ".join(x for x in (r.get("settings", ""), r.get("error", ""),
                                     r.get("note", "")) if x)  # fmt: skip
        note = " ".join(note.split()).replace("|", "/")[:400]  # one table cell
        lines.append(
            f"| {r['problem']} | {r['alpha_spec']} = {r['alpha']:.3g} | {r['model']} | "
            f"{r['engine']} | {_fmt(r, 'load_s')} | {_fmt(r, 'fit_s')} | {_fmt(r, 'gap', '.1e')} | "
            f"{_fmt(r, 'accuracy', '.4f')} | {r.get('nnz', '-')} | {_fmt(r, 'peak_mb', '.0f')} | "
            f"{r.get('vs_peer', '')} | {note} |"
        )  # fmt: skip
    return "\n".join(lines)


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", nargs="+", default=["debian", "debian10", "synth20"],
                    choices=["debian", "debian10", "synth20", "tiny"])  # fmt: skip
    ap.add_argument("--engines", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--alpha", nargs="+", default=None, metavar="C=<c>|amax/<r>",
                    help="every problem's alphas (default: DEFAULT_ALPHA)")  # fmt: skip
    ap.add_argument("--l1-ratio", type=float, default=1.0)
    ap.add_argument("--tol", type=float, default=1e-6, help="dl1's relative gap")
    ap.add_argument("--peer-tols", nargs="+", type=float,
                    default=[1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-8])  # fmt: skip
    ap.add_argument("--spark-tols", nargs="+", type=float, default=[1e-6, 1e-8, 1e-10, 1e-12])
    ap.add_argument("--spark-max-iter", type=int, default=1000)
    ap.add_argument("--max-iter", type=int, default=100_000, help="scikit-learn's max_iter")
    ap.add_argument("--driver-memory", default="4g")
    ap.add_argument("--time-limit", type=float, default=600.0,
                    help="seconds of fitting per engine and problem (all its tries)")  # fmt: skip
    ap.add_argument("--no-equal-gap", dest="equal_gap", action="store_false",
                    help="skip timing dl1 again at the closest peer's gap")  # fmt: skip
    ap.add_argument("--data-dir", default="bench-out/multiclass")
    ap.add_argument("--quick", action="store_true", help="the tiny problem only, seconds")
    ap.add_argument("--out", default=None, help="JSON file of every result")
    args = ap.parse_args(argv)
    if args.quick:
        args.problems, args.time_limit, args.driver_memory = ["tiny"], 60.0, "1g"
    return args


def _report(row: dict, rows: list[dict], out: str | None) -> None:
    """Keep a row (and the JSON so far) and print it."""
    rows.append(row)
    if out:
        Path(out).write_text(json.dumps(rows, indent=1, default=str))
    print(f"  {row['engine']:12s} {_fmt(row, 'fit_s')} s, gap {_fmt(row, 'gap', '.2e')}, "
          f"acc {_fmt(row, 'accuracy', '.4f')}, nnz {row.get('nnz', '-')}, peak "
          f"{_fmt(row, 'peak_mb', '.0f')} MB {row.get('error', '')}", flush=True)  # fmt: skip


def main(argv=None) -> list[dict]:
    args = parse(argv)
    here = str(Path(__file__).resolve().parent)  # children import debian_text, bench_engines
    os.environ["PYTHONPATH"] = os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])
    sys.path.insert(0, here)
    rows: list[dict] = []
    for problem in args.problems:
        src = problem_path(problem, args.data_dir)
        X, codes = load(src)
        for spec in args.alpha or [DEFAULT_ALPHA[problem]]:
            alpha = resolve_alpha(spec, X, codes)
            print(f"\n{problem}: {X.shape[0]:,} x {X.shape[1]:,}, nnz {X.nnz:,}, "
                  f"K = {codes.max() + 1}; alpha = {spec} = {alpha:.4g}", flush=True)  # fmt: skip
            cfg = vars(args) | {"target": args.tol}
            targets: dict[str, float] = {}
            for engine in sorted(args.engines, key=lambda e: not e.startswith("dl1")):
                model = MODELS[engine]
                row = {"problem": problem, "alpha_spec": spec, "alpha": alpha, "model": model,
                       "engine": engine, "n": X.shape[0], "p": X.shape[1],
                       "K": int(codes.max() + 1), "X_nnz": int(X.nnz)}  # fmt: skip
                why = missing(engine, args.l1_ratio)
                if why:
                    out = {"error": why}
                else:
                    cfg["target"] = max(args.tol, targets.get(model, args.tol))
                    out = in_child(engine, src, alpha, cfg, limit=args.time_limit + 600)
                if engine == REFERENCE[model] and "gap" in out:
                    targets[model] = out["gap"]
                row |= out | {"loadavg": os.getloadavg()}
                _report(row, rows, args.out)
            for peer in closest_peers(rows) if args.equal_gap else []:
                engine = REFERENCE[peer["model"]]
                cfg_eq = cfg | {"tol": peer["gap"]}
                row = {k: peer[k] for k in ("problem", "alpha_spec", "alpha", "model", "n",
                                            "p", "K", "X_nnz")}  # fmt: skip
                row |= {"engine": f"{engine}@{peer['engine']}", "asked_gap": peer["gap"]}
                row |= in_child(engine, src, alpha, cfg_eq, limit=args.time_limit + 600)
                row |= {"loadavg": os.getloadavg()}
                _report(row, rows, args.out)
    add_ratios(rows, args.tol)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1, default=str))
    print(table(rows))
    return rows


if __name__ == "__main__":
    main()
