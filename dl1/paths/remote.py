"""Path checkpoints on object storage: a lease instead of ``flock``, a local working copy.

A checkpoint at a URL (``s3://``, ``gs://``, ``abfs://``, ``memory://``) has the layout of
a local one (:mod:`dl1.paths.checkpoint`). The writing process keeps a working copy in a
private local directory: it downloads what it resumes from (the identity and progress
files, then only the arrays the checked progress file names, each read bounded by its
recorded size), writes each alpha there exactly as on disk, and uploads the alpha's arrays
before the progress file, which a single PUT replaces atomically. A process killed at any
point leaves a consistent prefix of completed alphas on the object store.

Object stores have no ``flock``. One writer at a time is ensured by a *lease*: the object
``dl1-lock.json`` created with an exclusive conditional PUT (S3 ``If-None-Match: *``;
fsspec's ``mode="create"`` elsewhere) naming its owner (a random id, host, pid and the
process's start time). The owner renews it every ``LEASE_SECONDS / 4`` (S3: a PUT
conditional on the lease's ETag, so a renewal never overwrites a lease taken over), and
deletes it on close. Another process finding it is refused with
:class:`~dl1.errors.CheckpointLockedError`, unless the lease is stale:

* its owner ran on this host and that process is gone (pid absent, or reused by a process
  started at another time): a killed run resumes at once;
* its owner ran on another host and the object was last written more than
  ``LEASE_SECONDS`` ago (the object store's clock against this host's: they must agree to
  well within ``LEASE_SECONDS``).

A stale lease is taken over by a PUT conditional on the ETag that was judged stale, so of
two processes taking it over one wins. A writer that fails to renew for ``LEASE_SECONDS``
(or finds its lease taken) records nothing more. On filesystems without conditional
writes on an ETag (not S3), renewal and takeover compare the lease's owner before writing:
a narrow race remains there between two processes taking over the same stale lease.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
import uuid
import weakref
from pathlib import Path
from typing import Any

from dl1.errors import CheckpointCorruptError, CheckpointLockedError
from dl1.store.location import Location, OversizeObjectError
from dl1.store.manifest import MAX_MANIFEST_BYTES, MAX_METADATA_BYTES
from dl1.store.upload import staging_dir

#: Seconds after which a lease not renewed is stale (for a holder on another host).
LEASE_SECONDS = 120.0
#: Largest lease object read.
MAX_LEASE_BYTES = 4096
#: Attempts at taking a lease that changes under us (created, released, taken over).
ACQUIRE_ATTEMPTS = 5
#: Most entries listed under a checkpoint's ``coef`` or ``state`` prefix.
MAX_LISTED = 1_000_000


def _is_s3(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("s3", "s3a")


def _start_time(pid: int) -> float | None:
    # local: psutil (~0.02 s to import) only for the process start times in checkpoint locks
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, OSError):
        return None


def _holder_text(holder: dict[str, Any] | None) -> str:
    if holder is None:
        return "owner unknown"
    return f"host {holder.get('host')!s:.100}, pid {holder.get('pid')!s:.20}"


def _parse(raw: bytes) -> dict[str, Any] | None:
    try:
        d = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(d, dict):
        return None
    ok = (
        isinstance(d.get("owner"), str)
        and isinstance(d.get("host"), str)
        and isinstance(d.get("pid"), int)
        and isinstance(d.get("started"), (int, float, type(None)))
    )
    return d if ok else None


def _modified(info: dict[str, Any]) -> float | None:
    for name in ("LastModified", "mtime", "last_modified", "created"):
        v = info.get(name)
        if hasattr(v, "timestamp"):
            return float(v.timestamp())
        if isinstance(v, (int, float)):
            return float(v)
    return None


def _stale(holder: dict[str, Any] | None, info: dict[str, Any], seconds: float) -> bool:
    if holder is not None and holder["host"] == socket.gethostname():
        started = _start_time(holder["pid"])
        if holder["started"] is None:  # its start time was unknown: the pid alone
            return started is None
        return started is None or started != holder["started"]
    t = _modified(info)
    return t is not None and time.time() - t > seconds


class Lease:
    """The lease of a checkpoint on object storage (see the module's docstring)."""

    def __init__(self, loc: Location, me: dict[str, Any], etag: str | None, seconds: float):
        self.loc = loc
        self.key = loc.key("dl1-lock.json")
        self.me = me
        self.body = json.dumps(me).encode()
        self.etag = etag
        self.seconds = seconds
        self.renewed = time.monotonic()
        self.lost: str | None = None
        self._stop = threading.Event()
        self._finalizer = weakref.finalize(self, Lease._drop, self._stop, loc, self.key, me)
        threading.Thread(
            target=Lease._renew_loop,
            args=(weakref.ref(self), self._stop, max(seconds / 4, 0.01)),
            name="dl1-checkpoint-lease",
            daemon=True,
        ).start()

    @classmethod
    def acquire(cls, loc: Location, seconds: float | None = None) -> Lease:
        """Take the lease of the checkpoint at ``loc`` (lasting ``seconds``, by default
        :data:`LEASE_SECONDS`); CheckpointLockedError if another process holds it."""
        seconds = LEASE_SECONDS if seconds is None else float(seconds)
        fs, key = loc.fs, loc.key("dl1-lock.json")
        me = {
            "owner": uuid.uuid4().hex,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": _start_time(os.getpid()),
        }
        body = json.dumps(me).encode()
        holder: dict[str, Any] | None = None
        for _ in range(ACQUIRE_ATTEMPTS):
            try:
                out = fs.pipe_file(key, body, mode="create")
                return cls(loc, me, _etag(fs, key, out), seconds)
            except FileExistsError:
                pass
            try:
                info = fs.info(key)
                raw = loc.read("dl1-lock.json", MAX_LEASE_BYTES)
            except FileNotFoundError:
                continue  # released meanwhile
            except OversizeObjectError:
                raw = b""
            holder = _parse(raw)
            if not _stale(holder, info, seconds):
                raise CheckpointLockedError(
                    f"checkpoint at {loc.display()} is being written by another process "
                    f"({_holder_text(holder)}); two writers would interleave their alphas. "
                    "Wait for it to end or stop it (the lease of a process that died is "
                    f"taken over: at once on its host, elsewhere {seconds:g} s after its "
                    "last renewal)"
                )
            try:
                out = _replace(fs, key, body, info.get("ETag"), raw)
            except (OSError, ValueError):
                continue  # another process took it over first
            return cls(loc, me, _etag(fs, key, out), seconds)
        raise CheckpointLockedError(
            f"checkpoint at {loc.display()}: its lease changed hands {ACQUIRE_ATTEMPTS} times "
            f"while this process tried to take it (last seen: {_holder_text(holder)})"
        )

    def check(self) -> None:
        """CheckpointLockedError if the lease was lost or could not be renewed in time."""
        if self.lost is None and time.monotonic() - self.renewed > self.seconds:
            self.lost = f"it was not renewed for {self.seconds:g} s"
        if self.lost is not None:
            raise CheckpointLockedError(
                f"checkpoint at {self.loc.display()}: this process no longer holds its lease "
                f"({self.lost}); another process may be writing it. Open it again to record"
            )

    @staticmethod
    def _renew_loop(ref: weakref.ref[Lease], stop: threading.Event, every: float) -> None:
        """Renew the lease every ``every`` seconds until it is released, lost or collected
        (the thread holds it only while renewing)."""
        while not stop.wait(every):
            lease = ref()
            if lease is None or not lease._renew():
                return
            del lease

    def _renew(self) -> bool:
        """One renewal; False once the lease is lost."""
        try:
            out = _replace(self.loc.fs, self.key, self.body, self.etag, self.body)
        except FileNotFoundError:
            self.lost = "its lease object was deleted"
            return False
        except ValueError:
            self.lost = "another process took the lease over"
            return False
        except Exception as e:  # noqa: BLE001 - any failure of the store's client
            if isinstance(e, OSError) and "condition" in str(e).lower():
                self.lost = "another process took the lease over"
                return False
            return True  # a transient failure: retried; check() stops records in time
        self.etag = _etag(self.loc.fs, self.key, out)
        self.renewed = time.monotonic()
        return True

    def same(self, loc: Location) -> bool:
        return self.lost is None and self.loc.url == loc.url

    def release(self) -> None:
        self._finalizer()

    @staticmethod
    def _drop(stop: threading.Event, loc: Location, key: str, me: dict[str, Any]) -> None:
        stop.set()
        try:
            if _parse(loc.read("dl1-lock.json", MAX_LEASE_BYTES)) == me:
                loc.fs.rm_file(key)
        except Exception:  # noqa: BLE001 - gone already, or unreachable: it goes stale
            pass


def _etag(fs: Any, key: str, out: Any) -> str | None:
    if isinstance(out, dict) and out.get("ETag"):
        return out["ETag"]
    try:
        return fs.info(key).get("ETag")
    except OSError:
        return None


def _replace(fs: Any, key: str, body: bytes, etag: str | None, seen: bytes) -> Any:
    """Overwrite the lease object only if it is still the one seen: conditional on its
    ETag on S3; elsewhere after comparing its bytes (ValueError if they changed)."""
    if _is_s3(fs) and etag:
        return fs.pipe_file(key, body, IfMatch=etag)
    if fs.cat_file(key, start=0, end=MAX_LEASE_BYTES + 1) != seen:
        raise ValueError("the lease object changed")
    return fs.pipe_file(key, body)


class Mirror:
    """The local working copy of a checkpoint on object storage, removed on close."""

    def __init__(self, loc: Location) -> None:
        self.loc = loc
        self.where = loc.display()
        self._tmp = staging_dir()
        self.dir = self._tmp / "checkpoint"
        self.dir.mkdir()
        self._finalizer = weakref.finalize(self, shutil.rmtree, self._tmp, True)

    def close(self) -> None:
        self._finalizer()

    def top_names(self) -> set[str]:
        """Names directly under the checkpoint's prefix (files and sub-prefixes)."""
        try:
            names = self.loc.fs.ls(self.loc.key(), detail=False)
        except FileNotFoundError:
            return set()
        return {n.rstrip("/").rsplit("/", 1)[-1] for n in names[:MAX_LISTED]}

    def fetch(self, rel: str, max_bytes: int) -> bool:
        """Download object ``rel`` (at most ``max_bytes``); False if it does not exist."""
        try:
            data = self.loc.read(rel, max_bytes)
        except FileNotFoundError:
            return False
        except OversizeObjectError as e:
            raise CheckpointCorruptError(f"checkpoint at {self.where}: {e}") from None
        f = self.dir / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data)
        return True

    def fetch_json(self, rel: str) -> bool:
        return self.fetch(rel, MAX_MANIFEST_BYTES)

    def fetch_array(self, key: str, entry: dict[str, Any]) -> None:
        """Download an array whose (checked) progress entry is ``entry``: its metadata and
        each chunk, bounded by its recorded size; a missing one stays missing (and is named
        when the array is read)."""
        self.fetch(f"{key}/zarr.json", MAX_METADATA_BYTES)
        for k, size in enumerate(entry["chunk_bytes"]):
            self.fetch(f"{key}/c/{k}", int(size))

    def push(self, rels: list[str]) -> None:
        """Upload files of the working copy, in one batch."""
        if rels:
            fs = self.loc.fs
            fs.put([os.fspath(self.dir / r) for r in rels], [self.loc.key(r) for r in rels])

    def push_tree(self, rel: str) -> None:
        """Replace prefix ``rel`` on the object store by the working copy's folder ``rel``."""
        self.remove(rel)
        d = self.dir / rel
        files = sorted(
            Path(sub, f).relative_to(self.dir).as_posix() for sub, _, fs in os.walk(d) for f in fs
        )
        self.push(files)

    def remove(self, rel: str) -> None:
        fs, key = self.loc.fs, self.loc.key(rel)
        if fs.exists(key):
            fs.rm(key, recursive=True)
        fs.invalidate_cache(self.loc.key())

    def remove_numbered(self, prefix: str, keep: set[int]) -> None:
        """Delete ``prefix/{k}`` on the object store for every ``k`` not in ``keep``
        (leftovers of a killed run), and anything else not named by a number."""
        try:
            names = self.loc.fs.ls(self.loc.key(prefix), detail=False)
        except FileNotFoundError:
            return
        for n in names[:MAX_LISTED]:
            name = n.rstrip("/").rsplit("/", 1)[-1]
            if not (name.isdigit() and int(name) in keep):
                self.loc.fs.rm(n, recursive=True)
