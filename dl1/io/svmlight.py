"""Streaming ingest of svmlight / libsvm text files into dl1 stores.

The file is read in byte batches cut at line boundaries; each batch is parsed by a numba
kernel (:mod:`dl1.kernels.svmlight`) into CSR arrays and appended to the store's
out-of-core writer, so the file is never held in memory. Reading, decompression and parsing
of the next batch run in a reader thread (the kernel releases the GIL) while the calling
thread appends the previous batch.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import math
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

import crc32c
import numpy as np

from dl1.errors import SvmlightFormatError
from dl1.kernels import svmlight as svmlight_kernels
from dl1.store import SplitWriter, Store, StoreWriter, open_store
from dl1.store.format import DTYPES, FORMATS, SPLITS
from dl1.store.split_writer import DEFAULT_BLOCK_NNZ

#: Largest accepted ``batch_bytes`` (1 GiB); the kernels address a batch with int64.
MAX_BATCH_BYTES = 1 << 30
#: Largest accepted ``max_line_bytes`` (2 GiB).
MAX_LINE_BYTES = (1 << 31) - 1
#: A line longer than this (64 MiB: some 4 million short nonzeros) and than the batch is
#: refused unless ``max_line_bytes`` says otherwise: the buffer grows to hold a long line,
#: and a small compressed file can hold a huge one.
DEFAULT_MAX_LINE_BYTES = 64 << 20
#: Without ``n_features``, a width above ``max(WIDTH_FREE, WIDTH_PER_NONZERO * nonzeros)``
#: is refused: a store and its fits keep arrays of one entry per column, so a few huge
#: indices would cost gigabytes of empty columns. ``n_features`` keeps any width to 2**31.
WIDTH_FREE = 1 << 24
WIDTH_PER_NONZERO = 16

_MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz"}

_PROBLEMS = {
    svmlight_kernels.BAD_PAIR: "malformed feature, expected index:value",
    svmlight_kernels.BAD_INDEX: "feature index is not an integer",
    svmlight_kernels.INDEX_OVERFLOW: (
        f"feature index is larger than {svmlight_kernels.MAX_INDEX} (indices are int32)"
    ),
    svmlight_kernels.NEGATIVE_INDEX: "negative feature index",
    svmlight_kernels.ZERO_INDEX: "feature index 0 in a one-based file (zero_based=False)",
    svmlight_kernels.UNSORTED: "feature indices are not sorted",
    svmlight_kernels.DUPLICATE: "duplicate feature index",
    svmlight_kernels.MISSING_LABEL: "missing label (the line starts with index:value)",
    svmlight_kernels.BAD_QID: "malformed qid, expected qid:<integer>",
    svmlight_kernels.MISSING_QID: "no qid:<integer> on the line (query_id=True)",
}


def _compression(path: Path) -> str | None:
    with open(path, "rb") as fh:
        head = fh.read(6)
    for magic, name in _MAGIC.items():
        if head.startswith(magic):
            return name
    return None


def _open_text(path: Path, compression: str | None) -> BinaryIO:
    if compression == "gzip":
        return gzip.open(path, "rb")
    if compression == "bzip2":
        return bz2.open(path, "rb")
    if compression == "xz":
        return lzma.open(path, "rb")
    return open(path, "rb")


def _readinto_full(fh: BinaryIO, view: memoryview) -> int:
    """Fill ``view`` unless the end of the file comes first; return the bytes read."""
    got = 0
    while got < len(view):
        n = fh.readinto(view[got:])
        if not n:
            break
        got += n
    return got


def _token(buf: np.ndarray, s: int, e: int, limit: int = 60) -> str:
    text = bytes(buf[s : min(e, s + limit)]).decode("utf-8", errors="replace")
    return repr(text + ("..." if e - s > limit else ""))


def memory_bound(
    batch_bytes: int,
    block_nnz: int,
    n_features: int,
    n_rows: int = 0,
    dtype: Any = np.float64,
    max_line_bytes: int = 0,
) -> int:
    """Worst-case peak memory (bytes above the interpreter's baseline) of :func:`from_svmlight`.

    This is the bound stated in :func:`from_svmlight` with the worst case ``nnz_b = B / 4``
    and ``rows_b = B / 2`` of a batch of ``B = batch_bytes`` bytes (a nonzero takes at least 4
    bytes, ``"1:1 "``, a row at least 2, ``"1\\n"``). ``n_features`` may be the number of distinct
    columns present: that is what the statistics cost. A file whose lines may be longer
    than a batch takes ``B = max(batch_bytes, max_line_bytes)``: the buffer grows to hold
    the longest line, and :func:`from_svmlight` refuses a line longer than both.
    """
    b = max(int(batch_bytes), int(max_line_bytes))
    nnz_b, rows_b = b // 4, b // 2
    parse = 2 * (b + 12 * nnz_b + 16 * rows_b)
    if np.dtype(dtype) == np.float32:
        parse += 4 * nnz_b
    append = 48 * nnz_b + 8 * rows_b
    return parse + append + 64 * int(block_nnz) + 40 * int(n_features) + 16 * int(n_rows)


def from_svmlight(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    n_features: int | None = None,
    zero_based: bool | str = "auto",
    dtype: Any = np.float64,
    query_id: bool = False,
    block_nnz: int = DEFAULT_BLOCK_NNZ,
    n_feature_blocks: int | None = None,
    formats: tuple[str, ...] = ("csc",),
    overwrite: bool = False,
    batch_bytes: int = 16 << 20,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    split: str = "train",
    attrs: dict[str, Any] | None = None,
) -> Store:
    """Stream an svmlight / libsvm file into a new dl1 store.

    Each line is ``label [qid:N] index:value index:value ... [# comment]``. Blank lines and
    lines holding only a comment are skipped; a ``#`` ends the content of its line; tokens
    are separated by any ASCII whitespace (trailing spaces, tabs and ``\\r\\n`` are fine); a
    row may have no feature; the last line may lack its newline. The result equals
    scikit-learn's ``load_svmlight_file`` exactly (same shape, indices, and bit-identical
    values and labels), except that dl1 refuses what a store cannot hold (see Raises) and
    that a file without any feature gives 0 columns (scikit-learn: 1).

    Parameters
    ----------
    src : str or PathLike
        The file: plain text, gzip, bzip2 or xz (recognised by its first bytes, whatever its
        extension).
    dst : str or PathLike
        Where to write the store (a path that does not exist yet, or an empty directory).
    n_features : int, optional
        Number of columns; default: the largest index seen (after the index base) plus one.
    zero_based : bool or "auto"
        Whether indices are zero-based (True) or one-based (False). ``"auto"`` follows
        scikit-learn: one-based unless an index 0 occurs in the file.
    dtype : float64 or float32
        Dtype of the stored values. Values are parsed as float64 and then cast (as
        scikit-learn does); the labels are always float64.
    query_id : bool
        Must be False. ``qid:N`` tokens (the first token after the label) are validated as
        integers and dropped: a store has no place for them yet. True raises
        ``NotImplementedError``.
    block_nnz, n_feature_blocks, formats
        Block grid and formats of the store, as in :meth:`dl1.store.StoreWriter.split`.
    overwrite : bool
        Replace an existing dl1 store at ``dst``.
    batch_bytes : int
        Bytes of text parsed at a time (the batch is extended to the end of a longer line).
    max_line_bytes : int
        A line longer than this and than ``batch_bytes`` is refused (SvmlightFormatError
        naming its first byte), so that memory stays bounded by the parameters whatever
        the file holds (default 64 MiB; at most 2 GiB).
    split : str
        Name of the split to write; a store needs a ``"train"`` split, so only ``"train"``
        is accepted here (see :func:`write_svmlight_split` for a test split).
    attrs : dict, optional
        Extra JSON-serialisable attributes of the store. The ingest records its own under
        ``attrs["svmlight"][split]``: the source's name, path, size, compression (None for
        plain text), uncompressed bytes, CRC32C of the text, lines, rows, nonzeros, the parse
        settings, the index base used and timings.

    Returns
    -------
    Store
        The opened store.

    Raises
    ------
    SvmlightFormatError
        Naming the file, the 1-based line number and the offending token, on: a malformed
        ``index:value`` pair, a missing or non-numeric label, a non-numeric value, a NaN or
        infinite label or value (also a value that overflows float32 when ``dtype`` is
        float32), a malformed qid, a negative index, an index >= 2**31, index 0 with
        ``zero_based=False``, an index beyond ``n_features``, and indices that are not
        strictly increasing within a line (unsorted or duplicate; scikit-learn refuses
        those too), and, without ``n_features``, a largest index making the store wider
        than ``max(2**24, 16 x nonzeros)`` columns (:data:`WIDTH_FREE`). The store is never
        finalised: ``dst`` has no manifest and the spill
        files are removed.

    Notes
    -----
    Numbers are converted exactly as Python's ``float()`` converts them: plain decimals
    with at most 19 significant digits (and most longer ones) by the numba kernel, the
    rest (``inf``, ``nan``, underscores as in ``1_000``, hexadecimal, a long mantissa whose
    rounding needs all its digits) by ``float()`` itself, which is slower but rare.
    Indices are read as Python's ``int()`` reads them (signs, leading zeros and
    underscores accepted). Beyond scikit-learn, a qid token must read ``qid:<integer>``.

    Memory does not grow with the size of the file, except for the writer's 16 bytes per
    row when it closes the split (below). A reader thread reads,
    decompresses and parses the next batch while the calling thread appends the previous
    one to the writer, so two batches are alive at a time. Above the interpreter's
    baseline, with ``B = batch_bytes`` (or the longest line, if longer: at most
    ``max_line_bytes``), ``nnz_b`` and
    ``rows_b`` the nonzeros and rows of a batch, ``p`` the number of features and ``n`` the
    number of rows, the peak is at most the sum of

    * two batch buffers and two parsed batches: ``2 (B + 12 nnz_b + 16 rows_b)`` bytes
      (plus ``4 nnz_b`` for a float32 store), and the decompressor's state (under 10 MB
      for bzip2 and xz);
    * the writer's bound (:mod:`dl1.store.writer`): about ``48 nnz_b + 8 rows_b`` for the
      batch being appended, ``64 block_nnz`` for the block being assembled, and at most
      ``40 d`` of per-column statistics, ``d`` the distinct columns present (``d <= p``
      and ``d <= nnz``: a file naming column 10**8 once costs one column, not 10**8);
    * and, when the split is closed, ``16 n``: the writer reads the labels and the row
      counts whole to write them (a term that does grow with the file).

    As a nonzero takes at least 4 bytes and a row 2, ``nnz_b <= B / 4`` and
    ``rows_b <= B / 2``, so the peak is at most about ``40 B + 64 block_nnz + 40 d + 16 n``
    bytes (:func:`memory_bound` computes it); typical files (8 or more bytes per nonzero,
    several nonzeros per line) stay under ``10 B + 64 block_nnz + 40 d + 16 n``. With the
    defaults (16 MiB batches, 4 Mi nonzeros per block) that is 896 MiB at worst and about
    416 MiB typically, plus ``40 d + 16 n``; lower ``batch_bytes`` and ``block_nnz`` to
    use less.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if split != "train":
        raise ValueError(
            "from_svmlight writes a new store, and a store needs a 'train' split; write a "
            f"{split!r} split next to it with write_svmlight_split"
        )
    user_attrs = dict(attrs or {})
    if "svmlight" in user_attrs:
        raise ValueError("attrs['svmlight'] is reserved for the ingest's own record")
    kw: dict[str, Any] = dict(
        n_features=n_features,
        zero_based=zero_based,
        dtype=dtype,
        query_id=query_id,
        block_nnz=block_nnz,
        n_feature_blocks=n_feature_blocks,
        formats=formats,
        batch_bytes=batch_bytes,
        max_line_bytes=max_line_bytes,
    )
    _settings(src, split, **kw)  # refuse bad arguments before dst is created
    with StoreWriter(dst, overwrite=overwrite, attrs=user_attrs) as w:
        write_svmlight_split(w, src, split=split, **kw)
    return open_store(dst)


