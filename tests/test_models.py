"""Models that act: FitResult / PathResult predict, score, save and load (untrusted files),
and convert to scikit-learn, checked against NumPy and scikit-learn."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import warnings

import dask
import dask.array as da
import joblib
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.metrics import accuracy_score, r2_score

import dl1
from dl1.errors import ModelFileError, ValidationError
from dl1.paths.result import PathResult
from dl1.saving import MAX_JSON_BYTES, MODEL_JSON
from dl1.solvers.result import FitResult

N, P = 120, 30
#: (loss, l1_ratio, tol) of the fits: every loss, pure L1 and elastic net
CASES = [
    ("squared", 1.0, 1e-10),
    ("squared", 0.5, 1e-10),
    ("logistic", 1.0, 1e-10),
    ("logistic", 0.5, 1e-10),
    ("hinge", 0.5, 1e-3),
    ("smooth_hinge", 1.0, 1e-8),
    ("squared_hinge", 1.0, 1e-8),
]


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = sp.random(N, P, density=0.3, format="csr", random_state=rng)
    w = np.zeros(P)
    w[:5] = 3 * rng.standard_normal(5)
    y = X @ w + 0.1 * rng.standard_normal(N)
    return X, y, np.where(y > np.median(y), 1.0, -1.0)


def _target(data, loss):
    return data[1] if loss == "squared" else data[2]


@pytest.fixture(scope="module")
def fits(data):
    X = data[0]
    out = {}
    for loss, l1_ratio, tol in CASES:
        y = _target(data, loss)
        alpha = dl1.alpha_max(X, y, loss=loss, l1_ratio=l1_ratio) / 10
        out[loss, l1_ratio] = dl1.fit(
            X, y, alpha=alpha, loss=loss, l1_ratio=l1_ratio, tol=tol, solver="auto", max_epochs=1000
        )
    return out


@pytest.fixture(scope="module")
def paths(data):
    X = data[0]
    out = {}
    for loss in ("squared", "logistic", "smooth_hinge"):
        y = _target(data, loss)
        out[loss] = dl1.path(
            X, y, n_alphas=5, eps=0.05, tol=1e-8, loss=loss, X_test=X[:60], y_test=y[:60]
        )
    return out


def _same_bits(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a.shape == b.shape and np.array_equal(a.view(np.uint64), b.view(np.uint64))


@pytest.mark.parametrize(("loss", "l1_ratio"), [c[:2] for c in CASES])
def test_fit_predicts_and_scores_as_numpy(data, fits, loss, l1_ratio):
    X, _, _ = data
    y = _target(data, loss)
    res = fits[loss, l1_ratio]
    assert (res.n_samples_, res.n_features_in_, res.fit_intercept) == (N, P, True)
    ref = X.toarray() @ res.coef_ + res.intercept_
    np.testing.assert_allclose(res.decision_function(X), ref, rtol=1e-12, atol=1e-13)
    if loss == "squared":
        np.testing.assert_allclose(res.predict(X), ref, rtol=1e-12, atol=1e-13)
        assert res.score(X, y) == pytest.approx(r2_score(y, ref), rel=1e-12)
    else:
        labels = np.where(ref >= 0, 1.0, -1.0)
        np.testing.assert_array_equal(res.predict(X), labels)
        assert res.score(X, y) == pytest.approx(accuracy_score(y, labels), rel=1e-15)
        assert res.score(X, y) > 0.7
    if loss == "logistic":
        np.testing.assert_allclose(res.predict_proba(X)[:, 1], 1 / (1 + np.exp(-ref)), rtol=1e-12)
    else:
        with pytest.raises(ValidationError, match="predict_proba needs the logistic loss"):
            res.predict_proba(X)
    lazy = res.predict(da.from_array(X, chunks=(50, 12)))
    assert isinstance(lazy, da.Array)
    np.testing.assert_allclose(
        lazy.compute(scheduler="sync"), res.predict(X), rtol=1e-12, atol=1e-13
    )


@pytest.mark.parametrize(("loss", "l1_ratio"), [c[:2] for c in CASES])
def test_fit_round_trip_predicts_bit_for_bit(tmp_path, data, fits, loss, l1_ratio):
    X, _, _ = data
    res = fits[loss, l1_ratio]
    out = res.save(tmp_path / "m")
    assert sorted(os.listdir(out)) == ["coef.npy", MODEL_JSON]
    back = dl1.load_model(out)
    assert isinstance(back, FitResult)
    assert _same_bits(back.coef_, res.coef_)
    for name in (
        "intercept_",
        "alpha",
        "l1_ratio",
        "tol",
        "gap_",
        "dual_gap_",
        "primal_",
        "dual_",
        "p0_",
        "passes_",
    ):
        assert _same_bits(getattr(back, name), getattr(res, name)), name
    for name in (
        "loss",
        "converged_",
        "n_rounds_",
        "n_partitions",
        "fit_intercept",
        "n_samples_",
        "n_features_in_",
    ):
        assert getattr(back, name) == getattr(res, name), name
    assert _same_bits(back.decision_function(X), res.decision_function(X))
    assert _same_bits(back.predict(X), res.predict(X))


@pytest.mark.parametrize("loss", ["squared", "logistic", "smooth_hinge"])
def test_path_predicts_at_chosen_and_grid_alphas_and_round_trips(tmp_path, data, paths, loss):
    X, _, _ = data
    y = _target(data, loss)
    path = paths[loss]
    assert path.chosen_alpha_ == path.best_alpha_ is not None
    k = path.best_index_
    coef = path.coefs_[:, k].toarray().ravel()
    ref = X @ coef + path.intercepts_[k]
    np.testing.assert_allclose(path.decision_function(X), ref, rtol=1e-12, atol=1e-13)
    np.testing.assert_array_equal(path.predict(X), path.model().predict(X))
    j = (k + 1) % path.n_alphas
    alpha_j = path.alphas_[j]
    np.testing.assert_array_equal(path.predict(X, alpha_j * (1 + 1e-13)), path.at(j).predict(X))
    assert _same_bits(path.at(j).coef_, path.coefs_[:, j].toarray().ravel())
    assert path.at(-1).alpha == path.alphas_[-1]
    metric = r2_score if loss == "squared" else accuracy_score
    want = metric(y, path.at(j).predict(X))
    assert path.score(X, y, alpha_j) == pytest.approx(want, rel=1e-12)
    with pytest.raises(ValueError, match=r"not on the path's grid.*nearest: "):
        path.predict(X, alpha_j * 1.01)
    out = path.save(tmp_path / "p")
    back = dl1.load_model(out)
    assert isinstance(back, PathResult)
    for name in (
        "alphas_",
        "intercepts_",
        "gaps_",
        "passes_",
        "seconds_",
        "test_mse_",
        "test_logloss_",
        "test_accuracy_",
    ):
        a, b = getattr(path, name), getattr(back, name)
        assert (a is None and b is None) or _same_bits(a, b), name
    for name in ("converged_", "n_active_", "rounds_"):
        np.testing.assert_array_equal(getattr(back, name), getattr(path, name))
    assert (back.coefs_ != path.coefs_).nnz == 0
    assert back.chosen_index_ == k and back.loss == loss
    for alpha in (None, alpha_j):
        assert _same_bits(back.decision_function(X, alpha), path.decision_function(X, alpha))


def test_path_without_a_chosen_alpha(data):
    X, y, _ = data
    path = dl1.path(X, y, n_alphas=3, eps=0.1, tol=1e-8)
    assert path.chosen_alpha_ is None
    with pytest.raises(ValueError, match="no chosen alpha"):
        path.predict(X)
    np.testing.assert_allclose(path.predict(X, path.alphas_[1]), path.at(1).decision_function(X))
    with pytest.raises(IndexError):
        path.at(3)


def test_cross_validated_alpha_is_the_chosen_one(paths):
    """A path with cross-validation's ``alpha_`` uses it when no alpha is given."""
    from dl1.paths.cv import CVResult

    path = paths["squared"]
    k = 1 if path.best_index_ != 1 else 2
    n = path.alphas_.shape[0]
    scores = np.ones((n, 3))
    cvres = CVResult(np.tile(path.alphas_, (3, 1)), scores, "mse", best=k, best_1se=0)
    fields = {f.name: getattr(path, f.name) for f in dataclasses.fields(path) if f.name != "cv_"}
    cv = PathResult(**fields, cv_=cvres)
    assert cv.alpha_ == path.alphas_[k] and cv.alpha_1se_ == path.alphas_[0]
    assert cv.chosen_index_ == k != path.best_index_
    np.testing.assert_array_equal(cv.coefs_[:, k].toarray().ravel(), cv.model().coef_)


