"""Where the solver's tasks run: a Dask distributed client, or in-process.

Every executor implements :class:`Executor`: :class:`LocalExecutor` (this process),
:class:`DistributedExecutor` (Dask tasks) and :class:`dl1.runtime.rpc.RpcExecutor` (Dask
tasks, and the working-set rounds as direct calls to the workers' partition servers).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import threading
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, Protocol, runtime_checkable

import dask
import dask.local

from dl1.runtime import persisted
from dl1.runtime.compute import current_client
from dl1.runtime.connection import connected
from dl1.runtime.dask_workarounds import engage_low_latency, low_latency
from dl1.runtime.exposure import check_client
from dl1.runtime.memory import DataFloor, check_worker_memory, killed_for_memory, warm_baseline
from dl1.runtime.warm import warm_coordinator, warm_up
from dl1.runtime.watchdog import (
    Watchdog,
    cluster_view,
    memory_restarts,
    pending_keys,
    run_listed,
)


@runtime_checkable
class Executor(Protocol):
    """What a solver runs its steps through. ``handle``s are futures (Dask's, or values in
    process); every wait is bounded (:mod:`dl1.runtime.watchdog`).

    An executor whose partition servers also run the working-set solver's passes is a
    :class:`PassServer` as well.
    """

    n_workers: int
    transport: str  # "local", "tasks" or "direct": how the last round's steps travelled
    in_process: bool  # whether the steps run in this process (blocks may be read here)

    def submit(self, fn: Callable, *args: Any) -> Any: ...
    def submit_to(self, part: int, fn: Callable, *args: Any) -> Any: ...
    def gather(self, handles: list[Any]) -> list[Any]: ...
    def wait(self, handles: list[Any]) -> None: ...
    def compute(self, delayed: list[Any], workers: list[int] | None = None) -> list[Any]: ...
    def check_memory(self, floor: Any) -> None: ...
    def broadcast(self, fn: Callable, *args: Any) -> None: ...
    def close(self) -> None: ...


#: Seconds the client waits for a worker to answer a first direct call before it sends its
#: calls, and fetches results, through the scheduler instead (a client that cannot reach
#: the workers' addresses).
PROBE_S = 5.0


class PassRequest(NamedTuple):
    """A pass over the feature blocks, as the working-set solver asks a
    :class:`PassServer` to run it: each partition's blocks (futures), their column ranges
    and alive sets, the screening threshold and the working set's minimum size."""

    parts: list[list[Any]]
    bounds: list[list[tuple[int, int]]]
    alive: list[list[Any]]
    threshold: float
    ws_start: int


@runtime_checkable
class PassServer(Protocol):
    """An executor whose partition servers run the working-set solver's rounds (direct
    calls, :mod:`dl1.runtime.rpc`). Each method returns a handle with ``result()``, or
    None when no server can run it now (a block not held by one server, a call that failed
    and fell back to tasks): the solver then runs the same steps as tasks."""

    def submit_pass(self, request: PassRequest, theta: Any, w_parts: list[Any],
                    ws_size: int) -> Any | None: ...  # fmt: skip
    def submit_then_scan(self, request: PassRequest, fn: Callable, *args: Any) -> Any | None: ...


#: The baseline memory of each worker this process warmed up (:func:`warm_up` run there by
#: :func:`~dl1.runtime.memory.warm_baseline`), by scheduler id and worker address: a worker
#: is warmed by the first solve that finds it listed, and later solves ask it nothing.
_BASELINES: dict[tuple[str, str], int] = {}
_BASELINES_LOCK = threading.Lock()
#: Whether the client reached the workers directly, by (scheduler id, workers' addresses).
_REACHED: dict[tuple[str, tuple[str, ...]], bool] = {}


class LocalExecutor:
    """Runs tasks in this process (no cluster): for small data and tests."""

    n_workers = 1
    transport = "local"
    in_process = True

    def __init__(self) -> None:
        warm_up()

    def submit(self, fn, *args):
        return fn(*args)

    def submit_to(self, part: int, fn, *args):
        """Like :meth:`submit` (one process: every partition is here)."""
        return fn(*args)

    def gather(self, handles: list[Any]) -> list[Any]:
        return list(handles)

    def compute(self, delayed: list[Any], workers: list[int] | None = None) -> list[Any]:
        # dask.local.get_sync itself, not the name "sync": the name warns (dask < 2024.12)
        # when a distributed client exists, though running here is what is meant
        return list(dask.compute(*delayed, scheduler=dask.local.get_sync))

    def wait(self, handles: list[Any]) -> None:
        pass

    def check_memory(self, floor: Any) -> None:
        """No workers: nothing to check."""

    def broadcast(self, fn, *args) -> None:
        """Run ``fn(*args)`` in every process running tasks (here: this one)."""
        fn(*args)

    def close(self) -> None:
        """Release what the solve held beside its tasks (here: nothing)."""



