"""The sample-wise SGD / FoBoS solvers: certified answers, in process and on a cluster."""

from __future__ import annotations

import warnings

import dask
import numpy as np
import pytest
import scipy.sparse as sp

import dl1
from dl1.kernels.codes import SQUARED
from dl1.kernels.lazy import FORM_CODES, lazy_pass
from dl1.solvers.result import ConvergenceWarning
from dl1.tasks.stochastic import SGDSettings, learning_rates
from tests.kernel_helpers import LOSS_CODES


def regression(n=600, p=80, seed=0):
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=0.08, format="csr", random_state=seed)
    y = X @ np.r_[rng.standard_normal(8), np.zeros(p - 8)] + 0.05 * rng.standard_normal(n)
    return X, y


def fit_quietly(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return dl1.fit(*args, **kwargs)


@pytest.mark.parametrize("solver", ["sgd", "fobos"])
@pytest.mark.parametrize(("loss", "l1_ratio"), [("squared", 1.0), ("squared", 0.5),
                                                ("logistic", 0.7)])
def test_certificate_bounds_the_distance_to_the_optimum(solver, loss, l1_ratio):
    """Pass: after a few epochs the reported objective exceeds the optimum (the working-set
    solver's, certified at 1e-10) by at most the reported duality gap, the reported dual
    is below that optimum, and the gap fell at least 10-fold from w = 0."""
    X, y = regression()
    if loss == "logistic":
        y = np.where(y > np.median(y), 1.0, -1.0)
    alpha = dl1.alpha_max(X, y, l1_ratio=l1_ratio, loss=loss) / 5
    ref = dl1.fit(X, y, alpha=alpha, l1_ratio=l1_ratio, loss=loss, tol=1e-10)
    res = fit_quietly(X, y, alpha=alpha, l1_ratio=l1_ratio, loss=loss, solver=solver,
                      max_epochs=15, tol=1e-8)
    assert res.n_rounds_ == 15 and not res.converged_
    assert res.primal_ - ref.primal_ <= res.dual_gap_ * (1 + 1e-9) + 1e-15
    assert res.dual_ <= ref.primal_ + 1e-12
    assert res.history_[-1]["gap"] <= 0.1 * res.history_[0]["gap"]
    assert res.history_[0]["nnz"] == 0  # the first entry certifies w = 0


def test_one_partition_is_sequential_lazy_sgd():
    """Pass: with one partition and one row block, an epoch of the solver is exactly one
    lazy pass of the kernel in the solver's row order, from w = 0 and the intercept of
    w = 0 (then refitted for the certificate), with the step the solver calibrated and
    recorded: same weights to 1e-12."""
    X, y = regression(n=200, p=30, seed=2)
    alpha = dl1.alpha_max(X, y) / 4
    res = fit_quietly(X, y, alpha=alpha, solver="fobos", max_epochs=1, n_partitions=1,
                      fit_intercept=False, tol=1e-12, seed=3)
    eta0 = res.history_[0]["eta0"]
    assert eta0 == res.history_[0]["calibration"].value
    settings = SGDSettings("fobos", SQUARED, alpha, 0.0, False, eta0, "invsqrt", 1.0 / 200)
    rng = np.random.default_rng(3 * 1_000_003)
    rng.permutation(1)  # the block order
    rows = rng.permutation(200).astype(np.int64)
    w = np.zeros(30)
    lazy_pass(X.indptr, X.indices.astype(np.int32), X.data, y, np.ones(200), rows,
              learning_rates(settings, 0, 200), w, 0.0, False, alpha, 0.0,
              FORM_CODES["fobos"], LOSS_CODES["squared"], 1.0)
    np.testing.assert_allclose(res.coef_, w, rtol=0, atol=1e-12)


def test_cluster_fit_equals_in_process_fit(local_cluster):
    """Pass: on a 2-worker LocalCluster (2 partitions, one per worker) the fit's
    coefficients, intercept and gaps equal the in-process fit's with the same partitions
    to 1e-12: the mixing and the orders do not depend on where tasks run."""
    X, y = regression(seed=4)
    alpha = dl1.alpha_max(X, y) / 10
    kw = dict(alpha=alpha, l1_ratio=0.8, solver="sgd", max_epochs=5, tol=1e-9, n_partitions=2)
    local = fit_quietly(X, y, **kw)
    remote = fit_quietly(X, y, client=local_cluster, **kw)
    np.testing.assert_allclose(remote.coef_, local.coef_, rtol=0, atol=1e-12)
    assert remote.intercept_ == pytest.approx(local.intercept_, abs=1e-12)
    assert [h["gap"] for h in remote.history_] == pytest.approx(
        [h["gap"] for h in local.history_], rel=1e-9)


def test_max_epochs_bounds_the_passes_and_warns():
    """Pass: max_epochs=0 returns w = 0 with its certificate and warns with the gap;
    max_epochs=3 makes exactly 3 passes."""
    X, y = regression(n=100, p=20, seed=5)
    alpha = dl1.alpha_max(X, y) / 3
    with pytest.warns(ConvergenceWarning, match="relative duality gap"):
        res = dl1.fit(X, y, alpha=alpha, solver="sgd", max_epochs=0, tol=1e-12)
    assert not res.coef_.any() and res.n_rounds_ == 0 and res.gap_ > 1e-12
    res = fit_quietly(X, y, alpha=alpha, solver="sgd", max_epochs=3, tol=1e-12)
    assert res.n_rounds_ == 3 and len(res.history_) == 4


def test_path_with_the_sgd_solver_warm_starts():
    """Pass: a 5-alpha path with solver="fobos" reports a relative gap at every alpha that
    bounds its objective's excess over the working-set path's (certified at 1e-10)."""
    X, y = regression(seed=6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        pth = dl1.path(X, y, n_alphas=5, eps=0.1, solver="fobos", max_epochs=10, tol=1e-3)
    ref = dl1.path(X, y, n_alphas=5, eps=0.1, tol=1e-10)
    np.testing.assert_allclose(pth.alphas_, ref.alphas_, rtol=1e-12)
    p_zero = 0.5 * np.mean((y - y.mean()) ** 2)

    def objective(path, k):
        w = path.coefs_[:, [k]].toarray().ravel()
        r = y - X @ w - path.intercepts_[k]
        return 0.5 * np.mean(r**2) + path.alphas_[k] * np.abs(w).sum()

    for k in range(5):
        excess = objective(pth, k) - objective(ref, k)
        assert -1e-12 <= excess <= pth.gaps_[k] * p_zero * (1 + 1e-9) + 1e-15


def test_estimators_take_the_sgd_solver_and_max_epochs():
    """Pass: dl1.Lasso(solver="sgd", max_epochs=4) makes 4 epochs (n_iter_) and its
    coefficients equal dl1.fit's with the same settings; a negative max_epochs is refused
    before any work with a message naming it."""
    from dl1.estimators import Lasso

    X, y = regression(n=150, p=25, seed=7)
    alpha = dl1.alpha_max(X, y) / 4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = Lasso(alpha, solver="sgd", max_epochs=4, tol=1e-12).fit(X, y)
    res = fit_quietly(X, y, alpha=alpha, solver="sgd", max_epochs=4, tol=1e-12)
    assert est.n_iter_ == 4
    np.testing.assert_array_equal(est.coef_, res.coef_)
    with pytest.raises(ValueError, match="max_epochs"):
        Lasso(alpha, solver="sgd", max_epochs=-1).fit(X, y)


@pytest.mark.parametrize("formats", [("csc",), ("csc", "csr")])
def test_store_in_memory_and_streamed_give_the_in_memory_fit(tmp_path, local_cluster, formats):
    """Pass: from a store (CSC only, or with CSR blocks), kept in worker memory or streamed
    (each task reads its row block and drops it), the SGD fit on a 2-worker LocalCluster
    equals the fit of the same matrix in memory with the store's row blocks as partitions'
    blocks, to 1e-12."""
    X, y = regression(n=400, p=60, seed=8)
    store = dl1.from_scipy(X, y, tmp_path / "s.zarr", n_feature_blocks=3, row_block_rows=100,
                           formats=formats)
    alpha = dl1.alpha_max(X, y) / 6
    kw = dict(alpha=alpha, solver="sgd", max_epochs=3, tol=1e-12, n_partitions=2)
    in_mem = fit_quietly(store, client=local_cluster, stream=False, **kw)
    streamed = fit_quietly(store, client=local_cluster, stream=True, **kw)
    np.testing.assert_allclose(streamed.coef_, in_mem.coef_, rtol=0, atol=1e-12)
    import dask.array as da

    Xd = da.from_array(X.tocsc(), chunks=(100, 20), asarray=False)
    direct = fit_quietly(Xd, y, **kw)
    np.testing.assert_allclose(in_mem.coef_, direct.coef_, rtol=0, atol=1e-12)
    assert in_mem.gap_ == pytest.approx(direct.gap_, rel=1e-9)


@pytest.mark.slow
def test_a_killed_worker_changes_nothing_in_the_answer():
    """Pass: SIGKILL one of 2 workers mid-fit (its row blocks and the epoch's task are
    lost): the fit completes with exactly the coefficients, intercept and gaps of an
    undisturbed fit on the same cluster (blocks are recomputed from their graph, and every
    task is a function of its inputs and seed)."""
    from distributed import Client, LocalCluster

    X, y = regression(n=3000, p=200, seed=9)
    alpha = dl1.alpha_max(X, y) / 10
    kw = dict(alpha=alpha, l1_ratio=0.9, solver="fobos", max_epochs=5, tol=1e-12,
              n_partitions=2)
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                     dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster) as client,
    ):
        reference = fit_quietly(X, y, client=client, **kw)
        killed = []

        def kill_at_epoch_2(entry):
            if entry["epoch"] == 2 and not killed:
                nanny = next(iter(cluster.workers.values()))
                nanny.process.process.kill()
                killed.append(True)

        with dask.config.set({"dl1.one-piece": False}):  # the fit's own tasks are lost
            res = fit_quietly(X, y, client=client, callback=kill_at_epoch_2, **kw)
    assert killed
    np.testing.assert_array_equal(res.coef_, reference.coef_)
    assert res.intercept_ == reference.intercept_
    assert [h["gap"] for h in res.history_] == [h["gap"] for h in reference.history_]


