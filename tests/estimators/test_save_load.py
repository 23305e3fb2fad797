"""Fitted estimators saved (``est.save``) and read back (``dl1.load_estimator``): the same
class, parameters, labels and predictions bit for bit; a FitResult's saved model read as the
estimator of its loss; a tampered estimator record refused, naming the file and field."""

from __future__ import annotations

import json

import dask
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from sklearn.exceptions import NotFittedError

import dl1
import dl1.estimators
from dl1.errors import ModelFileError
from dl1.estimators import saved
from dl1.objective.datafits import Huber
from dl1.saving import MODEL_JSON, content_digest
from dl1.solvers.result import FitResult

N, P = 90, 10


@pytest.fixture(autouse=True)
def in_process():
    """No Dask client: every fit and prediction runs in this process."""
    with dask.config.set(scheduler="sync"):
        yield


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = sp.random(N, P, density=0.4, format="csr", random_state=rng)
    w = np.zeros(P)
    w[:4] = [2.0, -1.5, 1.0, 0.5]
    y = X @ w + 0.2 * rng.standard_normal(N)
    counts = rng.poisson(np.exp(0.5 * (X @ w))).astype(np.float64)
    spam = np.where(y > np.median(y), "spam", "ham")
    return {"X": X, "y": y, "counts": counts, "spam": spam, "01": (spam == "spam").astype(int)}


#: (estimator, target) for every dl1 estimator class, with parameters off their defaults.
CASES = {
    "Lasso": (lambda: dl1.Lasso(alpha=0.01, max_iter=300, positive=True), "y"),
    "ElasticNet": (lambda: dl1.ElasticNet(alpha=0.02, l1_ratio=0.3, tol=1e-6), "y"),
    "LogisticRegression": (
        lambda: dl1.LogisticRegression(penalty="elasticnet", C=5.0, l1_ratio=0.7),
        "spam",
    ),
    "LinearSVC": (lambda: dl1.LinearSVC(C=2.0, class_weight="balanced"), "spam"),
    "PoissonRegressor": (lambda: dl1.PoissonRegressor(alpha=0.01, l1_ratio=0.5), "counts"),
    "HuberRegressor": (lambda: dl1.HuberRegressor(epsilon=0.5, alpha=0.01), "y"),
    "LassoCV": (lambda: dl1.LassoCV(alphas=6, eps=0.05, cv=3), "y"),
    "ElasticNetCV": (
        lambda: dl1.ElasticNetCV(l1_ratio=[0.4, 0.9], alphas=5, eps=0.05, cv=3),
        "y",
    ),  # fmt: skip
    "LogisticRegressionCV": (lambda: dl1.LogisticRegressionCV(Cs=[0.5, 2.0, 8.0], cv=3), "spam"),
}


def _fit(name, data):
    make, target = CASES[name]
    return make().fit(data["X"], data[target])


def _outputs(est, X):
    """Everything the estimator computes on X."""
    out = {"predict": est.predict(X)}
    for method in ("decision_function", "predict_proba", "predict_log_proba"):
        if hasattr(est, method):
            out[method] = getattr(est, method)(X)
    return out


