"""The worker preload (dl1.runtime.worker): a worker whose memory is high gives glibc's free heap
pages back to the system."""

import contextlib
import sys
import time
from collections.abc import Iterator

import pytest

from dl1.runtime.worker import MemoryTrimmer, trim_memory

glibc = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")


@contextlib.contextmanager
def _one_dl1_worker(memory_limit: int | str) -> Iterator:
    """A client of dl1's LocalCluster with one single-threaded worker process."""
    from distributed import Client

    from dl1.runtime.localcluster import local_cluster

    with (
        local_cluster(
            n_workers=1,
            threads_per_worker=1,
            memory_limit=memory_limit,
            dashboard_address="127.0.0.1:0",
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


def _fragment(dask_worker) -> tuple[float, float]:
    """Allocate 320 MB in 8 kB arrays, keep one in 16: the freed rest stays in the heap."""
    import numpy as np
    import psutil

    proc = psutil.Process()
    before = proc.memory_info().rss
    arrays = [np.ones(1000) for _ in range(40_000)]
    dask_worker.dl1_test_kept = arrays[::16]
    del arrays
    return before, proc.memory_info().rss


def _state(dask_worker) -> tuple[float, int]:
    import psutil

    return psutil.Process().memory_info().rss, dask_worker.dl1_trimmer.trims


@glibc
def test_a_worker_with_high_memory_gives_freed_heap_pages_back():
    """On a worker of dl1's LocalCluster, freeing 300 MB of small arrays leaves the resident
    memory high (glibc keeps the pages) until the worker's trimmer, above half of its limit,
    gives them back: at least 200 MB within a few seconds."""
    with _one_dl1_worker("600MiB") as client:
        before, fragmented = next(iter(client.run(_fragment).values()))
        assert fragmented - before > 250e6  # the freed arrays' pages are still resident
        deadline = time.time() + 10
        while time.time() < deadline:
            rss, trims = next(iter(client.run(_state).values()))
            if trims:
                break
            time.sleep(0.1)
        assert trims >= 1
        assert fragmented - rss > 200e6


@glibc
def test_the_trimmer_waits_for_high_and_growing_memory(monkeypatch):
    """No trim below ``fraction`` of the limit, nor until memory has grown by ``growth`` since
    the last trim; a trim records what it freed."""
    import psutil

    calls = []
    monkeypatch.setattr("dl1.runtime.worker.trim_memory", lambda: calls.append(1) or True)
    rss = psutil.Process().memory_info().rss
    MemoryTrimmer(limit=4 * rss)()  # far below half of the limit
    assert not calls
    t = MemoryTrimmer(limit=rss, fraction=0.5, growth=1e12)
    t()  # above half of the limit, never trimmed
    assert calls == [1] and t.trims == 1 and t.floor > 0
    t()  # not grown by 1e12 bytes since
    assert calls == [1] and t.trims == 1


@glibc
def test_trim_memory_releases_freed_heap_pages():
    """In this process: after freeing most of 40,000 small arrays, glibc reports that the
    trim gave memory back."""
    import numpy as np

    arrays = [np.ones(1000) for _ in range(40_000)]
    kept = arrays[::16]
    del arrays
    assert trim_memory() is True
    assert len(kept) == 2500


def test_the_managed_target_leaves_room_for_the_baseline_and_a_task():
    """Dask's target is lowered so that the baseline, the results held in memory and a
    running task's headroom fit under the pause threshold; never below a tenth of the limit;
    a target already lower (a large worker's 60%) is kept."""
    from dl1.runtime.worker import TASK_HEADROOM, WORKER_BASELINE, managed_target

    small = 650 * 2**20
    got = managed_target(small, 0.8, 0.6 * small)
    assert got < 0.6 * small
    assert WORKER_BASELINE + got + TASK_HEADROOM == pytest.approx(0.8 * small)
    tiny = 400 * 2**20  # its pause threshold is under the baseline and the headroom
    assert managed_target(tiny, 0.8, 0.6 * tiny) == pytest.approx(0.1 * tiny)
    large = 16 * 2**30
    assert managed_target(large, 0.8, 0.6 * large) == 0.6 * large


def _hold(nbytes: int):
    import numpy as np

    return np.ones(nbytes // 8)


def _memory_state(dask_worker) -> tuple[float, float, int, int]:
    data = dask_worker.data
    return data.n, data.fast.total_weight, len(data.fast), len(data.slow)


def test_a_dl1_worker_spills_results_beyond_its_managed_target():
    """On dl1's LocalCluster, a 650 MiB worker holds at most :func:`managed_target` bytes of
    results in memory (under Dask's own target) and spills the rest as they are
    stored, without waiting for its memory monitor."""
    import dask
    from distributed import wait

    from dl1.runtime.worker import managed_target

    limit = 650 * 2**20
    pause = dask.config.get("distributed.worker.memory.pause")
    target = dask.config.get("distributed.worker.memory.target") * limit
    with _one_dl1_worker(limit) as client:
        futures = [client.submit(_hold, 24 * 2**20, pure=False) for _ in range(10)]
        wait(futures)
        n, in_memory, fast, slow = next(iter(client.run(_memory_state).values()))
        assert n == managed_target(limit, pause, target) < target
        assert in_memory <= n
        assert slow >= 1 and fast + slow == 10  # 240 MiB stored: the oldest went to disk
        assert all(f.result().shape == (3 * 2**20,) for f in futures)  # read back intact


_MAPPINGS = """
import numpy as np
from dl1.runtime.worker import heap_for_solve, trim_memory

def on_heap():  # whether a 4 MiB array lies in glibc's main heap (not a mapping of its own)
    a = np.ones(2**19)
    with open("/proc/self/maps") as fh:
        spans = [line.split()[0].split("-") for line in fh if line.rstrip().endswith("[heap]")]
    return int(any(int(lo, 16) <= a.ctypes.data < int(hi, 16) for lo, hi in spans))

outside = on_heap()
with heap_for_solve():
    inside = on_heap()
    with heap_for_solve():  # nested: the outer one restores
        pass
    nested = on_heap()
trim_memory()  # the heap a solve keeps (HEAP_KEPT) would serve the next array
after = on_heap()
print(outside, inside, nested, after)
"""


@glibc
def test_a_solve_in_a_worker_takes_its_temporaries_from_the_heap():
    """With Dask's worker environment (glibc's thresholds fixed at 64 KiB), a 4 MiB array is
    a mapping of its own; inside ``heap_for_solve`` it comes from the heap, and the
    environment's thresholds are back afterwards (after the outermost of nested uses): once
    the heap is trimmed, such an array is a mapping again."""
    import os
    import subprocess

    env = {**os.environ, "MALLOC_TRIM_THRESHOLD_": "65536", "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run([sys.executable, "-c", _MAPPINGS], env=env, capture_output=True,
                         text=True, check=True, timeout=120).stdout  # fmt: skip
    assert out.split() == ["0", "1", "1", "0"]


_FAULTS = """
import resource
import numpy as np
from dl1.runtime.worker import heap_for_solve

def solve():  # the page faults of a solve's 8 MiB temporary; its 8 MiB result
    with heap_for_solve():
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        temporary = np.ones(2**20)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        del temporary
        return faults, np.ones(2**20)

first, result = solve()
del result  # freed after the solve, as a task's result and data are
print(first, solve()[0])
"""


@glibc
def test_the_next_solve_reuses_the_heap_pages_the_last_one_freed():
    """With Dask's worker environment, an 8 MiB temporary of a solve faults its pages in;
    when the solve's result is freed after it, the next solve's temporary of that size
    reuses them (before: glibc, back at the environment's 64 KiB trim threshold, gave the
    heap's top back at that free)."""
    import os
    import subprocess

    env = {**os.environ, "MALLOC_TRIM_THRESHOLD_": "65536", "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run([sys.executable, "-c", _FAULTS], env=env, capture_output=True,
                         text=True, check=True, timeout=120).stdout  # fmt: skip
    first, second = map(int, out.split())
    assert first >= 4 and second <= first // 4, (first, second)


_KEPT = """
import numpy as np
import dl1.runtime.worker as w

calls = []
w.trim_memory = lambda: calls.append(1) or True
with w.heap_for_solve():
    a = np.ones(2**20)  # 8 MiB, freed: kept for the next solve
    del a
kept = len(calls)
with w.heap_for_solve():  # 16 MiB blocks between smaller ones, freed: holes stay resident
    held = [(np.ones(2**21), np.ones(2**14)) for _ in range(w.HEAP_KEPT // 2**24 + 4)]
    held = [small for _, small in held]
print(kept, len(calls))
"""


@glibc
def test_a_solve_returns_its_freed_heap_only_beyond_what_is_kept():
    """After a solve in a worker, freed heap up to ``HEAP_KEPT`` stays with the process (the
    next solve's temporaries reuse it); beyond that it is trimmed."""
    import os
    import subprocess

    env = {**os.environ, "MALLOC_TRIM_THRESHOLD_": "65536", "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run([sys.executable, "-c", _KEPT], env=env, capture_output=True,
                         text=True, check=True, timeout=120).stdout  # fmt: skip
    assert out.split() == ["0", "1"]
