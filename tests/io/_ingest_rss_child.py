"""Child process of ``test_ingest_memory.py``: ingest an svmlight file, report the peak RSS.

Usage: ``python _ingest_rss_child.py SRC DST WARM_SRC WARM_DST OUT_NPZ BATCH_BYTES BLOCK_NNZ``.
Prints one JSON line. The baseline is the resident set after the imports and a warm-up ingest
of a tiny file (numba kernels loaded, zarr initialised); the peak is the kernel's high-water
mark (``VmHWM``), reset to the current resident set just before the ingest.
"""

import gc
import json
import resource
import sys
import time


def status_kb(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def reset_high_water_mark() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        return False
    return True


def main() -> None:
    src, dst, warm_src, warm_dst, out_npz = sys.argv[1:6]
    batch_bytes, block_nnz = int(sys.argv[6]), int(sys.argv[7])
    import numpy as np

    from dl1.io import from_svmlight

    kw = {"batch_bytes": batch_bytes, "block_nnz": block_nnz}
    from_svmlight(warm_src, warm_dst, **kw)
    gc.collect()
    baseline = status_kb("VmRSS")
    hwm_before = status_kb("VmHWM")
    was_reset = reset_high_water_mark()
    t0 = time.perf_counter()
    store = from_svmlight(src, dst, **kw)
    seconds = time.perf_counter() - t0
    peak = status_kb("VmHWM")
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    y = store.read("y")
    np.savez(out_npz, y=y, col_nnz=store.read("stats/col_nnz"))
    report = {
        "baseline_kb": baseline,
        "hwm_before_kb": hwm_before,
        "hwm_reset": was_reset,
        "peak_kb": peak,
        "ru_maxrss_kb": maxrss,
        "seconds": seconds,
        "shape": list(store.shape()),
        "nnz": store.nnz(),
        "n_blocks": [len(store.row_bounds()) - 1, len(store.col_bounds()) - 1],
        "parse_seconds": store.attrs["svmlight"]["train"]["seconds_read_parse_append"],
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
