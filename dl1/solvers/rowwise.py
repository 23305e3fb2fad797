"""The loop shared by the solvers that work by samples: epochs over row blocks, the
partitions' results combined by the coordinator, every epoch's model certified.

An epoch: every partition (a group of row blocks, on one worker) runs the solver's pass
over its rows from the epoch's start (a task of :mod:`dl1.tasks.rows`); the coordinator
combines what they return (the solver's rule: averaging models, adding dual averages or
dual updates). Then the certificate: ``z = X w``, the intercept refitted exactly for
``w``, the dual point ``theta`` and ``X^T theta`` (reduced from the row blocks) give the
duality gap of the penalised problem at the combined model, which is what is returned:
how the partitions are combined changes the iterates, never what the certificate says
about them. ``max_epochs`` bounds the passes; reaching it warns with the gap.

Before the first epoch, a solver with a step parameter (``rate_parameter``) left at None
calibrates it on a sample of rows (:mod:`dl1.solvers.calibration`); the value used is the
first history entry's ``rate_parameter`` key, the calibration's record its
``"calibration"``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from dl1.errors import ValidationError
from dl1.objective.datafits import DATAFITS
from dl1.objective.datafits.quadratic import balanced
from dl1.objective.gap import duality_gap_from_stats
from dl1.solvers.base import Problem, RowData, WarmState
from dl1.solvers.calibration import FACTORS, Calibration, CalibrationSettings, calibrate
from dl1.solvers.numerics import check_round
from dl1.solvers.options import SolverOptions
from dl1.solvers.result import Certificate, FitResult, make_result
from dl1.tasks.rows import rows_matvec_task, rows_xt_task


def gap_at(pb: Problem, z: np.ndarray, w: np.ndarray, theta: np.ndarray) -> Certificate:
    """The certificate of ``(w, z)`` with the dual point ``theta`` (``X^T theta`` reduced
    from the row blocks)."""
    absmax, excess = pb.penalty.xt_theta_stats(rows_xt_theta(pb.executor, pb.rows, theta), pb.n)
    return Certificate(*duality_gap_from_stats(
        pb.datafit, pb.penalty, pb.y, z, w, absmax, excess, s=pb.weights,
        intercept=pb.fit_intercept, theta=theta,
    ))  # fmt: skip


def check_loss(solver: str, datafit: Any) -> None:
    """Refuse a loss the sample-wise kernels have no step for (its datafit's
    ``row_steps``)."""
    if not datafit.row_steps:
        takes = [name for name, cls in DATAFITS.items() if cls.row_steps]
        raise ValidationError(
            f"solver={solver!r} has no steps for loss={datafit.name!r} (it takes "
            f"{', '.join(map(repr, takes))}); use solver='ws' or 'cd'"
        )


class SampleWiseSolver:
    """Base of the sample-wise solvers: subclasses say how an epoch starts
    (:meth:`_start`), runs (:meth:`_epoch`) and combines (:meth:`_combine`).

    Parameters
    ----------
    max_epochs : int
        Passes over the data at most; reaching it warns with the gap reached.
    seed : int
        Seed of the block and row orders (a new order every epoch).
    shuffle : bool
        Visit the blocks and their rows in a seeded random order each epoch; False: in
        their stored order (data read as a stream).
    certify_every : int
        Certify every ``certify_every`` epochs (and always after the last); 0: only after
        the last (one certifying pass at the end of a streamed run). An epoch not certified
        has no gap in the history and cannot stop the solve.
    verbose, callback : a line, or a call with the history entry, per epoch.
    """

    layout = "rows"
    returns_z = True
    direct_calls = False
    name = ""
    #: The step parameter calibrated when left at None ("": none to calibrate).
    rate_parameter = ""
    #: The sample and cost bound of the calibration.
    calibration = CalibrationSettings()

    @classmethod
    def from_options(cls, o: SolverOptions) -> SampleWiseSolver:
        """This solver configured from the entry points' keywords (those it has)."""
        return cls(**o.epochs, seed=o.seed, verbose=o.verbose, callback=o.callback)

    def __init__(
        self,
        *,
        max_epochs: int = 20,
        seed: int = 0,
        shuffle: bool = True,
        certify_every: int = 1,
        verbose: bool = False,
        callback: Any = None,
    ) -> None:
        self.max_epochs = max_epochs
        self.seed = seed
        self.shuffle = shuffle
        self.certify_every = certify_every
        self.verbose = verbose
        self.callback = callback

    def solve(self, problem: Problem, warm: WarmState | None = None) -> tuple[
        FitResult, WarmState
    ]:
        """Epochs until the combined model is certified within ``problem.tol``."""
        pb = problem
        check_loss(self.name, pb.datafit)
        rate, calibration = self._rate(pb, warm)
        state = self._start(pb, warm, rate)
        history: list[dict[str, Any]] = []
        t_start = time.perf_counter()
        epoch, converged = 0, False
        cert, z, b = self._certify(pb, state.w, state.b, self._dual_candidate(state))
        for epoch in range(self.max_epochs + 1):
            if cert is not None:  # a NaN passes no tolerance: stop, naming the epoch
                check_round(self.name, epoch, {"objective": cert.primal,
                                               "duality gap": cert.gap, "intercept": b})
            entry = self._entry(epoch, cert, pb, state.w, t_start,
                                self._rate_record(rate, calibration) if epoch == 0 else {})
            history.append(entry)
            converged = entry["gap"] <= pb.tol
            if converged or epoch == self.max_epochs:
                break
            outs = self._epoch(pb, state, epoch)
            state = self._combine(pb, state, outs)
            history[-1]["progressive_loss"] = sum(o.progressive for o in outs) / pb.n
            history[-1]["progressive_loss_by_block"] = sorted(
                pair for o in outs for pair in o.block_losses
            )
            cert = None
            if self._due(epoch + 1):
                cert, z, b = self._certify(pb, state.w, state.b, self._dual_candidate(state))
        res = make_result(pb, state.w, b, cert, converged, epoch, history)
        return res, WarmState(state.w, b, z)

    # -- what a solver defines ---------------------------------------------------------
    def _start(self, pb: Problem, warm: WarmState | None, rate: float | None = None) -> Any:
        """The state an epoch starts from (with ``w`` and ``b``), from ``warm`` or zero,
        with the step parameter ``rate``."""
        raise NotImplementedError

    def _base_rate(self, pb: Problem) -> float:
        """The step parameter the calibration's candidates are multiples of."""
        raise NotImplementedError

    def _trial(self, pb: Problem, state: Any) -> Any:
        """The pass the calibration runs on its sample, from ``state``
        (:mod:`dl1.tasks.stochastic`'s ``*Trial``)."""
        raise NotImplementedError

    def _epoch(self, pb: Problem, state: Any, epoch: int) -> list[Any]:
        """Every partition's pass (each output has ``progressive``)."""
        raise NotImplementedError

    def _combine(self, pb: Problem, state: Any, outs: list[Any]) -> Any:
        """The next state from the partitions' outputs."""
        raise NotImplementedError

    def _dual_candidate(self, state: Any) -> np.ndarray | None:
        """A dual point the solver keeps (``theta`` convention of :mod:`dl1.objective.gap`),
        certified beside the one from the predictions (by default none)."""
        return None

    # -- shared ------------------------------------------------------------------------
    def _candidates(self, pb: Problem) -> list[float]:
        """The calibration's candidates: the base step times :data:`FACTORS`."""
        return [self._base_rate(pb) * f for f in FACTORS]

    def _rate(self, pb: Problem, warm: WarmState | None) -> tuple[
        float | None, Calibration | None
    ]:
        """The step parameter: the one given, or calibrated on a sample of rows."""
        if not self.rate_parameter:
            return None, None
        given = getattr(self, self.rate_parameter)
        if given is not None:
            return float(given), None
        candidates = self._candidates(pb)
        trial = self._trial(pb, self._start(pb, warm, candidates[0]))
        cal = calibrate(pb, self.rate_parameter, candidates, trial, self.seed, self.calibration)
        return cal.value, cal

    def _rate_record(self, rate: float | None, cal: Calibration | None) -> dict[str, Any]:
        """The first history entry's record of the step parameter and its calibration."""
        if rate is None:
            return {}
        return {self.rate_parameter: rate} | ({} if cal is None else {"calibration": cal})

    def _due(self, epoch: int) -> bool:
        """Whether the model after ``epoch`` epochs is certified."""
        if epoch >= self.max_epochs:
            return True
        return self.certify_every > 0 and epoch % self.certify_every == 0

    def _on_partitions(self, pb: Problem, epoch: int, task: Any, *args: Any) -> list[Any]:
        """``task(the partition's blocks, *args, seed)`` on every partition's worker, the
        results in partition order."""
        ex, rows = pb.executor, pb.rows
        return ex.gather(
            [ex.submit_to(q, task, [rows.blocks[i] for i in part], *args,
                          self._seed(epoch, q, len(rows.parts)))
             for q, part in enumerate(rows.parts)]
        )  # fmt: skip

    def _seed(self, epoch: int, q: int, n_parts: int) -> int | None:
        """The seed of partition ``q``'s orders in ``epoch`` (None: stored order)."""
        if not self.shuffle:
            return None
        return self.seed * 1_000_003 + epoch * n_parts + q

    @staticmethod
    def _certify(pb: Problem, w: np.ndarray, b: float, dual: np.ndarray | None = None) -> (
        tuple[Certificate, np.ndarray, float]
    ):
        """The duality gap at ``w`` with the intercept refitted exactly; ``z = X w + b``.
        The dual point is the one of the predictions, or ``dual`` (made feasible for the
        intercept) when that gives the smaller gap."""
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
        cert = gap_at(pb, z, w, theta)
        if dual is not None and not pb.datafit.quadratic:
            other = gap_at(pb, z, w, balanced(dual) if pb.fit_intercept else dual)
            cert = min(cert, other, key=lambda c: c.gap)
        return cert, z, b

    def _curvature(self, pb: Problem) -> float:
        """The loss's curvature bound ``beta`` for step sizes (1 for the hinge, whose
        subgradients are bounded by 1)."""
        beta = pb.datafit.beta
        return beta if np.isfinite(beta) else 1.0

    def _entry(self, epoch: int, cert: Certificate | None, pb: Problem, w: np.ndarray,
               t_start: float, extra: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
        entry = {
            "round": epoch,
            "epoch": epoch,
            "objective": np.nan if cert is None else cert.primal,
            "gap": np.nan if cert is None else pb.relative_gap(cert.gap),
            "nnz": int(np.count_nonzero(w)),
            "seconds": time.perf_counter() - t_start,
        } | extra
        if self.verbose:
            print(f"epoch {epoch:4d}  objective {entry['objective']:.10g}  gap "
                  f"{entry['gap']:.3e}  nnz {entry['nnz']}")  # fmt: skip
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


def rows_xt_theta(ex: Any, rows: RowData, theta: np.ndarray) -> np.ndarray:
    """``X^T theta`` (length p) from the row blocks: each partition sums its blocks' parts
    on its worker, the coordinator adds the partitions' vectors in order."""
    parts = ex.gather(
        [ex.submit_to(q, rows_xt_task, [rows.blocks[i] for i in part], theta)
         for q, part in enumerate(rows.parts)]
    )  # fmt: skip
    return np.sum(parts, axis=0)
