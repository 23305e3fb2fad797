"""Any two labels in dl1.fit / dl1.path / dl1.alpha_max / dl1.fit_cv and the command line:
mapped to -1 / +1 before any work (the larger to +1), recorded as ``classes_``, and spoken
back by predict, score, saved models and scikit-learn conversions.

Each fit on two labels is compared with the same fit on labels -1 / +1: the mapped labels
are those very numbers, so the solutions are bit for bit the same."""

from __future__ import annotations

import json

import dask
import dask.array as da
import numpy as np
import pytest
from click.testing import CliRunner

import dl1
from dl1.errors import ModelFileError, ValidationError
from dl1.saving import MODEL_JSON, content_digest
from tests.helpers import random_csr

N, P, N_TEST = 120, 30, 50
ALPHA = 0.01
TOL = 1e-8
#: Label pairs other than -1 / +1: as ints, floats, and one whose larger value is negative.
PAIRS = [(0, 1), (3, 7), (-2.5, -0.5)]


@pytest.fixture
def in_process():
    """No Dask client: dl1 solves in this process."""
    with dask.config.set(scheduler="sync"):
        yield


@pytest.fixture(scope="module")
def data():
    """``(X, labels -1 / +1, X_test, test labels -1 / +1)``."""
    w = np.r_[2.0 * np.ones(4), -2.0 * np.ones(3), np.zeros(P - 7)]
    X, Xt = random_csr(N, P, 0.3, seed=5), random_csr(N_TEST, P, 0.3, seed=6)
    noise = 0.3 * np.sin(np.arange(N + N_TEST))
    y = np.where(X @ w + noise[:N] > 0.1, 1.0, -1.0)
    yt = np.where(Xt @ w + noise[N:] > 0.1, 1.0, -1.0)
    assert 0.2 < (y > 0).mean() < 0.8
    return X, y, Xt, yt


def relabel(y_pm1: np.ndarray, pair: tuple[float, float]) -> np.ndarray:
    """Labels -1 / +1 as ``pair`` (the smaller for -1), of the pair's type."""
    lo, hi = pair
    return np.where(y_pm1 > 0, hi, lo)


@pytest.fixture(scope="module")
def stores(data, tmp_path_factory):
    """Stores of the same data, labels -1 / +1 and 0 / 1 (train and test splits)."""
    X, y, Xt, yt = data
    root = tmp_path_factory.mktemp("two-labels")
    for name, pair in (("pm1", (-1, 1)), ("01", (0, 1))):
        dl1.from_scipy(X, relabel(y, pair).astype(np.float64), root / name,
                       X_test=Xt, y_test=relabel(yt, pair).astype(np.float64),
                       n_feature_blocks=2)  # fmt: skip
    return root


def assert_same_model(got, ref) -> None:
    """Bit for bit the same coefficients and intercept."""
    np.testing.assert_array_equal(got.coef_, ref.coef_)
    assert got.intercept_ == ref.intercept_


def assert_speaks_labels(res, ref, X, y_pm1, pair) -> None:
    """``res`` (fitted on ``pair``) predicts ``pair`` labels where ``ref`` (on -1 / +1)
    predicts -1 / +1, and scores the same accuracy on labels in ``pair``."""
    lo, hi = pair
    np.testing.assert_array_equal(res.classes_, [lo, hi])
    assert res.classes_.dtype == np.float64
    d = res.decision_function(X)
    assert (d != 0).all()  # away from the tie (dl1: +1, scikit-learn: classes_[0])
    pred = res.predict(X)
    np.testing.assert_array_equal(pred, np.where(d > 0, hi, lo))
    np.testing.assert_array_equal(pred, relabel(ref.predict(X), pair))
    y = relabel(y_pm1, pair)
    assert res.score(X, y) == ref.score(X, y_pm1)
    assert 0.6 < res.score(X, y) < 1.0


