"""One-vs-rest estimators of more than two classes (dl1.LinearSVC, dl1.LogisticRegression(
multi_class="ovr")) saved and read back: the same class, parameters, labels and predictions
bit for bit, the model's scheme, loss and per-class gaps on disk; to_sklearn() predicting as
they do; a one-vs-rest model saved without an estimator record read as the estimator that
fits it; a record disagreeing with the model's scheme or loss refused."""

from __future__ import annotations

import json

import dask
import numpy as np
import pytest
from scipy.special import expit
from sklearn.linear_model import SGDClassifier
from sklearn.multiclass import OneVsRestClassifier

import dl1
from dl1.errors import ModelFileError
from dl1.models import MulticlassModel
from dl1.saving import MODEL_JSON, content_digest
from tests.helpers import planted_classes

N, P, K = 150, 24, 3
NAMES = np.array(["arts", "games", "science"])


@pytest.fixture(autouse=True)
def in_process():
    """No Dask client: every fit and prediction runs in this process."""
    with dask.config.set(scheduler="sync"):
        yield


@pytest.fixture(scope="module")
def data():
    return planted_classes(N, P, K, seed=11)


CASES = {
    "svc-str": (lambda: dl1.LinearSVC(C=0.3, tol=1e-8), NAMES, "squared_hinge"),
    "svc-hinge-int": (lambda: dl1.LinearSVC(loss="hinge", C=0.2), None, "hinge"),
    "svc-elasticnet-balanced": (
        lambda: dl1.LinearSVC("elasticnet", l1_ratio=0.5, class_weight="balanced"),
        np.array([-1.0, 2.0, 7.0]), "squared_hinge"),
    "logistic-ovr": (lambda: dl1.LogisticRegression(multi_class="ovr", C=3.0, tol=1e-8),
                     np.array([-3, 5, 9], dtype=np.int8), "logistic"),
    "logistic-ovr-no-intercept": (
        lambda: dl1.LogisticRegression("elasticnet", l1_ratio=0.3, multi_class="ovr",
                                       fit_intercept=False), NAMES, "logistic"),
}  # fmt: skip


def _methods(est):
    names = ["predict", "decision_function"]
    return names + (["predict_proba", "predict_log_proba"] if hasattr(est, "predict_proba")
                    else [])  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_saved_one_vs_rest_estimator_loads_and_predicts_bit_for_bit(tmp_path, data, case):
    make, labels, loss = CASES[case]
    X, codes = data
    y = codes if labels is None else labels[codes]
    est = make().fit(X, y)
    assert est.coef_.shape == (K, P) and est.result_.multi_class == "ovr"
    est.save(tmp_path / "m")
    meta = json.loads((tmp_path / "m" / MODEL_JSON).read_text())
    assert (meta["kind"], meta["multi_class"], meta["loss"]) == ("multiclass", "ovr", loss)
    gaps = np.array([float.fromhex(g) for g in meta["gaps"]])
    assert np.array_equal(gaps, est.result_.gaps_) and gaps.max() == est.gap_

    loaded = dl1.load_estimator(tmp_path / "m")
    assert type(loaded) is type(est) and loaded.get_params() == est.get_params()
    assert loaded.classes_.dtype == est.classes_.dtype
    assert loaded.classes_.tolist() == est.classes_.tolist()
    for method in _methods(est):
        got, expected = getattr(loaded, method)(X), getattr(est, method)(X)
        assert got.dtype == expected.dtype and np.array_equal(got, expected), method
    for attr in ("coef_", "intercept_", "n_iter_", "dual_gap_", "gap_", "n_features_in_"):
        assert np.array_equal(getattr(loaded, attr), getattr(est, attr)), attr
    if est.class_weight_ is not None:
        assert np.array_equal(loaded.class_weight_, est.class_weight_)
    assert loaded.score(X, y) == est.score(X, y)
    # independent references: X W^T + b from the loaded coefficients; normalised sigmoids
    Z = X.toarray() @ loaded.coef_.T + loaded.intercept_
    np.testing.assert_allclose(loaded.decision_function(X), Z, rtol=1e-12, atol=1e-13)
    top = np.sort(Z, axis=1)  # the hinge's LP puts margins exactly at -1: rounding breaks ties
    clear = top[:, -1] - top[:, -2] > 1e-9
    assert clear.mean() > 0.5
    assert np.array_equal(loaded.predict(X)[clear], est.classes_[np.argmax(Z, axis=1)][clear])
    sk = loaded.to_sklearn()
    assert isinstance(sk, OneVsRestClassifier if loss == "logistic" else SGDClassifier)
    assert np.array_equal(sk.predict(X)[clear], est.predict(X)[clear])
    np.testing.assert_allclose(sk.decision_function(X), Z, rtol=1e-12, atol=1e-13)
    if loss == "logistic":
        S = expit(Z)
        np.testing.assert_allclose(loaded.predict_proba(X), S / S.sum(1, keepdims=True),
                                   rtol=1e-12)  # fmt: skip
        np.testing.assert_allclose(sk.predict_proba(X), loaded.predict_proba(X), rtol=1e-12)

    loaded.save(tmp_path / "again")  # saves again to the same content
    again = json.loads((tmp_path / "again" / MODEL_JSON).read_text())
    assert again["estimator"] == meta["estimator"] and again["digest"] == meta["digest"]
    model = dl1.load_model(tmp_path / "m")
    assert isinstance(model, MulticlassModel) and model.loss == loss
    assert np.array_equal(model.predict(X), est.predict(X))


