"""Direct lines to partition servers (dl1.solvers.line): messages arrive whole and writable,
errors and timeouts reach the caller, strangers are refused, and nothing outlives its use."""

import gc
import socket
import threading
import time

import numpy as np
import pytest

import dl1
from dl1.solvers.line import Dialer, Line, recv, send
from tests.test_penalised import as_dask, make_regression

KEY = b"k" * 32


class Owner:
    """A stand-in for a partition server: ``dispatch(method, args)``."""

    def dispatch(self, method, args):
        return getattr(self, method)(*args)

    def echo(self, *args):
        return args

    def fail(self, message):
        raise ValueError(message)

    def unpicklable(self):
        return threading.Lock()

    def slow(self, seconds):
        time.sleep(seconds)
        return seconds

    def meet(self):
        self.barrier.wait()  # BrokenBarrierError unless all parties are served at once
        return True


def test_a_message_arrives_whole_and_writable():
    a, b = socket.socketpair()
    msg = {
        "x": np.arange(10.0),
        "empty": np.zeros(0, np.int64),
        "strided": np.arange(20.0)[::3],
        "f32": np.linspace(0, 1, 7, dtype=np.float32),
        "nested": [("t", np.ones((3, 2)), None), 1.5],
    }
    send(a, msg)
    got = recv(b)
    for k in ("x", "empty", "strided", "f32"):
        np.testing.assert_array_equal(got[k], msg[k])
        assert got[k].dtype == msg[k].dtype and got[k].flags.writeable
    np.testing.assert_array_equal(got["nested"][0][1], msg["nested"][0][1])
    assert got["nested"][0][2] is None and got["nested"][1] == 1.5
    a.close()
    with pytest.raises(EOFError):
        recv(b)
    b.close()


def test_a_line_answers_reports_errors_and_refuses_strangers():
    owner = Owner()
    line = Line(owner, "dispatch", "127.0.0.1", KEY)
    d = Dialer(line.address, KEY)
    d.connect()
    x = np.random.default_rng(0).normal(size=16_087)
    out = d.request("echo", (x, "a")).result()
    np.testing.assert_array_equal(out[0], x)
    assert out[1] == "a"
    with pytest.raises(ValueError, match="boom"):
        d.request("fail", ("boom",)).result()
    with pytest.raises(RuntimeError, match="lock"):
        d.request("unpicklable", ()).result()
    # a reply that has not come: TimeoutError, and the request stays pending
    r = d.request("slow", (0.3,))
    with pytest.raises(TimeoutError):
        r.result(timeout=0.01)
    assert r.result() == 0.3
    # requests in flight together use connections of their own, served at once (each waits
    # for the others); early replies are read by their own thread
    owner.barrier = threading.Barrier(4, timeout=10)
    replies = [d.request("meet", (), early=i % 2 == 0) for i in range(4)]
    assert [r.result() for r in replies] == [True] * 4
    with pytest.raises(Exception):  # noqa: B017 (the handshake's own error)
        Dialer(line.address, b"x" * 32).connect()
    d.close()
    line.close()
    with pytest.raises(OSError):
        Dialer(line.address, KEY).connect(timeout=2.0)


def test_a_line_closes_when_its_owner_is_gone():
    owner = Owner()
    line = Line(owner, "dispatch", "127.0.0.1", KEY)
    d = Dialer(line.address, KEY)
    d.connect()
    assert d.request("echo", (1,)).result() == (1,)
    del owner
    gc.collect()
    with pytest.raises((EOFError, OSError)):
        d.request("echo", (2,)).result(timeout=5.0)
    with pytest.raises(OSError):
        Dialer(line.address, KEY).connect(timeout=2.0)


def _line_threads(dask_worker=None):
    return sum(t.name == "dl1-line" and t.is_alive() for t in threading.enumerate())


def test_a_fit_talks_to_its_servers_on_lines_and_closes_them(local_cluster):
    """During a fit on a process LocalCluster the workers serve lines (threads of their
    own); once the fit returns, none is left."""
    X, y = make_regression(seed=7)
    before = local_cluster.run(_line_threads)
    during: list[dict] = []

    def watch(entry):
        during.append(local_cluster.run(_line_threads))

    res = dl1.fit(as_dask(X, 3), y, alpha=0.01, client=local_cluster, callback=watch)
    assert {h["transport"] for h in res.history_} == {"direct"}
    assert all(n > before[w] for d in during for w, n in d.items())
    deadline = time.time() + 10
    while local_cluster.run(_line_threads) != before and time.time() < deadline:
        time.sleep(0.1)
    assert local_cluster.run(_line_threads) == before
