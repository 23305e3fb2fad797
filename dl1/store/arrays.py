"""Reading one stored array, verified: its chunks present, checked and decoded.

Every array of a store is read by :func:`read_array`: each chunk of the array is first
found where the manifest says, with the size it records (:func:`_check_chunks_present` for
a local folder, never following a path out of the store; :func:`_check_listing` for a
remote store), then its CRC32C and the decoded size its frames declare are checked before
it is decoded (:func:`codec_chain`, :func:`direct_decoder`), and a whole array is checked
against the manifest's checksum. The arrays' metadata parsed so far is kept per process.
Stores, their blocks and dask arrays are read by :mod:`dl1.store.reader`.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, NamedTuple

import crc32c
import numcodecs
import numpy as np
import zarr
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, ZstdCodec
from zarr.core.metadata.v3 import ArrayV3Metadata

from dl1.errors import ClusterStalledError, StoreAccessError, StoreCorruptError, StoreError
from dl1.store import frames
from dl1.store.format import checksum, chunk_path, n_chunks
from dl1.store.location import Location, OversizeObjectError, access_error, as_location, denied
from dl1.store.manifest import MAX_METADATA_BYTES

#: Metadata of arrays parsed by this process, by (URL, key, checksum, chunk sizes; for a
#: local file also its inode, size and modification time): a block read again (every pass
#: out of core, every fit of a path) costs its chunks' reads only.
_ARRAY_META: dict[tuple[Any, ...], Any] = {}
#: Entries of :data:`_ARRAY_META` kept (about 1 KiB each).
MAX_CACHED_METADATA = 16384


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
    except (ClusterStalledError, StoreAccessError):  # not answering, no access: not corrupt
        raise
    except Exception as e:
        raise unreadable(key, f"array {key!r} cannot be opened", e) from e
    if len(_ARRAY_META) >= MAX_CACHED_METADATA:
        _ARRAY_META.clear()
    _ARRAY_META[cache_key] = found
    return found


def unreadable(key: str, what: str, e: Exception) -> StoreError:
    """The error of array ``key`` failing to open or read with ``e``: access refused
    (:func:`~dl1.store.location.access_error`, naming where), else corrupt (``what``)."""
    if denied(e):
        return access_error(f"array {key!r}", e)
    return StoreCorruptError(f"{what}: {e}")


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
        except (ClusterStalledError, StoreAccessError):  # not answering, no access: not corrupt
            raise
        except Exception as e:
            raise unreadable(key, f"array {key!r} cannot be opened", e) from e
        try:
            a = arr[lo:hi]
        except (ClusterStalledError, StoreAccessError):  # not answering, no access: not corrupt
            raise
        except Exception as e:
            raise unreadable(key, _failing_chunk(arr, key, entry), e) from e
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
        except (ClusterStalledError, StoreAccessError):  # not answering, no access: not corrupt
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
