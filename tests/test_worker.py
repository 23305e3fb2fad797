"""The worker preload (dl1.worker): a worker whose memory is high gives glibc's free heap
pages back to the system."""

import sys
import time

import pytest

from dl1.worker import MemoryTrimmer, trim_memory

glibc = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")


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
    from distributed import Client

    from dl1.localcluster import local_cluster

    with (
        local_cluster(
            n_workers=1, threads_per_worker=1, memory_limit="600MiB", dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
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
    monkeypatch.setattr("dl1.worker.trim_memory", lambda: calls.append(1) or True)
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
