"""Tests of the synthetic E2006-like generator (dl1.datasets).

Tolerances are derived from the generative model, not tuned to one seed: expected values
come from :func:`column_probability` (the probability that a row holds a column of a given
popularity rank; the number of rows holding it is then Binomial(n, d_r)), and each check
allows 4 standard errors of the statistic, or a stated absolute margin where the statistic is
a smooth average over many columns. Every statistical check runs on several seeds.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.stats import binom, kstest

from dl1.datasets import (
    PRESETS,
    column_probability,
    draws_median,
    expected_draws_per_row,
    make_e2006_like,
    rank_pmf,
    true_coef,
)
from dl1.store import open_store

SEEDS = (0, 1, 2)
#: E2006-tfidf-shaped (p = 150,360, 1,200 nonzeros per row) but only 400 rows.
TFIDF_SHRUNK = dataclasses.replace(PRESETS["tfidf"], name="tfidf-shrunk", n_train=400, n_test=0)


def _X(store, split: str = "train") -> sp.csr_matrix:
    """The whole split as CSR, from the verified blocks."""
    rb, cb = store.row_bounds(split), store.col_bounds(split)
    rows = [
        sp.hstack([store.read_block(split, i, j) for j in range(len(cb) - 1)], format="csr")
        for i in range(len(rb) - 1)
    ]
    return sp.vstack(rows, format="csr")


@pytest.fixture(scope="module")
def small_stores(tmp_path_factory):
    """The "small" preset for several seeds (regression)."""
    root = tmp_path_factory.mktemp("e2006")
    return {s: make_e2006_like(root / f"small-{s}", "small", seed=s) for s in SEEDS}


@pytest.fixture(scope="module")
def tfidf_stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2006-tfidf")
    return {s: make_e2006_like(root / f"tfidf-{s}", TFIDF_SHRUNK, seed=s) for s in SEEDS}


# ------------------------------------------------------------------------------ presets
def test_preset_parameters():
    small, tfidf, log1p = PRESETS["small"], PRESETS["tfidf"], PRESETS["log1p"]
    assert (small.n_train, small.n_features) == (2_000, 50_000)
    assert (tfidf.n_train, tfidf.n_test, tfidf.n_features) == (16_087, 3_308, 150_360)
    assert (log1p.n_train, log1p.n_test, log1p.n_features) == (16_087, 3_308, 4_272_227)
    assert tfidf.row_nnz == pytest.approx(1_200, rel=0.02)
    assert log1p.row_nnz == pytest.approx(6_000, rel=0.05)
    assert log1p.density == pytest.approx(0.0014, rel=0.05)
    assert log1p.expected_nnz == pytest.approx(93e6, rel=0.01)
    assert tfidf.density == pytest.approx(0.008, rel=0.01)
    for pr in PRESETS.values():
        assert pr.n_informative == 200
    for pr in (small, tfidf, log1p):  # E2006's split
        assert pr.n_test / pr.n_train == pytest.approx(3_308 / 16_087, rel=0.01)
    tall, short = PRESETS["tall"], PRESETS["short"]
    assert (tall.n_train, tall.n_features, tall.row_nnz) == (2_000_000, 260_941, 88.5)
    assert (short.n_train, short.n_features, short.row_nnz) == (200_000, 230_000, 16.0)
    clf = PRESETS["shortclf"]
    assert (clf.n_train, clf.n_features) == (842_000, 400_000)
    assert clf.expected_nnz == pytest.approx(11.9e6, rel=0.01)
    assert (clf.task, clf.positive_fraction) == ("classification", 0.1)
    for pr in PRESETS.values():
        if pr.name != "shortclf":
            assert (pr.task, pr.positive_fraction) == ("regression", 0.5)


@pytest.mark.parametrize("preset", ["small", TFIDF_SHRUNK, "tall", "short", "shortclf"])
def test_model_calibration(preset):
    """The calibrated number of draws gives row_nnz expected nonzeros per row; the rank law
    is a decreasing distribution."""
    pr = PRESETS[preset] if isinstance(preset, str) else preset
    q = rank_pmf(pr)
    assert q.shape == (pr.n_features,)
    assert q.sum() == pytest.approx(1.0, abs=1e-12)
    assert np.all(np.diff(q) <= 0)
    d = column_probability(pr)
    assert d.sum() == pytest.approx(pr.row_nnz, rel=1e-3)
    # duplicates are merged, so more draws than distinct columns
    assert expected_draws_per_row(pr) > pr.row_nnz
    assert draws_median(pr) > 0


def test_log1p_calibration():
    """The log1p preset needs about 1.4 draws per distinct column (checked without p-sized
    arrays beyond the calibration's grouped ranks)."""
    pr = PRESETS["log1p"]
    ratio = expected_draws_per_row(pr) / pr.row_nnz
    assert 1.1 < ratio < 2.0


# ---------------------------------------------------------------------- shape & density
def test_shape_density_row_nnz(small_stores):
    pr = PRESETS["small"]
    d = column_probability(pr)
    for store in small_stores.values():
        n, p = store.shape("train")
        assert (n, p) == (pr.n_train, pr.n_features)
        assert store.shape("test") == (pr.n_test, pr.n_features)
        row_nnz = store.read("stats/row_nnz")
        assert row_nnz.sum() == store.nnz("train")
        assert row_nnz.min() >= 1
        # mean within 4 standard errors of the model's expectation
        se = row_nnz.std() / math.sqrt(n)
        assert abs(row_nnz.mean() - d.sum()) < 4 * se
        assert store.nnz("train") / (n * p) == pytest.approx(pr.density, rel=8 * se / d.sum())
        # lengths vary: lognormal draws (sigma 0.5) thinned by merged duplicates
        cv = row_nnz.std() / row_nnz.mean()
        assert 0.3 < cv < 0.6


def test_test_split_same_distribution(small_stores):
    pr = PRESETS["small"]
    d = column_probability(pr)
    for store in small_stores.values():
        row_nnz = store.read("stats/row_nnz", split="test")
        se = row_nnz.std() / math.sqrt(row_nnz.shape[0])
        assert abs(row_nnz.mean() - d.sum()) < 4 * se
        assert store.read("y", split="test").shape == (pr.n_test,)


# ------------------------------------------------------------------------------- skew
@pytest.mark.parametrize("which", ["small", "tfidf"])
def test_column_frequency_skew(which, small_stores, tfidf_stores):
    """Zipf-like popularity: the top 1% of columns hold about 35-40% of the nonzeros and most
    columns appear in fewer than 5 rows (small) / in few rows (tfidf-shaped, 400 rows)."""
    stores, pr = (
        (small_stores, PRESETS["small"]) if which == "small" else (tfidf_stores, TFIDF_SHRUNK)
    )
    d = column_probability(pr)
    p = pr.n_features
    top = p // 100
    expected_top = np.sort(d)[::-1][:top].sum() / d.sum()
    for store in stores.values():
        n = store.shape("train")[0]
        col_nnz = store.read("stats/col_nnz")
        assert col_nnz.sum() == store.nnz("train")
        share = np.sort(col_nnz)[::-1][:top].sum() / col_nnz.sum()
        # a smooth average over thousands of columns: 0.015 absolute is many standard errors
        assert share == pytest.approx(expected_top, abs=0.015)
        assert share > 0.3
        for z in (1, 5, 20):
            expected = binom.cdf(z - 1, n, d).mean()  # columns are Binomial(n, d_r)
            assert (col_nnz < z).mean() == pytest.approx(expected, abs=0.015)
        assert (col_nnz < 5).mean() > 0.6
        assert col_nnz.max() > 0.5 * n  # a few features are in most rows
        # popular columns are spread over the column ids (random permutation)
        popular = np.argsort(col_nnz)[::-1][:top]
        assert kstest(popular / p, "uniform").pvalue > 1e-4


# ----------------------------------------------------------------------------- values
def test_values_are_log1p_counts(small_stores):
    pr = PRESETS["small"]
    for store in small_stores.values():
        X = _X(store)
        v = X.data
        assert np.all(v > 0)
        c = np.expm1(v)
        counts = np.rint(c)
        assert np.all(counts >= 1)
        np.testing.assert_allclose(c, counts, rtol=1e-12)
        # discrete Pareto: P(c >= k) = k^-tail
        for k in (2, 4, 10):
            expected = k**-pr.count_tail
            se = math.sqrt(expected * (1 - expected) / v.shape[0])
            assert abs((counts >= k).mean() - expected) < 4 * se
        # sorted, unique column indices per row (checked by the store) and stats agree
        np.testing.assert_array_equal(np.diff(X.indptr), store.read("stats/row_nnz"))


def test_true_coefficients(small_stores):
    for store in small_stores.values():
        w, b = true_coef(store)
        coef = store.attrs["coef"]
        idx = np.asarray(coef["indices"])
        assert idx.shape == (200,)
        assert np.all(np.diff(idx) > 0)
        assert np.count_nonzero(w) == 200
        assert b == 0.0
        np.testing.assert_array_equal(w[idx], coef["values"])
        mags = np.abs(coef["values"])
        assert mags.min() >= 0.5 and mags.max() <= 1.5
        # spread over popular and rare features
        ranks = np.asarray(coef["ranks"])
        p = store.shape()[1]
        assert (ranks < p // 100).sum() >= 20
        assert (ranks > p // 10).sum() >= 20
        # the attrs are plain JSON
        json.dumps(store.attrs)


# -------------------------------------------------------------------------------- SNR
def test_regression_snr(small_stores):
    """Empirical var(Xw*) / var(noise) is the requested snr within 4 standard errors: those
    of the train variance of Xw* and of the pilot's (both sqrt((kurtosis - 1) / rows)) and of
    the Gaussian noise variance (sqrt(2 / n))."""
    for store in small_stores.values():
        attrs = store.attrs
        w, _ = true_coef(store)
        xw = _X(store) @ w
        resid = store.read("y") - xw
        n = xw.shape[0]
        snr = xw.var() / resid.var()
        kurt = np.mean((xw - xw.mean()) ** 4) / xw.var() ** 2
        rel_se = math.sqrt((kurt - 1) * (1 / n + 1 / attrs["pilot"]["rows"]) + 2 / n)
        assert snr == pytest.approx(attrs["snr"], rel=4 * rel_se)
        assert resid.std() == pytest.approx(attrs["noise_sigma"], rel=4 / math.sqrt(2 * n))
        assert attrs["noise_sigma"] ** 2 == pytest.approx(attrs["pilot"]["var_xw"] / 3.0)


def test_snr_parameter(tmp_path):
    store = make_e2006_like(tmp_path / "s", "small", snr=10.0, test_fraction=0.0)
    assert store.attrs["noise_sigma"] == pytest.approx(
        math.sqrt(store.attrs["pilot"]["var_xw"] / 10)
    )
    assert store.splits == ["train"]


# ---------------------------------------------------------------------- determinism
def _checksums(store):
    out = {}
    for split, e in store.manifest["splits"].items():
        out[split] = {k: a["crc32c"] for k, a in e["arrays"].items()}
        out[split]["blocks"] = [
            [{k: a["crc32c"] for k, a in b["arrays"].items()} for b in row]
            for row in e["blocks"]["csc"]
        ]
    return out


def test_same_seed_identical_different_seed_differs(small_stores, tmp_path):
    again = make_e2006_like(tmp_path / "again", "small", seed=0)
    assert _checksums(again) == _checksums(small_stores[0])
    assert again.attrs == small_stores[0].attrs
    a, b = _X(again), _X(small_stores[0])
    assert (a != b).nnz == 0
    np.testing.assert_array_equal(again.read("y"), small_stores[0].read("y"))
    assert _checksums(small_stores[1])["train"]["y"] != _checksums(small_stores[0])["train"]["y"]
    assert small_stores[1].attrs["coef"] != small_stores[0].attrs["coef"]
    assert (_X(small_stores[1]) != b).nnz > 0


def test_row_multiplier_prefix(small_stores, tmp_path):
    one = small_stores[0]
    two = make_e2006_like(tmp_path / "x2", "small", seed=0, row_multiplier=2)
    pr = PRESETS["small"]
    assert two.shape("train") == (2 * pr.n_train, pr.n_features)
    assert two.shape("test") == (2 * pr.n_test, pr.n_features)
    assert two.attrs["coef"] == one.attrs["coef"]
    assert two.attrs["noise_sigma"] == one.attrs["noise_sigma"]
    for split in ("train", "test"):
        n = one.shape(split)[0]
        x1, x2 = _X(one, split), _X(two, split)[:n]
        np.testing.assert_array_equal(x1.indptr, x2.indptr)
        np.testing.assert_array_equal(x1.indices, x2.indices)
        np.testing.assert_array_equal(x1.data, x2.data)
        np.testing.assert_array_equal(one.read("y", split), two.read("y", split)[:n])
        # the extra rows are new rows of the same distribution
        extra = _X(two, split)[n:]
        assert (extra[: min(n, 50)] != x1[: min(n, 50)]).nnz > 0


# --------------------------------------------------------------------- classification
@pytest.mark.parametrize("seed", SEEDS)
def test_classification(tmp_path, seed):
    """Labels in {-1, +1}; P(y = 1 | x) = sigmoid(x . w* + b) with var(x . w*) =
    snr * pi^2 / 3: the agreement of y with sign(x . w* + b) matches the Bayes accuracy
    mean(max(s, 1 - s)) within 4 standard errors and is below 1 (not separable by w*)."""
    store = make_e2006_like(tmp_path / "c", "small", seed=seed, task="classification")
    y = store.read("y")
    assert set(np.unique(y).tolist()) == {-1.0, 1.0}
    assert 0.35 < (y == 1).mean() < 0.65
    w, b = true_coef(store)
    t = _X(store) @ w + b
    s = 1.0 / (1.0 + np.exp(-t))
    bayes = np.maximum(s, 1 - s)
    acc = ((t > 0) == (y > 0)).mean()
    se = math.sqrt(np.sum(bayes * (1 - bayes))) / t.shape[0]
    assert abs(acc - bayes.mean()) < 4 * se
    assert 0.7 < acc < 0.95
    rel_se = math.sqrt(2.5 * (1 / t.shape[0] + 1 / store.attrs["pilot"]["rows"]))
    assert t.var() == pytest.approx(3.0 * math.pi**2 / 3, rel=4 * rel_se)
    y_test = store.read("y", split="test")
    assert set(np.unique(y_test).tolist()) == {-1.0, 1.0}


@pytest.mark.parametrize("seed", SEEDS)
def test_imbalanced_classification(tmp_path, seed):
    """The ``shortclf`` preset (shrunk to 16,384 rows) writes labels by default, with the
    preset's expected fraction of +1: the pilot's mean of sigmoid(x . w* + b), within 4
    standard errors of the pilot's and the sample's means; its intercept is set for that
    fraction, not at the median of the logits."""
    pr = dataclasses.replace(PRESETS["shortclf"], n_train=16_384, n_test=0)
    store = make_e2006_like(tmp_path / "c", pr, seed=seed)
    assert store.attrs["task"] == "classification"
    y = store.read("y")
    assert set(np.unique(y).tolist()) == {-1.0, 1.0}
    w, b = true_coef(store)
    s = 1.0 / (1.0 + np.exp(-(_X(store) @ w + b)))
    se = math.sqrt(s.var() / s.shape[0] + s.var() / store.attrs["pilot"]["rows"])
    assert abs(s.mean() - pr.positive_fraction) < 4 * se
    se_y = math.sqrt(pr.positive_fraction * (1 - pr.positive_fraction) / y.shape[0])
    assert abs((y == 1).mean() - pr.positive_fraction) < 4 * (se + se_y)
    pilot = store.attrs["pilot"]
    scale = math.sqrt(store.attrs["snr"] * math.pi**2 / 3 / pilot["var_xw"])
    assert b < -scale * pilot["median_xw"] - 1.0  # below the balancing intercept


@pytest.mark.parametrize("seed", SEEDS)
def test_multiclass(tmp_path, seed):
    """Labels 0 .. K-1 of a planted multinomial model: class k with probability
    softmax(x W*^T + b)_k. The agreement of y with argmax(x W*^T + b) matches the Bayes
    accuracy mean(max_k softmax) within 4 standard errors and is below 1; each class's
    frequency is its mean probability's (4 standard errors); the classes' mean logit
    variance is snr * pi^2 / 6; each informative feature speaks for one class."""
    K = 4
    store = make_e2006_like(tmp_path / "m", "small", seed=seed, task="multiclass", n_classes=K)
    assert (store.attrs["task"], store.attrs["n_classes"]) == ("multiclass", K)
    y = store.read("y")
    assert set(np.unique(y).tolist()) == {0.0, 1.0, 2.0, 3.0}
    W, b = true_coef(store)
    assert W.shape == (K, PRESETS["small"].n_features) and b.shape == (K,)
    assert np.count_nonzero(W) == PRESETS["small"].n_informative
    assert (np.count_nonzero(W, axis=0) <= 1).all()  # one class per feature
    T = _X(store) @ W.T + b
    S = np.exp(T - T.max(axis=1, keepdims=True))
    S /= S.sum(axis=1, keepdims=True)
    bayes = S.max(axis=1)
    acc = (np.argmax(T, axis=1) == y).mean()
    se = math.sqrt(np.sum(bayes * (1 - bayes))) / T.shape[0]
    assert abs(acc - bayes.mean()) < 4 * se
    assert 1.0 / K < acc < 0.95
    freq_se = np.sqrt(np.sum(S * (1 - S), axis=0)) / T.shape[0]
    freq = np.array([(y == k).mean() for k in range(K)])
    assert (np.abs(freq - S.mean(axis=0)) < 4 * freq_se + 4 * S.std(axis=0) / math.sqrt(
        T.shape[0])).all()  # fmt: skip
    rel_se = math.sqrt(2.5 * (1 / T.shape[0] + 1 / store.attrs["pilot"]["rows"]))
    assert np.var(T, axis=0).mean() == pytest.approx(3.0 * math.pi**2 / 6, rel=4 * rel_se)
    assert set(np.unique(store.read("y", split="test")).tolist()) == {0.0, 1.0, 2.0, 3.0}


def test_multiclass_leaves_the_other_tasks_and_its_rows_alone(tmp_path):
    """The rows (X) of a multiclass store are those of the regression store of its seed,
    and the default is 3 classes."""
    a = make_e2006_like(tmp_path / "r", "small", seed=5, test_fraction=0.0)
    b = make_e2006_like(tmp_path / "m", "small", seed=5, test_fraction=0.0, task="multiclass")
    assert (_X(a) != _X(b)).nnz == 0
    assert b.attrs["n_classes"] == 3 and set(np.unique(b.read("y")).tolist()) == {0.0, 1.0, 2.0}


# ------------------------------------------------------------------- options & errors
def test_options(tmp_path):
    store = make_e2006_like(
        tmp_path / "o",
        "small",
        dtype=np.float32,
        formats=("csc", "csr"),
        n_feature_blocks=3,
        test_fraction=0.5,
    )
    assert store.dtype() == np.float32
    assert len(store.col_bounds()) == 4
    assert store.shape("test")[0] == PRESETS["small"].n_train
    csr = store.read_block("train", 0, 1, fmt="csr")
    csc = store.read_block("train", 0, 1, fmt="csc")
    assert (csr != csc).nnz == 0
    # y is computed from the stored float32 values
    w, _ = true_coef(store)
    resid = store.read("y") - _X(store).astype(np.float64) @ w
    assert resid.std() == pytest.approx(store.attrs["noise_sigma"], rel=0.15)
    with pytest.raises(FileExistsError):
        make_e2006_like(tmp_path / "o", "small")
    again = make_e2006_like(tmp_path / "o", "small", overwrite=True, block_nnz=100_000)
    assert again.dtype() == np.float64
    assert again.block_nnz().max() <= 100_000 + again.read("stats/col_nnz").max()
    assert open_store(tmp_path / "o").attrs["seed"] == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"preset": "huge"}, "preset must be one of"),
        ({"preset": 3}, "preset must be one of"),
        ({"task": "ranking"}, "task must be one of"),
        ({"task": "multiclass", "n_classes": 1}, "n_classes must be an integer >= 2"),
        ({"task": "multiclass", "n_classes": 2.5}, "n_classes must be an integer >= 2"),
        ({"task": "classification", "n_classes": 3}, "n_classes is for task='multiclass'"),
        ({"row_multiplier": 0}, "row_multiplier must be an integer >= 1"),
        ({"row_multiplier": 1.5}, "row_multiplier must be an integer >= 1"),
        ({"row_multiplier": True}, "row_multiplier must be an integer >= 1"),
        ({"seed": -1}, "seed must be an integer >= 0"),
        ({"snr": 0.0}, "snr must be a positive"),
        ({"snr": float("nan")}, "snr must be a positive"),
        ({"test_fraction": 1.0}, "test_fraction must be in"),
        ({"dtype": np.int32}, "dtype must be float32 or float64"),
        (
            {"preset": dataclasses.replace(PRESETS["small"], positive_fraction=1.0)},
            "positive_fraction must be in",
        ),
        ({"preset": dataclasses.replace(PRESETS["small"], task="ranking")}, "task must be one"),
    ],
)
def test_invalid_arguments(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_e2006_like(tmp_path / "bad", **kwargs)
    assert not (tmp_path / "bad").exists()


def test_true_coef_rejects_other_stores():
    with pytest.raises(ValueError, match="not a store written by"):
        true_coef({"generator": "something else"})
