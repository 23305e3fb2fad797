"""The row-partitioned proximal Newton solver: scikit-learn's and a dense reference's
answers, certified; the partitions' tasks against NumPy; nothing as long as the rows sent
back to the coordinator."""

from __future__ import annotations

import dataclasses
import warnings
from collections import Counter

import dask
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.linear_model import ElasticNet, Lasso

import dl1
from dl1.errors import ValidationError
from dl1.objective.datafits import Logistic, Quadratic
from dl1.runtime.executor import LocalExecutor
from dl1.runtime.wire import PLUGIN_NAME
from dl1.solvers import row_newton
from dl1.solvers.result import ConvergenceWarning
from dl1.solvers.row_newton import RowNewtonSolver
from dl1.tasks.row_newton import (
    model_sums,
    part_out,
    start_part,
    trial_model,
    unpacked,
    with_theta,
)
from dl1.tasks.rows import assemble_rows
from tests.runtime.test_rpc import methods_served
from tests.test_penalised import (
    logistic_reference,
    make_classification,
    make_regression,
    numpy_gap_logistic,
    numpy_gap_squared,
    objective,
)


@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("l1_ratio", [1.0, 0.6])
def test_squared_loss_matches_scikit_learn(fit_intercept, l1_ratio):
    """Lasso and elastic net: scikit-learn's coefficients to 1e-8, the reported gap equal
    to the NumPy certificate's and below the tolerance."""
    X, y = make_regression(n=300, p=70, seed=3)
    alpha = dl1.alpha_max(X, y, l1_ratio=l1_ratio) / 20
    res = dl1.fit(X, y, alpha=alpha, l1_ratio=l1_ratio, fit_intercept=fit_intercept,
                  solver="row-newton", tol=1e-12, n_partitions=3)  # fmt: skip
    Ref = Lasso(alpha=alpha) if l1_ratio == 1 else ElasticNet(alpha=alpha, l1_ratio=l1_ratio)
    Ref.set_params(tol=1e-14, max_iter=1_000_000, fit_intercept=fit_intercept)
    Ref.fit(X.toarray(), y)
    assert res.converged_ and res.gap_ <= 1e-12
    np.testing.assert_allclose(res.coef_, Ref.coef_, atol=1e-8)
    np.testing.assert_allclose(res.intercept_, Ref.intercept_, atol=1e-8)
    gap = numpy_gap_squared(X, y, res.coef_, res.intercept_, alpha, l1_ratio, fit_intercept)
    np.testing.assert_allclose(gap, res.dual_gap_, rtol=1e-6, atol=1e-15)


@pytest.mark.parametrize("fit_intercept", [True, False])
def test_logistic_loss_matches_scikit_learn_with_a_numpy_certificate(fit_intercept):
    """L1 logistic regression at weak regularisation (most features active, the working
    set grown past its start): scikit-learn's objective to 1e-9, and the NumPy certificate
    of the answer within the tolerance."""
    X, y = make_classification(n=400, p=90, seed=2)
    # liblinear, the reference without an intercept, takes minutes below 1/5
    weak = 50 if fit_intercept else 5
    alpha = dl1.alpha_max(X, y, loss="logistic", fit_intercept=fit_intercept) / weak
    solver = RowNewtonSolver(ws_start=8)
    res = dl1.fit(X, y, alpha=alpha, loss="logistic", fit_intercept=fit_intercept,
                  solver=solver, tol=1e-10, n_partitions=2)  # fmt: skip
    coef, b = logistic_reference(X, y, alpha, fit_intercept)
    ours = objective(X, y, res.coef_, res.intercept_, alpha, 1.0, "logistic")
    ref = objective(X, y, coef, b, alpha, 1.0, "logistic")
    assert res.converged_
    assert ours <= ref + 1e-9 * ref
    assert max(h.get("ws_size", 0) for h in res.history_) > 8  # the working set grew
    gap = numpy_gap_logistic(X, y, res.coef_, res.intercept_, alpha, fit_intercept)
    assert gap <= 1e-10 * res.p0_ * 1.01


