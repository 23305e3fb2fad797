"""One-vs-rest estimators of more than two classes: dl1.LinearSVC (liblinear's scheme, as
scikit-learn's LinearSVC) and dl1.LogisticRegression(multi_class="ovr") (scikit-learn's
OneVsRestClassifier of binary logistic regressions), against scikit-learn and an LP per
class, in scikit-learn's model selection, and out of core on a cluster."""

from __future__ import annotations

import warnings

import dask
import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import linprog
from scipy.special import expit
from sklearn import svm
from sklearn.linear_model import LogisticRegression as SkLogisticRegression
from sklearn.model_selection import GridSearchCV, KFold, cross_val_score
from sklearn.multiclass import OneVsRestClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import MaxAbsScaler

import dl1
from dl1.params import InvalidParameterError
from dl1.solvers.result import FitResult

NAMES = np.array(["arts", "games", "science", "sports"])


@pytest.fixture(autouse=True)
def in_process():
    """No Dask client unless a test passes one: every fit runs in this process."""
    with dask.config.set(scheduler="sync"):
        yield


def _problem(n=300, p=40, K=4, seed=0):
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=0.3, random_state=seed + 1, format="csr")
    W = rng.standard_normal((p, K)) * (rng.random((p, 1)) < 0.3) * 3
    return X, NAMES[np.argmax(X @ W + rng.gumbel(size=(n, K)), axis=1)]


