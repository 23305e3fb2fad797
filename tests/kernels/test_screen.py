"""The scan's scoring kernel against NumPy."""

import numpy as np
import pytest

from dl1.kernels.screen import violation_scores


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
    absmax, excess = violation_scores(got, thr, cols, sqn, support)
    np.testing.assert_array_equal(got, want)
    assert absmax == (a.max() if m else 0.0)
    np.testing.assert_allclose(excess, np.square(ex[ex > 0]).sum(), rtol=1e-13)