class DistributedExecutor:
    """Runs tasks on a ``distributed.Client``; futures keep blocks in worker memory.

    A block lost with its worker is recomputed by the scheduler from its graph (a read of
    the store or of the input dask array), and tasks running there are rescheduled, so a
    worker killed mid-fit does not fail the fit.
    """

    transport = "tasks"
    in_process = False

    def __init__(self, client: Any) -> None:
        self.client = client
        self.watch = Watchdog(client)  # asks the scheduler for the cluster as it starts
        view = self.watch.first
        listed = view.workers if view.reachable else client.scheduler_info()["workers"]
        self.workers = sorted(listed)
        self.n_workers = len(self.workers)
        self.limits = {a: w.limit for a, w in view.workers.items()}
        self.watch.workers = list(self.workers)
        self.baselines = self._warm_up(view)

    def _warm_up(self, view: Any) -> dict[str, int]:
        """The workers warmed up (:func:`dl1.runtime.memory.warm_baseline`) and their
        baseline memory in bytes, by address: each worker once (:data:`_BASELINES`), so a
        solve on workers warmed by an earlier one asks them nothing; those that failed (e.g.
        restarted) are left out, and tried again by the next solve. The coordinating process
        loads the few kernels it runs itself meanwhile."""
        sid = view.scheduler_id
        cold = [a for a in self.workers if (sid, a) not in _BASELINES]
        if cold or not view.reachable:
            got = self.run(warm_baseline, what="the workers to load dl1 (warm-up)",
                           workers=cold if view.reachable else None)  # fmt: skip
            with _BASELINES_LOCK:
                _BASELINES.update({(sid, a): v for a, v in got.items() if isinstance(v, int)})
        warm_coordinator()
        return {a: _BASELINES[sid, a] for a in self.workers if (sid, a) in _BASELINES}

    def run(self, fn: Callable, *args: Any, what: str, bound: float | None = None,
            workers: list[str] | None = None) -> dict:  # fmt: skip
        """``client.run(fn, *args)`` on the workers the scheduler lists now (one lost since
        would cost Dask's connect timeout), or on those of them in ``workers``, each one's
        result or error by address; waited for by the watchdog (alive while those workers
        are listed), or at most ``bound`` seconds (then an empty dict: for optimisations)."""
        return run_listed(self.client, self.watch, fn, *args, what=what, bound=bound,
                          among=workers)  # fmt: skip

    def check_memory(self, floor: DataFloor) -> None:
        """Raise :class:`~dl1.errors.WorkerMemoryError` if the workers' limits cannot hold
        their baseline and ``floor`` (see :mod:`dl1.runtime.memory`)."""
        restarts = memory_restarts(self.client, self.watch.since)
        if restarts:  # workers restarted for memory while they loaded dl1
            raise killed_for_memory(restarts, self._current_limits())
        check_worker_memory(self.limits, self.baselines, self.workers, floor)

    def _current_limits(self) -> dict[str, int]:
        """The memory limits of the workers listed now (those of the start if none)."""
        view = cluster_view(self.client)
        return {a: w.limit for a, w in view.workers.items()} or dict(self.limits)

    @functools.cached_property
    def direct(self) -> bool:
        """Whether results are fetched from the workers straight (one hop, as dl1's direct
        calls are made) rather than relayed by the scheduler (two hops, all of them through
        its link): as the client's ``direct_to_workers`` says; when that is unset (Dask's
        default), if every worker answers a direct call within :data:`PROBE_S` seconds (a
        client outside the workers' network gathers through the scheduler)."""
        if self.client.direct_to_workers is not None:
            return bool(self.client.direct_to_workers)
        key = (self.watch.first.scheduler_id, tuple(self.workers))
        if key not in _REACHED:  # once a cluster and set of workers, not once a fit
            _REACHED[key] = self._answer_directly()
        return _REACHED[key]

    def _answer_directly(self) -> bool:
        """Whether every worker answers a direct identity call within :data:`PROBE_S`."""

        async def identities() -> None:
            await asyncio.gather(*(self.client.rpc(a).identity() for a in self.workers))

        probe = asyncio.wait_for(identities(), PROBE_S)
        try:
            asyncio.run_coroutine_threadsafe(probe, self.client.loop.asyncio_loop).result()
        except Exception:
            return False
        return True

    def submit(self, fn, *args):
        engage_low_latency()
        return self.client.submit(fn, *args, pure=False)

    def submit_to(self, part: int, fn, *args):
        """Submit to the worker of partition ``part`` (the one its blocks were loaded on), or
        another one if it is gone."""
        engage_low_latency()
        if not self.workers:
            return self.submit(fn, *args)
        return self.client.submit(
            fn,
            *args,
            pure=False,
            workers=[self.workers[part % self.n_workers]],
            allow_other_workers=True,
        )

    def gather(self, handles: list[Any]) -> list[Any]:
        """The results of ``handles`` (futures), waited for by the watchdog; a task killed
        with workers their nannies restarted for memory raises WorkerMemoryError."""
        if not handles:
            return []
        if self.watch.failed is not None:
            raise self.watch.failed  # the solve is over: no second wait for the timeout
        # local: distributed (~0.3 s to import), which import dl1.runtime.executor does without
        from distributed import KilledWorker

        coro = self.client.gather(list(handles), asynchronous=True, direct=self.direct)
        try:
            return self.watch.run_on_loop(
                coro, lambda: pending_keys(handles), finished=lambda: _done(handles)
            )
        except KilledWorker as exc:
            restarts = memory_restarts(self.client, self.watch.since)
            if restarts:
                raise killed_for_memory(restarts, self._current_limits()) from exc
            raise

    def wait(self, handles: list[Any]) -> None:
        """Wait for ``handles`` to finish (the watchdog bounds the wait); a task's own
        exception is raised here."""
        # local: distributed (~0.3 s to import), which import dl1.runtime.executor does without
        from distributed import wait

        if self.watch.failed is not None:
            raise self.watch.failed
        with as_current(self.client):  # wait() uses the current client: this one
            self.watch.poll(
                lambda t: wait(handles, timeout=t),
                lambda: pending_keys(handles),
                finished=lambda: _done(handles),
            )
        for h in handles:
            if h.status == "error":
                self.gather([h])  # raises the task's own exception (e.g. a ValidationError)

    def broadcast(self, fn, *args) -> None:
        """Run ``fn(*args)`` on every worker (for worker-local caches); nothing once the
        cluster stalled (the caches go with it)."""
        if self.watch.failed is None:
            self.run(fn, *args, what=f"the workers to run {fn.__name__}")

    def close(self) -> None:
        """Release what the solve held beside its tasks (tasks: nothing; see
        :meth:`dl1.runtime.rpc.RpcExecutor.close`)."""


    def compute(self, delayed: list[Any], workers: list[int] | None = None) -> list[Any]:
        engage_low_latency()
        if workers is None or not self.workers:
            return self.client.compute(delayed)
        return [
            self.client.compute(
                d, workers=[self.workers[k % self.n_workers]], allow_other_workers=True
            )
            for d, k in zip(delayed, workers, strict=True)
        ]


