"""The E2006-like generative model: its parameters (the presets) and its probabilities.

:class:`E2006Preset` holds the parameters of the model described in
:mod:`dl1.datasets.e2006`, :data:`PRESETS` the named ones; the functions here compute, in
closed form or by quadrature, what the model implies (the popularity law of the columns,
the number of draws per row calibrated to the preset's nonzeros per row, the probability
of each column in a row), for the generator (:mod:`dl1.datasets.e2006_sampling`) and for
the tests checking the data it writes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

# Gauss-Hermite nodes used to integrate over the lognormal number of draws per row.
_N_QUAD = 48


@dataclass(frozen=True)
class E2006Preset:
    """Parameters of the generative model (see :mod:`dl1.datasets.e2006`).

    Attributes
    ----------
    name : str
    n_train, n_test : int
        Rows of the train and test splits for ``row_multiplier=1``.
    n_features : int
        Number of columns ``p``.
    row_nnz : float
        Target expected number of nonzeros (distinct columns) per row.
    row_sigma : float
        ``sigma`` of the lognormal number of draws per row.
    zipf_a, zipf_shift : float
        Exponent ``a`` and shift ``s`` of the column-popularity law.
    count_tail : float
        Tail index of the counts: ``P(c >= k) = k^-count_tail``.
    n_informative : int
        Nonzeros of the true coefficient vector.
    batch_rows : int
        Rows generated per batch (fixes the random streams: changing it changes the data).
    pilot_rows : int
        Rows of the pilot sample estimating ``var(X w*)`` (rounded up to whole batches).
    task : {"regression", "classification"}
        The labels :func:`~dl1.datasets.make_e2006_like` writes unless told otherwise.
    positive_fraction : float
        Classification: expected fraction of ``+1`` labels, in (0, 1).
    """

    name: str
    n_train: int
    n_test: int
    n_features: int
    row_nnz: float
    row_sigma: float = 0.5
    zipf_a: float = 1.0
    zipf_shift: float = 10.0
    count_tail: float = 2.0
    n_informative: int = 200
    batch_rows: int = 512
    pilot_rows: int = 2048
    task: str = "regression"
    positive_fraction: float = 0.5

    @property
    def density(self) -> float:
        """Expected fraction of nonzero entries, ``row_nnz / n_features``."""
        return self.row_nnz / self.n_features

    @property
    def expected_nnz(self) -> float:
        """Expected nonzeros of the train split for ``row_multiplier=1``."""
        return self.row_nnz * self.n_train


#: Presets. ``n_train=16087`` and ``n_test=3308`` are the row counts of E2006.
PRESETS: dict[str, E2006Preset] = {
    "small": E2006Preset(
        "small",
        n_train=2000,
        n_test=411,
        n_features=50_000,
        row_nnz=200.0,
        batch_rows=256,
        pilot_rows=4096,
    ),
    "tfidf": E2006Preset(
        "tfidf",
        n_train=16_087,
        n_test=3_308,
        n_features=150_360,
        row_nnz=1_200.0,
        batch_rows=2048,
        pilot_rows=4096,
    ),
    "log1p": E2006Preset(
        "log1p",
        n_train=16_087,
        n_test=3_308,
        n_features=4_272_227,
        row_nnz=5_800.0,
        batch_rows=512,
        pilot_rows=1024,
    ),
    # Tall data with short rows, where the sample-wise solvers belong: the shape of Lipton &
    # Elkan's Medline abstracts (10^6 documents, 260,941 words, 88.5 nonzeros per row), twice
    # as tall.
    "tall": E2006Preset(
        "tall",
        n_train=2_000_000,
        n_test=200_000,
        n_features=260_941,
        row_nnz=88.5,
        batch_rows=8192,
        pilot_rows=8192,
    ),
    # Short documents: about 200,000 x 230,000 with ~16 words per row, as a text-regression
    # corpus of short texts; lengths vary more than in the other presets.
    "short": E2006Preset(
        "short",
        n_train=200_000,
        n_test=20_000,
        n_features=230_000,
        row_nnz=16.0,
        row_sigma=0.8,
        batch_rows=8192,
        pilot_rows=8192,
    ),
    # Short documents with imbalanced labels: L1 logistic regression on about 850,000 x
    # 400,000 with ~14 words per row (11.9M nonzeros) and 10% positive labels, the shape of a
    # short-text classification corpus.
    "shortclf": E2006Preset(
        "shortclf",
        n_train=842_000,
        n_test=42_100,
        n_features=400_000,
        row_nnz=14.15,
        row_sigma=0.8,
        batch_rows=8192,
        pilot_rows=8192,
        task="classification",
        positive_fraction=0.1,
    ),
}


# ---------------------------------------------------------------------------- the model
def _zipf_consts(pr: E2006Preset) -> tuple[int, float, float, float]:
    """(mode, c1, c2, e) of the closed-form inverse CDF used by :func:`_sample_rows`."""
    a, s, p = pr.zipf_a, pr.zipf_shift, pr.n_features
    if a == 1.0:
        return 0, s, math.log1p(p / s), 0.0
    s1 = s ** (1.0 - a)
    return 1, s1, (p + s) ** (1.0 - a) - s1, 1.0 / (1.0 - a)


def _zipf_cdf(x: np.ndarray, pr: E2006Preset) -> np.ndarray:
    a, s, p = pr.zipf_a, pr.zipf_shift, pr.n_features
    if a == 1.0:
        return np.log1p(x / s) / math.log1p(p / s)
    s1 = s ** (1.0 - a)
    return ((x + s) ** (1.0 - a) - s1) / ((p + s) ** (1.0 - a) - s1)


def rank_pmf(preset: str | E2006Preset) -> np.ndarray:
    """Probability of each popularity rank in one draw (length ``n_features``, decreasing)."""
    pr = _preset(preset)
    return np.diff(_zipf_cdf(np.arange(pr.n_features + 1, dtype=np.float64), pr))


def _quadrature(pr: E2006Preset, median: float) -> tuple[np.ndarray, np.ndarray]:
    """Draw counts and weights integrating over the lognormal number of draws per row."""
    z, w = np.polynomial.hermite_e.hermegauss(_N_QUAD)
    draws = np.maximum(1.0, np.rint(median * np.exp(pr.row_sigma * z)))
    return draws, w / w.sum()


def _row_probability(q: np.ndarray, draws: np.ndarray, weights: np.ndarray) -> np.ndarray:
    # P(rank in row) = E_L[1 - (1 - q)^L], evaluated as -expm1(L log1p(-q)).
    lq = np.log1p(-np.minimum(q, 1.0 - 1e-16))
    out = np.zeros_like(q)
    for L, w in zip(draws, weights, strict=True):
        out -= w * np.expm1(L * lq)
    return out


def _rank_groups(pr: E2006Preset, exact: int = 4096, n_bins: int = 4096):
    """Mean per-draw probability and size of groups of ranks: single ranks up to ``exact``,
    then geometric bins (inside a bin the pmf varies by far less than 1%)."""
    p = pr.n_features
    k = min(p, exact)
    edges = np.unique(np.concatenate([np.arange(k + 1.0), np.rint(np.geomspace(k, p, n_bins + 1))]))
    size = np.diff(edges)
    return np.diff(_zipf_cdf(edges, pr)) / size, size


@lru_cache(maxsize=32)
def draws_median(preset: str | E2006Preset) -> float:
    """Median ``m`` of the number of draws per row giving ``row_nnz`` expected nonzeros.

    Solved by bisection on ``sum_r d_r(m) = row_nnz`` (ranks grouped for large ``p``).
    """
    pr = _preset(preset)
    if not 0 < pr.row_nnz < pr.n_features:
        raise ValueError(f"row_nnz must be in (0, n_features), got {pr.row_nnz}")
    q, size = _rank_groups(pr)

    def expected(m: float) -> float:
        return float(size @ _row_probability(q, *_quadrature(pr, m)))

    lo = 0.25 * pr.row_nnz * math.exp(-0.5 * pr.row_sigma**2)
    hi = 2.0 * lo
    while expected(hi) < pr.row_nnz:
        lo, hi = hi, 2.0 * hi
        if hi > 1e12:
            raise ValueError(f"cannot reach row_nnz={pr.row_nnz} with this popularity law")
    for _ in range(80):
        mid = math.sqrt(lo * hi)
        if expected(mid) < pr.row_nnz:
            lo = mid
        else:
            hi = mid
    return hi


def column_probability(preset: str | E2006Preset) -> np.ndarray:
    """Probability ``d_r`` that a row contains the column of popularity rank ``r``.

    The expected nonzeros per row is ``d.sum()`` and the number of rows of a split holding
    that column is Binomial(n_rows, d_r).
    """
    pr = _preset(preset)
    return _row_probability(rank_pmf(pr), *_quadrature(pr, draws_median(pr)))


def expected_draws_per_row(preset: str | E2006Preset) -> float:
    """Mean number of rank draws per row (before merging duplicates)."""
    pr = _preset(preset)
    draws, w = _quadrature(pr, draws_median(pr))
    return float(draws @ w)


def _preset(preset: str | E2006Preset) -> E2006Preset:
    if isinstance(preset, E2006Preset):
        return preset
    if not isinstance(preset, str) or preset not in PRESETS:
        raise ValueError(
            f"preset must be one of {sorted(PRESETS)} (or an E2006Preset), got {preset!r}"
        )
    return PRESETS[preset]