def test_sample_weights_equal_repeated_rows():
    """Integer weights give the fit of the rows repeated that many times."""
    X, y = make_classification(n=200, p=40, seed=4)
    counts = np.random.default_rng(0).integers(1, 4, size=200)
    alpha = dl1.alpha_max(X, y, loss="logistic") / 10
    kw = dict(alpha=alpha, loss="logistic", solver="row-newton", tol=1e-11)
    weighted = dl1.fit(X, y, sample_weight=counts.astype(float), **kw)
    rows = np.repeat(np.arange(200), counts)
    repeated = dl1.fit(sp.csr_matrix(X)[rows], y[rows], **kw)
    np.testing.assert_allclose(weighted.coef_, repeated.coef_, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("direct", [True, False])
def test_cluster_fit_equals_in_process_fit(local_cluster, direct):
    """On two worker processes, the partitions (three: the sums' tree has one left over,
    a server two of them) give the in-process answer, by direct calls and by tasks."""
    X, y = make_classification(n=300, p=60, seed=5)
    kw = dict(alpha=dl1.alpha_max(X, y, loss="logistic") / 20, loss="logistic",
              solver="row-newton", tol=1e-10, n_partitions=3)  # fmt: skip
    here = dl1.fit(X, y, **kw)
    with dask.config.set({"dl1.one-piece": False, "dl1.direct-calls": direct}):
        there = dl1.fit(X, y, client=local_cluster, **kw)
    assert there.converged_
    np.testing.assert_allclose(there.coef_, here.coef_, atol=1e-9)
    assert there.n_rounds_ == here.n_rounds_


def drop_servers(dask_worker) -> None:
    """Close every partition server of a worker, as a worker restarted without them."""
    servers = dask_worker.plugins[PLUGIN_NAME].servers
    while servers:
        servers.popitem()[1].close()


@pytest.mark.slow
def test_a_fit_whose_servers_are_lost_goes_on_by_tasks(local_cluster):
    """The servers holding the partitions lost after the first certificate: the partitions are
    started again by tasks from the coefficients so far, and the fit reaches the
    in-process answer, certified."""
    from distributed import get_task_stream

    X, y = make_classification(n=300, p=60, seed=5)
    alpha = dl1.alpha_max(X, y, loss="logistic") / 20
    kw = dict(alpha=alpha, loss="logistic", tol=1e-10, n_partitions=3)
    here = dl1.fit(X, y, solver="row-newton", **kw)
    lost = []

    def lose_servers(entry):
        if entry["round"] == 0:
            local_cluster.run(drop_servers)
            lost.append(entry["calls"])

    solver = RowNewtonSolver(callback=lose_servers)
    with dask.config.set({"dl1.one-piece": False}), get_task_stream(local_cluster) as ts:
        there = dl1.fit(X, y, client=local_cluster, solver=solver, **kw)
    starts = [t for t in ts.data if str(t["key"]).startswith("start_part")]
    assert lost and len(starts) == 3  # by tasks, once, after the servers were lost
    assert [h["transport"] for h in there.history_][:1] == ["direct"]
    assert there.history_[-1]["transport"] == "tasks"
    assert there.converged_ and there.gap_ <= 1e-10 and there.n_rounds_ >= 2
    np.testing.assert_allclose(there.coef_, here.coef_, atol=1e-9)


class RecordingExecutor(LocalExecutor):
    """In process, recording the length of every result fetched by the coordinator."""

    def __init__(self) -> None:
        super().__init__()
        self.fetched: list[int] = []

    def gather(self, handles):
        out = super().gather(handles)
        self.fetched += [_length(h) for h in out]
        return out


def _length(out) -> int:
    """The longest array in a task's result."""
    if isinstance(out, np.ndarray):
        return out.shape[0]
    if isinstance(out, tuple):
        return max((_length(x) for x in out), default=0)
    return 0


def test_nothing_as_long_as_the_rows_comes_back(monkeypatch):
    """With 6,000 rows and 50 features, every result the coordinator fetches during the
    solve is as long as the features (``X^T theta``) or the working set's packed model
    (``m (m + 1) / 2``), never as long as the rows."""
    rng = np.random.default_rng(1)
    X = sp.random(6000, 50, density=0.1, format="csr", random_state=rng)
    y = X @ rng.standard_normal(50) + 0.1 * rng.standard_normal(6000)
    ex = RecordingExecutor()
    monkeypatch.setattr("dl1.runtime.executor.LocalExecutor", lambda: ex)
    res = dl1.fit(X, y, alpha=dl1.alpha_max(X, y) / 30, solver="row-newton", tol=1e-9,
                  n_partitions=3)  # fmt: skip
    assert res.converged_
    assert ex.fetched and max(ex.fetched) <= 50 * 51 // 2 < 6000


def test_refuses_a_non_smooth_loss_and_a_support_beyond_max_ws():
    X, y = make_classification(n=150, p=41, seed=1)
    with pytest.raises(ValidationError, match="smooth loss"):
        dl1.fit(X, y, alpha=0.01, loss="hinge", solver="row-newton")
    alpha = dl1.alpha_max(X, y, loss="logistic") / 100
    with pytest.raises(ValidationError, match="max_ws=4"):
        dl1.fit(X, y, alpha=alpha, loss="logistic", solver=RowNewtonSolver(max_ws=4,
                ws_start=4))  # fmt: skip


def test_max_rounds_warns_with_the_gap():
    X, y = make_classification(n=150, p=41, seed=1)
    alpha = dl1.alpha_max(X, y, loss="logistic") / 50
    with pytest.warns(ConvergenceWarning, match="relative duality gap"):
        res = dl1.fit(X, y, alpha=alpha, loss="logistic", tol=1e-12,
                      solver=RowNewtonSolver(max_rounds=1, ws_start=2))  # fmt: skip
    assert not res.converged_ and res.gap_ > 1e-12


def _part(X, y, s=None, w=None, b=0.3):
    X = sp.csr_matrix(X)
    blocks = [assemble_rows(0, 0, X[:70]), assemble_rows(1, 70, X[70:])]
    w = np.zeros(X.shape[1]) if w is None else w
    support = np.flatnonzero(w)
    return start_part(blocks, y, s, support, w[support], b), blocks


@pytest.mark.parametrize("datafit", [Quadratic(), Logistic()], ids=["squared", "logistic"])
def test_model_sums_and_trials_against_numpy(datafit):
    """A partition's model sums on a working set, and its trial values, against the dense
    formulas (per-row derivatives from the datafit's own gradient)."""
    X, y = make_classification(n=120, p=30, seed=6)
    s = np.random.default_rng(2).uniform(0.5, 2, size=120)
    w = np.random.default_rng(3).standard_normal(30) * 0.2
    part, blocks = _part(X, y, s, w)
    ws = np.array([1, 4, 5, 17, 29])
    d = np.random.default_rng(4).standard_normal(5)
    out = part_out(model_sums(part, blocks, datafit, ws, d, 0.05))
    Xd = X.toarray()
    z = Xd @ w + 0.3 + Xd[:, ws] @ d + 0.05
    g = datafit.gradient(y, z, s) * 120
    if datafit.quadratic:
        h = s
    else:
        p = 1 / (1 + np.exp(-y * z))
        h = s * p * (1 - p)
    # float32 up the tree: the model's Hessian to its rounding
    np.testing.assert_allclose(unpacked(out.A, 5), Xd[:, ws].T @ (h[:, None] * Xd[:, ws]),
                               rtol=1e-6)  # fmt: skip
    np.testing.assert_allclose(out.G, Xd[:, ws].T @ g, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose([out.g0, out.h0], [g.sum(), h.sum()], rtol=1e-10)
    np.testing.assert_allclose(out.value, datafit.value(y, z, s) * 120, rtol=1e-12)
    moved = model_sums(part, blocks, datafit, ws, d, 0.05)
    ts = np.array([1.0, 0.5])
    trial = part_out(trial_model(moved, blocks, datafit, ws, d, 0.0, ts))
    for t, v in zip(ts, trial.values, strict=True):
        np.testing.assert_allclose(v, datafit.value(y, z + t * Xd[:, ws] @ d, s) * 120,
                                   rtol=1e-12)  # fmt: skip
    at_full = part_out(model_sums(moved, blocks, datafit, ws, d, 0.0))
    np.testing.assert_array_equal(trial.model.A, at_full.A)
    np.testing.assert_allclose(trial.model.value, at_full.value, rtol=1e-12)
    pos, neg = part_out(with_theta(moved, blocks, datafit))
    theta = -datafit.gradient(y, z, s) * 120
    np.testing.assert_allclose([pos, neg], [theta[theta > 0].sum(), -theta[theta <= 0].sum()])
    # the intercept's shift taken by the same call
    shifted = with_theta(moved, blocks, datafit, -0.2)
    np.testing.assert_allclose(shifted.z, z - 0.2, rtol=1e-12)
    np.testing.assert_allclose(shifted.theta, -datafit.gradient(y, z - 0.2, s) * 120, rtol=1e-10)


def test_the_squared_loss_model_hessian_is_computed_once_a_working_set():
    """The squared loss's model Hessian is the working set's weighted Gram matrix whatever
    ``z``: a part keeps it across steps on the same working set (the same array, equal to
    a fresh computation after a step), computes it again for another set, and a
    logistic part keeps none (its curvature moves with ``z``)."""
    X, y = make_classification(n=120, p=30, seed=6)
    s = np.random.default_rng(2).uniform(0.5, 2, size=120)
    part, blocks = _part(X, y, s)
    ws, d = np.array([1, 4, 5, 17, 29]), np.random.default_rng(4).standard_normal(5)
    first = model_sums(part, blocks, Quadratic(), ws, None, 0.0)
    stepped = trial_model(first, blocks, Quadratic(), ws, d, 0.1, np.array([1.0]))
    assert stepped.gram is first.gram is part_out(stepped).model.A
    fresh = model_sums(dataclasses.replace(stepped, gram=None), blocks, Quadratic(), ws, None,
                       0.0)  # fmt: skip
    np.testing.assert_array_equal(fresh.gram, first.gram)
    other = model_sums(stepped, blocks, Quadratic(), ws[:3], None, 0.0)
    assert other.gram.shape == (6,) and other.gram is not first.gram
    assert model_sums(part, blocks, Logistic(), ws, None, 0.0).gram is None


@pytest.mark.parametrize(("n", "p", "tol"), [(200, 60, 1e-10), (200, 400, 1e-9)])
def test_a_path_is_certified_at_every_alpha(n, p, tol):
    """Warm starts along a path (each alpha from the partitions the last one kept): every
    alpha within the tolerance, the working-set path's coefficients. With 400 features the
    working sets change from one alpha to the next: a partition must not step with the
    columns of an earlier one (its predictions, hence its certificate, would no longer be
    those of the coefficients: measured, coefficients 3.2 away, certified)."""
    X, y = make_regression(n=n, p=p, seed=9)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        path = dl1.path(X, y, n_alphas=10, eps=0.05, solver="row-newton", tol=tol)
    ws = dl1.path(X, y, n_alphas=10, eps=0.05, tol=tol)
    assert path.converged_.all()
    np.testing.assert_allclose(path.coefs_.toarray(), ws.coefs_.toarray(), atol=1e-6)


ROW_TASKS = ("start_part", "shift_sums", "with_theta", "xt_theta", "gap_sums", "model_sums",
             "trial_model", "part_out", "sum_outs")  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("direct", [True, False])
def test_a_cluster_path_sends_the_labels_once(local_cluster, direct):
    """On two worker processes, a 5-alpha path starts its partitions once (the next
    alphas start from the kept predictions) and gives the in-process path. By direct calls
    (the default) no step is a task: one ``row_start`` a worker, and every call one
    ``row_call`` a worker (the first forwards it to the second); by tasks (``dl1.direct-
    calls: False``), one ``start_part`` task a partition."""
    from distributed import get_task_stream

    X, y = make_regression(n=400, p=50, seed=4)
    kw = dict(n_alphas=5, eps=0.05, solver="row-newton", tol=1e-10, n_partitions=2)
    here = dl1.path(X, y, **kw)
    before = local_cluster.run(methods_served)
    config = {"dl1.one-piece": False, "dl1.direct-calls": direct}
    with dask.config.set(config), get_task_stream(local_cluster) as ts:
        there = dl1.path(X, y, client=local_cluster, **kw)
    served = [Counter(v) - Counter(before.get(k, {}))
              for k, v in local_cluster.run(methods_served).items()]  # fmt: skip
    steps = Counter(str(t["key"]).split("-")[0] for t in ts.data)
    if direct:
        assert not any(steps[name] for name in ROW_TASKS), steps
        assert [c["row_start"] for c in served] == [1, 1]
        assert served[0]["row_call"] == served[1]["row_call"] > 5
    else:
        assert steps["start_part"] == 2
        assert not any(c["row_call"] + c["row_start"] for c in served)
    assert there.converged_.all()
    np.testing.assert_allclose(there.coefs_.toarray(), here.coefs_.toarray(), atol=1e-8)


class Recording(RowNewtonSolver):
    """Keeps the last problem it solved and the state it returned."""

    def solve(self, problem, warm=None):
        res, state = super().solve(problem, warm)
        self.seen = (problem, state)
        return res, state


def test_kept_partitions_serve_the_same_data_only():
    """A state's partitions are reused by a problem with the same rows, labels and
    weights (another penalty), not by one with other labels or weights, nor once made
    reproducible (a resumed run recomputes ``z``)."""
    X, y = make_regression(n=90, p=12, seed=3)
    solver = Recording()
    dl1.fit(X, y, alpha=dl1.alpha_max(X, y) / 5, solver=solver)
    pb, state = solver.seen
    assert len(state.parts.parts) == len(pb.rows.parts) > 0
    assert solver._kept(pb.at(pb.penalty), state) is state.parts
    assert solver._kept(dataclasses.replace(pb, y=pb.y.copy()), state) is None
    assert solver._kept(dataclasses.replace(pb, sample_weight=np.ones(90)), state) is None
    assert solver._kept(pb, state.reproducible()) is None


def test_cross_validation_refuses_it_by_name(monkeypatch):
    """A data handle's cross-validation scores held-out rows from the predictions, which
    this solver does not bring back: refused with the solver to use instead, before any
    alpha is solved."""

    def solved(*args, **kwargs):
        raise AssertionError("a fold's alpha was solved before the refusal")

    monkeypatch.setattr(RowNewtonSolver, "solve", solved)
    X, y = make_regression(n=120, p=20, seed=2)
    with pytest.raises(ValidationError, match="solver='row-newton'.*solver='ws'"):
        dl1.estimators.LassoCV(alphas=3, cv=3, solver="row-newton").fit(X, y)


def test_a_step_the_first_ladder_refuses_is_found_in_the_rest(monkeypatch):
    """When no step of the first ladder is accepted (forced here for the first Newton
    steps: glmnet's steps on these data are taken whole), the rest of the ladder is
    evaluated from the parts before the step, and the fit reaches the reference."""
    real = row_newton._Run._armijo
    seen = {"first": 0, "rest": 0}

    def refuse_first(run, values, steps, *args):
        if steps.shape[0] == row_newton.FIRST_STEPS and seen["first"] < 3:
            seen["first"] += 1
            return None
        seen["rest"] += steps.shape[0] != row_newton.FIRST_STEPS
        return real(run, values, steps, *args)

    monkeypatch.setattr(row_newton._Run, "_armijo", refuse_first)
    X, y = make_classification(n=300, p=40, seed=3)
    alpha = dl1.alpha_max(X, y, loss="logistic") / 20
    res = dl1.fit(X, y, alpha=alpha, loss="logistic", solver="row-newton", tol=1e-10)
    ref = dl1.fit(X, y, alpha=alpha, loss="logistic", tol=1e-10)
    assert seen == {"first": 3, "rest": 3} and res.converged_
    np.testing.assert_allclose(res.coef_, ref.coef_, atol=1e-6)
