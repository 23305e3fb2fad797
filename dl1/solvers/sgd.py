"""Stochastic gradient descent and FoBoS over row blocks, with lazy elastic-net updates,
certified by the duality gap of the penalised problem.

When to use it: samples far outnumber features and a moderate accuracy is enough (a
relative gap of 1e-2 to 1e-4 in a few passes), or the data is to be read a few times in
order. Its rate is O(1/sqrt(T)) (O(log T / T) with a ridge part): for a tight
certificate, use the working-set solver (``"ws"``).

An epoch: every partition (a group of row blocks, on one worker) runs one pass of lazy
SGD / FoBoS steps (Lipton & Elkan 2015; :mod:`dl1.kernels.lazy`) over its rows, from the
round's model; the coordinator averages the partitions' models, weighted by their rows
(parameter mixing: Mann et al. 2009, Zinkevich et al. 2010). With one partition the epoch
is plain sequential SGD. Then the certificate: ``z = X w``, the intercept refitted exactly
for ``w``, the dual point ``theta`` and ``X^T theta`` (reduced from the row blocks) give the
duality gap of the averaged model, which is what is returned: mixing changes the
iterates, never what the certificate says about them.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from dl1.loading import rows_xt_theta
from dl1.objective.gap import duality_gap_from_stats
from dl1.solvers.base import Problem, WarmState
from dl1.solvers.result import Certificate, FitResult, make_result
from dl1.tasks.rows import SGDOutput, SGDSettings, rows_matvec_task, sgd_epoch_task

LEARNING_RATES = ("constant", "invsqrt", "inverse")


class StochasticGradientSolver:
    """Epochs of lazy SGD over row blocks, models mixed per epoch, each certified.

    Parameters
    ----------
    max_epochs : int
        Passes over the data at most; reaching it warns with the gap reached.
    learning_rate : {"invsqrt", "constant", "inverse"}
        ``eta_t = eta0 / sqrt(1 + t / n)``, ``eta0``, or ``eta0 / (1 + t / n)`` (``t`` counts
        steps over all epochs, ``n`` is the number of samples).
    eta0 : float, optional
        First step; default ``1 / (beta * max_i ||x_i||^2)``, the largest step that cannot
        overshoot one example's loss (``beta`` bounds the loss's curvature).
    seed : int
        Seed of the block and row orders (a new order every epoch).
    verbose, callback : a line, or a call with the history entry, per epoch.
    """

    name = "sgd"
    form = "sgd"
    layout = "rows"
    direct_calls = False

    def __init__(
        self,
        *,
        max_epochs: int = 20,
        learning_rate: str = "invsqrt",
        eta0: float | None = None,
        seed: int = 0,
        verbose: bool = False,
        callback: Any = None,
    ) -> None:
        if learning_rate not in LEARNING_RATES:
            raise ValueError(
                f"learning_rate must be one of {LEARNING_RATES}, got {learning_rate!r}"
            )
        self.max_epochs = max_epochs
        self.learning_rate = learning_rate
        self.eta0 = eta0
        self.seed = seed
        self.verbose = verbose
        self.callback = callback

    def solve(self, problem: Problem, warm: WarmState | None = None) -> tuple[
        FitResult, WarmState
    ]:
        """Epochs until the averaged model is certified within ``problem.tol``."""
        pb = problem
        settings = self._settings(pb)
        w = np.zeros(pb.p) if warm is None else np.array(warm.coef, dtype=np.float64)
        b = pb.initial_intercept() if warm is None else float(warm.intercept)
        history: list[dict[str, Any]] = []
        t_start = time.perf_counter()
        steps, epoch, converged = 0, 0, False
        cert, z, b = self._certify(pb, w, b)
        for epoch in range(self.max_epochs + 1):
            entry = self._entry(epoch, cert, pb, w, t_start)
            history.append(entry)
            if entry["gap"] <= pb.tol or epoch == self.max_epochs:
                converged = entry["gap"] <= pb.tol
                break
            outs = self._epoch(pb, w, b, settings, steps, epoch)
            w, b = self._mix(pb, outs)
            steps += sum(o.steps for o in outs)
            history[-1]["progressive_loss"] = sum(o.progressive for o in outs) / pb.n
            cert, z, b = self._certify(pb, w, b)
        res = make_result(pb, w, b, cert, converged, epoch, history)
        return res, WarmState(w, b, z)

    def _settings(self, pb: Problem) -> SGDSettings:
        eta0 = self.eta0
        if eta0 is None:
            L = pb.datafit.beta * max(pb.rows.row_sqnorm_max, 1e-300)
            eta0 = 1.0 / L
        if self.form == "sgd" and eta0 * pb.penalty.alpha_l2 >= 1.0:
            eta0 = 0.5 / pb.penalty.alpha_l2  # keeps the ridge factor 1 - eta l2 positive
        return SGDSettings(
            self.form, pb.loss, pb.penalty.alpha_l1, pb.penalty.alpha_l2, pb.fit_intercept,
            float(eta0), self.learning_rate, 1.0 / pb.n,
        )  # fmt: skip

    def _epoch(self, pb, w, b, settings, steps, epoch) -> list[SGDOutput]:
        """Every partition's pass, from the same model and step count."""
        ex, rows = pb.executor, pb.rows
        return ex.gather(
            [
                ex.submit_to(
                    q, sgd_epoch_task, [rows.blocks[i] for i in part], w, b, pb.handles.y,
                    pb.handles.sample_weight, settings, steps,
                    self.seed * 1_000_003 + epoch * len(rows.parts) + q,
                )
                for q, part in enumerate(rows.parts)
            ]
        )  # fmt: skip

    @staticmethod
    def _mix(pb: Problem, outs: list[SGDOutput]) -> tuple[np.ndarray, float]:
        """The partitions' models averaged, weighted by their rows (parameter mixing)."""
        total = sum(o.steps for o in outs)
        w = sum(o.w * (o.steps / total) for o in outs)
        b = sum(o.b * (o.steps / total) for o in outs)
        return np.asarray(w, dtype=np.float64), float(b)

    @staticmethod
    def _certify(pb: Problem, w: np.ndarray, b: float) -> tuple[Certificate, np.ndarray, float]:
        """The duality gap at ``w`` with the intercept refitted exactly; ``z = X w + b``."""
        ex, rows = pb.executor, pb.rows
        b = b if pb.fit_intercept else 0.0
        parts = ex.gather(
            [ex.submit_to(q, rows_matvec_task, [rows.blocks[i] for i in part], w, b)
             for q, part in enumerate(rows.parts)]
        )  # fmt: skip
        z = np.concatenate([seg for part in parts for seg in part])
        if pb.fit_intercept:
            db = pb.datafit.intercept_update(pb.y, z, pb.weights, max_iter=20)
            b += db
            z += db
        theta = pb.datafit.dual_point(pb.y, z, pb.weights, pb.fit_intercept)
        xt = rows_xt_theta(ex, rows, theta)
        absmax, excess = pb.penalty.xt_theta_stats(xt, pb.n)
        cert = Certificate(*duality_gap_from_stats(
            pb.datafit, pb.penalty, pb.y, z, w, absmax, excess, s=pb.weights,
            intercept=pb.fit_intercept, theta=theta,
        ))  # fmt: skip
        return cert, z, b

    def _entry(self, epoch, cert, pb, w, t_start) -> dict[str, Any]:
        entry = {
            "round": epoch,
            "epoch": epoch,
            "objective": cert.primal,
            "gap": pb.relative_gap(cert.gap),
            "nnz": int(np.count_nonzero(w)),
            "seconds": time.perf_counter() - t_start,
        }
        if self.verbose:
            print(f"epoch {epoch:4d}  objective {cert.primal:.10g}  gap {entry['gap']:.3e}"
                  f"  nnz {entry['nnz']}")  # fmt: skip
        if self.callback is not None:
            self.callback(entry)
        return entry

    def restore(
        self, problem: Problem, arrays: dict[str, np.ndarray], intercept: float
    ) -> WarmState:
        """The state a checkpoint saved."""
        return WarmState(arrays["w"], intercept, arrays["z"])

    def release(self, problem: Problem, state: WarmState | None) -> None:
        """Nothing is cached on the workers beyond the row blocks, which the problem holds."""


class FobosSolver(StochasticGradientSolver):
    """:class:`StochasticGradientSolver` with FoBoS's proximal elastic-net step (Duchi &
    Singer 2009) instead of the subgradient step: exact zeros at every step, and no bound
    on ``eta * l2``. When to use it: as SGD, when the model's sparsity along the way
    matters."""

    name = "fobos"
    form = "fobos"

