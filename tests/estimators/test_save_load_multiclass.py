"""A ``dl1.LogisticRegression`` of more than two classes saved (``est.save``) and read back
(``dl1.load_estimator``, ``dl1.load_model``): the same class, parameters, labels and
predictions bit for bit, its model a CSR matrix on disk; a saved multinomial model without
an estimator record read as the LogisticRegression that fits it; a tampered record refused,
naming the file and field."""

from __future__ import annotations

import json

import dask
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from scipy.special import softmax

import dl1
from dl1.errors import ModelFileError
from dl1.models import MulticlassModel
from dl1.saving import MODEL_JSON, content_digest
from tests.estimators.test_save_load import _set, _set_classes, _set_param
from tests.helpers import planted_classes

N, P, K = 150, 24, 4
NAMES = np.array(["arts", "games", "science", "sports"])


@pytest.fixture(autouse=True)
def in_process():
    """No Dask client: every fit and prediction runs in this process."""
    with dask.config.set(scheduler="sync"):
        yield


@pytest.fixture(scope="module")
def data():
    return planted_classes(N, P, K, seed=3)


def _outputs(est, X):
    return {m: getattr(est, m)(X) for m in
            ("predict", "decision_function", "predict_proba", "predict_log_proba")}  # fmt: skip


def _arrays(d):
    return {n: np.load(d / f"{n}.npy") for n in ("coef_data", "coef_indices", "coef_indptr")}


