"""l1-regularised dual averaging (Xiao 2009) over row blocks, certified per epoch.

When to use it: as SGD (many more samples than features, a few passes, moderate accuracy),
when the model should be sparse along the way: RDA thresholds the running average of all
past gradients, not the last step, so it sets many more weights exactly to zero than
truncated-gradient SGD at the same test error (the paper's Sec. 5). ``rho > 0`` is the
"enhanced" variant, sparser still. Rate O(1/sqrt(T)) for the averaged iterate.

The state of the method is the sum of all loss gradients ``G`` and the step count ``t``
(:mod:`dl1.kernels.rda`); every partition runs a pass from the pooled state and the
coordinator adds the partitions' gradient sums and steps: their dual averages are pooled
(``gbar = sum_k G_k / sum_k t_k``), and with one partition an epoch is sequential RDA. The
loop and the certificate are :class:`dl1.solvers.rowwise.SampleWiseSolver`'s.

``rda_gamma`` needs no tuning: by default it is calibrated before the first epoch on a
sample of rows (:mod:`dl1.solvers.calibration`, after Bottou's SGD); a given value is used
as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from dl1.kernels.rda import rda_state, rda_weights
from dl1.solvers.base import Problem, WarmState
from dl1.solvers.calibration import FACTORS
from dl1.solvers.rowwise import SampleWiseSolver
from dl1.tasks.stochastic import RDAOutput, RDASettings, RDATrial, rda_epoch_task


@dataclass(frozen=True)
class RDAState:
    """The pooled dual average (``G``, ``G_b`` over ``t`` steps) and the model it gives."""

    G: np.ndarray
    Gb: float
    t: float
    w: np.ndarray
    b: float
    settings: RDASettings


class RDASolver(SampleWiseSolver):
    """Epochs of l1-RDA over row blocks, dual averages pooled per epoch, each certified.

    Parameters
    ----------
    max_epochs, seed, shuffle, certify_every, verbose, callback
        As :class:`~dl1.solvers.rowwise.SampleWiseSolver`.
    rda_gamma : float, optional
        ``beta_t = rda_gamma sqrt(t)`` (Eq. (8)); the paper's best is ``L / D`` (bounds of
        the gradients and of ``||w*||``), rarely known. Default (None): calibrated before
        the first epoch on a sample of rows (:mod:`dl1.solvers.calibration`: one pass over
        the sample for each of ``gamma_b / 2^k``, ``k = -2 .. 6``, the lowest regularised
        objective on the sample wins; at most half an epoch's steps from 1,800 rows), with
        ``gamma_b = beta max_i ||x_i||^2 / sqrt(n)``, which makes the step given to each gradient,
        ``1 / (gamma_b sqrt(t))``, the SGD solver's base ``eta0 / sqrt(1 + t / n)`` once
        ``t >> n``. A value skips the calibration. The value used is
        ``history_[0]["rda_gamma"]``. Also used with a ridge part, where the paper allows
        ``beta_t = 0``: with a small ridge that makes the first iterates ``-gbar / l2`` huge.
    rho : float
        Sparsity-enhancing weight of ``rho ||w||_1`` in ``h`` (0: plain l1-RDA).

    Examples
    --------
    >>> from dl1.solvers.rda import RDASolver
    >>> calibrated = RDASolver(max_epochs=50)  # rda_gamma from a sample of rows
    >>> fixed = RDASolver(max_epochs=50, rda_gamma=5.0)  # no calibration
    """

    name = "rda"
    rate_parameter = "rda_gamma"

    def __init__(
        self,
        *,
        max_epochs: int = 20,
        rda_gamma: float | None = None,
        rho: float = 0.0,
        seed: int = 0,
        shuffle: bool = True,
        certify_every: int = 1,
        verbose: bool = False,
        callback: Any = None,
    ) -> None:
        super().__init__(max_epochs=max_epochs, seed=seed, shuffle=shuffle,
                         certify_every=certify_every, verbose=verbose, callback=callback)
        self.rda_gamma = rda_gamma
        self.rho = rho

    def _base_rate(self, pb: Problem) -> float:
        """``beta max_i ||x_i||^2 / sqrt(n)``: a step of ``1 / (gamma sqrt(t))`` per
        gradient, SGD's schedule ``eta0 / sqrt(1 + t / n)`` with its base ``eta0`` (see
        :mod:`dl1.solvers.sgd`) once ``t >> n``."""
        return self._curvature(pb) * max(pb.rows.row_sqnorm_max, 1e-300) / math.sqrt(pb.n)

    def _candidates(self, pb: Problem) -> list[float]:
        """``gamma`` is the inverse of a step: the base divided by the ladder's factors."""
        return [self._base_rate(pb) / f for f in FACTORS]

    def _trial(self, pb: Problem, state: RDAState) -> RDATrial:
        return RDATrial(state.settings, state.w, state.b, state.t)

    def _settings(self, pb: Problem, gamma: float | None) -> RDASettings:
        gamma = self._base_rate(pb) if gamma is None else gamma
        return RDASettings(pb.datafit.code, pb.penalty.alpha_l1, pb.penalty.alpha_l2,
                           pb.fit_intercept, float(gamma), float(self.rho), 1.0)  # fmt: skip

    def _start(self, pb: Problem, warm: WarmState | None, rate: float | None = None) -> (
        RDAState
    ):
        """From zero, or from the dual average whose weights are ``warm``'s after ``n``
        steps (Eq. (6) inverted coordinate by coordinate)."""
        st = self._settings(pb, rate)
        if warm is None:
            return RDAState(np.zeros(pb.p), 0.0, 0.0, np.zeros(pb.p), 0.0, st)
        t = float(pb.n)
        b = float(warm.intercept) if pb.fit_intercept else 0.0
        G, Gb = rda_state(warm.coef, b, t, st.l1, st.l2, st.gamma, st.rho, st.gamma_b)
        w, b = rda_weights(G, t, st.l1, st.l2, st.gamma, st.rho, Gb, st.gamma_b)
        return RDAState(G, Gb, t, w, b, st)

    def _epoch(self, pb: Problem, state: RDAState, epoch: int) -> list[RDAOutput]:
        return self._on_partitions(
            pb, epoch, rda_epoch_task, state.G, state.Gb, state.t, pb.handles.y,
            pb.handles.sample_weight, state.settings,
        )  # fmt: skip

    def _combine(self, pb: Problem, state: RDAState, outs: list[RDAOutput]) -> RDAState:
        """The partitions' gradient sums and steps added: one pooled dual average."""
        G = state.G + np.sum([o.dG for o in outs], axis=0)
        Gb = state.Gb + sum(o.dGb for o in outs)
        t = state.t + sum(o.steps for o in outs)
        st = state.settings
        w, b = rda_weights(G, t, st.l1, st.l2, st.gamma, st.rho, Gb, st.gamma_b)
        return RDAState(G, Gb, t, w, b, st)
