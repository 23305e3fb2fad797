"""What a path records per alpha besides the solution: held-out metrics, the compact form
of its coefficients, and what identifies its data and settings in a checkpoint."""

from __future__ import annotations

import os
from typing import Any

import dask
import dask.local
import numpy as np
import scipy.sparse as sp
from dask.base import tokenize

from dl1.errors import ValidationError
from dl1.objective.datafits import datafit_class
from dl1.predict import decision_function
from dl1.runtime.watchdog import watched_result
from dl1.store import Store, open_store
from dl1.store.format import checksum


def fingerprint(X: Any, y: np.ndarray, split: str) -> dict[str, Any]:
    """What identifies the data of a checkpoint: store checksums, or a token of the input."""
    if isinstance(X, (str, os.PathLike)):
        X = open_store(X)
    if isinstance(X, Store):
        e = X.entry(split)
        return {
            "kind": "store",
            "split": split,
            "shape": list(e["shape"]),
            "nnz": int(e["nnz"]),
            "blocks": tokenize(e["blocks"]),
            "y_crc32c": checksum(y),
        }
    return {"kind": type(X).__name__, "token": tokenize(X), "y_crc32c": checksum(y)}


#: The grid of data whose ``alpha_max`` is 0 (a constant ``y``, an all-zero ``X``): every
#: alpha gives ``w = 0``; scikit-learn's ``_alpha_grid`` puts its alphas here too.
RESOLUTION = float(np.finfo(float).resolution)


def alpha_grid(alpha_max: float, n_alphas: int = 100, eps: float = 1e-2) -> np.ndarray:
    """``n_alphas`` values from ``alpha_max`` down to ``eps * alpha_max``, geometrically;
    ``n_alphas`` times :data:`RESOLUTION` when ``alpha_max`` is not above it (as
    scikit-learn). An infinite ``alpha_max`` (``l1_ratio = 0``, ridge) has no grid."""
    if n_alphas < 1 or not 0 < eps < 1:
        raise ValueError(f"need n_alphas >= 1 and 0 < eps < 1, got {n_alphas}, {eps}")
    if not np.isfinite(alpha_max):
        raise ValidationError(
            "no alpha grid for l1_ratio=0 (ridge: alpha_max is infinite), as in scikit-learn; "
            "give the alphas (alphas=...)"
        )
    if alpha_max <= RESOLUTION:
        return np.full(n_alphas, RESOLUTION)
    return np.geomspace(alpha_max, alpha_max * eps, n_alphas)


def test_data(X: Any, X_test: Any, y_test: Any) -> tuple[Any, np.ndarray] | None:
    if X_test is None:
        return None
    if isinstance(X_test, str) and isinstance(X, (str, os.PathLike, Store)):
        st = X if isinstance(X, Store) else open_store(X)
        return (st.to_dask(X_test), st.read("y", X_test))
    if y_test is None:
        raise ValidationError("y_test is required with X_test")
    return (X_test, np.asarray(y_test, dtype=np.float64).ravel())


def test_metric(test, coef: np.ndarray, b: float, client: Any, loss: str) -> dict[str, float]:
    pred = decision_function(test[0], coef, b)
    if isinstance(pred, np.ndarray):  # in-memory test data
        return metrics(loss, test[1], pred)
    if client is None:
        pred = pred.compute(scheduler=dask.local.get_sync)  # in this process, as asked
    else:  # waited for by the watchdog: a stalled cluster is an error, not a hang
        pred = watched_result(client, client.compute(pred), "the test split's predictions")
    return metrics(loss, test[1], pred)


def sparse_record(rec: dict[str, Any]) -> dict[str, Any]:
    """The record with its coefficients kept as (indices, values): a path's memory on the
    client grows with its supports, not with n_alphas x p."""
    coef = np.asarray(rec["coef"], dtype=np.float64)
    nz = np.flatnonzero(coef)
    return {**rec, "coef": (nz, coef[nz])}


def records_as_arrays(records: list[dict[str, Any]], p: int) -> dict[str, Any]:
    """The per-alpha records of a run without checkpoint, in the checkpoint's load() form."""
    names = sorted({m for r in records for m in (r["test_metric"] or {})})
    indptr = np.concatenate([[0], np.cumsum([r["coef"][0].shape[0] for r in records])])
    coefs = sp.csc_matrix(
        (
            np.concatenate([r["coef"][1] for r in records] or [np.zeros(0)]),
            np.concatenate([r["coef"][0] for r in records] or [np.zeros(0, np.int64)]),
            indptr,
        ),
        shape=(p, len(records)),
    )
    return {
        "coefs": coefs,
        "intercepts": np.array([r["intercept"] for r in records], dtype=np.float64),
        "gaps": np.array([r["gap"] for r in records], dtype=np.float64),
        "converged": np.array([r["converged"] for r in records], dtype=bool),
        "n_active": np.array([r["n_active"] for r in records], dtype=np.int64),
        "passes": np.array([r["passes"] for r in records], dtype=np.float64),
        "seconds": np.array([r["seconds"] for r in records], dtype=np.float64),
        "rounds": np.array([r["rounds"] for r in records], dtype=np.int64),
        "test_metrics": {
            m: np.array([(r["test_metric"] or {}).get(m, np.nan) for r in records]) for m in names
        },
    }


def crc(a: np.ndarray) -> int:
    return checksum(np.ascontiguousarray(a, dtype=np.float64))


#: Validation metrics by name, ``(y, decision values) -> value`` (a loss lists its own:
#: ``Datafit.metrics``); log-loss only of a log-odds decision function.
METRIC_FUNCTIONS = {
    "mse": lambda y, pred: float(np.mean((y - pred) ** 2)),
    "logloss": lambda y, pred: float(np.mean(np.logaddexp(0.0, -y * pred))),
    "accuracy": lambda y, pred: float(np.mean(y * pred > 0)),
}


def metrics(loss: str, y: np.ndarray, pred: np.ndarray) -> dict[str, float]:
    """The validation metrics of ``loss`` of decision values ``pred`` against ``y`` (the
    loss's predictions: through its inverse link, :meth:`Datafit.response`)."""
    cls = datafit_class(loss)
    pred = cls.response(pred)
    return {m: METRIC_FUNCTIONS[m](y, pred) for m in cls.metrics}
