"""A fit's inputs, read and checked before any work starts: shared by every entry point.

:func:`read_inputs` turns ``X`` (a dask array, a store, a :class:`~dl1.dataset.Dataset`, a
SciPy, pydata sparse or NumPy matrix), ``y`` and the sample weights into validated
:class:`Inputs`; :func:`check_two_classes` refuses a classification fit its intercept alone
would solve. Kept apart from the loading of the blocks (:mod:`dl1.loading`) so that the
checks every entry point makes on what it was given are found in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import dask.array as da
import numpy as np
import scipy.sparse as sp

from dl1.chunks import ColumnSliced, as_csc, is_pydata_sparse
from dl1.errors import ValidationError
from dl1.objective.datafits import make_datafit, normalize_sample_weight
from dl1.runtime.compute import computed
from dl1.runtime.executor import Held
from dl1.store import Store, open_store
from dl1.store.location import is_store_source


@dataclass(frozen=True)
class Inputs:
    """A fit's validated inputs: ``X`` as a 2-D dask array (each column chunk a feature
    block), ``y``, the sample weights normalised to sum to n (empty: none), the datafit,
    the store ``X`` came from (None: not a store) and, for data given in this process's
    memory, that matrix (``local``: CSC or a NumPy array) as the blocks will be cut from it."""

    X: da.Array
    y: np.ndarray
    sample_weight: np.ndarray
    datafit: Any
    store: Store | None
    split: str
    dataset: Any = None  # a dl1.Dataset whose held blocks the fit reads
    local: Any = None  # X in this process's memory (None: a store, a dask array, a Dataset)

    @property
    def weights(self) -> np.ndarray | None:
        return None if self.sample_weight.shape[0] == 0 else self.sample_weight


def as_dask(X: Any, split: str) -> tuple[da.Array, np.ndarray | None, np.ndarray | None, Any]:
    """(X as a 2-D dask array, y from a store or None, sample weights from a store or None,
    X as the in-memory matrix the dask array wraps, or None)."""
    if is_store_source(X):
        X = open_store(X)
    if isinstance(X, Store):
        y = X.read("y", split)
        sw = X.read("sample_weight", split) if X.entry(split)["has_sample_weight"] else None
        return X.to_dask(split, X.column_format(split)), y, sw, None
    if isinstance(X, da.Array):
        if X.ndim != 2:
            raise ValidationError(f"X must be 2-D, got {X.ndim} dimensions")
        if any(np.isnan(c) for cs in X.chunks for c in cs):
            raise ValidationError("X has unknown chunk sizes; call X.compute_chunk_sizes()")
        return X, None, None, None
    if sp.issparse(X) or isinstance(X, np.ndarray) or is_pydata_sparse(X):
        if X.ndim != 2:
            raise ValidationError(
                f"X must be 2-D (samples x features); got an array of shape {X.shape}"
                + (" (one feature: X.reshape(-1, 1))" if X.ndim == 1 else "")
            )
        n, p = X.shape
        X = np.asarray(X) if isinstance(X, np.ndarray) else as_csc(X)
        meta = np.empty((0, 0), X.dtype) if isinstance(X, np.ndarray) else sp.csc_matrix(
            (0, 0), dtype=X.dtype)  # fmt: skip
        # name=False: a random name, the matrix's values not hashed
        Xd = da.from_array(ColumnSliced(X), chunks=(n, max(1, -(-p // 4))), asarray=False,
                           meta=meta, name=False)  # fmt: skip
        return Xd, None, None, X
    raise ValidationError(
        f"X must be a dask array, a dl1 Store, store path or URL, a dl1 Dataset, a scipy.sparse "
        f"or pydata sparse matrix or a NumPy array; got {type(X).__name__}"
    )


def as_vector(v: Any, n: int, what: str) -> np.ndarray:
    """``v`` as n finite float64 values, refused (naming ``what`` and the entry) when it is
    not 1-D (or a single column), not real numbers (complex parts are never dropped),
    of another length or not finite. A dask array is computed by :func:`computed`."""
    (v,) = computed(v, what=what) if isinstance(v, da.Array) else (v,)
    v = np.asarray(v)
    if v.ndim > 2 or (v.ndim == 2 and v.shape[1] != 1):
        raise ValidationError(f"{what} must be 1-D; got an array of shape {v.shape}")
    if v.dtype.kind == "c":
        raise ValidationError(
            f"{what} has dtype {v.dtype}: complex values are not supported (pass the real "
            "part explicitly if that is what is meant)"
        )
    try:
        if v.dtype.kind not in "biufO":
            raise TypeError
        v = np.asarray(v, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        raise ValidationError(f"{what} has dtype {v.dtype}; use real numbers") from None
    if v.shape[0] != n:
        raise ValidationError(f"{what} has {v.shape[0]} values for {n} rows of X")
    bad = ~np.isfinite(v)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise ValidationError(f"{what}[{k}] is {v[k]} (not finite)")
    return v


#: Smallest sum of squares of a nonzero vector or column dl1 accepts: below it the squares
#: are subnormal or zero, and norms, gaps and steps lose their precision (or vanish).
SQUARES_MIN = float(np.finfo(np.float64).tiny)


def check_squares(v: np.ndarray, what: str) -> None:
    """Refuse ``v`` when its sum of squares overflows or underflows float64: every norm,
    objective and gap of the fit is made of such sums (naming the largest entry)."""
    with np.errstate(over="ignore", under="ignore"):
        sq = float(np.dot(v, v))
    if np.isfinite(sq) and (sq >= SQUARES_MIN or not v.any()):
        return
    k = int(np.argmax(np.abs(v)))
    kind = "overflows" if not np.isfinite(sq) else "underflows"
    raise ValidationError(
        f"{what}: its sum of squares {kind} float64 (largest value {what}[{k}] = {v[k]:.3g}); "
        f"rescale {what} so that its values' squares are representable"
    )


def check_store_columns(store: Store, split: str) -> None:
    """Refuse a store whose column statistics (squared norms, written with the store) show a
    column whose sum of squares is not finite, before any block is loaded."""
    sq = store.read("stats/col_sqsum", split)
    bad = ~np.isfinite(sq)
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        raise ValidationError(
            f"X column {j} (split {split!r} of {store.path}): its sum of squares overflows "
            f"float64 ({int(bad.sum())} column(s) in all); rescale the column"
        )


def read_inputs(
    X: Any, y: Any, sample_weight: Any, loss: str, split: str, *, y_optional: bool = False
) -> Inputs:
    """The validated :class:`Inputs` of a fit (``y`` and weights read from a store or from
    a :class:`~dl1.dataset.Dataset`; ``y_optional``: an empty ``y`` when there is none)."""
    if isinstance(X, Held):  # a Dataset
        return dataset_inputs(X, y, sample_weight, loss)
    store = open_store(X) if is_store_source(X) else X
    store = store if isinstance(store, Store) else None
    Xd, y_store, sw_store, local = as_dask(X if store is None else store, split)
    n, p = Xd.shape
    if n == 0 or p == 0:
        raise ValidationError(
            f"X has {n} rows and {p} columns; a fit needs at least one sample and one feature"
        )
    if np.dtype(Xd.dtype) not in (np.float32, np.float64):
        raise ValidationError(f"X has dtype {Xd.dtype}; use float32 or float64")
    if y is None:
        y = y_store
    if y is None and not y_optional:
        raise ValidationError("y is required unless X is a dl1 store")
    if store is not None:
        check_store_columns(store, split)
    datafit = make_datafit(loss)
    y = np.zeros(0) if y is None else checked_y(datafit, y, n)
    if sample_weight is None:
        sample_weight = sw_store
    return Inputs(Xd, y, normalized_weights(sample_weight, n), datafit, store, split,
                  local=local)  # fmt: skip


def checked_y(datafit: Any, y: Any, n: int) -> np.ndarray:
    """``y`` as n finite values the datafit accepts, its squares representable."""
    y = datafit.validate_y(as_vector(y, n, "y"))
    check_squares(y, "y")
    return y


def dataset_inputs(ds: Any, y: Any, sample_weight: Any, loss: str) -> Inputs:
    """The :class:`Inputs` of a fit on a :class:`~dl1.dataset.Dataset` (or a view of its
    rows): its held data, ``y`` (given for the view's rows, or the handle's), and weights
    over all held rows, zero outside the view."""
    ds._check_live()
    held = ds._inputs
    n = ds.n_total
    if y is not None:
        y_view = as_vector(y, ds.shape[0], "y")
        y = y_view if ds.rows is None else np.zeros(n)
        if ds.rows is not None:
            y[ds.rows] = y_view
    elif held.y.shape[0]:
        y = held.y
    else:
        raise ValidationError("y is required: the Dataset was persisted without y")
    if sample_weight is not None:
        sample_weight = as_vector(sample_weight, ds.shape[0], "sample_weight")
    datafit = make_datafit(loss)
    sw = normalized_weights(ds.row_weights(sample_weight), n)
    return Inputs(held.X, checked_y(datafit, y, n), sw, datafit, held.store, held.split, ds)


def normalized_weights(sample_weight: Any, n: int) -> np.ndarray:
    """Sample weights checked (finite, non-negative) and normalised to sum to n; empty for
    None."""
    sw = np.zeros(0)
    if sample_weight is not None:
        s = as_vector(sample_weight, n, "sample_weight")
        if (s < 0).any():
            raise ValidationError(f"sample_weight[{int(np.flatnonzero(s < 0)[0])}] is negative")
        sw = normalize_sample_weight(s, n)  # divided by their largest first: never overflows
    return sw


def check_two_classes(inputs: Inputs, loss: str, fit_intercept: bool) -> None:
    """Refuse a classification loss fitted with an intercept when one label has no positive
    weight: the intercept alone then fits every sample (the logistic loss's is infinite),
    and the solvers' steps and tolerances, relative to the objective at ``w = 0``, are
    undefined. One check for every classification loss and solver, before any loading."""
    y = inputs.y
    if not fit_intercept or not inputs.datafit.classifies or y.shape[0] == 0:
        return
    w = inputs.weights
    for label in (-1.0, 1.0):
        mass = float(np.count_nonzero(y == label) if w is None else w[y == label].sum())
        if mass <= 0.0:
            raise ValidationError(
                f"{loss} fit with an intercept needs both labels -1 and +1 with positive "
                f"weight; label {label:+.0f} has none (the intercept alone fits every sample)"
            )
