"""The RDA, Prox-SDCA and SMIDAS solvers against the working-set solver's optimum."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

import dl1
from dl1.solvers.result import ConvergenceWarning


def data(loss: str, n=800, p=60, seed=0):
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=0.1, format="csr", random_state=seed)
    z = X @ np.r_[rng.standard_normal(6), np.zeros(p - 6)]
    if loss == "squared":
        return X, z + 0.05 * rng.standard_normal(n)
    return X, np.where(z + 0.1 * rng.standard_normal(n) > np.median(z), 1.0, -1.0)


def fit_quietly(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return dl1.fit(*args, **kwargs)


@pytest.mark.parametrize("n_partitions", [1, 2])
@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_sdca_reaches_1e_6_and_the_working_set_solution(loss, n_partitions):
    """Pass: Prox-SDCA on the elastic net (l1_ratio 0.5) stops certified at relative gap
    1e-6, and its coefficients are within the strong-convexity bound of the working-set
    optimum (certified at 1e-12): ``||w - w*|| <= sqrt(2 gap / l2)``, since
    ``P(w) - P* >= l2/2 ||w - w*||^2`` and ``P(w) - P* <= gap``."""
    X, y = data(loss)
    alpha = dl1.alpha_max(X, y, l1_ratio=0.5, loss=loss) / 10
    kw = dict(alpha=alpha, l1_ratio=0.5, loss=loss)
    ref = dl1.fit(X, y, tol=1e-12, **kw)
    res = dl1.fit(X, y, solver="sdca", tol=1e-6, max_epochs=300, n_partitions=n_partitions, **kw)
    assert res.converged_ and res.gap_ <= 1e-6
    bound = math.sqrt(2 * (res.dual_gap_ + ref.dual_gap_) / (0.5 * alpha))
    assert np.linalg.norm(res.coef_ - ref.coef_) <= bound
    assert res.primal_ - ref.primal_ <= res.dual_gap_ + 1e-15


def test_sdca_pure_lasso_uses_the_papers_ridge_and_says_when_it_is_slow():
    """Pass: with l1_ratio=1 Prox-SDCA solves the paper's ridged problem (Sec. 3.1); when
    the ridge makes the expected number of rounds exceed max_epochs it warns up front,
    naming the estimate and the working-set solver."""
    X, y = data("squared", n=300, p=30, seed=1)
    alpha = dl1.alpha_max(X, y) / 10
    with pytest.warns(ConvergenceWarning) as seen:
        dl1.fit(X, y, alpha=alpha, solver="sdca", tol=1e-6, max_epochs=5)
    messages = [str(w.message) for w in seen]
    assert any("ridge" in m and "rounds" in m and "'ws'" in m for m in messages), messages


@pytest.mark.parametrize("n_partitions", [1, 2])
@pytest.mark.parametrize(("loss", "l1_ratio"), [("squared", 1.0), ("logistic", 1.0),
                                                ("squared", 0.5)])
def test_rda_objective_within_its_certificate_and_theorem_2(loss, l1_ratio, n_partitions):
    """Pass: l1-RDA's objective after 10 epochs exceeds the working-set optimum by at most
    its own reported gap (the certificate), and by at most Xiao's Theorem 2 bound
    ``(gamma D^2 + L^2 / gamma) / sqrt(T)`` with ``D = ||w*||``, ``L = max |loss'| max ||x_i||``
    and the ``gamma`` the solver calibrated and recorded (the bound is for the averaged
    iterate; the last iterate, returned here, is the one the
    paper's experiments use). The model has at most the optimum's nonzeros plus 10%: RDA's
    thresholds on the average gradient give exact zeros."""
    X, y = data(loss, seed=2)
    alpha = dl1.alpha_max(X, y, l1_ratio=l1_ratio, loss=loss) / 8
    kw = dict(alpha=alpha, l1_ratio=l1_ratio, loss=loss)
    ref = dl1.fit(X, y, tol=1e-12, **kw)
    res = fit_quietly(X, y, solver="rda", max_epochs=10, tol=1e-9, n_partitions=n_partitions,
                      **kw)
    excess = res.primal_ - ref.primal_
    assert excess <= res.dual_gap_ + 1e-15
    n = X.shape[0]
    R = math.sqrt(X.multiply(X).sum(axis=1).max())
    gamma = res.history_[0]["rda_gamma"]
    assert gamma == res.history_[0]["calibration"].value
    L = (np.abs(y).max() + np.abs(X @ ref.coef_).max() + abs(ref.intercept_) if loss == "squared"
         else 1.0) * R
    D = np.linalg.norm(ref.coef_)
    assert excess <= (gamma * D**2 + L**2 / gamma) / math.sqrt(10 * n)
    assert np.count_nonzero(res.coef_) <= 1.1 * np.count_nonzero(ref.coef_) + 1


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_smidas_objective_within_its_certificate_and_theorem_3(loss):
    """Pass: SMIDAS's objective after 10 epochs with Theorem 3's step (given: the default
    is calibrated) exceeds the working-set optimum by at most its reported gap, and by at
    most Theorem 3's bound for that step (any eta: case (13), ``eta (p-1) rho^2 e / 2 +
    ||w*||_1^2 / (eta T)`` with ``rho = 1`` for the logistic loss; case (14), ``(1 / (1 -
    c) - 1) P(0) + ||w*||_1^2 / (eta T (1 - c))`` with ``c = eta (p-1) rho e / 2``,
    ``rho = 2`` for the squared loss), on data scaled to the theorem's ``|x_ij| <= 1``.
    The theorem bounds a random iterate in expectation; the last one is returned, as in
    the paper's experiments."""
    from dl1.kernels.smidas import smidas_eta, smidas_eta_smooth, smidas_p
    from dl1.solvers.smidas import SMIDASSolver

    X, y = data(loss, seed=3)
    X = X / abs(X).max()
    alpha = dl1.alpha_max(X, y, loss=loss) / 8
    ref = dl1.fit(X, y, alpha=alpha, loss=loss, tol=1e-12)
    T, p = 10 * X.shape[0], smidas_p(X.shape[1])
    B, xmax = ref.p0_ / alpha, math.sqrt(X.multiply(X).sum(axis=1).max())
    if loss == "logistic":
        eta = smidas_eta(B * xmax, 1.0, p, T) / xmax**2
    else:
        eta = smidas_eta_smooth(B * xmax, 2.0, p, T, ref.p0_) / xmax**2
    res = fit_quietly(X, y, alpha=alpha, loss=loss, solver=SMIDASSolver(max_epochs=10, eta=eta),
                      tol=1e-9, n_partitions=1)
    assert res.history_[0]["eta"] == eta and "calibration" not in res.history_[0]
    excess = res.primal_ - ref.primal_
    assert excess <= res.dual_gap_ + 1e-15
    w1 = np.abs(ref.coef_).sum()
    assert w1 <= B  # the B the step assumes bounds ||w*||_1
    if loss == "logistic":
        bound = eta * (p - 1) * math.e / 2 + w1**2 / (eta * T)
    else:
        c = eta * (p - 1) * 2.0 * math.e / 2
        assert c < 1
        bound = (1 / (1 - c) - 1) * res.p0_ + w1**2 / (eta * T * (1 - c))
    assert excess <= bound


