"""dl1.fit against scikit-learn, closed forms and recomputed certificates, on real clusters."""

import threading
import time
import warnings

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.linear_model import ElasticNet, Lasso, LogisticRegression

import dl1


def make_regression(n=120, p=53, density=0.15, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=density, format="csc", random_state=rng, dtype=dtype)
    w = np.zeros(p)
    w[rng.choice(p, 8, replace=False)] = rng.standard_normal(8) * 3
    y = X @ w + 0.5 + 0.1 * rng.standard_normal(n)
    return X, y


def make_classification(n=150, p=41, seed=1):
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=0.2, format="csc", random_state=rng)
    w = np.zeros(p)
    w[:6] = rng.standard_normal(6) * 4
    prob = 1 / (1 + np.exp(-(X @ w - 0.3)))
    y = np.where(rng.random(n) < prob, 1.0, -1.0)
    return X, y


def as_dask(X, n_blocks):
    """Column chunks of unequal widths that do not divide p evenly."""
    p = X.shape[1]
    cuts = np.unique(
        np.linspace(0, p, n_blocks + 1).astype(int) + np.r_[0, [1] * (n_blocks - 1), 0]
    )
    widths = tuple(np.diff(cuts).tolist())
    assert len(widths) == n_blocks and sum(widths) == p
    return da.from_array(sp.csc_matrix(X), chunks=(X.shape[0], widths), asarray=False)


def objective(X, y, coef, b, alpha, l1_ratio, loss):
    z = X @ coef + b
    if loss == "squared":
        f = 0.5 * np.mean((y - z) ** 2)
    else:
        f = np.mean(np.logaddexp(0, -y * z))
    return f + alpha * (l1_ratio * np.abs(coef).sum() + (1 - l1_ratio) / 2 * coef @ coef)


def numpy_gap_squared(X, y, coef, b, alpha, l1_ratio, fit_intercept):
    """Duality gap recomputed from scratch (scikit-learn's formula, divided by n)."""
    n = X.shape[0]
    r = y - X @ coef - b
    theta = r - r.mean() if fit_intercept else r
    a1, a2 = alpha * l1_ratio, alpha * (1 - l1_ratio)
    xt = X.T @ theta
    primal = objective(X, y, coef, b, alpha, l1_ratio, "squared")
    if a2 == 0:
        scale = min(1.0, n * a1 / np.abs(xt).max())
        th = scale * theta
        dual = (
            (th @ y - 0.5 * th @ th) / n if fit_intercept is False else (th @ y - 0.5 * th @ th) / n
        )
    else:
        scale = min(1.0, n * a1 / np.abs(xt).max())
        cands = []
        for c in (1.0, scale):
            th = c * theta
            ex = np.maximum(np.abs(X.T @ th) / n - a1, 0)
            cands.append((th @ y - 0.5 * th @ th) / n - ex @ ex / (2 * a2))
        dual = max(cands)
    return primal - dual


@pytest.mark.parametrize("n_blocks", [1, 2, 4, 7])
@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("l1_ratio", [1.0, 0.6])
@pytest.mark.parametrize("solver", ["ws", "cd"])
@pytest.mark.slow
def test_squared_matches_sklearn(local_cluster, n_blocks, fit_intercept, l1_ratio, solver):
    X, y = make_regression()
    amax = dl1.alpha_max(
        as_dask(X, n_blocks),
        y,
        l1_ratio=l1_ratio,
        fit_intercept=fit_intercept,
        client=local_cluster,
    )
    alpha = amax / 10
    res = dl1.fit(
        as_dask(X, n_blocks),
        y,
        alpha=alpha,
        l1_ratio=l1_ratio,
        tol=1e-10,
        fit_intercept=fit_intercept,
        n_partitions=min(n_blocks, 3),
        client=local_cluster,
        solver=solver,
    )
    Ref = Lasso(alpha=alpha) if l1_ratio == 1 else ElasticNet(alpha=alpha, l1_ratio=l1_ratio)
    Ref.set_params(tol=1e-10, max_iter=100_000, fit_intercept=fit_intercept).fit(X, y)
    ours = objective(X, y, res.coef_, res.intercept_, alpha, l1_ratio, "squared")
    ref = objective(X, y, Ref.coef_, Ref.intercept_, alpha, l1_ratio, "squared")
    assert res.converged_
    assert abs(ours - ref) <= 1e-6 * ref
    assert ours <= ref * (1 + 1e-9)
    np.testing.assert_array_equal(res.coef_ != 0, np.abs(Ref.coef_) > 1e-12)
    # the certificate recomputed in NumPy from coef_ agrees with the reported one
    gap = numpy_gap_squared(X, y, res.coef_, res.intercept_, alpha, l1_ratio, fit_intercept)
    assert gap >= -1e-15
    np.testing.assert_allclose(gap, res.dual_gap_, rtol=1e-6, atol=1e-14)
    assert res.gap_ <= 1e-10