def _quiet(est, X, y):
    """scikit-learn's fit, its own warning at max_iter silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.fit(X, y)


def _objective(X, yk, w, b, C, loss):
    """liblinear's / scikit-learn's binary objective of class k against the rest, the
    intercept unpenalised: ``C sum_i loss(y_i (x_i w + b)) + ||w||_1``."""
    m = yk * (X @ w + b)
    losses = {"squared_hinge": np.maximum(0.0, 1.0 - m) ** 2,
              "hinge": np.maximum(0.0, 1.0 - m), "logistic": np.logaddexp(0.0, -m)}  # fmt: skip
    return C * losses[loss].sum() + np.abs(w).sum()


def _pm1(y, label):
    return np.where(y == label, 1.0, -1.0)


def test_linear_svc_is_liblinears_one_vs_rest_without_intercept():
    """Pass: LinearSVC of four classes equals sklearn.svm.LinearSVC(penalty="l1",
    dual=False) (liblinear's one-vs-rest) to 1e-6, every class certified."""
    X, y = _problem()
    ours = dl1.LinearSVC(C=0.5, fit_intercept=False, tol=1e-12).fit(X, y)
    ref = _quiet(svm.LinearSVC(penalty="l1", dual=False, C=0.5, fit_intercept=False,
                               tol=1e-8, max_iter=1_000_000), X, y)  # fmt: skip
    np.testing.assert_array_equal(ours.classes_, NAMES)
    assert ours.coef_.shape == (4, 40) and ours.intercept_.shape == (4,)
    assert not ours.intercept_.any() and 0 < np.count_nonzero(ours.coef_) < ours.coef_.size
    np.testing.assert_allclose(ours.coef_, ref.coef_, atol=1e-6)
    assert ours.gap_ <= 1e-12 and (ours.result_.gaps_ <= 1e-12).all()
    assert ours.result_.multi_class == "ovr" and ours.result_.loss == "squared_hinge"
    d = ours.decision_function(X)
    np.testing.assert_allclose(d, X.toarray() @ ours.coef_.T, rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(ours.predict(X), ref.predict(X))
    np.testing.assert_array_equal(ours.predict(X), NAMES[np.argmax(d, axis=1)])
    assert ours.score(X, y) == ref.score(X, y)
    assert not hasattr(ours, "predict_proba")


def test_linear_svc_with_intercept_is_liblinears_up_to_its_intercept_penalty():
    """Pass: with an intercept (unpenalised here, ``|b| / s`` in liblinear's with
    ``intercept_scaling=s``), each class's objective is at most liblinear's solution's
    (ours is certified optimal), which exceeds it by at most ``|b| / s``."""
    X, y = _problem(seed=1)
    C, s = 0.5, 1e3
    ours = dl1.LinearSVC(C=C, tol=1e-12).fit(X, y)
    # liblinear's coordinate order is random, drawn from the global state when unseeded
    # (the tests run before it in the process): at tol 1e-6 a few orders in 60 stop with
    # an intercept up to 1.4e-2 off (most within 7e-5); a seeded reference is the same run
    ref = _quiet(svm.LinearSVC(penalty="l1", dual=False, C=C, intercept_scaling=s, tol=1e-6,
                               max_iter=1_000_000, random_state=0), X, y)  # fmt: skip
    for k, label in enumerate(NAMES):
        yk = _pm1(y, label)
        mine = _objective(X, yk, ours.coef_[k], ours.intercept_[k], C, "squared_hinge")
        theirs = _objective(X, yk, ref.coef_[k], ref.intercept_[k], C, "squared_hinge")
        assert mine <= theirs * (1 + 1e-10)
        assert theirs - mine <= abs(ours.intercept_[k]) / s + 1e-6 * mine
    np.testing.assert_allclose(ours.intercept_, ref.intercept_, atol=1e-3)


def _hinge_lp(X, yk, C):
    """The L1 hinge with a free intercept as one LP (Zhu et al.'s 1-norm SVM):
    ``min 1^T (u + v) + C 1^T xi``, ``xi >= 1 - y (X (u - v) + b)``, ``u, v, xi >= 0``."""
    Xd = X.toarray()
    n, p = Xd.shape
    yX = yk[:, None] * Xd
    A = np.hstack([-yX, yX, -yk[:, None], -np.eye(n)])
    cost = np.concatenate([np.ones(2 * p), [0.0], np.full(n, C)])
    bounds = [(0, None)] * (2 * p) + [(None, None)] + [(0, None)] * n
    sol = linprog(cost, A_ub=A, b_ub=-np.ones(n), bounds=bounds, method="highs")
    assert sol.status == 0
    return sol.fun


def test_linear_svc_hinge_is_the_lp_of_every_class():
    """Pass: LinearSVC(loss="hinge") of three classes reaches each class's LP optimum to a
    relative 1e-9; the hinge with the elastic net is refused with more than two classes."""
    X, y = _problem(n=120, p=30, K=3, seed=2)
    ours = dl1.LinearSVC(loss="hinge", C=0.3, tol=1e-10).fit(X, y)
    assert ours.coef_.shape == (3, 30) and ours.result_.loss == "hinge"
    for k, label in enumerate(ours.classes_):
        yk = _pm1(y, label)
        lp = _hinge_lp(X, yk, 0.3)
        mine = _objective(X, yk, ours.coef_[k], ours.intercept_[k], 0.3, "hinge")
        assert mine == pytest.approx(lp, rel=1e-9)
    with pytest.raises(ValueError, match="loss='hinge' with more than two classes"):
        dl1.LinearSVC("elasticnet", "hinge", l1_ratio=0.5).fit(X, y)


@pytest.mark.parametrize("fit_intercept, solver", [(False, "liblinear"), (True, "saga")])
def test_logistic_ovr_is_scikit_learns_one_vs_rest(fit_intercept, solver):
    """Pass: LogisticRegression(multi_class="ovr") equals scikit-learn's
    OneVsRestClassifier of L1 LogisticRegression (liblinear without intercept, saga with
    an unpenalised one) to 1e-8 in coefficients and probabilities; its probabilities are each
    class's sigmoid, rows normalised; to_sklearn() is a OneVsRestClassifier predicting as
    it does."""
    X, y = _problem(seed=3)
    ours = dl1.LogisticRegression(multi_class="ovr", C=2.0, tol=1e-11,
                                  fit_intercept=fit_intercept).fit(X, y)  # fmt: skip
    ref = _quiet(OneVsRestClassifier(SkLogisticRegression(
        solver=solver, l1_ratio=1.0, C=2.0, tol=1e-10 if solver == "liblinear" else 1e-12,
        max_iter=100_000,
        fit_intercept=fit_intercept)), X, y)  # fmt: skip
    coef = np.vstack([e.coef_ for e in ref.estimators_])
    np.testing.assert_allclose(ours.coef_, coef, atol=1e-8)
    proba = ours.predict_proba(X)
    np.testing.assert_allclose(proba, ref.predict_proba(X), atol=1e-8)
    S = expit(X.toarray() @ ours.coef_.T + ours.intercept_)
    np.testing.assert_allclose(proba, S / S.sum(axis=1, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(np.exp(ours.predict_log_proba(X)), proba, rtol=1e-12)
    np.testing.assert_array_equal(ours.predict(X), ref.predict(X))
    sk = ours.to_sklearn()
    assert isinstance(sk, OneVsRestClassifier) and sk.estimators_[0].C == 2.0
    np.testing.assert_allclose(sk.predict_proba(X), proba, rtol=1e-12)
    np.testing.assert_allclose(sk.decision_function(X), ours.decision_function(X), rtol=1e-12,
                               atol=1e-14)  # fmt: skip
    np.testing.assert_array_equal(sk.predict(X), ours.predict(X))
    # the multinomial model (the default) is another model
    multinomial = dl1.LogisticRegression(C=2.0, tol=1e-11, fit_intercept=fit_intercept)
    assert np.abs(multinomial.fit(X, y).predict_proba(X) - proba).max() > 1e-2


def test_class_weights_weigh_every_class_problem():
    """Pass: class_weight="balanced" multiplies each sample's weight by its class's
    (total / (K * class total), scikit-learn's rule) in every class's problem: each row of
    coef_ is liblinear's binary fit of that class with those sample weights."""
    X, y = _problem(seed=4)
    y = np.where(np.arange(len(y)) % 4 == 0, "arts", y)
    ours = dl1.LinearSVC(C=0.5, fit_intercept=False, class_weight="balanced",
                         tol=1e-12).fit(X, y)  # fmt: skip
    counts = np.array([(y == c).sum() for c in NAMES])
    np.testing.assert_allclose(ours.class_weight_, len(y) / (4 * counts), rtol=1e-12)
    sw = ours.class_weight_[np.searchsorted(NAMES, y)]
    for k, label in enumerate(NAMES):
        ref = svm.LinearSVC(penalty="l1", dual=False, C=0.5, fit_intercept=False, tol=1e-8,
                            max_iter=1_000_000)  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref.fit(X, _pm1(y, label), sample_weight=sw)
        np.testing.assert_allclose(ours.coef_[k], ref.coef_[0], atol=1e-6)


def test_two_classes_stay_binary_and_multi_class_is_checked():
    """Pass: with two classes LinearSVC and LogisticRegression(multi_class="ovr") are the
    binary fits (a FitResult, coef_ (1, p)) bit for bit; an unknown multi_class is refused
    naming the parameter."""
    X, y = _problem(K=2, seed=5)
    for make in (dl1.LinearSVC, dl1.LogisticRegression):
        extra = {"multi_class": "ovr"} if make is dl1.LogisticRegression else {}
        est = make(C=0.5, tol=1e-10, **extra).fit(X, y)
        assert isinstance(est.result_, FitResult) and est.coef_.shape == (1, 40)
        assert est.intercept_.shape == (1,) and est.decision_function(X).shape == (300,)
        loss = "logistic" if make is dl1.LogisticRegression else "squared_hinge"
        res = dl1.fit(X, _pm1(y, est.classes_[1]), alpha=1 / (0.5 * 300), loss=loss, tol=1e-10)
        np.testing.assert_array_equal(est.coef_[0], res.coef_)
    with pytest.raises(InvalidParameterError, match="'multi_class' parameter of "
                                                    "LogisticRegression must be"):  # fmt: skip
        dl1.LogisticRegression(multi_class="ova").fit(*_problem(K=3))


def test_grid_search_pipelines_and_cross_validation_choose_as_scikit_learn():
    """Pass: on three classes, GridSearchCV over C picks scikit-learn's C with its mean test
    scores, and cross_val_score of a pipeline gives scikit-learn's scores (LinearSVC against
    liblinear's, LogisticRegression(multi_class="ovr") against a OneVsRestClassifier)."""
    X, y = _problem(K=3, seed=6)
    folds = KFold(3, shuffle=True, random_state=0)
    grid = {"C": [0.05, 0.5, 5.0]}
    ours = GridSearchCV(dl1.LinearSVC(fit_intercept=False, tol=1e-12), grid, cv=folds)
    theirs = GridSearchCV(svm.LinearSVC(penalty="l1", dual=False, fit_intercept=False,
                                        tol=1e-8, max_iter=1_000_000), grid, cv=folds)  # fmt: skip
    ours.fit(X, y)
    _quiet(theirs, X, y)
    assert ours.best_params_ == theirs.best_params_
    np.testing.assert_allclose(ours.cv_results_["mean_test_score"],
                               theirs.cv_results_["mean_test_score"])  # fmt: skip
    pipe = make_pipeline(MaxAbsScaler(), dl1.LogisticRegression(multi_class="ovr", tol=1e-11))
    ref = make_pipeline(MaxAbsScaler(), OneVsRestClassifier(SkLogisticRegression(
        solver="saga", l1_ratio=1.0, tol=1e-12, max_iter=100_000)))  # fmt: skip
    scores = cross_val_score(pipe, X, y, cv=folds)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = cross_val_score(ref, X, y, cv=folds)
    np.testing.assert_allclose(scores, expected)


def test_a_three_class_store_fits_on_a_cluster_and_predicts_lazily(local_cluster, tmp_path):
    """Pass: LinearSVC and LogisticRegression(multi_class="ovr") fitted on a 3-class
    E2006-like store, streamed on a 2-worker LocalCluster, equal the in-memory fits on its
    rows to 1e-7; their predictions on the store are lazy dask arrays equal to the
    in-memory model's."""
    store = dl1.datasets.make_e2006_like(tmp_path / "m.zarr", "small", task="multiclass",
                                         n_classes=3, test_fraction=0.1)  # fmt: skip
    X = store.to_dask("train").compute().tocsr()
    y = store.read("y")
    Xt = store.to_dask("test").compute().tocsr()
    for make in (lambda **kw: dl1.LinearSVC(C=0.01, tol=1e-8, **kw),
                 lambda **kw: dl1.LogisticRegression(C=0.05, multi_class="ovr", tol=1e-8,
                                                     **kw)):  # fmt: skip
        mem = make().fit(X, y)
        ooc = make(client=local_cluster, stream=True).fit(store)
        np.testing.assert_array_equal(ooc.classes_, [0.0, 1.0, 2.0])
        assert 0 < np.count_nonzero(ooc.coef_) < 0.1 * ooc.coef_.size
        np.testing.assert_allclose(ooc.coef_, mem.coef_, atol=1e-7)
        np.testing.assert_allclose(ooc.intercept_, mem.intercept_, atol=1e-7)
        lazy = ooc.predict(store)
        assert isinstance(lazy, da.Array)
        with dask.config.set(scheduler=local_cluster.get):
            np.testing.assert_array_equal(lazy.compute(), mem.predict(Xt))
            d = ooc.decision_function(store).compute()
            assert ooc.score(store) == pytest.approx(mem.score(Xt, store.read("y", "test")))
        np.testing.assert_allclose(d, mem.decision_function(Xt), rtol=1e-9, atol=1e-12)
