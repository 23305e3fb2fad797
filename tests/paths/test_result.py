"""PathResult: construction, best alpha, flags, summary and PNG figures."""

import numpy as np
import pytest
import scipy.sparse as sp

from dl1.paths import PathCheckpoint, PathResult

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def arrays(n=8, p=30, seed=0, metrics=None):
    """A dict shaped like PathCheckpoint.load()."""
    rng = np.random.default_rng(seed)
    dense = np.where(rng.random((p, n)) < np.linspace(0.05, 0.6, n), rng.standard_normal((p, n)), 0)
    converged = np.ones(n, dtype=bool)
    converged[[2, 5] if n > 5 else []] = False
    return {
        "alphas": np.geomspace(1.0, 1e-2, n),
        "coefs": sp.csc_matrix(dense),
        "intercepts": rng.standard_normal(n),
        "gaps": np.where(converged, 1e-8, 1e-3),
        "converged": converged,
        "n_active": np.count_nonzero(dense, axis=0),
        "passes": np.full(n, 2.5),
        "seconds": np.full(n, 0.25),
        "rounds": np.arange(1, n + 1),
        "test_metrics": metrics or {},
        "extra": [None] * n,
    }


def make(loss="squared", **kw):
    return PathResult.from_checkpoint_arrays(arrays(**kw), l1_ratio=0.5, loss=loss, tol=1e-6)


def assert_pngs(files, names):
    assert [f.name for f in files] == names
    for f in files:
        data = f.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 5000, f


def test_construction_from_arrays():
    d = arrays()
    r = make()
    assert r.n_alphas == 8 and r.coefs_.format == "csc" and r.coefs_.shape == (30, 8)
    assert np.array_equal(r.coefs_.toarray(), d["coefs"].toarray())
    assert r.alphas_.dtype == np.float64 and r.converged_.dtype == bool
    assert r.n_active_.dtype == np.int64 and r.rounds_.dtype == np.int64
    assert (r.l1_ratio, r.loss, r.tol) == (0.5, "squared", 1e-6)
    assert r.test_mse_ is None and r.test_logloss_ is None and r.test_accuracy_ is None
    assert r.best_alpha_ is None and r.best_index_ is None and r.validation_error_ is None
    # a partial path: the grid is cut to the completed alphas
    d = arrays(n=3)
    del d["alphas"]
    r = PathResult.from_checkpoint_arrays(
        d, alphas=np.geomspace(1, 1e-2, 10), l1_ratio=1.0, loss="squared", tol=1e-6
    )
    assert np.array_equal(r.alphas_, np.geomspace(1, 1e-2, 10)[:3])


def test_inconsistent_arrays_and_unknown_loss_are_refused():
    d = arrays()
    d["gaps"] = d["gaps"][:-1]
    with pytest.raises(ValueError, match="gaps_"):
        PathResult.from_checkpoint_arrays(d, l1_ratio=1.0, loss="squared", tol=1e-6)
    with pytest.raises(ValueError, match="loss"):
        make(loss="cauchy")


def test_best_alpha_minimises_the_validation_error():
    mse = np.array([5.0, 4.0, np.nan, 1.5, 1.0, 1.0, 2.0, 3.0])
    r = make(metrics={"mse": mse})
    assert r.best_index_ == 4 and r.best_alpha_ == r.alphas_[4]  # first of the ties, NaN skipped
    logloss = np.array([0.7, 0.6, 0.5, 0.4, 0.45, 0.5, 0.6, 0.7])
    accuracy = np.array([0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.9, 0.9])
    r = make(loss="logistic", metrics={"logloss": logloss, "accuracy": accuracy})
    assert r.best_alpha_ == r.alphas_[3]  # by log-loss, not accuracy
    assert np.array_equal(r.test_accuracy_, accuracy) and r.test_mse_ is None
    assert make(metrics={"mse": np.full(8, np.nan)}).best_alpha_ is None


