"""Progress of a long command, on stderr: a bar on a terminal, and plain timestamped lines,
flushed as they are written, when stderr is not a terminal (a job's log shows progress
while the job runs)."""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any


def timestamp() -> str:
    """The UTC time, ISO 8601 to the second (``2026-01-31T12:00:00Z``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Progress:
    """A context manager reporting the steps of ``name`` (``total`` of them, or None when
    unknown) with :meth:`step`; :meth:`note` writes a line in either mode.

    Parameters
    ----------
    name : str
        What progresses (``"path"``, ``"fit"``), the first word of each line.
    total : int, optional
        Number of steps, for the bar.
    terminal : bool, optional
        Draw a bar (default: when stderr is a terminal).
    """

    def __init__(self, name: str, total: int | None = None, *, terminal: bool | None = None):
        self.name, self.total = name, total
        self.terminal = sys.stderr.isatty() if terminal is None else terminal
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        if self.terminal:
            # local: rich (~0.05 s to import) only for a bar on a terminal, not for plain lines
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn
            from rich.progress import Progress as Bar

            self._bar = Bar(
                TextColumn(f"[bold]{self.name}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                console=Console(stderr=True),
            )
            self._bar.__enter__()
            self._task = self._bar.add_task(self.name, total=self.total, info="")
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._bar is not None:
            self._bar.__exit__(kind, value, tb)
            self._bar = None

    def step(self, done: int, info: str) -> None:
        """Step ``done`` (1-based) finished; ``info`` describes it."""
        if self._bar is not None:
            self._bar.update(self._task, completed=done, info=info)
            return
        self.line(f"{done}/{self.total} {info}" if self.total else info)

    def note(self, text: str) -> None:
        """A line outside the steps (a phase starts or ends)."""
        if self._bar is not None:
            self._bar.console.print(text, highlight=False, markup=False)
        else:
            self.line(text)

    def line(self, text: str) -> None:
        """``<UTC time> <name> <text>`` on stderr, flushed."""
        sys.stderr.write(f"{timestamp()} {self.name} {text}\n")
        sys.stderr.flush()
