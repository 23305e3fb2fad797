"""Fuzzing stores and checkpoints: seeded mutations of manifests, chunks, arrays (with valid
checksums, so only the structure checks can catch them) and checkpoint states.

Every mutated copy is fitted (or its path resumed) in a child process with a timeout,
several cases per child. Pass criterion, per case: a dl1 error (a Dl1Error subclass whose
message is non-empty and names where: a field, array, chunk, block, alpha...) or the
answer of the unmutated data, bit for bit; never a crash (negative return code), a hang
(timeout) or a raw Python error (IndexError, KeyError, ValueError...). 48 cases in CI,
400 with DL1_HEAVY=1.
"""

import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest

import dl1
from dl1.paths.checkpoint_format import IDENTITY, PROGRESS
from dl1.store.arrays import read_array
from dl1.store.format import MANIFEST
from tests.helpers import stop_path_after
from tests.reliability.untrusted import make_store, rewrite_array, run_child

HEAVY = os.environ.get("DL1_HEAVY") == "1"
N_CASES = 400 if HEAVY else 48
PER_CHILD = 16
N_ALPHAS = 6
ALPHA = 0.05
SEED = int(os.environ.get("DL1_FUZZ_SEED", "2024"))  # another seed explores further
#: A message names where the problem is: one of these words, or a field of the identity.
WHERE = (
    "field", "array", "chunk", "block", "column", "alpha", "manifest", PROGRESS, IDENTITY,
    "fingerprint.", "settings.", "n_features", "y[", "sample_weight[", "format", "version",
)  # fmt: skip

# --------------------------------------------------------------- JSON mutations


def _nodes(tree, path=()):
    """Every (path, value) of a JSON tree, the root excluded."""
    items = tree.items() if isinstance(tree, dict) else enumerate(tree)
    for k, v in items:
        yield (*path, k), v
        if isinstance(v, (dict, list)):
            yield from _nodes(v, (*path, k))


def _parent(tree, path):
    for k in path[:-1]:
        tree = tree[k]
    return tree


WRONG = [None, "x", -1, 1.5, [], {}, True, 10**15, 2**63 - 1, "../../etc/passwd", float("nan")]


def mutate_json(tree, rng):
    """One random edit of a JSON tree in place; returns its description."""
    nodes = list(_nodes(tree))
    path, value = nodes[rng.integers(len(nodes))]
    parent, key = _parent(tree, path), path[-1]
    op = rng.choice(["delete", "wrong", "huge", "negative", "traversal", "extend"])
    if op == "delete":
        del parent[key]
    elif op == "wrong":
        parent[key] = WRONG[rng.integers(len(WRONG))]
    elif op == "huge":
        parent[key] = 10**15 if rng.random() < 0.5 else 2**62
    elif op == "negative":
        parent[key] = -1
    elif op == "traversal" and isinstance(parent, dict):
        parent["../../" + str(key)] = parent.pop(key)
    elif op == "traversal":
        parent[key] = "/etc/passwd"
    elif isinstance(value, list) and value:
        value.append(value[-1])
    else:
        parent[key] = [value, value]
    return f"{op} {'.'.join(map(str, path))}"


def mutate_json_file(f: Path, rng) -> str:
    if rng.random() < 0.1:
        raw = f.read_bytes()
        f.write_bytes(raw[: rng.integers(len(raw))])
        return f"truncate {f.name}"
    tree = json.loads(f.read_text())
    what = mutate_json(tree, rng)
    f.write_text(json.dumps(tree))
    return f"{f.name}: {what}"


# ------------------------------------------------------------ chunk mutations


