"""dl1's estimators in scikit-learn workflows, against scikit-learn's own estimators."""

from __future__ import annotations

import pickle

import dask
import dask.array as da
import joblib
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from sklearn import linear_model, svm
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV, KFold, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.class_weight import compute_class_weight

import dl1
from dl1.estimators import ElasticNet, Lasso, LinearSVC, LogisticRegression
from dl1.params import InvalidParameterError
from tests.helpers import task_stream


@pytest.fixture(autouse=True)
def in_process():
    """No current Dask client unless a test passes one (dl1 then runs in this process)."""
    with dask.config.set(scheduler="sync"):
        yield


def regression(n=80, p=12, seed=0, sparse=False):
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=0.5, format="csr", random_state=rng) if sparse else \
        rng.standard_normal((n, p))
    w = np.where(rng.random(p) < 0.5, rng.standard_normal(p), 0.0)
    return X, X @ w + 0.5 + 0.1 * rng.standard_normal(n)


def classification(n=80, p=6, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p))
    return X, np.where(X[:, 0] - 0.5 * X[:, 1] + 0.5 * rng.standard_normal(n) > 0.3, 1, -1)


# -- the objective is scikit-learn's -----------------------------------------------------------
@pytest.mark.parametrize("weighted", [False, True])
def test_regressors_equal_sklearns(weighted):
    """Pass: coef_ and intercept_ equal scikit-learn's Lasso / ElasticNet (tol 1e-12) to
    1e-8, with and without sample weights, and dual_gap_ is the absolute gap (gap_ * P(0))."""
    X, y = regression()
    sw = np.random.default_rng(1).uniform(0.2, 3, X.shape[0]) if weighted else None
    for ours, ref in [
        (Lasso(alpha=0.05, tol=1e-12), linear_model.Lasso(alpha=0.05)),
        (ElasticNet(alpha=0.05, l1_ratio=0.3, tol=1e-14),
         linear_model.ElasticNet(alpha=0.05, l1_ratio=0.3)),
    ]:
        ours.fit(X, y, sample_weight=sw)
        ref.set_params(tol=1e-14, max_iter=1_000_000).fit(X, y, sample_weight=sw)
        np.testing.assert_allclose(ours.coef_, ref.coef_, atol=1e-8)
        assert ours.intercept_ == pytest.approx(ref.intercept_, abs=1e-8)
        assert ours.dual_gap_ == pytest.approx(ours.gap_ * ours.result_.p0_, rel=1e-9)
        np.testing.assert_allclose(ours.predict(X), ref.predict(X), atol=1e-8)
        assert ours.score(X, y, sw) == pytest.approx(ref.score(X, y, sw), abs=1e-10)


@pytest.mark.parametrize("weighted", [False, True])
def test_logistic_regression_equals_sklearns_saga(weighted):
    """Pass: LogisticRegression(C) equals scikit-learn's L1 LogisticRegression (saga, intercept
    unpenalised, tol 1e-12) to 1e-6, weighted too (alpha = 1 / (C sum s)); predict_proba
    equals scikit-learn's."""
    X, y = classification()
    sw = np.random.default_rng(2).uniform(0.2, 3, X.shape[0]) if weighted else None
    ours = LogisticRegression(C=0.3, tol=1e-12).fit(X, y, sample_weight=sw)
    ref = linear_model.LogisticRegression(l1_ratio=1.0, C=0.3, solver="saga", tol=1e-12,
                                          max_iter=100_000).fit(X, y, sample_weight=sw)
    assert 0 < np.count_nonzero(ours.coef_) < X.shape[1]
    np.testing.assert_allclose(ours.coef_, ref.coef_, atol=1e-6)
    np.testing.assert_allclose(ours.intercept_, ref.intercept_, atol=1e-6)
    np.testing.assert_allclose(ours.predict_proba(X), ref.predict_proba(X), atol=1e-6)
    np.testing.assert_allclose(np.exp(ours.predict_log_proba(X)), ours.predict_proba(X))


