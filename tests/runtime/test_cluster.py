"""The deployment recipe: real `dask scheduler` and `dask worker` processes on 127.0.0.1."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import dask
import numpy as np
import pytest

import dl1
from tests.helpers import random_csr

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def recipe_cluster(tmp_path):
    """Start the cluster with cluster/start-local.sh, exactly as the recipe says."""
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "DL1_SCHEDULER_FILE": str(tmp_path / "scheduler.json"),
    }
    subprocess.run(
        ["bash", str(REPO / "cluster" / "start-local.sh"), "2"],
        cwd=tmp_path,
        env=env,
        check=True,
        timeout=300,
        capture_output=True,
    )
    address = json.loads((tmp_path / "scheduler.json").read_text())["address"]
    try:
        yield address, env
    finally:
        subprocess.run(
            ["bash", str(REPO / "cluster" / "stop-local.sh")], cwd=tmp_path, env=env, timeout=60
        )


@pytest.mark.slow
def test_fit_on_a_real_scheduler_and_workers(tmp_path, recipe_cluster):
    from distributed import Client

    address, env = recipe_cluster
    X = random_csr(300, 120, 0.1, seed=0)
    y = X @ np.r_[np.ones(5), np.zeros(115)] + 0.01 * np.arange(300) % 1
    store = tmp_path / "s.zarr"
    dl1.from_scipy(X, y, store, n_feature_blocks=3)
    with Client(address, timeout=30) as client:
        deadline = time.time() + 60
        while len(client.scheduler_info()["workers"]) < 2 and time.time() < deadline:
            time.sleep(0.2)
        assert len(client.scheduler_info()["workers"]) == 2

        def served(dask_worker):  # by value: the workers cannot import this test module
            plugin = dask_worker.plugins.get("dl1-partition-servers")
            return 0 if plugin is None else plugin.calls_served

        before = client.run(served)
        during: list[dict] = []

        def watch(entry):  # the workers serve the fit's direct calls (dl1.runtime.rpc)
            during.append(client.run(served))

        with dask.config.set({"dl1.one-piece": False}):  # distributed, with direct calls
            remote = dl1.fit(store, alpha=0.01, tol=1e-10, client=client, callback=watch)
        assert during and all(n > before[w] for w, n in during[-1].items())
        assert {h["transport"] for h in remote.history_} == {"direct"}
        # the recipe cached the kernels before starting the workers (dl1 warm)
        assert "kernels compiled or loaded" in (tmp_path / "dl1-warm.log").read_text()
        # the workers are separate processes started by the recipe
        assert os.getpid() not in client.run(os.getpid).values()
        # as the recipe starts it, the scheduler steals no work (dl1 places its tasks)
        assert not client.run_on_scheduler(
            lambda dask_scheduler: "stealing" in dask_scheduler.extensions
        )
        # and its workers run no statistical profiler
        profiles = client.run(lambda dask_worker: "profile" in dask_worker.periodic_callbacks)
        assert not any(profiles.values())
        # and they preload dl1.runtime.worker (each trims its heaps when its memory is high)
        trims = client.run(lambda dask_worker: "dl1-trim-memory" in dask_worker.periodic_callbacks)
        assert all(trims.values())
    local = dl1.fit(store, alpha=0.01, tol=1e-10)
    np.testing.assert_array_equal(remote.coef_, local.coef_)
    assert remote.converged_
    # the command line of the recipe
    out = subprocess.run(
        [sys.executable, "-m", "dl1", "fit", str(store), "--scheduler", address, "--tol", "1e-8"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    assert "certified at tol 1e-08" in out.stdout
