"""Benchmark of reading a dl1 store from an S3 server against reading it from local disk.

One store (an E2006-like preset, written by :func:`dl1.datasets.make_e2006_like` to local
disk) is uploaded to an S3-compatible server (moto's server mode, started here on
127.0.0.1, unless ``AWS_ENDPOINT_URL`` names another). Every block of the train split is
then read and verified (:meth:`dl1.store.Store.read_block`: sizes, CRC32C, bounded
decoding, structure, content digest) from each location, in this process, sequentially or
by ``--threads`` threads; each measurement is the median of ``--repeat`` passes, local and
S3 passes interleaved. Reported: blocks per second and MB/s of stored (compressed) bytes.

Local reads come from the page cache after the first pass (the store is small next to
memory): the local figure is dl1's decode-and-verify rate, the S3 figure adds the HTTP
requests (one per object: metadata and chunks, three arrays per block) to a server on the
same machine. A remote object store adds its network latency and bandwidth to that.

Example::

    python benchmarks/bench_objectstore.py --preset small --n-feature-blocks 64 --repeat 5
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any


def s3_endpoint() -> contextlib.AbstractContextManager[str]:
    """``AWS_ENDPOINT_URL``, or a moto server on 127.0.0.1 (throwaway credentials)."""
    if os.environ.get("AWS_ENDPOINT_URL"):
        return contextlib.nullcontext(os.environ["AWS_ENDPOINT_URL"])
    from dl1.testing import s3_server

    return s3_server(key="bench", secret="bench")


def stored_bytes(store: Any, split: str = "train") -> int:
    """Bytes of the chunks of the split's blocks (compressed, as stored)."""
    e = store.entry(split)
    fmt = store.column_format(split)
    return sum(
        sum(a["chunk_bytes"]) for row in e["blocks"][fmt] for blk in row
        for a in blk["arrays"].values()
    )  # fmt: skip


def read_all(store: Any, threads: int) -> float:
    """Seconds to read and verify every block of the train split."""
    fmt = store.column_format()
    ij = [(i, j) for i in range(len(store.row_bounds()) - 1)
          for j in range(len(store.col_bounds()) - 1)]  # fmt: skip
    t0 = time.perf_counter()
    if threads <= 1:
        for i, j in ij:
            store.read_block("train", i, j, fmt)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda b: store.read_block("train", b[0], b[1], fmt), ij))
    return time.perf_counter() - t0


def run(args: argparse.Namespace) -> dict[str, Any]:
    import s3fs

    from dl1.datasets import make_e2006_like
    from dl1.store import open_store

    with tempfile.TemporaryDirectory() as tmp, s3_endpoint() as endpoint:
        t0 = time.perf_counter()
        local = make_e2006_like(Path(tmp) / "s.zarr", preset=args.preset, seed=0,
                                n_feature_blocks=args.n_feature_blocks)  # fmt: skip
        write = time.perf_counter() - t0
        fs = s3fs.S3FileSystem()
        bucket = f"dl1-bench-{uuid.uuid4().hex[:8]}"
        fs.mkdir(bucket)
        try:
            t0 = time.perf_counter()
            fs.put(str(local.path), f"s3://{bucket}/s.zarr", recursive=True)
            upload = time.perf_counter() - t0
            remote = open_store(f"s3://{bucket}/s.zarr")
            n_blocks = (len(local.row_bounds()) - 1) * (len(local.col_bounds()) - 1)
            nbytes = stored_bytes(local)
            times: dict[str, list[float]] = {"local": [], "s3": []}
            read_all(local, args.threads)  # warm: imports, page cache, connections
            read_all(remote, args.threads)
            for _ in range(args.repeat):
                times["local"].append(read_all(local, args.threads))
                times["s3"].append(read_all(remote, args.threads))
        finally:
            fs.rm(bucket, recursive=True)
    out: dict[str, Any] = {
        "preset": args.preset,
        "shape": list(local.shape()),
        "nnz": local.nnz(),
        "blocks": n_blocks,
        "stored_mb": nbytes / 1e6,
        "threads": args.threads,
        "repeat": args.repeat,
        "write_s": write,
        "upload_s": upload,
        "endpoint": "moto on 127.0.0.1" if "127.0.0.1" in endpoint else "AWS_ENDPOINT_URL",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}",
    }
    for where, ts in times.items():
        med = statistics.median(ts)
        out[where] = {"median_s": med, "blocks_per_s": n_blocks / med,
                      "mb_per_s": nbytes / 1e6 / med, "runs_s": ts}  # fmt: skip
    out["s3_over_local"] = out["s3"]["median_s"] / out["local"]["median_s"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small", help="an E2006-like preset (small, tfidf)")
    parser.add_argument("--n-feature-blocks", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="threads reading blocks")
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    args = parser.parse_args()
    out = run(args)
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"{out['preset']}: {out['shape'][0]} x {out['shape'][1]}, nnz {out['nnz']:,}, "
          f"{out['blocks']} blocks, {out['stored_mb']:.1f} MB stored; {out['threads']} "
          f"thread(s), median of {out['repeat']}; {out['machine']}")  # fmt: skip
    for where in ("local", "s3"):
        r = out[where]
        print(f"  {where:5s}  {r['blocks_per_s']:8.1f} blocks/s  {r['mb_per_s']:7.1f} MB/s  "
              f"({r['median_s']:.3f} s per pass)")  # fmt: skip
    print(f"  S3 / local time: {out['s3_over_local']:.1f}x")


if __name__ == "__main__":
    main()
