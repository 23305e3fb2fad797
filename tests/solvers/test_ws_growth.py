"""The working set's growth: faster after a working set its solution filled, and
subproblems solved loosely while the working set leaves violators out."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import minimize
from scipy.special import expit

import dl1
from dl1.solvers import subproblems
from dl1.solvers import ws as ws_module
from dl1.solvers.scans import every_column_joined, scan_pass, violators_left_out
from dl1.solvers.subproblems import WHOLE_RATIO, GatheredGram, SpreadNewton
from dl1.solvers.ws import WorkingSetSolver
from dl1.tasks.growth import WS_FAST_GROWTH, WS_FILLED, next_ws_size
from dl1.tasks.records import BlockScan, GapStats
from tests.helpers import stop_path_after
from tests.test_penalised import as_dask


def test_next_ws_size():
    assert next_ws_size(0, 0, 128) == 128
    assert next_ws_size(300, 0, 128) == 600  # no last working set: twice the support
    assert next_ws_size(120, 128, 128) == WS_FAST_GROWTH * 120  # 120 >= 0.9 * 128: filled
    assert next_ws_size(100, 128, 128) == 200  # 100 < 0.9 * 128: not filled
    assert next_ws_size(200, 1000, 128) == 400  # not filled: twice the support
    assert next_ws_size(30, 32, 128) == 128  # never below ws_start
    edge = int(np.ceil(WS_FILLED * 1000))
    assert next_ws_size(edge, 1000, 1) == WS_FAST_GROWTH * edge
    assert next_ws_size(edge - 1, 1000, 1) == 2 * (edge - 1)
    # a filled set whose round cut the gap little: the fast growth squared
    assert next_ws_size(120, 128, 128, slow=True) == WS_FAST_GROWTH**2 * 120
    assert next_ws_size(100, 128, 128, slow=True) == 200  # not filled: as before
    assert next_ws_size(300, 0, 128, slow=True) == 600


def _scan(scores):
    return BlockScan(GapStats(0.0, 0.0), np.arange(len(scores)), np.asarray(scores, float),
                     None, 0, -1.0)  # fmt: skip


def test_violators_left_out_counts_positive_scores_over_blocks():
    blocks = [_scan([0.3, 0.1, -0.2]), _scan([0.5, -1.0]), _scan([])]
    assert violators_left_out(blocks, 2)  # 3 violators, 2 joined
    assert not violators_left_out(blocks, 3)
    assert not violators_left_out(blocks, 10)  # the rest of the set: non-violators


def test_every_column_joined_when_each_block_offered_all_it_had():
    blocks = [_scan([0.3, 0.1, -0.2]), _scan([-0.5]), _scan([])]
    assert every_column_joined(blocks, 4, 4)  # 3 and 1 offered, under the quota of 4
    assert not every_column_joined(blocks, 4, 3)  # one offered column left out
    assert not every_column_joined(blocks, 3, 4)  # a block offered its quota: maybe more


def test_a_working_set_of_every_nonempty_column_is_the_whole_problem(monkeypatch):
    """Empty columns never join a working set: one holding every other column is the
    whole problem, and its subproblem goes to WHOLE_RATIO times the final target, not
    past it. The fit stops certified."""
    X, y = _weak_problem()
    n, tol = X.shape[0], 1e-2
    X = sp.hstack([X, sp.csc_matrix((n, 40))], format="csc")  # 40 empty columns
    movable = int(np.count_nonzero(np.diff(X.indptr)))
    seen = []
    real = GatheredGram.run_call

    def spy(run, ws, call, r):
        seen.append((run.whole, ws.shape[0], call.settings.target_gap, run.cert.gap))
        return real(run, ws, call, r)

    monkeypatch.setattr(GatheredGram, "run_call", staticmethod(spy))
    res = dl1.fit(X, y, alpha=1.0 / (100.0 * n), loss="logistic", tol=tol)
    assert res.converged_ and res.gap_ <= tol
    whole = [(size, target, gap) for is_whole, size, target, gap in seen if is_whole]
    assert whole and all(size == movable < X.shape[1] for size, _, _ in whole)
    for _, target, gap in whole:
        assert target == pytest.approx(max(0.3 * min(gap, tol * res.p0_),
                                           WHOLE_RATIO * tol * res.p0_), rel=1e-12)  # fmt: skip
    assert not any(is_whole for is_whole, size, _, _ in seen if size < movable)


def _weak_problem(seed=0, n=400, p=800):
    """Short sparse rows and a label most features help to fit: at weak regularisation
    most of them enter, as with text at large C."""
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=0.01, format="csc", random_state=seed)
    w = rng.standard_normal(p)
    y = np.where(X @ w + 0.3 * rng.standard_normal(n) > 0, 1.0, -1.0)
    return X, y


def _record_targets(monkeypatch) -> list:
    """Each gathered subproblem's ``(crowded, target gap, current gap)``, as it runs."""
    targets = []
    real = GatheredGram.run_call

    def spy(run, ws, call, r):
        targets.append((run.crowded, call.settings.target_gap, run.cert.gap))
        return real(run, ws, call, r)

    monkeypatch.setattr(GatheredGram, "run_call", staticmethod(spy))
    return targets


