"""In-memory data on a cluster: each worker receives the columns (or rows) of its own
blocks only, not the whole matrix, and a lost block is computed again from its task.

Before, the matrix was wrapped whole in a dask array: every worker that computed one of
its chunks received all of it, so a matrix that fit the cluster's memory spread out did
not fit one worker's."""

from __future__ import annotations

import os
import signal

import dask
import numpy as np
import pytest
import scipy.sparse as sp

import dl1
from tests.reliability.faults import nanny_cluster, worker_pids
from tests.test_penalised import make_regression

#: Share of the matrix's bytes a worker may receive: its blocks' columns (half of them on
#: two workers) and the length-n vectors, never the whole matrix.
LARGEST_SHARE = 0.6


def regression(n: int = 3000, p: int = 2000, dense: bool = False):
    rng = np.random.default_rng(4)
    X = sp.random(n, p, density=0.05, format="csr", random_state=4)
    X = X.toarray() if dense else X
    y = X[:, :30] @ rng.standard_normal(30) + 0.01 * rng.standard_normal(n)
    return X, np.asarray(y).ravel()


def nbytes(X) -> int:
    return X.nbytes if isinstance(X, np.ndarray) else X.data.nbytes + X.indices.nbytes


def traffic(client) -> tuple[dict[str, int], int]:
    """Bytes the scheduler has sent each worker (task specs with their arguments, over its
    stream to the worker) and bytes the workers have sent one another."""
    sent = client.run_on_scheduler(
        lambda dask_scheduler: {a: c.byte_count for a, c in dask_scheduler.stream_comms.items()}
    )
    peers = client.run(lambda dask_worker: dask_worker.transfer_outgoing_bytes_total)
    return sent, sum(peers.values())


def received_during(client, call) -> tuple[dict[str, int], int]:
    """What each worker received from the scheduler, and the workers from one another,
    while ``call(look)`` runs up to its first ``look`` (a fit's callback: blocks loaded)."""
    before = traffic(client)
    seen: list[tuple[dict[str, int], int]] = []

    def look(*args):
        if not seen:
            seen.append(traffic(client))

    result = call(look)
    sent, peers = seen[0]
    return {a: sent[a] - before[0].get(a, 0) for a in sent}, peers - before[1], result


@pytest.fixture
def distributed():
    with dask.config.set({"dl1.one-piece": False}):
        yield


@pytest.mark.usefixtures("distributed")
@pytest.mark.parametrize(("dense", "solver"), [(False, "ws"), (True, "ws"), (False, "sdca")])
def test_each_worker_receives_its_blocks_only(local_cluster, dense, solver):
    """Pass: no worker receives as much as 60% of the matrix's bytes (its blocks are half
    of them), and the fit equals the one in this process. Before: each worker received
    the whole matrix with every chunk task it ran (4 x the matrix for the dense one)."""
    X, y = regression(dense=dense)
    kw = dict(alpha=0.05, tol=1e-8, solver=solver)
    if solver == "sdca":
        kw |= dict(l1_ratio=0.5, tol=1e-5, max_epochs=500)
    per_worker, between, got = received_during(
        local_cluster, lambda look: dl1.fit(X, y, client=local_cluster, callback=look, **kw)
    )
    here = dl1.fit(X, y, client=None, **kw)
    np.testing.assert_allclose(got.coef_, here.coef_, rtol=0, atol=1e-10)
    assert max(per_worker.values()) < LARGEST_SHARE * nbytes(X), (per_worker, nbytes(X))
    assert between < 0.1 * nbytes(X), between


@pytest.mark.usefixtures("distributed")
def test_a_handle_of_in_memory_data_is_spread(local_cluster):
    X, y = regression()
    sent = traffic(local_cluster)[0]
    with dl1.persist(X, y, client=local_cluster) as ds:
        after = traffic(local_cluster)[0]
        got = dl1.fit(ds, alpha=0.05, tol=1e-8)
    assert max(after[a] - sent.get(a, 0) for a in after) < LARGEST_SHARE * nbytes(X)
    here = dl1.fit(X, y, alpha=0.05, tol=1e-8, client=None)
    np.testing.assert_allclose(got.coef_, here.coef_, rtol=0, atol=1e-10)


@pytest.mark.slow
@pytest.mark.usefixtures("distributed")
def test_a_worker_lost_mid_fit_has_its_blocks_computed_again():
    """SIGKILL a worker at round 3 (its nanny starts another): its blocks are computed
    again from their tasks, and the fit equals the undisturbed one bit for bit."""
    X, y = make_regression(n=3000, p=4000, density=0.01, seed=9)
    kw = dict(alpha=1e-4, tol=1e-9, max_rounds=100_000)
    with nanny_cluster(2) as (_, client):
        ref = dl1.fit(X, y, client=client, **kw)
        assert ref.n_rounds_ > 3

        def kill_at_round_3(entry):
            if entry["round"] == 3:
                os.kill(next(iter(worker_pids(client).values())), signal.SIGKILL)

        got = dl1.fit(X, y, client=client, callback=kill_at_round_3, **kw)
    np.testing.assert_array_equal(got.coef_, ref.coef_)
    assert got.intercept_ == ref.intercept_
