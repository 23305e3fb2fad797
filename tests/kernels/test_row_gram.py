"""The weighted Gram matrix of a CSR matrix's rows, against NumPy."""

import numpy as np
import scipy.sparse as sp

from dl1.kernels.gram import csr_weighted_gram


def test_csr_weighted_gram_against_numpy():
    rng = np.random.default_rng(0)
    X = sp.random(300, 17, density=0.3, format="lil", random_state=rng)
    X[5] = 0  # an empty row
    X = X.tocsr()
    X.eliminate_zeros()
    assert X.indptr[5] == X.indptr[6]
    h = rng.uniform(0, 2, size=300)
    h[7] = 0.0
    out = np.full((17, 17), np.nan)
    csr_weighted_gram(X.indptr, X.indices.astype(np.int32), X.data, h, out)
    dense = X.toarray()
    np.testing.assert_allclose(out, dense.T @ (h[:, None] * dense), rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(out, out.T)
