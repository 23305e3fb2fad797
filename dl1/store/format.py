"""On-disk layout of a dl1 store (format ``dl1-sparse``, version 1).

A store is a directory holding a zarr v3 group::

    STORE/
      zarr.json                      root group, attributes {"dl1_format": "dl1-sparse", ...}
      dl1-manifest.json              written last and atomically; a store without it is refused
      train/                         one group per split ("train", optionally "test")
        y                            float64 (n,)
        sample_weight                float64 (n,), optional
        stats/col_nnz                int64 (p,)   nonzeros per column
        stats/col_sum                float64 (p,) sum of each column (means for implicit centering)
        stats/col_sqsum              float64 (p,) squared norm of each column
        stats/row_nnz                int64 (n,)   nonzeros per row
        X/csc/b{i}.{j}/indptr        int64 (cols_j + 1,)  block (row block i, feature block j)
        X/csc/b{i}.{j}/indices       int32 (nnz_ij,)      row indices local to the row block
        X/csc/b{i}.{j}/data          float32 or float64 (nnz_ij,)
        X/csr/b{i}.{j}/...           the same block as CSR (column indices local), if asked

Row block ``i`` covers rows ``row_bounds[i]:row_bounds[i+1]`` and feature block ``j`` covers
columns ``col_bounds[j]:col_bounds[j+1]``; both bounds are int64, so the total number of
nonzeros may exceed 2**31 while indices inside a block stay int32. Inside a block, indices
are sorted and unique and every value is finite.

Every chunk is written, empty ones included, and compressed with Blosc-LZ4 (byte shuffle
for integer arrays, none for values) followed by a CRC32C checksum codec, so a flipped bit is
detected when the chunk is decoded. LZ4 decodes at about 3 GB/s per core, against about
1 GB/s for zstd, whose better ratio on values does not pay for the time every pass spends
decoding; indices shuffled compress better with LZ4 than unshuffled with zstd. Codecs are
recorded in each array's zarr metadata, so stores written with other codecs (zstd, by
earlier versions of dl1) read just the same. The manifest records
the format version, the shape, dtype and block grid of each split, the nnz of every block,
and a CRC32C of the decoded bytes of every array; with it a missing chunk (which zarr would
silently read as zeros) or a chunk swapped between stores is detected and named.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import crc32c
import numpy as np
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec

FORMAT_NAME = "dl1-sparse"
FORMAT_VERSION = 1
MANIFEST = "dl1-manifest.json"
#: Elements per zarr chunk of the 1-D arrays (4 Mi elements: 32 MiB of float64 decoded).
CHUNK_ELEMS = 1 << 22
SPLITS = ("train", "test")
FORMATS = ("csc", "csr")
DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
STAT_NAMES = ("col_nnz", "col_sum", "col_sqsum", "row_nnz")


def block_key(split: str, fmt: str, i: int, j: int) -> str:
    """Group path of block ``(i, j)`` of a split in a given format."""
    return f"{split}/X/{fmt}/b{i}.{j}"


def checksum(a: np.ndarray) -> int:
    """CRC32C of the bytes of an array (C order)."""
    return int(crc32c.crc32c(memoryview(np.ascontiguousarray(a)).cast("B")))


def codecs(dtype: np.dtype) -> list[Any]:
    """Compressors of an array of ``dtype``: Blosc-LZ4 (byte shuffle for integers), then a
    CRC32C checksum of the compressed bytes."""
    dtype = np.dtype(dtype)
    shuffle = "shuffle" if dtype.kind in "iu" else "noshuffle"
    return [
        BloscCodec(cname="lz4", clevel=5, shuffle=shuffle, typesize=dtype.itemsize),
        Crc32cCodec(),
    ]


def write_array(
    root: str | os.PathLike, key: str, a: np.ndarray, *, chunk_elems: int = CHUNK_ELEMS
) -> dict[str, Any]:
    """Write a 1-D array under ``root/key`` with every chunk stored; return its manifest entry."""
    a = np.ascontiguousarray(a)
    chunks = (max(1, min(chunk_elems, a.shape[0])),)
    arr = zarr.create_array(
        store=os.fspath(root),
        name=key,
        shape=a.shape,
        chunks=chunks,
        dtype=a.dtype,
        compressors=codecs(a.dtype),
        fill_value=0,
        config={"write_empty_chunks": True},
        overwrite=False,
    )
    if a.shape[0]:
        arr[:] = a
    entry = {"shape": list(a.shape), "dtype": a.dtype.str, "chunk": chunks[0]}
    entry["crc32c"] = checksum(a)
    # Stored (compressed) size of every chunk: a truncated chunk is found by a stat on open.
    entry["chunk_bytes"] = [chunk_path(root, key, k).stat().st_size for k in range(n_chunks(entry))]
    return entry


def write_array_from_file(
    root: str | os.PathLike,
    key: str,
    src: str | os.PathLike,
    dtype: Any,
    *,
    chunk_elems: int = CHUNK_ELEMS,
) -> dict[str, Any]:
    """Write a raw binary file of ``dtype`` values as a 1-D array, one chunk at a time.

    Memory is one chunk, whatever the length; the checksum is accumulated chunk by chunk.
    """
    dtype = np.dtype(dtype)
    n = os.path.getsize(src) // dtype.itemsize
    with open(src, "rb") as fh:
        return write_array_pieces(
            root,
            key,
            n,
            lambda lo, hi: np.fromfile(fh, dtype=dtype, count=hi - lo),
            chunk_elems=chunk_elems,
            dtype=dtype,
        )


def write_array_pieces(
    root: str | os.PathLike,
    key: str,
    n: int,
    piece: Callable[[int, int], np.ndarray],
    *,
    chunk_elems: int = CHUNK_ELEMS,
    dtype: Any = None,
) -> dict[str, Any]:
    """Write a 1-D array of ``n`` elements whose elements ``[lo, hi)`` are ``piece(lo, hi)``,
    asked chunk after chunk in order: memory is one chunk, whatever ``n``.

    ``dtype`` defaults to the dtype of ``piece(0, 0)``.
    """
    dtype = np.dtype(piece(0, 0).dtype if dtype is None else dtype)
    chunk = max(1, min(chunk_elems, n))
    arr = zarr.create_array(
        store=os.fspath(root),
        name=key,
        shape=(n,),
        chunks=(chunk,),
        dtype=dtype,
        compressors=codecs(dtype),
        fill_value=0,
        config={"write_empty_chunks": True},
        overwrite=False,
    )
    crc = 0
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        values = np.ascontiguousarray(piece(start, stop), dtype=dtype)
        if values.shape != (stop - start,):
            raise ValueError(f"piece [{start}, {stop}) of {key!r} has shape {values.shape}")
        arr[start:stop] = values
        crc = crc32c.crc32c(memoryview(values).cast("B"), crc)
    entry = {"shape": [n], "dtype": dtype.str, "chunk": chunk, "crc32c": int(crc)}
    entry["chunk_bytes"] = [chunk_path(root, key, k).stat().st_size for k in range(n_chunks(entry))]
    return entry


def n_chunks(entry: dict[str, Any]) -> int:
    """Number of chunks an array of this manifest entry stores."""
    n = entry["shape"][0]
    return 0 if n == 0 else -(-n // entry["chunk"])


def chunk_path(root: str | os.PathLike, key: str, k: int) -> Path:
    """File of chunk ``k`` of the 1-D array ``key`` (zarr v3 default chunk key encoding)."""
    return Path(root) / key / "c" / str(k)


def write_manifest(root: str | os.PathLike, manifest: dict[str, Any], name: str = MANIFEST) -> None:
    """Write a JSON file atomically: temporary file, fsync, rename, fsync of the directory."""
    root = Path(root)
    tmp = root / (name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, root / name)
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def block_digest(
    indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, shape: tuple[int, int], fmt: str
) -> int:
    """Digest of a block's entries that its CSC and CSR layouts share: the tie between the
    two layouts of a store (:func:`dl1.kernels.store.content_digest`)."""
    # local: dl1.kernels loads numba (~0.1 s), which dl1.store.format, .manifest and .arrays
    # do without
    from dl1.kernels.store import content_digest

    data = np.ascontiguousarray(data)
    bits = data.view(np.uint64 if data.dtype.itemsize == 8 else np.uint32)
    return int(content_digest(indptr, indices, bits, int(shape[1]), fmt == "csc"))
