"""An alpha far below any useful value: the working-set solver stops once its rounds no longer
lower the gap, and says why, instead of running its 1,000 rounds of 50,000 epochs each."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp

import dl1

ALPHA = 1e-15


def ill_conditioned(seed: int = 0) -> tuple[sp.csc_matrix, np.ndarray]:
    """300 x 50 sparse least squares whose columns come in nearly equal pairs (condition
    number about 7e3): at ``ALPHA`` the Lasso is least squares, and coordinate descent
    creeps (scikit-learn's Lasso stops at its 1,000 epochs with a warning)."""
    rng = np.random.default_rng(seed)
    a = sp.random(300, 25, density=0.2, format="csc", random_state=rng)
    b = a.copy()
    b.data = b.data * (1 + 1e-3 * rng.standard_normal(b.data.shape))
    X = sp.hstack([a, b]).tocsc()
    y = X @ rng.standard_normal(50) + 0.1 * rng.standard_normal(300)
    return X, y


def least_squares_objective(X: sp.csc_matrix, y: np.ndarray) -> float:
    """``min ||y - X w - b||^2 / (2 n)``, the closed form the Lasso tends to as alpha -> 0."""
    A = np.column_stack([X.toarray(), np.ones(X.shape[0])])
    coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    return float(np.sum((y - A @ coef) ** 2) / (2 * X.shape[0]))


@pytest.mark.parametrize("entry", ["fit", "path"])
@pytest.mark.slow
def test_hopeless_alpha_stops_and_says_why(entry):
    """``alpha = 1e-15`` on an ill-conditioned 300 x 50 sparse problem (in process), as a
    fit and as the one alpha of a path. Before: 1,000 rounds of 3.3 s (each subproblem at
    its 50,000-epoch limit, the gap falling 1% a round), then a warning to raise
    max_rounds.

    Pass: the solve stops within 3 rounds, not converged, with one ConvergenceWarning that
    says why it stopped (two subproblems on the same working set at their epoch limit, the
    gap barely falling) with the gap reached and tol; its objective is that of least
    squares (``numpy.linalg.lstsq`` with an intercept) to 1e-9 relative: stopping lost
    nothing float64 could certify.
    """
    X, y = ill_conditioned()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if entry == "fit":
            res = dl1.fit(X, y, alpha=ALPHA)
            rounds, gap, coef, b = res.n_rounds_, res.gap_, res.coef_, res.intercept_
            assert not res.converged_
        else:
            res = dl1.path(X, y, alphas=[ALPHA])
            rounds, gap = int(res.rounds_[0]), float(res.gaps_[0])
            coef, b = res.coefs_[:, 0].toarray().ravel(), float(res.intercepts_[0])
    conv = [w for w in caught if issubclass(w.category, dl1.ConvergenceWarning)]
    assert len(conv) == 1, [str(w.message) for w in caught]
    message = str(conv[0].message)
    assert "stopped: two subproblems on the same 50 features" in message, message
    assert f"{gap:.3e} > tol 1.000e-04" in message, message
    assert 1 <= rounds <= 3 and gap > 1e-4
    objective = np.sum((y - X @ coef - b) ** 2) / (2 * X.shape[0]) + ALPHA * np.abs(coef).sum()
    best = least_squares_objective(X, y)
    assert abs(objective - best) <= 1e-9 * best, (objective, best)


def test_hopeless_alpha_stops_coordinate_descent():
    """The same problem and alpha with ``solver="cd"`` (one epoch a round). Before: its
    1,000 rounds, the gap frozen from round 100 on, then a warning to raise max_rounds.

    Pass: it stops within 1 + 100 rounds of the gap's last 1% fall (before 300 rounds),
    with one ConvergenceWarning that says the gap stopped falling, with the gap and tol.
    """
    X, y = ill_conditioned()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = dl1.fit(X, y, alpha=ALPHA, solver="cd")
    conv = [w for w in caught if issubclass(w.category, dl1.ConvergenceWarning)]
    assert len(conv) == 1, [str(w.message) for w in caught]
    message = str(conv[0].message)
    assert "stopped: the duality gap has not fallen by 1% in 100 rounds" in message, message
    assert f"{res.gap_:.3e} > tol 1.000e-04" in message, message
    assert not res.converged_ and res.n_rounds_ < 300