def test_smidas_refuses_a_ridge_part():
    """Pass: SMIDAS is for the L1 penalty: l1_ratio < 1 is refused with a message naming
    the solvers that take the elastic net."""
    X, y = data("squared", n=100, p=10, seed=4)
    with pytest.raises(dl1.errors.ValidationError, match="smidas.*L1.*rda"):
        dl1.fit(X, y, alpha=0.1, l1_ratio=0.5, solver="smidas")


@pytest.mark.parametrize("solver", ["rda", "sdca", "smidas"])
def test_cluster_fit_equals_in_process_fit(local_cluster, solver):
    """Pass: on a 2-worker LocalCluster the fit equals the in-process fit with the same
    partitions, to 1e-12 (the combination does not depend on where the tasks run)."""
    X, y = data("squared", seed=5)
    l1_ratio = 0.5 if solver == "sdca" else 1.0
    alpha = dl1.alpha_max(X, y, l1_ratio=l1_ratio) / 8
    kw = dict(alpha=alpha, l1_ratio=l1_ratio, solver=solver, max_epochs=4, tol=1e-12,
              n_partitions=2)
    local = fit_quietly(X, y, **kw)
    remote = fit_quietly(X, y, client=local_cluster, **kw)
    np.testing.assert_allclose(remote.coef_, local.coef_, rtol=0, atol=1e-12)
    assert remote.intercept_ == pytest.approx(local.intercept_, abs=1e-12)


@pytest.mark.parametrize("n_partitions", [1, 2])
def test_sdca_smoothed_hinge_matches_the_working_set_solution(n_partitions):
    """Pass: with the smoothed hinge (a loss of every solver), Prox-SDCA stops certified at
    1e-6 and lies within the strong-convexity bound of the working-set optimum."""
    X, y = data("logistic", seed=6)
    kw = dict(l1_ratio=0.5, loss="smooth_hinge")
    alpha = dl1.alpha_max(X, y, **kw) / 10
    ref = dl1.fit(X, y, alpha=alpha, tol=1e-12, **kw)
    res = dl1.fit(X, y, alpha=alpha, solver="sdca", tol=1e-6, max_epochs=300,
                  n_partitions=n_partitions, **kw)
    assert res.converged_
    bound = math.sqrt(2 * (res.dual_gap_ + ref.dual_gap_) / (0.5 * alpha))
    assert np.linalg.norm(res.coef_ - ref.coef_) <= bound


