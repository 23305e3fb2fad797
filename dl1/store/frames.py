"""Decoded sizes that compressed chunks declare, read from their headers without decoding.

A chunk is untrusted: a few kilobytes of zstd can declare (or, without a declared size,
stream out) gigabytes. Before a chunk is decoded, the size its frames declare is compared
with the size its array's chunk shape and dtype imply (:func:`declared_bytes`), and only a
chunk declaring exactly that is decoded, into a buffer of that size. The codecs dl1 reads
are those whose frames carry their decoded size: Blosc (header field ``nbytes``) and zstd
(every frame's ``Frame_Content_Size``, RFC 8878); a zstd frame without one is refused.
"""

from __future__ import annotations

import struct

#: Magic number of a zstd frame (little-endian), RFC 8878 section 3.1.1.
ZSTD_MAGIC = 0xFD2FB528
_BLOSC_HEADER = 16
#: Bytes of the Dictionary_ID field by its flag, and of Frame_Content_Size by its flag.
_DID_BYTES = (0, 1, 2, 4)
_FCS_BYTES = (0, 2, 4, 8)


def blosc_nbytes(body: bytes | memoryview) -> int:
    """Decoded bytes of a Blosc chunk, from its 16-byte header (checked for consistency).

    Raises
    ------
    ValueError
        The chunk is shorter than the header, its stored size differs from the header's,
        or its block size is not within the decoded size (c-blosc allocates per block).
    """
    if len(body) < _BLOSC_HEADER:
        raise ValueError(f"{len(body)} bytes, shorter than a Blosc header")
    nbytes, blocksize, cbytes = struct.unpack_from("<III", body, 4)
    if cbytes != len(body):
        raise ValueError(f"its Blosc header says {cbytes} compressed bytes, it holds {len(body)}")
    if not 0 < blocksize <= max(nbytes, 1):
        raise ValueError(f"its Blosc block size {blocksize} is not in [1, {nbytes}]")
    return nbytes


def zstd_content_size(body: bytes | memoryview) -> int:
    """Decoded bytes of a chunk of zstd frames: the sum of their declared content sizes.

    The frames are walked header by header and block by block (no decoding) to the end of
    the chunk, so every frame's size is accounted for.

    Raises
    ------
    ValueError
        A frame declares no content size, is truncated or is not a zstd frame (skippable
        frames included: dl1 never writes them), or bytes follow the last frame.
    """
    view = memoryview(body).cast("B")
    total, pos, n = 0, 0, len(view)
    if n == 0:
        raise ValueError("empty zstd chunk")
    while pos < n:
        pos, size = _zstd_frame(view, pos, n)
        total += size
    return total


def _zstd_frame(view: memoryview, pos: int, n: int) -> tuple[int, int]:
    """(end, content size) of the zstd frame starting at ``pos``."""
    if pos + 6 > n:
        raise ValueError(f"truncated zstd frame header at byte {pos}")
    if int.from_bytes(view[pos : pos + 4], "little") != ZSTD_MAGIC:
        raise ValueError(f"no zstd frame at byte {pos} (bad magic number)")
    fhd = view[pos + 4]
    if fhd & 0x08:
        raise ValueError(f"zstd frame at byte {pos} sets the reserved header bit")
    fcs_flag, single, has_checksum = fhd >> 6, (fhd >> 5) & 1, (fhd >> 2) & 1
    pos += 5 + (0 if single else 1) + _DID_BYTES[fhd & 3]
    size_len = _FCS_BYTES[fcs_flag] or single
    if not size_len:
        raise ValueError("a zstd frame does not declare its decoded size")
    if pos + size_len > n:
        raise ValueError("truncated zstd frame header")
    size = int.from_bytes(view[pos : pos + size_len], "little") + (256 if size_len == 2 else 0)
    pos += size_len
    while True:
        if pos + 3 > n:
            raise ValueError("truncated zstd frame (block header)")
        header = int.from_bytes(view[pos : pos + 3], "little")
        last, kind, block = header & 1, (header >> 1) & 3, header >> 3
        if kind == 3:
            raise ValueError("zstd block of the reserved type")
        pos += 3 + (1 if kind == 1 else block)
        if pos > n:
            raise ValueError("truncated zstd frame (block)")
        if last:
            break
    pos += 4 * has_checksum
    if pos > n:
        raise ValueError("truncated zstd frame (checksum)")
    return pos, size


def declared_bytes(compressor: str, body: bytes | memoryview) -> int:
    """Decoded bytes a chunk declares: ``compressor`` is "blosc", "zstd" or "none"."""
    if compressor == "blosc":
        return blosc_nbytes(body)
    if compressor == "zstd":
        return zstd_content_size(body)
    return len(body)
