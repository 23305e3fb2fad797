"""One piece when it fits: a whole solve (a fit, a path, a cross-validation fold) run as one
task on one worker, by the in-process solver, when its data fits that worker with room.

A distributed solve pays a round trip per step of every round (a pass, a subproblem, a
choice of working set); on data that fits one worker those round trips are most of a fit's
time (``benchmarks/RESULTS.md``). Here the coordinator ships the call once (the data as the
caller gave it: a store is read by the worker itself, a data handle's blocks are the task's
dependencies) and only waits, under the watchdog, for the answer; a worker lost mid-task
is survived as any task is (the scheduler runs it again elsewhere).

The rule (:func:`chosen`, :func:`fits`): a cluster, the data's size known (a store's
blocks from its manifest, which is all the caller reads of a store it ships:
:func:`manifest_bytes`; a :class:`~dl1.dataset.Dataset`'s held blocks, an in-memory
array, a dense dask array), at most ``dl1.one-piece-max-bytes`` (Dask configuration,
default 64 MiB: beyond it the workers sharing each pass win) and at most
``dl1.one-piece-fraction`` (default 0.25) of a worker's memory for data (its
``memory_limit``, else the host's memory shared by the workers, less its measured
baseline); not when the caller asked for what only the coordinating process can do
(``stream=True``, a checkpoint, ``verbose`` lines). ``dl1.one-piece`` (Dask
configuration): ``"auto"`` (default, the rule), ``True`` (whenever the call can be
shipped, whatever the size) or ``False`` (never).

A callback does not keep a solve distributed: in the worker, each call's arguments are
logged as a Dask event of a topic of that solve (``Worker.log_event``), which the calling
process subscribes to (``Client.subscribe_topic``) and hands to the callback, in its own
thread, while the task runs; every call is delivered before the solve returns. The
callback sees the values of each call (a round's history entry, an alpha's result) but
not the worker's live objects: an entry is not updated after the call, and the call
cannot change the solve (an error it raises ends the solve, as in process).

The task leaves the worker's process-wide state alone: that it solves in this process
(no client, no nested shipment) is a context variable of the task (:func:`in_task`), read
where dl1 picks its client, not Dask's global configuration another task would see.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import pickle
import queue
import time
import uuid
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import cloudpickle
import dask
import numpy as np
import scipy.sparse as sp
from dask.sizeof import sizeof
from dask.utils import parse_bytes

from dl1.errors import Dl1Error, ValidationError
from dl1.runtime import persisted
from dl1.runtime.cancel import cancelled_with_task
from dl1.runtime.compute import computed_here, in_task, solving_here
from dl1.runtime.dask_workarounds import client_low_latency
from dl1.runtime.executor import DistributedExecutor
from dl1.runtime.worker import WORKER_BASELINE, heap_for_solve
from dl1.store.location import is_store_source
from dl1.store.reader import Store, block_memory, manifest_store

ONE_PIECE_KEY = "dl1.one-piece"
FRACTION_KEY = "dl1.one-piece-fraction"
DEFAULT_FRACTION = 0.25
MAX_BYTES_KEY = "dl1.one-piece-max-bytes"
DEFAULT_MAX_BYTES = 64 * 2**20

def setting() -> bool | str:
    """``dl1.one-piece`` from Dask's configuration: ``"auto"``, ``True`` or ``False``
    (``False`` within a solve in one piece)."""
    if in_task():
        return False
    value = dask.config.get(ONE_PIECE_KEY, "auto")
    if isinstance(value, str) and value.lower() in ("true", "false", "auto"):
        value = {"true": True, "false": False}.get(value.lower(), "auto")
    if value not in (True, False, "auto"):
        raise ValidationError(f"{ONE_PIECE_KEY} must be 'auto', True or False; got {value!r}")
    return value


def fraction() -> float:
    """``dl1.one-piece-fraction``: the share of a worker's memory for data a solve in one
    piece may take with its data (the rest is for the solver's own arrays and caches)."""
    value = dask.config.get(FRACTION_KEY, DEFAULT_FRACTION)
    try:
        value = float(value)
    except (TypeError, ValueError):
        value = float("nan")
    if not 0.0 < value <= 1.0:
        raise ValidationError(f"{FRACTION_KEY} must be in (0, 1]; got {value!r}")
    return value


def data_bytes(X: Any, inputs: Any) -> float | None:
    """Bytes the data of a solve takes in memory, or None when it cannot be known without
    reading it (a dask array of sparse chunks)."""
    if inputs.dataset is not None:
        return inputs.dataset.held_bytes()
    if inputs.store is not None:
        return float(block_memory(inputs.store, inputs.split))
    if sp.issparse(X):  # as the CSC blocks it becomes (int32 indices), as a store's
        return float(X.nnz * (X.dtype.itemsize + 4) + 8 * (X.shape[1] + 1))
    if isinstance(X, np.ndarray):
        return float(X.nbytes)
    meta = getattr(inputs.X, "_meta", None)
    if isinstance(meta, np.ndarray):  # dense chunks: the size is the shape's
        return float(inputs.X.nbytes)
    if hasattr(X, "nbytes") and not hasattr(X, "dask"):  # pydata sparse in memory
        return float(X.nbytes)
    return None


def names_store(X: Any) -> bool:
    """Whether ``X`` is a store (opened, or a path, URL or zarr store naming one), whose
    solve in one piece can be decided from its manifest alone (:func:`manifest_bytes`)."""
    return isinstance(X, Store) or is_store_source(X)


def manifest_bytes(X: Any, split: str) -> float:
    """Bytes the blocks of ``split`` of store ``X`` take in memory, from its manifest alone:
    the caller that ships the solve neither checks nor reads the store's chunks, the worker
    does (as it opens the store to solve)."""
    return float(block_memory(X if isinstance(X, Store) else manifest_store(X), split))


class Refusal(NamedTuple):
    """Why a call stays distributed (for the logs and the tests)."""

    reason: str


def excluded(*, stream: Any, checkpoint: Any = None, verbose: bool = False) -> Refusal | None:
    """What the caller asked for that only the coordinating process can do (a callback
    is not: its calls are relayed, see the module docstring)."""
    if stream:
        return Refusal("stream=True reads blocks task by task")
    if checkpoint is not None:
        return Refusal("a checkpoint is written by the coordinating process")
    if verbose:
        return Refusal("verbose lines are printed by the calling process")
    return None


def max_bytes() -> float:
    """``dl1.one-piece-max-bytes``: the largest data solved in one piece by the rule. Above
    it a pass's work, shared by the workers when distributed, outweighs the round trips one
    piece saves (``benchmarks/RESULTS.md``: on 2 workers, tfidf's 224 MiB of blocks fit in
    0.79 s distributed and 0.98 s in one piece; log1p's 1.1 GiB in 1.3 s and 4.2 s)."""
    given = dask.config.get(MAX_BYTES_KEY, DEFAULT_MAX_BYTES)
    try:
        value = float(parse_bytes(given) if isinstance(given, str) else given)
    except (TypeError, ValueError):
        value = float("nan")
    if not value >= 0:
        raise ValidationError(f"{MAX_BYTES_KEY} must be a size in bytes (>= 0); got {given!r}")
    return value


def fits(ex: Any, nbytes: float | None) -> bool:
    """The size rule: ``nbytes`` known, at most :func:`max_bytes` and at most
    :func:`fraction` of the smallest room of ``ex``'s workers."""
    if nbytes is None or not ex.workers:
        return False
    return nbytes <= min(max_bytes(), fraction() * min(room(ex).values()))


def room(ex: Any) -> dict[str, float]:
    """Each worker's memory for data: its limit (else the host's memory shared by the
    workers) less its measured baseline."""
    share = host_memory() / max(1, ex.n_workers)
    return {
        a: float((ex.limits.get(a) or share) - ex.baselines.get(a, WORKER_BASELINE))
        for a in ex.workers
    }


@functools.cache
def host_memory() -> int:
    """This machine's memory in bytes (asked once)."""
    # local: psutil (~0.02 s to import) only to size a solve in one piece
    import psutil

    return int(psutil.virtual_memory().total)


class Caught(NamedTuple):
    """A warning raised in the worker, re-raised in the calling process."""

    category: type
    message: str


class Answer(NamedTuple):
    """What the task returns: the entry's result, its warnings, its seconds and the number
    of callback calls it relayed; or ``refused``, the dl1 error the entry raised (bad data,
    a damaged store: an answer, raised in the caller, not a failed task whose traceback the
    worker would log)."""

    result: Any
    caught: list[Caught]
    seconds: float
    relayed: int = 0
    refused: Dl1Error | None = None


class SparseCoef(NamedTuple):
    """A result's ``coef_`` as it travels in an event: its nonzeros (an L1 model's few)."""

    size: int
    indices: np.ndarray
    values: np.ndarray


def _compact(arg: Any) -> Any:
    """A callback argument as it travels: a result's ``coef_`` as its nonzeros."""
    coef = getattr(arg, "coef_", None)
    if not isinstance(coef, np.ndarray) or coef.ndim != 1:
        return arg
    arg = copy.copy(arg)  # the solver's own result keeps its dense coef_
    nz = np.flatnonzero(coef)
    arg.coef_ = SparseCoef(coef.shape[0], nz.astype(np.int64), coef[nz])
    return arg


def _expand(arg: Any) -> Any:
    """A callback argument as the callback sees it (:func:`_compact` undone)."""
    sparse = getattr(arg, "coef_", None)
    if isinstance(sparse, SparseCoef):
        coef = np.zeros(sparse.size, dtype=sparse.values.dtype)
        coef[sparse.indices] = sparse.values
        arg.coef_ = coef
    return arg


class Relay:
    """A solve's callback as it travels to the worker, in shipment ``part`` of a call: each
    call logs the part, its number (from 0 in each run of the task) and its arguments
    (pickled, a result's coefficients as their nonzeros) as an event of ``topic``;
    :meth:`bind` gives it the worker first (a call from any thread of the task then
    reaches it)."""

    def __init__(self, topic: str, part: int = 0) -> None:
        self.topic, self.part = topic, part
        self.calls = 0
        self._worker: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"topic": self.topic, "part": self.part}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["topic"], state["part"])

    def bind(self, worker: Any) -> None:
        self._worker = worker

    def __call__(self, *args: Any) -> None:
        args = tuple(_compact(a) for a in args)
        msg = pickle.dumps((self.part, self.calls, args), protocol=5)
        self._worker.log_event(self.topic, msg)
        self.calls += 1