def test_every_estimator_class_is_covered():
    assert set(CASES) == set(dl1.estimators.__all__)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_saved_estimator_loads_fitted_and_predicts_bit_for_bit(tmp_path, data, name):
    est = _fit(name, data)
    X = data["X"]
    written = est.save(tmp_path / "model")
    assert written == tmp_path / "model"
    loaded = dl1.load_estimator(tmp_path / "model")

    assert type(loaded) is type(est)
    assert loaded.get_params() == est.get_params()
    expected, got = _outputs(est, X), _outputs(loaded, X)
    assert expected.keys() == got.keys()
    for method in expected:
        assert np.asarray(got[method]).dtype == np.asarray(expected[method]).dtype, method
        assert np.array_equal(got[method], expected[method]), method
    assert loaded.score(X, data[CASES[name][1]]) == est.score(X, data[CASES[name][1]])
    for attr in ("coef_", "intercept_", "n_iter_", "dual_gap_", "gap_", "n_features_in_"):
        assert np.array_equal(getattr(loaded, attr), getattr(est, attr)), attr
        assert np.shape(getattr(loaded, attr)) == np.shape(getattr(est, attr)), attr
    if hasattr(est, "classes_"):
        assert loaded.classes_.dtype == est.classes_.dtype
        assert loaded.classes_.tolist() == est.classes_.tolist() == ["ham", "spam"]
        assert np.array_equal(loaded.class_weight_, est.class_weight_) or (
            loaded.class_weight_ is None and est.class_weight_ is None
        )
    else:
        assert not hasattr(loaded, "classes_")
    for attr in ("alpha_", "l1_ratio_"):
        if hasattr(est, attr):
            assert np.array_equal(getattr(loaded, attr), getattr(est, attr)), attr
    assert isinstance(loaded.result_, FitResult)
    assert np.array_equal(loaded.result_.coef_, est.result_.coef_)
    try:
        reference = est.to_sklearn()
    except ValueError as e:  # no scikit-learn equivalent (Poisson with an L1 part)
        with pytest.raises(ValueError, match="no equivalent"):
            loaded.to_sklearn()
        assert "no equivalent" in str(e)
    else:
        assert np.array_equal(loaded.to_sklearn().predict(X), reference.predict(X))

    # it saves again, to the same content; load_model reads the file as result_
    loaded.save(tmp_path / "again")
    again = json.loads((tmp_path / "again" / MODEL_JSON).read_text())
    first = json.loads((tmp_path / "model" / MODEL_JSON).read_text())
    assert again["estimator"] == first["estimator"]
    assert again["digest"] == first["digest"]
    res = dl1.load_model(tmp_path / "model")
    assert isinstance(res, FitResult)
    assert np.array_equal(res.decision_function(X), est.result_.decision_function(X))


@pytest.mark.parametrize(
    "labels",
    [["ham", "spam"], [0, 1], [False, True], [-1.0, 2.0], np.array([3, 7], dtype=np.int8)],
    ids=["str", "0/1", "bool", "float", "int8"],
)
def test_classifier_labels_come_back_with_their_dtype(tmp_path, data, labels):
    labels = np.asarray(labels)
    y = labels[(data["spam"] == "spam").astype(int)]
    est = dl1.LogisticRegression(C=3.0).fit(data["X"], y)
    est.save(tmp_path / "m")
    loaded = dl1.load_estimator(tmp_path / "m")
    assert loaded.classes_.dtype == est.classes_.dtype == labels.dtype
    assert loaded.classes_.tolist() == est.classes_.tolist() == labels.tolist()
    pred = loaded.predict(data["X"])
    assert pred.dtype == labels.dtype
    assert np.array_equal(pred, est.predict(data["X"]))
    assert set(pred.tolist()) == set(labels.tolist())  # both classes predicted


def test_parameters_json_cannot_hold_are_dropped_and_the_rest_kept(tmp_path, data):
    est = dl1.LogisticRegression(
        C=4.0, class_weight={"ham": 2.0}, random_state=np.random.RandomState(3), max_iter=400
    ).fit(data["X"], data["spam"])
    est.save(tmp_path / "m")
    params = json.loads((tmp_path / "m" / MODEL_JSON).read_text())["estimator"]["params"]
    assert "client" not in params and "class_weight" not in params
    assert "random_state" not in params
    assert (params["C"], params["max_iter"]) == (4.0, 400)
    loaded = dl1.load_estimator(tmp_path / "m")
    assert loaded.class_weight is None and loaded.random_state is None
    assert (loaded.C, loaded.max_iter) == (4.0, 400)
    assert np.array_equal(loaded.class_weight_, est.class_weight_)
    assert np.array_equal(loaded.predict(data["X"]), est.predict(data["X"]))


