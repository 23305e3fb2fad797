"""A direct line to a partition server: pickled requests and replies over a socket.

A working-set round is four messages in a row (coordinator to the subproblem's server, to
its peers and back). Sent as Dask actor calls, each one crosses the sender's event loop,
the receiver's event loop and the receiver's actor thread: hand-overs between threads that
contend for the interpreter lock with the process's other work. A line is a socket of its
own: opened with the HMAC handshake of :mod:`multiprocessing.connection` (on a key the
coordinator draws for the solve), then the caller's own thread writes a request, a thread of
the server reads it, runs the method and writes the reply. On a 2-core LocalCluster a round
trip with a length-16,087 vector took a median 0.25 ms, against 0.80 ms as an actor call
sent straight to the worker (300 calls, idle workers); in fits at the ``"tfidf"`` preset
a call had taken 2-3 ms to reach its worker.

A message is the sizes of its parts, a pickle (Dask's: by reference where it can, else by
value), then the pickle's contiguous buffers (numpy arrays, out of band), each read from the
socket in place into fresh writable memory: the megabytes of columns a peer sends cost no
copy beyond the socket's. Nagle's algorithm is off (a message is written in pieces, and a
small piece waiting for the peer's delayed acknowledgement stalled round trips by 40 ms).
Lines are opened only where Dask's own messages are not encrypted (``tcp://`` addresses);
anything else keeps the actor calls.
"""

from __future__ import annotations

import contextvars
import os
import select
import socket
import struct
import threading
import time
import weakref
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

#: Seconds to wait for a first connection to a line before the caller keeps actor calls.
CONNECT_S = 5.0