def test_linear_svc_equals_liblinear_without_intercept_and_elastic_net_is_dl1_fit():
    """Pass: LinearSVC (squared hinge, L1, no intercept) equals liblinear's L1 LinearSVC to
    1e-6; LinearSVC(loss="hinge", penalty="elasticnet") equals dl1.fit's hinge fit (solver
    auto) bit for bit; l1_ratio without penalty="elasticnet", or missing with it, is refused."""
    X, y = classification(seed=3)
    ours = LinearSVC(C=0.2, fit_intercept=False, tol=1e-12).fit(X, y)
    ref = svm.LinearSVC(penalty="l1", dual=False, C=0.2, fit_intercept=False, tol=1e-10,
                        max_iter=100_000).fit(X, y)
    np.testing.assert_allclose(ours.coef_, ref.coef_, atol=1e-6)
    hinge = LinearSVC("elasticnet", "hinge", C=0.2, l1_ratio=0.5, tol=1e-3).fit(X, y)
    res = dl1.fit(X, y.astype(float), alpha=1 / (0.2 * len(y)), l1_ratio=0.5, loss="hinge",
                  solver="auto", tol=1e-3)
    np.testing.assert_array_equal(hinge.coef_.ravel(), res.coef_)
    with pytest.raises(InvalidParameterError, match="l1_ratio=0.5 is only used"):
        LinearSVC(l1_ratio=0.5).fit(X, y)
    with pytest.raises(InvalidParameterError, match="needs l1_ratio"):
        LogisticRegression(penalty="elasticnet").fit(X, y)


@pytest.mark.parametrize("labels", [("no", "yes"), (0, 1), (False, True), (3, 7)])
def test_any_two_labels_give_the_same_model(labels):
    """Pass: labels as strings, {0, 1}, bools or other ints give the -1/+1 fit's coefficients
    exactly, classes_ sorted, predictions in the original labels (classes_[1] where the
    decision is > 0)."""
    X, y = classification(seed=4)
    y_lab = np.where(y > 0, labels[1], labels[0])
    base = LogisticRegression(C=1.0, tol=1e-10).fit(X, y)
    clf = LogisticRegression(C=1.0, tol=1e-10).fit(X, y_lab.tolist())
    np.testing.assert_array_equal(clf.classes_, np.array(labels))
    np.testing.assert_array_equal(clf.coef_, base.coef_)
    expected = np.where(clf.decision_function(X) > 0, labels[1], labels[0])
    np.testing.assert_array_equal(clf.predict(X), expected)
    assert clf.score(X, y_lab) == base.score(X, y)


@pytest.mark.parametrize("class_weight", ["balanced", {"no": 3.0}, {"no": 0.5, "yes": 2.0}])
@pytest.mark.parametrize("weighted", [False, True])
def test_class_weight_equals_sklearns(class_weight, weighted):
    """Pass: LogisticRegression(class_weight) equals scikit-learn's saga fit with the same
    class_weight (and sample weights) to 1e-6, on imbalanced string labels; class_weight_
    is scikit-learn's compute_class_weight (weighted); LinearSVC(class_weight) equals
    liblinear's without intercept to 1e-6."""
    X, y = classification(n=120, seed=5)
    y = np.where(y > 0, "yes", "no")
    assert 0.2 < np.mean(y == "yes") < 0.4  # imbalanced: "balanced" weighs the classes apart
    sw = np.random.default_rng(6).uniform(0.5, 2, len(y)) if weighted else None
    ours = LogisticRegression(C=0.3, tol=1e-12, class_weight=class_weight)
    ours.fit(X, y, sample_weight=sw)
    ref = linear_model.LogisticRegression(
        l1_ratio=1.0, C=0.3, solver="saga", tol=1e-11, max_iter=1_000_000,
        class_weight=class_weight,
    )  # fmt: skip
    ref.fit(X, y, sample_weight=sw)
    expected = compute_class_weight(class_weight, classes=ours.classes_, y=y, sample_weight=sw)
    np.testing.assert_allclose(ours.class_weight_, expected, rtol=1e-12)
    np.testing.assert_allclose(ours.coef_, ref.coef_, atol=1e-6)
    np.testing.assert_allclose(ours.intercept_, ref.intercept_, atol=1e-6)
    svc = LinearSVC(C=0.2, fit_intercept=False, tol=1e-12, class_weight=class_weight)
    svc.fit(X, y, sample_weight=sw)
    lib = svm.LinearSVC(penalty="l1", dual=False, C=0.2, fit_intercept=False, tol=1e-10,
                        max_iter=100_000, class_weight=class_weight)  # fmt: skip
    np.testing.assert_allclose(svc.coef_, lib.fit(X, y, sample_weight=sw).coef_, atol=1e-6)