def write_svmlight_split(
    writer: StoreWriter,
    src: str | os.PathLike,
    *,
    split: str = "train",
    n_features: int | None = None,
    zero_based: bool | str = "auto",
    dtype: Any = np.float64,
    query_id: bool = False,
    block_nnz: int = DEFAULT_BLOCK_NNZ,
    n_feature_blocks: int | None = None,
    formats: tuple[str, ...] = ("csc",),
    batch_bytes: int = 16 << 20,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
) -> dict[str, Any]:
    """Stream an svmlight / libsvm file into one split of an open store writer.

    The building block of :func:`from_svmlight`, with the same parameters, parsing rules,
    errors and memory bound; use it to put a train and a test file into one store::

        with StoreWriter(dst) as w:
            write_svmlight_split(w, "a.train", split="train", zero_based=False)
            write_svmlight_split(w, "a.test", split="test", zero_based=False, n_features=p)

    (pass ``zero_based`` explicitly, and the train split's number of features to the test
    split, so that both splits index the same columns).

    Returns
    -------
    dict
        The ingest's record (source, settings, rows, nnz, ...), also stored in
        ``writer.attrs["svmlight"][split]``.
    """
    st = _settings(
        src,
        split,
        n_features=n_features,
        zero_based=zero_based,
        dtype=dtype,
        query_id=query_id,
        block_nnz=block_nnz,
        n_feature_blocks=n_feature_blocks,
        formats=formats,
        batch_bytes=batch_bytes,
        max_line_bytes=max_line_bytes,
    )
    src_path = Path(src)
    with _open_text(src_path, st["compression"]) as fh:
        sw = writer.split(
            split,
            n_features=st["n_features"],
            dtype=np.dtype(st["dtype"]),
            block_nnz=block_nnz,
            n_feature_blocks=n_feature_blocks,
            formats=tuple(formats),
        )
        ingest = _Ingest(sw, os.fspath(src), st["mode"], st["n_features"],
                         np.dtype(st["dtype"]), st["max_line_bytes"])  # fmt: skip
        t0 = time.perf_counter()
        ingest.run(fh, st["batch_bytes"])
        base = ingest.index_base(st["zero_based"])
        t_parse = time.perf_counter() - t0
    sw.close(index_base=base)
    del st["mode"]
    record = {
        **st,
        "index_base": base,
        "text_bytes": ingest.text_bytes,
        "text_crc32c": ingest.crc,
        "lines": ingest.line + (not ingest.ends_with_newline),
        "rows": ingest.rows,
        "nnz": ingest.nnz,
        "seconds_read_parse_append": round(t_parse, 3),
        "seconds_total": round(time.perf_counter() - t0, 3),
    }
    writer.attrs.setdefault("svmlight", {})[split] = record
    return record


