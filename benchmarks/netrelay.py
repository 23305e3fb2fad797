"""A delaying TCP relay: the latency of an emulated network link (benchmarks/bench_network.py).

``tc netem`` is not available on every kernel (this machine's lacks the module), so a link's
one-way latency is emulated in user space: the relay listens on one address per component
(a Dask scheduler or worker) and forwards every connection to that component, holding each
chunk it reads until ``delay`` seconds after it arrived (a monotonic clock), then writing it
on, in order. A connection through the relay thus sees ``delay`` in each direction: a round
trip gains ``2 * delay``. Bandwidth is the kernel's business (``tc tbf`` on the veth pairs).

Threads rather than asyncio: Python's epoll selector rounds every timeout up to a whole
millisecond (``selectors.EpollSelector.select``), which would turn a 0.2 ms link into 1 ms;
``time.sleep`` (``clock_nanosleep``) wakes within tens of microseconds. Each direction of a
connection has a reader (``recv``, stamp, queue) and a writer (wait until due, ``sendall``),
so the delay is a pipeline, not a stop-and-wait: bytes keep flowing at the link's rate.

When either side closes (or fails), the other side is shut down once everything read before
the close has been delivered; both sockets are then closed.

:func:`probe` calibrates a link: one-byte echo round trips and the throughput of a bulk
send, against :data:`CAL_SERVER` run at the far end.

The relay also counts, per route, the *turns* of its connections (and apart, of those from
a given set of client addresses): a turn is data going back to the connecting side after it
sent some, so for request / response traffic (Dask's rpc) it is one round trip.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import queue
import socket
import statistics
import threading
import time
from collections.abc import Iterable

#: Largest chunk read at once.
CHUNK = 256 * 2**10
#: Chunks held per direction before the reader waits (bounds the relay's memory).
MAX_QUEUED = 64
#: How often blocked threads look at the stop flag, seconds.
POLL = 0.2


def _fine_timer_slack() -> None:
    """Let this thread's sleeps (and those of the threads it starts) end within 1 us of
    their time: Linux's default timer slack is 50 us (``prctl(PR_SET_TIMERSLACK)``)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(29, 1000, 0, 0, 0)  # PR_SET_TIMERSLACK


@dataclasses.dataclass(frozen=True)
class Route:
    """Connections to ``listen`` (host, port) are forwarded to ``target`` (host, port)."""

    listen: tuple[str, int]
    target: tuple[str, int]


@dataclasses.dataclass
class RouteStats:
    """What went through one route: connections, bytes each way, and turns (request ->
    response round trips) on all its connections and on the client's."""

    connections: int = 0
    bytes_to_target: int = 0
    bytes_from_target: int = 0
    turns: int = 0
    client_turns: int = 0


class _Link:
    """One relayed connection: two sockets, four threads, one shutdown."""

    def __init__(self, relay: Relay, route: Route, a: socket.socket, b: socket.socket,
                 from_client: bool) -> None:  # fmt: skip
        self.relay, self.route, self.a, self.b = relay, route, a, b
        self.from_client = from_client
        self.closed = threading.Event()
        self._last = ""  # the direction of the last chunk ("up": to the target)
        self._lock = threading.Lock()
        self._done = 0

    def start(self) -> None:
        up: queue.Queue = queue.Queue(MAX_QUEUED)
        down: queue.Queue = queue.Queue(MAX_QUEUED)
        for fn, args in (
            (self._read, (self.a, up, "up")),
            (self._write, (self.b, up)),
            (self._read, (self.b, down, "down")),
            (self._write, (self.a, down)),
        ):
            threading.Thread(target=self._run, args=(fn, args), daemon=True).start()

    def _run(self, fn, args) -> None:
        """Run a reader or writer; a writer's end (its side closed, everything read before
        delivered; or a failure) shuts the whole link down."""
        try:
            fn(*args)
        except OSError:
            pass
        finally:
            if fn == self._write:
                self.shutdown()
            with self._lock:
                self._done += 1
                last = self._done == 4
            if last:
                for s in (self.a, self.b):
                    s.close()
                self.relay._forget(self)

    def _read(self, sock: socket.socket, q: queue.Queue, way: str) -> None:
        try:
            while not self.closed.is_set():
                data = sock.recv(CHUNK)
                if not data:
                    return
                self._count(way, len(data))
                self._put(q, (time.monotonic() + self.relay.delay, data))
        finally:
            self._put(q, None)

    def _put(self, q: queue.Queue, item) -> None:
        while True:  # bounded: the writer drains, or the link closes
            try:
                q.put(item, timeout=POLL)
                return
            except queue.Full:
                if self.closed.is_set():
                    return

    def _write(self, sock: socket.socket, q: queue.Queue) -> None:
        while True:
            try:
                item = q.get(timeout=POLL)
            except queue.Empty:
                if self.closed.is_set():
                    return
                continue
            if item is None:
                return
            due, data = item
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            sock.sendall(data)

    def _count(self, way: str, n: int) -> None:
        st = self.relay.stats[self.route]
        with self._lock:
            if way == "up":
                st.bytes_to_target += n
            else:
                st.bytes_from_target += n
                if self._last == "up":
                    st.turns += 1
                    st.client_turns += self.from_client
            self._last = way

    def shutdown(self) -> None:
        """Stop both directions: the blocked reads return, the writers stop."""
        self.closed.set()
        for s in (self.a, self.b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class Relay:
    """Forward each :class:`Route`, delaying every chunk by ``delay`` seconds.

    Parameters
    ----------
    routes : iterable of Route
    delay : float
        One-way latency added to each direction, seconds (>= 0).
    clients : iterable of str
        Peer addresses whose connections' turns are counted (:class:`RouteStats`).

    Use as a context manager, or :meth:`start` and :meth:`stop`.
    """

    def __init__(self, routes: Iterable[Route], delay: float, clients: Iterable[str] = ()):
        if not delay >= 0:
            raise ValueError(f"delay must be >= 0 seconds, got {delay!r}")
        self.routes = list(routes)
        if not self.routes:
            raise ValueError("a relay needs at least one route")
        self.delay = float(delay)
        self.clients = set(clients)
        self.stats = {r: RouteStats() for r in self.routes}
        self._stop = threading.Event()
        self._links: set[_Link] = set()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._listeners: list[socket.socket] = []

    def start(self) -> Relay:
        """Bind every route's address (port 0: any; see :attr:`addresses`) and serve."""
        for route in self.routes:
            srv = socket.create_server(route.listen, reuse_port=False)
            srv.settimeout(POLL)
            self._listeners.append(srv)
            t = threading.Thread(target=self._accept, args=(route, srv), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """The bound (host, port) of each route, in order."""
        return [s.getsockname()[:2] for s in self._listeners]

    def _accept(self, route: Route, srv: socket.socket) -> None:
        _fine_timer_slack()  # inherited by the links' threads started here
        while not self._stop.is_set():
            try:
                a, peer = srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                b = socket.create_connection(route.target, timeout=10)
            except OSError:
                a.close()
                continue
            for s in (a, b):
                s.settimeout(None)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(self, route, a, b, from_client=peer[0] in self.clients)
            with self._lock:
                self._links.add(link)
                self.stats[route].connections += 1
            link.start()

    def _forget(self, link: _Link) -> None:
        with self._lock:
            self._links.discard(link)

    def stop(self, timeout: float = 5.0) -> None:
        """Close the listeners and every relayed connection (waits at most ``timeout``)."""
        self._stop.set()
        for s in self._listeners:
            s.close()
        with self._lock:
            links = list(self._links)
        for link in links:
            link.shutdown()
        end = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, end - time.monotonic()))

    def totals(self) -> RouteStats:
        """The stats of all routes summed."""
        out = RouteStats()
        for st in self.stats.values():
            for f in dataclasses.fields(RouteStats):
                setattr(out, f.name, getattr(out, f.name) + getattr(st, f.name))
        return out

    def __enter__(self) -> Relay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ------------------------------------------------------- calibrating an emulated link
