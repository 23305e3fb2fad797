"""Issue 31's benchmark matrix: dl1 against celer, skglm, scikit-learn, Snap ML and liblinear.

For every preset, loss and kind, every solver computes the same answer:

- loss ``squared``: the Lasso ``1/(2n) ||y - X w - b||^2 + alpha ||w||_1``; ``logistic``: L1
  logistic regression ``(1/n) sum_i log(1 + exp(-y_i (x_i w + b))) + alpha ||w||_1``, labels
  in {-1, +1}; both with an unpenalised intercept ``b``;
- kind ``fit``: one alpha, ``alpha_max / --ratio`` (default 20); ``path``: ``--n-alphas``
  (default 100) alphas from ``alpha_max`` down to ``--eps * alpha_max``, warm-started from one
  alpha to the next where the solver can be (scikit-learn, celer, skglm; liblinear and Snap ML
  start every alpha cold);

each to relative duality gap 1e-6, certified by one NumPy computation for every solver
(:func:`rel_gap`, dl1's datafits and :func:`dl1.objective.gap.duality_gap`): the gap at the
dual point ``-n grad F(X w + b)`` taken at the best intercept shift, balanced
(``sum theta = 0``) and rescaled into the L1 dual ball, divided by ``P(0)`` (the objective at
``w = 0`` with the intercept fitted). For the squared loss that is scikit-learn's Lasso gap;
for the logistic loss the Fenchel gap of L1 logistic regression. Peers whose intercept is a
penalised constant feature (Snap ML, liblinear; celer's L1 logistic regression, which has no
intercept, gets a constant column of ``INTERCEPT_SCALING``, 1e5-1e6) have their intercept refitted
exactly for their ``w`` before the check (not timed).

Solvers: ``dl1`` on a LocalCluster of ``--workers`` single-threaded worker processes (its
store read from disk in every timed run, after one untimed warm-up run of the same kind),
``dl1-inproc`` the same in the calling process (``client=None``); the peers get ``X`` in
memory (loading not timed, one untimed warm-up fit on a few rows to compile numba code).
Squared: celer, skglm, scikit-learn's ``Lasso``, Snap ML; logistic: celer, skglm,
liblinear (scikit-learn's ``LogisticRegression(solver="liblinear")``, at most 1,000
iterations: tighter tols than 1e-6 can stall it), Snap ML. Peers start
at tolerances meant to reach 1e-6 (``PEER_TOL``); a fit (or a path's alpha) that the check
does not certify is redone once with a 100x tighter tol (that time counts for a path's
alpha; a fit's reported times are all at the final tol); a peer still short is marked ✗.

Peers are stopped at a limit per cell: dl1 and dl1-inproc run first, and a peer's run of a
(preset, loss, kind) is stopped after ``--peer-limit-factor`` (5) times the larger of dl1's
two medians on it, at least ``--peer-limit-min`` (10) seconds; a path's limit is also at most
``--time-limit``. Only the timed library calls count (the child announces each call's
start, with a path's timed seconds so far, and its end): a path stops after the alpha that
passes the limit, and a call still running ``--peer-limit-grace`` (10) seconds past the
limit has its child process (and anything it started) killed, the job recorded as stopped
with its timed seconds, and a new child goes on with the next job (reloading the data).
A peer's untimed warm-up (a fit on 500 rows) is bounded by the same limit; a peer stopped
there reads ``(stopped in its warm-up)`` and is no bound on the speed-up.
dl1's children are never stopped. Within its limit a peer runs as before (every repeat,
every retry at a tighter tol). A stopped peer reads ``> t s (stopped)`` (``t``: its timed
seconds when stopped, at least its limit), its memory the peak until then (``≥ MB``). The
speed-up is taken against the fastest certified peer when its median is below every
stopped peer's ``t``; otherwise, if a peer was stopped, against the smallest ``t``, as a
lower bound ``> x`` (every peer then either stopped, took longer, or was not certified:
:func:`peer_reference`). Times are medians of ``--repeat`` runs
(``--path-repeat`` for paths, ``--peer-path-repeat`` for the peers' paths); peak memory is
the high-water RSS of each process over a job (dl1 on the cluster: the coordinator and each
worker).

Every solver runs in child processes, one per (solver, preset, loss); results are printed
as markdown tables (times, speed-ups, memory) and written to ``--json``.

    python benchmarks/bench_matrix.py --presets small short tfidf log1p shortclf \\
        --losses squared logistic --kinds fit path --repeat 3 --json bench-out/matrix.json
    python benchmarks/bench_matrix.py --quick   # every cell on tiny data, a few minutes
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import multiprocessing as mp
import queue
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

TARGET = 1e-6
PRESETS = ("small", "short", "tfidf", "log1p", "shortclf")
PEERS = {
    "squared": ("celer", "skglm", "sklearn", "snapml"),
    "logistic": ("celer", "skglm", "liblinear", "snapml"),
}
DL1 = ("dl1", "dl1-inproc")
#: Each peer's first tol for a relative gap of 1e-6 (its own stopping rule's equivalent):
#: scikit-learn and celer's Lasso stop on gap <= tol ||y - mean y||^2 / n = 2 tol P(0);
#: celer's logistic on gap <= tol n log 2 (its sum, >= n P(0)); skglm on a KKT violation;
#: liblinear and Snap ML on their own progress measures.
PEER_TOL = {
    ("sklearn", "squared"): 5e-7,
    ("celer", "squared"): 5e-7,
    ("skglm", "squared"): 1e-6,
    ("snapml", "squared"): 1e-6,
    ("celer", "logistic"): 3e-7,
    ("skglm", "logistic"): 1e-6,
    ("liblinear", "logistic"): 1e-6,
    ("snapml", "logistic"): 1e-6,
}
RETRY_FACTOR = 100.0
#: The constant feature standing for the intercept of the peers that penalise it: large, so
#: that its penalty (``alpha |b| / scaling``) does not bias ``w`` beyond a gap of 1e-6 (at 100
#: the gap stalls near 1e-3, at 1e4 near 1e-5); liblinear's at 1e6 takes ~100x longer.
INTERCEPT_SCALING = {"snapml": 1e6, "celer": 1e6, "liblinear": 1e5}
#: Peers whose intercept is refitted exactly before the check (see the module docstring).
REFIT_INTERCEPT = {"snapml", "liblinear", ("celer", "logistic")}
WARM_STARTED = {"sklearn", "celer", "skglm"}


@dataclasses.dataclass(frozen=True)
class Job:
    """One cell of the matrix for one solver: a fit at ``alphas[0]`` or a path on ``alphas``."""

    preset: str
    loss: str
    kind: str
    store: str
    alphas: tuple[float, ...]
    p0: float
    repeat: int
    time_limit: float
    warmup: int = 1
    peer_repeat: int = 1


# ----------------------------------------------------------------------------- the check
def _datafit(loss: str):
    from dl1.objective.datafits import Logistic, Quadratic

    return Logistic() if loss == "logistic" else Quadratic()


def p_zero(y: np.ndarray, loss: str) -> float:
    """``P(0)``: the objective at ``w = 0`` with the intercept fitted."""
    df = _datafit(loss)
    return float(df.value(y, np.full(y.shape[0], df.initial_intercept(y))))


def alpha_max(X: sp.spmatrix, y: np.ndarray, loss: str) -> float:
    """The smallest alpha whose solution is ``w = 0`` (with the intercept fitted)."""
    theta = _datafit(loss).dual_point(y, np.zeros(y.shape[0]), None, True)
    return float(np.abs(X.T @ theta).max() / X.shape[0])


def rel_gap(X, y, loss: str, coef: np.ndarray, b: float, alpha: float, p0: float) -> float:
    """Relative duality gap ``gap / P(0)`` of ``(coef, b)``, in NumPy on the full data."""
    from dl1.objective.gap import duality_gap
    from dl1.objective.penalties.elastic_net import ElasticNet

    df = _datafit(loss)
    z = X @ coef + b
    theta = df.dual_point(y, z, None, True)
    _, _, gap = duality_gap(df, ElasticNet(alpha), y, z, coef, X.T @ theta, theta=theta)
    return float(gap / p0)


def refit_intercept(X, y, loss: str, coef: np.ndarray) -> float:
    """The best intercept for ``coef`` (mean residual; Newton steps on the log-loss)."""
    z = X @ coef
    if loss == "squared":
        return float(np.mean(y - z))
    df = _datafit(loss)
    b = df.initial_intercept(y)
    return float(b + df.intercept_update(y, z + b, None, max_iter=50))


def _sparse(coef: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    idx = np.flatnonzero(coef)
    return idx, coef[idx]


def _dense(sparse: tuple[np.ndarray, np.ndarray], p: int) -> np.ndarray:
    out = np.zeros(p)
    out[sparse[0]] = sparse[1]
    return out


# ----------------------------------------------------------------------- process helpers
def _peak_mb() -> float:
    """High-water RSS of this process since the last :func:`_reset_peak`, in MB."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak() -> None:
    """Restart the high-water RSS from the current RSS (Linux ``clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:  # not Linux, or not allowed: the peak then covers the whole process
        pass


def _load(store: str) -> tuple[sp.csc_matrix, np.ndarray]:
    import dl1

    st = dl1.open_store(store)
    return sp.csc_matrix(st.to_dask().compute(scheduler="sync")), st.read("y")


def _hwm_mb(pid: int) -> float | None:
    """High-water RSS of process ``pid`` (since its last :func:`_reset_peak`), in MB."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _kill_tree(p) -> None:
    """Kill the child ``p`` and every process it started (none expected of a peer)."""
    import psutil

    try:
        procs = psutil.Process(p.pid).children(recursive=True)
    except psutil.Error:
        procs = []
    p.kill()
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
    p.join(timeout=30)
    psutil.wait_procs(procs, timeout=30)


