"""A solve in one piece whose caller is gone stops on its worker: the worker is free for
the next caller within seconds, not after the whole solve."""

from __future__ import annotations

import importlib
import threading
import time

import dask
import numpy as np
import pytest
import scipy.sparse as sp

import dl1
from dl1.cancellation import cancellable
from dl1.errors import SolveCancelled
from dl1.runtime import executor
from dl1.solvers.ws import WorkingSetSolver
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


@pytest.mark.parametrize(
    ("loss", "gram_max", "module", "kernel"),
    [("squared", 8192, "dl1.tasks.gram", "gram_cd_epochs"),
     ("squared", 0, "dl1.tasks.subproblem", "cd_block_epochs"),
     ("logistic", 8192, "dl1.tasks.prox_newton", "weighted_cd_epochs")],
)  # fmt: skip
def test_a_cancelled_solve_stops_within_one_epoch_of_its_subproblem(
    monkeypatch, loss, gram_max, module, kernel
):
    """Pass: the cancellation set after a subproblem's 5th kernel call (Gram covariance
    updates; coordinate descent on the columns, working sets past ``gram_max``; the
    logistic Newton step's coordinate descent) stops the solve before the next epoch, in
    the subproblem, with SolveCancelled: a long subproblem does not run to its end once
    its caller is gone."""
    A = random_csr(300, 40, 0.2, 1)
    X = sp.hstack([A, A + 0.01 * random_csr(300, 40, 0.2, 3)], format="csr")  # ill-conditioned
    y = X @ np.random.default_rng(2).standard_normal(80)
    if loss != "squared":
        y = np.where(y > np.median(y), 1.0, -1.0)
    mod = importlib.import_module(module)
    real = getattr(mod, kernel)
    event, calls = threading.Event(), []

    def cancel_at_fifth(*args):
        calls.append(1)
        out = real(*args)
        if len(calls) == 5:
            event.set()  # the watcher would set it now: the caller went away
        return out

    monkeypatch.setattr(mod, kernel, cancel_at_fifth)
    monkeypatch.setattr(executor, "warm_up", lambda: None)  # its calls are not the solve's
    alpha = 0.001 * dl1.alpha_max(X, y, loss=loss, client=None)
    solver = WorkingSetSolver(gram_max=gram_max)
    with dask.config.set(scheduler="sync"), cancellable(event):
        with pytest.raises(SolveCancelled, match="subproblem, step"):
            dl1.fit(X, y, alpha=alpha, loss=loss, tol=1e-12, client=None, solver=solver)
    assert len(calls) == 5
