"""Unpenalised features (``penalty_factor`` 0, glmnet's ``penalty.factor = 0``): fits,
``alpha_max`` and paths against an independent dense solver (L-BFGS-B on the split
``w = u - v``, ``u, v >= 0``), the dual constraint ``x_j^T theta = 0`` met, the refusals,
and the same answer on a cluster."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import minimize

import dl1
from dl1.errors import NumericalError, ValidationError
from dl1.objective.datafits import Logistic, Poisson, Quadratic
from tests.helpers import fit_in_mode

DATAFITS = {"squared": Quadratic(), "logistic": Logistic(), "poisson": Poisson()}
FREE = np.array([0, 3, 7])


def problem(loss, n=160, p=30, seed=0):
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=0.3, random_state=seed, format="csr")
    z = X @ (rng.normal(size=p) * (rng.random(p) < 0.4)) + 0.2
    if loss == "logistic":
        return X, np.where(z + 0.3 * rng.normal(size=n) > np.median(z), 1.0, -1.0)
    if loss == "poisson":
        return X, rng.poisson(np.exp(0.5 * z)).astype(float)
    return X, z + 0.1 * rng.normal(size=n)


def factors(p):
    f = np.random.default_rng(1).uniform(0.5, 2.0, p)
    f[FREE] = 0.0
    return f


def objective(loss, X, y, w, b, alpha, l1_ratio, f):
    z = X @ w + b
    pen = alpha * np.sum(f * (l1_ratio * np.abs(w) + 0.5 * (1 - l1_ratio) * w * w))
    return DATAFITS[loss].value(y, z) + pen


def reference(loss, X, y, alpha, l1_ratio, f):
    """L-BFGS-B on ``(u, v, b)``, ``w = u - v``: the L1 part linear on ``u, v >= 0``, the
    unpenalised features free (their ``v`` is 0 and ``u`` unbounded)."""
    A, p = X.toarray(), X.shape[1]
    F = DATAFITS[loss]
    a1, a2 = alpha * l1_ratio * f, alpha * (1 - l1_ratio) * f

    def fun(x):
        u, v, b = x[:p], x[p:2 * p], x[-1]
        w = u - v
        z = A @ w + b
        g = A.T @ F.gradient(y, z)
        val = F.value(y, z) + a1 @ (u + v) + 0.5 * a2 @ (w * w)
        gw = g + a2 * w
        return val, np.concatenate([gw + a1, -gw + a1, [F.gradient(y, z).sum()]])

    lo = np.where(f == 0.0, -np.inf, 0.0)
    bounds = [(a, None) for a in lo] + [(0.0, 0.0) if fj == 0 else (0.0, None) for fj in f]
    x0 = np.zeros(2 * p + 1)
    x0[-1] = F.initial_intercept(y)
    out = minimize(fun, x0, jac=True, method="L-BFGS-B", bounds=[*bounds, (None, None)],
                   options={"maxiter": 100_000, "maxfun": 200_000, "ftol": 1e-16,
                            "gtol": 1e-12})  # fmt: skip
    w = out.x[:p] - out.x[p:2 * p]
    return w, out.x[-1], objective(loss, X, y, w, out.x[-1], alpha, l1_ratio, f)


@pytest.mark.parametrize("loss", DATAFITS)
@pytest.mark.parametrize("l1_ratio", [1.0, 0.5])
def test_fit_agrees_with_the_dense_reference_and_is_certified(in_process, loss, l1_ratio):
    """Pass: certified to 1e-10; the reference's objective lies within dl1's gap below
    dl1's (1e-9 slack for L-BFGS-B); the unpenalised coefficients are nonzero and their
    dual constraints x_j^T grad F = 0 hold to 1e-10."""
    X, y = problem(loss)
    f = factors(X.shape[1])
    alpha = 0.2 * dl1.alpha_max(X, y, loss=loss, penalty_factor=f, l1_ratio=l1_ratio)
    res = dl1.fit(X, y, alpha=alpha, l1_ratio=l1_ratio, loss=loss, penalty_factor=f,
                  tol=1e-10)  # fmt: skip
    assert res.converged_ and res.gap_ <= 1e-10
    ours = objective(loss, X, y, res.coef_, res.intercept_, alpha, l1_ratio, f)
    assert res.primal_ == pytest.approx(ours, rel=1e-12)
    w, b, ref = reference(loss, X, y, alpha, l1_ratio, f)
    assert ours - res.dual_gap_ - 1e-9 <= ref
    assert ours == pytest.approx(ref, rel=1e-7)
    np.testing.assert_allclose(res.coef_, w, atol=1e-4)
    assert np.all(res.coef_[FREE] != 0.0)
    grad = X.T @ DATAFITS[loss].gradient(y, X @ res.coef_ + res.intercept_)
    assert np.abs(grad[FREE]).max() <= 1e-10


def test_alpha_max_is_the_penalised_features_correlation_with_the_free_fit(in_process):
    """Pass: alpha_max is max_j |x_j^T r| / (n f_j) over the penalised features, r the
    residual of least squares on the unpenalised ones and the intercept (computed here);
    at alpha_max the penalised coefficients are 0 and the free ones that least-squares
    fit, just below it one penalised coefficient enters."""
    X, y = problem("squared", seed=2)
    f = factors(X.shape[1])
    A = np.hstack([X.toarray()[:, FREE], np.ones((X.shape[0], 1))])
    sol = np.linalg.lstsq(A, y, rcond=None)[0]
    r = y - A @ sol
    pen = f > 0
    expect = np.max(np.abs(X.toarray().T @ r)[pen] / f[pen]) / X.shape[0]
    amax = dl1.alpha_max(X, y, penalty_factor=f)
    assert amax == pytest.approx(expect, rel=1e-10)
    at = dl1.fit(X, y, alpha=amax * (1 + 1e-9), penalty_factor=f, tol=1e-12)
    assert np.count_nonzero(at.coef_[pen]) == 0
    np.testing.assert_allclose(at.coef_[FREE], sol[:-1], rtol=1e-9)
    below = dl1.fit(X, y, alpha=0.98 * amax, penalty_factor=f, tol=1e-12)
    assert np.count_nonzero(below.coef_[pen]) == 1


def test_path_keeps_the_free_features_and_matches_the_reference(in_process):
    """Pass: a logistic path from its alpha_max certifies every alpha; the free features
    are in from the first alpha, the penalised out; the last alpha matches the
    reference's objective (1e-7)."""
    X, y = problem("logistic", seed=3)
    f = factors(X.shape[1])
    path = dl1.path(X, y, loss="logistic", penalty_factor=f, n_alphas=5, eps=0.1, tol=1e-10)
    assert path.converged_.all()
    first = path.coefs_[:, 0].toarray().ravel()
    assert set(np.flatnonzero(first)) == set(FREE)
    last = path.coefs_[:, -1].toarray().ravel()
    ours = objective("logistic", X, y, last, path.intercepts_[-1], path.alphas_[-1], 1.0, f)
    assert ours == pytest.approx(reference("logistic", X, y, path.alphas_[-1], 1.0, f)[2],
                                 rel=1e-7)  # fmt: skip


