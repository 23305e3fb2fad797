"""The chunks of a dask array ``X`` as SciPy sparse matrices, whatever they hold.

Dask's documented ways to hold sparse data are pydata ``sparse`` arrays (``COO``, ``GCXS``)
or SciPy matrices; dense ndarrays are accepted too. Every task reading a chunk converts it
here, so each kind is accepted by every entry point alike.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import scipy.sparse as sp

from dl1.errors import ValidationError


def is_pydata_sparse(x: Any) -> bool:
    """Whether ``x`` is a pydata ``sparse`` array (``COO``, ``GCXS``, ``DOK``, ...)."""
    return type(x).__module__.split(".")[0] == "sparse" and hasattr(x, "nnz")


def as_scipy(chunk: Any, fmt: Literal["csc", "csr"]) -> sp.csc_matrix | sp.csr_matrix:
    """``chunk`` (a SciPy sparse matrix or array, a pydata ``sparse`` array or a dense
    array) as a 2-D SciPy matrix in format ``fmt``; not copied when it already is one.

    Raises
    ------
    ValidationError
        When the chunk is not 2-D.
    """
    if is_pydata_sparse(chunk):
        _check_2d(chunk)
        if chunk.fill_value != 0:
            raise ValidationError(f"a chunk of X is a sparse array of fill value "
                                  f"{chunk.fill_value}; only 0 is supported")  # fmt: skip
        if not hasattr(chunk, "to_scipy_sparse"):  # DOK
            chunk = chunk.to_coo()
        chunk = chunk.to_scipy_sparse()
    elif not sp.issparse(chunk):
        chunk = _check_2d(np.asarray(chunk))
    return sp.csc_matrix(chunk) if fmt == "csc" else sp.csr_matrix(chunk)


def _check_2d(chunk: Any) -> Any:
    if chunk.ndim != 2:
        raise ValidationError(f"a chunk of X has {chunk.ndim} dimensions, expected 2")
    return chunk


def as_csc(chunk: Any) -> sp.csc_matrix:
    """``chunk`` as a CSC matrix (see :func:`as_scipy`)."""
    return as_scipy(chunk, "csc")


def as_csr(chunk: Any) -> sp.csr_matrix:
    """``chunk`` as a CSR matrix (see :func:`as_scipy`)."""
    return as_scipy(chunk, "csr")
