"""The data handle (dl1.persist / dl1.Dataset): fits on it equal fits on the data, read
nothing from the store again, views select rows by weights, and release frees the workers."""

from __future__ import annotations

import time

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.linear_model import ElasticNet, Lasso

import dl1
from dl1.errors import ValidationError
from tests.helpers import random_csr, store_reads, task_stream


def _problem(n=240, p=60, seed=0):
    rng = np.random.default_rng(seed)
    X = random_csr(n, p, 0.15, seed)
    w = np.zeros(p)
    w[:6] = rng.standard_normal(6)
    return X, X @ w + 0.2 * rng.standard_normal(n)


def _sk(X, y, alpha, l1_ratio=1.0, sample_weight=None):
    est = ElasticNet(alpha=alpha, l1_ratio=l1_ratio, tol=1e-13, max_iter=200_000)
    return est.fit(X, y, sample_weight=sample_weight)


def test_fits_on_a_handle_and_on_its_views_match_scikit_learn_in_process():
    X, y = _problem()
    with dl1.persist(X, y) as ds:
        assert ds.shape == X.shape and len(ds) == X.shape[0]
        res = dl1.fit(ds, alpha=0.02, tol=1e-10)
        ref = _sk(X, y, 0.02)
        np.testing.assert_allclose(res.coef_, ref.coef_, atol=1e-8)
        assert abs(res.intercept_ - ref.intercept_) < 1e-8
        rows = np.arange(1, 240, 3)
        view = ds[rows]
        assert view.shape == (80, 60)
        np.testing.assert_array_equal(view.y, y[rows])
        res = dl1.fit(view, alpha=0.02, l1_ratio=0.7, tol=1e-10)
        ref = _sk(X[rows], y[rows], 0.02, 0.7)
        np.testing.assert_allclose(res.coef_, ref.coef_, atol=1e-8)
        # a boolean mask and a view of a view select the same rows
        mask = np.zeros(240, bool)
        mask[rows] = True
        np.testing.assert_array_equal(ds[mask].rows, rows)
        np.testing.assert_array_equal(ds[1:][::3].rows, rows)


def test_weights_standardisation_and_warm_starts_on_a_view():
    X, y = _problem(seed=1)
    rng = np.random.default_rng(1)
    sw = rng.uniform(0.5, 2.0, X.shape[0])
    rows = np.flatnonzero(rng.random(X.shape[0]) < 0.6)
    with dl1.persist(X, y) as ds:
        res = dl1.fit(ds[rows], sample_weight=sw[rows], alpha=0.01, tol=1e-10)
        ref = _sk(X[rows], y[rows], 0.01, sample_weight=sw[rows])
        np.testing.assert_allclose(res.coef_, ref.coef_, atol=1e-8)
        std = dl1.fit(ds[rows], alpha=0.01, standardize=True, tol=1e-10)
        direct = dl1.fit(X[rows], y[rows], alpha=0.01, standardize=True, tol=1e-10)
        np.testing.assert_allclose(std.coef_, direct.coef_, atol=1e-8)
        # a warm start from the answer certifies it at once; from elsewhere it gets there too
        again = dl1.fit(ds, alpha=0.01, tol=1e-10, coef_init=res.coef_ * 0.5,
                        intercept_init=0.3)  # fmt: skip
        cold = dl1.fit(ds, alpha=0.01, tol=1e-10)
        np.testing.assert_allclose(again.coef_, cold.coef_, atol=1e-8)
        same = dl1.fit(ds, alpha=0.01, tol=1e-10, coef_init=cold.coef_,
                       intercept_init=cold.intercept_)  # fmt: skip
        assert same.n_rounds_ <= 1 and same.converged_


def test_row_layout_solver_on_a_view_matches_the_working_set_solver():
    X, y = _problem(seed=2)
    rows = np.arange(0, 240, 2)
    with dl1.persist(X, y) as ds:
        a = dl1.fit(ds[rows], alpha=0.05, l1_ratio=0.5, tol=1e-9, solver="sdca", max_epochs=400)
        b = dl1.fit(X[rows], y[rows], alpha=0.05, l1_ratio=0.5, tol=1e-9)
        assert a.converged_ and b.converged_
        # the ridge part makes P (0.025)-strongly convex: ||w - w*||^2 <= 2 gap / 0.025
        bound = np.sqrt(2 * a.dual_gap_ / 0.025) + np.sqrt(2 * b.dual_gap_ / 0.025)
        assert np.linalg.norm(a.coef_ - b.coef_) <= bound


def test_misuse_is_refused_with_its_reason():
    X, y = _problem()
    ds = dl1.persist(X, y)
    with pytest.raises(ValidationError, match="n_partitions=2"):
        dl1.fit(ds, alpha=0.1, n_partitions=3)
    with pytest.raises(ValidationError, match="stream=True"):
        dl1.fit(ds, alpha=0.1, stream=True)
    with pytest.raises(IndexError, match="out of range"):
        ds[[0, 240]]
    with pytest.raises(TypeError, match="cannot be pickled"):
        import pickle

        pickle.dumps(ds)
    view = ds[:10]
    ds.release()
    for data in (ds, view):
        with pytest.raises(ValidationError, match="released"):
            dl1.fit(data, alpha=0.1)
    with pytest.raises(ValidationError, match="y is required"):
        dl1.fit(dl1.persist(X), alpha=0.1)


