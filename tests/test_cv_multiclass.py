"""dl1.fit_cv with more than two classes: the multinomial model's folds (each a warm-started
dl1.path_multiclass, its held-out rows weighing 0), against fits on the folds' own rows,
the choice, the refit; on a two-worker cluster the in-memory choice."""

from __future__ import annotations

import dask
import numpy as np
import pytest
import scipy.sparse as sp
from scipy.special import log_softmax
from sklearn.model_selection import StratifiedKFold

import dl1
import dl1.multiclass as multiclass
from dl1.errors import ValidationError

NAMES = np.array(["arts", "games", "science", "sports"])


def _problem(n=200, p=30, seed=0):
    """Four classes from a sparse multinomial model on sparse features."""
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=0.3, random_state=seed + 1, format="csr")
    W = rng.standard_normal((p, 4)) * (rng.random((p, 1)) < 0.3) * 4
    return X, NAMES[np.argmax(X @ W + rng.gumbel(size=(n, 4)), axis=1)]


@pytest.fixture
def in_process():
    with dask.config.set(scheduler="sync"):
        yield


def _held_out(fit, X, y, scoring):
    """A fit's held-out score, written independently of dl1's."""
    Z = np.asarray(X @ fit.coef_.T.toarray()) + fit.intercept_
    codes = np.searchsorted(NAMES, y)
    if scoring == "accuracy":
        return np.mean(np.argmax(Z, axis=1) == codes)
    return np.mean(log_softmax(Z, axis=1)[np.arange(len(y)), codes])


@pytest.mark.parametrize("scoring", ["accuracy", "neg_log_loss"])
def test_folds_are_the_fits_of_their_own_rows(in_process, scoring):
    """Each fold's path (all rows, the held-out ones weighing 0) scores as fits on the
    training rows alone; the grid is the whole data's, from its alpha_max; the choice is
    the best mean score, the refit the fit of all rows there."""
    X, y = _problem()
    cv = StratifiedKFold(3)
    res = dl1.fit_cv(X, y, loss="logistic", n_alphas=5, eps=0.05, cv=cv, scoring=scoring,
                     tol=1e-10)  # fmt: skip
    amax = dl1.path_multiclass(X, y, n_alphas=1, tol=1e-10).alpha_max_
    (cvr,) = res.cv
    np.testing.assert_allclose(cvr.alphas[0], amax * np.geomspace(1, 0.05, 5), rtol=1e-10)
    for k, (train, test) in enumerate(cv.split(X, y)):
        for j, alpha in enumerate(cvr.alphas[k]):
            fit = dl1.fit_multiclass(X[train], y[train], alpha=alpha, tol=1e-10)
            assert cvr.scores[j, k] == pytest.approx(_held_out(fit, X[test], y[test], scoring),
                                                     abs=1e-7)  # fmt: skip
    assert res.index == int(np.argmax(cvr.scores.mean(axis=1)))
    assert res.alpha == cvr.alphas[0][res.index]
    np.testing.assert_array_equal(res.classes, NAMES)
    np.testing.assert_array_equal(res.fit.classes_, NAMES)
    full = dl1.fit_multiclass(X, y, alpha=res.alpha, tol=1e-10)
    np.testing.assert_allclose(res.fit.coef_.toarray(), full.coef_.toarray(), atol=1e-7)
    assert res.fit.gap_ <= 1e-10


def test_a_c_grid_is_the_estimators(in_process):
    """Cs: each fold's alphas 1 / (C n_train); the choice and refit as
    dl1.LogisticRegressionCV's."""
    X, y = _problem(seed=1)
    Cs = np.array([0.1, 1.0, 10.0])
    res = dl1.fit_cv(X, y, loss="logistic", Cs=Cs, cv=StratifiedKFold(3), tol=1e-10)
    folds = list(StratifiedKFold(3).split(X, y))
    for k, (train, _) in enumerate(folds):
        np.testing.assert_allclose(res.cv[0].alphas[k], 1.0 / (Cs * len(train)), rtol=1e-14)
    est = dl1.LogisticRegressionCV(Cs=Cs, cv=StratifiedKFold(3), tol=1e-10).fit(X, y)
    assert est.C_[0] == Cs[res.index] and res.alpha == 1.0 / (Cs[res.index] * len(y))
    np.testing.assert_allclose(est.coef_, res.fit.coef_.toarray(), atol=1e-9)


def test_what_the_multinomial_cv_does_not_take_is_refused(in_process):
    X, y = _problem(n=60)
    with pytest.raises(ValidationError, match="loss='logistic'"):
        dl1.fit_cv(X, y, loss="squared_hinge", cv=3)
    with pytest.raises(ValidationError, match="positive=True"):
        dl1.fit_cv(X, y, loss="logistic", positive=True, cv=3)
    with pytest.raises(ValidationError, match="scoring='mse'"):
        dl1.fit_cv(X, y, loss="logistic", scoring="mse", cv=3)
    two = np.where(y == "arts", 1.0, -1.0)
    with pytest.raises(ValidationError, match="score_weight is for more than two classes"):
        dl1.fit_cv(X, two, loss="logistic", score_weight=np.ones(60), cv=3)


