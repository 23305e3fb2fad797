"""Lasso and elastic net: scikit-learn's estimators' objective, fitted by :func:`dl1.fit`."""

from __future__ import annotations

from typing import Any

from sklearn.base import RegressorMixin

from dl1.estimators.base import CONSTRAINTS, SHARED, DL1Estimator, is_out_of_core
from dl1.objective.datafits import datafit_class


def _constraints(*names: str) -> dict[str, list[Any]]:
    return {name: CONSTRAINTS[name] for name in (*names, *SHARED)}


class _Regressor(RegressorMixin, DL1Estimator):
    _loss = "squared"

    def _penalty_options(self) -> dict[str, Any]:
        return {"positive": bool(self.positive)}

    def predict(self, X: Any) -> Any:
        """``X @ coef_ + intercept_``: an ndarray for X in memory, a lazy dask array computed
        blockwise for a dask array, store (its test split) or Dataset; through the loss's
        inverse link (``exp`` for Poisson)."""
        return datafit_class(self._loss).response(self._decision(X))

    def score(self, X: Any, y: Any = None, sample_weight: Any = None) -> float:
        """R^2 of :meth:`predict` on X (out of core, y None: X's own targets)."""
        if is_out_of_core(X):
            return self._score_out_of_core(X, y, sample_weight)
        return super().score(X, y, sample_weight)


class Lasso(_Regressor):
    """Linear least squares with an L1 penalty, certified by its duality gap.

    Minimises ``1/(2n) ||y - X w - b||^2 + alpha ||w||_1`` (scikit-learn's ``Lasso``; with
    ``sample_weight``, normalised to sum to n as scikit-learn does) on data in memory or out
    of core, on the current Dask client, ``client``, or in this process.

    Parameters
    ----------
    alpha : float, default=1.0
        Strength of the L1 penalty (> 0).
    fit_intercept : bool, default=True
        Fit an unpenalised intercept.
    tol : float in (0, 1), default=1e-4
        Stop at a duality gap ``<= tol * P(0)`` (relative to the objective at ``w = 0``).
    max_iter : int, default=1000
        Rounds of the solver at most (dl1.fit's ``max_rounds``); reaching it warns
        (``dl1.ConvergenceWarning``) with the gap reached.
    warm_start : bool, default=False
        Start from the previous fit's ``coef_`` and ``intercept_``.
    random_state : None, int or RandomState, default=None
        Seed of the randomised solvers (None: 0, results reproducible).
    solver : str or solver object, default="ws"
        As :func:`dl1.fit` (``"ws"``, ``"cd"``, ``"sdca"``, ``"sgd"``, ..., ``"auto"``).
    client : distributed.Client or str, optional
        The cluster to run on (default: the current client, else this process), or its
        scheduler's address, connected to for each fit. Not pickled with the estimator.
    n_partitions : int, default=2
        Groups of feature blocks updated together each round.
    stream : bool, optional
        Out of core: read the blocks from the store in every pass (None: decided from the
        workers' memory).
    standardize : bool, default=False
        Penalise coefficients of features scaled to unit standard deviation (``coef_`` in
        the input's scale).
    screen : bool, default=False
        Gap-safe screening (working-set solver).
    max_epochs : int, optional
        Passes of the sample-wise solvers at most.
    positive : bool, default=False
        Coefficients kept ``>= 0`` (scikit-learn's ``positive``; the working-set solver,
        without screening).

    Attributes
    ----------
    coef_ : ndarray (n_features,)
    intercept_ : float
    n_iter_ : int
        Rounds run.
    dual_gap_ : float
        Absolute duality gap of the returned point (as scikit-learn's).
    gap_ : float
        Relative duality gap ``dual_gap_ / P(0)`` (what ``tol`` bounds).
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        For a pandas DataFrame X.
    result_ : dl1.FitResult
        The full result of :func:`dl1.fit` (history, timings, passes).
    """

    _fits = ("squared",)

    @classmethod
    def _from_fit(cls, model: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
        got = super()._from_fit(model)
        if got is None or float(model.l1_ratio) != 1.0:  # an elastic net's fit: not a Lasso
            return None
        got[0]["alpha"] = float(model.alpha)
        return got

    _parameter_constraints = _constraints("alpha", "tol", "max_iter", "warm_start",
                                          "random_state", "positive")  # fmt: skip

    def __init__(
        self,
        alpha: float = 1.0,
        *,
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
        self.alpha = alpha
        self.fit_intercept = fit_intercept
        self.tol = tol
        self.max_iter = max_iter
        self.warm_start = warm_start
        self.random_state = random_state
        self.solver = solver
        self.client = client
        self.n_partitions = n_partitions
        self.stream = stream
        self.standardize = standardize
        self.screen = screen
        self.max_epochs = max_epochs
        self.positive = positive


class ElasticNet(_Regressor):
    """Linear least squares with an elastic-net penalty, certified by its duality gap.

    Minimises ``1/(2n) ||y - X w - b||^2 + alpha (l1_ratio ||w||_1 + (1 - l1_ratio) / 2
    ||w||^2)`` (scikit-learn's ``ElasticNet``).

    Parameters
    ----------
    alpha : float, default=1.0
    l1_ratio : float in [0, 1], default=0.5
        The L1 part of the penalty.
    fit_intercept, tol, max_iter, warm_start, random_state, solver, client, n_partitions,
    stream, standardize, screen, max_epochs, positive
        As :class:`Lasso`.

    Attributes
    ----------
    coef_, intercept_, n_iter_, dual_gap_, gap_, n_features_in_, feature_names_in_, result_
        As :class:`Lasso`.
    """

    _fits = ("squared",)

    @classmethod
    def _from_fit(cls, model: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
        got = super()._from_fit(model)
        if got is None or (cls is ElasticNet and float(model.l1_ratio) == 1.0):
            return None  # a Lasso's fit
        got[0].update(alpha=float(model.alpha), l1_ratio=float(model.l1_ratio),
                      **model.loss_params)  # fmt: skip
        return got

    _parameter_constraints = _constraints("alpha", "l1_ratio", "tol", "max_iter",
                                          "warm_start", "random_state", "positive")  # fmt: skip

    def __init__(
        self,
        alpha: float = 1.0,
        *,
        l1_ratio: float = 0.5,
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
        self.alpha = alpha
        self.l1_ratio = l1_ratio
        self.fit_intercept = fit_intercept
        self.tol = tol
        self.max_iter = max_iter
        self.warm_start = warm_start
        self.random_state = random_state
        self.solver = solver
        self.client = client
        self.n_partitions = n_partitions
        self.stream = stream
        self.standardize = standardize
        self.screen = screen
        self.max_epochs = max_epochs
        self.positive = positive

    def _l1_ratio(self) -> float:
        return float(self.l1_ratio)
