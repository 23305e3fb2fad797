"""Path checkpoints (exact round trip, refusals, corruption) and PathResult."""

import numpy as np
import pytest

from dl1.errors import StoreCorruptError
from dl1.regpath import CheckpointMismatchError, PathCheckpoint, PathResult

ALPHAS = np.geomspace(1.0, 0.01, 5)


def open_ck(path, **over):
    kw = dict(
        fingerprint={"data": "abc"},
        settings={"tol": 1e-6, "loss": "squared"},
        alphas=ALPHAS,
        n_features=7,
    )
    kw.update(over)
    return PathCheckpoint.open_or_create(path, **kw)


def rec(k, rng):
    coef = np.where(rng.random(7) < 0.5, rng.standard_normal(7) / 3, 0.0)
    return dict(
        coef=coef,
        intercept=rng.standard_normal(),
        gap=float(np.nextafter(1e-7, 1)),
        converged=bool(k % 2),
        n_active=int(np.count_nonzero(coef)),
        passes=k + 1,
        seconds=0.1 * k,
        rounds=k,
        test_metric={"mse": 1 / 3} if k else None,
    )


def test_round_trip_is_bit_exact_and_resumes_a_prefix(tmp_path):
    rng = np.random.default_rng(0)
    recs = [rec(k, rng) for k in range(3)]
    ck = open_ck(tmp_path / "ck")
    for k, r in enumerate(recs):
        ck.record(k, **r)
    again = open_ck(tmp_path / "ck")
    assert again.n_done == 3
    d = again.load()
    for k, r in enumerate(recs):
        np.testing.assert_array_equal(d["coefs"][:, k].toarray().ravel(), r["coef"])
        np.testing.assert_array_equal(again.coef(k), r["coef"])
        assert d["intercepts"][k] == r["intercept"] and d["gaps"][k] == r["gap"]
        assert d["converged"][k] == r["converged"] and d["passes"][k] == r["passes"]
    assert np.isnan(d["test_metrics"]["mse"][0]) and d["test_metrics"]["mse"][1] == 1 / 3
    res = PathResult.from_arrays(d, alphas=ALPHAS, l1_ratio=1.0, loss="squared", tol=1e-6)
    assert res.best_alpha_ == ALPHAS[1]
    assert "NO" in res.summary()
    with pytest.raises(ValueError, match="out of order"):
        again.record(4, **recs[0])
    for f in (tmp_path / "ck").rglob("*"):
        if f.is_file():
            assert not f.read_bytes().startswith(b"\x80")  # no pickle


@pytest.mark.parametrize(
    "over, field",
    [
        (dict(fingerprint={"data": "xyz"}), "fingerprint.data"),
        (dict(settings={"tol": 1e-7, "loss": "squared"}), "settings.tol"),
        (dict(alphas=ALPHAS * (1 + 1e-15)), "alpha grid"),
        (dict(n_features=8), "n_features"),
    ],
)
def test_mismatch_is_refused_naming_the_field(tmp_path, over, field):
    open_ck(tmp_path / "ck")
    with pytest.raises(CheckpointMismatchError, match=field):
        open_ck(tmp_path / "ck", **over)


def test_corrupted_completed_alpha_is_named(tmp_path):
    rng = np.random.default_rng(1)
    ck = open_ck(tmp_path / "ck")
    r = rec(1, rng)
    r["coef"][:] = 1.0
    ck.record(0, **r)
    f = tmp_path / "ck" / "a0" / "val" / "c" / "0"
    raw = bytearray(f.read_bytes())
    raw[len(raw) // 2] ^= 0x04
    f.write_bytes(bytes(raw))
    with pytest.raises(StoreCorruptError, match="a0/val"):
        open_ck(tmp_path / "ck").load()


def test_leftover_arrays_of_an_unfinished_alpha_are_rewritten(tmp_path):
    rng = np.random.default_rng(2)
    ck = open_ck(tmp_path / "ck")
    ck.record(0, **rec(0, rng))
    (tmp_path / "ck" / "a1").mkdir()
    (tmp_path / "ck" / "a1" / "junk").write_text("half-written")
    ck = open_ck(tmp_path / "ck")
    r = rec(1, rng)
    ck.record(1, **r)
    np.testing.assert_array_equal(open_ck(tmp_path / "ck").coef(1), r["coef"])