def _settings(
    src: str | os.PathLike,
    split: str,
    *,
    n_features: int | None,
    zero_based: bool | str,
    dtype: Any,
    query_id: bool,
    block_nnz: int,
    n_feature_blocks: int | None,
    formats: tuple[str, ...],
    batch_bytes: int,
    max_line_bytes: int,
) -> dict[str, Any]:
    """Checked settings of an ingest and the facts of its source file."""
    if query_id:
        raise NotImplementedError(
            "query_id=True: a dl1 store has no place for query ids yet; with query_id=False "
            "the qid:N tokens are validated and dropped"
        )
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if isinstance(zero_based, str):
        if zero_based != "auto":
            raise ValueError(f"zero_based must be True, False or 'auto', got {zero_based!r}")
        mode = svmlight_kernels.AUTO_BASED
    else:
        zero_based = bool(zero_based)
        mode = svmlight_kernels.ZERO_BASED if zero_based else svmlight_kernels.ONE_BASED
    dtype = np.dtype(dtype)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be float64 or float32, got {dtype}")
    if n_features is not None:
        n_features = int(n_features)
        if not 1 <= n_features <= svmlight_kernels.MAX_INDEX + 1:
            raise ValueError(f"n_features must be in [1, 2**31], got {n_features}")
    if not 1 <= int(batch_bytes) <= MAX_BATCH_BYTES:
        raise ValueError(f"batch_bytes must be in [1, {MAX_BATCH_BYTES}], got {batch_bytes}")
    if not 1 <= int(max_line_bytes) <= MAX_LINE_BYTES:
        raise ValueError(f"max_line_bytes must be in [1, {MAX_LINE_BYTES}], got {max_line_bytes}")
    if any(f not in FORMATS for f in formats):
        raise ValueError(f"formats must be a subset of {FORMATS}, got {formats}")
    src_path = Path(src)
    if not src_path.is_file():
        raise FileNotFoundError(f"no svmlight file at {src_path}")
    compression = _compression(src_path)
    return {
        "name": src_path.name,
        "path": os.fspath(src_path.absolute()),
        "size": src_path.stat().st_size,
        "compression": compression,
        "zero_based": zero_based,
        "n_features": n_features,
        "dtype": dtype.name,
        "query_id": bool(query_id),
        "batch_bytes": int(batch_bytes),
        "max_line_bytes": int(max_line_bytes),
        "mode": mode,
    }