CASES = {
    "str": (lambda: dl1.LogisticRegression(C=2.0, tol=1e-8), NAMES),
    "int": (lambda: dl1.LogisticRegression(penalty="elasticnet", l1_ratio=0.6, C=4.0), None),
    "float": (lambda: dl1.LogisticRegression(class_weight="balanced", max_iter=200),
              np.array([-1.0, 0.0, 2.0, 7.0])),
    "int8": (lambda: dl1.LogisticRegression(fit_intercept=False, C=3.0),
             np.array([-3, 5, 9, 100], dtype=np.int8)),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_saved_multinomial_estimator_loads_and_predicts_bit_for_bit(tmp_path, data, case):
    make, labels = CASES[case]
    X, codes = data
    y = codes if labels is None else labels[codes]
    est = make().fit(X, y)
    assert est.coef_.shape == (K, P)
    est.save(tmp_path / "m")
    assert sorted(f.name for f in (tmp_path / "m").iterdir()) == [
        "coef_data.npy", "coef_indices.npy", "coef_indptr.npy", MODEL_JSON]  # fmt: skip
    # on disk: the CSR matrix (K, p) of the nonzero coefficients, a class a row
    a = _arrays(tmp_path / "m")
    on_disk = sp.csr_matrix((a["coef_data"], a["coef_indices"], a["coef_indptr"]), (K, P))
    assert np.array_equal(on_disk.toarray(), est.coef_)
    assert a["coef_data"].shape[0] == np.count_nonzero(est.coef_)

    loaded = dl1.load_estimator(tmp_path / "m")
    assert type(loaded) is dl1.LogisticRegression
    assert loaded.get_params() == est.get_params()
    assert loaded.classes_.dtype == est.classes_.dtype
    assert loaded.classes_.tolist() == est.classes_.tolist()
    expected, got = _outputs(est, X), _outputs(loaded, X)
    for method in expected:
        assert got[method].dtype == expected[method].dtype, method
        assert np.array_equal(got[method], expected[method]), method
    for attr in ("coef_", "intercept_", "n_iter_", "dual_gap_", "gap_", "n_features_in_"):
        assert np.array_equal(getattr(loaded, attr), getattr(est, attr)), attr
        assert np.shape(getattr(loaded, attr)) == np.shape(getattr(est, attr)), attr
    if est.class_weight_ is None:
        assert loaded.class_weight_ is None
    else:
        assert est.class_weight_.shape == (K,)
        assert np.array_equal(loaded.class_weight_, est.class_weight_)
    assert loaded.score(X, y) == est.score(X, y)
    # an independent reference: the softmax of X W^T + b from the loaded coefficients
    Z = X.toarray() @ loaded.coef_.T + loaded.intercept_
    np.testing.assert_allclose(got["predict_proba"], softmax(Z, axis=1), rtol=1e-12, atol=1e-15)
    assert np.array_equal(got["predict"], est.classes_[np.argmax(Z, axis=1)])
    sk = loaded.to_sklearn()
    assert np.array_equal(sk.predict(X), expected["predict"])
    np.testing.assert_allclose(sk.predict_proba(X), expected["predict_proba"], rtol=1e-12)

    # it saves again to the same content; load_model reads the files as result_
    loaded.save(tmp_path / "again")
    first = json.loads((tmp_path / "m" / MODEL_JSON).read_text())
    again = json.loads((tmp_path / "again" / MODEL_JSON).read_text())
    assert again["estimator"] == first["estimator"] and again["digest"] == first["digest"]
    model = dl1.load_model(tmp_path / "m")
    assert isinstance(model, MulticlassModel) and isinstance(est.result_, MulticlassModel)
    assert np.array_equal(model.decision_function(X), est.result_.decision_function(X))
    assert np.array_equal(model.predict(X), expected["predict"])


def test_sample_weights_and_feature_names_come_back(tmp_path, data):
    X, codes = data
    frame = pd.DataFrame(X.toarray(), columns=[f"f{j}" for j in range(P)])
    sw = np.random.default_rng(0).uniform(0.5, 2.0, N)
    est = dl1.LogisticRegression(C=2.0).fit(frame, NAMES[codes], sample_weight=sw)
    est.save(tmp_path / "m")
    loaded = dl1.load_estimator(tmp_path / "m")
    assert loaded.feature_names_in_.tolist() == est.feature_names_in_.tolist()
    assert np.array_equal(loaded.predict_proba(frame), est.predict_proba(frame))
    # the model records the weighted problem's alpha = 1 / (C sum s)
    assert dl1.load_model(tmp_path / "m").alpha == 1.0 / (2.0 * sw.sum())
    with pytest.raises(ValueError, match="feature names"):
        loaded.predict(frame[frame.columns[::-1]])


def test_an_estimator_fitted_out_of_core_saves_and_predicts_a_store_lazily(tmp_path, data):
    X, codes = data
    dl1.from_scipy(X[:100], codes[:100].astype(float), tmp_path / "s.zarr", X_test=X[100:],
                   y_test=codes[100:].astype(float), n_feature_blocks=3,
                   row_block_rows=25)  # fmt: skip
    est = dl1.LogisticRegression(C=3.0, tol=1e-8).fit(tmp_path / "s.zarr")
    assert est.classes_.tolist() == [0.0, 1.0, 2.0, 3.0]
    est.save(tmp_path / "m")
    loaded = dl1.load_estimator(tmp_path / "m")
    for method in ("predict", "predict_proba", "decision_function"):
        lazy = getattr(loaded, method)(tmp_path / "s.zarr")
        assert type(lazy).__module__.startswith("dask."), method
        expected = getattr(est, method)(tmp_path / "s.zarr").compute()
        assert np.array_equal(lazy.compute(), expected), method
        np.testing.assert_allclose(expected, getattr(est, method)(X[100:]), rtol=1e-12,
                                   atol=1e-14)  # fmt: skip
    assert loaded.score(tmp_path / "s.zarr") == est.score(tmp_path / "s.zarr")


@pytest.mark.parametrize("l1_ratio", [1.0, 0.5])
def test_a_saved_multinomial_model_loads_as_the_logistic_regression_fitting_it(
    tmp_path, data, l1_ratio
):
    X, codes = data
    alpha = 0.02
    res = dl1.fit_multiclass(X, NAMES[codes], alpha=alpha, l1_ratio=l1_ratio, tol=1e-8)
    model = MulticlassModel.from_result(res, alpha=alpha, l1_ratio=l1_ratio, n_samples=N)
    model.save(tmp_path / "m")
    assert "estimator" not in json.loads((tmp_path / "m" / MODEL_JSON).read_text())
    est = dl1.load_estimator(tmp_path / "m")
    assert type(est) is dl1.LogisticRegression
    assert est.C == 1.0 / (N * alpha) and est.tol == 1e-8 and est.fit_intercept is True
    assert est.penalty == ("l1" if l1_ratio == 1.0 else "elasticnet")
    assert est.classes_.tolist() == NAMES.tolist()
    assert np.array_equal(est.predict_proba(X), model.predict_proba(X))
    # the estimator of those parameters fits the same model (to the certified tolerance)
    refit = dl1.LogisticRegression(**est.get_params()).fit(X, NAMES[codes])
    np.testing.assert_allclose(refit.predict_proba(X), est.predict_proba(X), atol=1e-3)
    est.save(tmp_path / "again")
    again = dl1.load_estimator(tmp_path / "again")
    assert again.get_params() == est.get_params()
    assert np.array_equal(again.predict(X), model.predict(X))


def test_a_grouped_model_has_no_estimator(tmp_path, data):
    X, codes = data
    res = dl1.fit_multiclass(X, codes, alpha=0.02, penalty="grouped", tol=1e-8)
    MulticlassModel.from_result(res, alpha=0.02, l1_ratio=1.0, penalty="grouped",
                                n_samples=N).save(tmp_path / "m")  # fmt: skip
    with pytest.raises(ModelFileError, match="field penalty is 'grouped', which no dl1 "
                                             "estimator fits.*dl1.load_model"):  # fmt: skip
        dl1.load_estimator(tmp_path / "m")
    assert dl1.load_model(tmp_path / "m").penalty == "grouped"


# -- tampered records -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fitted(data):
    X, codes = data
    return dl1.LogisticRegression(C=2.0, class_weight="balanced").fit(X, NAMES[codes])


def _edit_record(d, edit):
    """Apply ``edit`` to the estimator record at ``d``, its digest recomputed (so that the
    record's own checks are what refuses it)."""
    meta = json.loads((d / MODEL_JSON).read_text())
    edit(meta["estimator"])
    meta["digest"] = content_digest(meta, _arrays(d))
    (d / MODEL_JSON).write_text(json.dumps(meta))


TAMPERING = [
    ("a one-vs-rest hinge class", lambda r: (r.update({"class": "LinearSVC"}),
                                             r["params"].pop("n_jobs"),
                                             r["params"].pop("multi_class")),
     "estimator.class", "is LinearSVC, which fits no multinomial model"),
    ("one-vs-rest", _set_param(multi_class="ovr"), "estimator.params",
     "do not give the model's scheme and loss ('multinomial', 'multinomial')"),
    ("another l1_ratio", _set_param(penalty="elasticnet", l1_ratio=0.5), "estimator.params",
     "do not give the model's penalty ('l1', l1_ratio 1.0)"),
    ("fit_intercept flipped", _set_param(fit_intercept=False),
     "estimator.params.fit_intercept", "is not the model's fit_intercept"),
    ("two classes", _set_classes(values=["arts", "games"]), "estimator.classes.values",
     "has 2 entries, expected 4"),
    ("five classes", _set_classes(values=[*NAMES.tolist(), "zoo"]), "estimator.classes.values",
     "has 5 entries, expected 4"),
    ("other classes", _set_classes(values=["arts", "games", "music", "sports"]),
     "estimator.classes", "are not the model's classes"),
    ("other dtype", _set_classes(dtype="|O"), "estimator.classes", "are not the model's classes"),
    ("unsorted classes", _set_classes(values=["games", "arts", "science", "sports"]),
     "estimator.classes.values", "are not 4 distinct labels in increasing order"),
    ("classes missing", lambda r: r.pop("classes"), "estimator.classes", "is missing"),
    ("class weights short", _set(class_weight=[float.hex(1.0)] * 2), "estimator.class_weight",
     "has 2 entries, expected 4"),
    ("class weight NaN", _set(class_weight=[float.hex(1.0)] * 3 + ["nan"]),
     "estimator.class_weight[3]", "is not finite"),
]  # fmt: skip


@pytest.mark.parametrize("edit, field, problem", [t[1:] for t in TAMPERING],
                         ids=[t[0] for t in TAMPERING])  # fmt: skip
def test_a_tampered_multinomial_record_is_refused_naming_file_and_field(
    tmp_path, fitted, edit, field, problem
):
    d = tmp_path / "m"
    fitted.save(d)
    _edit_record(d, edit)
    with pytest.raises(ModelFileError) as info:
        dl1.load_estimator(d)
    assert str(d) in str(info.value)
    assert f"{MODEL_JSON} field {field} {problem}" in str(info.value)
