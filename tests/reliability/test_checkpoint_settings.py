"""Path checkpoints: every setting that changes the answer is in the checkpoint's identity,
and one checkpoint is written by one thread of one process at a time.

Every test states its pass criterion.
"""

import json
import threading

import numpy as np
import pytest

import dl1
from dl1.errors import CheckpointLockedError
from dl1.paths.checkpoint import PathCheckpoint
from dl1.paths.checkpoint_format import PROGRESS, CheckpointMismatchError
from tests.helpers import random_csr, stop_path_after
from tests.reliability.faults import assert_same_path

N_ALPHAS = 4
#: A few sgd epochs per alpha certify no alpha: the warnings are expected.
pytestmark = pytest.mark.filterwarnings("ignore:alpha.*is not certified")


@pytest.fixture(scope="module")
def problem():
    X = random_csr(80, 15, 0.3, seed=5)
    y = X @ np.random.default_rng(6).standard_normal(15) + 0.1
    return X, y


SETTINGS = {"solver": "sgd", "max_epochs": 4, "seed": 0}


@pytest.mark.parametrize(
    "settings,changed,field",
    [
        (SETTINGS, {"max_epochs": 6}, "max_epochs=4, this run has 6"),
        (SETTINGS, {"seed": 1}, "seed=0, this run has 1"),
        ({"solver": "ws"}, {"random_order": True}, "random_order=false, this run has true"),
    ],
)
def test_resume_with_another_setting_is_refused_and_the_same_resumes_bit_for_bit(
    problem, tmp_path, settings, changed, field
):
    """Pass: a path stopped after alpha 1 and resumed with another ``max_epochs`` or
    ``seed`` (sgd) or coordinate order (ws) is refused with CheckpointMismatchError naming
    the setting and both values, leaving the checkpoint as it was; resumed with the same
    settings it gives the uninterrupted path bit for bit. Before: the resume with another
    max_epochs or seed was accepted and mixed both settings."""
    X, y = problem
    ref = dl1.path(X, y, n_alphas=N_ALPHAS, checkpoint=str(tmp_path / "ref"), **settings)
    ck = tmp_path / "ck"
    stop_path_after(1, X, y, n_alphas=N_ALPHAS, checkpoint=str(ck), **settings)
    before = (ck / PROGRESS).read_bytes()
    with pytest.raises(CheckpointMismatchError, match=f"settings.solver_options.*{field}"):
        dl1.path(X, y, n_alphas=N_ALPHAS, checkpoint=str(ck), **{**settings, **changed})
    assert (ck / PROGRESS).read_bytes() == before
    assert len(json.loads(before)["done"]) == 2
    assert_same_path(dl1.path(X, y, n_alphas=N_ALPHAS, checkpoint=str(ck), **settings), ref)


def test_two_threads_opening_one_checkpoint_at_once(tmp_path):
    """Pass: in each of 20 trials, two threads started together (a barrier) opening one new
    checkpoint give one checkpoint object and one CheckpointLockedError naming another
    thread of this process, never another error. Before: zarr's ContainsArrayError or
    "exists and is not a dl1 path checkpoint", varying by run."""
    for trial in range(20):
        path = tmp_path / f"ck{trial}"
        start, hold = threading.Barrier(2), threading.Barrier(2, timeout=60)
        got: list = [None, None]

        def open_it(i, path=path, start=start, hold=hold, got=got):
            start.wait()
            try:
                got[i] = PathCheckpoint.open_or_create(
                    path, fingerprint={"data": 1}, settings={"tol": 1e-4},
                    alphas=np.array([1.0, 0.5]), n_features=3,
                )  # fmt: skip
            except Exception as e:  # noqa: BLE001 - the test looks at every outcome
                got[i] = e
            hold.wait()  # the winner holds its object while the other tries

        threads = [threading.Thread(target=open_it, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        kinds = sorted(type(g).__name__ for g in got)
        assert kinds == ["CheckpointLockedError", "PathCheckpoint"], (trial, got)
        err = next(g for g in got if isinstance(g, CheckpointLockedError))
        assert "another thread of this process" in str(err)
        next(g for g in got if isinstance(g, PathCheckpoint)).close()


def test_second_thread_path_is_refused_while_the_first_writes(problem, tmp_path):
    """Pass: while a thread's dl1.path holds a checkpoint (stopped in its callback after
    alpha 0), dl1.path on the same checkpoint in the main thread raises
    CheckpointLockedError and leaves the progress file as it was; the first thread then
    ends with the uninterrupted path, bit for bit, and the checkpoint opens again."""
    X, y = problem
    ref = dl1.path(X, y, n_alphas=N_ALPHAS, checkpoint=str(tmp_path / "ref"), **SETTINGS)
    ck = tmp_path / "ck"
    holding, go = threading.Event(), threading.Event()
    out: dict = {}

    def hold(k, alpha, res):
        if k == 0:
            holding.set()
            go.wait(timeout=120)

    def first():
        try:
            out["res"] = dl1.path(X, y, n_alphas=N_ALPHAS, checkpoint=str(ck), callback=hold,
                                  **SETTINGS)  # fmt: skip
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            out["error"] = e

    t = threading.Thread(target=first)
    t.start()
    try:
        assert holding.wait(timeout=120)
        before = (ck / PROGRESS).read_bytes()
        with pytest.raises(CheckpointLockedError, match="another thread of this process"):
            dl1.path(X, y, n_alphas=N_ALPHAS, checkpoint=str(ck), **SETTINGS)
        assert (ck / PROGRESS).read_bytes() == before
    finally:
        go.set()
        t.join(timeout=120)
    assert "error" not in out, out
    assert_same_path(out["res"], ref)
    assert_same_path(dl1.path(X, y, n_alphas=N_ALPHAS, checkpoint=str(ck), **SETTINGS), ref)
