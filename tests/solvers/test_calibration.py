"""The sample-wise solvers' step calibration: defaults that need no tuning."""

from __future__ import annotations

import warnings
from dataclasses import replace

import dask
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.linear_model import Lasso

import dl1
from dl1.kernels.codes import SQUARED
from dl1.kernels.lazy import FORM_CODES, dense_pass, rows_loss
from dl1.solvers.calibration import (
    FACTORS,
    CalibrationSettings,
    partition_shares,
    sample_size,
)
from dl1.solvers.registry import SOLVERS as SOLVERS_BY_NAME
from dl1.solvers.result import ConvergenceWarning
from dl1.solvers.sgd import StochasticGradientSolver
from dl1.tasks.rows import assemble_rows
from dl1.tasks.stochastic import SGDSettings, SGDTrial, calibration_task, learning_rates
from tests.helpers import task_stream
from tests.kernel_helpers import LOSS_CODES

SOLVERS = ["sgd", "fobos", "rda", "smidas"]


def lasso_problem(kind: str, n=3000, p=2000, seed=0):
    """A sparse 3,000 x 2,000 Lasso problem: 1% dense (``base``), 2% dense with every column
    scaled by 100 (``columns_x100``), 2% dense with y scaled by 1e3 (``y_x1e3``), or 1% dense
    with column scales spread over e^-2 .. e^2 (``mixed_scales``, for the benchmarks); 40
    true features, 10% noise; alpha = alpha_max / 10."""
    rng = np.random.default_rng(seed)
    density = 0.02 if kind in ("columns_x100", "y_x1e3") else 0.01
    X = sp.random(n, p, density=density, format="csr", random_state=seed)
    w = np.zeros(p)
    w[rng.choice(p, 40, replace=False)] = rng.standard_normal(40)
    z = X @ w
    y = z + 0.1 * np.std(z) * rng.standard_normal(n)
    if kind == "columns_x100":
        X = X * 100.0
    elif kind == "y_x1e3":
        y = y * 1e3
    elif kind == "mixed_scales":
        X = sp.csr_matrix(X @ sp.diags(np.exp(rng.uniform(-2, 2, p))))
    return X, y, dl1.alpha_max(X, y) / 10


def lasso_optimum(X, y, alpha):
    """scikit-learn's Lasso objective at tol 1e-10, in dl1's scaling."""
    m = Lasso(alpha=alpha, tol=1e-10, max_iter=100_000).fit(X, y)
    r = y - X @ m.coef_ - m.intercept_
    return 0.5 * np.mean(r**2) + alpha * np.abs(m.coef_).sum()


def defaults(solver: str):
    """The solver with its defaults, 50 epochs, certified only after the last."""
    return SOLVERS_BY_NAME[solver](max_epochs=50, certify_every=0)


