"""The command line as a batch job runs it: real processes, output piped to a log.

A path's log shows a timestamped line per alpha while the path runs, distributed or in
one piece; commands and
cluster/stop-local.sh shut their clusters down with no traceback or kill warning in any
log; the examples of this area run as scripts.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import task_stream

#: Processes killed, frozen or started: the full tier (CI), not the everyday one.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ENV = {
    **os.environ,
    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
}
#: What a clean shutdown never logs.
DIRTY = ("Traceback", "CommClosedError", "still alive after", "killing", "Exception")
STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ path (\d+)/(\d+) alpha ")


def clean(text: str) -> bool:
    return not any(word in text for word in DIRTY)


def _path_lines(store: Path, plots: Path, *options: str, one_piece: bool) -> tuple[str, str]:
    """``dl1 path STORE --n-alphas 5`` run with pipes (``dl1.one-piece`` set to
    ``one_piece``): its stdout and stderr, once it has exited with status 0 and its stderr
    has held a timestamped line per alpha, each read while the command still ran."""
    env = {**ENV, "DASK_DL1__ONE_PIECE": str(one_piece)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dl1", "path", str(store), "--n-alphas", "5", "--plots",
         str(plots), *options],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    stdout: list[str] = []
    reader = threading.Thread(target=lambda: stdout.extend(proc.stdout), daemon=True)
    reader.start()
    seen, running_at = [], []
    stderr = []
    for line in proc.stderr:  # ends when the process closes stderr (exits)
        stderr.append(line)
        if STAMP.match(line):
            seen.append(STAMP.match(line).groups())
            running_at.append(proc.poll() is None)
    assert proc.wait(timeout=300) == 0, "".join(stderr)
    reader.join(timeout=60)
    assert seen == [(str(k), "5") for k in range(1, 6)], "".join(stderr)
    assert all(running_at), running_at
    return "".join(stdout), "".join(stderr)


def test_path_log_has_a_line_per_alpha_while_it_runs(reg, tmp_path):
    """Pass: with stdout and stderr pipes (not terminals), each alpha's timestamped line
    of a distributed path is read while the command still runs (before the summary, the
    figures and the shutdown); the command started and stopped its own LocalCluster
    without a traceback or a kill warning."""
    stdout, stderr = _path_lines(reg.path, tmp_path / "plots", "--workers", "2",
                                 one_piece=False)  # fmt: skip
    assert "best alpha" in stdout
    assert clean(stderr + stdout), stderr


def test_path_in_one_piece_logs_a_line_per_alpha_while_it_runs(reg, scheduler, local_cluster,
                                                                tmp_path):  # fmt: skip
    """Pass: a path solved in one piece (one task on the session's cluster, which the
    command joins) logs each alpha's line while the command runs, as a distributed one."""
    with task_stream(local_cluster) as ts:
        stdout, stderr = _path_lines(reg.path, tmp_path / "plots", "--scheduler", scheduler,
                                     one_piece=True)  # fmt: skip
    pieces = [e for e in ts.data if str(e["key"]).startswith("in_worker")]
    assert len(pieces) == 1, [e["key"] for e in ts.data]
    assert "best alpha" in stdout
    assert clean(stderr + stdout), stderr


