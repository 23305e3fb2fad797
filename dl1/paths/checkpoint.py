"""Incremental, resumable checkpoints of a regularisation path (no pickle).

A checkpoint is a directory holding a zarr v3 group::

    CKPT/
      zarr.json                  root group, attributes {"dl1_format": "dl1-path-checkpoint", ...}
      dl1-checkpoint.json        identity: format and dl1 versions, data fingerprint, settings,
                                 the alpha grid (float.hex) and p; written once, last at creation
      coef/{k}/indices           int64 (nnz_k,)   positions of the nonzero coefficients of alpha k
      coef/{k}/values            float64 (nnz_k,) their values
      dl1-progress.json          completed alphas 0..n_done-1: scalars and array checksums

Recording alpha ``k`` writes and fsyncs its two arrays (every chunk stored, Blosc-LZ4 + CRC32C
like a dl1 store), then replaces ``dl1-progress.json`` atomically (temporary file, fsync,
rename), so a process killed at any point leaves a consistent prefix of completed alphas.
Arrays of an alpha missing from the progress file are leftovers of a killed run and are
rewritten. On open, the arrays of every completed alpha are verified against the checksums
of the progress file.

Floats (scalars, test metrics and the alpha grid) are stored as ``float.hex`` strings, so every
value, NaN and infinities included, round-trips bit for bit; a coefficient is stored wherever its
bit pattern is nonzero, so :meth:`PathCheckpoint.coef` returns it bit-identical, signed zeros
included. Nothing is pickled: the directory holds only JSON files and zarr chunks.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import threading
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import scipy.sparse as sp
import zarr

from dl1 import __version__
from dl1.errors import (
    CheckpointCorruptError,
    CheckpointLockedError,
    StoreCorruptError,
    StoreError,
)
from dl1.paths.remote import Lease, Mirror
from dl1.store.format import write_array, write_manifest
from dl1.store.location import Location, open_regular
from dl1.store.manifest import FieldChecker, check_array_entry, check_inside
from dl1.store.reader import read_array
from dl1.store.upload import destination

try:  # Linux and macOS; on Windows no lock is taken (see PathCheckpoint)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

FORMAT_NAME = "dl1-path-checkpoint"
FORMAT_VERSION = 1
IDENTITY = "dl1-checkpoint.json"
PROGRESS = "dl1-progress.json"
#: Held (``flock``) by the process writing the checkpoint; holds its pid, as JSON.
LOCK = "dl1-lock.json"
#: Float scalars of each completed alpha (stored as float.hex), and the integer ones.
FLOATS = ("intercept", "gap", "passes", "seconds")
INTS = ("n_active", "rounds")
#: Key of each scalar in the dict returned by :meth:`PathCheckpoint.load`.
LOAD_KEYS = {
    "intercept": "intercepts",
    "gap": "gaps",
    "passes": "passes",
    "seconds": "seconds",
    "n_active": "n_active",
    "rounds": "rounds",
}
_ABSENT = "<absent>"


class CheckpointMismatchError(StoreError):
    """A checkpoint was written for other data, settings, alphas or versions.

    The message names the first field that differs, with both values.
    """


def _hex(x: float) -> str:
    return float(x).hex()


def _unhex(s: str) -> float:
    return float.fromhex(s)


def _jsonable(obj: Any) -> Any:
    """``obj`` as plain JSON types (numpy scalars and arrays converted, tuples as lists)."""

    def default(o: Any) -> Any:
        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
        raise TypeError(f"{type(o).__name__} is not JSON serialisable: {o!r}")

    return json.loads(json.dumps(obj, default=default))


def _canon(v: Any) -> str:
    # Compared as canonical JSON text: NaN equals NaN, 1 differs from 1.0 and from True.
    return json.dumps(v, sort_keys=True)


def _diff(old: Any, new: Any, name: str) -> tuple[str, Any, Any] | None:
    """First differing field of two JSON values, as (dotted name, old value, new value)."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new), key=str):
            if key not in old or key not in new:
                return f"{name}.{key}", old.get(key, _ABSENT), new.get(key, _ABSENT)
            d = _diff(old[key], new[key], f"{name}.{key}")
            if d is not None:
                return d
        return None
    return None if _canon(old) == _canon(new) else (name, old, new)


