"""dl1's workers as batch jobs: dask-jobqueue's SLURM, PBS and LSF clusters set up as a dl1
cluster.

The scheduler runs in the calling process and each job runs ``dask worker`` processes with
the settings :func:`dl1.runtime.localcluster.local_cluster` gives its own workers
(:func:`worker_settings`): ``MALLOC_MMAP_THRESHOLD_`` in their environment, no statistical
profiler, one thread each, the :mod:`dl1.runtime.worker` preload (heap trimming, a spill
target that leaves room for a running task) and no HTTP server unless asked. The scheduler
steals no work and listens on 127.0.0.1 unless an ``interface`` is given: loopback only
reaches jobs on the submitting node (a single-node cluster, or a login node that runs
jobs), a real cluster names its network (``interface="ib0"``) and should use TLS
(``security=``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import logging
import math
import numbers
import shlex
import sys
from dataclasses import dataclass
from typing import Any

import dask

from dl1.errors import ClusterStalledError, Dl1Error
from dl1.params import Interval, Options, is_str, predicate, validate_params, validated
from dl1.runtime.localcluster import (
    CLUSTER_CONFIG,
    NO_HTTP_CONFIG,
    NO_HTTP_PRELOAD,
    WORKER_ENV,
    WORKER_PRELOAD,
)

#: dask-jobqueue's cluster class for each batch system.
CLUSTER_CLASSES = {"slurm": "SLURMCluster", "pbs": "PBSCluster", "lsf": "LSFCluster"}

#: Name of the batch jobs (what ``squeue --name`` or ``qstat`` shows).
JOB_NAME = "dl1-worker"

#: Seconds a worker keeps trying to reach its scheduler before it exits (its job then ends
#: instead of holding an allocation for a scheduler that is gone).
DEATH_TIMEOUT = 60

#: Seconds :func:`jobqueue_cluster` waits by default for its workers' jobs to start.
START_TIMEOUT = 300.0

#: :func:`jobqueue_cluster`'s arguments that :func:`job_script` does not take.
_NOT_IN_SCRIPT = frozenset({"n_workers", "security", "timeout"})


class JobSubmissionError(Dl1Error, RuntimeError):
    """The batch system refused a worker job (its submission command failed); the message
    gives the command's error output."""


@predicate("a list of strings")
def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


_CONSTRAINTS: dict[str, list[Any]] = {
    "kind": [Options(tuple(CLUSTER_CLASSES))],
    "n_workers": [Interval(numbers.Integral, 1, None)],
    "memory": [None, is_str],
    "cores": [Interval(numbers.Integral, 1, None)],
    "walltime": [None, is_str],
    "queue": [None, is_str],
    "account": [None, is_str],
    "extra": [None, _is_str_list],
    "interface": [None, is_str],
    "log_directory": [None, is_str],
    "dashboard": ["boolean"],
    "timeout": [None, Interval(numbers.Real, 0, None, closed="neither")],
}


@dataclass(frozen=True)
class WorkerSettings:
    """What a dl1 worker started by a batch job carries.

    Attributes
    ----------
    env : dict[str, str]
        Environment of the worker processes (glibc reads ``MALLOC_*`` at start-up, Dask its
        ``DASK_*`` settings).
    args : list[str]
        Arguments of ``dask worker`` (preloads, HTTP, listening host).
    """

    env: dict[str, str]
    args: list[str]

    def prologue(self) -> list[str]:
        """The environment as shell ``export`` lines of a job script, then ``dl1 warm``
        (:mod:`dl1.warming`): a node's first job compiles the kernels into the
        installation's cache, later ones load them in seconds. A failure there is said
        and the worker starts anyway (compiling its kernels at first use)."""
        python = shlex.quote(sys.executable)
        warm = (f"{python} -m dl1 warm >&2 || echo 'dl1 warm failed; the worker compiles "
                "its kernels at first use' >&2")  # fmt: skip
        return [*(f"export {k}={shlex.quote(v)}" for k, v in self.env.items()), warm]


def worker_settings(*, dashboard: bool = False, host: str | None = "127.0.0.1") -> WorkerSettings:
    """The environment and ``dask worker`` arguments of a dl1 worker started outside a
    LocalCluster (batch jobs, Kubernetes pods): those of
    :func:`dl1.runtime.localcluster.local_cluster`'s workers.

    Parameters
    ----------
    dashboard : bool
        Keep the worker's HTTP endpoints (``/health``, ``/metrics``); by default they get no
        routes and are closed as the worker starts (:mod:`dl1.runtime.nohttp`).
    host : str or None
        Address the worker listens on (None: Dask's choice, every interface).
    """
    env = {**WORKER_ENV, "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False"}
    args = ["--preload", WORKER_PRELOAD]
    if not dashboard:
        env["DASK_DISTRIBUTED__WORKER__HTTP__ROUTES"] = "[]"
        args += ["--preload", NO_HTTP_PRELOAD, "--no-dashboard"]
    if host is not None:
        args += ["--host", host, "--dashboard-address", f"{host}:0"]
    return WorkerSettings(env=env, args=args)


