"""Out-of-core mode: each task reads the blocks it needs from the store and drops them."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import dl1
from dl1.datasets import make_e2006_like
from dl1.errors import StoreCorruptError, ValidationError
from dl1.loading import block_sources, decide_stream
from dl1.runtime.monitor import PeakRSS
from dl1.runtime.worker import WORKER_BASELINE
from dl1.solvers.result import ConvergenceWarning
from dl1.store import open_store
from dl1.store.reader import block_memory
from dl1.tasks.blocks import BlockSource
from dl1.tasks.passes import scan_task


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("stream") / "s.zarr"
    make_e2006_like(path, preset="small", seed=3, n_feature_blocks=7)
    return path


def _holds_blocks(dask_worker) -> bool:
    from dl1.tasks.blocks import Block

    return any(isinstance(v, Block) for v in dask_worker.data.values())


@pytest.mark.parametrize(
    "kw",
    [
        dict(loss="squared", screen=True),
        dict(loss="squared", l1_ratio=0.5, standardize=True),
        dict(loss="logistic"),
    ],
)
@pytest.mark.slow
def test_streamed_fit_equals_in_memory_fit(local_cluster, store, kw):
    if kw["loss"] == "logistic":
        st = open_store(store)
        y = np.where(st.read("y") > np.median(st.read("y")), 1.0, -1.0)
    else:
        y = None
    amax = dl1.alpha_max(store, y, loss=kw["loss"], client=local_cluster)
    args = dict(alpha=amax / 10, tol=1e-8, client=local_cluster, **kw)
    mem = dl1.fit(store, y, stream=False, **args)
    assert local_cluster.run(_holds_blocks) != {}
    streamed = dl1.fit(store, y, stream=True, **args)
    assert streamed.streamed_ and not mem.streamed_
    assert mem.converged_ and streamed.converged_
    # the same solution (out of core the working set's Gram matrix is formed by a sparse
    # product instead of a dense one: the iterates agree to rounding, both are certified)
    scale = np.abs(mem.coef_).max()
    np.testing.assert_allclose(streamed.coef_, mem.coef_, rtol=0, atol=1e-6 * scale)
    assert np.array_equal(streamed.coef_ != 0, mem.coef_ != 0)
    assert streamed.primal_ == pytest.approx(mem.primal_, rel=1e-8)
    # gathering working-set columns re-reads blocks: more passes, never fewer
    assert streamed.passes_ >= mem.passes_


def test_streamed_cd_and_in_process_equal_in_memory(store):
    amax = dl1.alpha_max(store)
    for solver in ("cd", "ws"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            a, b = (
                dl1.fit(store, alpha=amax / 5, solver=solver, max_rounds=8, stream=s)
                for s in (False, True)
            )
        np.testing.assert_allclose(a.coef_, b.coef_, rtol=0, atol=1e-9 * np.abs(a.coef_).max())
        assert a.gap_ == pytest.approx(b.gap_, rel=1e-6)


def test_stream_needs_a_store(store):
    X, y = dl1.open(store)
    with pytest.raises(ValidationError, match="stream=True.*store"):
        dl1.fit(X, y, alpha=0.1, stream=True)
    with pytest.raises(ValidationError, match="stream=True.*store"):
        dl1.path(X, y, n_alphas=3, stream=True)


class _FakeClient:
    def __init__(self, limits):
        self.limits = limits

    def scheduler_info(self):
        return {"workers": {f"w{k}": {"memory_limit": m} for k, m in enumerate(self.limits)}}


class _FakeExecutor:
    def __init__(self, limits):
        self.client = _FakeClient(limits)


def test_auto_streams_when_blocks_exceed_half_the_workers_data_memory(store):
    st = open_store(store)
    need = block_memory(st, "train")
    assert need == st.nnz() * (st.dtype().itemsize + 4) + 16 * (st.shape()[1] + 1)
    # two workers whose memory for data (limit - baseline) totals 2 * need: keep in memory
    fits = _FakeExecutor([WORKER_BASELINE + need, WORKER_BASELINE + need])
    assert not decide_stream(None, st, "train", fits)
    # ... and just below: stream
    tight = _FakeExecutor([WORKER_BASELINE + need // 2 - 1, WORKER_BASELINE + need // 2 - 1])
    assert decide_stream(None, st, "train", tight)
    assert not decide_stream(False, st, "train", tight)
    assert decide_stream(True, st, "train", fits)
    assert not decide_stream(None, None, "train", tight)  # not a store: nothing to stream from


def test_fully_screened_block_is_not_read(store):
    src = block_sources(open_store(store), "train", np.zeros(0), False, True)[0][2]
    gone = BlockSource(**{**src.__dict__, "root": "/nonexistent/store"})
    none_alive = np.packbits(np.zeros(gone.ncols, dtype=bool))
    theta = np.ones(open_store(store).shape()[0])
    empty = [(np.zeros(0, np.int64), np.zeros(0))]
    out, _ = scan_task([gone], theta, 1.0, empty, 5, [none_alive], None)
    assert out[0][4] == 0 and out[0][1].shape == (0,)
    with pytest.raises(StoreCorruptError, match="cannot be opened"):  # an alive block is read
        scan_task([gone], theta, 1.0, empty, 5, [None], None)
    # the real source reads and scans like the block kept in memory
    blk = src.load()
    a, _ = scan_task([src], theta, 1.0, empty, 5, [None], None)
    b, _ = scan_task([blk], theta, 1.0, empty, 5, [None], None)
    assert a[0][0] == b[0][0] and np.array_equal(a[0][1], b[0][1])


@pytest.mark.slow
def test_out_of_core_path_on_memory_limited_cluster(local_cluster, tmp_path):
    """The path on a store streamed by workers with a small memory limit.

    The workers never hold a block between tasks, are neither paused nor restarted, stay
    below their pause threshold, and the path equals the one computed with the blocks in
    memory (to rounding: out of core the working set's Gram matrix is a sparse product).
    With the working-set subproblems spread over the workers (on a Gram matrix formed where
    the columns were extracted, or by CoCoA+ rounds there) the path is certified too and
    agrees to its tolerance.
    """
    import os

    from distributed import Client, LocalCluster

    path = tmp_path / "tall.zarr"
    make_e2006_like(path, preset="small", seed=4, row_multiplier=3, n_feature_blocks=12)
    limit = 500 * 2**20
    kw = dict(n_alphas=8, eps=0.05, tol=1e-6, screen=True, X_test="test")
    ref = dl1.path(path, client=local_cluster, stream=False, **kw)
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            memory_limit=limit,
            dashboard_address="127.0.0.1:0",
        ) as cluster,
        Client(cluster) as client,
    ):
        pids = client.run(os.getpid)
        held = []
        with PeakRSS(pids.values()) as rss:
            res = dl1.path(
                path,
                client=client,
                stream=True,
                callback=lambda k, a, r: held.append(client.run(_holds_blocks)),
                **kw,
            )
            # the working-set subproblems spread over the workers (nothing gathered): on a
            # Gram matrix formed across them, or by CoCoA+ rounds
            spreads = {}
            for mode, key in [(True, "inner_checks"), ("cocoa", "inner_rounds")]:
                spread_rounds = []
                spreads[mode] = (
                    dl1.path(
                        path,
                        client=client,
                        stream=True,
                        spread=mode,
                        callback=lambda k, a, r, key=key, out=spread_rounds: out.extend(
                            h[key] for h in r.history_ if key in h
                        ),
                        **kw,
                    ),
                    spread_rounds,
                )
        assert client.run(os.getpid) == pids  # no worker restarted
        logs = "\n".join(m for msgs in client.get_worker_logs().values() for _, m in msgs)
        assert "Pausing worker" not in logs and "Worker is at" not in logs
    assert len(held) == 8 and not any(any(h.values()) for h in held)
    pause = 0.8 * limit
    assert max(rss.peak.values()) < pause, (rss.peak, pause)
    C, R = res.coefs_.toarray(), ref.coefs_.toarray()
    np.testing.assert_allclose(C, R, rtol=0, atol=1e-6 * np.abs(R).max())
    assert (res.gaps_ <= 1e-6).all() and (ref.gaps_ <= 1e-6).all()
    np.testing.assert_allclose(res.test_mse_, ref.test_mse_, rtol=1e-6)
    for spread, spread_rounds in spreads.values():
        assert spread.converged_.all() and spread_rounds
        C = spread.coefs_.toarray()
        np.testing.assert_allclose(C, R, rtol=0, atol=1e-3 * np.abs(R).max())
        np.testing.assert_allclose(spread.test_mse_, ref.test_mse_, rtol=1e-4)
    assert res.converged_.all()
    assert (res.passes_ >= ref.passes_).all()


def _streamed_problem(tmp_path, seed: int, n_feature_blocks: int):
    """A small store's blocks as sources read by each task (in process), and the bytes of
    each column once extracted (from the store's column counts)."""
    from dl1.runtime.executor import LocalExecutor
    from tests.solving import load_blocks_for_test

    path = tmp_path / "s.zarr"
    make_e2006_like(path, preset="small", seed=seed, n_feature_blocks=n_feature_blocks)
    ex = LocalExecutor()
    blocks, cb, y, sw, datafit, store = load_blocks_for_test(ex, path, stream=True)
    col_bytes = (4.0 + store.dtype("train").itemsize) * store.read("stats/col_nnz", "train") + 8.0
    return path, ex, blocks, cb, y, sw, datafit, col_bytes


def test_out_of_core_working_sets_grow_within_the_column_budget(tmp_path):
    """Out of core, violators join the working set while its columns (bytes from the store's
    column counts) fit the budget (at least WS_MIN_NEW of them, or WS_MIN_GROWTH times the
    support's size): with a budget between the
    solution's support and the unbounded solver's largest working set, every round's working
    set fits that slack and stays below the unbounded one, and the answer is the same."""
    from dl1.objective.penalties.elastic_net import ElasticNet
    from dl1.solvers.scans import WS_MIN_GROWTH, WS_MIN_NEW
    from tests.solving import solve_ws

    path, ex, blocks, cb, y, sw, datafit, col_bytes = _streamed_problem(tmp_path, 6, 4)
    kw = dict(fit_intercept=True, tol=1e-8, max_rounds=500, n_partitions=2)
    pen = ElasticNet(dl1.alpha_max(path) / 100)
    # unbounded (infinite budget), its working sets' bytes recorded
    free, _ = solve_ws(ex, blocks, cb, y, sw, datafit, pen, col_bytes=col_bytes, **kw)
    free_max = max(h["ws_bytes"] for h in free.history_ if "ws_bytes" in h)
    # between the support's bytes and the largest unbounded working set's: the bound binds
    support_bytes = col_bytes[free.coef_ != 0].sum()
    assert support_bytes < free_max
    budget = 0.5 * (support_bytes + free_max)
    capped, _ = solve_ws(
        ex, blocks, cb, y, sw, datafit, pen, col_bytes=col_bytes, cache_max=budget, **kw
    )
    assert free.converged_ and capped.converged_
    rounds = [h for h in capped.history_ if "ws_bytes" in h]
    assert rounds
    for h in rounds:
        # within the budget, but for the violators that join in any case
        least = max(WS_MIN_NEW, int(WS_MIN_GROWTH * h["nnz"]))
        assert h["ws_bytes"] <= budget + least * col_bytes.max()
    assert max(h["ws_bytes"] for h in rounds) < free_max
    assert capped.n_rounds_ >= free.n_rounds_
    np.testing.assert_allclose(capped.coef_, free.coef_, atol=1e-5 * np.abs(free.coef_).max())


@pytest.mark.parametrize(("spread", "key"), [(True, "inner_checks"), ("cocoa", "inner_rounds")])
@pytest.mark.slow
def test_spread_subproblems_take_a_bounded_share_of_a_partitions_columns(
    tmp_path, monkeypatch, spread, key
):
    """Out of core, each task of a spread subproblem takes one share of its partition's
    cached groups, of at most ``SHARE_FRACTION * gather_max`` bytes unless a single group
    is larger: with a share budget that cuts the partitions into several shares, the answer
    is the one of unbounded shares (the same subproblem, its sums in another order)."""
    from dl1.objective.penalties.elastic_net import ElasticNet
    from dl1.solvers import ws as W
    from tests.solving import solve_ws

    path, ex, blocks, cb, y, sw, datafit, col_bytes = _streamed_problem(tmp_path, 7, 6)
    pen = ElasticNet(dl1.alpha_max(path) / 50)
    kw = dict(fit_intercept=True, tol=1e-8, max_rounds=500, n_partitions=2, spread=spread)
    plans = []
    plan_of = W.spread_plan

    def recorded(groups, ws, part_of_block, col_bounds, col_bytes=None, share_bytes=np.inf):
        plan = plan_of(groups, ws, part_of_block, col_bounds, col_bytes, share_bytes)
        sizes = [sum(float(col_bytes[ids].sum()) for _, ids, _ in grp) for _, grp in plan]
        plans.append((len({q for q, _ in plan}), len(plan), sizes, [len(g) for _, g in plan]))
        return plan

    monkeypatch.setattr(W, "spread_plan", recorded)
    one, _ = solve_ws(ex, blocks, cb, y, sw, datafit, pen, col_bytes=col_bytes, **kw)
    assert all(n_shares == n_parts for n_parts, n_shares, _, _ in plans)
    # a gather budget under which the Gram matrix of the largest working set is still formed
    # (16 m^2 bytes), and a share fraction that cuts each partition's groups in two or more
    budget = 16.0 * (max(h.get("ws_size", 0) for h in one.history_) + 1) ** 2
    monkeypatch.setattr(W, "SHARE_FRACTION", max(max(sz) for _, _, sz, _ in plans) / 2 / budget)
    plans.clear()
    cut, _ = solve_ws(
        ex, blocks, cb, y, sw, datafit, pen, col_bytes=col_bytes, gather_max=budget, **kw
    )
    assert any(n_shares > n_parts for n_parts, n_shares, _, _ in plans)
    share_max = W.SHARE_FRACTION * budget
    for _, _, sizes, counts in plans:
        assert all(s <= share_max or c == 1 for s, c in zip(sizes, counts, strict=True))
    assert one.converged_ and cut.converged_
    assert all(key in h for h in cut.history_[:-1])
    scale = np.abs(one.coef_).max()
    np.testing.assert_allclose(cut.coef_, one.coef_, rtol=0, atol=1e-5 * scale)
    assert np.array_equal(cut.coef_ != 0, one.coef_ != 0)
