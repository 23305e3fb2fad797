"""The on-disk format of a path checkpoint, and the checks of what is read back from it.

The layout is described in :mod:`dl1.paths.checkpoint`. This module holds its file names,
the encoding of floats (``float.hex``) and of JSON values, what the identity records of
the path's solver (:func:`solver_settings`), and every check made on a checkpoint read
back, which is untrusted: the identity compared with the run's field by field
(:class:`CheckpointMismatchError` names the first that differs), the progress file checked
as a schema, the coefficient and state arrays checked before a resume uses them.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dl1.errors import CheckpointCorruptError, StoreError
from dl1.store.location import open_regular
from dl1.store.manifest import FieldChecker, check_array_entry

FORMAT_NAME = "dl1-path-checkpoint"
FORMAT_VERSION = 1
IDENTITY = "dl1-checkpoint.json"
PROGRESS = "dl1-progress.json"
#: Held (``flock``) by the process writing the checkpoint; holds its pid, as JSON.
LOCK = "dl1-lock.json"
#: Float scalars of each completed alpha (stored as float.hex), and the integer ones.
FLOATS = ("intercept", "gap", "passes", "seconds")
INTS = ("n_active", "rounds")
#: Key of each scalar in the dict returned by :meth:`~dl1.paths.checkpoint.PathCheckpoint.load`.
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
