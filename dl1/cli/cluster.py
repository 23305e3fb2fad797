"""Where a command computes: a LocalCluster dl1 starts (``--cluster local``, the default),
SLURM jobs (``--cluster slurm``, through :mod:`dl1.deploy.jobqueue`), or a running scheduler
(``--scheduler ADDRESS`` or ``--scheduler-file FILE``, over TLS with ``--tls-*``).

Every option is checked before anything starts or connects; the cluster dl1 started is shut
down on exit (the client first, then the workers and the scheduler), quietly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import click
from dask.utils import parse_bytes

from dl1.errors import Dl1Error, ValidationError
from dl1.runtime.connection import check_scheduler_answers
from dl1.runtime.exposure import check_scheduler_address
from dl1.runtime.localcluster import local_cluster

#: A scheduler file larger than this is refused unread (Dask's hold one address and a few ids).
MAX_SCHEDULER_FILE_BYTES = 1 << 20
#: Seconds to wait for the workers of SLURM jobs (queued jobs may wait for a node).
DEFAULT_WORKER_TIMEOUT = 600.0
#: Seconds a LocalCluster's worker has to exit when closed before it is killed.
CLOSE_TIMEOUT = 30.0


@dataclass(frozen=True)
class ClusterSpec:
    """The cluster options of a command."""

    scheduler: str | None = None
    scheduler_file: str | None = None
    cluster: str = "local"
    workers: int = 2
    memory_limit: str | None = None
    dashboard: bool = False
    slurm_queue: str | None = None
    slurm_walltime: str | None = None
    slurm_account: str | None = None
    job_extra: tuple[str, ...] = ()
    job_log_directory: str | None = None
    worker_timeout: float = DEFAULT_WORKER_TIMEOUT
    tls_ca_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    def check(self) -> None:
        """Refuse contradictory or malformed options (:class:`click.UsageError`,
        :class:`ValidationError`) before any cluster starts."""
        if self.scheduler and self.scheduler_file:
            raise click.UsageError("give --scheduler or --scheduler-file, not both")
        joined = self.scheduler or self.scheduler_file
        if joined and self.cluster != "local":
            raise click.UsageError(
                f"--cluster {self.cluster} starts a cluster; --scheduler "
                "and --scheduler-file join a running one: give one of them"
            )
        if self.dashboard and joined:
            raise click.UsageError(
                "--dashboard is for the cluster dl1 starts; a running scheduler "
                "(--scheduler) serves its own dashboard, or none"
            )
        slurm = (self.slurm_queue, self.slurm_walltime, self.slurm_account,
                 self.job_log_directory, *self.job_extra)  # fmt: skip
        if self.cluster != "slurm" and any(v is not None for v in slurm):
            raise click.UsageError(
                "--slurm-*, --job-extra and --job-log-directory need --cluster slurm"
            )
        if not self.worker_timeout > 0:
            raise ValidationError(
                f"--worker-timeout must be > 0 seconds; got {self.worker_timeout}"
            )
        _check_memory_limit(self.memory_limit)
        for name, f in (
            ("--tls-ca-file", self.tls_ca_file),
            ("--tls-cert", self.tls_cert),
            ("--tls-key", self.tls_key),
        ):
            if f is not None and not os.path.isfile(f):
                raise ValidationError(f"{name}: no file {f}")


def _check_memory_limit(memory_limit: str | None) -> None:
    """A ``--memory-limit`` parsed before the cluster starts."""
    if memory_limit is None or memory_limit == "auto":
        return
    try:
        ok = parse_bytes(memory_limit) > 0
    except ValueError:
        ok = False
    if not ok:
        raise ValidationError(
            f"--memory-limit must be a positive size such as '4GiB' or 'auto'; got {memory_limit!r}"
        )


def _tls_option(name: str, help: str) -> Any:
    """A ``--tls-*`` file option, also read from ``DL1_TLS_*``."""
    envvar = "DL1_" + name.lstrip("-").replace("-", "_").upper()
    return click.option(name, type=click.Path(dir_okay=False), default=None, envvar=envvar,
                        show_envvar=True, help=help)  # fmt: skip


def _slurm_option(name: str, help: str, **kwargs: Any) -> Any:
    """An option of ``--cluster slurm`` only (its help says so)."""
    return click.option(name, default=None, help=f"--cluster slurm: {help}", **kwargs)


#: ``--workers`` and ``--dashboard``, shared with ``dl1 demo`` (which starts a LocalCluster).
WORKERS_OPTION = click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Worker processes (or SLURM jobs) of the cluster dl1 starts.",
)
DASHBOARD_OPTION = click.option(
    "--dashboard",
    is_flag=True,
    help="Serve the LocalCluster's Dask dashboard (and its workers' /health, "
    "/metrics) on 127.0.0.1; none without it (no authentication, any local "
    "user reaches loopback).",
)

_OPTIONS = [
    click.option(
        "--scheduler", default=None, help="Address of a running scheduler (tcp://... or tls://...)."
    ),
    click.option(
        "--scheduler-file",
        type=click.Path(dir_okay=False),
        default=None,
        help="Scheduler file of a running scheduler (dask scheduler "
        "--scheduler-file, cluster/start-local.sh's dl1-scheduler.json).",
    ),
    click.option(
        "--cluster",
        type=click.Choice(["local", "slurm"]),
        default="local",
        show_default=True,
        help="Cluster dl1 starts when no scheduler is given: a LocalCluster, or "
        "workers as SLURM jobs (dask-jobqueue; pip install 'dl1[jobqueue]').",
    ),
    WORKERS_OPTION,
    click.option(
        "--memory-limit",
        default=None,
        help="Memory of each worker of the cluster dl1 starts (e.g. 4GiB).",
    ),
    DASHBOARD_OPTION,
    _slurm_option("--slurm-queue", "the partition."),
    _slurm_option("--slurm-walltime", "each worker job's time limit (HH:MM:SS)."),
    _slurm_option("--slurm-account", "the account."),
    _slurm_option(
        "--job-extra",
        "an extra #SBATCH directive (repeatable), e.g. --job-extra=--exclusive.",
        multiple=True,
    ),
    _slurm_option(
        "--job-log-directory",
        "where the worker jobs write their logs (default: SLURM's, slurm-<job id>.out in the "
        "current directory).",
        type=click.Path(file_okay=False),
    ),
    click.option(
        "--worker-timeout",
        type=float,
        default=DEFAULT_WORKER_TIMEOUT,
        show_default=True,
        help="--cluster slurm: seconds to wait for the worker jobs to start.",
    ),
    _tls_option("--tls-ca-file", "CA certificate of a tls:// scheduler."),
    _tls_option("--tls-cert", "This client's certificate for a tls:// scheduler."),
    _tls_option("--tls-key", "This client's private key for a tls:// scheduler."),
]
_FIELDS = [f.name for f in dataclasses.fields(ClusterSpec)]


def cluster_options(f):
    """Add the cluster options to a command, which receives them as ``cluster=ClusterSpec``."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        values = {k: kwargs.pop(k) for k in _FIELDS}
        values["job_extra"] = tuple(values["job_extra"])
        return f(*args, cluster=ClusterSpec(**values), **kwargs)

    for option in reversed(_OPTIONS):
        wrapper = option(wrapper)
    return wrapper


