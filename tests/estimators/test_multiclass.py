"""dl1.LogisticRegression with more than two classes: scikit-learn's multinomial model,
its attributes and predictions, in scikit-learn's model selection, in memory and out of
core."""

from __future__ import annotations

import warnings

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
from scipy.special import logsumexp
from sklearn.linear_model import LogisticRegression as SkLogisticRegression
from sklearn.model_selection import GridSearchCV, KFold, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import MaxAbsScaler

import dl1

NAMES = np.array(["arts", "games", "science", "sports"])


def _problem(n=320, p=60, K=4, seed=0):
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=0.2, random_state=seed + 1, format="csr")
    W = rng.standard_normal((p, K)) * (rng.random((p, 1)) < 0.3) * 3
    return X, NAMES[np.argmax(X @ W + rng.gumbel(size=(n, K)), axis=1)]


def _objective(X, y, coef, intercept, alpha, l1_ratio):
    """scikit-learn's multinomial objective divided by ``n C``, written independently."""
    Z = X @ coef.T + intercept
    codes = np.searchsorted(NAMES, y)
    ce = (logsumexp(Z, axis=1) - Z[np.arange(X.shape[0]), codes]).mean()
    return ce + alpha * (l1_ratio * np.abs(coef).sum() + 0.5 * (1 - l1_ratio) * (coef**2).sum())


def _saga(**kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # saga's own warning at max_iter
        return SkLogisticRegression(solver="saga", tol=1e-12, max_iter=100000, **kw)


@pytest.mark.parametrize("params", [{"C": 1.0}, {"penalty": "elasticnet", "l1_ratio": 0.5,
                                                  "C": 3.0}])  # fmt: skip
def test_multinomial_predictions_match_scikit_learn(params):
    X, y = _problem()
    est = dl1.LogisticRegression(tol=1e-10, **params).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rest = {k: v for k, v in params.items() if k != "penalty"}
        sk = _saga(**{"l1_ratio": 1.0, **rest}).fit(X, y)
    np.testing.assert_array_equal(est.classes_, NAMES)
    assert est.coef_.shape == (4, 60) and est.intercept_.shape == (4,)
    assert est.gap_ <= 1e-10 and est.n_iter_ >= 1
    proba = est.predict_proba(X)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)
    # the objective within the certified gap of saga's; the probabilities as close as a flat
    # objective allows (a relative gap of 1e-10 bounds ||dW||^2 by 2 gap / (alpha (1 - l1_ratio))
    # with the elastic net: ~1e-4 here)
    n, r = X.shape[0], params.get("l1_ratio", 1.0)
    ours, theirs = (_objective(X, y, m.coef_, m.intercept_, 1 / (n * params["C"]), r)
                    for m in (est, sk))  # fmt: skip
    assert ours - est.result_.dual_ >= 0 and theirs >= est.result_.dual_
    assert ours <= theirs + (ours - est.result_.dual_)
    np.testing.assert_allclose(proba, sk.predict_proba(X), atol=1e-4)
    np.testing.assert_allclose(np.exp(est.predict_log_proba(X)), proba, rtol=1e-10)
    assert est.decision_function(X).shape == (320, 4)
    np.testing.assert_array_equal(est.predict(X), NAMES[np.argmax(proba, axis=1)])
    assert est.score(X, y) == pytest.approx(np.mean(est.predict(X) == y))
    np.testing.assert_allclose(est.to_sklearn().predict_proba(X), proba, rtol=1e-12)


@pytest.mark.slow
def test_grid_search_and_pipelines_choose_as_with_scikit_learn():
    X, y = _problem(seed=1)
    folds = KFold(3, shuffle=True, random_state=0)
    grid = {"C": [0.3, 3.0]}
    ours = GridSearchCV(dl1.LogisticRegression(tol=1e-9), grid, cv=folds).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = GridSearchCV(_saga(l1_ratio=1.0), grid, cv=folds).fit(X, y)
    assert ours.best_params_ == theirs.best_params_
    np.testing.assert_allclose(ours.cv_results_["mean_test_score"],
                               theirs.cv_results_["mean_test_score"])  # fmt: skip
    scores = cross_val_score(make_pipeline(MaxAbsScaler(), dl1.LogisticRegression(tol=1e-9)),
                             X, y, cv=folds)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = cross_val_score(make_pipeline(MaxAbsScaler(), _saga(l1_ratio=1.0)), X, y,
                              cv=folds)  # fmt: skip
    np.testing.assert_allclose(scores, ref)


