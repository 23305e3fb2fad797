"""Adding a solver is one module and a registry entry: dl1.fit, dl1.path and the estimators
reach it by name, with neither the path loop nor the other solvers changed."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.linear_model import Lasso

import dl1
from dl1.solvers.cd import CoordinateDescentSolver
from dl1.solvers.options import SolverOptions
from dl1.solvers.registry import SOLVERS


class ShuffledCD(CoordinateDescentSolver):
    """Coordinate descent in a random order, under a name of its own (a new solver as a
    user or a later issue would add it: its own class, registered by name)."""

    name = "shuffled-cd"

    @classmethod
    def from_options(cls, o: SolverOptions) -> ShuffledCD:
        """The entry points' keywords it has (its constructor is narrower than its base's)."""
        return cls(max_rounds=o.rounds, seed=o.seed, verbose=o.verbose, callback=o.callback)

    def __init__(self, *, max_rounds: int = 1000, seed: int = 0, verbose: bool = False,
                 callback=None) -> None:  # fmt: skip
        super().__init__(
            max_rounds=max_rounds, random_order=True, seed=seed, verbose=verbose,
            callback=callback,
        )  # fmt: skip


def _data():
    rng = np.random.default_rng(5)
    X = sp.random(120, 60, density=0.2, format="csc", random_state=rng)
    y = X @ np.r_[rng.standard_normal(5), np.zeros(55)] + 0.05 * rng.standard_normal(120)
    return X, y


def test_a_registered_solver_serves_fit_path_and_estimators(monkeypatch):
    """Pass criterion: the registered solver's fit matches scikit-learn's Lasso to 1e-6, its
    path is certified at every alpha and matches the working-set path's coefficients, and
    the estimator accepts its name; an unregistered name is refused before any work."""
    monkeypatch.setitem(SOLVERS, ShuffledCD.name, ShuffledCD)
    X, y = _data()
    alpha = dl1.alpha_max(X, y) / 10
    kw = dict(tol=1e-10, max_rounds=20_000)
    res = dl1.fit(X, y, alpha=alpha, solver="shuffled-cd", **kw)
    ref = Lasso(alpha=alpha, tol=1e-12, max_iter=100_000).fit(X.toarray(), y)
    assert res.converged_
    np.testing.assert_allclose(res.coef_, ref.coef_, atol=1e-6)
    path = dl1.path(X, y, n_alphas=6, eps=0.1, solver="shuffled-cd", **kw)
    ws = dl1.path(X, y, n_alphas=6, eps=0.1, tol=1e-10)
    assert path.converged_.all()
    np.testing.assert_allclose(path.coefs_.toarray(), ws.coefs_.toarray(), atol=1e-5)
    est = dl1.estimators.Lasso(alpha=alpha, solver="shuffled-cd", tol=1e-10,
                               max_iter=20_000).fit(X, y)
    np.testing.assert_allclose(est.coef_, ref.coef_, atol=1e-6)
    with pytest.raises(ValueError, match="'solver' parameter of dl1.fit"):
        dl1.fit(X, y, alpha=alpha, solver="no-such-solver")
