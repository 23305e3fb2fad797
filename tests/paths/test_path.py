"""dl1.path against scikit-learn's paths; checkpoint kill-and-resume; flags and plots."""

import os
import signal
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.linear_model import LogisticRegression, enet_path, lasso_path

import dl1
from tests.helpers import stop_path_after

REPO = Path(__file__).resolve().parents[2]


def make_data(n=150, p=80, seed=0):
    rng = np.random.default_rng(seed)
    X = sp.random(n, p, density=0.15, format="csc", random_state=rng)
    w = np.zeros(p)
    w[rng.choice(p, 10, replace=False)] = rng.standard_normal(10) * 2
    y = X @ w + 0.1 * rng.standard_normal(n)
    return X, y


def objective(X, y, coef, b, alpha, l1_ratio):
    r = y - X @ coef - b
    return 0.5 * np.mean(r**2) + alpha * (
        l1_ratio * np.abs(coef).sum() + (1 - l1_ratio) / 2 * coef @ coef
    )


@pytest.mark.parametrize("l1_ratio", [1.0, 0.5])
def test_path_matches_sklearn_paths(local_cluster, l1_ratio):
    X, y = make_data()
    res = dl1.path(
        X,
        y,
        n_alphas=30,
        eps=1e-2,
        l1_ratio=l1_ratio,
        tol=1e-10,
        fit_intercept=False,
        screen=l1_ratio == 1.0,
        client=local_cluster,
    )
    assert res.coefs_.shape == (80, 30)
    assert np.all(np.diff(res.alphas_) < 0)
    assert res.alphas_[0] == pytest.approx(
        dl1.alpha_max(X, y, l1_ratio=l1_ratio, fit_intercept=False), rel=1e-12
    )
    fn = lasso_path if l1_ratio == 1 else enet_path
    kw = {} if l1_ratio == 1 else {"l1_ratio": l1_ratio}
    _, ref, _ = fn(X, y, alphas=res.alphas_, tol=1e-12, max_iter=100_000, **kw)
    dense = res.coefs_.toarray()
    for k, a in enumerate(res.alphas_):
        ours = objective(X, y, dense[:, k], 0.0, a, l1_ratio)
        theirs = objective(X, y, ref[:, k], 0.0, a, l1_ratio)
        assert abs(ours - theirs) <= 1e-6 * theirs, k
    assert res.converged_.all() and (res.gaps_ <= 1e-10).all()
    assert not dense[:, 0].any()  # alpha_max: all zero
    np.testing.assert_array_equal(res.n_active_, (dense != 0).sum(0))
    assert (res.passes_ >= 1).all()


def test_logistic_path_matches_sklearn():
    rng = np.random.default_rng(3)
    X = sp.random(120, 30, density=0.25, format="csc", random_state=rng)
    y = np.where(X @ rng.standard_normal(30) + 0.3 * rng.standard_normal(120) > 0, 1.0, -1.0)
    res = dl1.path(X, y, loss="logistic", n_alphas=6, eps=0.05, tol=1e-10, fit_intercept=False)
    n = X.shape[0]
    for k, a in enumerate(res.alphas_[1:], start=1):
        clf = LogisticRegression(
            l1_ratio=1.0,
            C=1 / (n * a),
            solver="liblinear",
            fit_intercept=False,
            tol=1e-12,
            max_iter=100_000,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            clf.fit(X, y)

        def obj(c, a=a):
            return np.mean(np.logaddexp(0, -y * (X @ c))) + a * np.abs(c).sum()

        ours, theirs = obj(res.coefs_[:, k].toarray().ravel()), obj(clf.coef_.ravel())
        assert ours <= theirs * (1 + 1e-6) and abs(ours - theirs) <= 1e-6 * theirs


def test_test_metrics_best_alpha_and_plots(tmp_path):
    X, y = make_data(n=300, seed=1)
    Xtr, ytr, Xte, yte = X[:200], y[:200], X[200:], y[200:]
    res = dl1.path(Xtr, ytr, n_alphas=12, X_test=Xte, y_test=yte, tol=1e-8)
    dense = res.coefs_.toarray()
    mse = [np.mean((yte - Xte @ dense[:, k] - res.intercepts_[k]) ** 2) for k in range(12)]
    np.testing.assert_allclose(res.test_mse_, mse, rtol=1e-10)
    assert res.best_alpha_ == res.alphas_[int(np.argmin(mse))]
    files = res.plot(tmp_path / "plots")
    assert files and all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in files)