#: A calibration server (``python -c CAL_SERVER HOST PORT``, run where the component would
#: be): after a first byte ``e`` it echoes; after ``s`` and an 8-byte length it reads that
#: many bytes and answers ``k``. It prints ``ready`` once listening, serves 16 connections.
CAL_SERVER = r"""
import socket, sys, threading
def recvn(c, n):
    b = b""
    while len(b) < n:
        d = c.recv(n - len(b))
        if not d:
            raise EOFError
        b += d
    return b
def serve(c):
    with c:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        mode = recvn(c, 1)
        if mode == b"e":
            while d := c.recv(65536):
                c.sendall(d)
        else:
            n, got = int.from_bytes(recvn(c, 8), "big"), 0
            while got < n:
                d = c.recv(1 << 20)
                if not d:
                    return
                got += len(d)
            c.sendall(b"k")
srv = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
for _ in range(16):
    c, _ = srv.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""


def recv_exactly(s: socket.socket, n: int) -> bytes:
    """``n`` bytes from ``s`` (ConnectionError if it closes first)."""
    b = b""
    while len(b) < n:
        d = s.recv(n - len(b))
        if not d:
            raise ConnectionError("calibration connection closed early")
        b += d
    return b


def echo_rtts(address: tuple[str, int], n: int) -> list[float]:
    """Round trips of one byte to the calibration server's echo."""
    with socket.create_connection(address, timeout=30) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(b"e")
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            s.sendall(b"x")
            recv_exactly(s, 1)
            out.append(time.perf_counter() - t0)
    return out


def throughput(address: tuple[str, int], nbytes: int, rtt: float) -> float:
    """Bits/s of ``nbytes`` sent to the calibration server's sink (less one round trip)."""
    block = b"\0" * (1 << 20)
    with socket.create_connection(address, timeout=60) as s:
        s.sendall(b"s" + nbytes.to_bytes(8, "big"))
        t0 = time.perf_counter()
        for _ in range(nbytes // len(block)):
            s.sendall(block)
        recv_exactly(s, 1)
        return nbytes * 8 / max(time.perf_counter() - t0 - rtt, 1e-9)


def probe(address: tuple[str, int], nbytes: int) -> tuple[list[float], float]:
    """Echo round trips (200) and the median throughput of three ``nbytes`` probes."""
    rtts = echo_rtts(address, 200)
    rtt = statistics.median(rtts)
    return rtts, statistics.median(throughput(address, nbytes, rtt) for _ in range(3))


def serve(routes: list[Route], delay: float, clients: list[str], conn) -> None:
    """Run a :class:`Relay` in this process until ``conn`` (a multiprocessing pipe end)
    says ``"stop"``; ``"stats"`` answers the summed :class:`RouteStats` as a dict."""
    with Relay(routes, delay, clients) as relay:
        conn.send("ready")
        while True:
            msg = conn.recv() if conn.poll(3600) else "stop"
            if msg == "stats":
                conn.send(dataclasses.asdict(relay.totals()))
            else:
                break
    conn.send("stopped")
