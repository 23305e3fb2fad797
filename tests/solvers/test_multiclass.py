"""Multinomial logistic regression (dl1.fit_multiclass) against scikit-learn and a dense
NumPy reference, certified; in process, on a 2-worker cluster and streamed from a store."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.special import logsumexp, softmax
from sklearn.linear_model import LogisticRegression

import dl1
from dl1.errors import ValidationError
from dl1.multiclass import load_labelled
from dl1.objective.datafits.multinomial import Multinomial
from dl1.objective.penalties.elastic_net import ElasticNet
from dl1.params import InvalidParameterError
from dl1.solvers.multiclass import MulticlassWorkingSetSolver
from tests.test_penalised import as_dask


def _problem(n=240, p=70, K=4, seed=0):
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=0.2, random_state=seed + 1, format="csc")
    W = rng.standard_normal((p, K)) * (rng.random((p, 1)) < 0.2) * 3
    y = np.argmax(X @ W + rng.gumbel(size=(n, K)), axis=1)
    return X, y


def _objective(X, y, W, b, alpha, l1_ratio=1.0, grouped=False):
    """The multinomial objective, written independently of dl1 (``W``: ``p x K``)."""
    Z = X @ W + b
    loss = (logsumexp(Z, axis=1) - Z[np.arange(X.shape[0]), y]).mean()
    l1 = np.linalg.norm(W, axis=1).sum() if grouped else np.abs(W).sum()
    return loss + alpha * (l1_ratio * l1 + 0.5 * (1 - l1_ratio) * (W * W).sum())


def _sklearn(X, y, alpha, l1_ratio, intercept=True):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # saga's own convergence warning at max_iter
        return LogisticRegression(l1_ratio=l1_ratio, solver="saga", C=1 / (X.shape[0] * alpha),
                                  tol=1e-13, max_iter=200000,
                                  fit_intercept=intercept).fit(X, y)  # fmt: skip


@pytest.mark.parametrize("l1_ratio, intercept", [(1.0, True), (0.5, True), (1.0, False)])
def test_multinomial_matches_scikit_learn_saga(l1_ratio, intercept):
    X, y = _problem()
    alpha = 0.01
    res = dl1.fit_multiclass(X, y, alpha=alpha, l1_ratio=l1_ratio, tol=1e-10,
                             fit_intercept=intercept)  # fmt: skip
    assert res.converged_ and res.gap_ <= 1e-10
    assert res.coef_.shape == (4, 70) and res.intercept_.shape == (4,)
    np.testing.assert_array_equal(res.classes_, np.arange(4))
    W = res.coef_.T.toarray()
    ours = _objective(X, y, W, res.intercept_, alpha, l1_ratio)
    assert res.primal_ == pytest.approx(ours, rel=1e-12)
    sk = _sklearn(X, y, alpha, l1_ratio, intercept)
    theirs = _objective(X, y, sk.coef_.T, sk.intercept_, alpha, l1_ratio)
    # theirs >= the optimum >= our dual, up to the rounding of sums of n terms (the gap at
    # 1e-10 may come out a few 1e-15 below zero)
    rounding = 1e-13 * ours
    assert ours <= theirs + max(res.primal_ - res.dual_, 0.0) + rounding
    assert theirs - ours <= 1e-6 * ours  # saga's own precision
    assert res.dual_ <= theirs + rounding  # the certificate is a true lower bound
    # the same decision function (scikit-learn's intercepts are centred as dl1's up to a
    # constant per row, which the softmax ignores)
    Z_ours, Z_sk = X @ W + res.intercept_, X @ sk.coef_.T + sk.intercept_
    np.testing.assert_allclose(softmax(Z_ours, axis=1), softmax(Z_sk, axis=1), atol=1e-4)


def _grouped_reference(X, y, alpha, iters=20000):
    """The grouped multinomial by FISTA on dense arrays (row-wise block soft-thresholding,
    the intercept a free block), stopped when a step no longer moves."""
    Xd = X.toarray()
    n, p = Xd.shape
    K = y.max() + 1
    Y = np.eye(K)[y]
    A = np.hstack([Xd, np.ones((n, 1))])
    step = 1.0 / (0.5 * np.linalg.norm(A, 2) ** 2 / n)
    V = np.zeros((p + 1, K))
    U, t = V.copy(), 1.0
    for _ in range(iters):
        G = A.T @ (softmax(A @ U, axis=1) - Y) / n
        Vn = U - step * G
        norms = np.linalg.norm(Vn[:p], axis=1)
        shrink = np.maximum(1 - step * alpha / np.where(norms > 0, norms, 1), 0)
        Vn[:p] *= shrink[:, None]
        tn = 0.5 * (1 + np.sqrt(1 + 4 * t * t))
        U, t = Vn + (t - 1) / tn * (Vn - V), tn
        if np.abs(Vn - V).max() < 1e-13:
            V = Vn
            break
        V = Vn
    return V[:p], V[p]


def test_grouped_multinomial_matches_a_dense_reference():
    X, y = _problem(n=150, p=30, K=3, seed=2)
    alpha = 0.02
    res = dl1.fit_multiclass(X, y, alpha=alpha, penalty="grouped", tol=1e-10)
    assert res.converged_
    W = res.coef_.T.toarray()
    rows_in = np.abs(W).max(axis=1) > 0
    assert 0 < rows_in.sum() < 30
    assert (np.abs(W[rows_in]) > 0).all()  # in for every class or for none
    Wr, br = _grouped_reference(X, y, alpha)
    ours = _objective(X, y, W, res.intercept_, alpha, grouped=True)
    theirs = _objective(X, y, Wr, br, alpha, grouped=True)
    assert ours == pytest.approx(theirs, rel=1e-8)
    assert res.dual_ <= theirs


def test_integer_weights_fit_as_repeated_rows_and_as_scikit_learn():
    X, y = _problem(n=150, p=40, K=3, seed=7)
    rng = np.random.default_rng(8)
    w = rng.integers(0, 4, X.shape[0]).astype(float)
    w[np.flatnonzero(w == 0)[:1]] = 0.0
    keep = np.repeat(np.arange(X.shape[0]), w.astype(int))
    alpha = 0.01
    weighted = dl1.fit_multiclass(X, y, alpha=alpha, sample_weight=w, tol=1e-11)
    repeated = dl1.fit_multiclass(X[keep], y[keep], alpha=alpha, tol=1e-11)
    np.testing.assert_allclose(weighted.coef_.toarray(), repeated.coef_.toarray(), atol=1e-6)
    np.testing.assert_allclose(weighted.intercept_, repeated.intercept_, atol=1e-6)
    assert weighted.primal_ == pytest.approx(repeated.primal_, rel=1e-9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sk = LogisticRegression(l1_ratio=1.0, solver="saga", C=1 / (w.sum() * alpha),
                                tol=1e-13, max_iter=200000).fit(X, y, sample_weight=w)  # fmt: skip
    Xd = X[keep]
    ours = _objective(Xd, y[keep], weighted.coef_.T.toarray(), weighted.intercept_, alpha)
    theirs = _objective(Xd, y[keep], sk.coef_.T, sk.intercept_, alpha)
    assert abs(ours - theirs) <= 1e-6 * ours
    with pytest.raises(ValidationError, match="class 1 has no sample of positive weight"):
        dl1.fit_multiclass(X, y, alpha=alpha, sample_weight=np.where(y == 1, 0.0, 1.0))


def test_string_labels_are_encoded_sorted():
    X, y = _problem(K=3, seed=3)
    names = np.array(["spam", "eggs", "ham"])[y]
    res = dl1.fit_multiclass(X, names, alpha=0.02, tol=1e-8)
    np.testing.assert_array_equal(res.classes_, ["eggs", "ham", "spam"])
    ref = dl1.fit_multiclass(X, np.searchsorted(["eggs", "ham", "spam"], names), alpha=0.02,
                             tol=1e-8)  # fmt: skip
    np.testing.assert_array_equal(res.coef_.toarray(), ref.coef_.toarray())


def test_distributed_and_streamed_fits_give_the_in_process_answer(local_cluster, tmp_path):
    X, y = _problem(n=200, p=90, K=3, seed=5)
    kw = dict(alpha=0.01, tol=1e-10)
    local = dl1.fit_multiclass(X, y, **kw)
    remote = dl1.fit_multiclass(as_dask(X, 5), y, client=local_cluster, **kw)
    store = dl1.from_scipy(X, y.astype(float), tmp_path / "mc.zarr")
    streamed = dl1.fit_multiclass(store, client=local_cluster, stream=True, **kw)
    for res in (remote, streamed):
        assert res.converged_
        np.testing.assert_allclose(res.coef_.toarray(), local.coef_.toarray(), atol=1e-7)
        np.testing.assert_allclose(res.intercept_, local.intercept_, atol=1e-7)
    np.testing.assert_array_equal(streamed.classes_, [0.0, 1.0, 2.0])


def test_a_bound_that_stops_the_fit_warns_with_the_gap():
    X, y = _problem()
    with pytest.warns(dl1.ConvergenceWarning, match="relative duality gap .* > tol 1e-12") as w:
        res = dl1.fit_multiclass(X, y, alpha=0.001, tol=1e-12, max_rounds=2)
    assert w[0].filename == __file__  # the warning names the caller's line
    assert not res.converged_ and res.n_rounds_ == 2 and res.gap_ > 1e-12
    # the figures describe the point returned (not the one before a last subproblem)
    W = res.coef_.T.toarray()
    assert res.primal_ == pytest.approx(_objective(X, y, W, res.intercept_, 0.001), rel=1e-12)


def test_an_intercept_refit_survives_a_class_whose_probabilities_underflow():
    """A class no row gives any probability (its decision values far below the others')
    leaves the intercepts' Hessian singular; the refit still makes the others optimal."""
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 3, 50)
    Z = rng.standard_normal((50, 4))
    Z[:, 3] = -1e4  # class 3: probability exp(-1e4) = 0 in every row
    Z2, b = Multinomial().fit_intercept(codes, Z, np.zeros(4))
    P = softmax(Z2, axis=1)
    g = (P.sum(axis=0) - np.bincount(codes, minlength=4)) / 50
    assert np.isfinite(b).all() and np.abs(g[:3]).max() <= 1e-12