def fit_quietly(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return dl1.fit(*args, **kwargs)


@pytest.fixture(scope="module")
def problems():
    out = {}
    for kind in ("base", "columns_x100", "y_x1e3"):
        X, y, alpha = lasso_problem(kind)
        out[kind] = (X, y, alpha, lasso_optimum(X, y, alpha))
    return out


CASES = [(solver, kind) for solver in ("sgd", "fobos", "rda")
         for kind in ("base", "columns_x100", "y_x1e3")] + [("smidas", "y_x1e3")]


@pytest.mark.parametrize(("solver", "kind"), CASES)
def test_fifty_epochs_with_defaults_come_within_10_percent(problems, solver, kind):
    """Pass: in process, 50 epochs with every default (the step calibrated) give a Lasso
    objective within 10% of scikit-learn's optimum, on three generated problems (densities
    1% and 2%, columns scaled by 100, y scaled by 1e3); the step used and its calibration
    are recorded, the chosen candidate the lowest of the recorded sample objectives.
    SMIDAS, whose steps cost O(|supp theta|), runs on one here and another on the
    cluster below."""
    X, y, alpha, optimum = problems[kind]
    res = fit_quietly(X, y, alpha=alpha, solver=defaults(solver), tol=1e-12)
    assert res.primal_ <= 1.10 * optimum
    cal = res.history_[0]["calibration"]
    assert res.history_[0][cal.parameter] == cal.value
    assert cal.value == cal.candidates[int(np.argmin(cal.objectives))]


@pytest.mark.slow
def test_on_a_cluster_the_calibration_runs_on_the_workers(local_cluster, problems):
    """Pass: on a 2-worker LocalCluster, the solve distributed (not in one piece, 2
    partitions), 50 epochs with defaults of SGD, FoBoS, RDA and SMIDAS are within 10% of
    the optimum on the problem with columns scaled by 100, and every fit ran exactly one
    calibration task per partition, one on each worker (where its rows are). (That a
    cluster fit equals the in-process one with the same partitions, calibration included,
    is test_sgd's and test_samplewise's test_cluster_fit_equals_in_process_fit.)"""
    X, y, alpha, optimum = problems["columns_x100"]
    for solver in SOLVERS:
        kw = dict(alpha=alpha, solver=defaults(solver), tol=1e-12, n_partitions=2)
        with (
            dask.config.set({"dl1.one-piece": False}),
            task_stream(local_cluster) as ts,
        ):
            res = fit_quietly(X, y, client=local_cluster, **kw)
        assert res.primal_ <= 1.10 * optimum, solver
        workers = [e["worker"] for e in ts.data if "calibration_task" in str(e["key"])]
        assert len(workers) == 2 and len(set(workers)) == 2, workers


def test_a_given_step_skips_the_calibration_and_seeds_repeat_it():
    """Pass: a given ``eta0`` is used as it is (recorded, no calibration record); the same
    seed calibrates to the same step and coefficients; the calibration samples at most
    ``budget`` epochs' worth of steps (``len(FACTORS) * rows <= budget * n``)."""
    X, y, alpha = lasso_problem("base", n=2400, p=300, seed=1)
    kw = dict(alpha=alpha, max_epochs=3, tol=1e-12)
    given = fit_quietly(X, y, solver=StochasticGradientSolver(max_epochs=3, eta0=0.05), **kw)
    assert given.history_[0]["eta0"] == 0.05 and "calibration" not in given.history_[0]
    a = fit_quietly(X, y, solver="sgd", seed=4, **kw)
    b = fit_quietly(X, y, solver="sgd", seed=4, **kw)
    assert a.history_[0]["calibration"] == b.history_[0]["calibration"]._replace(
        seconds=a.history_[0]["calibration"].seconds)
    np.testing.assert_array_equal(a.coef_, b.coef_)
    cal = a.history_[0]["calibration"]
    budget = CalibrationSettings().budget
    m = sample_size(2400, len(FACTORS), CalibrationSettings())
    assert cal.sample_rows == sum(partition_shares([1200, 1200], m))
    assert cal.cost_epochs == len(FACTORS) * cal.sample_rows / 2400 <= budget


def test_the_sample_objective_is_the_dense_passes():
    """Pass: a partition's calibration figures equal an independent recomputation: the
    seeded rows drawn, one dense (O(d) per step) SGD pass over them in the trial's order
    with each candidate, then the loss summed in NumPy and the penalty, to 1e-10."""
    X, y, alpha = lasso_problem("base", n=400, p=50, seed=2)
    block = assemble_rows(0, 0, X)
    settings = SGDSettings("sgd", SQUARED, alpha, 0.0, True, 0.0, "invsqrt", 1.0 / 400)
    trial = SGDTrial(settings, np.zeros(50), float(y.mean()))
    candidates = [0.01, 0.1, 1.0]
    out = calibration_task([block], y, np.zeros(0), 60, trial, candidates, 7)
    draw = np.random.default_rng(7)
    draw.permutation(1)  # the order of the blocks the rows are drawn from
    rows = np.sort(draw.choice(400, size=60, replace=False))
    Xs, ys = X[rows], y[rows]
    order = np.random.default_rng(7)
    order.permutation(1)  # the block order of the trial's pass
    visit = order.permutation(60).astype(np.int64)
    for k, eta0 in enumerate(candidates):
        w = np.zeros(50)
        b, _ = dense_pass(Xs.indptr, Xs.indices, Xs.data, ys, np.ones(60), visit,
                          learning_rates(replace(settings, eta0=eta0), 0, 60),
                          w, float(y.mean()), True, alpha, 0.0, FORM_CODES["sgd"],
                          LOSS_CODES["squared"], 1.0)
        loss = 0.5 * np.sum((ys - Xs @ w - b) ** 2)
        assert out.losses[k] == pytest.approx(loss, rel=1e-10)
        assert out.penalties[k] == pytest.approx(alpha * np.abs(w).sum(), rel=1e-10)
    assert out.rows == 60


def test_rows_loss_is_numpys():
    """Pass: the kernel's weighted loss over CSR rows equals NumPy's for each loss."""
    rng = np.random.default_rng(3)
    X = sp.random(50, 20, density=0.3, format="csr", random_state=3)
    w, sw = rng.standard_normal(20), rng.random(50)
    y = np.where(rng.random(50) > 0.5, 1.0, -1.0)
    z = X @ w + 0.3
    m = y * z
    expected = {
        "squared": 0.5 * (y - z) ** 2,
        "logistic": np.logaddexp(0.0, -m),
        "hinge": np.maximum(0.0, 1.0 - m),
    }
    for loss, values in expected.items():
        got = rows_loss(X.indptr, X.indices, X.data, y, sw, w, 0.3, LOSS_CODES[loss], 1.0)
        assert got == pytest.approx(np.sum(sw * values), rel=1e-12)
