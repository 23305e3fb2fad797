"""A data handle: the feature blocks of ``X`` loaded into the workers once, for many fits.

Every fit on a store reads its blocks from the store again; a grid search, a path per
cross-validation fold or a refit would read the data once per candidate. :func:`persist`
reads them once and returns a :class:`Dataset`, which every entry point and estimator
accepts in place of ``X``. Fits on it make no read of the store: blocks are held as they
were read (no sample weights, no standardisation), and a fit needing weights or scales gets
blocks that share the held arrays and carry only their own per-column constants
(:func:`dl1.tasks.blocks.reweight_block`).

Rows are selected by weights, not copies: ``ds[rows]`` is a view whose fits weigh the
other rows zero (the objective is then exactly the one of the selected rows; weights are
normalised to sum to n). Cross-validation folds and scikit-learn's splitters use it.

The handle is released by :meth:`Dataset.release` or at the end of a ``with`` block; the
workers then drop the blocks (Dask forgets a key once no client holds it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import numbers
from typing import Any, NamedTuple

import numpy as np
import scipy.sparse as sp
from dask.sizeof import sizeof

from dl1.errors import ValidationError
from dl1.runtime.executor import coordinating, executor_for
from dl1.runtime.watchdog import watched_result
from dl1.solvers.result import coef_by_block
from dl1.tasks.blocks import identity, reweight_block
from dl1.tasks.passes import matvec_task


class Dataset:
    """Feature blocks of ``X`` held by the workers (or by this process without a cluster).

    Made by :func:`persist`; pass it as ``X`` to :func:`dl1.fit`, :func:`dl1.path`,
    :func:`dl1.alpha_max` or an estimator's ``fit``. ``ds[rows]`` selects rows without
    copying (a view sharing the blocks).

    Attributes
    ----------
    X : dask array
        The data it was loaded from (read again only if used directly).
    y : ndarray (n_samples,) or None
        Targets of the selected rows.
    sample_weight : ndarray (n_samples,) or None
        Sample weights of the selected rows as given (None: none).
    shape : (n_samples, n_features)
        Of the selected rows.
    client : distributed.Client or None
        The cluster holding the blocks (None: this process).
    n_partitions : int
        The partitions the blocks were placed for (fits on the handle use the same).
    """

    def __init__(self, inputs: Any, blocks: list[Any], col_bounds: np.ndarray, client: Any,
                 n_partitions: int, rows: np.ndarray | None = None) -> None:  # fmt: skip
        self._inputs = inputs
        self._blocks = blocks
        self.col_bounds = col_bounds
        self.client = client
        self.n_partitions = n_partitions
        self.rows = rows
        self._shared: dict[str, Any] = {"released": False}

    # -- what the handle holds ------------------------------------------------------------
    @property
    def released(self) -> bool:
        return bool(self._shared["released"])

    def _check_live(self) -> None:
        if self.released:
            raise ValidationError("this Dataset was released; persist the data again")

    @property
    def X(self) -> Any:
        X = self._inputs.X
        return X if self.rows is None else X[self.rows]

    @property
    def n_total(self) -> int:
        """Rows of the held blocks (all rows, whatever this view selects)."""
        return int(self._inputs.X.shape[0])

    @property
    def shape(self) -> tuple[int, int]:
        n = self.n_total if self.rows is None else int(self.rows.shape[0])
        return n, int(self._inputs.X.shape[1])

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def ndim(self) -> int:
        return 2

    @property
    def y(self) -> np.ndarray | None:
        y = self._inputs.y
        if y is None or y.shape[0] == 0:
            return None
        return y if self.rows is None else y[self.rows]

    @property
    def sample_weight(self) -> np.ndarray | None:
        sw = self._inputs.weights
        if sw is None:
            return None
        return sw if self.rows is None else sw[self.rows]

    @property
    def store(self) -> Any:
        return self._inputs.store

    @property
    def split(self) -> str:
        return self._inputs.split

    def __repr__(self) -> str:
        n, p = self.shape
        where = "this process" if self.client is None else "the workers"
        state = "released" if self.released else f"{len(self._blocks)} feature blocks on {where}"
        view = "" if self.rows is None else f", a view of {self.n_total} rows"
        return f"Dataset({n} x {p}, {state}{view})"

    # -- views ----------------------------------------------------------------------------
    def __getitem__(self, key: Any) -> Dataset:
        """The rows ``key`` (indices, a boolean mask or a slice; also ``(rows, slice(None))``)
        as a view sharing the blocks: nothing is copied or read."""
        if isinstance(key, tuple):
            if len(key) != 2 or not (key[1] is Ellipsis or key[1] == slice(None)):
                raise IndexError("a Dataset selects rows only: ds[rows] or ds[rows, :]")
            key = key[0]
        n = self.shape[0]
        local = np.arange(n)[key] if isinstance(key, slice) else np.asarray(key)
        if local.dtype == bool:
            if local.shape != (n,):
                raise IndexError(f"boolean row mask of length {local.shape[0]} for {n} rows")
            local = np.flatnonzero(local)
        if isinstance(key, numbers.Integral) or local.ndim != 1 or local.dtype.kind not in "iu":
            raise IndexError("rows must be a 1-D array of indices, a boolean mask or a slice")
        if local.size and (local.min() < -n or local.max() >= n):
            raise IndexError(f"row index out of range for {n} rows")
        local = np.where(local < 0, local + n, local).astype(np.int64)
        rows = local if self.rows is None else self.rows[local]
        view = Dataset(self._inputs, self._blocks, self.col_bounds, self.client,
                       self.n_partitions, rows)  # fmt: skip
        view._shared = self._shared
        return view

    def row_weights(self, sample_weight: np.ndarray | None) -> np.ndarray | None:
        """Weights over all held rows for a fit on this view: ``sample_weight`` (of the
        view's rows, or the handle's own) placed at the view's rows, zero elsewhere; None
        when every row counts once."""
        sw = self.sample_weight if sample_weight is None else sample_weight
        if self.rows is None:
            return sw
        ones = np.ones(self.rows.shape[0]) if sw is None else np.asarray(sw, np.float64)
        return np.bincount(self.rows, weights=ones, minlength=self.n_total)

    # -- blocks for a fit -----------------------------------------------------------------
    def feature_blocks(self, ex: Any, sw: np.ndarray, standardize: bool, center: bool):
        """The blocks a fit with normalised weights ``sw`` (empty: none) reads: the held
        ones, or blocks sharing their arrays with the fit's own column constants."""
        self._check_live()
        if sw.shape[0] == 0 and not standardize:
            return list(self._blocks), self.col_bounds
        weights = ex.submit(identity, sw)  # sent once, not once per block
        parts = self.part_of_block()
        blocks = [
            ex.submit_to(int(parts[j]), reweight_block, b, int(self.col_bounds[j]), weights,
                         standardize, center)
            for j, b in enumerate(self._blocks)
        ]  # fmt: skip
        ex.wait(blocks)
        return blocks, self.col_bounds

    def part_of_block(self) -> np.ndarray:
        k = len(self._blocks)
        split = np.array_split(np.arange(k), max(1, min(self.n_partitions, k)))
        return np.concatenate([np.full(len(a), q) for q, a in enumerate(split)])

    def row_blocks(self, ex: Any) -> Any:
        """The row blocks (sample-wise solvers), loaded and checked on first use, then held
        too."""
        # local: dl1.row_blocks loads zarr and its codecs, which dl1.Dataset does without
        from dl1.row_blocks import held_rows

        self._check_live()
        if self._shared.get("rows") is None:
            self._shared["rows"] = held_rows(ex, self._inputs, self.n_partitions)
        return self._shared["rows"]

    # -- one piece (dl1.runtime.one_piece) ------------------------------------------------
    def held_bytes(self) -> float:
        """Bytes of the held blocks in memory, as Dask counts them (``sizeof``)."""
        self._check_live()
        if self.client is None:
            return float(sum(sizeof(b) for b in self._blocks))
        got = self.client.nbytes(keys=[b.key for b in self._blocks], summary=False)
        return float(sum(got.values()))

    def shipped(self) -> tuple[HandleRecipe, list[Any]]:
        """This view as a recipe another process rebuilds around the held blocks, and the
        blocks (futures: the dependencies of the task that ships it)."""
        self._check_live()
        return HandleRecipe(self._inputs, self.col_bounds, self.n_partitions, self.rows), list(
            self._blocks
        )

    # -- predictions ----------------------------------------------------------------------
    def decision_function(self, coef: np.ndarray, intercept: float) -> np.ndarray:
        """``X @ coef + intercept`` on this view's rows, from the held blocks (no read of the
        store), computed where they are: n values, like ``y``, which the client holds too."""
        self._check_live()
        coef = np.asarray(coef, dtype=np.float64).ravel()
        if coef.shape[0] != self.shape[1]:
            raise ValidationError(f"X has {self.shape[1]} features, the model {coef.shape[0]}")
        every = list(range(len(self._blocks)))
        parts = coef_by_block(coef, self.col_bounds, every)
        used = [j for j in every if parts[j][0].shape[0]]
        args = ([self._blocks[j] for j in used], [parts[j] for j in used], self.n_total,
                float(intercept), self.rows)  # fmt: skip
        if self.client is None:
            return _matvec_rows(*args)
        future = self.client.submit(_matvec_rows, *args, pure=False)
        return watched_result(self.client, future, "predictions on a Dataset")

    # -- lifetime -------------------------------------------------------------------------
    def release(self) -> None:
        """Drop the blocks (every view of the handle too): the workers free them once no
        other client holds them. A client :func:`persist` connected for the handle (given
        ``client`` as an address) is closed."""
        self._shared["released"] = True
        self._shared["rows"] = None
        self._blocks.clear()
        connection = self._shared.pop("connection", None)
        if connection is not None:
            connection.close()

    def keep(self, connection: contextlib.ExitStack) -> None:
        """Close ``connection`` on :meth:`release`: the client :func:`persist` connected
        to a scheduler's address for this handle."""
        self._shared["connection"] = connection

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __reduce__(self) -> Any:
        raise TypeError(
            "a dl1 Dataset holds blocks in the workers' memory and cannot be pickled; pass "
            "the store (or the array) and persist it where it is used"
        )


