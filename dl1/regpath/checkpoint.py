"""Incremental, resumable checkpoints of a regularisation path (no pickle).

Layout of a checkpoint directory (a zarr v3 group)::

    CKPT/
      zarr.json            root group {"dl1_checkpoint": 1}
      meta.json            format/dl1 versions, data fingerprint, settings, alphas, p
      a{k}/idx, a{k}/val   nonzero indices (int64) and values (float64) of alpha k's coef
      progress.json        completed alphas (a prefix), their scalars and array checksums

Alpha ``k``'s arrays are written first, then ``progress.json`` is replaced atomically, so a
process killed at any point leaves a consistent prefix; arrays of an alpha missing from the
progress file are leftovers and are rewritten. Floats are stored as ``float.hex`` strings,
so every value round-trips bit for bit.
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
from dl1.errors import StoreError
from dl1.store.format import write_array, write_manifest
from dl1.store.reader import read_array

FORMAT_VERSION = 1
META = "meta.json"
PROGRESS = "progress.json"
SCALARS = ("intercept", "gap", "seconds", "passes")
INTS = ("n_active", "rounds")


class CheckpointMismatchError(StoreError):
    """A checkpoint belongs to other data, settings or versions; the message names the field."""


def _hex(x: float) -> str:
    return float(x).hex()


def _unhex(s: str) -> float:
    return float.fromhex(s)


class PathCheckpoint:
    """A path checkpoint; create or reopen with :meth:`open_or_create`."""

    def __init__(self, path: Path, meta: dict[str, Any], progress: list[dict[str, Any]]):
        self.path = path
        self.meta = meta
        self._done = progress

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
        """Open the checkpoint at ``path`` (refusing a mismatch) or create it."""
        path = Path(path).absolute()
        meta = {
            "format": "dl1-path-checkpoint",
            "format_version": FORMAT_VERSION,
            "dl1_version": __version__,
            "fingerprint": json.loads(json.dumps(fingerprint)),
            "settings": json.loads(json.dumps(settings)),
            "alphas": [_hex(a) for a in np.asarray(alphas, dtype=np.float64)],
            "n_features": int(n_features),
        }
        if (path / META).exists():
            with open(path / META, encoding="utf-8") as fh:
                old = json.load(fh)
            _compare(path, old, meta)
            progress = []
            if (path / PROGRESS).exists():
                with open(path / PROGRESS, encoding="utf-8") as fh:
                    progress = json.load(fh)["done"]
            return cls(path, meta, progress)
        if path.exists() and any(path.iterdir()):
            raise FileExistsError(f"{path} exists and is not a dl1 path checkpoint")
        path.mkdir(parents=True, exist_ok=True)
        zarr.open_group(os.fspath(path), mode="w-", attributes={"dl1_checkpoint": 1})
        write_manifest(path, meta, META)
        write_manifest(path, {"done": []}, PROGRESS)
        return cls(path, meta, [])

    @property
    def n_done(self) -> int:
        """Number of completed alphas (always a prefix of the grid)."""
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
        passes: int,
        seconds: float,
        rounds: int,
        test_metric: dict[str, float] | None = None,
    ) -> None:
        """Write alpha ``k``'s result atomically; ``k`` must be the next alpha."""
        if k != self.n_done:
            raise ValueError(f"alpha {k} recorded out of order: {self.n_done} alphas are done")
        coef = np.asarray(coef, dtype=np.float64)
        if coef.shape != (self.meta["n_features"],):
            raise ValueError(f"coef has shape {coef.shape}, expected ({self.meta['n_features']},)")
        d = self.path / f"a{k}"
        if d.exists():  # leftover of a run killed while writing this alpha
            shutil.rmtree(d)
        nz = np.flatnonzero(coef).astype(np.int64)
        entry = {
            "k": k,
            "idx": write_array(self.path, f"a{k}/idx", nz),
            "val": write_array(self.path, f"a{k}/val", coef[nz]),
            "converged": bool(converged),
            "test_metric": {m: _hex(v) for m, v in (test_metric or {}).items()},
        }
        for name, v in zip(SCALARS, (intercept, gap, seconds, passes), strict=True):
            entry[name] = _hex(v)
        for name, v in zip(INTS, (n_active, rounds), strict=True):
            entry[name] = int(v)
        write_manifest(self.path, {"done": [*self._done, entry]}, PROGRESS)
        self._done.append(entry)

    def coef(self, k: int) -> np.ndarray:
        """Dense coefficients of completed alpha ``k`` (verified against their checksums)."""
        e = self._done[k]
        out = np.zeros(self.meta["n_features"])
        out[read_array(self.path, f"a{k}/idx", e["idx"])] = read_array(
            self.path, f"a{k}/val", e["val"]
        )
        return out

    def load(self) -> dict[str, Any]:
        """Arrays of the completed prefix (coefficients verified against their checksums)."""
        p, m = self.meta["n_features"], self.n_done
        rows, cols, vals = [], [], []
        for k, e in enumerate(self._done):
            idx = read_array(self.path, f"a{k}/idx", e["idx"])
            rows.append(idx)
            cols.append(np.full(idx.shape[0], k, dtype=np.int64))
            vals.append(read_array(self.path, f"a{k}/val", e["val"]))
        coefs = sp.csc_matrix(
            (
                np.concatenate(vals) if vals else np.zeros(0),
                (
                    np.concatenate(rows) if rows else np.zeros(0, np.int64),
                    np.concatenate(cols) if cols else np.zeros(0, np.int64),
                ),
            ),
            shape=(p, m),
        )
        out: dict[str, Any] = {"coefs": coefs}
        for name, key in zip(SCALARS, ("intercepts", "gaps", "seconds", "passes"), strict=True):
            out[key] = np.array([_unhex(e[name]) for e in self._done])
        for name in INTS:
            out[name] = np.array([e[name] for e in self._done], dtype=np.int64)
        out["converged"] = np.array([e["converged"] for e in self._done], dtype=bool)
        names = sorted({n for e in self._done for n in e["test_metric"]})
        out["test_metrics"] = {
            n: np.array([_unhex(e["test_metric"].get(n, "nan")) for e in self._done]) for n in names
        }
        return out


def _compare(path: Path, old: dict[str, Any], new: dict[str, Any]) -> None:
    """Raise :class:`CheckpointMismatchError` naming the first field that differs."""
    for key in ("format", "format_version", "dl1_version", "n_features"):
        if old.get(key) != new[key]:
            raise CheckpointMismatchError(
                f"checkpoint at {path} was written with {key}={old.get(key)!r}, "
                f"this run has {new[key]!r}"
            )
    for group in ("fingerprint", "settings"):
        a, b = old.get(group, {}), new[group]
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                raise CheckpointMismatchError(
                    f"checkpoint at {path} was written with {group}.{key}={a.get(key)!r}, "
                    f"this run has {b.get(key)!r}"
                )
    if old.get("alphas") != new["alphas"]:
        raise CheckpointMismatchError(
            f"checkpoint at {path} was written for another alpha grid "
            f"({len(old.get('alphas', []))} alphas from {old.get('alphas', ['?'])[0]})"
        )