def test_class_weight_out_of_core_in_cv_and_refused():
    """Pass: class weights on a dask array give the in-memory fit (1e-9);
    LogisticRegressionCV(class_weight) refits as LogisticRegression(C=C_, class_weight)
    (1e-9); n_jobs is accepted by the estimators scikit-learn gives it; a class_weight key
    that is no class, a class weighing 0 and a non-dict are refused by name."""
    X, y = classification(n=120, seed=5)
    mem = LogisticRegression(C=0.5, tol=1e-12, class_weight="balanced", n_jobs=4).fit(X, y)
    Xd = da.from_array(sp.csr_matrix(X), chunks=(40, 3), asarray=False)
    ooc = LogisticRegression(C=0.5, tol=1e-12, class_weight="balanced").fit(Xd, y)
    np.testing.assert_allclose(ooc.coef_, mem.coef_, atol=1e-9)
    np.testing.assert_array_equal(ooc.class_weight_, mem.class_weight_)
    cv = dl1.LogisticRegressionCV(Cs=4, cv=3, class_weight={1: 2.0}, tol=1e-10, n_jobs=-1)
    cv.fit(X, y)
    refit = LogisticRegression(C=float(cv.C_[0]), class_weight={1: 2.0}, tol=1e-10).fit(X, y)
    np.testing.assert_allclose(cv.coef_, refit.coef_, atol=1e-9)
    for est in (dl1.LassoCV(n_jobs=2), dl1.ElasticNetCV(n_jobs=None)):
        assert est.get_params()["n_jobs"] in (2, None)
    with pytest.raises(ValueError, match="not in class_weight|not.*class"):
        LogisticRegression(class_weight={7: 2.0}).fit(X, y)
    with pytest.raises(ValueError, match="only one class has positive sample_weight"):
        LogisticRegression(class_weight={1: 0.0}).fit(X, y)
    with pytest.raises(InvalidParameterError, match="'class_weight' parameter.*balanced"):
        LogisticRegression(class_weight="equal").fit(X, y)
    with pytest.raises(InvalidParameterError, match="'n_jobs' parameter"):
        LogisticRegression(n_jobs="all").fit(X, y)


def test_one_class_more_than_two_and_unknown_parameters_are_refused():
    X, y = classification()
    with pytest.raises(ValueError, match="only one class: 'a'"):
        LinearSVC().fit(X, np.full(len(y), "a"))
    three = np.arange(len(y)) % 3
    assert LinearSVC().fit(X, three).coef_.shape == (3, X.shape[1])  # one-vs-rest
    assert dl1.LogisticRegressionCV(Cs=2).fit(X, three).coef_.shape == (3, X.shape[1])
    with pytest.raises(ValueError, match="Invalid parameter 'l1_ratio' for estimator Lasso"):
        Lasso().set_params(l1_ratio=0.5)
    with pytest.raises(InvalidParameterError, match="'alpha' parameter of Lasso must be"):
        Lasso(alpha=-1.0).fit(*regression())
    with pytest.raises(InvalidParameterError, match="'max_iter' parameter of ElasticNet"):
        ElasticNet(max_iter=-2).fit(*regression())