class _BlasHold:
    """One BLAS thread while any solve in this process asks for it: the first to enter
    sets the limit, the last to leave restores what it found, so solves in several threads
    (each entering and leaving in its own order) never leave the process limited."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holders = 0
        self.limited: Any = None

    def enter(self) -> None:
        with self.lock:
            if self.holders == 0:
                self.limited = blas_controller().limit(limits=1, user_api="blas")
            self.holders += 1

    def leave(self) -> None:
        with self.lock:
            self.holders -= 1
            if self.holders == 0:
                self.limited.restore_original_limits()
                self.limited = None


_BLAS_HOLD = _BlasHold()


@contextlib.contextmanager
def quiet_blas() -> Iterator[None]:
    """This process's BLAS held to one thread while it runs or coordinates a solve (the
    limit is the process's, restored when the last solve holding it ends).

    dl1's kernels are single-threaded (numba); BLAS does the coordinator's arithmetic on
    length-n vectors and, in process, the Gram products of working sets (row blocks of at
    most a few thousand columns): OpenBLAS's threads gain little there, then spin for
    about 0.1 s after each call and take a core from the kernels that follow and from a
    LocalCluster's workers (2 cores under load, in process: the ``small`` preset's fit took
    0.14 s of CPU with every thread and 0.07 s with one, tfidf's 1.12 s and 0.55 s;
    ``benchmarks/RESULTS.md``). Dask's workers start with one BLAS
    thread (``OPENBLAS_NUM_THREADS=1``), so a solve in one piece runs the same way.
    """
    _BLAS_HOLD.enter()
    try:
        yield
    finally:
        _BLAS_HOLD.leave()


@functools.cache
def blas_controller() -> Any:
    """This process's ``threadpoolctl.ThreadpoolController``, made once: making one scans
    every loaded library (~15 ms, which ``threadpool_limits`` paid in every fit)."""
    # local: threadpoolctl (~2 ms to import) only once a solve holds BLAS to one thread
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


@contextlib.contextmanager
def as_current(client: Any) -> Iterator[None]:
    """``client`` made the current one (``Client.as_current``), so that Dask's helpers that
    take no client (``distributed.wait``, ``dask.compute`` of an input array) use it even
    when it is not the default one; nothing without a client."""
    if client is None or not hasattr(client, "as_current"):
        yield
        return
    with client.as_current():
        yield


def coordinating(func: Callable) -> Callable:
    """Run ``func``, an entry point, as the coordinator of its ``client`` keyword argument
    (None: the current Dask client, as ``dask.compute`` would use, or this process when
    there is none): under :func:`low_latency` (engaged by its first task), :func:`quiet_blas`
    and :func:`as_current`,
    after warning if its scheduler is reached over plain TCP from another machine
    (:mod:`dl1.runtime.exposure`), its dask arguments holding persisted chunks checked or
    brought here (:func:`chunks_placed`). One wrapper, so that the entry points' warnings
    keep their ``stacklevel``."""
    signature = inspect.signature(func)

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:  # a wrong keyword refused before anything is connected, as Python says it
            signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{func.__name__}() {exc}") from None
        client = kwargs.get("client")
        if client is None:
            held = held_by(args[0]) if args else NOT_HELD
            client = kwargs["client"] = current_client() if held is NOT_HELD else held
        with contextlib.ExitStack() as connection:
            client = kwargs["client"] = connection.enter_context(connected(client))
            check_client(client)
            args, kwargs = chunks_placed(signature, args, kwargs, client)
            with low_latency(client, lazy=True), quiet_blas(), as_current(client):
                result = func(*args, **kwargs)
            if isinstance(result, Held) and result.client is client:
                result.keep(connection.pop_all())  # a handle made on a client made here
            return result

    return wrapper


def chunks_placed(
    signature: inspect.Signature, args: tuple, kwargs: dict[str, Any], client: Any
) -> tuple[tuple, dict[str, Any]]:
    """An entry point's arguments, those that are dask collections holding persisted
    chunks checked (:func:`~dl1.runtime.persisted.held_futures`: not released, held by
    ``client``'s cluster) and, for a solve in this process (``client`` None), given their
    chunks' values (:func:`~dl1.runtime.persisted.localized`): Dask's local scheduler
    cannot compute their futures."""
    bound = signature.bind_partial(*args, **kwargs)
    held = {n: persisted.held_futures(v, n, client) for n, v in bound.arguments.items()}
    held = {n: futures for n, futures in held.items() if futures}
    if not held or client is not None:
        return args, kwargs
    for name, futures in held.items():
        bound.arguments[name] = persisted.localized(bound.arguments[name], name, futures)
    return bound.args, bound.kwargs


#: :func:`held_by` of an input that no cluster holds.
NOT_HELD = object()


@runtime_checkable
class Held(Protocol):
    """Data whose blocks a cluster's workers (or this process) hold: a
    :class:`~dl1.dataset.Dataset`, shipped to a solve in one piece as its recipe."""

    client: Any

    def shipped(self) -> Any: ...

    def keep(self, connection: contextlib.ExitStack) -> None:
        """Close ``connection`` (a client made for the call that made this) when released."""


def held_by(X: Any) -> Any:
    """The client of data :class:`Held` by workers (None: held by this process), whose
    fits run where its blocks are; :data:`NOT_HELD` for any other input."""
    return X.client if isinstance(X, Held) else NOT_HELD


def executor_for(client: Any) -> Executor:
    """The executor of ``client`` (None: in-process)."""
    return LocalExecutor() if client is None else DistributedExecutor(client)


def _done(handles: list[Any]) -> int:
    """How many of ``handles`` (Dask futures) finished."""
    return sum(1 for h in handles if h.done())
