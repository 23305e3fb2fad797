"""One-vs-rest (dl1.fit_multiclass(multi_class="ovr")) against scikit-learn per class, a dense
LP reference for the hinge and the binary dl1.fit; each class certified; every pass shared
by all classes; in process, on a 2-worker cluster and streamed from a store."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import linprog
from sklearn.linear_model import LogisticRegression
from sklearn.svm import LinearSVC

import dl1
import dl1.solvers.ovr as ovr_module
from dl1.errors import ValidationError
from dl1.kernels.screen import top_scores
from dl1.params import InvalidParameterError
from dl1.tasks.blocks import Block
from dl1.tasks.ovr import ovr_scan_task
from dl1.tasks.passes import scan_task
from tests.test_penalised import as_dask


def _problem(n=240, p=70, K=4, seed=0, density=0.2, scale=3.0, share=0.2):
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=density, random_state=seed + 1, format="csc")
    W = rng.standard_normal((p, K)) * (rng.random((p, 1)) < share) * scale
    y = np.argmax(X @ W + rng.gumbel(size=(n, K)), axis=1)
    return X, y


def _phi(loss, m):
    """The binary losses of the margin ``m = y z``, written independently of dl1."""
    if loss == "logistic":
        return np.logaddexp(0.0, -m)
    hinge = np.maximum(0.0, 1.0 - m)
    return hinge**2 if loss == "squared_hinge" else hinge


def _objective(loss, X, yk, w, b, alpha, l1_ratio=1.0, s=None):
    """Class k's binary objective (labels ``yk`` in +-1), weights ``s`` summing to n."""
    s = np.ones(X.shape[0]) if s is None else s
    m = yk * (X @ w + b)
    pen = l1_ratio * np.abs(w).sum() + 0.5 * (1 - l1_ratio) * (w @ w)
    return float(np.mean(s * _phi(loss, m)) + alpha * pen)


def _relabel(y, k):
    return np.where(y == k, 1.0, -1.0)


def _saga(X, yk, alpha, l1_ratio, intercept, solver="saga"):
    """scikit-learn's binary L1 / elastic-net logistic regression, ``C = 1 / (n alpha)``.

    liblinear meets tol 1e-8 here in 15 iterations with tol 1e-13's objective to 15 digits;
    at 1e-13 it takes thousands (16 s)."""
    tol = 1e-8 if solver == "liblinear" else 1e-13
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # saga's own convergence warning at max_iter
        clf = LogisticRegression(l1_ratio=l1_ratio, solver=solver, C=1 / (X.shape[0] * alpha),
                                 tol=tol, max_iter=200000,
                                 fit_intercept=intercept).fit(X, yk)  # fmt: skip
    return clf.coef_.ravel(), float(clf.intercept_[0]) if intercept else 0.0


def _check_class(res, k, loss, X, y, alpha, l1_ratio, w_ref, b_ref):
    """Class k certified, its objective the record's, and the reference's within 1e-6."""
    yk = _relabel(y, k)
    ours = _objective(loss, X, yk, res.coef_[k].toarray().ravel(), res.intercept_[k], alpha,
                      l1_ratio)  # fmt: skip
    theirs = _objective(loss, X, yk, w_ref, b_ref, alpha, l1_ratio)
    assert res.gaps_[k] <= res.tol and res.converged_classes_[k]
    assert res.primals_[k] == pytest.approx(ours, rel=1e-12)
    ulp = 1e-13 * ours  # the gap at the optimum is rounding, of either sign
    assert res.duals_[k] <= theirs + ulp  # the certificate is a true lower bound
    assert ours <= theirs + max(res.primals_[k] - res.duals_[k], 0.0) + ulp  # theirs >= opt
    assert abs(theirs - ours) <= 1e-6 * ours