def test_predictions_from_the_held_blocks_match_numpy():
    X, y = _problem()
    coef = np.linspace(-1, 1, X.shape[1])
    with dl1.persist(X, y) as ds:
        rows = np.array([5, 3, 200, 3])
        z = ds[rows].decision_function(coef, 0.25)
        np.testing.assert_allclose(z, X[rows] @ coef + 0.25, rtol=1e-12)


# -- on a cluster ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    from dl1.datasets import make_e2006_like

    return make_e2006_like(tmp_path_factory.mktemp("ds") / "small.zarr", preset="small", seed=3)


def test_a_handle_reads_each_block_once_for_many_fits(local_cluster, small_store):
    client = local_cluster
    store = small_store
    with task_stream(client) as loading:
        ds = dl1.persist(store, client=client)
    n_row_blocks = len(store.row_bounds("train")) - 1
    assert store_reads(loading.data) == n_row_blocks * (len(ds.col_bounds) - 1)
    amax = dl1.alpha_max(ds)
    with task_stream(client) as fitting:
        alphas = amax * np.geomspace(0.5, 0.05, 10)
        fits = [dl1.fit(ds, alpha=a, tol=1e-6) for a in alphas]
        rows = np.arange(0, ds.shape[0], 2)
        half = dl1.fit(ds[rows], alpha=alphas[3], tol=1e-6)
        path = dl1.path(ds, alphas=alphas[:4], tol=1e-6)
        z = ds[rows].decision_function(fits[0].coef_, fits[0].intercept_)
    assert store_reads(fitting.data) == 0
    Xd = store.to_dask("train")  # the reference reads the store, after the count
    X_mem = sp.csr_matrix(client.compute(Xd).result())
    np.testing.assert_allclose(z, X_mem[rows] @ fits[0].coef_ + fits[0].intercept_, rtol=1e-10)
    assert all(f.converged_ for f in fits) and half.converged_ and path.converged_.all()
    ref = dl1.fit(store, alpha=alphas[3], tol=1e-6, client=client)
    np.testing.assert_allclose(fits[3].coef_, ref.coef_, atol=1e-6 * np.abs(ref.coef_).max())
    ds.release()


def _held(keys, dask_worker=None) -> tuple[int, int]:
    """(bytes of ``keys`` this worker holds, bytes of all it holds), by Dask's accounting."""
    state = dask_worker.state
    mine = sum(state.tasks[k].nbytes or 0 for k in keys if k in dask_worker.data)
    return mine, int(state.nbytes)


def test_release_returns_the_workers_memory(local_cluster, small_store):
    client = local_cluster
    ds = dl1.persist(small_store, client=client)
    keys = [f.key for f in ds._blocks]
    dl1.fit(ds[: ds.shape[0] // 2], alpha=dl1.alpha_max(ds) / 5, tol=1e-4)
    held = client.run(_held, keys)
    blocks = sum(m for m, _ in held.values())
    per_nnz = small_store.dtype("train").itemsize + 4  # a value and an int32 index
    assert blocks >= small_store.nnz("train") * per_nnz  # the blocks are held, counted right
    total = sum(t for _, t in held.values())
    ds.release()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = client.run(_held, keys)
        if not any(m for m, _ in now.values()):
            break
        time.sleep(0.1)
    assert not any(m for m, _ in now.values())
    assert sum(t for _, t in now.values()) <= total - blocks


def test_a_handle_on_a_cluster_equals_a_fit_on_the_array(local_cluster):
    X, y = _problem(n=300, p=90, seed=4)
    ds = dl1.persist(sp.csc_matrix(X), y, client=local_cluster)
    rows = np.arange(0, 300, 4)
    res = dl1.fit(ds[rows], alpha=0.01, tol=1e-10)  # the handle's client, none given
    ref = Lasso(alpha=0.01, tol=1e-13, max_iter=200_000).fit(X[rows], y[rows])
    np.testing.assert_allclose(res.coef_, ref.coef_, atol=1e-8)
    with pytest.raises(ValidationError, match="held by this process"):
        dl1.fit(dl1.persist(X, y), alpha=0.01, client=local_cluster)
    ds.release()


def test_a_handle_of_in_memory_data_does_not_keep_the_matrix_twice():
    """Pass: a data handle made from a matrix in memory ships (to a solve in one piece) a
    recipe without that matrix beside its dask array: its pickle is within 10% of the
    array's (it doubled when the inputs kept the matrix for the memory check, and the
    folds' shipments, past 1 MiB, were then scattered)."""
    import cloudpickle

    X = sp.random(2000, 1500, density=0.02, format="csr", random_state=3)
    with dl1.persist(X, np.ones(2000)) as ds:
        recipe, _ = ds.shipped()
        assert recipe.inputs.local is None
        size, array = len(cloudpickle.dumps(recipe)), len(cloudpickle.dumps(recipe.inputs.X))
    assert size < 1.1 * array, (size, array)
