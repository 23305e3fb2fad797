"""Opening and reading dl1 stores, eagerly or as lazy dask arrays.

A store is read from a local folder or from any filesystem fsspec reaches
(:class:`~dl1.store.location.Location`). Task graphs carry the location, not data: each
task reads and verifies its blocks where it runs.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import crc32c
import numcodecs
import numpy as np
import scipy.sparse as sp
import zarr
from dask.base import tokenize
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, ZstdCodec

from dl1.chunks import as_csc
from dl1.errors import ClusterStalledError, IncompleteStoreError, StoreCorruptError, StoreError
from dl1.kernels import store as store_kernels
from dl1.store import frames
from dl1.store.format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST,
    block_digest,
    block_key,
    checksum,
    chunk_path,
    n_chunks,
)
from dl1.store.location import Location, NotRegularFileError, OversizeObjectError, as_location
from dl1.store.manifest import (
    MAX_MANIFEST_BYTES,
    MAX_METADATA_BYTES,
    validate_manifest,
)

if TYPE_CHECKING:  # workers reading blocks import this module: no dask.array there
    import dask.array as da

ChunkType = Literal["scipy", "sparse", "dense"]
#: Metadata of arrays parsed by this process, by (URL, key, checksum, chunk sizes; for a
#: local file also its inode, size and modification time): a block read again (every pass
#: out of core, every fit of a path) costs its chunks' reads only.
_ARRAY_META: dict[tuple[Any, ...], Any] = {}
#: Entries of :data:`_ARRAY_META` kept (about 1 KiB each).
MAX_CACHED_METADATA = 16384
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


def _check_chunks_present(
    root: Path, key: str, a: dict[str, Any], resolved: dict[str, str] | None = None
) -> tuple[int, ...]:
    """Every chunk file of an array is a regular file inside the store, of its recorded size.

    The array's folders are resolved (a symlink out of the store is refused), each chunk
    file is ``lstat``-ed (a symlinked chunk is refused): nothing outside the store is
    opened, and whether a path outside exists is never revealed. ``resolved`` keeps the
    folders resolved so far (:func:`_resolved`), shared by the arrays of one opening.
    Returns the stamp of the array's metadata file (inode, size, modification time; empty
    when it is missing).
    """
    resolved = {} if resolved is None else resolved
    real_root = resolved.get("") or resolved.setdefault("", os.path.realpath(root))
    real = _resolved(real_root, f"{key}/c", resolved)
    if os.path.commonpath([real_root, real]) != real_root:
        raise StoreCorruptError(
            f"array {key!r} resolves to {real}, outside {real_root} (a symlink or traversal)"
        )
    folder = os.path.join(root, key)
    if n_chunks(a) and not os.path.isdir(folder):
        raise StoreCorruptError(f"array {key!r} cannot be opened: {folder} is missing")
    meta = os.path.join(folder, "zarr.json")
    try:
        mst = os.lstat(meta)
    except (FileNotFoundError, NotADirectoryError):
        mst = None  # zarr names the missing metadata when the array is opened
    if mst is not None and stat.S_ISLNK(mst.st_mode):
        raise StoreCorruptError(f"the metadata of array {key!r} is a symlink ({meta})")
    if mst is not None and not stat.S_ISREG(mst.st_mode):
        raise StoreCorruptError(f"the metadata of array {key!r} is not a regular file ({meta})")
    if mst is not None and mst.st_size > MAX_METADATA_BYTES:
        raise StoreCorruptError(
            f"the metadata of array {key!r} has {mst.st_size:,} bytes, more than the "
            f"{MAX_METADATA_BYTES:,} accepted ({meta})"
        )
    for k in range(n_chunks(a)):
        f = os.path.join(folder, "c", str(k))  # as chunk_path names it
        try:
            st = os.lstat(f)
        except (FileNotFoundError, NotADirectoryError):
            raise StoreCorruptError(f"chunk {k} of array {key!r} is missing ({f})") from None
        if not stat.S_ISREG(st.st_mode):
            raise StoreCorruptError(f"chunk {k} of array {key!r} is not a regular file ({f})")
        size = st.st_size
        if size != a["chunk_bytes"][k]:
            raise StoreCorruptError(
                f"chunk {k} of array {key!r} has {size} bytes, the manifest says "
                f"{a['chunk_bytes'][k]} (truncated or replaced: {f})"
            )
    return () if mst is None else (mst.st_ino, mst.st_size, mst.st_mtime_ns)


def _resolved(real_root: str, rel: str, resolved: dict[str, str]) -> str:
    """``os.path.realpath(real_root / rel)`` (``real_root`` resolved), a component at a
    time from its resolved parent: a plain name that is no symlink resolves to itself under
    its parent; a symlink, ``.`` or ``..`` is resolved by ``realpath``. Each folder's answer is
    kept in ``resolved``, so arrays of one opening share their parents' ``lstat``s."""
    got = resolved.get(rel)
    if got is not None:
        return got
    head, _, name = rel.rpartition("/")
    parent = _resolved(real_root, head, resolved) if head else real_root
    path = os.path.join(parent, name)
    plain = name not in ("", ".", "..") and not os.path.islink(path)
    got = path if plain else os.path.realpath(path)
    resolved[rel] = got
    return got


