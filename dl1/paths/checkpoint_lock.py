"""Who may write a path checkpoint: one process, and in it one thread, at a time.

A local checkpoint is locked by an exclusive ``flock`` on its lock file (:class:`_Lock`,
released by the kernel when the process dies), one on object storage by a lease
(:class:`~dl1.paths.remote.Lease`); within a process, a registry of the checkpoints being
opened or written refuses a second thread and lets the thread that opened a checkpoint
take its lock over (a retry after an exception). :class:`~dl1.paths.checkpoint.PathCheckpoint`
claims, takes and registers its lock through these functions.
"""

from __future__ import annotations

import json
import os
import threading
import weakref
from pathlib import Path
from typing import TextIO

from dl1.errors import CheckpointCorruptError, CheckpointLockedError
from dl1.paths.checkpoint_format import LOCK
from dl1.paths.remote import Lease
from dl1.store.location import Location
from dl1.store.manifest import check_inside

try:  # Linux and macOS; on Windows no lock is taken (see PathCheckpoint)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


class _Lock:
    """An exclusive ``flock`` on the checkpoint's lock file, holding the writer's pid.

    The kernel releases it when the process dies, so a lock left by a killed run never
    blocks a resume; it is also released by :meth:`release` or when the last object
    holding it is collected. Windows has no ``fcntl``: no lock is taken there.
    """

    def __init__(self, fh: TextIO) -> None:
        self.fh = fh
        self._finalizer = weakref.finalize(self, fh.close)

    @classmethod
    def acquire(cls, path: Path) -> _Lock:
        f = path / LOCK
        check_inside(path, f, f"lock file {LOCK}", CheckpointCorruptError)
        fh = open(f, "a+", encoding="utf-8")  # noqa: SIM115 - held for the writer's life
        if fcntl is not None:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                fh.seek(0)
                holder = _holder(fh.read())
                fh.close()
                raise CheckpointLockedError(
                    f"checkpoint at {path} is being written by another process ({holder}); "
                    "two writers would interleave their alphas. Wait for it to end or stop it "
                    "(a lock left by a process that died is released with it)"
                ) from None
        fh.seek(0)
        fh.truncate()
        json.dump({"pid": os.getpid()}, fh)
        fh.flush()
        return cls(fh)

    def same_file(self, path: Path) -> bool:
        try:
            return os.path.samestat(os.fstat(self.fh.fileno()), os.stat(path / LOCK))
        except (OSError, ValueError):
            return False

    def release(self) -> None:
        self._finalizer()


def _holder(text: str) -> str:
    """``pid N`` from a lock file's content, if it is readable."""
    try:
        pid = json.loads(text)["pid"]
    except (ValueError, TypeError, KeyError, RecursionError):
        return "pid unknown"
    return f"pid {pid}" if isinstance(pid, int) and not isinstance(pid, bool) else "pid unknown"


#: The checkpoint objects of this process holding a lock, by real path, with the thread
#: that opened each: a checkpoint opened again by that thread (a retry after an exception)
#: takes the lock over. Guarded by :data:`_REGISTRY`, as is :data:`_OPENING`.
_HELD: dict[str, tuple[weakref.ref[object], threading.Thread]] = {}  # PathCheckpoints
#: The paths being opened or created by a thread of this process, and that thread.
_OPENING: dict[str, threading.Thread] = {}
_REGISTRY = threading.Lock()


def _locked_by_thread(path: Path | str, thread: threading.Thread) -> CheckpointLockedError:
    return CheckpointLockedError(
        f"checkpoint at {path} is being written by another thread of this process "
        f"({thread.name}, pid {os.getpid()}); two writers would interleave their alphas. "
        "Wait for it to end"
    )


def _remote_key(loc: Location) -> str:
    """Registry key of a checkpoint on object storage."""
    return "url:" + loc.url


def _claim(path: Path | str, key: str | None = None) -> str:
    """Claim ``path`` for this thread's open (its key in the registry, by default its real
    path): refused with CheckpointLockedError while another live thread of this process
    opens it or holds an object writing it; the OS lock (:class:`_Lock`) or the lease
    (:class:`~dl1.paths.remote.Lease`) refuses other processes."""
    key, me = key or os.path.realpath(path), threading.current_thread()
    with _REGISTRY:
        if key in _OPENING:
            raise _locked_by_thread(path, _OPENING[key])
        ref, owner = _HELD.get(key, (None, None))
        old = ref() if ref is not None else None
        if old is not None and old._lock is not None and owner is not me and owner.is_alive():
            raise _locked_by_thread(path, owner)
        _OPENING[key] = me
    return key


def _release_claim(key: str) -> None:
    with _REGISTRY:
        _OPENING.pop(key, None)


def _take_lock(path: Path) -> _Lock:
    """The lock of ``path`` (claimed by this thread, :func:`_claim`): from an earlier
    object of this process that holds it (which may then no longer write), else acquired;
    CheckpointLockedError if another process holds it."""
    key = os.path.realpath(path)
    with _REGISTRY:
        ref, _ = _HELD.get(key, (None, None))
        old = ref() if ref is not None else None
        if old is not None and old._lock is not None and old._lock.same_file(path):
            lock, old._lock = old._lock, None
            return lock
    return _Lock.acquire(path)


def _take_lease(loc: Location) -> Lease:
    """The lease of the checkpoint at ``loc`` (claimed by this thread): from an earlier
    object of this process that holds it, else acquired."""
    with _REGISTRY:
        ref, _ = _HELD.get(_remote_key(loc), (None, None))
        old = ref() if ref is not None else None
        if old is not None and isinstance(old._lock, Lease) and old._lock.same(loc):
            lock, old._lock = old._lock, None
            return lock
    return Lease.acquire(loc)
