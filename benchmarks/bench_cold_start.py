"""Cold start: the first fit of a fresh process, in process and on a fresh 2-worker
LocalCluster, with numba's cache empty (a new installation) and after ``dl1 warm``.

By default each run is a new Python process of this environment whose ``NUMBA_CACHE_DIR``
is a new empty folder (what a fresh virtualenv has) or a folder ``dl1 warm`` filled once;
its workers inherit it. With ``--venv``, a new virtualenv gets ``pip install`` of this
repository (not editable: numba caches beside the installed modules, as for a user), and
numba's cache it uses is emptied before each cold run. Times are wall seconds from the
interpreter's start (imports included) to the fit's answer; medians over ``--runs``.

    python benchmarks/bench_cold_start.py --runs 3 [--venv]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

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


def timed(python: str, code: str, env: dict[str, str], *args: str) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "run.py"
        script.write_text(code)
        out = subprocess.run([python, str(script), *args], capture_output=True, text=True,
                             check=True, timeout=900, cwd=tmp, env=env)  # fmt: skip
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("SECONDS"))
    return float(line.split()[1])


def new_venv(root: Path) -> str:
    """The python of a new virtualenv with this repository installed (not editable)."""
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True)
    python = str(root / "venv" / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", str(REPO)], check=True)
    return python


def cache_emptier(root: Path) -> tuple[dict[str, str], Callable[[], None]]:
    """The environment of the new virtualenv's runs (numba's cache in ``root``, where
    ``dl1 warm`` and the fits find it, as they find ``~/.cache/dl1/numba`` by default: see
    ``dl1/_numba_cache.py``), and a call that empties that cache."""
    cache = root / "numba-cache"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["NUMBA_CACHE_DIR"] = str(cache)

    def empty() -> None:
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir()

    return env, empty


def runs_in_venv(root: Path, runs: int, store: str) -> tuple[float, list[tuple]]:
    python = new_venv(root)
    env, empty = cache_emptier(root)
    rows = []
    for name, code, extra in (("in process", IN_PROCESS, ()),
                              ("2-worker LocalCluster", ON_CLUSTER, (store,))):  # fmt: skip
        cold = []
        for _ in range(runs):
            empty()
            cold.append(timed(python, code, env, *extra))
        rows.append([name, statistics.median(cold)])
    empty()
    t0 = time.perf_counter()
    subprocess.run([python, "-m", "dl1", "warm"], check=True, capture_output=True, env=env,
                   cwd=root)  # fmt: skip
    warm_s = time.perf_counter() - t0
    for row, code, extra in zip(rows, (IN_PROCESS, ON_CLUSTER), ((), (store,)), strict=True):
        row.append(statistics.median(timed(python, code, env, *extra) for _ in range(runs)))
    return warm_s, [tuple(r) for r in rows]


def runs_with_cache_dirs(root: Path, runs: int, store: str) -> tuple[float, list[tuple]]:
    def env(cache: Path) -> dict[str, str]:
        return {**os.environ, "NUMBA_CACHE_DIR": str(cache)}

    warm = root / "warm-cache"
    warm.mkdir()
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "dl1", "warm"], check=True, capture_output=True,
                   env=env(warm))  # fmt: skip
    warm_s = time.perf_counter() - t0
    rows = []
    for name, code, extra in (("in process", IN_PROCESS, ()),
                              ("2-worker LocalCluster", ON_CLUSTER, (store,))):  # fmt: skip
        cold = []
        for k in range(runs):
            empty = root / f"empty-{name[:2]}-{k}"
            empty.mkdir()
            cold.append(timed(sys.executable, code, env(empty), *extra))
        hot = [timed(sys.executable, code, env(warm), *extra) for _ in range(runs)]
        rows.append((name, statistics.median(cold), statistics.median(hot)))
    return warm_s, rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--venv", action="store_true",
                    help="install this repository into a new virtualenv and time its runs")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dl1-cold-") as root:
        root = Path(root)
        subprocess.run([sys.executable, "-m", "dl1", "generate", str(root / "small.zarr")],
                       check=True, capture_output=True)  # fmt: skip
        store = str(root / "small.zarr")
        measure = runs_in_venv if args.venv else runs_with_cache_dirs
        warm_s, rows = measure(root, args.runs, store)
    where = "a new virtualenv" if args.venv else "NUMBA_CACHE_DIR folders"
    print(f"{where}; dl1 warm (once per installation): {warm_s:.1f} s")
    print("| first fit | empty numba cache | after `dl1 warm` |")
    print("|---|---|---|")
    for name, c, h in rows:
        print(f"| {name} | {c:.1f} s | {h:.1f} s |")


if __name__ == "__main__":
    main()
