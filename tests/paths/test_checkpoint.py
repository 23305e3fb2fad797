"""PathCheckpoint: exact round trip, kill-and-resume, refusals naming the field, corruption."""

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import dl1.paths.checkpoint as ckmod
from dl1.errors import StoreCorruptError, StoreError
from dl1.paths import CheckpointMismatchError, PathCheckpoint

P = 40
ALPHAS = np.geomspace(1.0, 1e-3, 12)
FINGERPRINT = {"shape": [100, P], "nnz": 1234, "crc32c": [1, 2, 3]}
SETTINGS = {"tol": 1e-6, "loss": "squared", "l1_ratio": 1.0, "solver": {"max_rounds": 50}}
ROOT = Path(__file__).resolve().parents[2]


def open_ck(path, **over):
    kw = dict(fingerprint=FINGERPRINT, settings=SETTINGS, alphas=ALPHAS, n_features=P)
    kw.update(over)
    return PathCheckpoint.open_or_create(path, **kw)


def gen(k):
    """Deterministic record of alpha k, with signed zeros, NaN and inf in awkward places."""
    rng = np.random.default_rng(k)
    coef = np.where(rng.random(P) < 0.3, rng.standard_normal(P), 0.0)
    coef[k % P] = -0.0
    return dict(
        coef=coef,
        intercept=float(rng.standard_normal()),
        gap=float(np.nextafter(1e-7, 1.0)) if k % 3 else float("nan"),
        converged=bool(k % 3),
        n_active=int(np.count_nonzero(coef)),
        passes=1.0 / 3.0 + k,
        seconds=0.1 * k,
        rounds=k + 1,
        test_metric={"mse": 1.0 / (k + 3)} if k % 2 else None,
        extra={"k": k, "history": [0.1, float("inf")], "bad": float("nan")} if k == 1 else None,
    )


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def fill(path, n):
    ck = open_ck(path)
    for k in range(ck.n_done, n):
        ck.record(k, **gen(k))
    return ck


def test_round_trip_is_bit_exact(tmp_path):
    ck = fill(tmp_path / "ck", 5)
    assert ck.n_done == 5
    for ck2 in (ck, open_ck(tmp_path / "ck")):
        assert ck2.n_done == 5
        for k in range(5):
            assert same_bits(ck2.coef(k), gen(k)["coef"])  # -0.0 included
        d = ck2.load()
        assert same_bits(d["alphas"], ALPHAS[:5])
        dense = np.column_stack([gen(k)["coef"] for k in range(5)])
        assert d["coefs"].format == "csc" and d["coefs"].dtype == np.float64
        assert d["coefs"].shape == (P, 5)
        assert np.array_equal(d["coefs"].toarray(), dense)
        assert d["coefs"].nnz == np.count_nonzero(dense)
        for key, name in ckmod.LOAD_KEYS.items():
            want = np.array([gen(k)[key] for k in range(5)], dtype=d[name].dtype)
            assert same_bits(d[name], want), name  # NaN gaps round-trip too
        assert same_bits(d["converged"], np.array([gen(k)["converged"] for k in range(5)]))
        mse = d["test_metrics"]["mse"]
        assert np.isnan(mse[[0, 2, 4]]).all() and same_bits(mse[[1, 3]], np.array([1 / 4, 1 / 6]))
        assert d["extra"][0] is None and d["extra"][1]["k"] == 1
        assert d["extra"][1]["history"] == [0.1, float("inf")] and np.isnan(d["extra"][1]["bad"])


def test_empty_checkpoint_loads_an_empty_path(tmp_path):
    d = open_ck(tmp_path / "ck").load()
    assert d["coefs"].shape == (P, 0) and d["gaps"].shape == (0,) and d["test_metrics"] == {}
    assert open_ck(tmp_path / "ck").n_done == 0


def test_record_out_of_order_or_wrong_shape_is_refused(tmp_path):
    ck = open_ck(tmp_path / "ck", alphas=ALPHAS[:2])
    with pytest.raises(ValueError, match="out of order"):
        ck.record(1, **gen(1))
    ck.record(0, **gen(0))
    with pytest.raises(ValueError, match="out of order"):
        ck.record(0, **gen(0))
    with pytest.raises(ValueError, match="shape"):
        ck.record(1, **{**gen(1), "coef": np.zeros(P + 1)})
    ck.record(1, **gen(1))
    with pytest.raises(ValueError, match="past the end"):
        ck.record(2, **gen(2))
    with pytest.raises(IndexError):
        ck.coef(2)
    assert open_ck(tmp_path / "ck", alphas=ALPHAS[:2]).n_done == 2


def _mutate_version(monkeypatch):
    monkeypatch.setattr(ckmod, "__version__", "9.9.9")
    return {}