def test_sdca_hinge_is_certified_by_its_own_dual_variables():
    """Pass: with the (non-smooth) hinge and no intercept, Prox-SDCA reaches relative gap
    1e-5 within 300 rounds: the certificate uses its dual variables (the dual point of the
    predictions, a 0/1 subgradient, cannot certify points on the margin)."""
    X, y = data("logistic", seed=7)
    kw = dict(l1_ratio=0.5, loss="hinge", fit_intercept=False)
    alpha = dl1.alpha_max(X, y, **kw) / 10
    res = dl1.fit(X, y, alpha=alpha, solver="sdca", tol=1e-5, max_epochs=300, **kw)
    assert res.converged_ and res.gap_ <= 1e-5


def test_sdca_hinge_with_an_intercept_reaches_a_tight_gap():
    """Pass: with the hinge and an unpenalised intercept, Prox-SDCA (the method of
    multipliers on the intercept's dual constraint) is certified at relative gap 1e-6
    within 300 rounds, the certificate refitting the intercept exactly; holding the
    refitted intercept through each round instead stalled at 4e-2 on these data."""
    rng = np.random.default_rng(1)
    X = sp.random(600, 40, density=0.2, format="csr", random_state=rng)
    w = np.r_[rng.standard_normal(6) * 4, np.zeros(34)]
    y = np.where(X @ w - 0.3 + 0.3 * rng.standard_normal(600) > 0, 1.0, -1.0)
    kw = dict(l1_ratio=0.5, loss="hinge")
    alpha = dl1.alpha_max(X, y, **kw) / 10
    res = dl1.fit(X, y, alpha=alpha, solver="sdca", tol=1e-6, max_epochs=300, **kw)
    assert res.converged_ and res.gap_ <= 1e-6
    # the certified objective is the hinge objective of the answer, recomputed in NumPy
    z = X @ res.coef_ + res.intercept_
    primal = np.mean(np.maximum(0.0, 1.0 - y * z)) + alpha * (
        0.5 * np.abs(res.coef_).sum() + 0.25 * res.coef_ @ res.coef_
    )
    assert primal == pytest.approx(res.history_[-1]["objective"], rel=1e-12)


@pytest.mark.parametrize("solver", ["ws", "cd"])
def test_hinge_is_refused_by_the_solvers_needing_smoothness(solver):
    """Pass: the hinge with a feature-wise solver is refused before any work, naming the
    solvers that take it."""
    X, y = data("logistic", n=100, p=10, seed=8)
    with pytest.raises(dl1.errors.ValidationError, match="not smooth.*sdca"):
        dl1.fit(X, y, alpha=0.01, loss="hinge", solver=solver)


@pytest.mark.parametrize("solver", ["sgd", "fobos", "rda", "smidas"])
def test_online_solvers_take_the_hinge(solver):
    """Pass: the online solvers fit the hinge (a subgradient step; the loss's curvature is
    unbounded, its slope is not): the gap falls at least 10-fold from w = 0 in 20 epochs,
    2-fold for SMIDAS (with the p-norm link its first epochs on this small problem move
    little whatever the step: 2.2-fold for its calibrated step, 2.5-fold at best)."""
    X, y = data("logistic", seed=9)
    l1_ratio = 1.0 if solver == "smidas" else 0.5
    kw = dict(l1_ratio=l1_ratio, loss="hinge")
    alpha = dl1.alpha_max(X, y, **kw) / 10
    res = fit_quietly(X, y, alpha=alpha, solver=solver, max_epochs=20, tol=1e-9, **kw)
    factor = 0.5 if solver == "smidas" else 0.1
    assert res.history_[-1]["gap"] <= factor * res.history_[0]["gap"]


@pytest.mark.parametrize("solver", ["sgd", "rda", "sdca"])
def test_dense_numpy_input_gives_the_sparse_inputs_fit(solver):
    """Pass: an ndarray X gives exactly the fit of the same matrix as scipy.sparse (row
    blocks are CSR whatever the input)."""
    X, y = data("squared", n=200, p=20, seed=12)
    kw = dict(alpha=dl1.alpha_max(X, y, l1_ratio=0.5) / 5, l1_ratio=0.5, solver=solver,
              max_epochs=3, tol=1e-12)
    dense = fit_quietly(X.toarray(), y, **kw)
    sparse = fit_quietly(X, y, **kw)
    np.testing.assert_allclose(dense.coef_, sparse.coef_, rtol=0, atol=1e-12)