def run_children(
    target, jobs: list[Job], *args, limits: list[float | None] | None = None, grace: float = 0.0
) -> list[dict[str, Any]]:
    """Run ``target(jobs, *args, q)`` in a spawned child; one record per job, an error
    record for every job the child did not report (it raised or died).

    ``limits``: per job, ``None`` or the seconds after which its timed runs are stopped.
    The child reports ``(k, "run", (wall clock, timed seconds so far, warm-up?))`` before
    each timed call (or untimed warm-up) and ``(k, "run", None)`` after it; when the job's
    timed seconds would pass ``limit + grace`` during a call, the child (and anything it
    started) is killed, the job recorded as stopped with its timed seconds then, and a new
    child runs the jobs after it."""
    limits = limits or [None] * len(jobs)
    out: dict[int, dict[str, Any]] = {}
    start = 0
    while start < len(jobs):
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(target=target, args=(jobs[start:], *args, q))
        p.start()
        deadline: float | None = None  # wall clock at which the running job is stopped
        tick: tuple[int, float, float, bool] | None = None  # (job, wall, timed s, warm-up)
        stopped, t_stop = None, 0.0
        try:
            while len(out) < len(jobs):
                wait = 5.0 if deadline is None else min(5.0, max(0.05, deadline - time.time()))
                try:
                    k, what, rec = q.get(timeout=wait)
                except queue.Empty:
                    if deadline is not None and time.time() >= deadline:
                        stopped, t_stop = tick, time.time()
                        break
                    if not p.is_alive():
                        break
                    continue
                k += start
                if what == "done":
                    out[k] = rec
                    deadline = tick = None
                elif rec is None or limits[k] is None:  # "run": job k's timed call ended
                    deadline = tick = None
                else:  # "run": a timed call of job k starts
                    wall, so_far, warm = rec
                    tick = (k, wall, so_far, warm)
                    deadline = wall + max(0.0, limits[k] - so_far) + grace
        finally:
            if stopped is not None or (p.is_alive() and len(out) < len(jobs)):
                peak = _hwm_mb(p.pid)
                _kill_tree(p)
            else:
                peak = None
                p.join(timeout=60)
                if p.is_alive():
                    p.kill()
            q.close()
            q.cancel_join_thread()
        if stopped is None:
            break
        k, wall, so_far, warm = stopped
        out[k] = {"stopped": True, "stopped_s": so_far + t_stop - wall, "in_warmup": warm,
                  "limit_s": limits[k], "peaks_mb": [] if peak is None else [peak]}  # fmt: skip
        start = k + 1
    return [out.get(k, {"error": f"child exited with code {p.exitcode}"}) for k in range(len(jobs))]


