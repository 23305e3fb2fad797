"""Out-of-core problems of ``bench_engines.py``: X stays in a dl1 store on disk.

A problem named ``<preset>-x<k>`` (``log1p-x4``) is ``make_e2006_like(preset=<preset>,
row_multiplier=k, test_fraction=0, seed=0)`` written once to a store (``smoke-x<k>``: the
smoke problem with k times its rows, written by ``dl1.from_scipy`` in blocks of 2,000
nonzeros and row blocks of 600 rows). No process ever holds all of X:

* the certificate and ``alpha_max``: :class:`StoreMatrix`, a SciPy ``LinearOperator`` whose
  ``X @ w`` and ``X.T @ theta`` read the stored blocks one at a time, so ``certify`` runs
  unchanged (the same NumPy formulas, dense vectors of length n and p only);
* Spark: a Parquet copy, ``(label double, features VectorUDT)`` rows, written once by
  :func:`write_parquet` a file of rows at a time from the blocks (preparation, not timed)
  and read back with Spark's own reader (``--spark-parquet`` does the same for a problem
  in memory);
* dask-ml: :func:`daskml_store_arrays`, the store's blocks as a dask array of pydata sparse
  ``COO`` chunks, read where the tasks run, never persisted.
"""

from __future__ import annotations

import math
import re
import shutil
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator


def smoke_data(loss: str, n: int = 600):
    """A tiny sparse problem (seconds for every engine): n x 300."""
    rng = np.random.default_rng(0)
    X = sp.random(n, 300, density=0.05, format="csr", random_state=1)
    w = np.zeros(300)
    w[:10] = rng.standard_normal(10) * 3
    z = X @ w + 0.5 + 0.5 * rng.standard_normal(n)
    y = np.where(z > np.median(z), 1.0, -1.0) if loss == "logistic" else z
    return X, y


def ooc_spec(problem: str) -> tuple[str, int] | None:
    """``(preset, k)`` of an out-of-core problem ``<preset>-x<k>``, else None."""
    m = re.fullmatch(r"(\w+)-x(\d+)", problem)
    return (m.group(1), int(m.group(2))) if m else None


class StoreMatrix(LinearOperator):
    """The train split's X of a dl1 store, as a LinearOperator read block by block."""

    def __init__(self, path: str, split: str = "train") -> None:
        import dl1

        self.store, self.split = dl1.open_store(path), split
        self.rb, self.cb = self.store.row_bounds(split), self.store.col_bounds(split)
        self.nnz = self.store.nnz(split)
        super().__init__(np.float64, self.store.shape(split))

    def read_y(self) -> np.ndarray:
        return np.asarray(self.store.read("y", self.split), dtype=np.float64)

    def _blocks(self, rows: tuple[int, int] | None = None):
        """``(row slice, col slice, block)`` of every stored block meeting ``rows``."""
        lo, hi = rows or (0, self.shape[0])
        for i in range(len(self.rb) - 1):
            a, b = max(lo, int(self.rb[i])), min(hi, int(self.rb[i + 1]))
            if a >= b:
                continue
            for j in range(len(self.cb) - 1):
                B = self.store.read_block(self.split, i, j)
                if (a, b) != (self.rb[i], self.rb[i + 1]):
                    B = B[a - self.rb[i] : b - self.rb[i]]
                yield slice(a, b), slice(int(self.cb[j]), int(self.cb[j + 1])), B

    def _matvec(self, w):
        w = np.asarray(w, dtype=np.float64).ravel()
        z = np.zeros(self.shape[0])
        for r, c, B in self._blocks():
            z[r] += B @ w[c]
        return z

    def _rmatvec(self, theta):
        theta = np.asarray(theta, dtype=np.float64).ravel()
        out = np.zeros(self.shape[1])
        for r, c, B in self._blocks():
            out[c] += B.T @ theta[r]
        return out

    def rows(self, lo: int, hi: int) -> sp.csr_matrix:
        """Rows ``[lo, hi)`` as CSR, assembled from their pieces of every block."""
        bands: dict[int, list] = {}
        for r, _, B in self._blocks((lo, hi)):
            bands.setdefault(r.start, []).append(B)
        return sp.vstack([sp.hstack(bands[k]) for k in sorted(bands)], format="csr")


def store_alpha_max(X: StoreMatrix, y: np.ndarray, loss: str) -> float:
    """``||X^T theta_0||_inf / n`` at the best constant (dl1's ``alpha_max``, intercept fitted),
    from the blocks."""
    from dl1.objective.datafits import Logistic, Quadratic

    df = Logistic() if loss == "logistic" else Quadratic()
    z0 = np.full(y.shape[0], df.initial_intercept(y))
    return float(np.max(np.abs(X.T @ df.dual_point(y, z0, None, True))) / y.shape[0])


