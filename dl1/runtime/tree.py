"""Partitions' results combined along a binomial tree of tasks among the workers.

The coordinator then receives one result, not one a worker, and no worker receives more
than ``ceil(log2 W)``: what a reduction of length-p vectors needs past a few workers (a
coordinator gathering 64 of them at a million features takes a gigabyte through its link).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def tree_reduce(ex: Any, handles: list[tuple[int, Any]], combine: Callable[[Any, Any], Any]) -> Any:
    """The handle of ``combine`` applied along a binomial tree to ``handles`` (each
    ``(partition, handle)``, in partition order): level by level, neighbours are combined
    on the first one's worker (``ex.submit_to``), the order kept, so ``combine(a, b)``
    always has ``a`` from lower partitions than ``b``."""
    if not handles:
        raise ValueError("tree_reduce needs at least one partition's result")
    level = list(handles)
    while len(level) > 1:
        pairs = [(a[0], ex.submit_to(a[0], combine, a[1], b[1]))
                 for a, b in zip(level[0::2], level[1::2], strict=False)]  # fmt: skip
        level = pairs + level[len(pairs) * 2 :]
    return level[0][1]
