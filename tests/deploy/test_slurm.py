"""dl1 on SLURM for real: worker jobs started by dl1.deploy.jobqueue_cluster on the single-node
SLURM of cluster/slurm/start-single-node.sh give the LocalCluster's path, and leave no job.

Skipped, with the reason, where SLURM does not answer (CI starts it in .ci/run).
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import dask
import numpy as np
import pytest
from distributed import Client, get_task_stream

import dl1
from dl1.deploy import jobqueue_cluster
from dl1.deploy.jobqueue import JobSubmissionError
from dl1.errors import ClusterStalledError
from tests.deploy.conftest import dl1_jobs
from tests.helpers import random_csr

REPO = Path(__file__).resolve().parents[2]

PATH = dict(n_alphas=5, eps=0.05, tol=1e-9)


def _wait_no_jobs(seconds: float = 30.0) -> list[str]:
    """dl1's jobs still in SLURM's queue after waiting up to ``seconds`` for them to go."""
    deadline = time.monotonic() + seconds
    while (jobs := dl1_jobs()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return jobs


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(3)
    X = random_csr(400, 150, 0.08, seed=3)
    w = np.r_[rng.standard_normal(10), np.zeros(140)]
    y = X @ w + 0.05 * rng.standard_normal(400)
    return dl1.from_scipy(X, y, tmp_path_factory.mktemp("slurm") / "s.zarr", n_feature_blocks=4)


@pytest.fixture(scope="module")
def slurm_cluster(slurm, tmp_path_factory):
    """Two dl1 workers as two SLURM jobs of one core and 1 GiB each."""
    logs = tmp_path_factory.mktemp("slurm-logs")
    cluster = jobqueue_cluster(
        "slurm", 2, memory="1GiB", walltime="00:15:00", log_directory=str(logs), timeout=120
    )
    try:
        with Client(cluster, set_as_default=False) as client:
            yield cluster, client
    finally:
        cluster.close()


def _path(store, client):
    with dask.config.set({"dl1.one-piece": False}), get_task_stream(client) as ts:
        t0 = time.perf_counter()
        res = dl1.path(store, **PATH, client=client)
        seconds = time.perf_counter() - t0
    return res, {e["worker"] for e in ts.data}, seconds


@pytest.mark.slow
def test_the_workers_are_slurm_jobs_with_dl1_settings(slurm_cluster):
    cluster, client = slurm_cluster

    def seen(dask_worker):  # by value: the workers cannot import this test module
        import os

        import dask

        return {
            "job": os.environ.get("SLURM_JOB_ID"),
            "malloc": os.environ.get("MALLOC_MMAP_THRESHOLD_"),
            "profile": dask.config.get("distributed.worker.profile.enabled"),
            "http": dict(dask_worker.services),
            "trims": hasattr(dask_worker, "dl1_trimmer"),
            "threads": dask_worker.state.nthreads,
            "host": dask_worker.address.split("://")[1].rsplit(":", 1)[0],
        }

    out = list(client.run(seen).values())
    assert (
        len(out) == 2 and len({o["job"] for o in out}) == 2 and None not in {o["job"] for o in out}
    )
    for o in out:
        assert o["malloc"] == "65536" and o["profile"] is False and o["http"] == {}
        assert o["trims"] and o["threads"] == 1 and o["host"] == "127.0.0.1"
    scheduler = client.run_on_scheduler(
        lambda dask_scheduler: ("stealing" in dask_scheduler.extensions, dask_scheduler.address)
    )
    assert scheduler[0] is False and scheduler[1].startswith("tcp://127.0.0.1:")


def test_a_path_on_slurm_workers_is_the_local_clusters(slurm_cluster, local_cluster, store):
    _, client = slurm_cluster
    on_slurm, workers, _ = _path(store, client)
    local, _, _ = _path(store, local_cluster)
    assert len(workers) == 2  # both jobs did work
    assert on_slurm.converged_.all() and local.converged_.all()
    np.testing.assert_array_equal(on_slurm.alphas_, local.alphas_)
    # both certified at 1e-9 of P(0): the coefficients agree to that accuracy
    a, b = on_slurm.coefs_.toarray(), local.coefs_.toarray()
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * np.abs(b).max())


def test_the_jobs_are_gone_once_the_cluster_closes(slurm_cluster):
    cluster, _ = slurm_cluster
    assert len(dl1_jobs()) >= 2
    cluster.close()
    assert _wait_no_jobs() == []


def test_workers_that_cannot_start_are_reported_and_cancelled(slurm, tmp_path):
    # a partition SLURM does not have: sbatch refuses every job
    with pytest.raises(JobSubmissionError, match="invalid partition"):
        jobqueue_cluster("slurm", 1, memory="1GiB", queue="no-such-partition", timeout=5,
                         log_directory=str(tmp_path))  # fmt: skip
    assert _wait_no_jobs() == []


def test_workers_that_do_not_join_in_time_are_reported_and_cancelled(slurm, tmp_path):
    # a job SLURM holds for an hour: queued, never started
    with pytest.raises(ClusterStalledError, match="0 of 1 dl1 workers .* joined in 1 s"):
        jobqueue_cluster("slurm", 1, memory="1GiB", extra=["--begin=now+3600"], timeout=1,
                         log_directory=str(tmp_path))  # fmt: skip
    assert _wait_no_jobs() == []


def test_a_tls_cluster_of_slurm_workers(slurm, tmp_path):
    # security=True: a temporary certificate, given to the jobs through a shared directory
    with (
        dask.config.set({"jobqueue.slurm.shared-temp-directory": str(tmp_path)}),
        jobqueue_cluster(
            "slurm", 1, memory="1GiB", security=True, timeout=120, log_directory=str(tmp_path)
        ) as cluster,  # fmt: skip
        Client(cluster, security=cluster.security, set_as_default=False) as client,
    ):
        (address,) = client.scheduler_info()["workers"]
        assert cluster.scheduler_address.startswith("tls://127.0.0.1:")
        assert address.startswith("tls://127.0.0.1:")
        assert client.submit(sum, [1, 2]).result() == 3
    assert _wait_no_jobs() == []
    assert not list(tmp_path.glob(".dask-jobqueue*"))  # the certificate's files are removed


def test_the_slurm_example_runs(slurm, tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "slurm_job.py"), str(tmp_path), "--tiny"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "certified 4/4" in out.stdout
    assert _wait_no_jobs() == []