@pytest.mark.parametrize(("loss", "l1_ratio"), [c[:2] for c in CASES])
def test_to_sklearn_predicts_as_dl1_and_pickles(data, fits, loss, l1_ratio):
    X, _, _ = data
    y = _target(data, loss)
    res = fits[loss, l1_ratio]
    est = res.to_sklearn()
    if loss == "squared":
        np.testing.assert_allclose(est.predict(X), res.predict(X), rtol=1e-12, atol=1e-13)
    else:
        np.testing.assert_array_equal(est.classes_, [-1.0, 1.0])
        d = res.decision_function(X)
        np.testing.assert_allclose(est.decision_function(X), d, rtol=1e-12, atol=1e-13)
        assert (d != 0).all()  # labels then agree exactly
        np.testing.assert_array_equal(est.predict(X), res.predict(X))
    if loss == "logistic":
        np.testing.assert_allclose(est.predict_proba(X), res.predict_proba(X), rtol=1e-12)
    assert est.score(X, y) == pytest.approx(res.score(X, y), rel=1e-12)
    assert est.n_features_in_ == P
    buf = io.BytesIO()
    joblib.dump(est, buf)
    buf.seek(0)
    np.testing.assert_array_equal(joblib.load(buf).predict(X), est.predict(X))


@pytest.mark.parametrize(
    ("loss", "l1_ratio"), [("squared", 1.0), ("squared", 0.5), ("logistic", 0.5)]
)
def test_to_sklearn_is_the_same_problem(data, fits, loss, l1_ratio):
    """Refitted by scikit-learn with its own solver, the estimator finds dl1's solution:
    the parameters map the objective exactly (alpha, l1_ratio, C = 1 / (n alpha))."""
    X, _, _ = data
    y = _target(data, loss)
    res = fits[loss, l1_ratio]
    ref = clone(res.to_sklearn()).set_params(tol=1e-12, max_iter=100_000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        ref.fit(X, y)
    np.testing.assert_allclose(np.ravel(ref.coef_), res.coef_, atol=1e-5)
    np.testing.assert_allclose(np.ravel(ref.intercept_)[0], res.intercept_, atol=1e-5)


def test_sgd_classifiers_have_dl1s_objective(fits):
    for (loss, l1_ratio), res in fits.items():
        if loss in ("hinge", "squared_hinge", "smooth_hinge"):
            params = res.to_sklearn().get_params()
            want = "squared_hinge" if loss == "squared_hinge" else "hinge"
            assert (params["loss"], params["penalty"]) == (want, "elasticnet")
            assert (params["alpha"], params["l1_ratio"]) == (res.alpha, l1_ratio)


# -- untrusted files ---------------------------------------------------------------------------
@pytest.fixture
def saved(tmp_path, fits, paths):
    return fits["squared", 1.0].save(tmp_path / "fit"), paths["squared"].save(tmp_path / "path")


def _meta(d):
    return json.loads((d / MODEL_JSON).read_text())


def _edit_json(d, **changes):
    meta = json.loads((d / MODEL_JSON).read_text())
    meta.update(changes)
    (d / MODEL_JSON).write_text(json.dumps(meta))


def _tamper(kind, fit_dir, path_dir):
    """Damage a saved model; returns (directory, message expected)."""
    if kind == "wrong shape":
        np.save(fit_dir / "coef.npy", np.zeros(P + 1))
        return fit_dir, r"coef.npy has shape \(31,\), expected \(30,\)"
    if kind == "NaN":
        np.save(fit_dir / "coef.npy", np.full(P, np.nan))
        return fit_dir, "coef.npy holds nan at position 0"
    if kind == "wrong dtype":
        np.save(fit_dir / "coef.npy", np.zeros(P, np.float32))
        return fit_dir, "coef.npy has dtype <f4, expected <f8"
    if kind == "object dtype":
        np.save(fit_dir / "coef.npy", np.array([{}] * P, dtype=object), allow_pickle=True)
        return fit_dir, "coef.npy has dtype |O, expected <f8"
    if kind == "trailing bytes":
        with open(fit_dir / "coef.npy", "ab") as fh:
            fh.write(b"\0" * 8)
        return fit_dir, "coef.npy holds .* bytes, its header implies"
    if kind == "huge JSON":
        with open(fit_dir / MODEL_JSON, "ab") as fh:
            fh.truncate(MAX_JSON_BYTES + 1)
        return fit_dir, f"more than {MAX_JSON_BYTES}"
    if kind == "missing file":
        (fit_dir / "coef.npy").unlink()
        return fit_dir, "coef.npy is missing"
    if kind == "missing json":
        (fit_dir / MODEL_JSON).unlink()
        return fit_dir, "model.json is missing"
    if kind == "valid loss edited":  # squared -> logistic: every field still valid
        _edit_json(fit_dir, loss="logistic")
        return fit_dir, "digest does not match the model's fields and arrays"
    if kind == "valid alpha edited":
        _edit_json(path_dir, alphas=[float.hex(1.0)] * len(_meta(path_dir)["alphas"]))
        return path_dir, "digest does not match"
    if kind == "a coefficient changed":
        coef = np.load(fit_dir / "coef.npy")
        coef[0] += 1.0
        np.save(fit_dir / "coef.npy", coef)
        return fit_dir, "digest does not match"
    if kind == "format version":
        _edit_json(fit_dir, format_version=3)
        return fit_dir, r"format_version is 3: this dl1 .* reads versions \(1, 2\)"
    if kind == "not hex":
        _edit_json(fit_dir, alpha=0.1)
        return fit_dir, "field alpha is not a float.hex string"
    if kind == "bad loss":
        _edit_json(fit_dir, loss="absolute")
        return fit_dir, "field loss is not one of"
    if kind == "negative n":
        _edit_json(fit_dir, n_features=-1)
        return fit_dir, "field n_features is out of range"
    if kind == "duplicate key":
        text = (fit_dir / MODEL_JSON).read_text()
        (fit_dir / MODEL_JSON).write_text(text.replace("{", '{"loss": "squared",', 1))
        return fit_dir, "duplicate key 'loss'"
    if kind == "short vector":
        meta = json.loads((path_dir / MODEL_JSON).read_text())
        _edit_json(path_dir, gaps=meta["gaps"][:-1])
        return path_dir, "field gaps has 4 entries, expected 5"
    if kind == "index out of range":
        idx = np.load(path_dir / "coefs_indices.npy")
        idx[-1] = P
        np.save(path_dir / "coefs_indices.npy", idx)
        return path_dir, r"indices outside \[0, 30\)"
    if kind == "indptr":
        ptr = np.load(path_dir / "coefs_indptr.npy")
        ptr[1], ptr[2] = ptr[2], ptr[1] - 1
        np.save(path_dir / "coefs_indptr.npy", ptr)
        return path_dir, "coefs_indptr.npy does not run up from 0"
    if kind == "symlink outside":
        target = fit_dir.parent / "elsewhere.npy"
        os.replace(fit_dir / "coef.npy", target)
        os.symlink(target, fit_dir / "coef.npy")
        return fit_dir, "outside"
    raise AssertionError(kind)


TAMPERING = [
    "wrong shape",
    "NaN",
    "wrong dtype",
    "object dtype",
    "trailing bytes",
    "huge JSON",
    "missing file",
    "missing json",
    "format version",
    "valid loss edited",
    "valid alpha edited",
    "a coefficient changed",
    "not hex",
    "bad loss",
    "negative n",
    "duplicate key",
    "short vector",
    "index out of range",
    "indptr",
    "symlink outside",
]


@pytest.mark.parametrize("kind", TAMPERING)
def test_tampered_files_are_refused(saved, kind):
    where, message = _tamper(kind, *saved)
    with pytest.raises(ModelFileError, match=message):
        dl1.load_model(where)


def test_a_model_of_format_version_1_loads_without_a_digest(saved, data, fits):
    fit_dir, _ = saved
    meta = _meta(fit_dir)
    del meta["digest"]
    meta["format_version"] = 1
    (fit_dir / MODEL_JSON).write_text(json.dumps(meta))
    old = dl1.load_model(fit_dir)
    assert old.loss == "squared"
    assert _same_bits(old.predict(data[0]), fits["squared", 1.0].predict(data[0]))


def test_not_a_model(tmp_path):
    with pytest.raises(ModelFileError, match="is not a directory holding a saved dl1 model"):
        dl1.load_model(tmp_path / "nothing")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / MODEL_JSON).write_text("[1, 2]")
    with pytest.raises(ModelFileError, match=r"field \(root\) is not an object"):
        dl1.load_model(tmp_path / "d")