def _mutate_format(monkeypatch):
    monkeypatch.setattr(ckmod, "FORMAT_VERSION", ckmod.FORMAT_VERSION + 1)
    return {}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(fingerprint={**FINGERPRINT, "nnz": 1235}), "fingerprint.nnz=1234, this run has 1235"),
        (dict(fingerprint={**FINGERPRINT, "crc32c": [1, 2, 4]}), "fingerprint.crc32c="),
        (dict(fingerprint={**FINGERPRINT, "extra": 1}), "fingerprint.extra=<absent>"),
        (dict(settings={**SETTINGS, "tol": 1e-7}), "settings.tol=1e-06, this run has 1e-07"),
        (dict(settings={**SETTINGS, "loss": "logistic"}), 'settings.loss="squared"'),
        (dict(settings={**SETTINGS, "l1_ratio": 1}), "settings.l1_ratio=1.0, this run has 1"),
        (
            dict(settings={**SETTINGS, "solver": {"max_rounds": 51}}),
            "settings.solver.max_rounds=50, this run has 51",
        ),
        (dict(alphas=ALPHAS[:-1]), "len(alphas)=12, this run has 11"),
        (
            dict(alphas=np.concatenate([ALPHAS[:7], [np.nextafter(ALPHAS[7], 1)], ALPHAS[8:]])),
            "alphas[7]=",
        ),
        (dict(n_features=P + 1), "n_features=40, this run has 41"),
        (_mutate_version, "dl1_version='0.1.0', this run has '9.9.9'"),
        (_mutate_format, "format_version=1, this run has 2"),
    ],
)
def test_mismatch_is_refused_naming_the_field(tmp_path, monkeypatch, change, message):
    fill(tmp_path / "ck", 2)
    over = change(monkeypatch) if callable(change) else change
    with pytest.raises(CheckpointMismatchError) as e:
        open_ck(tmp_path / "ck", **over)
    assert message in str(e.value) and str(tmp_path / "ck") in str(e.value)
    assert isinstance(e.value, StoreError)


def test_equal_settings_reopen_even_with_nan_numpy_and_tuples(tmp_path):
    settings = {"tol": np.float64(1e-6), "n": np.int64(3), "w": (1.0, 2.0), "x": float("nan")}
    ck = open_ck(tmp_path / "ck", settings=settings)
    ck.record(0, **gen(0))
    again = {"tol": 1e-6, "n": 3, "w": [1.0, 2.0], "x": float("nan")}
    assert open_ck(tmp_path / "ck", settings=again).n_done == 1


def test_corrupted_or_missing_array_of_a_completed_alpha_is_named(tmp_path):
    fill(tmp_path / "ck", 4)
    chunk = tmp_path / "ck" / "coef" / "1" / "values" / "c" / "0"
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    chunk.write_bytes(bytes(raw))
    with pytest.raises(StoreCorruptError, match=r"completed alpha 1 .*coef/1/values"):
        open_ck(tmp_path / "ck")
    fill(tmp_path / "ck2", 4)
    (tmp_path / "ck2" / "coef" / "2" / "indices" / "c" / "0").unlink()
    with pytest.raises(StoreCorruptError, match=r"completed alpha 2 .*coef/2/indices"):
        open_ck(tmp_path / "ck2")


@pytest.mark.parametrize("name", ["progress", "identity"])
def test_deeply_nested_json_is_a_named_corruption_not_a_recursion_error(tmp_path, name):
    """Pass: a progress (or identity) file of 100,000 nested brackets, which JSON's parser
    cannot descend, is refused as a corrupt checkpoint naming the file (before: a bare
    RecursionError)."""
    from dl1.paths.checkpoint_format import IDENTITY, PROGRESS

    fill(tmp_path / "ck", 2)
    f = tmp_path / "ck" / (PROGRESS if name == "progress" else IDENTITY)
    f.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(StoreError, match=f.name):
        open_ck(tmp_path / "ck")


def test_leftover_arrays_of_an_unfinished_alpha_are_replaced(tmp_path):
    fill(tmp_path / "ck", 2)
    # arrays of alpha 2 written, progress not: what a kill between the two leaves
    ckmod.write_array(tmp_path / "ck", "coef/2/indices", np.arange(5, dtype=np.int64))
    ckmod.write_array(tmp_path / "ck", "coef/5/values", np.ones(3))
    ck = open_ck(tmp_path / "ck")
    assert ck.n_done == 2
    assert sorted(p.name for p in (tmp_path / "ck" / "coef").iterdir()) == ["0", "1"]
    ck.record(2, **gen(2))
    assert same_bits(open_ck(tmp_path / "ck").coef(2), gen(2)["coef"])


def test_interrupted_creation_is_restarted_and_foreign_directories_refused(tmp_path):
    ck = open_ck(tmp_path / "ck")
    (tmp_path / "ck" / ckmod.IDENTITY).unlink()  # killed before the identity file
    assert open_ck(tmp_path / "ck").n_done == 0
    assert ck.path == tmp_path / "ck"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "data.txt").write_text("x")
    with pytest.raises(StoreError, match="not a dl1 path checkpoint"):
        open_ck(tmp_path / "other")