def mutate_chunk(root: Path, rng) -> str:
    """Truncate, extend, flip a bit of, empty, delete or swap a random chunk file."""
    chunks = sorted(p for p in root.rglob("c/*") if p.is_file())
    f = chunks[rng.integers(len(chunks))]
    raw = f.read_bytes()
    op = rng.choice(["truncate", "extend", "flip", "empty", "delete", "swap"])
    if op == "truncate":
        f.write_bytes(raw[: rng.integers(len(raw))])
    elif op == "extend":
        f.write_bytes(raw + rng.bytes(int(rng.integers(1, 64))))
    elif op == "flip":
        pos = int(rng.integers(len(raw)))
        f.write_bytes(raw[:pos] + bytes([raw[pos] ^ (1 << int(rng.integers(8)))]) + raw[pos + 1 :])
    elif op == "empty":
        f.write_bytes(b"")
    elif op == "delete":
        f.unlink()
    else:
        other = chunks[rng.integers(len(chunks))]
        f.write_bytes(other.read_bytes())
    return f"{op} {f.relative_to(root)}"


# --------------------------------------------- checksum-valid array mutations


def _hostile_values(a: np.ndarray, rng) -> tuple[np.ndarray, str]:
    """A hostile replacement of a stored array. Only edits that make it invalid (or leave
    it unchanged) are made: a float array rewritten with other finite values of the same
    length is simply other data, which no check can (or should) tell from the real."""
    ops = ["cut", "extend", "empty", "poke"] + (
        ["reverse", "shuffle"] if a.dtype.kind == "i" else []
    )
    op = rng.choice(ops)
    if op == "cut":
        return a[: rng.integers(max(1, a.shape[0]))], op
    if op == "extend":
        return np.concatenate([a, a[: rng.integers(1, 8)] if a.size else np.ones(3, a.dtype)]), op
    if op == "empty" or a.size == 0:
        return a[:0], "empty"
    b = a.copy()
    if op == "reverse":
        return b[::-1].copy(), op
    if op == "shuffle":
        rng.shuffle(b)
        return b, op
    pos = int(rng.integers(b.size))
    if b.dtype.kind == "f":
        b[pos] = rng.choice([np.nan, np.inf, -np.inf])
    else:
        info = np.iinfo(b.dtype)
        b[pos] = rng.choice([-1, info.max, info.min])
    return b, f"poke[{pos}]"


def _array_entries(tree, path=()):
    """(path, entry) of every array entry (a dict with "crc32c") of a manifest or progress."""
    for p, v in _nodes(tree, path):
        if isinstance(v, dict) and "crc32c" in v:
            yield p, v


def _key(path) -> str:
    """Array key of a manifest entry path: splits.S.arrays.NAME, splits.S.blocks.F[i][j]..."""
    if path[0] == "splits":
        s = path[1]
        if path[2] == "arrays":
            return f"{s}/{path[3]}"
        fmt, i, j, name = path[3], path[4], path[5], path[7]
        return f"{s}/X/{fmt}/b{i}.{j}/{name}"
    # progress: done.[k].indices|values|state.NAME
    k = path[1]
    return f"coef/{k}/{path[2]}" if path[2] != "state" else f"state/{k}/{path[3]}"


def mutate_array(root: Path, json_name: str, rng) -> str:
    f = root / json_name
    tree = json.loads(f.read_text())
    # (a progress file still names the state of the alpha before the latest, whose
    # folder record() already removed: only arrays that exist are rewritten)
    entries = [(p, e) for p, e in _array_entries(tree) if (root / _key(p)).is_dir()]
    path, entry = entries[rng.integers(len(entries))]
    key = _key(path)
    b, op = _hostile_values(read_array(root, key, entry), rng)
    _parent(tree, path)[path[-1]] = rewrite_array(root, key, b)
    f.write_text(json.dumps(tree))
    return f"{op} {key} (checksums valid)"


# -------------------------------------------------------------------- cases


