"""Predictions of a fitted linear model, in memory or blockwise on a (possibly out-of-core)
dask array, store or :class:`dl1.Dataset`.

Shared by :class:`dl1.FitResult`, :class:`dl1.paths.PathResult` and the estimators. On a dask
input nothing is gathered: every row block's decision values are summed on the workers from
the column blocks holding a nonzero coefficient, and each such block's coefficients travel
once, as (indices, values), so the graph grows with the support, not with the width.
"""

from __future__ import annotations

from typing import Any

import dask
import numpy as np
import scipy.sparse as sp
from scipy.special import expit

from dl1.chunks import check_structure
from dl1.errors import ValidationError
from dl1.labels import as_pm1
from dl1.objective.datafits import CLASSIFICATION_LOSSES, LOSSES, datafit_class
from dl1.runtime.compute import computed
from dl1.runtime.executor import Held
from dl1.store.location import is_store_source


def decision_function(X: Any, coef: Any, intercept: Any, *, split: str = "test") -> Any:
    """``X @ coef + intercept``.

    Parameters
    ----------
    X : array-like, sparse matrix, dask array, Store, store path or Dataset
        In memory (ndarray, scipy.sparse, pydata sparse, pandas DataFrame, list of lists);
        or a dask array (chunks scipy.sparse, pydata sparse COO/GCXS or dense, any
        chunking), a :class:`dl1.Store` or its path (``split`` chooses the split) or a
        :class:`dl1.Dataset`, predicted from the blocks it holds (an ndarray: the n values
        are computed on its cluster at once).
    coef : array-like (p,)
    intercept : float
    split : str
        The split of a store to predict on.

    Returns
    -------
    ndarray (n,) for an in-memory ``X``, else a lazy float64 dask array (n,) computed
    blockwise where the blocks are.

    Raises
    ------
    ValidationError
        ``X`` has not ``len(coef)`` features (checked first; both counts are named), or
        ``coef`` / ``intercept`` are not a vector and a scalar.
    """
    coef = _coef(coef)
    b = _scalar(intercept)
    if isinstance(X, Held):  # a Dataset, from the blocks it holds: no read of the store
        return X.decision_function(coef, b)
    X = as_input(X, split)
    check_n_features(X, coef.shape[0])
    if not _is_dask(X):
        return np.asarray(X @ coef, dtype=np.float64).ravel() + b
    return _dask_decision(X, coef, b)


def predict(X: Any, coef: Any, intercept: Any, loss: str, *, split: str = "test") -> Any:
    """Decision values (``loss="squared"``) or labels -1.0 / +1.0 (classification losses,
    ``+1`` where the decision value is ``>= 0``), in the container kind
    :func:`decision_function` returns."""
    d = decision_function(X, coef, intercept, split=split)
    if not datafit_class(loss).classifies:
        return datafit_class(loss).response(d)
    if _is_dask(d):
        return d.map_blocks(_labels, dtype=np.float64)
    return _labels(d)


def predict_proba(X: Any, coef: Any, intercept: Any, *, split: str = "test") -> Any:
    """Class probabilities ``[P(y = -1), P(y = +1)]`` (n, 2) of the logistic model,
    computed as scikit-learn's binary ``LogisticRegression.predict_proba``."""
    d = decision_function(X, coef, intercept, split=split)
    if _is_dask(d):
        return d.map_blocks(_proba, dtype=np.float64, new_axis=1, chunks=(d.chunks[0], (2,)))
    return _proba(d)


def score(
    X: Any,
    y: Any,
    coef: Any,
    intercept: Any,
    loss: str,
    *,
    sample_weight: Any = None,
    split: str = "test",
) -> float:
    """R^2 (as :func:`sklearn.metrics.r2_score`) for ``loss="squared"``, accuracy
    otherwise (``y`` in {-1, +1}).

    ``y=None`` takes the targets of ``X``: a store's ``y`` of ``split``, or a Dataset's
    ``y``. Lazy targets and predictions are computed on the current client, or in this
    thread within a solve in one piece (:func:`dl1.runtime.compute.computed`).
    """
    # local: scikit-learn (~1 s, ~120 MiB to import) only to score; workers import dl1.predict
    from sklearn.metrics import accuracy_score, r2_score

    classifies = datafit_class(loss).classifies  # an unknown loss: refused before any work
    y = _targets(X, y, split)
    pred = predict(X, coef, intercept, loss, split=split)
    if _is_dask(pred):
        (pred,) = computed(pred)
    if y.shape[0] != pred.shape[0]:
        raise ValidationError(f"y has {y.shape[0]} values, X has {pred.shape[0]} rows")
    sw = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64).ravel()
    if not classifies:
        return float(r2_score(y, pred, sample_weight=sw))
    bad = ~np.isin(y, (-1.0, 1.0))
    if bad.any():
        raise ValidationError(
            f"y holds {y[bad][0]!r}: accuracy of a dl1 {loss} model needs labels in "
            "{-1, +1} (an estimator maps its classes_ to them)"
        )
    return float(accuracy_score(y, pred, sample_weight=sw))


