"""Helpers shared by the tests: random sparse data, the tasks a cluster ran."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp

import dl1


def random_csr(n, p, density, seed, dtype=np.float64, empty_rows=(), empty_cols=()):
    """Random CSR with chosen empty rows and columns."""
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=density, format="lil", random_state=rng, dtype=dtype)
    for r in empty_rows:
        X[r, :] = 0
    for c in empty_cols:
        X[:, c] = 0
    X = sp.csr_matrix(X)
    X.eliminate_zeros()
    return X


def planted_classes(n: int, p: int, K: int, seed: int) -> tuple[Any, np.ndarray]:
    """A sparse ``n x p`` CSR matrix and K-class labels: the argmax of a planted sparse
    linear model plus Gumbel noise (a multinomial model's draws)."""
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=0.3, format="csr", random_state=rng)
    W = rng.standard_normal((p, K)) * (rng.random((p, 1)) < 0.4) * 3
    return X, np.argmax(X @ W + rng.gumbel(size=(n, K)), axis=1)


def store_reads(task_stream) -> int:
    """Tasks of a Dask task stream that read blocks from a dl1 store (whole blocks, keys
    ``dl1-<split>-...``, or pieces, ``read_columns_task``)."""

    def name(key):
        return str(key[0] if isinstance(key, tuple) else key)

    return sum(1 for e in task_stream
               if name(e["key"]).startswith(("dl1-train-", "read_columns_task")))  # fmt: skip


@dataclass
class TaskStream:
    """The task stream records of the tasks a scheduler saw end while a block ran."""

    data: list[dict] = field(default_factory=list)


def _records_since(first: int | None, dask_scheduler: Any = None) -> tuple[int, list[dict]]:
    """On the scheduler: its task stream's record count, and the records from number
    ``first`` on (none when ``first`` is None)."""
    plugin = dask_scheduler.plugins["task-stream"]
    if first is None:
        return plugin.index, []
    held = plugin.index - len(plugin.buffer)  # records before these left the buffer
    return plugin.index, list(plugin.buffer)[max(0, first - held):]


@contextlib.contextmanager
def task_stream(client: Any) -> Iterator[TaskStream]:
    """The tasks the cluster of ``client`` reported ended while the block ran, by the
    scheduler's count of records, as recent ``distributed.get_task_stream`` does. The
    oldest distributed dl1 supports chooses them by the time a task ended, as the worker
    stamps it (its clock corrected by a heartbeat's estimate of the offset), so a task that
    ended just before the block could be counted in it."""
    client.get_task_stream(start=0, stop=0)  # the scheduler's task stream plugin, made
    first, _ = client.run_on_scheduler(_records_since, None)
    stream = TaskStream()
    yield stream
    _, stream.data = client.run_on_scheduler(_records_since, first)


def released_batching(client: Any, bound: float = 10.0) -> bool:
    """Whether dl1 lets go of ``client``'s batching interval within ``bound`` seconds (a fit
    in one piece holds it a moment after it returns)."""
    from dl1.runtime.dask_workarounds import held_short

    deadline = time.monotonic() + bound
    while held_short(client) and time.monotonic() < deadline:
        time.sleep(0.01)
    return not held_short(client)


def fit_in_mode(client: Any, tmp_path: Any, mode: str, X: Any, y: Any, **kw: Any) -> Any:
    """``dl1.fit(X, y, **kw)`` on ``client`` in ``mode``: ``"one piece"``, ``"distributed"``
    (one piece off) or ``"streamed"`` (out of core, from a 4-block store in ``tmp_path``)."""
    import dask

    import dl1

    data, extra = X, {}
    if mode == "streamed":
        data = dl1.from_scipy(X, y, tmp_path / "s.zarr", n_feature_blocks=4)
        extra = {"stream": True}
    with dask.config.set({"dl1.one-piece": mode == "one piece"}):
        return dl1.fit(data, None if mode == "streamed" else y, client=client, **kw, **extra)


class PathStopped(Exception):
    """Raised by :func:`stop_path_after`'s callback."""


def stop_path_after(k: int, *args: Any, **kw: Any) -> None:
    """Run ``dl1.path(*args, **kw)`` and interrupt it after its alpha ``k`` (from 0) has
    been fitted and checkpointed, as a job killed there would be; check it stopped there."""
    def stop(i, alpha, res):
        if i == k:
            raise PathStopped

    with pytest.raises(PathStopped):
        dl1.path(*args, callback=stop, **kw)
