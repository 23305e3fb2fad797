"""Calls to dl1's handlers on Dask workers, over Dask's own comm.

A call is one message of Dask's rpc (``dl1_open``, ``dl1_call``, ``dl1_close``: handlers a
:class:`~dl1.runtime.servers.PartitionServers` plugin registers on each worker), sent on the
caller's connection pool (the client's, or a worker's to its peers) or forwarded by the
scheduler's ``proxy`` handler when the client cannot reach the workers. Dask's comm brings
its TLS and authentication; no worker listens on a port of its own.

The arguments and results travel as :class:`Packed`: one pickle of the whole object, with
small arrays in band and large ones (a peer's gathered columns: megabytes) as frames of
their own (Dask's pickle serializer sends a Packed's buffers out of band), written and read
without a copy. Dask would make a frame of every array; a call carries dozens of small
index arrays, and one pickle costs a fraction of that.

Dask is imported on first use: the modules a worker's tasks import load no more of it.
"""

from __future__ import annotations

import asyncio
import functools
import os
import pickle
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import cloudpickle
import dask
from dask.utils import parse_timedelta

from dl1.runtime.wire import BlockMoved, ServerClosed

#: Buffers of at least this many bytes travel as frames of their own (out of band).
OUT_OF_BAND_BYTES = 64 * 2**10


@dataclass
class Packed:
    """An object pickled (protocol 5) into ``head``, its large buffers apart (pickled out
    of band in turn: Dask's pickle serializer makes them frames of their own)."""

    head: bytes
    buffers: list[memoryview]
    #: the packing process: one that unpacks its own Packed (Dask's in-process comm passes
    #: objects as they are) copies the buffers, which are the packed arrays' memory
    pid: int

    def __reduce_ex__(self, protocol: int) -> tuple:
        if protocol < 5:
            return _packed, (self.head, [bytes(b) for b in self.buffers], self.pid)
        return _packed, (self.head, [pickle.PickleBuffer(b) for b in self.buffers], self.pid)


def _packed(head: bytes, buffers: list[Any], pid: int) -> Packed:
    return Packed(head, [memoryview(b) for b in buffers], pid)


def pack(obj: Any) -> Packed:
    """``obj`` pickled: by reference where plain pickle can (functions of dl1's modules),
    else by value (cloudpickle: objects of ``__main__``, closures)."""
    buffers: list[memoryview] = []

    def out_of_band(buf: pickle.PickleBuffer) -> bool:
        view = buf.raw()
        if view.nbytes < OUT_OF_BAND_BYTES:
            return True  # in band
        buffers.append(view)
        return False

    try:
        head = pickle.dumps(obj, protocol=5, buffer_callback=out_of_band)
        if b"__main__" not in head:
            return Packed(head, buffers, os.getpid())
    except Exception:
        pass
    buffers.clear()
    head = cloudpickle.dumps(obj, protocol=5, buffer_callback=out_of_band)
    return Packed(head, buffers, os.getpid())


def unpack(packed: Packed) -> Any:
    """The object :func:`pack` packed, its arrays writable and its own: a buffer delivered
    read-only, or still the packing process's memory, is copied."""
    own = packed.pid != os.getpid()
    buffers = [b if own and not memoryview(b).readonly else bytearray(b) for b in packed.buffers]
    return pickle.loads(packed.head, buffers=buffers)


class PackingError(RuntimeError):
    """A handler's result could not be pickled (the caller gets this instead)."""


def pack_result(obj: Any) -> Packed:
    """:func:`pack` of a handler's result; :class:`PackingError` naming what failed."""
    try:
        return pack(obj)
    except Exception as exc:
        raise PackingError(f"{type(exc).__name__}: {exc}") from None


#: Seconds a call may take to connect to a worker, at most (Dask's connect timeout, 30 s
#: by default, if shorter): a lost worker's address refuses connections, which Dask retries
#: until its timeout; a live worker accepts in milliseconds.
CONNECT_S = 10.0


def connect_timeout() -> float:
    """Seconds to connect to a worker: :data:`CONNECT_S`, or Dask's timeout if shorter."""
    dask_s = parse_timedelta(dask.config.get("distributed.comm.timeouts.connect"), "s")
    return min(CONNECT_S, float(dask_s or CONNECT_S))


class _Signalling:
    """A Dask comm that sets ``written`` once a message is written to it (handed to the
    transport), for calls sent one after the other (:func:`start_calls_in_turn`)."""

    def __init__(self, comm: Any, written: asyncio.Event) -> None:
        self._comm, self._written = comm, written

    async def write(self, msg: Any, **kwargs: Any) -> int:
        try:
            return await self._comm.write(msg, **kwargs)
        finally:
            self._written.set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._comm, name)


