"""The cross-validated estimators and ``dl1.path(cv=)``: the same folds, alphas and held-out
errors as scikit-learn's LassoCV / ElasticNetCV / LogisticRegressionCV, glmnet's 1-SE rule,
and on a cluster one read of the data for every fold and candidate."""

from __future__ import annotations

import threading
import time
import warnings

import dask
import numpy as np
import pytest
from sklearn import linear_model as sk
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import GridSearchCV, KFold, StratifiedKFold
from sklearn.utils.estimator_checks import parametrize_with_checks

import dl1
from tests.helpers import random_csr, store_reads, task_stream


def _regression(n=240, p=50, seed=0):
    rng = np.random.default_rng(seed)
    X = random_csr(n, p, 0.15, seed)
    w = np.zeros(p)
    w[:6] = rng.standard_normal(6)
    return X, X @ w + 0.3 * rng.standard_normal(n), w


@pytest.fixture
def in_process():
    with dask.config.set(scheduler="sync"):
        yield


def test_lasso_cv_matches_scikit_learn(in_process):
    X, y, _ = _regression()
    ours = dl1.LassoCV(alphas=20, cv=KFold(4), tol=1e-11).fit(X, y)
    ref = sk.LassoCV(alphas=20, cv=KFold(4), tol=1e-13, max_iter=200_000).fit(X, y)
    np.testing.assert_allclose(ours.alphas_, ref.alphas_, rtol=1e-12)
    assert ours.alpha_ == ref.alpha_
    np.testing.assert_allclose(ours.mse_path_, ref.mse_path_, rtol=1e-6)
    np.testing.assert_allclose(ours.coef_, ref.coef_, atol=1e-8)
    # glmnet's one-standard-error rule, recomputed from the held-out errors
    mean = ref.mse_path_.mean(axis=1)
    se = ref.mse_path_.std(axis=1, ddof=1) / np.sqrt(4)
    k = int(np.argmin(mean))
    assert ours.alpha_1se_ == ref.alphas_[np.flatnonzero(mean <= mean[k] + se[k]).min()]
    assert ours.alpha_1se_ >= ours.alpha_


def test_elastic_net_cv_chooses_l1_ratio_and_alpha_as_scikit_learn(in_process):
    X, y, _ = _regression(seed=1)
    ours = dl1.ElasticNetCV(l1_ratio=[0.2, 0.9], alphas=12, cv=3, tol=1e-11).fit(X, y)
    ref = sk.ElasticNetCV(l1_ratio=[0.2, 0.9], alphas=12, cv=3, tol=1e-13,
                          max_iter=200_000).fit(X, y)  # fmt: skip
    assert (ours.alpha_, ours.l1_ratio_) == (ref.alpha_, ref.l1_ratio_)
    assert ours.mse_path_.shape == ref.mse_path_.shape == (2, 12, 3)
    np.testing.assert_allclose(ours.alphas_, ref.alphas_, rtol=1e-12)
    np.testing.assert_allclose(ours.mse_path_, ref.mse_path_, rtol=1e-6)
    # the refits: P is alpha (1 - l1_ratio)-strongly convex, ||w - w*||^2 <= 2 gap / mu
    mu = ours.alpha_ * (1 - ours.l1_ratio_)
    bound = np.sqrt(2 * ours.dual_gap_ / mu) + np.sqrt(2 * max(ref.dual_gap_, 0.0) / mu)
    assert np.linalg.norm(ours.coef_ - ref.coef_) <= bound


@pytest.mark.parametrize("scoring", ["accuracy", "neg_log_loss"])
def test_logistic_regression_cv_matches_scikit_learn(in_process, scoring):
    X, _, w = _regression(n=300, seed=2)
    rng = np.random.default_rng(2)
    labels = np.where(X @ w + 0.5 * rng.standard_normal(300) > 0, "spam", "ham")
    ours = dl1.LogisticRegressionCV(Cs=8, cv=StratifiedKFold(4), scoring=scoring, tol=1e-11,
                                    fit_intercept=False).fit(X, labels)  # fmt: skip
    # liblinear penalises an intercept: without one, the two objectives are the same
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", ConvergenceWarning)  # liblinear's, at the largest C
        ref = sk.LogisticRegressionCV(Cs=8, cv=StratifiedKFold(4), scoring=scoring, tol=1e-10,
                                      fit_intercept=False, l1_ratios=(1.0,), solver="liblinear",
                                      max_iter=100_000).fit(X, labels)  # fmt: skip
    np.testing.assert_array_equal(ours.classes_, ref.classes_)
    np.testing.assert_allclose(ours.Cs_, ref.Cs_)
    np.testing.assert_array_equal(ours.C_, ref.C_)
    np.testing.assert_allclose(ours.scores_["spam"], np.squeeze(ref.scores_["spam"]), atol=1e-6)
    np.testing.assert_allclose(ours.coef_, ref.coef_, atol=1e-6)
    np.testing.assert_array_equal(ours.predict(X), ref.predict(X))


def test_path_with_cv_chooses_as_lasso_cv(in_process):
    X, y, _ = _regression(seed=3)
    res = dl1.path(X, y, n_alphas=15, eps=1e-3, cv=KFold(3), tol=1e-10)
    est = dl1.LassoCV(alphas=15, cv=KFold(3), tol=1e-10).fit(X, y)
    np.testing.assert_allclose(res.alphas_, est.alphas_, rtol=1e-12)
    np.testing.assert_allclose(res.cv_.scores, est.mse_path_, rtol=1e-8)
    assert res.alphas_[res.cv_.best] == est.alpha_
    assert res.converged_.all() and res.coefs_.shape == (X.shape[1], 15)


