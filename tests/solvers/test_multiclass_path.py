"""The multinomial path (dl1.path_multiclass): alpha_max against NumPy, each alpha's fit
certified and equal to a cold fit's, warm starts that save work, on a 2-worker cluster."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import softmax

import dl1
from dl1.errors import ValidationError
from tests.solvers.test_multiclass import _objective, _problem
from tests.test_penalised import as_dask


def _alpha_max_reference(X, y, grouped=False):
    """``max |X^T (Y - P_0)| / n`` at ``W = 0`` with the optimal intercept (``P_0`` the
    class frequencies), the row norms for the grouped penalty."""
    n, K = X.shape[0], int(y.max()) + 1
    Y = np.eye(K)[y]
    V = X.T @ (Y - Y.mean(axis=0))
    return (np.linalg.norm(V, axis=1).max() if grouped else np.abs(V).max()) / n


@pytest.mark.parametrize("penalty", ["l1", "grouped"])
def test_alpha_max_is_the_numpy_one_and_the_edge_of_the_zero_solution(penalty):
    X, y = _problem()
    grouped = penalty == "grouped"
    pth = dl1.path_multiclass(X, y, alphas=[1.0], penalty=penalty, tol=1e-8)
    amax = _alpha_max_reference(X, y, grouped)
    assert pth.alpha_max_ == pytest.approx(amax, rel=1e-10)
    at, below = dl1.path_multiclass(X, y, alphas=[amax * 1.001, amax * 0.95],
                                    penalty=penalty, tol=1e-8).fits_  # fmt: skip
    assert at.coef_.nnz == 0 and below.coef_.nnz > 0
    # W = 0 with the class frequencies' intercept, at alpha_max
    np.testing.assert_allclose(softmax(at.intercept_), np.bincount(y) / y.shape[0], rtol=1e-10)


def test_each_alpha_is_certified_and_is_the_cold_fits_answer():
    X, y = _problem(seed=3)
    pth = dl1.path_multiclass(X, y, n_alphas=6, eps=0.02, tol=1e-9)
    assert (np.diff(pth.alphas_) < 0).all() and pth.alphas_[0] == pth.alpha_max_
    assert (pth.gaps_ <= 1e-9).all()
    for alpha, fit in zip(pth.alphas_, pth.fits_, strict=True):
        cold = dl1.fit_multiclass(X, y, alpha=alpha, tol=1e-9)
        ours = _objective(X, y, fit.coef_.T.toarray(), fit.intercept_, alpha)
        theirs = _objective(X, y, cold.coef_.T.toarray(), cold.intercept_, alpha)
        # both within their certified gaps of the optimum (gaps relative to F(b0) <= log K)
        assert abs(ours - theirs) <= 1e-9 * np.log(4) * 2
    assert pth.intercepts_.shape == (6, 4) and len(pth.coefs_) == 6


def test_warm_starts_save_work_over_cold_fits():
    X, y = _problem(n=400, p=300, seed=5)
    pth = dl1.path_multiclass(X, y, n_alphas=8, eps=0.01, tol=1e-8)
    cold = [dl1.fit_multiclass(X, y, alpha=a, tol=1e-8) for a in pth.alphas_]
    warm_epochs = sum(f.n_epochs_ for f in pth.fits_)
    assert warm_epochs < sum(f.n_epochs_ for f in cold)


def test_the_path_on_a_cluster_and_streamed_is_the_in_process_one(local_cluster, tmp_path):
    X, y = _problem(seed=7)
    kw = dict(n_alphas=4, eps=0.05, tol=1e-9)
    here = dl1.path_multiclass(X, y, **kw)
    there = dl1.path_multiclass(as_dask(X, 5), y, client=local_cluster, **kw)
    store = dl1.from_scipy(X, y.astype(float), tmp_path / "mc.zarr")
    streamed = dl1.path_multiclass(store, client=local_cluster, stream=True, **kw)
    for other in (there, streamed):
        np.testing.assert_allclose(other.alphas_, here.alphas_, rtol=1e-12)
        for a, b in zip(here.fits_, other.fits_, strict=True):
            assert b.gap_ <= 1e-9
            np.testing.assert_allclose(b.coef_.toarray(), a.coef_.toarray(), atol=1e-6)


@pytest.mark.parametrize("alphas", [[], [0.1, -1.0], [np.nan]])
def test_bad_alphas_are_refused(alphas):
    X, y = _problem()
    with pytest.raises(ValidationError, match="alphas must be finite and positive"):
        dl1.path_multiclass(X, y, alphas=alphas)
