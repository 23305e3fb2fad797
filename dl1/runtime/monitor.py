"""Peak resident memory of processes (workers of a LocalCluster), for tests and benchmarks."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

import psutil


class PeakRSS:
    """Samples the resident memory of some processes every ``period`` seconds, in a thread.

    Use as a context manager; ``peak`` maps each pid to the largest RSS seen (bytes).
    """

    def __init__(self, pids: Iterable[int], period: float = 0.02) -> None:
        self.procs = [psutil.Process(p) for p in pids]
        self.peak = {p.pid: 0 for p in self.procs}
        self.period = period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for p in self.procs:
                try:
                    self.peak[p.pid] = max(self.peak[p.pid], p.memory_info().rss)
                except psutil.NoSuchProcess:
                    pass
            time.sleep(self.period)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
