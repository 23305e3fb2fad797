"""Proximal stochastic dual coordinate ascent (Shalev-Shwartz & Zhang) over row blocks,
combined by CoCoA+, certified per round.

When to use it: many more samples than features, a tight certificate wanted, and a ridge
part in the penalty (elastic net, ``l1_ratio < 1``) or a loss whose dual steps are in
closed form (squared, hinge, smoothed hinge): its rate is linear, ``O((1 + R^2 / (lambda
n)) log(1/eps))`` passes for ``lambda = alpha (1 - l1_ratio)``. For a pure Lasso the paper
adds the ridge ``lambda = eps / B^2`` (Sec. 3.1), which makes it slow at tight tolerances:
prefer the working-set solver there.

A round: every partition runs Option-I dual steps (:mod:`dl1.kernels.sdca`) on its rows,
``n_epochs`` local passes, on the CoCoA+ local subproblem with ``sigma' = K`` partitions
(Smith et al., JMLR 2018, Eq. (8)), so that adding the partitions' updates never lowers the
dual; the coordinator adds the dual changes and ``v = (1/(lambda n)) sum_i alpha_i x_i``.
The model is ``w = grad g*(v)``, a soft-threshold of ``v``; the loop and the certificate
(duality gap of the penalised problem itself, the intercept refitted exactly) are
:class:`dl1.solvers.rowwise.SampleWiseSolver`'s.

The unpenalised intercept is handled by the method of multipliers (augmented Lagrangian)
on the dual constraint ``sum_i alpha_i = 0`` that it imposes and that single-coordinate
steps cannot keep: each round solves, by its dual steps, the proximal problem ``P(w, b) +
lambda (b - c)^2 / (2 kappa^2)`` (the kernel's constant feature ``kappa`` with the offset
``c``: an unconstrained dual), and then moves the centre ``c`` to that problem's intercept
``c + kappa v_b`` (the multiplier update). At a fixed point ``v_b = 0``, i.e. ``sum alpha =
0``, and ``c`` is the unpenalised optimum's intercept: no bias. The certificate refits the
intercept exactly, so it certifies the problem itself. (Holding the refitted intercept
through a round instead, block coordinate descent on ``(w, b)``, stalled with the hinge:
relative gap 4e-2 after 100 rounds where this reaches 1e-6.)
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from dl1.kernels.sdca import lasso_ridge, primal_from_dual
from dl1.solvers.base import Problem, WarmState
from dl1.solvers.options import SolverOptions
from dl1.solvers.result import convergence_warning
from dl1.solvers.rowwise import SampleWiseSolver, rows_xt_theta
from dl1.tasks.stochastic import SDCAOutput, SDCASettings, sdca_round_task


@dataclass(frozen=True)
class SDCAState:
    """The dual variables (length n), ``v``, the model, and ``b``: the centre ``c`` of the
    intercept (the round's subproblem has the intercept ``c + kappa v_b``)."""

    alpha: np.ndarray
    v: np.ndarray
    w: np.ndarray
    b: float
    settings: SDCASettings
    #: the intercept feature's coordinate ``(1/(lambda n)) sum_i kappa alpha_i``
    vb: float = 0.0


class SDCASolver(SampleWiseSolver):
    """Rounds of Prox-SDCA local passes on every partition, added by CoCoA+.

    Parameters
    ----------
    max_epochs, seed, shuffle, certify_every, verbose, callback
        As :class:`~dl1.solvers.rowwise.SampleWiseSolver` (an epoch is a round).
    n_epochs : int
        Local passes over a partition's rows per round.
    intercept_scale : float
        With an intercept, the value ``kappa`` of its constant feature as a fraction of the
        largest row norm (module docstring). Measured on the hinge: 0.1 reached relative
        gap 1e-6 by round 150 where 1 was at 1.3e-5 after 300 (``benchmarks/RESULTS.md``).
    """

    name = "sdca"

    @classmethod
    def from_options(cls, o: SolverOptions) -> SDCASolver:
        """This solver configured from the entry points' keywords (those it has)."""
        return cls(**o.epochs, n_epochs=o.n_epochs, seed=o.seed, verbose=o.verbose,
                   callback=o.callback)  # fmt: skip

    def __init__(
        self,
        *,
        max_epochs: int = 100,
        n_epochs: int = 1,
        intercept_scale: float = 0.1,
        seed: int = 0,
        shuffle: bool = True,
        certify_every: int = 1,
        verbose: bool = False,
        callback: Any = None,
    ) -> None:
        super().__init__(max_epochs=max_epochs, seed=seed, shuffle=shuffle,
                         certify_every=certify_every, verbose=verbose, callback=callback)
        self.n_epochs = n_epochs
        self.intercept_scale = intercept_scale

    def _settings(self, pb: Problem) -> SDCASettings:
        l1, l2 = pb.penalty.alpha_l1, pb.penalty.alpha_l2
        if l2 == 0.0 and pb.p_zero > 0:
            # Sec. 3.1: an (eps/2)-accurate solution with the ridge eps / B^2 is eps-accurate
            l2 = lasso_ridge(pb.tol * pb.p_zero / 2, l1, pb.p_zero)
            self._warn_if_slow(pb, l2)
        elif l2 == 0.0:  # P(0) = 0 <= P(w): w = 0 is optimal, certified before any round
            l2 = l1
        kappa = 0.0
        if pb.fit_intercept:
            kappa = self.intercept_scale * math.sqrt(max(pb.rows.row_sqnorm_max, 1e-300))
        return SDCASettings(pb.datafit.code, l1, l2, float(len(pb.rows.parts)), self.n_epochs, pb.n,
                            kappa=kappa)  # fmt: skip

    def _warn_if_slow(self, pb: Problem, ridge: float) -> None:
        """Warn when Theorem 1's round count with the Lasso's ridge, ``(1 + sigma' beta R^2
        / (ridge n)) log(1 / tol)``, exceeds ``max_epochs``."""
        K = len(pb.rows.parts)
        rounds = (1 + K * self._curvature(pb) * pb.rows.row_sqnorm_max / (ridge * pb.n)) * max(
            1.0, math.log(1.0 / pb.tol)
        )
        if rounds > self.max_epochs:
            warnings.warn(
                f"Prox-SDCA on a pure L1 penalty solves it with the ridge {ridge:.3g} "
                f"(Shalev-Shwartz & Zhang, Sec. 3.1), which needs about {rounds:.3g} rounds "
                f"for tol={pb.tol:g}, more than max_epochs={self.max_epochs}; the "
                "working-set solver ('ws') is the one for the Lasso",
                convergence_warning(),
                stacklevel=6,
            )

    def _start(self, pb: Problem, warm: WarmState | None, rate: float | None = None) -> (
        SDCAState
    ):
        """From ``alpha = 0``, or from the dual point of ``warm``'s predictions (the
        optimum's relation ``alpha_i = -s_i loss'(y_i, z_i)``; no step: ``rate`` unused)."""
        st = self._settings(pb)
        if warm is None:
            return SDCAState(np.zeros(pb.n), np.zeros(pb.p), np.zeros(pb.p),
                             pb.initial_intercept(), st)  # fmt: skip
        alpha = pb.datafit.dual_point(pb.y, warm.z, pb.weights, False)
        v = rows_xt_theta(pb.executor, pb.rows, alpha) / (st.l2 * pb.n)
        vb = st.kappa * float(alpha.sum()) / (st.l2 * pb.n)
        # the centre such that the subproblem's intercept is warm's
        return self._state(alpha, v, float(warm.intercept) - st.kappa * vb, st, vb)

    @staticmethod
    def _state(alpha, v, b, st: SDCASettings, vb: float = 0.0) -> SDCAState:
        w, _ = primal_from_dual(v, 0.0, st.l1, st.l2)
        return SDCAState(alpha, v, w, b, st, vb)

    def _dual_candidate(self, state: SDCAState) -> np.ndarray:
        """The dual variables themselves (``theta = alpha``)."""
        return state.alpha

    def _epoch(self, pb: Problem, state: SDCAState, epoch: int) -> list[SDCAOutput]:
        ex, rows = pb.executor, pb.rows
        out = []
        for q, part in enumerate(rows.parts):
            lo, hi = int(rows.row_bounds[part[0]]), int(rows.row_bounds[part[-1] + 1])
            out.append(ex.submit_to(
                q, sdca_round_task, [rows.blocks[i] for i in part], state.alpha[lo:hi], lo,
                state.v, state.vb, state.b, pb.handles.y, pb.handles.sample_weight,
                state.settings,
                self._seed(epoch, q, len(rows.parts)),
            ))  # fmt: skip
        return ex.gather(out)

    def _combine(self, pb: Problem, state: SDCAState, outs: list[SDCAOutput]) -> SDCAState:
        """The partitions' dual changes and ``v`` changes added (CoCoA+ adding)."""
        alpha = state.alpha.copy()
        for o in outs:
            for r0, da in o.d_alpha:
                alpha[r0 : r0 + da.shape[0]] += da
        v = state.v + np.sum([o.dv for o in outs], axis=0)
        vb = state.vb + sum(o.dvb for o in outs)
        # method of multipliers for the unpenalised intercept: the centre moves to the
        # intercept of the round's (proximal) subproblem, centre + kappa v_b
        return self._state(alpha, v, state.b + state.settings.kappa * vb, state.settings, vb)
