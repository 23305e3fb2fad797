"""Multinomial logistic loss of ``K`` classes: ``F(Z) = (1/n) sum_i (lse(z_i) - z_{i, y_i})``.

``Z = X W + 1 b^T`` is the ``n x K`` matrix of decision values (``W`` of shape ``(p, K)``,
``b`` of length ``K``) and ``lse`` the log-sum-exp of a row: scikit-learn's multinomial
objective (``LogisticRegression`` with ``C = 1 / (n alpha)``), glmnet's
``family="multinomial"``. Labels are class codes ``0 .. K-1``.

Duality (as :mod:`dl1.objective.gap`, per class). The dual point is ``Theta = -n grad F(Z) =
Y - P`` (``Y`` one-hot, ``P`` the row softmax of ``Z``). The conjugate of a row's loss is the
negative entropy on the simplex: ``f_i^*(u) = sum_k q_k log q_k`` for ``q = u + e_{y_i}`` in
the simplex, else ``inf``; so ``F^*(-c Theta / n) = (1/n) sum_i negent(c P_i + (1 - c)
e_{y_i})``, finite for every scale ``c`` in ``[0, 1]`` (a convex combination of two points
of the simplex). With an intercept, ``sum_i Theta_i = 0`` holds when ``b`` is optimal for
``W`` (:meth:`Multinomial.fit_intercept`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import softmax, xlogy

from dl1.errors import ValidationError
from dl1.kernels.multiclass import csc_xt_mat, mc_loss_along, repair_dual

#: Sample weights normalised to sum to n, or None for unit weights.
Weights = NDArray[np.float64] | None

#: ``max_k |d F / d b_k|`` at which the intercept counts as optimal: the dual point's class
#: sums are then zero to ``n`` times this (its constraint, to rounding).
GRADIENT_TOL = 1e-14

#: Newton decrement (squared, relative to ``max(1, F)``) below which the intercept's full
#: Newton step is taken without a line search: the model is exact there to far below
#: the rounding of ``F``, a mean of ``n`` terms, which the search would compare.
FULL_STEP = 1e-10

#: Newton steps of the intercept, at most (each is O(n K^2); a few reach machine precision).
INTERCEPT_STEPS = 50

#: Sweeps of the dual point's repair over a working set's columns, at most.
REPAIR_SWEEPS = 3


class Multinomial:
    """The multinomial (softmax cross-entropy) datafit; plain and picklable."""

    name = "multinomial"
    classifies = True

    def __repr__(self) -> str:
        return "Multinomial()"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self).__name__)

    @staticmethod
    def encode(y: ArrayLike) -> tuple[NDArray[Any], NDArray[np.int64]]:
        """``(classes, codes)`` of labels ``y`` (sorted classes, as scikit-learn's); refuses
        fewer than two classes, naming what it found."""
        y = np.asarray(y)
        if y.ndim != 1:
            raise ValidationError(f"y must be 1-D class labels, got shape {y.shape}")
        if y.dtype.kind == "f" and not np.isfinite(y).all():
            bad = int(np.flatnonzero(~np.isfinite(y))[0])
            raise ValidationError(f"y[{bad}] is {float(y[bad])}: labels must be finite")
        classes, codes = np.unique(y, return_inverse=True)
        if classes.shape[0] < 2:
            raise ValidationError(
                f"a classifier needs at least two classes in y; found {classes.tolist()!r}"
            )
        return classes, codes.astype(np.int64)

    @staticmethod
    def value(codes: NDArray[np.int64], Z: NDArray[np.float64], s: Weights = None) -> float:
        """``F(Z)``: the mean cross-entropy (weighted by ``s``, normalised to sum to n)."""
        return loss_along(codes, Z, None, 0.0, s)

    @staticmethod
    def loss_along(
        codes: NDArray[np.int64], Z: NDArray[np.float64], dZ: NDArray[np.float64] | None,
        t: float, s: Weights = None,
    ) -> float:
        """``F(Z + t dZ)``, the trial point never formed (a line search's)."""
        return loss_along(codes, Z, dZ, t, s)

    @staticmethod
    def probabilities(Z: NDArray[np.float64]) -> NDArray[np.float64]:
        """The row softmax ``P`` of ``Z`` (the predicted class probabilities)."""
        return softmax(Z, axis=1)

    @staticmethod
    def dual_point(
        codes: NDArray[np.int64], P: NDArray[np.float64], s: Weights = None
    ) -> NDArray[np.float64]:
        """``Theta = S (Y - P)`` (``-n`` times the gradient), from the probabilities ``P``."""
        theta = -P
        theta[np.arange(P.shape[0]), codes] += 1.0
        return theta if s is None else theta * s[:, None]

    @staticmethod
    def conjugates(
        codes: NDArray[np.int64], P: NDArray[np.float64], scales: tuple[float, ...],
        s: Weights = None,
    ) -> tuple[float, ...]:
        """``F^*(-c Theta / n)`` at each scale ``c`` of ``Theta = S (Y - P)``: the (weighted)
        mean negative entropy of ``c P_i + (1 - c) e_{y_i}``."""
        n = P.shape[0]
        rows = np.arange(n)
        out = []
        for c in scales:
            q = c * P
            q[rows, codes] += 1.0 - c
            ent = xlogy(q, q).sum(axis=1)
            out.append(float((ent.sum() if s is None else s @ ent) / n))
        return tuple(out)

    @staticmethod
    def repaired(
        codes: NDArray[np.int64], P: NDArray[np.float64], columns: tuple[NDArray[Any], ...],
        lam: float, s: Weights = None, intercept: bool = False, sweeps: int = REPAIR_SWEEPS,
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """``(Q, X^T S (Y - Q))``: probabilities ``Q`` whose dual point ``S (Y - Q)`` meets
        ``|x_j^T S (y_k - q_k)| <= lam`` on the CSC ``columns`` (``indptr, indices, data``),
        made from ``P`` by moving the violating columns' rows' mass to their labels
        (:func:`~dl1.kernels.multiclass.repair_dual`); pass ``Q`` for ``P`` to
        :meth:`dual_point` and :meth:`conjugates`. Rows stay on the simplex, so the dual
        value stays a lower bound. With an ``intercept`` the classes' sums of the dual point
        (its constraint, met by ``P`` at an optimal intercept) are restored
        (:func:`restore_class_sums`); where they cannot be, ``P`` is returned."""
        indptr, indices, data = (np.ascontiguousarray(a) for a in columns)
        Q = np.array(P, dtype=np.float64, order="C")
        V = np.empty((indptr.shape[0] - 1, Q.shape[1]))
        sw = np.zeros(0) if s is None else np.ascontiguousarray(s, dtype=np.float64)
        codes = codes.astype(np.int64)
        repair_dual(indptr, indices, data, codes, sw, Q, float(lam), sweeps, V)
        if intercept:
            restored = restore_class_sums(codes, Q, s)
            if restored is None:
                Q = np.array(P, dtype=np.float64, order="C")
            else:
                Q = restored
            csc_xt_mat(indptr, indices, data, Multinomial.dual_point(codes, Q, s), V)
        return Q, V

    @staticmethod
    def initial_intercept(
        codes: NDArray[np.int64], n_classes: int, s: Weights = None
    ) -> NDArray[np.float64]:
        """The optimal intercept at ``W = 0``: the log (weighted) class frequencies,
        centred; a class without weight gets a very negative one (its probability ~0)."""
        counts = np.bincount(codes, weights=s, minlength=n_classes).astype(np.float64)
        b = np.log(np.maximum(counts / counts.sum(), 1e-300))
        b = np.maximum(b, -700.0)
        return b - b.mean()

    def fit_intercept(
        self, codes: NDArray[np.int64], Z: NDArray[np.float64], b: NDArray[np.float64],
        s: Weights = None, max_steps: int = INTERCEPT_STEPS,
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """``(Z, b)`` with ``b`` made optimal for the coefficients behind ``Z`` (at most
        ``max_steps`` Newton steps with a backtracking line search on ``F(Z + 1 d^T)``,
        until the Newton decrement is at rounding level): then every class's column of
        ``Theta`` sums to 0 (to rounding), the intercept's dual constraint. The Hessian's
        null direction (adding a constant to every class) is closed by ``1 1^T / K``."""
        n, K = Z.shape
        counts = np.bincount(codes, weights=s, minlength=K).astype(np.float64)
        f = self.value(codes, Z, s)
        before = np.inf
        for _ in range(max_steps):
            P = self.probabilities(Z)
            SP = P if s is None else P * s[:, None]
            g = (SP.sum(axis=0) - counts) / n
            H = (np.diag(SP.sum(axis=0)) - SP.T @ P) / n + np.full((K, K), 1.0 / K)
            # least squares: a class whose probabilities all underflowed to 0 leaves H
            # singular (its direction then has no curvature and no gradient)
            d = -np.linalg.lstsq(H, g, rcond=None)[0]
            decrement = -float(g @ d)  # the Newton decrement squared: f - min of the model
            size = float(np.abs(g).max())
            full = decrement <= FULL_STEP * max(1.0, f)
            # optimal; or taking full steps that no longer halve the gradient: its sums
            # (n terms each) are at their rounding floor
            if not size > GRADIENT_TOL or (full and size > 0.5 * before):
                break
            before = size
            t, f_new = 1.0, f
            # backtrack while the decrease is above rounding; below it, Newton's full step is
            # exact to rounding and the line search's comparisons (F a sum of n terms) noise
            while not full and t > 1e-9:
                f_new = self.value(codes, Z + t * d, s)
                if f_new <= f - 0.25 * t * decrement:
                    break
                t *= 0.5
            Z, b, f = Z + t * d, b + t * d, min(f, f_new)
        return Z, b


def loss_along(
    codes: NDArray[np.int64], Z: NDArray[np.float64], dZ: NDArray[np.float64] | None,
    t: float, s: Weights = None,
) -> float:
    """``F(Z + t dZ)`` by :func:`~dl1.kernels.multiclass.mc_loss_along` (``dZ`` None:
    ``F(Z)``)."""
    Z = np.ascontiguousarray(Z, dtype=np.float64)
    dZ = Z if dZ is None else np.ascontiguousarray(dZ, dtype=np.float64)
    sw = np.zeros(0) if s is None else np.ascontiguousarray(s, dtype=np.float64)
    return float(mc_loss_along(Z, dZ, 0.0 if dZ is Z else float(t), codes.astype(np.int64), sw))


def restore_class_sums(
    codes: NDArray[np.int64], Q: NDArray[np.float64], s: Weights = None
) -> NDArray[np.float64] | None:
    """``Q`` with every class's sum of ``S (Y - Q)`` made 0 (an intercept's dual
    constraint), each class's off-label probabilities scaled by ``1 - tau_k`` and the rows'
    labels taking the difference; None when no such ``tau`` keeps the rows on the simplex.

    The classes' sums ``d`` move by ``M tau`` with ``M = diag(A) - B``, ``B_ck`` the
    (weighted) mass of class ``k`` on the rows of class ``c != k`` and ``A_k = sum_c B_ck``:
    a singular M-matrix whose columns sum to 0, as ``d`` does (rows sum to 0), so ``M tau =
    -d`` is solved by least squares."""
    n, K = Q.shape
    w = np.ones(n) if s is None else np.asarray(s, dtype=np.float64)
    Y = np.zeros((n, K))
    Y[np.arange(n), codes] = 1.0
    d = w @ (Y - Q)
    B = (Y * w[:, None]).T @ Q
    np.fill_diagonal(B, 0.0)
    tau = np.linalg.lstsq(np.diag(B.sum(axis=0)) - B, -d, rcond=None)[0]
    if not np.isfinite(tau).all() or tau.max(initial=0.0) > 1.0:
        return None
    out = Q * (1.0 - tau)[None, :]
    out[np.arange(n), codes] = 0.0
    out[np.arange(n), codes] = 1.0 - out.sum(axis=1)
    return out if (out >= 0.0).all() else None


def check_labels(codes: NDArray[np.int64], n_classes: int) -> None:
    """Refuse class codes out of ``0 .. n_classes - 1`` (a corrupted label array)."""
    if codes.shape[0] and (codes.min() < 0 or codes.max() >= n_classes):
        bad = int(np.flatnonzero((codes < 0) | (codes >= n_classes))[0])
        raise ValidationError(f"label code {codes[bad]} at row {bad} is not in 0..{n_classes - 1}")


def log_loss_bound(n_classes: int) -> float:
    """``F`` at ``Z = 0``: ``log K`` (a scale for relative tolerances)."""
    return math.log(n_classes)
