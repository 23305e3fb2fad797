"""Writing dl1 stores: an out-of-core row-to-feature-block transpose.

Rows arrive in batches (CSR). Each batch is validated, sorted by column (a counting sort,
or a comparison sort when its columns are few over a wide range) and spilled to raw files
inside the store directory. When a split is closed, each block ``(i, j)`` is assembled by
reading only its column range from every spilled batch (found by binary search in the
batch's sorted columns), sorted into CSC, checksummed and written.

A store bound for a URL (``s3://``, ``gs://``, ``abfs://``, ``memory://``) is written the
same way into a private local staging directory, then uploaded with its manifest last
(:mod:`dl1.store.upload`): the local disk it needs is the store's size.

Memory is bounded independently of the number of rows and nonzeros, and of the largest
column index: per-column work is over the distinct columns present. Above the interpreter's
baseline, a :class:`SplitWriter` holds

* one batch being appended and its sorted copy: about ``3 * 16 * batch_nnz`` bytes;
* one block being assembled (spilled entries, CSC arrays and, if asked, CSR arrays):
  about ``64 * block_nnz`` bytes, where a block holds at most ``block_nnz`` nonzeros plus the
  nonzeros of one column inside one row block (row blocks are added automatically when a
  single column holds more than ``block_nnz`` nonzeros);
* per-column statistics of the distinct columns present: ``32 * d`` bytes (``40 * d``
  while new columns are merged in), ``d <= min(n_features, nnz)``;
* when closing, one chunk of the length-n and length-p arrays (``y``, weights, row counts,
  column statistics), which are written chunk by chunk, and one block's index pointer:
  a feature block spans at most :data:`MAX_BLOCK_COLS` columns.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from dl1 import __version__
from dl1.store.format import (
    CHUNK_ELEMS,
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST,
    SPLITS,
    write_manifest,
)
from dl1.store.location import Location
from dl1.store.split_writer import DEFAULT_BLOCK_NNZ, SplitWriter
from dl1.store.upload import (
    check_fresh,
    claim_for_tasks,
    destination,
    publish,
    remove_staging,
)
from dl1.store.upload import staging_dir as staging_dir_for


def _prepare_fresh(path: Path, overwrite: bool) -> None:
    if path.exists():
        if path.is_dir() and not any(path.iterdir()):
            return
        is_store = (path / MANIFEST).exists() or _has_dl1_root(path)
        if not overwrite:
            raise FileExistsError(
                f"{path} already exists; a store is always written into a fresh path "
                "(pass overwrite=True to replace an existing dl1 store)"
            )
        if not is_store:
            raise FileExistsError(
                f"{path} exists and is not a dl1 store; refusing to delete it with overwrite=True"
            )
        shutil.rmtree(path)
    path.mkdir(parents=True)


def _has_dl1_root(path: Path) -> bool:
    try:
        g = zarr.open_group(os.fspath(path), mode="r")
    except Exception:
        return False
    return g.attrs.get("dl1_format") == FORMAT_NAME


class StoreWriter:
    """Write a new dl1 store; the manifest is written last, atomically, on :meth:`close`.

    Parameters
    ----------
    path : str, PathLike or URL
        A path that does not exist yet (or is an empty directory), or a URL of any fsspec
        filesystem (``s3://``, ``gs://``, ``abfs://``, ``memory://``; ``file://`` is a
        local path) with nothing at it.
    overwrite : bool
        Replace an existing dl1 store at ``path``. Anything else at ``path`` is never deleted.
        At a URL the old store stays whole until the new one is complete in the staging
        directory; while the new one uploads, the old manifest is gone (the store is refused,
        never read half old, half new).
    attrs : dict, optional
        JSON-serialisable attributes recorded in the manifest (provenance, generator settings).
    chunk_elems : int
        Elements per zarr chunk of the stored 1-D arrays.
    storage_options : dict, optional
        Options of the URL's filesystem (credentials, endpoint); by default its library
        finds credentials where it usually does (environment, config files). Never logged.
    staging_dir : str or PathLike, optional
        For a URL: where the store is written before it is uploaded (a private directory is
        made under it, by default under the system's temporary directory). It needs free
        space for the whole store, and is removed after the upload, or on any failure.

    Use it as a context manager: leaving the block with an exception removes the spill files
    (and, for a URL, the staging directory; nothing is uploaded) and leaves no manifest, so
    the partial store is refused by :func:`dl1.open`.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        overwrite: bool = False,
        attrs: dict[str, Any] | None = None,
        chunk_elems: int = CHUNK_ELEMS,
        storage_options: dict[str, Any] | None = None,
        staging_dir: str | os.PathLike | None = None,
    ) -> None:
        dest = destination(path, storage_options)
        self.remote: Location | None = None
        self.overwrite = overwrite
        self._staging: Path | None = None
        if isinstance(dest, Location):
            check_fresh(dest, MANIFEST, overwrite)
            self.remote = dest
            self._staging = staging_dir_for(staging_dir)
            dest = self._staging / "store"
        try:
            self.path = dest
            _prepare_fresh(self.path, overwrite)
            zarr.open_group(
                os.fspath(self.path),
                mode="w-",
                attributes={"dl1_format": FORMAT_NAME, "dl1_format_version": FORMAT_VERSION},
            )
            self._spill = Path(tempfile.mkdtemp(prefix=".dl1-spill-", dir=self.path))
        except BaseException:
            self._remove_staging()
            raise
        self.attrs: dict[str, Any] = dict(attrs or {})
        self.chunk_elems = int(chunk_elems)
        self._splits: dict[str, dict[str, Any]] = {}
        self._open_split: SplitWriter | None = None
        self._uploaded: dict[str, int] | None = None
        self.closed = False

    def claim_for_tasks(self) -> Location:
        """For a URL: let tasks upload blocks straight to it (see
        :func:`~dl1.store.upload.claim_for_tasks`: an old store there is refused from now
        on); record what they uploaded with :meth:`adopt`. Returns the destination."""
        if self.remote is None:
            raise ValueError("claim_for_tasks is for a store written to a URL")
        claim_for_tasks(self.path, self.remote, MANIFEST)
        self._uploaded = {}
        return self.remote

    def adopt(self, files: dict[str, int]) -> None:
        """Record files (relative name: size) that tasks uploaded to the destination."""
        if self._uploaded is None:
            raise RuntimeError("call claim_for_tasks before tasks upload files")
        self._uploaded.update(files)

    @property
    def destination(self) -> Path | Location:
        """Where the store ends up: its local path, or its :class:`~dl1.store.location.Location`."""
        return self.path if self.remote is None else self.remote

    def split(
        self,
        name: str = "train",
        *,
        n_features: int | None = None,
        dtype: Any = np.float64,
        block_nnz: int = DEFAULT_BLOCK_NNZ,
        n_feature_blocks: int | None = None,
        col_bounds: Any = None,
        row_block_rows: int | None = None,
        formats: tuple[str, ...] = ("csc",),
        has_sample_weight: bool = False,
    ) -> SplitWriter:
        """Start writing a split; returns a :class:`SplitWriter` to ``append`` row batches to."""
        if name not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {name!r}")
        if name in self._splits:
            raise ValueError(f"split {name!r} was already written")
        if self._open_split is not None:
            raise RuntimeError(f"split {self._open_split.name!r} is still open; close it first")
        sw = SplitWriter(
            self,
            name,
            n_features=n_features,
            dtype=dtype,
            block_nnz=block_nnz,
            n_feature_blocks=n_feature_blocks,
            col_bounds=col_bounds,
            row_block_rows=row_block_rows,
            formats=formats,
            has_sample_weight=has_sample_weight,
        )
        self._open_split = sw
        return sw

    def register_split(self, name: str, entry: dict[str, Any]) -> None:
        """Record the manifest entry of a split whose blocks were written elsewhere."""
        if name in self._splits:
            raise ValueError(f"split {name!r} was already written")
        self._splits[name] = entry
        self._open_split = None

    def close(self) -> Path | Location:
        """Write the manifest (atomically) and remove the spill directory; for a URL, upload
        the staged store (manifest last) and remove the staging directory."""
        if self.closed:
            return self.destination
        if self._open_split is not None:
            raise RuntimeError(f"split {self._open_split.name!r} was not closed")
        if "train" not in self._splits:
            raise ValueError("a store needs a 'train' split")
        manifest = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "dl1_version": __version__,
            "attrs": self.attrs,
            "splits": self._splits,
        }
        shutil.rmtree(self._spill, ignore_errors=True)
        try:
            write_manifest(self.path, manifest)
            if self.remote is not None:
                publish(self.path, self.remote, MANIFEST, self.overwrite, self._uploaded)
        finally:
            self._remove_staging()
        self.closed = True
        return self.destination

    def abort(self) -> None:
        """Remove the spill files (and a URL's staging directory); the store stays without a
        manifest, and nothing is uploaded."""
        if self._open_split is not None:
            for fh in self._open_split._fh.values():
                fh.close()
        shutil.rmtree(self._spill, ignore_errors=True)
        self._remove_staging()
        self.closed = True

    def _remove_staging(self) -> None:
        if self._staging is not None:
            remove_staging(self._staging)

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