def test_stream_order_certify_at_the_end_and_losses_per_block():
    """Pass: with shuffle=False the blocks and rows are visited in stored order (one
    partition: the epoch equals one kernel pass over rows 0..n-1); with certify_every=0
    only the last epoch has a gap (earlier entries NaN) and the result is that of the same
    run certified every epoch; each epoch reports the progressive loss of every row block
    (block index, mean loss), whose row-weighted mean is the epoch's progressive loss."""
    from dl1.solvers.sgd import StochasticGradientSolver

    X, y = regression(n=300, p=30, seed=10)
    alpha = dl1.alpha_max(X, y) / 5
    Xd = __import__("dask.array", fromlist=["from_array"]).from_array(
        X.tocsc(), chunks=(100, 30), asarray=False)
    kw = dict(alpha=alpha, tol=1e-12, n_partitions=1, fit_intercept=False)
    every = fit_quietly(Xd, y, solver=StochasticGradientSolver(max_epochs=3, shuffle=False), **kw)
    end = fit_quietly(Xd, y, solver=StochasticGradientSolver(max_epochs=3, shuffle=False,
                                                             certify_every=0), **kw)
    np.testing.assert_array_equal(end.coef_, every.coef_)
    assert [np.isnan(h["gap"]) for h in end.history_] == [False, True, True, False]
    assert end.gap_ == every.gap_
    first = fit_quietly(Xd, y, solver=StochasticGradientSolver(max_epochs=1, shuffle=False), **kw)
    settings = SGDSettings("sgd", SQUARED, alpha, 0.0, False, first.history_[0]["eta0"],
                           "invsqrt", 1.0 / 300)
    w = np.zeros(30)
    lazy_pass(X.indptr, X.indices.astype(np.int32), X.data, y, np.ones(300),
              np.arange(300, dtype=np.int64), learning_rates(settings, 0, 300), w, 0.0, False,
              alpha, 0.0, FORM_CODES["sgd"], LOSS_CODES["squared"], 1.0)
    np.testing.assert_allclose(first.coef_, w, rtol=0, atol=1e-12)
    by_block = every.history_[0]["progressive_loss_by_block"]
    assert [i for i, _ in by_block] == [0, 1, 2]
    assert np.mean([m for _, m in by_block]) == pytest.approx(
        every.history_[0]["progressive_loss"], rel=1e-12)


