"""``client=`` as a scheduler's address: a client connected for the call (closed after),
or kept by a handle until it is released; addresses where no scheduler answers refused
by name."""

from __future__ import annotations

import dask
import numpy as np
import pytest
import scipy.sparse as sp

import dl1
from dl1.errors import ValidationError


def data():
    X = sp.random(300, 40, density=0.2, random_state=0, format="csr")
    y = X @ np.linspace(-1, 1, 40) + np.random.default_rng(0).normal(scale=0.1, size=300)
    return X, y


def clients_of(client) -> set[str]:
    """The scheduler's connected clients, other than ``client`` and fire-and-forget."""
    ids = client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.clients))
    return set(ids) - {client.id, "fire-and-forget"}


def test_a_fit_on_an_address_connects_for_the_call_and_closes(local_cluster):
    X, y = data()
    address = local_cluster.scheduler.address
    here = dl1.fit(X, y, alpha=0.01, tol=1e-10)
    there = dl1.fit(X, y, alpha=0.01, tol=1e-10, client=address)
    assert there.converged_ and there.gap_ <= 1e-10
    np.testing.assert_allclose(there.coef_, here.coef_, atol=1e-8)
    assert clients_of(local_cluster) == set()


def test_a_path_and_an_estimator_take_an_address(local_cluster):
    X, y = data()
    address = local_cluster.scheduler.address
    p_here = dl1.path(X, y, n_alphas=5, tol=1e-9)
    p_there = dl1.path(X, y, n_alphas=5, tol=1e-9, client=address)
    np.testing.assert_allclose(p_there.coefs_.toarray(), p_here.coefs_.toarray(), atol=1e-8)
    est = dl1.Lasso(alpha=0.01, tol=1e-10, client=address).fit(X, y)
    np.testing.assert_allclose(est.coef_, dl1.Lasso(alpha=0.01, tol=1e-10).fit(X, y).coef_,
                               atol=1e-8)  # fmt: skip
    assert clients_of(local_cluster) == set()


def test_a_handle_keeps_its_connection_until_released(local_cluster):
    X, y = data()
    address = local_cluster.scheduler.address
    ds = dl1.persist(X, y, client=address)
    assert len(clients_of(local_cluster)) == 1  # the handle's client holds the blocks
    fit = dl1.fit(ds, alpha=0.01, tol=1e-10)
    np.testing.assert_allclose(fit.coef_, dl1.fit(X, y, alpha=0.01, tol=1e-10).coef_, atol=1e-8)
    ds.release()
    assert clients_of(local_cluster) == set()


def test_an_address_where_no_scheduler_answers_is_named():
    X, y = data()
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        with pytest.raises(ConnectionError, match=r"no Dask scheduler answers at tcp://127"):
            dl1.fit(X, y, alpha=0.01, client="tcp://127.0.0.1:9")


@pytest.mark.parametrize(
    ("client", "match"),
    [("127.0.0.1:8786", "nor a scheduler address"), ("localhost", "nor a scheduler address")],
)
def test_a_string_that_is_no_address_is_refused(client, match):
    X, y = data()
    with pytest.raises(ValidationError, match=match):
        dl1.fit(X, y, alpha=0.01, client=client)


def test_a_tls_address_without_certificates_says_what_to_set():
    X, y = data()
    with dask.config.set({"distributed.comm.tls.ca-file": None,
                          "distributed.comm.tls.client.cert": None}):  # fmt: skip
        with pytest.raises(ValidationError, match=r"distributed.comm.tls.ca-file"):
            dl1.fit(X, y, alpha=0.01, client="tls://127.0.0.1:8786")