@pytest.mark.parametrize("l1_ratio, intercept, solver", [
    (1.0, True, "saga"), (0.5, True, "saga"), (1.0, False, "liblinear"),
])  # fmt: skip
def test_ovr_logistic_matches_scikit_learn_per_class(l1_ratio, intercept, solver):
    X, y = _problem()
    alpha = 0.01
    res = dl1.fit_multiclass(X, y, alpha=alpha, l1_ratio=l1_ratio, multi_class="ovr",
                             loss="logistic", tol=1e-10, fit_intercept=intercept)  # fmt: skip
    assert isinstance(res, ovr_module.OvrResult)
    assert res.converged_ and res.gap_ == res.gaps_.max() <= 1e-10
    assert res.coef_.shape == (4, 70) and res.intercept_.shape == (4,)
    np.testing.assert_array_equal(res.classes_, np.arange(4))
    if not intercept:
        assert not res.intercept_.any()
    for k in range(4):
        w_ref, b_ref = _saga(X, _relabel(y, k), alpha, l1_ratio, intercept, solver)
        _check_class(res, k, "logistic", X, y, alpha, l1_ratio, w_ref, b_ref)


def test_ovr_squared_hinge_matches_liblinear_per_class():
    X, y = _problem(seed=4)
    alpha = 0.005
    res = dl1.fit_multiclass(X, y, alpha=alpha, multi_class="ovr", loss="squared_hinge",
                             tol=1e-11, fit_intercept=False)  # fmt: skip
    assert res.converged_ and res.loss == "squared_hinge"
    for k in range(4):
        svc = LinearSVC(penalty="l1", loss="squared_hinge", dual=False, fit_intercept=False,
                        C=1.0 / (X.shape[0] * alpha), tol=1e-10, max_iter=100_000)  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # liblinear may stop on its iteration count
            w_ref = svc.fit(X, _relabel(y, k)).coef_.ravel()
        _check_class(res, k, "squared_hinge", X, y, alpha, 1.0, w_ref, 0.0)


def _hinge_lp(X, yk, alpha):
    """The L1 hinge with a free intercept as one dense LP over every column (Zhu et al.'s
    1-norm SVM): ``min alpha 1^T (u + v) + 1^T xi / n``, ``xi >= 1 - y (X (u - v) + b)``."""
    Xd = X.toarray()
    n, p = Xd.shape
    yX = yk[:, None] * Xd
    A = np.hstack([-yX, yX, -yk[:, None], -np.eye(n)])
    cost = np.concatenate([np.full(2 * p, alpha), [0.0], np.full(n, 1.0 / n)])
    bounds = [(0, None)] * (2 * p) + [(None, None)] + [(0, None)] * n
    sol = linprog(cost, A_ub=A, b_ub=-np.ones(n), bounds=bounds, method="highs")
    assert sol.status == 0
    return sol.x[:p] - sol.x[p : 2 * p], float(sol.x[2 * p])


def test_ovr_hinge_matches_a_dense_lp_per_class():
    X, y = _problem(n=120, p=40, K=3, seed=6)
    alpha = 0.01
    res = dl1.fit_multiclass(X, y, alpha=alpha, multi_class="ovr", loss="hinge", tol=1e-9)
    assert res.converged_
    for k in range(3):
        w_ref, b_ref = _hinge_lp(X, _relabel(y, k), alpha)
        _check_class(res, k, "hinge", X, y, alpha, 1.0, w_ref, b_ref)


@pytest.mark.parametrize("loss", ["logistic", "squared_hinge"])
def test_two_classes_give_the_binary_fit(loss):
    X, y = _problem(n=200, p=300, K=2, seed=8, density=0.05, scale=6.0, share=0.05)
    kw = dict(alpha=0.003, loss=loss, tol=1e-10)
    res = dl1.fit_multiclass(X, y, multi_class="ovr", **kw)
    binary = dl1.fit(X, _relabel(y, 1), **kw)
    assert res.converged_ and binary.converged_
    # class 1 against class 0 is the binary problem; class 0's is its mirror image
    np.testing.assert_allclose(res.coef_[1].toarray().ravel(), binary.coef_, atol=1e-7)
    np.testing.assert_allclose(res.coef_[0].toarray().ravel(), -binary.coef_, atol=1e-7)
    np.testing.assert_allclose(res.intercept_, [-binary.intercept_, binary.intercept_],
                               atol=1e-7)  # fmt: skip
    assert res.primals_ == pytest.approx([binary.primal_] * 2, rel=1e-10)
    assert res.n_rounds_ == binary.n_rounds_  # the binary solver's rounds, shared


