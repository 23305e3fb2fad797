"""dl1.fit and dl1.path with labels of more than two classes: the multiclass model of
dl1.fit_multiclass / dl1.path_multiclass, the binary-only settings refused."""

from __future__ import annotations

import numpy as np
import pytest

import dl1
from dl1.errors import ValidationError
from tests.solvers.test_multiclass import _problem

SCHEMES = [
    ("logistic", {"multi_class": "multinomial"}),
    ("squared_hinge", {"multi_class": "ovr", "loss": "squared_hinge"}),
]


@pytest.mark.parametrize("loss, scheme", SCHEMES)
def test_fit_with_three_classes_is_the_multiclass_fit(loss, scheme):
    X, y = _problem(K=3)
    res = dl1.fit(X, y, alpha=0.01, loss=loss, tol=1e-8)
    ref = dl1.fit_multiclass(X, y, alpha=0.01, tol=1e-8, **scheme)
    assert type(res) is type(ref) and res.coef_.shape == (3, X.shape[1])
    np.testing.assert_array_equal(res.coef_.toarray(), ref.coef_.toarray())
    np.testing.assert_array_equal(res.classes_, [0, 1, 2])


def test_labels_stored_with_a_store_are_read_for_the_choice(tmp_path):
    X, y = _problem(K=3)
    store = dl1.from_scipy(X, y.astype(float), tmp_path / "mc.zarr")
    res = dl1.fit(store, alpha=0.01, loss="logistic", tol=1e-8)
    ref = dl1.fit_multiclass(X, y, alpha=0.01, tol=1e-8)
    np.testing.assert_allclose(res.coef_.toarray(), ref.coef_.toarray(), atol=1e-9)
    # a regression loss takes the same labels as numbers
    assert isinstance(dl1.fit(store, alpha=0.01, tol=1e-8), dl1.FitResult)


def test_fit_and_path_with_three_classes_standardise_as_the_multinomial_ones():
    X, y = _problem(K=3)
    fit = dl1.fit(X, y, loss="logistic", alpha=0.01, tol=1e-9, standardize=True)
    ref = dl1.fit_multiclass(X, y, alpha=0.01, tol=1e-9, standardize=True)
    np.testing.assert_array_equal(fit.coef_.toarray(), ref.coef_.toarray())
    pth = dl1.path(X, y, loss="logistic", n_alphas=2, eps=0.1, tol=1e-8, standardize=True)
    ref = dl1.path_multiclass(X, y, n_alphas=2, eps=0.1, tol=1e-8, standardize=True)
    for a, b in zip(pth.coefs_, ref.coefs_, strict=True):
        np.testing.assert_array_equal(a.toarray(), b.toarray())
    plain = dl1.fit_multiclass(X, y, alpha=0.01, tol=1e-9)
    assert not np.allclose(plain.coef_.toarray(), fit.coef_.toarray(), atol=1e-3)


def test_path_with_three_classes_is_the_multinomial_path():
    X, y = _problem(K=3)
    pth = dl1.path(X, y, loss="logistic", n_alphas=3, eps=0.1, tol=1e-8)
    ref = dl1.path_multiclass(X, y, n_alphas=3, eps=0.1, tol=1e-8)
    np.testing.assert_array_equal(pth.alphas_, ref.alphas_)
    for a, b in zip(pth.coefs_, ref.coefs_, strict=True):
        np.testing.assert_array_equal(a.toarray(), b.toarray())


@pytest.mark.parametrize("kwargs, named", [
    ({"screen": True}, "screen"),
    ({"positive": True}, "positive"),
    ({"penalty_factor": np.ones(70)}, "penalty_factor"),
    ({"solver": "cd"}, "solver"),
    ({"loss": "smooth_hinge"}, "smooth_hinge"),
])  # fmt: skip
def test_binary_only_settings_are_refused_naming_them(kwargs, named):
    X, y = _problem(K=3)
    kwargs = {"loss": "logistic", **kwargs}
    with pytest.raises(ValidationError, match=named):
        dl1.fit(X, y, alpha=0.01, **kwargs)


@pytest.mark.parametrize("kwargs, named", [({"loss": "hinge"}, "one-vs-rest path"),
                                           ({"cv": 3}, "cv")])  # fmt: skip
def test_path_refuses_what_the_multinomial_path_does_not_do(kwargs, named):
    X, y = _problem(K=3)
    kwargs = {"loss": "logistic", **kwargs}
    with pytest.raises(ValidationError, match=named):
        dl1.path(X, y, **kwargs)