# -- scikit-learn's tools ------------------------------------------------------------------------
def test_grid_search_and_cross_val_score_agree_with_sklearn():
    """Pass: GridSearchCV over alpha (5 folds) picks scikit-learn's Lasso's alpha with the
    same mean test scores to 1e-8; cross_val_score equals scikit-learn's to 1e-8."""
    X, y = regression(n=100, seed=5)
    grid = {"alpha": [0.3, 0.1, 0.03, 0.01, 0.003]}
    cv = KFold(5, shuffle=True, random_state=0)
    ours = GridSearchCV(Lasso(tol=1e-12), grid, cv=cv).fit(X, y)
    ref = GridSearchCV(linear_model.Lasso(tol=1e-12, max_iter=100_000), grid, cv=cv).fit(X, y)
    assert ours.best_params_ == ref.best_params_
    np.testing.assert_allclose(ours.cv_results_["mean_test_score"],
                               ref.cv_results_["mean_test_score"], atol=1e-8)
    np.testing.assert_allclose(cross_val_score(ElasticNet(0.1, tol=1e-12), X, y, cv=cv),
                               cross_val_score(linear_model.ElasticNet(0.1, tol=1e-12), X, y,
                                               cv=cv), atol=1e-8)


def test_pipeline_with_a_scaler_on_sparse_input_equals_sklearns():
    """Pass: StandardScaler(with_mean=False) then Lasso on CSR input gives scikit-learn's
    pipeline's predictions to 1e-8."""
    X, y = regression(sparse=True, seed=6)
    ours = make_pipeline(StandardScaler(with_mean=False), Lasso(0.05, tol=1e-12)).fit(X, y)
    ref = make_pipeline(StandardScaler(with_mean=False),
                        linear_model.Lasso(0.05, tol=1e-12, max_iter=100_000)).fit(X, y)
    np.testing.assert_allclose(ours.predict(X), ref.predict(X), atol=1e-8)


def test_pandas_input_sets_feature_names_and_int_input_is_float():
    """Pass: a DataFrame fit records feature_names_in_ and equals the NumPy fit; an int
    array fits as its float64 copy; a refit on NumPy forgets the names."""
    X, y = regression(seed=7)
    df = pd.DataFrame(X, columns=[f"f{j}" for j in range(X.shape[1])])
    est = Lasso(0.05).fit(df, pd.Series(y))
    np.testing.assert_array_equal(est.feature_names_in_, df.columns)
    np.testing.assert_array_equal(est.coef_, Lasso(0.05).fit(X, y).coef_)
    Xi = np.round(3 * X).astype(np.int64)
    np.testing.assert_array_equal(est.fit(Xi, y).coef_, Lasso(0.05).fit(Xi.astype(float), y).coef_)
    assert not hasattr(est, "feature_names_in_")


def test_warm_start_starts_from_the_previous_solution():
    """Pass: refitting with warm_start=True on the same data is certified at round 0 (the
    previous solution already meets tol) with the same coefficients; without it, it is not."""
    X, y = regression(seed=8)
    est = Lasso(0.02, tol=1e-10, warm_start=True).fit(X, y)
    first = est.coef_.copy()
    assert est.n_iter_ > 0
    assert est.fit(X, y).n_iter_ == 0
    np.testing.assert_allclose(est.coef_, first, atol=1e-12)
    assert est.set_params(warm_start=False).fit(X, y).n_iter_ > 0


def test_clone_and_pickle_round_trips():
    """Pass: clone keeps the parameters and drops the fit; pickle and joblib round trips
    predict identically and keep every fitted attribute."""
    X, y = classification(seed=9)
    est = LogisticRegression(C=0.5, tol=1e-8).fit(X, y)
    c = clone(est)
    assert c.get_params() == est.get_params() and not hasattr(c, "coef_")
    for copy in (pickle.loads(pickle.dumps(est)), joblib.load(_dumped(est))):
        np.testing.assert_array_equal(copy.predict_proba(X), est.predict_proba(X))
        np.testing.assert_array_equal(copy.classes_, est.classes_)
        assert copy.result_.gap_ == est.result_.gap_


def _dumped(est, path=None):
    import io

    buf = io.BytesIO()
    joblib.dump(est, buf)
    buf.seek(0)
    return buf


