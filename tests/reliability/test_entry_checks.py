"""Data refused where it enters, the same way for every solver and loss: values whose
squares leave float64, and classification labels of one class with an intercept.

Every test states its pass criterion.
"""

import dask
import numpy as np
import pytest
import scipy.sparse as sp

import dl1
from dl1.errors import ValidationError
from dl1.solvers.registry import SOLVERS
from tests.helpers import random_csr

N, P = 60, 12
ROW, COL = 7, 3
#: The loss each solver is tried with: the squared loss, the hinge for the solver of the hinge.
SOLVER_LOSS = {name: "hinge" if name == "smoothing" else "squared" for name in SOLVERS}
#: Pairs (loss, solver) of the classification losses with a solver taking them.
CLASSIFICATION = [
    ("logistic", "ws"), ("logistic", "cd"), ("logistic", "sdca"), ("logistic", "sgd"),
    ("logistic", "fobos"), ("logistic", "rda"), ("logistic", "smidas"),
    ("hinge", "smoothing"), ("hinge", "sdca"), ("hinge", "sgd"), ("hinge", "rda"),
    ("smooth_hinge", "ws"), ("smooth_hinge", "cd"), ("smooth_hinge", "sdca"),
    ("smooth_hinge", "smidas"), ("squared_hinge", "ws"), ("squared_hinge", "cd"),
]  # fmt: skip


def data(loss, values=((ROW, COL, 1e200),)):
    """An 60 x 12 CSR matrix with ``values`` put in, and targets for ``loss``."""
    X = sp.lil_matrix(random_csr(N, P, 0.3, seed=3))
    for r, c, v in values:
        X[r, c] = v
    rng = np.random.default_rng(4)
    y = rng.standard_normal(N) if loss == "squared" else np.where(np.arange(N) % 3, 1.0, -1.0)
    return sp.csr_matrix(X), y


def overflow_match(solver):
    """What the refusal of the 1e200 at (ROW, COL) says: the column, the problem and the
    value; the row too where the data enters as rows."""
    where = f", row {ROW}" if SOLVERS[solver].layout == "rows" else ""
    return (rf"column {COL}\b.*its sum of squares overflows float64 \(largest value "
            rf"1e\+200{where}")  # fmt: skip


@pytest.mark.parametrize("solver", sorted(SOLVERS))
def test_overflowing_value_is_refused_by_every_solver(solver):
    """Pass: a CSR matrix holding 1e200 is refused by every solver with the ValidationError
    of the working-set solver (naming the column, that its sum of squares overflows float64
    and the value; the sample-wise solvers, which load rows, also name the row). Before:
    ws and cd refused it, sdca, rda and smidas returned an all-NaN model with a
    ConvergenceWarning and sgd returned zeros."""
    X, y = data(SOLVER_LOSS[solver])
    with pytest.raises(ValidationError, match=overflow_match(solver)):
        dl1.fit(X, y, alpha=0.01, loss=SOLVER_LOSS[solver], solver=solver, max_epochs=2)


@pytest.mark.parametrize("loss,solver", CLASSIFICATION[::2])
def test_overflowing_value_is_refused_for_every_loss(loss, solver):
    """Pass: the same refusal with the classification losses (one solver each way)."""
    X, y = data(loss)
    with pytest.raises(ValidationError, match=overflow_match(solver)):
        dl1.fit(X, y, alpha=0.01, loss=loss, solver=solver, max_epochs=2)


@pytest.mark.parametrize("solver", ["ws", "sdca"])
def test_underflowing_column_is_refused_by_both_layouts(solver):
    """Pass: a column whose only value is 1e-170 (its square is below the smallest normal
    float64) is refused, naming the column, by a column-wise and a sample-wise solver."""
    X, y = data("squared", ())
    X = sp.lil_matrix(X)
    X[:, COL] = 0.0
    X[ROW, COL] = 1e-170
    with pytest.raises(ValidationError, match=rf"column {COL}\b.*underflows float64"):
        dl1.fit(sp.csr_matrix(X), y, alpha=0.01, solver=solver, max_epochs=2)


def test_row_whose_squares_overflow_is_refused_by_the_sample_wise_solvers():
    """Pass: a row holding 1e154 twice (each column's sum of squares is finite, the row's
    is not: no step size is left) is refused by sgd, naming the row. Before: sgd returned
    zeros."""
    X, y = data("squared", ((ROW, 2, 1e154), (ROW, 5, 1e154)))
    with pytest.raises(ValidationError, match=rf"X row {ROW}: its sum of squares overflows"):
        dl1.fit(X, y, alpha=0.01, solver="sgd", max_epochs=2)


def test_row_whose_squares_overflow_is_refused_through_a_data_handle():
    """Pass: the same row, held by a data handle (``dl1.persist``), is refused by sgd with
    the same error when the handle's row blocks are loaded: a handle's rows are checked as
    a matrix's are."""
    X, y = data("squared", ((ROW, 2, 1e154), (ROW, 5, 1e154)))
    with dl1.persist(X, y) as ds:
        with pytest.raises(ValidationError, match=rf"X row {ROW}: its sum of squares overflows"):
            dl1.fit(ds, alpha=0.01, solver="sgd", max_epochs=2)


