"""Unpenalised features (penalty factor 0): their columns on the coordinator and the exact
minimisation over them that keeps the duality gap a certificate.

A feature with ``f_j = 0`` has the dual constraint ``x_j^T theta = 0`` (the conjugate of a
zero penalty is the indicator of 0), which no rescaling of ``theta`` can meet. It is met
the way the intercept's ``sum_i theta_i = 0`` is: before each certifying pass the
coordinator minimises the datafit exactly over the unpenalised coefficients and the
intercept, the others fixed (damped Newton on ``F(z + A d)``, ``A = [X_U, 1]``, a small
dense system), so that ``A^T grad F = 0`` to rounding. The dual point of that point is
feasible for the unpenalised features, and the pass's statistics leave them out
(:func:`dl1.kernels.linalg.weighted_dual`). It is glmnet's ``penalty.factor = 0`` with the
gap of Ndiaye et al. (gap-safe rules) restricted to the penalised features.

The columns are gathered once per solve: ``n x |U|`` sparse, a few covariates in practice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dl1.errors import NumericalError, ValidationError
from dl1.objective.datafits.margin import kernel_weights
from dl1.objective.datafits.quadratic import Quadratic
from dl1.solvers.base import Problem
from dl1.tasks.columns import extract_task

#: Newton steps of one exact minimisation (quadratic convergence: a handful are used).
MAX_NEWTON = 100
#: Halvings of one Newton step's line search.
MAX_HALVINGS = 60
#: ``|A^T g|`` at or below this many rounding units of ``|A|^T |g|`` is zero.
ROUNDING_UNITS = 64.0
EPS = float(np.finfo(np.float64).eps)
#: A predicted decrease below this fraction of ``|F|`` is not resolved by ``F``'s value.
RESOLVED = 1e3 * EPS


def check_free(problem: Problem) -> None:
    """Refuse unpenalised features a fit cannot certify, before any work: a non-smooth
    loss (no Newton step), bounds on them (the minimisation over them is unconstrained)
    or no penalised feature left (no ``alpha_max``)."""
    free = problem.penalty.free
    if free.shape[0] == 0:
        return
    if not problem.datafit.smooth:
        raise ValidationError(f"penalty_factor has zeros (unpenalised features) and "
                              f"loss={problem.datafit.name!r} is not smooth: give the "
                              "unpenalised features a small factor such as 1e-6")  # fmt: skip
    box = problem.penalty.bounds
    if box.shape[1] and np.isfinite(box if box.shape[1] == 1 else box[:, free]).any():
        raise ValidationError("penalty_factor has zeros (unpenalised features) with bounds "
                              "on them (positive=True or bounds=): a bounded unpenalised "
                              "feature is not supported; give it a small factor such as "
                              "1e-6")  # fmt: skip
    if free.shape[0] == problem.p:
        raise ValidationError("penalty_factor is 0 for every feature: nothing is penalised")


@dataclass
class FreeColumns:
    """The unpenalised features ``cols`` and their columns ``X`` (``n x |U|``, CSC, scaled
    as the blocks scale them), held by the coordinator for one solve."""

    cols: np.ndarray
    X: sp.csc_matrix

    @classmethod
    def gather(cls, problem: Problem) -> FreeColumns | None:
        """The columns of the penalty's unpenalised features, extracted from their blocks
        (one task per block holding some); None when every feature is penalised."""
        pb, ex = problem, problem.executor
        check_free(pb)
        free = pb.penalty.free
        if free.shape[0] == 0:
            return None
        owner = np.searchsorted(pb.col_bounds, free, side="right") - 1
        handles = []
        for j in np.unique(owner):
            local = free[owner == j] - pb.col_bounds[j]
            handles.append(ex.submit(extract_task, pb.blocks[int(j)], local))
        parts = []
        for g in ex.gather(handles):
            m = sp.csc_matrix((g.data.astype(np.float64), g.indices, g.indptr),
                              shape=(pb.n, g.ncols))  # fmt: skip
            parts.append(m @ sp.diags(g.scale) if g.scaled else m)
        return cls(free, sp.hstack(parts, format="csc"))

    def refit(self, problem: Problem, z: np.ndarray, w: np.ndarray, b: float) -> float:
        """Minimise ``F`` over the unpenalised coefficients (and the intercept) from
        ``(w, b, z)``: ``w`` and ``z`` are moved in place, the new intercept returned.

        Raises
        ------
        NumericalError
            No minimum within :data:`MAX_NEWTON` steps: the unpenalised features alone
            drive the loss down without end (e.g. they separate the classes).
        """
        pb = problem
        sw = kernel_weights(pb.weights, pb.n)
        A = sp.hstack([self.X, np.ones((pb.n, 1))], format="csc") if pb.fit_intercept else self.X
        last = np.inf
        for _ in range(MAX_NEWTON):
            g, h = derivatives(pb, z, sw)
            grad = A.T @ g
            size = float(np.abs(grad).max())
            if size <= ROUNDING_UNITS * EPS * float((abs(A).T @ np.abs(g)).max(initial=0.0)):
                break
            step = newton_step(A, h, grad)
            dz = A @ step
            slope = float(grad @ step)
            t = line_search(pb, z, dz, slope)
            if t < 1.0 and -slope <= RESOLVED * pb.n * abs(pb.datafit.value(pb.y, z, pb.weights)):
                # the decrease is below what F resolves: Newton's last steps, judged by the
                # gradient they leave (quadratic convergence), not by F
                if size >= last:
                    break
                t = 1.0
            last = size
            z += t * dz
            w[self.cols] += t * step[: self.cols.shape[0]]
            if pb.fit_intercept:
                b += t * float(step[-1])
        else:
            raise NumericalError(
                f"the {self.cols.shape[0]} unpenalised features (penalty_factor 0) have no "
                f"finite optimum within {MAX_NEWTON} Newton steps: they alone drive the loss "
                "down without end (e.g. they separate the classes); penalise them a little"
            )
        return b


def derivatives(problem: Problem, z: np.ndarray, sw: np.ndarray) -> tuple[np.ndarray, ...]:
    """``(g, h)``: ``n grad F(z)`` and ``n diag(hess F(z))``, per sample."""
    pb = problem
    if isinstance(pb.datafit, Quadratic):
        s = np.ones(pb.n) if sw.shape[0] == 0 else sw
        return s * (z - pb.y), s.copy()
    g, h = np.empty(pb.n), np.empty(pb.n)
    pb.datafit.grad_hess(pb.y, z, sw, g, h)
    return g, h


def newton_step(A: sp.csc_matrix, h: np.ndarray, grad: np.ndarray) -> np.ndarray:
    """``-(A^T diag(h) A)^+ grad``: a least-squares solve, as the curvature may vanish in
    some directions (Huber's linear part, a hinge's flat part, an empty column)."""
    H = np.asarray((A.T @ A.multiply(h[:, None])).todense())
    return -np.linalg.lstsq(H, grad, rcond=None)[0]


def line_search(problem: Problem, z: np.ndarray, dz: np.ndarray, slope: float) -> float:
    """The largest ``t = 2^-k`` with Armijo's decrease of ``F(z + t dz)``, 0 if none."""
    pb = problem
    f0 = pb.datafit.value(pb.y, z, pb.weights)
    t = 1.0
    for _ in range(MAX_HALVINGS):
        if pb.datafit.value(pb.y, z + t * dz, pb.weights) <= f0 + 1e-4 * t * slope / pb.n:
            return t
        t *= 0.5
    return 0.0