def test_a_client_is_shared_by_clone_and_left_out_of_pickles(local_cluster):
    """Pass: an estimator fitted with client= on a 2-process LocalCluster (tasks ran there)
    equals the in-process fit; clone shares the client; its pickle has no client and
    predicts identically in this process."""
    X, y = regression(seed=10, sparse=True)
    with task_stream(local_cluster) as stream:
        est = Lasso(0.02, tol=1e-8, client=local_cluster).fit(X, y)
    assert len(stream.data) > 0
    np.testing.assert_array_equal(est.coef_, Lasso(0.02, tol=1e-8).fit(X, y).coef_)
    assert clone(est).client is local_cluster
    copy = pickle.loads(pickle.dumps(est))
    assert copy.client is None and est.client is local_cluster
    np.testing.assert_array_equal(copy.predict(X), est.predict(X))


# -- out of core ---------------------------------------------------------------------------------
def test_dask_input_fits_as_in_memory_and_predicts_lazily():
    """Pass: on a dask array of CSR chunks (3 x 2 chunks) the fit equals the in-memory one;
    predict, decision_function and predict_proba are lazy dask arrays equal to the in-memory
    predictions; labels stay the estimator's; score takes dask y."""
    X, y = classification(n=90, seed=11)
    Xs = sp.csr_matrix(X)
    Xd = da.from_array(Xs, chunks=(30, 3), asarray=False)
    y_lab = np.where(y > 0, "pos", "neg")
    ours = LogisticRegression(C=0.5, tol=1e-10).fit(Xd, y_lab)
    mem = LogisticRegression(C=0.5, tol=1e-10).fit(Xs, y_lab)
    np.testing.assert_allclose(ours.coef_, mem.coef_, atol=1e-12)
    assert ours.n_features_in_ == X.shape[1]
    for method in ("predict", "decision_function", "predict_proba"):
        lazy = getattr(ours, method)(Xd)
        assert isinstance(lazy, da.Array), method
        expected = getattr(ours, method)(Xs)
        if method == "predict":
            np.testing.assert_array_equal(lazy.compute(), expected)
        else:
            np.testing.assert_allclose(lazy.compute(), expected, rtol=1e-12, atol=1e-14)
    assert ours.score(Xd, da.from_array(y_lab, chunks=30)) == mem.score(Xs, y_lab)
    reg = Lasso(0.02, tol=1e-10).fit(Xd, da.from_array(X[:, 0], chunks=30))
    assert isinstance(reg.predict(Xd), da.Array)


def test_stores_fit_with_their_own_labels_any_two(tmp_path):
    """Pass: a classifier fitted on a store path with labels -1/+1 (y read by dl1.fit) equals
    the in-memory fit, has classes_ [-1, 1] and predicts lazily on the store's test split;
    a store whose labels are 0/1 fits as the in-memory 0/1 labels do (classes_ [0, 1],
    coefficients and predictions), with class_weight too; three stored labels are refused."""
    X, y = classification(n=60, seed=12)
    Xs = sp.csr_matrix(X)
    dl1.from_scipy(Xs, y.astype(float), tmp_path / "pm.zarr", X_test=Xs[:20],
                   y_test=y[:20].astype(float))
    est = LogisticRegression(C=0.5, tol=1e-10).fit(str(tmp_path / "pm.zarr"))
    np.testing.assert_array_equal(est.classes_, [-1.0, 1.0])
    np.testing.assert_allclose(est.coef_, LogisticRegression(C=0.5, tol=1e-10).fit(X, y).coef_,
                               atol=1e-12)
    lazy = est.predict(str(tmp_path / "pm.zarr"))
    assert isinstance(lazy, da.Array)
    np.testing.assert_array_equal(lazy.compute(), est.predict(Xs[:20]))
    assert est.score(str(tmp_path / "pm.zarr")) == est.score(Xs[:20], y[:20])
    y01 = (y > 0).astype(float)
    dl1.from_scipy(Xs, y01, tmp_path / "01.zarr", X_test=Xs[:20], y_test=y01[:20])
    for cw in (None, "balanced"):
        on_store = LogisticRegression(C=0.5, tol=1e-10, class_weight=cw).fit(tmp_path / "01.zarr")
        in_memory = LogisticRegression(C=0.5, tol=1e-10, class_weight=cw).fit(X, y01)
        np.testing.assert_array_equal(on_store.classes_, [0.0, 1.0])
        np.testing.assert_allclose(on_store.coef_, in_memory.coef_, atol=1e-12)
        np.testing.assert_array_equal(on_store.class_weight_, in_memory.class_weight_)
        stored_pred = on_store.predict(str(tmp_path / "01.zarr")).compute()
        np.testing.assert_array_equal(stored_pred, in_memory.predict(X[:20]))
        assert on_store.score(str(tmp_path / "01.zarr")) == in_memory.score(X[:20], y01[:20])
    dl1.from_scipy(Xs, np.arange(60.0) % 3, tmp_path / "three.zarr")
    for est in (LinearSVC(), LogisticRegression()):  # one-vs-rest, the multinomial model
        three = est.fit(tmp_path / "three.zarr")
        np.testing.assert_array_equal(three.classes_, [0.0, 1.0, 2.0])
        assert three.coef_.shape == (3, Xs.shape[1])


