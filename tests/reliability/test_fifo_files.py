"""Files that are not files: a FIFO in place of a file dl1 reads (a store's manifest or an
array's metadata, a saved model's JSON or array, a checkpoint's progress) is refused at
once, naming it. A plain open of a FIFO waits for a writer for ever, so each case runs in a
child process with a deadline: a hang fails the test instead of the suite.

Pass: the child exits within 60 s, non-zero, with dl1's error naming the file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import dl1

DEADLINE_S = 60


def _data():
    X = sp.random(50, 8, density=0.3, format="csr", random_state=0)
    return X, np.asarray(X.sum(axis=1)).ravel() + 0.1


def _as_fifo(f: Path) -> None:
    assert f.is_file(), f"{f} is not there to replace"
    f.unlink()
    os.mkfifo(f)


def _refused(code: str, error: str, name: str) -> None:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=DEADLINE_S)  # fmt: skip
    last = (done.stderr.strip().splitlines() or [""])[-1]
    assert done.returncode != 0 and last.startswith(f"dl1.errors.{error}"), done.stderr[-2000:]
    assert name in last and "not a regular file" in last, last


@pytest.mark.parametrize(
    ("rel", "call"),
    [
        ("dl1-manifest.json", "dl1.open_store(p)"),
        ("train/y/zarr.json", "dl1.fit(p, alpha=0.1, client=None)"),
        ("train/stats/col_nnz/zarr.json", "dl1.fit(p, alpha=0.1, client=None)"),
    ],
)
@pytest.mark.slow
def test_a_fifo_in_a_store_is_refused(tmp_path, rel, call):
    store = tmp_path / "s.zarr"
    dl1.from_scipy(*_data(), store)
    _as_fifo(store / rel)
    _refused(f"import dl1; p = {str(store)!r}; {call}", "StoreCorruptError", os.path.basename(rel))


@pytest.mark.parametrize("name", ["model.json", "coef.npy"])
def test_a_fifo_in_a_saved_model_is_refused(tmp_path, name):
    model = dl1.fit(*_data(), alpha=0.1, client=None).save(tmp_path / "m")
    _as_fifo(model / name)
    _refused(f"import dl1; dl1.load_model({str(model)!r})", "ModelFileError", name)


@pytest.mark.slow
def test_a_fifo_in_a_checkpoint_is_refused(tmp_path):
    X, y = _data()
    ck = tmp_path / "ck"
    dl1.path(X, y, n_alphas=3, checkpoint=ck, client=None)
    _as_fifo(ck / "dl1-progress.json")
    code = ("import numpy as np, scipy.sparse as sp, dl1; "
            "X = sp.random(50, 8, density=0.3, format='csr', random_state=0); "
            "y = np.asarray(X.sum(axis=1)).ravel() + 0.1; "
            f"dl1.path(X, y, n_alphas=3, checkpoint={str(ck)!r}, client=None)")  # fmt: skip
    _refused(code, "CheckpointCorruptError", "dl1-progress.json")