def test_uncertified_alpha_is_flagged_and_named():
    X, y = make_data(seed=2)
    with pytest.warns(dl1.ConvergenceWarning, match=r"alpha\[\d+\] = .* is not certified"):
        res = dl1.path(X, y, n_alphas=5, tol=1e-10, max_rounds=0)
    assert not res.converged_.all()
    assert (res.gaps_[~res.converged_] > 1e-10).all()


def _child_script(store, ck, kill_after):
    return textwrap.dedent(
        f"""
        import os, signal, sys
        import dl1
        def cb(k, alpha, res):
            if k == {kill_after}:
                os.kill(os.getpid(), signal.SIGKILL)
        dl1.path({str(store)!r}, n_alphas=15, tol=1e-9, checkpoint={str(ck)!r}, callback=cb)
        """
    )


@pytest.mark.slow
def test_kill_and_resume_is_bit_identical(tmp_path):
    X, y = make_data(n=200, p=120, seed=4)
    store = tmp_path / "s.zarr"
    dl1.from_scipy(X, y, store, n_feature_blocks=3)
    reference = dl1.path(store, n_alphas=15, tol=1e-9)
    ck = tmp_path / "ck.zarr"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", _child_script(store, ck, 6)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    resumed = dl1.path(store, n_alphas=15, tol=1e-9, checkpoint=ck)
    assert (resumed.coefs_ != reference.coefs_).nnz == 0
    np.testing.assert_array_equal(resumed.intercepts_, reference.intercepts_)
    np.testing.assert_array_equal(resumed.gaps_, reference.gaps_)
    # a checkpoint of other settings is refused, naming the field
    with pytest.raises(Exception, match="tol"):
        dl1.path(store, n_alphas=15, tol=1e-8, checkpoint=ck)


def test_last_pass_of_an_alpha_is_the_first_of_the_next():
    """Without screening (Lasso), an alpha's certifying pass is reused by the next alpha:
    every alpha but the first reads the data once per round and not once more."""
    X, y = make_data(n=150, p=90, seed=8)
    res = dl1.path(X, y, n_alphas=12, eps=0.05, tol=1e-8)
    assert res.converged_.all()
    np.testing.assert_array_equal(res.passes_[1:], res.rounds_[1:].astype(float))
    assert res.passes_[0] == res.rounds_[0] + 1
    # with screening the pass is not reusable (it skipped screened columns): one more read
    scr = dl1.path(X, y, n_alphas=12, eps=0.05, tol=1e-8, screen=True)
    assert (scr.passes_[1:] > scr.rounds_[1:] - 1e-12).all()


def _gram_cache_size() -> int:
    from dl1.tasks.gram import GRAM_CACHE

    return len(GRAM_CACHE)


def _clear_gram_cache() -> None:
    from dl1.tasks.gram import GRAM_CACHE

    GRAM_CACHE.clear()


def test_workers_forget_gram_matrices_after_fit_and_path(local_cluster, monkeypatch):
    """The working-set Gram matrices the workers keep between rounds are dropped when the
    fit or path ends (a long-lived worker does not keep hundreds of MiB per past solve)."""
    from dl1.tasks import subproblem

    # earlier tests' solves run without an entry point (tests.solving.solve_ws) leave theirs
    local_cluster.run(_clear_gram_cache)
    X, y = make_data(p=400, seed=3)  # wider than a first working set: several rounds
    amax = dl1.alpha_max(X, y)
    seen = []
    orig = subproblem.working_set_gram
    with monkeypatch.context() as patch:
        # in process: a Gram matrix is cached during the solve, none is left after it
        patch.setattr(
            subproblem, "working_set_gram",
            lambda *a: seen.append(_gram_cache_size()) or orig(*a),
        )  # fmt: skip
        res = dl1.fit(X, y, alpha=amax / 20, tol=1e-8)
        assert res.converged_ and len(seen) >= 2 and max(seen) >= 1
    assert _gram_cache_size() == 0
    dl1.fit(X, y, alpha=amax / 20, tol=1e-8, client=local_cluster)
    dl1.path(X, y, n_alphas=10, tol=1e-8, client=local_cluster)
    assert set(local_cluster.run(_gram_cache_size).values()) == {0}


