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

The format's names and the checks of what is read back: :mod:`dl1.paths.checkpoint_format`;
the locks keeping a checkpoint to one writer: :mod:`dl1.paths.checkpoint_lock`.
"""

from __future__ import annotations

import os
import shutil
import threading
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import zarr

from dl1 import __version__
from dl1.errors import CheckpointCorruptError, CheckpointLockedError, StoreCorruptError, StoreError
from dl1.paths.checkpoint_format import (
    FLOATS,
    FORMAT_NAME,
    FORMAT_VERSION,
    IDENTITY,
    INTS,
    LOAD_KEYS,
    LOCK,
    PROGRESS,
    _check_progress,
    _check_state_entries,
    _coef_problem,
    _compare,
    _hex,
    _interrupted_creation,
    _jsonable,
    _read_json,
    _unhex,
)
from dl1.paths.checkpoint_lock import (
    _HELD,
    _REGISTRY,
    _claim,
    _Lock,
    _release_claim,
    _remote_key,
    _take_lease,
    _take_lock,
)
from dl1.paths.remote import Lease, Mirror
from dl1.store.arrays import read_array
from dl1.store.format import write_array, write_manifest
from dl1.store.location import Location
from dl1.store.manifest import check_inside
from dl1.store.upload import destination


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


__all__ = ["PathCheckpoint"]