def test_a_dataset_and_its_row_views_fit_as_the_rows_in_memory():
    """Pass: a classifier fitted on a dl1.Dataset (labels -1/+1 held with it) equals the
    in-memory fit, and on a row view (alpha from the view's row count) the fit on those rows
    to 1e-8; predictions on the Dataset come from its blocks."""
    X, y = classification(n=60, seed=13)
    Xs = sp.csr_matrix(X)
    with dl1.persist(da.from_array(Xs, chunks=(30, 3), asarray=False), y.astype(float)) as ds:
        est = LogisticRegression(C=0.5, tol=1e-10).fit(ds)
        mem = LogisticRegression(C=0.5, tol=1e-10).fit(X, y)
        np.testing.assert_array_equal(est.classes_, [-1.0, 1.0])
        np.testing.assert_allclose(est.coef_, mem.coef_, atol=1e-12)
        # predicted from the blocks the Dataset holds (no read of the data again)
        np.testing.assert_array_equal(est.predict(ds), mem.predict(X))
        assert est.score(ds) == mem.score(X, y)
        view = LogisticRegression(C=0.5, tol=1e-12).fit(ds[np.arange(40)])
        rows = LogisticRegression(C=0.5, tol=1e-12).fit(X[:40], y[:40])
        np.testing.assert_allclose(view.coef_, rows.coef_, atol=1e-8)


def test_estimators_have_sparse_coef_and_to_sklearn_with_their_classes():
    """Pass: sparse_coef_ is coef_ as a sparse row; to_sklearn() is on the estimator itself
    and a classifier's keeps its own classes (strings here), predicting as it does."""
    X, y = regression(seed=3, sparse=True)
    reg = Lasso(alpha=0.05).fit(X, y)
    assert sp.issparse(reg.sparse_coef_)
    np.testing.assert_array_equal(reg.sparse_coef_.toarray().ravel(), reg.coef_)
    np.testing.assert_allclose(reg.to_sklearn().predict(X), reg.predict(X), rtol=1e-12)
    labels = np.where(y > np.median(y), "spam", "ham")
    clf = LogisticRegression(C=5.0).fit(X, labels)
    assert clf.sparse_coef_.shape == (1, X.shape[1])
    sk = clf.to_sklearn()
    np.testing.assert_array_equal(sk.classes_, clf.classes_)
    np.testing.assert_array_equal(sk.predict(X), clf.predict(X))


def test_a_fit_that_stops_early_names_the_estimators_own_parameter():
    """Pass: Lasso(max_iter=0) warns "raise max_iter", the estimator's parameter, not
    dl1.fit's max_rounds."""
    X, y = regression(seed=4)
    with pytest.warns(dl1.ConvergenceWarning, match="raise max_iter or tol") as rec:
        Lasso(alpha=1e-4, max_iter=0, tol=1e-10).fit(X, y)
    assert not any("max_rounds" in str(w.message) for w in rec)
