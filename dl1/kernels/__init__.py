"""Numba kernels on raw CSC column blocks (arrays and scalars only, no Dask).

See :mod:`dl1.kernels.linalg` for the shared conventions (``col_scale`` and ``sw``: an empty
array means no column scaling / unit sample weights).
"""

from dl1.kernels.cd import cd_block_epochs, soft_threshold
from dl1.kernels.linalg import csc_col_sqnorms, csc_matvec, csc_rmatvec, csc_xt_theta_stats

__all__ = [
    "cd_block_epochs",
    "csc_col_sqnorms",
    "csc_matvec",
    "csc_rmatvec",
    "csc_xt_theta_stats",
    "soft_threshold",
]
