"""One split of a store being written (:class:`SplitWriter`, opened by
:class:`dl1.store.writer.StoreWriter`): row batches validated, sorted by column and
spilled, then each feature block assembled from its column range of every spilled batch,
checksummed and written (:func:`write_block`); the bounds on its memory are stated in
:mod:`dl1.store.writer`.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import scipy.sparse as sp

from dl1.errors import ValidationError
from dl1.kernels import store as store_kernels
from dl1.store.format import (
    CHUNK_ELEMS,
    DTYPES,
    FORMATS,
    block_digest,
    block_key,
    write_array,
    write_array_from_file,
    write_array_pieces,
)

#: Most columns of a feature block (its CSC index pointer is 8 bytes per column).
MAX_BLOCK_COLS = CHUNK_ELEMS
#: Default target of nonzeros per block (4 Mi: about 48 MiB of float64 CSC).
DEFAULT_BLOCK_NNZ = 1 << 22
MAX_BLOCK_NNZ = (1 << 31) - 1



class SplitOwner(Protocol):
    """What a split needs of the :class:`~dl1.store.writer.StoreWriter` that opened it."""

    path: Path
    chunk_elems: int
    _spill: Path

    def register_split(self, name: str, entry: dict[str, Any]) -> None: ...


def _as_csr_arrays(X: Any, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(data, indices, indptr, n_cols_or_-1) of a batch, with checked dtypes."""
    if isinstance(X, tuple):
        data, indices, indptr = X
        n_cols = -1
    else:
        if not sp.issparse(X):
            X = sp.csr_matrix(np.asarray(X))
        if X.format != "csr":
            X = X.tocsr()
        data, indices, indptr = X.data, X.indices, X.indptr
        n_cols = X.shape[1]
    data = np.asarray(data)
    if data.dtype != dtype:
        if data.dtype == np.float32 and dtype == np.float64:
            data = data.astype(np.float64)
        else:
            raise ValidationError(
                f"unsupported value dtype {data.dtype} for a store of dtype {dtype}; "
                "stores hold float32 or float64 (cast explicitly if that is what you want)"
            )
    indices = np.asarray(indices)
    if indices.dtype.kind not in "iu":
        raise ValidationError(f"indices must be integers, got dtype {indices.dtype}")
    if indices.dtype != np.int32:
        if indices.size and (indices.max() >= 2**31 or indices.min() < -(2**31)):
            raise ValidationError("column indices >= 2**31 are not supported")
        indices = indices.astype(np.int32)
    indptr = np.asarray(indptr).astype(np.int64, copy=False)
    return data, indices, indptr, n_cols


