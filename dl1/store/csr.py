"""CSR blocks added to an existing store, out of core: what the sample-wise solvers read.

Each block is read (verified) as CSC, transposed into CSR with sorted indices and written
beside it, one block in memory at a time; the manifest, rewritten atomically at the end,
is the only thing that makes the new blocks part of the store. An interrupted run leaves
the store as it was (the CSR arrays it wrote are not in the manifest, and the next run
overwrites them).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import scipy.sparse as sp

from dl1.store.format import block_digest, write_manifest
from dl1.store.reader import Store, open_store
from dl1.store.writer import write_block


def add_csr(path: str | os.PathLike) -> Store:
    """Add CSR copies of every block of every split of the store at ``path`` that lacks
    them; a store that has them already is returned unchanged.

    Parameters
    ----------
    path : str or path-like
        A dl1 store (checked as :func:`dl1.open_store` checks it).

    Returns
    -------
    Store
        The store, reopened, with ``"csr"`` among the formats of each split.
    """
    store = open_store(path)
    manifest = copy.deepcopy(store.manifest)
    root = Path(os.fspath(store.path))
    changed = False
    for split, entry in manifest["splits"].items():
        if "csr" in entry["formats"]:
            continue
        entry["blocks"]["csr"] = csr_blocks(store, root, split, entry["blocks"])
        entry["formats"] = [*entry["formats"], "csr"]
        changed = True
    if changed:
        write_manifest(root, manifest)
    return open_store(root)


def csr_blocks(store: Store, root: Path, split: str, blocks: dict) -> list[list[dict]]:
    """The manifest entries of the CSR copies of ``split``'s blocks, written one by one.

    Each block's content digest (:func:`dl1.store.format.block_digest`) is recorded in both
    layouts' entries (``blocks``, the split's manifest entries, gets it for the source
    layout), which ties them: a store whose layouts disagree is refused.
    """
    n_rb = len(store.row_bounds(split)) - 1
    n_cb = len(store.col_bounds(split)) - 1
    fmt = store.entry(split)["formats"][0]
    grid = []
    for i in range(n_rb):
        row = []
        for j in range(n_cb):
            ip, ix, dx = store.read_block_arrays(split, i, j, fmt)
            shape = store.block_shape(split, i, j)
            cls = sp.csc_matrix if fmt == "csc" else sp.csr_matrix
            tie = block_digest(ip, ix, dx, shape, fmt)
            blocks[fmt][i][j]["content"] = tie
            m = cls((dx, ix, ip), shape=shape).tocsr()
            m.sort_indices()
            row.append(
                write_block(root, split, "csr", i, j, m.indptr, m.indices, m.data, content=tie)
            )
            del m, ip, ix, dx
        grid.append(row)
    return grid