def make_cases(base: Path, store: Path, partial: Path, n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    cases = []
    for c in range(n):
        kind = rng.choice(["manifest", "chunk", "array", "ck-json", "ck-chunk", "ck-array"],
                          p=[0.3, 0.2, 0.15, 0.15, 0.1, 0.1])  # fmt: skip
        d = base / f"case{c}"
        if kind.startswith("ck"):
            shutil.copytree(partial, d)
            if kind == "ck-json":
                name = PROGRESS if rng.random() < 0.8 else IDENTITY
                what = mutate_json_file(d / name, rng)
            elif kind == "ck-chunk":
                what = mutate_chunk(d, rng)
            else:
                what = mutate_array(d, PROGRESS, rng)
        else:
            shutil.copytree(store, d)
            if kind == "manifest":
                what = mutate_json_file(d / MANIFEST, rng)
            elif kind == "chunk":
                what = mutate_chunk(d, rng)
            else:
                what = mutate_array(d, MANIFEST, rng)
        cases.append({"id": c, "kind": str(kind), "what": what, "dir": str(d)})
    return cases


FUZZ_CHILD = textwrap.dedent(
    """
    import json, sys, warnings
    import numpy as np
    import dl1
    from dl1.errors import Dl1Error

    warnings.simplefilter("ignore")
    store, ref_ck, n_alphas, alpha = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    ref_fit = dl1.fit(store, alpha=alpha)
    ref_path = dl1.path(store, n_alphas=n_alphas, checkpoint=ref_ck)  # reload: no solving
    for case in json.loads(sys.stdin.read()):
        print(json.dumps({"start": case["id"]}), flush=True)
        try:
            if case["kind"].startswith("ck"):
                r = dl1.path(store, n_alphas=n_alphas, checkpoint=case["dir"])
                same = (r.coefs_ != ref_path.coefs_).nnz == 0 and np.array_equal(
                    r.intercepts_, ref_path.intercepts_)
            else:
                r = dl1.fit(case["dir"], alpha=alpha)
                same = np.array_equal(r.coef_, ref_fit.coef_) and r.intercept_ == ref_fit.intercept_
            out = {"error": None, "same": bool(same)}
        except Exception as e:
            out = {"error": type(e).__name__, "dl1": isinstance(e, Dl1Error), "msg": str(e)}
        print(json.dumps({"case": case["id"], **out}), flush=True)
    """
)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    base = tmp_path_factory.mktemp("fuzz")
    store = make_store(base / "s", formats=("csc", "csr"), weighted=True)
    dl1.path(str(store), n_alphas=N_ALPHAS, checkpoint=str(base / "ref"))

    stop_path_after(2, str(store), n_alphas=N_ALPHAS, checkpoint=str(base / "partial"))
    return base, store


def _run_batch(store: Path, ref: Path, batch: list[dict]) -> dict[int, dict]:
    args = (str(store), str(ref), str(N_ALPHAS), str(ALPHA))
    try:
        proc = run_child(FUZZ_CHILD, timeout=120, args=args, input=json.dumps(batch))
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        started = [json.loads(x)["start"] for x in out.splitlines() if '"start"' in x]
        pytest.fail(f"hang: case {started[-1] if started else '?'} of {batch}")
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0:
        started = [x["start"] for x in lines if "start" in x]
        case = next((c for c in batch if started and c["id"] == started[-1]), None)
        pytest.fail(f"child died with {proc.returncode} on {case}: {proc.stderr[-2000:]}")
    return {x["case"]: x for x in lines if "case" in x}


@pytest.mark.slow
def test_fuzzed_stores_and_checkpoints_fail_cleanly_or_answer_right(data):
    """Pass: every one of N_CASES seeded mutations (manifest fields deleted, retyped, huge,
    negative, renamed to traversal names, lists extended, files truncated; chunk files
    truncated, extended, bit-flipped, emptied, deleted, swapped; arrays cut, extended,
    poked with NaN/inf/out-of-range values, reversed, shuffled, emptied with valid
    checksums; the same on a checkpoint's progress, identity, chunks and states) gives a
    dl1 error naming where, or the unmutated answer; no crash, hang or raw error."""
    base, store = data
    cases = make_cases(base / "cases", store, base / "partial", N_CASES, SEED)
    bad = []
    for lo in range(0, len(cases), PER_CHILD):
        batch = cases[lo : lo + PER_CHILD]
        got = _run_batch(store, base / "ref", batch)
        for case in batch:
            r = got[case["id"]]
            if r["error"] is None:
                ok = r["same"]
            else:
                msg = r["msg"].lower()
                ok = r["dl1"] and msg.strip() and any(w.lower() in msg for w in WHERE)
            if not ok:
                bad.append((case["what"], r))
    assert not bad, "\n".join(map(str, bad))