def as_input(X: Any, split: str = "test") -> Any:
    """``X`` as what the predictions use: a dask array for a dask array, store, store
    path or Dataset; a CSR matrix or float ndarray (validated, finite) in memory."""
    # local: dask.array (~0.2 s, its pandas/xarray integrations): not in import dl1.predict
    import dask.array as da

    # local: Store is dl1.store.reader's, which loads zarr and its codecs: not in import
    # dl1.predict (the solvers and dl1.dataset import it)
    from dl1.store import Store, open_store

    if is_store_source(X):
        X = open_store(X)
    if isinstance(X, Store):
        return X.to_dask(split)
    if isinstance(X, da.Array):
        if X.ndim != 2:
            raise ValidationError(f"X must be 2-D, got a dask array of shape {X.shape}")
        return X
    if isinstance(getattr(X, "X", None), da.Array) and hasattr(X, "shape"):
        return as_input(X.X, split)  # a dl1.Dataset
    return _in_memory(X)


def check_n_features(X: Any, n_features: int) -> None:
    """Raise :class:`ValidationError` unless ``X`` has ``n_features`` columns."""
    p = X.shape[1]
    if p != n_features:
        raise ValidationError(
            f"X has {p} features, but coef is expecting {n_features} features as input"
        )


def _in_memory(X: Any) -> Any:
    # local: scikit-learn (~1 s, ~120 MiB to import) only to check an in-memory X
    from sklearn.utils import check_array

    if not sp.issparse(X) and hasattr(X, "to_scipy_sparse"):  # pydata sparse COO / GCXS
        X = X.to_scipy_sparse()
    if sp.issparse(X):  # before SciPy's compiled code reads its indices
        check_structure(X)
    return check_array(X, accept_sparse=("csr", "csc"), dtype=(np.float64, np.float32))


def _is_dask(X: Any) -> bool:
    return type(X).__module__.startswith("dask.")


def _coef(coef: Any) -> np.ndarray:
    c = np.asarray(coef, dtype=np.float64)
    if c.ndim != 1:
        raise ValidationError(f"coef must be a vector, got shape {c.shape}")
    return c


def _scalar(x: Any) -> float:
    a = np.asarray(x, dtype=np.float64)
    if a.size != 1:
        raise ValidationError(f"intercept must be a scalar, got shape {a.shape}")
    return float(a.reshape(-1)[0])


def _labels(d: np.ndarray) -> np.ndarray:
    return np.where(d >= 0, 1.0, -1.0)


def _proba(d: np.ndarray) -> np.ndarray:
    p = expit(d)
    return np.stack([1 - p, p], axis=1)


def _targets(X: Any, y: Any, split: str) -> np.ndarray:
    # local: keeps zarr out of import dl1.predict, as in as_input
    from dl1.store import Store, open_store

    if y is None:
        if is_store_source(X):
            X = open_store(X)
        if isinstance(X, Store):
            y = X.read("y", split)
        elif getattr(X, "y", None) is not None and hasattr(X, "X"):
            y = X.y
        else:
            raise ValidationError("y is required unless X is a store or a Dataset with y")
    if _is_dask(y):
        (y,) = computed(y)
    return np.asarray(y, dtype=np.float64).ravel()


def _block_dot(chunk: Any, nz: tuple[np.ndarray, np.ndarray], width: int) -> np.ndarray:
    """``chunk @ w`` for the block's coefficients ``nz`` = (local indices, values)."""
    if not sp.issparse(chunk) and hasattr(chunk, "to_scipy_sparse"):  # pydata COO / GCXS
        chunk = chunk.to_scipy_sparse()
    idx, vals = nz
    if sp.issparse(chunk) and chunk.format == "csc":  # only the support's columns are read
        return np.asarray(chunk[:, idx] @ vals, dtype=np.float64).ravel()
    w = np.zeros(width)
    w[idx] = vals
    return np.asarray(chunk @ w, dtype=np.float64).ravel()


def _row_total(b: float, n: int, *parts: np.ndarray) -> np.ndarray:
    out = np.full(n, b)
    for part in parts:
        out += part
    return out


def _row_count(chunk: Any) -> int:
    return int(chunk.shape[0])