@contextmanager
def connected(spec: ClusterSpec, say: Callable[[str], None]) -> Iterator[Any]:
    """A client of the cluster ``spec`` describes (started, or joined), for the block; on
    leaving it, however it is left, the client is closed, then the cluster dl1 started
    (its workers given time to exit, SLURM jobs stopped through their nannies). The
    dashboard's address, if served, is said with ``say``."""
    stack, client = _client(None, spec.workers, spec.memory_limit, spec=spec, say=say)
    with stack:
        yield client


def _client(
    scheduler: str | None,
    workers: int,
    memory_limit: str | None,
    dashboard: bool = False,
    *,
    spec: ClusterSpec | None = None,
    say: Any = None,
) -> tuple[ExitStack, Any]:
    """``(stack, client)``: a client of the cluster ``spec`` describes (by default a
    LocalCluster of ``workers`` processes, or the running ``scheduler``). Closing ``stack``
    closes the client, then the cluster dl1 started, if any."""
    if spec is None:
        spec = ClusterSpec(
            scheduler=scheduler, workers=workers, memory_limit=memory_limit, dashboard=dashboard
        )
    spec.check()
    # local: distributed (~0.3 s to import) only once a command needs its cluster
    from distributed import Client

    logging.getLogger("distributed").setLevel(logging.WARNING)
    stack = ExitStack()
    address = spec.scheduler or (spec.scheduler_file and scheduler_address(spec.scheduler_file))
    if address:
        check_scheduler_address(address)
        security = client_security(address, spec)
        check_scheduler_answers(address, security)
        client = stack.enter_context(Client(address, security=security, set_as_default=True))
        return stack, client
    try:
        cluster = stack.enter_context(_start(spec))
        stack.callback(close_workers, cluster)  # after the client, before the cluster
        client = stack.enter_context(Client(cluster))
        if spec.cluster != "local":
            stack.callback(stop_nannies, client)  # first: while the scheduler runs
    except BaseException:
        stack.close()
        raise
    if spec.dashboard and say is not None:
        say(f"dashboard: {client.dashboard_link}")
    elif spec.dashboard:
        click.echo(f"dashboard: {client.dashboard_link}")
    return stack, client