class HandleRecipe(NamedTuple):
    """A :class:`Dataset` view without its blocks: what a one-piece task receives
    (:mod:`dl1.runtime.one_piece`), rebuilt there as a handle of that process."""

    inputs: Any
    col_bounds: np.ndarray
    n_partitions: int
    rows: np.ndarray | None

    def local(self, blocks: list[Any]) -> Dataset:
        """The handle over ``blocks`` (the held blocks, now in this process)."""
        return Dataset(self.inputs, list(blocks), self.col_bounds, None, self.n_partitions,
                       self.rows)  # fmt: skip


def _matvec_rows(blocks: list[Any], parts: list[Any], n: int, intercept: float,
                 rows: np.ndarray | None) -> np.ndarray:  # fmt: skip
    z = np.full(n, intercept)
    if blocks:
        z += matvec_task(blocks, parts, n)
    return z if rows is None else z[rows]


@coordinating
def persist(
    X: Any,
    y: Any = None,
    *,
    sample_weight: Any = None,
    client: Any = None,
    n_partitions: int = 2,
    split: str = "train",
) -> Dataset:
    """Load the feature blocks of ``X`` into the workers once, for many fits.

    Parameters
    ----------
    X : dl1 Store, store path, dask array, scipy.sparse matrix or ndarray
    y : array_like, optional
        Targets (read from the store when ``X`` is one; may be left out for a handle used
        only to predict).
    sample_weight : array_like, optional
        Used by fits on the handle that are given no weights of their own.
    client : distributed.Client or str, optional
        Default: the current Dask client; this process when there is none. For a
        scheduler's address, the handle keeps a client connected to it until released.
    n_partitions : int
        The fits' partitions (as in :func:`dl1.fit`): blocks are placed one partition per
        worker.
    split : str
        Split of a store.

    Returns
    -------
    Dataset
        Accepted as ``X`` everywhere; ``with dl1.persist(...) as ds:`` releases it at the end.
    """
    # local: dl1.inputs and dl1.loading load zarr and its codecs, dl1.params scikit-learn
    # and pandas: none of them in import dl1.dataset (dl1.Dataset; dl1.entry_labels imports it)
    from dl1.inputs import read_inputs
    from dl1.loading import load_blocks, memory_floor
    from dl1.params import PENALISED, validate_params

    validate_params({k: PENALISED[k] for k in ("n_partitions", "client")},
                    {"n_partitions": n_partitions, "client": client}, "dl1.persist()")  # fmt: skip
    if isinstance(X, Dataset):
        raise ValidationError("X is a Dataset already")
    ex = executor_for(client)
    if ex.in_process and (sp.issparse(X) or isinstance(X, np.ndarray)):
        X = X.copy()  # held here, the blocks would be views of the caller's matrix
    inputs = read_inputs(X, y, sample_weight, "squared", split, y_optional=True)
    ex.check_memory(memory_floor(inputs, False, n_partitions))
    blocks, cb = load_blocks(ex, inputs.X, np.zeros(0), False, False, n_partitions,
                             inputs.store, split, stream=False, local=inputs.local)  # fmt: skip
    ex.wait(blocks)
    # the blocks are held: the in-memory matrix is not kept beside them (a handle's recipe
    # travels with every solve shipped in one piece)
    return Dataset(dataclasses.replace(inputs, local=None), blocks, cb, client, n_partitions)