def test_stop_local_stops_workers_then_scheduler_with_clean_logs(reg, tmp_path):
    """Pass: cluster/start-local.sh's scheduler and workers serve ``dl1 fit
    --scheduler-file`` (one JSON document on stdout), and cluster/stop-local.sh leaves no
    process and no traceback, CommClosedError or kill warning in their logs."""
    env = {**ENV, "DL1_SCHEDULER_FILE": str(tmp_path / "scheduler.json")}
    subprocess.run(["bash", str(REPO / "cluster" / "start-local.sh"), "2"], cwd=tmp_path,
                   env=env, check=True, timeout=300, capture_output=True)  # fmt: skip
    pids = [int(p) for p in (tmp_path / "dl1-cluster.pids").read_text().split()]
    try:
        out = subprocess.run(
            [sys.executable, "-m", "dl1", "fit", str(reg.path), "--output",
             str(tmp_path / "model"), "--scheduler-file", str(tmp_path / "scheduler.json"),
             "--json"],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        assert doc["certified"] and doc["model"] == str(tmp_path / "model")
    finally:
        stop = subprocess.run(["bash", str(REPO / "cluster" / "stop-local.sh")], cwd=tmp_path,
                              env=env, timeout=120, capture_output=True, text=True)  # fmt: skip
    assert stop.returncode == 0 and stop.stderr == "", stop.stderr
    assert not (tmp_path / "dl1-cluster.pids").exists()
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid), pid
    logs = sorted(tmp_path.glob("dl1-*.log"))
    assert [log.name for log in logs] == ["dl1-scheduler.log", "dl1-warm.log", "dl1-worker-1.log",
                                          "dl1-worker-2.log"]  # fmt: skip
    for log in logs:
        text = log.read_text()
        assert clean(text), f"{log.name}:\n{text}"
    assert "End scheduler" in (tmp_path / "dl1-scheduler.log").read_text()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def _finished(proc: subprocess.Popen, timeout: float = 300) -> subprocess.CompletedProcess:
    """``proc``'s exit status and output, once it has exited (killed after ``timeout``)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_examples_run_as_scripts(tmp_path):
    """Pass: examples/out_of_core_path.py (tiny sizes) certifies every alpha of a streamed
    path, and examples/scheduler_file.py fits by scheduler file and stops its scheduler
    and worker with clean logs."""
    work = tmp_path / "sf"
    work.mkdir()
    ooc_args = ["--rows", "600", "--features", "60", "--n-alphas", "3", str(tmp_path)]
    # side by side: each waits mostly for its own cluster to start
    ooc_run, sf_run = (
        subprocess.Popen(
            [sys.executable, str(REPO / "examples" / script), *args],
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for script, args in (("out_of_core_path.py", ooc_args), ("scheduler_file.py", [str(work)]))
    )
    ooc, sf = (_finished(run) for run in (ooc_run, sf_run))
    assert ooc.returncode == 0, ooc.stderr
    assert "3 alphas (squared, l1_ratio=1.0, tol=1e-06): 3 certified, 0 not" in ooc.stdout
    assert len(re.findall(r"^alpha \d/3 ", ooc.stdout, flags=re.M)) == 3
    assert sf.returncode == 0, sf.stderr
    assert "(certified: True)" in sf.stdout
    for log in ("scheduler.log", "worker.log"):
        assert clean((work / log).read_text()), (work / log).read_text()


def test_path_on_slurm_jobs_gives_the_local_answer(reg, local_cluster, tmp_path):
    """Pass (when SLURM runs here, as in CI): ``dl1 path --cluster slurm`` runs its workers
    as SLURM jobs and saves the same path as the LocalCluster's (every alpha certified,
    coefficients equal to the certificate's tolerance); no dl1 job is left in the queue,
    and the jobs' logs hold no traceback or kill warning."""
    import pytest

    import dl1
    from tests.deploy.conftest import dl1_jobs, slurm_unavailable

    reason = slurm_unavailable()
    if reason:
        pytest.skip(reason)
    out = subprocess.run(
        [sys.executable, "-m", "dl1", "path", str(reg.path), "--n-alphas", "4", "--cluster",
         "slurm", "--workers", "2", "--memory-limit", "1GiB", "--slurm-walltime", "00:15:00",
         "--worker-timeout", "120", "--job-log-directory", str(tmp_path / "jobs"),
         "--output", str(tmp_path / "p"), "--plots",
         str(tmp_path / "plots"), "--json"],
        env=ENV, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert all(json.loads(out.stdout)["certified"])
    local = dl1.path(reg.path, n_alphas=4, tol=1e-6, client=local_cluster)
    slurm = dl1.load_model(tmp_path / "p")
    np.testing.assert_array_equal(slurm.alphas_, local.alphas_)
    np.testing.assert_allclose(slurm.coefs_.toarray(), local.coefs_.toarray(), rtol=1e-5,
                               atol=1e-8)  # fmt: skip
    assert clean(out.stderr), out.stderr
    deadline = time.monotonic() + 30
    while dl1_jobs() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert dl1_jobs() == []
    logs = sorted((tmp_path / "jobs").iterdir())
    assert len({log.stem for log in logs}) == 2  # the two worker jobs' .out and .err
    for log in logs:
        assert clean(log.read_text()), f"{log.name}:\n{log.read_text()}"