def test_overwrite(tmp_path, fits):
    a, b = fits["squared", 1.0], fits["logistic", 1.0]
    target = a.save(tmp_path / "m")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        b.save(target)
    assert dl1.load_model(target).loss == "squared"
    b.save(target, overwrite=True)
    assert dl1.load_model(target).loss == "logistic"
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # no temporary left
    user = tmp_path / "user"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a saved dl1 model"):
        a.save(user, overwrite=True)
    assert (user / "notes.txt").read_text() == "mine"
    (tmp_path / "file").write_text("mine")
    with pytest.raises(FileExistsError):
        a.save(tmp_path / "file", overwrite=True)
    assert (tmp_path / "file").read_text() == "mine"


def test_a_store_on_a_cluster_with_a_loaded_model(local_cluster, tmp_path, data, fits):
    """A loaded model predicts a store's test split on the workers, as the saved one."""
    X, y, _ = data
    dl1.from_scipy(
        X[:80],
        y[:80],
        tmp_path / "s.zarr",
        X_test=X[80:],
        y_test=y[80:],
        n_feature_blocks=3,
        row_block_rows=16,
    )
    res = fits["squared", 0.5]
    back = dl1.load_model(res.save(tmp_path / "m"))
    got = local_cluster.compute(back.predict(tmp_path / "s.zarr")).result()
    np.testing.assert_allclose(got, res.predict(X[80:]), rtol=1e-12, atol=1e-13)
    with dask.config.set(scheduler=local_cluster.get):
        assert back.score(tmp_path / "s.zarr") == pytest.approx(
            r2_score(y[80:], res.predict(X[80:])), rel=1e-12
        )
