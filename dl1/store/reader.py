"""Opening and reading dl1 stores, eagerly or as lazy dask arrays.

A store is read from a local folder or from any filesystem fsspec reaches
(:class:`~dl1.store.location.Location`). Task graphs carry the location, not data: each
task reads and verifies its blocks where it runs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import dask
import numpy as np
import scipy.sparse as sp
from dask.base import tokenize

from dl1.chunks import as_csc
from dl1.errors import IncompleteStoreError, StoreCorruptError, StoreError
from dl1.kernels import store as store_kernels
from dl1.store.arrays import (
    _check_chunks_present,
    _check_listing,
    _location,
    _prefetch,
    read_array,
)
from dl1.store.format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST,
    block_digest,
    block_key,
    n_chunks,
)
from dl1.store.location import Location, NotRegularFileError, OversizeObjectError, as_location
from dl1.store.manifest import MAX_MANIFEST_BYTES, validate_manifest

if TYPE_CHECKING:  # workers reading blocks import this module: no dask.array there
    import dask.array as da

ChunkType = Literal["scipy", "sparse", "dense"]
#: Objects a remote store may hold besides its arrays' chunks and metadata (groups,
#: manifest, attributes): more than this (and twice the arrays' objects) is refused.
MAX_OTHER_OBJECTS = 1000


def _load_manifest(loc: Location) -> dict[str, Any]:
    if not loc.isdir():
        raise FileNotFoundError(f"no dl1 store at {loc}")
    mf = loc.display(MANIFEST)
    try:
        size = loc.size(MANIFEST)
    except (FileNotFoundError, NotADirectoryError):
        size = None
    if size is None:
        raise IncompleteStoreError(
            f"{loc} has no {MANIFEST}: the store was not completely written (the writer was "
            "interrupted or failed) or it is not a dl1 store; write it again"
        )
    if size > MAX_MANIFEST_BYTES:
        raise StoreCorruptError(
            f"{mf} has {size:,} bytes, more than the {MAX_MANIFEST_BYTES:,} a dl1 manifest may "
            "have (about 60,000 blocks); refused before parsing"
        )
    try:
        text = loc.read(MANIFEST, MAX_MANIFEST_BYTES)
        manifest = json.loads(text)
    except OversizeObjectError:  # grew since the stat
        raise StoreCorruptError(f"{mf} has more than {MAX_MANIFEST_BYTES:,} bytes") from None
    except NotRegularFileError as e:
        raise StoreCorruptError(f"the manifest {e}") from None
    except (OSError, ValueError, RecursionError) as e:
        raise IncompleteStoreError(f"{mf} is unreadable or truncated: {e}") from e
    if not isinstance(manifest, dict):
        raise StoreCorruptError(f"{mf} does not hold a JSON object")
    if manifest.get("format") != FORMAT_NAME:
        raise StoreError(f"{loc} is not a {FORMAT_NAME} store (format={manifest.get('format')!r})")
    version = manifest.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise StoreError(
            f"{loc} has format version {version!r}; this dl1 reads versions <= {FORMAT_VERSION}"
        )
    return validate_manifest(manifest, str(loc))


def _array_entries(split: str, entry: dict[str, Any]):
    """(key, array manifest entry) of every array of a split."""
    for name, a in entry["arrays"].items():
        yield f"{split}/{name}", a
    for fmt, rows in entry["blocks"].items():
        for i, row in enumerate(rows):
            for j, blk in enumerate(row):
                for name, a in blk["arrays"].items():
                    yield f"{block_key(split, fmt, i, j)}/{name}", a


def read_block_arrays(
    root: str | os.PathLike,
    split: str,
    fmt: str,
    i: int,
    j: int,
    blk: dict[str, Any],
    shape: tuple[int, int],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Verified ``(indptr, indices, data)`` of block ``(i, j)``.

    Besides the checksums, the structure is checked before any kernel sees the arrays:
    the index pointer, indices inside the block, sorted and unique, and finite values.
    """
    key = block_key(split, fmt, i, j)
    loc = _location(root)
    names = ("indptr", "indices", "data")
    got = None  # a remote block's objects: fetched at once, not one request after another
    if not loc.is_local:
        got = _prefetch(loc, [(f"{key}/{name}", blk["arrays"][name]) for name in names])
    indptr, indices, data = (
        read_array(loc, f"{key}/{name}", blk["arrays"][name], prefetched=got) for name in names
    )
    n_major, n_minor = (shape[1], shape[0]) if fmt == "csc" else shape
    if indptr.shape[0] != n_major + 1 or indices.shape[0] != blk["nnz"]:
        raise StoreCorruptError(
            f"block {key!r}: index pointer of length {indptr.shape[0]} / {indices.shape[0]} "
            f"nonzeros do not match the block grid ({n_major} major, nnz {blk['nnz']})"
        )
    status, m, k = store_kernels.check_compressed(indptr, indices, data, n_minor)
    if status != store_kernels.OK:
        problem = store_kernels.PROBLEMS[status]
        if status == store_kernels.BAD_INDPTR:
            problem = store_kernels.indptr_problem(indptr, indices.shape[0], data.shape[0])
        else:
            problem += f" (position {k}, index {int(indices[k])})"
        raise StoreCorruptError(
            f"block {key!r}, {'column' if fmt == 'csc' else 'row'} {m} of the block: {problem}"
        )
    if "content" in blk and block_digest(indptr, indices, data, shape, fmt) != blk["content"]:
        raise StoreCorruptError(
            f"block {key!r} does not hold the matrix its manifest's content digest records "
            "(shared by the block's CSC and CSR layouts): the layouts disagree"
        )
    return indptr, indices, data


