"""dl1.predict: decision values, labels, probabilities and scores against NumPy / scikit-learn,
in memory, blockwise on dask arrays of every chunk kind, and on stores on a real cluster."""

from __future__ import annotations

import types
import warnings

import dask
import dask.array as da
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import sparse
from sklearn.metrics import accuracy_score, r2_score

import dl1
from dl1.errors import ValidationError
from dl1.predict import (
    CLASSIFICATION_LOSSES,
    decision_function,
    predict,
    predict_proba,
    score,
)

N, P = 61, 37
B = 0.25


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(5)
    X = sp.random(N, P, density=0.3, format="csr", random_state=rng)
    coef = np.zeros(P)
    coef[[0, 3, 30, 31]] = rng.standard_normal(4)
    y = X @ coef + B + 0.1 * rng.standard_normal(N)
    return X, coef, y


def _chunked(X, kind, chunks):
    dense = da.from_array(X.toarray(), chunks=chunks)
    convert = {
        "dense": None,
        "csr": sp.csr_matrix,
        "csc": sp.csc_matrix,
        "coo": sp.coo_matrix,
        "pydata-coo": sparse.COO.from_numpy,
        "pydata-gcxs": sparse.GCXS.from_numpy,
    }[kind]
    return dense if convert is None else dense.map_blocks(convert, dtype=dense.dtype)


IN_MEMORY = {
    "ndarray": lambda X: X.toarray(),
    "csr": sp.csr_matrix,
    "csc": sp.csc_matrix,
    "coo": sp.coo_matrix,
    "pydata-coo": sparse.COO.from_scipy_sparse,
    "dataframe": lambda X: pd.DataFrame(X.toarray(), columns=[f"f{j}" for j in range(P)]),
    "list": lambda X: X.toarray().tolist(),
    "int ndarray": lambda X: np.round(10 * X.toarray()).astype(np.int64),
}


@pytest.mark.parametrize("kind", IN_MEMORY)
def test_in_memory_inputs_equal_numpy(data, kind):
    X, coef, _ = data
    Xk = IN_MEMORY[kind](X)
    dense = np.asarray(sp.csr_matrix(Xk).toarray() if sp.issparse(Xk) else np.asarray(
        Xk.todense() if hasattr(Xk, "todense") else Xk, dtype=np.float64))  # fmt: skip
    ref = dense @ coef + B
    got = decision_function(Xk, coef, B)
    assert isinstance(got, np.ndarray) and got.shape == (N,)
    np.testing.assert_allclose(got, ref, rtol=1e-13, atol=1e-14)
    np.testing.assert_array_equal(predict(Xk, coef, B, "squared"), got)
    for loss in CLASSIFICATION_LOSSES:
        np.testing.assert_array_equal(predict(Xk, coef, B, loss), np.where(ref >= 0, 1.0, -1.0))
    proba = predict_proba(Xk, coef, B)
    np.testing.assert_allclose(proba[:, 1], 1.0 / (1.0 + np.exp(-ref)), rtol=1e-13)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-15)


CHUNKINGS = [(61, 37), (13, 10), ((7, 30, 24), (1, 2, 30, 4))]


@pytest.mark.parametrize("kind", ["dense", "csr", "csc", "coo", "pydata-coo", "pydata-gcxs"])
@pytest.mark.parametrize("chunks", CHUNKINGS)
def test_dask_chunk_kinds_and_chunkings_equal_numpy(data, kind, chunks):
    X, coef, _ = data
    Xd = _chunked(X, kind, chunks)
    ref = X.toarray() @ coef + B
    for w, want in ((coef, ref), (np.zeros(P), np.full(N, B))):
        got = decision_function(Xd, w, B)
        assert isinstance(got, da.Array)
        np.testing.assert_allclose(got.compute(scheduler="sync"), want, rtol=1e-13, atol=1e-14)
    labels = predict(Xd, coef, B, "logistic").compute(scheduler="sync")
    np.testing.assert_array_equal(labels, np.where(ref >= 0, 1.0, -1.0))
    proba = predict_proba(Xd, coef, B)
    assert proba.shape == (N, 2)
    np.testing.assert_allclose(
        proba.compute(scheduler="sync")[:, 1], 1 / (1 + np.exp(-ref)), rtol=1e-13
    )