def test_a_filled_working_set_grows_faster_and_the_fit_is_certified(monkeypatch):
    """At weak regularisation each round's solution fills its working set; the next one
    is WS_FAST_GROWTH times its support. While the pass finds more violators than join,
    the subproblem's target is inner_ratio times the current gap (not the final one),
    and the last subproblems go to the final target. The answer is scikit-learn's."""
    X, y = _weak_problem()
    n = X.shape[0]
    C = 10.0
    targets = _record_targets(monkeypatch)
    res = dl1.fit(X, y, alpha=1.0 / (C * n), loss="logistic", tol=1e-8)
    assert res.converged_ and res.gap_ <= 1e-8
    hist = [h for h in res.history_ if "ws_size" in h]
    filled = [i for i in range(1, len(hist))
              if hist[i]["nnz"] >= WS_FILLED * hist[i - 1]["ws_size"]]  # fmt: skip
    assert filled  # the test's point: supports that fill their working sets
    for i in filled:
        assert hist[i]["ws_size"] >= min(WS_FAST_GROWTH * hist[i]["nnz"], X.shape[1] // 2)
    crowded = [t for t in targets if t[0]]
    assert crowded and not targets[-1][0]
    ratio = 0.3  # WorkingSetSolver's inner_ratio
    final = 1e-8 * res.p0_
    for is_crowded, target, gap in targets:
        expected = ratio * (gap if is_crowded else min(gap, final))
        assert target == pytest.approx(expected, rel=1e-12)
    obj = _objective(X, y, 1.0 / (C * n))
    w_ref, b_ref = _reference(X, y, 1.0 / (C * n))
    assert abs(obj(res.coef_, res.intercept_) - obj(w_ref, b_ref)) <= 1e-8 * res.p0_


def test_a_filled_set_whose_gap_fell_little_grows_fastest(monkeypatch):
    """The fit reads WS_SLOW_GAP against its last two gaps: with 0 every round from the
    second is slow, and a filled set grows WS_FAST_GROWTH**2 times its support (or to every
    column a pass offers); with inf none is, and it grows WS_FAST_GROWTH times. Either
    way the fit is certified and is the L-BFGS-B reference's."""
    import dl1.solvers.ws as ws

    X, y = _weak_problem(seed=2, n=600, p=2500)
    n = X.shape[0]
    alpha = 1.0 / (1e4 * n)
    movable = int(np.count_nonzero(np.diff(X.indptr)))
    obj = _objective(X, y, alpha)
    best = obj(*_reference(X, y, alpha))
    sizes = {}
    for slow_gap in (0.0, np.inf):
        monkeypatch.setattr(ws, "WS_SLOW_GAP", slow_gap)
        res = dl1.fit(X, y, alpha=alpha, loss="logistic", tol=1e-6)
        assert res.converged_ and res.gap_ <= 1e-6
        assert abs(obj(res.coef_, res.intercept_) - best) <= 1e-6 * res.p0_
        hist = [h for h in res.history_ if "ws_size" in h]
        filled = [i for i in range(1, len(hist))
                  if hist[i]["nnz"] >= WS_FILLED * hist[i - 1]["ws_size"]]  # fmt: skip
        assert 1 in filled  # the test's point: a filled set after two gaps
        for i in filled:
            growth = WS_FAST_GROWTH**2 if slow_gap == 0.0 else WS_FAST_GROWTH
            want = min(growth * hist[i]["nnz"], movable)
            assert want * 0.99 <= hist[i]["ws_size"] <= growth * hist[i]["nnz"]
        sizes[slow_gap] = hist[1]["ws_size"]
    assert sizes[0.0] > sizes[np.inf]  # the rule made a difference here


def _objective(X, y, alpha):
    def f(w, b):
        return float(np.logaddexp(0, -y * (X @ w + b)).mean() + alpha * np.abs(w).sum())

    return f


def _reference(X, y, alpha):
    """The L1-logistic optimum by L-BFGS-B on ``w = u - v``, ``u, v >= 0`` (smooth, bound
    constrained), independent of dl1."""
    n, p = X.shape
    A = X.toarray()

    def f(x):
        w, b = x[:p] - x[p:2 * p], x[-1]
        m = y * (A @ w + b)
        s = -y * expit(-m) / n
        gw = A.T @ s
        val = np.logaddexp(0, -m).mean() + alpha * x[: 2 * p].sum()
        return val, np.concatenate([gw + alpha, -gw + alpha, [s.sum()]])

    bounds = [(0, None)] * (2 * p) + [(None, None)]
    out = minimize(f, np.zeros(2 * p + 1), jac=True, method="L-BFGS-B", bounds=bounds,
                   options={"maxiter": 100_000, "ftol": 1e-15, "gtol": 1e-12})  # fmt: skip
    return out.x[:p] - out.x[p : 2 * p], out.x[-1]


def test_a_crowded_subproblem_is_not_solved_past_the_fits_target(monkeypatch):
    """At a loose ``tol`` a crowded round's inner_ratio times the current gap can be tighter
    than the fit needs: its target is then WHOLE_RATIO times the final one (its solution
    only starts the next round). The fit still stops certified at ``tol``."""
    X, y = _weak_problem()
    n, tol = X.shape[0], 0.2
    targets = _record_targets(monkeypatch)
    res = dl1.fit(X, y, alpha=1.0 / (10.0 * n), loss="logistic", tol=tol)
    assert res.converged_ and res.gap_ <= tol
    final = tol * res.p0_
    crowded = [(target, gap) for is_crowded, target, gap in targets if is_crowded]
    for target, gap in crowded:
        assert target == pytest.approx(max(0.3 * gap, WHOLE_RATIO * final), rel=1e-12)
    assert any(0.3 * gap < WHOLE_RATIO * final for _, gap in crowded)  # the rule ran


def test_a_path_solves_crowded_working_sets_loosely(monkeypatch):
    """Paths solve their subproblems to the final target (tight), except while a working
    set leaves violators out: then to inner_ratio times the current gap, as fits do; and
    a working set of every column that can move to WHOLE_RATIO of the final target."""
    X, y = _weak_problem(seed=1)
    targets = []
    real = GatheredGram.run_call

    def spy(run, ws, call, r):
        targets.append((run.crowded, call.settings.target_gap, run.cert.gap,
                        run.problem.tol * run.problem.p_zero, run.whole))  # fmt: skip
        return real(run, ws, call, r)

    monkeypatch.setattr(GatheredGram, "run_call", staticmethod(spy))
    amax = dl1.alpha_max(X, y, loss="logistic")
    res = dl1.path(X, y, alphas=amax * np.array([0.5, 0.05, 0.005]), loss="logistic", tol=1e-8)
    assert all(g <= 1e-8 for g in res.gaps_)
    assert any(t[0] for t in targets) and not all(t[0] for t in targets)
    for is_crowded, target, gap, final, whole in targets:
        expected = 0.3 * (gap if is_crowded else min(gap, final))
        if whole or is_crowded:
            expected = max(expected, WHOLE_RATIO * final)
        assert target == pytest.approx(expected, rel=1e-12)


def test_spread_newton_steps_stop_loosely_while_crowded(monkeypatch):
    """Spread proximal Newton steps stop at inner_ratio times the current gap while the
    working set leaves violators out, at the final target once it does not; the answer
    is the L-BFGS-B reference's."""
    X, y = _weak_problem(seed=2)
    n, C = X.shape[0], 10.0
    solves = []
    real_solve, real_gap = SpreadNewton.solve, SpreadNewton._gap

    def gap_spy(run, ws, theta, parts):
        g = real_gap(run, ws, theta, parts)
        solves[-1][2].append(g)
        return g

    def solve_spy(self, run, ws, targets, r):
        assert targets.loose == pytest.approx(0.3 * run.cert.gap, rel=1e-12)
        solves.append((run.crowded, targets, []))
        return real_solve(self, run, ws, targets, r)

    visits, steps = [], []
    real_task, real_shares = subproblems.newton_share_task, SpreadNewton._shares

    def task_spy(*args):
        visits.append(args[10])  # the visit's epochs
        return real_task(*args)

    def shares_spy(self, run, plan, g, h, theta, step):
        before = len(visits)
        out = real_shares(self, run, plan, g, h, theta, step)
        steps.append((run.crowded, len(plan), step, len(visits) - before))
        return out

    monkeypatch.setattr(SpreadNewton, "solve", solve_spy)
    monkeypatch.setattr(SpreadNewton, "_gap", staticmethod(gap_spy))
    monkeypatch.setattr(SpreadNewton, "_shares", shares_spy)
    monkeypatch.setattr(subproblems, "newton_share_task", task_spy)
    alpha = 1.0 / (C * n)
    res = dl1.fit(as_dask(X, 4), y, alpha=alpha, loss="logistic", tol=1e-8, spread=True)
    assert res.converged_ and res.gap_ <= 1e-8
    assert {h["mode"] for h in res.history_[:-1]} == {"SpreadNewton"}
    assert any(c for c, _, _ in solves) and not solves[-1][0]
    final = 1e-8 * res.p0_
    for crowded, targets, gaps in solves:
        target = targets.loose if crowded else targets.gap
        assert targets.gap <= 0.3 * final * (1 + 1e-12)  # spread: the final target
        assert gaps[-1] <= target or len(gaps) == SpreadNewton.max_steps + 1
        assert all(g > target for g in gaps[:-1])  # no step past the target
    # a chain of sweeps only for a step of several shares on a working set not crowded
    for crowded, shares, step, calls in steps:
        swept = step and shares > 1 and not crowded
        assert calls == (SpreadNewton.sweeps if swept else 1) * shares
    assert any(s > 1 and st and not c for c, s, st, _ in steps)
    assert any(s > 1 and st and c for c, s, st, _ in steps)
    loose_stops = [g[-1] for c, t, g in solves if c]
    assert any(g > 0.3 * final for g in loose_stops)  # stopped before the final target
    obj = _objective(X, y, alpha)
    w_ref, b_ref = _reference(X, y, alpha)
    assert abs(obj(res.coef_, res.intercept_) - obj(w_ref, b_ref)) <= 1e-8 * res.p0_


def test_a_path_resumed_from_its_checkpoint_is_the_uninterrupted_one(tmp_path):
    """In memory, at weak regularisation (filled working sets, the faster growth), a path
    stopped after its second alpha and resumed from its checkpoint is the uninterrupted
    path, bit for bit."""
    X, y = _weak_problem(seed=2, n=600, p=2500)
    n = X.shape[0]
    kw = dict(alphas=1.0 / (np.array([10.0, 100.0, 1e3, 1e4]) * n), loss="logistic",
              tol=1e-6)  # fmt: skip
    ref = dl1.path(X, y, checkpoint=tmp_path / "ref", **kw)
    stop_path_after(1, X, y, checkpoint=tmp_path / "ck", **kw)
    resumed = dl1.path(X, y, checkpoint=tmp_path / "ck", **kw)
    assert (resumed.coefs_ != ref.coefs_).nnz == 0
    np.testing.assert_array_equal(resumed.intercepts_, ref.intercepts_)
    np.testing.assert_array_equal(resumed.gaps_, ref.gaps_)


def test_an_alphas_reused_pass_cut_to_its_quota_is_a_fresh_pass(monkeypatch):
    """A path's next alpha starts from the last alpha's certifying pass, each block's
    candidates cut to the new, smaller quota: the same candidates, in the same order, and
    the same scores as a pass run afresh at that alpha with that quota. (A small first
    working set, filled and certified at once, leaves a pass with the filled set's
    larger quota.)"""
    X, y = _weak_problem(seed=0, n=600, p=2500)
    real = ws_module.Run._shifted
    seen = []

    def checked(run, reuse, ws_size):
        out = real(run, reuse, ws_size)
        fresh = scan_pass(run.problem, reuse.theta, run.threshold, run.w, ws_size,
                          [None] * len(run.problem.blocks), None, False, run.support)  # fmt: skip
        blocks = [blk for part in fresh for blk in part.blocks]
        for cut, new in zip(out.per_block, blocks, strict=True):
            np.testing.assert_array_equal(cut.candidates, new.candidates)
            np.testing.assert_allclose(cut.scores, new.scores, rtol=1e-12, atol=1e-12)
        seen.append((reuse.ws_size, ws_size, max(len(b.candidates) for b in blocks)))
        return out

    monkeypatch.setattr(ws_module.Run, "_shifted", checked)
    dl1.path(X, y, n_alphas=12, eps=1e-3, loss="logistic", tol=1e-2,
             solver=WorkingSetSolver(ws_start=8))  # fmt: skip
    # the cut mattered: a quota below the reused pass's, blocks holding more violators
    assert any(old > new and most == new for old, new, most in seen), seen