@pytest.mark.slow
def test_streamed_epochs_hold_one_row_block_at_a_time(tmp_path):
    """Pass: out of core (stream=True) on dl1's 1-worker LocalCluster (the allocator
    settings it recommends out of core) limited to 1 GiB, the
    worker's peak RSS during an SGD fit (sampled every 10 ms) rises above its RSS before
    the fit by less than 3 row blocks' bytes, while the data is 12 row blocks: a task holds
    the block being assembled, one of its 2 chunks and the reader's buffers for that chunk
    (measured: 2-2.5 blocks; the rest is allocator noise), and nothing of the blocks before
    it."""
    import threading

    import psutil
    from distributed import Client

    from dl1.runtime.localcluster import local_cluster

    n, p, n_blocks = 120_000, 20_000, 12
    rng = np.random.default_rng(11)
    per_row = 100  # 12M nonzeros, 144 MB; a block 12 MB against 1 MB n-vectors
    cols = np.sort(rng.choice(p, size=(n, per_row), replace=True), axis=1)
    X = sp.csr_matrix((rng.random(n * per_row), cols.ravel(), np.arange(0, n * per_row + 1,
                                                                        per_row)), shape=(n, p))
    X.sum_duplicates()
    y = np.asarray(X.sum(axis=1)).ravel()
    store = dl1.from_scipy(X, y, tmp_path / "s.zarr", n_feature_blocks=2,
                           row_block_rows=n // n_blocks, formats=("csc", "csr"))
    block_bytes = X.nnz * 12 / n_blocks  # float64 value + int32 index per nonzero
    alpha = dl1.alpha_max(X, y) / 10
    with (
        local_cluster(n_workers=1, threads_per_worker=1, processes=True, memory_limit="1GiB")
        as cluster,
        Client(cluster) as client,
    ):
        pid = next(iter(client.run(__import__("os").getpid).values()))
        proc = psutil.Process(pid)
        fit_quietly(store, alpha=alpha, solver="sgd", max_epochs=1, stream=True, tol=1e-12,
                    client=client, n_partitions=1)  # compile and warm up first
        base = proc.memory_info().rss
        peak, done = [base], threading.Event()

        def sample():
            while not done.is_set():
                peak.append(proc.memory_info().rss)
                done.wait(0.01)

        t = threading.Thread(target=sample)
        t.start()
        try:
            res = fit_quietly(store, alpha=alpha, solver="sgd", max_epochs=2, stream=True,
                              tol=1e-12, client=client, n_partitions=1)
        finally:
            done.set()
            t.join()
    assert res.n_rounds_ == 2
    assert max(peak) - base < 3 * block_bytes, (max(peak) - base, block_bytes)