def test_unknown_row_chunks(data):
    """Row blocks of unknown length (a boolean row mask) are predicted too."""
    X, coef, _ = data
    Xd = _chunked(X, "csr", (13, 10))
    keep = np.arange(N) % 3 != 0
    Xm = Xd[da.from_array(keep, chunks=13)]
    assert np.isnan(Xm.shape[0])
    for w in (coef, np.zeros(P)):
        got = decision_function(Xm, w, B).compute(scheduler="sync")
        np.testing.assert_allclose(got, X.toarray()[keep] @ w + B, rtol=1e-13, atol=1e-14)


def _culled(pred):
    """The tasks computing ``pred`` needs."""
    keys = set(dask.core.flatten(pred.__dask_keys__()))
    return pred.__dask_graph__().cull(keys)


def test_only_the_support_blocks_are_read(data):
    """The graph holds the column blocks with a nonzero coefficient only: its size grows
    with the support, not with the width."""
    X, _, _ = data
    coef = np.zeros(P)
    coef[[12, 14]] = 1.0  # column block 1 of 10-wide blocks
    Xd = _chunked(X, "csc", (13, 10))
    pred = decision_function(Xd, coef, B)
    touched = {k[1:] for k in _culled(pred) if isinstance(k, tuple) and k[0] == Xd.name}
    assert touched == {(i, 1) for i in range(5)}
    np.testing.assert_allclose(pred.compute(scheduler="sync"), X @ coef + B, rtol=1e-13)
    wide = _chunked(sp.hstack([X] * 20, format="csr"), "csc", (13, 10))
    coef_wide = np.zeros(20 * P)
    coef_wide[[12, 14]] = 1.0
    assert len(_culled(decision_function(wide, coef_wide, B))) == len(_culled(pred))


@pytest.mark.parametrize(
    "X",
    [np.zeros((4, 5)), sp.csr_matrix((4, 5)), da.zeros((4, 5), chunks=2)],
    ids=["ndarray", "csr", "dask"],
)
def test_feature_count_checked_first(X):
    with pytest.raises(ValidationError, match="X has 5 features, but coef is expecting 6"):
        decision_function(X, np.zeros(6), 0.0)
    with pytest.raises(ValidationError, match="X has 5 features"):
        score(X, np.ones(4), np.zeros(6), 0.0, "squared")


def test_invalid_arguments(data):
    X, coef, y = data
    with pytest.raises(ValidationError, match="loss must be one of"):
        predict(X, coef, B, "absolute")
    with pytest.raises(ValidationError, match="coef must be a vector"):
        decision_function(X, coef[None, :], B)
    with pytest.raises(ValidationError, match="intercept must be a scalar"):
        decision_function(X, coef, [1.0, 2.0])
    with pytest.raises(ValidationError, match="y is required"):
        score(X, None, coef, B, "squared")
    with pytest.raises(ValidationError, match="y has 3 values, X has 61 rows"):
        score(X, y[:3], coef, B, "squared")
    with pytest.raises(ValidationError, match="labels in"):
        score(X, (y > 0).astype(float), coef, B, "hinge")
    with pytest.raises(ValueError, match="NaN"):
        decision_function(np.full((2, P), np.nan), coef, B)


