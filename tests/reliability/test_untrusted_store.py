"""Untrusted stores: names that leave the store, malformed manifests, hostile blocks.

A store is a folder anyone could have edited. Every test states its pass criterion; none
may see a raw IndexError/KeyError/AttributeError, a read outside the store, or a crash.
"""

import os
import shutil
import textwrap

import pytest

import dl1
from dl1.errors import StoreCorruptError
from dl1.store.arrays import read_array
from tests.reliability.untrusted import (
    copy_store,
    make_store,
    manifest,
    put_manifest,
    results,
    rewrite_array,
    run_child,
)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return make_store(tmp_path_factory.mktemp("pristine") / "s", formats=("csc", "csr"))


@pytest.fixture
def store(pristine, tmp_path):
    return copy_store(pristine, tmp_path / "box" / "s")


def test_format_name_traversal_reads_no_block_outside(store):
    """Pass: a manifest whose format name is ``../../../outside_csr`` (with real CSR blocks
    there) is refused by dl1.open and dl1.fit with a StoreCorruptError naming the field
    ``splits.train.formats`` and the value; before, the fit read every block from there."""
    outside = store.parent / "outside_csr"
    shutil.move(store / "train" / "X" / "csr", outside)
    shutil.rmtree(store / "train" / "X" / "csc")
    m = manifest(store)
    e = m["splits"]["train"]
    e["blocks"] = {"../../../outside_csr": e["blocks"]["csr"]}
    e["formats"] = ["../../../outside_csr"]
    put_manifest(store, m)
    for call in (lambda: dl1.open(store), lambda: dl1.fit(str(store), alpha=0.05)):
        with pytest.raises(StoreCorruptError, match=r"splits\.train\.formats.*outside_csr"):
            call()


@pytest.mark.parametrize(
    "name", ["../../etc/hostname", "/etc/hostname", "stats/../../../x", "y/..", "a\\b", ""]
)
def test_array_name_leaving_the_store_is_refused_alike(store, name):
    """Pass: an array entry whose name leaves the store is refused with a StoreCorruptError
    naming the field and the value, identical whether the target exists or not (so it tells
    nothing about the filesystem); before, existence leaked (NotADirectoryError against
    'chunk 0 is missing')."""
    m = manifest(store)
    m["splits"]["train"]["arrays"][name] = m["splits"]["train"]["arrays"]["y"]
    put_manifest(store, m)
    with pytest.raises(StoreCorruptError, match=r"splits\.train\.arrays") as err:
        dl1.open(store)
    assert repr(name) in str(err.value)


def test_symlinks_out_of_the_store_are_refused(store, tmp_path):
    """Pass: an array folder that is a symlink to a copy outside the store, a chunk file
    and an array's zarr.json that are symlinks, are refused (StoreCorruptError naming the
    array) before any chunk is read; the same bytes inside the store read fine."""
    outside = tmp_path / "elsewhere"
    shutil.copytree(store / "train" / "y", outside)
    shutil.rmtree(store / "train" / "y")
    os.symlink(outside, store / "train" / "y")
    with pytest.raises(StoreCorruptError, match=r"array 'train/y' resolves to .*outside"):
        dl1.open(store)
    os.unlink(store / "train" / "y")
    shutil.copytree(outside, store / "train" / "y")
    dl1.open(store)
    chunk = store / "train" / "y" / "c" / "0"
    shutil.move(chunk, outside / "moved")
    os.symlink(outside / "moved", chunk)
    with pytest.raises(StoreCorruptError, match=r"chunk 0 of array 'train/y' is not a regular"):
        dl1.open(store)
    shutil.move(outside / "moved", chunk)
    meta = store / "train" / "y" / "zarr.json"
    shutil.move(meta, outside / "zarr.json")
    os.symlink(outside / "zarr.json", meta)
    with pytest.raises(StoreCorruptError, match=r"metadata of array 'train/y' is a symlink"):
        dl1.open(store)


def _set(path, value):
    def edit(m):
        *head, last = path
        d = m
        for k in head:
            d = d[k]
        d[last] = value

    return edit


def _drop(path):
    def edit(m):
        *head, last = path
        d = m
        for k in head:
            d = d[k]
        del d[last]

    return edit