def _guard(q, k: int, fn, *args) -> None:
    try:
        q.put((k, "done", fn(*args)))
    except Exception:  # reported in the table; the child goes on with its next job
        q.put((k, "done", {"error": traceback.format_exc(limit=3).strip().splitlines()[-1]}))


# ------------------------------------------------------------------------------- dl1
def _dl1_child(jobs: list[Job], mode: str, n_workers: int, q) -> None:
    if mode == "inproc":
        for k, job in enumerate(jobs):
            _guard(q, k, _dl1_job, job, None)
        return
    import dl1

    with local_cluster(n_workers) as client:
        dl1.runtime.executor.DistributedExecutor(client)  # workers' numba warm-up
        for k, job in enumerate(jobs):
            _guard(q, k, _dl1_job, job, client)


@contextlib.contextmanager
def local_cluster(n_workers: int, *, as_default: bool = True) -> Iterator[Any]:
    """A client of Dask's ``LocalCluster`` of ``n_workers`` one-thread worker processes on
    127.0.0.1 (the scheduler in this process), as a user would start it; the default
    client unless ``as_default`` is False. Closed on exit, leniently: on a busy machine
    the nannies may time out closing, after the results were sent."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                           host="127.0.0.1", dashboard_address=":0")  # fmt: skip
    client = Client(cluster, set_as_default=as_default)
    try:
        yield client
    finally:
        try:
            client.close()
            cluster.close(timeout=60)
        except Exception:
            pass


def _dl1_run(job: Job, client: Any, alphas) -> tuple[float, Any]:
    import dl1

    t0 = time.perf_counter()
    if job.kind == "fit":
        res = dl1.fit(job.store, alpha=alphas[0], tol=TARGET, loss=job.loss, client=client)
    else:
        res = dl1.path(job.store, alphas=np.asarray(alphas), tol=TARGET, loss=job.loss,
                       client=client)  # fmt: skip
    return time.perf_counter() - t0, res


def _dl1_job(job: Job, client: Any) -> dict[str, Any]:
    _reset_peak()
    if client is not None:
        client.run(_reset_peak)
    # warm-up: the same fit; for a path, a fit at its 10th alpha (one per worker: a solve
    # that runs in one task compiles its kernels in the worker that first runs it)
    warm = job.alphas if job.kind == "fit" else job.alphas[min(9, len(job.alphas) - 1) :][:1]
    for _ in range(job.warmup):
        _dl1_run(dataclasses.replace(job, kind="fit"), client, warm)
    times, details = [], []
    for _ in range(job.repeat):
        dt, res = _dl1_run(job, client, job.alphas)
        times.append(dt)
        if job.kind == "fit":
            details.append({"load_s": res.load_seconds_, "solve_s": res.solve_seconds_,
                            "rounds": res.n_rounds_,
                            "overhead": float(res.overhead_fraction_)})  # fmt: skip
        else:
            details.append({"passes": float(np.sum(res.passes_))})
    peaks = [_peak_mb()]
    if client is not None:
        peaks += list(client.run(_peak_mb).values())
    if job.kind == "fit":
        sols = [(_sparse(np.asarray(res.coef_, dtype=np.float64)), float(res.intercept_))]
    else:
        coefs = res.coefs_.tocsc()
        sols = [
            (_sparse(coefs[:, k].toarray().ravel()), float(res.intercepts_[k]))
            for k in range(len(job.alphas))
        ]
    return {"times": times, "solutions": sols, "peaks_mb": peaks, "details": details}


# ------------------------------------------------------------------------------ peers
class Peer:
    """A peer solver for one loss: cold or warm-started fits returning ``(coef, b)``."""

    def __init__(self, name: str, loss: str, warm: bool) -> None:
        self.name, self.loss, self.warm = name, loss, warm and name in WARM_STARTED
        self.model: Any = None
        self.refit = name in REFIT_INTERCEPT or (name, loss) in REFIT_INTERCEPT
        self.augment = (name, loss) == ("celer", "logistic")

    def prepare(self, X: sp.csc_matrix) -> Any:
        """The matrix this peer is given (celer's logistic: a constant column appended)."""
        if not self.augment:
            return X
        ones = sp.csc_matrix(np.full((X.shape[0], 1), INTERCEPT_SCALING[self.name]))
        return sp.hstack([X, ones], format="csc")

    def _make(self, alpha: float, tol: float, n: int) -> Any:
        name, loss, warm = self.name, self.loss, self.warm
        if name == "sklearn":
            from sklearn.linear_model import Lasso

            return Lasso(alpha=alpha, tol=tol, max_iter=100_000, warm_start=warm)
        if name == "celer" and loss == "squared":
            from celer import Lasso

            return Lasso(alpha=alpha, tol=tol, max_iter=1000, max_epochs=100_000, warm_start=warm)
        if name == "celer":
            from celer import LogisticRegression

            return LogisticRegression(C=1.0 / (alpha * n), tol=tol, fit_intercept=False,
                                      max_iter=1000, max_epochs=100_000,
                                      warm_start=warm)  # fmt: skip
        if name == "skglm" and loss == "squared":
            from skglm import Lasso

            return Lasso(alpha=alpha, tol=tol, max_iter=1000, max_epochs=100_000, warm_start=warm)
        if name == "skglm":
            from skglm import SparseLogisticRegression

            return SparseLogisticRegression(alpha=alpha, tol=tol, max_iter=1000,
                                            max_epochs=100_000, warm_start=warm)  # fmt: skip
        if name == "liblinear":
            from sklearn.linear_model import LogisticRegression

            return LogisticRegression(C=1.0 / (alpha * n), l1_ratio=1.0, solver="liblinear",
                                      tol=tol, intercept_scaling=INTERCEPT_SCALING[name],
                                      max_iter=1000)  # fmt: skip
        if name == "snapml":
            # Snap ML minimises a sum of losses (1/2 of squares) + regularizer ||w||_1
            from snapml import LinearRegression, LogisticRegression

            cls = LinearRegression if loss == "squared" else LogisticRegression
            return cls(regularizer=alpha * n, penalty="l1", dual=False, fit_intercept=True,
                       intercept_scaling=INTERCEPT_SCALING[name], tol=tol,
                       max_iter=100_000)  # fmt: skip
        raise ValueError(f"no peer {name!r} for loss {loss!r}")

    def fit(self, Xp, X, y, alpha: float, tol: float) -> tuple[np.ndarray, float, float]:
        """``(coef, b, seconds)``; warm-started from the previous fit when ``self.warm``."""
        n = X.shape[0]
        if self.model is None or not self.warm:
            self.model = self._make(alpha, tol, n)
        elif self.name == "celer" and self.loss == "logistic":
            self.model.set_params(C=1.0 / (alpha * n), tol=tol)
        else:
            self.model.set_params(alpha=alpha, tol=tol)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            self.model.fit(Xp, y)
            dt = time.perf_counter() - t0
        coef = np.asarray(self.model.coef_, dtype=np.float64).ravel()[: X.shape[1]].copy()
        if self.refit:
            b = refit_intercept(X, y, self.loss, coef)
        else:
            b = float(np.ravel(self.model.intercept_)[0])
        return coef, b, dt


def _peer_child(jobs: list[Job], name: str, q) -> None:
    data: dict[str, Any] = {}
    for k, job in enumerate(jobs):
        if job.store not in data:
            data.clear()
            X, y = _load(job.store)
            data[job.store] = (X, y)

        def tick(so_far: float | None, warmup: bool = False, k=k) -> None:
            """A timed call (or the warm-up) starts, or (``None``) ended."""
            q.put((k, "run", None if so_far is None else (time.time(), so_far, warmup)))

        _guard(q, k, _peer_job, name, job, *data[job.store], tick)


def _peer_job(name: str, job: Job, X, y, tick) -> dict[str, Any]:
    _reset_peak()
    peer = Peer(name, job.loss, warm=job.kind == "path")
    Xp = peer.prepare(X)
    m = min(X.shape[0], 500)  # warm-up on a few rows: numba compilation, imports
    tick(0.0, warmup=True)  # bounded by the limit too: a warm-up can take minutes
    Peer(name, job.loss, warm=False).fit(Xp[:m], X[:m], y[:m], job.alphas[0], 1e-3)
    tick(None)
    tol0 = PEER_TOL[(name, job.loss)]

    def gap(coef, b, alpha):
        return rel_gap(X, y, job.loss, coef, b, alpha, job.p0)

    if job.kind == "fit":
        return _peer_fit(peer, job, Xp, X, y, tol0, gap, tick)
    times, sols, gaps, tols = [], [], [], []
    for _ in range(job.peer_repeat):
        peer = Peer(name, job.loss, warm=True)
        t_total, sols, gaps, tols = 0.0, [], [], []
        for alpha in job.alphas:
            tol = tol0
            tick(t_total)
            coef, b, dt = peer.fit(Xp, X, y, alpha, tol)
            tick(None)
            t_total += dt
            g = gap(coef, b, alpha)
            if g > TARGET and t_total <= job.time_limit:
                tol = tol0 / RETRY_FACTOR
                tick(t_total)
                coef, b, dt = peer.fit(Xp, X, y, alpha, tol)
                tick(None)
                t_total += dt
                g = gap(coef, b, alpha)
            sols.append((_sparse(coef), b))
            gaps.append(g)
            tols.append(tol)
            if t_total > job.time_limit:
                break
        times.append(t_total)
        if len(sols) < len(job.alphas):  # stopped at the limit: no more repeats
            break
    rec = {"times": times, "solutions": sols, "gaps": gaps, "tols": tols,
           "peaks_mb": [_peak_mb()]}  # fmt: skip
    if len(sols) < len(job.alphas):
        rec.update(stopped=True, stopped_s=t_total, limit_s=job.time_limit)
    return rec


def _peer_fit(peer: Peer, job: Job, Xp, X, y, tol0: float, gap, tick) -> dict[str, Any]:
    alpha = job.alphas[0]
    tol = tol0
    tick(0.0)
    coef, b, dt = peer.fit(Xp, X, y, alpha, tol)
    tick(None)
    if gap(coef, b, alpha) > TARGET:
        tol = tol0 / RETRY_FACTOR
        tick(0.0)
        coef, b, dt = peer.fit(Xp, X, y, alpha, tol)
        tick(None)
    times = [dt]
    for _ in range(job.peer_repeat - 1):
        tick(0.0)
        coef, b, dt = peer.fit(Xp, X, y, alpha, tol)
        tick(None)
        times.append(dt)
    return {"times": times, "solutions": [(_sparse(coef), b)], "tols": [tol],
            "peaks_mb": [_peak_mb()]}  # fmt: skip


# ------------------------------------------------------------------------------- data
def quick_preset(name: str):
    """A tiny version of a preset (a few hundred rows) for ``--quick``."""
    from dl1.datasets import PRESETS as GEN

    pr = GEN[name]
    p = min(pr.n_features, 3000)
    return dataclasses.replace(pr, name=f"{name}-quick", n_train=300, n_test=0, n_features=p,
                               row_nnz=min(pr.row_nnz, 30.0), batch_rows=128,
                               pilot_rows=512)  # fmt: skip


def store_for(preset: str, loss: str, data_dir: Path, quick: bool) -> Path:
    """The store of ``preset`` for ``loss`` (generated once): the preset's own labels, or
    ``{preset}-clf.zarr`` with classification labels for the logistic loss on a regression
    preset."""
    from dl1.datasets import PRESETS as GEN
    from dl1.datasets import make_e2006_like

    pr = quick_preset(preset) if quick else GEN[preset]
    task = "classification" if loss == "logistic" else pr.task
    name = pr.name if task == pr.task else f"{pr.name}-{'clf' if loss == 'logistic' else 'reg'}"
    path = data_dir / f"{name}.zarr"
    if not (path / "dl1-manifest.json").exists():
        print(f"generating {name} -> {path}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        make_e2006_like(path, preset=pr, seed=0, task=task, overwrite=True)
        print(f"  {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    import dl1

    attrs = dl1.open_store(path).attrs
    want = {"preset": pr.name, "seed": 0, "task": task, "row_multiplier": 1, "dtype": "<f8"}
    got = {k: attrs.get(k) for k in want}
    if got != want:
        raise SystemExit(f"{path} holds {got}, not {want}: move it away or use --data-dir")
    return path


# ---------------------------------------------------------------------------- the matrix
def certify(rec: dict[str, Any], job: Job, X, y) -> None:
    """Add the check's gaps, ``certified`` and nonzeros to a solver's record."""
    if "error" in rec:
        return
    if "solutions" not in rec:  # killed inside a timed run: how far it got is not known
        rec.update(alphas_done=None, certified=False)
        return
    if "gaps" not in rec:
        rec["gaps"] = [
            rel_gap(X, y, job.loss, _dense(c, X.shape[1]), b, a, job.p0)
            for (c, b), a in zip(rec["solutions"], job.alphas, strict=False)
        ]
    rec["alphas_done"] = len(rec["solutions"])
    rec["max_gap"] = max(rec["gaps"])
    rec["certified"] = rec["alphas_done"] == len(job.alphas) and rec["max_gap"] <= TARGET * 1.0001
    rec["mean_nnz"] = float(np.mean([len(c[0]) for c, _ in rec["solutions"]]))
    rec["median_s"] = float(statistics.median(rec["times"]))
    del rec["solutions"]


def _cells(args, data_dir: Path):
    """Per (preset, loss): its store, the jobs of every kind, and the data's shape."""
    from dl1.paths.evaluation import alpha_grid

    path_repeat = args.repeat if args.path_repeat is None else args.path_repeat
    peer_path_repeat = path_repeat if args.peer_path_repeat is None else args.peer_path_repeat
    for preset in args.presets:
        for loss in args.losses:
            path = store_for(preset, loss, data_dir, args.quick)
            X, y = _load(str(path))
            amax, p0 = alpha_max(X, y, loss), p_zero(y, loss)
            jobs = []
            for kind in args.kinds:
                alphas = ((amax / args.ratio,) if kind == "fit"
                          else tuple(alpha_grid(amax, args.n_alphas, args.eps)))  # fmt: skip
                repeat = args.repeat if kind == "fit" else path_repeat
                peer_repeat = args.repeat if kind == "fit" else peer_path_repeat
                jobs.append(Job(preset, loss, kind, str(path), alphas, p0, repeat,
                                args.time_limit, args.warmup, peer_repeat))  # fmt: skip
            shape = {"n": X.shape[0], "p": X.shape[1], "nnz": int(X.nnz),
                     "positive": float(np.mean(y > 0)) if loss == "logistic" else None}  # fmt: skip
            print(f"{preset}/{loss}: {X.shape[0]:,} x {X.shape[1]:,}, nnz {X.nnz:,}, "
                  f"alpha_max {amax:.4g}", file=sys.stderr, flush=True)  # fmt: skip
            yield jobs, shape, (X, y)


def peer_limit(records: list[dict[str, Any]], job: Job, factor: float, least: float):
    """The seconds after which a peer's run of ``job``'s cell is stopped: ``factor`` times
    the larger of dl1's two medians on the cell, at least ``least``; a path's also at most
    ``job.time_limit``. ``None`` (a fit) or ``job.time_limit`` (a path) without dl1's
    medians or with ``factor <= 0``."""
    cell = (job.preset, job.loss, job.kind)
    meds = [r["median_s"] for r in records if r["solver"] in DL1 and "median_s" in r
            and (r["preset"], r["loss"], r["kind"]) == cell]  # fmt: skip
    limit = max(factor * max(meds), least) if meds and factor > 0 else None
    if job.kind == "path":
        limit = job.time_limit if limit is None else min(limit, job.time_limit)
    return limit


def run_group(
    cells: list, solvers: list[str], workers: int, factor: float = 0.0, least: float = 0.0,
    grace: float = 0.0,
) -> list[dict[str, Any]]:  # fmt: skip
    """Every solver on the jobs of ``cells``, one child process per solver (dl1's first: its
    medians set the peers' limits, :func:`peer_limit`; ``grace``: see :func:`run_children`)."""
    records = []
    solvers = [s for s in solvers if s in DL1] + [s for s in solvers if s not in DL1]
    for solver in solvers:
        mine = [(job, shape, data) for jobs, shape, data in cells for job in jobs
                if solver in DL1 or solver in PEERS[job.loss]]  # fmt: skip
        if not mine:
            continue
        jobs = [job for job, _, _ in mine]
        t0 = time.perf_counter()
        if solver in DL1:
            mode = "cluster" if solver == "dl1" else "inproc"
            recs = run_children(_dl1_child, jobs, mode, workers)
        else:
            limits = [peer_limit(records, job, factor, least) for job in jobs]
            jobs = [dataclasses.replace(job, time_limit=lim) if job.kind == "path" else job
                    for job, lim in zip(jobs, limits, strict=True)]  # fmt: skip
            recs = run_children(_peer_child, jobs, solver, limits=limits, grace=grace)
        for (job, shape, (X, y)), rec in zip(mine, recs, strict=True):
            certify(rec, job, X, y)
            rec.update(preset=job.preset, loss=job.loss, kind=job.kind, solver=solver,
                       alpha=job.alphas[0] if job.kind == "fit" else None,
                       n_alphas=len(job.alphas), **shape)  # fmt: skip
            records.append(rec)
            print(f"  {job.preset}/{job.loss} {job.kind:4s} {solver:10s} {_cell(rec)}"
                  f"  ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
    return records


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", nargs="+", default=list(PRESETS), choices=PRESETS)
    ap.add_argument("--losses", nargs="+", default=["squared", "logistic"],
                    choices=["squared", "logistic"])  # fmt: skip
    ap.add_argument("--kinds", nargs="+", default=["fit", "path"], choices=["fit", "path"])
    ap.add_argument(
        "--solvers",
        nargs="+",
        default=None,
        help="a subset of: dl1 dl1-inproc celer skglm sklearn liblinear snapml",
    )
    ap.add_argument("--data-dir", default="bench-out")
    ap.add_argument("--ratio", type=float, default=20.0, help="fit: alpha = alpha_max / ratio")
    ap.add_argument("--n-alphas", type=int, default=100)
    ap.add_argument("--eps", type=float, default=1e-2)
    ap.add_argument("--repeat", type=int, default=3, help="runs per fit (median reported)")
    ap.add_argument("--path-repeat", type=int, default=None, help="runs per path (--repeat)")
    ap.add_argument("--peer-path-repeat", type=int, default=None,
                    help="a peer's runs per path (--path-repeat)")  # fmt: skip
    ap.add_argument(
        "--warmup",
        type=int,
        default=2,
        help="dl1's untimed warm-up fits per job (each worker runs a first fit)",
    )
    ap.add_argument("--time-limit", type=float, default=3600.0,
                    help="seconds per peer path, at most")  # fmt: skip
    ap.add_argument("--peer-limit-factor", type=float, default=5.0,
                    help="a peer's run is stopped after this times the larger of dl1's two "
                    "medians on the cell (0: no such limit)")  # fmt: skip
    ap.add_argument("--peer-limit-min", type=float, default=10.0,
                    help="seconds: the least limit of a peer's run")  # fmt: skip
    ap.add_argument("--peer-limit-grace", type=float, default=10.0,
                    help="seconds past its limit before a peer's timed call is killed")  # fmt: skip
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", default=None, help="write every record here")
    ap.add_argument("--quick", action="store_true",
                    help="tiny versions of the presets, 5 alphas, 1 run, one child process "
                    "per solver for the whole matrix: a smoke test")  # fmt: skip
    args = ap.parse_args(argv)
    if args.quick:
        args.n_alphas, args.repeat, args.path_repeat, args.warmup = 5, 1, 1, 1
        args.peer_path_repeat = 1
        args.time_limit = min(args.time_limit, 60.0)
        if args.data_dir == "bench-out":
            args.data_dir = tempfile.mkdtemp(prefix="dl1-bench-quick-")
    data_dir = Path(args.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    solvers = [s for s in (*DL1, *PEERS["squared"], "liblinear")
               if not args.solvers or s in args.solvers]  # fmt: skip

    limit_args = (args.peer_limit_factor, args.peer_limit_min, args.peer_limit_grace)
    records: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    settings = {k: v for k, v in vars(args).items() if k != "json"}
    settings.update(target=TARGET, peer_tol={f"{a}/{b}": t for (a, b), t in PEER_TOL.items()},
                    retry_factor=RETRY_FACTOR, intercept_scaling=INTERCEPT_SCALING)  # fmt: skip

    def save() -> None:  # after every (preset, loss): a long run stopped early keeps its cells
        if args.json:
            Path(args.json).write_text(json.dumps({"settings": settings, "records": records},
                                                  indent=1, default=float))  # fmt: skip

    if args.quick:  # everything in memory, one child per solver
        records += run_group(list(_cells(args, data_dir)), solvers, args.workers, *limit_args)
    else:  # one (preset, loss) at a time: one data set in memory
        for cell in _cells(args, data_dir):
            records += run_group([cell], solvers, args.workers, *limit_args)
            save()
            del cell
    save()
    print(tables(records))
    print(f"\n(matrix in {time.perf_counter() - t_start:.0f} s)")


# ------------------------------------------------------------------------------ tables
def _cell(rec: dict[str, Any] | None) -> str:
    if rec is None:
        return "—"
    if "error" in rec:
        return f"error: {rec['error'][:60]}"
    if rec.get("stopped"):
        done = ""
        if rec["kind"] == "path":
            n = rec["alphas_done"]
            done = ", killed inside an alpha" if n is None else f", {n}/{rec['n_alphas']} alphas"
        if rec.get("in_warmup"):
            return f"> {rec['stopped_s']:.3g} s (stopped in its warm-up on 500 rows)"
        return f"> {rec['stopped_s']:.3g} s (stopped{done})"
    s = f"{rec['median_s']:.2f}"
    if rec["alphas_done"] < rec["n_alphas"]:
        return f"> {s} ({rec['alphas_done']}/{rec['n_alphas']} alphas) ✗"
    return s if rec["certified"] else f"{s} ✗ ({rec['max_gap']:.1e})"


def _mem(rec: dict[str, Any] | None) -> str:
    if rec is None or "error" in rec or not rec["peaks_mb"]:
        return "—"
    peaks = rec["peaks_mb"]
    if len(peaks) == 1:  # a stopped peer: its peak until it stopped
        return f"≥ {peaks[0]:.0f}" if rec.get("stopped") else f"{peaks[0]:.0f}"
    return f"{peaks[0]:.0f} + " + " + ".join(f"{m:.0f}" for m in peaks[1:])


def _dl1_table(records: list[dict[str, Any]]) -> str:
    """dl1's runs: medians of the store read, solve, rounds, overhead (fits), passes (paths)."""
    out = ["dl1's runs (medians; fits: reading the store, solving, rounds, the rounds' share",
           "not in kernels; paths: passes over the data)", "",
           "| preset | loss | kind | solver | seconds | load s | solve s | rounds | overhead "
           "| passes |", "|" + "---|" * 10]  # fmt: skip
    for rec in records:
        if rec["solver"] not in DL1 or "error" in rec:
            continue

        def med(key: str, rec=rec) -> str:
            vals = [d[key] for d in rec["details"] if key in d]
            return f"{statistics.median(vals):.4g}" if vals else ""

        out.append(f"| {rec['preset']} | {rec['loss']} | {rec['kind']} | {rec['solver']} | "
                   f"{rec['median_s']:.3g} | {med('load_s')} | {med('solve_s')} | "
                   f"{med('rounds')} | {med('overhead')} | {med('passes')} |")  # fmt: skip
    return "\n".join(out)


def peer_reference(row: dict[str, dict[str, Any]]) -> tuple[str, float, bool] | None:
    """The peer time dl1's speed-up is taken against: ``(label, seconds, lower bound?)``.

    The fastest certified peer's median counts when it is below every stopped peer's
    stopped time (each at least its limit). Otherwise, when some peer was stopped (and no
    certified peer is faster than the first to stop), the smallest stopped time is a lower
    bound on the fastest certified peer's time: the speed-up is ``> stopped / dl1``. Peers
    neither certified nor stopped (✗, errors), or stopped in their untimed warm-up on a few
    rows, do not count. ``None``: no peer to compare."""
    peers = {s: r for s, r in row.items() if s not in DL1 and "error" not in r}
    ok = {s: r["median_s"] for s, r in peers.items() if r.get("certified")}
    stopped = {s: r["stopped_s"] for s, r in peers.items()
               if r.get("stopped") and not r.get("in_warmup")}  # fmt: skip
    best = min(ok, key=ok.__getitem__) if ok else None
    first = min(stopped, key=stopped.__getitem__) if stopped else None
    if best is not None and (first is None or ok[best] < stopped[first]):
        return best, ok[best], False
    if first is not None:
        return first, stopped[first], True
    return None


def tables(records: list[dict[str, Any]]) -> str:
    """Markdown: seconds (✗: not certified at 1e-6) and speed-ups; peak MB per process."""
    peers = ("celer", "skglm", "sklearn", "liblinear", "snapml")
    cells: dict[tuple, dict[str, dict[str, Any]]] = {}
    for rec in records:
        cells.setdefault((rec["preset"], rec["loss"], rec["kind"]), {})[rec["solver"]] = rec
    head = ["preset", "loss", "kind", "dl1 (cluster)", "dl1 (in process)", *peers,
            "fastest certified peer", "speed-up (cluster)", "speed-up (in process)"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    mem = ["| " + " | ".join(head[:3] + ["dl1 (coordinator + workers)", "dl1 (in process)",
                                         *peers]) + " |", "|" + "---|" * 10]  # fmt: skip
    for (preset, loss, kind), row in cells.items():
        ref = peer_reference(row)

        def speed(solver: str, row=row, ref=ref) -> str:
            r = row.get(solver)
            if ref is None or r is None or "median_s" not in r:
                return "n/a"
            return f"{'> ' if ref[2] else ''}{ref[1] / r['median_s']:.2f}x"

        best = "none" if ref is None else ref[0]
        if ref is not None and ref[2]:
            best = f"> {ref[1]:.3g} s ({ref[0]} stopped)"
        lines.append("| " + " | ".join([
            preset, loss, kind, _cell(row.get("dl1")), _cell(row.get("dl1-inproc")),
            *(_cell(row.get(p)) for p in peers), best,
            speed("dl1"), speed("dl1-inproc")]) + " |")  # fmt: skip
        mem.append("| " + " | ".join([preset, loss, kind, _mem(row.get("dl1")),
                                      _mem(row.get("dl1-inproc")),
                                      *(_mem(row.get(p)) for p in peers)]) + " |")  # fmt: skip
    return (
        _dl1_table(records)
        + "\n\nSeconds (median; ✗: not certified at relative gap 1e-6 by the check, with its gap;"
        " > t s (stopped): stopped at its limit after t s; speed-up: the fastest certified peer's"
        " seconds / dl1's, > x: a lower bound from the first peer stopped)\n\n"
        + "\n".join(lines)
        + "\n\nPeak memory per process, MB\n\n"
        + "\n".join(mem)
    )


if __name__ == "__main__":
    main()
