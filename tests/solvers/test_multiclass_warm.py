"""Warm starts of dl1.fit_multiclass (``coef_init`` / ``intercept_init``): multinomial and
one-vs-rest fits from a nearby answer reach the cold fit's objective, checked against
objectives written independently of dl1; a start at the answer certifies at once; bad
starts are refused; on a 2-worker cluster and streamed from a store."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import dl1
from dl1.errors import ValidationError
from tests.solvers.test_multiclass import _objective as _multinomial_objective
from tests.solvers.test_ovr import _objective as _binary_objective
from tests.solvers.test_ovr import _relabel
from tests.test_penalised import as_dask

SCHEMES = [
    {"multi_class": "multinomial"},
    {"multi_class": "multinomial", "penalty": "grouped"},
    {"multi_class": "multinomial", "l1_ratio": 0.5},
    {"multi_class": "ovr", "loss": "logistic"},
    {"multi_class": "ovr", "loss": "squared_hinge"},
    {"multi_class": "ovr", "loss": "hinge"},
]


def _problem(n=240, p=70, K=4, seed=0):
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=0.2, random_state=seed + 1, format="csc")
    W = rng.standard_normal((p, K)) * (rng.random((p, 1)) < 0.2) * 3
    return X, np.argmax(X @ W + rng.gumbel(size=(n, K)), axis=1)


def _objectives(res, X, y, alpha, scheme):
    """The fit's objective(s) recomputed from its coefficients: the multinomial one, or
    each one-vs-rest class's binary one."""
    W, b = res.coef_.toarray(), res.intercept_
    r = scheme.get("l1_ratio", 1.0)
    if scheme["multi_class"] == "multinomial":
        grouped = scheme.get("penalty") == "grouped"
        return np.array([_multinomial_objective(X, y, W.T, b, alpha, r, grouped)])
    return np.array([_binary_objective(scheme["loss"], X, _relabel(y, k), W[k], b[k], alpha, r)
                     for k in range(W.shape[0])])  # fmt: skip


def _gaps(res):
    """The certified absolute gaps: the multinomial one, or each class's."""
    if hasattr(res, "gaps_"):
        return res.primals_ - res.duals_
    return np.array([res.primal_ - res.dual_])


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_fit_from_another_alphas_answer_reaches_the_cold_fits_objective(scheme):
    X, y = _problem()
    kw = dict(tol=1e-9, **scheme)
    near = dl1.fit_multiclass(X, y, alpha=0.004, **kw)
    cold = dl1.fit_multiclass(X, y, alpha=0.002, **kw)
    warm = dl1.fit_multiclass(X, y, alpha=0.002, coef_init=near.coef_.toarray(),
                              intercept_init=near.intercept_, **kw)  # fmt: skip
    assert warm.converged_ and cold.converged_
    ours, theirs = _objectives(warm, X, y, 0.002, scheme), _objectives(cold, X, y, 0.002, scheme)
    # each within the other's certified gap (plus rounding): the same minimum
    slack = np.maximum(_gaps(warm), 0.0) + np.maximum(_gaps(cold), 0.0) + 1e-12 * theirs
    assert (np.abs(ours - theirs) <= slack).all()
    assert warm.n_rounds_ <= cold.n_rounds_ + 1


@pytest.mark.parametrize("scheme", SCHEMES[:5])
def test_a_fit_started_at_its_answer_is_certified_by_its_first_pass(scheme):
    """(Not the hinge: its certificate is its LP's multipliers, which a start lacks.)"""
    X, y = _problem(seed=2)
    kw = dict(alpha=0.003, tol=1e-8, **scheme)
    res = dl1.fit_multiclass(X, y, **kw)
    again = dl1.fit_multiclass(X, y, coef_init=res.coef_, intercept_init=res.intercept_, **kw)
    first = 1 if scheme["multi_class"] == "multinomial" else 0  # rounds counted as records
    assert again.converged_ and again.n_rounds_ == first
    np.testing.assert_allclose(again.coef_.toarray(), res.coef_.toarray(), atol=1e-12)


def test_a_start_without_intercepts_fits_them():
    X, y = _problem(seed=3)
    kw = dict(alpha=0.003, tol=1e-9)
    res = dl1.fit_multiclass(X, y, **kw)
    again = dl1.fit_multiclass(X, y, coef_init=res.coef_, **kw)
    assert again.converged_
    np.testing.assert_allclose(again.intercept_, res.intercept_, atol=1e-6)
    ovr = dl1.fit_multiclass(X, y, multi_class="ovr", **kw)
    again = dl1.fit_multiclass(X, y, multi_class="ovr", coef_init=ovr.coef_, **kw)
    assert again.converged_
    np.testing.assert_allclose(again.intercept_, ovr.intercept_, atol=1e-6)


def test_bad_starts_are_refused_before_any_work():
    X, y = _problem()
    with pytest.raises(ValidationError, match=r"coef_init must be 4 x 70 finite values .* "
                                              r"got shape \(4, 69\)"):  # fmt: skip
        dl1.fit_multiclass(X, y, alpha=0.01, coef_init=np.zeros((4, 69)))
    with pytest.raises(ValidationError, match="coef_init must be 4 x 70 finite values"):
        dl1.fit_multiclass(X, y, alpha=0.01, coef_init=np.full((4, 70), np.nan))
    with pytest.raises(ValidationError, match=r"intercept_init must be 4 finite values .* "
                                              r"got shape \(3,\)"):  # fmt: skip
        dl1.fit_multiclass(X, y, alpha=0.01, multi_class="ovr", intercept_init=np.zeros(3))


@pytest.mark.slow
def test_warm_starts_on_a_cluster_and_streamed_give_the_in_process_answer(local_cluster,
                                                                          tmp_path):  # fmt: skip
    X, y = _problem(n=200, p=90, K=3, seed=5)
    store = dl1.from_scipy(X, y.astype(float), tmp_path / "mc.zarr")
    for scheme in ({"multi_class": "multinomial"}, {"multi_class": "ovr"}):
        kw = dict(tol=1e-10, **scheme)
        near = dl1.fit_multiclass(X, y, alpha=0.02, **kw)
        start = {"coef_init": near.coef_, "intercept_init": near.intercept_}
        local = dl1.fit_multiclass(X, y, alpha=0.01, **start, **kw)
        remote = dl1.fit_multiclass(as_dask(X, 5), y, alpha=0.01, client=local_cluster,
                                    **start, **kw)  # fmt: skip
        streamed = dl1.fit_multiclass(store, alpha=0.01, client=local_cluster, stream=True,
                                      **start, **kw)  # fmt: skip
        for res in (remote, streamed):
            assert res.converged_
            np.testing.assert_allclose(res.coef_.toarray(), local.coef_.toarray(), atol=1e-7)
            np.testing.assert_allclose(res.intercept_, local.intercept_, atol=1e-7)
