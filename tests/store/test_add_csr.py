"""CSR blocks added to an existing store (dl1.store.csr, dl1 convert --add-csr)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import dl1
from dl1.solvers.result import ConvergenceWarning
from dl1.store.csr import add_csr
from tests.helpers import random_csr
from tests.test_cli import run


def store_without_csr(tmp_path, test_split=True):
    X = random_csr(240, 70, 0.1, seed=2)
    y = np.asarray(X.sum(axis=1)).ravel()
    kw = dict(X_test=random_csr(40, 70, 0.1, seed=3), y_test=np.zeros(40)) if test_split else {}
    return X, y, dl1.from_scipy(X, y, tmp_path / "s.zarr", n_feature_blocks=3,
                                row_block_rows=60, **kw)


def test_add_csr_writes_every_block_as_csr_and_keeps_the_rest(tmp_path):
    """Pass: after add_csr every split lists "csr", each CSR block equals the CSC block
    (same matrix, sorted indices), the CSC blocks and y are unchanged, and a second call
    changes nothing (the manifest's bytes are identical)."""
    X, y, store = store_without_csr(tmp_path)
    before = {s: [[store.read_block(s, i, j, "csc").toarray() for j in range(3)]
                  for i in range(len(store.row_bounds(s)) - 1)] for s in store.splits}
    out = add_csr(store.path)
    for s in out.splits:
        assert out.entry(s)["formats"] == ["csc", "csr"]
        for i, row in enumerate(before[s]):
            for j, dense in enumerate(row):
                m = out.read_block(s, i, j, "csr")
                assert m.format == "csr" and m.has_sorted_indices
                np.testing.assert_array_equal(m.toarray(), dense)
                np.testing.assert_array_equal(out.read_block(s, i, j, "csc").toarray(), dense)
    np.testing.assert_array_equal(out.read("y"), y)
    manifest = (tmp_path / "s.zarr" / "dl1-manifest.json").read_bytes()
    add_csr(store.path)
    assert (tmp_path / "s.zarr" / "dl1-manifest.json").read_bytes() == manifest
    assert json.loads(manifest)  # still a valid manifest


def test_the_sample_wise_solvers_read_the_added_blocks(tmp_path):
    """Pass: streamed SGD on the store with added CSR blocks reads them (RowSource format
    "csr") and gives the same fit as on the store before (CSC chunks) to 1e-12."""
    from dl1.row_blocks import row_sources

    X, y, store = store_without_csr(tmp_path, test_split=False)
    kw = dict(alpha=dl1.alpha_max(X, y) / 5, solver="sgd", max_epochs=2, tol=1e-12,
              stream=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        before = dl1.fit(store, **kw)
        after_store = add_csr(store.path)
        assert {s.fmt for s in row_sources(after_store, "train")[0]} == {"csr"}
        after = dl1.fit(after_store, **kw)
    np.testing.assert_allclose(after.coef_, before.coef_, rtol=0, atol=1e-12)


@pytest.mark.slow
def test_cli_add_csr(tmp_path):
    """Pass: `dl1 convert STORE --add-csr` adds the blocks and prints the store summary; a
    DST with --add-csr, or no DST without it, is a usage error (exit 2, one line)."""
    _, _, store = store_without_csr(tmp_path, test_split=False)
    out = run("convert", store.path, "--add-csr")
    assert "CSR blocks added" in out.stdout
    assert dl1.open_store(store.path).entry("train")["formats"] == ["csc", "csr"]
    bad = run("convert", store.path, tmp_path / "other", "--add-csr", check=False)
    assert bad.returncode == 2 and "--add-csr takes one argument" in bad.stderr
    bad = run("convert", store.path, check=False)
    assert bad.returncode == 2


@pytest.mark.parametrize("damage", ["manifest", "chunk"])
def test_add_csr_refuses_a_damaged_store_and_changes_nothing(tmp_path, damage):
    """Pass: a store with no manifest, or a corrupt chunk, is refused with a dl1 store
    error, and the manifest (if any) is unchanged."""
    _, _, store = store_without_csr(tmp_path, test_split=False)
    root = tmp_path / "s.zarr"
    if damage == "manifest":
        (root / "dl1-manifest.json").unlink()
    else:
        chunk = next((root / "train" / "X" / "csc").glob("b1.1/data/c/0"))
        raw = bytearray(chunk.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        chunk.write_bytes(bytes(raw))
    before = (root / "dl1-manifest.json").read_bytes() if damage == "chunk" else None
    with pytest.raises(dl1.errors.StoreError):
        add_csr(root)
    if before is not None:
        assert (root / "dl1-manifest.json").read_bytes() == before
