"""Benchmark of writing dl1 stores: synthetic generation and svmlight ingest.

1. Generate E2006-like presets (default ``log1p``: 16,087 x 4,272,227, ~93M nonzeros) with
   :func:`dl1.datasets.make_e2006_like`; report wall time, MB/s written (store bytes on disk
   over wall time), nonzeros/s, store size and peak RSS.
2. Write the train split of the ``tfidf`` preset as an svmlight file (scikit-learn's
   ``dump_svmlight_file``), then ingest it with :func:`dl1.io.svmlight.from_svmlight` and load
   it with scikit-learn's ``load_svmlight_file``; report MB/s of text, peak RSS and ratios.

Every measured run is a fresh child process (``python bench_store.py --_child ...``) that
reports its own wall time and peak RSS (``VmHWM`` of /proc/self/status: the high-water mark
of the resident set, interpreter and imports included; the peak after the imports is
reported as the baseline). With ``--repeat N`` the medians of N runs are shown.

Example::

    python benchmarks/bench_store.py --out-dir /tmp/dl1-bench --repeat 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_RESULT = "BENCH-RESULT "
_ROOT = Path(__file__).resolve().parents[1]


# -------------------------------------------------------------------------- children
def _rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB.

    ``VmHWM`` of /proc/self/status is the high-water mark of this process's own address
    space; ``ru_maxrss`` is not used on Linux because it keeps the parent's RSS across
    ``fork``/``exec`` (it would report the benchmark driver's memory).
    """
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one measured task in this (fresh) process."""
    kind = spec["kind"]
    if kind == "generate":
        import numpy as np

        from dl1.datasets import make_e2006_like

        base = _rss_mb()
        t0 = time.perf_counter()
        store = make_e2006_like(
            spec["dst"], spec["preset"], seed=spec["seed"], overwrite=True, dtype=np.float64
        )
        wall = time.perf_counter() - t0
        nnz = sum(store.nnz(s) for s in store.splits)
        return {"wall": wall, "nnz": nnz, "rss_base": base, "rss_peak": _rss_mb()}
    if kind == "dl1_ingest":
        from dl1.io.svmlight import from_svmlight

        base = _rss_mb()
        t0 = time.perf_counter()
        store = from_svmlight(spec["src"], spec["dst"], n_features=spec["p"], overwrite=True)
        wall = time.perf_counter() - t0
        return {"wall": wall, "nnz": store.nnz(), "rss_base": base, "rss_peak": _rss_mb()}
    if kind == "sklearn_load":
        import numpy as np
        from sklearn.datasets import load_svmlight_file

        base = _rss_mb()
        t0 = time.perf_counter()
        X, _ = load_svmlight_file(spec["src"], n_features=spec["p"], dtype=np.float64)
        wall = time.perf_counter() - t0
        return {"wall": wall, "nnz": int(X.nnz), "rss_base": base, "rss_peak": _rss_mb()}
    raise ValueError(f"unknown child task {kind!r}")


def _run_child(spec: dict[str, Any]) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--_child", json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    for line in proc.stdout.splitlines():
        if line.startswith(_RESULT):
            return json.loads(line[len(_RESULT) :])
    raise RuntimeError(
        f"child {spec['kind']} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    )


def _median_runs(spec: dict[str, Any], repeat: int) -> dict[str, Any]:
    runs = [_run_child(spec) for _ in range(repeat)]
    out = {k: statistics.median(r[k] for r in runs) for k in ("wall", "rss_base", "rss_peak")}
    out["nnz"] = runs[0]["nnz"]
    out["walls"] = [r["wall"] for r in runs]
    return out


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# ----------------------------------------------------------------------------- parts
def _warm_up(out: Path) -> None:
    """Fill the numba on-disk caches (generator, writer and svmlight kernels) so that no
    measured run includes compilation."""
    print("warming up (numba caches)", flush=True)
    dst = out / "warmup.dl1"
    _run_child({"kind": "generate", "preset": "small", "seed": 0, "dst": str(dst)})
    src = out / "warmup.svm"
    src.write_text("1.5 1:0.5 3:2\n-1 2:1.25\n", encoding="ascii")
    try:
        _run_child(
            {"kind": "dl1_ingest", "src": str(src), "dst": str(out / "warmup-in.dl1"), "p": 3}
        )
    except RuntimeError:
        pass  # reported by the ingest part
    for d in (dst, out / "warmup-in.dl1"):
        shutil.rmtree(d, ignore_errors=True)
    src.unlink()


def bench_generate(presets: list[str], out: Path, repeat: int) -> list[dict[str, Any]]:
    rows = []
    for preset in presets:
        dst = out / f"{preset}.dl1"
        print(f"generating {preset} ({repeat}x) -> {dst}", flush=True)
        r = _median_runs({"kind": "generate", "preset": preset, "seed": 0, "dst": str(dst)}, repeat)
        size = _du(dst)
        r.update(preset=preset, path=str(dst), bytes=size)
        rows.append(r)
    return rows


def _write_svmlight(store_path: Path, dst: Path) -> dict[str, Any]:
    import scipy.sparse as sp
    from sklearn.datasets import dump_svmlight_file

    from dl1.store import open_store

    store = open_store(store_path)
    rb, cb = store.row_bounds(), store.col_bounds()
    X = sp.vstack(
        [
            sp.hstack([store.read_block("train", i, j) for j in range(len(cb) - 1)], format="csr")
            for i in range(len(rb) - 1)
        ],
        format="csr",
    )
    y = store.read("y")
    t0 = time.perf_counter()
    dump_svmlight_file(X, y, os.fspath(dst), zero_based=False)
    return {"wall": time.perf_counter() - t0, "nnz": int(X.nnz), "p": int(X.shape[1])}


def bench_ingest(preset: str, out: Path, repeat: int, gen_rows: list[dict[str, Any]]):
    try:
        from dl1.io.svmlight import from_svmlight  # noqa: F401
    except ImportError as e:
        return {"unavailable": f"dl1.io.svmlight.from_svmlight is not available ({e})"}
    store_path = out / f"{preset}.dl1"
    if not any(r["preset"] == preset for r in gen_rows):
        gen_rows.append(bench_generate([preset], out, 1)[0])
    src = out / f"{preset}-train.svm"
    print(f"writing {src} (sklearn dump_svmlight_file)", flush=True)
    dump = _write_svmlight(store_path, src)
    text = src.stat().st_size
    res: dict[str, Any] = {"preset": preset, "src": str(src), "bytes": text, "dump": dump}
    print(f"ingesting {src} with dl1 ({repeat}x)", flush=True)
    spec = {"src": str(src), "dst": str(out / f"{preset}-ingested.dl1"), "p": dump["p"]}
    res["dl1"] = _median_runs({"kind": "dl1_ingest", **spec}, repeat)
    res["dl1"]["bytes_out"] = _du(out / f"{preset}-ingested.dl1")
    print(f"loading {src} with scikit-learn ({repeat}x)", flush=True)
    res["sklearn"] = _median_runs({"kind": "sklearn_load", **spec}, repeat)
    return res


# ---------------------------------------------------------------------------- report
def _table(headers: list[str], rows: list[list[str]]) -> str:
    w = [max(len(h), *(len(r[k]) for r in rows)) for k, h in enumerate(headers)]
    line = "  ".join(h.rjust(w[k]) for k, h in enumerate(headers))
    sep = "  ".join("-" * x for x in w)
    body = ["  ".join(c.rjust(w[k]) for k, c in enumerate(r)) for r in rows]
    return "\n".join([line, sep, *body])


def report(gen: list[dict[str, Any]], ing: dict[str, Any] | None, repeat: int) -> str:
    import numpy as np
    import scipy

    import dl1

    mb = 1e6
    out = [
        f"dl1 {dl1.__version__}, Python {platform.python_version()}, numpy {np.__version__}, "
        f"scipy {scipy.__version__}, {os.cpu_count()} CPUs; medians of {repeat} run(s); "
        "peak RSS = VmHWM of the child process (base = after imports)",
        "",
        "Synthetic generation (make_e2006_like, train + test splits)",
    ]
    rows = [
        [
            r["preset"],
            f"{r['nnz']:,}",
            f"{r['wall']:.1f}",
            f"{r['bytes'] / mb:,.1f}",
            f"{r['bytes'] / mb / r['wall']:.1f}",
            f"{r['nnz'] / r['wall'] / 1e6:.2f}",
            f"{r['rss_peak']:,.0f} ({r['rss_base']:,.0f})",
        ]
        for r in gen
    ]
    out.append(
        _table(
            ["preset", "nnz", "wall s", "store MB", "MB/s", "M nnz/s", "peak RSS MB (base)"],
            rows,
        )
    )
    out.append("")
    if ing is None:
        return "\n".join(out)
    if "unavailable" in ing:
        out.append(f"svmlight ingest: unavailable: {ing['unavailable']}")
        return "\n".join(out)
    text = ing["bytes"]
    out.append(
        f"svmlight ingest of the {ing['preset']} train split: {text / mb:,.0f} MB of text, "
        f"{ing['dump']['nnz']:,} nnz (file written by sklearn dump_svmlight_file in "
        f"{ing['dump']['wall']:.1f} s)"
    )
    rows = []
    for name, key in (
        ("dl1 from_svmlight -> store", "dl1"),
        ("sklearn load_svmlight_file", "sklearn"),
    ):
        r = ing[key]
        rows.append(
            [
                name,
                f"{r['wall']:.1f}",
                f"{text / mb / r['wall']:.1f}",
                f"{r['nnz'] / r['wall'] / 1e6:.2f}",
                f"{r['rss_peak']:,.0f} ({r['rss_base']:,.0f})",
            ]
        )
    out.append(_table(["reader", "wall s", "text MB/s", "M nnz/s", "peak RSS MB (base)"], rows))
    d, s = ing["dl1"], ing["sklearn"]
    out.append(
        f"ratio dl1 / sklearn: speed x{s['wall'] / d['wall']:.2f}, peak RSS "
        f"x{d['rss_peak'] / s['rss_peak']:.2f} (above base: "
        f"x{(d['rss_peak'] - d['rss_base']) / max(s['rss_peak'] - s['rss_base'], 1e-9):.2f}); "
        f"dl1 store on disk {d['bytes_out'] / mb:,.0f} MB"
    )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=(
            "Benchmark dl1 store writing: generation of E2006-like presets (wall time, MB/s, "
            "nnz/s, size on disk, peak RSS) and svmlight ingest against scikit-learn."
        )
    )
    ap.add_argument(
        "--out-dir",
        default=None,
        help="directory for the stores and the svmlight file (default: a temporary directory, "
        "removed at the end)",
    )
    ap.add_argument(
        "--presets",
        nargs="*",
        default=["log1p"],
        help="presets to generate and time (default: log1p)",
    )
    ap.add_argument(
        "--ingest-preset",
        default="tfidf",
        help="preset whose train split is written as svmlight and ingested (default: tfidf)",
    )
    ap.add_argument("--no-ingest", action="store_true", help="skip the svmlight ingest part")
    ap.add_argument("--repeat", type=int, default=1, help="runs per measurement (medians)")
    ap.add_argument("--json", default=None, help="also write the raw results to this file")
    ap.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if str(_ROOT) not in sys.path:
        sys.path.insert(0, str(_ROOT))  # run from a checkout without installing dl1
    if args._child is not None:
        print(_RESULT + json.dumps(_child(json.loads(args._child))), flush=True)
        return 0
    if args.repeat < 1:
        ap.error("--repeat must be >= 1")
    tmp = None
    if args.out_dir is None:
        tmp = tempfile.mkdtemp(prefix="dl1-bench-store-")
        out = Path(tmp)
    else:
        out = Path(args.out_dir)
        out.mkdir(parents=True, exist_ok=True)
    try:
        _warm_up(out)
        gen = bench_generate(args.presets, out, args.repeat)
        ing = None if args.no_ingest else bench_ingest(args.ingest_preset, out, args.repeat, gen)
        print()
        print(report(gen, ing, args.repeat))
        if args.json:
            Path(args.json).write_text(json.dumps({"generate": gen, "ingest": ing}, indent=1))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
