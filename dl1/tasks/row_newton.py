"""The worker side of the row-partitioned proximal Newton solver
(:mod:`dl1.solvers.row_newton`): row partitions that keep their predictions.

A partition (a group of row blocks, on one worker) is a :class:`RowPart`: its rows'
labels, weights and ``z = X_q w + b``, which never leave the worker. Every task reads a
part and the partition's row blocks (their own keys, passed beside it: a part never
carries them, so Dask's cost of moving a part is what it holds) and returns a new part
(pure tasks: a part lost with its worker is recomputed from its lineage) whose ``out`` is
the small result the coordinator fetches (:func:`part_out`): sums, vectors as long as the
working set, or ``X_q^T theta_q`` (as long as the features). Nothing as long as the rows
is sent back.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np
import scipy.sparse as sp
from dask.sizeof import sizeof

from dl1.kernels.gram import csr_weighted_gram
from dl1.kernels.margins import balance_sides
from dl1.objective.datafits.margin import kernel_weights
from dl1.tasks.rows import RowBlock, RowSource, loaded_rows

#: A partition's row blocks, in row order.
Blocks = list[RowBlock | RowSource]


@dataclass(frozen=True)
class RowPart:
    """A partition's labels ``y``, weights ``s`` (None: unit) and predictions ``z`` (its
    row blocks, consecutive, are passed to each task beside it); ``cols`` the rows'
    columns ``ws`` (CSR, ``n_q x m``: those of the last working set it was sent);
    ``theta`` the partition's part of the last dual point; ``out`` the last task's small
    result; ``gram`` the packed model Hessian on ``ws`` when it does not move with ``z``
    (the squared loss's, ``X_W^T diag(s) X_W``: computed once a working set)."""

    y: np.ndarray
    s: np.ndarray | None
    z: np.ndarray
    cols: Any = None
    ws: np.ndarray | None = None
    theta: np.ndarray | None = None
    out: Any = None
    gram: np.ndarray | None = None

    @property
    def sw(self) -> np.ndarray:
        """The weights as the kernels take them (empty: unit)."""
        return kernel_weights(self.s, self.y.shape[0])


@sizeof.register(RowPart)
def _row_part_sizeof(part: RowPart) -> int:
    """What a part holds (its row blocks are their own keys)."""
    arrays = [part.y, part.s, part.z, part.theta, part.gram]
    held = sum(a.nbytes for a in arrays if a is not None)
    if part.cols is not None:
        held += part.cols.data.nbytes + part.cols.indices.nbytes + part.cols.indptr.nbytes
    return held


class ShiftSums(NamedTuple):
    """At ``z + shift``: ``n_q F_q`` (the partition's loss sum), ``sum g``, ``sum |g|``
    and ``sum h`` (the loss's first and second derivatives, weighted): an intercept Newton
    step's sums."""

    value: float
    g: float
    g_abs: float
    h: float


class ModelSums(NamedTuple):
    """A partition's part of the quadratic model on the working set ``W`` at ``z``
    (``g``, ``h`` the per-row derivatives): ``A = X_W^T diag(h) X_W`` (its upper triangle,
    row by row, in float32: :func:`packed`), ``c = X_W^T h``, ``G = X_W^T g``, ``g0 = sum
    g``, ``h0 = sum h`` and the loss sum ``n_q F_q``."""

    A: np.ndarray
    c: np.ndarray
    G: np.ndarray
    g0: float
    h0: float
    value: float


class TrialSums(NamedTuple):
    """A Newton step's trial: the loss sums at each step length of the ladder, and the
    :class:`ModelSums` at the full step."""

    values: np.ndarray
    model: ModelSums


class GapSums(NamedTuple):
    """A partition's loss sum and conjugate sums (at each scale), for the duality gap."""

    value: float
    conjugates: tuple[float, ...]


def part_out(part: RowPart) -> Any:
    """The small result of the task that made ``part``."""
    return part.out


def sum_outs(a: Any, b: Any) -> Any:
    """Two partitions' small results added: arrays and numbers, or records (named tuples,
    tuples) of them field by field (a step of the tree the coordinator's sums are
    reduced along)."""
    if not isinstance(a, tuple):
        return a + b
    fields = [sum_outs(x, y) for x, y in zip(a, b, strict=True)]
    return type(a)(*fields) if hasattr(a, "_fields") else tuple(fields)


def start_part(blocks: list[RowBlock | RowSource], y: np.ndarray, s: np.ndarray | None,
               support: np.ndarray, values: np.ndarray, b: float) -> RowPart:  # fmt: skip
    """The partition of ``blocks`` with ``z = X_q w + b``, ``w`` given by its nonzeros
    (``w[support] = values``): a cold or warm start sends those, not a length-p vector."""
    z = []
    for blk in map(loaded_rows, blocks):
        w = np.zeros(blk.p)
        w[support] = values
        z.append(_matrix(blk) @ w)
    return RowPart(y, s, np.concatenate(z) + b)


def _matrix(blk: RowBlock) -> sp.csr_matrix:
    return sp.csr_matrix((blk.data, blk.indices, blk.indptr), shape=(blk.n_rows, blk.p))


def _derivatives(part: RowPart, datafit: Any, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, ``n`` times the loss's gradient and Hessian diagonal at ``z`` (the squared
    loss's: ``s (z - y)`` and ``s``)."""
    if datafit.quadratic:  # no grad_hess: its proximal Newton is the Gram mode's
        h = np.ones_like(z) if part.s is None else part.s.astype(np.float64)
        return datafit.gradient(part.y, z, part.s) * z.shape[0], h
    g, h = np.empty_like(z), np.empty_like(z)
    datafit.grad_hess(part.y, z, part.sw, g, h)
    return g, h


def shift_sums(part: RowPart, blocks: Blocks, datafit: Any, shift: float) -> RowPart:
    """:class:`ShiftSums` at ``z + shift`` (``out``)."""
    z = part.z + shift
    g, h = _derivatives(part, datafit, z)
    value = datafit.value(part.y, z, part.s) * z.shape[0]
    return replace(part, out=ShiftSums(value, float(g.sum()), float(np.abs(g).sum()),
                                       float(h.sum())))


def with_theta(part: RowPart, blocks: Blocks, datafit: Any, shift: float = 0.0) -> RowPart:
    """The part with ``z + shift`` (the intercept moved) and its dual point ``theta_q = -n
    grad F(z)`` on its rows; ``out``: the sums of its positive entries and of its negative
    entries' magnitudes (the balance of an unpenalised intercept's constraint needs them
    over all rows)."""
    z = part.z + shift if shift else part.z
    theta = datafit.dual_point(part.y, z, part.s)
    pos = float(theta[theta > 0].sum())
    return replace(part, z=z, theta=theta, out=(pos, -float(theta[theta <= 0].sum())))


def balanced_theta(part: RowPart, sides: tuple[float, float] | None) -> np.ndarray:
    """``theta_q``, with the heavier side of the whole dual point shrunk when ``sides``
    (its sums over all rows, :func:`with_theta`) are given, as
    :func:`dl1.kernels.margins.balance_sides` does for one vector."""
    if sides is None:
        return part.theta
    theta = part.theta.copy()
    balance_sides(theta, *sides)
    return theta


def xt_theta(part: RowPart, blocks: Blocks, sides: tuple[float, float] | None) -> RowPart:
    """``out = X_q^T theta_q`` (balanced by ``sides``), length p."""
    theta = balanced_theta(part, sides)
    out, r = None, 0
    for blk in map(loaded_rows, blocks):
        out = np.zeros(blk.p) if out is None else out
        out += _matrix(blk).T @ theta[r : r + blk.n_rows]
        r += blk.n_rows
    return replace(part, out=np.zeros(0) if out is None else out)


def gap_sums(part: RowPart, blocks: Blocks, datafit: Any, sides: tuple[float, float] | None,
             scales: tuple[float, ...]) -> RowPart:  # fmt: skip
    """``out``: :class:`GapSums` of the dual point (balanced by ``sides``) at ``scales``."""
    theta = balanced_theta(part, sides)
    n = part.y.shape[0]
    value, conj = datafit.value_conjugates(part.y, part.z, theta, part.s, scales)
    return replace(part, out=GapSums(value * n, tuple(c * n for c in conj)))


def with_columns(part: RowPart, blocks: Blocks, ws: np.ndarray) -> RowPart:
    """The part holding its rows' columns ``ws`` (kept while the working set is the same,
    compared by its columns: a part outlives its solve when a path keeps it)."""
    if part.ws is not None and np.array_equal(part.ws, ws):
        return part
    cols = sp.vstack([_matrix(blk)[:, ws] for blk in map(loaded_rows, blocks)], "csr")
    cols.sort_indices()  # csr_weighted_gram pairs each entry with the ones after it
    return replace(part, cols=cols, ws=ws, gram=None)


def packed(A: np.ndarray) -> np.ndarray:
    """The upper triangle of the symmetric ``A``, row by row, in float32: a quarter of its
    float64 bytes up the tree. The model's Hessian only steers the Newton steps (the
    certificate never reads it), as the working-set solver's float32 Gram matrices do."""
    return A[np.triu_indices(A.shape[0])].astype(np.float32)


def unpacked(v: np.ndarray, m: int) -> np.ndarray:
    """The symmetric ``m x m`` float64 matrix whose :func:`packed` form is ``v``."""
    A = np.empty((m, m))
    upper = np.triu_indices(m)
    A[upper] = v
    A.T[upper] = v
    return A


def model_sums(part: RowPart, blocks: Blocks, datafit: Any, ws: np.ndarray,
               step: np.ndarray | None, shift: float) -> RowPart:  # fmt: skip
    """The part after the step ``X_W step + shift`` (None: none), with the
    :class:`ModelSums` of the quadratic model at its new ``z`` (``out``)."""
    part = with_columns(part, blocks, ws)
    z = part.z if step is None else part.z + (part.cols @ step + shift)
    g, h = _derivatives(part, datafit, z)
    A = part.gram if part.gram is not None else _packed_gram(part.cols, h)
    sums = ModelSums(A, part.cols.T @ h, part.cols.T @ g, float(g.sum()), float(h.sum()),
                     datafit.value(part.y, z, part.s) * z.shape[0])  # fmt: skip
    # the squared loss's h is the weights: its model Hessian is the working set's for good
    return replace(part, z=z, theta=None, out=sums, gram=A if datafit.quadratic else None)


def _packed_gram(cols: sp.csr_matrix, h: np.ndarray) -> np.ndarray:
    """:func:`packed` ``X_W^T diag(h) X_W`` of the rows' working-set columns ``cols``."""
    A = np.empty((cols.shape[1],) * 2)
    csr_weighted_gram(cols.indptr, cols.indices, cols.data, h, A)
    return packed(A)


def trial_model(part: RowPart, blocks: Blocks, datafit: Any, ws: np.ndarray,
                d: np.ndarray, shift: float, steps: np.ndarray) -> RowPart:  # fmt: skip
    """The part after the full step ``X_W d + shift``; ``out``: :class:`TrialSums`, the
    loss sums ``n_q F_q(z + t (X_W d + shift))`` for each ``t`` of ``steps`` (a line
    search's ladder) and the model's sums at the full step."""
    part = with_columns(part, blocks, ws)
    u = part.cols @ d + shift
    n = part.y.shape[0]
    values = np.array([datafit.value(part.y, part.z + t * u, part.s) * n for t in steps])
    after = model_sums(part, blocks, datafit, ws, d, shift)
    return replace(after, out=TrialSums(values, after.out))