#: Seconds between looks at the wait while no relayed call arrives.
RELAY_POLL_S = 1.0
#: Seconds the calls relayed by a finished task may take to arrive (they travel through
#: the scheduler, as the task's answer does, so they are normally there before it).
LATE_CALLS_S = 10.0


class Listener:
    """The calling process's side of a :class:`Relay`: subscribed to a topic of its own
    (unsubscribed when done), it hands each relayed call to ``callback`` in the thread that
    waits for the task, once each and in order: a task run again (its worker lost, or its
    shipment sent again) repeats the calls made so far, which are dropped."""

    def __init__(self, client: Any, callback: Callable[..., Any]) -> None:
        self.client, self.callback = client, callback
        self.topic = f"dl1-progress-{uuid.uuid4().hex}"
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.next: dict[int, int] = {}  # by part: the number of its next call to hand over
        self.early: dict[tuple[int, int], tuple] = {}  # calls that came before an earlier one

    def relay(self, part: int) -> Relay:
        """The callback of shipment ``part``, as it travels."""
        return Relay(self.topic, part)

    @property
    def delivered(self) -> int:
        """The calls handed to the callback."""
        return sum(self.next.values())

    def __enter__(self) -> Listener:
        self.client.subscribe_topic(self.topic, self.events.put)
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: Any) -> None:
        try:
            self.client.unsubscribe_topic(self.topic)
        except Exception:
            if kind is None:  # else the solve's own error (a lost scheduler) says more
                raise

    def gather(self, ex: Any, futures: list[Any]) -> list[Answer]:
        """``ex.gather(futures)`` (in a helper thread), the relayed calls delivered
        meanwhile and, after it, until every call the tasks made is delivered (at most
        :data:`LATE_CALLS_S` seconds). An error (of a callback too) cancels the tasks."""
        with ThreadPoolExecutor(1, thread_name_prefix="dl1-one-piece-wait") as pool:
            waiting = pool.submit(ex.gather, futures)
            waiting.add_done_callback(lambda _: self.events.put(None))  # wakes the wait
            try:
                while not waiting.done():  # ends: the watchdog bounds the gather
                    self.deliver(RELAY_POLL_S)
                answers = waiting.result()
                deadline = time.monotonic() + LATE_CALLS_S
                expected = sum(a.relayed for a in answers)
                while self.delivered < expected and time.monotonic() < deadline:
                    self.deliver(deadline - time.monotonic())
            except BaseException:
                ex.client.cancel(futures)
                raise
        return answers

    def deliver(self, timeout: float) -> None:
        """The next relayed call, if one arrives within ``timeout`` seconds, made."""
        try:
            event = self.events.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return
        if event is None:  # the tasks ended
            return
        _, msg = event
        part, number, args = pickle.loads(msg)
        if number >= self.next.setdefault(part, 0):  # else a repeat: dropped
            self.early[part, number] = args
        while (part, self.next[part]) in self.early:  # each part's calls in order
            args = self.early.pop((part, self.next[part]))
            self.next[part] += 1
            self.callback(*(_expand(a) for a in args))


