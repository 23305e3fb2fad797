"""The cancellation flag of the solve running in this thread.

A solve in one piece runs as one task; when its caller is gone Dask cancels the task but
cannot stop its thread. :mod:`dl1.runtime.cancel` watches the task and sets the event
installed here (:func:`cancellable`); the solvers check it once a round and the
subproblems' epoch loops once an epoch (:func:`check_cancelled`), so a cancelled solve
stops within an epoch, not after a whole subproblem. Outside such a task no event is set
and a check costs one context-variable lookup.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from dl1.errors import SolveCancelled

_CANCELLED: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar(
    "dl1_cancelled", default=None
)


def check_cancelled(where: str, step: int) -> None:
    """Raise :class:`SolveCancelled` if this thread's solve was cancelled; ``where`` and
    ``step`` (a round or an epoch) name the place in the message."""
    event = _CANCELLED.get()
    if event is not None and event.is_set():
        raise SolveCancelled(f"{where}, step {step}: the solve's task was cancelled (its "
                             "caller is gone); stopped")  # fmt: skip


@contextmanager
def cancellable(event: threading.Event) -> Iterator[None]:
    """Within: :func:`check_cancelled` in this thread raises once ``event`` is set."""
    token = _CANCELLED.set(event)
    try:
        yield
    finally:
        _CANCELLED.reset(token)
