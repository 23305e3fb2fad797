"""One piece when it fits (dl1.runtime.one_piece): a fit, a path or a cross-validation fold
whose data fits a worker runs as one task there, with the distributed solve's answer; the
rule and its overrides; warnings come back; a worker lost mid-task is survived."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import warnings

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster

import dl1
from dl1.errors import ValidationError
from tests.helpers import random_csr, released_batching, task_stream

ONE = "dl1.one-piece"


def _regression(n=400, p=120, seed=0):
    rng = np.random.default_rng(seed)
    X = random_csr(n, p, 0.1, seed)
    w = np.zeros(p)
    w[:8] = rng.standard_normal(8)
    return X, X @ w + 0.1 * rng.standard_normal(n)


def _classification(n=400, p=120, seed=1):
    X, z = _regression(n, p, seed)
    return X, np.where(z > np.median(z), 1.0, -1.0)


def _pieces(stream) -> list[dict]:
    """The one-piece tasks of a Dask task stream."""
    return [e for e in stream if str(e["key"]).startswith("in_worker")]


def _solve(client, mode, fn, *args, **kwargs):
    """``fn(*args, client=client, **kwargs)`` with ``dl1.one-piece`` = ``mode``, and the
    one-piece tasks it ran."""
    with dask.config.set({ONE: mode}), task_stream(client) as ts:
        out = fn(*args, client=client, **kwargs)
    return out, _pieces(ts.data)


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_a_fit_that_fits_runs_as_one_task_with_the_distributed_answer(local_cluster, loss):
    X, y = _regression() if loss == "squared" else _classification()
    kw = dict(alpha=dl1.alpha_max(X, y, loss=loss) / 10, loss=loss, tol=1e-8)
    one, tasks = _solve(local_cluster, "auto", dl1.fit, X, y, **kw)
    dist, none = _solve(local_cluster, False, dl1.fit, X, y, **kw)
    assert len(tasks) == 1 and not none
    assert one.converged_ and dist.converged_
    # both certified at 1e-8 of P(0): the coefficients agree to the certificate's accuracy
    scale = np.abs(dist.coef_).max()
    np.testing.assert_allclose(one.coef_, dist.coef_, atol=1e-3 * scale)
    assert abs(one.primal_ - dist.primal_) <= 2e-8 * one.p0_


def test_a_store_is_read_by_the_worker_and_a_path_matches(local_cluster, tmp_path):
    from dl1.datasets import make_e2006_like

    store = make_e2006_like(tmp_path / "s.zarr", preset="small", seed=5)
    kw = dict(n_alphas=8, eps=0.05, tol=1e-7)
    one, tasks = _solve(local_cluster, "auto", dl1.path, store, **kw)
    dist, _ = _solve(local_cluster, False, dl1.path, store, **kw)
    assert len(tasks) == 1
    np.testing.assert_array_equal(one.alphas_, dist.alphas_)
    assert one.converged_.all() and dist.converged_.all()
    a, b = one.coefs_.toarray(), dist.coefs_.toarray()
    np.testing.assert_allclose(a, b, atol=1e-3 * np.abs(b).max())


def test_a_store_is_decided_from_its_manifest_and_read_by_the_worker_only(
    local_cluster, tmp_path, monkeypatch
):
    """The caller of a solve in one piece on a store reads its manifest only (no chunk,
    no check of the chunk files): the worker opens, checks and reads it, and its refusal
    of a damaged store is raised here."""
    import dl1.routing
    import dl1.store.arrays
    import dl1.store.reader
    from dl1.errors import StoreCorruptError

    X, y = _regression(seed=4)
    path = tmp_path / "s.zarr"
    dl1.from_scipy(X, y, path)
    kw = dict(alpha=dl1.alpha_max(X, y) / 10, tol=1e-8)
    ref = dl1.fit(X, y, client=None, **kw)
    opened = dl1.open_store(path)

    def refused(*args, **kwargs):
        raise AssertionError("the caller read the store")

    monkeypatch.setattr(dl1.routing, "read_inputs", refused)
    monkeypatch.setattr(dl1.store.reader, "_check_chunks_present", refused)
    monkeypatch.setattr(dl1.store.arrays, "_check_chunks_present", refused)
    for X_given in (str(path), opened):
        res, tasks = _solve(local_cluster, "auto", dl1.fit, X_given, **kw)
        assert len(tasks) == 1 and res.converged_
        np.testing.assert_allclose(res.coef_, ref.coef_, atol=1e-4 * np.abs(ref.coef_).max())
    os.remove(path / "train" / "y" / "c" / "0")
    with pytest.raises(StoreCorruptError, match=r"chunk 0 of array 'train/y' is missing"):
        _solve(local_cluster, "auto", dl1.fit, str(path), **kw)


def test_folds_run_side_by_side_on_different_workers(local_cluster):
    X, y = _regression(n=600, seed=3)
    with dl1.persist(X, y, client=local_cluster) as ds:
        one, tasks = _solve(local_cluster, "auto", dl1.fit_cv, ds, cv=4, n_alphas=12, tol=1e-8)
        dist, none = _solve(local_cluster, False, dl1.fit_cv, ds, cv=4, n_alphas=12, tol=1e-8)
    folds = [t for t in tasks if t["worker"]]
    assert len(tasks) == 4 + 1 and not none  # four folds and the refit
    assert len({t["worker"] for t in folds}) == 2
    np.testing.assert_allclose(one.cv[0].scores, dist.cv[0].scores, rtol=1e-5)
    assert one.alpha == dist.alpha


def test_the_rule_and_its_overrides(local_cluster):
    X, y = _regression()
    kw = dict(alpha=0.01, tol=1e-6)
    with dask.config.set({"dl1.one-piece-fraction": 1e-12}):
        _, auto = _solve(local_cluster, "auto", dl1.fit, X, y, **kw)
        _, forced = _solve(local_cluster, True, dl1.fit, X, y, **kw)
    assert not auto and len(forced) == 1
    with dask.config.set({"dl1.one-piece-max-bytes": "1 kiB"}):  # smaller than the data
        _, auto = _solve(local_cluster, "auto", dl1.fit, X, y, **kw)
    assert not auto
    # what only the calling process can do keeps the solve distributed; a callback does not
    _, tasks = _solve(local_cluster, True, dl1.fit, X, y, **kw, verbose=True)
    assert not tasks
    _, tasks = _solve(local_cluster, True, dl1.fit, X, y, **kw, callback=lambda h: None)
    assert len(tasks) == 1
    with dask.config.set({ONE: "sometimes"}), pytest.raises(ValidationError, match=ONE):
        dl1.fit(X, y, client=local_cluster, **kw)
    for key, bad in (("dl1.one-piece-fraction", 2.0), ("dl1.one-piece-max-bytes", "lots")):
        with dask.config.set({key: bad}), pytest.raises(ValidationError, match=key):
            dl1.fit(X, y, client=local_cluster, **kw)


def test_a_dask_array_of_sparse_chunks_has_no_known_size(local_cluster):
    import dask.array as da

    X, y = _regression()
    Xd = da.from_array(X.tocsc(), chunks=(400, 40), asarray=False)
    _, auto = _solve(local_cluster, "auto", dl1.fit, Xd, y, alpha=0.01)
    res, forced = _solve(local_cluster, True, dl1.fit, Xd, y, alpha=0.01)
    assert not auto and len(forced) == 1 and res.converged_


def test_the_workers_warnings_reach_the_caller(local_cluster):
    X, y = _regression()
    with dask.config.set({ONE: True}), pytest.warns(dl1.ConvergenceWarning, match="gap"):
        res = dl1.fit(X, y, alpha=1e-3, tol=1e-10, solver="sgd", max_epochs=2,
                      client=local_cluster)  # fmt: skip
    assert not res.converged_


def test_a_callback_gets_each_round_and_alpha_here_while_one_piece_runs(local_cluster):
    """Pass: a path and a fit in one piece call their callback in the calling thread, once
    per alpha / round, with the values of the solve (the result's coefficients and gaps,
    the history's entries)."""
    X, y = _regression()
    kw = dict(n_alphas=5, eps=0.05, tol=1e-8)
    calls, threads = [], set()

    def on_alpha(k, alpha, res):
        calls.append((k, alpha, res))
        threads.add(threading.get_ident())

    res, tasks = _solve(local_cluster, True, dl1.path, X, y, callback=on_alpha, **kw)
    assert len(tasks) == 1 and threads == {threading.get_ident()}
    assert [c[0] for c in calls] == list(range(5))
    np.testing.assert_array_equal([c[1] for c in calls], res.alphas_)
    for k, _, r in calls:
        np.testing.assert_array_equal(r.coef_, res.coefs_[:, [k]].toarray().ravel())
        assert r.gap_ == res.gaps_[k] and r.converged_ and r.alpha == res.alphas_[k]

    entries: list = []
    fit, tasks = _solve(local_cluster, True, dl1.fit, X, y, alpha=0.01, tol=1e-8,
                        callback=entries.append)  # fmt: skip
    assert len(tasks) == 1 and len(entries) == len(fit.history_) >= 2
    assert [e["gap"] for e in entries] == [h["gap"] for h in fit.history_]


def test_the_clients_batching_is_short_while_a_solve_in_one_piece_runs(local_cluster):
    """Pass: while a fit runs in one piece (seen from its callback, which runs here) the
    client's stream to the scheduler batches at dl1's short interval, so the task and the
    release of its futures (sent by the client's loop once the fit has returned) leave at
    once; Dask's interval is back soon after, also when the shortening overlaps a solve's
    ``low_latency`` (the last of the two restores it)."""
    from dl1.runtime.dask_workarounds import LOW_LATENCY_INTERVAL, low_latency

    X, y = _regression()
    comm = local_cluster.scheduler_comm

    def restored() -> bool:
        return released_batching(local_cluster) and comm.interval == dask_interval

    assert released_batching(local_cluster)  # an earlier test's fit let go of it
    dask_interval = comm.interval
    assert dask_interval > LOW_LATENCY_INTERVAL

    seen: list[float] = []
    _solve(local_cluster, True, dl1.fit, X, y, alpha=0.01, tol=1e-8,
           callback=lambda _: seen.append(comm.interval))  # fmt: skip
    assert seen and set(seen) == {LOW_LATENCY_INTERVAL}
    assert restored()
    with low_latency(local_cluster):
        _solve(local_cluster, True, dl1.fit, X, y, alpha=0.01, tol=1e-8)
        time.sleep(0.2)
        assert comm.interval == LOW_LATENCY_INTERVAL  # the outer user still holds it
    assert restored()


def test_an_error_of_the_callback_ends_the_solve_in_one_piece(local_cluster):
    X, y = _regression()

    def stop(*_):
        raise KeyboardInterrupt  # as Ctrl-C in the callback

    with pytest.raises(KeyboardInterrupt):
        _solve(local_cluster, True, dl1.path, X, y, n_alphas=20, callback=stop)
    deadline = time.monotonic() + 30
    while any(local_cluster.processing().values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(local_cluster.processing().values())  # the task was cancelled


def _config() -> tuple:
    """In a worker: the Dask configuration dl1 reads, and whether this task solves in one
    piece (the worker's client made first: making it sets Dask's ``scheduler``)."""
    from distributed import get_client

    from dl1.runtime.compute import in_task

    get_client()

    return dask.config.get("scheduler", None), dask.config.get(ONE, None), in_task()


def _hold(*_) -> None:
    """In the one-piece task (as its callback): hold the solve until the probe has run."""
    from distributed import Event

    Event("dl1-test-inside").set()
    assert Event("dl1-test-probed").wait(120)


def _probe() -> tuple:
    """In the same worker, while the one-piece task is held: what another task sees."""
    from distributed import Event

    assert Event("dl1-test-inside").wait(120)
    try:
        return _config()
    finally:
        Event("dl1-test-probed").set()


@pytest.mark.slow
def test_a_one_piece_task_leaves_the_process_config_to_other_tasks():
    """Pass: on a worker of two threads, a task running while a one-piece path is inside
    its solve sees the worker's Dask configuration unchanged and is not in one piece; the
    path solved in its own thread (no task of its own on the cluster)."""
    from dl1.runtime.one_piece import Shipment, in_worker

    X, y = _regression()
    with (
        LocalCluster(n_workers=1, threads_per_worker=2, processes=True, host="127.0.0.1",
                     dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster, set_as_default=False) as client,
    ):  # fmt: skip
        before = client.submit(_config, pure=False).result(timeout=180)
        shipment = Shipment(dl1.path, X, {"y": y, "n_alphas": 3, "callback": _hold})
        with task_stream(client) as ts:
            solve = client.submit(in_worker, shipment, [], pure=False)
            seen = client.submit(_probe, pure=False).result(timeout=180)
            answer = solve.result(timeout=180)
        after = client.submit(_config, pure=False).result(timeout=180)
    assert before == after == seen and before[2] is False
    assert answer.result.converged_.all() and answer.relayed == 0
    names = {str(e["key"]).split("-")[0] for e in ts.data}
    assert names == {"in_worker", "_probe"}, names


def test_an_error_in_the_worker_is_raised_here(local_cluster):
    X, y = _regression()
    with dask.config.set({ONE: True}), pytest.raises(ValidationError, match="coef_init"):
        dl1.fit(X, y, alpha=0.01, coef_init=np.ones(3), client=local_cluster)


def test_a_refusal_in_the_worker_is_an_answer_not_a_failed_task(local_cluster, tmp_path):
    """A damaged store refused by the worker solving it in one piece: the caller gets the
    store's error, and no worker logs a "Compute Failed" traceback for it (the refusal is
    the task's answer, not its failure)."""
    from dl1.errors import StoreCorruptError

    X, y = _regression(seed=6)
    path = tmp_path / "s.zarr"
    dl1.from_scipy(X, y, path)
    os.remove(path / "train" / "y" / "c" / "0")
    before = _compute_failed(local_cluster)
    with dask.config.set({ONE: True}), task_stream(local_cluster) as ts:
        with pytest.raises(StoreCorruptError, match=r"chunk 0 of array 'train/y' is missing"):
            dl1.fit(str(path), alpha=0.01, client=local_cluster)
    assert len(_pieces(ts.data)) == 1
    assert _compute_failed(local_cluster) == before


def _compute_failed(client) -> int:
    """The "Compute Failed" entries in the workers' logs."""
    logs = client.get_worker_logs()
    return sum("Compute Failed" in line for lines in logs.values() for _, line in lines)


@pytest.mark.slow
def test_a_worker_lost_mid_task_is_survived():
    """The worker running the one piece is killed: the scheduler runs the task again on
    the other worker (its nanny restarts the first), and the answer is the same; the
    callback got each alpha once, in order (the second run's repeats of the alphas the
    first had relayed are dropped)."""
    X, y = _regression(n=3000, p=3000, seed=7)
    kw = dict(n_alphas=60, eps=1e-3, tol=1e-9)
    ref = dl1.path(X, y, client=None, **kw)
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                     dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster, set_as_default=False) as client,
    ):  # fmt: skip
        killed, alphas = [], []
        relayed = threading.Event()

        def kill_the_runner():
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not killed:
                busy = [w for w, keys in client.processing().items()
                        if any(str(k).startswith("in_worker") for k in keys)]  # fmt: skip
                if busy and relayed.wait(10):  # inside the solve, some alphas relayed
                    killed.append(busy[0])
                    with contextlib.suppress(Exception):  # the worker dies before answering
                        client.run(os._exit, 1, workers=busy[:1])
                time.sleep(0.05)

        killed_at = []

        def on_alpha(k, *_):
            alphas.append(k)
            if k == 2:
                relayed.set()
            if killed and not killed_at:
                killed_at.append(k)

        killer = threading.Thread(target=kill_the_runner, daemon=True)
        killer.start()
        with dask.config.set({ONE: True}), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the killed worker's comm
            res = dl1.path(X, y, client=client, callback=on_alpha, **kw)
        killer.join(5)
    assert killed, "the one-piece task was never seen running"
    assert res.converged_.all()
    assert 0 < killed_at[0] < kw["n_alphas"], killed_at
    assert alphas == list(range(kw["n_alphas"]))
    np.testing.assert_array_equal(res.coefs_.toarray(), ref.coefs_.toarray())