@pytest.mark.parametrize(
    ("loss", "fit_intercept"), [("squared", True), ("squared", False), ("logistic", True)]
)
@pytest.mark.slow
def test_sequential_screening_is_safe_and_screens_from_the_first_pass(
    monkeypatch, loss, fit_intercept
):
    """Between alphas, the first pass of an alpha applies the gap-safe sphere of the previous
    alpha's solution: no feature of the exact solution is ever screened, the bound behind the
    sphere's rescaling holds over all columns (recomputed in NumPy), and the first pass
    already leaves most columns out."""
    import dl1.solvers.ws as W

    rng = np.random.default_rng(21)
    X, y = make_data(n=200, p=300, seed=21)
    if loss == "logistic":
        y = np.where(y > np.median(y), 1.0, -1.0)
    sw = rng.uniform(0.5, 2.0, X.shape[0])
    seen = []
    orig = W.sequential_sphere

    def spy(problem, z, w, max_s, seed):
        seen.append((seed.xt_bound, np.abs(X.T @ seed.theta).max()))
        return orig(problem, z, w, max_s, seed)

    monkeypatch.setattr(W, "sequential_sphere", spy)
    first_alive, screened = [], []
    res = dl1.path(
        X,
        y,
        n_alphas=20,
        eps=0.05,
        tol=1e-10,
        loss=loss,
        fit_intercept=fit_intercept,
        sample_weight=sw,
        screen=True,
        callback=lambda k, a, r: (
            first_alive.append(r.history_[0]["alive"]),
            screened.append(r.screened_.copy()),
        ),
    )
    assert res.converged_.all()
    assert len(seen) == 19
    for bound, exact in seen:
        assert bound >= exact * (1 - 1e-12)
    # the sequential sphere acts in the first pass of an alpha (its first alpha: all columns)
    assert first_alive[0] == X.shape[1]
    if loss == "squared":
        assert np.median(first_alive[1:]) < X.shape[1] / 2
    else:  # the nearly separable logistic path soon activates most features
        assert first_alive[1] < X.shape[1] / 4
    for k, alpha in enumerate(res.alphas_):
        ref = dl1.fit(
            X,
            y,
            alpha=alpha,
            loss=loss,
            tol=1e-10,
            max_rounds=200_000,
            fit_intercept=fit_intercept,
            sample_weight=sw,
            solver="cd",
        )
        support = np.abs(ref.coef_) > 1e-9
        assert not (screened[k] & support).any(), k
        np.testing.assert_allclose(res.coefs_[:, k].toarray().ravel(), ref.coef_, atol=1e-4)


def test_screened_path_resumes_bit_identical(tmp_path):
    """With screening, the checkpoint keeps what seeds the next alpha's sequential sphere:
    an interrupted screened path resumes to the bits of an uninterrupted one."""
    X, y = make_data(n=200, p=120, seed=5)
    kw = dict(n_alphas=12, tol=1e-9, screen=True)
    # uninterrupted, with its own checkpoint: each alpha's subproblem starts its Gram matrix
    # afresh, as a resumed one must (BLAS rounds an entry differently in products of other
    # shapes, so a path without checkpoint, whose Gram matrix spans alphas, agrees to
    # rounding only; compared below)
    reference = dl1.path(X, y, checkpoint=tmp_path / "ref.zarr", **kw)

    ck = tmp_path / "ck.zarr"
    stop_path_after(5, X, y, checkpoint=ck, **kw)
    resumed = dl1.path(X, y, checkpoint=ck, **kw)
    assert (resumed.coefs_ != reference.coefs_).nnz == 0
    np.testing.assert_array_equal(resumed.intercepts_, reference.intercepts_)
    np.testing.assert_array_equal(resumed.gaps_, reference.gaps_)
    np.testing.assert_array_equal(resumed.passes_, reference.passes_)
    plain = dl1.path(X, y, **kw)
    np.testing.assert_allclose(plain.coefs_.toarray(), resumed.coefs_.toarray(), atol=1e-8)
    np.testing.assert_allclose(plain.intercepts_, resumed.intercepts_, atol=1e-8)