def test_a_store_on_a_cluster_gives_the_in_memory_model_and_lazy_predictions(
    local_cluster, tmp_path
):
    X, y = _problem(seed=2)
    codes = np.searchsorted(NAMES, y).astype(float)
    store = dl1.from_scipy(X, codes, tmp_path / "mc.zarr")
    mem = dl1.LogisticRegression(tol=1e-10).fit(X, codes)
    ooc = dl1.LogisticRegression(tol=1e-10, client=local_cluster, stream=True).fit(store)
    np.testing.assert_array_equal(ooc.classes_, [0.0, 1.0, 2.0, 3.0])
    np.testing.assert_allclose(ooc.coef_, mem.coef_, atol=1e-7)
    Xd = store.to_dask("train")
    proba = ooc.predict_proba(Xd)
    pred = ooc.predict(Xd)
    assert isinstance(proba, da.Array) and isinstance(pred, da.Array)
    np.testing.assert_allclose(proba.compute(), mem.predict_proba(X), atol=1e-7)
    np.testing.assert_array_equal(pred.compute(), mem.predict(X))


def test_balanced_class_weights_match_scikit_learn():
    X, y = _problem(seed=3)
    y = np.where(np.arange(len(y)) % 5 == 0, "arts", y)  # one class more frequent
    sw = np.random.default_rng(4).uniform(0.5, 2.0, len(y))
    est = dl1.LogisticRegression(class_weight="balanced", tol=1e-10).fit(X, y, sw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sk = _saga(l1_ratio=1.0, class_weight="balanced").fit(X, y, sample_weight=sw)
    per_class = np.array([sw[y == c].sum() for c in NAMES])
    np.testing.assert_allclose(est.class_weight_, sw.sum() / (4 * per_class), rtol=1e-12)
    np.testing.assert_allclose(est.predict_proba(X), sk.predict_proba(X), atol=1e-6)


@pytest.mark.parametrize("make", [
    lambda **kw: dl1.LogisticRegression(tol=1e-9, **kw),
    lambda **kw: dl1.LogisticRegression(tol=1e-9, multi_class="ovr", **kw),
    lambda **kw: dl1.LinearSVC(tol=1e-9, **kw),
])  # fmt: skip
def test_warm_start_continues_from_the_last_fit_of_the_same_classes(make):
    X, y = _problem(seed=5)
    est = make(C=0.5, warm_start=True).fit(X, y)
    first = est.coef_.copy()
    est.set_params(C=1.0).fit(X, y)
    cold = make(C=1.0).fit(X, y)
    assert est.result_.gap_ <= 1e-9
    scores = "predict_proba" if hasattr(est, "predict_proba") else "decision_function"
    np.testing.assert_allclose(getattr(est, scores)(X), getattr(cold, scores)(X), atol=1e-5)
    # the start is the last fit: refitting at the same C certifies at its first pass
    # (rounds counted as the solvers count them: the multinomial one's records from 1)
    again = est.fit(X, y)
    assert again.n_iter_ == (1 if again.result_.multi_class == "multinomial" else 0)
    # other classes: a cold start (as a fresh estimator's)
    fresh = make(C=1.0).fit(X[:200], np.where(y[:200] == "arts", "games", y[:200]))
    other = est.fit(X[:200], np.where(y[:200] == "arts", "games", y[:200]))
    np.testing.assert_allclose(other.coef_, fresh.coef_, atol=1e-12)
    assert not np.array_equal(first, other.coef_)


def test_what_the_multiclass_fit_does_not_take_yet_is_refused():
    X, y = _problem()
    with pytest.raises(ValueError, match="screen=True is not supported with more"):
        dl1.LogisticRegression(screen=True).fit(X, y)
    with pytest.raises(ValueError, match="screen=True is not supported with more"):
        dl1.LinearSVC(screen=True).fit(X, y)
    with pytest.raises(ValueError, match="LinearSVC: loss='hinge' with more than two classes "
                                         r"\(one-vs-rest\) takes penalty='l1' only"):  # fmt: skip
        dl1.LinearSVC("elasticnet", "hinge", l1_ratio=0.5).fit(X, y)