# -- in process ---------------------------------------------------------------------------------
@pytest.mark.usefixtures("in_process")
@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("loss", ["logistic", "squared_hinge"])
def test_fit_on_two_labels_is_the_fit_on_pm1(data, pair, loss):
    X, y, Xt, yt = data
    ref = dl1.fit(X, y, alpha=ALPHA, loss=loss, tol=TOL)
    np.testing.assert_array_equal(ref.classes_, [-1.0, 1.0])
    labels = relabel(y, pair)
    res = dl1.fit(X, labels, alpha=ALPHA, loss=loss, tol=TOL)
    assert_same_model(res, ref)
    assert_speaks_labels(res, ref, Xt, yt, pair)
    assert dl1.alpha_max(X, labels, loss=loss) == dl1.alpha_max(X, y, loss=loss)
    # a dask y, a single column, a dask X: the same; predictions lazy, in the labels
    col = dl1.fit(X, da.from_array(labels.reshape(-1, 1), chunks=50), alpha=ALPHA, loss=loss,
                  tol=TOL)  # fmt: skip
    assert_same_model(col, ref)
    lazy = res.predict(da.from_array(Xt, chunks=(20, 10)))
    assert isinstance(lazy, da.Array)
    np.testing.assert_array_equal(lazy.compute(), res.predict(Xt))


@pytest.mark.usefixtures("in_process")
def test_predict_proba_columns_are_in_classes_order(data):
    X, y, Xt, _ = data
    res = dl1.fit(X, relabel(y, (3, 7)), alpha=ALPHA, loss="logistic", tol=TOL)
    proba = res.predict_proba(Xt)
    np.testing.assert_allclose(proba[:, 1], 1 / (1 + np.exp(-res.decision_function(Xt))))
    np.testing.assert_array_equal(res.classes_[proba.argmax(axis=1)], res.predict(Xt))


@pytest.mark.usefixtures("in_process")
def test_a_tie_predicts_the_second_class_as_dl1_predicts_plus_one(data):
    """At a decision value of exactly 0 (here ``w = 0`` without intercept) the labels are
    the relabelled -1 / +1 predictions: ``classes_[1]``, as dl1's +1."""
    X, y, Xt, _ = data
    ref = dl1.fit(X, y, alpha=10.0, loss="logistic", fit_intercept=False)
    res = dl1.fit(X, relabel(y, (0, 1)), alpha=10.0, loss="logistic", fit_intercept=False)
    assert not res.coef_.any() and (res.decision_function(Xt) == 0).all()
    np.testing.assert_array_equal(ref.predict(Xt), np.ones(N_TEST))
    np.testing.assert_array_equal(res.predict(Xt), np.ones(N_TEST))


@pytest.mark.usefixtures("in_process")
@pytest.mark.parametrize("pair", [(0, 1), (3, 7)])
def test_path_on_two_labels_is_the_path_on_pm1(data, pair):
    X, y, Xt, yt = data
    kw = dict(n_alphas=6, eps=0.05, loss="logistic", tol=TOL)
    ref = dl1.path(X, y, X_test=Xt, y_test=yt, **kw)
    res = dl1.path(X, relabel(y, pair), X_test=Xt, y_test=relabel(yt, pair), **kw)
    np.testing.assert_array_equal(res.alphas_, ref.alphas_)
    np.testing.assert_array_equal(res.coefs_.toarray(), ref.coefs_.toarray())
    np.testing.assert_array_equal(res.intercepts_, ref.intercepts_)
    np.testing.assert_array_equal(res.test_accuracy_, ref.test_accuracy_)
    np.testing.assert_array_equal(res.test_logloss_, ref.test_logloss_)
    np.testing.assert_array_equal(res.classes_, pair)
    np.testing.assert_array_equal(ref.classes_, [-1.0, 1.0])
    k = res.best_index_
    assert k == ref.best_index_
    model = res.model()
    assert_speaks_labels(model, ref.model(), Xt, yt, pair)
    np.testing.assert_array_equal(res.predict(Xt), model.predict(Xt))
    assert res.score(Xt, relabel(yt, pair)) == ref.score(Xt, yt)
    with pytest.raises(ValidationError, match=r"y_test\[0\] = 5.0 is neither class"):
        dl1.path(X, relabel(y, pair), X_test=Xt, y_test=np.full(N_TEST, 5.0), **kw)


