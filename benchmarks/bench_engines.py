"""dl1 against Spark MLlib and dask-ml, Lasso and L1-logistic, side by side in one run.

Each problem is a synthetic E2006-like preset (``dl1.datasets.make_e2006_like``, seed 0;
``task="classification"`` for the logistic loss) at ``alpha = alpha_max / --ratio``
(``dl1.alpha_max``, default ratio 20). Each engine runs in a spawned child process of its
own, which first loads the data into the engine (timed separately: ``load s``) and then
fits (``fit s``):

* dl1: ``dl1.persist(X, y)`` on a LocalCluster of 2 single-threaded worker processes
  (127.0.0.1), then ``dl1.fit(data, loss=..., alpha=..., tol=--tol)``, numba warmed up
  first (excluded); ``--repeat`` fits, median time.
* Spark MLlib (pyspark 4): a SparkSession on ``local[2]``, driver on 127.0.0.1, UI off,
  ``--driver-memory``; the data a cached DataFrame of ``(label, SparseVector)`` rows, sent
  from Python (``parallelize``) or, with ``--spark-parquet``, read from a Parquet copy as
  out of core (below);
  ``LinearRegression`` / ``LogisticRegression(elasticNetParam=1, regParam=alpha,
  standardization=False, fitIntercept=True)``. Each ``--spark-tols`` in turn (with
  ``maxIter=--spark-max-iter``) until its answer certifies at dl1's gap (or its gap stops
  falling, or the time bound is spent); the reported row is that fit (re-run ``--repeat``
  times when it took under 60 s: median), the others are in the JSON (``tries``).
* dask-ml: on a LocalCluster of 2 single-threaded worker processes (127.0.0.1); X a dask
  array whose row chunks are pydata ``sparse.COO`` blocks (its documented sparse input),
  persisted on the workers; ``LinearRegression`` / ``LogisticRegression(penalty="l1",
  solver="admm")`` with ``solver_kwargs={"normalize": False, "abstol": ..., "reltol": ...}``
  for each ``--daskml-reltols`` (abstol = reltol / 100), ``max_iter=--daskml-max-iter``.
  A failure (MemoryError, IndexError, ..., or no answer within ``--daskml-time-limit``,
  by default ``--time-limit``) is recorded as the result and the run goes on.

Out of core: a problem named ``<preset>-x<k>`` (``log1p-x4``: 64,348 x 4,272,227, about
373M nonzeros) is ``make_e2006_like(preset, row_multiplier=k, test_fraction=0)`` written
once to a dl1 store, and no process ever holds all of X (``engines_ooc.py``). dl1 fits
straight from the store (``dl1.fit(path, stream=True)``: blocks read in every pass) on
dl1's LocalCluster with ``--ooc-memory-limit`` per worker, no separate load. Spark reads a
Parquet copy written once beforehand, a file of rows at a time from the blocks (its
preparation is ``parquet_prep_s`` in the JSON, not timed as load); its load is
``spark.read.parquet`` + cache + count. dask-ml gets the store's blocks as a dask array of
``sparse.COO`` chunks read by its tasks (not persisted), on workers of
``--ooc-daskml-memory-limit``. The certificate and ``alpha_max`` use ``X @ w`` and
``X.T @ theta`` computed block by block from the store (a SciPy ``LinearOperator``: the
same ``certify``).

The objectives and how alpha is mapped (both checked on a 300 x 40 sparse problem before
this benchmark trusted them, see below). dl1's objective is scikit-learn's:
``1/(2n) ||y - Xw - b||^2 + alpha ||w||_1`` or ``1/n sum log(1 + exp(-y_i z_i)) + alpha
||w||_1``, intercept unpenalised.

* Spark, ``regParam = alpha`` for both losses. ``LinearRegression`` minimises
  ``1/(2n) ||y - Xw - b||^2 + regParam ||w||_1``; internally it divides the label by its
  standard deviation s and the penalty by s too, which rescales the problem by s^2 and
  leaves the solution unchanged, so no factor s appears. ``LogisticRegression`` minimises
  the mean log-loss (labels 0/1) plus ``regParam ||w||_1``. With ``standardization=False``
  Spark's internal feature scaling is compensated per feature, the intercept is not
  penalised. Checked against ``sklearn.linear_model.Lasso`` (tol 1e-12) at alpha_max/5 and
  alpha_max/20: coefficients equal to 9e-9 (max |coef| 2.2; ``regParam = alpha * s``
  instead is off by 0.5), and against liblinear's L1 logistic (``C = 1/(n alpha)``,
  intercept scaling 1e4) to 2e-5, same supports.
* dask-ml (dask-glm): the squared loss is the *sum* ``||y - Xw||^2`` (no 1/2, no 1/n), the
  logistic the sum of log-losses (labels 0/1), the penalty ``(1/C) ||w||_1``: so
  ``C = 1 / (2 n alpha)`` (squared) and ``C = 1 / (n alpha)`` (logistic). dask-glm by
  default standardises the columns of X (``normalize=True``), which changes the penalty
  (and raises "Multiple constant columns detected!" on text data's empty columns, or fails
  on sparse chunks): ``normalize=False`` is passed. Checked with ``fit_intercept=False``
  against scikit-learn: admm to 2e-4 (Lasso) and 2e-5 (logistic); proximal_grad only to
  9e-2 / 2e-2, hence admm. dask-ml's own intercept (``fit_intercept=True``) fails on
  sparse chunks ("All arrays must be instances of SparseArray": it concatenates a dense
  column of ones), so the blocks get an explicit constant column of value
  ``--intercept-scaling`` (1) and ``fit_intercept=False``; that column is penalised like
  any coefficient, so dask-ml solves a slightly different problem and is certified, as
  every answer, against the one with a free intercept. (A column of 100, penalising the
  intercept 100 times less, made admm far slower: the smoke problem's Lasso got no answer
  in 117 s, against 13 s with 1.)

Every answer ``(w, b)`` is certified by the same NumPy certificate: dl1's duality gap
(``dl1.objective.gap.duality_gap``) on the full data at that point, relative to ``P`` at
the best constant (``gap / P(b0)``, the quantity dl1's ``tol`` bounds). Peak memory is
the peak RSS (VmHWM) of the engine's processes: Spark's JVM and its Python workers
(``psutil`` children of the child process), the two Dask workers for dl1 and dask-ml
(the client, which holds the data, is not counted for any engine). The machine has 2
cores shared by the engines' processes; figures compare within one run.

    python benchmarks/bench_engines.py --problems tfidf log1p short --out engines.json
    python benchmarks/bench_engines.py --problems log1p-x4 --out engines-ooc.json
    python benchmarks/bench_engines.py --smoke          # tiny synthetic data, seconds
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import statistics
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from engines_ooc import (
    StoreMatrix,
    daskml_store_arrays,
    make_store,
    ooc_spec,
    parquet_note,
    smoke_data,
    spark_parquet_frame,
    store_alpha_max,
    write_parquet,
)

ENGINES = ("dl1", "spark", "dask-ml")


# ---------------------------------------------------------------- data and certificate


def _vmhwm_mb(pid: int | str = "self") -> float:
    """Peak RSS (VmHWM) of a process, MB; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def problem_data(problem: str, loss: str, data_dir: str, limit_rows: int | None) -> str:
    """Path of an .npz holding ``X`` (CSR) and ``y`` of a problem (generated once)."""
    d = Path(data_dir)
    d.mkdir(parents=True, exist_ok=True)
    task = "classification" if loss == "logistic" else "regression"
    out = d / f"{problem}-{task}-{limit_rows or 'all'}.npz"
    if out.exists():
        return str(out)
    if problem == "smoke":
        X, y = smoke_data(loss)
    else:
        import dl1
        from dl1.datasets import make_e2006_like

        path = d / f"{problem}-{task}.zarr"
        if not (path / "dl1-manifest.json").exists():
            print(f"generating {problem} ({task}) -> {path}", flush=True)
            make_e2006_like(path, preset=problem, task=task, seed=0, overwrite=True)
        store = dl1.open_store(path)
        X = sp.csr_matrix(store.to_dask().compute(scheduler="sync"))
        y = np.asarray(store.read("y"), dtype=np.float64)
        if limit_rows:
            X, y = X[:limit_rows], y[:limit_rows]
    np.savez(out, data=X.data, indices=X.indices, indptr=X.indptr, shape=X.shape, y=y)
    return str(out)


