"""Proximal Newton on a multinomial working set: the subproblem method of
:mod:`dl1.solvers.multiclass`.

The restricted problem ``min_{W, b} F(X_W W + 1 b^T) + penalty(W)`` is solved by proximal
Newton steps (Lee, Sun & Saunders, SIAM J. Optim. 2014; skglm's ``ProxNewton``; glmnet's
multinomial IRLS, Friedman, Hastie & Tibshirani, J. Stat. Softw. 2010, section 4), as the
binary margin losses' are (:mod:`dl1.tasks.prox_newton`):

1. at ``Z``, the model ``<G, D> + (1/2) sum_i s_i D_i^T (diag(p_i) - p_i p_i^T) D_i / n +
   penalty(W + dW)`` of the loss along ``D = X dW + 1 db^T``, with the row Hessians whole
   (cross-class terms included);
2. coordinate descent on the model (:func:`~dl1.kernels.multiclass.mc_model_epoch`): no
   ``exp`` in the inner loop, where the coordinate descent on the loss itself recomputes a
   row's softmax at each of its entries; the intercepts are coordinates of their own; after
   one epoch over every feature, epochs visit the active ones until the model's decrease
   stalls, then one over every feature decides (glmnet's active-set cycling); each
   coefficient moves at most :data:`MAX_LOGIT_STEP` decision units a step (a trust region);
3. a backtracking line search on the objective along ``(dW, db)`` (Armijo's rule with the
   model's first-order decrease), ``P`` recomputed once per trial.

Once a step's decrease is near the target, the intercept is made optimal (the dual
point's constraint) and the restricted gap read; the solve stops at ``target``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import numpy as np

from dl1.kernels.multiclass import (
    csc_mat_add,
    mc_intercept_step,
    mc_model_epoch,
    mc_model_stats,
)
from dl1.objective.datafits.multinomial import Multinomial
from dl1.objective.penalties.group import GroupElasticNet
from dl1.tasks.anderson import anderson_point
from dl1.tasks.damping import next_damping

#: Armijo's constant of the line search.
ARMIJO = 1e-4
#: Halvings of the line search before a Newton step is given up.
MAX_HALVINGS = 30
#: Relative rounding of the objective below which a full step is taken (as the binary).
VALUE_ROUNDING = 1e-12
#: Coordinate-descent epochs at most per Newton step.
MAX_INNER = 25
#: An epoch whose model decrease is at most this fraction of the step's decrease so far
#: ends the model's minimisation (the forcing term of inexact Newton).
INNER_RTOL = 1e-3
#: The restricted gap is read only after a step whose decrease is at most this many times
#: the target (see :data:`dl1.tasks.prox_newton.CHECK_DECREASE`).
CHECK_DECREASE = 1e2
#: Epochs between Anderson extrapolations of the model's coordinate descent.
ANDERSON = 5
#: A coefficient's curvature is at least this fraction of its bound ``||x_j||_s^2 / (2n)``.
CURVATURE_FLOOR = 1e-4
#: A Newton step moves no decision value by more than this through one coefficient (its
#: column's largest entry times its move): a trust region on the model, which is flat along
#: coefficients still growing where their class's probabilities vanish, and would send
#: them, and the line search with every other coordinate, far beyond where it holds.
MAX_LOGIT_STEP = 5.0


class Restricted(NamedTuple):
    """A working set's columns (CSC arrays and sample-weighted squared norms), the class
    codes, the sample weights (normalised to sum to ``n``; empty for unit ones) and the
    penalty."""

    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    sqnorm: np.ndarray
    codes: np.ndarray
    sample_weight: np.ndarray
    penalty: Any
    grouped: bool
    fit_intercept: bool


class Point(Protocol):
    """The iterate a subproblem moves: the working set's rows of ``W`` (``m x K``), the
    intercepts ``b``, ``Z = X_W W + 1 b^T`` and its row softmax ``P``, which ``refresh``
    recomputes from ``Z``."""

    W: np.ndarray
    b: np.ndarray
    Z: np.ndarray
    P: np.ndarray

    def refresh(self) -> None: ...


class _Model(NamedTuple):
    """The model at a point: ``P``, ``SG = S (P - Y) / n``, ``SP = S P / n``, per
    coefficient its gradient ``G0``, curvature ``C`` and the part ``E`` of it the loss's
    Hessian lacks (floor, damping), and the inverse of the intercepts' block."""

    P: np.ndarray
    SG: np.ndarray
    SP: np.ndarray
    G0: np.ndarray
    C: np.ndarray
    E: np.ndarray
    Hinv: np.ndarray


class _Step(NamedTuple):
    """A Newton step in the making: ``dW``, ``dZ = X dW + 1 db^T``, ``db`` and ``r_i = p_i
    . dZ_i``."""

    dW: np.ndarray
    dZ: np.ndarray
    db: np.ndarray
    r: np.ndarray


