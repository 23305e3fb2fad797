"""A worker SIGKILLed during a cross-validation whose folds run in one piece, side by side:
the folds it held run again on the other worker and the answer is the one in process."""

from __future__ import annotations

import os
import signal
import threading
import time
import warnings

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster

import dl1
from tests.helpers import random_csr


def _fold_workers(client) -> list[str]:
    """The workers running a one-piece task now."""
    return [w for w, keys in client.processing().items()
            if any(str(k).startswith("in_worker") for k in keys)]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["LassoCV"])  # LogisticRegressionCV: the same folds
def test_a_worker_killed_mid_cross_validation_is_survived(kind):
    """Pass: one of two workers SIGKILLed while it runs a fold: the fit completes with
    the in-process choice of alpha (or C) and coefficients (1e-8)."""
    rng = np.random.default_rng(3)
    X = random_csr(2000, 1500, 0.02, 3)
    w = np.zeros(1500)
    w[:100] = rng.standard_normal(100)
    y = X @ w + 0.5 * rng.standard_normal(2000)
    if kind == "LassoCV":
        make = lambda client: dl1.LassoCV(cv=4, alphas=12, tol=1e-8, client=client)  # noqa: E731
    else:
        y = np.where(y > np.median(y), 1.0, -1.0)
        make = lambda client: dl1.LogisticRegressionCV(  # noqa: E731
            cv=4, Cs=6, tol=1e-8, client=client)  # fmt: skip
    here = make(None).fit(X, y)
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                     dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster, set_as_default=False) as client,
    ):  # fmt: skip
        pids = client.run(os.getpid)
        killed = []

        def kill_a_fold_runner():
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not killed:
                busy = _fold_workers(client)
                if busy:
                    time.sleep(0.5)  # inside the fold's solve
                    killed.append(busy[0])
                    os.kill(pids[busy[0]], signal.SIGKILL)
                time.sleep(0.02)

        killer = threading.Thread(target=kill_a_fold_runner, daemon=True)
        killer.start()
        with dask.config.set({"dl1.one-piece": True}), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the killed worker's comm
            there = make(client).fit(X, y)
        killer.join(5)
    assert killed, "no fold was seen running"
    chosen = "alpha_" if kind == "LassoCV" else "C_"
    assert np.all(getattr(there, chosen) == getattr(here, chosen))
    np.testing.assert_allclose(there.coef_, here.coef_, atol=1e-8)
