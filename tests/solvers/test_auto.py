"""solver="auto": the documented rule of dl1.solvers.auto."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import dl1
from dl1.objective.datafits import Hinge, Logistic, Quadratic, SmoothHinge
from dl1.solvers.auto import choose_solver


@pytest.mark.parametrize(
    ("datafit", "expected"),
    [(Quadratic(), "ws"), (Logistic(), "ws"), (SmoothHinge(), "ws"), (Hinge(), "smoothing")],
)
def test_rule(datafit, expected):
    """Pass: smooth losses go to the working-set solver, the hinge to the smoothing solver
    (the rule the module documents, from the measurements in benchmarks/RESULTS.md)."""
    assert choose_solver(datafit) == expected


@pytest.mark.parametrize(("loss", "expected"), [("squared", "ws"), ("hinge", "smoothing")])
def test_fit_path_and_estimator_take_auto(loss, expected):
    """Pass: dl1.fit(solver="auto") gives the chosen solver's result exactly (same
    coefficients as naming it), dl1.path and the estimators accept "auto"."""
    rng = np.random.default_rng(0)
    X = sp.random(300, 20, density=0.3, format="csr", random_state=0)
    z = X @ rng.standard_normal(20)
    y = z if loss == "squared" else np.where(z > np.median(z), 1.0, -1.0)
    kw = dict(alpha=dl1.alpha_max(X, y, loss=loss, l1_ratio=0.5) / 5, l1_ratio=0.5, loss=loss,
              tol=1e-6, fit_intercept=loss == "squared")
    auto = dl1.fit(X, y, solver="auto", **kw)
    named = dl1.fit(X, y, solver=expected, **kw)
    np.testing.assert_array_equal(auto.coef_, named.coef_)
    pth = dl1.path(X, y, n_alphas=3, eps=0.3, l1_ratio=0.5, loss=loss, tol=1e-4,
                   solver="auto", fit_intercept=loss == "squared")
    assert pth.converged_.all()
    from dl1.estimators import ElasticNet

    if loss == "squared":
        est = ElasticNet(kw["alpha"], l1_ratio=0.5, solver="auto", tol=1e-6).fit(X, y)
        np.testing.assert_array_equal(est.coef_, named.coef_)


def test_a_configured_solver_object_is_used_as_it_is():
    """Pass: a solver object passed as solver= runs with its own settings (2 epochs here,
    whatever fit's defaults), and an object that is not a solver is refused before any
    work, naming the parameter."""
    from dl1.solvers.rda import RDASolver
    from dl1.solvers.result import ConvergenceWarning

    X = sp.random(200, 15, density=0.3, format="csr", random_state=1)
    y = X @ np.arange(15.0)
    with pytest.warns(ConvergenceWarning):
        res = dl1.fit(X, y, alpha=0.01, solver=RDASolver(max_epochs=2), tol=1e-12)
    assert res.n_rounds_ == 2
    with pytest.raises(ValueError, match="'solver' parameter"):
        dl1.fit(X, y, alpha=0.01, solver=object())