def _to_chunk(arrs, shape, fmt: str, chunk_type: ChunkType):
    cls = sp.csc_matrix if fmt == "csc" else sp.csr_matrix
    m = cls((arrs[2], arrs[1], arrs[0]), shape=shape)
    if chunk_type == "scipy":
        return m
    if chunk_type == "dense":
        return m.toarray()
    # local: pydata sparse (~0.2 s alone) only for chunk_type="sparse"; workers need none
    import sparse

    return sparse.GCXS.from_scipy_sparse(m)


def read_block_task(root, split, fmt, i, j, blk, shape, chunk_type):
    return _to_chunk(read_block_arrays(root, split, fmt, i, j, blk, shape), shape, fmt, chunk_type)


def csc_column_range(m: Any, lo: int, hi: int, copy: bool = True) -> sp.csc_matrix:
    """Columns ``[lo, hi)`` of ``m`` (a chunk of any kind, made CSC): one contiguous run of
    entries (SciPy's general slicing takes several times longer), copied unless ``copy`` is
    False (a view keeps all of ``m`` alive: for pieces that together keep all of it)."""
    m = as_csc(m)
    a, b = int(m.indptr[lo]), int(m.indptr[hi])
    data, indices = m.data[a:b], m.indices[a:b]
    if copy:
        data, indices = data.copy(), indices.copy()
    return sp.csc_matrix((data, indices, m.indptr[lo : hi + 1] - a), shape=(m.shape[0], hi - lo))


def read_columns_task(root, split, fmt, i, j, blk, shape, lo, hi):
    """Columns ``[lo, hi)`` of stored block ``(i, j)`` as CSC: a piece of a block, read
    where the task runs (each piece by its own worker, not read once and shipped)."""
    return csc_column_range(read_block_task(root, split, fmt, i, j, blk, shape, "scipy"), lo, hi)


def _read_slice_task(root, key, entry, lo, hi):
    return read_array(root, key, entry, slice(lo, hi))


def _meta(chunk_type: ChunkType, fmt: str, dtype: np.dtype):
    if chunk_type == "dense":
        return np.empty((0, 0), dtype=dtype)
    m = (sp.csc_matrix if fmt == "csc" else sp.csr_matrix)((0, 0), dtype=dtype)
    if chunk_type == "scipy":
        return m
    # local: pydata sparse (~0.2 s alone) only for chunk_type="sparse"; workers need none
    import sparse

    return sparse.GCXS.from_scipy_sparse(m)