class MultinomialNewton:
    """Proximal Newton steps on a multinomial working set, configured once.

    Parameters
    ----------
    max_newton : int
        Newton steps at most per subproblem.
    """

    def __init__(self, max_newton: int = 100) -> None:
        self.max_newton = max_newton
        self.datafit = Multinomial()

    def solve(self, rp: Restricted, pt: Point, target: float, max_epochs: int,
              gap_of: Callable[[], float]) -> int:  # fmt: skip
        """Move ``pt`` (``W``, ``b``, ``Z``, ``P``; see :class:`~dl1.solvers.multiclass.
        _Point`) towards the restricted problem's answer until ``gap_of()``, its restricted
        gap, is at most ``target``; returns the coordinate-descent epochs run."""
        n = pt.Z.shape[0]
        s = rp.sample_weight if rp.sample_weight.shape[0] else np.ones(n)
        weights = rp.sample_weight if rp.sample_weight.shape[0] else None
        floor = CURVATURE_FLOOR * 0.5 * rp.sqnorm / n
        f = self._objective(rp, pt, weights)
        epochs, damping = 0, 0.0
        for _ in range(self.max_newton):
            model = self._model(rp, pt, s, floor, damping)
            dW, dZ, db, ran = self._minimise(rp, pt, model, max_epochs - epochs)
            epochs += ran
            t, f_t = self._line_search(rp, pt, model, dW, dZ, weights, f)
            if t == 0.0:
                break
            damping = next_damping(damping, t)
            pt.W += t * dW
            pt.b += t * db
            pt.Z += t * dZ
            pt.refresh()
            decrease, f = f - f_t, f_t
            if decrease <= CHECK_DECREASE * target or epochs >= max_epochs:
                if rp.fit_intercept:
                    pt.Z, pt.b = self.datafit.fit_intercept(rp.codes, pt.Z, pt.b, weights)
                    pt.refresh()
                    f = self._objective(rp, pt, weights)
                if gap_of() <= target or epochs >= max_epochs:
                    break
        return epochs

    def _objective(self, rp: Restricted, pt: Point, weights: Any) -> float:
        return self.datafit.value(rp.codes, pt.Z, weights) + block_penalty(rp.penalty, pt.W)

    def _model(self, rp: Restricted, pt: Point, s: np.ndarray, floor: np.ndarray,
               damping: float) -> _Model:  # fmt: skip
        n, K = pt.P.shape
        P = pt.P
        SP = P * (s / n)[:, None]
        SG = SP.copy()
        SG[np.arange(n), rp.codes] -= s / n
        # curvatures: the Hessian's diagonal, or for the grouped penalty's block steps the
        # diagonal that majorises the block (diag(p) - p p^T <= diag(p))
        m = rp.indptr.shape[0] - 1
        G0, raw = np.empty((m, K)), np.empty((m, K))
        mc_model_stats(rp.indptr, rp.indices, rp.data, SG, SP if rp.grouped else SP * (1 - P),
                       G0, raw)  # fmt: skip
        C = np.maximum(raw, floor[:, None])
        if damping:
            C += (damping / CURVATURE_FLOOR) * floor[:, None]
        # the intercepts' block, closed along the all-ones direction (1 1^T / K there)
        Hb = np.diag(SP.sum(axis=0)) - SP.T @ P + np.full((K, K), 1.0 / K)
        return _Model(P, SG, SP, G0, C, C - raw, np.linalg.pinv(Hb))

    def _minimise(self, rp: Restricted, pt: Point, model: _Model, budget: int):
        """``(dW, dZ, db, epochs)``: the model minimised approximately from ``dW = 0``.

        After an epoch over every entry, epochs visit only the active ones (nonzero; for the
        grouped penalty, the nonzero features' rows) until the rule stops them, then one
        over every entry decides (glmnet's active-set cycling).
        Every :data:`ANDERSON` epochs of one kind the last iterates are extrapolated
        (Anderson acceleration of coordinate descent, Bertrand & Massias, AISTATS 2021,
        Alg. 1) and the extrapolation kept if it lowers the model."""
        n, K = pt.P.shape
        m = rp.indptr.shape[0] - 1
        st = _Step(np.zeros((m, K)), np.zeros((n, K)), np.zeros(K), np.zeros(n))
        reach = _reach(rp)
        pen = rp.penalty
        every, all_entries = np.arange(m, dtype=np.int64), np.ones((m, K), dtype=np.bool_)
        order, visit, total, epochs, hist = every, all_entries, 0.0, 0, []
        while epochs < min(MAX_INNER, max(budget, 1)):
            fall = mc_model_epoch(rp.indptr, rp.indices, rp.data, order, visit, model.SP, model.P,
                                  model.G0, model.C, model.E, pt.W, st.dW, st.dZ, st.r,
                                  pen.alpha_l1, pen.alpha_l2, rp.grouped, reach)  # fmt: skip
            if rp.fit_intercept:
                fall += mc_intercept_step(model.SG, model.SP, model.P, model.Hinv, st.db,
                                          st.dZ, st.r)  # fmt: skip
            epochs += 1
            total += fall
            if fall <= INNER_RTOL * total:
                if order is every:
                    break
                order, visit, hist = every, all_entries, []  # every entry decides
                continue
            if order is every:
                # the active entries (for the grouped penalty: features, all classes)
                nonzero = pt.W + st.dW != 0
                if rp.grouped:
                    nonzero[:] = nonzero.any(axis=1, keepdims=True)
                active = np.flatnonzero(nonzero.any(axis=1))
                if nonzero.sum() < nonzero.size:
                    order, visit, hist = active, nonzero, []
            hist.append(np.concatenate([st.dW.ravel(), st.db]))
            if len(hist) == ANDERSON + 1:
                self._extrapolate(rp, pt, model, st, np.array(hist))
                hist = []
        return st.dW, st.dZ, st.db, epochs

    def _extrapolate(self, rp: Restricted, pt: Point, model: _Model, st: _Step,
                     hist: np.ndarray) -> None:  # fmt: skip
        """Replace the step by the Anderson extrapolation of the iterates ``hist`` (rows:
        ``dW`` flattened, then ``db``) if it lowers the model; ``dZ`` and ``r`` follow."""
        ext = anderson_point(hist)
        if ext is None:
            return
        K = st.db.shape[0]
        trial = _Step(ext[:-K].reshape(st.dW.shape), np.empty_like(st.dZ), ext[-K:],
                      np.empty_like(st.r))  # fmt: skip
        if self._model_value(rp, pt, model, trial) < self._model_value(rp, pt, model, st):
            st.dW[:], st.dZ[:], st.db[:], st.r[:] = trial.dW, trial.dZ, trial.db, trial.r

    @staticmethod
    def _model_value(rp: Restricted, pt: Point, model: _Model, st: _Step) -> float:
        """The model at the step (its ``dZ`` and ``r`` recomputed from ``dW`` and ``db``):
        ``<SG, D> + (1/2) sum_i (SP_i . D_i^2 - (SP_i . D_i)(p_i . D_i)) + E-terms +
        penalty(W + dW)``."""
        st.dZ[:] = st.db
        csc_mat_add(rp.indptr, rp.indices, rp.data, st.dW, st.dZ)
        D = st.dZ
        np.einsum("ik,ik->i", model.P, D, out=st.r)
        quad = float((model.SG * D).sum()) + 0.5 * float((model.SP * D * D).sum())
        quad -= 0.5 * float(np.einsum("ik,ik->i", model.SP, D) @ st.r)
        quad += 0.5 * float((model.E * st.dW * st.dW).sum())
        return quad + block_penalty(rp.penalty, pt.W + st.dW)

    def _line_search(self, rp: Restricted, pt: Point, model: _Model, dW: np.ndarray,
                     dZ: np.ndarray, weights: Any, f0: float) -> tuple[float, float]:  # fmt: skip
        """The step ``t`` (1, 1/2, ...) meeting Armijo's rule on the objective, with the
        objective there; ``(0, f0)`` if none does."""
        pen0 = block_penalty(rp.penalty, pt.W)
        slope = min(0.0, float((model.SG * dZ).sum()) + block_penalty(rp.penalty, pt.W + dW) - pen0)
        rounding = VALUE_ROUNDING * abs(f0)
        t = 1.0
        for _ in range(MAX_HALVINGS):
            f_t = (self.datafit.loss_along(rp.codes, pt.Z, dZ, t, weights)
                   + block_penalty(rp.penalty, pt.W + t * dW))  # fmt: skip
            if f_t <= f0 + ARMIJO * t * slope + (rounding if t == 1.0 else 0.0):
                return t, f_t
            t *= 0.5
        return 0.0, f0


def _reach(rp: Restricted) -> np.ndarray:
    """Each column's trust region: :data:`MAX_LOGIT_STEP` over its largest entry."""
    m = rp.indptr.shape[0] - 1
    top = np.zeros(m)
    full = np.flatnonzero(np.diff(rp.indptr) > 0)
    top[full] = np.maximum.reduceat(np.abs(rp.data), rp.indptr[full])
    with np.errstate(divide="ignore"):
        return MAX_LOGIT_STEP / top


def block_penalty(pen: Any, W: np.ndarray) -> float:
    """The penalty of a ``(m, K)`` block of rows of ``W``: the grouped penalty row-wise
    (:class:`~dl1.objective.penalties.group.GroupElasticNet` takes the matrix), the
    elastic net entry-wise."""
    return pen.value(W) if isinstance(pen, GroupElasticNet) else pen.value(W.ravel())
