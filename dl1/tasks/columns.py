"""Working-set columns: extracted from a block, compacted where they are cached, gathered
into one matrix for a subproblem."""

from __future__ import annotations

import time

import numpy as np

from dl1.kernels.select import csc_copy_columns_into, csc_select_columns
from dl1.tasks.blocks import Block, BlockSource, loaded
from dl1.tasks.records import (
    ColumnGroup,
)


def select_columns(indptr, indices, data, cols):
    """CSC arrays of the columns ``cols`` (in that order) of a CSC matrix."""
    return csc_select_columns(indptr, indices, data, np.asarray(cols, dtype=np.int64))


def extract_task(block: Block | BlockSource, local: np.ndarray):
    """CSC arrays, scales and squared norms of the chosen columns of a block.

    Values keep the block's dtype (a float32 store's columns cost 8 bytes per nonzero to
    cache and to move, not 12); every consumer widens them to float64 exactly, in its
    kernels or in the copy it makes."""
    t0 = time.perf_counter()
    block = loaded(block)
    local = np.asarray(local, dtype=np.int64)
    indptr, indices, data = select_columns(block.indptr, block.indices, block.data, local)
    scale = block.col_scale[local] if block.col_scale.shape[0] else np.zeros(0)
    return ColumnGroup(
        indptr,
        indices,
        data,
        scale,
        block.col_sqnorm[local],
        block.col_scale.shape[0] > 0,
        time.perf_counter() - t0,
    )


def compact_task(group: ColumnGroup, keep: np.ndarray) -> ColumnGroup:
    """The columns ``keep`` of a gathered group (:func:`extract_task`), run where the group
    is held: a working set that has moved on frees its stale columns without rereading."""
    t0 = time.perf_counter()
    keep = np.asarray(keep, dtype=np.int64)
    indptr, indices, data = select_columns(group.indptr, group.indices, group.data, keep)
    scale = group.scale[keep] if group.scaled else np.zeros(0)
    seconds = time.perf_counter() - t0
    return ColumnGroup(indptr, indices, data, scale, group.sqnorm[keep], group.scaled, seconds)


def group_col_sums(extracts: list[ColumnGroup], sample_weight: np.ndarray) -> list[np.ndarray]:
    """``sum_i s_i x_ij`` of every column of each cached group (unscaled), for the profiled
    steps of :func:`ws_round_task`: computed once per subproblem, where the groups live."""
    s = None if sample_weight.shape[0] == 0 else sample_weight
    return [col_sums(e.indptr, e.indices, e.data, s) for e in extracts]


def gather_columns(extracts: list[ColumnGroup], extract_ids: list[np.ndarray], ws: np.ndarray):
    """CSC arrays, scales and squared norms of the columns ``ws`` (in that order), copied
    from the cached groups into arrays allocated once (one copy of the working set)."""

    if not extracts:
        return np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0), np.zeros(0), np.zeros(0)
    goff = np.concatenate([[0], np.cumsum([ids.shape[0] for ids in extract_ids])])
    ids = np.concatenate(extract_ids)
    order = np.argsort(ids, kind="stable")
    pos = order[np.searchsorted(ids[order], ws)]  # every ws column is in some group
    group = np.searchsorted(goff, pos, side="right") - 1
    local = pos - goff[group]
    lens = np.zeros(ws.shape[0], dtype=np.int64)
    # the working set's columns by group, each group's in working-set order
    by = np.argsort(group, kind="stable")
    starts = np.flatnonzero(np.diff(group[by], prepend=-1))
    ends = [*starts[1:], by.shape[0]]
    runs = [(int(group[by[a]]), by[a:b]) for a, b in zip(starts, ends, strict=True)]
    for g, dest in runs:
        ip = extracts[g].indptr
        lens[dest] = ip[local[dest] + 1] - ip[local[dest]]
    indptr = np.zeros(ws.shape[0] + 1, dtype=np.int64)
    np.cumsum(lens, out=indptr[1:])
    indices = np.empty(indptr[-1], dtype=np.int32)
    data = np.empty(indptr[-1], dtype=np.float64)
    for g, dest in runs:
        e = extracts[g]
        csc_copy_columns_into(e.indptr, e.indices, e.data, local[dest], indptr, dest, indices, data)
    sqn = np.concatenate([e.sqnorm for e in extracts])[pos]
    scale = np.zeros(0)
    if any(e.scaled for e in extracts):
        scale = np.concatenate([e.scale if e.scaled else np.ones(e.ncols) for e in extracts])
        scale = scale[pos]
    return indptr, indices, data, scale, sqn


def col_sums(indptr, indices, vals, s) -> np.ndarray:
    """``sum_i s_i x_ij`` per column of CSC arrays (no per-nonzero column index array)."""
    out = np.zeros(indptr.shape[0] - 1)
    nz = np.flatnonzero(np.diff(indptr))
    if nz.shape[0]:
        v = vals if s is None else vals * s[indices]
        out[nz] = np.add.reduceat(v, indptr[nz])
    return out
