"""scikit-learn style estimators: a thin shell around :func:`dl1.fit`.

Settings are stored untouched by ``__init__`` and validated in ``fit``; the client is a
parameter (None: the current Dask client when there is one, as :func:`dl1.fit`). After
``fit``: ``coef_``, ``intercept_``, ``dual_gap_`` (absolute), ``gap_`` (relative to
P(0)), ``n_iter_`` (rounds) and ``result_``.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from dl1.params import PENALISED, validate_params
from dl1.penalised import fit as fit_function


class _Base:
    _loss = "squared"
    #: the constraints of dl1.fit's parameters of the same names (one declaration)
    _parameter_constraints = {
        name: PENALISED[name]
        for name in ("alpha", "l1_ratio", "fit_intercept", "standardize", "tol", "max_rounds",
                     "max_epochs", "n_partitions", "solver", "client")
    }  # fmt: skip

    def __init__(
        self,
        alpha: float = 1.0,
        *,
        l1_ratio: float = 1.0,
        fit_intercept: bool = True,
        standardize: bool = False,
        tol: float = 1e-4,
        max_rounds: int = 1000,
        max_epochs: int | None = None,
        n_partitions: int = 2,
        solver: str = "ws",
        client: Any = None,
    ) -> None:
        self.alpha = alpha
        self.l1_ratio = l1_ratio
        self.fit_intercept = fit_intercept
        self.standardize = standardize
        self.tol = tol
        self.max_rounds = max_rounds
        self.max_epochs = max_epochs
        self.n_partitions = n_partitions
        self.solver = solver
        self.client = client

    @classmethod
    def _param_names(cls) -> list[str]:
        sig = inspect.signature(_Base.__init__)
        return [p for p in sig.parameters if p != "self"]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self._param_names()}

    def set_params(self, **params: Any) -> _Base:
        for k, v in params.items():
            if k not in self._param_names():
                raise ValueError(f"invalid parameter {k!r} for {type(self).__name__}")
            setattr(self, k, v)
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}(alpha={self.alpha!r}, l1_ratio={self.l1_ratio!r})"

    def fit(self, X: Any, y: Any = None, sample_weight: Any = None) -> _Base:
        """Fit on X (dask array, store, path, scipy.sparse or ndarray) and y."""
        validate_params(self._parameter_constraints, self.get_params(), type(self).__name__)
        res = fit_function(
            X,
            y,
            alpha=self.alpha,
            l1_ratio=self.l1_ratio,
            loss=self._loss,
            fit_intercept=self.fit_intercept,
            standardize=self.standardize,
            sample_weight=sample_weight,
            tol=self.tol,
            max_rounds=self.max_rounds,
            max_epochs=self.max_epochs,
            n_partitions=self.n_partitions,
            solver=self.solver,
            client=self.client,
        )
        self.result_ = res
        self.coef_ = res.coef_
        self.intercept_ = res.intercept_
        self.dual_gap_ = res.dual_gap_
        self.gap_ = res.gap_
        self.n_iter_ = res.n_rounds_
        return self

    def decision_function(self, X: Any) -> np.ndarray:
        """``X @ coef_ + intercept_`` for an in-memory X (use :mod:`dl1.predict` for dask)."""
        return np.asarray(X @ self.coef_).ravel() + self.intercept_


class Lasso(_Base):
    """L1-regularised least squares (scikit-learn's Lasso objective), certified."""

    def __init__(self, alpha: float = 1.0, **kw: Any) -> None:
        super().__init__(alpha, **kw)
        if self.l1_ratio != 1.0:
            raise ValueError("Lasso has l1_ratio = 1; use ElasticNet")

    def predict(self, X: Any) -> np.ndarray:
        return self.decision_function(X)


class ElasticNet(Lasso):
    """Elastic-net least squares (scikit-learn's ElasticNet objective), certified."""

    def __init__(self, alpha: float = 1.0, *, l1_ratio: float = 0.5, **kw: Any) -> None:
        _Base.__init__(self, alpha, l1_ratio=l1_ratio, **kw)


class LogisticRegression(_Base):
    """L1 / elastic-net logistic regression, labels in {-1, +1}; ``alpha = 1 / (n C)``."""

    _loss = "logistic"

    def predict(self, X: Any) -> np.ndarray:
        return np.where(self.decision_function(X) >= 0, 1.0, -1.0)

    def predict_proba(self, X: Any) -> np.ndarray:
        p = 1.0 / (1.0 + np.exp(-self.decision_function(X)))
        return np.column_stack([1 - p, p])