def test_what_cannot_be_certified_is_refused_by_name(in_process):
    """Pass: a non-smooth loss, positive=True and all-zero factors are refused naming the
    cause; a free feature that separates the classes raises NumericalError, not a hang."""
    X, y = problem("logistic", seed=4)
    f = factors(X.shape[1])
    with pytest.raises(ValidationError, match="'hinge' is not smooth"):
        dl1.fit(X, y, alpha=0.01, loss="hinge", penalty_factor=f, solver="ws")
    with pytest.raises(ValidationError, match="positive=True"):
        dl1.fit(X, y, alpha=0.01, loss="logistic", penalty_factor=f, positive=True)
    with pytest.raises(ValidationError, match="every feature"):
        dl1.fit(X, y, alpha=0.01, loss="logistic", penalty_factor=np.zeros(X.shape[1]))
    sep = sp.hstack([sp.csr_matrix(y[:, None] + 2.0), X], format="csr")
    with pytest.raises(NumericalError, match="no finite optimum"):
        dl1.fit(sep, y, alpha=0.01, loss="logistic", penalty_factor=np.r_[0.0, f])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["one piece", "distributed", "streamed"])
def test_on_a_cluster_the_fit_is_the_one_in_process(local_cluster, tmp_path, mode):
    """Pass: the free columns are gathered from the workers' blocks (held or in the
    store): one piece, distributed and out of core give the in-process fit (1e-10)."""
    X, y = problem("squared", n=300, p=50, seed=5)
    f = factors(50)
    kw = dict(alpha=0.01, l1_ratio=0.7, penalty_factor=f, standardize=True, tol=1e-10)
    here = dl1.fit(X, y, client=None, **kw)
    res = fit_in_mode(local_cluster, tmp_path, mode, X, y, **kw)
    assert res.converged_
    assert res.primal_ == pytest.approx(here.primal_, rel=1e-10)
    np.testing.assert_allclose(res.coef_, here.coef_, atol=1e-7)
