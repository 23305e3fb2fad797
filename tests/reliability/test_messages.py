"""Bad inputs and parameters are refused before any work, by an error naming the problem.

Every case asserts the exception's type and that its message names the offending input
(X, y, a parameter, a column) and what is wrong with it.
"""

import numpy as np
import pytest
import scipy.sparse as sp

import dl1
from dl1.errors import ValidationError
from dl1.params import InvalidParameterError


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((30, 8))
    return X, X[:, 0] + 0.1 * rng.standard_normal(30)


@pytest.mark.parametrize(
    ("shape", "named"), [((0, 5), "0 rows"), ((5, 0), "0 columns"), ((0, 0), "0 rows")]
)
@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_empty_x_is_refused(shape, named, kind):
    """Pass criterion: X without rows or columns raises ValidationError naming the count
    (before: ZeroDivisionError, or numpy's 'zero-size array to reduction')."""
    X = np.zeros(shape) if kind == "dense" else sp.csr_matrix(shape)
    with pytest.raises(ValidationError, match=named):
        dl1.fit(X, np.zeros(shape[0]), alpha=0.1)


@pytest.mark.parametrize("shape", [(30,), (1, 30, 8)])
def test_x_must_be_two_dimensional(data, shape):
    """Pass criterion: a 1-D or 3-D X raises ValidationError naming X, 2-D and its shape
    (before: 'not enough values to unpack')."""
    X, y = data
    with pytest.raises(ValidationError, match=r"X must be 2-D .*shape \(" + str(shape[0])):
        dl1.fit(X.ravel()[:30].reshape(shape) if len(shape) == 1 else X[None], y, alpha=0.1)


def test_complex_y_is_refused_not_truncated(data):
    """Pass criterion: complex y raises ValidationError naming y and 'complex' (before: the
    imaginary part was dropped silently and the fit 'converged')."""
    X, y = data
    with pytest.raises(ValidationError, match=r"^y has dtype complex128: complex"):
        dl1.fit(X, y + 1j, alpha=0.1)
    with pytest.raises(ValidationError, match=r"^y has dtype object"):
        dl1.fit(X, np.array([1 + 1j] * 30, dtype=object), alpha=0.1)


@pytest.mark.parametrize(
    ("X_dtype", "named"), [(np.complex128, "complex128"), (object, "object"), (bool, "bool")]
)
def test_x_of_other_dtypes_is_refused(data, X_dtype, named):
    """Pass criterion: X of a complex, object or boolean dtype raises ValidationError naming
    the dtype and the accepted ones."""
    X, y = data
    with pytest.raises(ValidationError, match=f"X has dtype {named}; use float32 or float64"):
        dl1.fit(X.astype(X_dtype), y, alpha=0.1)


@pytest.mark.parametrize(
    ("y", "named"),
    [
        (np.array(["a"] * 30), "y has dtype <U1"),
        (np.zeros((30, 2)), r"y must be 1-D; got an array of shape \(30, 2\)"),
        (np.zeros(29), "y has 29 values for 30 rows"),
    ],
)
def test_y_of_other_kinds_is_refused(data, y, named):
    """Pass criterion: y of strings, of two columns or of the wrong length raises
    ValidationError naming y and the problem."""
    with pytest.raises(ValidationError, match=named):
        dl1.fit(data[0], y, alpha=0.1)


@pytest.mark.parametrize(
    ("entry", "kwargs", "name"),
    [
        ("fit", {"alpha": 0.1, "max_rounds": -1}, "max_rounds"),
        ("fit", {"alpha": 0.1, "max_rounds": 2.5}, "max_rounds"),
        ("fit", {"alpha": 0.1, "n_partitions": 0}, "n_partitions"),
        ("fit", {"alpha": 0.1, "solver": "cd", "n_epochs": 0}, "n_epochs"),
        ("fit", {"alpha": 0.0}, "alpha"),
        ("fit", {"alpha": float("inf")}, "alpha"),
        ("fit", {"alpha": 0.1, "tol": float("inf")}, "tol"),
        ("fit", {"alpha": 0.1, "tol": float("nan")}, "tol"),
        ("fit", {"alpha": 0.1, "tol": -1e-4}, "tol"),
        ("fit", {"alpha": 0.1, "tol": 1.0}, "tol"),
        ("fit", {"alpha": 0.1, "l1_ratio": 1.5}, "l1_ratio"),
        ("path", {"n_alphas": 0}, "n_alphas"),
        ("path", {"n_alphas": -3}, "n_alphas"),
        ("path", {"eps": 1.0}, "eps"),
        ("fit_constrained", {"delta": 1.0, "max_iter": -1}, "max_iter"),
        ("fit_constrained", {"delta": -1.0}, "delta"),
        ("path_constrained", {"n_deltas": 0}, "n_deltas"),
    ],
)
def test_bounds_of_parameters_are_named(data, entry, kwargs, name):
    """Pass criterion: an integer bound of 0 or below, a non-finite or out-of-range number
    raises InvalidParameterError naming the parameter, the entry point and the valid
    interval (already so on main except tol=1, then accepted: it certifies w = 0)."""
    X, y = data
    with pytest.raises(InvalidParameterError, match=rf"'{name}' parameter of dl1\.{entry}\(\)"):
        getattr(dl1, entry)(X, y, **kwargs)


def test_zero_rounds_certify_the_start_point_only(data):
    """Pass criterion: max_rounds=0 is valid and returns w = 0 with its (uncertified) gap
    and a ConvergenceWarning, not an error."""
    X, y = data
    with pytest.warns(dl1.ConvergenceWarning):
        res = dl1.fit(X, y, alpha=0.01, max_rounds=0)
    assert not res.converged_ and not res.coef_.any() and 0 < res.gap_ <= 1


def test_constant_y_and_empty_columns_are_fine(data):
    """Pass criterion: a constant y gives w = 0 certified (gap 0), an all-zero column gets a
    zero coefficient while the others match the fit without it."""
    X, y = data
    res = dl1.fit(X, np.full(30, 3.0), alpha=0.01)
    assert res.converged_ and not res.coef_.any() and res.intercept_ == pytest.approx(3.0)
    Xz = X.copy()
    Xz[:, 3] = 0.0
    with_zero = dl1.fit(Xz, y, alpha=0.01, tol=1e-10)
    without = dl1.fit(np.delete(X, 3, axis=1), y, alpha=0.01, tol=1e-10)
    assert with_zero.coef_[3] == 0.0
    np.testing.assert_allclose(np.delete(with_zero.coef_, 3), without.coef_, atol=1e-8)


@pytest.mark.parametrize(
    ("weights", "named"),
    [
        (np.zeros(30), "sample_weight sums to 0"),
        (np.r_[-1.0, np.ones(29)], r"sample_weight\[0\] is negative"),
    ],
)
def test_sample_weights_that_cannot_be_normalised_are_refused(data, weights, named):
    """Pass criterion: weights summing to 0, or negative ones, raise ValidationError naming
    sample_weight (subnormal and huge weights fit as their rescaled copy:
    tests/reliability/test_named_errors.py)."""
    with pytest.raises(ValidationError, match=named):
        dl1.fit(*data, alpha=0.1, sample_weight=weights)
