"""scikit-learn estimators over :func:`dl1.fit`: :class:`Lasso`, :class:`ElasticNet`,
:class:`LogisticRegression` and :class:`LinearSVC` (see :mod:`dl1.estimators.base` for what
they share)."""

from dl1.estimators.classification import LinearSVC, LogisticRegression
from dl1.estimators.cv import ElasticNetCV, LassoCV, LogisticRegressionCV
from dl1.estimators.glm import HuberRegressor, PoissonRegressor
from dl1.estimators.regression import ElasticNet, Lasso

__all__ = [
    "ElasticNet",
    "ElasticNetCV",
    "HuberRegressor",
    "Lasso",
    "LassoCV",
    "LinearSVC",
    "LogisticRegression",
    "LogisticRegressionCV",
    "PoissonRegressor",
]
