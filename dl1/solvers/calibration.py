"""Step sizes that need no tuning for the sample-wise solvers, calibrated on a sample of rows
before the first epoch, as Bottou's SGD does (``determineEta0`` in his sgd code).

The solver proposes a ladder of candidate values of its step parameter (``eta0`` of SGD /
FoBoS, ``rda_gamma`` of RDA, ``eta`` of SMIDAS): its own base value, a safe step for the
data's largest row, times powers of 2 (:data:`FACTORS`). Every partition draws a seeded
sample of its rows on its worker (where the rows are: only floats go back to the
coordinator), runs one pass of the solver's own kernel over the sample from the
solve's start with each candidate (the same row order for all), and evaluates the
regularised objective of each result on the sample. The coordinator adds the partitions'
figures and keeps the candidate with the lowest objective.

Cost: ``k = len(FACTORS)`` (9; 7 for SMIDAS) passes over ``m`` sampled rows, each followed
by one pass of predictions over them, with ``m = min(sample_rows, max(min_rows, budget n /
k))``: at most ``budget`` epochs of kernel steps (default half an epoch, plus as many
predictions) once ``n >= k min_rows / budget`` (1,800 rows by default; smaller data
samples ``min_rows`` rows), and a vanishing fraction on large data (at most 2,000 rows:
18,000 steps whatever ``n``). The rows are drawn from a seeded choice of whole row blocks
holding ``budget`` of the rows (at least ``m``): out of core, at most ``budget`` epochs of
reading, plus one block per partition. The record (:class:`Calibration`) is the first
history entry's ``"calibration"``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from dl1.tasks.stochastic import calibration_task

#: Candidates relative to the solver's base value (steps: the base times these; RDA's
#: ``gamma``, the inverse of a step, divided by them).
FACTORS = tuple(2.0**k for k in range(-2, 7))


@dataclass(frozen=True)
class CalibrationSettings:
    """How the step is calibrated: rows sampled at most, the cost bound in epochs, and the
    rows sampled at least (all of them when there are fewer)."""

    sample_rows: int = 2000
    budget: float = 0.5
    min_rows: int = 100


class Calibration(NamedTuple):
    """A calibration's outcome: the parameter, its chosen value, the candidates and their
    regularised objectives on the sample (inf: diverged), the rows sampled, its cost in
    epochs of kernel steps and its seconds."""

    parameter: str
    value: float
    candidates: tuple[float, ...]
    objectives: tuple[float, ...]
    sample_rows: int
    cost_epochs: float
    seconds: float


def sample_size(n: int, n_candidates: int, settings: CalibrationSettings) -> int:
    """Rows sampled: ``sample_rows``, fewer when the passes would cost more than ``budget``
    epochs, but at least ``min_rows`` (and at most ``n``)."""
    m = max(settings.min_rows, int(settings.budget * n / n_candidates))
    return max(1, min(n, settings.sample_rows, m))


def partition_shares(sizes: list[int], m: int) -> list[int]:
    """Rows each partition samples: ``m`` split in proportion to their rows."""
    total = max(1, sum(sizes))
    return [min(s, max(1, round(m * s / total))) if s else 0 for s in sizes]


def calibrate(
    pb: Any, parameter: str, candidates: list[float], trial: Any, seed: int,
    settings: CalibrationSettings,
) -> Calibration:  # fmt: skip
    """The candidate with the lowest regularised objective after one pass over a sample of
    rows, each partition's part computed on its worker
    (:func:`dl1.tasks.stochastic.calibration_task` with the solver's ``trial``)."""
    t0 = time.perf_counter()
    ex, rows = pb.executor, pb.rows
    sizes = [int(sum(rows.row_bounds[i + 1] - rows.row_bounds[i] for i in part))
             for part in rows.parts]  # fmt: skip
    shares = partition_shares(sizes, sample_size(pb.n, len(candidates), settings))
    outs = ex.gather(
        [ex.submit_to(q, calibration_task, [rows.blocks[i] for i in part], pb.handles.y,
                      pb.handles.sample_weight, shares[q], trial, candidates,
                      (seed + 1) * 1_000_003 - 1 - q, settings.budget)
         for q, part in enumerate(rows.parts) if shares[q]]
    )  # fmt: skip
    m = sum(o.rows for o in outs)
    with np.errstate(all="ignore"):  # a diverged candidate's figures overflow: inf
        losses = np.sum([o.losses for o in outs], axis=0) / m
        penalties = np.sum([o.penalties * (o.rows / m) for o in outs], axis=0)
        objectives = np.where(np.isfinite(losses + penalties), losses + penalties, np.inf)
    best = int(np.argmin(objectives))
    return Calibration(
        parameter, float(candidates[best]), tuple(map(float, candidates)),
        tuple(map(float, objectives)), m, len(candidates) * m / pb.n, time.perf_counter() - t0,
    )  # fmt: skip
