"""The scan's scoring kernel against NumPy."""

import numpy as np
import pytest

from dl1.kernels.screen import top_scores, top_scores_heap, violation_scores

EMPTY = np.zeros(0)


@pytest.mark.parametrize("m", [0, 1, 1023, 1024, 5000])
def test_violation_scores_match_numpy(m):
    rng = np.random.default_rng(m)
    ncols = m + 10
    cols = np.sort(rng.choice(ncols, size=m, replace=False)).astype(np.int64)
    c = rng.standard_normal(m)
    sqn = rng.uniform(0.5, 2.0, ncols)
    sqn[rng.random(ncols) < 0.1] = 0.0
    support = np.sort(rng.choice(ncols, size=min(ncols, 7), replace=False)).astype(np.int64)
    thr = 0.8
    a = np.abs(c)
    ex = a - thr
    want = ex.copy()
    want[np.isin(cols, support)] = -np.inf
    want[sqn[cols] == 0] = -np.inf
    got = c.copy()
    absmax, excess, box = violation_scores(got, thr, cols, sqn, support, EMPTY,
                                           np.zeros((2, 0)), 1.0, 0.0)
    assert box == 0.0
    np.testing.assert_array_equal(got, want)
    assert absmax == (a.max() if m else 0.0)
    np.testing.assert_allclose(excess, np.square(ex[ex > 0]).sum(), rtol=1e-13)


@pytest.mark.parametrize("select", [top_scores, top_scores_heap])
@pytest.mark.parametrize("m", [0, 1, 5, 1000, 20000])
@pytest.mark.parametrize("k", [0, 1, 7, 128, 30000])
def test_top_scores_match_a_numpy_sort(select, m, k):
    rng = np.random.default_rng(m + k)
    # rounded, so that ties are common; -inf and NaN never join
    score = np.round(rng.standard_normal(m), 1)
    score[rng.random(m) < 0.2] = -np.inf
    score[rng.random(m) < 0.01] = np.nan
    ok = np.flatnonzero(score > -np.inf)
    want = ok[np.lexsort((ok, -score[ok]))][:k]
    np.testing.assert_array_equal(select(score, k), want)


@pytest.mark.parametrize("select", [top_scores, top_scores_heap])
def test_top_scores_keep_the_best_when_scores_rise(select):
    # every score joins the heap and pushes the worst out: the sift-down's worst case
    score = np.arange(1000.0)
    np.testing.assert_array_equal(select(score, 10), np.arange(999, 989, -1))