class _Ingest:
    """State of one streaming parse: the line count, index range and source checksum."""

    def __init__(
        self,
        sw: SplitWriter,
        name: str,
        mode: int,
        n_features: int | None,
        dtype: np.dtype,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    ) -> None:
        self.sw = sw
        self.name = name
        self.mode = mode
        self.n_features = -1 if n_features is None else n_features
        self.dtype = dtype
        self.line = 0  # lines before the current batch
        self.rows = 0
        self.nnz = 0
        self.text_bytes = 0
        self.crc = 0
        self.min_index = svmlight_kernels.MAX_INDEX + 1
        self.max_index = -1
        self.max_lines = (0, 0)  # the lines of the batch holding the largest index
        # first line with index == n_features (an error only if the file is zero-based)
        self.eq_error: str | None = None
        self.ends_with_newline = True
        self.max_line_bytes = max_line_bytes  # a buffer grows to hold a line up to this

    def error(self, line_in_batch: int, problem: str, token: str) -> SvmlightFormatError:
        return SvmlightFormatError(
            f"{self.name}, line {self.line + line_in_batch + 1}: {problem}: {token}"
        )

    def run(self, fh: BinaryIO, batch_bytes: int) -> None:
        """Read, parse and append the whole file.

        A reader thread reads (and decompresses) the next batch and parses it while this
        thread appends the previous one; two buffers circulate between them, so at most two
        batches are alive. A buffer grows to hold a line longer than it, up to
        ``max_line_bytes``.
        """
        free: queue.Queue = queue.Queue()
        ready: queue.Queue = queue.Queue()
        for _ in range(2):
            free.put(np.empty(batch_bytes, dtype=np.uint8))
        stop = threading.Event()
        reader = threading.Thread(
            target=self._produce, args=(fh, free, ready, stop), name="dl1-svmlight-reader"
        )
        reader.start()
        try:
            while True:
                item = ready.get()
                if isinstance(item, BaseException):
                    raise item
                if item is None:
                    break
                buf, cut, parsed = item
                self.text_bytes += cut
                self.ends_with_newline = bool(buf[cut - 1] == 10)
                self.batch(buf[:cut], parsed)
                del parsed, item
                free.put(buf)
        finally:
            stop.set()
            free.put(None)
            reader.join()

    def _produce(
        self, fh: BinaryIO, free: queue.Queue, ready: queue.Queue, stop: threading.Event
    ) -> None:
        """Reader thread: fill a buffer, cut it after its last newline, parse the lines."""
        try:
            buf = free.get()
            filled = 0
            offset = 0  # bytes of the file before buf
            while buf is not None and not stop.is_set():
                got = _readinto_full(fh, memoryview(buf)[filled:])
                total = filled + got
                eof = total < buf.shape[0]
                if total == 0:
                    break
                cut = total if eof else int(svmlight_kernels.last_newline(buf, total)) + 1
                if cut == 0:
                    # no newline in a full buffer: a line longer than the buffer
                    if buf.shape[0] >= self.max_line_bytes:
                        raise SvmlightFormatError(
                            f"{self.name}: the line starting at byte {offset} is longer than "
                            f"max_line_bytes ({self.max_line_bytes:,} bytes); raise "
                            "max_line_bytes (at most 2 GiB) if such lines are meant"
                        )
                    size = min(2 * buf.shape[0], self.max_line_bytes)
                    bigger = np.empty(size, dtype=np.uint8)
                    bigger[:total] = buf[:total]
                    buf = bigger
                    filled = total
                    continue
                view = buf[:cut]
                self.crc = crc32c.crc32c(memoryview(view), self.crc)
                parsed = svmlight_kernels.parse_lines(view, self.mode, self.n_features, False)
                tail = total - cut
                nxt = None
                if not eof:
                    nxt = free.get()
                    if nxt is not None:
                        if nxt.shape[0] < buf.shape[0]:
                            nxt = np.empty(buf.shape[0], dtype=np.uint8)
                        nxt[:tail] = buf[cut:total]
                ready.put((buf, cut, parsed))
                del parsed, view
                buf = nxt
                filled = tail
                offset += cut
            ready.put(None)
        except BaseException as e:  # handed to the main thread, which raises it
            ready.put(e)

    def batch(self, buf: np.ndarray, parsed: tuple) -> None:
        """Convert the slow tokens of parsed lines, check them, and append the rows."""
        (
            status,
            err_line,
            err_s,
            err_e,
            n_rows,
            n_nl,
            n_slow,
            y,
            indptr,
            indices,
            data,
            _qid,
            min_idx,
            max_idx,
            eq_line,
            eq_s,
            eq_e,
        ) = parsed
        nnz = int(indptr[n_rows])
        y = y[:n_rows]
        indptr = indptr[: n_rows + 1]
        data = data[:nnz]
        indices = indices[:nnz]
        # Problems found after the kernel are in rows before its own problem, if any.
        first: tuple[int, str, str] | None = None
        if n_slow:
            first = self._convert_slow(buf, y, indptr, data)
        if self.dtype == np.float32:
            with np.errstate(over="ignore"):
                data = data.astype(np.float32)
            bad = ~np.isfinite(data)
            if bad.any():
                k = int(np.flatnonzero(bad)[0])
                r = int(np.searchsorted(indptr, k, "right")) - 1
                if first is None or r < first[0]:
                    tok = self._feature_token(buf, self._row_offset(buf, r), k - int(indptr[r]))
                    first = (r, "value overflows float32", tok)
        if first is not None:
            r, problem, tok = first
            raise self.error(self._line_of(buf, self._row_offset(buf, r)), problem, tok)
        if status != svmlight_kernels.OK:
            if status == svmlight_kernels.INDEX_TOO_LARGE:
                problem = (
                    f"feature index out of range for n_features={self.n_features}"
                    + {
                        svmlight_kernels.ZERO_BASED: " (zero-based)",
                        svmlight_kernels.ONE_BASED: " (one-based)",
                        svmlight_kernels.AUTO_BASED: "",
                    }[self.mode]
                )
            else:
                problem = _PROBLEMS[status]
            raise self.error(err_line, problem, _token(buf, err_s, err_e))
        if eq_line >= 0 and self.eq_error is None:
            self.eq_error = str(
                self.error(
                    eq_line,
                    f"feature index out of range for n_features={self.n_features} "
                    "(the file is zero-based: it has an index 0)",
                    _token(buf, eq_s, eq_e),
                )
            )
        if n_rows:
            self.sw.append((data, indices, indptr), y)
            self.rows += n_rows
            self.nnz += nnz
            self.min_index = min(self.min_index, int(min_idx))
            if max_idx > self.max_index:
                self.max_index = int(max_idx)
                self.max_lines = (self.line + 1, self.line + max(n_nl, 1))
        self.line += n_nl

    def _convert_slow(
        self,
        buf: np.ndarray,
        y: np.ndarray,
        indptr: np.ndarray,
        data: np.ndarray,
    ) -> tuple[int, str, str] | None:
        """Convert the tokens the kernel left as NaN with ``float()``, in file order.

        Returns the first problem as ``(row, problem, token)``, or None.
        """
        slow_rows = np.flatnonzero(np.isnan(y))
        slow_k = np.flatnonzero(np.isnan(data))
        k_rows = np.searchsorted(indptr, slow_k, "right") - 1
        rows = np.union1d(slow_rows, k_rows)
        starts = svmlight_kernels.row_offsets(buf, rows.astype(np.int64)).tolist()
        labels_slow = set(slow_rows.tolist())
        ks, krs = slow_k.tolist(), k_rows.tolist()
        y_vals: list[float] = []
        d_vals: list[float] = []
        j = 0
        for r, start, k0 in zip(rows.tolist(), starts, indptr[rows].tolist(), strict=True):
            tokens = self._line_bytes(buf, start).split()
            feats = tokens[1:]
            if feats and feats[0].startswith(b"qid"):
                feats = feats[1:]
            todo = [(-1, tokens[0], tokens[0])] if r in labels_slow else []
            while j < len(ks) and krs[j] == r:
                tok = feats[ks[j] - k0]
                todo.append((ks[j], tok.split(b":", 1)[1], tok))
                j += 1
            for k, text, tok in todo:
                what = "label" if k < 0 else "value"
                try:
                    v = float(text)
                except ValueError:
                    v = None
                if v is None or not math.isfinite(v):
                    problem = "is not a number" if v is None else "is NaN or infinite"
                    return r, f"{what} {problem}", repr(tok[:60].decode("utf-8", "replace"))
                (y_vals if k < 0 else d_vals).append(v)
        y[slow_rows] = y_vals
        data[slow_k] = d_vals
        return None

    @staticmethod
    def _line_bytes(buf: np.ndarray, start: int) -> bytes:
        line = bytes(buf[start : svmlight_kernels.line_end(buf, start)])
        hash_pos = line.find(b"#")
        return line if hash_pos < 0 else line[:hash_pos]

    @staticmethod
    def _row_offset(buf: np.ndarray, r: int) -> int:
        return int(svmlight_kernels.row_offsets(buf, np.array([r], dtype=np.int64))[0])

    @staticmethod
    def _line_of(buf: np.ndarray, start: int) -> int:
        return int(svmlight_kernels.count_lines(buf, int(start)))

    def _feature_token(self, buf: np.ndarray, start: int, j: int) -> str:
        feats = self._line_bytes(buf, int(start)).split()[1:]
        if feats and feats[0].startswith(b"qid"):
            feats = feats[1:]
        return repr(feats[j][:60].decode("utf-8", errors="replace"))

    def index_base(self, zero_based: bool | str) -> int:
        """The index base, after the whole file was read; raises a pending range error."""
        if zero_based == "auto":
            base = 1 if self.max_index >= 0 and self.min_index > 0 else 0
        else:
            base = 0 if zero_based else 1
        if base == 0 and self.eq_error is not None:
            raise SvmlightFormatError(self.eq_error)
        self._check_width(base)
        return base

    def _check_width(self, base: int) -> None:
        """Refuse a width the file's nonzeros do not justify (see :data:`WIDTH_FREE`),
        unless ``n_features`` was given."""
        width = self.max_index + 1 - base
        limit = max(WIDTH_FREE, WIDTH_PER_NONZERO * self.nnz)
        if self.n_features >= 0 or width <= limit:
            return
        a, b = self.max_lines
        where = f"line {a}" if a == b else f"lines {a}-{b}"
        raise SvmlightFormatError(
            f"{self.name}, {where}: feature index {self.max_index} makes the store "
            f"{width:,} columns wide for {self.nnz:,} nonzeros; a store and each fit keep "
            f"arrays of one entry per column ({8 * width / 2**30:.2f} GiB each here), so "
            f"widths above max({WIDTH_FREE:,}, {WIDTH_PER_NONZERO} x nonzeros) are refused; "
            "give n_features (dl1 convert --n-features) to keep this width"
        )


__all__ = ["from_svmlight", "memory_bound", "write_svmlight_split"]
