"""Cold start: the first fit of a fresh process, in process and on a fresh 2-worker
LocalCluster, with numba's cache empty (a new installation) and after ``dl1 warm``.

Each run is a new Python process whose ``NUMBA_CACHE_DIR`` is a new empty folder (what a
fresh virtualenv has) or a folder ``dl1 warm`` filled once; its workers inherit it. Times
are wall seconds from the interpreter's start (imports included) to the fit's answer;
medians over ``--runs``.

    python benchmarks/bench_cold_start.py --runs 3
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

IN_PROCESS = """
import time; t0 = time.perf_counter()
import numpy as np, scipy.sparse as sp, dl1
X = sp.random(2000, 5000, density=0.01, format="csr", random_state=0)
y = np.asarray(X[:, :20] @ np.arange(1.0, 21.0)).ravel()
est = dl1.Lasso(alpha=0.01).fit(X, y)
print("SECONDS", time.perf_counter() - t0, est.gap_)
"""

ON_CLUSTER = """
import time; t0 = time.perf_counter()
import sys
from distributed import Client, LocalCluster
import dl1
if __name__ == "__main__":
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as c, \\
            Client(c):
        res = dl1.fit(sys.argv[1], alpha=dl1.alpha_max(sys.argv[1]) / 20, tol=1e-6)
        print("SECONDS", time.perf_counter() - t0, res.gap_)
"""


def timed(code: str, cache: Path, *args: str) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "run.py"
        script.write_text(code)
        out = subprocess.run([sys.executable, str(script), *args], capture_output=True,
                             text=True, check=True, timeout=600, cwd=tmp,
                             env={**__import__("os").environ, "NUMBA_CACHE_DIR": str(cache)})
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("SECONDS"))
    return float(line.split()[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dl1-cold-") as root:
        root = Path(root)
        subprocess.run([sys.executable, "-m", "dl1", "generate", str(root / "small.zarr")],
                       check=True, capture_output=True)  # fmt: skip
        store = str(root / "small.zarr")
        warm = root / "warm-cache"
        warm.mkdir()
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "dl1", "warm"], check=True, capture_output=True,
                       env={**__import__("os").environ, "NUMBA_CACHE_DIR": str(warm)})
        warm_s = time.perf_counter() - t0
        rows = []
        for name, code, extra in (("in process", IN_PROCESS, ()),
                                  ("2-worker LocalCluster", ON_CLUSTER, (store,))):
            cold = []
            for k in range(args.runs):
                empty = root / f"empty-{name[:2]}-{k}"
                empty.mkdir()
                cold.append(timed(code, empty, *extra))
            hot = [timed(code, warm, *extra) for _ in range(args.runs)]
            rows.append((name, statistics.median(cold), statistics.median(hot)))
    print(f"dl1 warm (once per installation): {warm_s:.1f} s")
    print("| first fit | empty numba cache | after `dl1 warm` |")
    print("|---|---|---|")
    for name, c, h in rows:
        print(f"| {name} | {c:.1f} s | {h:.1f} s |")


if __name__ == "__main__":
    main()