def test_array_parameters_come_back_as_lists(tmp_path, data):
    est = dl1.LassoCV(alphas=np.array([0.1, 0.03, 0.01]), cv=3).fit(data["X"], data["y"])
    est.save(tmp_path / "m")
    loaded = dl1.load_estimator(tmp_path / "m")
    assert loaded.alphas == [0.1, 0.03, 0.01]
    assert loaded.alpha_ == est.alpha_
    assert np.array_equal(loaded.predict(data["X"]), est.predict(data["X"]))


def test_feature_names_of_a_dataframe_fit_come_back(tmp_path, data):
    X = pd.DataFrame(data["X"].toarray(), columns=[f"f{j}" for j in range(P)])
    est = dl1.Lasso(alpha=0.01).fit(X, data["y"])
    est.save(tmp_path / "m")
    loaded = dl1.load_estimator(tmp_path / "m")
    assert loaded.feature_names_in_.tolist() == est.feature_names_in_.tolist()
    assert np.array_equal(loaded.predict(X), est.predict(X))  # no feature-name warning
    with pytest.raises(ValueError, match="feature names"):
        loaded.predict(X[X.columns[::-1]])


# -- a FitResult's saved model: the estimator of its loss -------------------------------------
NATURAL = [
    ("squared", 1.0, "y", "Lasso"),
    ("squared", 0.5, "y", "ElasticNet"),
    ("logistic", 1.0, "01", "LogisticRegression"),
    ("logistic", 0.5, "01", "LogisticRegression"),
    ("hinge", 1.0, "01", "LinearSVC"),
    ("squared_hinge", 1.0, "01", "LinearSVC"),
    ("poisson", 0.5, "counts", "PoissonRegressor"),
    ("huber", 1.0, "y", "HuberRegressor"),
]


@pytest.mark.parametrize("loss, l1_ratio, target, cls", NATURAL)
def test_a_saved_fit_result_loads_as_the_estimator_of_its_loss(
    tmp_path, data, loss, l1_ratio, target, cls
):
    X, y = data["X"], data[target]
    datafit = Huber(epsilon=0.8) if loss == "huber" else loss
    alpha = dl1.alpha_max(X, y, loss=datafit, l1_ratio=l1_ratio) / 10
    res = dl1.fit(X, y, alpha=alpha, l1_ratio=l1_ratio, loss=datafit, tol=1e-6, solver="auto")
    res.save(tmp_path / "m")
    assert "estimator" not in json.loads((tmp_path / "m" / MODEL_JSON).read_text())
    est = dl1.load_estimator(tmp_path / "m")
    assert type(est).__name__ == cls
    assert np.array_equal(est.predict(X), res.predict(X))
    assert np.array_equal(est.coef_.ravel(), res.coef_)
    assert est.n_iter_ == res.n_rounds_ and est.n_features_in_ == P
    assert est.fit_intercept is True and est.tol == 1e-6
    if cls in ("LogisticRegression", "LinearSVC"):
        assert est.classes_.tolist() == [0.0, 1.0]
        assert est.C == 1.0 / (N * res.alpha)
        assert est.penalty == ("l1" if l1_ratio == 1.0 else "elasticnet")
        if cls == "LinearSVC":
            assert est.loss == loss
    else:
        assert est.alpha == res.alpha
    if cls in ("ElasticNet", "PoissonRegressor"):
        assert est.l1_ratio == l1_ratio
    if cls == "HuberRegressor":
        assert est.epsilon == 0.8
    # it saves, now with its record, and loads again the same
    est.save(tmp_path / "again")
    again = dl1.load_estimator(tmp_path / "again")
    assert type(again) is type(est) and again.get_params() == est.get_params()
    assert np.array_equal(again.predict(X), res.predict(X))


