"""CSR blocks added to an existing store, out of core: what the sample-wise solvers read.

Each block is read (verified) as CSC, transposed into CSR with sorted indices and written
beside it, one block in memory at a time (for a store at a URL: staged locally, then
uploaded); the manifest, rewritten atomically at the end, is the only thing that makes
the new blocks part of the store. An interrupted run leaves
the store as it was (the CSR arrays it wrote are not in the manifest, and the next run
overwrites them).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import scipy.sparse as sp

from dl1.store.format import MANIFEST, block_digest, write_manifest
from dl1.store.reader import Store, open_store
from dl1.store.split_writer import write_block
from dl1.store.upload import check_uploaded, remove_staging, staging_dir, upload_tree


def add_csr(path: Any, storage_options: dict[str, Any] | None = None) -> Store:
    """Add CSR copies of every block of every split of the store at ``path`` that lacks
    them; a store that has them already is returned unchanged.

    Parameters
    ----------
    path : str, path-like, URL, zarr store or Location
        A dl1 store (checked as :func:`dl1.open_store` checks it).
    storage_options : dict, optional
        Options of a URL's filesystem (credentials from the environment by default). At a
        URL the CSR blocks are written to a private local staging directory, uploaded
        beside the others, and the manifest naming them is uploaded last (one PUT).

    Returns
    -------
    Store
        The store, reopened, with ``"csr"`` among the formats of each split.
    """
    store = open_store(path, storage_options)
    manifest = copy.deepcopy(store.manifest)
    loc = store.location
    staging = None if loc.is_local else staging_dir()
    try:
        root = loc.path if staging is None else staging
        changed = False
        for split, entry in manifest["splits"].items():
            if "csr" in entry["formats"]:
                continue
            entry["blocks"]["csr"] = csr_blocks(store, root, split, entry["blocks"])
            entry["formats"] = [*entry["formats"], "csr"]
            changed = True
        if changed:
            write_manifest(root, manifest)
            if staging is not None:
                sizes = upload_tree(staging, loc, skip=("zarr.json", MANIFEST))
                check_uploaded(loc, sizes)
                loc.fs.put_file(os.fspath(staging / MANIFEST), loc.key(MANIFEST))
    finally:
        if staging is not None:
            remove_staging(staging)
    return open_store(loc)


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
