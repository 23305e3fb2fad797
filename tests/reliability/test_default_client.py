"""Without ``client=``, dl1's entry points run on the current Dask client when there is one
(as ``dask.compute`` does: ``distributed.default_client()``) and in this process when there
is none."""

import numpy as np
import pytest

import dl1
from dl1.estimators import Lasso
from tests.helpers import task_stream

CALLS = {
    "fit": lambda X, y: dl1.fit(X, y, alpha=0.05),
    "path": lambda X, y: dl1.path(X, y, n_alphas=3),
    "alpha_max": lambda X, y: dl1.alpha_max(X, y),
    "fit_constrained": lambda X, y: dl1.fit_constrained(X, y, delta=1.0, tol=1e-2),
    "path_constrained": lambda X, y: dl1.path_constrained(X, y, n_deltas=3, tol=1e-2),
    "Lasso": lambda X, y: Lasso(alpha=0.05).fit(X, y),
}


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((80, 16))
    return X, X[:, 0] - X[:, 1] + 0.1 * rng.standard_normal(80)


def tasks_run(client, call, X, y) -> int:
    """How many tasks the cluster of ``client`` ran during ``call(X, y)``."""
    with task_stream(client) as stream:
        call(X, y)
    return len(stream.data)


@pytest.mark.parametrize("entry", list(CALLS))
@pytest.mark.slow
def test_entry_points_use_the_current_client(local_cluster, data, entry):
    """Pass criterion: inside ``with Client(cluster)`` (the session cluster's client is not
    the default one) a call without ``client=`` runs tasks on that cluster (before: none,
    everything ran in the calling process); outside it, with no current client, it runs
    none there."""
    from distributed import Client

    X, y = data
    assert tasks_run(local_cluster, CALLS[entry], X, y) == 0
    with Client(local_cluster.scheduler.address) as current:
        assert tasks_run(current, CALLS[entry], X, y) > 0
    assert tasks_run(local_cluster, CALLS[entry], X, y) == 0


@pytest.mark.parametrize("one_piece", [False, True])
def test_results_do_not_depend_on_where_they_ran(local_cluster, data, one_piece):
    """Pass criterion: the fit on the current client, distributed or in one piece on a
    worker, equals the in-process fit bit for bit (the partitions, not the cluster, fix
    the arithmetic)."""
    import dask
    from distributed import Client

    X, y = data
    local = dl1.fit(X, y, alpha=0.05, tol=1e-8)
    with Client(local_cluster.scheduler.address), dask.config.set({"dl1.one-piece": one_piece}):
        remote = dl1.fit(X, y, alpha=0.05, tol=1e-8)
    assert {h["transport"] for h in local.history_} == {"local"}
    # distributed, the rounds ran as tasks or calls; in one piece, in a worker's process
    assert ("local" in {h["transport"] for h in remote.history_}) == one_piece
    np.testing.assert_array_equal(local.coef_, remote.coef_)


def test_a_local_dask_scheduler_keeps_the_fit_in_process(local_cluster, data):
    """Pass criterion: under ``dask.config.set(scheduler="sync")`` a call without
    ``client=`` runs no task on the current client's cluster, as ``dask.compute`` would
    not."""
    import dask
    from distributed import Client

    X, y = data
    with Client(local_cluster.scheduler.address) as current, dask.config.set(scheduler="sync"):
        assert tasks_run(current, CALLS["fit"], X, y) == 0