T = ["splits", "train"]
Y = [*T, "arrays", "y"]
B = [*T, "blocks", "csc", 0, 0]
MALFORMED = [
    ("no splits", _drop(["splits"]), r"field splits is missing"),
    ("splits a list", _set(["splits"], []), r"splits is not an object"),
    ("no arrays", _drop([*T, "arrays"]), r"splits\.train\.arrays is missing"),
    ("no y", _drop(Y), r"splits\.train\.arrays\.y is missing"),
    ("no chunk_bytes", _drop([*Y, "chunk_bytes"]), r"arrays\.y\.chunk_bytes is missing"),
    ("short chunk_bytes", _set([*Y, "chunk_bytes"], []), r"arrays\.y\.chunk_bytes has 0"),
    ("shape a string", _set([*Y, "shape"], "80"), r"arrays\.y\.shape is not a list"),
    ("negative chunk", _set([*Y, "chunk"], -1), r"arrays\.y\.chunk is out of range"),
    ("crc a float", _set([*Y, "crc32c"], 1.5), r"arrays\.y\.crc32c is not an integer"),
    ("dtype unknown", _set([*Y, "dtype"], "|O"), r"arrays\.y\.dtype"),
    ("split dtype int", _set([*T, "dtype"], "<i2"), r"splits\.train\.dtype"),
    ("row of blocks missing", lambda m: m["splits"]["train"]["blocks"]["csc"][0].pop(),
     r"blocks\.csc\[0\] has 1 entries, expected 2"),
    ("block nnz a string", _set([*B, "nnz"], "x"), r"blocks\.csc\[0\]\[0\]\.nnz is not"),
    ("block without data", _drop([*B, "arrays", "data"]), r"csc\[0\]\[0\]\.arrays does not"),
    ("nnz off by one", lambda m: m["splits"]["train"].__setitem__(
        "nnz", m["splits"]["train"]["nnz"] + 1), r"splits\.train\.nnz"),
    ("col_bounds short", _set([*T, "col_bounds"], [0, 30]), r"blocks\.csc\[0\] has 2"),
    ("col_bounds decreasing", _set([*T, "col_bounds"], [0, 31, 30]), r"col_bounds\[2\]"),
    ("huge n", _set([*T, "shape"], [10**15, 30]), r"splits\.train\.row_bounds"),
    ("huge array", _set([*Y, "shape"], [10**12]), r"arrays\.y\.shape\[0\] is 10+"),
    ("huge chunk", _set([*Y, "chunk"], 2**40), r"arrays\.y\.chunk is out of range"),
    ("unknown split", lambda m: m["splits"].__setitem__("../t", m["splits"]["train"]),
     r"split '\.\./t'"),
    ("formats empty", _set([*T, "formats"], []), r"splits\.train\.formats"),
    ("has_sample_weight without array", _set([*T, "has_sample_weight"], True),
     r"arrays\.sample_weight is missing"),
    ("root emptied", lambda m: m.clear(), r"field splits is missing"),
]  # fmt: skip