def _check_listing(loc: Location, listing: dict[str, int], key: str, a: dict[str, Any]) -> None:
    """Every chunk object of an array is listed with its recorded size (a remote store:
    one listing of the whole store stands for a ``stat`` per chunk)."""
    meta = listing.get(f"{key}/zarr.json")
    if meta is not None and meta > MAX_METADATA_BYTES:
        raise StoreCorruptError(
            f"the metadata of array {key!r} has {meta:,} bytes, more than the "
            f"{MAX_METADATA_BYTES:,} accepted ({loc.display(key + '/zarr.json')})"
        )
    for k in range(n_chunks(a)):
        rel = f"{key}/c/{k}"
        size = listing.get(rel)
        if size is None:
            raise StoreCorruptError(f"chunk {k} of array {key!r} is missing ({loc.display(rel)})")
        if size != a["chunk_bytes"][k]:
            raise StoreCorruptError(
                f"chunk {k} of array {key!r} has {size} bytes, the manifest says "
                f"{a['chunk_bytes'][k]} (truncated or replaced: {loc.display(rel)})"
            )


Prefetched = dict[str, "bytes | Exception"]


class _ArrayMeta(NamedTuple):
    """What the reader needs of a zarr array, from its metadata alone."""

    metadata: Any
    dtype: np.dtype
    shape: tuple[int, ...]
    chunks: tuple[int, ...]


def _meta_key(loc: Location, key: str, entry: dict[str, Any], stamp: tuple[int, ...] = ()):
    return (loc.url, key, entry["crc32c"], hash(tuple(entry["chunk_bytes"])), *stamp)


def _array_metadata(
    loc: Location,
    key: str,
    entry: dict[str, Any],
    prefetched: Prefetched | None = None,
    stamp: tuple[int, ...] = (),
) -> _ArrayMeta:
    """The metadata of array ``key``, read bounded and parsed without opening the array
    through zarr (whose every open is a round trip through its event-loop thread): once per
    process for an array of given checksum and chunk sizes, and for a local file of given
    ``stamp`` (:func:`_check_chunks_present`)."""
    from zarr.core.metadata.v3 import ArrayV3Metadata

    cache_key = _meta_key(loc, key, entry, stamp)
    hit = _ARRAY_META.get(cache_key)
    if hit is not None:
        return hit
    rel = f"{key}/zarr.json"
    try:
        raw = _fetched(loc, rel, MAX_METADATA_BYTES, prefetched)
        meta = ArrayV3Metadata.from_dict(json.loads(raw))
        dtype = np.dtype(meta.dtype.to_native_dtype())
        found = _ArrayMeta(meta, dtype, tuple(meta.shape), tuple(meta.chunks))
    except OversizeObjectError:
        raise StoreCorruptError(
            f"the metadata of array {key!r} has more than the {MAX_METADATA_BYTES:,} bytes "
            f"accepted ({loc.display(rel)})"
        ) from None
    except ClusterStalledError:  # storage not answering: not corrupt
        raise
    except Exception as e:
        raise StoreCorruptError(f"array {key!r} cannot be opened: {e}") from e
    if len(_ARRAY_META) >= MAX_CACHED_METADATA:
        _ARRAY_META.clear()
    _ARRAY_META[cache_key] = found
    return found