class Store:
    """An opened dl1 store: manifest, verified eager reads, and lazy dask arrays.

    Made by :func:`open_store`. Cheap to pickle: the manifest and the store's
    :class:`~dl1.store.location.Location` (a path, or a URL and its storage options).
    """

    def __init__(self, path: str | os.PathLike | Location, manifest: dict[str, Any]) -> None:
        self.location = _location(path)
        self.manifest = manifest

    @property
    def path(self) -> Path | str:
        """The store's folder (a Path), or for a store on a remote filesystem its URL as
        shown in messages (no credentials)."""
        loc = self.location
        return loc.path if loc.is_local else loc.display()

    @property
    def root(self) -> str | Location:
        """What task graphs carry to read the store where they run: the folder's path, or
        the :class:`~dl1.store.location.Location` (URL and storage options)."""
        loc = self.location
        return loc.url if loc.is_local else loc

    def __repr__(self) -> str:
        parts = [
            f"{s}: {e['shape'][0]}x{e['shape'][1]}, nnz={e['nnz']}"
            for s, e in self.manifest["splits"].items()
        ]
        return f"Store({str(self.path)!r}; " + "; ".join(parts) + ")"

    @property
    def splits(self) -> list[str]:
        return list(self.manifest["splits"])

    @property
    def attrs(self) -> dict[str, Any]:
        return self.manifest.get("attrs", {})

    def entry(self, split: str = "train") -> dict[str, Any]:
        try:
            return self.manifest["splits"][split]
        except KeyError:
            raise KeyError(
                f"store {self.path} has no split {split!r} (has {self.splits})"
            ) from None

    def shape(self, split: str = "train") -> tuple[int, int]:
        return tuple(self.entry(split)["shape"])

    def nnz(self, split: str = "train") -> int:
        return int(self.entry(split)["nnz"])

    def dtype(self, split: str = "train") -> np.dtype:
        return np.dtype(self.entry(split)["dtype"])

    def row_bounds(self, split: str = "train") -> np.ndarray:
        return np.asarray(self.entry(split)["row_bounds"], dtype=np.int64)

    def col_bounds(self, split: str = "train") -> np.ndarray:
        return np.asarray(self.entry(split)["col_bounds"], dtype=np.int64)

    def block_nnz(self, split: str = "train", fmt: str | None = None) -> np.ndarray:
        e = self.entry(split)
        fmt = fmt or e["formats"][0]
        return np.array([[b["nnz"] for b in row] for row in e["blocks"][fmt]], dtype=np.int64)

    def column_format(self, split: str = "train") -> str:
        """The format the feature-wise solvers read: CSC when stored, else the first."""
        formats = self.entry(split)["formats"]
        return "csc" if "csc" in formats else formats[0]

    def _fmt(self, split: str, fmt: str | None) -> str:
        e = self.entry(split)
        fmt = fmt or e["formats"][0]
        if fmt not in e["formats"]:
            raise ValueError(f"split {split!r} is stored as {e['formats']}, not {fmt!r}")
        return fmt

    def block_shape(self, split: str, i: int, j: int) -> tuple[int, int]:
        rb, cb = self.row_bounds(split), self.col_bounds(split)
        return int(rb[i + 1] - rb[i]), int(cb[j + 1] - cb[j])

    def read_block(
        self,
        split: str = "train",
        i: int = 0,
        j: int = 0,
        fmt: str | None = None,
        chunk_type: ChunkType = "scipy",
    ):
        """Block ``(i, j)`` as a scipy.sparse matrix (or ``chunk_type``), verified."""
        fmt = self._fmt(split, fmt)
        blk = self.entry(split)["blocks"][fmt][i][j]
        shape = self.block_shape(split, i, j)
        return read_block_task(self.root, split, fmt, i, j, blk, shape, chunk_type)

    def read_block_arrays(
        self, split: str = "train", i: int = 0, j: int = 0, fmt: str | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Verified raw ``(indptr, indices, data)`` of block ``(i, j)``."""
        fmt = self._fmt(split, fmt)
        blk = self.entry(split)["blocks"][fmt][i][j]
        return read_block_arrays(self.root, split, fmt, i, j, blk, self.block_shape(split, i, j))

    def read(self, name: str, split: str = "train") -> np.ndarray:
        """A verified split-level array: ``"y"``, ``"sample_weight"`` or ``"stats/<name>"``."""
        arrays = self.entry(split)["arrays"]
        if name not in arrays:
            raise KeyError(f"split {split!r} has no array {name!r} (has {sorted(arrays)})")
        return read_array(self.root, f"{split}/{name}", arrays[name])

    def to_dask(
        self, split: str = "train", fmt: str | None = None, chunk_type: ChunkType = "scipy"
    ) -> da.Array:
        """X as a dask array whose chunks are the stored blocks, read where the task runs."""
        if chunk_type not in ("scipy", "sparse", "dense"):
            raise ValueError(f"chunk_type must be 'scipy', 'sparse' or 'dense', got {chunk_type!r}")
        fmt = self._fmt(split, fmt)
        e = self.entry(split)
        rb, cb = self.row_bounds(split), self.col_bounds(split)
        name = f"dl1-{split}-{fmt}-" + tokenize(self.root, e, chunk_type)
        root = self.root
        dsk = {
            (name, i, j): (
                read_block_task,
                root,
                split,
                fmt,
                i,
                j,
                e["blocks"][fmt][i][j],
                self.block_shape(split, i, j),
                chunk_type,
            )
            for i in range(len(rb) - 1)
            for j in range(len(cb) - 1)
        }
        chunks = (tuple(np.diff(rb).tolist()), tuple(np.diff(cb).tolist()))
        # local: dask.array (~0.25 s, ~13 MiB to import) stays out of workers reading blocks
        import dask.array as da

        return da.Array(dsk, name, chunks, meta=_meta(chunk_type, fmt, self.dtype(split)))

    def column_piece(self, split: str, fmt: str | None, i: int, j: int, lo: int, hi: int):
        """A dask delayed of columns ``[lo, hi)`` (within the block) of stored block
        ``(i, j)``, read where it runs (:func:`read_columns_task`)."""
        fmt = self._fmt(split, fmt)
        blk = self.entry(split)["blocks"][fmt][i][j]
        args = (self.root, split, fmt, i, j, blk, self.block_shape(split, i, j))
        return dask.delayed(read_columns_task, pure=True)(*args, lo, hi)

    def vector_dask(self, name: str = "y", split: str = "train") -> da.Array:
        """A length-n split array (``y`` or ``sample_weight``) chunked like the row blocks of X."""
        arrays = self.entry(split)["arrays"]
        if name not in arrays:
            raise KeyError(f"split {split!r} has no array {name!r}")
        rb = self.row_bounds(split)
        key = f"{split}/{name}"
        tok = f"dl1-{split}-{name}-" + tokenize(self.root, arrays[name], rb)
        root = self.root
        dsk = {
            (tok, i): (_read_slice_task, root, key, arrays[name], int(rb[i]), int(rb[i + 1]))
            for i in range(len(rb) - 1)
        }
        # local: dask.array (~0.25 s, ~13 MiB to import) stays out of workers reading blocks
        import dask.array as da

        return da.Array(dsk, tok, (tuple(np.diff(rb).tolist()),), meta=np.empty(0, np.float64))


def block_memory(store: Store, split: str) -> int:
    """Bytes the feature blocks of ``split`` take in worker memory (CSC, int32 indices)."""
    p = store.shape(split)[1]
    return store.nnz(split) * (store.dtype(split).itemsize + 4) + 16 * (p + 1)


def manifest_store(
    path: str | os.PathLike | Location | Any, storage_options: dict[str, Any] | None = None
) -> Store:
    """A dl1 store with its manifest read and validated, its chunks not checked: for a
    decision made from the manifest alone (shapes, nonzeros, dtypes) by a process that will
    not read the store itself. Whoever reads it opens it with :func:`open_store`.

    Parameters
    ----------
    path, storage_options : as for :func:`open_store`.
    """
    loc = as_location(path, storage_options)
    return Store(loc, _load_manifest(loc))


def open_store(
    path: str | os.PathLike | Location | Any, storage_options: dict[str, Any] | None = None
) -> Store:
    """Open a dl1 store, refusing an incomplete one, and check that every chunk is present
    with the size the manifest records.

    Parameters
    ----------
    path : str, path-like, zarr store or Location
        A local folder, a URL fsspec reaches (``s3://``, ``gs://``, ``abfs://``,
        ``file://``, ``memory://``), or a zarr ``LocalStore`` / ``FsspecStore``.
    storage_options : dict, optional
        Options of the URL's fsspec filesystem (endpoint, credentials...). By default none:
        credentials come from the environment, as each backend looks for them. They go
        with the task graphs to the workers, which read their blocks from the store
        themselves; they are never shown in messages.

    Checking the chunks costs one ``stat`` per chunk on a local disk, one listing of the
    store on an object store.
    """
    loc = as_location(path, storage_options)
    manifest = _load_manifest(loc)
    arrays = [
        (key, a) for split, entry in manifest["splits"].items()
        for key, a in _array_entries(split, entry)
    ]  # fmt: skip
    if loc.is_local:
        resolved: dict[str, str] = {}
        for key, a in arrays:
            _check_chunks_present(loc.path, key, a, resolved)
    else:
        expected = sum(n_chunks(a) + 1 for _, a in arrays)
        listing = loc.listing(max_entries=2 * expected + MAX_OTHER_OBJECTS)
        for key, a in arrays:
            _check_listing(loc, listing, key, a)
    return Store(loc, manifest)
