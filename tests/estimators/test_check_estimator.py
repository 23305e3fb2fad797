"""scikit-learn's estimator checks on every dl1 estimator, with default parameters, in this
process (no Dask client current: a leaked one would make them run on a cluster)."""

from __future__ import annotations

import dask
import pytest
from sklearn.utils import estimator_checks
from sklearn.utils.estimator_checks import parametrize_with_checks

from dl1.estimators import (
    ElasticNet,
    HuberRegressor,
    Lasso,
    LinearSVC,
    LogisticRegression,
    PoissonRegressor,
)

ESTIMATORS = [Lasso(), ElasticNet(), LogisticRegression(), LinearSVC(), PoissonRegressor(),
              HuberRegressor()]  # fmt: skip

WEIGHT_CHECKS = (
    "check_sample_weight_equivalence_on_dense_data",
    "check_sample_weight_equivalence_on_sparse_data",
)


@pytest.fixture(autouse=True)
def in_process():
    """No current Dask client: dl1 runs in this process (dask.compute's rule)."""
    with dask.config.set(scheduler="sync"):
        yield


@parametrize_with_checks(ESTIMATORS)
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)


@pytest.mark.parametrize("check", WEIGHT_CHECKS)
@pytest.mark.parametrize(
    "estimator, tol", [(LogisticRegression, 1e-10), (LinearSVC, 1e-8)], ids=["logistic", "svc"]
)
def test_sample_weight_equivalence_at_a_tight_tol(estimator, tol, check):
    """Pass: the weighted and the repeated-rows fits agree at a tight tol too (the checks
    above run them at the default tol). The checks give LogisticRegression three classes
    (its multinomial fit): a relative gap of 1e-8 bounds its probabilities' difference only
    to ~2e-7, the check's rtol is 1e-7, hence 1e-10."""
    getattr(estimator_checks, check)(estimator.__name__, estimator(tol=tol))
