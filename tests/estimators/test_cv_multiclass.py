"""dl1.LogisticRegressionCV with more than two classes: the multinomial model's folds,
scores, choice of C and refit, against scikit-learn's LogisticRegressionCV (saga, L1 or
elastic net, the same folds)."""

from __future__ import annotations

import warnings

import dask
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn import linear_model as sk
from sklearn.model_selection import StratifiedKFold

import dl1
from dl1.errors import GridEdgeWarning

NAMES = np.array(["arts", "games", "science"])


def _problem(n=240, p=20, seed=0):
    """Three classes drawn from a sparse multinomial model."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p))
    W = np.zeros((3, p))
    W[:, :5] = 1.5 * rng.standard_normal((3, 5))
    return X, NAMES[np.argmax(X @ W.T + rng.gumbel(size=(n, 3)), axis=1)]


@pytest.fixture(autouse=True)
def in_process():
    with dask.config.set(scheduler="sync"):
        yield


def _sklearn_cv(X, y, sample_weight=None, tol=1e-12, **kw):
    """scikit-learn's fit (saga to a tight tol)."""
    est = sk.LogisticRegressionCV(solver="saga", tol=tol, max_iter=100_000, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # saga's at max_iter, the attributes' deprecation
        return est.fit(X, y, sample_weight=sample_weight)


def _prior_log_loss(y, folds):
    """The held-out neg_log_loss of the model with W = 0 on each fold (its intercepts the
    log training frequencies: the softmax is the training classes' frequencies)."""
    out = []
    for train, test in folds:
        freq = np.array([np.mean(y[train] == c) for c in NAMES])
        out.append(np.mean(np.log(freq[np.searchsorted(NAMES, y[test])])))
    return np.array(out)


def _prior_accuracy(y, folds):
    """The held-out accuracy of the model with W = 0 on each fold: it predicts the
    training rows' most frequent class (unique on these folds, checked)."""
    out = []
    for train, test in folds:
        counts = np.array([np.sum(y[train] == c) for c in NAMES])
        assert np.sum(counts == counts.max()) == 1
        out.append(np.mean(y[test] == NAMES[np.argmax(counts)]))
    return np.array(out)


@pytest.mark.parametrize("scoring", [None, "neg_log_loss"])
def test_multinomial_cv_matches_scikit_learn(scoring):
    X, y = _problem()
    cv = StratifiedKFold(4)
    Cs = np.logspace(-3, 2, 6)  # saga's time grows with C: up to 100, not 1e4
    ours = dl1.LogisticRegressionCV(Cs=Cs, cv=cv, scoring=scoring, tol=1e-10).fit(X, y)
    ref = _sklearn_cv(X, y, Cs=Cs, cv=cv, scoring=scoring, l1_ratios=(1.0,), random_state=0)
    np.testing.assert_array_equal(ours.classes_, ref.classes_)
    np.testing.assert_allclose(ours.Cs_, ref.Cs_)
    np.testing.assert_array_equal(ours.C_, ref.C_)  # one per class, as scikit-learn's
    assert ours.C_.shape == ours.l1_ratio_.shape == (3,)
    assert set(ours.scores_) == set(NAMES)
    got, want = ours.scores_["games"], ref.scores_["games"][..., 0]  # (folds, Cs)
    # saga leaves the intercepts of the empty model (the smallest Cs) short of their optimum
    # (its step is scaled by C; where they stop depends on its random sample order, and
    # with them the class it predicts): there the reference is the empty model's exact score
    paths = np.stack(list(ref.coefs_paths_.values()))  # (K, folds, Cs, 1, p + 1)
    empty = np.all(paths[..., :-1] == 0, axis=(0, 3, 4))  # (folds, Cs)
    exact = _prior_log_loss if scoring == "neg_log_loss" else _prior_accuracy
    prior = np.broadcast_to(exact(y, list(cv.split(X, y)))[:, None], got.shape)
    want = np.where(empty, prior, want)
    assert empty.any() and not empty.all()
    np.testing.assert_allclose(got, want, atol=1e-7)
    assert ours.coef_.shape == (3, X.shape[1])
    np.testing.assert_allclose(ours.coef_, ref.coef_, atol=1e-7)
    np.testing.assert_allclose(ours.intercept_, ref.intercept_, atol=1e-7)
    np.testing.assert_allclose(ours.predict_proba(X), ref.predict_proba(X), atol=1e-7)
    np.testing.assert_array_equal(ours.predict(X), ref.predict(X))
    assert ours.result_.gap_ <= 1e-10 and ours.alpha_ == 1.0 / (ours.C_[0] * len(y))


def test_several_l1_ratios_choose_as_scikit_learn():
    X, y = _problem(seed=1)
    cv = StratifiedKFold(3)
    ours = dl1.LogisticRegressionCV(Cs=[0.05, 0.3, 2.0], l1_ratios=[0.3, 1.0], cv=cv,
                                    tol=1e-10).fit(X, y)  # fmt: skip
    ref = _sklearn_cv(X, y, Cs=[0.05, 0.3, 2.0], l1_ratios=[0.3, 1.0], cv=cv)
    np.testing.assert_array_equal(ours.C_, ref.C_)
    np.testing.assert_array_equal(ours.l1_ratio_, ref.l1_ratio_)
    assert ours.scores_["arts"].shape == ref.scores_["arts"].shape == (3, 3, 2)
    np.testing.assert_allclose(ours.scores_["arts"], ref.scores_["arts"], atol=1e-7)
    np.testing.assert_allclose(ours.coef_, ref.coef_, atol=1e-6)


def test_sample_and_class_weights_match_scikit_learn():
    """The folds fit by the sample weights times the class weights, and score by the
    sample weights alone, as scikit-learn's."""
    X, y = _problem(seed=2)
    y = np.where(np.arange(len(y)) % 4 == 0, "arts", y)  # one class more frequent
    sw = np.random.default_rng(3).uniform(0.5, 2.0, len(y))
    cv = StratifiedKFold(3)
    # small Cs: from C = 0.5 on these weights saga stops at max_iter far from the optimum
    kw = {"Cs": [0.02, 0.1], "cv": cv, "class_weight": {"arts": 0.5, "science": 2.0}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GridEdgeWarning)  # a short grid, on purpose
        ours = dl1.LogisticRegressionCV(tol=1e-10, **kw).fit(X, y, sample_weight=sw)
        unweighted = dl1.LogisticRegressionCV(tol=1e-10, **kw).fit(X, y)
    ref = _sklearn_cv(X, y, sw, l1_ratios=(1.0,), random_state=0, **kw)
    plain = _sklearn_cv(X, y, l1_ratios=(1.0,), random_state=0, **kw)
    assert max(ref.n_iter_.max(), plain.n_iter_.max()) < 100_000  # saga converged
    np.testing.assert_array_equal(ours.C_, ref.C_)
    np.testing.assert_allclose(ours.scores_["arts"], ref.scores_["arts"][..., 0], atol=1e-7)
    np.testing.assert_allclose(ours.coef_, ref.coef_, atol=1e-6)
    # no sample weights: the class weights fit, the rows score alike
    np.testing.assert_allclose(unweighted.scores_["arts"], plain.scores_["arts"][..., 0],
                               atol=1e-7)  # fmt: skip
    np.testing.assert_allclose(unweighted.coef_, plain.coef_, atol=1e-6)


def test_two_classes_keep_the_binary_attributes():
    X, y = _problem(seed=4)
    two = np.where(y == "arts", "arts", "other")
    est = dl1.LogisticRegressionCV(Cs=3, cv=3).fit(X, two)
    assert est.coef_.shape == (1, X.shape[1]) and est.C_.shape == (1,)
    assert list(est.scores_) == ["other"]


def test_what_the_multinomial_cv_does_not_take_is_refused():
    X, y = _problem(n=90)
    codes = np.searchsorted(NAMES, y).astype(np.float64)
    with pytest.raises(ValueError, match="standardize=True is not supported with more than"):
        dl1.LogisticRegressionCV(Cs=2, cv=3, standardize=True).fit(X, y)
    ds = dl1.persist(X, codes)
    try:
        with pytest.raises(ValueError, match="not a Dataset"):
            dl1.LogisticRegressionCV(Cs=2, cv=3).fit(ds)
    finally:
        ds.release()


def test_a_store_on_a_cluster_gives_the_in_memory_choice(local_cluster, tmp_path):
    X, y = _problem(n=150, seed=5)
    codes = np.searchsorted(NAMES, y).astype(np.float64)
    kw = {"Cs": [0.03, 0.3, 3.0], "cv": StratifiedKFold(3), "tol": 1e-8}
    mem = dl1.LogisticRegressionCV(**kw).fit(X, codes)
    store = dl1.from_scipy(sp.csr_matrix(X), codes, tmp_path / "mc.zarr")
    ooc = dl1.LogisticRegressionCV(client=local_cluster, **kw).fit(store)
    np.testing.assert_array_equal(ooc.classes_, [0.0, 1.0, 2.0])
    np.testing.assert_array_equal(ooc.C_, mem.C_)
    np.testing.assert_allclose(ooc.scores_[1.0], mem.scores_[1.0], atol=1e-6)
    np.testing.assert_allclose(ooc.coef_, mem.coef_, atol=1e-5)
    np.testing.assert_array_equal(ooc.predict(store.to_dask("train")).compute(), mem.predict(X))


def test_saved_and_loaded_it_predicts_the_same(tmp_path):
    X, y = _problem(n=120, seed=6)
    est = dl1.LogisticRegressionCV(Cs=[0.03, 0.3, 3.0], cv=3, tol=1e-8).fit(X, y)
    est.save(tmp_path / "cv.dl1")
    back = dl1.load_estimator(tmp_path / "cv.dl1")
    assert type(back) is dl1.LogisticRegressionCV
    np.testing.assert_array_equal(back.classes_, NAMES)
    np.testing.assert_array_equal(back.l1_ratio_, [1.0, 1.0, 1.0])
    assert back.alpha_ == est.alpha_
    np.testing.assert_array_equal(back.coef_, est.coef_)
    np.testing.assert_array_equal(back.predict_proba(X), est.predict_proba(X))
