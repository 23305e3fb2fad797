"""Multinomial models (:class:`dl1.models.MulticlassModel`) predict as NumPy's softmax of
``X W^T + b``, save and load bit for bit (in memory, and lazily on a store, in process and
on a cluster), and their files are checked as untrusted input: a damaged file, a shape or
a class count that disagrees, a NaN or an edited value is refused, naming file and field."""

from __future__ import annotations

import copy
import json

import dask
import numpy as np
import pytest
import scipy.sparse as sp
from scipy.special import log_softmax, softmax
from sklearn.metrics import accuracy_score

import dl1
from dl1.errors import ModelFileError
from dl1.models import MulticlassModel
from dl1.saving import MODEL_JSON, content_digest

N, P, K = 160, 30, 3
LABELS = np.array([2.0, 5.0, 9.0])


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    X = sp.random(N, P, density=0.25, format="csr", random_state=rng)
    W = rng.standard_normal((P, K)) * (rng.random((P, 1)) < 0.4) * 3
    return X, LABELS[np.argmax(X @ W + rng.gumbel(size=(N, K)), axis=1)]


@pytest.fixture(scope="module")
def models(data):
    X, y = data
    out = {}
    with dask.config.set(scheduler="sync"):
        for penalty, l1_ratio in (("l1", 1.0), ("l1", 0.5), ("grouped", 0.8)):
            res = dl1.fit_multiclass(X, y, alpha=0.01, l1_ratio=l1_ratio, penalty=penalty,
                                     tol=1e-8)  # fmt: skip
            out[penalty, l1_ratio] = MulticlassModel.from_result(
                res, alpha=0.01, l1_ratio=l1_ratio, penalty=penalty, n_samples=N
            )
    return out


def _reference(model, X):
    """The decision values, from a dense copy of the coefficients (NumPy only)."""
    return X.toarray() @ model.coef_.toarray().T + model.intercept_


