"""The working-set solver's proximal Newton subproblem (smooth margin losses) against
scikit-learn, and on a LocalCluster against the calling process."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.linear_model import LogisticRegression
from sklearn.svm import LinearSVC

import dl1
import dl1.tasks.subproblem as subproblem_module
from dl1.kernels.linalg import csc_col_sqnorms
from dl1.objective.datafits import Logistic, Quadratic, SquaredHinge
from dl1.objective.penalties import ElasticNet
from dl1.solvers.base import WorkingSetBudget
from dl1.solvers.subproblems import (
    WHOLE_RATIO,
    ColumnCD,
    GatheredGram,
    GatheredProxNewton,
    SpreadCocoa,
    SpreadGram,
    SpreadNewton,
    choose_mode,
)
from dl1.solvers.ws import WorkingSetSolver
from dl1.tasks.growth import WS_START
from dl1.tasks.prox_newton import Columns, _restricted_gap, prox_newton
from tests.test_penalised import as_dask, make_classification, objective


class NewtonCalls(list):
    """The proximal Newton solves' reports, with ``targets``: each call's working-set size
    and target gap."""

    def __init__(self) -> None:
        super().__init__()
        self.targets: list[tuple[int, float]] = []


@pytest.fixture
def newton_calls(monkeypatch):
    """Counts the proximal Newton solves of the in-process fits of a test."""
    calls = NewtonCalls()
    targets = calls.targets
    real = subproblem_module.prox_newton

    def counted(*args):
        out = real(*args)
        if args[8] > 0.0:  # a fit's call (not the executor's warm-up, to target 0)
            assert out[3].gap <= args[8]  # stopped at its target
            calls.append(out[3])
            targets.append((args[0].indptr.shape[0] - 1, args[8]))
        return out

    monkeypatch.setattr(subproblem_module, "prox_newton", counted)
    return calls


def sklearn_logistic(X, y, alpha, l1_ratio, fit_intercept):
    """scikit-learn on this objective's scaling (C = 1 / (n alpha)), to tight tolerance."""
    clf = LogisticRegression(
        C=1.0 / (X.shape[0] * alpha), l1_ratio=l1_ratio, solver="saga",
        fit_intercept=fit_intercept, tol=1e-13, max_iter=1_000_000,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf.fit(X, y)
    return clf.coef_.ravel(), float(clf.intercept_[0]) if fit_intercept else 0.0


class _Problem:
    def __init__(self, datafit):
        self.datafit, self.streamed, self.n = datafit, False, 100
        self.penalty = ElasticNet(0.1)
        self.budget = type("Budget", (), {"gather_max": 1e9})()


def test_choose_mode_takes_prox_newton_for_smooth_margin_losses():
    ws = np.arange(200)
    assert isinstance(choose_mode(None, _Problem(Logistic()), ws, 4096), GatheredProxNewton)
    assert isinstance(choose_mode(None, _Problem(SquaredHinge()), ws, 4096), GatheredProxNewton)
    assert type(choose_mode(None, _Problem(Quadratic()), ws, 4096)) is GatheredGram
    assert type(choose_mode(False, _Problem(_WithoutHessian()), ws, 4096)) is ColumnCD


def test_out_of_core_a_working_set_is_spread_by_its_columns_bytes_not_the_dense_bound():
    """Streamed: gathered while three times its columns' bytes fit one worker's budget (a
    sparse working set whose dense bound, 12 n m bytes, would not); the squared loss keeps
    the dense bound (its Gram path densifies columns)."""
    n, gather_max = 100_000, 200e6
    col_bytes = np.full(5000, 8.0 * 2000 + 8)  # 2,000 nonzeros a column, float32 values
    small, big = np.arange(4000), np.arange(5000)  # 192 MB and 240 MB in three copies
    for loss, ws, mode in [(Logistic(), small, GatheredProxNewton),
                           (Logistic(), big, SpreadNewton),
                           (Quadratic(), np.arange(200), SpreadGram)]:  # fmt: skip
        pb = _Problem(loss)
        pb.streamed, pb.n = True, n
        pb.budget = WorkingSetBudget(gather_max=gather_max, col_bytes=col_bytes)
        assert 12.0 * n * ws.shape[0] > gather_max  # the dense bound would spread them all
        assert type(choose_mode(None, pb, ws, 4096)) is mode
        # CoCoA+ rounds only when asked for
        assert type(choose_mode("cocoa", pb, ws, 4096)) is SpreadCocoa


class _WithoutHessian:
    """A smooth datafit exposing no ``grad_hess``: column epochs."""

    quadratic = False
    beta = 1.0


@pytest.mark.parametrize(("fit_intercept", "l1_ratio"), [(True, 1.0), (False, 1.0), (True, 0.5)])
def test_logistic_matches_scikit_learn(newton_calls, fit_intercept, l1_ratio):
    X, y = make_classification(n=160, p=45, seed=3)
    amax = dl1.alpha_max(X, y, loss="logistic", l1_ratio=l1_ratio, fit_intercept=fit_intercept)
    alpha = amax / 8
    res = dl1.fit(X, y, alpha=alpha, l1_ratio=l1_ratio, loss="logistic", tol=1e-11,
                  fit_intercept=fit_intercept, client=None)  # fmt: skip
    assert res.converged_ and newton_calls and all(c.newton_steps >= 1 for c in newton_calls)
    coef, b = sklearn_logistic(X, y, alpha, l1_ratio, fit_intercept)
    ours = objective(X, y, res.coef_, res.intercept_, alpha, l1_ratio, "logistic")
    ref = objective(X, y, coef, b, alpha, l1_ratio, "logistic")
    assert ours <= ref + 1e-10
    np.testing.assert_allclose(res.coef_, coef, atol=1e-4)
    assert res.intercept_ == pytest.approx(b, abs=1e-4)
    np.testing.assert_array_equal(res.coef_ != 0, np.abs(coef) > 1e-6)


def test_standardized_logistic_equals_fitting_scaled_features(newton_calls):
    X, y = make_classification(n=150, p=30, seed=4)
    Xd = X.toarray()
    std = Xd.std(axis=0)
    alpha = dl1.alpha_max(Xd / std, y, loss="logistic") / 6
    res = dl1.fit(X, y, alpha=alpha, loss="logistic", standardize=True, tol=1e-11, client=None)
    coef, b = sklearn_logistic(Xd / std, y, alpha, 1.0, True)
    assert newton_calls
    np.testing.assert_allclose(res.coef_, coef / std, atol=1e-4 / std.min())
    assert res.intercept_ == pytest.approx(b, abs=1e-4)


def test_squared_hinge_matches_liblinear(newton_calls):
    X, y = make_classification(n=150, p=40, seed=5)
    alpha = dl1.alpha_max(X, y, loss="squared_hinge", fit_intercept=False) / 10
    res = dl1.fit(X, y, alpha=alpha, loss="squared_hinge", fit_intercept=False, tol=1e-11,
                  client=None)  # fmt: skip
    assert res.converged_ and newton_calls
    svc = LinearSVC(penalty="l1", loss="squared_hinge", dual=False, fit_intercept=False,
                    C=1.0 / (X.shape[0] * alpha), tol=1e-10, max_iter=100_000)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # liblinear may stop on its iteration count
        coef = svc.fit(X, y).coef_.ravel()

    def primal(w):
        return np.mean(np.maximum(0.0, 1.0 - y * (X @ w)) ** 2) + alpha * np.abs(w).sum()

    assert primal(res.coef_) <= primal(coef) + 1e-10
    np.testing.assert_allclose(res.coef_, coef, atol=1e-4)


@pytest.mark.parametrize("p", [120, 400])
def test_subproblem_goes_to_the_final_target_in_few_rounds(newton_calls, p):
    """Each subproblem stops once its restricted gap meets its target (the fixture checks
    it), so the fit ends at the pass after the working set is right: at least
    ``inner_ratio * tol * P(0)`` for a working set of some features, exactly
    ``WHOLE_RATIO * tol * P(0)`` for one of every feature (the whole problem: the
    next pass certifies it)."""
    X, y = make_classification(n=300, p=p, seed=6)
    alpha = dl1.alpha_max(X, y, loss="logistic") / 20
    res = dl1.fit(X, y, alpha=alpha, loss="logistic", tol=1e-6, client=None)
    assert res.converged_ and res.n_rounds_ <= 3 and res.dual_gap_ <= 1e-6 * res.p0_
    final = 1e-6 * res.p0_
    ratio = WorkingSetSolver().inner_ratio
    for size, target in newton_calls.targets:
        if size == p:
            assert target == pytest.approx(WHOLE_RATIO * final, rel=1e-12)
        else:  # the final target's fraction, or the current gap's while violators wait
            assert target >= ratio * final * (1 - 1e-12)
    assert {size == p for size, _ in newton_calls.targets} == ({True} if p < WS_START else {False})


def test_cluster_gives_the_in_process_answer(local_cluster):
    X, y = make_classification(n=200, p=60, seed=7)
    alpha = dl1.alpha_max(X, y, loss="logistic") / 10
    kw = {"alpha": alpha, "l1_ratio": 0.8, "loss": "logistic", "tol": 1e-10}
    here = dl1.fit(X, y, client=None, **kw)
    there = dl1.fit(as_dask(X, 3), y, client=local_cluster, n_partitions=2, **kw)
    assert there.converged_
    np.testing.assert_allclose(there.coef_, here.coef_, atol=1e-7)
    assert there.intercept_ == pytest.approx(here.intercept_, abs=1e-7)


@pytest.mark.parametrize("max_epochs", [1, 3, 50])
def test_reported_gap_is_the_returned_points(max_epochs):
    """Stopped by its epoch limit after steps whose gap it skipped (a target of 0), the
    solve still reports the restricted gap at the point it returns."""
    X, y = make_classification(n=120, p=25, seed=8)
    X.sort_indices()
    ip, ix = X.indptr.astype(np.int64), X.indices.astype(np.int32)
    data, empty = X.data.astype(np.float64), np.zeros(0)
    cols = Columns(ip, ix, data, empty, csc_col_sqnorms(ip, ix, data, empty, empty))
    datafit = Logistic()
    penalty = ElasticNet(dl1.alpha_max(X, y, loss="logistic") / 10, 1.0)
    z0 = np.full(y.shape[0], datafit.initial_intercept(y))
    w, dz, db, info = prox_newton(cols, np.zeros(25), y, z0, empty, datafit, penalty, True,
                                  0.0, max_epochs)  # fmt: skip
    assert info.epochs <= max_epochs and info.newton_steps >= 1
    z = z0 + dz
    g, h, out = (np.empty(y.shape[0]) for _ in range(3))
    datafit.grad_hess(y, z, empty, g, h)
    primal = datafit.value(y, z) + penalty.value(w)
    expected = _restricted_gap(cols, w, y, g, None, datafit, penalty, True, primal, out)
    assert info.gap == pytest.approx(expected, rel=1e-9, abs=1e-15)
    assert db == pytest.approx(float(np.mean(dz - X @ w)), abs=1e-10)


def _model_minimum(dense, g, h, w, a1, a2, n):
    """The model's minimiser ``(d, e)`` by FISTA on the dense problem (``e`` unpenalised)."""
    A = np.hstack([dense, np.ones((dense.shape[0], 1))])
    L = np.linalg.eigvalsh(A.T @ (h[:, None] * A)).max() / n
    x = y = np.zeros(A.shape[1])
    t = 1.0
    for _ in range(50_000):
        grad = A.T @ (g + h * (A @ y)) / n
        z = y - grad / L
        v = w + z[:-1]
        shrunk = np.sign(v) * np.maximum(np.abs(v) - a1 / L, 0.0) / (1.0 + a2 / L)
        x_new = np.append(shrunk - w, z[-1])
        t_new = (1 + np.sqrt(1 + 4 * t * t)) / 2
        x, y, t = x_new, x_new + (t - 1) / t_new * (x_new - x), t_new
    return x[:-1], x[-1]


def _ill_conditioned_model(n=200, p=15, seed=4):
    """A model on nearly collinear columns (a shared factor plus 5% noise), as TF-IDF's
    frequent words give: plain coordinate descent converges slowly on it."""
    from dl1.kernels.cd import weighted_col_stats
    from dl1.tasks.prox_newton import Model

    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((n, 1)) + 0.05 * rng.standard_normal((n, p))
    X = sp.csc_matrix(dense)
    ip, ix, data = X.indptr.astype(np.int64), X.indices.astype(np.int32), X.data
    empty = np.zeros(0)
    cols = Columns(ip, ix, data, empty, csc_col_sqnorms(ip, ix, data, empty, empty))
    g, h = rng.normal(size=n), rng.uniform(0.05, 0.25, n)
    lj, hx, hdata = np.empty(p), np.empty(p), np.empty(data.shape[0])
    weighted_col_stats(ip, ix, data, empty, h, lj, hx, hdata)
    shift = np.array([-g.sum() / h.sum(), h.sum()])
    return cols, dense, Model(g, h, hdata, lj, hx, np.zeros(p), shift, empty)


def _minimise(cols, model, penalty, max_epochs):
    from dl1.tasks.prox_newton import minimise_model

    n, p = model.g.shape[0], cols.indptr.shape[0] - 1
    model = model._replace(shift=model.shift.copy())
    dw, r, u, tmp = np.zeros(p), model.g.copy(), np.empty(n), np.empty(n)
    epochs = minimise_model(cols, np.zeros(p), model, penalty, dw, r, u, tmp, max_epochs)
    return epochs, dw, float(model.shift[0]), r


def test_model_descent_with_extrapolation_reaches_the_minimum_sooner(monkeypatch):
    """Pass: on nearly collinear columns the model's coordinate descent, extrapolated
    (Anderson), ends at the model's minimum (FISTA on the dense model), with ``r = g + H X
    d`` kept; after as many epochs, plain epochs (no extrapolation) are still far above it."""
    import dl1.tasks.prox_newton as pn

    monkeypatch.setattr(pn, "INNER_RTOL", 1e-14)
    cols, dense, model = _ill_conditioned_model()
    n, p = dense.shape
    penalty = ElasticNet(0.002, 0.9)
    a1, a2 = penalty.alpha_l1, penalty.alpha_l2

    def q(d, e):
        v = dense @ d + e
        return (model.g @ v + v @ (model.h * v) / 2) / n + a1 * np.abs(d).sum() + a2 * d @ d / 2

    d_ref, e_ref = _model_minimum(dense, model.g, model.h, np.zeros(p), a1, a2, n)
    assert np.count_nonzero(d_ref) >= 5
    epochs, d, e, r = _minimise(cols, model, penalty, 5_000)
    assert epochs < 5_000
    assert q(d, e) <= q(d_ref, e_ref) + 1e-10 * abs(q(d_ref, e_ref))
    np.testing.assert_allclose(r, model.g + model.h * (dense @ d), atol=1e-9)
    assert abs(np.sum(r + model.h * e)) <= 1e-9 * np.abs(model.g).sum()  # e stays optimal
    monkeypatch.setattr(pn, "_extrapolate", lambda *args: None)
    _, d_plain, e_plain, _ = _minimise(cols, model, penalty, epochs)
    assert q(d_plain, e_plain) - q(d_ref, e_ref) > 1e3 * max(q(d, e) - q(d_ref, e_ref), 1e-15)


def test_damping_rule():
    """Levenberg-Marquardt's rule: raised to the cut of a shortened step (at least
    MIN_DAMPING / t, at most 1), quartered after full steps, then dropped."""
    from dl1.tasks.damping import MIN_DAMPING, next_damping

    assert next_damping(0.0, 1.0) == 0.0
    assert next_damping(0.0, 0.25) == pytest.approx(4 * MIN_DAMPING)
    assert next_damping(0.1, 0.5) == pytest.approx(0.2)
    assert next_damping(0.5, 1e-6) == 1.0
    d, steps = 1.0, 0
    while d > 0.0 and steps < 100:
        d, steps = next_damping(d, 1.0), steps + 1
    assert d == 0.0 and steps == 6  # 1 / 4^5 < MIN_DAMPING after five quarterings


def test_a_shortened_step_damps_the_next_model(monkeypatch):
    """After a line search that cut the step, the next model carries the damping's
    curvature (its bound times the damping, on every column), and a full step takes it
    back; the answer is still the restricted problem's (gap at target)."""
    import dl1.tasks.prox_newton as pn

    X, y = make_classification(n=150, p=20, seed=11)
    X.sort_indices()
    ip, ix = X.indptr.astype(np.int64), X.indices.astype(np.int32)
    data, empty = X.data.astype(np.float64), np.zeros(0)
    cols = Columns(ip, ix, data, empty, csc_col_sqnorms(ip, ix, data, empty, empty))
    extras, calls = [], []
    real_search, real_minimise = pn.line_search, pn.minimise_model

    def search(*args):
        t, f = real_search(*args)
        calls.append(t)
        return (0.5 * t, f) if len(calls) == 1 else (t, f)  # as if the first were cut

    def minimise(cols_, w, model, *args):
        extras.append(model.extra.copy())
        return real_minimise(cols_, w, model, *args)

    datafit = Logistic()
    penalty = ElasticNet(dl1.alpha_max(X, y, loss="logistic") / 20, 1.0)
    z0 = np.full(y.shape[0], datafit.initial_intercept(y))
    monkeypatch.setattr(pn, "line_search", search)
    monkeypatch.setattr(pn, "minimise_model", minimise)
    _, _, _, info = prox_newton(cols, np.zeros(20), y, z0, empty, datafit, penalty, True,
                                1e-10, 10_000)  # fmt: skip
    assert info.gap <= 1e-10 and len(extras) >= 4
    assert extras[0].shape == (0,)
    bound = datafit.beta * cols.sqnorm
    np.testing.assert_allclose(extras[1], 2e-3 * bound, rtol=1e-12)  # MIN_DAMPING / 0.5
    np.testing.assert_allclose(extras[2], 5e-4 * bound, rtol=1e-12)  # a full step: / 4
    assert extras[3].shape == (0,)  # another: below MIN_DAMPING, dropped


def test_trust_box_rule():
    """The box is the radius over each column's largest entry (inf for an empty column),
    halved after a shortened step and doubled after a whole one; an infinite first radius
    (every loss but the logistic) is no box."""
    from dl1.tasks.trust import TrustBox

    X = sp.csc_matrix(np.array([[0.5, 0.0, -2.0], [0.25, 0.0, 1.0]]))
    ip, data = X.indptr.astype(np.int64), X.data.astype(np.float64)
    box = TrustBox.of(ip, data, np.zeros(0), Logistic())
    np.testing.assert_array_equal(box.reach(), [8.0, np.inf, 2.0])
    box.update(0.5)
    box.update(0.25)
    np.testing.assert_array_equal(box.reach(), [2.0, np.inf, 0.5])
    box.update(1.0)
    np.testing.assert_array_equal(box.reach(), [4.0, np.inf, 1.0])
    box.update(1.0)
    box.update(0.5)
    np.testing.assert_array_equal(box.reach(), [4.0, np.inf, 1.0])
    scaled = TrustBox.of(ip, data, np.array([2.0, 1.0, 0.5]), Logistic())
    np.testing.assert_array_equal(scaled.reach(), [4.0, np.inf, 4.0])
    assert TrustBox.of(ip, data, np.zeros(0), SquaredHinge()).reach().shape == (0,)


def _deep_rows_problem():
    """Columns 0 and 1 reach only two positive rows, which ``w_1 = -12`` puts 9 deep on the
    wrong side (``p (1 - p)`` about 1e-4, the logistic loss's linear part); the other rows
    use the other columns."""
    X, y = make_classification(n=200, p=30, seed=3)
    X = X.tolil()
    X[:, :2] = 0.0
    deep = sp.lil_matrix((2, 30))
    deep[:, 0] = deep[:, 1] = np.array([[0.75], [0.7]])
    X = sp.vstack([X.tocsc(), deep.tocsc()]).tocsc()
    X.sort_indices()
    w0 = np.zeros(30)
    w0[1] = -12.0
    return X, np.r_[y, 1.0, 1.0], w0


def test_the_trust_box_keeps_the_first_step_whole(monkeypatch):
    """From the point above, the unboxed model moves columns 0 and 1 by hundreds and the
    line search cuts the whole step to 1/8 or less; in the trust region's box every step is
    whole, fewer are taken, and both reach the restricted problem's answer (columns 0 and 1
    are equal: only their sum is determined)."""
    import math

    import dl1.tasks.prox_newton as pn

    class Unboxed(Logistic):
        newton_reach = math.inf

    X, y, w0 = _deep_rows_problem()
    ip, ix = X.indptr.astype(np.int64), X.indices.astype(np.int32)
    data, empty = X.data.astype(np.float64), np.zeros(0)
    cols = Columns(ip, ix, data, empty, csc_col_sqnorms(ip, ix, data, empty, empty))
    penalty = ElasticNet(dl1.alpha_max(X, y, loss="logistic") / 50, 1.0)
    real_search = pn.line_search
    runs = {}
    for datafit in (Logistic(), Unboxed()):
        steps = []

        def search(*args, steps=steps):
            t, f = real_search(*args)
            steps.append(t)
            return t, f

        monkeypatch.setattr(pn, "line_search", search)
        z0 = X @ w0 + datafit.initial_intercept(y)
        w, dz, _, info = prox_newton(cols, w0, y, z0, empty, datafit, penalty, True, 1e-10,
                                     10_000)  # fmt: skip
        assert info.gap <= 1e-10
        runs[type(datafit).__name__] = (w, z0 + dz, steps)
    (w, z, steps), (w_u, z_u, steps_u) = runs["Logistic"], runs["Unboxed"]
    assert steps_u[0] <= 1 / 8 and all(t == 1.0 for t in steps) and len(steps) < len(steps_u)
    assert w[0] + w[1] == pytest.approx(w_u[0] + w_u[1], abs=1e-6)
    np.testing.assert_allclose(w[2:], w_u[2:], atol=1e-6)
    np.testing.assert_allclose(z, z_u, atol=1e-6)


def test_forcing_term_is_the_reduction_left_within_its_bounds():
    """The model's accuracy for the next Newton step: the loosest while the gap is not
    known, ``target / gap`` between INNER_RTOL and INNER_RTOL_FAR otherwise."""
    from dl1.tasks.prox_newton import INNER_RTOL, INNER_RTOL_FAR, forcing_term

    assert forcing_term(np.inf, 1e-3) == INNER_RTOL_FAR
    assert forcing_term(np.nan, 1e-3) == INNER_RTOL_FAR
    assert forcing_term(2e-3, 1e-3) == INNER_RTOL_FAR  # half the gap to go: a loose model
    assert forcing_term(5e-2, 1e-3) == pytest.approx(2e-2)
    assert forcing_term(1.0, 1e-8) == INNER_RTOL  # many digits to go: the tightest
    assert INNER_RTOL < 2e-2 < INNER_RTOL_FAR