@dataclass(frozen=True)
class Shipment:
    """A call (an entry point's core function and its record, or a fold's job) as it
    travels to the worker: the data as the caller gave
    it (``X``), or, for a data handle, its recipe (``dataset``; its blocks travel as the
    task's dependencies). ``chunks``: the futures of the arguments that are dask
    collections holding persisted chunks (:func:`carried`), by argument name; they travel
    as the task's dependencies, not pickled with the rest."""

    entry: Callable[..., Any]  # the function the task calls (pickled by reference)
    X: Any
    kwargs: dict[str, Any] = field(default_factory=dict)
    dataset: Any = None
    chunks: dict[str, list[Any]] = field(default_factory=dict)


def carried(entry: Callable[..., Any], X: Any, kwargs: dict[str, Any], client: Any) -> Shipment:
    """A call of ``entry`` as it travels to a task of ``client``'s cluster: each argument
    holding persisted chunks, whose futures the worker's local scheduler cannot compute,
    replaced by its recipe and its chunks' futures (:func:`dl1.runtime.persisted.detached`;
    put back in place by :func:`attached`)."""
    given, chunks = {"X": X, **kwargs}, {}
    for name, value in given.items():
        if persisted.held_futures(value, name, client):
            given[name], chunks[name] = persisted.detached(value, name, client)
    X = given.pop("X")
    return Shipment(entry, X, given, chunks=chunks)


