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

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import zarr

from dl1 import __version__
from dl1.errors import StoreCorruptError, StoreError
from dl1.store.format import write_array, write_manifest
from dl1.store.reader import read_array

FORMAT_NAME = "dl1-path-checkpoint"
FORMAT_VERSION = 1
IDENTITY = "dl1-checkpoint.json"
PROGRESS = "dl1-progress.json"
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


class PathCheckpoint:
    """Checkpoint of a regularisation path; create or reopen with :meth:`open_or_create`.

    One process writes a checkpoint at a time.

    Attributes
    ----------
    path : Path
        The checkpoint directory.
    alphas : ndarray (n_alphas,)
        The alpha grid, as recorded.
    n_features : int
    fingerprint, settings : dict
        As given at creation (after a JSON round trip).
    """

    def __init__(self, path: Path, identity: dict[str, Any], done: list[dict[str, Any]]):
        self.path = path
        self._identity = identity
        self._done = done
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
    ) -> PathCheckpoint:
        """Reopen the checkpoint at ``path``, or create it if there is none.

        Parameters
        ----------
        path : str or PathLike
            Checkpoint directory; created if missing. An existing directory must be empty, a
            dl1 path checkpoint, or one whose creation was interrupted.
        fingerprint : dict
            JSON-able description of the data (e.g. store checksums, shape, nnz).
        settings : dict
            JSON-able settings of the path (l1_ratio, loss, tol, solver options...).
        alphas : ndarray (n_alphas,)
            The alpha grid, compared bit for bit.
        n_features : int
            Length of each coefficient vector.

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
        StoreError
            ``path`` is a non-empty directory that is not a dl1 path checkpoint.
        """
        path = Path(path).absolute()
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
        if (path / IDENTITY).exists():
            old = _read_json(path / IDENTITY, StoreError)
            _compare(path, old, identity)
            done = _read_json(path / PROGRESS, StoreCorruptError).get("done")
            ck = cls(path, old, _check_progress(path, done, len(alphas)))
            ck._verify()
            ck._remove_leftovers()
            return ck
        if path.exists() and not _interrupted_creation(path):
            raise StoreError(f"{path} exists and is not a dl1 path checkpoint")
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        zarr.open_group(
            os.fspath(path),
            mode="w-",
            attributes={"dl1_format": FORMAT_NAME, "format_version": FORMAT_VERSION},
        )
        write_manifest(path, {"done": []}, PROGRESS)
        write_manifest(path, identity, IDENTITY)  # last: marks the checkpoint as created
        return cls(path, _read_json(path / IDENTITY, StoreError), [])

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
        """
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
            shutil.rmtree(d)
        nz = np.flatnonzero(coef.view(np.uint64)).astype(np.int64)
        entry["indices"] = write_array(self.path, f"coef/{k}/indices", nz)
        entry["values"] = write_array(self.path, f"coef/{k}/values", coef[nz])
        _fsync_tree(d)
        if state is not None:
            sd = self.path / "state" / str(k)
            if sd.exists():
                shutil.rmtree(sd)
            entry["state"] = {
                name: write_array(
                    self.path, f"state/{k}/{name}", np.ascontiguousarray(a, dtype=np.float64)
                )
                for name, a in state.items()
            }
            _fsync_tree(sd)
        write_manifest(self.path, {"done": [*self._done, entry]}, PROGRESS)
        self._done.append(entry)
        # the progress file now names this alpha's state: older states are not needed
        for old in (self.path / "state").glob("*"):
            if old.name.isdigit() and int(old.name) < k:
                shutil.rmtree(old)
                self._done[int(old.name)].pop("state", None)

    def state(self, k: int) -> dict[str, np.ndarray] | None:
        """The state recorded with completed alpha ``k``, if it is still kept (the latest)."""
        if not 0 <= k < self.n_done:
            raise IndexError(f"alpha {k} is not completed ({self.n_done} alphas are done)")
        entries = self._done[k].get("state")
        if not entries or not (self.path / "state" / str(k)).is_dir():
            return None
        try:
            return {
                name: read_array(self.path, f"state/{k}/{name}", e) for name, e in entries.items()
            }
        except StoreCorruptError as err:
            raise StoreCorruptError(
                f"checkpoint at {self.path}: the solver state of alpha {k} is damaged: {err}"
            ) from err

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
        return f"PathCheckpoint({str(self.path)!r}, {self.n_done}/{len(self.alphas)} alphas done)"

    def _read(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        e = self._done[k]
        try:
            idx = read_array(self.path, f"coef/{k}/indices", e["indices"])
            val = read_array(self.path, f"coef/{k}/values", e["values"])
        except StoreCorruptError as err:
            raise StoreCorruptError(
                f"checkpoint at {self.path}: completed alpha {k} "
                f"(alpha={_unhex(e['alpha']):.6g}) is damaged: {err}"
            ) from err
        if idx.shape != val.shape or (idx.size and (idx[0] < 0 or idx[-1] >= self.n_features)):
            raise StoreCorruptError(
                f"checkpoint at {self.path}: completed alpha {k} has inconsistent arrays"
            )
        return idx, val

    def _verify(self) -> None:
        for k in range(self.n_done):
            self._read(k)

    def _remove_leftovers(self) -> None:
        root = self.path / "coef"
        if not root.is_dir():
            return
        for d in root.iterdir():
            if not (d.name.isdigit() and int(d.name) < self.n_done):
                if d.is_dir():
                    shutil.rmtree(d)
                else:
                    d.unlink()


def _read_json(f: Path, error: type[StoreError]) -> dict[str, Any]:
    try:
        with open(f, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError) as e:
        raise error(f"{f} is missing, unreadable or truncated: {e}") from e


def _interrupted_creation(path: Path) -> bool:
    """Whether ``path`` is empty or holds only what a creation killed before its end writes."""
    names = {p.name for p in path.iterdir()}
    if not names:
        return True
    if not names <= {"zarr.json", PROGRESS, PROGRESS + ".tmp", IDENTITY + ".tmp"}:
        return False
    if "zarr.json" not in names:
        return True
    try:
        attrs = _read_json(path / "zarr.json", StoreError).get("attributes", {})
    except StoreError:
        return False
    return attrs.get("dl1_format") == FORMAT_NAME


def _check_progress(path: Path, done: Any, n_alphas: int) -> list[dict[str, Any]]:
    if not isinstance(done, list) or len(done) > n_alphas:
        raise StoreCorruptError(f"checkpoint at {path}: {PROGRESS} is malformed")
    for k, e in enumerate(done):
        if not isinstance(e, dict) or e.get("k") != k:
            raise StoreCorruptError(
                f"checkpoint at {path}: entry {k} of {PROGRESS} is not alpha {k}"
            )
    return done


def _compare(path: Path, old: dict[str, Any], new: dict[str, Any]) -> None:
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
    if len(a) != len(b):
        raise CheckpointMismatchError(
            f"checkpoint at {path} was written with len(alphas)={len(a)}, this run has {len(b)}"
        )
    for k, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            raise CheckpointMismatchError(
                f"checkpoint at {path} was written with alphas[{k}]={_unhex(x)!r} ({x}), "
                f"this run has {_unhex(y)!r} ({y})"
            )


__all__ = ["CheckpointMismatchError", "PathCheckpoint"]
