"""Standardised multiclass fits (dl1.fit_multiclass(standardize=True)): the model of the
columns scaled to unit (weighted) deviation, centred with an intercept, its coefficients
in the input's scale; against scikit-learn on columns scaled in NumPy, against dl1's own
fit of those columns for the grouped penalty and the hinge, warm-started, and streamed from
a store on a 2-worker cluster."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.linear_model import LogisticRegression

import dl1
from tests.solvers.test_multiclass import _objective
from tests.test_penalised import as_dask


def _problem(n=240, p=40, K=3, seed=0):
    """Columns of very different spreads (a penalty without scaling favours the wide)."""
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=0.25, random_state=seed + 1, format="csc")
    X = sp.csc_matrix(X @ sp.diags(np.exp(rng.uniform(-3, 3, p))))
    W = rng.standard_normal((p, K)) * (rng.random((p, 1)) < 0.3)
    y = np.argmax(X @ (W / np.sqrt(X.multiply(X).mean(axis=0)).A.T) + rng.gumbel(size=(n, K)),
                  axis=1)  # fmt: skip
    return X, y


def _scales(X, s=None, center=True):
    """``1 / std_j`` of each column, weighted by ``s`` (summing to n), written with NumPy."""
    D = X.toarray()
    s = np.ones(D.shape[0]) if s is None else s * D.shape[0] / s.sum()
    mean = s @ D / D.shape[0]
    sq = s @ (D * D) / D.shape[0]
    return 1.0 / np.sqrt(sq - mean**2 if center else sq)


@pytest.mark.parametrize("intercept", [True, False])
def test_standardised_multinomial_matches_scikit_learn_on_scaled_columns(intercept):
    X, y = _problem()
    scale, alpha = _scales(X, center=intercept), 0.01
    res = dl1.fit_multiclass(X, y, alpha=alpha, tol=1e-10, standardize=True,
                             fit_intercept=intercept)  # fmt: skip
    Xs = X @ sp.diags(scale)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # saga's own warning at max_iter
        sk = LogisticRegression(l1_ratio=1.0, solver="saga", C=1 / (X.shape[0] * alpha),
                                tol=1e-13, max_iter=200000, fit_intercept=intercept).fit(Xs, y)
    W = res.coef_.toarray().T / scale[:, None]  # the scaled columns' coefficients
    ours = _objective(Xs, y, W, res.intercept_, alpha)
    theirs = _objective(Xs, y, sk.coef_.T, sk.intercept_ if intercept else 0.0, alpha)
    assert res.converged_ and res.primal_ == pytest.approx(ours, rel=1e-10)
    assert abs(ours - theirs) <= 1e-6 * theirs
    np.testing.assert_allclose(res.coef_.toarray() / scale, sk.coef_, atol=1e-4)


@pytest.mark.parametrize("scheme", [{"penalty": "grouped"}, {"l1_ratio": 0.6},
                                    {"multi_class": "ovr", "loss": "squared_hinge"},
                                    {"multi_class": "ovr", "loss": "hinge"}])  # fmt: skip
def test_a_standardised_fit_is_the_fit_of_the_scaled_columns(scheme):
    X, y = _problem(seed=2)
    s = np.random.default_rng(3).uniform(0.5, 2.0, X.shape[0])
    scale = _scales(X, s)
    kw = dict(alpha=0.004, tol=1e-10, sample_weight=s, **scheme)
    res = dl1.fit_multiclass(X, y, standardize=True, **kw)
    ref = dl1.fit_multiclass(sp.csc_matrix(X @ sp.diags(scale)), y, **kw)
    assert res.converged_ and ref.converged_
    # the same objective (each within the other's certified gap); the same model
    primal, theirs = (r.primals_ if hasattr(r, "primals_") else np.array([r.primal_])
                      for r in (res, ref))  # fmt: skip
    assert (np.abs(primal - theirs) <= 2e-10 * theirs + 1e-14).all()
    np.testing.assert_allclose(res.coef_.toarray(), ref.coef_.toarray() * scale, atol=1e-5)
    np.testing.assert_allclose(res.intercept_, ref.intercept_, atol=1e-5)


def test_a_constant_column_stays_out_and_a_start_is_in_the_inputs_scale():
    X, y = _problem(seed=4)
    X = sp.hstack([X, sp.csc_matrix(np.full((X.shape[0], 1), 3.0))], format="csc")
    kw = dict(alpha=0.003, tol=1e-9, standardize=True)
    res = dl1.fit_multiclass(X, y, **kw)
    assert res.converged_ and res.coef_[:, -1].nnz == 0
    again = dl1.fit_multiclass(X, y, coef_init=res.coef_, intercept_init=res.intercept_, **kw)
    assert again.converged_ and again.n_rounds_ == 1
    np.testing.assert_allclose(again.coef_.toarray(), res.coef_.toarray(), atol=1e-12)


def test_the_path_and_the_estimator_standardise_as_the_fit():
    X, y = _problem(seed=5)
    path = dl1.path_multiclass(X, y, n_alphas=3, eps=0.1, tol=1e-10, standardize=True)
    fit = dl1.fit_multiclass(X, y, alpha=path.alphas_[-1], tol=1e-10, standardize=True)
    assert fit.primal_ == pytest.approx(path.fits_[-1].primal_, rel=1e-8)
    est = dl1.LogisticRegression(C=1 / (X.shape[0] * path.alphas_[-1]), tol=1e-10,
                                 standardize=True).fit(X, y)  # fmt: skip
    np.testing.assert_allclose(est.coef_, fit.coef_.toarray(), atol=1e-6)


@pytest.mark.slow
def test_standardised_fits_on_a_cluster_and_streamed_give_the_in_process_answer(
        local_cluster, tmp_path):  # fmt: skip
    X, y = _problem(n=200, p=60, seed=6)
    store = dl1.from_scipy(X, y.astype(float), tmp_path / "mc.zarr")
    for scheme in ({"multi_class": "multinomial"}, {"multi_class": "ovr"}):
        kw = dict(alpha=0.01, tol=1e-10, standardize=True, **scheme)
        local = dl1.fit_multiclass(X, y, **kw)
        remote = dl1.fit_multiclass(as_dask(X, 5), y, client=local_cluster, **kw)
        streamed = dl1.fit_multiclass(store, client=local_cluster, stream=True, **kw)
        for res in (remote, streamed):
            assert res.converged_
            np.testing.assert_allclose(res.coef_.toarray(), local.coef_.toarray(), atol=1e-7)
            np.testing.assert_allclose(res.intercept_, local.intercept_, atol=1e-7)
