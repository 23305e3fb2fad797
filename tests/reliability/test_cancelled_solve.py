"""A solve in one piece whose caller is gone stops on its worker: the worker is free for
the next caller within seconds, not after the whole solve."""

from __future__ import annotations

import time

import dask
import numpy as np
import pytest

import dl1
from tests.helpers import random_csr


def _long_path_data():
    """A path of about a minute in one piece on this machine (100 alphas to eps 1e-3 at a
    tol of 1e-10, 200 true features)."""
    rng = np.random.default_rng(0)
    X = random_csr(1000, 1500, 0.02, 0)
    w = np.zeros(1500)
    w[:200] = rng.standard_normal(200)
    return X, X @ w + 0.5 * rng.standard_normal(1000)


def _executing(client) -> int:
    return sum(client.run(lambda dask_worker: dask_worker.state.executing_count).values())


@pytest.mark.slow
def test_a_cancelled_one_piece_path_stops_on_its_worker_within_seconds(local_cluster):
    """Pass: the callback raising at the first alpha (as Ctrl-C would) cancels the task, and
    no worker runs it 5 s later (the path has ~100 alphas left); the worker then serves
    the next call."""
    X, y = _long_path_data()
    seen = []

    def stop(*call):
        seen.append(call)
        raise KeyboardInterrupt

    with dask.config.set({"dl1.one-piece": True}), pytest.raises(KeyboardInterrupt):
        dl1.path(X, y, n_alphas=100, eps=1e-3, tol=1e-10, client=local_cluster, callback=stop)
    t0 = time.monotonic()
    assert len(seen) == 1
    while _executing(local_cluster) and time.monotonic() - t0 < 60:
        time.sleep(0.1)
    assert time.monotonic() - t0 <= 5.0, "the cancelled solve ran on"
    assert dl1.alpha_max(X, y, client=local_cluster) > 0
