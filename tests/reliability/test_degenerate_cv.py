"""Degenerate but legal data in cross-validation and paths, as scikit-learn handles it: a
constant ``y`` or an all-zero ``X`` (``alpha_max`` is 0: every alpha gives ``w = 0``) and an
automatic grid asked for ``l1_ratio = 0`` (ridge: ``alpha_max`` is infinite)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn import linear_model as sk

import dl1
from dl1.errors import ValidationError


def _cases():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 5))
    y = rng.standard_normal(60)
    return {"constant y": (X, np.full(60, 3.0)), "all-zero X": (np.zeros((60, 5)), y)}


@pytest.mark.parametrize("case", ["constant y", "all-zero X"])
@pytest.mark.parametrize("kind", ["LassoCV", "ElasticNetCV"])
def test_cv_on_data_whose_alpha_max_is_zero_answers_as_scikit_learn(case, kind):
    X, y = _cases()[case]
    kw = {} if kind == "LassoCV" else {"l1_ratio": [0.5, 1.0]}
    ref = getattr(sk, kind)(cv=3, **kw).fit(X, y)
    got = getattr(dl1, kind)(cv=3, **kw).fit(X, y)
    assert got.alpha_ == ref.alpha_
    np.testing.assert_array_equal(got.coef_, ref.coef_)
    assert got.intercept_ == pytest.approx(ref.intercept_, rel=1e-12)
    np.testing.assert_allclose(got.predict(X), ref.predict(X), rtol=1e-12)


@pytest.mark.parametrize("case", ["constant y", "all-zero X"])
def test_a_path_on_such_data_is_certified_zero(case):
    X, y = _cases()[case]
    path = dl1.path(X, y, n_alphas=4, client=None)
    assert path.converged_.all() and path.coefs_.nnz == 0
    np.testing.assert_array_equal(path.alphas_, sk.LassoCV(alphas=4).fit(X, y).alphas_)


def test_an_automatic_grid_for_l1_ratio_zero_is_refused_as_scikit_learn_does():
    X, y = _cases()["all-zero X"]
    X = X + np.random.default_rng(1).standard_normal(X.shape)
    with pytest.raises(ValueError, match="l1_ratio=0"):
        sk.ElasticNetCV(l1_ratio=[0, 0.5, 1], cv=3).fit(X, y)
    with pytest.raises(ValidationError, match=r"l1_ratio=0 .*give the alphas"):
        dl1.ElasticNetCV(l1_ratio=[0, 0.5, 1], cv=3).fit(X, y)
    with pytest.raises(ValidationError, match=r"l1_ratio=0 .*give the alphas"):
        dl1.path(X, y, l1_ratio=0.0, n_alphas=3, client=None)
    given = dl1.ElasticNetCV(l1_ratio=[0, 1], alphas=[1.0, 0.1], cv=3).fit(X, y)
    ref = sk.ElasticNetCV(l1_ratio=[0, 1], alphas=[1.0, 0.1], cv=3).fit(X, y)
    assert (given.alpha_, given.l1_ratio_) == (ref.alpha_, ref.l1_ratio_)