def test_a_loss_without_an_estimator_is_refused(tmp_path, data):
    X, y = data["X"], data["01"]
    res = dl1.fit(X, y, alpha=dl1.alpha_max(X, y, loss="smooth_hinge") / 5,
                  loss="smooth_hinge", tol=1e-6)  # fmt: skip
    res.save(tmp_path / "m")
    with pytest.raises(ModelFileError, match="'smooth_hinge', which no dl1 estimator fits.*"
                                             "dl1.load_model"):  # fmt: skip
        dl1.load_estimator(tmp_path / "m")
    assert isinstance(dl1.load_model(tmp_path / "m"), FitResult)


def test_a_path_is_refused_pointing_to_load_model(tmp_path, data):
    dl1.path(data["X"], data["y"], n_alphas=3, eps=0.1, tol=1e-6).save(tmp_path / "p")
    with pytest.raises(ModelFileError, match=r"field kind is 'path'.*dl1\.load_model"):
        dl1.load_estimator(tmp_path / "p")


def test_save_needs_a_fit_and_overwrite(tmp_path, data):
    with pytest.raises(NotFittedError):
        dl1.Lasso().save(tmp_path / "m")
    est = _fit("Lasso", data)
    est.save(tmp_path / "m")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        est.save(tmp_path / "m")
    other = dl1.Lasso(alpha=0.05).fit(data["X"], data["y"])
    other.save(tmp_path / "m", overwrite=True)
    assert dl1.load_estimator(tmp_path / "m").alpha == 0.05


def test_load_estimator_is_exported():
    assert "load_estimator" in dl1.__all__
    assert dl1.load_estimator is saved.load_estimator
    assert "load_estimator" in dl1.load_model.__doc__


# -- tampered records -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fitted(data):
    return {"Lasso": _fit("Lasso", data), "LogisticRegression": _fit("LogisticRegression", data)}


def _edit_record(d, edit, *, digest=True):
    """Apply ``edit`` to the estimator record of the model at ``d`` (its digest recomputed,
    so that the record's own checks are what refuses it)."""
    meta = json.loads((d / MODEL_JSON).read_text())
    if callable(edit):
        edit(meta["estimator"])
    else:
        meta["estimator"] = edit
    if digest:
        meta["digest"] = content_digest(meta, {"coef": np.load(d / "coef.npy")})
    (d / MODEL_JSON).write_text(json.dumps(meta))


def _set(**changes):
    return lambda record: record.update(changes)


def _set_param(**changes):
    return lambda record: record["params"].update(changes)


def _set_classes(**changes):
    return lambda record: record["classes"].update(changes)