@pytest.mark.usefixtures("in_process")
def test_fit_cv_and_path_cv_on_two_labels(data):
    X, y, _, _ = data
    kw = dict(cv=3, n_alphas=5, eps=0.05, loss="logistic", tol=1e-6)
    labels = relabel(y, (3, 7))
    ref, res = dl1.fit_cv(X, y, **kw), dl1.fit_cv(X, labels, **kw)
    assert (res.alpha, res.alpha_1se) == (ref.alpha, ref.alpha_1se)
    np.testing.assert_array_equal(res.cv[0].scores, ref.cv[0].scores)
    assert_same_model(res.fit, ref.fit)
    np.testing.assert_array_equal(res.classes, [3.0, 7.0])
    np.testing.assert_array_equal(res.fit.classes_, [3.0, 7.0])
    np.testing.assert_array_equal(ref.fit.classes_, [-1.0, 1.0])
    assert_speaks_labels(res.fit, ref.fit, X, y, (3, 7))
    assert dl1.fit_cv(X, labels, refit=False, **kw).fit is None
    p_ref = dl1.path(X, y, **kw)
    p_res = dl1.path(X, labels, **kw)
    np.testing.assert_array_equal(p_res.coefs_.toarray(), p_ref.coefs_.toarray())
    assert p_res.alpha_ == p_ref.alpha_
    np.testing.assert_array_equal(p_res.classes_, [3.0, 7.0])
    np.testing.assert_array_equal(p_res.predict(X), relabel(p_ref.predict(X), (3, 7)))


@pytest.mark.usefixtures("in_process")
def test_labels_stored_with_x_y_none(data, stores):
    """A store (its path, or opened) and a Dataset holding labels 0 / 1, fitted with y=None:
    the fits on the store of labels -1 / +1; a Dataset view too; the test split's labels
    score and validate in 0 / 1."""
    X, y, Xt, yt = data
    pm1, zo = stores / "pm1", stores / "01"
    ref = dl1.fit(pm1, alpha=ALPHA, loss="logistic", tol=TOL)
    for source in (zo, dl1.open_store(zo)):
        res = dl1.fit(source, alpha=ALPHA, loss="logistic", tol=TOL)
        assert_same_model(res, ref)
        assert_speaks_labels(res, ref, Xt, yt, (0, 1))
        assert res.score(zo) == ref.score(pm1)  # y=None: the store's test labels
    assert dl1.alpha_max(zo, loss="logistic") == dl1.alpha_max(pm1, loss="logistic")
    p_ref = dl1.path(pm1, n_alphas=4, eps=0.1, loss="logistic", tol=TOL, X_test="test")
    p_res = dl1.path(zo, n_alphas=4, eps=0.1, loss="logistic", tol=TOL, X_test="test")
    np.testing.assert_array_equal(p_res.coefs_.toarray(), p_ref.coefs_.toarray())
    np.testing.assert_array_equal(p_res.test_accuracy_, p_ref.test_accuracy_)
    np.testing.assert_array_equal(p_res.classes_, [0.0, 1.0])
    with dl1.persist(zo) as ds, dl1.persist(pm1) as ds_ref:
        assert_same_model(dl1.fit(ds, alpha=ALPHA, loss="logistic", tol=TOL), ref)
        rows = np.arange(0, N, 2)
        view = dl1.fit(ds[rows], alpha=ALPHA, loss="logistic", tol=TOL)
        assert_same_model(view, dl1.fit(ds_ref[rows], alpha=ALPHA, loss="logistic", tol=TOL))
        np.testing.assert_array_equal(view.classes_, [0.0, 1.0])
        cv = dl1.fit_cv(ds, cv=3, n_alphas=4, eps=0.1, loss="logistic", tol=1e-6)
        cv_ref = dl1.fit_cv(ds_ref, cv=3, n_alphas=4, eps=0.1, loss="logistic", tol=1e-6)
        assert_same_model(cv.fit, cv_ref.fit)
        np.testing.assert_array_equal(cv.fit.classes_, [0.0, 1.0])
        np.testing.assert_array_equal(ds.y, relabel(y, (0, 1)))  # the handle is unchanged