def make_store(problem: str, loss: str, data_dir: str) -> str:
    """Path of the store of an out-of-core problem (written once)."""
    preset, k = ooc_spec(problem)
    task = "classification" if loss == "logistic" else "regression"
    path = Path(data_dir) / f"{problem}-{task}.zarr"
    if (path / "dl1-manifest.json").exists():
        return str(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if preset == "smoke":
        import dl1

        X, y = smoke_data(loss, 600 * k)
        dl1.from_scipy(X, y, path, block_nnz=2000, row_block_rows=600, overwrite=True)
    else:
        from dl1.datasets import make_e2006_like

        make_e2006_like(path, preset=preset, task=task, seed=0, row_multiplier=k,
                        test_fraction=0.0, overwrite=True)  # fmt: skip
    print(f"generated {path} in {time.perf_counter() - t0:.0f} s", flush=True)
    return str(path)


# ---------------------------------------------------------------- Spark: a Parquet copy


def _vector_type():
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql.types import DoubleType, StructField, StructType

    return StructType([StructField("label", DoubleType()), StructField("features", VectorUDT())])


def write_parquet(X, y, loss: str, out: str, file_nnz: int = 48 << 20) -> str:
    """A Parquet copy of a problem for Spark (written once; returns its folder): files of
    about ``file_nnz`` nonzeros, row groups of 2,000 rows, columns ``label`` (0/1 for the
    logistic loss) and ``features``, the struct Spark stores a ``VectorUDT`` as (type 0:
    sparse, size, indices, values). X is a CSR matrix or a :class:`StoreMatrix`, whose
    file's rows are assembled from every block."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    dst = Path(out)
    if (dst / "_SUCCESS").exists():
        return str(dst)
    y = (y > 0).astype(np.float64) if loss == "logistic" else y
    n, p = X.shape
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    t0 = time.perf_counter()
    cuts = np.linspace(0, n, max(1, math.ceil(X.nnz / file_nnz)) + 1).astype(int)
    elem = {"int": pa.field("element", pa.int32(), nullable=False),
            "dbl": pa.field("element", pa.float64(), nullable=False)}  # fmt: skip
    ftype = pa.struct([pa.field("type", pa.int8(), nullable=False), ("size", pa.int32()),
                       ("indices", pa.list_(elem["int"])),
                       ("values", pa.list_(elem["dbl"]))])  # fmt: skip
    for f, (a, b) in enumerate(zip(cuts[:-1], cuts[1:], strict=True)):
        R = X.rows(int(a), int(b)) if isinstance(X, StoreMatrix) else X[a:b]
        off = pa.array(R.indptr.astype(np.int32))
        feats = pa.StructArray.from_arrays(
            [pa.array(np.zeros(b - a, np.int8)), pa.array(np.full(b - a, p, np.int32)),
             pa.ListArray.from_arrays(off, pa.array(R.indices.astype(np.int32)),
                                      type=pa.list_(elem["int"])),
             pa.ListArray.from_arrays(off, pa.array(R.data), type=pa.list_(elem["dbl"]))],
            fields=list(ftype))  # fmt: skip
        table = pa.table({"label": pa.array(y[a:b]), "features": feats})
        pq.write_table(table, tmp / f"part-{f:05d}.parquet", row_group_size=2000)
        del R, feats, table
    (tmp / "_SUCCESS").touch()
    tmp.rename(dst)
    size = sum(q.stat().st_size for q in dst.iterdir()) / 2**30
    print(f"wrote {dst}: {len(cuts) - 1} files, {size:.2f} GiB, in "
          f"{time.perf_counter() - t0:.0f} s", flush=True)  # fmt: skip
    return str(dst)


def spark_parquet_frame(spark, path: str):
    """The Parquet copy read by Spark (schema given: label, VectorUDT), cached, counted."""
    df = spark.read.schema(_vector_type()).parquet(path).cache()
    df.count()
    return df


def parquet_note(path: str) -> str:
    files = [q for q in Path(path).iterdir() if q.suffix == ".parquet"]
    size = sum(q.stat().st_size for q in files) / 2**30
    return f"Parquet copy ({len(files)} files, {size:.2f} GiB) read, cached, counted"


# ---------------------------------------------------------------- dask-ml: lazy blocks


def daskml_store_arrays(store: str, loss: str, scaling: float, partitions: int):
    """X (with the constant column ``scaling``) and y as dask arrays read from the store
    where the tasks run: ``Store.to_dask(chunk_type="sparse")`` blocks made ``sparse.COO``,
    ``partitions`` row chunks spanning every column (admm's layout); nothing persisted."""
    import dask.array as da
    import sparse

    import dl1

    st = dl1.open_store(store)
    n, p = st.shape()
    meta = sparse.COO.from_numpy(np.zeros((0, 0)))
    Xs = st.to_dask(chunk_type="sparse").map_blocks(sparse.COO, dtype=np.float64, meta=meta)
    rows = -(-n // partitions)
    const = da.full((n, 1), scaling, chunks=(rows, 1)).map_blocks(sparse.COO.from_numpy, meta=meta)
    X = da.concatenate([Xs.rechunk((rows, Xs.chunks[1])), const], axis=1)
    X = X.rechunk((rows, p + 1))
    y = st.vector_dask("y").rechunk(rows)
    if loss == "logistic":
        y = (y > 0).astype(np.float64)
    return X, y
