"""The smoothing solver: the hinge certified at tol, against linear and quadratic programs
solved by SciPy."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import linprog, minimize

import dl1
from dl1.objective.datafits import Hinge, SmoothHinge
from dl1.objective.gap import duality_gap
from dl1.objective.penalties.elastic_net import ElasticNet


def data(n=300, p=100, separable=False, seed=0):
    """Sparse classification data: labels from 10 features, noisy unless ``separable``."""
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=0.1, format="csr", random_state=seed)
    z = X @ np.r_[rng.standard_normal(10), np.zeros(p - 10)]
    noise = 0.0 if separable else 0.3 * rng.standard_normal(n)
    return X, np.where(z + noise > np.median(z), 1.0, -1.0)


def hinge_objective(X, y, w, b, alpha, l1_ratio=1.0, s=None):
    """The penalised hinge objective in NumPy (weights normalised to sum to n)."""
    n = y.shape[0]
    s = np.ones(n) if s is None else s * n / s.sum()
    loss = s @ np.maximum(0.0, 1.0 - y * (X @ w + b)) / n
    return loss + alpha * (l1_ratio * np.abs(w).sum() + 0.5 * (1 - l1_ratio) * w @ w)


def reference_lp(X, y, alpha, fit_intercept, s=None, method="highs-ds"):
    """The L1 hinge as a dense LP over ``(w, b, xi)`` with ``|w| <= t``: optimum and
    coefficients (an independent formulation of the one the solver's task uses)."""
    X = np.asarray(X.todense())
    n, p = X.shape
    s = np.ones(n) if s is None else s * n / s.sum()
    nb = int(fit_intercept)
    # variables: w (p, free), t (p), b (nb, free), xi (n)
    cost = np.r_[np.zeros(p), np.full(p, alpha), np.zeros(nb), s / n]
    eye = np.eye(p)
    margin = np.hstack([-y[:, None] * X, np.zeros((n, p)), -y[:, None] * np.ones((n, nb)),
                        -np.eye(n)])
    abs_up = np.hstack([eye, -eye, np.zeros((p, nb + n))])
    abs_dn = np.hstack([-eye, -eye, np.zeros((p, nb + n))])
    a_ub = np.vstack([margin, abs_up, abs_dn])
    b_ub = np.r_[-np.ones(n), np.zeros(2 * p)]
    bounds = [(None, None)] * p + [(0, None)] * p + [(None, None)] * nb + [(0, None)] * n
    res = linprog(cost, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method=method,
                  options={"primal_feasibility_tolerance": 1e-10,
                           "dual_feasibility_tolerance": 1e-10})
    assert res.status == 0, res.message
    return res.fun, res.x[:p], (res.x[2 * p] if fit_intercept else 0.0)


CASES = [(sep, fi) for sep in (False, True) for fi in (True, False)]


@pytest.mark.parametrize(("separable", "fit_intercept"), CASES)
@pytest.mark.parametrize("tol", [1e-4, 1e-8])
def test_l1_hinge_is_certified_and_matches_the_lp(separable, fit_intercept, tol):
    """Pass: loss="hinge", l1_ratio=1 (where every older solver stopped at relative gap
    0.2-0.9) is certified at tol; the objective recomputed in NumPy is the reported primal
    and lies within the certified gap of the optimum of an independent dense LP (HiGHS,
    feasibility 1e-10); the certified dual is a lower bound of it; the coefficients and
    intercept equal the LP's when both simplex and interior point agree on them (unique
    solution)."""
    X, y = data(separable=separable)
    alpha = dl1.alpha_max(X, y, loss="hinge", fit_intercept=fit_intercept) / 10
    res = dl1.fit(X, y, loss="hinge", alpha=alpha, tol=tol, fit_intercept=fit_intercept,
                  solver="smoothing")
    assert res.converged_ and res.gap_ <= tol
    opt, w_ref, b_ref = reference_lp(X, y, alpha, fit_intercept)
    primal = hinge_objective(X, y, res.coef_, res.intercept_, alpha)
    assert primal == pytest.approx(res.primal_, rel=1e-12, abs=1e-14)
    assert res.dual_ <= opt + 1e-9
    assert primal - opt <= res.dual_gap_ + 1e-9
    _, w_ipm, b_ipm = reference_lp(X, y, alpha, fit_intercept, method="highs-ipm")
    if np.allclose(w_ipm, w_ref, atol=1e-7) and abs(b_ipm - b_ref) <= 1e-7:
        np.testing.assert_allclose(res.coef_, w_ref, atol=1e-9)
        assert res.intercept_ == pytest.approx(b_ref, abs=1e-9)


def test_sample_weights_are_the_lp_with_weighted_slacks():
    """Pass: with sample weights (some zero) and an intercept, the certified fit's
    objective is within its gap of the weighted LP's optimum, and equals refitting on the
    rows repeated by integer weights."""
    X, y = data(n=200, p=60, seed=3)
    s = np.random.default_rng(4).integers(0, 3, y.shape[0]).astype(float)
    alpha = dl1.alpha_max(X, y, loss="hinge", sample_weight=s) / 8
    res = dl1.fit(X, y, loss="hinge", alpha=alpha, sample_weight=s, tol=1e-8,
                  solver="smoothing")
    assert res.converged_
    opt, _, _ = reference_lp(X, y, alpha, True, s=s)
    primal = hinge_objective(X, y, res.coef_, res.intercept_, alpha, s=s)
    assert res.dual_ <= opt + 1e-9 and primal - opt <= res.dual_gap_ + 1e-9
    rows = np.repeat(np.arange(y.shape[0]), s.astype(int))
    rep = dl1.fit(X[rows], y[rows], loss="hinge", alpha=alpha, tol=1e-8, solver="smoothing")
    assert rep.primal_ == pytest.approx(res.primal_, abs=1e-8)


@pytest.mark.parametrize("gamma", [1.0, 0.1, 1e-3])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_hinge_dual_at_a_smoothed_dual_point_is_a_lower_bound(gamma, fit_intercept):
    """Pass: the hinge's dual value at the smoothed hinge's dual point of any (w, b) --
    what certifies the smoothing solver's stages -- never exceeds the LP's optimum, and the
    hinge gap exceeds the smoothed gap by at most gamma / 2 (the bound the continuation's
    schedule rests on), with sample weights."""
    X, y = data(n=120, p=30, seed=5)
    rng = np.random.default_rng(6)
    s = rng.uniform(0.2, 2.0, y.shape[0])
    s *= y.shape[0] / s.sum()
    alpha = 0.02
    opt, _, _ = reference_lp(X, y, alpha, fit_intercept, s=s)
    pen = ElasticNet(alpha, 1.0)
    for _ in range(5):
        w = rng.standard_normal(30) * (rng.random(30) < 0.3)
        z = X @ w + (rng.standard_normal() if fit_intercept else 0.0)
        smooth = SmoothHinge(gamma)
        theta = smooth.dual_point(y, z, s, fit_intercept)
        xt = X.T @ theta
        p_h, d_h, gap_h = duality_gap(Hinge(), pen, y, z, w, xt, s, fit_intercept, theta)
        _, _, gap_s = duality_gap(smooth, pen, y, z, w, xt, s, fit_intercept, theta)
        assert d_h <= opt + 1e-12 <= p_h + 2e-12
        assert gap_s - 1e-12 <= gap_h <= gap_s + gamma / 2 + 1e-12


def reference_qp(X, y, alpha, l1_ratio):
    """The elastic-net hinge without intercept by SLSQP on its smooth reformulation
    (``w = u - v``, ``u, v, xi >= 0``, margins as inequality constraints)."""
    X = np.asarray(X.todense())
    n, p = X.shape
    a1, a2 = alpha * l1_ratio, alpha * (1 - l1_ratio)

    def f(x):
        u, v, xi = x[:p], x[p:2 * p], x[2 * p:]
        w = u - v
        return xi.sum() / n + a1 * (u.sum() + v.sum()) + 0.5 * a2 * w @ w

    def grad(x):
        u, v = x[:p], x[p:2 * p]
        w = u - v
        return np.r_[a1 + a2 * w, a1 - a2 * w, np.full(n, 1.0 / n)]

    yx = y[:, None] * X
    cons = {"type": "ineq", "fun": lambda x: yx @ (x[:p] - x[p:2 * p]) + x[2 * p:] - 1.0,
            "jac": lambda x: np.hstack([yx, -yx, np.eye(n)])}
    x0 = np.r_[np.zeros(2 * p), np.ones(n)]
    res = minimize(f, x0, jac=grad, constraints=[cons], bounds=[(0, None)] * (2 * p + n),
                   method="SLSQP", options={"ftol": 1e-14, "maxiter": 2000})
    assert res.success, res.message
    return res.fun


@pytest.mark.parametrize("tol", [1e-4, 1e-6])
def test_elastic_net_hinge_by_continuation_matches_a_qp(tol):
    """Pass: l1_ratio=0.5 (a QP: continuation in gamma) is certified at tol, with gamma
    decreasing stage by stage; its objective is within the certified gap of SLSQP's
    optimum of the smooth reformulation, and its dual below it."""
    X, y = data(n=80, p=12, seed=7)
    alpha = dl1.alpha_max(X, y, loss="hinge", l1_ratio=0.5, fit_intercept=False) / 10
    res = dl1.fit(X, y, loss="hinge", l1_ratio=0.5, alpha=alpha, tol=tol,
                  fit_intercept=False, solver="smoothing")
    assert res.converged_ and res.gap_ <= tol
    gammas = [h["gamma"] for h in res.history_ if "hinge_gap" in h]
    assert all(b < a for a, b in zip(gammas, gammas[1:], strict=False))
    opt = reference_qp(X, y, alpha, 0.5)
    assert res.dual_ <= opt + 1e-8
    assert res.primal_ - opt <= res.dual_gap_ + 1e-8


def test_auto_path_and_cluster_give_the_in_process_fit(local_cluster):
    """Pass: solver="auto" picks the smoothing solver for the hinge (identical result);
    a 4-alpha path certifies every alpha, each within its gap of the LP optimum; on a
    two-process LocalCluster the fit equals the in-process one to 1e-9."""
    X, y = data(n=200, p=50, seed=8)
    alpha = dl1.alpha_max(X, y, loss="hinge") / 10
    kw = dict(loss="hinge", alpha=alpha, tol=1e-6)
    named = dl1.fit(X, y, solver="smoothing", **kw)
    auto = dl1.fit(X, y, solver="auto", **kw)
    np.testing.assert_array_equal(auto.coef_, named.coef_)
    remote = dl1.fit(X, y, solver="smoothing", client=local_cluster, **kw)
    assert remote.converged_
    np.testing.assert_allclose(remote.coef_, named.coef_, atol=1e-9)
    assert remote.primal_ == pytest.approx(named.primal_, abs=1e-9)
    pth = dl1.path(X, y, loss="hinge", n_alphas=4, eps=0.1, tol=1e-6, solver="smoothing")
    assert pth.converged_.all()
    for k, a in enumerate(pth.alphas_):
        opt, _, _ = reference_lp(X, y, a, True)
        w = pth.coefs_[:, [k]].toarray().ravel()
        primal = hinge_objective(X, y, w, pth.intercepts_[k], a)
        assert primal - opt <= pth.gaps_[k] * named.p0_ + 1e-9  # P(0) is alpha's too


def test_smooth_losses_go_to_the_working_set_solver():
    """Pass: with a smooth loss the smoothing solver is the working-set solver (same
    coefficients)."""
    X, y = data(n=200, p=40, seed=9)
    kw = dict(loss="logistic", alpha=dl1.alpha_max(X, y, loss="logistic") / 5, tol=1e-8)
    np.testing.assert_array_equal(dl1.fit(X, y, solver="smoothing", **kw).coef_,
                                  dl1.fit(X, y, solver="ws", **kw).coef_)


def test_a_checkpointed_path_resumes_bit_for_bit(tmp_path):
    """Pass: a hinge path interrupted after its third alpha (an exception from the
    callback) resumes from its checkpoint to the uninterrupted path's coefficients,
    intercepts and gaps exactly."""
    X, y = data(n=150, p=40, seed=10)
    kw = dict(loss="hinge", n_alphas=6, eps=0.1, tol=1e-6, solver="smoothing")
    reference = dl1.path(X, y, **kw)

    def stop(k, alpha, res):
        if k == 2:
            raise KeyboardInterrupt

    ck = tmp_path / "ck.zarr"
    with pytest.raises(KeyboardInterrupt):
        dl1.path(X, y, checkpoint=ck, callback=stop, **kw)
    resumed = dl1.path(X, y, checkpoint=ck, **kw)
    assert (resumed.coefs_ != reference.coefs_).nnz == 0
    np.testing.assert_array_equal(resumed.intercepts_, reference.intercepts_)
    np.testing.assert_array_equal(resumed.gaps_, reference.gaps_)


def test_bad_settings_are_refused():
    """Pass: a non-positive gamma_start or a shrink outside (0, 1) is refused, naming it."""
    from dl1.solvers.smoothing import SmoothingSolver

    with pytest.raises(dl1.errors.ValidationError, match="gamma_start"):
        SmoothingSolver(gamma_start=0.0)
    with pytest.raises(dl1.errors.ValidationError, match="shrink"):
        SmoothingSolver(shrink=1.0)