def test_two_class_hinge_gives_the_smoothing_solvers_lp_fit():
    X, y = _problem(n=150, p=200, K=2, seed=9, density=0.05, scale=6.0, share=0.05)
    kw = dict(alpha=0.005, loss="hinge", tol=1e-9)
    res = dl1.fit_multiclass(X, y, multi_class="ovr", **kw)
    binary = dl1.fit(X, _relabel(y, 1), solver="smoothing", **kw)
    np.testing.assert_allclose(res.coef_[1].toarray().ravel(), binary.coef_, atol=1e-8)
    assert res.intercept_[1] == pytest.approx(binary.intercept_, abs=1e-8)
    assert res.gaps_[1] == pytest.approx(binary.gap_, abs=1e-12)


@pytest.mark.parametrize("loss", ["logistic", "squared_hinge", "hinge"])
def test_one_pass_a_round_serves_every_class(loss, monkeypatch):
    """The passes: one scan per partition and round for all classes (counted), each class
    certified at the round its own binary fit is, so K classes take the rounds of the
    slowest binary fit, within 3x of any one binary fit."""
    X, y = _problem(n=500, p=2000, K=5, seed=3, density=0.02, scale=6.0, share=0.05)
    calls = []

    def counted(blocks, offsets, theta, *args):
        calls.append(theta.shape[1])
        return ovr_scan_task(blocks, offsets, theta, *args)

    monkeypatch.setattr(ovr_module, "ovr_scan_task", counted)
    kw = dict(alpha=0.002, loss=loss, tol=1e-8)
    res = dl1.fit_multiclass(X, y, multi_class="ovr", n_partitions=2, **kw)
    assert res.converged_
    assert len(calls) == 2 * (res.n_rounds_ + 1) == 2 * res.n_passes_
    assert calls[0] == calls[1] == 5  # the first pass: every class at once
    solver = "smoothing" if loss == "hinge" else "ws"
    binary = [dl1.fit(X, _relabel(y, k), solver=solver, **kw) for k in range(5)]
    rounds = np.array([b.n_rounds_ for b in binary])
    assert res.n_rounds_ >= 2  # working sets grew: a test of the rounds, not of one pass
    np.testing.assert_array_equal(res.rounds_, rounds)
    assert res.n_rounds_ + 1 <= 3 * (rounds.min() + 1)  # the goal: 3x one binary fit
    # a certified class leaves the later passes
    assert sorted(calls[::2], reverse=True) == calls[::2]


def _weighted_problem():
    X, y = _problem(n=150, p=40, K=3, seed=7)
    w = np.random.default_rng(8).integers(0, 4, X.shape[0]).astype(float)
    return X, y, w


@pytest.mark.parametrize("loss", ["logistic", "squared_hinge", "hinge"])
def test_integer_weights_fit_as_repeated_rows(loss):
    X, y, w = _weighted_problem()
    keep = np.repeat(np.arange(X.shape[0]), w.astype(int))
    kw = dict(alpha=0.01, multi_class="ovr", loss=loss, tol=1e-11)
    weighted = dl1.fit_multiclass(X, y, sample_weight=w, **kw)
    repeated = dl1.fit_multiclass(X[keep], y[keep], **kw)
    unweighted = dl1.fit_multiclass(X, y, **kw)
    assert weighted.converged_ and repeated.converged_
    np.testing.assert_allclose(weighted.primals_, repeated.primals_, rtol=1e-9)
    assert np.abs(unweighted.primals_ - weighted.primals_).max() > 1e-3  # the weights matter
    if loss != "hinge":  # an LP's optimum need not be unique; its value is
        np.testing.assert_allclose(weighted.coef_.toarray(), repeated.coef_.toarray(),
                                   atol=1e-6)  # fmt: skip
        np.testing.assert_allclose(weighted.intercept_, repeated.intercept_, atol=1e-6)
    with pytest.raises(ValidationError, match="class 1 has no sample of positive weight"):
        dl1.fit_multiclass(X, y, sample_weight=np.where(y == 1, 0.0, 1.0), **kw)