def test_bad_inputs_are_refused_before_any_block_loads():
    X, y = _problem()
    with pytest.raises(ValidationError, match="at least two classes"):
        dl1.fit_multiclass(X, np.zeros(X.shape[0]), alpha=0.1)
    with pytest.raises(InvalidParameterError, match="penalty"):
        dl1.fit_multiclass(X, y, alpha=0.1, penalty="l2")
    with pytest.raises(InvalidParameterError, match="alpha"):
        dl1.fit_multiclass(X, y, alpha=-1.0)
    with pytest.raises(ValidationError, match=r"y\[3\] is nan"):
        dl1.fit_multiclass(X, np.where(np.arange(X.shape[0]) == 3, np.nan, y), alpha=0.1)


def test_the_working_set_doubles_past_each_blocks_first_candidates():
    """Each block offers as many candidates as the next working set may take: with a small
    ``ws_start`` the working set still doubles (``2 |support|``) round after round."""
    X, y = _problem(n=300, p=400, K=3, seed=11)
    data = load_labelled(as_dask(X, 2), y, None, "train", None, 2, None)
    assert len(data.blocks) == 2
    prob = data.problem(ElasticNet(0.002, 1.0), True)
    res = MulticlassWorkingSetSolver(tol=1e-8, ws_start=4).solve(prob)
    assert res.converged_
    supports = [h["support"] for h in res.history_]
    # a round may add up to the support again: more than the 2 x 4 first candidates
    assert max(np.diff(supports)) > 2 * 4


