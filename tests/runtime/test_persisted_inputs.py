"""Dask collections holding persisted chunks (``client.persist(X)``, ``X.persist()``, arrays
derived from those, a persisted DataFrame's ``to_dask_array``) give the same certified
answer whether the solve runs in this process, in one piece on a worker or distributed
(:mod:`dl1.runtime.persisted`); a collection whose chunks were released, or that another
cluster holds, is refused at once, naming the argument."""

from __future__ import annotations

import time

import dask
import dask.array as da
import numpy as np
import pytest
import sparse
from distributed import Client, LocalCluster

import dl1
from dl1.errors import ValidationError
from tests.helpers import random_csr, task_stream

N, P = 600, 40
MODES = ("in process", "one piece", "distributed")


def _dense(seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, P))
    w = np.zeros(P)
    w[:6] = rng.standard_normal(6)
    return X, X @ w + 0.1 * rng.standard_normal(N)


def _sparse(seed=1):
    X = random_csr(N, 60, 0.1, seed)
    w = np.zeros(60)
    w[:6] = np.random.default_rng(seed).standard_normal(6)
    return X, X @ w + 0.01


def _frame(X):
    import dask.dataframe as dd
    import pandas as pd

    return dd.from_pandas(pd.DataFrame(X, columns=[f"f{j}" for j in range(X.shape[1])]),
                          npartitions=3)  # fmt: skip


def _scipy(client, S, chunks):
    return client.persist(da.from_array(S, chunks=chunks, asarray=False))