def test_weighted_logistic_matches_scikit_learn_per_class():
    X, y, w = _weighted_problem()
    alpha = 0.01
    res = dl1.fit_multiclass(X, y, sample_weight=w, alpha=alpha, multi_class="ovr", tol=1e-11)
    s = w * X.shape[0] / w.sum()  # dl1's normalisation: the weights sum to n
    for k in range(3):
        yk = _relabel(y, k)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sk = LogisticRegression(l1_ratio=1.0, solver="saga", C=1 / (w.sum() * alpha),
                                    tol=1e-13, max_iter=200000)  # fmt: skip
            sk.fit(X, yk, sample_weight=w)
        ours = _objective("logistic", X, yk, res.coef_[k].toarray().ravel(),
                          res.intercept_[k], alpha, s=s)  # fmt: skip
        theirs = _objective("logistic", X, yk, sk.coef_.ravel(), sk.intercept_[0], alpha, s=s)
        assert res.primals_[k] == pytest.approx(ours, rel=1e-12)
        assert res.duals_[k] <= theirs + 1e-13 * ours
        assert abs(ours - theirs) <= 1e-6 * ours


def test_distributed_and_streamed_fits_give_the_in_process_answer(local_cluster, tmp_path):
    X, y = _problem(n=200, p=400, K=3, seed=5, density=0.05, scale=6.0, share=0.05)
    store = dl1.from_scipy(X, y.astype(float), tmp_path / "ovr.zarr")
    for loss in ("logistic", "hinge"):
        kw = dict(alpha=0.004, tol=1e-10, multi_class="ovr", loss=loss)
        local = dl1.fit_multiclass(X, y, **kw)
        remote = dl1.fit_multiclass(as_dask(X, 5), y, client=local_cluster, **kw)
        streamed = dl1.fit_multiclass(store, client=local_cluster, stream=True, **kw)
        in_memory_store = dl1.fit_multiclass(store, client=local_cluster, stream=False, **kw)
        assert local.converged_ and local.coef_.nnz > 0
        for res in (remote, streamed, in_memory_store):
            assert res.converged_ and (res.gaps_ <= 1e-10).all()
            np.testing.assert_allclose(res.coef_.toarray(), local.coef_.toarray(), atol=1e-7)
            np.testing.assert_allclose(res.intercept_, local.intercept_, atol=1e-7)
        np.testing.assert_array_equal(streamed.classes_, [0.0, 1.0, 2.0])
        assert remote.n_passes_ == remote.n_rounds_ + 1  # a scan a round, for all classes
        assert streamed.n_passes_ > streamed.n_rounds_ + 1  # extraction re-reads blocks


def test_string_labels_are_encoded_sorted():
    X, y = _problem(K=3, seed=3)
    names = np.array(["spam", "eggs", "ham"])[y]
    kw = dict(alpha=0.02, tol=1e-8, multi_class="ovr", loss="squared_hinge")
    res = dl1.fit_multiclass(X, names, **kw)
    np.testing.assert_array_equal(res.classes_, ["eggs", "ham", "spam"])
    ref = dl1.fit_multiclass(X, np.searchsorted(["eggs", "ham", "spam"], names), **kw)
    np.testing.assert_array_equal(res.coef_.toarray(), ref.coef_.toarray())