def test_a_working_set_its_solution_filled_grows_fourfold():
    """The binary growth rule: ``next_ws_size`` of the support and the last working set,
    4 times the support after a working set whose solution filled it, else twice."""
    from dl1.tasks.growth import next_ws_size

    X, y = _problem(n=300, p=600, K=3, seed=11)
    data = load_labelled(as_dask(X, 2), y, None, "train", None, 2, None)
    prob = data.problem(ElasticNet(0.0005, 1.0), True)
    res = MulticlassWorkingSetSolver(tol=1e-8, ws_start=8).solve(prob)
    assert res.converged_
    hist = [h for h in res.history_ if "ws_size" in h]
    last = 0
    for h in hist:
        assert h["ws_size"] == next_ws_size(h["support"], last, 8)  # p = 600: never capped
        last = h["ws_size"]
    sizes = [h["ws_size"] for h in hist]
    fast = [i for i in range(1, len(hist)) if hist[i]["support"] >= 0.9 * sizes[i - 1]]
    assert fast and all(sizes[i] >= min(4 * hist[i]["support"], 300) for i in fast)


def test_the_callback_sees_every_rounds_certified_point(capsys):
    X, y = _problem(seed=2)
    seen = []
    res = dl1.fit_multiclass(X, y, alpha=0.01, tol=1e-9, callback=seen.append, verbose=True)
    assert [e["round"] for e in seen] == list(range(res.n_rounds_))
    assert seen[-1]["gap"] == res.gap_ <= 1e-9 and seen[0]["gap"] > 1e-9
    assert capsys.readouterr().out.count("gap") == res.n_rounds_


def _rescaled_dual(X, y, W, b, alpha):
    """The dual value at ``Y - P`` rescaled uniformly into ``|X^T Theta| <= n alpha`` (pure
    L1; with an intercept optimal for ``W`` its classes' sums are 0), independently of dl1."""
    n, K = X.shape[0], W.shape[1]
    P = softmax(X @ W + b, axis=1)
    Y = np.eye(K)[y]
    c = min(1.0, n * alpha / np.abs(X.T @ (Y - P)).max())
    Q = c * P + (1 - c) * Y
    return -float((Q * np.log(np.where(Q > 0, Q, 1.0))).sum() / n)


@pytest.mark.parametrize("intercept", [False, True])
@pytest.mark.parametrize("tol", [1e-2, 1e-4, 1e-6])
def test_the_repaired_dual_point_is_a_lower_bound_tighter_than_rescaling(tol, intercept):
    """The L1 certificate repairs ``Y - P`` on the working set's columns before rescaling
    it: still below the optimum (scikit-learn's), above the uniformly rescaled one."""
    X, y = _problem(n=300, p=60, K=5, seed=3)
    alpha = 0.002
    sk = _sklearn(X, y, alpha, 1.0, intercept=intercept)
    best = _objective(X, y, sk.coef_.T, sk.intercept_, alpha)
    res = dl1.fit_multiclass(X, y, alpha=alpha, tol=tol, fit_intercept=intercept)
    assert res.converged_
    assert res.dual_ <= best + 1e-12 * best
    rescaled = _rescaled_dual(X, y, res.coef_.T.toarray(), res.intercept_, alpha)
    assert res.dual_ > rescaled