def close_workers(cluster: Any, timeout: float = CLOSE_TIMEOUT) -> None:
    """Close the workers of a LocalCluster dl1 started, giving each up to ``timeout``
    seconds to exit before its nanny kills it (Dask's own close gives 4 s, which a loaded
    machine exceeds: "Worker process still alive after 4.0 seconds, killing")."""
    # local: distributed (~0.3 s to import) only once a command has a cluster to close
    from distributed import LocalCluster

    if not isinstance(cluster, LocalCluster):
        return

    async def close_all() -> None:
        nannies = list(cluster.workers.values())
        await asyncio.gather(
            *(w.close(timeout=timeout, reason="dl1-done") for w in nannies),
            return_exceptions=True,
        )

    cluster.sync(close_all)


#: Seconds a worker lets a heartbeat already sent come back before its nanny is signalled.
HEARTBEAT_SETTLE_S = 0.5


async def _terminate_nanny(dask_worker: Any) -> bool:
    """In a worker: SIGTERM its nanny (its parent process), which closes the worker and
    itself as on ``dask worker``'s own SIGTERM. Nothing for a worker without a nanny.

    The worker's heartbeat is stopped first and one in flight given time to return: a
    heartbeat caught by the close of the worker's connections logs a CommClosedError
    traceback ("Failed to communicate with scheduler during heartbeat"; seen in a SLURM
    job's log, 5 ms after "Stopping worker")."""
    if not getattr(dask_worker, "nanny", None):
        return False
    heartbeat = dask_worker.periodic_callbacks.get("heartbeat")
    if heartbeat is not None:
        heartbeat.stop()
        await asyncio.sleep(HEARTBEAT_SETTLE_S)
    os.kill(os.getppid(), signal.SIGTERM)
    return True


def stop_nannies(client: Any, timeout: float = CLOSE_TIMEOUT) -> None:
    """Stop the batch jobs' workers through their nannies while the scheduler still runs,
    one at a time, and wait (at most ``timeout`` seconds in all) until they have left it.

    Cancelling the jobs (dask-jobqueue's close) stops the scheduler and the workers at
    once, and the workers' logs then hold ``CommClosedError`` tracebacks. One at a time:
    when a worker leaves, the scheduler tells the others, and one closing meanwhile makes
    it log "Batched Comm Closed" with a traceback."""
    deadline = time.monotonic() + timeout
    try:
        for address in client.nthreads():
            if not client.run(_terminate_nanny, workers=[address]).get(address):
                continue  # no nanny: the cluster's close stops that worker
            while address in client.nthreads() and time.monotonic() < deadline:
                time.sleep(0.1)
    except (OSError, TimeoutError):  # the cluster's close cancels whatever is left
        return