@pytest.mark.parametrize("key", [("l1", 1.0), ("l1", 0.5), ("grouped", 0.8)])
def test_a_multinomial_model_round_trips_bit_for_bit(tmp_path, data, models, key):
    X, y = data
    model = models[key]
    assert model.coef_.shape == (K, P) and model.converged_ and model.gap_ <= 1e-8
    Z = _reference(model, X)
    np.testing.assert_allclose(model.decision_function(X), Z, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(model.predict_proba(X), softmax(Z, axis=1), rtol=1e-12)
    assert np.array_equal(model.predict(X), LABELS[np.argmax(Z, axis=1)])
    assert model.score(X, y) == accuracy_score(y, LABELS[np.argmax(Z, axis=1)])

    back = dl1.load_model(model.save(tmp_path / "m"))
    assert isinstance(back, MulticlassModel)
    for attr in ("alpha", "l1_ratio", "penalty", "tol", "fit_intercept", "gap_", "primal_",
                 "dual_", "converged_", "n_rounds_", "n_epochs_", "n_samples_"):  # fmt: skip
        assert getattr(back, attr) == getattr(model, attr), attr
    assert back.classes_.dtype == LABELS.dtype and back.classes_.tolist() == LABELS.tolist()
    assert np.array_equal(back.intercept_, model.intercept_)
    assert (back.coef_ != model.coef_).nnz == 0
    for method in ("decision_function", "predict_proba", "predict"):
        assert np.array_equal(getattr(back, method)(X), getattr(model, method)(X)), method
    sk = back.to_sklearn()
    assert np.array_equal(sk.predict(X), model.predict(X))
    np.testing.assert_allclose(sk.predict_log_proba(X), log_softmax(Z, axis=1), rtol=1e-10)
    back.save(tmp_path / "again")
    digest = [json.loads((tmp_path / d / MODEL_JSON).read_text())["digest"]
              for d in ("m", "again")]  # fmt: skip
    assert digest[0] == digest[1]


def test_a_loaded_model_predicts_a_store_on_a_cluster(local_cluster, tmp_path, data, models):
    """Lazily, blockwise on the workers, as the saved model in memory."""
    X, y = data
    dl1.from_scipy(X[:100], y[:100], tmp_path / "s.zarr", X_test=X[100:], y_test=y[100:],
                   n_feature_blocks=3, row_block_rows=16)  # fmt: skip
    model = models["l1", 1.0]
    back = dl1.load_model(model.save(tmp_path / "m"))
    lazy = back.predict_proba(tmp_path / "s.zarr")
    assert type(lazy).__module__.startswith("dask.") and lazy.shape == (60, K)
    got = local_cluster.compute(lazy).result()
    np.testing.assert_allclose(got, softmax(_reference(model, X[100:]), axis=1), rtol=1e-12)
    labels = local_cluster.compute(back.predict(tmp_path / "s.zarr", split="train")).result()
    assert np.array_equal(labels, model.predict(X[:100]))
    with dask.config.set(scheduler=local_cluster.get):
        assert back.score(tmp_path / "s.zarr") == accuracy_score(y[100:], model.predict(X[100:]))


# -- untrusted files --------------------------------------------------------------------------
def _edit_json(d, **changes):
    meta = json.loads((d / MODEL_JSON).read_text())
    meta.update(changes)
    (d / MODEL_JSON).write_text(json.dumps(meta))


def _edit_npy(d, name, edit):
    a = np.load(d / f"{name}.npy")
    a = edit(a)
    np.save(d / f"{name}.npy", a)


def _swap_first_indices(a):
    a = a.copy()
    a[0], a[1] = a[1], a[0]
    return a


def _meta(d):
    return json.loads((d / MODEL_JSON).read_text())


TAMPERING = [
    ("indptr one row short", lambda d: _edit_npy(d, "coef_indptr", lambda a: a[:-1]),
     r"coef_indptr.npy has shape \(3,\), expected \(4,\)"),
    ("more classes than coef rows", lambda d: _edit_json(d, n_classes=4),
     "field classes.values has 3 entries, expected 4"),
    ("a class count of one", lambda d: _edit_json(d, n_classes=1),
     "field n_classes is out of range"),
    ("classes short", lambda d: _edit_json(d, classes={"dtype": "<f8",
                                                       "values": [float.hex(2.0)] * 2}),
     "field classes.values has 2 entries, expected 3"),
    ("classes unsorted", lambda d: _edit_json(d, classes={
        "dtype": "<f8", "values": [float.hex(x) for x in (5.0, 2.0, 9.0)]}),
     "field classes.values are not 3 distinct labels in increasing order"),
    ("class NaN", lambda d: _edit_json(d, classes={
        "dtype": "<f8", "values": [float.hex(2.0), "nan", float.hex(9.0)]}),
     r"field classes.values\[1\] is not finite"),
    ("intercept short", lambda d: _edit_json(d, intercept=_meta(d)["intercept"][:2]),
     "field intercept has 2 entries, expected 3"),
    ("intercept NaN", lambda d: _edit_json(d, intercept=["nan", *_meta(d)["intercept"][1:]]),
     r"field intercept\[0\] is not finite"),
    ("coefficient NaN", lambda d: _edit_npy(d, "coef_data", lambda a: a * np.nan),
     "coef_data.npy holds nan at position 0"),
    ("coefficients of the wrong dtype", lambda d: _edit_npy(d, "coef_data",
                                                              lambda a: a.astype(np.float32)),
     "coef_data.npy has dtype <f4, expected <f8"),
    ("a feature out of range", lambda d: _edit_npy(d, "coef_indices", lambda a: a + P),
     r"coef_indices.npy holds indices outside \[0, 30\)"),
    ("fewer features", lambda d: _edit_json(d, n_features=2),
     r"coef_indptr.npy does not run up from 0 to at most n_classes \* n_features = 6"),
    ("indices unsorted", lambda d: _edit_npy(d, "coef_indices", _swap_first_indices),
     "coef_indices.npy is not strictly increasing within each row"),
    ("indptr decreasing", lambda d: _edit_npy(d, "coef_indptr", lambda a: a[::-1].copy()),
     "coef_indptr.npy does not run up from 0"),
    ("indices missing", lambda d: (d / "coef_indices.npy").unlink(),
     "coef_indices.npy is missing"),
    ("another loss", lambda d: _edit_json(d, loss="logistic"),
     "field loss is not 'multinomial'"),
    ("another penalty", lambda d: _edit_json(d, penalty="l2"),
     r"field penalty is not one of \('l1', 'grouped'\)"),
    ("l1_ratio above 1", lambda d: _edit_json(d, l1_ratio=float.hex(1.5)),
     r"field l1_ratio is out of range \[0.0, 1.0\]"),
    ("alpha negative", lambda d: _edit_json(d, alpha=float.hex(-0.01)),
     "field alpha is out of range"),
    ("converged not a bool", lambda d: _edit_json(d, converged="yes"),
     "field converged is not true or false"),
    ("a valid alpha edited", lambda d: _edit_json(d, alpha=float.hex(0.5)),
     "field digest does not match the model's fields and arrays"),
    ("a valid class edited", lambda d: _edit_json(d, classes={
        "dtype": "<f8", "values": [float.hex(x) for x in (2.0, 5.0, 10.0)]}),
     "field digest does not match"),
    ("a coefficient changed", lambda d: _edit_npy(d, "coef_data", lambda a: a + 1.0),
     "field digest does not match"),
    ("no digest", lambda d: _edit_json(d, digest=None), "field digest is not a SHA-256"),
]  # fmt: skip


@pytest.mark.parametrize("edit, message", [t[1:] for t in TAMPERING],
                         ids=[t[0] for t in TAMPERING])  # fmt: skip
def test_a_damaged_multinomial_model_is_refused_naming_file_and_field(
    tmp_path, models, edit, message
):
    d = models["l1", 1.0].save(tmp_path / "m")
    assert models["l1", 1.0].coef_.nnz > 2
    edit(d)
    for load in (dl1.load_model, dl1.load_estimator):
        with pytest.raises(ModelFileError, match=message) as info:
            load(d)
        assert str(d) in str(info.value)


# -- one-vs-rest models -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def ovr_models(data):
    X, y = data
    out = {}
    with dask.config.set(scheduler="sync"):
        for loss in ("logistic", "squared_hinge", "hinge"):
            res = dl1.fit_multiclass(X, y, alpha=0.01, multi_class="ovr", loss=loss, tol=1e-8)
            out[loss] = MulticlassModel.from_result(res, alpha=0.01, l1_ratio=1.0, n_samples=N)
    return out


@pytest.mark.parametrize("loss", ["logistic", "squared_hinge", "hinge"])
def test_a_one_vs_rest_model_round_trips_bit_for_bit(tmp_path, data, ovr_models, loss):
    """Pass: a one-vs-rest model predicts as NumPy's argmax of X W^T + b (its logistic
    probabilities: the normalised sigmoids), and loads back with its scheme, loss and
    per-class gaps, predicting bit for bit."""
    X, y = data
    model = ovr_models[loss]
    assert (model.multi_class, model.loss) == ("ovr", loss) and model.gaps_.shape == (K,)
    assert model.converged_ and model.gap_ == model.gaps_.max() <= 1e-8
    Z = _reference(model, X)
    np.testing.assert_allclose(model.decision_function(X), Z, rtol=1e-12, atol=1e-13)
    # the hinge's LP vertices put many margins exactly at -1: rounding breaks those ties
    top = np.sort(Z, axis=1)
    clear = top[:, -1] - top[:, -2] > 1e-9
    assert clear.mean() > 0.5
    assert np.array_equal(model.predict(X)[clear], LABELS[np.argmax(Z, axis=1)][clear])
    back = dl1.load_model(model.save(tmp_path / "m"))
    for attr in ("multi_class", "loss", "alpha", "l1_ratio", "penalty", "tol", "gap_", "primal_",
                 "dual_", "converged_", "n_rounds_", "n_epochs_", "n_samples_"):  # fmt: skip
        assert getattr(back, attr) == getattr(model, attr), attr
    assert np.array_equal(back.gaps_, model.gaps_)
    assert np.array_equal(back.intercept_, model.intercept_)
    assert (back.coef_ != model.coef_).nnz == 0
    methods = ["decision_function", "predict"] + (["predict_proba"] if loss == "logistic" else [])
    for method in methods:
        assert np.array_equal(getattr(back, method)(X), getattr(model, method)(X)), method
    if loss == "logistic":
        S = 1.0 / (1.0 + np.exp(-Z))
        np.testing.assert_allclose(back.predict_proba(X), S / S.sum(1, keepdims=True), rtol=1e-12)
    else:
        with pytest.raises(ValueError, match=f"one-vs-rest {loss} model gives no probabilities"):
            back.predict_proba(X)
    sk = back.to_sklearn()
    np.testing.assert_allclose(sk.decision_function(X), Z, rtol=1e-12, atol=1e-13)
    assert np.array_equal(sk.predict(X)[clear], model.predict(X)[clear])


def test_a_multinomial_model_saved_before_one_vs_rest_loads(tmp_path, models, data):
    """Pass: a multinomial model's files without the ``multi_class`` field (dl1 before
    one-vs-rest) load as the multinomial model."""
    d = models["l1", 1.0].save(tmp_path / "m")
    meta = _meta(d)
    assert meta.pop("multi_class") == "multinomial"
    arrays = {n: np.load(d / f"{n}.npy") for n in ("coef_data", "coef_indices", "coef_indptr")}
    meta["digest"] = content_digest(meta, arrays)
    (d / MODEL_JSON).write_text(json.dumps(meta))
    back = dl1.load_model(d)
    assert (back.multi_class, back.loss, back.gaps_) == ("multinomial", "multinomial", None)
    assert np.array_equal(back.predict_proba(data[0]), models["l1", 1.0].predict_proba(data[0]))


def test_a_gap_rounded_below_zero_round_trips(tmp_path, ovr_models):
    """A class's certified gap computed in floating point can be -2e-16 at an exact answer:
    saved as computed and read back (a gap of -1, tampering, is refused below)."""
    model = copy.copy(ovr_models["squared_hinge"])  # the fixture's, untouched
    model.gaps_ = np.array([-2.220446049250313e-16, *model.gaps_[1:]])
    back = dl1.load_model(model.save(tmp_path / "m"))
    assert np.array_equal(back.gaps_, model.gaps_)


OVR_TAMPERING = [
    ("another scheme", "squared_hinge", lambda d: _edit_json(d, multi_class="ova"),
     "field multi_class is not 'multinomial' or 'ovr'"),
    ("the multinomial loss", "squared_hinge", lambda d: _edit_json(d, loss="multinomial"),
     r"field loss is not one of \('logistic', 'squared_hinge', 'hinge'\)"),
    ("a multinomial hinge", "hinge", lambda d: _edit_json(d, multi_class="multinomial"),
     "field loss is not 'multinomial'"),
    ("the grouped penalty", "logistic", lambda d: _edit_json(d, penalty="grouped"),
     r"field penalty is not one of \('l1',\)"),
    ("gaps short", "logistic", lambda d: _edit_json(d, gaps=_meta(d)["gaps"][:2]),
     "field gaps has 2 entries, expected 3"),
    ("gaps missing", "logistic", lambda d: _edit_json(d, gaps=None), "field gaps is not"),
    ("a gap NaN", "logistic", lambda d: _edit_json(d, gaps=[*_meta(d)["gaps"][:2], "nan"]),
     r"field gaps\[2\] is not finite"),
    ("a gap negative", "logistic", lambda d: _edit_json(d, gaps=[float.hex(-1.0),
                                                                 *_meta(d)["gaps"][1:]]),
     r"field gaps\[0\] is out of range"),
    ("a hinge elastic net", "hinge", lambda d: _edit_json(d, l1_ratio=float.hex(0.5)),
     "field l1_ratio is not 1 .the one-vs-rest hinge takes the pure L1 penalty"),
    ("a valid loss edited", "squared_hinge", lambda d: _edit_json(d, loss="hinge"),
     "field digest does not match"),
    ("a valid gap edited", "logistic", lambda d: _edit_json(d, gaps=[float.hex(0.5)] * 3),
     "field digest does not match"),
]  # fmt: skip


@pytest.mark.parametrize("loss, edit, message", [t[1:] for t in OVR_TAMPERING],
                         ids=[t[0] for t in OVR_TAMPERING])  # fmt: skip
def test_a_damaged_one_vs_rest_model_is_refused_naming_file_and_field(
    tmp_path, ovr_models, loss, edit, message
):
    d = ovr_models[loss].save(tmp_path / "m")
    edit(d)
    for load in (dl1.load_model, dl1.load_estimator):
        with pytest.raises(ModelFileError, match=message) as info:
            load(d)
        assert str(d) in str(info.value)
