"""Cross-validation says when its choice is an end of its grid with the score still
improving there (dl1.paths.cv.warn_at_edge)."""

from __future__ import annotations

import warnings

import dask
import numpy as np
import pytest

import dl1
from dl1.errors import GridEdgeWarning
from dl1.paths.cv import choose, warn_at_edge

GRID = np.array([1.0, 0.5, 0.25, 0.125])


def _warned(scores: np.ndarray, scoring: str = "mse") -> list[str]:
    best, _ = choose(scores, scoring)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_at_edge(scores, scoring, best, GRID)
    return [str(w.message) for w in caught if w.category is GridEdgeWarning]


def test_an_end_still_improving_beyond_the_folds_noise_is_said():
    """Pass: the smallest alpha clearly best (every fold) warns, naming it and the C end;
    the largest clearly best too; an interior best, a tie at the end and a gain within
    the folds' noise say nothing; accuracy (higher is better) is read the right way."""
    down = np.array([[4.0, 4.1, 3.9], [3.0, 3.1, 2.9], [2.0, 2.2, 1.9], [1.0, 1.1, 0.9]])
    (msg,) = _warned(down)
    assert "smallest alpha of its grid (0.125; for a C grid, the largest C)" in msg
    (msg,) = _warned(down[::-1])
    assert "largest alpha of its grid (1" in msg
    assert _warned(np.array([[3.0] * 3, [1.0] * 3, [2.0] * 3, [4.0] * 3])) == []
    assert _warned(np.array([[3.0] * 3, [2.0] * 3, [1.0] * 3, [1.0] * 3])) == []
    noisy = np.array([[3.0] * 3, [2.0] * 3, [1.0, 1.5, 0.6], [0.9, 0.6, 1.3]])
    assert _warned(noisy) == []
    ((up,), (high,)) = _warned(-down, "accuracy"), _warned(down, "accuracy")
    assert "smallest alpha" in up and "held-out accuracy" in up and "largest alpha" in high


def test_lasso_cv_on_a_short_grid_warns_and_a_long_one_does_not():
    """Pass: LassoCV on nearly noiseless data with a grid that stops at alpha_max / 10
    warns (the error still falls at its end); the default grid (down to 1e-3 alpha_max)
    on noisy data chooses inside it and says nothing."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((120, 10))
    w = np.r_[np.ones(5), np.zeros(5)]
    with dask.config.set(scheduler="sync"):
        with pytest.warns(GridEdgeWarning, match="smallest alpha"):
            dl1.LassoCV(alphas=5, eps=0.1, cv=3).fit(X, X @ w + 0.01 * rng.standard_normal(120))
        y = X @ w + 3.0 * rng.standard_normal(120)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            est = dl1.LassoCV(cv=3).fit(X, y)
    assert not [w for w in caught if w.category is GridEdgeWarning]
    assert 0 < list(est.alphas_).index(est.alpha_) < len(est.alphas_) - 1
