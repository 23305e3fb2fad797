"""Stochastic gradient descent and FoBoS over row blocks, with lazy elastic-net updates.

When to use it: samples far outnumber features and a moderate accuracy is enough (a
relative gap of 1e-2 to 1e-4 in a few passes), or the data is to be read a few times in
order. Its rate is O(1/sqrt(T)) (O(log T / T) with a ridge part): for a tight
certificate, use the working-set solver (``"ws"``).

Each partition runs one pass of lazy SGD / FoBoS steps (Lipton & Elkan 2015;
:mod:`dl1.kernels.lazy`) over its rows from the epoch's model, and the coordinator
averages the partitions' models weighted by their rows (parameter mixing: Mann et al.
2009, Zinkevich et al. 2010); with one partition an epoch is plain sequential SGD. The
loop and the certificate are :class:`dl1.solvers.rowwise.SampleWiseSolver`'s.

The first step ``eta0`` needs no tuning: by default it is calibrated before the first epoch
on a sample of rows (:mod:`dl1.solvers.calibration`, after Bottou's SGD), among multiples
of ``1 / (beta max_i ||x_i||^2)``; a given ``eta0`` is used as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dl1.solvers.base import Problem, WarmState
from dl1.solvers.rowwise import SampleWiseSolver
from dl1.tasks.stochastic import SGDOutput, SGDSettings, SGDTrial, sgd_epoch_task

LEARNING_RATES = ("constant", "invsqrt", "inverse")


@dataclass(frozen=True)
class SGDState:
    """An epoch's start: the model and the steps taken so far (decaying rates)."""

    w: np.ndarray
    b: float
    steps: int
    settings: SGDSettings


class StochasticGradientSolver(SampleWiseSolver):
    """Epochs of lazy SGD over row blocks, models averaged per epoch, each certified.

    Parameters
    ----------
    max_epochs, seed, shuffle, certify_every, verbose, callback
        As :class:`~dl1.solvers.rowwise.SampleWiseSolver`.
    learning_rate : {"invsqrt", "constant", "inverse"}
        ``eta_t = eta0 / sqrt(1 + t / n)``, ``eta0``, or ``eta0 / (1 + t / n)`` (``t`` counts
        steps over all epochs, ``n`` is the number of samples).
    eta0 : float, optional
        First step. Default (None): calibrated before the first epoch on a sample of rows
        (:mod:`dl1.solvers.calibration`: one pass over the sample for each of
        ``eta_b * 2^k``, ``k = -2 .. 6``, with ``eta_b = 1 / (beta max_i ||x_i||^2)`` the
        largest step that cannot overshoot one example's loss, ``beta`` bounding its
        curvature; the lowest regularised objective on the sample wins), at most half an
        epoch's steps from 1,800 rows. A value skips the calibration. The step used is
        ``history_[0]["eta0"]``, the calibration's record ``history_[0]["calibration"]``.

    Examples
    --------
    >>> from dl1.solvers.sgd import StochasticGradientSolver
    >>> calibrated = StochasticGradientSolver(max_epochs=50)  # eta0 from a sample of rows
    >>> fixed = StochasticGradientSolver(max_epochs=50, eta0=0.01)  # no calibration
    """

    name = "sgd"
    form = "sgd"
    rate_parameter = "eta0"

    def __init__(
        self,
        *,
        max_epochs: int = 20,
        learning_rate: str = "invsqrt",
        eta0: float | None = None,
        seed: int = 0,
        shuffle: bool = True,
        certify_every: int = 1,
        verbose: bool = False,
        callback: Any = None,
    ) -> None:
        super().__init__(max_epochs=max_epochs, seed=seed, shuffle=shuffle,
                         certify_every=certify_every, verbose=verbose, callback=callback)
        if learning_rate not in LEARNING_RATES:
            raise ValueError(
                f"learning_rate must be one of {LEARNING_RATES}, got {learning_rate!r}"
            )
        self.learning_rate = learning_rate
        self.eta0 = eta0

    def _start(self, pb: Problem, warm: WarmState | None, rate: float | None = None) -> (
        SGDState
    ):
        w = np.zeros(pb.p) if warm is None else np.array(warm.coef, dtype=np.float64)
        b = pb.initial_intercept() if warm is None else float(warm.intercept)
        return SGDState(w, b, 0, self._settings(pb, rate))

    def _base_rate(self, pb: Problem) -> float:
        """``1 / (beta max_i ||x_i||^2)``: no step overshoots one example's loss."""
        return 1.0 / (self._curvature(pb) * max(pb.rows.row_sqnorm_max, 1e-300))

    def _candidates(self, pb: Problem) -> list[float]:
        """The base step's multiples, held below ``0.5 / l2`` in the SGD form (its ridge
        factor ``1 - eta l2`` stays positive)."""
        cands = super()._candidates(pb)
        if self.form == "sgd" and pb.penalty.alpha_l2 > 0:
            cands = [min(c, 0.5 / pb.penalty.alpha_l2) for c in cands]
        return cands

    def _trial(self, pb: Problem, state: SGDState) -> SGDTrial:
        return SGDTrial(state.settings, state.w, state.b)

    def _settings(self, pb: Problem, eta0: float | None) -> SGDSettings:
        eta0 = self._base_rate(pb) if eta0 is None else eta0
        if self.form == "sgd" and eta0 * pb.penalty.alpha_l2 >= 1.0:
            eta0 = 0.5 / pb.penalty.alpha_l2  # keeps the ridge factor 1 - eta l2 positive
        return SGDSettings(
            self.form, pb.datafit.code, pb.penalty.alpha_l1, pb.penalty.alpha_l2, pb.fit_intercept,
            float(eta0), self.learning_rate, 1.0 / pb.n,
        )  # fmt: skip

    def _epoch(self, pb: Problem, state: SGDState, epoch: int) -> list[SGDOutput]:
        """Every partition's pass, from the same model and step count."""
        return self._on_partitions(
            pb, epoch, sgd_epoch_task, state.w, state.b, pb.handles.y,
            pb.handles.sample_weight, state.settings, state.steps,
        )  # fmt: skip

    def _combine(self, pb: Problem, state: SGDState, outs: list[SGDOutput]) -> SGDState:
        """The partitions' models averaged, weighted by their rows (parameter mixing)."""
        total = sum(o.steps for o in outs)
        w = np.sum([o.w * (o.steps / total) for o in outs], axis=0)
        b = float(sum(o.b * (o.steps / total) for o in outs))
        return SGDState(w, b, state.steps + total, state.settings)


class FobosSolver(StochasticGradientSolver):
    """:class:`StochasticGradientSolver` with FoBoS's proximal elastic-net step (Duchi &
    Singer 2009) instead of the subgradient step: exact zeros at every step, and no bound
    on ``eta * l2``. When to use it: as SGD, when the model's sparsity along the way
    matters."""

    name = "fobos"
    form = "fobos"