@pytest.mark.usefixtures("in_process")
@pytest.mark.parametrize("entry", ["fit", "path", "alpha_max", "fit_cv"])
def test_one_label_or_more_than_two_are_refused(data, entry):
    X, y, _, _ = data
    call = {
        "fit": lambda v: dl1.fit(X, v, alpha=ALPHA, loss="logistic"),
        "path": lambda v: dl1.path(X, v, n_alphas=3, loss="logistic"),
        "alpha_max": lambda v: dl1.alpha_max(X, v, loss="logistic"),
        "fit_cv": lambda v: dl1.fit_cv(X, v, cv=3, n_alphas=3, loss="logistic"),
    }[entry]
    three = np.arange(N) % 3
    if entry in ("fit", "path", "fit_cv"):  # the multiclass model (test_multiclass_entry.py)
        res = call(three)
        coef = {"fit": lambda: res.coef_, "path": lambda: res.coefs_[-1],
                "fit_cv": lambda: res.fit.coef_}[entry]()  # fmt: skip
        assert coef.shape[0] == 3
    else:
        with pytest.raises(ValidationError, match=r"y has 3 distinct values \(0.0, 1.0, 2.0\)"
                                                  r".*dl1's classifiers are binary"):  # fmt: skip
            call(three)
        with pytest.raises(ValidationError, match=r"y has 20 distinct values \(0.0, 1.0, 2.0, "
                                                  r"3.0, 4.0, \.\.\.\)"):  # fmt: skip
            call(np.arange(N) % 20)
    with pytest.raises(ValidationError, match=r"y has 1 distinct value \(0.0\)"):
        call(np.zeros(N))
    with pytest.raises(ValidationError, match=r"y has \d+ distinct values"):
        call(np.linspace(0, 1, N))  # continuous targets given a classification loss
    with pytest.raises(ValidationError, match=r"y\[3\] is nan"):
        call(np.where(np.arange(N) == 3, np.nan, relabel(y, (0, 1))))
    with pytest.raises(ValidationError, match="labels must be numbers"):
        call(np.where(y > 0, "yes", "no"))


@pytest.mark.usefixtures("in_process")
def test_regression_targets_are_left_alone(data):
    X, y, _, _ = data
    t = relabel(y, (0, 1)).astype(np.float64)
    res = dl1.fit(X, t, alpha=ALPHA, tol=TOL)
    assert res.classes_ is None
    assert not np.isin(res.predict(X), (0.0, 1.0)).all()


@pytest.mark.usefixtures("in_process")
def test_score_refuses_a_label_of_neither_class(data):
    X, y, Xt, yt = data
    res = dl1.fit(X, relabel(y, (0, 1)), alpha=ALPHA, loss="logistic", tol=TOL)
    bad = relabel(yt, (0, 1)).astype(np.float64)
    bad[4] = -1.0
    with pytest.raises(ValidationError, match=r"y\[4\] = -1.0 is neither class"):
        res.score(Xt, bad)


# -- saved models and scikit-learn ---------------------------------------------------------------
@pytest.mark.usefixtures("in_process")
def test_saved_models_keep_their_classes(data, tmp_path):
    X, y, Xt, yt = data
    res = dl1.fit(X, relabel(y, (3, 7)), alpha=ALPHA, loss="logistic", tol=TOL)
    back = dl1.load_model(res.save(tmp_path / "fit"))
    np.testing.assert_array_equal(back.classes_, [3.0, 7.0])
    np.testing.assert_array_equal(back.predict(Xt), res.predict(Xt))
    assert back.score(Xt, relabel(yt, (3, 7))) == res.score(Xt, relabel(yt, (3, 7)))
    path = dl1.path(X, relabel(y, (0, 1)), n_alphas=4, eps=0.1, loss="logistic", tol=TOL)
    pback = dl1.load_model(path.save(tmp_path / "path"))
    np.testing.assert_array_equal(pback.classes_, [0.0, 1.0])
    a = float(path.alphas_[-1])
    np.testing.assert_array_equal(pback.predict(Xt, a), path.predict(Xt, a))
    assert set(np.unique(pback.predict(Xt, a))) <= {0.0, 1.0}
    reg = dl1.load_model(dl1.fit(X, y, alpha=ALPHA, tol=TOL).save(tmp_path / "reg"))
    assert reg.classes_ is None
    assert "classes" not in json.loads((tmp_path / "reg" / MODEL_JSON).read_text())