@pytest.mark.slow
def test_paused_workers_stall_a_one_piece_fit_within_the_timeout():
    """Both workers paused for memory before the fit: the one-piece task never starts, and
    the watchdog raises ClusterStalledError within the stall timeout (plus polling slack)."""
    from dl1.errors import ClusterStalledError
    from tests.reliability.faults import nanny_cluster
    from tests.reliability.test_watchdog import SLACK_S, STALL_S, _free, _hog, _statuses

    X, y = _regression()
    with nanny_cluster(2, memory_limit=600 * 2**20) as (_, client):
        dl1.fit(X, y, alpha=0.01, client=client)  # loads dl1 on the workers
        client.run(_hog, 0.88)
        deadline = time.monotonic() + 30
        while _statuses(client) != {"paused"}:
            assert time.monotonic() < deadline, "the workers did not pause"
            time.sleep(0.1)
        t0 = time.monotonic()
        with (
            dask.config.set({ONE: True, "dl1.stall-timeout": STALL_S}),
            pytest.raises(ClusterStalledError, match="paused"),
        ):
            dl1.fit(X, y, alpha=0.01, client=client)
        assert time.monotonic() - t0 < STALL_S + SLACK_S
        client.run(_free)


def test_a_small_call_travels_in_its_task_and_a_large_one_is_scattered(local_cluster,
                                                                        monkeypatch):  # fmt: skip
    """A call pickled within INLINE_BYTES is the task's argument (nothing scattered); a larger
    one is scattered first; both give the same answer."""
    from dl1.runtime import one_piece

    X, y = _regression()
    kw = dict(alpha=0.01, tol=1e-8)
    scattered = []
    scatter = one_piece._scatter
    monkeypatch.setattr(one_piece, "_scatter", lambda *a: scattered.append(1) or scatter(*a))
    small, tasks = _solve(local_cluster, True, dl1.fit, X, y, **kw)
    assert len(tasks) == 1 and not scattered
    monkeypatch.setattr(one_piece, "INLINE_BYTES", 100)
    large, tasks = _solve(local_cluster, True, dl1.fit, X, y, **kw)
    assert len(tasks) == 1 and scattered == [1]
    np.testing.assert_array_equal(small.coef_, large.coef_)
    assert small.coef_.shape == (X.shape[1],) and np.count_nonzero(small.coef_)


def test_a_shipment_whose_worker_is_lost_while_scattered_is_sent_again(local_cluster,
                                                                        monkeypatch):  # fmt: skip
    """The scatter of a large call fails as when its worker is lost mid-way (the scheduler,
    told where the data landed, raises KeyError for a worker it no longer knows): the call
    is scattered again and answers as undisturbed. Before: the KeyError reached the caller."""
    from dl1.runtime import one_piece

    X, y = _regression()
    kw = dict(alpha=0.01, tol=1e-8)
    monkeypatch.setattr(one_piece, "INLINE_BYTES", 100)
    ref, _ = _solve(local_cluster, True, dl1.fit, X, y, **kw)
    scatter, failed = local_cluster.scatter, []

    def lost_once(*args, **kwargs):
        if failed:
            return scatter(*args, **kwargs)
        failed.append(1)

        async def lost():
            raise KeyError("tcp://127.0.0.1:1")

        return lost()

    monkeypatch.setattr(local_cluster, "scatter", lost_once)
    got, tasks = _solve(local_cluster, True, dl1.fit, X, y, **kw)
    assert failed == [1] and len(tasks) == 1
    np.testing.assert_array_equal(got.coef_, ref.coef_)