def logistic_reference(X, y, alpha, fit_intercept):
    """scikit-learn's L1 logistic regression on this objective's scaling (C = 1 / (n alpha))."""
    n = X.shape[0]
    clf = LogisticRegression(
        l1_ratio=1.0,
        C=1.0 / (n * alpha),
        solver="saga" if fit_intercept else "liblinear",
        fit_intercept=fit_intercept,
        tol=1e-12,
        max_iter=1_000_000,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf.fit(X, y)
    return clf.coef_.ravel(), float(clf.intercept_[0]) if fit_intercept else 0.0


@pytest.mark.parametrize("n_blocks", [1, 2, 4, 7])
@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("solver", ["ws", "cd"])
@pytest.mark.slow
def test_logistic_matches_sklearn(local_cluster, n_blocks, fit_intercept, solver):
    X, y = make_classification()
    amax = dl1.alpha_max(X, y, loss="logistic", fit_intercept=fit_intercept)
    alpha = amax / 5
    res = dl1.fit(
        as_dask(X, n_blocks),
        y,
        alpha=alpha,
        loss="logistic",
        tol=1e-10,
        fit_intercept=fit_intercept,
        n_partitions=min(n_blocks, 2),
        client=local_cluster,
        max_rounds=20_000,
        solver=solver,
    )
    coef, b = logistic_reference(X, y, alpha, fit_intercept)
    ours = objective(X, y, res.coef_, res.intercept_, alpha, 1.0, "logistic")
    ref = objective(X, y, coef, b, alpha, 1.0, "logistic")
    assert res.converged_
    assert ours <= ref * (1 + 1e-6)
    assert abs(ours - ref) <= 1e-6 * ref
    np.testing.assert_array_equal(res.coef_ != 0, np.abs(coef) > 1e-6)
    gap = numpy_gap_logistic(X, y, res.coef_, res.intercept_, alpha, fit_intercept)
    assert gap >= -1e-15
    # the reported gap may use a slightly better dual point (Newton-refitted intercept)
    assert res.dual_gap_ <= gap * (1 + 1e-6) + 1e-15
    assert gap <= 1e-10 * res.p0_ * 10


def numpy_gap_logistic(X, y, coef, b, alpha, fit_intercept):
    """Lasso-logistic duality gap from scratch: theta_i = y_i sigmoid(-y_i z_i), made to sum
    to zero (intercept) and scaled into the dual feasible set."""
    n = X.shape[0]
    z = X @ coef + b
    theta = y / (1 + np.exp(y * z))
    if fit_intercept:
        pos, neg = theta[theta > 0].sum(), -theta[theta < 0].sum()
        if pos > neg:
            theta[theta > 0] *= neg / pos
        else:
            theta[theta < 0] *= pos / neg
    theta *= min(1.0, n * alpha / np.abs(X.T @ theta).max())
    u = y * theta  # in [0, 1]
    ent = np.where(u > 0, u * np.log(np.where(u > 0, u, 1)), 0) + np.where(
        u < 1, (1 - u) * np.log(np.where(u < 1, 1 - u, 1)), 0
    )
    dual = -ent.sum() / n
    return objective(X, y, coef, b, alpha, 1.0, "logistic") - dual


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_alpha_max_gives_zero_in_at_most_one_round(loss):
    X, y = make_classification() if loss == "logistic" else make_regression()
    amax = dl1.alpha_max(X, y, loss=loss)
    for alpha in (amax, 3 * amax):
        res = dl1.fit(X, y, alpha=alpha, loss=loss, tol=1e-8)
        assert not res.coef_.any()
        assert res.n_rounds_ <= 1
    res = dl1.fit(X, y, alpha=0.99 * amax, loss=loss, tol=1e-8)
    assert res.coef_.any()


def test_alpha_max_closed_form():
    X, y = make_regression()
    Xd = X.toarray()
    expected = np.abs(Xd.T @ (y - y.mean())).max() / X.shape[0]
    assert dl1.alpha_max(X, y) == pytest.approx(expected, rel=1e-12)
    assert dl1.alpha_max(X, y, l1_ratio=0.5) == pytest.approx(2 * expected, rel=1e-12)


def test_sparse_dense_float32_agree(local_cluster):
    X, y = make_regression(seed=3)
    kw = dict(alpha=0.01, tol=1e-10, client=local_cluster)
    r_sparse = dl1.fit(as_dask(X, 3), y, **kw)
    r_dense = dl1.fit(da.from_array(X.toarray(), chunks=(60, 20)), y, **kw)
    np.testing.assert_allclose(r_dense.coef_, r_sparse.coef_, rtol=1e-7, atol=1e-9)
    X32 = X.astype(np.float32)
    r32 = dl1.fit(as_dask(X32, 3), y, **kw)
    assert r32.converged_
    ref = Lasso(alpha=0.01, tol=1e-12, max_iter=100_000).fit(X32.astype(np.float64), y)
    np.testing.assert_allclose(r32.coef_, ref.coef_, atol=1e-6)


def test_sample_weights_match_sklearn():
    X, y = make_regression(seed=5)
    sw = np.random.default_rng(0).uniform(0.2, 3, X.shape[0])
    res = dl1.fit(as_dask(X, 2), y, alpha=0.01, sample_weight=sw, tol=1e-11)
    ref = Lasso(alpha=0.01, tol=1e-12, max_iter=100_000).fit(X, y, sample_weight=sw)
    # scikit-learn normalises weights to sum to n as well
    np.testing.assert_allclose(res.coef_, ref.coef_, atol=1e-7)
    np.testing.assert_allclose(res.intercept_, ref.intercept_, atol=1e-7)


def test_standardize_equals_fitting_scaled_features():
    X, y = make_regression(seed=6)
    Xd = X.toarray()
    std = Xd.std(axis=0)
    res = dl1.fit(X, y, alpha=0.02, standardize=True, tol=1e-11)
    ref = Lasso(alpha=0.02, tol=1e-12, max_iter=100_000).fit((Xd - Xd.mean(0)) / std, y)
    np.testing.assert_allclose(res.coef_, ref.coef_ / std, atol=1e-7)


def test_store_input_and_round_limit_warning(tmp_path):
    X, y = make_regression(seed=7)
    dl1.from_scipy(X, y, tmp_path / "s", n_feature_blocks=3)
    res = dl1.fit(tmp_path / "s", alpha=0.01, tol=1e-10)
    ref = dl1.fit(X, y, alpha=0.01, tol=1e-10)
    np.testing.assert_allclose(res.coef_, ref.coef_, atol=1e-9)
    # more columns than a first working set: one round cannot reach the tolerance
    X, y = make_regression(p=400, seed=7)
    dl1.from_scipy(X, y, tmp_path / "wide", n_feature_blocks=3)
    for solver in ("ws", "cd"):
        with pytest.warns(
            dl1.ConvergenceWarning, match=r"relative duality gap .* > tol 1\.000e-15"
        ):
            r = dl1.fit(tmp_path / "wide", alpha=0.001, tol=1e-15, max_rounds=1, solver=solver)
        assert not r.converged_ and r.n_rounds_ == 1 and r.gap_ > 1e-15
        assert r.gap_ == r.history_[-1]["gap"]


def test_bad_inputs_are_named():
    X, y = make_regression()
    with pytest.raises(dl1.errors.ValidationError, match="y has 3 values for 120 rows"):
        dl1.fit(X, y[:3], alpha=0.1)
    y2 = y.copy()
    y2[4] = np.nan
    with pytest.raises(dl1.errors.ValidationError, match=r"y\[4\] is nan"):
        dl1.fit(X, y2, alpha=0.1)
    with pytest.raises(ValueError, match=r"'loss' parameter of dl1.fit\(\) must be one of"):
        dl1.fit(X, y, alpha=0.1, loss="tweedie")
    with pytest.raises(ValueError, match=r"'alpha' parameter of dl1.fit\(\) must be"):
        dl1.fit(X, y, alpha=-1)
    with pytest.raises(dl1.errors.ValidationError, match="labels"):
        dl1.fit(X, y, alpha=0.1, loss="logistic")
    bad = X.copy()
    bad.data[0] = np.inf
    with pytest.raises(dl1.errors.ValidationError, match="column 0: value is NaN or infinite"):
        dl1.fit(bad, y, alpha=0.1)


def _cluster(n_workers):
    from distributed import Client, LocalCluster

    cluster = LocalCluster(
        n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0"
    )
    return cluster, Client(cluster)


@pytest.mark.slow
def test_identical_across_worker_counts_and_runs(local_cluster):
    X, y = make_regression(n=200, p=90, seed=8)
    kw = dict(alpha=0.005, tol=1e-8, n_partitions=3, random_order=True, seed=11)
    results = [dl1.fit(as_dask(X, 5), y, client=local_cluster, **kw) for _ in range(2)]
    for n_workers in (1, 3):
        cluster, client = _cluster(n_workers)
        with cluster, client:
            results.append(dl1.fit(as_dask(X, 5), y, client=client, **kw))
    results.append(dl1.fit(as_dask(X, 5), y, **kw))  # in-process
    for r in results[1:]:
        np.testing.assert_array_equal(r.coef_, results[0].coef_)
        assert r.intercept_ == results[0].intercept_
        assert r.n_rounds_ == results[0].n_rounds_


@pytest.mark.slow
@pytest.mark.parametrize("spread", [False, True])
def test_a_killed_worker_does_not_fail_the_fit(spread):
    """SIGKILL a worker mid-fit: lost blocks, cached column groups and (``spread``) the
    chain of Gram matrices formed across the workers are recomputed from their tasks."""
    X, y = make_regression(n=3000, p=4000, density=0.01, seed=9)
    kw = dict(alpha=1e-4, tol=1e-9, n_partitions=2, max_rounds=100_000, spread=spread)
    cluster, client = _cluster(2)
    with cluster, client:
        # on the cluster: its workers' one BLAS thread rounds like the rerun tasks will
        reference = dl1.fit(as_dask(X, 4), y, client=client, **kw)
        assert ("inner_checks" in reference.history_[0]) == spread
        # in memory the rounds are direct calls to the workers; spread subproblems are tasks
        assert {h["transport"] for h in reference.history_} == {"tasks" if spread else "direct"}
        out = {}
        started = threading.Event()

        def on_round(entry):
            if entry["round"] == 3:
                started.set()
                time.sleep(0.2)  # let the next round's tasks reach the workers

        t = threading.Thread(
            target=lambda: out.setdefault(
                "r", dl1.fit(as_dask(X, 4), y, client=client, callback=on_round, **kw)
            )
        )
        t.start()
        assert started.wait(timeout=120)
        time.sleep(0.1)
        assert t.is_alive(), "the fit finished before a worker could be killed; use more data"
        nanny = next(iter(cluster.workers.values()))
        nanny.process.process.kill()  # SIGKILL: the worker's blocks are lost
        t.join(timeout=300)
        assert "r" in out
    np.testing.assert_array_equal(out["r"].coef_, reference.coef_)
    assert out["r"].history_[-1]["transport"] == "tasks"  # a direct call failed: tasks since


def test_estimators_match_sklearn_and_reject_unknown_parameters():
    from dl1.estimators import ElasticNet as Enet
    from dl1.estimators import Lasso as L1
    from dl1.estimators import LogisticRegression as LR

    X, y = make_regression(seed=12)
    ours = L1(alpha=0.01, tol=1e-10).fit(X, y)
    ref = Lasso(alpha=0.01, tol=1e-12, max_iter=100_000).fit(X, y)
    np.testing.assert_allclose(ours.coef_, ref.coef_, atol=1e-8)
    np.testing.assert_allclose(ours.predict(X), ref.predict(X), atol=1e-8)
    assert ours.n_iter_ >= 1 and ours.gap_ <= 1e-10
    en = Enet(alpha=0.01, l1_ratio=0.3, tol=1e-14).fit(X, y)
    ref = ElasticNet(alpha=0.01, l1_ratio=0.3, tol=1e-12, max_iter=100_000).fit(X, y)
    # the objective is alpha_l2-strongly convex: dl1's gap G bounds |w - w*|_2 by
    # sqrt(2 G / alpha_l2) (about 6e-7 at tol 1e-14); scikit-learn's answer is taken as
    # w* to 1e-8, the Lasso's tolerance above
    bound = np.sqrt(2 * en.dual_gap_ / (0.01 * 0.7))
    assert en.gap_ <= 1e-14 and bound < 1e-6, bound
    np.testing.assert_allclose(en.coef_, ref.coef_, rtol=0, atol=bound + 1e-8)
    with pytest.raises(ValueError, match="Invalid parameter 'alhpa'"):
        L1().set_params(alhpa=1)
    with pytest.raises(TypeError):
        L1(alhpa=1)
    assert L1(alpha=2.0).get_params()["alpha"] == 2.0
    Xc, yc = make_classification()
    clf = LR(C=1 / (0.01 * Xc.shape[0]), tol=1e-8).fit(Xc, yc)
    assert set(np.unique(clf.predict(Xc))) <= {-1.0, 1.0}
    assert (clf.predict(Xc) == yc).mean() > 0.7
    np.testing.assert_allclose(clf.predict_proba(Xc).sum(1), 1.0)


@pytest.mark.parametrize("loss", ["squared", "logistic"])
@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.slow
def test_screening_never_discards_a_feature_of_the_solution(loss, fit_intercept):
    """Gap-safe screening is safe: every screened feature is zero in the exact solution."""
    if loss == "squared":
        X, y = make_regression(n=200, p=300, density=0.05, seed=13)
    else:
        X, y = make_classification(n=200, p=300, seed=14)
    sw = np.random.default_rng(0).uniform(0.5, 2, X.shape[0])
    amax = dl1.alpha_max(X, y, loss=loss, fit_intercept=fit_intercept, sample_weight=sw)
    n_screened = 0
    for ratio in (1.5, 4, 10, 30):
        alpha = amax / ratio
        res = dl1.fit(
            as_dask(X, 3),
            y,
            alpha=alpha,
            loss=loss,
            tol=1e-12,
            screen=True,
            max_rounds=100,
            fit_intercept=fit_intercept,
            sample_weight=sw,
        )
        ref = dl1.fit(
            as_dask(X, 3),
            y,
            alpha=alpha,
            loss=loss,
            tol=1e-10,
            max_rounds=200_000,
            fit_intercept=fit_intercept,
            sample_weight=sw,
            solver="cd",
        )
        support = np.abs(ref.coef_) > 1e-9
        assert not (res.screened_ & support).any()
        np.testing.assert_allclose(res.coef_, ref.coef_, atol=1e-4)
        n_screened += int(res.screened_.sum())
    assert n_screened > 0  # the rule did screen something


def test_decision_function_on_column_blocks_equals_numpy():
    """Predictions block by block (each block's nonzero coefficients shipped as indices and
    values) equal ``X @ coef + b``, for supports in some blocks only and for coef = 0."""
    from dl1.predict import decision_function

    rng = np.random.default_rng(5)
    X = sp.random(50, 37, density=0.3, format="csc", random_state=rng)
    Xd = as_dask(X, 4)
    for support in ([0, 3, 30], [12], []):
        coef = np.zeros(37)
        coef[support] = rng.standard_normal(len(support))
        got = decision_function(Xd, coef, 0.25).compute(scheduler="sync")
        np.testing.assert_allclose(got, X @ coef + 0.25, rtol=1e-13, atol=1e-13)


def _positive_regression(seed):
    rng = np.random.default_rng(seed)
    X = sp.random(200, 300, density=0.1, format="csc", random_state=rng)
    X.data = np.abs(X.data)  # positive features: nearly collinear with the intercept
    w = np.zeros(300)
    w[:15] = rng.standard_normal(15)
    return X, X @ w + 0.1 * rng.standard_normal(200) + 3.0


@pytest.mark.parametrize(("spread", "key"), [(True, "inner_checks"), ("cocoa", "inner_rounds")])
@pytest.mark.slow
def test_spread_subproblem_matches_sklearn_on_a_cluster(local_cluster, spread, key):
    """The working-set subproblem solved where its columns live (on a Gram matrix formed
    across the partitions, or by CoCoA+ rounds over them; intercept profiled) gives
    scikit-learn's Lasso and the gathered solver's answer, certified, on a 2-process
    LocalCluster."""
    X, y = _positive_regression(31)
    alpha = dl1.alpha_max(X, y) / 25
    res = dl1.fit(as_dask(X, 4), y, alpha=alpha, tol=1e-10, spread=spread, client=local_cluster)
    assert res.converged_
    assert all(key in h for h in res.history_[:-1])  # that spread path ran
    ref = Lasso(alpha=alpha, tol=1e-12, max_iter=100_000).fit(X, y)
    ours = objective(X, y, res.coef_, res.intercept_, alpha, 1.0, "squared")
    theirs = objective(X, y, ref.coef_, ref.intercept_, alpha, 1.0, "squared")
    assert ours <= theirs * (1 + 1e-6)
    np.testing.assert_array_equal(res.coef_ != 0, np.abs(ref.coef_) > 1e-10)
    gathered = dl1.fit(as_dask(X, 4), y, alpha=alpha, tol=1e-10, client=local_cluster)
    np.testing.assert_allclose(res.coef_, gathered.coef_, atol=1e-6)


@pytest.mark.parametrize(
    ("loss", "spread", "mode"),
    [
        ("squared", True, "SpreadGram"),  # Gram matrix across partitions
        ("squared", "cocoa", "SpreadCocoa"),
        ("logistic", True, "SpreadNewton"),  # no Gram matrix: spread Newton steps
        ("squared_hinge", True, "SpreadNewton"),
        ("logistic", "cocoa", "SpreadCocoa"),
    ],
)
def test_spread_subproblem_in_process_equals_gathered(loss, spread, mode):
    X, y = _positive_regression(32)
    sw = np.random.default_rng(3).uniform(0.5, 2.0, X.shape[0])
    if loss != "squared":
        y = np.where(y > np.median(y), 1.0, -1.0)
    alpha = dl1.alpha_max(X, y, loss=loss, sample_weight=sw) / 10
    kw = dict(alpha=alpha, loss=loss, tol=1e-10, sample_weight=sw)
    res = dl1.fit(as_dask(X, 3), y, spread=spread, **kw)
    gathered = dl1.fit(as_dask(X, 3), y, spread=False, **kw)
    assert res.converged_ and gathered.converged_
    assert {h["mode"] for h in res.history_[:-1]} == {mode}
    assert not any(h["mode"].startswith("Spread") for h in gathered.history_[:-1])
    np.testing.assert_allclose(res.coef_, gathered.coef_, atol=1e-5)
    assert res.intercept_ == pytest.approx(gathered.intercept_, abs=1e-5)
    with pytest.raises(ValueError, match=r"'spread' parameter of dl1.fit\(\) must be"):
        dl1.fit(as_dask(X, 3), y, spread="gram", **kw)


@pytest.mark.slow
def test_gather_budget_follows_the_workers_memory_limit(local_cluster):
    from distributed import Client, LocalCluster

    from dl1.loading import gather_budget
    from dl1.runtime.executor import executor_for
    from dl1.runtime.worker import WORKER_BASELINE

    assert gather_budget(executor_for(local_cluster), streamed=False) == np.inf
    limit = 400 * 2**20
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, memory_limit=limit, dashboard_address="127.0.0.1:0"
        ) as cluster,
        Client(cluster) as client,
    ):
        assert gather_budget(executor_for(client), streamed=True) == (limit - WORKER_BASELINE) / 4


