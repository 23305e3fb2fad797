"""``dl1 warm``: every kernel a first fit needs is in numba's cache afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

FIRST_FIT = """
import numpy as np, scipy.sparse as sp, dl1
X = sp.random(2000, 5000, density=0.01, format="csr", random_state=0)
y = np.asarray(X[:, :20] @ np.arange(1.0, 21.0)).ravel()
print("GAP", dl1.Lasso(alpha=0.01).fit(X, y).gap_)
"""

#: A first multiclass fit of each kind: multinomial (l1, then grouped) and one-vs-rest
#: (logistic, squared hinge, hinge), on float64 data as a store's; the largest gap printed.
FIRST_MULTICLASS_FIT = """
import numpy as np, scipy.sparse as sp, dl1
X = sp.random(600, 300, density=0.05, format="csr", random_state=0)
z = X @ np.random.default_rng(0).standard_normal((300, 4))
y = np.argmax(z + np.random.default_rng(1).gumbel(size=z.shape), axis=1)
gaps = [dl1.fit_multiclass(X, y, alpha=0.002, penalty=p, tol=1e-6).gap_
        for p in ("l1", "grouped")]
gaps += [dl1.fit_multiclass(X, y, alpha=0.002, multi_class="ovr", loss=loss, tol=1e-6).gap_
         for loss in ("logistic", "squared_hinge", "hinge")]
print("GAP", max(gaps))
"""


def _run(args, cache, cwd):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "NUMBA_DEBUG_CACHE": "1"}
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=600,
                          cwd=cwd)  # fmt: skip


@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    """A numba cache filled by ``dl1 warm --json`` from empty (a new installation), and
    warm's JSON document."""
    root = tmp_path_factory.mktemp("warm")
    warm = _run([sys.executable, "-m", "dl1", "warm", "--json"], root / "cache", root)
    assert warm.returncode == 0, warm.stderr
    return root / "cache", json.loads(warm.stdout[warm.stdout.index("{") :])


def _first_fit_compiles_nothing(script, warmed, tmp_path):
    """``script`` compiles kernels in a process of an empty cache (so that the check can
    fail), none in one of the warmed cache; returns the warmed process's printed gap."""
    cold = _run([sys.executable, "-c", script], tmp_path / "empty", tmp_path)
    assert cold.returncode == 0 and "data saved" in cold.stdout + cold.stderr, cold.stderr
    first = _run([sys.executable, "-c", script], warmed[0], tmp_path)
    assert first.returncode == 0, first.stderr
    saved = [line for line in (first.stdout + first.stderr).splitlines() if "data saved" in line]
    assert not saved, saved
    return float(first.stdout.split("GAP")[1].split()[0])


@pytest.mark.slow
def test_after_dl1_warm_a_first_fit_compiles_nothing(warmed, tmp_path):
    """An empty numba cache (a new installation), ``dl1 warm --json``, then a first fit in
    a new process with numba's cache logging on.

    Pass: warm exits 0 reporting its stages (every loss, both dtypes, ingest); the fit's
    process saves no kernel to the cache (it loads them all), and its gap is certified.
    Without warm the same fit saves kernels (checked first, so the test can fail).
    """
    assert {"squared (float32)", "logistic (float64)", "ingest"} <= set(warmed[1]["stages"])
    assert 0 <= _first_fit_compiles_nothing(FIRST_FIT, warmed, tmp_path) <= 1e-4


@pytest.mark.slow
def test_after_dl1_warm_a_first_multiclass_fit_compiles_nothing(warmed, tmp_path):
    """As above for the multiclass models (:mod:`dl1.kernels.multiclass`, the one-vs-rest
    scans and subproblems): warm reports its multiclass stages, and a first multinomial
    (l1, grouped) and one-vs-rest (logistic, squared hinge, hinge) fit in a new process
    loads every kernel and is certified."""
    assert {"multiclass (float64)", "multiclass (float32)"} <= set(warmed[1]["stages"])
    assert 0 <= _first_fit_compiles_nothing(FIRST_MULTICLASS_FIT, warmed, tmp_path) <= 1e-6
