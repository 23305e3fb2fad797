"""The manifest of a dl1 store read as untrusted input: a schema check and safe names.

A manifest is JSON anyone could have edited. Before any file is touched, every field is
checked to be present, of the right type, in range and consistent with the others (shapes,
block grid, nnz, chunk counts), and every name that becomes part of a path is a plain name
that stays inside the store. A problem raises :class:`~dl1.errors.StoreCorruptError` (or the
``error`` class given, e.g. for checkpoints) naming the field and its value, so that a
damaged or hostile manifest never reaches an ``IndexError`` or a read outside its folder.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from dl1.errors import StoreCorruptError
from dl1.store.format import DTYPES, FORMATS, SPLITS

#: A chunk holds at most 2**31 bytes decoded: the most a Blosc chunk (or a zarr chunk
#: dl1 writes) can hold; a larger "chunk" is a corrupt or hostile manifest, refused before
#: any allocation.
MAX_CHUNK_BYTES = 1 << 31
#: Largest manifest parsed (64 MiB, about 60,000 blocks of one chunk per array): a larger
#: file is refused after a ``stat``, before a byte of it is parsed.
MAX_MANIFEST_BYTES = 64 << 20
#: Largest zarr metadata file (``zarr.json``) of an array: dl1 writes about 1 KiB.
MAX_METADATA_BYTES = 64 << 10
#: Plain names: no separator, no "..", no NUL, nothing a filesystem would interpret.
_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*\Z")
#: dtypes of the arrays of a store (little-endian, as written).
ARRAY_DTYPES = ("<i4", "<i8", "<f4", "<f8")
BLOCK_ARRAYS = {"indptr": "<i8", "indices": "<i4"}  # "data" has the split's dtype


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class FieldChecker:
    """Raises ``error`` with the store's path, the dotted field name and the value."""

    def __init__(
        self, where: str, error: type[StoreCorruptError], label: str = "manifest field"
    ) -> None:
        self.where = where
        self.error = error
        self.label = label

    def fail(self, field: str, problem: str, value: Any = ...) -> NoReturn:
        shown = "" if value is ... else f" (value {_show(value)})"
        raise self.error(f"{self.where}: {self.label} {field} {problem}{shown}")

    def obj(self, value: Any, field: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(field, "is not an object", value)
        return value

    def key(self, d: dict[str, Any], name: str, field: str) -> Any:
        if name not in d:
            self.fail(name if field == "(root)" else f"{field}.{name}", "is missing")
        return d[name]

    def integer(self, value: Any, field: str, lo: int = 0, hi: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(field, "is not an integer", value)
        if value < lo or (hi is not None and value > hi):
            self.fail(field, f"is out of range [{lo}, {'inf' if hi is None else hi}]", value)
        return value

    def seq(self, value: Any, field: str, length: int | None = None) -> list[Any]:
        if not isinstance(value, list):
            self.fail(field, "is not a list", value)
        if length is not None and len(value) != length:
            self.fail(field, f"has {len(value)} entries, expected {length}")
        return value

    def name(self, value: Any, field: str) -> str:
        """A plain file name (one path component)."""
        if not isinstance(value, str) or not _PLAIN.match(value) or value in (".", ".."):
            self.fail(field, "is not a plain name (a path or traversal is refused)", value)
        return value

    def relpath(self, value: Any, field: str) -> str:
        """A relative path of plain names separated by "/" (e.g. ``stats/col_nnz``)."""
        if not isinstance(value, str):
            self.fail(field, "is not a string", value)
        for part in value.split("/"):
            if not isinstance(part, str) or not _PLAIN.match(part) or part in (".", ".."):
                self.fail(field, "is not a relative name inside the store", value)
        return value


def check_array_entry(
    ck: FieldChecker,
    entry: Any,
    field: str,
    *,
    dtype: str | None = None,
    length: int | None = None,
) -> dict[str, Any]:
    """Check the manifest entry of one 1-D array (shape, dtype, chunk, checksum, sizes)."""
    entry = ck.obj(entry, field)
    shape = ck.seq(ck.key(entry, "shape", field), f"{field}.shape", 1)
    n = ck.integer(shape[0], f"{field}.shape[0]")
    if length is not None and n != length:
        ck.fail(f"{field}.shape[0]", f"is {n}, the rest of the manifest implies {length}")
    dt = ck.key(entry, "dtype", field)
    if dt not in ARRAY_DTYPES or (dtype is not None and dt != dtype):
        want = ARRAY_DTYPES if dtype is None else dtype
        ck.fail(f"{field}.dtype", f"is not {want}", dt)
    itemsize = np.dtype(dt).itemsize
    max_chunk = MAX_CHUNK_BYTES // itemsize
    chunk = ck.integer(ck.key(entry, "chunk", field), f"{field}.chunk", 1, max_chunk)
    if chunk > max(1, n):
        ck.fail(f"{field}.chunk", f"is larger than the array ({n} elements)", chunk)
    ck.integer(ck.key(entry, "crc32c", field), f"{field}.crc32c", 0, (1 << 32) - 1)
    sizes = ck.seq(ck.key(entry, "chunk_bytes", field), f"{field}.chunk_bytes", -(-n // chunk))
    for k, s in enumerate(sizes):
        ck.integer(s, f"{field}.chunk_bytes[{k}]", 1)
    return entry


def _bounds(ck: FieldChecker, value: Any, field: str, end: int) -> list[int]:
    """Block bounds: ``0 = b[0] <= b[1] <= ... = end``."""
    b = ck.seq(value, field)
    if len(b) < 2:
        ck.fail(field, "has fewer than 2 entries", b)
    prev = -1
    for k, v in enumerate(b):
        ck.integer(v, f"{field}[{k}]")
        if v < prev:
            ck.fail(f"{field}[{k}]", f"is smaller than the bound before it ({prev})", v)
        prev = v
    if b[0] != 0 or b[-1] != end:
        ck.fail(field, f"does not run from 0 to {end}", [b[0], b[-1]])
    return b


def _check_blocks(
    ck: FieldChecker, e: dict[str, Any], field: str, rb: list[int], cb: list[int]
) -> None:
    formats = ck.seq(ck.key(e, "formats", field), f"{field}.formats")
    if not formats or len(set(map(str, formats))) != len(formats):
        ck.fail(f"{field}.formats", f"is not a non-empty list of distinct {FORMATS}", formats)
    for f in formats:
        if f not in FORMATS:
            ck.fail(f"{field}.formats", f"names {f!r}, not one of {FORMATS}", formats)
    blocks = ck.obj(ck.key(e, "blocks", field), f"{field}.blocks")
    if sorted(blocks) != sorted(formats):
        ck.fail(f"{field}.blocks", f"has formats {sorted(blocks)!r}, expected {formats}")
    data_dtype = e["dtype"]
    for fmt in formats:
        total = 0
        rows = ck.seq(blocks[fmt], f"{field}.blocks.{fmt}", len(rb) - 1)
        for i, row in enumerate(rows):
            row = ck.seq(row, f"{field}.blocks.{fmt}[{i}]", len(cb) - 1)
            for j, blk in enumerate(row):
                shape = (rb[i + 1] - rb[i], cb[j + 1] - cb[j])
                total += _check_block(ck, blk, f"{field}.blocks.{fmt}[{i}][{j}]", fmt, shape,
                                      data_dtype)  # fmt: skip
        if total != e["nnz"]:
            ck.fail(f"{field}.nnz", f"is {e['nnz']}, the blocks of {fmt!r} hold {total}")
    _check_ties(ck, blocks, formats, field)


def _check_ties(ck: FieldChecker, blocks: dict[str, Any], formats: list[str], field: str) -> None:
    """Every block's ``content`` digest is an unsigned 64-bit integer, present in every
    layout when a split has two, and the same in both: they hold one matrix."""
    for fmt in formats:
        for i, row in enumerate(blocks[fmt]):
            for j, blk in enumerate(row):
                where = f"{field}.blocks.{fmt}[{i}][{j}].content"
                if len(formats) > 1 and "content" not in blk:
                    ck.fail(where, "is missing (it ties the layouts of a split stored in two)")
                if "content" in blk:
                    ck.integer(blk["content"], where, 0, (1 << 64) - 1)
                    first = blocks[formats[0]][i][j]["content"]
                    if blk["content"] != first:
                        ck.fail(where, f"differs from the {formats[0]} layout's ({first}): the "
                                "two layouts hold different matrices", blk["content"])  # fmt: skip


def _check_block(
    ck: FieldChecker, blk: Any, field: str, fmt: str, shape: tuple[int, int], data_dtype: str
) -> int:
    blk = ck.obj(blk, field)
    nnz = ck.integer(ck.key(blk, "nnz", field), f"{field}.nnz", 0, shape[0] * shape[1])
    arrays = ck.obj(ck.key(blk, "arrays", field), f"{field}.arrays")
    if sorted(arrays) != ["data", "indices", "indptr"]:
        ck.fail(f"{field}.arrays", "does not hold exactly indptr, indices and data",
                sorted(arrays))  # fmt: skip
    n_major = shape[1] if fmt == "csc" else shape[0]
    check_array_entry(ck, arrays["indptr"], f"{field}.arrays.indptr", dtype="<i8",
                      length=n_major + 1)  # fmt: skip
    check_array_entry(ck, arrays["indices"], f"{field}.arrays.indices", dtype="<i4", length=nnz)
    check_array_entry(ck, arrays["data"], f"{field}.arrays.data", dtype=data_dtype, length=nnz)
    return nnz


def _check_split_arrays(ck: FieldChecker, e: dict[str, Any], field: str, n: int, p: int) -> None:
    arrays = ck.obj(ck.key(e, "arrays", field), f"{field}.arrays")
    has_sw = ck.key(e, "has_sample_weight", field)
    if not isinstance(has_sw, bool):
        ck.fail(f"{field}.has_sample_weight", "is not true or false", has_sw)
    known = {"y": ("<f8", n), "stats/col_nnz": ("<i8", p), "stats/col_sum": ("<f8", p),
             "stats/col_sqsum": ("<f8", p), "stats/row_nnz": ("<i8", n)}  # fmt: skip
    if has_sw:
        known["sample_weight"] = ("<f8", n)
    for name in known:
        ck.key(arrays, name, f"{field}.arrays")
    for name, a in arrays.items():
        ck.relpath(name, f"{field}.arrays key")
        if name not in known:
            ck.fail(f"{field}.arrays", f"has an unknown array {name!r}; expected {sorted(known)}")
        dt, length = known[name]
        check_array_entry(ck, a, f"{field}.arrays.{name}", dtype=dt, length=length)


def _check_split(ck: FieldChecker, e: Any, field: str) -> None:
    e = ck.obj(e, field)
    shape = ck.seq(ck.key(e, "shape", field), f"{field}.shape", 2)
    n, p = (ck.integer(v, f"{field}.shape[{k}]") for k, v in enumerate(shape))
    ck.integer(ck.key(e, "nnz", field), f"{field}.nnz", 0, n * p)
    dtype = ck.key(e, "dtype", field)
    if dtype not in [d.str for d in DTYPES]:
        ck.fail(f"{field}.dtype", f"is not one of {[d.str for d in DTYPES]}", dtype)
    rb = _bounds(ck, ck.key(e, "row_bounds", field), f"{field}.row_bounds", n)
    cb = _bounds(ck, ck.key(e, "col_bounds", field), f"{field}.col_bounds", p)
    _check_split_arrays(ck, e, field, n, p)
    _check_blocks(ck, e, field, rb, cb)


def validate_manifest(manifest: Any, where: str) -> dict[str, Any]:
    """Check a store's manifest as a schema; return it unchanged.

    Parameters
    ----------
    manifest : Any
        The parsed JSON.
    where : str
        The store's path, named in the error.

    Raises
    ------
    StoreCorruptError
        A field is missing, of the wrong type, out of range or inconsistent with the
        others; the message names the field (e.g. ``splits.train.blocks.csc[0][1].nnz``).
    """
    ck = FieldChecker(where, StoreCorruptError)
    m = ck.obj(manifest, "(root)")
    splits = ck.obj(ck.key(m, "splits", "(root)"), "splits")
    if not splits:
        ck.fail("splits", "is empty")
    for split, e in splits.items():
        if split not in SPLITS:
            ck.fail("splits", f"has a split {split!r}, not one of {SPLITS}")
        _check_split(ck, e, f"splits.{split}")
    if "attrs" in m:
        ck.obj(m["attrs"], "attrs")
    return m


def check_inside(root: Path, path: Path, what: str, error: type[StoreCorruptError]) -> None:
    """Refuse ``path`` unless it resolves (symlinks followed) inside ``root``."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if os.path.commonpath([real_root, real]) != real_root:
        raise error(f"{what} resolves to {real}, outside {real_root} (a symlink or traversal)")