def test_overflowing_value_is_refused_on_a_cluster(local_cluster):
    """Pass: on a two-worker cluster (distributed, not one piece), sdca refuses the 1e200
    with the same error, naming column and row."""
    X, y = data("squared")
    with (
        dask.config.set({"dl1.one-piece": False}),
        pytest.raises(ValidationError, match=overflow_match("sdca")),
    ):
        dl1.fit(X, y, alpha=0.01, solver="sdca", max_epochs=2, client=local_cluster)


@pytest.mark.parametrize("loss,solver", CLASSIFICATION)
def test_one_class_with_an_intercept_is_refused_by_every_solver(loss, solver):
    """Pass: labels all +1 with an intercept are refused, by every classification loss and
    solver, with the ValidationError the logistic loss gives (both labels with positive
    weight needed); so are two labels of which one has zero weight. Before: the hinge with
    sdca raised ValueError "lasso_ridge needs epsilon, l1, p0 > 0" from inside."""
    X, y = data(loss, ())
    with pytest.raises(ValidationError, match="needs both labels -1 and \\+1 with positive"):
        dl1.fit(X, np.ones(N), alpha=0.01, loss=loss, solver=solver, max_epochs=2)
    sw = np.where(y > 0, 1.0, 0.0)
    with pytest.raises(ValidationError, match="label -1 has none"):
        dl1.fit(X, y, alpha=0.01, loss=loss, solver=solver, max_epochs=2, sample_weight=sw)


@pytest.mark.parametrize("entry", ["fit_constrained", "path_constrained"])
def test_one_class_with_an_intercept_is_refused_by_frank_wolfe(entry):
    """Pass: the constrained (Frank-Wolfe) entry points refuse labels all +1 with an
    intercept with the same ValidationError as every other solver, naming the label that
    has no weight. Before: the logistic datafit's own message, raised after the blocks were
    loaded."""
    X, _ = data("logistic", ())
    kw = {"delta": 1.0} if entry == "fit_constrained" else {"n_deltas": 3}
    with pytest.raises(ValidationError, match="needs both labels .* label -1 has none"):
        getattr(dl1, entry)(X, np.ones(N), loss="logistic", **kw)


def test_constant_target_with_an_intercept_gives_the_zero_model_with_sdca():
    """Pass: a constant target with an intercept (objective 0 at w = 0) is fitted by sdca
    on the Lasso to the closed form, w = 0 and the intercept the constant, certified. Before:
    ValueError "lasso_ridge needs epsilon, l1, p0 > 0"."""
    X, _ = data("squared", ())
    res = dl1.fit(X, np.full(N, 2.5), alpha=0.01, solver="sdca", max_epochs=5)
    assert res.converged_
    np.testing.assert_array_equal(res.coef_, np.zeros(P))
    assert res.intercept_ == pytest.approx(2.5, abs=1e-12)


@pytest.mark.parametrize("solver", ["ws", "sdca"])
def test_column_whose_weighted_squares_overflow_is_refused_by_both_layouts(solver):
    """Pass: 3e153 at (ROW, COL), its square finite, with all the sample weight on ROW
    (normalised to N = 60 there: the weighted sum of squares overflows) is refused by a
    column-wise and a sample-wise solver, naming the column."""
    X, y = data("squared", ((ROW, COL, 3e153),))
    sw = np.zeros(N)
    sw[ROW] = 1.0
    with pytest.raises(ValidationError, match=rf"column {COL}\b.*overflows float64"):
        dl1.fit(X, y, alpha=0.01, solver=solver, max_epochs=2, sample_weight=sw)


def test_diverging_sample_wise_solve_stops_with_numerical_error():
    """Pass: sgd with a step parameter of 1e300 (valid data, diverging steps) stops with
    NumericalError naming the solver, the epoch and the quantity that is not finite,
    instead of returning a NaN model with a ConvergenceWarning."""
    from dl1.errors import NumericalError
    from dl1.inputs import read_inputs
    from dl1.loading import load_problem
    from dl1.objective.penalties.elastic_net import ElasticNet
    from dl1.runtime.executor import executor_for
    from dl1.solvers.sgd import StochasticGradientSolver

    X, y = data("squared", ())
    problem, _ = load_problem(
        read_inputs(X, y, None, "squared", "train"), executor_for(None),
        penalty=ElasticNet(0.01, 1.0), fit_intercept=True, standardize=False, tol=1e-4,
        n_partitions=2, loss="squared", streamed=False, layout="rows",
    )  # fmt: skip
    with (
        np.errstate(all="ignore"),
        pytest.raises(NumericalError, match=r"^sgd, round [1-5]: the \w+( gap)? is not finite"),
    ):
        StochasticGradientSolver(eta0=1e300, max_epochs=5).solve(problem)