def attached(given: dict[str, Any], chunks: dict[str, list[Any]]) -> dict[str, Any]:
    """``given`` (a shipment's arguments) with each detached collection rebuilt from the
    values of its chunks, which arrived as the task's dependencies (``chunks``)."""
    return {
        name: value.attached(chunks[name]) if isinstance(value, persisted.Detached) else value
        for name, value in given.items()
    }


def chosen(ex: Any, nbytes: Callable[[], float | None], refusal: Refusal | None) -> bool:
    """Whether a solve whose data takes ``nbytes()`` bytes runs in one piece on ``ex``."""
    mode = setting()
    if not isinstance(ex, DistributedExecutor) or mode is False or refusal is not None:
        return False
    return mode is True or fits(ex, nbytes())


def ship(
    ex: Any,
    entry: Callable[..., Any],
    X: Any,
    kwargs: dict[str, Any],
    callback: Callable[..., Any] | None = None,
    dataset: Any = None,
) -> Any:
    """``entry(X, client=None, **kwargs)`` computed in one piece on ``ex``'s cluster, its
    ``callback`` (if any) called here with the calls relayed (see :class:`Listener`);
    ``dataset``: ``X``'s data handle, if any (its blocks travel as the task's
    dependencies)."""
    if dataset is None:
        return run_many(ex, [carried(entry, X, kwargs, ex.client)], [], callback=callback)[0]
    recipe, blocks = dataset.shipped()
    shipment = dataclasses.replace(carried(entry, None, kwargs, ex.client), dataset=recipe)
    return run_many(ex, [shipment], blocks, callback=callback)[0]