@pytest.mark.parametrize(("label", "edit", "field"), MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_manifest_is_refused_naming_the_field(store, label, edit, field):
    """Pass: each malformed manifest (deleted fields, wrong types, out of range, inconsistent
    with the other fields, huge sizes) is refused by dl1.open with a StoreCorruptError whose
    message names the field; before: raw KeyError/IndexError/TypeError/AttributeError, or a
    fit that ran on a store declaring 10**15 rows."""
    m = manifest(store)
    edit(m)
    m.update({"format": "dl1-sparse", "format_version": 1})
    put_manifest(store, m)
    with pytest.raises(StoreCorruptError, match=field):
        dl1.open(store)


def test_manifest_that_is_not_an_object_is_refused(store):
    """Pass: a manifest holding a JSON list is a StoreCorruptError, not an AttributeError."""
    put_manifest(store, [1, 2])
    with pytest.raises(StoreCorruptError, match="does not hold a JSON object"):
        dl1.open(store)


def test_hostile_block_with_valid_checksums_is_named_with_block_and_column(store):
    """Pass: a block whose index pointer decreases (checksums recomputed, so only the
    structure check can see it) fails dl1.fit with a StoreCorruptError naming the block,
    the column and "index pointer decreases"; before, it was named "indices are not
    sorted" after the kernel read past the index pointer's rows."""
    m = manifest(store)
    blk = m["splits"]["train"]["blocks"]["csc"][0][0]
    key = "train/X/csc/b0.0/indptr"
    ip = read_array(store, key, blk["arrays"]["indptr"])
    ip[3], ip[4] = ip[4], ip[3]
    assert ip[3] > ip[4]
    blk["arrays"]["indptr"] = rewrite_array(store, key, ip)
    put_manifest(store, m)
    with pytest.raises(
        StoreCorruptError, match=r"b0\.0', column 3 of the block: index pointer decreases"
    ):
        dl1.fit(str(store), alpha=0.05)


KERNEL_CHILD = textwrap.dedent(
    """
    import json
    import numpy as np
    from dl1.kernels import store as sk

    nnz = 6
    idx = np.arange(nnz, dtype=np.int32)
    val = np.ones(nnz)
    i64 = lambda *v: np.array(v, dtype=np.int64)
    cases = {
        "valid": (i64(0, 2, 4, 6), idx, val),
        "indptr decreasing": (i64(0, 5, 10**9, 2, 6), idx, val),
        "indptr decreasing far": (i64(0, 5, 2, 6), idx, val),
        "indptr past nnz": (i64(0, 3, 10**12, 6), idx, val),
        "indptr negative": (i64(0, -5, 6), idx, val),
        "indptr not from 0": (i64(3, 4, 6), idx, val),
        "indptr empty": (i64(), idx, val),
        "indptr ends early": (i64(0, 2, 4), idx, val),
        "indptr ends late": (i64(0, 2, 7), idx, val),
        "indices negative": (i64(0, 3, 6), np.array([0, -1, 2, 0, 1, 2], np.int32), val),
        "index too large": (i64(0, 3, 6), np.array([0, 1, 99, 0, 1, 2], np.int32), val),
        "data short": (i64(0, 3, 6), idx, val[:2]),
        "indices short": (i64(0, 3, 6), idx[:2], val),
        "data NaN": (i64(0, 3, 6), idx, np.array([1, np.nan, 1, 1, 1, 1.0])),
        "all empty": (i64(0), idx[:0], val[:0]),
    }
    for name, (ip, ix, dt) in cases.items():
        try:
            status, major, pos = sk.check_compressed(ip, ix, dt, 10)
            text = sk.PROBLEMS.get(status, "ok")
            if status == sk.BAD_INDPTR:
                text = sk.indptr_problem(ip, ix.shape[0], dt.shape[0])
            out = {"case": name, "status": int(status), "text": text}
        except Exception as e:  # an IndexError from NUMBA_BOUNDSCHECK lands here
            out = {"case": name, "raised": type(e).__name__, "text": str(e)}
        print(json.dumps(out), flush=True)
    """
)


def test_validation_kernel_is_bounds_safe_on_hostile_inputs(tmp_path):
    """Pass: under NUMBA_BOUNDSCHECK=1 (fresh numba cache, a child process with a timeout)
    check_compressed reports a problem for every hostile input (indptr decreasing, past
    nnz, negative, not from 0, empty, wrong end; indices negative or out of range; lengths
    that differ; NaN), never raises (boundscheck's IndexError) nor crashes, accepts the
    valid inputs, and the index pointer's problem is named. Before: IndexError from the
    bounds check (and, without it, reads past the arrays)."""
    proc = run_child(
        KERNEL_CHILD, timeout=300, NUMBA_BOUNDSCHECK="1", NUMBA_CACHE_DIR=str(tmp_path / "nc")
    )
    got = {r["case"]: r for r in results(proc)}
    assert len(got) == 15
    for name, r in got.items():
        assert "raised" not in r, r
        assert (r["status"] == 0) == (name in ("valid", "all empty")), r
    assert "decreases" in got["indptr decreasing far"]["text"]
    assert "past the 6 nonzeros" in got["indptr decreasing"]["text"]
    assert "past the 6 nonzeros" in got["indptr past nnz"]["text"]
    assert "starts at 3" in got["indptr not from 0"]["text"]
    assert "values" in got["data short"]["text"]
    assert got["data NaN"]["text"] == "value is NaN or infinite"


def test_corrupt_or_missing_chunks_stay_named(store):
    """Pass: a deleted, truncated, extended or bit-flipped chunk is a StoreCorruptError
    naming the chunk and the array (on open, or when its block is read)."""
    chunk = store / "train" / "X" / "csc" / "b0.1" / "data" / "c" / "0"
    raw = chunk.read_bytes()
    for bad, where in (
        (raw[:-7], "open"),
        (raw + b"\0", "open"),
        (raw[:40] + bytes([raw[40] ^ 1]) + raw[41:], "fit"),
    ):
        chunk.write_bytes(bad)
        with pytest.raises(StoreCorruptError, match=r"chunk 0 of array 'train/X/csc/b0\.1/data'"):
            dl1.open(store) if where == "open" else dl1.fit(str(store), alpha=0.05)
    chunk.unlink()
    with pytest.raises(StoreCorruptError, match=r"chunk 0 of .*b0\.1/data' is missing"):
        dl1.open(store)
