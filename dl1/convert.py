"""Getting data into dl1 stores and out again: scipy, dask (sparse or dense chunks), zarr."""

from __future__ import annotations

import os
from typing import Any

import dask
import dask.array as da
import numpy as np
import scipy.sparse as sp

from dl1.chunks import as_csc, as_csr
from dl1.errors import ValidationError
from dl1.kernels import store as store_kernels
from dl1.runtime.connection import connected
from dl1.store import Store, StoreWriter, open_store
from dl1.store.format import CHUNK_ELEMS, DTYPES, FORMATS, block_digest, write_array
from dl1.store.location import Location
from dl1.store.reader import ChunkType
from dl1.store.split_writer import DEFAULT_BLOCK_NNZ, check_finite, write_block
from dl1.store.upload import open_written, remove_staging, staging_dir, upload_tree


def open(  # noqa: A001 - the library's entry point, like zarr.open
    path: str | os.PathLike,
    split: str = "train",
    *,
    fmt: str | None = None,
    chunk_type: ChunkType = "scipy",
    storage_options: dict[str, Any] | None = None,
) -> tuple[da.Array, da.Array]:
    """Open a dl1 store as ``(X, y)`` dask arrays.

    Parameters
    ----------
    path : str, PathLike, URL, zarr store or Location
        A store written by dl1 (refused if its manifest is missing or a chunk is missing or
        truncated), as :func:`dl1.store.open_store` takes it.
    split : str
        ``"train"`` or ``"test"``.
    fmt : {"csc", "csr"}, optional
        Stored format of the blocks to read (default: the first one stored).
    chunk_type : {"scipy", "sparse", "dense"}
        Chunks as scipy.sparse matrices, pydata ``sparse.GCXS`` arrays, or dense ndarrays.
    storage_options : dict, optional
        Options of a URL's filesystem (credentials from the environment by default).

    Returns
    -------
    X : dask.array.Array
        One chunk per stored block, read (and verified) lazily where the task runs.
    y : dask.array.Array
        Target, chunked like the row blocks of X.
    """
    store = open_store(path, storage_options)
    return store.to_dask(split, fmt, chunk_type), store.vector_dask("y", split)


def _canonical_csr(X: Any) -> sp.csr_matrix:
    X = as_csr(X)
    if not X.has_canonical_format:
        # Duplicates in scipy mean "sum"; sorting and summing on a copy keeps the meaning.
        X = X.copy()
        X.sum_duplicates()
    return X


def _writer(
    dst: str | os.PathLike,
    source: str,
    overwrite: bool,
    attrs: dict[str, Any] | None,
    storage_options: dict[str, Any] | None,
) -> StoreWriter:
    """The writer of a new store at ``dst`` whose ``source`` attribute names where its data
    came from (the caller's ``attrs`` added)."""
    return StoreWriter(dst, overwrite=overwrite, attrs={"source": source, **(attrs or {})},
                       storage_options=storage_options)  # fmt: skip