def test_a_dask_array_and_a_store_on_a_cluster_choose_as_in_memory(local_cluster, tmp_path):
    import dask.array as da

    X, y = _problem(n=160, seed=2)
    codes = np.searchsorted(NAMES, y).astype(np.float64)
    kw = {"loss": "logistic", "Cs": [0.3, 3.0, 30.0], "cv": StratifiedKFold(3), "tol": 1e-8}
    with dask.config.set(scheduler="sync"):
        mem = dl1.fit_cv(X, codes, **kw)
    store = dl1.from_scipy(X, codes, tmp_path / "mc.zarr")
    Xd = da.from_array(X.toarray(), chunks=(40, 30))
    for data, labels in ((Xd, codes), (store, None)):
        res = dl1.fit_cv(data, labels, client=local_cluster, **kw)
        assert res.index == mem.index and res.alpha == mem.alpha
        np.testing.assert_allclose(res.cv[0].scores, mem.cv[0].scores, atol=1e-6)
        np.testing.assert_allclose(res.fit.coef_.toarray(), mem.fit.coef_.toarray(), atol=1e-5)
        assert res.fit.gap_ <= 1e-8


@pytest.mark.parametrize("scoring", ["accuracy", "neg_log_loss"])
def test_grouped_folds_are_the_grouped_paths_of_their_own_rows(in_process, scoring):
    """penalty="grouped" (glmnet's type.multinomial="grouped"): each fold's scores are
    those of dl1.path_multiclass(penalty="grouped") on its training rows alone over the
    same grid (accuracy: the same counts; neg_log_loss to 1e-6), the choice the argmax of
    their means."""
    X, y = _problem()
    cv = StratifiedKFold(3)
    res = dl1.fit_cv(X, y, loss="logistic", penalty="grouped", n_alphas=5, eps=0.05, cv=cv,
                     scoring=scoring, tol=1e-10, refit=False)  # fmt: skip
    (cvr,) = res.cv
    expected = np.empty_like(cvr.scores)
    for k, (train, test) in enumerate(cv.split(X, y)):
        path = dl1.path_multiclass(X[train], y[train], alphas=cvr.alphas[k], penalty="grouped",
                                   tol=1e-10)  # fmt: skip
        np.testing.assert_array_equal(path.alphas_, cvr.alphas[k])
        expected[:, k] = [_held_out(f, X[test], y[test], scoring) for f in path.fits_]
        if scoring == "accuracy":
            np.testing.assert_array_equal(np.rint(cvr.scores[:, k] * len(test)),
                                          np.rint(expected[:, k] * len(test)))  # fmt: skip
    np.testing.assert_allclose(cvr.scores, expected, rtol=0, atol=1e-6)
    assert res.index == int(np.argmax(expected.mean(axis=1)))
    assert res.alpha == cvr.alphas[0][res.index]
    assert res.fit is None


def _group_sizes(coef: sp.spmatrix) -> np.ndarray:
    """Each feature's number of nonzero coefficients over the K classes."""
    return (coef.toarray() != 0).sum(axis=0)


def test_the_grouped_refit_is_the_grouped_fit_at_the_choice(in_process):
    """The refit is dl1.fit_multiclass(penalty="grouped") on all rows at the chosen alpha:
    each feature in or out for every class at once, where the L1 cross-validation's refit
    on the same data keeps some features for some classes only."""
    X, y = _problem()
    kw = {"loss": "logistic", "n_alphas": 5, "eps": 0.05, "cv": StratifiedKFold(3),
          "tol": 1e-10}  # fmt: skip
    res = dl1.fit_cv(X, y, penalty="grouped", **kw)
    full = dl1.fit_multiclass(X, y, alpha=res.alpha, penalty="grouped", tol=1e-10)
    ours, ref = res.fit.coef_.toarray(), full.coef_.toarray()
    np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-6 * np.abs(ref).max())
    np.testing.assert_allclose(res.fit.intercept_, full.intercept_, rtol=1e-6, atol=1e-9)
    assert res.fit.gap_ <= 1e-10
    np.testing.assert_array_equal(res.fit.classes_, NAMES)
    sizes = _group_sizes(res.fit.coef_)
    assert set(sizes.tolist()) == {0, len(NAMES)}
    l1_sizes = _group_sizes(dl1.fit_cv(X, y, **kw).fit.coef_)
    assert ((l1_sizes > 0) & (l1_sizes < len(NAMES))).any()