def _start(spec: ClusterSpec) -> Any:
    """The cluster dl1 starts for ``spec``: a LocalCluster or SLURM jobs."""
    if spec.cluster == "slurm":
        try:
            # local: --cluster slurm only (dask-jobqueue is optional, dl1[jobqueue]); a failed
            # import becomes the one-line error below
            from dl1.deploy.jobqueue import jobqueue_cluster
        except ImportError as e:
            raise Dl1Error(
                f"--cluster slurm needs dask-jobqueue (pip install 'dl1[jobqueue]'): {e}"
            ) from None
        return jobqueue_cluster(
            "slurm",
            spec.workers,
            memory=spec.memory_limit,
            cores=1,
            walltime=spec.slurm_walltime,
            queue=spec.slurm_queue,
            account=spec.slurm_account,
            extra=list(spec.job_extra) or None,
            dashboard=spec.dashboard,
            log_directory=spec.job_log_directory,
            timeout=spec.worker_timeout,  # the jobs are cancelled if no worker joins by then
        )
    return local_cluster(
        silence_logs=logging.WARNING,
        n_workers=spec.workers,
        threads_per_worker=1,
        processes=True,
        dashboard=spec.dashboard,
        # never Dask's all-interfaces default; a free port when no dashboard is served
        dashboard_address="127.0.0.1:8787" if spec.dashboard else "127.0.0.1:0",
        memory_limit=spec.memory_limit or "auto",
    )


def scheduler_address(path: str) -> str:
    """The address in the scheduler file ``path`` (checked: a JSON object with a string
    ``address`` of a known scheme, the file no larger than :data:`MAX_SCHEDULER_FILE_BYTES`)."""
    try:
        size = os.path.getsize(path)
    except OSError:
        raise FileNotFoundError(f"--scheduler-file: no file {path}") from None
    if size > MAX_SCHEDULER_FILE_BYTES:
        raise ValidationError(f"--scheduler-file {path} has {size:,} bytes: not a scheduler file")
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ValidationError(f"--scheduler-file {path} is not JSON: {e}") from None
    address = doc.get("address") if isinstance(doc, dict) else None
    if not isinstance(address, str) or "://" not in address:
        raise ValidationError(f"--scheduler-file {path} has no scheduler address")
    return address


def client_security(address: str, spec: ClusterSpec) -> Any:
    """The client's TLS settings: ``--tls-*`` when given, else Dask's configuration
    (``distributed.comm.tls.*``). A ``tls://`` address without a CA certificate or a
    client certificate is a :class:`ValidationError` naming what is missing."""
    # local: distributed (~0.3 s to import) only to connect to a running scheduler
    from distributed.security import Security

    given = (spec.tls_ca_file, spec.tls_cert, spec.tls_key)
    if any(given):
        security = Security(
            tls_ca_file=spec.tls_ca_file,
            tls_client_cert=spec.tls_cert,
            tls_client_key=spec.tls_key,
            require_encryption=True,
        )
    else:
        security = Security()
    if not address.startswith("tls://"):
        return security
    missing = [
        what
        for what, have in (
            ("the CA certificate (--tls-ca-file)", security.tls_ca_file),
            ("this client's certificate (--tls-cert)", security.tls_client_cert),
        )
        if not have
    ]
    if missing:
        raise ValidationError(
            f"the scheduler {address} speaks TLS and needs {' and '.join(missing)}; "
            "or set Dask's distributed.comm.tls.ca-file / .client.cert / .client.key"
        )
    return security
