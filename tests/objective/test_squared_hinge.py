"""The squared-hinge datafit against its definition, and fits with it against references."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import minimize_scalar

import dl1
from dl1.errors import ValidationError
from dl1.objective.datafits import SquaredHinge

F = SquaredHinge()


def labels(n=40, seed=0):
    rng = np.random.default_rng(seed)
    y = np.where(rng.random(n) < 0.6, 1.0, -1.0)
    return y, 1.5 * rng.standard_normal(n), rng.uniform(0.5, 2, n)


def phi(m):
    return np.maximum(0.0, 1.0 - m) ** 2


@pytest.mark.parametrize("weighted", [False, True])
def test_value_and_gradient_match_the_definition_and_finite_differences(weighted):
    """Pass: F equals (1/n) sum s phi(y z); each gradient entry equals the central finite
    difference of F along that coordinate to 1e-7 (F is C^1, piecewise quadratic)."""
    y, z, s = labels()
    s = s if weighted else None
    n = y.shape[0]
    ref = (phi(y * z) if s is None else s * phi(y * z)).sum() / n
    assert F.value(y, z, s) == pytest.approx(ref, rel=1e-14)
    g = F.gradient(y, z, s)
    h = 1e-6
    fd = [(F.value(y, z + h * e, s) - F.value(y, z - h * e, s)) / (2 * h) for e in np.eye(n)]
    np.testing.assert_allclose(g, fd, atol=1e-7)


def test_conjugate_is_the_supremum_of_its_definition_and_fenchel_young_holds():
    """Pass: for theta = s y c (c >= 0, some c above 2, i.e. beyond the hinge's domain)
    F*(-theta/n) equals sup_z <-theta/n, z> - F(z) by scalar maximisation per coordinate
    to 1e-8; a negative c gives +inf; Fenchel-Young is an equality at theta = dual_point(z)
    and a strict inequality elsewhere."""
    y, z, s = labels()
    n = y.shape[0]
    c = np.random.default_rng(1).uniform(0, 3, n)
    theta = s * y * c
    expected = 0.0
    for i in range(n):
        def neg(t, i=i):
            return theta[i] * t + s[i] * phi(y[i] * t)
        expected += -minimize_scalar(neg, bounds=(-50, 50), method="bounded",
                                     options={"xatol": 1e-12}).fun
    assert F.conjugate(y, theta, s) == pytest.approx(expected / n, abs=1e-8)
    bad = theta.copy()
    bad[0] = -0.5 * s[0] * y[0]
    assert F.conjugate(y, bad, s) == np.inf
    at = F.dual_point(y, z, s)
    lhs = F.value(y, z, s) + F.conjugate(y, at, s)
    assert lhs == pytest.approx(-(at @ z) / n, abs=1e-12)
    assert F.value(y, z, s) + F.conjugate(y, theta, s) > -(theta @ z) / n + 1e-6


@pytest.mark.parametrize("weighted", [False, True])
def test_intercept_update_minimises_and_dual_point_is_feasible(weighted):
    """Pass: z + intercept_update minimises F along the intercept (scalar minimisation's
    value matched to 1e-12, its derivative zero to 1e-12); the intercept dual point sums to
    0 and lies in the conjugate's domain; with one label the shift puts every margin at 1."""
    y, z, s = labels(seed=3)
    s = s if weighted else None
    db = F.intercept_update(y, z, s)
    ref = minimize_scalar(lambda t: F.value(y, z + t, s), bounds=(-20, 20), method="bounded",
                          options={"xatol": 1e-12})
    assert F.value(y, z + db, s) <= ref.fun + 1e-12
    assert abs(F.gradient(y, z + db, s).sum()) < 1e-12
    theta = F.dual_point(y, z, s, intercept=True)
    assert abs(theta.sum()) < 1e-12 and np.isfinite(F.conjugate(y, theta, s))
    ones = np.ones_like(y)
    b = F.intercept_update(ones, z, s)
    assert F.value(ones, z + b, s) == 0.0 and (z + b).min() == pytest.approx(1.0)
    assert F.initial_intercept(-ones) == -1.0


def _data(n=120, p=15, seed=0):
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=0.4, format="csr", random_state=rng)
    y = np.where(X @ rng.standard_normal(p) + 0.3 * rng.standard_normal(n) > 0.2, 1.0, -1.0)
    return X, y, rng.uniform(0.5, 2.0, n)