def test_non_certified_alphas_are_flagged_in_repr_and_summary():
    mse = np.linspace(3, 1, 8)
    r = make(metrics={"mse": mse})
    assert list(np.flatnonzero(~r.converged_)) == [2, 5]
    text = repr(r)
    assert "loss='squared'" in text and "n_alphas=8" in text and "certified=6/8" in text
    assert f"best_alpha={r.alphas_[7]:.4g}" in text and len(text) < 200
    lines = r.summary().splitlines()
    head = lines[0].split()
    assert head == ["k", "alpha", "nnz", "rel_gap", "certified", "passes", "seconds", "test_mse"]
    assert len(lines) == 10
    for k, line in enumerate(lines[1:9]):
        cells = line.split()
        assert int(cells[0]) == k and float(cells[1]) == pytest.approx(r.alphas_[k], rel=1e-4)
        assert int(cells[2]) == r.n_active_[k]
        assert cells[4] == ("NO" if k in (2, 5) else "yes")
        assert float(cells[7]) == pytest.approx(mse[k], rel=1e-5)
    assert lines[8].endswith(" *") and "6 certified, 2 not" in lines[-1]
    assert "best alpha" in lines[-1]
    logistic = make(loss="logistic", metrics={"logloss": mse, "accuracy": 1 - mse / 4})
    assert logistic.summary().splitlines()[0].split()[-2:] == ["test_logloss", "test_acc"]
    assert "test_mse" not in make().summary() and "best" not in make().summary()


@pytest.mark.slow
def test_plot_writes_png_files_with_and_without_test_metrics(tmp_path):
    assert_pngs(make().plot(tmp_path / "a"), ["coefficient_paths.png", "support_and_gap.png"])
    files = make(metrics={"mse": np.linspace(3, 1, 8)}).plot(tmp_path / "b")
    assert_pngs(files, ["coefficient_paths.png", "support_and_gap.png", "validation.png"])
    m = {"logloss": np.linspace(0.7, 0.3, 8), "accuracy": np.linspace(0.5, 0.9, 8)}
    files = make(loss="logistic", metrics=m).plot(tmp_path / "c")
    assert_pngs(files, ["coefficient_paths.png", "support_and_gap.png", "validation.png"])


def test_plot_shows_the_top_features_of_a_wide_path(tmp_path):
    r = make(p=400, n=6)
    C = r.coefs_.tocsr()
    peak = np.asarray(abs(C).max(axis=1).todense()).ravel()
    top = r._top_features()
    assert top.size == 50 and peak[top].min() >= np.sort(peak)[-50]
    assert_pngs(r.plot(tmp_path), ["coefficient_paths.png", "support_and_gap.png"])


@pytest.mark.parametrize("n", [0, 1])
def test_plot_and_summary_of_degenerate_paths(tmp_path, n):
    d = arrays(n=n, metrics={"mse": np.ones(n)})
    d["coefs"] = sp.csc_matrix((5, n))
    d["n_active"] = np.zeros(n, dtype=np.int64)
    d["gaps"] = np.zeros(n)  # exact solutions: nothing to draw on a log scale
    r = PathResult.from_checkpoint_arrays(d, l1_ratio=1.0, loss="squared", tol=1e-6)
    assert f"n_alphas={n}" in repr(r) and len(r.summary().splitlines()) == n + 2
    assert len(r.plot(tmp_path)) == 3


def test_from_a_checkpoint(tmp_path):
    alphas = np.geomspace(1.0, 0.1, 6)
    ck = PathCheckpoint.open_or_create(
        tmp_path / "ck", fingerprint={}, settings={}, alphas=alphas, n_features=4
    )
    for k in range(4):
        coef = np.array([0.0, 0.5 * k, 0.0, -0.1 * k])
        ck.record(
            k, coef=coef, intercept=1.0, gap=1e-9, converged=True, n_active=2 * (k > 0),
            passes=1.0, seconds=0.01, rounds=1, test_metric={"mse": 2.0 - k / 4}, extra=None,
        )  # fmt: skip
    r = PathResult.from_checkpoint_arrays(ck.load(), l1_ratio=1.0, loss="squared", tol=1e-8)
    assert np.array_equal(r.alphas_, alphas[:4]) and r.best_alpha_ == alphas[3]
    assert r.coefs_[3, 3] == pytest.approx(-0.3) and r.coefs_.nnz == 6


def test_the_best_alpha_at_an_end_of_the_grid_is_inside_the_plot():
    """Pass: a path whose best alpha is its smallest (a choice at the grid's edge) draws
    its best-alpha line strictly inside the validation plot's x-limits (it used to lie on
    the axes' border, invisible); every alpha is inside too."""
    r = make(metrics={"mse": np.linspace(3, 1, 8)})  # decreasing: the last alpha is best
    assert r.best_alpha_ == r.alphas_.min()
    fig = r._plot_validation()
    ax = fig.axes[0]
    right, left = ax.get_xlim()[1], ax.get_xlim()[0]  # alpha decreases to the right
    assert left > r.alphas_.max() and right < r.best_alpha_
    (line,) = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    assert right < line.get_xdata()[0] < left