def _intervals(client):
    """Batched-send intervals of the client, the scheduler's streams and the workers."""

    def on_scheduler(dask_scheduler=None):
        return sorted({c.interval for c in dask_scheduler.stream_comms.values()})

    def on_worker(dask_worker=None):
        return dask_worker.batched_stream.interval

    return (
        client.scheduler_comm.interval,
        client.run_on_scheduler(on_scheduler),
        sorted(set(client.run(on_worker).values())),
    )


def test_low_latency_sets_and_restores_dask_batching_intervals(local_cluster, monkeypatch):
    from dl1.runtime import dask_workarounds
    from dl1.runtime.dask_workarounds import LOW_LATENCY_INTERVAL, held_short, low_latency
    from tests.helpers import released_batching

    assert released_batching(local_cluster)  # an earlier test's fit in one piece let go
    before = _intervals(local_cluster)
    assert before[0] != LOW_LATENCY_INTERVAL  # Dask's defaults (ms), not ours
    seen = []
    with low_latency(local_cluster):
        seen.append(_intervals(local_cluster))
        X, y = make_regression(n=60, p=20, seed=3)
        res = dl1.fit(as_dask(X, 2), y, alpha=0.01, tol=1e-8, client=local_cluster)
        assert res.converged_
        # a fit inside leaves the outer setting in force when it returns
        seen.append(_intervals(local_cluster))
        # the client's linger, long enough to be seen however slow this machine is
        monkeypatch.setattr(dask_workarounds, "CLIENT_LINGER_S", 1.0)
    want = (LOW_LATENCY_INTERVAL, [LOW_LATENCY_INTERVAL], [LOW_LATENCY_INTERVAL])
    assert seen == [want, want]
    # the scheduler's and the workers' at once; the client's after the fit's releases
    assert held_short(local_cluster)
    assert _intervals(local_cluster)[1:] == before[1:]
    assert released_batching(local_cluster)
    assert _intervals(local_cluster) == before
    # and dl1.fit sets them for its own duration only
    dl1.fit(as_dask(X, 2), y, alpha=0.01, tol=1e-8, client=local_cluster)
    assert released_batching(local_cluster)
    assert _intervals(local_cluster) == before