def _dask_decision(X: Any, coef: np.ndarray, b: float) -> Any:
    # local: dask.array (~0.2 s, its pandas/xarray integrations) only for lazy inputs
    import dask.array as da

    cb = np.concatenate([[0], np.cumsum(X.chunks[1])]).astype(np.int64)
    nz = np.flatnonzero(coef)
    owner = np.searchsorted(cb, nz, side="right") - 1
    # one graph key per touched column block holds its coefficients, shared by its row blocks
    by_block = {
        int(j): dask.delayed((nz[owner == j] - cb[j], coef[nz[owner == j]]), pure=True)
        for j in np.unique(owner)
    }
    # unoptimised: Dask's optimisation drops a persisted X's futures from the chunks'
    # graphs (leaving the keys to its scheduler), which dl1.runtime.compute.computed must see
    blocks = X.to_delayed(optimize_graph=False)
    rows = []
    for i, n_i in enumerate(X.chunks[0]):
        parts = [
            dask.delayed(_block_dot, pure=True)(blocks[i, j], w, int(cb[j + 1] - cb[j]))
            for j, w in by_block.items()
        ]
        known = not np.isnan(n_i)
        n = int(n_i) if known else dask.delayed(_row_count, pure=True)(blocks[i, 0])
        total = dask.delayed(_row_total, pure=True)(b, n, *parts)
        rows.append(da.from_delayed(total, shape=(n_i,), dtype=np.float64))
    return da.concatenate(rows) if rows else da.zeros(0)


def _as_classes(labels: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """Labels -1.0 / +1.0 as ``classes[0]`` / ``classes[1]``."""
    return classes[(labels > 0).astype(np.intp)]


class LinearPredictor:
    """Predictions of a record holding ``coef_``, ``intercept_``, ``loss`` and, for a
    classification loss, ``classes_`` (a fitted model of dl1): the functions of this module
    bound to it, in the model's labels (``classes_[1]`` is +1; None: -1 / +1)."""

    coef_: np.ndarray
    intercept_: float
    loss: str
    classes_: np.ndarray | None

    def _classes(self) -> np.ndarray | None:
        """The labels of a classification model (None: -1 / +1, or not a classifier)."""
        classes = getattr(self, "classes_", None)
        return classes if classes is not None and datafit_class(self.loss).classifies else None

    def decision_function(self, X: Any, *, split: str = "test") -> Any:
        """``X @ coef_ + intercept_`` (see :func:`dl1.predict.decision_function`)."""
        return decision_function(X, self.coef_, self.intercept_, split=split)

    def predict(self, X: Any, *, split: str = "test") -> Any:
        """Values (regression losses) or labels (see :func:`dl1.predict.predict`):
        ``classes_[1]`` where the decision value is ``>= 0`` (dl1's +1), else
        ``classes_[0]``; -1.0 / +1.0 without ``classes_``. Lazy (blockwise) on a dask
        array, store or Dataset, as :func:`dl1.predict.predict`."""
        pred = predict(X, self.coef_, self.intercept_, self.loss, split=split)
        classes = self._classes()
        if classes is None:
            return pred
        if _is_dask(pred):
            return pred.map_blocks(_as_classes, classes=classes, dtype=np.float64)
        return _as_classes(pred, classes)

    def predict_proba(self, X: Any, *, split: str = "test") -> Any:
        """``[P(y = -1), P(y = +1)]`` per row, for the logistic loss only: the columns are
        in ``classes_`` order (``classes_[0]``, then ``classes_[1]``)."""
        if not datafit_class(self.loss).log_odds:
            raise ValidationError(f"predict_proba needs the logistic loss, this model's is "
                                  f"{self.loss!r}")  # fmt: skip
        return predict_proba(X, self.coef_, self.intercept_, split=split)

    def score(
        self, X: Any, y: Any = None, *, sample_weight: Any = None, split: str = "test"
    ) -> float:
        """R^2 (squared loss) or accuracy; ``y=None`` takes a store's or Dataset's targets
        (see :func:`dl1.predict.score`). A classifier's labels are ``classes_`` (mapped to
        -1 / +1 by :func:`dl1.labels.as_pm1`: another value is refused, named)."""
        classes = self._classes()
        if classes is not None:

            y = as_pm1(_targets(X, y, split), classes)
        return score(X, y, self.coef_, self.intercept_, self.loss,
                     sample_weight=sample_weight, split=split)  # fmt: skip


__all__ = [
    "CLASSIFICATION_LOSSES",
    "LOSSES",
    "LinearPredictor",
    "decision_function",
    "predict",
    "predict_proba",
    "score",
]