def test_score_equals_sklearn_metrics(data):
    X, coef, y = data
    sw = np.random.default_rng(1).uniform(0.5, 2.0, N)
    pred = X @ coef + B
    assert score(X, y, coef, B, "squared") == pytest.approx(r2_score(y, pred), rel=1e-14)
    assert score(X, y, coef, B, "squared", sample_weight=sw) == pytest.approx(
        r2_score(y, pred, sample_weight=sw), rel=1e-14
    )
    labels = np.where(y - B >= 0.1, 1.0, -1.0)
    want = accuracy_score(labels, np.where(pred >= 0, 1.0, -1.0), sample_weight=sw)
    assert 0.0 < want < 1.0
    for loss in CLASSIFICATION_LOSSES:
        assert score(X, labels, coef, B, loss, sample_weight=sw) == pytest.approx(want, rel=1e-15)
    Xd = _chunked(X, "csr", (13, 10))
    with dask.config.set(scheduler="sync"):
        assert score(Xd, da.from_array(y, chunks=13), coef, B, "squared") == pytest.approx(
            r2_score(y, pred), rel=1e-13
        )


def test_dataset_like_input(data):
    """Anything with a dask array ``.X`` (a dl1.Dataset) predicts on it; score reads its y."""
    X, coef, y = data
    Xd = _chunked(X, "csc", (13, 10))
    ds = types.SimpleNamespace(X=Xd, y=y, shape=Xd.shape)
    got = decision_function(ds, coef, B)
    assert isinstance(got, da.Array)
    np.testing.assert_allclose(got.compute(scheduler="sync"), X @ coef + B, rtol=1e-13)
    with dask.config.set(scheduler="sync"):
        assert score(ds, None, coef, B, "squared") == pytest.approx(
            r2_score(y, X @ coef + B), rel=1e-13
        )


@pytest.fixture(scope="module")
def store(tmp_path_factory, data):
    X, coef, y = data
    rng = np.random.default_rng(2)
    Xt = sp.random(40, P, density=0.3, format="csr", random_state=rng)
    yt = Xt @ coef + B + 0.1 * rng.standard_normal(40)
    path = tmp_path_factory.mktemp("predict") / "s.zarr"
    dl1.from_scipy(X, y, path, X_test=Xt, y_test=yt, n_feature_blocks=4, row_block_rows=16)
    return path, Xt, yt


def test_store_on_a_cluster(local_cluster, data, store):
    """A store (path or opened) predicts blockwise on the workers; score takes its y."""
    X, coef, y = data
    path, Xt, yt = store
    for src in (path, str(path), dl1.open_store(path)):
        pred = decision_function(src, coef, B)
        assert isinstance(pred, da.Array) and pred.npartitions > 1
        got = local_cluster.compute(pred).result()
        np.testing.assert_allclose(got, Xt @ coef + B, rtol=1e-13, atol=1e-14)
    train = local_cluster.compute(decision_function(path, coef, B, split="train")).result()
    np.testing.assert_allclose(train, X @ coef + B, rtol=1e-13, atol=1e-14)
    with dask.config.set(scheduler=local_cluster.get):
        r2 = score(path, None, coef, B, "squared")
        assert r2 == pytest.approx(r2_score(yt, Xt @ coef + B), rel=1e-13)
        assert score(path, None, coef, B, "squared", split="train") == pytest.approx(
            r2_score(y, X @ coef + B), rel=1e-13
        )
    labels = local_cluster.compute(predict(path, coef, B, "squared_hinge")).result()
    np.testing.assert_array_equal(labels, np.where(Xt @ coef + B >= 0, 1.0, -1.0))
    with pytest.raises(ValidationError, match="X has 37 features, but coef is expecting 38"):
        decision_function(path, np.zeros(P + 1), B)


def test_convergence_warning_is_sklearns():
    """dl1's warning is caught by filters on scikit-learn's (and is still a UserWarning)."""
    from sklearn.exceptions import ConvergenceWarning

    assert issubclass(dl1.ConvergenceWarning, ConvergenceWarning)
    assert issubclass(dl1.ConvergenceWarning, UserWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        with pytest.raises(ConvergenceWarning):
            warnings.warn("not certified", dl1.ConvergenceWarning, stacklevel=1)