def _blas_threads() -> set[int]:
    from threadpoolctl import threadpool_info

    return {d["num_threads"] for d in threadpool_info() if d["user_api"] == "blas"}


def test_a_coordinating_process_keeps_its_blas_to_one_thread(local_cluster):
    """While dl1.fit or dl1.path coordinates a cluster, and while a fit runs without a
    client, this process's BLAS runs on one thread (spinning BLAS threads took a core from
    the workers of a LocalCluster, and from the kernels in process); the process's own
    setting is back when they return."""
    from threadpoolctl import threadpool_limits

    X, y = make_regression(n=80, p=30, seed=4)
    with threadpool_limits(limits=2, user_api="blas"):
        before = _blas_threads()
        assert before == {2}
        seen: list[set[int]] = []
        res = dl1.fit(
            as_dask(X, 2),
            y,
            alpha=0.01,
            client=local_cluster,
            callback=lambda entry: seen.append(_blas_threads()),
        )
        assert res.converged_ and seen and all(s == {1} for s in seen)
        assert _blas_threads() == before
        dl1.path(
            as_dask(X, 2),
            y,
            n_alphas=3,
            client=local_cluster,
            callback=lambda k, alpha, r: seen.append(_blas_threads()),
        )
        assert seen[-1] == {1} and _blas_threads() == before
        local: list[set[int]] = []
        dl1.fit(as_dask(X, 2), y, alpha=0.01, callback=lambda e: local.append(_blas_threads()))
        assert local and all(s == {1} for s in local) and _blas_threads() == before