TAMPERING = [
    ("Lasso", "not an object", "Lasso", "estimator", "is not an object"),
    ("Lasso", "class not an estimator", _set(**{"class": "os.system"}), "estimator.class",
     "is not one of dl1's estimators"),
    ("Lasso", "class a base class", _set(**{"class": "DL1Estimator"}), "estimator.class",
     "is not one of dl1's estimators"),
    ("Lasso", "class missing", lambda r: r.pop("class"), "estimator.class", "is missing"),
    ("Lasso", "params not a dict", _set(params=[["alpha", 0.1]]), "estimator.params",
     "is not an object"),
    ("Lasso", "param of another class", _set_param(C=1.0), "estimator.params.C",
     "is not a saved parameter of Lasso"),
    ("Lasso", "client param", _set_param(client="tcp://evil:8786"), "estimator.params.client",
     "is not a saved parameter of Lasso"),
    ("Lasso", "param an object", _set_param(alpha={"__class__": "x"}), "estimator.params.alpha",
     "is not null, a bool, a finite number, a string or a list"),
    ("Lasso", "param nested list", _set_param(alpha=[[0.1]]), "estimator.params.alpha",
     "is not null, a bool"),
    ("Lasso", "param invalid", _set_param(alpha=-1.0), "estimator.params",
     "are not valid for Lasso"),
    ("Lasso", "another loss", _set(**{"class": "PoissonRegressor"}), "estimator.class",
     "is PoissonRegressor of loss 'poisson', the model's is 'squared'"),
    ("Lasso", "fit_intercept flipped", _set_param(fit_intercept=False),
     "estimator.params.fit_intercept", "is not the model's fit_intercept"),
    ("Lasso", "unknown field", _set(pickle="gASV"), "estimator.pickle",
     "is not a field of the record"),
    ("Lasso", "classes of a regressor", _set(classes={"dtype": "|b1", "values": [False, True]}),
     "estimator.classes", "is given for Lasso, which does not classify"),
    ("Lasso", "feature names short", _set(feature_names=["a"]), "estimator.feature_names",
     f"has 1 entries, expected {P}"),
    ("LogisticRegression", "classes missing", lambda r: r.pop("classes"), "estimator.classes",
     "is missing"),
    ("LogisticRegression", "classes dtype", _set_classes(dtype="|V8"), "estimator.classes.dtype",
     "is not a label dtype"),
    ("LogisticRegression", "classes unsorted", _set_classes(values=["spam", "ham"]),
     "estimator.classes.values", "are not two distinct labels in increasing order"),
    ("LogisticRegression", "classes too long", _set_classes(dtype="<U2"),
     "estimator.classes.values", "do not fit dtype <U2"),
    ("LogisticRegression", "classes not strings", _set_classes(values=["ham", 1]),
     "estimator.classes.values[1]", "is not a string"),
    ("LogisticRegression", "int class out of range",
     _set_classes(dtype="|i1", values=[0, 300]), "estimator.classes.values[1]",
     "is out of range"),
    ("LogisticRegression", "three classes", _set_classes(values=["a", "b", "c"]),
     "estimator.classes.values", "has 3 entries, expected 2"),
    ("LogisticRegression", "class weight negative",
     _set(class_weight=[float.hex(1.0), float.hex(-2.0)]), "estimator.class_weight[1]",
     "is out of range"),
]  # fmt: skip


@pytest.mark.parametrize(
    "name, edit, field, problem", [t[:1] + t[2:] for t in TAMPERING], ids=[t[1] for t in TAMPERING]
)
def test_a_tampered_record_is_refused_naming_file_and_field(
    tmp_path, fitted, name, edit, field, problem
):
    d = tmp_path / "m"
    fitted[name].save(d)
    _edit_record(d, edit)
    with pytest.raises(ModelFileError) as info:
        dl1.load_estimator(d)
    message = str(info.value)
    assert str(d) in message
    assert f"{MODEL_JSON} field {field} {problem}" in message


def test_an_edited_record_without_its_digest_is_refused(tmp_path, fitted):
    d = tmp_path / "m"
    fitted["Lasso"].save(d)
    _edit_record(d, _set_param(alpha=0.5), digest=False)  # a valid value
    for load in (dl1.load_estimator, dl1.load_model):
        with pytest.raises(ModelFileError, match="digest does not match"):
            load(d)


def test_a_model_without_the_record_loads(tmp_path, fitted, data):
    """Older files (no record) load: the record removed, the estimator of the loss."""
    d = tmp_path / "m"
    est = fitted["LogisticRegression"]
    est.save(d)
    meta = json.loads((d / MODEL_JSON).read_text())
    del meta["estimator"]
    meta["digest"] = content_digest(meta, {"coef": np.load(d / "coef.npy")})
    (d / MODEL_JSON).write_text(json.dumps(meta))
    loaded = dl1.load_estimator(d)
    assert type(loaded) is dl1.LogisticRegression
    # the labels the fit read (-1 / +1: the estimator mapped its own before dl1.fit)
    assert loaded.classes_.tolist() == [-1.0, 1.0]
    expected = np.where(est.predict(data["X"]) == "spam", 1.0, -1.0)
    assert np.array_equal(loaded.predict(data["X"]), expected)
