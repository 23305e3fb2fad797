"""Helpers of the untrusted-store, untrusted-checkpoint and fuzz tests: small stores,
manifest edits, checksum-valid array rewrites, and running code in a child process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from dl1.store.format import MANIFEST, write_array

ROOT = Path(__file__).resolve().parents[2]
N, P = 80, 30


def make_store(
    path: Path, formats: tuple[str, ...] = ("csc",), seed: int = 1, weighted: bool = False
) -> Path:
    """A small store (80 x 30, two feature blocks, chunks of 64 elements), with sample
    weights if ``weighted``."""
    import dl1
    from dl1.store import StoreWriter
    from tests.helpers import random_csr

    X = random_csr(N, P, 0.3, seed=seed)
    y = np.random.default_rng(seed).standard_normal(N)
    with StoreWriter(path, chunk_elems=64) as w:
        sw = w.split(n_feature_blocks=2, formats=formats, has_sample_weight=weighted)
        weights = np.random.default_rng(seed + 1).uniform(0.5, 2.0, N) if weighted else None
        sw.append(X, y, weights)
        sw.close()
    assert dl1.open(path) is not None
    return path


def copy_store(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def manifest(path: Path) -> dict[str, Any]:
    return json.loads((path / MANIFEST).read_text())


def put_manifest(path: Path, m: Any) -> None:
    (path / MANIFEST).write_text(json.dumps(m))


def rewrite_array(root: Path, key: str, a: np.ndarray) -> dict[str, Any]:
    """Replace a stored array by ``a`` with valid chunk checksums; return its new entry
    (the caller puts it in the manifest, so the checksums all agree)."""
    if (root / key).exists():
        shutil.rmtree(root / key)
    return write_array(root, key, np.ascontiguousarray(a), chunk_elems=64)


def child_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **extra}
    env.pop("DL1_HEAVY", None)
    return env


def run_child(
    code: str, timeout: float, args: tuple[str, ...] = (), input: str | None = None, **env: str
) -> subprocess.CompletedProcess:
    """Run ``code`` (with ``sys.argv[1:] = args`` and ``input`` on stdin) in a fresh
    interpreter; a hang fails the test (TimeoutExpired), a crash shows as a negative return
    code."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        input=input,
        env=child_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def results(proc: subprocess.CompletedProcess) -> list[dict[str, Any]]:
    """The JSON lines a child printed (one per case)."""
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def zstd_rle_frame(decoded: int, declare: bool = True) -> bytes:
    """A valid zstd frame of ``decoded`` zero bytes made of RLE blocks (4 bytes per 128 KiB
    decoded): 4 GiB fit in 128 KiB. With ``declare=False`` the frame does not state its
    decoded size (a streaming decoder learns it only by decoding)."""
    magic = (0xFD2FB528).to_bytes(4, "little")
    if declare:  # single segment, 8-byte content size
        head = magic + bytes([0xE0]) + decoded.to_bytes(8, "little")
    else:  # no content size, a 128 KiB window
        head = magic + bytes([0x00, 0x38])
    blocks = bytearray()
    left = decoded
    while left:
        size = min(1 << 17, left)
        left -= size
        blocks += ((left == 0) | (1 << 1) | (size << 3)).to_bytes(3, "little") + b"\0"
    return head + bytes(blocks)


def put_chunk(root: Path, key: str, entry: dict[str, Any], k: int, body: bytes) -> None:
    """Replace chunk ``k`` of array ``key`` by ``body`` with a valid CRC32C, and record its
    size in the manifest ``entry`` of the array (so only decoding can tell)."""
    import crc32c

    raw = body + crc32c.crc32c(body).to_bytes(4, "little")
    (root / key / "c" / str(k)).write_bytes(raw)
    entry["chunk_bytes"][k] = len(raw)


def as_zstd(root: Path, key: str, entry: dict[str, Any]) -> None:
    """Rewrite a stored array with zstd (as earlier dl1 versions wrote), same values; its
    manifest ``entry`` gets the new chunk sizes."""
    import zarr
    from zarr.codecs import Crc32cCodec, ZstdCodec

    from dl1.store.arrays import read_array

    a = read_array(root, key, entry)
    shutil.rmtree(root / key)
    z = zarr.create_array(
        store=os.fspath(root),
        name=key,
        shape=a.shape,
        chunks=(entry["chunk"],),
        dtype=a.dtype,
        compressors=[ZstdCodec(level=3), Crc32cCodec()],
        fill_value=0,
        config={"write_empty_chunks": True},
    )
    z[:] = a
    entry["chunk_bytes"] = [
        (root / key / "c" / str(k)).stat().st_size for k in range(len(entry["chunk_bytes"]))
    ]