@pytest.mark.parametrize("weighted", [False, True])
def test_fit_equals_liblinear_l1_squared_hinge(weighted):
    """Pass: dl1.fit(loss="squared_hinge", alpha=1/(C sum s)) without intercept, certified
    at relative gap 1e-12, equals scikit-learn's LinearSVC(penalty="l1", dual=False) (which
    minimises C sum s_i max(0, 1 - y_i x_i w)^2 + ||w||_1) to 1e-6."""
    from sklearn.svm import LinearSVC

    X, y, s = _data()
    s = s if weighted else None
    C = 0.5
    total = X.shape[0] if s is None else s.sum()
    res = dl1.fit(X, y, alpha=1 / (C * total), loss="squared_hinge", fit_intercept=False,
                  sample_weight=s, tol=1e-12)
    ref = LinearSVC(penalty="l1", dual=False, C=C, fit_intercept=False, tol=1e-10,
                    max_iter=100_000).fit(X, y, sample_weight=s)
    assert res.converged_ and res.gap_ <= 1e-12
    assert 0 < np.count_nonzero(res.coef_) < X.shape[1]
    np.testing.assert_allclose(res.coef_, ref.coef_.ravel(), atol=1e-6)


def _fista(X, y, alpha, iters=20_000):
    """Dense reference: FISTA on F(Xw + b) + alpha ||w||_1, the intercept unpenalised."""
    A = np.hstack([X, np.ones((X.shape[0], 1))])
    L = F.beta * np.linalg.norm(A, 2) ** 2 / X.shape[0]
    v = x = np.zeros(A.shape[1])
    t = 1.0
    for _ in range(iters):
        u = v - F.gradient(y, A @ v) @ A / L
        x_new = np.concatenate([np.sign(u[:-1]) * np.maximum(np.abs(u[:-1]) - alpha / L, 0),
                                u[-1:]])
        t_new = (1 + np.sqrt(1 + 4 * t * t)) / 2
        v = x_new + (t - 1) / t_new * (x_new - x)
        x, t = x_new, t_new
    return x[:-1], x[-1]


@pytest.mark.parametrize("solver", ["ws", "cd"])
def test_fit_with_intercept_equals_a_dense_reference_and_screening_is_safe(solver):
    """Pass: with an intercept, the working-set (screening on) and coordinate-descent fits
    certified at 1e-10 equal a dense FISTA reference to 1e-5, and their objective is within
    the certified gap of the reference's."""
    X, y, _ = _data(seed=1)
    alpha = dl1.alpha_max(X, y, loss="squared_hinge") / 5
    res = dl1.fit(X, y, alpha=alpha, loss="squared_hinge", tol=1e-10, solver=solver,
                  screen=solver == "ws", max_rounds=50_000)
    w, b = _fista(X.toarray(), y, alpha)
    np.testing.assert_allclose(res.coef_, w, atol=1e-5)
    assert res.intercept_ == pytest.approx(b, abs=1e-5)
    ref_obj = F.value(y, X @ w + b) + alpha * np.abs(w).sum()
    assert res.primal_ <= ref_obj + 1e-12
    assert res.primal_ - res.dual_gap_ <= ref_obj + 1e-12


def test_alpha_max_gives_zero_and_sample_wise_solvers_refuse_the_loss():
    """Pass: at alpha_max the fit is w = 0 and just below it is not; a sample-wise solver
    given the squared hinge raises a ValidationError naming the loss and the solvers that
    take it (before: a KeyError from the kernels' loss table)."""
    X, y, _ = _data(seed=2)
    amax = dl1.alpha_max(X, y, loss="squared_hinge")
    assert not dl1.fit(X, y, alpha=amax, loss="squared_hinge", tol=1e-8).coef_.any()
    assert dl1.fit(X, y, alpha=0.95 * amax, loss="squared_hinge", tol=1e-8).coef_.any()
    for solver in ("sdca", "sgd"):
        with pytest.raises(ValidationError, match="loss='squared_hinge'.*'ws'"):
            dl1.fit(X, y, alpha=amax / 2, loss="squared_hinge", solver=solver)