def _show_hex(v: Any) -> str:
    """A recorded float.hex string as ``value (hex)``; anything else as JSON (untrusted)."""
    try:
        return f"{_unhex(v)!r} ({v})"
    except (TypeError, ValueError):
        return _canon(v)


def _show(v: Any) -> str:
    return v if v is _ABSENT else _canon(v)


def _fsync_tree(d: Path) -> None:
    """fsync every file and directory under ``d`` (and ``d``'s parent directory)."""
    for sub, _, files in os.walk(d):
        for f in files:
            fd = os.open(os.path.join(sub, f), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(sub, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fd = os.open(d.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
_HELD: dict[str, tuple[weakref.ref[PathCheckpoint], threading.Thread]] = {}
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


def solver_settings(solver: Any) -> dict[str, Any]:
    """What a checkpoint records of the path's solver: its class and every parameter of
    its constructor but the reporting ones (``verbose``, ``callback``), as configured.
    Each can change the answer (the epochs, the seed of the orders, the steps...): a path
    resumed with another value would mix two settings, so it is refused."""
    params = inspect.signature(type(solver)).parameters
    options = {
        name: getattr(solver, name)
        for name in params
        if name not in ("verbose", "callback") and hasattr(solver, name)
    }
    return {"class": type(solver).__qualname__,
            "options": json.loads(json.dumps(options, default=_json_or_repr))}  # fmt: skip


def _json_or_repr(o: Any) -> Any:
    """A numpy value as its JSON value, anything else as its repr."""
    return o.tolist() if isinstance(o, (np.generic, np.ndarray)) else repr(o)


class PathCheckpoint:
    """Checkpoint of a regularisation path; create or reopen with :meth:`open_or_create`.

    One process writes a checkpoint at a time: the opening process holds an exclusive OS
    lock (``flock`` on ``dl1-lock.json``, which names its pid) until :meth:`close`, the
    end of a ``with`` block or the object's collection; another process opening it is
    refused with :class:`~dl1.errors.CheckpointLockedError`. The kernel drops the lock of a
    process that dies, so a killed run never blocks its resume. Opening the checkpoint again
    in the same process takes the lock over (the older object can no longer record). On
    Windows (no ``fcntl``) no lock is taken: do not share a checkpoint between processes
    there.

    Everything read back is untrusted: the progress file is checked as a schema (every
    field present, typed, consistent with the alpha grid), array names must be plain names
    inside the checkpoint, and the arrays a resume uses are checked for length, dtype and
    finiteness (:meth:`state`) before any solver sees them.

    A checkpoint may also live on object storage (a URL: ``s3://``, ``gs://``, ``abfs://``,
    ``memory://``): the process then works on a local copy and uploads each alpha's arrays
    before its progress file, and a lease object replaces the OS lock
    (:mod:`dl1.paths.remote`).

    Attributes
    ----------
    path : Path
        The checkpoint directory (for a URL: the local working copy).
    location : Location or None
        For a checkpoint on object storage, where it lives.
    alphas : ndarray (n_alphas,)
        The alpha grid, as recorded.
    n_features : int
    fingerprint, settings : dict
        As given at creation (after a JSON round trip).
    """

    def __init__(
        self,
        path: Path,
        identity: dict[str, Any],
        done: list[dict[str, Any]],
        lock: _Lock | Lease | None = None,
        mirror: Mirror | None = None,
    ):
        self.path = path
        self._identity = identity
        self._done = done
        self._lock = lock
        self._mirror = mirror
        self.location = None if mirror is None else mirror.loc
        self.where = str(path) if mirror is None else mirror.where
        if lock is not None:
            key = os.path.realpath(path) if mirror is None else _remote_key(mirror.loc)
            with _REGISTRY:
                _HELD[key] = (weakref.ref(self), threading.current_thread())
        self.alphas = np.array([_unhex(a) for a in identity["alphas"]], dtype=np.float64)
        self.n_features = int(identity["n_features"])
        self.fingerprint = identity["fingerprint"]
        self.settings = identity["settings"]

    @classmethod
    def open_or_create(
        cls,
        path: str | os.PathLike,
        *,
        fingerprint: dict[str, Any],
        settings: dict[str, Any],
        alphas: np.ndarray,
        n_features: int,
        storage_options: dict[str, Any] | None = None,
    ) -> PathCheckpoint:
        """Reopen the checkpoint at ``path``, or create it if there is none.

        Parameters
        ----------
        path : str, PathLike, URL or Location
            Checkpoint directory; created if missing. An existing directory must be empty, a
            dl1 path checkpoint, or one whose creation was interrupted. A URL (or a
            :class:`~dl1.store.location.Location`) puts it on object storage.
        fingerprint : dict
            JSON-able description of the data (e.g. store checksums, shape, nnz).
        settings : dict
            JSON-able settings of the path (l1_ratio, loss, tol, solver options...).
        alphas : ndarray (n_alphas,)
            The alpha grid, compared bit for bit.
        n_features : int
            Length of each coefficient vector.
        storage_options : dict, optional
            Options of a URL's filesystem (by default credentials come from the
            environment); never logged.

        Returns
        -------
        PathCheckpoint
            With :attr:`n_done` completed alphas (0 for a new checkpoint).

        Raises
        ------
        CheckpointMismatchError
            The existing checkpoint was written with another checkpoint format version, dl1
            version, number of features, fingerprint, settings or alpha grid; the message
            names the field (e.g. ``settings.tol``) and both values.
        StoreCorruptError
            The array of a completed alpha is missing or does not match its checksum.
        CheckpointCorruptError
            The progress file is malformed (the message names the field) or a completed
            alpha's arrays do not match it.
        CheckpointLockedError
            Another process has the checkpoint open.
        StoreError
            ``path`` is a non-empty directory that is not a dl1 path checkpoint.
        """
        dest = destination(path, storage_options)
        alphas = np.asarray(alphas, dtype=np.float64)
        if alphas.ndim != 1:
            raise ValueError(f"alphas must be 1-D, got shape {alphas.shape}")
        identity = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "dl1_version": __version__,
            "n_features": int(n_features),
            "fingerprint": _jsonable(fingerprint),
            "settings": _jsonable(settings),
            "alphas": [_hex(a) for a in alphas],
        }
        if isinstance(dest, Location):
            return cls._open_remote(dest, identity)
        path = dest
        key = _claim(path)
        try:
            if not (path / IDENTITY).exists():
                if path.exists() and not _interrupted_creation(path):
                    raise StoreError(f"{path} exists and is not a dl1 path checkpoint")
                path.mkdir(parents=True, exist_ok=True)
            lock = _take_lock(path)
            try:
                if (path / IDENTITY).exists():  # (re-checked under the lock)
                    return cls._reopen(path, identity, lock)
                return cls._create(path, identity, lock)
            except BaseException:
                lock.release()
                raise
        finally:
            _release_claim(key)

    @classmethod
    def _open_remote(cls, loc: Location, identity: dict[str, Any]) -> PathCheckpoint:
        """Open or create the checkpoint at ``loc`` on object storage: lease, then a local
        working copy of what the checked progress file names."""
        key = _claim(loc.display(), _remote_key(loc))
        try:
            mirror = Mirror(loc)
            try:
                lock = _take_lease(loc)
                try:
                    if mirror.fetch_json(IDENTITY):
                        mirror.fetch_json(PROGRESS)
                        return cls._reopen(mirror.dir, identity, lock, mirror)
                    names = mirror.top_names()
                    allowed = {"zarr.json", PROGRESS, LOCK, PROGRESS + ".tmp", IDENTITY + ".tmp"}
                    if not names <= allowed:
                        raise StoreError(f"{loc.display()} exists and is not a dl1 path checkpoint")
                    return cls._create(mirror.dir, identity, lock, mirror)
                except BaseException:
                    lock.release()
                    raise
            except BaseException:
                mirror.close()
                raise
        finally:
            _release_claim(key)

    @classmethod
    def _reopen(
        cls, path: Path, identity: dict[str, Any], lock: _Lock | Lease, mirror: Mirror | None = None
    ) -> PathCheckpoint:
        where = path if mirror is None else mirror.where
        old = _read_json(path / IDENTITY, StoreError)
        _compare(where, old, identity)
        progress = _read_json(path / PROGRESS, CheckpointCorruptError)
        done = _check_progress(where, progress, identity)
        if mirror is not None:  # only what the checked progress file names
            for k, e in enumerate(done):
                for name in ("indices", "values"):
                    mirror.fetch_array(f"coef/{k}/{name}", e[name])
                for name, a in (e.get("state") or {}).items():
                    mirror.fetch_array(f"state/{k}/{name}", a)
        ck = cls(path, old, done, lock, mirror)
        ck._verify()
        ck._remove_leftovers()
        if mirror is not None:
            mirror.remove_numbered("coef", set(range(len(done))))
            mirror.remove_numbered("state", {k for k, e in enumerate(done) if "state" in e})
        return ck

    @classmethod
    def _create(
        cls, path: Path, identity: dict[str, Any], lock: _Lock | Lease, mirror: Mirror | None = None
    ) -> PathCheckpoint:
        if not _interrupted_creation(path):
            raise StoreError(f"{path} exists and is not a dl1 path checkpoint")
        for f in path.iterdir():  # what a creation killed before its end left
            if f.name != LOCK:
                f.unlink()
        zarr.open_group(  # "a", not "w-": the folder holds the lock file already
            os.fspath(path),
            mode="a",
            attributes={"dl1_format": FORMAT_NAME, "format_version": FORMAT_VERSION},
        )
        write_manifest(path, {"done": []}, PROGRESS)
        write_manifest(path, identity, IDENTITY)  # last: marks the checkpoint as created
        if mirror is not None:
            mirror.remove_numbered("coef", set())
            mirror.remove_numbered("state", set())
            mirror.push(["zarr.json", PROGRESS])
            mirror.push([IDENTITY])
        return cls(path, _read_json(path / IDENTITY, StoreError), [], lock, mirror)

    def close(self) -> None:
        """Release the checkpoint's lock; the object can still be read, no longer record."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> PathCheckpoint:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def n_done(self) -> int:
        """Number of completed alphas; they are always alphas ``0 .. n_done - 1``."""
        return len(self._done)

    def record(
        self,
        k: int,
        *,
        coef: np.ndarray,
        intercept: float,
        gap: float,
        converged: bool,
        n_active: int,
        passes: float,
        seconds: float,
        rounds: int,
        test_metric: dict[str, float] | None = None,
        extra: dict[str, Any] | None = None,
        state: dict[str, np.ndarray] | None = None,
    ) -> None:
        """Write the result of alpha ``k`` atomically.

        Parameters
        ----------
        k : int
            Index of the alpha in the grid; must equal :attr:`n_done`.
        coef : ndarray (p,)
            Coefficients (float64; stored bit for bit).
        intercept, gap, passes, seconds : float
            Stored bit for bit (NaN and infinities included).
        converged : bool
        n_active, rounds : int
        test_metric : dict of str to float, optional
            Validation metrics of this alpha (e.g. ``{"mse": ...}``).
        extra : dict, optional
            Any JSON-able data (floats round-trip exactly, NaN and infinities included).
        state : dict of str to float64 ndarray, optional
            The solver's state after this alpha (e.g. ``X w + b``), stored bit for bit so that
            a resumed path continues exactly where this one stopped; only the latest alpha's
            state is kept (:meth:`state`).

        Raises
        ------
        ValueError
            ``k`` is not the next alpha, or ``coef`` has the wrong shape.
        CheckpointLockedError
            This object no longer holds the lock (closed, or the checkpoint was opened again).
        """
        if isinstance(self._lock, Lease):
            self._lock.check()
        if self._lock is None:
            raise CheckpointLockedError(
                f"checkpoint at {self.where}: this PathCheckpoint no longer holds the lock "
                "(it was closed, or the checkpoint was opened again); open it again to record"
            )
        if k != self.n_done:
            raise ValueError(
                f"alpha {k} recorded out of order: alphas 0..{self.n_done - 1} are done, "
                f"the next is {self.n_done}"
            )
        if k >= len(self.alphas):
            raise ValueError(f"alpha {k} is past the end of the grid ({len(self.alphas)} alphas)")
        coef = np.ascontiguousarray(coef, dtype=np.float64)
        if coef.shape != (self.n_features,):
            raise ValueError(f"coef has shape {coef.shape}, expected ({self.n_features},)")
        entry: dict[str, Any] = {"k": k, "alpha": _hex(self.alphas[k])}
        for name, v in zip(FLOATS, (intercept, gap, passes, seconds), strict=True):
            entry[name] = _hex(v)
        for name, v in zip(INTS, (n_active, rounds), strict=True):
            entry[name] = int(v)
        entry["converged"] = bool(converged)
        entry["test_metric"] = {str(m): _hex(v) for m, v in (test_metric or {}).items()}
        entry["extra"] = None if extra is None else _jsonable(extra)
        d = self.path / "coef" / str(k)
        if d.exists():  # leftover of a run killed while writing this alpha
            self._remove(d)
        nz = np.flatnonzero(coef.view(np.uint64)).astype(np.int64)
        entry["indices"] = write_array(self.path, f"coef/{k}/indices", nz)
        entry["values"] = write_array(self.path, f"coef/{k}/values", coef[nz])
        _fsync_tree(d)
        if state is not None:
            sd = self.path / "state" / str(k)
            if sd.exists():
                self._remove(sd)
            entry["state"] = {
                name: write_array(
                    self.path, f"state/{k}/{name}", np.ascontiguousarray(a, dtype=np.float64)
                )
                for name, a in state.items()
            }
            _fsync_tree(sd)
        if self._mirror is not None:  # the arrays are in place before the progress names them
            self._mirror.push_tree(f"coef/{k}")
            if state is not None:
                self._mirror.push_tree(f"state/{k}")
            self._lock.check()
        write_manifest(self.path, {"done": [*self._done, entry]}, PROGRESS)
        if self._mirror is not None:
            self._mirror.push([PROGRESS])
        self._done.append(entry)
        # the progress file now names this alpha's state: older states are not needed
        for old in (self.path / "state").glob("*"):
            if old.name.isdigit() and int(old.name) < k:
                self._remove(old)
                if self._mirror is not None:
                    self._mirror.remove(f"state/{old.name}")
                self._done[int(old.name)].pop("state", None)

    def state(
        self,
        k: int,
        lengths: Mapping[str, int] | None = None,
        required: tuple[str, ...] = (),
    ) -> dict[str, np.ndarray] | None:
        """The state recorded with completed alpha ``k``, if it is still kept (the latest).

        Parameters
        ----------
        k : int
            A completed alpha.
        lengths : mapping of str to int, optional
            To resume from the state: the length each array must have for the problem at
            hand. Then every saved array must be named here, have that length (checked
            before it is read) and hold finite values only, and the intercept of alpha
            ``k`` must be finite: a solver never sees a state it could not have saved.
        required : tuple of str
            Arrays that must be present (a missing state is then an error, not None).

        Raises
        ------
        CheckpointCorruptError
            An array is damaged, missing, unknown, of the wrong length or not finite; the
            message names the array and the problem.
        """
        if not 0 <= k < self.n_done:
            raise IndexError(f"alpha {k} is not completed ({self.n_done} alphas are done)")
        where = f"checkpoint at {self.where}: the solver state of alpha {k}"
        entries = self._done[k].get("state") or {}
        missing = [name for name in required if name not in entries]
        if missing or (required and not (self.path / "state" / str(k)).is_dir()):
            raise CheckpointCorruptError(f"{where} is missing array(s) {missing or required}")
        if not entries or not (self.path / "state" / str(k)).is_dir():
            return None
        if lengths is not None:
            _check_state_entries(where, entries, lengths)
            intercept = _unhex(self._done[k]["intercept"])
            if not np.isfinite(intercept):
                raise CheckpointCorruptError(f"{where}: the intercept is {intercept}")
        try:
            arrays = {
                name: read_array(self.path, f"state/{k}/{name}", e) for name, e in entries.items()
            }
        except StoreCorruptError as err:
            raise CheckpointCorruptError(f"{where} is damaged: {err}") from err
        if lengths is not None:
            for name, a in arrays.items():
                bad = np.flatnonzero(~np.isfinite(a))
                if bad.size:
                    raise CheckpointCorruptError(
                        f"{where}: array {name!r} holds {a[bad[0]]} at position {bad[0]} "
                        f"({bad.size} non-finite values); a resume needs finite values"
                    )
        return arrays

    def coef(self, k: int) -> np.ndarray:
        """Dense coefficients of completed alpha ``k``, bit-identical to those recorded.

        Raises
        ------
        IndexError
            Alpha ``k`` is not completed.
        StoreCorruptError
            Its arrays are missing or do not match their checksums.
        """
        if not 0 <= k < self.n_done:
            raise IndexError(f"alpha {k} is not completed ({self.n_done} alphas are done)")
        idx, val = self._read(k)
        out = np.zeros(self.n_features)
        out[idx] = val
        return out

    def load(self) -> dict[str, Any]:
        """Results of the completed alphas ``0 .. n_done - 1``.

        Returns
        -------
        dict
            ``alphas`` (float64), ``coefs`` (scipy.sparse.csc_matrix p x n_done, float64, exact
            values; signed zeros are dropped, use :meth:`coef` for the exact bits),
            ``intercepts``, ``gaps``, ``passes``, ``seconds`` (float64), ``converged`` (bool),
            ``n_active``, ``rounds`` (int64), ``test_metrics`` (dict of metric name to float64
            array, NaN where an alpha has no value) and ``extra`` (list of dict or None).
        """
        n = self.n_done
        idx, val = [], []
        for k in range(n):
            i, v = self._read(k)
            idx.append(i)
            val.append(v)
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum([len(i) for i in idx], out=indptr[1:])
        coefs = sp.csc_matrix(
            (
                np.concatenate(val) if n else np.zeros(0),
                np.concatenate(idx) if n else np.zeros(0, np.int64),
                indptr,
            ),
            shape=(self.n_features, n),
        )
        coefs.eliminate_zeros()
        out: dict[str, Any] = {"alphas": self.alphas[:n].copy(), "coefs": coefs}
        for name in FLOATS:
            out[LOAD_KEYS[name]] = np.array([_unhex(e[name]) for e in self._done], np.float64)
        for name in INTS:
            out[LOAD_KEYS[name]] = np.array([e[name] for e in self._done], dtype=np.int64)
        out["converged"] = np.array([e["converged"] for e in self._done], dtype=bool)
        names = sorted({m for e in self._done for m in e["test_metric"]})
        out["test_metrics"] = {
            m: np.array([_unhex(e["test_metric"].get(m, "nan")) for e in self._done], np.float64)
            for m in names
        }
        out["extra"] = [e["extra"] for e in self._done]
        return out

    def __repr__(self) -> str:
        return f"PathCheckpoint({self.where!r}, {self.n_done}/{len(self.alphas)} alphas done)"

    def _read(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        e = self._done[k]
        try:
            idx = read_array(self.path, f"coef/{k}/indices", e["indices"])
            val = read_array(self.path, f"coef/{k}/values", e["values"])
        except StoreCorruptError as err:
            raise CheckpointCorruptError(
                f"checkpoint at {self.where}: completed alpha {k} "
                f"(alpha={_unhex(e['alpha']):.6g}) is damaged: {err}"
            ) from err
        problem = _coef_problem(idx, val, self.n_features)
        if problem:
            raise CheckpointCorruptError(
                f"checkpoint at {self.where}: completed alpha {k} has inconsistent arrays "
                f"({problem})"
            )
        return idx, val

    def _verify(self) -> None:
        for k in range(self.n_done):
            self._read(k)

    def _remove(self, d: Path) -> None:
        """Delete ``d`` (a file or folder of the checkpoint), never anything outside it: a
        symlink is unlinked, not followed."""
        check_inside(self.path, d.parent, f"{d.relative_to(self.path)}", CheckpointCorruptError)
        if d.is_dir() and not d.is_symlink():
            shutil.rmtree(d)
        else:
            d.unlink()

    def _remove_leftovers(self) -> None:
        root = self.path / "coef"
        if not root.is_dir():
            return
        check_inside(self.path, root, "coef", CheckpointCorruptError)
        for d in root.iterdir():
            if not (d.name.isdigit() and int(d.name) < self.n_done):
                self._remove(d)


def _coef_problem(idx: np.ndarray, val: np.ndarray, p: int) -> str:
    """What is wrong with a completed alpha's coefficient arrays ('' if nothing): record()
    writes strictly increasing indices in [0, p) and a fit's finite values."""
    if idx.shape != val.shape:
        return f"{idx.shape[0]} coefficient indices, {val.shape[0]} values"
    if idx.size and (idx.min() < 0 or idx.max() >= p):
        return f"coefficient indices outside [0, {p})"
    if (np.diff(idx) <= 0).any():
        return "coefficient indices not strictly increasing"
    if not np.isfinite(val).all():
        return "coefficient values not finite"
    return ""


def _read_json(f: Path, error: type[StoreError]) -> dict[str, Any]:
    try:
        with open_regular(f, "r", encoding="utf-8") as fh:
            out = json.load(fh)
    except (OSError, ValueError, RecursionError) as e:  # nesting too deep: not ours
        raise error(f"{f} is missing, unreadable or truncated: {e}") from e
    if not isinstance(out, dict):
        raise error(f"{f} does not hold a JSON object")
    return out


def _interrupted_creation(path: Path) -> bool:
    """Whether ``path`` is empty or holds only what a creation killed before its end writes."""
    names = {p.name for p in path.iterdir()}
    if not names - {LOCK}:
        return True
    if not names <= {"zarr.json", PROGRESS, PROGRESS + ".tmp", IDENTITY + ".tmp", LOCK}:
        return False
    if "zarr.json" not in names:
        return True
    try:
        attrs = _read_json(path / "zarr.json", StoreError).get("attributes", {})
    except StoreError:
        return False
    return attrs.get("dl1_format") == FORMAT_NAME


def _check_progress(
    path: Path | str, progress: Any, identity: dict[str, Any]
) -> list[dict[str, Any]]:
    """The completed alphas of a progress file, checked as a schema against the identity
    (alpha grid, number of features) before anything they name is read."""
    ck = FieldChecker(f"checkpoint at {path}", CheckpointCorruptError, f"{PROGRESS} field")
    done = ck.seq(ck.key(ck.obj(progress, "(root)"), "done", "(root)"), "done")
    if len(done) > len(identity["alphas"]):
        ck.fail("done", f"has {len(done)} alphas, the grid {len(identity['alphas'])}")
    for k, e in enumerate(done):
        _check_entry(ck, e, f"done[{k}]", k, identity)
    return done


def _check_entry(ck: FieldChecker, e: Any, field: str, k: int, identity: dict[str, Any]) -> None:
    e = ck.obj(e, field)
    if ck.integer(ck.key(e, "k", field), f"{field}.k") != k:
        ck.fail(f"{field}.k", f"is not {k}", e["k"])
    if ck.key(e, "alpha", field) != identity["alphas"][k]:
        ck.fail(f"{field}.alpha", f"is not alphas[{k}] of the grid", e["alpha"])
    for name in FLOATS:
        _check_hex(ck, ck.key(e, name, field), f"{field}.{name}")
    for name in INTS:
        ck.integer(ck.key(e, name, field), f"{field}.{name}")
    if not isinstance(ck.key(e, "converged", field), bool):
        ck.fail(f"{field}.converged", "is not true or false", e["converged"])
    for m, v in ck.obj(ck.key(e, "test_metric", field), f"{field}.test_metric").items():
        _check_hex(ck, v, f"{field}.test_metric.{m}")
    ck.key(e, "extra", field)
    idx = check_array_entry(ck, ck.key(e, "indices", field), f"{field}.indices", dtype="<i8")
    n = idx["shape"][0]
    if n > identity["n_features"]:
        ck.fail(f"{field}.indices.shape[0]", f"exceeds n_features={identity['n_features']}", n)
    check_array_entry(ck, ck.key(e, "values", field), f"{field}.values", dtype="<f8", length=n)
    if "state" in e:
        for name, a in ck.obj(e["state"], f"{field}.state").items():
            ck.name(name, f"{field}.state key")
            check_array_entry(ck, a, f"{field}.state.{name}", dtype="<f8")


def _check_hex(ck: FieldChecker, v: Any, field: str) -> None:
    try:
        _unhex(v)
    except (TypeError, ValueError):
        ck.fail(field, "is not a float.hex string", v)


def _check_state_entries(where: str, entries: dict[str, Any], lengths: Mapping[str, int]) -> None:
    """Every saved state array is known and has the length the problem needs (checked on
    the progress file's entry, before the array is read)."""
    for name, e in entries.items():
        if name not in lengths:
            raise CheckpointCorruptError(
                f"{where}: array {name!r} is not one this solver saves ({sorted(lengths)})"
            )
        n = e["shape"][0]
        if n != lengths[name]:
            raise CheckpointCorruptError(
                f"{where}: array {name!r} has {n} values, this problem needs {lengths[name]}"
            )


def _compare(path: Path | str, old: dict[str, Any], new: dict[str, Any]) -> None:
    """Raise :class:`CheckpointMismatchError` naming the first field that differs."""
    if old.get("format") != FORMAT_NAME:
        raise StoreError(f"{path} is not a dl1 path checkpoint (format={old.get('format')!r})")
    for key in ("format_version", "dl1_version", "n_features"):
        if old.get(key) != new[key]:
            raise CheckpointMismatchError(
                f"checkpoint at {path} was written with {key}={old.get(key)!r}, "
                f"this run has {new[key]!r}"
            )
    for group in ("fingerprint", "settings"):
        d = _diff(old.get(group, {}), new[group], group)
        if d is not None:
            raise CheckpointMismatchError(
                f"checkpoint at {path} was written with {d[0]}={_show(d[1])}, "
                f"this run has {_show(d[2])}"
            )
    a, b = old.get("alphas", []), new["alphas"]
    if not isinstance(a, list):
        raise CheckpointCorruptError(f"checkpoint at {path}: {IDENTITY} field alphas is not a list")
    if len(a) != len(b):
        raise CheckpointMismatchError(
            f"checkpoint at {path} was written with len(alphas)={len(a)}, this run has {len(b)}"
        )
    for k, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            raise CheckpointMismatchError(
                f"checkpoint at {path} was written with alphas[{k}]={_show_hex(x)}, "
                f"this run has {_show_hex(y)}"
            )


__all__ = ["CheckpointMismatchError", "PathCheckpoint"]
