"""Dask arrays whose chunks are pydata ``sparse`` arrays (COO, GCXS) give the same results as
the same arrays with SciPy chunks, at every entry point."""

import dask
import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
import sparse

import dl1
from dl1.chunks import as_csc, as_csr
from dl1.errors import ValidationError
from tests.helpers import random_csr

N, P = 80, 40
KINDS = {"COO": sparse.COO.from_scipy_sparse, "GCXS": sparse.GCXS.from_scipy_sparse}
# one column chunk cut into pieces for two partitions; several column and row chunks
CHUNKINGS = [(40, P), (30, 13)]


@pytest.fixture(scope="module")
def data():
    X = random_csr(N, P, 0.2, seed=3)
    rng = np.random.default_rng(3)
    w = np.where(rng.random(P) < 0.3, rng.standard_normal(P), 0.0)
    return X, X @ w + 0.1 * rng.standard_normal(N)


def dask_arrays(X, chunks):
    """The matrix as dask arrays chunked alike: SciPy chunks, then one per pydata kind
    (each chunk converted by its task, as Dask's documentation does it: slicing a whole
    pydata array in every task would time pydata's JIT compilation, not dl1)."""
    ref = da.from_array(X, chunks=chunks, asarray=False)
    meta = {k: f(sp.csr_matrix((0, 0))) for k, f in KINDS.items()}
    return ref, {k: ref.map_blocks(f, meta=meta[k]) for k, f in KINDS.items()}


def assert_same(a, b):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_every_chunk_kind_converts_to_the_same_matrix(data, kind):
    X = data[0]
    for chunk in (X, X.tocsc(), sp.csr_array(X), X.toarray(), KINDS[kind](X)):
        c, r = as_csc(chunk), as_csr(chunk)
        assert (c.format, r.format) == ("csc", "csr")
        assert (c != X).nnz == 0 and (r != X).nnz == 0


def test_chunks_that_are_not_matrices_are_refused():
    with pytest.raises(ValidationError, match="1 dimensions, expected 2"):
        as_csc(sparse.COO.from_numpy(np.ones(3)))
    with pytest.raises(ValidationError, match="fill value 1.0"):
        as_csc(sparse.full((2, 2), 1.0))


@pytest.mark.parametrize("chunks", CHUNKINGS)
def test_fit_alpha_max_and_row_solver(data, chunks):
    X, y = data
    ref, arrays = dask_arrays(X, chunks)
    amax = dl1.alpha_max(ref, y)
    settings = ({"tol": 1e-8}, {"solver": "sdca", "l1_ratio": 0.5, "tol": 1e-5})  # row layout
    expected = [dl1.fit(ref, y, alpha=amax / 10, **kw) for kw in settings]
    for Xs in arrays.values():
        assert_same(dl1.alpha_max(Xs, y), amax)
        for kw, a in zip(settings, expected, strict=True):
            b = dl1.fit(Xs, y, alpha=amax / 10, **kw)
            assert a.converged_ and b.converged_
            assert_same(b.coef_, a.coef_)
            assert_same(b.intercept_, a.intercept_)


def test_path(data):
    X, y = data
    ref, arrays = dask_arrays(X, CHUNKINGS[0])
    a = dl1.path(ref, y, n_alphas=4, tol=1e-8)
    for Xs in arrays.values():
        b = dl1.path(Xs, y, n_alphas=4, tol=1e-8)
        assert np.all(b.converged_)
        assert_same(b.alphas_, a.alphas_)
        assert_same(b.coefs_.toarray(), a.coefs_.toarray())


def test_fit_on_a_cluster(data, local_cluster):
    X, y = data
    ref, arrays = dask_arrays(X, CHUNKINGS[0])
    a = dl1.fit(ref, y, alpha=0.05, tol=1e-8, client=local_cluster)
    for Xs in arrays.values():
        b = dl1.fit(Xs, y, alpha=0.05, tol=1e-8, client=local_cluster)
        assert_same(b.coef_, a.coef_)
        assert_same(dl1.alpha_max(Xs, y, client=local_cluster), dl1.alpha_max(ref, y))


@pytest.mark.parametrize("kind", KINDS)
def test_from_dask_writes_the_matrix(data, kind, local_cluster, tmp_path):
    X, y = data
    Xs = dask_arrays(X, CHUNKINGS[1])[1][kind]
    for name, client in (("local", None), ("cluster", local_cluster)):
        dl1.from_dask(Xs, y, tmp_path / f"{name}.zarr", client=client)
        Xr, yr = dl1.open(tmp_path / f"{name}.zarr")
        (blocks,) = dask.compute(Xr.to_delayed().tolist())
        assert (sp.bmat(blocks, format="csr") != X).nnz == 0
        np.testing.assert_array_equal(yr.compute(), y)
