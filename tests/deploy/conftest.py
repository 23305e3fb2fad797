"""Fixtures of the deployment tests: a SLURM controller that answers, or a skip saying why."""

import shutil
import subprocess

import pytest

#: How SLURM is started for these tests (CI runs it before the test command).
START = "bash cluster/slurm/start-single-node.sh (as root)"


def slurm_unavailable() -> str | None:
    """Why SLURM cannot run jobs here (None: a partition has an idle or mixed node)."""
    for command in ("sinfo", "sbatch", "squeue", "scancel"):
        if shutil.which(command) is None:
            return f"SLURM is not installed ({command} not found); start it with {START}"
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=15
        )
    except subprocess.TimeoutExpired:
        return f"the SLURM controller does not answer (sinfo timed out); {START}"
    states = out.stdout.split()
    if out.returncode != 0 or not {"idle", "mixed"} & set(states):
        reason = (out.stderr.strip().splitlines() or [f"node states {states}"])[-1]
        return f"SLURM has no node ready for jobs ({reason}); start it with {START}"
    return None


@pytest.fixture(scope="session")
def slurm() -> None:
    """Skip unless SLURM runs jobs on this machine."""
    reason = slurm_unavailable()
    if reason:
        pytest.skip(reason)


def dl1_jobs() -> list[str]:
    """Ids of the dl1 worker jobs in SLURM's queue (pending, running or completing)."""
    from dl1.deploy.jobqueue import JOB_NAME

    out = subprocess.run(
        ["squeue", "-h", "--name", JOB_NAME, "-o", "%i"],
        capture_output=True, text=True, timeout=15, check=True,
    )  # fmt: skip
    return out.stdout.split()
