"""SMIDAS, stochastic mirror descent made sparse (Shalev-Shwartz & Tewari 2011, Algorithm
3), over row blocks, certified per epoch.

When to use it: an L1 problem (``l1_ratio=1``) with very many features of which few matter,
read a few times: its p-norm link (``p = 2 ln d``) makes the rate depend on ``||w*||_1``
and ``log d`` rather than on ``||w*||_2`` and ``d`` (Theorem 3), the regime where plain SGD
is slowest. Rate O(1/sqrt(T)); a step costs O(nnz(x_i) + |supp(theta)|)
(:mod:`dl1.kernels.smidas`).

Every partition runs SMIDAS steps over its rows from the epoch's mirror vector ``theta``;
the coordinator averages the partitions' ``theta`` (and intercepts), weighted by their
rows: mixing in the mirror space, where the steps are taken. With one partition an epoch
is sequential SMIDAS. The step is a constant ``eta``, as the paper's. Theorem 3's (for
``T`` steps, :func:`dl1.kernels.smidas.smidas_eta` and ``smidas_eta_smooth``, with ``B >=
||w*||_1`` and data scaled to ``|x_ij| <= 1``) guards against the worst case and is hundreds
of times too small on typical data (3x the optimal Lasso objective after 50 epochs on a
3,000 x 2,000 problem), so by default ``eta`` is calibrated before the first epoch on a
sample of rows (:mod:`dl1.solvers.calibration`, after Bottou's SGD). The loop and the
certificate are :class:`dl1.solvers.rowwise.SampleWiseSolver`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dl1.errors import ValidationError
from dl1.kernels.smidas import smidas_p
from dl1.solvers.base import Problem, WarmState
from dl1.solvers.calibration import FACTORS
from dl1.solvers.rowwise import SampleWiseSolver
from dl1.tasks.stochastic import (
    SMIDASOutput,
    SMIDASSettings,
    SMIDASTrial,
    link,
    link_inverse,
    smidas_epoch_task,
)


@dataclass(frozen=True)
class SMIDASState:
    """The mirror vector, the model it gives, and the step's settings."""

    theta: np.ndarray
    w: np.ndarray
    b: float
    settings: SMIDASSettings


class SMIDASSolver(SampleWiseSolver):
    """Epochs of SMIDAS over row blocks, mirror vectors averaged per epoch, each certified.

    Parameters
    ----------
    max_epochs, seed, shuffle, certify_every, verbose, callback
        As :class:`~dl1.solvers.rowwise.SampleWiseSolver`.
    eta : float, optional
        The constant step. Default (None): calibrated before the first epoch on a sample
        of rows (:mod:`dl1.solvers.calibration`: one pass over the sample for each of
        ``eta_b * 2^k``, ``k = 0 .. 6``, with ``eta_b = 1 / (beta max_i ||x_i||^2)``; the
        lowest regularised objective on the sample wins), at most half an epoch's steps
        from 1,800 rows. A value skips the calibration. The step used is
        ``history_[0]["eta"]``.

    Examples
    --------
    >>> from dl1.solvers.smidas import SMIDASSolver
    >>> calibrated = SMIDASSolver(max_epochs=50)  # eta from a sample of rows
    >>> fixed = SMIDASSolver(max_epochs=50, eta=0.1)  # no calibration
    """

    name = "smidas"
    rate_parameter = "eta"

    def __init__(
        self,
        *,
        max_epochs: int = 20,
        eta: float | None = None,
        seed: int = 0,
        shuffle: bool = True,
        certify_every: int = 1,
        verbose: bool = False,
        callback: Any = None,
    ) -> None:
        super().__init__(max_epochs=max_epochs, seed=seed, shuffle=shuffle,
                         certify_every=certify_every, verbose=verbose, callback=callback)
        self.eta = eta

    def _base_rate(self, pb: Problem) -> float:
        """``1 / (beta max_i ||x_i||^2)``, SGD's base step (the link is 1-homogeneous, so
        the step scales with the data as SGD's)."""
        return 1.0 / (self._curvature(pb) * max(pb.rows.row_sqnorm_max, 1e-300))

    def _candidates(self, pb: Problem) -> list[float]:
        """The base step times the ladder's factors from 1: on a short sample, steps below
        the base leave ``w`` near 0 and can look best (the hinge) while the run needs more
        (measured: the base step or larger was best after 20-50 epochs in every case)."""
        return [self._base_rate(pb) * f for f in FACTORS if f >= 1.0]

    def _trial(self, pb: Problem, state: SMIDASState) -> SMIDASTrial:
        return SMIDASTrial(state.settings, state.theta, state.b)

    def _settings(self, pb: Problem, eta: float | None) -> SMIDASSettings:
        if pb.penalty.alpha_l2 > 0:
            raise ValidationError(
                "solver='smidas' is for the L1 penalty (l1_ratio=1); use 'rda', 'fobos' or "
                "'sdca' for the elastic net"
            )
        eta = self._base_rate(pb) if eta is None else eta
        return SMIDASSettings(pb.datafit.code, pb.penalty.alpha_l1, pb.fit_intercept, float(eta),
                              smidas_p(pb.p))  # fmt: skip

    def _start(self, pb: Problem, warm: WarmState | None, rate: float | None = None) -> (
        SMIDASState
    ):
        st = self._settings(pb, rate)
        if warm is None:
            return SMIDASState(np.zeros(pb.p), np.zeros(pb.p), pb.initial_intercept(), st)
        w = np.asarray(warm.coef, dtype=np.float64)
        return SMIDASState(link(w, st.p), w.copy(), float(warm.intercept), st)

    def _epoch(self, pb: Problem, state: SMIDASState, epoch: int) -> list[SMIDASOutput]:
        return self._on_partitions(
            pb, epoch, smidas_epoch_task, state.theta, state.b, pb.handles.y,
            pb.handles.sample_weight, state.settings,
        )  # fmt: skip

    def _combine(self, pb: Problem, state: SMIDASState, outs: list[SMIDASOutput]) -> (
        SMIDASState
    ):
        """The partitions' mirror vectors and intercepts averaged, weighted by rows."""
        total = sum(o.steps for o in outs)
        theta = np.sum([o.theta * (o.steps / total) for o in outs], axis=0)
        b = float(sum(o.b * (o.steps / total) for o in outs))
        return SMIDASState(theta, link_inverse(theta, state.settings.p), b, state.settings)