def _fetched(loc: Location, rel: str, max_bytes: int, prefetched: Prefetched | None) -> bytes:
    """Object ``rel`` from ``prefetched`` (re-raising the error its read met), else read."""
    if prefetched is None or rel not in prefetched:
        return loc.read(rel, max_bytes)
    got = prefetched[rel]
    if isinstance(got, Exception):
        raise got
    return got


def _chunk_rels(key: str, entry: dict[str, Any], span: tuple[int, int]) -> list[str]:
    c = entry["chunk"]
    return [f"{key}/c/{k}" for k in range(span[0] // c, -(-span[1] // c))]


def _prefetch(loc: Location, arrays: list[tuple[str, dict[str, Any]]]) -> Prefetched:
    """The chunks of whole arrays of a remote store (and their metadata not yet parsed),
    fetched by concurrent requests."""
    rels, sizes = [], []
    for key, entry in arrays:
        if _meta_key(loc, key, entry) not in _ARRAY_META:
            rels.append(f"{key}/zarr.json")
            sizes.append(MAX_METADATA_BYTES)
        rels += _chunk_rels(key, entry, (0, entry["shape"][0]))
        sizes += entry["chunk_bytes"]
    return dict(zip(rels, loc.read_many(rels, sizes), strict=True))


def _location(root: str | os.PathLike | Location) -> Location:
    return root if isinstance(root, Location) else as_location(root)


def read_array(
    root: str | os.PathLike | Location,
    key: str,
    entry: dict[str, Any],
    sl: slice | None = None,
    prefetched: Prefetched | None = None,
) -> np.ndarray:
    """Read a stored 1-D array (or a contiguous slice of it), verifying its chunks.

    ``root`` is the store's folder, URL or :class:`~dl1.store.location.Location`. Each
    chunk's size is the manifest's, its CRC32C is checked and the decoded size its frames
    declare must be the one its shape and dtype imply before it is decoded
    (:mod:`dl1.store.frames`), so a decompression bomb allocates nothing; a whole array is
    also checked against the manifest checksum. ``prefetched`` holds objects of a remote
    store already fetched (:func:`_prefetch`); others are fetched here, concurrently.
    """
    loc = _location(root)
    stamp: tuple[int, ...] = ()
    if loc.is_local:  # first: refuses paths outside the store
        stamp = _check_chunks_present(loc.path, key, entry)
    arr = _array_metadata(loc, key, entry, prefetched, stamp)
    if (
        list(arr.shape) != entry["shape"]
        or arr.dtype.str != entry["dtype"]
        or tuple(arr.chunks) != (entry["chunk"],)
    ):
        raise StoreCorruptError(
            f"array {key!r} has shape {arr.shape}, dtype {arr.dtype} and chunks {arr.chunks}, "
            f"the manifest says {tuple(entry['shape'])}, {entry['dtype']} and {entry['chunk']}"
        )
    compressor, crc = codec_chain(arr, key)
    lo, hi, step = (sl or slice(None)).indices(entry["shape"][0])
    if step != 1:
        raise ValueError(f"only contiguous slices are read, got {sl}")
    hi = max(lo, hi)
    if not loc.is_local and prefetched is None:
        rels = _chunk_rels(key, entry, (lo, hi))
        sizes = [entry["chunk_bytes"][int(r.rsplit("/", 1)[1])] for r in rels]
        prefetched = dict(zip(rels, loc.read_many(rels, sizes), strict=True))
    decoder = direct_decoder(arr)
    if decoder is not None:
        a = _read_direct(loc, key, entry, arr.dtype, decoder, compressor, (lo, hi), prefetched)
    else:
        c = entry["chunk"]
        for k in range(lo // c, -(-hi // c)):  # sizes checked before zarr decodes
            _chunk_body(loc, key, k, entry, compressor, crc, c * arr.dtype.itemsize, prefetched)
        try:
            arr = zarr.open_array(loc.zarr_store(), path=key, mode="r")
        except ClusterStalledError:  # storage not answering: not corrupt
            raise
        except Exception as e:
            raise StoreCorruptError(f"array {key!r} cannot be opened: {e}") from e
        try:
            a = arr[lo:hi]
        except ClusterStalledError:  # storage not answering: not corrupt
            raise
        except Exception as e:
            raise StoreCorruptError(f"{_failing_chunk(arr, key, entry)}: {e}") from e
    if sl is None and checksum(a) != entry["crc32c"]:
        raise StoreCorruptError(
            f"array {key!r} does not match its manifest checksum (a chunk was replaced or the "
            "manifest belongs to another store)"
        )
    return a


def codec_chain(arr: Any, key: str) -> tuple[str, bool]:
    """``(compressor, has_crc32c)`` of an array whose codecs dl1 reads, else refused.

    Accepted: the bytes codec, then Blosc, zstd or no compressor, then optionally CRC32C:
    compressors whose frames declare their decoded size (:mod:`dl1.store.frames`). Any
    other chain (gzip, sharding, filters...) is a :class:`StoreCorruptError` naming it.
    """
    cs = list(arr.metadata.codecs)
    crc = bool(cs) and isinstance(cs[-1], Crc32cCodec)
    middle = cs[1 : len(cs) - crc]
    if (
        not cs
        or not isinstance(cs[0], BytesCodec)
        or len(middle) > 1
        or (middle and not isinstance(middle[0], BloscCodec | ZstdCodec))
    ):
        names = [type(c).__name__ for c in cs]
        raise StoreCorruptError(
            f"array {key!r} uses the codecs {names}; dl1 reads bytes, then Blosc, zstd or "
            "nothing, then optionally CRC32C (compressors whose frames declare their size)"
        )
    if not middle:
        return "none", crc
    return ("blosc" if isinstance(middle[0], BloscCodec) else "zstd"), crc


def direct_decoder(arr: Any) -> Any:
    """The numcodecs decoder of an array whose codecs are dl1's own chain (little-endian
    bytes, Blosc or zstd, CRC32C), else None (read through zarr)."""
    cs = arr.metadata.codecs
    if (
        len(cs) != 3
        or not isinstance(cs[0], BytesCodec)
        or not isinstance(cs[2], Crc32cCodec)
        or arr.dtype.byteorder == ">"
        or (arr.dtype.itemsize > 1 and cs[0].endian is not None and cs[0].endian.value != "little")
    ):
        return None
    if isinstance(cs[1], BloscCodec):
        return numcodecs.Blosc()  # the Blosc header describes its own compressor and shuffle
    if isinstance(cs[1], ZstdCodec):
        return numcodecs.Zstd()
    return None


def _chunk_bytes(
    loc: Location, key: str, k: int, size: int, prefetched: Prefetched | None = None
) -> bytes:
    """The stored bytes of chunk ``k``: a local file (checked in place by
    :func:`_check_chunks_present`), or a remote object read by a request of at most
    ``size + 1`` bytes, refused unless it holds exactly the ``size`` the manifest records."""
    if loc.is_local:
        return chunk_path(loc.path, key, k).read_bytes()
    rel = f"{key}/c/{k}"
    try:
        raw = _fetched(loc, rel, size, prefetched)
    except FileNotFoundError:
        missing = f"chunk {k} of array {key!r} is missing ({loc.display(rel)})"
        raise StoreCorruptError(missing) from None
    except OversizeObjectError:
        raw = None
    if raw is None or len(raw) != size:
        got = "more" if raw is None else f"{len(raw)}"
        raise StoreCorruptError(
            f"chunk {k} of array {key!r} has {got} bytes, the manifest says {size} "
            f"(truncated or replaced: {loc.display(rel)})"
        )
    return raw


def _chunk_body(
    loc: Location,
    key: str,
    k: int,
    entry: dict[str, Any],
    compressor: str,
    crc: bool,
    expected: int,
    prefetched: Prefetched | None = None,
) -> memoryview:
    """The compressed bytes of chunk ``k``, checked: CRC32C (if the chain has it), and the
    decoded size its frames declare equal to ``expected`` (the chunk's shape x itemsize)."""
    raw = _chunk_bytes(loc, key, k, entry["chunk_bytes"][k], prefetched)
    body = memoryview(raw)
    if crc:
        if len(raw) < 4 or crc32c.crc32c(body[:-4]) != int.from_bytes(raw[-4:], "little"):
            raise StoreCorruptError(f"chunk {k} of array {key!r} is corrupt (checksum failed)")
        body = body[:-4]
    try:
        declared = frames.declared_bytes(compressor, body)
    except ValueError as e:
        raise StoreCorruptError(f"chunk {k} of array {key!r} is corrupt ({e})") from None
    if declared != expected:
        raise StoreCorruptError(
            f"chunk {k} of array {key!r} declares {declared:,} bytes decoded where its shape "
            f"and dtype make {expected:,}: refused before decoding (a corrupt chunk or a "
            "decompression bomb)"
        )
    return body


def _read_direct(
    loc: Location,
    key: str,
    entry: dict[str, Any],
    dtype: np.dtype,
    decoder: Any,
    compressor: str,
    span: tuple[int, int],
    prefetched: Prefetched | None = None,
) -> np.ndarray:
    """Elements ``span = (lo, hi)`` of an array, each chunk file decoded straight into the
    result (a partial chunk through one chunk-sized buffer).

    The same bytes zarr would read (zarr v3 chunk files: the compressed chunk, then its
    CRC32C, little-endian), without zarr's intermediate chunk buffer and copy: on the
    log1p preset this halves the time a worker spends loading its blocks.
    """
    c = entry["chunk"]
    lo, hi = span
    out = np.empty(hi - lo, dtype=dtype)
    scratch = None
    for k in range(lo // c, -(-hi // c)):
        body = _chunk_body(loc, key, k, entry, compressor, True, c * dtype.itemsize, prefetched)
        a, b = max(lo, k * c), min(hi, (k + 1) * c)
        try:
            if b - a == c:
                decoder.decode(body, out=out[a - lo : b - lo])
            else:  # zarr stores an edge chunk whole, padded with the fill value
                if scratch is None:
                    scratch = np.empty(c, dtype=dtype)
                decoder.decode(body, out=scratch)
                out[a - lo : b - lo] = scratch[a - k * c : b - k * c]
        except ClusterStalledError:  # storage not answering: not corrupt
            raise
        except Exception as e:
            raise StoreCorruptError(
                f"chunk {k} of array {key!r} is corrupt (decompression failed: {e})"
            ) from e
    return out


def _failing_chunk(arr: Any, key: str, entry: dict[str, Any]) -> str:
    c = entry["chunk"]
    for k in range(n_chunks(entry)):
        try:
            arr[k * c : (k + 1) * c]
        except Exception:
            return f"chunk {k} of array {key!r} is corrupt (checksum or decompression failed)"
    return f"array {key!r} could not be read"


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
        import dask.array as da

        return da.Array(dsk, name, chunks, meta=_meta(chunk_type, fmt, self.dtype(split)))

    def column_piece(self, split: str, fmt: str | None, i: int, j: int, lo: int, hi: int):
        """A dask delayed of columns ``[lo, hi)`` (within the block) of stored block
        ``(i, j)``, read where it runs (:func:`read_columns_task`)."""
        import dask

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
        import dask.array as da

        return da.Array(dsk, tok, (tuple(np.diff(rb).tolist()),), meta=np.empty(0, np.float64))


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