#: The inputs, by name: ``(client, dX, held) -> (dask collection, the same data in memory,
#: its targets)``, ``dX`` the dense data row- and column-chunked, ``held`` it persisted.
BUILDERS = {
    "dense": lambda c, dX, held: (dX, *_dense()),
    "dense, persisted": lambda c, dX, held: (held, *_dense()),
    "dense, .persist()": lambda c, dX, held: (_persist_method(c, dX), *_dense()),
    "dense, persisted, sliced": lambda c, dX, held: (held[:, :30], _dense()[0][:, :30],
                                                     _dense()[1]),  # fmt: skip
    "dense, persisted, scaled": lambda c, dX, held: (held * 2, _dense()[0] * 2, _dense()[1]),
    "scipy rows, persisted": lambda c, dX, held: (_scipy(c, _sparse()[0], (N // 3, 60)),
                                                  *_sparse()),  # fmt: skip
    "scipy columns, persisted": lambda c, dX, held: (
        _scipy(c, _sparse()[0].tocsc(), (N, 20)), *_sparse()),
    "pydata-sparse, persisted": lambda c, dX, held: (
        _scipy(c, sparse.COO.from_scipy_sparse(_sparse()[0]), (N // 2, 30)), *_sparse()),
    "dataframe, persisted": lambda c, dX, held: (
        _frame_array(c, c.persist(_frame(_dense()[0]))), *_dense()),
    "dataframe array, persisted": lambda c, dX, held: (
        c.persist(_frame_array(c, _frame(_dense()[0]))), *_dense()),
}
INPUTS = tuple(BUILDERS)


def _inputs(client, name):
    """Input ``name`` as a dask collection on ``client``'s cluster, the same data in memory
    and its targets."""
    dX = da.from_array(_dense()[0], chunks=(N // 2, P // 2))  # row- and column-chunked
    return BUILDERS[name](client, dX, client.persist(dX))


def _frame_array(client, frame):
    with client.as_current():  # the lengths are computed on the current client
        return frame.to_dask_array(lengths=True)


def _persist_method(client, dX):
    with client.as_current():  # X.persist() on the current client, as a Dask user writes
        return dX.persist()


def _in_mode(client, mode, fn, *args, shipped=True, **kwargs):
    """``fn(*args, **kwargs)`` solved as ``mode`` says; one-piece tasks ran on the cluster
    meanwhile if and only if it solved in one piece (``shipped``: ``fn`` ships its solve;
    ``alpha_max``, one pass, does not)."""
    if mode == "in process":  # no client: Dask's local scheduler, as dask.compute's
        with dask.config.set(scheduler="sync"), task_stream(client) as ts:
            out = fn(*args, client=None, **kwargs)
    else:
        with dask.config.set({"dl1.one-piece": mode == "one piece"}), \
                task_stream(client) as ts:  # fmt: skip
            out = fn(*args, client=client, **kwargs)
    pieces = [e for e in ts.data if str(e["key"]).startswith("in_worker")]
    assert bool(pieces) == (mode == "one piece" and shipped)
    return out


def _sklearn_lasso(X, y, alpha):
    from sklearn.linear_model import Lasso

    return Lasso(alpha=alpha, tol=1e-12, max_iter=100_000).fit(X, y)




@pytest.mark.parametrize("name", INPUTS)
@pytest.mark.slow
def test_a_fit_gives_the_same_certified_answer_in_every_mode(local_cluster, name):
    dX, X, y = _inputs(local_cluster, name)
    alpha = 0.05 * np.abs(X.T @ (y - y.mean())).max() / N
    ref = _sklearn_lasso(X, y, alpha)
    fits = [_in_mode(local_cluster, m, dl1.fit, dX, y, alpha=alpha, tol=1e-10) for m in MODES]
    for res in fits:
        assert res.converged_ and res.gap_ <= 1e-10
        scale = np.abs(ref.coef_).max()
        np.testing.assert_allclose(res.coef_, ref.coef_, atol=1e-4 * scale)
        np.testing.assert_allclose(res.intercept_, ref.intercept_, atol=1e-4 * scale)
    for res in fits[1:]:  # the same blocks, the same solver: the same iterates
        np.testing.assert_array_equal(res.coef_, fits[0].coef_)


@pytest.mark.parametrize("name", ["dense, persisted", "scipy columns, persisted",
                                  "dense, persisted, sliced"])  # fmt: skip
def test_every_entry_point_takes_a_persisted_array_in_every_mode(local_cluster, name):
    dX, X, y = _inputs(local_cluster, name)
    labels = np.where(y > np.median(y), "up", "down")
    ref_max = dl1.alpha_max(X, y, client=None)
    ref_path = dl1.path(X, y, n_alphas=5, eps=0.05, tol=1e-9, client=None)
    ref_cv = dl1.fit_cv(X, y, cv=3, n_alphas=5, tol=1e-8, client=None)
    ref_clf = dl1.LogisticRegression(C=1.0, tol=1e-8, client=None).fit(X, labels)
    for mode in MODES:
        amax = _in_mode(local_cluster, mode, dl1.alpha_max, dX, y, shipped=False)
        assert amax == pytest.approx(ref_max, rel=1e-12)
        path = _in_mode(local_cluster, mode, dl1.path, dX, y, n_alphas=5, eps=0.05, tol=1e-9)
        np.testing.assert_allclose(path.alphas_, ref_path.alphas_, rtol=1e-12)
        assert path.converged_.all()
        a, b = path.coefs_.toarray(), ref_path.coefs_.toarray()
        np.testing.assert_allclose(a, b, atol=1e-3 * np.abs(b).max())
        cv = _in_mode(local_cluster, mode, dl1.fit_cv, dX, y, cv=3, n_alphas=5, tol=1e-8)
        assert cv.alpha == ref_cv.alpha
        np.testing.assert_allclose(cv.cv[0].scores, ref_cv.cv[0].scores, rtol=1e-4)
        est = dl1.Lasso(alpha=ref_max / 20, tol=1e-10)
        fitted = _estimator_fit(local_cluster, mode, est, dX, y)
        ref = _sklearn_lasso(X, y, ref_max / 20)
        np.testing.assert_allclose(fitted.coef_, ref.coef_, atol=1e-4 * np.abs(ref.coef_).max())
        assert fitted.result_.converged_ and fitted.result_.gap_ <= 1e-10
        clf = _estimator_fit(local_cluster, mode, dl1.LogisticRegression(C=1.0, tol=1e-8),
                             dX, labels)  # fmt: skip
        np.testing.assert_allclose(clf.coef_, ref_clf.coef_,
                                   atol=1e-3 * np.abs(ref_clf.coef_).max())  # fmt: skip
        assert clf.score(dX, labels) == ref_clf.score(X, labels)


def _estimator_fit(client, mode, est, dX, y):
    """``est.fit(dX, y)`` as ``mode`` says (``client`` None in process)."""
    est.set_params(client=None if mode == "in process" else client)
    return _in_mode(client, mode, lambda *a, client: est.fit(*a), dX, y)


def test_persisted_targets_weights_and_test_data_in_every_mode(local_cluster):
    X, y = _dense()
    sw = np.random.default_rng(3).uniform(0.5, 2.0, N)
    ref = dl1.path(X, y, sample_weight=sw, n_alphas=4, eps=0.1, tol=1e-9, X_test=X[:200],
                   y_test=y[:200], client=None)  # fmt: skip
    c = local_cluster
    kw = dict(y=c.persist(da.from_array(y, chunks=N // 4)),
              sample_weight=c.persist(da.from_array(sw, chunks=N // 3)),
              X_test=c.persist(da.from_array(X[:200], chunks=(100, P))),
              y_test=c.persist(da.from_array(y[:200], chunks=50)))  # fmt: skip
    dX = c.persist(da.from_array(X, chunks=(N, P // 2)))
    for mode in MODES:
        got = _in_mode(c, mode, dl1.path, dX, n_alphas=4, eps=0.1, tol=1e-9, **kw)
        np.testing.assert_allclose(got.test_mse_, ref.test_mse_, rtol=1e-6)
        np.testing.assert_allclose(got.coefs_.toarray(), ref.coefs_.toarray(),
                                   atol=1e-4 * np.abs(ref.coefs_.toarray()).max())  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
def test_released_chunks_are_refused_at_once_naming_the_argument(local_cluster, mode):
    X, y = _dense()
    held = local_cluster.persist(da.from_array(X, chunks=(N // 2, P)))
    local_cluster.cancel(held)
    t0 = time.monotonic()
    with pytest.raises(ValidationError, match=r"X is a dask collection persisted .* released"):
        _in_mode(local_cluster, mode, dl1.fit, held[:, :10], y, alpha=0.1)
    yd = local_cluster.persist(da.from_array(y, chunks=N // 2))
    local_cluster.cancel(yd)
    with pytest.raises(ValidationError, match=r"y is a dask collection .* persist y again"):
        _in_mode(local_cluster, mode, dl1.fit, X, yd, alpha=0.1)
    assert time.monotonic() - t0 < 30  # refused, not waited for until the stall timeout


def test_an_array_another_cluster_holds_is_refused(local_cluster):
    X, y = _dense()
    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address="127.0.0.1:0") as lc, \
            Client(lc, set_as_default=False) as other:  # fmt: skip
        held = other.persist(da.from_array(X, chunks=(N // 2, P)))
        with pytest.raises(ValidationError, match="persisted on the cluster of scheduler"):
            dl1.fit(held, y, alpha=0.1, client=local_cluster)
        # in process, its chunks come from the cluster that holds them
        with dask.config.set(scheduler="sync"):
            res = dl1.fit(held, y, alpha=0.1, tol=1e-10, client=None)
    ref = dl1.fit(X, y, alpha=0.1, tol=1e-10, client=None)
    np.testing.assert_allclose(res.coef_, ref.coef_, atol=1e-6 * np.abs(ref.coef_).max())


def test_a_persisted_array_takes_one_piece_by_the_rule(local_cluster):
    """The case that failed: a persisted dense array, small enough for the rule's default."""
    X, y = _dense()
    held = local_cluster.persist(da.from_array(X, chunks=(N // 2, P)))
    with task_stream(local_cluster) as ts:
        res = dl1.fit(held, y, alpha=0.05, tol=1e-10, client=local_cluster)
    assert [e for e in ts.data if str(e["key"]).startswith("in_worker")]
    np.testing.assert_allclose(res.coef_, dl1.fit(X, y, alpha=0.05, tol=1e-10).coef_,
                               atol=1e-6)  # fmt: skip