@validated(_CONSTRAINTS, "dl1.deploy.jobqueue_cluster")
def jobqueue_cluster(
    kind: str,
    n_workers: int,
    *,
    memory: str | None = None,
    cores: int = 1,
    walltime: str | None = None,
    queue: str | None = None,
    account: str | None = None,
    extra: list[str] | None = None,
    interface: str | None = None,
    security: Any = None,
    log_directory: str | None = None,
    dashboard: bool = False,
    timeout: float | None = START_TIMEOUT,
) -> Any:
    """A started dask-jobqueue cluster (SLURM, PBS or LSF) of ``n_workers`` dl1 workers.

    Each batch job runs ``cores`` single-threaded worker processes sharing ``memory``,
    started with :func:`worker_settings`; the scheduler (in this process) steals no work,
    serves no HTTP unless ``dashboard`` and listens on 127.0.0.1 unless ``interface`` names a
    network interface. Close the cluster (``with`` block or ``.close()``) to cancel its jobs.

    Parameters
    ----------
    kind : {"slurm", "pbs", "lsf"}
        The batch system (dask-jobqueue's ``SLURMCluster``, ``PBSCluster``, ``LSFCluster``).
    n_workers : int
        Worker processes to start (``ceil(n_workers / cores)`` jobs).
    memory : str, optional
        Memory of one job (``"4GiB"``), shared by its workers; their memory limit and
        spill target follow from it. Default: Dask's ``jobqueue.<kind>.memory``, which
        dask-jobqueue requires.
    cores : int
        Cores of one job, one worker process per core.
    walltime, queue, account : str, optional
        The job's time limit (``"01:00:00"``), queue or partition, and account or project.
    extra : list of str, optional
        Further directives of the job script (``["--exclusive"]`` for SLURM).
    interface : str, optional
        Network interface of the scheduler and workers (``"ib0"``) on a multi-node cluster.
    security : distributed.Security or True, optional
        TLS for the scheduler and workers (True: a temporary certificate, written to
        dask-jobqueue's ``shared-temp-directory``).
    log_directory : str, optional
        Where the jobs write their output (default: the batch system's).
    dashboard : bool
        Serve the scheduler's dashboard and the workers' HTTP endpoints.
    timeout : float or None
        Seconds to wait for the workers to join (None: return at once, jobs may still be
        queued); when they do not, the jobs are cancelled and
        :class:`dl1.errors.ClusterStalledError` raised.
    """
    cluster = _cluster(JobSpec(kind, memory, cores, walltime, queue, account, extra, interface,
                               security, log_directory, dashboard))  # fmt: skip
    try:
        _submit(cluster, n_workers)
        if timeout is not None:
            _wait_for_workers(cluster, kind, n_workers, timeout)
    except BaseException:
        cluster.close()
        raise
    return cluster


def _submit(cluster: Any, n_workers: int) -> None:
    """Submit the jobs of ``n_workers`` workers and wait for the submissions (not for the
    jobs to start): a refused submission raises :class:`JobSubmissionError`."""
    # local: distributed (~0.3 s to import) comes with dask-jobqueue's cluster, not on import
    from distributed.core import Status

    async def submitted() -> None:
        await cluster._correct_state()
        await asyncio.sleep(0)  # the failed submission's log record, if any, is out

    refusals = _Refusals()
    log = logging.getLogger("tornado.application")  # where Dask's scale reports a failure
    log.addFilter(refusals)
    try:
        cluster.scale(n_workers)
        cluster.sync(submitted)
    finally:
        log.removeFilter(refusals)
    unsubmitted = [job for job in cluster._created if job.status == Status.created]
    if refusals.errors or unsubmitted:
        # a job never submitted stays "created", which Dask's close refuses (dask/distributed#6183)
        for job in unsubmitted:
            job.status = Status.failed
        detail = "; ".join(refusals.errors) or "no error output"
        raise JobSubmissionError(f"the batch system refused dl1's worker job: {detail}")


