"""The batch scripts of dl1's worker jobs (SLURM, PBS, LSF): dl1's worker settings in each.

Rendered by dask-jobqueue itself, no batch system needed; the SLURM jobs run for real in
test_slurm.py.
"""

import os
import shlex
import subprocess

import pytest

from dl1.deploy import job_script, worker_settings
from dl1.params import InvalidParameterError
from dl1.runtime.localcluster import WORKER_ENV, WORKER_PRELOAD

OPTIONS = dict(memory="2GiB", cores=2, walltime="01:30:00", queue="short", account="proj7")

#: What each batch system's directives must say for OPTIONS (dask-jobqueue's spelling).
DIRECTIVES = {
    "slurm": ["#SBATCH -J dl1-worker", "#SBATCH -p short", "#SBATCH -A proj7",
              "#SBATCH --cpus-per-task=2", "#SBATCH --mem=2G", "#SBATCH -t 01:30:00"],
    "pbs": ["#PBS -N dl1-worker", "#PBS -q short", "#PBS -A proj7",
            "#PBS -l select=1:ncpus=2:mem=2048MB", "#PBS -l walltime=01:30:00"],
    "lsf": ["#BSUB -J dl1-worker", "#BSUB -q short", '#BSUB -P "proj7"', "#BSUB -n 2",
            "#BSUB -W 01:30:00"],
}  # fmt: skip


def _worker_command(script: str) -> list[str]:
    (line,) = [ln for ln in script.splitlines() if "distributed.cli.dask_worker" in ln]
    return shlex.split(line)


def _option(argv: list[str], name: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == name]


@pytest.mark.parametrize("kind", sorted(DIRECTIVES))
def test_each_job_runs_single_threaded_dl1_workers(kind):
    script = job_script(kind, **OPTIONS, extra=["--comment=dl1"])
    lines = script.splitlines()
    for directive in DIRECTIVES[kind]:
        assert directive in lines, (kind, directive)
    assert lines.index(DIRECTIVES[kind][0]) < lines.index(
        next(ln for ln in lines if ln.endswith("--comment=dl1"))
    )
    exports = {ln.split()[1].split("=", 1)[0]: ln for ln in lines if ln.startswith("export ")}
    for key, value in WORKER_ENV.items():
        assert exports[key] == f"export {key}={value}"
    assert exports["DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED"].endswith("=False")
    assert exports["DASK_DISTRIBUTED__WORKER__HTTP__ROUTES"].endswith("='[]'")
    argv = _worker_command(script)
    assert _option(argv, "--nthreads") == ["1"] and _option(argv, "--nworkers") == ["2"]
    assert _option(argv, "--memory-limit") == ["1.00GiB"]  # the job's memory, per worker
    assert _option(argv, "--preload") == [WORKER_PRELOAD, "dl1.runtime.nohttp"]
    assert _option(argv, "--host") == ["127.0.0.1"] and "--no-dashboard" in argv
    assert argv[argv.index("distributed.cli.dask_worker") + 1] == "tcp://SCHEDULER:8786"


def test_an_interface_replaces_loopback_and_a_dashboard_keeps_http():
    argv = _worker_command(job_script("slurm", memory="1GiB", interface="lo", dashboard=True))
    assert _option(argv, "--interface") == ["lo"] and "--host" not in argv
    assert _option(argv, "--preload") == [WORKER_PRELOAD] and "--no-dashboard" not in argv


def test_worker_settings_are_the_local_clusters():
    settings = worker_settings()
    assert settings.env.items() >= WORKER_ENV.items()
    assert worker_settings(host=None).args == settings.args[: settings.args.index("--host")]


@pytest.mark.parametrize(
    "kwargs, name",
    [({"kind": "sge"}, "kind"), ({"cores": 0}, "cores"), ({"extra": "--x"}, "extra"),
     ({"memory": 4}, "memory")],
)  # fmt: skip
def test_invalid_options_are_refused_by_name(kwargs, name):
    with pytest.raises(InvalidParameterError, match=f"'{name}' parameter"):
        job_script(**{"kind": "slurm", **kwargs})


@pytest.mark.parametrize("name", ["security", "timeout", "memroy"])
def test_arguments_that_do_not_shape_a_job_are_refused_by_name(name):
    with pytest.raises(TypeError, match=f"unexpected keyword arguments: {name}$"):
        job_script("slurm", memory="1GiB", **{name: 1})


def _warm_line(script: str) -> str:
    lines = script.splitlines()
    warm = next(ln for ln in lines if " -m dl1 warm" in ln)
    worker = next(i for i, ln in enumerate(lines) if "distributed.cli.dask_worker" in ln)
    assert lines.index(warm) < worker  # kernels cached before the worker starts
    return warm


def test_each_job_warms_the_kernel_cache_before_its_worker_starts():
    line = _warm_line(job_script("slurm", memory="1GiB"))
    run = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "kernels compiled or loaded" in run.stderr


def test_a_failed_warm_is_said_and_the_job_goes_on(tmp_path):
    (tmp_path / "dl1").mkdir()  # a dl1 that cannot run: the job's line says so, exit 0
    (tmp_path / "dl1" / "__init__.py").write_text("raise ImportError('broken install')\n")
    line = _warm_line(job_script("slurm", memory="1GiB"))
    run = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=600,
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)})  # fmt: skip
    assert run.returncode == 0
    assert "broken install" in run.stderr and "dl1 warm failed" in run.stderr
