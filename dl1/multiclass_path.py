"""``dl1.path_multiclass``: the multinomial model along a decreasing grid of penalties, each
fit certified and warm-started from the previous one (glmnet's path), the data loaded once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import scipy.sparse as sp

from dl1.errors import ValidationError
from dl1.multiclass import LabelledBlocks, load_labelled, multinomial_penalty, warn_unconverged
from dl1.params import MULTICLASS_PATH, validated
from dl1.runtime.executor import coordinating
from dl1.solvers.class_start import WarmStart
from dl1.solvers.multiclass import MulticlassResult, MulticlassWorkingSetSolver


@dataclass
class MulticlassPath:
    """A multinomial path: ``alphas_`` (decreasing) and at each its certified fit
    (``fits_``, :class:`~dl1.solvers.multiclass.MulticlassResult`), with the classes."""

    alphas_: np.ndarray
    fits_: list[MulticlassResult]
    classes_: np.ndarray
    alpha_max_: float

    @property
    def coefs_(self) -> list[sp.csr_matrix]:
        """Each alpha's sparse ``(K, p)`` coefficients."""
        return [f.coef_ for f in self.fits_]

    @property
    def intercepts_(self) -> np.ndarray:
        """``(n_alphas, K)``."""
        return np.array([f.intercept_ for f in self.fits_])

    @property
    def gaps_(self) -> np.ndarray:
        """Each fit's certified relative duality gap."""
        return np.array([f.gap_ for f in self.fits_])

    @property
    def n_rounds_(self) -> np.ndarray:
        """Passes over the data at each alpha."""
        return np.array([f.n_rounds_ for f in self.fits_])


@coordinating
@validated(MULTICLASS_PATH, "dl1.path_multiclass()")
def path_multiclass(
    X: Any,
    y: Any = None,
    *,
    alphas: Any = None,
    n_alphas: int = 20,
    eps: float = 1e-3,
    l1_ratio: float = 1.0,
    penalty: str = "l1",
    sample_weight: Any = None,
    fit_intercept: bool = True,
    tol: float = 1e-4,
    max_rounds: int = 100,
    max_epochs: int = 5000,
    standardize: bool = False,
    n_partitions: int = 2,
    stream: bool | None = None,
    client: Any = None,
    split: str = "train",
) -> MulticlassPath:
    """Fit the multinomial model of :func:`dl1.fit_multiclass` along a grid of penalties.

    Each fit starts from the previous alpha's answer (its support, coefficients and
    intercepts), so that a fit near the last costs a few passes; every one is certified
    to ``tol``. The blocks are loaded (or located, streamed) once.

    Parameters
    ----------
    X, y, l1_ratio, penalty, sample_weight, fit_intercept, tol, max_rounds, max_epochs, standardize
        As in :func:`dl1.fit_multiclass`.
    alphas : array-like, optional
        The penalties, fitted in decreasing order; by default ``n_alphas`` of them from
        ``alpha_max`` (the smallest at which ``W = 0``, found by one pass) down to
        ``eps * alpha_max``, evenly spaced in log scale.
    n_alphas : int
    eps : float
    n_partitions, stream, client, split
        As in :func:`dl1.fit`.

    Returns
    -------
    MulticlassPath
        ``alphas_``, ``fits_``, ``coefs_``, ``intercepts_``, ``gaps_``, ``n_rounds_``,
        ``classes_``, ``alpha_max_``; a :class:`dl1.ConvergenceWarning` names each alpha a
        bound stopped above ``tol``.
    """
    data = load_labelled(X, y, sample_weight, split, client, n_partitions, stream, standardize,
                         fit_intercept)  # fmt: skip
    return path_labelled(data, PathGrid(alphas, n_alphas, eps), l1_ratio=l1_ratio,
                         penalty=penalty, fit_intercept=fit_intercept, tol=tol,
                         max_rounds=max_rounds, max_epochs=max_epochs)  # fmt: skip


class PathGrid(NamedTuple):
    """A path's penalties: ``alphas``, or ``n_alphas`` below ``alpha_max`` down to ``eps``
    times it."""

    alphas: Any = None
    n_alphas: int = 20
    eps: float = 1e-3


def path_labelled(data: LabelledBlocks, grid: PathGrid, *, l1_ratio: float, penalty: str,
                  fit_intercept: bool, tol: float, max_rounds: int,
                  max_epochs: int = 5000) -> MulticlassPath:  # fmt: skip
    """:func:`path_multiclass` on data already loaded (the options checked by the caller;
    the coefficients in the input's scale)."""
    solver = MulticlassWorkingSetSolver(tol=tol, max_rounds=max_rounds, max_epochs=max_epochs)
    amax = solver.alpha_max(data.problem(multinomial_penalty(penalty, 1.0, l1_ratio),
                                         fit_intercept), l1_ratio)  # fmt: skip
    alphas = _grid(grid.alphas, grid.n_alphas, grid.eps, amax)
    fits, start = [], None
    for alpha in alphas:
        res = solver.solve(data.problem(multinomial_penalty(penalty, alpha, l1_ratio),
                                        fit_intercept), start)  # fmt: skip
        res.classes_ = data.classes
        warn_unconverged(res, max_rounds, max_epochs, stacklevel=5, where=f" at alpha={alpha:.4g}")
        fits.append(res)
        start = WarmStart.of(res)  # in the scaled columns' terms, as the solver's
    for res in fits:
        res.coef_ = data.input_coef(res.coef_)
    return MulticlassPath(alphas, fits, data.classes, amax)


def _grid(alphas: Any, n_alphas: int, eps: float, alpha_max: float) -> np.ndarray:
    """The penalties in decreasing order: given (checked finite and positive) or a log grid
    below ``alpha_max``."""
    if alphas is None:
        if not np.isfinite(alpha_max) or alpha_max <= 0.0:
            raise ValidationError(
                f"alpha_max is {alpha_max}: the data give no grid (no feature correlates "
                "with the labels, or l1_ratio is 0); pass alphas"
            )
        return np.geomspace(alpha_max, alpha_max * eps, n_alphas)
    grid = np.asarray(alphas, dtype=np.float64).ravel()
    if grid.shape[0] == 0 or not (np.isfinite(grid).all() and (grid > 0).all()):
        raise ValidationError(f"alphas must be finite and positive, got {grid.tolist()!r}")
    return np.sort(grid)[::-1]