def test_no_pickle_only_json_and_zarr_chunks(tmp_path):
    fill(tmp_path / "ck", 3)
    root = tmp_path / "ck"
    for f in root.rglob("*"):
        if f.is_dir():
            continue
        rel = f.relative_to(root)
        if f.name.endswith(".json"):
            meta = json.loads(f.read_text())  # plain JSON, parses without pickle
            if f.name == "zarr.json" and meta["node_type"] == "array":
                assert meta["data_type"] in ("int64", "float64"), rel
                assert [c["name"] for c in meta["codecs"]] == ["bytes", "blosc", "crc32c"], rel
        else:
            assert rel.parts[0] == "coef" and rel.parts[-2] == "c", rel  # a zarr chunk
    assert "pickle" not in "".join(f.read_text() for f in root.rglob("*.json"))


CHILD = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    import dl1.paths.checkpoint as ckmod
    from tests.paths.test_checkpoint import gen, open_ck

    mode, path, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    die = lambda: os.kill(os.getpid(), signal.SIGKILL)
    state = {{"k": -1, "arrays": 0}}
    if mode == "mid_arrays":
        real = ckmod.write_array
        def write_array(root, key, a, **kw):
            if state["k"] == kill_at and key.endswith("values"):
                die()
            return real(root, key, a, **kw)
        ckmod.write_array = write_array
    if mode == "before_progress":
        real_m = ckmod.write_manifest
        def write_manifest(root, manifest, name):
            if state["k"] == kill_at:
                die()
            return real_m(root, manifest, name)
        ckmod.write_manifest = write_manifest
    if mode == "tmp_written":
        real_r = os.replace
        def replace(a, b):
            if state["k"] == kill_at:
                die()
            return real_r(a, b)
        os.replace = replace
    ck = open_ck(path)
    for k in range(ck.n_done, len(ck.alphas)):
        state["k"] = k
        ck.record(k, **gen(k))
        print(k, flush=True)
        if mode == "between" and k == kill_at:
            die()
    """
)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    path = tmp_path_factory.mktemp("ref") / "ck"
    fill(path, len(ALPHAS))
    return path


def _assert_same_checkpoint(a, b):
    da, db = open_ck(a).load(), open_ck(b).load()
    assert da.keys() == db.keys()
    for key in da:
        if key == "coefs":
            for part in ("data", "indices", "indptr"):
                assert same_bits(getattr(da[key], part), getattr(db[key], part))
        elif key == "test_metrics":
            assert all(same_bits(da[key][m], db[key][m]) for m in da[key])
        elif key == "extra":
            assert json.dumps(da[key]) == json.dumps(db[key])
        else:
            assert same_bits(da[key], db[key]), key
    pa = json.loads((a / ckmod.PROGRESS).read_text())
    pb = json.loads((b / ckmod.PROGRESS).read_text())
    assert pa == pb  # same scalars, checksums and chunk sizes


@pytest.mark.parametrize(
    ("mode", "expect_done"),
    [("between", 5), ("mid_arrays", 4), ("before_progress", 4), ("tmp_written", 4), ("ext", None)],
)
def test_killed_writer_resumes_bit_identical(tmp_path, reference, mode, expect_done):
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(tests=str(ROOT)))
    path = tmp_path / "ck"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(script), mode, str(path), "4"]
    if mode == "ext":
        # killed from outside at an arbitrary moment, once a few alphas are done
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
        while proc.stdout.readline().strip() != "2":
            pass
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    else:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    ck = open_ck(path)
    if expect_done is not None:
        assert ck.n_done == expect_done
    assert 3 <= ck.n_done <= len(ALPHAS)
    for k in range(ck.n_done):
        assert same_bits(ck.coef(k), gen(k)["coef"])
    fill(path, len(ALPHAS))
    _assert_same_checkpoint(path, reference)


def test_solver_state_is_kept_for_the_latest_alpha_only_bit_for_bit(tmp_path):
    ck = open_ck(tmp_path / "ck")
    rng = np.random.default_rng(3)
    states = []
    for k in range(3):
        z = rng.standard_normal(17)
        z[k] = np.nan  # any float64 bits
        states.append({"z": z, "w": rng.standard_normal(P)})
        ck.record(k, **gen(k), state=states[-1])
        kept = [q.name for q in (tmp_path / "ck" / "state").iterdir() if q.is_dir()]
        assert kept == [str(k)]
    ck = open_ck(tmp_path / "ck")
    got = ck.state(2)
    for name in ("z", "w"):
        assert same_bits(got[name], states[2][name])
    assert ck.state(1) is None and ck.state(0) is None
    with pytest.raises(IndexError):
        ck.state(3)
    # a state written but not yet named by the progress file (a kill in between) is redone
    ckmod.write_array(tmp_path / "ck", "state/3/z", np.ones(4))
    ck = open_ck(tmp_path / "ck")
    ck.record(3, **gen(3), state={"z": np.zeros(17)})
    assert same_bits(open_ck(tmp_path / "ck").state(3)["z"], np.zeros(17))
    # a damaged state is named
    chunk = tmp_path / "ck" / "state" / "3" / "z" / "c" / "0"
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    chunk.write_bytes(bytes(raw))
    with pytest.raises(StoreCorruptError, match=r"solver state of alpha 3"):
        open_ck(tmp_path / "ck").state(3)