def test_the_grouped_grid_starts_at_the_grouped_alpha_max(in_process):
    """The default grid runs down from the whole data's alpha_max of the grouped penalty
    (the largest row norm of the dual point's correlations: at least the L1's largest
    entry)."""
    X, y = _problem(n=120, seed=3)
    res = dl1.fit_cv(X, y, loss="logistic", penalty="grouped", n_alphas=3, eps=0.1, cv=3,
                     tol=1e-8, refit=False)  # fmt: skip
    amax = dl1.path_multiclass(X, y, penalty="grouped", n_alphas=1).alpha_max_
    assert res.cv[0].alphas[0][0] == pytest.approx(amax, rel=1e-12)
    np.testing.assert_allclose(res.cv[0].alphas[0], amax * np.geomspace(1, 0.1, 3), rtol=1e-12)
    assert amax > dl1.path_multiclass(X, y, n_alphas=1).alpha_max_


def test_the_grouped_penalty_needs_more_than_two_classes(in_process):
    X, y = _problem(n=60)
    two = np.where(y == "arts", "arts", "other")
    with pytest.raises(ValidationError, match="penalty='grouped' needs more than two classes"):
        dl1.fit_cv(X, two, loss="logistic", penalty="grouped", cv=3)
    with pytest.raises(ValidationError, match="penalty='grouped' needs more than two classes"):
        dl1.fit_cv(X, np.arange(60.0), loss="squared", penalty="grouped", cv=3)
    with pytest.raises(ValidationError, match="'penalty' parameter of dl1.fit_cv"):
        dl1.fit_cv(X, y, loss="logistic", penalty="group", cv=3)


def test_one_vs_rest_cross_validation_is_scikit_learns_wrapper(in_process):
    """One-vs-rest cross-validation as in scikit-learn (whose LogisticRegressionCV has no
    multi_class): OneVsRestClassifier around dl1's binary LogisticRegressionCV, each class
    choosing its own C as scikit-learn's saga L1 cross-validation does on the same folds,
    the coefficients the same to saga's tolerance, a class without features at its
    log-odds."""
    from sklearn.linear_model import LogisticRegressionCV as SkCV
    from sklearn.multiclass import OneVsRestClassifier

    X, y = _problem(seed=1)
    Cs, cv = [0.05, 0.5, 5.0], StratifiedKFold(3)
    ours = OneVsRestClassifier(dl1.LogisticRegressionCV(Cs=Cs, cv=cv, tol=1e-10)).fit(X, y)
    ref = OneVsRestClassifier(SkCV(Cs=Cs, cv=cv, l1_ratios=(1.0,), solver="saga", tol=1e-8,
                                   scoring="accuracy", use_legacy_attributes=False, random_state=0,
                                   max_iter=100_000)).fit(X, y)  # fmt: skip
    np.testing.assert_array_equal(ours.classes_, NAMES)
    chosen = [e.C_[0] for e in ours.estimators_]
    assert chosen == [float(np.ravel(e.C_)[0]) for e in ref.estimators_]
    assert len(set(chosen)) > 1  # the classes chose differently: not one shared C
    for name, a, b in zip(NAMES, ours.estimators_, ref.estimators_, strict=True):
        np.testing.assert_allclose(a.coef_, np.reshape(b.coef_, (1, -1)), atol=1e-4)
        if a.coef_.any():
            np.testing.assert_allclose(a.intercept_, np.ravel(b.intercept_), atol=1e-4)
        else:  # the log-odds of the class (saga's intercept lags there: 2e-1 off)
            freq = np.mean(y == name)
            np.testing.assert_allclose(a.intercept_, np.log(freq / (1 - freq)), rtol=1e-8)
    d_ours, d_ref = ours.decision_function(X), ref.decision_function(X)
    for k, est in enumerate(ours.estimators_):  # saga's lagging intercepts: the log-odds
        if not est.coef_.any():
            d_ref[:, k] = est.intercept_[0]
    np.testing.assert_allclose(d_ours, d_ref, atol=1e-3)
    top2 = np.sort(d_ref, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1e-2  # rows not decided by saga's last digits
    expected = NAMES[np.argmax(d_ref, axis=1)]
    np.testing.assert_array_equal(ours.predict(X)[clear], expected[clear])


def test_the_data_are_loaded_once_for_every_fold_and_the_refit(in_process, monkeypatch):
    loads = []
    real = multiclass.load_blocks

    def counted(*args, **kwargs):
        loads.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(multiclass, "load_blocks", counted)
    X, y = _problem(seed=4)
    res = dl1.fit_cv(X, y, loss="logistic", n_alphas=4, eps=0.05, cv=3, tol=1e-8)
    assert res.fit.converged_ and len(loads) == 1


def test_a_fold_without_a_class_is_refused_naming_it(in_process):
    X, y = _problem(seed=6)
    y = np.where(np.arange(len(y)) == 0, "zebra", y)  # one sample: absent from 2 folds' rows
    folds = [(np.arange(1, 100), np.arange(100, 200)), (np.arange(0, 100), np.arange(100, 200))]
    with pytest.raises(ValidationError, match="class 'zebra' has no sample of positive weight"):
        dl1.fit_cv(X, y, loss="logistic", n_alphas=3, cv=folds)
