"""Inputs that crashed with an error naming nothing: a closed client, weights near the
float64 limit (an address in place of a client: tests/runtime/test_connection.py)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import dl1
from dl1.errors import ValidationError


def data():
    X = sp.random(200, 30, density=0.2, random_state=0, format="csr")
    return X, np.random.default_rng(0).normal(size=200)


def test_a_closed_client_is_named():
    """Pass: a fit on a closed client raises ValidationError saying so (before:
    AttributeError 'NoneType' object has no attribute 'address')."""
    from distributed import Client, LocalCluster

    X, y = data()
    with LocalCluster(n_workers=1, processes=False, dashboard_address="127.0.0.1:0") as cluster:
        client = Client(cluster, set_as_default=False)
        client.close()
        with pytest.raises(ValidationError, match="client is closed"):
            dl1.fit(X, y, alpha=0.01, client=client)


@pytest.mark.parametrize("scale", [1e300, 1e-318])
def test_weights_near_the_float_limits_fit_as_their_rescaled_copy(scale):
    """Pass: weights of 1e308 (whose sum overflows) or subnormal ones (whose sum n would
    divide to inf) give the fit of the weights rescaled into the normal range (before:
    ZeroDivisionError, or a refusal)."""
    X, y = data()
    sw = np.ones(200)
    sw[:5] = 8.0
    extreme = sw * (1e308 / 8.0 if scale > 1 else scale)
    res = dl1.fit(X, y, alpha=0.01, sample_weight=extreme, tol=1e-10)
    ref = dl1.fit(X, y, alpha=0.01, sample_weight=sw, tol=1e-10)
    assert res.converged_
    np.testing.assert_allclose(res.coef_, ref.coef_, rtol=1e-9, atol=1e-12)


def test_a_huge_n_partitions_costs_what_the_data_does():
    """Pass: n_partitions=10**9 on 200 x 30 data allocates under 50 MB (tracemalloc's peak)
    and gives the n_partitions=30 answer (before: a 10**9-point linspace, 6 GB)."""
    import tracemalloc

    X, y = data()
    ref = dl1.fit(X, y, alpha=0.01, n_partitions=30)
    tracemalloc.start()
    try:
        res = dl1.fit(X, y, alpha=0.01, n_partitions=10**9)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 50e6
    np.testing.assert_array_equal(res.coef_, ref.coef_)