def load_npz(path: str):
    f = np.load(path)
    X = sp.csr_matrix((f["data"], f["indices"], f["indptr"]), shape=tuple(f["shape"]))
    return X, f["y"]


def load_problem(src: str):
    """``(X, y)`` of a problem: a CSR matrix from an .npz, or an out-of-core problem's
    :class:`StoreMatrix` (read block by block) from a store."""
    if src.endswith(".zarr"):
        X = StoreMatrix(src)
        return X, X.read_y()
    return load_npz(src)


def certify(X, y, coef, b, alpha: float, loss: str) -> float:
    """Relative duality gap of ``(coef, b)``: dl1's gap function (NumPy) on the full data at
    the answer's own point, over ``P`` at the best constant (y in {-1, +1} for logistic)."""
    from dl1.objective.datafits import Logistic, Quadratic
    from dl1.objective.gap import duality_gap
    from dl1.objective.penalties.elastic_net import ElasticNet

    df = Logistic() if loss == "logistic" else Quadratic()
    z = X @ coef + b
    theta = df.dual_point(y, z, None, True)
    _, _, gap = duality_gap(df, ElasticNet(alpha), y, z, coef, X.T @ theta, theta=theta)
    p0 = df.value(y, np.full(y.shape[0], df.initial_intercept(y)))
    return float(gap / p0)


