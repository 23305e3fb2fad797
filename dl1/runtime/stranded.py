"""A workaround on the scheduler: tasks stranded in ``no-worker`` beside idle workers,
sent on by the coordinator's watchdog (:mod:`dl1.runtime.watchdog`)."""

from __future__ import annotations

import time
from typing import Any

# A task submitted with ``workers=[...]`` and ``allow_other_workers=True`` (dl1 places blocks
# next to their partitions) goes to Dask's ``no-worker`` state when no worker runs at all
# (every worker lost or paused at once). Dask sends no-worker tasks to a worker that joins
# (or resumes) only if that worker is among the task's restrictions
# (``Scheduler.bulk_schedule_unrunnable_after_adding_worker`` ignores
# ``loose_restrictions``), so once its restricted workers are gone such a task waits for
# ever beside idle workers. The coordinator's watchdog then asks the scheduler to place
# them as it would have on submission: on any running worker.
# Upstream: dask/distributed#7346 (restricted tasks left in ``no-worker`` when their workers
# are removed; open, about strict restrictions; the loose case is the same code path).


def release_stranded(dask_scheduler: Any = None) -> int:
    """On the scheduler: send no-worker tasks with loose restrictions that no running
    worker satisfies to ``processing`` (any running worker); how many were sent."""
    running = getattr(dask_scheduler, "running", None)
    unrunnable = getattr(dask_scheduler, "unrunnable", None)
    if not running or not unrunnable:
        return 0
    stranded = [
        ts.key
        for ts in list(unrunnable)
        if ts.loose_restrictions and not dask_scheduler.valid_workers(ts)
    ]
    if stranded:
        recs = dict.fromkeys(stranded, "processing")
        dask_scheduler.transitions(recs, stimulus_id=f"dl1-release-stranded-{time.time()}")
    return len(stranded)