class _Refusals(logging.Filter):
    """Takes dask-jobqueue's failed submissions out of the log, keeping their error output
    (the submission command's standard error)."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not (isinstance(exc, RuntimeError) and "non-zero exit code" in str(exc)):
            return True
        self.errors.append(" ".join(str(exc).partition("stderr:")[2].split()) or str(exc))
        return False


def job_script(kind: str, **options: Any) -> str:
    """The batch script :func:`jobqueue_cluster` submits for each job, with a placeholder for
    the scheduler's address: to check a configuration, or to submit workers by hand
    (``sbatch``, ``qsub``, ``bsub``) to a scheduler started elsewhere.

    Parameters
    ----------
    kind : {"slurm", "pbs", "lsf"}
        The batch system.
    **options
        :func:`jobqueue_cluster`'s keyword arguments that shape a job (all but ``security``
        and ``timeout``), with its defaults; any other raises ``TypeError``.
    """
    params = _script_arguments(kind, options)
    validate_params(_CONSTRAINTS, params, "dl1.deploy.job_script")
    fields = {f.name for f in dataclasses.fields(JobSpec)}
    with _cluster(JobSpec(**{k: v for k, v in params.items() if k in fields})) as cluster:
        script = cluster.job_script()
        return script.replace(cluster.scheduler_address, "tcp://SCHEDULER:8786")


def _script_arguments(kind: str, options: dict[str, Any]) -> dict[str, Any]:
    """:func:`jobqueue_cluster`'s arguments for a job script (its defaults for those not in
    ``options``); a ``TypeError`` names an argument :func:`job_script` does not take."""
    signature = inspect.signature(jobqueue_cluster)
    unknown = sorted(set(options) - set(signature.parameters) | set(options) & _NOT_IN_SCRIPT)
    if unknown:
        raise TypeError(f"job_script() got unexpected keyword arguments: {', '.join(unknown)}")
    bound = signature.bind(kind, 1, **options)
    bound.apply_defaults()
    return {k: v for k, v in bound.arguments.items() if k not in _NOT_IN_SCRIPT}


@dataclass(frozen=True)
class JobSpec:
    """What shapes the jobs and the scheduler of :func:`jobqueue_cluster` (its arguments
    but the number of workers and the timeout), validated."""

    kind: str
    memory: str | None = None
    cores: int = 1
    walltime: str | None = None
    queue: str | None = None
    account: str | None = None
    extra: list[str] | None = None
    interface: str | None = None
    security: Any = None
    log_directory: str | None = None
    dashboard: bool = False


def _cluster(spec: JobSpec) -> Any:
    """dask-jobqueue's cluster set up for dl1 (scheduler started, no job) for ``spec``."""
    kind, interface, dashboard = spec.kind, spec.interface, spec.dashboard
    cls = _cluster_class(kind)
    settings = worker_settings(dashboard=dashboard, host=None if interface else "127.0.0.1")
    config = dict(CLUSTER_CONFIG)
    scheduler: dict[str, Any] = {"dashboard": dashboard}
    if interface is None:
        scheduler["host"] = "127.0.0.1"
    if dashboard:
        scheduler["dashboard_address"] = "127.0.0.1:0" if interface is None else ":0"
    else:
        config |= NO_HTTP_CONFIG
        scheduler |= {"dashboard_address": "127.0.0.1:0", "preload": [NO_HTTP_PRELOAD]}
    with dask.config.set(config):
        return cls(
            **_job_kwargs(spec),
            interface=interface,
            security=spec.security,
            scheduler_options=scheduler,
            job_script_prologue=settings.prologue(),
            worker_extra_args=settings.args,
            death_timeout=DEATH_TIMEOUT,
            job_name=JOB_NAME,
            log_directory=spec.log_directory,
        )


@functools.cache
def _cluster_class(kind: str) -> type:
    """dask-jobqueue's cluster class of ``kind``, whose ``close`` also deletes the temporary
    TLS certificate and key it wrote for the jobs (``security=True``), which it otherwise
    leaves until the cluster object is garbage collected."""
    try:
        # local: dask-jobqueue is optional (dl1[jobqueue]); without it, the ImportError below
        import dask_jobqueue
    except ImportError as e:
        raise ImportError(
            f"dl1.deploy.jobqueue needs dask-jobqueue (pip install 'dl1[jobqueue]'): {e}"
        ) from None

    base = getattr(dask_jobqueue, CLUSTER_CLASSES[kind])

    async def _close(self: Any) -> None:
        try:
            await base._close(self)
        finally:
            for key in ("ca_file", "cert", "key"):
                handle = getattr(self, f"_job_{key}", None)
                if handle is not None:
                    handle.close()  # a NamedTemporaryFile: closing deletes it

    return type(f"Dl1{base.__name__}", (base,), {"_close": _close, "__module__": __name__})


def _job_kwargs(spec: JobSpec) -> dict[str, Any]:
    """dask-jobqueue's job arguments for ``spec`` (None: its configuration's value)."""
    kwargs: dict[str, Any] = {"cores": spec.cores, "processes": spec.cores}
    named = {"memory": spec.memory, "walltime": spec.walltime, "queue": spec.queue}
    # the account is "account" for SLURM and PBS, "project" for LSF
    named["project" if spec.kind == "lsf" else "account"] = spec.account
    kwargs |= {k: v for k, v in named.items() if v is not None}
    if spec.extra:
        kwargs["job_extra_directives"] = list(spec.extra)
    return kwargs


def _wait_for_workers(cluster: Any, kind: str, n_workers: int, timeout: float) -> None:
    """Wait up to ``timeout`` seconds for ``n_workers`` workers; raise ClusterStalledError
    naming how many joined when they do not."""
    try:
        cluster.wait_for_workers(n_workers, timeout=timeout)
    except TimeoutError:
        joined = len(cluster.scheduler_info.get("workers", {}))
        jobs = math.ceil(n_workers / max(cluster._dummy_job.worker_processes or 1, 1))
        raise ClusterStalledError(
            f"{joined} of {n_workers} dl1 workers ({jobs} {kind.upper()} jobs) joined in "
            f"{timeout:g} s: the jobs are queued or failed; see the batch system's queue "
            "and the jobs' output"
        ) from None