def _answer(X, y, coef, b, alpha, loss) -> dict:
    coef = np.asarray(coef, dtype=np.float64).ravel()
    return {"gap": certify(X, y, coef, float(b), alpha, loss),
            "nnz": int(np.count_nonzero(coef))}  # fmt: skip


def _error(e: BaseException) -> str:
    """An exception as a result: its start, and the JVM's error when Spark died of one."""
    msg = f"{type(e).__name__}: {str(e)[:300]}"
    oom = "java.lang.OutOfMemoryError"
    if oom in str(e) and oom not in msg:
        msg = f"{oom} ({msg})"
    return msg


def _bounded(fn, seconds: float):
    """``fn()`` in a daemon thread: (result, None), or (None, error string) when it raises
    or is still running after ``seconds`` (it is then abandoned; the child exits)."""
    box: dict = {}

    def run():
        try:
            box["out"] = fn()
        except BaseException as e:  # noqa: BLE001 - the error is the result
            box["err"] = _error(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(max(seconds, 1.0))
    if t.is_alive():
        return None, f"no answer within {seconds:.0f} s"
    return box.get("out"), box.get("err")


def _cluster(workers: int, memory_limit: str | None = None, dl1_setup: bool = False):
    """Distributed's LocalCluster (Dask's default memory limit unless ``memory_limit``), or
    with ``dl1_setup`` dl1's (spill buffer and malloc settings for memory-limited workers,
    ``dl1.runtime.localcluster``)."""
    from distributed import Client, LocalCluster

    from dl1.runtime.localcluster import local_cluster

    kw = {"n_workers": workers, "threads_per_worker": 1, "processes": True,
          "host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"}  # fmt: skip
    if memory_limit:
        kw["memory_limit"] = memory_limit
    cluster = local_cluster(**kw) if dl1_setup else LocalCluster(**kw)
    return cluster, Client(cluster)


def _workers_peak(client) -> float:
    try:
        return float(sum(client.run(_vmhwm_mb).values()))
    except Exception:  # noqa: BLE001 - a dead worker
        return float("nan")


def _finish(q, out: dict) -> None:
    """Hand ``out`` to the parent and leave at once (threads left running are abandoned)."""
    q.put(out)
    q.close()
    q.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ---------------------------------------------------------------- the engines (children)


def _run_dl1(src, loss, alpha, cfg, q) -> None:
    import dl1

    X, y = load_problem(src)
    ooc = isinstance(X, StoreMatrix)
    mem = cfg.get("ooc_memory_limit", "1GiB") if ooc else None
    out: dict = {"settings": f"tol={cfg['tol']:g}, solver=auto, {cfg['workers']} workers"
                 + (f" x memory_limit {mem}, read from the store in every pass (stream=True)"
                    if ooc else "")}  # fmt: skip
    cluster, client = _cluster(cfg["workers"], mem, dl1_setup=ooc)
    try:
        from dl1.runtime.executor import DistributedExecutor

        DistributedExecutor(client)  # numba warm-up, excluded
        Xw, yw = smoke_data(loss) if ooc else (X[:200], y[:200])
        dl1.fit(Xw, yw, alpha=alpha, loss=loss, client=client)  # warm-up
        t0 = time.perf_counter()
        data = src if ooc else dl1.persist(X, y, client=client)
        if not ooc:  # out of core, the store is read inside every fit
            out["load_s"] = time.perf_counter() - t0
        kw = {"stream": True} if ooc else {}
        times = []
        for _ in range(cfg["repeat"]):
            if times and times[-1] > 60:  # as Spark's: repeated only when under 60 s
                break
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t0 = time.perf_counter()
                res, err = _bounded(lambda: dl1.fit(data, alpha=alpha, loss=loss, tol=cfg["tol"],
                                                    client=client, **kw),
                                    cfg["time_limit"])  # fmt: skip
            if err:
                out["error"] = err
                break
            times.append(time.perf_counter() - t0)
        if times:
            out["peak_mb"] = _workers_peak(client)
            out |= _answer(X, y, res.coef_, res.intercept_, alpha, loss)
            out |= {"fit_s": statistics.median(times), "fit_runs": times,
                    "dl1_gap": float(res.gap_), "rounds": int(res.n_rounds_),
                    "streamed": bool(getattr(res, "streamed_", False))}  # fmt: skip
        out.setdefault("peak_mb", _workers_peak(client))
    except Exception as e:  # noqa: BLE001
        out["error"] = _error(e)
    _finish(q, out)


def _spark_session(cfg, oom_flag: str):
    """Spark on local[2]; its JVM touches ``oom_flag`` if it runs out of heap (an error
    that reaches Python only as a stopped SparkContext)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder
    for kv in cfg.get("spark_conf") or []:
        builder = builder.config(*kv.split("=", 1))
    spark = (
        builder.master("local[2]")
        .config("spark.driver.extraJavaOptions", f'-XX:OnOutOfMemoryError="touch {oom_flag}"')
        .appName("dl1-bench-engines")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", cfg["driver_memory"])
        .config("spark.driver.maxResultSize", "4g")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _spark_frame(spark, X, y01, partitions: int):
    from pyspark.ml.linalg import SparseVector, VectorUDT
    from pyspark.sql.types import DoubleType, StructField, StructType

    p = X.shape[1]
    schema = StructType([StructField("label", DoubleType()), StructField("features", VectorUDT())])

    def rows(block):
        Xk, yk = block
        for i in range(Xk.shape[0]):
            a, b = Xk.indptr[i], Xk.indptr[i + 1]
            yield (float(yk[i]), SparseVector(p, Xk.indices[a:b], Xk.data[a:b]))

    cuts = np.linspace(0, X.shape[0], partitions + 1).astype(int)
    blocks = [(X[a:b], y01[a:b]) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    rdd = spark.sparkContext.parallelize(blocks, partitions).flatMap(rows)
    df = spark.createDataFrame(rdd, schema).cache()
    df.count()
    return df


def _spark_peak() -> float:
    import psutil

    return float(sum(_vmhwm_mb(c.pid) for c in psutil.Process().children(recursive=True)))


def _run_spark(src, loss, alpha, cfg, q) -> None:
    X, y = load_problem(src)
    y01 = (y > 0).astype(np.float64) if loss == "logistic" else y
    out: dict = {"tries": []}
    spark = None
    oom = Path(tempfile.mkdtemp(prefix="dl1-spark-")) / "oom"
    out["settings"] = "; ".join(
        [f"driver memory {cfg['driver_memory']}", *(cfg.get("spark_conf") or [])]
        + ([parquet_note(cfg["parquet"])] if cfg.get("parquet") else [])
    )
    try:
        spark = _spark_session(cfg, str(oom))
        t0 = time.perf_counter()
        if cfg.get("parquet"):
            df = spark_parquet_frame(spark, cfg["parquet"])
        else:
            df = _spark_frame(spark, X, y01, cfg["partitions"])
        out["load_s"] = time.perf_counter() - t0
        out["partitions"] = df.rdd.getNumPartitions()
        deadline = time.perf_counter() + cfg["time_limit"]
        from pyspark.ml.classification import LogisticRegression
        from pyspark.ml.regression import LinearRegression

        Est = LogisticRegression if loss == "logistic" else LinearRegression

        def fit(tol):
            m = Est(elasticNetParam=1.0, regParam=alpha, standardization=False,
                    fitIntercept=True, tol=tol, maxIter=cfg["spark_max_iter"]).fit(df)  # fmt: skip
            return m.coefficients.toArray(), float(m.intercept), int(m.summary.totalIterations)

        best = None
        for tol in cfg["spark_tols"]:
            left = deadline - time.perf_counter()
            if left <= 1:
                out["note"] = f"time bound spent before tol {tol:g}"
                break
            t0 = time.perf_counter()
            res, err = _bounded(lambda tol=tol: fit(tol), left)
            if err:
                _bounded(spark.sparkContext.cancelAllJobs, 30)  # fails if Spark is dead
                out["tries"].append({"tol": tol, "error": err})
                out["note"] = f"tol {tol:g}: {err}"
                break
            secs = time.perf_counter() - t0
            coef, b, iters = res
            a = _answer(X, y, coef, b, alpha, loss)
            tri = {"tol": tol, "fit_s": secs, "iterations": iters, **a}
            out["tries"].append(tri)
            print(f"    spark tol {tol:g}: {secs:.1f} s, {iters} iterations, gap "
                  f"{a['gap']:.2e}", flush=True)  # fmt: skip
            if best is not None and tri["gap"] > best["gap"] / 2:
                out["note"] = f"gap floor (tol {tol:g}: {tri['gap']:.1e})"
                if tri["gap"] < best["gap"]:
                    best = tri
                break
            best = tri
            if tri["gap"] <= cfg["target"]:
                break
            if iters >= cfg["spark_max_iter"]:
                out["note"] = f"maxIter {cfg['spark_max_iter']} reached at tol {tol:g}"
        if best is not None:
            times = [best["fit_s"]]
            for _ in range(cfg["repeat"] - 1):
                if best["fit_s"] > 60 or time.perf_counter() + best["fit_s"] > deadline:
                    break
                t0 = time.perf_counter()
                fit(best["tol"])
                times.append(time.perf_counter() - t0)
            out |= {"gap": best["gap"], "nnz": best["nnz"], "fit_s": statistics.median(times),
                    "fit_runs": times,
                    "settings": f"tol={best['tol']:g}, maxIter={cfg['spark_max_iter']} "
                                f"({best['iterations']} iterations); "
                                + out["settings"]}  # fmt: skip
        elif out["tries"]:
            out["error"] = out["tries"][-1]["error"]
        out["peak_mb"] = _spark_peak()
    except Exception as e:  # noqa: BLE001
        out["error"] = _error(e)
    if oom.exists():  # the JVM ran out of heap: say so before the error Python saw
        where = "fit" if "load_s" in out else "load"
        key = "error" if "error" in out else "note"
        was = out.get(key, "").replace("java.lang.OutOfMemoryError ", "")
        out[key] = f"java.lang.OutOfMemoryError (driver memory {cfg['driver_memory']}, {where})"
        out[key] += f": {was}" if was else ""
    oom.unlink(missing_ok=True)
    oom.parent.rmdir()
    if spark is not None:
        out.setdefault("peak_mb", _spark_peak())
        _bounded(spark.stop, 30)
    _finish(q, out)


def _daskml_memory(X, y, loss, s, client, partitions):
    """X (with the constant column ``s``) and y as dask arrays of ``partitions`` row chunks,
    X's chunks pydata ``sparse.COO``, scattered to the workers and persisted there."""
    import dask.array as da
    import sparse
    from distributed import wait

    n, p = X.shape
    cuts = np.linspace(0, n, partitions + 1).astype(int)
    Xs, ys = [], []
    meta = sparse.COO.from_numpy(np.zeros((0, 0)))
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        block = sp.hstack([X[a:b], sp.csr_matrix(np.full((b - a, 1), s))]).tocsr()
        fx = client.scatter(sparse.COO.from_scipy_sparse(block))
        Xs.append(da.from_delayed(fx, shape=(b - a, p + 1), dtype=np.float64, meta=meta))
        yb = (y[a:b] > 0).astype(np.float64) if loss == "logistic" else y[a:b]
        ys.append(da.from_delayed(client.scatter(yb), shape=(b - a,), dtype=np.float64))
    Xd, yd = client.persist([da.concatenate(Xs), da.concatenate(ys)])
    wait([Xd, yd])
    return Xd, yd


def _run_daskml(src, loss, alpha, cfg, q) -> None:
    X, y = load_problem(src)
    ooc = isinstance(X, StoreMatrix)
    n, p = X.shape
    s = cfg["intercept_scaling"]
    out: dict = {"tries": []}
    mem = cfg.get("ooc_daskml_memory_limit", "4GiB") if ooc else None
    cluster, client = _cluster(cfg["workers"], mem)
    try:
        t0 = time.perf_counter()
        if ooc:  # lazy: the store's blocks are read by the tasks of every admm iteration
            Xd, yd = daskml_store_arrays(src, loss, s, cfg["partitions"])
        else:
            Xd, yd = _daskml_memory(X, y, loss, s, client, cfg["partitions"])
            out["load_s"] = time.perf_counter() - t0
        deadline = time.perf_counter() + cfg.get("daskml_time_limit", cfg["time_limit"])
        from dask_ml.linear_model import LinearRegression, LogisticRegression

        if loss == "logistic":
            Est, C = LogisticRegression, 1.0 / (n * alpha)
        else:
            Est, C = LinearRegression, 1.0 / (2 * n * alpha)
        best = None
        for reltol in cfg["daskml_reltols"]:
            left = deadline - time.perf_counter()
            if left <= 1:
                out["note"] = f"time bound spent before reltol {reltol:g}"
                break
            kw = {"normalize": False, "reltol": reltol, "abstol": reltol / 100}
            est = Est(penalty="l1", C=C, fit_intercept=False, solver="admm",
                      max_iter=cfg["daskml_max_iter"], solver_kwargs=kw)  # fmt: skip
            t0 = time.perf_counter()
            res, err = _bounded(lambda est=est: est.fit(Xd, yd), left)
            if err:
                out["tries"].append({"reltol": reltol, "error": err})
                out["note"] = f"reltol {reltol:g}: {err}"
                break
            secs = time.perf_counter() - t0
            coef = np.asarray(est.coef_, dtype=np.float64)
            a = _answer(X, y, coef[:-1], s * coef[-1], alpha, loss)
            tri = {"reltol": reltol, "fit_s": secs, **a}
            out["tries"].append(tri)
            print(f"    dask-ml reltol {reltol:g}: {secs:.1f} s, gap {a['gap']:.2e}", flush=True)
            if best is None or tri["gap"] < best["gap"]:
                best = tri
            if tri["gap"] <= cfg["target"]:
                break
        if best is not None:
            out |= {"gap": best["gap"], "nnz": best["nnz"], "fit_s": best["fit_s"],
                    "fit_runs": [best["fit_s"]],
                    "settings": f"admm, reltol={best['reltol']:g}, abstol="
                                f"{best['reltol'] / 100:g}, max_iter={cfg['daskml_max_iter']}, "
                                f"C={C:.4g}, normalize=False, intercept column {s:g}"
                                + (f"; X read from the store's blocks by its tasks, not "
                                   f"persisted, {cfg['workers']} workers x memory_limit {mem}"
                                   if ooc else "")}  # fmt: skip
        elif out["tries"]:
            out["error"] = out["tries"][-1]["error"]
        out["peak_mb"] = _workers_peak(client)
    except Exception as e:  # noqa: BLE001
        out["error"] = _error(e)
    _finish(q, out)


RUNNERS = {"dl1": _run_dl1, "spark": _run_spark, "dask-ml": _run_daskml}


def in_child(engine: str, *args, limit: float) -> dict:
    """An engine in a spawned child; the parent's own bound (the child bounds its fits)."""
    return run_in_child(RUNNERS[engine], *args, limit=limit)


def run_in_child(target, *args, limit: float) -> dict:
    """``target(*args, q)`` in a spawned child, its answer read from ``q``; killed (and
    said so) past ``limit`` seconds."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, q))
    p.start()
    try:
        out = q.get(timeout=limit)
    except queue.Empty:
        out = {"error": f"child gave no answer within {limit:.0f} s (killed)"}
        p.kill()
    p.join(60)
    if p.is_alive():
        p.kill()
    return out


# ---------------------------------------------------------------- main


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", nargs="+", default=["tfidf", "log1p", "short"],
                    help="presets of dl1.datasets (tfidf, log1p, short, shortclf, tall, "
                    "small); <preset>-x<k>: k times the rows, out of core")  # fmt: skip
    ap.add_argument("--losses", nargs="+", default=["squared", "logistic"],
                    choices=["squared", "logistic"])  # fmt: skip
    ap.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    ap.add_argument("--limit-rows", type=int, default=None, help="first rows only")
    ap.add_argument("--smoke", action="store_true", help="tiny synthetic data, seconds")
    ap.add_argument("--data-dir", default="bench-out/engines")
    ap.add_argument("--ratio", type=float, default=20.0, help="alpha = alpha_max / ratio")
    ap.add_argument("--tol", type=float, default=1e-6, help="dl1's relative gap")
    ap.add_argument("--repeat", type=int, default=3, help="dl1's fits (and Spark's final)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=4, help="Spark's and dask-ml's")
    ap.add_argument("--time-limit", type=float, default=600.0,
                    help="seconds of fitting per engine and problem (after its load)")  # fmt: skip
    ap.add_argument("--spark-tols", nargs="+", type=float,
                    default=[1e-6, 1e-8, 1e-10, 1e-12])  # fmt: skip
    ap.add_argument("--spark-max-iter", type=int, default=1000)
    ap.add_argument("--driver-memory", default="8g")
    ap.add_argument("--spark-conf", nargs="+", default=[], metavar="KEY=VALUE",
                    help="more Spark settings")  # fmt: skip
    ap.add_argument("--spark-parquet", action="store_true",
                    help="Spark reads a Parquet copy (as out of core) for problems in memory "
                    "too, instead of rows sent from Python")  # fmt: skip
    ap.add_argument("--daskml-reltols", nargs="+", type=float, default=[1e-2, 1e-4])
    ap.add_argument("--daskml-max-iter", type=int, default=250)
    ap.add_argument("--intercept-scaling", type=float, default=1.0,
                    help="dask-ml's constant column (its intercept, penalised)")  # fmt: skip
    ap.add_argument("--daskml-time-limit", type=float, default=None,
                    help="dask-ml's seconds of fitting (default: --time-limit)")  # fmt: skip
    ap.add_argument("--ooc-memory-limit", default="1GiB",
                    help="memory_limit of each dl1 worker on an out-of-core problem")  # fmt: skip
    ap.add_argument("--ooc-daskml-memory-limit", default="4GiB",
                    help="memory_limit of each dask-ml worker on an out-of-core problem (on "
                    "one in memory, Dask's default)")  # fmt: skip
    ap.add_argument("--out", default=None, help="JSON file of every result")
    args = ap.parse_args(argv)
    if args.smoke:
        args.problems, args.time_limit, args.repeat = ["smoke", "smoke-x2"], 30, 1
        args.driver_memory, args.daskml_reltols = "1g", args.daskml_reltols[:1]
        args.daskml_time_limit = None
    if args.daskml_time_limit is None:
        args.daskml_time_limit = args.time_limit

    import dl1

    rows: list[dict] = []
    for problem in args.problems:
        for loss in args.losses:
            cfg = vars(args) | {"target": args.tol}
            prep: dict = {}
            if ooc_spec(problem):  # X stays on disk: read block by block, never whole
                src = make_store(problem, loss, args.data_dir)
                X, y = load_problem(src)
                amax = store_alpha_max(X, y, loss)
            else:
                src = problem_data(problem, loss, args.data_dir, args.limit_rows)
                X, y = load_npz(src)
                amax = float(dl1.alpha_max(X, y, loss=loss))
            if "spark" in args.engines and (ooc_spec(problem) or args.spark_parquet):
                t0 = time.perf_counter()
                cfg["parquet"] = write_parquet(X, y, loss, src.rsplit(".", 1)[0] + ".parquet")
                prep["parquet_prep_s"] = time.perf_counter() - t0
            alpha = amax / args.ratio
            print(f"\n{problem} {loss}: {X.shape[0]:,} x {X.shape[1]:,}, nnz {X.nnz:,}; "
                  f"alpha = alpha_max/{args.ratio:g} = {alpha:.4g}", flush=True)  # fmt: skip
            for engine in args.engines:
                limit = 3 * max(args.time_limit, args.daskml_time_limit) + 1800
                out = in_child(engine, src, loss, alpha, cfg, limit=limit)
                if engine == "dl1" and "gap" in out:
                    cfg["target"] = max(args.tol, out["gap"])  # the peers' aim
                row = {"problem": problem, "loss": loss, "engine": engine,
                       "n": X.shape[0], "p": X.shape[1], "X_nnz": int(X.nnz),
                       "alpha_max": amax, "alpha": alpha, **prep, **out,
                       "loadavg": os.getloadavg()}  # fmt: skip
                rows.append(row)
                if args.out:  # kept as it comes
                    Path(args.out).write_text(json.dumps(rows, indent=1, default=str))
                print(f"  {engine:8s} {_fmt(row, 'load_s')} s load, {_fmt(row, 'fit_s')} s "
                      f"fit, gap {_fmt(row, 'gap', '.2e')}, nnz {row.get('nnz', '-')}, "
                      f"peak {_fmt(row, 'peak_mb', '.0f')} MB  {row.get('error', '')}",
                      flush=True)  # fmt: skip
            del X, y
    print(table(rows))
    return rows


def _fmt(row: dict, key: str, spec: str = ".2f") -> str:
    v = row.get(key)
    return "-" if v is None or (isinstance(v, float) and np.isnan(v)) else format(v, spec)


def table(rows: list[dict]) -> str:
    lines = ["", "| problem | loss | engine | load s | fit s | rel. gap | nnz | peak MB | "
             "settings / result |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        err, extra = r.get("error", ""), r.get("note", "")
        if err and err in extra:  # the last try's error, said with its setting
            err = ""
        note = "; ".join(x for x in (r.get("settings", ""), err, extra) if x)
        runs = r.get("fit_runs") or []
        fit = _fmt(r, "fit_s") + (f" (median of {len(runs)})" if len(runs) > 1 else "")
        lines.append(f"| {r['problem']} | {r['loss']} | {r['engine']} | {_fmt(r, 'load_s')} | "
                     f"{fit} | {_fmt(r, 'gap', '.1e')} | {r.get('nnz', '-')} | "
                     f"{_fmt(r, 'peak_mb', '.0f')} | {note} |")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    main()