def from_scipy(
    X: Any,
    y: Any,
    dst: str | os.PathLike,
    *,
    sample_weight: Any = None,
    X_test: Any = None,
    y_test: Any = None,
    block_nnz: int = DEFAULT_BLOCK_NNZ,
    n_feature_blocks: int | None = None,
    col_bounds: Any = None,
    row_block_rows: int | None = None,
    formats: tuple[str, ...] = ("csc",),
    overwrite: bool = False,
    attrs: dict[str, Any] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Store:
    """Write an in-memory scipy.sparse (or dense) matrix and its target into a new store.

    The matrix is streamed through the same out-of-core writer as the other sources, in row
    batches of about ``block_nnz`` nonzeros; the user's arrays are never modified.

    Parameters
    ----------
    dst : str, PathLike or URL
        The new store: a path or a URL (``s3://``, ``gs://``, ``abfs://``, ``memory://``,
        ``file://``), as :class:`~dl1.store.StoreWriter` takes it, with ``storage_options``.

    Returns
    -------
    Store
        The opened store.
    """
    with _writer(dst, "scipy", overwrite, attrs, storage_options) as w:
        for split, A, b, sw_ in (("train", X, y, sample_weight), ("test", X_test, y_test, None)):
            if A is None:
                continue
            A = _canonical_csr(A)
            if A.dtype not in DTYPES:
                raise ValidationError(
                    f"unsupported dtype {A.dtype}; stores hold float32 or float64 "
                    "(cast explicitly, e.g. X.astype(np.float64))"
                )
            b = np.asarray(b)
            if b.shape[0] != A.shape[0]:
                raise ValidationError(f"{split}: y has {b.shape[0]} values for {A.shape[0]} rows")
            s = w.split(
                split,
                n_features=A.shape[1],
                dtype=A.dtype,
                block_nnz=block_nnz,
                n_feature_blocks=n_feature_blocks,
                col_bounds=col_bounds,
                row_block_rows=row_block_rows,
                formats=formats,
                has_sample_weight=sw_ is not None,
            )
            row_nnz = np.diff(A.indptr)
            cum = np.cumsum(row_nnz)
            r = 0
            while r < A.shape[0] or (r == 0 and A.shape[0] == 0):
                r_end = int(np.searchsorted(cum, (cum[r - 1] if r else 0) + block_nnz, "right"))
                r_end = min(max(r_end, r + 1), A.shape[0])
                s.append(
                    A[r:r_end],
                    b[r:r_end],
                    None if sw_ is None else np.asarray(sw_)[r:r_end],
                )
                if A.shape[0] == 0:
                    break
                r = r_end
            s.close()
    return open_written(w.destination)


def _chunk_to_csc(chunk: Any) -> sp.csc_matrix:
    m = as_csc(chunk)
    if not m.has_canonical_format:
        m = m.copy()
        m.sum_duplicates()
    return m


def _write_dask_chunk_reported(*args: Any) -> dict[str, Any]:
    """:func:`_write_dask_chunk`, its error returned (``{"error": exc}``) instead of raised:
    the caller raises it once every block's task has ended, so that no writer is still
    writing when the failed store is removed (and an ``overwrite`` retry finds it gone)."""
    try:
        return _write_dask_chunk(*args)
    except Exception as exc:
        return {"error": exc}


def _write_dask_chunk(
    chunk: Any,
    root: str | Location,
    split: str,
    formats: tuple[str, ...],
    i: int,
    j: int,
    r0: int,
    c0: int,
    dtype: str,
    chunk_elems: int,
) -> dict[str, Any]:
    """Validate and write one dask chunk as block ``(i, j)``; runs on a worker. At a URL
    the block is written to a private local directory and uploaded from there (the names
    and sizes of its files are returned under ``"files"``)."""
    if isinstance(root, Location):
        tmp = staging_dir()
        try:
            out = _write_dask_chunk(
                chunk, os.fspath(tmp), split, formats, i, j, r0, c0, dtype, chunk_elems
            )
            out["files"] = upload_tree(tmp, root)
        finally:
            remove_staging(tmp)
        return out
    m = _chunk_to_csc(chunk)
    if m.dtype != np.dtype(dtype):
        raise ValidationError(f"block ({i}, {j}) has dtype {m.dtype}, the array says {dtype}")
    indptr = m.indptr.astype(np.int64)
    indices = m.indices.astype(np.int32)
    status, c, k = store_kernels.check_compressed(indptr, indices, m.data, m.shape[0])
    if status != store_kernels.OK:
        row = f"row {r0 + int(indices[k])}, " if status != store_kernels.BAD_INDPTR else ""
        raise ValidationError(
            f"block ({i}, {j}), {row}column {c0 + c}: {store_kernels.PROBLEMS[status]}"
        )
    out: dict[str, Any] = {}
    tie = block_digest(indptr, indices, m.data, m.shape, "csc") if len(formats) > 1 else None
    for f in formats:
        if f == "csc":
            arrs = (indptr, indices, m.data)
        else:
            r = m.tocsr()
            r.sort_indices()
            arrs = (r.indptr.astype(np.int64), r.indices.astype(np.int32), r.data)
        out[f] = write_block(root, split, f, i, j, *arrs, chunk_elems=chunk_elems, content=tie)
    sq = m.copy()
    sq.data = np.square(sq.data, dtype=np.float64)
    out["col_nnz"] = np.diff(indptr)
    out["col_sum"] = np.asarray(m.sum(axis=0, dtype=np.float64)).ravel()
    out["col_sqsum"] = np.asarray(sq.sum(axis=0)).ravel()
    out["row_nnz"] = np.bincount(indices, minlength=m.shape[0]).astype(np.int64)
    return out


def _written(tasks: list[list[Any]], client: Any) -> list[list[dict[str, Any]]]:
    """Each write task's report, run on ``client`` (an address: connected to for the
    writes) or on the local threaded scheduler; every writer ends (its block or its error)
    before an error is raised."""
    with connected(client) as client:
        if client is None:
            (results,) = dask.compute(tasks, scheduler="threads")
            return results
        futures = [client.compute(row) for row in tasks]
        client.gather([f for row in futures for f in row], errors="skip")
        return [client.gather(row) for row in futures]


def from_dask(
    X: da.Array,
    y: Any,
    dst: str | os.PathLike,
    *,
    sample_weight: Any = None,
    split: str = "train",
    formats: tuple[str, ...] = ("csc",),
    client: Any = None,
    overwrite: bool = False,
    attrs: dict[str, Any] | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Store:
    """Write a dask array (scipy.sparse, pydata sparse or dense chunks) into a new store.

    Every chunk of X becomes one block, written by the task that computes it (on a worker
    when ``client`` is given), so the matrix never passes through the client; only the
    length-n vectors and per-column statistics (O(n + p)) do. A dense zarr array enters as
    ``dask.array.from_zarr(...)``.

    At a URL (``s3://``, ``gs://``, ``abfs://``, ``memory://``), each task uploads its
    block itself (staged in a private local directory of its worker), the client stages
    and uploads the rest, and the manifest goes last. With ``overwrite=True`` an old store
    at the URL is refused from the start (its manifest is deleted before blocks are
    written over it).

    Parameters
    ----------
    dst : str, PathLike or URL
        The new store, with ``storage_options`` for a URL (credentials from the
        environment by default; the workers need them too).
    client : distributed.Client or str, optional
        Where to run the writes (a scheduler's address is connected to for them).
        Without it the local threaded scheduler is used; a global client is never picked
        up silently.
    """
    if not isinstance(X, da.Array) or X.ndim != 2:
        raise ValidationError("X must be a 2-D dask array")
    if np.dtype(X.dtype) not in DTYPES:
        raise ValidationError(f"unsupported dtype {X.dtype}; stores hold float32 or float64")
    if any(f not in FORMATS for f in formats):
        raise ValueError(f"formats must be a subset of {FORMATS}, got {formats}")
    if any(np.isnan(c) for cs in X.chunks for c in cs):
        raise ValidationError("X has unknown chunk sizes; call X.compute_chunk_sizes() first")
    n, p = X.shape
    y = np.asarray(y.compute() if isinstance(y, da.Array) else y, dtype=np.float64).ravel()
    if y.shape[0] != n:
        raise ValidationError(f"y has {y.shape[0]} values for {n} rows of X")
    check_finite(y, "y", split, 0)
    w = None
    if sample_weight is not None:
        w = sample_weight.compute() if isinstance(sample_weight, da.Array) else sample_weight
        w = np.asarray(w, dtype=np.float64).ravel()
        if w.shape[0] != n:
            raise ValidationError(f"sample_weight has {w.shape[0]} values for {n} rows of X")
        check_finite(w, "sample_weight", split, 0)
        if (w < 0).any():
            raise ValidationError(
                f"split {split!r}, row {int(np.flatnonzero(w < 0)[0])}: negative sample_weight"
            )
    # The writer owns the root group, the manifest and cleanup; blocks come from the tasks.
    with _writer(dst, "dask", overwrite, attrs, storage_options) as sw:
        path = sw.path
        target = os.fspath(path) if sw.remote is None else sw.claim_for_tasks()
        rb = np.concatenate([[0], np.cumsum(X.chunks[0])]).astype(np.int64)
        cb = np.concatenate([[0], np.cumsum(X.chunks[1])]).astype(np.int64)
        delayed = X.to_delayed()
        tasks = [
            [
                dask.delayed(_write_dask_chunk_reported, pure=False)(
                    delayed[i, j],
                    target,
                    split,
                    tuple(formats),
                    i,
                    j,
                    int(rb[i]),
                    int(cb[j]),
                    np.dtype(X.dtype).str,
                    sw.chunk_elems,
                )
                for j in range(len(cb) - 1)
            ]
            for i in range(len(rb) - 1)
        ]
        results = _written(tasks, client)
        for res in (res for row in results for res in row):
            if "error" in res:  # the first block's in block order, every writer done
                raise res["error"]
        stats = {
            k: np.zeros(p, dtype=np.int64 if k == "col_nnz" else np.float64)
            for k in ("col_nnz", "col_sum", "col_sqsum")
        }
        row_nnz = np.zeros(n, dtype=np.int64)
        for i, row in enumerate(results):
            for j, res in enumerate(row):
                if "files" in res:
                    sw.adopt(res["files"])
                for k in stats:
                    stats[k][cb[j] : cb[j + 1]] += res[k]
                row_nnz[rb[i] : rb[i + 1]] += res["row_nnz"]
        root = os.fspath(path)
        ce = sw.chunk_elems
        arrays = {
            "y": write_array(root, f"{split}/y", y, chunk_elems=ce),
            **{
                f"stats/{k}": write_array(root, f"{split}/stats/{k}", v, chunk_elems=ce)
                for k, v in stats.items()
            },
            "stats/row_nnz": write_array(root, f"{split}/stats/row_nnz", row_nnz, chunk_elems=ce),
        }
        if w is not None:
            arrays["sample_weight"] = write_array(root, f"{split}/sample_weight", w, chunk_elems=ce)
        sw.register_split(
            split,
            {
                "shape": [int(n), int(p)],
                "nnz": int(stats["col_nnz"].sum()),
                "dtype": np.dtype(X.dtype).str,
                "formats": list(formats),
                "row_bounds": rb.tolist(),
                "col_bounds": cb.tolist(),
                "has_sample_weight": w is not None,
                "blocks": {f: [[res[f] for res in row] for row in results] for f in formats},
                "arrays": arrays,
            },
        )
    return open_written(sw.destination)


__all__ = ["CHUNK_ELEMS", "from_dask", "from_scipy", "open"]
