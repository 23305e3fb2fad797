"""Dask inputs computed by dl1 (targets, weights, lazy predictions) run where the solve
runs: in the task's own thread within a solve in one piece on a worker, on the current
client otherwise (:func:`dl1.runtime.compute.computed`)."""

from __future__ import annotations

import os
import threading

import dask
import dask.array as da
import numpy as np
import pytest

from dl1.inputs import as_vector
from dl1.predict import score
from dl1.runtime import compute

N = 40


def data(seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, 3))
    coef = np.array([1.0, -2.0, 0.5])
    y = np.where(rng.random(N) < 0.5, -1.0, 1.0)
    return X, coef, y


def pinned(a, pid, tid, chunks):
    """``a`` as a dask array whose chunks refuse to be computed anywhere but in thread
    ``tid`` of process ``pid`` (a closure: pickled by value for the workers)."""

    def guard(block):
        here = (os.getpid(), threading.get_ident())
        if here != (pid, tid):
            raise RuntimeError(f"computed in {here}, not in the task's {(pid, tid)}")
        return block

    return da.from_array(a, chunks=chunks).map_blocks(guard, dtype=a.dtype)


def in_one_piece_task(what):
    """Run on a worker: as a solve in one piece would, read dask targets (``what`` is
    ``"as_vector"``) or score lazy predictions (``"score"``); every chunk is computed in
    this very thread."""

    X, coef, y = data()
    pid, tid = os.getpid(), threading.get_ident()
    yd = pinned(y, pid, tid, N // 4)
    Xd = pinned(X, pid, tid, (N // 2, 3))
    with compute.solving_here():
        if what == "as_vector":
            return as_vector(yd, N, "y")
        return score(Xd, yd, coef, 0.0, "logistic")


@pytest.mark.parametrize("what", ["as_vector", "score"])
def test_inside_a_one_piece_task_dask_inputs_are_computed_in_its_thread(local_cluster, what):
    X, coef, y = data()
    got = local_cluster.submit(in_one_piece_task, what, pure=False).result(timeout=120)
    if what == "as_vector":
        np.testing.assert_array_equal(got, y)
    else:
        assert got == np.mean(np.where(X @ coef > 0, 1.0, -1.0) == y)


def test_in_the_caller_the_current_client_computes_them(local_cluster):
    def where(block):
        return np.full(block.shape, float(os.getpid()))

    pids = da.from_array(np.zeros(N), chunks=N // 4).map_blocks(where, dtype=float)
    with local_cluster.as_current():
        on_workers = as_vector(pids, N, "y")
        with dask.config.set(scheduler="sync"):  # a local scheduler named: as dask.compute
            here = as_vector(pids, N, "y")
    workers = {float(p) for p in local_cluster.run(os.getpid).values()}
    assert set(on_workers) <= workers and os.getpid() not in set(on_workers)
    np.testing.assert_array_equal(here, float(os.getpid()))


def test_without_a_client_they_are_computed_here():
    X, coef, y = data(1)
    with dask.config.set(scheduler="sync"):  # no client: the caller's thread
        tid = threading.get_ident()
        yd = pinned(y, os.getpid(), tid, N // 4)
        np.testing.assert_array_equal(as_vector(yd, N, "y"), y)
        acc = score(pinned(X, os.getpid(), tid, (N // 2, 3)), yd, coef, 0.3, "logistic")
    assert acc == pytest.approx(np.mean(np.where(X @ coef + 0.3 > 0, 1.0, -1.0) == y))
