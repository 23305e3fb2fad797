"""The stall timeout: how long dl1 waits without progress (of the cluster, or of object
storage) before it fails with a named error rather than hang."""

from __future__ import annotations

import dask
from dask.utils import parse_timedelta

#: Dask configuration key of the stall timeout (seconds, or a string such as ``"2 min"``).
STALL_TIMEOUT_KEY = "dl1.stall-timeout"

#: Seconds without progress before a wait fails: long enough for Dask to spill and resume a
#: paused worker, restart a lost one and recompute its results (seconds on a LocalCluster).
DEFAULT_STALL_TIMEOUT = 60.0

__all__ = ["DEFAULT_STALL_TIMEOUT", "STALL_TIMEOUT_KEY", "stall_timeout"]


def stall_timeout() -> float:
    """Seconds of no progress before a wait fails: ``dl1.stall-timeout`` (Dask config)."""
    value = dask.config.get(STALL_TIMEOUT_KEY, default=None)
    if value is None:
        return DEFAULT_STALL_TIMEOUT
    try:
        seconds = parse_timedelta(value, default="s")
    except (KeyError, ValueError, TypeError):
        seconds = None
    if seconds is None or not seconds > 0:
        raise ValueError(f"{STALL_TIMEOUT_KEY} must be a positive duration, got {value!r}")
    return float(seconds)
