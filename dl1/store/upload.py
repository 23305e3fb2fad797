"""Writing stores and checkpoints to object storage (any fsspec URL): staged, then published.

A store written to a URL (``s3://``, ``gs://``, ``abfs://``, ``memory://``...) is first
written complete to a local staging directory by the ordinary out-of-core writer (so the
memory bound is unchanged; the local disk needed is the store's size), then its files are
uploaded with the manifest last: a reader never sees a manifest before every block is in
place. ``file://`` URLs are local paths and are written in place.

Credentials come from ``storage_options`` or, by default, from where the filesystem's
library looks for them (environment, config files, instance roles). They are never put in
a message or a repr: URLs are shown without any ``user:password@`` part.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dl1.errors import StoreError
from dl1.store.format import FORMAT_NAME
from dl1.store.location import Location, as_location
from dl1.store.reader import open_store

#: Largest root ``zarr.json`` read to tell whether a destination holds a dl1 store.
MAX_ROOT_JSON = 64 << 10
#: Files uploaded per request batch (fsspec runs a batch concurrently).
UPLOAD_BATCH = 256
#: Most objects listed under a destination being replaced (its old store's files).
MAX_LISTED = 10_000_000


def destination(dst: Any, storage_options: Mapping[str, Any] | None = None) -> Path | Location:
    """A local path, or the :class:`~dl1.store.location.Location` of a URL (``file://``
    URLs are local paths); ``dst`` is anything :func:`~dl1.store.location.as_location`
    takes (a path, a URL, a zarr store object, a Location)."""
    loc = as_location(dst, storage_options)
    return loc.path if loc.is_local else loc


def local_files(root: Path) -> list[str]:
    """Relative names (``/``-separated) of the files under ``root``, sorted."""
    out = []
    for sub, _, files in os.walk(root):
        rel = os.path.relpath(sub, root)
        for f in files:
            out.append(f if rel == "." else f"{rel.replace(os.sep, '/')}/{f}")
    return sorted(out)


def remote_state(remote: Location, manifest: str) -> str:
    """What is at ``remote``: ``"empty"`` (nothing), ``"store"`` (a dl1 store, possibly
    incomplete: a manifest, or a root group marked as dl1's) or ``"other"``."""
    fs, root = remote.fs, remote.key()
    if fs.exists(f"{root}/{manifest}"):
        return "store"
    try:
        names = fs.ls(root, detail=False)
    except FileNotFoundError:
        return "empty"
    if not names:
        return "empty"
    return "store" if _is_dl1_root(fs, f"{root}/zarr.json") else "other"


def _is_dl1_root(fs: Any, key: str) -> bool:
    try:
        if fs.size(key) > MAX_ROOT_JSON:
            return False
        attrs = json.loads(fs.cat_file(key)).get("attributes", {})
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(attrs, dict) and attrs.get("dl1_format") == FORMAT_NAME


def check_fresh(remote: Location, manifest: str, overwrite: bool) -> str:
    """Refuse a destination that holds something, unless it is a dl1 store and
    ``overwrite`` is set; return its :func:`remote_state`."""
    state = remote_state(remote, manifest)
    if state == "other":
        raise FileExistsError(f"{remote} exists and is not a dl1 store; refusing to write over it")
    if state == "store" and not overwrite:
        raise FileExistsError(
            f"{remote} already exists; a store is always written into a fresh path "
            "(pass overwrite=True to replace an existing dl1 store)"
        )
    return state


def publish(
    local: Path,
    remote: Location,
    manifest: str,
    overwrite: bool,
    uploaded: Mapping[str, int] | None = None,
) -> None:
    """Upload the store staged at ``local`` to ``remote``, its manifest last.

    With ``overwrite`` and a dl1 store already there, its manifest is deleted first (from
    then on it is refused, never read mixed with the new one), the new files are uploaded
    over it, the old store's other files are deleted, and the new manifest is uploaded.
    An upload that fails leaves no manifest: the destination is then refused by
    :func:`dl1.open` until it is written again.

    ``uploaded`` names the files (with their sizes) that tasks already put in place
    (:func:`claim_for_tasks`); they are kept, and checked with the staged ones.
    """
    if uploaded is None:
        state = check_fresh(remote, manifest, overwrite)
    else:
        state = "store"
    fs, root = remote.fs, remote.key()
    names = [n for n in local_files(local) if n != manifest]
    expected = {n: (local / n).stat().st_size for n in names}
    expected.update(uploaded or {})
    if state == "store":
        if fs.exists(f"{root}/{manifest}"):
            fs.rm_file(f"{root}/{manifest}")
        stale = [remote.key(k) for k in remote.listing(MAX_LISTED) if k not in expected]
        if stale:
            fs.rm(stale)
    for start in range(0, len(names), UPLOAD_BATCH):
        batch = names[start : start + UPLOAD_BATCH]
        put_batch(fs, [os.fspath(local / n) for n in batch], [f"{root}/{n}" for n in batch])
    check_uploaded(remote, expected)
    fs.put_file(os.fspath(local / manifest), f"{root}/{manifest}")


def check_uploaded(remote: Location, expected: Mapping[str, int]) -> None:
    """Every file of ``expected`` (name: size) is at ``remote`` with its size: checked
    before a manifest names them."""
    remote.fs.invalidate_cache(remote.key())
    sizes = remote.listing(MAX_LISTED)
    for n, size in expected.items():
        if sizes.get(n) != size:
            raise StoreError(f"{remote}: uploaded file {n} is missing or not of its written size")


def claim_for_tasks(local: Path, remote: Location, manifest: str) -> None:
    """Make ``remote`` ready for tasks that upload blocks themselves: an old store's
    manifest is deleted (the old store is refused from now on, since blocks are written
    over it), and the staged root group is uploaded, so the prefix is known as a dl1 store
    (without a manifest) if the write is interrupted."""
    fs, root = remote.fs, remote.key()
    if fs.exists(f"{root}/{manifest}"):
        fs.rm_file(f"{root}/{manifest}")
    fs.put_file(os.fspath(local / "zarr.json"), f"{root}/zarr.json")


def upload_tree(local: Path, remote: Location, skip: tuple[str, ...] = ("zarr.json",)) -> dict:
    """Upload every file under ``local`` but ``skip`` to the same names under ``remote``
    (what a task wrote); return ``{name: size}`` of the uploaded files."""
    names = [n for n in local_files(local) if n not in skip]
    fs, root = remote.fs, remote.key()
    put_batch(fs, [os.fspath(local / n) for n in names], [f"{root}/{n}" for n in names])
    return {n: (local / n).stat().st_size for n in names}


def put_batch(fs: Any, sources: list[str], targets: list[str]) -> None:
    """Upload local files ``sources`` to ``targets`` on ``fs`` (concurrently where the
    filesystem is asynchronous)."""
    fs.put(sources, targets)


def staging_dir(dir: str | os.PathLike | None = None) -> Path:
    """A new private staging directory (under ``dir``, else the system's temporary
    directory, ``TMPDIR``)."""
    return Path(tempfile.mkdtemp(prefix="dl1-staging-", dir=dir))


def remove_staging(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def open_written(dest: Path | Location) -> Any:
    """The store just written at ``dest``, opened (and checked) as :func:`dl1.open_store`
    opens it."""
    if isinstance(dest, Location):
        return open_store(dest)
    return open_store(dest)