#: At the default tol (relative gap 1e-4 on every fold and alpha) the weighted and the
#: repeated-rows fits of LassoCV's and ElasticNetCV's checks differ by more than their rtol
#: of 1e-7, as LogisticRegression's (tests/estimators/test_check_estimator.py); at a tight
#: tol they agree (test_sample_weight_equivalence_of_cv_at_a_tight_tol).
TOLERANCE = "default tol=1e-4 (relative duality gap) against the check's rtol=1e-7"
SAMPLE_WEIGHT_CHECKS = ("check_sample_weight_equivalence_on_dense_data",
                        "check_sample_weight_equivalence_on_sparse_data")  # fmt: skip


@parametrize_with_checks(
    [dl1.LassoCV(alphas=4, cv=3), dl1.ElasticNetCV(alphas=4, cv=3),
     # moderate Cs: on the checks' tiny separable data sets C = 1e4 (Cs=3's largest) drives
     # the logistic fits to their round limit, minutes per check. Multiclass tag on: the
     # checks' three classes cross-validate the multinomial model (test_cv_multiclass.py)
     dl1.LogisticRegressionCV(Cs=[0.01, 0.1, 1.0], cv=3)],  # small grids: hundreds of fits
    expected_failed_checks=lambda est: (
        {} if isinstance(est, dl1.LogisticRegressionCV)
        else dict.fromkeys(SAMPLE_WEIGHT_CHECKS, TOLERANCE)
    ),
)  # fmt: skip
def test_cv_estimators_pass_scikit_learn_checks(estimator, check):
    with dask.config.set(scheduler="sync"):
        check(estimator)


@pytest.mark.parametrize("check", SAMPLE_WEIGHT_CHECKS)
def test_sample_weight_equivalence_of_cv_at_a_tight_tol(in_process, check):
    """Pass: the checks listed as failing at the default tol pass at tol=1e-11."""
    from sklearn.utils import estimator_checks

    getattr(estimator_checks, check)("LassoCV", dl1.LassoCV(alphas=4, cv=3, tol=1e-11))


# -- on a cluster ---------------------------------------------------------------------------


def _block_reads(store) -> int:
    """Reads of one load: every row block of every loaded block (a store with fewer
    feature blocks than partitions is read in pieces, :func:`dl1.loading.finer_bounds`)."""
    from dl1.loading import finer_bounds

    cb = finer_bounds(store.col_bounds("train"), 2, store.read("stats/col_nnz", "train"))
    return (len(store.row_bounds("train")) - 1) * (len(cb) - 1)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from dl1.datasets import make_e2006_like

    return make_e2006_like(tmp_path_factory.mktemp("cv") / "small.zarr", preset="small", seed=5)


@pytest.mark.parametrize("one_piece", [False, "auto"])
def test_cv_on_a_cluster_reads_once_and_runs_folds_side_by_side(
    local_cluster, store, monkeypatch, one_piece
):
    """Distributed, each fold's path is coordinated by a thread of its own; in one piece
    (the handle fits a worker), each fold is one task, on both workers at once."""
    import dl1.paths.cv as cvmod

    spans: list[tuple[float, float]] = []
    lock = threading.Lock()
    inner = cvmod.fold_scores

    def timed(*args, **kwargs):
        t0 = time.monotonic()
        out = inner(*args, **kwargs)
        with lock:
            spans.append((t0, time.monotonic()))
        return out

    monkeypatch.setattr(cvmod, "fold_scores", timed)
    with dask.config.set({"dl1.one-piece": one_piece}), task_stream(local_cluster) as ts:
        est = dl1.LassoCV(alphas=6, eps=0.05, cv=3, tol=1e-6, client=local_cluster).fit(store)
    assert store_reads(ts.data) == _block_reads(store)  # each stored block (or piece) once
    if one_piece:  # the folds' tasks (and the refit's), as the scheduler ran them
        pieces = [e for e in ts.data if str(e["key"]).startswith("in_worker")]
        spans = [(e["startstops"][-1]["start"], e["startstops"][-1]["stop"]) for e in pieces]
        assert len({e["worker"] for e in pieces}) == 2
    assert len(spans) == (4 if one_piece else 3)
    (a0, a1), (b0, b1) = sorted(spans)[:2]
    assert b0 < a1, "the folds' paths ran one after the other"
    # the same choice and errors in this process
    with dask.config.set(scheduler="sync"):
        local = dl1.LassoCV(alphas=6, eps=0.05, cv=3, tol=1e-6).fit(store)
    assert est.alpha_ == local.alpha_
    np.testing.assert_allclose(est.mse_path_, local.mse_path_, rtol=1e-4)


def test_grid_search_on_a_handle_reads_each_block_once(local_cluster, store, monkeypatch):
    import dl1.store.reader as reader

    local_reads = []  # reads in this process (a dask array computed here would read)
    inner = reader.read_block_arrays
    monkeypatch.setattr(reader, "read_block_arrays",
                        lambda *a, **k: local_reads.append(a) or inner(*a, **k))  # fmt: skip

    with task_stream(local_cluster) as loading:
        ds = dl1.persist(store, client=local_cluster)
    n_read = store_reads(loading.data)
    amax = dl1.alpha_max(ds)
    grid = {"alpha": list(amax * np.geomspace(0.5, 0.02, 10))}
    with task_stream(local_cluster) as searching:
        search = GridSearchCV(dl1.Lasso(tol=1e-5, client=local_cluster), grid, cv=3).fit(ds)
    assert n_read == _block_reads(store)
    assert store_reads(searching.data) == 0 and not local_reads
    assert search.best_estimator_.dual_gap_ <= 1e-5 * search.best_estimator_.result_.p0_
    assert len(search.cv_results_["mean_test_score"]) == 10
    ds.release()