def _without_classes(d) -> None:
    """A saved fit's ``model.json`` without ``classes``, its digest recomputed: a model as
    dl1 saved it before classes were recorded."""
    meta = json.loads((d / MODEL_JSON).read_text())
    del meta["classes"]
    meta["digest"] = content_digest(meta, {"coef": np.load(d / "coef.npy")})
    (d / MODEL_JSON).write_text(json.dumps(meta))


@pytest.mark.usefixtures("in_process")
def test_a_model_without_classes_loads_as_before_and_bad_classes_are_refused(data, tmp_path):
    X, y, Xt, _ = data
    res = dl1.fit(X, y, alpha=ALPHA, loss="logistic", tol=TOL)
    old = res.save(tmp_path / "old")
    assert json.loads((old / MODEL_JSON).read_text())["classes"] == [
        "-0x1.0000000000000p+0",
        "0x1.0000000000000p+0",
    ]
    _without_classes(old)
    back = dl1.load_model(old)
    assert back.classes_ is None
    np.testing.assert_array_equal(back.predict(Xt), res.predict(Xt))
    np.testing.assert_array_equal(back.to_sklearn().classes_, [-1.0, 1.0])
    one, two, inf = float.hex(1.0), float.hex(2.0), "inf"
    for value, named in [
        ([two, one], "classes are not two distinct labels in increasing order"),
        ([one, one], "classes are not two distinct labels in increasing order"),
        ([one], "classes has 1 entries, expected 2"),
        ("0x1p+0", "classes is not a list"),
        ([one, inf], r"classes\[1\] is not finite"),
        ([one, 2.0], r"classes\[1\] is not a float.hex string"),
    ]:
        bad = res.save(tmp_path / "bad", overwrite=True)
        meta = json.loads((bad / MODEL_JSON).read_text())
        meta["classes"] = value
        (bad / MODEL_JSON).write_text(json.dumps(meta))
        with pytest.raises(ModelFileError, match=f"model.json field {named}"):
            dl1.load_model(bad)
    reg = dl1.fit(X, y, alpha=ALPHA, tol=TOL).save(tmp_path / "reg")
    meta = json.loads((reg / MODEL_JSON).read_text())
    meta["classes"] = [one, two]
    (reg / MODEL_JSON).write_text(json.dumps(meta))
    with pytest.raises(ModelFileError, match="classes is given for loss 'squared'"):
        dl1.load_model(reg)


@pytest.mark.usefixtures("in_process")
@pytest.mark.parametrize("loss", ["logistic", "squared_hinge"])
def test_to_sklearn_speaks_the_classes(data, loss):
    X, y, Xt, yt = data
    labels = relabel(y, (3, 7))
    res = dl1.fit(X, labels, alpha=ALPHA, loss=loss, tol=TOL)
    est = res.to_sklearn()
    np.testing.assert_array_equal(est.classes_, [3.0, 7.0])
    np.testing.assert_array_equal(est.predict(Xt), res.predict(Xt))
    assert est.score(Xt, relabel(yt, (3, 7))) == pytest.approx(res.score(Xt, relabel(yt, (3, 7))))
    path = dl1.path(X, labels, n_alphas=3, eps=0.1, loss=loss, tol=TOL)
    a = float(path.alphas_[-1])
    np.testing.assert_array_equal(path.to_sklearn(a).predict(Xt), path.predict(Xt, a))


@pytest.mark.usefixtures("in_process")
@pytest.mark.parametrize("pair", [(0, 1), (3, 7), (False, True)])
def test_an_estimators_result_speaks_its_numeric_classes(data, pair):
    """``est.result_`` (a FitResult) predicts, scores and saves in the estimator's classes
    when they are numbers, as ``est`` does."""
    X, y, Xt, yt = data
    est = dl1.LogisticRegression(C=10.0, tol=TOL).fit(X, relabel(y, pair))
    np.testing.assert_array_equal(est.result_.classes_, est.classes_.astype(np.float64))
    np.testing.assert_array_equal(est.result_.predict(Xt), est.predict(Xt))
    np.testing.assert_array_equal(est.result_.to_sklearn().predict(Xt), est.predict(Xt))
    tested = relabel(yt, pair)
    assert est.result_.score(Xt, tested) == pytest.approx(est.score(Xt, tested))