async def send_call(
    pool: Any,
    address: str,
    op: str,
    via_scheduler: Any = None,
    written: asyncio.Event | None = None,
    **msg: Any,
) -> dict:
    """The reply of ``address``'s handler ``op`` to ``msg``: on ``pool`` (Dask's
    ConnectionPool), or forwarded by the scheduler (``via_scheduler``, an rpc to it) when
    given. Dask raises the handler's own exception here. The connection is made (or taken
    from the pool) within :func:`connect_timeout` seconds; the call itself is not bounded
    (a subproblem may take long: the caller watches the worker instead). ``written`` is
    set once the request is written (or the call failed first)."""
    if via_scheduler is not None:  # the scheduler's handler Dask's own Actors call through
        if written is not None:
            written.set()
        return await via_scheduler.proxy(msg={"op": op, **msg}, worker=address)
    if written is None:
        # connect with our bound and hand the connection back: the call below takes it
        # from the pool at once (no await in between), so it does not connect again
        pool.reuse(address, await pool.connect(address, timeout=connect_timeout()))
        return await getattr(pool(address), op)(**msg)
    # local: distributed (~0.3 s to import), which import dl1.runtime.calls does without
    from distributed.core import send_recv

    try:
        comm = await pool.connect(address, timeout=connect_timeout())
    except BaseException:
        written.set()
        raise
    try:  # what Dask's pooled rpc calls do, with the write signalled
        codecs = {"serializers": pool.serializers, "deserializers": pool.deserializers}
        return await send_recv(_Signalling(comm, written), op=op, **codecs, **msg)
    finally:
        pool.reuse(address, comm)


class Call:
    """The pending reply to a call: ``result()`` is the handler's unpacked ``"result"``."""

    def __init__(self, future: Future, started: threading.Event) -> None:
        self._future = future
        self._started = started

    def wait_sent(self) -> None:
        """Wait until the event loop has taken the call up: it writes the request in the
        same step. A caller that works meanwhile first waits for this, or its work could
        keep the loop from sending (on a busy machine, for milliseconds) while the callee
        idles."""
        self._started.wait()

    def result(self, timeout: float | None = None) -> Any:
        """The call's result (its error raised here; BlockMoved for a server's answer that a
        block moved, ServerClosed for one that its server is not there); TimeoutError if
        none came within ``timeout`` seconds (the call stays pending)."""
        reply = self._future.result(timeout=timeout)
        if "moved" in reply:
            raise BlockMoved(reply["moved"])
        if "closed" in reply:
            raise ServerClosed(reply["closed"])
        return unpack(reply["result"])


def start_call(
    loop: asyncio.AbstractEventLoop,
    pool: Any,
    address: str,
    op: str,
    args: Any,
    via_scheduler: Any = None,
    **msg: Any,
) -> Call:
    """Send ``op`` with ``args`` packed (here, in the calling thread) from a thread outside
    ``loop``, the event loop owning ``pool``; the reply is read by the loop as it comes."""
    # local: distributed (~0.3 s to import), which import dl1.runtime.calls does without
    from distributed.protocol import to_serialize

    payload = to_serialize(pack(args))
    started = threading.Event()

    async def send() -> dict:
        started.set()
        return await send_call(pool, address, op, via_scheduler, payload=payload, **msg)

    return Call(asyncio.run_coroutine_threadsafe(send(), loop), started)


def start_calls_in_turn(
    loop: asyncio.AbstractEventLoop, pool: Any, calls: list[tuple[str, Any]], op: str, **msg: Any
) -> list[Call]:
    """Send ``op`` to each ``(address, args)`` of ``calls`` (packed here, in the calling
    thread), each request once the one before is written: on one link, the first callee
    gets all of it first, instead of every callee a share of it meanwhile (a tree of
    forwarding callees waits for its head only). The replies are read as they come."""
    # local: distributed (~0.3 s to import), which import dl1.runtime.calls does without
    from distributed.protocol import to_serialize

    payloads = [to_serialize(pack(args)) for _, args in calls]
    replies: list[Future] = [Future() for _ in calls]
    started = threading.Event()

    async def send_all() -> None:
        started.set()
        for (address, _), payload, reply in zip(calls, payloads, replies, strict=True):
            written = asyncio.Event()
            sent = asyncio.ensure_future(
                send_call(pool, address, op, written=written, payload=payload, **msg)
            )
            sent.add_done_callback(functools.partial(_settle, reply))
            await written.wait()

    asyncio.run_coroutine_threadsafe(send_all(), loop)
    return [Call(reply, started) for reply in replies]


def _settle(reply: Future, done: asyncio.Future) -> None:
    """``done``'s outcome into ``reply``."""
    if done.cancelled():
        reply.cancel()
    elif done.exception() is not None:
        reply.set_exception(done.exception())
    else:
        reply.set_result(done.result())