class SplitWriter:
    """Append row batches of one split; :meth:`close` transposes them into blocks.

    Obtained from :meth:`StoreWriter.split`. Column indices are stored as given
    ("raw"); ``close(index_base=1)`` turns one-based raw indices into zero-based columns.
    """

    def __init__(
        self,
        owner: SplitOwner,
        name: str,
        *,
        n_features: int | None,
        dtype: Any,
        block_nnz: int,
        n_feature_blocks: int | None,
        col_bounds: Any,
        row_block_rows: int | None,
        formats: tuple[str, ...],
        has_sample_weight: bool,
    ) -> None:
        self.owner = owner
        self.name = name
        self.dtype = np.dtype(dtype)
        if self.dtype not in DTYPES:
            raise ValidationError(f"unsupported dtype {self.dtype}; use float32 or float64")
        formats = tuple(formats)
        if (
            not formats
            or any(f not in FORMATS for f in formats)
            or len(set(formats)) != len(formats)
        ):
            raise ValueError(f"formats must be a non-empty subset of {FORMATS}, got {formats}")
        self.formats = formats
        if not 1 <= block_nnz <= MAX_BLOCK_NNZ:
            raise ValueError(f"block_nnz must be in [1, {MAX_BLOCK_NNZ}], got {block_nnz}")
        self.block_nnz = int(block_nnz)
        self.n_features = None if n_features is None else int(n_features)
        self.n_feature_blocks = n_feature_blocks
        self.col_bounds = None if col_bounds is None else np.asarray(col_bounds, dtype=np.int64)
        self.row_block_rows = row_block_rows
        self.has_sample_weight = has_sample_weight
        self.dir = owner._spill / name
        self.dir.mkdir()
        self._fh = {
            k: open(self.dir / f"{k}.bin", "ab")
            for k in ("rows", "cols", "vals", "y", "w", "row_nnz")
        }
        # per batch: first row, number of rows, first entry, number of entries
        self._batches: list[tuple[int, int, int, int]] = []
        self.n_rows = 0
        self.nnz = 0
        self.min_index: int | None = None
        self.max_index: int | None = None
        self.argmin_row = -1
        self.argmax_row = -1
        self._stats = ColumnStats()
        self.closed = False

    def append(self, X: Any, y: Any, sample_weight: Any = None) -> None:
        """Append a batch of rows.

        Parameters
        ----------
        X : scipy.sparse matrix, dense array, or tuple ``(data, indices, indptr)`` of CSR
            arrays. Indices within a row must be sorted and unique, values finite.
        y : array of length ``X.shape[0]``, finite.
        sample_weight : array of the same length, finite and non-negative; required if and
            only if the split was opened with ``has_sample_weight=True``.
        """
        if self.closed:
            raise RuntimeError("split writer is closed")
        data, indices, indptr, n_cols = _as_csr_arrays(X, self.dtype)
        n_b = indptr.shape[0] - 1
        r0 = self.n_rows
        if self.n_features is not None and n_cols > self.n_features:
            raise ValidationError(
                f"batch starting at row {r0} has {n_cols} columns, more than "
                f"n_features={self.n_features}"
            )
        status, r, k = store_kernels.check_compressed(indptr, indices, data, -1)
        if status != store_kernels.OK:
            where = f"row {r0 + r}"
            if status != store_kernels.BAD_INDPTR:
                where += f", column index {int(indices[k])}"
            raise ValidationError(f"split {self.name!r}, {where}: {store_kernels.PROBLEMS[status]}")
        y = np.asarray(y, dtype=np.float64).reshape(-1)
        if y.shape[0] != n_b:
            raise ValidationError(
                f"split {self.name!r}, rows {r0}..{r0 + n_b - 1}: y has {y.shape[0]} values "
                f"for {n_b} rows"
            )
        check_finite(y, "y", self.name, r0)
        if self.has_sample_weight != (sample_weight is not None):
            raise ValidationError(
                f"split {self.name!r}: sample_weight must be given for every batch or none"
            )
        if sample_weight is not None:
            w = np.asarray(sample_weight, dtype=np.float64).reshape(-1)
            if w.shape[0] != n_b:
                raise ValidationError(
                    f"split {self.name!r}: sample_weight has {w.shape[0]} values for {n_b} rows"
                )
            check_finite(w, "sample_weight", self.name, r0)
            if (w < 0).any():
                bad = int(np.flatnonzero(w < 0)[0])
                raise ValidationError(
                    f"split {self.name!r}, row {r0 + bad}: negative sample_weight {w[bad]}"
                )
            w.tofile(self._fh["w"])
        nnz_b = indices.shape[0]
        if nnz_b:
            lo = int(indices.min())
            hi = int(indices.max())
            if self.min_index is None or lo < self.min_index:
                self.min_index = lo
                self.argmin_row = r0 + int(np.searchsorted(indptr, np.argmin(indices), "right")) - 1
            if self.max_index is None or hi > self.max_index:
                self.max_index = hi
                self.argmax_row = r0 + int(np.searchsorted(indptr, np.argmax(indices), "right")) - 1
        rows, cols, vals = _col_sorted(indptr, indices, data)
        rows.tofile(self._fh["rows"])
        cols.tofile(self._fh["cols"])
        vals.tofile(self._fh["vals"])
        y.tofile(self._fh["y"])
        np.diff(indptr).tofile(self._fh["row_nnz"])
        self._batches.append((r0, n_b, self.nnz, nnz_b))
        self._stats.add(cols, vals)
        self.n_rows += n_b
        self.nnz += nnz_b

    # ------------------------------------------------------------------ close
    def close(self, *, index_base: int = 0) -> dict[str, Any]:
        """Transpose the spilled batches into blocks and write the split.

        Parameters
        ----------
        index_base : int
            Raw column index of the first column (1 for one-based input).
        """
        if self.closed:
            raise RuntimeError("split writer is closed")
        for fh in self._fh.values():
            fh.close()
        if self.min_index is not None and self.min_index - index_base < 0:
            raise ValidationError(
                f"split {self.name!r}, row {self.argmin_row}: column index {self.min_index} is "
                f"below the index base {index_base}"
            )
        seen = 0 if self.max_index is None else self.max_index + 1 - index_base
        p = seen if self.n_features is None else self.n_features
        if seen > p:
            raise ValidationError(
                f"split {self.name!r}, row {self.argmax_row}: column index {self.max_index} is "
                f"out of range for n_features={p} (index base {index_base})"
            )
        n = self.n_rows
        st = self._stats
        cols = st.cols - index_base  # distinct columns present, zero-based, sorted
        row_bounds = self._row_bounds(st.nnz)
        col_bounds = self._col_bounds(cols, st.nnz, p, len(row_bounds) - 1)
        if self.col_bounds is None:
            col_bounds = _split_wide(col_bounds)
        root = self.owner.path
        ce = self.owner.chunk_elems
        blocks: dict[str, list[list[dict[str, Any]]]] = {f: [] for f in self.formats}
        for i in range(len(row_bounds) - 1):
            for f in self.formats:
                blocks[f].append([])
            for j in range(len(col_bounds) - 1):
                indptr, indices, data = self._assemble(
                    row_bounds[i], row_bounds[i + 1], col_bounds[j], col_bounds[j + 1], index_base
                )
                shape = (
                    int(row_bounds[i + 1] - row_bounds[i]),
                    int(col_bounds[j + 1] - col_bounds[j]),
                )
                tie = None
                if len(self.formats) > 1:  # the layouts' shared digest ties them
                    tie = block_digest(indptr, indices, data, shape, "csc")
                for f in self.formats:
                    if f == "csc":
                        arrs = (indptr, indices, data)
                    else:
                        m = sp.csc_matrix((data, indices, indptr), shape=shape).tocsr()
                        m.sort_indices()
                        arrs = (m.indptr.astype(np.int64), m.indices.astype(np.int32), m.data)
                    blocks[f][i].append(
                        write_block(root, self.name, f, i, j, *arrs, chunk_elems=ce, content=tie)
                    )
                del indptr, indices, data
        arrays = {
            "y": write_array_from_file(
                root, f"{self.name}/y", self.dir / "y.bin", np.float64, chunk_elems=ce
            ),
            **{
                f"stats/{name}": write_array_pieces(
                    root, f"{self.name}/stats/{name}", p, _scatter(cols, values), chunk_elems=ce
                )
                for name, values in (
                    ("col_nnz", st.nnz),
                    ("col_sum", st.sum),
                    ("col_sqsum", st.sqsum),
                )
            },
            "stats/row_nnz": write_array_from_file(
                root,
                f"{self.name}/stats/row_nnz",
                self.dir / "row_nnz.bin",
                np.int64,
                chunk_elems=ce,
            ),
        }
        if self.has_sample_weight:
            arrays["sample_weight"] = write_array_from_file(
                root,
                f"{self.name}/sample_weight",
                self.dir / "w.bin",
                np.float64,
                chunk_elems=ce,
            )
        entry = {
            "shape": [n, p],
            "nnz": int(self.nnz),
            "dtype": self.dtype.str,
            "formats": list(self.formats),
            "row_bounds": [int(b) for b in row_bounds],
            "col_bounds": [int(b) for b in col_bounds],
            "has_sample_weight": self.has_sample_weight,
            "blocks": blocks,
            "arrays": arrays,
        }
        shutil.rmtree(self.dir, ignore_errors=True)
        self.closed = True
        self.owner.register_split(self.name, entry)
        return entry

    def __enter__(self) -> SplitWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None and not self.closed:
            self.close()

    def _row_bounds(self, col_nnz: np.ndarray) -> np.ndarray:
        n = self.n_rows
        if self.row_block_rows is not None:
            step = int(self.row_block_rows)
            if step < 1:
                raise ValueError("row_block_rows must be >= 1")
            n_rb = max(1, -(-n // step))
            return np.minimum(np.arange(n_rb + 1, dtype=np.int64) * step, n)
        # One row block unless a single column holds more than block_nnz nonzeros.
        max_col = int(col_nnz.max()) if col_nnz.size else 0
        n_rb = max(1, min(n, -(-max_col // self.block_nnz)))
        return np.linspace(0, n, n_rb + 1).round().astype(np.int64)

    def _col_bounds(self, cols: np.ndarray, col_nnz: np.ndarray, p: int, n_rb: int) -> np.ndarray:
        """Feature block bounds: as given, or cuts of equal nnz (``col_nnz`` of the sorted
        distinct columns ``cols``; absent columns hold none)."""
        if self.col_bounds is not None:
            b = self.col_bounds
            if b.ndim != 1 or b.size < 2 or b[0] != 0 or b[-1] != p or np.any(np.diff(b) <= 0):
                raise ValueError(
                    f"col_bounds must increase strictly from 0 to n_features={p}, got {b.tolist()}"
                )
            return b
        total = int(col_nnz.sum())
        if self.n_feature_blocks is not None:
            n_fb = int(self.n_feature_blocks)
        else:
            n_fb = max(1, math.ceil(total / (self.block_nnz * n_rb)))
        n_fb = max(1, min(n_fb, p)) if p else 1
        if p == 0:
            return np.array([0, 0], dtype=np.int64)
        if total == 0:
            return np.linspace(0, p, n_fb + 1).round().astype(np.int64)
        # Equal-nnz cuts: column c ends in the block whose share of the cumulative nnz it reaches
        # (the cumulative count only rises at the columns present).
        cum = np.cumsum(col_nnz)
        targets = total * np.arange(1, n_fb, dtype=np.float64) / n_fb
        cuts = cols[np.searchsorted(cum, targets, side="left")] + 1
        b = np.concatenate([[0], cuts, [p]]).astype(np.int64)
        # Keep every block non-empty in columns.
        for k in range(1, len(b) - 1):
            b[k] = min(max(b[k], b[k - 1] + 1), p - (len(b) - 1 - k))
        return b

    def _assemble(
        self, r_lo: int, r_hi: int, c_lo: int, c_hi: int, base: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """CSC arrays of the block rows [r_lo, r_hi) x columns [c_lo, c_hi)."""
        raw_lo, raw_hi = c_lo + base, c_hi + base
        parts_r, parts_c, parts_v = [], [], []
        isz = np.dtype(np.int32).itemsize
        vsz = self.dtype.itemsize
        with (
            open(self.dir / "rows.bin", "rb") as fr,
            open(self.dir / "cols.bin", "rb") as fc,
            open(self.dir / "vals.bin", "rb") as fv,
        ):
            for row0, n_b, e0, nnz_b in self._batches:
                if row0 + n_b <= r_lo or row0 >= r_hi or nnz_b == 0:
                    continue
                # the batch's entries are sorted by column: its column range by binary search
                a = _lower_bound(fc.fileno(), e0, nnz_b, raw_lo)
                b = _lower_bound(fc.fileno(), e0, nnz_b, raw_hi)
                if b == a:
                    continue
                fr.seek((e0 + a) * isz)
                rows = np.fromfile(fr, dtype=np.int32, count=b - a)
                fc.seek((e0 + a) * isz)
                cols = np.fromfile(fc, dtype=np.int32, count=b - a)
                fv.seek((e0 + a) * vsz)
                vals = np.fromfile(fv, dtype=self.dtype, count=b - a)
                if row0 < r_lo or row0 + n_b > r_hi:
                    grow = rows.astype(np.int64) + row0
                    keep = (grow >= r_lo) & (grow < r_hi)
                    rows, cols, vals = rows[keep], cols[keep], vals[keep]
                parts_r.append((rows + np.int32(row0 - r_lo)).astype(np.int32, copy=False))
                parts_c.append((cols - np.int32(raw_lo)).astype(np.int32, copy=False))
                parts_v.append(vals)
        if parts_r:
            rows = np.concatenate(parts_r)
            cols = np.concatenate(parts_c)
            vals = np.concatenate(parts_v)
        else:
            rows = np.zeros(0, dtype=np.int32)
            cols = np.zeros(0, dtype=np.int32)
            vals = np.zeros(0, dtype=self.dtype)
        del parts_r, parts_c, parts_v
        return store_kernels.coo_to_csc(rows, cols, vals, c_hi - c_lo)


def _lower_bound(fd: int, e0: int, n: int, key: int) -> int:
    """First of the ``n`` sorted int32 columns spilled from entry ``e0`` that is ``>= key``
    (binary search by ``pread``: a few pages read, none mapped)."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        if int.from_bytes(os.pread(fd, 4, (e0 + mid) * 4), "little", signed=True) < key:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _col_sorted(
    indptr: np.ndarray, indices: np.ndarray, data: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(rows, cols, vals)`` of a CSR batch sorted by column, rows ascending in a column.

    A counting sort (O(nnz + columns)) when the batch's column range is not much wider
    than its nonzeros, else a stable comparison sort, so that memory stays O(nnz) whatever
    the largest index.
    """
    nnz = indices.shape[0]
    n_raw = int(indices.max()) + 1 if nnz else 0
    if n_raw <= 4 * nnz + 4096:
        rows, cols, vals, _ = store_kernels.csr_to_col_sorted(indptr, indices, data, 0, n_raw)
        return rows, cols, vals
    order = np.argsort(indices, kind="stable")
    rows = np.repeat(np.arange(indptr.shape[0] - 1, dtype=np.int32), np.diff(indptr))
    return rows[order], indices[order], data[order]


class ColumnStats:
    """Nonzeros, sums and squared sums of the distinct columns seen so far (sorted), so
    that memory follows the columns present, not the largest index."""

    def __init__(self) -> None:
        self.cols = np.zeros(0, dtype=np.int64)
        self.nnz = np.zeros(0, dtype=np.int64)
        self.sum = np.zeros(0, dtype=np.float64)
        self.sqsum = np.zeros(0, dtype=np.float64)

    def add(self, cols: np.ndarray, vals: np.ndarray) -> None:
        """Add a batch's entries, sorted by column (:func:`_col_sorted`)."""
        if not cols.shape[0]:
            return
        starts = np.flatnonzero(np.r_[True, cols[1:] != cols[:-1]])
        present = cols[starts].astype(np.int64)
        run = np.repeat(np.arange(starts.shape[0]), np.diff(np.r_[starts, cols.shape[0]]))
        counts = np.bincount(run)
        sums = np.bincount(run, weights=vals)
        with np.errstate(over="ignore"):  # |x| > 1.3e154: the statistic is inf, not an error
            sq = np.square(vals, dtype=np.float64)
        sqsums = np.bincount(run, weights=sq)
        pos = np.searchsorted(self.cols, present)
        new = pos >= self.cols.shape[0]
        new[~new] = self.cols[pos[~new]] != present[~new]
        if new.any():
            at = pos[new]
            self.cols = np.insert(self.cols, at, present[new])
            for name in ("nnz", "sum", "sqsum"):
                setattr(self, name, np.insert(getattr(self, name), at, 0))
            pos = np.searchsorted(self.cols, present)
        self.nnz[pos] += counts
        self.sum[pos] += sums
        self.sqsum[pos] += sqsums


def _scatter(cols: np.ndarray, values: np.ndarray):
    """Pieces ``[lo, hi)`` of the dense array that is ``values`` at ``cols``, 0 elsewhere."""

    def piece(lo: int, hi: int) -> np.ndarray:
        out = np.zeros(hi - lo, dtype=values.dtype)
        a, b = np.searchsorted(cols, [lo, hi]).tolist()
        out[cols[a:b] - lo] = values[a:b]
        return out

    return piece


def _split_wide(bounds: np.ndarray) -> np.ndarray:
    """Block bounds with any block wider than :data:`MAX_BLOCK_COLS` cut evenly."""
    width = np.diff(bounds)
    if not width.size or width.max() <= MAX_BLOCK_COLS:
        return bounds
    out = [bounds[:1]]
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        k = -(-(hi - lo) // MAX_BLOCK_COLS)
        out.append(np.linspace(lo, hi, k + 1).round().astype(np.int64)[1:])
    return np.concatenate(out)


def check_finite(a: np.ndarray, what: str, split: str, r0: int) -> None:
    bad = ~np.isfinite(a)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise ValidationError(f"split {split!r}, row {r0 + k}: {what} is {a[k]} (not finite)")


def write_block(
    root: str | os.PathLike,
    split: str,
    fmt: str,
    i: int,
    j: int,
    indptr: np.ndarray,
    indices: np.ndarray,
    data: np.ndarray,
    *,
    chunk_elems: int = CHUNK_ELEMS,
    content: int | None = None,
) -> dict[str, Any]:
    """Write the arrays of one block; return its manifest entry (nnz and array entries, and
    ``content``, the digest shared by the block's layouts, when the split has two)."""
    key = block_key(split, fmt, i, j)
    extra = {} if content is None else {"content": int(content)}
    return {
        **extra,
        "nnz": int(indices.shape[0]),
        "arrays": {
            "indptr": write_array(
                root, f"{key}/indptr", indptr.astype(np.int64, copy=False), chunk_elems=chunk_elems
            ),
            "indices": write_array(
                root,
                f"{key}/indices",
                indices.astype(np.int32, copy=False),
                chunk_elems=chunk_elems,
            ),
            "data": write_array(root, f"{key}/data", data, chunk_elems=chunk_elems),
        },
    }