#: Times a shipment lost with its worker is sent again (as Dask's ``allowed-failures``).
RESENDS = 3


def run_many(
    ex: Any,
    shipments: list[Shipment],
    blocks: list[Any],
    *,
    spread: bool = False,
    callback: Callable[..., Any] | None = None,
) -> list[Any]:
    """Each of ``shipments`` run as one task (``spread``: the k-th on the k-th worker, or
    another if it is lost, so that independent solves run side by side), all waited for
    at once by ``ex``'s watchdog; the workers' warnings re-raised here, once each; the
    entries' ``callback`` calls, if given, relayed to it here while the tasks run.

    A shipment travels pickled in its task's arguments up to :data:`INLINE_BYTES`
    (:func:`inline`), else as scattered data, not in the task's graph (which the scheduler
    would hold and warns about past 10 MiB); scattered data is not recomputable, so a
    shipment lost with its worker is sent again, at most :data:`RESENDS` times.
    """
    # local: distributed (~0.3 s to import), which import dl1.runtime.one_piece does without
    from distributed.client import FutureCancelledError

    listener = None if callback is None else Listener(ex.client, callback)
    with client_low_latency(ex.client), listener or nullcontext():
        for attempt in range(RESENDS + 1):
            try:
                answers = _submitted(ex, shipments, blocks, spread, listener)
                break
            except (FutureCancelledError, ShipmentLost):
                if attempt == RESENDS:
                    raise
    caught = [c for a in answers for c in a.caught]
    for c in dict.fromkeys(caught):
        warnings.warn(c.message, c.category, stacklevel=4)
    for a in answers:
        if a.refused is not None:
            raise a.refused
    return [a.result for a in answers]


def _submitted(ex: Any, shipments: list[Shipment], blocks: list[Any], spread: bool,
               listener: Listener | None) -> list[Any]:  # fmt: skip
    """The answers of ``shipments`` sent as tasks, waited for (with ``listener``'s calls
    delivered meanwhile, if given)."""
    if listener is not None:
        shipments = [dataclasses.replace(s, kwargs={**s.kwargs, "callback": listener.relay(k)})
                     for k, s in enumerate(shipments)]  # fmt: skip
    workers = ex.workers if spread else []
    futures, sent = [], []
    try:
        for k, shipment in enumerate(shipments):
            where = {}
            if workers:
                where = {"workers": [workers[k % len(workers)]], "allow_other_workers": True}
            body = dataclasses.replace(shipment, chunks={})  # they travel as dependencies
            packed = inline(body)
            if packed is None:
                sent.append(_scatter(ex, body, where.get("workers")))
            arg = sent[-1] if packed is None else packed
            futures.append(ex.client.submit(in_worker, arg, blocks, shipment.chunks,
                                            pure=False, **where))  # fmt: skip
        answers = ex.gather(futures) if listener is None else listener.gather(ex, futures)
    finally:
        for f in futures + sent:
            f.release()
    return [a._replace(result=_expand(a.result)) for a in answers]


