"""Poisson and Huber regression with an elastic-net penalty, fitted by :func:`dl1.fit`."""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.metrics import d2_tweedie_score

from dl1.entry_labels import stored_labels
from dl1.estimators.base import computed, is_out_of_core
from dl1.estimators.regression import ElasticNet, _constraints
from dl1.objective.datafits import Huber
from dl1.params import POSITIVE


class PoissonRegressor(ElasticNet):
    """Poisson regression (log link) with an elastic-net penalty, certified by its gap.

    Minimises ``(1/n) sum_i (exp(z_i) - y_i z_i) + alpha (l1_ratio ||w||_1 + (1 - l1_ratio)
    / 2 ||w||^2)`` with ``z = X w + b``, counts ``y >= 0``: half the mean Poisson deviance
    up to a constant, as scikit-learn's ``PoissonRegressor`` (whose penalty is
    ``l1_ratio=0``'s) and glmnet's ``family="poisson"``. Fitted by the working-set solver's
    proximal Newton steps (the loss's curvature has no bound).

    Parameters
    ----------
    alpha : float, default=1.0
    l1_ratio : float in [0, 1], default=1.0
        The L1 part of the penalty (0: scikit-learn's ``PoissonRegressor``).
    fit_intercept, tol, max_iter, warm_start, random_state, client, n_partitions, stream,
    standardize, positive
        As :class:`dl1.Lasso`; ``solver`` is ``"ws"`` (or ``"auto"``) and ``screen`` False.

    Attributes
    ----------
    coef_, intercept_, n_iter_, dual_gap_, gap_, n_features_in_, feature_names_in_, result_
        As :class:`dl1.Lasso`.
    """

    _loss = "poisson"
    _fits = ("poisson",)

    def __init__(
        self,
        alpha: float = 1.0,
        *,
        l1_ratio: float = 1.0,
        fit_intercept: bool = True,
        tol: float = 1e-4,
        max_iter: int = 1000,
        warm_start: bool = False,
        random_state: Any = None,
        solver: Any = "ws",
        client: Any = None,
        n_partitions: int = 2,
        stream: bool | None = None,
        standardize: bool = False,
        screen: bool = False,
        max_epochs: int | None = None,
        positive: bool = False,
    ) -> None:
        super().__init__(
            alpha, l1_ratio=l1_ratio, fit_intercept=fit_intercept, tol=tol, max_iter=max_iter,
            warm_start=warm_start, random_state=random_state, solver=solver, client=client,
            n_partitions=n_partitions, stream=stream, standardize=standardize, screen=screen,
            max_epochs=max_epochs, positive=positive,
        )  # fmt: skip

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.target_tags.positive_only = True  # counts
        return tags

    def score(self, X: Any, y: Any = None, sample_weight: Any = None) -> float:
        """D^2, the fraction of Poisson deviance explained (scikit-learn's
        ``PoissonRegressor.score``); out of core, y None: X's own targets."""
        if y is None and is_out_of_core(X):
            y = stored_labels(X, "test")
        pred = computed(self.predict(X))
        sw = None if sample_weight is None else computed(sample_weight)
        return float(d2_tweedie_score(np.asarray(computed(y), np.float64), pred,
                                      sample_weight=sw, power=1))  # fmt: skip


class HuberRegressor(ElasticNet):
    """Huber regression with an elastic-net penalty, certified by its duality gap.

    Minimises ``(1/n) sum_i H(y_i - z_i) + alpha (l1_ratio ||w||_1 + (1 - l1_ratio) / 2
    ||w||^2)``, ``H(r) = r^2 / 2`` for ``|r| <= epsilon``, ``epsilon |r| - epsilon^2 / 2``
    beyond: skglm's ``Huber`` datafit and scikit-learn's ``SGDRegressor(loss="huber")``.
    Unlike scikit-learn's ``HuberRegressor`` the residuals are not divided by a fitted
    scale: ``epsilon`` is in the units of ``y``.

    Parameters
    ----------
    epsilon : float > 0, default=1.35
        Residuals beyond it count linearly.
    alpha : float, default=1.0
    l1_ratio : float in [0, 1], default=1.0
    fit_intercept, tol, max_iter, warm_start, random_state, solver, client, n_partitions,
    stream, standardize, screen, max_epochs, positive
        As :class:`dl1.Lasso`.

    Attributes
    ----------
    coef_, intercept_, n_iter_, dual_gap_, gap_, n_features_in_, feature_names_in_, result_
        As :class:`dl1.Lasso`.
    """

    _fits = ("huber",)
    _parameter_constraints = {**_constraints("alpha", "l1_ratio", "tol", "max_iter",
                                             "warm_start", "random_state", "positive"),
                              "epsilon": [POSITIVE]}  # fmt: skip

    def __init__(
        self,
        epsilon: float = 1.35,
        *,
        alpha: float = 1.0,
        l1_ratio: float = 1.0,
        fit_intercept: bool = True,
        tol: float = 1e-4,
        max_iter: int = 1000,
        warm_start: bool = False,
        random_state: Any = None,
        solver: Any = "ws",
        client: Any = None,
        n_partitions: int = 2,
        stream: bool | None = None,
        standardize: bool = False,
        screen: bool = False,
        max_epochs: int | None = None,
        positive: bool = False,
    ) -> None:
        self.epsilon = epsilon
        super().__init__(
            alpha, l1_ratio=l1_ratio, fit_intercept=fit_intercept, tol=tol, max_iter=max_iter,
            warm_start=warm_start, random_state=random_state, solver=solver, client=client,
            n_partitions=n_partitions, stream=stream, standardize=standardize, screen=screen,
            max_epochs=max_epochs, positive=positive,
        )  # fmt: skip

    @property
    def _loss(self) -> Any:  # type: ignore[override]
        return Huber(self.epsilon)


__all__ = ["HuberRegressor", "PoissonRegressor"]
