"""Peak memory of the svmlight ingest on a file ten times larger than its stated bound."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dl1.io.svmlight import memory_bound

CHILD = Path(__file__).with_name("_ingest_rss_child.py")
BATCH_BYTES = 1 << 20
BLOCK_NNZ = 1 << 18
P = 1 << 17


def line_block(rng: np.random.Generator, n_rows: int) -> tuple[bytes, np.ndarray, np.ndarray]:
    """``n_rows`` one-based lines of about 100 features; returns text, labels, column counts."""
    lines, labels = [], []
    col_nnz = np.zeros(P, dtype=np.int64)
    for r in range(n_rows):
        k = int(rng.integers(60, 140))
        idx = np.unique(rng.integers(0, P, k))
        if r == 0:
            idx = np.union1d(idx, [P - 1])  # the largest index fixes n_features
        col_nnz[idx] += 1
        vals = np.round(rng.standard_normal(idx.size), 6)
        label = float(np.round(rng.standard_normal(), 3))
        labels.append(label)
        feats = " ".join(
            f"{i}:{v!r}" for i, v in zip((idx + 1).tolist(), vals.tolist(), strict=True)
        )
        lines.append(f"{label!r} {feats}\n")
    return "".join(lines).encode(), np.array(labels), col_nnz


@pytest.mark.slow
def test_ingest_peak_rss_is_below_the_stated_bound(tmp_path):
    block, y_block, col_nnz_block = line_block(np.random.default_rng(0), 2000)
    rows_block = len(y_block)
    nnz_block = int(col_nnz_block.sum())
    # the bound grows by 16 bytes per row: solve size >= 10 * bound(size)
    per_byte = 10 * 16 * rows_block / len(block)
    fixed = memory_bound(BATCH_BYTES, BLOCK_NNZ, P, 0)
    reps = int(np.ceil(10 * fixed / (1 - per_byte) / len(block))) + 1
    n_rows = reps * rows_block
    bound = memory_bound(BATCH_BYTES, BLOCK_NNZ, P, n_rows)
    src = tmp_path / "big.svm"
    with open(src, "wb") as fh:
        for _ in range(reps):
            fh.write(block)
    size = src.stat().st_size
    assert size >= 10 * bound
    warm = tmp_path / "warm.svm"
    warm.write_bytes(block[: block.index(b"\n", 50_000) + 1])
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    try:
        proc = subprocess.run(
            [
                sys.executable,
                str(CHILD),
                str(src),
                str(tmp_path / "store"),
                str(warm),
                str(tmp_path / "warm_store"),
                str(tmp_path / "out.npz"),
                str(BATCH_BYTES),
                str(BLOCK_NNZ),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=900,
        )
    finally:
        src.unlink()
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    delta = (report["peak_kb"] - report["baseline_kb"]) * 1024
    print(
        f"\nfile {size / 2**20:.0f} MiB, {n_rows} rows, {reps * nnz_block} nnz; "
        f"stated bound {bound / 2**20:.1f} MiB; baseline {report['baseline_kb'] / 1024:.0f} MiB, "
        f"peak {report['peak_kb'] / 1024:.0f} MiB, delta {delta / 2**20:.1f} MiB "
        f"(hwm reset: {report['hwm_reset']}); ingest {report['seconds']:.1f} s "
        f"({size / 1e6 / report['seconds']:.0f} MB/s), blocks {report['n_blocks']}"
    )
    assert delta < bound
    assert report["shape"] == [n_rows, P]
    assert report["nnz"] == reps * nnz_block
    out = np.load(tmp_path / "out.npz")
    np.testing.assert_array_equal(out["y"], np.tile(y_block, reps))
    np.testing.assert_array_equal(out["col_nnz"], reps * col_nnz_block)
