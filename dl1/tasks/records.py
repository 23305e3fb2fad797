"""Named records that travel between the coordinator and the workers' tasks.

NamedTuples: they pickle small (a Dask message or a server call carries many of them) and
read by name; a new field goes at the end.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np


class GapStats(NamedTuple):
    """Per-block reductions of ``c = X^T theta`` that the duality gap needs:
    ``max_j |c_j|``, ``sum_j (|c_j| - threshold)_+^2`` and the finite bounds' conjugate
    terms (:func:`dl1.kernels.linalg.csc_xt_theta_stats`)."""

    absmax: float
    excess: float
    box: float = 0.0


class ColumnGroup(NamedTuple):
    """Columns of one block extracted for a working set (CSC arrays in the block's dtype),
    with their scales (empty unless ``scaled``), squared norms and the seconds the
    extraction took (counted as kernel time by the subproblem that uses it first)."""

    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    scale: np.ndarray
    sqnorm: np.ndarray
    scaled: bool
    seconds: float

    @property
    def ncols(self) -> int:
        return self.indptr.shape[0] - 1

    @property
    def col_scale(self) -> np.ndarray:
        """The scales, or an empty array when the columns are not scaled."""
        return self.scale if self.scaled else np.zeros(0)


class BlockScan(NamedTuple):
    """One block's part of a pass (:func:`dl1.tasks.passes.scan_task`).

    ``candidates`` (local column ids) and ``scores`` (``|x_j^T theta| - threshold``) are
    the block's worst KKT violators; ``alive`` its unscreened columns as packed bits (None:
    all); ``visited`` the nonzeros read; ``norm_max`` its largest column norm (-1: not
    computed)."""

    stats: GapStats
    candidates: np.ndarray
    scores: np.ndarray
    alive: np.ndarray | None
    visited: int
    norm_max: float


class PartitionScan(NamedTuple):
    """A partition's part of a pass: its blocks' scans and the kernel seconds."""

    blocks: list[BlockScan]
    seconds: float


class RoundOutput(NamedTuple):
    """A partition's CoCoA+ round (:func:`dl1.tasks.passes.round_task`): the new nonzero
    coefficients of each block as (local ids, values), ``u = X_part dw``, the gap
    statistics at the start point (None when not asked) and the seconds its kernels took."""

    coef: list[tuple[np.ndarray, np.ndarray]]
    u: np.ndarray
    stats: list[GapStats] | None
    kernel_s: float


class SpreadNewtonOutput(NamedTuple):
    """A share's part of a spread proximal Newton step
    (:func:`dl1.tasks.spread_newton.newton_share_task`): the step of its live columns
    (in group order, over its visits so far), ``u``, the ``X d`` of the whole step so far
    (this visit's and the earlier ones'), the restricted gap statistics at the step's start,
    the model's epochs and the seconds its kernels took."""

    dw: np.ndarray
    u: np.ndarray
    stats: GapStats
    epochs: int
    kernel_s: float


class SpreadRoundOutput(NamedTuple):
    """A partition's CoCoA+ round of a spread working-set subproblem
    (:func:`dl1.tasks.spread.ws_round_task`): new coefficients of each group's live
    columns, ``u``, the intercept shift, the restricted gap statistics and the seconds its
    kernels took."""

    coef: list[np.ndarray]
    u: np.ndarray
    shift: float
    stats: GapStats
    kernel_s: float


class SubproblemInfo(NamedTuple):
    """How a working-set subproblem went: its epochs, its restricted duality gap, the
    seconds its kernels took and, for proximal Newton, its Newton steps (None for the
    methods that take none) and block steps (:mod:`dl1.tasks.block_newton`)."""

    epochs: int
    gap: float
    kernel_s: float
    newton_steps: int | None = None
    block_steps: int = 0


class SubproblemOutput(NamedTuple):
    """A gathered working-set subproblem's answer: the working set's new coefficients, the
    change of ``X w + b``, the change of the intercept, and how it went."""

    w_ws: np.ndarray
    dz: np.ndarray
    db: float
    info: SubproblemInfo


class SubproblemCall(NamedTuple):
    """The arguments of :func:`dl1.tasks.subproblem.subproblem_task`, by name: the cached
    column groups (handles or resolved), their feature ids and freshness, the working set
    and its coefficients, ``y``, ``z = X w + b``, the sample weights and the
    :class:`~dl1.tasks.subproblem.SubproblemSettings`."""

    groups: list[Any]
    group_ids: list[np.ndarray]
    fresh: list[bool]
    ws: np.ndarray
    w_ws: np.ndarray
    y: Any
    z: np.ndarray
    sample_weight: Any
    settings: Any


class Vertex(NamedTuple):
    """A Frank-Wolfe candidate vertex: a column (global index), its gradient and its
    ``sigma = x_j^T y``."""

    col: int
    grad: float
    sigma: float


class FWColumn(NamedTuple):
    """A column the Frank-Wolfe coordinator fetched: its rows and (scaled) values, sum,
    squared norm and scale."""

    rows: np.ndarray
    vals: np.ndarray
    colsum: float
    sqnorm: float
    scale: float


class FWPartitionRound(NamedTuple):
    """A partition's Frank-Wolfe round (:func:`dl1.tasks.fw.fw_round_task`): its best vertex
    (None: nothing scored), the columns scored and nonzeros read, the certificate's
    statistics over the scored columns, and the task's seconds."""

    best: Vertex | None
    scored: int
    visited: int
    absmax: float
    excess: float
    seconds: float


class FWCandidate(NamedTuple):
    """The chosen vertex with its column (None before it is fetched: a certifying pass)."""

    vertex: Vertex
    column: FWColumn | None

    @property
    def col(self) -> int:
        return self.vertex.col

    @property
    def grad(self) -> float:
        return self.vertex.grad


class FWRound(NamedTuple):
    """The coordinator's view of a Frank-Wolfe round: the best candidate over all
    partitions (None: no columns), counts, the certificate's statistics, wall and busy
    seconds."""

    candidate: FWCandidate | None
    scored: int
    visited: int
    stats: GapStats
    wall: float
    busy: float