# -- on a cluster ---------------------------------------------------------------------------------
@pytest.mark.parametrize("one_piece", [True, False])
def test_on_a_cluster(data, stores, local_cluster, one_piece, monkeypatch):
    """On a two-worker cluster, shipped in one piece or not: labels given and labels of a
    store (y=None) give the fit on -1 / +1, in their labels."""
    from dl1.runtime import one_piece as shipping

    shipped: list[str] = []
    ship = shipping.ship
    def spy(ex, entry, X, kwargs, *rest):
        shipped.append(kwargs["solve"].__name__)  # the core function the worker runs
        return ship(ex, entry, X, kwargs, *rest)

    monkeypatch.setattr(shipping, "ship", spy)
    X, y, Xt, yt = data
    c = local_cluster
    with dask.config.set({"dl1.one-piece": one_piece}):
        ref = dl1.fit(X, y, alpha=ALPHA, loss="logistic", tol=TOL, client=c)
        res = dl1.fit(X, relabel(y, (3, 7)), alpha=ALPHA, loss="logistic", tol=TOL, client=c)
        assert_same_model(res, ref)
        assert_speaks_labels(res, ref, Xt, yt, (3, 7))
        s_ref = dl1.fit(stores / "pm1", alpha=ALPHA, loss="logistic", tol=TOL, client=c)
        s_res = dl1.fit(stores / "01", alpha=ALPHA, loss="logistic", tol=TOL, client=c)
        assert_same_model(s_res, s_ref)
        np.testing.assert_array_equal(s_res.classes_, [0.0, 1.0])
        kw = dict(n_alphas=3, eps=0.1, loss="logistic", tol=TOL, client=c, X_test="test")
        p_ref, p_res = dl1.path(stores / "pm1", **kw), dl1.path(stores / "01", **kw)
        np.testing.assert_array_equal(p_res.coefs_.toarray(), p_ref.coefs_.toarray())
        np.testing.assert_array_equal(p_res.test_accuracy_, p_ref.test_accuracy_)
        np.testing.assert_array_equal(p_res.classes_, [0.0, 1.0])
    assert shipped == (["fitted"] * 4 + ["walked"] * 2 if one_piece else [])


def test_command_line_fit_predict_and_score_in_the_labels(data, stores, local_cluster, tmp_path):
    """``dl1 fit`` on a store of labels 0 / 1: the model of the store of -1 / +1, saved with
    its classes; ``dl1 predict`` writes labels 0 / 1 and ``dl1 score`` scores them."""
    from dl1.cli import cli

    _, _, Xt, yt = data
    where = ("--scheduler", local_cluster.scheduler.address)

    def invoke(*args):
        result = CliRunner().invoke(cli, [str(a) for a in (*args, *where)],
                                    catch_exceptions=False)  # fmt: skip
        assert result.exit_code == 0, result.stderr
        return result

    for name in ("pm1", "01"):
        invoke("fit", stores / name, "--loss", "logistic", "--alpha-ratio", "10", "--output",
               tmp_path / name, "--json")  # fmt: skip
    ref, res = dl1.load_model(tmp_path / "pm1"), dl1.load_model(tmp_path / "01")
    assert_same_model(res, ref)
    np.testing.assert_array_equal(res.classes_, [0.0, 1.0])
    out = json.loads(invoke("fit", stores / "01", "--loss", "logistic", "--alpha-ratio", "10",
                            "--json").stdout)  # fmt: skip
    labels = np.where(Xt @ res.coef_ + res.intercept_ >= 0, 1.0, 0.0)
    assert out["test_accuracy"] == np.mean(labels == relabel(yt, (0, 1))) > 0.6
    invoke("predict", tmp_path / "01", stores / "01", "--output", tmp_path / "p.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "p.npy"), labels)
    np.testing.assert_array_equal(labels, res.predict(Xt))
    scored = invoke("score", tmp_path / "01", stores / "01").stdout.split()
    assert scored[:2] == ["accuracy", f"{res.score(Xt, relabel(yt, (0, 1))):.6g}"]
