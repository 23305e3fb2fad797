"""A solve that stops when nobody waits for it any more.

A solve in one piece (:mod:`dl1.runtime.one_piece`) runs as one task; when its caller is
interrupted or its client goes, Dask cancels the task but cannot stop the thread running
it, which would solve on for minutes and hold the worker (the next caller then waits for a
busy worker). Here the task's thread is given a cancellation event
(:mod:`dl1.cancellation`), set by a watcher that looks every :data:`WATCH_S` seconds whether
the worker still runs the task; every solver checks it once a round
(:func:`dl1.solvers.numerics.check_round`) and the subproblems once an epoch, and stops with
:class:`~dl1.errors.SolveCancelled`. An epoch is the unit: one compiled kernel call
finishes first.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dl1.cancellation import cancellable

#: Seconds between the watcher's looks at the task's state.
WATCH_S = 0.2
#: The worker's states of a task whose thread is still wanted.
RUNNING = frozenset({"executing", "long-running"})


@contextmanager
def cancelled_with_task(worker: Any) -> Iterator[None]:
    """Within (in a worker's task thread): the solve stops when the worker no longer runs
    this task (released, cancelled or forgotten by the scheduler)."""
    key = worker.get_current_task()
    event, done = threading.Event(), threading.Event()

    def watch() -> None:
        while not done.wait(WATCH_S):
            # read only: a task's state in the worker's state machine (distributed has no
            # public "is my task still wanted" call)
            ts = worker.state.tasks.get(key)
            if ts is None or ts.state not in RUNNING:
                event.set()
                return

    watcher = threading.Thread(target=watch, name="dl1-cancel-watch", daemon=True)
    watcher.start()
    try:
        with cancellable(event):
            yield
    finally:
        done.set()
        watcher.join()
