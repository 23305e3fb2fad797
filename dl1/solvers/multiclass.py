"""Working-set solver of the multinomial model: every pass over the data serves all classes.

The model is ``min_{W, b} F(X W + 1 b^T) + penalty(W)`` (:mod:`dl1.objective.datafits.
multinomial`), ``W`` of shape ``(p, K)``, with the elastic net (each coefficient its own
group) or the grouped one (a feature's ``K`` coefficients together,
:mod:`dl1.objective.penalties.group`). Each round:

1. the workers compute ``X_b^T Theta`` (``p_b x K``) of every feature block against the
   dual point ``Theta = Y - P`` (one read of each block for all classes) and send back only
   the gap's statistics and their most violating features (:func:`~dl1.tasks.multiclass.
   mc_scan_task`);
2. the coordinator certifies the point by the duality gap (:mod:`dl1.objective.gap`'s
   scales: ``Theta`` rescaled into the dual norm ball, and unscaled with an L2 part) and
   stops once it is at most ``tol`` times the loss at the best constant;
3. otherwise the working set is the support plus the worst violators, up to
   ``max(ws_start, 2 |support|)`` features (skglm / celer's growth rule); its columns are
   extracted where the blocks are and the restricted problem is solved by proximal Newton
   steps (:mod:`dl1.solvers.multinomial_newton`: coordinate descent on a quadratic model
   of the loss with the rows' Hessians whole, a line search on the objective), until its
   own gap is a fraction of the round's (or, when the working set repeats, the final
   target).

What the coordinator holds grows with ``n x K`` (``Z``, ``P``, ``Theta``) and the working
set's columns, not with ``p``; each worker receives ``Theta`` (``n x K``) once per round.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import scipy.sparse as sp

from dl1.kernels.multiclass import csc_mat_add, csc_xt_mat, softmax_rows
from dl1.objective.datafits.multinomial import Multinomial
from dl1.objective.gap import dual_from_conjugates, dual_scales
from dl1.objective.penalties.elastic_net import ElasticNet
from dl1.objective.penalties.group import GroupElasticNet
from dl1.solvers.class_start import WarmStart, decisions_at, gather_ws_columns
from dl1.solvers.multinomial_newton import MultinomialNewton, Restricted, block_penalty
from dl1.tasks.growth import WS_START, next_ws_size
from dl1.tasks.multiclass import excess_sq, group_norms, mc_scan_task


@dataclass(frozen=True)
class MulticlassProblem:
    """What a multinomial solve reads: the executor and its feature blocks (futures or
    sources) with their column ranges, the class codes, the penalty and the intercept."""

    ex: Any
    blocks: list[Any]
    col_bounds: np.ndarray
    codes: np.ndarray
    n_classes: int
    penalty: ElasticNet | GroupElasticNet
    fit_intercept: bool = True
    n_partitions: int = 2
    #: normalised to sum to n; empty for unit weights (the blocks' squared norms weighted)
    sample_weight: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def grouped(self) -> bool:
        return isinstance(self.penalty, GroupElasticNet)

    @property
    def weights(self) -> np.ndarray | None:
        """The sample weights, or None for unit ones (the datafit's convention)."""
        return self.sample_weight if self.sample_weight.shape[0] else None


@dataclass
class MulticlassResult:
    """A certified multinomial fit. ``coef_`` is sparse, ``(K, p)`` (a text model's
    ``K x p`` dense would not fit in memory); ``gap_`` is relative to ``F`` at the best
    constant, as ``tol``."""

    coef_: sp.csr_matrix
    intercept_: np.ndarray
    primal_: float
    dual_: float
    gap_: float
    tol: float
    converged_: bool
    n_rounds_: int
    n_epochs_: int
    history_: list[dict] = field(default_factory=list)

    @property
    def dual_gap_(self) -> float:
        return self.gap_


@dataclass
class _Point:
    """The current iterate: the support (sorted features) and its rows of ``W``, the
    intercept, and ``Z = X W + 1 b^T`` with its row softmax ``P`` and log-sum-exps."""

    support: np.ndarray
    W: np.ndarray
    b: np.ndarray
    Z: np.ndarray
    P: np.ndarray
    lse: np.ndarray

    def refresh(self) -> None:
        softmax_rows(self.Z, self.P, self.lse)


class _DualAt(NamedTuple):
    """The certifying probabilities ``Q`` made at decision values ``Z``, with ``X_W^T
    Theta`` on the working set's columns."""

    Z: np.ndarray
    Q: np.ndarray
    V: np.ndarray | None


class _Columns:
    """A working set's columns gathered from their blocks, as one CSC matrix, with the
    last dual point made on them (a subproblem's last gap is the next round's point)."""

    def __init__(self, prob: MulticlassProblem, ws: np.ndarray) -> None:
        self.indptr, self.indices, self.data, self.sqnorm = gather_ws_columns(
            prob.ex, prob.blocks, prob.col_bounds, ws)
        self.dual: _DualAt | None = None


class MulticlassWorkingSetSolver:
    """The multinomial working-set solver, configured once.

    Parameters
    ----------
    tol : float
        Target duality gap relative to ``F`` at the best constant.
    max_rounds : int
        Passes over the data, at most.
    max_epochs : int
        Coordinate-descent epochs of one subproblem, at most.
    ws_start : int
        The first working set's size.
    inner_ratio : float
        A subproblem stops at this fraction of the round's gap.
    verbose, callback
        A line, or a call with the round's history entry (its certified point: ``gap``,
        ``primal``, ``support``, ``epochs``), per round.
    """

    def __init__(self, tol: float = 1e-4, max_rounds: int = 100, max_epochs: int = 5000,
                 ws_start: int = WS_START, inner_ratio: float = 0.3, verbose: bool = False,
                 callback: Callable[[dict], Any] | None = None) -> None:  # fmt: skip
        self.tol, self.max_rounds, self.max_epochs = tol, max_rounds, max_epochs
        self.ws_start, self.inner_ratio = ws_start, inner_ratio
        self.verbose, self.callback = verbose, callback
        self.datafit = Multinomial()
        self.newton = MultinomialNewton()

    def solve(self, prob: MulticlassProblem, start: WarmStart | None = None) -> MulticlassResult:
        """Rounds of pass, certificate and subproblem until the gap reaches ``tol``, from
        ``start`` (a nearby answer: a path's previous alpha) or from ``W = 0``."""
        pt = self._start(prob)
        scale = self.datafit.value(prob.codes, pt.Z, prob.weights)  # F at the best constant
        if start is not None:
            self._warm(prob, pt, start)
        history: list[dict] = []
        epochs = 0
        primal = dual = np.inf
        last_ws = np.zeros(0, np.int64)
        cols: _Columns | None = None  # the last working set's columns
        for rnd in range(self.max_rounds):
            t0 = time.perf_counter()
            Q = self._dual_probabilities(prob, pt, cols)[0]
            theta = self.datafit.dual_point(prob.codes, Q, prob.weights)
            want = self._ws_size(pt, last_ws.shape[0])
            absmax, excess, cands, scores = self._pass(prob, theta, want)
            primal, dual = self._gap(prob, pt, absmax, excess, Q)
            history.append({"round": rnd, "gap": (primal - dual) / scale, "primal": primal,
                            "support": int(pt.support.shape[0]), "epochs": epochs})  # fmt: skip
            self._report(history[-1])
            if primal - dual <= self.tol * scale or rnd == self.max_rounds - 1:
                break  # certified; or the last round: the point returned is the one certified
            ws = self._working_set(prob, pt, cands, scores, want)
            target = self.inner_ratio * (primal - dual)
            if np.array_equal(ws, last_ws):
                # the same working set again: its problem is the whole one (no violator
                # outside), so solve it to the final target at once, not a fraction closer
                target = min(target, 0.5 * self.tol * scale)
            last_ws = ws
            history[-1]["ws_size"] = int(ws.shape[0])
            cols = _Columns(prob, ws)
            epochs += self._subproblem(prob, pt, ws, cols, target)
            history[-1]["seconds"] = time.perf_counter() - t0
        coef = sp.csr_matrix(_scatter(pt, int(prob.col_bounds[-1])).T)
        coef.eliminate_zeros()
        gap = (primal - dual) / scale
        return MulticlassResult(coef, pt.b.copy(), primal, dual, gap, self.tol,
                                bool(gap <= self.tol), len(history), epochs, history)  # fmt: skip

    def _report(self, entry: dict) -> None:
        if self.verbose:
            print(f"round {entry['round']:3d}  gap {entry['gap']:.3e}  "
                  f"support {entry['support']}")  # fmt: skip
        if self.callback is not None:
            self.callback(entry)

    # -- steps ----------------------------------------------------------------------------
    def _start(self, prob: MulticlassProblem) -> _Point:
        n, K = prob.codes.shape[0], prob.n_classes
        b = (self.datafit.initial_intercept(prob.codes, K, prob.weights) if prob.fit_intercept
             else np.zeros(K))  # fmt: skip
        Z = np.tile(b, (n, 1))
        pt = _Point(np.zeros(0, np.int64), np.zeros((0, K)), b, Z, np.empty((n, K)),
                    np.empty(n))  # fmt: skip
        pt.refresh()
        return pt

    def _warm(self, prob: MulticlassProblem, pt: _Point, start: WarmStart) -> None:
        """Move the point to ``start``: ``Z`` recomputed exactly from its columns."""
        cols = gather_ws_columns(prob.ex, prob.blocks, prob.col_bounds, start.support)
        pt.support, pt.W = start.support.copy(), np.array(start.W, dtype=np.float64)
        if prob.fit_intercept and start.b is not None:
            pt.b = np.array(start.b, dtype=np.float64)
        pt.Z = decisions_at(cols, pt.W, pt.b, pt.Z.shape[0])
        pt.refresh()
        if prob.fit_intercept:  # the dual point's constraint needs b optimal for this W
            pt.Z, pt.b = self.datafit.fit_intercept(prob.codes, pt.Z, pt.b, prob.weights)
            pt.refresh()

    def alpha_max(self, prob: MulticlassProblem, l1_ratio: float) -> float:
        """The smallest ``alpha`` at which ``W = 0`` (with its optimal intercept) is the
        answer: one pass, the largest dual-norm group of ``X^T Theta_0`` over ``n l1_ratio``."""
        pt = self._start(prob)
        theta = self.datafit.dual_point(prob.codes, pt.P, prob.weights)
        absmax = self._pass(prob, theta)[0]
        return ElasticNet.alpha_max(absmax / pt.Z.shape[0], l1_ratio)

    def _parts(self, prob: MulticlassProblem) -> list[list[int]]:
        k = len(prob.blocks)
        return [list(g) for g in np.array_split(np.arange(k), max(1, min(prob.n_partitions, k)))]

    def _pass(self, prob: MulticlassProblem, theta: np.ndarray, want: int = 1):
        """One pass over every block (a task per partition): the gap's statistics and each
        block's ``want`` largest groups as candidates (as many as the next working set
        may take: the support's own features among them)."""
        n = theta.shape[0]
        threshold = n * prob.penalty.alpha_l1
        futs = [prob.ex.submit(mc_scan_task, [prob.blocks[j] for j in part],
                               [int(prob.col_bounds[j]) for j in part], theta, prob.grouped,
                               threshold, want)
                for part in self._parts(prob)]  # fmt: skip
        scans = prob.ex.gather(futs)
        absmax = max((s.absmax for s in scans), default=0.0)
        excess = sum(s.excess_sq for s in scans)
        cands = np.concatenate([s.candidates for s in scans])
        scores = np.concatenate([s.scores for s in scans])
        return absmax, excess, cands, scores

    def _gap(self, prob: MulticlassProblem, pt: _Point, absmax: float, excess: float,
             Q: np.ndarray):  # fmt: skip
        """``(primal, dual)`` at the point, from the pass's statistics of the dual point
        made from the probabilities ``Q``."""
        n = pt.Z.shape[0]
        pen = prob.penalty
        primal = self.datafit.value(prob.codes, pt.Z, prob.weights) + block_penalty(pen, pt.W)
        scales = dual_scales(pen, absmax, n)
        conj = self.datafit.conjugates(prob.codes, Q, scales, prob.weights)
        return primal, dual_from_conjugates(pen, scales, conj, excess, n)

    def _ws_size(self, pt: _Point, last_ws: int) -> int:
        """The next working set's size (:func:`~dl1.tasks.growth.next_ws_size`, the binary
        rule), from the support and the last working set's size."""
        return next_ws_size(pt.support.shape[0], last_ws, self.ws_start)

    def _working_set(self, prob, pt: _Point, cands: np.ndarray, scores: np.ndarray,
                     size: int):  # fmt: skip
        """The support plus the worst violators (largest dual-norm groups) up to ``size``
        features, sorted."""
        order = np.argsort(-scores, kind="stable")
        new = cands[order][~np.isin(cands[order], pt.support)]
        _, first = np.unique(new, return_index=True)
        new = new[np.sort(first)][: max(size - pt.support.shape[0], 0)]
        return np.union1d(pt.support, new).astype(np.int64)

    def _subproblem(self, prob: MulticlassProblem, pt: _Point, ws: np.ndarray,
                    cols: _Columns, target: float) -> int:  # fmt: skip
        """Solve the problem restricted to ``ws`` (its columns ``cols``) to a gap of
        ``target``; the point moves to its answer (the support: the rows left nonzero).
        Returns the epochs it took."""
        n, K = pt.Z.shape
        W = np.zeros((ws.shape[0], K))
        W[np.searchsorted(ws, pt.support)] = pt.W
        Z = np.tile(pt.b, (n, 1))
        csc_mat_add(cols.indptr, cols.indices, cols.data, W, Z)  # exact, not drifted
        pt.Z, pt.W, pt.support = Z, W, ws
        pt.refresh()
        rp = Restricted(cols.indptr, cols.indices, cols.data, cols.sqnorm, prob.codes,
                        prob.sample_weight, prob.penalty, prob.grouped, prob.fit_intercept)
        epochs = self.newton.solve(rp, pt, target, self.max_epochs,
                                   lambda: self._restricted_gap(prob, pt, cols))
        keep = np.flatnonzero(np.abs(pt.W).max(axis=1) > 0)
        pt.support, pt.W = ws[keep], pt.W[keep]
        return epochs

    def _restricted_gap(self, prob: MulticlassProblem, pt: _Point, cols: _Columns) -> float:
        Q, V = self._dual_probabilities(prob, pt, cols)
        n = Q.shape[0]
        norms = group_norms(V, prob.grouped)
        absmax = float(norms.max(initial=0.0))
        excess = excess_sq(V, prob.grouped, n * prob.penalty.alpha_l1)
        primal, dual = self._gap(prob, pt, absmax, excess, Q)
        return primal - dual

    def _dual_probabilities(
        self, prob: MulticlassProblem, pt: _Point, cols: _Columns | None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """``(Q, X_W^T Theta)``: the probabilities whose dual point ``Theta = S (Y - Q)``
        certifies the point, with its values on the working set's columns (None without
        them). Where the penalty is the L1 norm of each coefficient, ``P`` is repaired on
        the working set (:meth:`~dl1.objective.datafits.multinomial.Multinomial.repaired`):
        near an answer the largest violations sit there, on coefficients still growing
        where the probabilities vanish, and rescaling every row by them would cost the dual
        far more (the uniform rescaling still takes what remains). Otherwise ``Q = P``."""
        if cols is None:
            return pt.P, None
        if cols.dual is None or not np.array_equal(cols.dual.Z, pt.Z):
            cols.dual = _DualAt(pt.Z.copy(), *self._dual_on(prob, pt, cols))
        return cols.dual.Q, cols.dual.V

    def _dual_on(self, prob: MulticlassProblem, pt: _Point,
                 cols: _Columns) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        pen = prob.penalty
        n = pt.P.shape[0]
        if prob.grouped or pen.alpha_l2 > 0.0 or pen.alpha_l1 <= 0.0:
            V = np.empty((cols.indptr.shape[0] - 1, pt.P.shape[1]))
            theta = self.datafit.dual_point(prob.codes, pt.P, prob.weights)
            csc_xt_mat(cols.indptr, cols.indices, cols.data, theta, V)
            return pt.P, V
        columns = (cols.indptr, cols.indices, cols.data)
        return self.datafit.repaired(prob.codes, pt.P, columns, n * pen.alpha_l1, prob.weights,
                                     prob.fit_intercept)  # fmt: skip


def _scatter(pt: _Point, p: int) -> sp.csr_matrix:
    """The support's rows as a sparse ``(p, K)`` matrix."""
    K = pt.W.shape[1]
    rows = np.repeat(pt.support, K)
    cols = np.tile(np.arange(K), pt.support.shape[0])
    return sp.csr_matrix((pt.W.ravel(), (rows, cols)), shape=(p, K))