#: A shipment pickled to at most this many bytes travels in its task's arguments: the call
#: and the task in one message to the scheduler. A larger one is scattered first (one more
#: round trip): the scheduler keeps a task's arguments, and warns of graphs past 10 MiB.
INLINE_BYTES = 2**20


def inline(shipment: Shipment) -> bytes | None:
    """``shipment`` pickled, if it takes at most :data:`INLINE_BYTES` (an in-memory array
    larger than that is not pickled to find out); else None. As bytes, Dask looks for no
    futures or keys inside (it would in a dataclass's fields)."""
    if sizeof(shipment.X) > INLINE_BYTES:
        return None
    packed = cloudpickle.dumps(shipment, protocol=5)
    return packed if len(packed) <= INLINE_BYTES else None


class ShipmentLost(Exception):
    """A shipment's worker was lost while it was scattered to it: sent again."""


def _scatter(ex: Any, shipment: Shipment, workers: list[str] | None) -> Any:
    """``shipment`` scattered (to ``workers`` if given), waited for by the watchdog: a
    cluster whose workers cannot take it (all paused, all lost) is a stall, not a hang.

    A worker lost during the scatter fails it with the connection's error, or with the
    scheduler's ``KeyError`` for the worker it no longer knows (told where the data
    landed): :class:`ShipmentLost`, which :func:`run_many` sends again."""
    # local: distributed (~0.3 s to import), which import dl1.runtime.one_piece does without
    from distributed.comm import CommClosedError

    coro = ex.client.scatter(shipment, hash=False, workers=workers, asynchronous=True)
    try:
        return ex.watch.run_on_loop(coro, lambda: "a solve sent to a worker")
    except (KeyError, CommClosedError, ConnectionError) as e:
        raise ShipmentLost(f"{type(e).__name__}: {e}") from e


#: Warnings of the libraries beneath (not of the solve) stay in the worker's log.
QUIET = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)


def in_worker(
    shipment: Shipment | bytes, blocks: list[Any], chunks: dict[str, list[Any]] | None = None
) -> Answer:
    """The task: the shipment's function called in this process (no cluster: the
    in-process solver, :func:`in_task` set for this task only), its warnings recorded to
    travel back, its callback's calls relayed (:class:`Relay`). ``shipment`` may come pickled
    (:func:`inline`); ``blocks`` are a data handle's blocks, ``chunks`` the persisted chunks
    of its arguments (:func:`carried`); the result goes back with its ``coef_`` as its
    nonzeros."""
    # local: distributed (~0.3 s to import) is loaded in a worker, where this task runs
    from distributed import get_worker

    t0 = time.perf_counter()
    if isinstance(shipment, bytes):
        shipment = pickle.loads(shipment)
    given = attached({"X": shipment.X, **shipment.kwargs}, chunks or {})
    X = given.pop("X")
    if shipment.dataset is not None:  # a data handle's recipe: its blocks are the task's
        X = shipment.dataset.local(blocks)
    relay = given.get("callback")
    if isinstance(relay, Relay):
        relay.bind(get_worker())
    result, refused, caught = None, None, []
    with solving_here(), heap_for_solve(), cancelled_with_task(get_worker()):
        try:  # a refusal of the data or the store is the caller's error, not the task's
            kwargs = computed_here(given)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                result = shipment.entry(X, client=None, **kwargs)
        except Dl1Error as exc:
            refused = exc
    got = [Caught(w.category, str(w.message)) for w in caught if not issubclass(w.category, QUIET)]
    relayed = relay.calls if isinstance(relay, Relay) else 0
    return Answer(_compact(result), got, time.perf_counter() - t0, relayed, refused)
