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


@pytest.mark.slow
def test_after_dl1_warm_a_first_fit_compiles_nothing(tmp_path):
    """An empty numba cache (a new installation), ``dl1 warm --json``, then a first fit in
    a new process with numba's cache logging on.

    Pass: warm exits 0 reporting its stages (every loss, both dtypes, ingest); the fit's
    process saves no kernel to the cache (it loads them all), and its gap is certified.
    Without warm the same fit saves kernels (checked first, so the test can fail).
    """
    def run(args, cache):
        env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "NUMBA_DEBUG_CACHE": "1"}
        return subprocess.run(args, capture_output=True, text=True, env=env, timeout=600,
                              cwd=tmp_path)  # fmt: skip

    cold = run([sys.executable, "-c", FIRST_FIT], tmp_path / "empty")
    assert cold.returncode == 0 and "data saved" in cold.stdout + cold.stderr
    cache = tmp_path / "cache"
    warm = run([sys.executable, "-m", "dl1", "warm", "--json"], cache)
    assert warm.returncode == 0, warm.stderr
    doc = json.loads(warm.stdout[warm.stdout.index("{"):])
    assert {"squared (float32)", "logistic (float64)", "ingest"} <= set(doc["stages"])
    first = run([sys.executable, "-c", FIRST_FIT], cache)
    assert first.returncode == 0, first.stderr
    assert "data saved" not in first.stdout + first.stderr
    gap = float(first.stdout.split("GAP")[1].split()[0])
    assert 0 <= gap <= 1e-4