def test_a_bound_that_stops_the_fit_warns_naming_the_classes():
    X, y = _problem(n=500, p=2000, K=4, seed=3, density=0.02, scale=6.0, share=0.05)
    with pytest.warns(dl1.ConvergenceWarning, match=r"classes above tol 1e-12 .* 0 \(") as w:
        res = dl1.fit_multiclass(X, y, alpha=0.001, tol=1e-12, max_rounds=1,
                                 multi_class="ovr")  # fmt: skip
    assert w[0].filename == __file__  # the warning names the caller's line
    assert not res.converged_ and res.n_rounds_ == 1 and res.gap_ > 1e-12
    assert len(res.history_) == 2 and res.history_[-1]["gap"] == res.gap_


def test_bad_inputs_are_refused_before_any_block_loads():
    X, y = _problem()
    ovr = dict(alpha=0.1, multi_class="ovr")
    with pytest.raises(InvalidParameterError, match="multi_class"):
        dl1.fit_multiclass(X, y, alpha=0.1, multi_class="ova")
    with pytest.raises(InvalidParameterError, match="'loss' parameter"):
        dl1.fit_multiclass(X, y, loss="squared", **ovr)
    with pytest.raises(ValidationError, match="needs multi_class='ovr'"):
        dl1.fit_multiclass(X, y, alpha=0.1, loss="hinge")
    with pytest.raises(ValidationError, match="'grouped' is multinomial only"):
        dl1.fit_multiclass(X, y, penalty="grouped", **ovr)
    with pytest.raises(ValidationError, match="hinge takes the pure L1 penalty"):
        dl1.fit_multiclass(X, y, loss="hinge", l1_ratio=0.5, **ovr)
    with pytest.raises(ValidationError, match="at least two classes"):
        dl1.fit_multiclass(X, np.zeros(X.shape[0]), **ovr)
    with pytest.raises(ValidationError, match=r"y\[3\] is nan"):
        dl1.fit_multiclass(X, np.where(np.arange(X.shape[0]) == 3, np.nan, y), **ovr)


def test_the_shared_scan_equals_the_binary_pass_class_by_class():
    """ovr_scan_task's column k is scan_task with theta[:, k]: same statistics, same
    candidates and scores (each class's support excluded)."""
    rng = np.random.default_rng(11)
    mask = np.ones(300)
    mask[7] = 0.0  # an empty column never joins
    X = sp.csc_matrix(sp.random(60, 300, density=0.1, random_state=12) @ sp.diags(mask))
    X.eliminate_zeros()
    sq = np.asarray(X.multiply(X).sum(axis=0)).ravel()
    block = Block(0, X.indptr.astype(np.int64), X.indices.astype(np.int32), X.data,
                  np.zeros(0), sq, 60)  # fmt: skip
    theta = rng.standard_normal((60, 3))
    supports = [np.array([3, 150, 299]), np.zeros(0, np.int64), np.arange(0, 300, 7)]
    out = ovr_scan_task([block], [1000], theta, 0.8, [s + 1000 for s in supports],
                        [5, 40, 300])  # fmt: skip
    for k in range(3):
        (ref,) = scan_task([block], theta[:, k].copy(), 0.8, [(supports[k], np.ones(1))],
                           [5, 40, 300][k]).blocks  # fmt: skip
        got = out.blocks[0][k]
        assert got.stats == pytest.approx(ref.stats, rel=1e-12)
        np.testing.assert_array_equal(got.candidates, ref.candidates)
        np.testing.assert_allclose(got.scores, ref.scores, rtol=1e-12)
        # and both against NumPy: |X^T theta| - threshold, the support and empty out
        c = np.abs(X.T @ theta[:, k]) - 0.8
        c[supports[k]] = -np.inf
        c[sq == 0] = -np.inf
        np.testing.assert_array_equal(got.candidates, top_scores(c, [5, 40, 300][k]))
        assert got.stats.absmax == pytest.approx(np.abs(X.T @ theta[:, k]).max(), rel=1e-12)
