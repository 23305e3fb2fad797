"""benchmarks/bench_row_calls.py on tiny stores: every run certified, both transports,
the records the scaling model fits its row parameters on."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import dl1

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_row_calls  # noqa: E402
import scaling_model  # noqa: E402


def _store(path: Path, n: int) -> str:
    rng = np.random.default_rng(n)
    X = sp.random(n, 80, density=0.05, format="csr", random_state=rng)
    y = X @ rng.standard_normal(80) + 0.1 * rng.standard_normal(n)
    dl1.from_scipy(X, y, path, n_feature_blocks=2)
    return str(path)


@pytest.mark.slow
def test_bench_row_calls_times_both_transports(tmp_path):
    """One run a store and transport on a 2-worker LocalCluster: certified, the same
    calls both ways, and records the model fits each transport's parameters from."""
    a, b = _store(tmp_path / "a.zarr", 300), _store(tmp_path / "b.zarr", 600)
    out = tmp_path / "rows.json"
    assert bench_row_calls.main(["--stores", a, b, "--small", a, "--partitions", "2", "4",
                                 "--repeat", "1", "--tol", "1e-8", "--json", str(out)]) == 0
    runs = json.loads(out.read_text())
    assert {(r["transport"], r["series"]) for r in runs} == {
        (t, s) for t in ("direct", "tasks") for s in ("rows", "partitions")
    }
    assert all(r["gap"] <= 1e-8 and r["calls"] > 0 and r["workers"] == 2 for r in runs)
    # the solve is timed inside the whole fit (the model's set-up is their difference)
    assert all(0 < r["fit_seconds"] < r["seconds"] for r in runs)
    calls = {(r["store"], r["partitions"], r["transport"]): r["calls"] for r in runs}
    assert all(calls[(s, q, "direct")] == calls[(s, q, "tasks")] for s, q, _ in calls)
    for direct in (True, False):
        # each transport's parameters come from its own runs only
        own = [r for r in runs if (r["transport"] == "direct") == direct]
        rp = scaling_model.fit_row_params(runs, 2e-9, direct=direct, message_s=1e-3)
        assert rp == scaling_model.fit_row_params(own, 2e-9, direct=direct, message_s=1e-3)
        assert rp.direct == direct