def _socket(conn: Connection) -> socket.socket:
    """The socket under a connection that passed the handshake (``conn`` is closed), with
    Nagle's algorithm off: a message is written in pieces, and a small piece waiting for
    the peer's delayed acknowledgement stalled round trips by 40 ms."""
    sock = socket.socket(fileno=os.dup(conn.fileno()))
    conn.close()
    sock.setblocking(True)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _read(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise EOFError("the line was closed")
        got += k
    return buf


def send(sock: socket.socket, obj: Any) -> None:
    """Write ``obj``: the sizes, its pickle, then each of its out-of-band buffers."""
    from distributed.protocol.pickle import dumps

    bufs: list[Any] = []
    head = dumps(obj, protocol=5, buffer_callback=bufs.append)
    raws = [b.raw() for b in bufs]
    sizes = [len(head), *(r.nbytes for r in raws)]
    sock.sendall(struct.pack(f"!I{len(sizes)}Q", len(sizes), *sizes))
    sock.sendall(head)
    for r in raws:
        sock.sendall(r)


def recv(sock: socket.socket) -> Any:
    """Read an object :func:`send` wrote; its buffers land in fresh writable memory, read
    from the socket in place."""
    from distributed.protocol.pickle import loads

    (count,) = struct.unpack("!I", _read(sock, 4))
    sizes = struct.unpack(f"!{count}Q", _read(sock, 8 * count))
    head = _read(sock, sizes[0])
    return loads(head, buffers=[_read(sock, n) for n in sizes[1:]])


class Line:
    """The listening end, in a server's process: ``handler(method, args)`` answers each
    request, one thread per connection.

    The threads hold the handler's owner only weakly (``owner`` is the object whose bound
    method ``handler`` is): once the owner is gone, connections close and the listener
    with them; :meth:`close` does so at once. The threads run in a copy of the creating
    thread's context (a Dask worker's: ``get_worker`` works in them).
    """

    def __init__(self, owner: Any, method: str, host: str, authkey: bytes) -> None:
        self._listener = Listener((host, 0), authkey=authkey)
        self.address: tuple[str, int] = self._listener.address
        self._owner = weakref.ref(owner)
        self._method = method
        self._closing = threading.Event()
        self._context = contextvars.copy_context()
        self._spawn(self._accept)
        weakref.finalize(owner, Line._shut, self._listener, self._closing)

    def _spawn(self, fn: Any, *args: Any) -> None:
        ctx = self._context.copy()
        threading.Thread(target=ctx.run, args=(fn, *args), daemon=True, name="dl1-line").start()

    @staticmethod
    def _shut(listener: Listener, closing: threading.Event) -> None:
        if closing.is_set():
            return
        closing.set()
        # closing a socket does not wake a thread blocked in its accept(): a connection does
        try:
            socket.create_connection(listener.address, timeout=1.0).close()
        except OSError:
            pass
        try:
            listener.close()
        except OSError:
            pass

    def close(self) -> None:
        """Stop accepting connections (open ones end when their callers close them)."""
        Line._shut(self._listener, self._closing)

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                conn = self._listener.accept()
            except OSError:  # closed, or the connection that wakes a closing line
                if self._closing.is_set():
                    return
                time.sleep(0.01)  # a failing handshake, or no descriptor left for now
                continue
            except Exception:  # a caller failing the handshake
                continue
            if self._closing.is_set():
                conn.close()
                return
            try:
                sock = _socket(conn)
            except OSError:
                continue
            self._spawn(self._serve, sock)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    method, args = recv(conn)
                except (EOFError, OSError):
                    return
                owner = self._owner()
                if owner is None:
                    return
                try:
                    out = ("ok", getattr(owner, self._method)(method, args))
                except Exception as exc:  # raised again by the caller
                    out = ("error", exc)
                del owner
                try:
                    send(conn, out)
                    continue
                except (EOFError, OSError):
                    return
                except Exception as exc:  # unpicklable (pickled before a byte is written)
                    out = ("error", RuntimeError(f"{type(exc).__name__}: {exc}"))
                try:
                    send(conn, out)
                except (EOFError, OSError):
                    return


class Dialer:
    """The calling end: connections to one :class:`Line`, one request in flight on each
    (a connection is opened when every open one awaits a reply)."""

    def __init__(self, address: tuple[str, int], authkey: bytes) -> None:
        self.address = tuple(address)
        self._authkey = authkey
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()
        self._all: list[socket.socket] = []
        weakref.finalize(self, Dialer._close_all, self._all)

    def connect(self, timeout: float = CONNECT_S) -> None:
        """Open a first connection, or raise (TimeoutError after ``timeout`` seconds)."""
        box: list[Any] = []

        def attempt() -> None:
            try:
                box.append(self._open())
            except Exception as exc:
                box.append(exc)

        t = threading.Thread(target=attempt, daemon=True)
        t.start()
        t.join(timeout)
        if not box:
            raise TimeoutError(f"no answer from {self.address} within {timeout} s")
        if isinstance(box[0], Exception):
            raise box[0]
        self._release(box[0])

    def _open(self) -> socket.socket:
        """A new connection (handshake passed), kept to be closed with the others."""
        conn = _socket(Client(self.address, authkey=self._authkey))
        with self._lock:
            self._all.append(conn)
        return conn

    def request(self, method: str, args: tuple, early: bool = False) -> Reply:
        """Send ``method(*args)``; the reply is read by :meth:`Reply.result`, or as soon as
        it comes, by a thread of its own, with ``early`` (a reply of megabytes that the
        caller wants in memory by the time it needs it, while it works meanwhile)."""
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = self._open()
        send(conn, (method, args))
        return Reply(self, conn, early)

    def _release(self, conn: socket.socket) -> None:
        with self._lock:
            self._idle.append(conn)

    @staticmethod
    def _close_all(conns: list[socket.socket]) -> None:
        for c in conns:
            try:
                c.close()
            except OSError:
                pass

    def close(self) -> None:
        """Close every connection (the server's threads serving them end)."""
        with self._lock:
            conns, self._idle = list(self._all), []
            self._all.clear()
        Dialer._close_all(conns)


class Reply:
    """The pending reply to a :meth:`Dialer.request`."""

    def __init__(self, dialer: Dialer, conn: socket.socket, early: bool = False) -> None:
        self._dialer, self._conn = dialer, conn
        self._out: tuple[str, Any] | None = None
        self._failed: BaseException | None = None
        self._reader: threading.Thread | None = None
        if early:
            self._reader = threading.Thread(target=self._read, daemon=True, name="dl1-reply")
            self._reader.start()

    def _read(self) -> None:
        try:
            self._out = recv(self._conn)
        except BaseException as exc:  # raised by result()
            self._failed = exc
            return
        self._dialer._release(self._conn)

    def result(self, timeout: float | None = None) -> Any:
        """The method's result (its exception raised here); TimeoutError if none came
        within ``timeout`` seconds (the request stays pending)."""
        if self._reader is not None:
            self._reader.join(timeout)
            if self._reader.is_alive():
                raise TimeoutError(f"no reply from {self._dialer.address} within {timeout} s")
            if self._failed is not None:
                raise self._failed
        elif self._out is None:
            ready, _, _ = select.select([self._conn], [], [], timeout)
            if not ready:
                raise TimeoutError(f"no reply from {self._dialer.address} within {timeout} s")
            self._out = recv(self._conn)
            self._dialer._release(self._conn)
        assert self._out is not None
        status, value = self._out
        if status == "error":
            raise value
        return value