@pytest.mark.parametrize("loss", ["squared_hinge", "hinge", "logistic"])
def test_a_saved_one_vs_rest_model_loads_as_the_estimator_fitting_it(tmp_path, data, loss):
    """Pass: a one-vs-rest model of dl1.fit_multiclass saved without a record loads as
    LinearSVC(loss) or LogisticRegression(multi_class="ovr") with C = 1 / (n alpha), which
    refits the same model."""
    X, codes = data
    alpha = 0.02
    res = dl1.fit_multiclass(X, NAMES[codes], alpha=alpha, multi_class="ovr", loss=loss,
                             tol=1e-9)  # fmt: skip
    model = MulticlassModel.from_result(res, alpha=alpha, l1_ratio=1.0, n_samples=N)
    model.save(tmp_path / "m")
    est = dl1.load_estimator(tmp_path / "m")
    if loss == "logistic":
        assert type(est) is dl1.LogisticRegression and est.multi_class == "ovr"
    else:
        assert type(est) is dl1.LinearSVC and est.loss == loss
    assert est.C == 1.0 / (N * alpha) and est.tol == 1e-9 and est.penalty == "l1"
    assert np.array_equal(est.decision_function(X), model.decision_function(X))
    refit = type(est)(**est.get_params()).fit(X, NAMES[codes])
    np.testing.assert_allclose(refit.coef_, est.coef_, atol=1e-6)
    with pytest.raises(ModelFileError, match="no dl1 estimator fits"):
        grouped = dl1.fit_multiclass(X, codes, alpha=alpha, penalty="grouped", tol=1e-6)
        MulticlassModel.from_result(grouped, alpha=alpha, l1_ratio=1.0, penalty="grouped",
                                    n_samples=N).save(tmp_path / "g")  # fmt: skip
        dl1.load_estimator(tmp_path / "g")


def test_a_hinge_model_has_no_probabilities(data):
    X, codes = data
    res = dl1.fit_multiclass(X, codes, alpha=0.02, multi_class="ovr", loss="hinge")
    model = MulticlassModel.from_result(res, alpha=0.02, l1_ratio=1.0, n_samples=N)
    with pytest.raises(ValueError, match="a one-vs-rest hinge model gives no probabilities"):
        model.predict_proba(X)


# -- records that disagree with the model -------------------------------------------------------
def _arrays(d):
    return {n: np.load(d / f"{n}.npy") for n in ("coef_data", "coef_indices", "coef_indptr")}


def _edit_record(d, edit):
    """Apply ``edit`` to the estimator record at ``d``, its digest recomputed (so that the
    record's own checks are what refuses it)."""
    meta = json.loads((d / MODEL_JSON).read_text())
    edit(meta["estimator"])
    meta["digest"] = content_digest(meta, _arrays(d))
    (d / MODEL_JSON).write_text(json.dumps(meta))


def _svc_as_logistic(record):
    record["class"] = "LogisticRegression"
    record["params"].pop("loss")


TAMPERING = [
    ("svc", "another loss", lambda r: r["params"].update(loss="hinge"), "estimator.params",
     "do not give the model's scheme and loss ('ovr', 'squared_hinge')"),
    ("svc", "a logistic class", _svc_as_logistic, "estimator.class",
     "is LogisticRegression, which fits no one-vs-rest squared_hinge model"),
    ("logistic", "multinomial", lambda r: r["params"].update(multi_class="multinomial"),
     "estimator.params", "do not give the model's scheme and loss ('ovr', 'logistic')"),
    ("logistic", "a CV class", lambda r: r.update({"class": "LogisticRegressionCV",
                                                   "params": {}}),
     "estimator.class", "is LogisticRegressionCV, which fits no one-vs-rest logistic model"),
    ("svc", "an elastic net", lambda r: r["params"].update(penalty="elasticnet", l1_ratio=0.5),
     "estimator.params", "do not give the model's penalty ('l1', l1_ratio 1.0)"),
]  # fmt: skip


@pytest.mark.parametrize("which, edit, field, problem", [(t[0], *t[2:]) for t in TAMPERING],
                         ids=[t[1] for t in TAMPERING])  # fmt: skip
def test_a_record_disagreeing_with_the_scheme_is_refused(tmp_path, data, which, edit, field,
                                                         problem):  # fmt: skip
    X, codes = data
    est = (dl1.LinearSVC(C=0.3) if which == "svc"
           else dl1.LogisticRegression(multi_class="ovr")).fit(X, NAMES[codes])  # fmt: skip
    d = tmp_path / "m"
    est.save(d)
    _edit_record(d, edit)
    with pytest.raises(ModelFileError) as info:
        dl1.load_estimator(d)
    assert str(d) in str(info.value)
    assert f"{MODEL_JSON} field {field} {problem}" in str(info.value)
