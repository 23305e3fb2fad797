"""Streaming svmlight ingest: exact agreement with scikit-learn, errors naming the line, and
the numba parser against a pure-Python reference."""

import bz2
import gzip
import io
import lzma
import struct
import threading
from decimal import Decimal, localcontext
from pathlib import Path

import crc32c
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_svmlight_file, load_svmlight_files

import dl1
from dl1.errors import IncompleteStoreError, SvmlightFormatError
from dl1.io import from_svmlight, write_svmlight_split
from dl1.io.svmlight import memory_bound
from dl1.kernels import svmlight as svmlight_kernels
from dl1.kernels import svmlight_numbers
from dl1.store import StoreWriter, open_store
from dl1.store.format import MANIFEST

# ----------------------------------------------------------------------------- generators


def number_token(rng: np.random.Generator, max_exp: int = 140) -> str:
    """A random decimal in one of the spellings found in svmlight files, below 1e(max_exp+7)."""
    x = rng.standard_normal() * 10.0 ** rng.integers(-8, 8)
    kind = rng.integers(14)
    if kind == 0:
        return str(int(rng.integers(-1000, 1000)))
    if kind == 1:
        return f"{x:.6g}"
    if kind == 2:
        return repr(float(x))
    if kind == 3:
        return f"{x:.3e}"
    if kind == 4:
        return f"{x * 1e5:.2E}"  # 3.25E+02 style
    if kind == 5:
        return f"1e-{rng.integers(1, 30)}"
    if kind == 6:  # long mantissas, beyond 19 digits
        digits = "".join(rng.choice(list("0123456789"), int(rng.integers(19, 30))))
        return ("-" if rng.random() < 0.5 else "") + "0." + digits
    if kind == 7:
        return f"+{abs(x):.5f}"
    if kind == 8:
        return f"{x:.17g}"
    if kind == 9:
        return str(rng.choice(["0", "-0", "0.0", ".5", "5.", "007.25", "-0e5", "1_000.5"]))
    if kind == 10:
        # (values above 1e154 are left out: their squares overflow the store's column stats)
        big = f"1.7976931348623157e{max_exp}"
        return str(rng.choice(["4.9e-324", "2.2250738585072011e-308", big]))
    if kind == 11:
        return f"{x:.25g}"
    if kind == 12:
        return f"{rng.integers(1, 10**6)}e{rng.integers(-320, max_exp)}"
    return f"{x:.1f}"


def label_token(rng: np.random.Generator) -> str:
    return str(rng.choice(["1", "-1", "+1", "2.5", "0", "1e-3", "-7.25E+01", number_token(rng)]))


def make_text(
    rng: np.random.Generator,
    n_lines: int,
    p: int,
    base: int,
    *,
    crlf: bool = False,
    noise: bool = True,
    final_newline: bool = True,
    qid: bool = False,
    max_exp: int = 140,
) -> bytes:
    """Random svmlight text with indices in ``[base, base + p)``."""
    lines = []
    for _ in range(n_lines):
        if noise and rng.random() < 0.08:
            lines.append(str(rng.choice(["", "   ", "# comment", "\t# 1:2 3:4", " \t"])))
            continue
        k = int(rng.integers(0, min(p, 12) + 1)) if rng.random() > 0.1 else 0
        idx = np.sort(rng.choice(p, size=k, replace=False)) + base
        seps = [" "] if not noise else [" ", "  ", "\t", " \t "]
        parts = [label_token(rng)]
        if qid and rng.random() < 0.7:
            parts.append(f"qid:{rng.integers(0, 50)}")
        parts += [f"{i}:{number_token(rng, max_exp)}" for i in idx]
        line = parts[0]
        for part in parts[1:]:
            line += str(rng.choice(seps)) + part
        if noise and rng.random() < 0.2:
            line += str(rng.choice([" ", "\t", "  # trailing comment", "#x:1", " \x0b"]))
        lines.append(line)
    eol = "\r\n" if crlf else "\n"
    text = eol.join(lines) + (eol if final_newline else "")
    return text.encode()


def write(path: Path, text: bytes, compression: str | None = None) -> Path:
    opener = {None: open, "gz": gzip.open, "bz2": bz2.open, "xz": lzma.open}[compression]
    if compression:
        path = path.with_name(path.name + "." + compression)
    with opener(path, "wb") as fh:
        fh.write(text)
    return path


def read_back(
    dst: Path, fmt: str | None = None, split: str = "train"
) -> tuple[sp.csr_matrix, np.ndarray]:
    store = open_store(dst)
    X = sp.csr_matrix(store.to_dask(split, fmt=fmt).compute())
    X.sort_indices()
    return X, store.vector_dask("y", split).compute()


def assert_bit_identical(X: sp.csr_matrix, y: np.ndarray, Xs, ys) -> None:
    Xs = sp.csr_matrix(Xs)
    assert X.shape == Xs.shape
    assert X.dtype == Xs.dtype
    np.testing.assert_array_equal(X.indptr, Xs.indptr)
    np.testing.assert_array_equal(X.indices, Xs.indices)
    itype = np.int64 if X.dtype == np.float64 else np.int32
    # bit patterns: -0.0 and every last bit count
    np.testing.assert_array_equal(X.data.view(itype), Xs.data.view(itype))
    assert y.dtype == ys.dtype == np.float64
    np.testing.assert_array_equal(y.view(np.int64), ys.view(np.int64))


# ------------------------------------------------------------ agreement with scikit-learn

SKLEARN_CASES = [
    # (base, zero_based, compression, batch_bytes, store options, dtype, crlf, final newline)
    (1, "auto", None, 16 << 20, {}, np.float64, False, True),
    (0, "auto", None, 1, {}, np.float64, False, False),
    (1, False, None, 7, {"n_feature_blocks": 3}, np.float64, True, True),
    (0, True, None, 64, {"block_nnz": 40, "formats": ("csc", "csr")}, np.float64, False, True),
    (1, "auto", "gz", 33, {"n_feature_blocks": 2}, np.float64, True, False),
    (0, True, "bz2", 200, {}, np.float64, False, True),
    (1, False, "xz", 4096, {"block_nnz": 100}, np.float64, False, True),
    (1, "auto", None, 5, {}, np.float32, False, True),
    (0, "auto", "gz", 1000, {"block_nnz": 25, "formats": ("csr", "csc")}, np.float32, True, True),
    (1, True, None, 300, {}, np.float64, False, True),  # one-based file read as zero-based
]


@pytest.mark.parametrize(
    "base, zero_based, compression, batch_bytes, opts, dtype, crlf, final_nl", SKLEARN_CASES
)
def test_equals_sklearn(
    tmp_path, base, zero_based, compression, batch_bytes, opts, dtype, crlf, final_nl
):
    rng = np.random.default_rng(batch_bytes + 7 * base)
    max_exp = 30 if dtype == np.float32 else 140
    text = make_text(
        rng, 120, 40, base, crlf=crlf, final_newline=final_nl, qid=True, max_exp=max_exp
    )
    src = write(tmp_path / "data.svm", text, compression)
    store = from_svmlight(
        src, tmp_path / "s", zero_based=zero_based, batch_bytes=batch_bytes, dtype=dtype, **opts
    )
    Xs, ys = load_svmlight_file(io.BytesIO(text), zero_based=zero_based, dtype=dtype)
    for fmt in store.entry()["formats"]:
        assert_bit_identical(*read_back(tmp_path / "s", fmt), Xs, ys)
    if "n_feature_blocks" in opts:
        assert len(store.col_bounds()) - 1 == opts["n_feature_blocks"]
    rec = store.attrs["svmlight"]["train"]
    assert rec["name"] == src.name
    assert rec["size"] == src.stat().st_size
    assert rec["compression"] == {None: None, "gz": "gzip", "bz2": "bzip2", "xz": "xz"}[compression]
    assert rec["text_bytes"] == len(text)
    assert rec["text_crc32c"] == crc32c.crc32c(text)
    assert rec["lines"] == text.count(b"\n") + (not text.endswith(b"\n"))
    assert rec["zero_based"] == zero_based
    assert rec["rows"] == Xs.shape[0] and rec["nnz"] == Xs.nnz


def test_edge_cases_equal_sklearn(tmp_path):
    text = (
        b"# header comment\n"
        b"\n"
        b"1 1:0.5 3:2.5e-3 10:-7\n"
        b"-1 qid:3 2:1 4:0.1234567890123456789  # trailing\n"
        b"+1\n"
        b"   \t \n"
        b"2.5 5:3.25E+02\t6:1e-5 \r\n"
        b"-0 7:-0 8:0 9:00012.5000\n"
        b"3 1:1_000.5 2:0.1234567890123456789012345678 3:4.9e-324 4:1.7976931348623157e150\n"
        b"4#comment right after the label\n"
        b"5 1:1#comment right after a value\n"
        b"\x0c6 +2:.5 03:5. 4:+7\x0b\n"
        b"1e-3 1:1 2:2.2250738585072011e-308 3:9007199254740993 4:123456789012345678901\n"
        b"7 qid:-2\n"
        b"8 1:5e-400 2:1e22 3:1e23 4:0.00000000000000000000000000001"
    )
    src = write(tmp_path / "edge.svm", text)
    for batch_bytes in (1, 2, 3, 11, 1 << 20):
        dst = tmp_path / f"s{batch_bytes}"
        store = from_svmlight(src, dst, batch_bytes=batch_bytes)
        assert_bit_identical(*read_back(dst), *load_svmlight_file(str(src)))
        assert store.shape() == (12, 10)
    # signed zeros survive: label -0 and value -0
    X, y = read_back(tmp_path / "s1")
    assert np.signbit(y[4]) and X.indices[X.indptr[4]] == 6 and np.signbit(X.data[X.indptr[4]])


def test_long_lines_span_many_batches(tmp_path):
    rng = np.random.default_rng(5)
    text = make_text(rng, 30, 2000, 1, noise=False)
    src = write(tmp_path / "long.svm", text)
    from_svmlight(src, tmp_path / "s", batch_bytes=16, n_feature_blocks=4)
    assert_bit_identical(*read_back(tmp_path / "s"), *load_svmlight_file(str(src)))


def test_n_features_and_zero_based_auto(tmp_path):
    src = write(tmp_path / "a.svm", b"1 1:1 3:2\n-1 2:5\n")
    store = from_svmlight(src, tmp_path / "s1")  # one-based: 3 columns
    assert store.shape() == (2, 3) and store.attrs["svmlight"]["train"]["index_base"] == 1
    store = from_svmlight(src, tmp_path / "s2", zero_based=True)
    assert store.shape() == (2, 4)
    store = from_svmlight(src, tmp_path / "s3", n_features=10)
    Xs, ys = load_svmlight_file(str(src), n_features=10)
    assert_bit_identical(*read_back(tmp_path / "s3"), Xs, ys)
    # auto with index == n_features: fine when one-based ...
    store = from_svmlight(src, tmp_path / "s4", n_features=3)
    assert store.shape() == (2, 3)
    # ... and zero-based when an index 0 occurs
    src0 = write(tmp_path / "b.svm", b"1 0:1 3:2\n-1 2:5\n")
    store = from_svmlight(src0, tmp_path / "s5", n_features=4)
    assert_bit_identical(*read_back(tmp_path / "s5"), *load_svmlight_file(str(src0), n_features=4))


def test_file_without_features_and_empty_file(tmp_path):
    src = write(tmp_path / "a.svm", b"1\n-1\n# c\n2\n")
    store = from_svmlight(src, tmp_path / "s")
    assert store.shape() == (3, 0)  # scikit-learn says (3, 1)
    np.testing.assert_array_equal(store.read("y"), [1.0, -1.0, 2.0])
    store = from_svmlight(src, tmp_path / "s2", n_features=4)
    assert store.shape() == (3, 4) and store.nnz() == 0
    empty = write(tmp_path / "e.svm", b"")
    assert from_svmlight(empty, tmp_path / "s3").shape() == (0, 0)


def test_arguments(tmp_path):
    src = write(tmp_path / "a.svm", b"1 1:1\n")
    with pytest.raises(NotImplementedError, match="query_id"):
        from_svmlight(src, tmp_path / "s", query_id=True)
    with pytest.raises(ValueError, match="write_svmlight_split"):
        from_svmlight(src, tmp_path / "s", split="test")
    with pytest.raises(ValueError, match="split must be one of"):
        from_svmlight(src, tmp_path / "s", split="valid")
    with pytest.raises(ValueError, match="zero_based"):
        from_svmlight(src, tmp_path / "s", zero_based="yes")
    with pytest.raises(ValueError, match="reserved"):
        from_svmlight(src, tmp_path / "s", attrs={"svmlight": 1})
    with pytest.raises(FileNotFoundError):
        from_svmlight(tmp_path / "missing.svm", tmp_path / "s")
    assert not (tmp_path / "s").exists()
    store = from_svmlight(src, tmp_path / "s", attrs={"origin": "test"})
    assert store.attrs["origin"] == "test"
    with pytest.raises(FileExistsError):
        from_svmlight(src, tmp_path / "s")
    from_svmlight(src, tmp_path / "s", overwrite=True)
    assert dl1.from_svmlight is from_svmlight


def test_train_and_test_files_in_one_store(tmp_path):
    rng = np.random.default_rng(11)
    texts = [make_text(rng, 90, 30, 1), make_text(rng, 40, 30, 1)]
    train = write(tmp_path / "a.train", texts[0])
    test = write(tmp_path / "a.test", texts[1], "bz2")
    p = 31
    with StoreWriter(tmp_path / "s") as w:
        rec = write_svmlight_split(w, train, split="train", zero_based=False, n_features=p)
        write_svmlight_split(w, test, split="test", zero_based=False, n_features=p, block_nnz=50)
    store = open_store(tmp_path / "s")
    assert sorted(store.splits) == ["test", "train"]
    assert store.attrs["svmlight"]["train"] == rec
    assert store.attrs["svmlight"]["test"]["compression"] == "bzip2"
    ref = load_svmlight_files([io.BytesIO(t) for t in texts], zero_based=False, n_features=p)
    assert_bit_identical(*read_back(tmp_path / "s", split="train"), *ref[:2])
    assert_bit_identical(*read_back(tmp_path / "s", split="test"), *ref[2:])


def test_compression_detected_by_magic_bytes(tmp_path):
    text = b"1 1:1 2:3.5\n-1 3:1e-5\n"
    src = write(tmp_path / "a.svm", text, "gz")
    renamed = src.rename(tmp_path / "no_extension")
    store = from_svmlight(renamed, tmp_path / "s")
    assert store.attrs["svmlight"]["train"]["compression"] == "gzip"
    assert_bit_identical(*read_back(tmp_path / "s"), *load_svmlight_file(io.BytesIO(text)))


# ----------------------------------------------------------------------------- errors

ERROR_CASES = [
    # (text, kwargs, line, words in the message, scikit-learn refuses it too)
    (b"1 1:1\n1 3\n", {}, 2, ["malformed feature", "'3'"], True),
    (b"1 1:1\n\n1 :3\n", {}, 3, ["malformed feature", "':3'"], True),
    (b"1 1:1\n1 3:\n", {}, 2, ["malformed feature", "'3:'"], True),
    (b"# c\n1:2 3:4\n", {}, 2, ["missing label", "'1:2'"], True),
    (b"1 1:1\nabc 1:2\n", {}, 2, ["label is not a number", "'abc'"], True),
    (b"1 1:1\n2 1:abc\n", {}, 2, ["value is not a number", "'1:abc'"], True),
    (b"1 1:1\n2 1:2:3\n", {}, 2, ["value is not a number", "'1:2:3'"], True),
    (b"1 1:1\n2 1:0x10\n", {}, 2, ["value is not a number"], True),
    (b"1 1:1\n2 1:nan\n", {}, 2, ["NaN or infinite", "'1:nan'"], False),
    (b"1 1:1\n2 1:-inf\n", {}, 2, ["NaN or infinite"], False),
    (b"1 1:1\n2 1:1e400\n", {}, 2, ["NaN or infinite", "'1:1e400'"], False),
    (b"1 1:1\nnan 1:2\n", {}, 2, ["label is NaN or infinite"], False),
    (b"1 1:1\n\n\ninfinity\n", {}, 4, ["label is NaN or infinite"], False),
    (b"1 1:1\n1 1.5:2\n", {}, 2, ["index is not an integer", "'1.5:2'"], True),
    (b"1 1:1\n1 a:2\n", {}, 2, ["index is not an integer"], True),
    (b"1 1:1\n1 -3:2\n", {}, 2, ["negative feature index", "'-3:2'"], True),
    (b"1 1:1\n1 -99999999999:2\n", {}, 2, ["negative feature index"], False),
    (b"1 1:1\n1 2147483648:2\n", {}, 2, ["larger than 2147483647"], False),
    (b"1 1:1\n1 0:2\n", {"zero_based": False}, 2, ["index 0", "'0:2'"], True),
    (b"1 1:1\n1 5:2\n", {"zero_based": True, "n_features": 5}, 2, ["n_features=5", "'5:2'"], True),
    (b"1 1:1\n1 6:2\n", {"zero_based": False, "n_features": 5}, 2, ["n_features=5"], True),
    (b"1 1:1\n1 6:2\n", {"n_features": 5}, 2, ["n_features=5", "'6:2'"], True),
    (b"1 1:1\n1 5:2\n1 0:1\n", {"n_features": 5}, 2, ["index 0", "'5:2'"], True),  # deferred
    (b"1 1:1\n1 3:1 2:1\n", {}, 2, ["not sorted", "'2:1'"], True),
    (b"1 1:1\n1 2:1 2:3\n", {}, 2, ["duplicate", "'2:3'"], True),
    (b"1 1:1\n1 qid:x 1:2\n", {}, 2, ["malformed qid", "'qid:x'"], False),
    (b"1 1:1\n1 qid 1:2\n", {}, 2, ["malformed qid"], True),
    (b"1 1:1\n1 qidx:3 1:2\n", {}, 2, ["malformed qid"], False),
    (b"1 1:1\n1 1:2 qid:3\n", {}, 2, ["index is not an integer"], True),
    (b"1 1:1\n1 1:1e39\n", {"dtype": np.float32}, 2, ["overflows float32", "'1:1e39'"], False),
    (b"1 1:1\n1 1:2\x00\n", {}, 2, ["not a number"], True),
    (b"1 1:1\r\n1 2:3 2:4\r\n", {}, 2, ["duplicate"], True),
    (b"1 1:1\n1 2:3 1", {}, 2, ["malformed feature"], True),  # last line without newline
]


@pytest.mark.parametrize("batch_bytes", [1 << 20, 3])
@pytest.mark.parametrize("text, kwargs, line, words, sklearn_refuses", ERROR_CASES)
def test_errors_name_the_line(tmp_path, text, kwargs, line, words, sklearn_refuses, batch_bytes):
    src = write(tmp_path / "bad.svm", text)
    dst = tmp_path / "s"
    with pytest.raises(SvmlightFormatError) as info:
        from_svmlight(src, dst, batch_bytes=batch_bytes, **kwargs)
    msg = str(info.value)
    assert isinstance(info.value, ValueError)
    assert msg.startswith(f"{src}, line {line}: "), msg
    for w in words:
        assert w in msg, msg
    if sklearn_refuses:
        with pytest.raises(ValueError):
            load_svmlight_file(str(src), **{k: v for k, v in kwargs.items() if k != "dtype"})
    assert_not_finalised(dst)


def assert_not_finalised(dst: Path) -> None:
    assert not (dst / MANIFEST).exists()
    assert not list(dst.glob(".dl1-spill-*"))
    with pytest.raises(IncompleteStoreError):
        open_store(dst)


@pytest.mark.parametrize("compression", [None, "gz"])
def test_error_deep_in_a_big_file_names_its_line(tmp_path, compression):
    rng = np.random.default_rng(3)
    good = make_text(rng, 3000, 50, 1, noise=True)
    n_good = good.count(b"\n")
    text = good + b"1 4:1 3:1\n" + make_text(rng, 100, 50, 1)
    src = write(tmp_path / "big.svm", text, compression)
    with pytest.raises(SvmlightFormatError, match=rf", line {n_good + 1}: .*not sorted"):
        from_svmlight(src, tmp_path / "s", batch_bytes=4096, block_nnz=500)
    assert_not_finalised(tmp_path / "s")


def test_slow_token_error_before_a_kernel_error_in_the_same_batch(tmp_path):
    src = write(tmp_path / "a.svm", b"1 1:1\n1 1:nan\n1 2:1 1:1\n")
    with pytest.raises(SvmlightFormatError, match=r"line 2: .*NaN"):
        from_svmlight(src, tmp_path / "s")
    src = write(tmp_path / "b.svm", b"1 1:1\n1 1:1e39\n1 1:nan\n")
    with pytest.raises(SvmlightFormatError, match=r"line 2: .*float32"):
        from_svmlight(src, tmp_path / "s2", dtype=np.float32)


# ------------------------------------------------------------ kernel against a reference

SLOW = object()


def ref_int(tok: bytes) -> int | None:
    try:
        return int(tok)
    except ValueError:
        return None


def ref_parse(text: bytes, mode: int, n_features: int):
    """Pure-Python parse: ``(status, err_line, y, indptr, indices, data, row_offsets)``.

    Values are Python floats (NaN/inf included) or None when ``float()`` refuses them.
    """
    y, indptr, indices, data, starts = [], [0], [], [], []
    offset = 0
    for lineno, raw in enumerate(text.split(b"\n")):
        start, offset = offset, offset + len(raw) + 1
        toks = raw.split(b"#", 1)[0].split()
        if not toks:
            continue
        status, row_idx, row_val = ref_line(toks, mode, n_features)
        if status != svmlight_kernels.OK:
            return status, lineno, y, indptr, indices, data, starts
        y.append(ref_float(toks[0]))
        indices += row_idx
        data += row_val
        indptr.append(len(indices))
        starts.append(start)
    return svmlight_kernels.OK, 0, y, indptr, indices, data, starts


def ref_line(toks: list[bytes], mode: int, n_features: int) -> tuple[int, list, list]:
    if b":" in toks[0]:
        return svmlight_kernels.MISSING_LABEL, [], []
    feats = toks[1:]
    if feats and feats[0].startswith(b"qid"):
        q = feats.pop(0)
        if q[3:4] != b":" or ref_int(q[4:]) is None:
            return svmlight_kernels.BAD_QID, [], []
    prev = -1
    row_idx, row_val = [], []
    for t in feats:
        if b":" not in t or t.startswith(b":"):
            return svmlight_kernels.BAD_PAIR, [], []
        idx_s, val = t.split(b":", 1)
        idx = ref_int(idx_s)
        if idx is None:
            status = svmlight_kernels.BAD_INDEX
        elif idx < 0:
            status = svmlight_kernels.NEGATIVE_INDEX
        elif idx > svmlight_kernels.MAX_INDEX:
            status = svmlight_kernels.INDEX_OVERFLOW
        elif idx == 0 and mode == svmlight_kernels.ONE_BASED:
            status = svmlight_kernels.ZERO_INDEX
        elif idx <= prev:
            status = svmlight_kernels.DUPLICATE if idx == prev else svmlight_kernels.UNSORTED
        elif n_features >= 0 and (
            idx > n_features or (idx == n_features and mode == svmlight_kernels.ZERO_BASED)
        ):
            status = svmlight_kernels.INDEX_TOO_LARGE
        elif not val:
            status = svmlight_kernels.BAD_PAIR
        else:
            status = svmlight_kernels.OK
        if status != svmlight_kernels.OK:
            return status, [], []
        row_idx.append(idx)
        row_val.append(ref_float(val))
        prev = idx
    return svmlight_kernels.OK, row_idx, row_val


def ref_float(tok: bytes) -> float | None:
    try:
        return float(tok)
    except ValueError:
        return None


def check_values(got: np.ndarray, ref: list) -> int:
    """Every value the kernel gave equals ``float()`` bit for bit; returns the NaN count."""
    assert got.shape[0] == len(ref)
    n_nan = 0
    for g, r in zip(got.tolist(), ref, strict=True):
        if g != g:  # a placeholder: float() refuses the token, or it is not finite, or slow
            n_nan += 1
            continue
        assert r is not None and struct.pack("<d", g) == struct.pack("<d", r), (g, r)
    return n_nan


def junk_line(rng: np.random.Generator) -> str:
    return str(
        rng.choice(
            [
                "1 3",
                "1:2 3:4",
                "1 -2:1",
                "1 0:1",
                "1 2:1 1:1",
                "1 2:1 2:1",
                "1 qid:a 1:1",
                "1 qid:4 1:1",
                "1 9:1",
                "1 10:1",
                "1 :1",
                "1 1:",
                "x 1:1",
                "1 1:y",
                "1 1_0:2",
                "1 99999999999:1",
                "1 1:inf",
                "nan",
                "1 1:1:1",
                "1 +3:2",
            ]
        )
    )


@pytest.mark.parametrize("seed", range(40))
def test_kernel_matches_reference_parser(seed):
    rng = np.random.default_rng(seed)
    base = int(rng.integers(2))
    text = make_text(rng, 25, 12, base, crlf=bool(seed % 3 == 0), qid=True).decode()
    lines = text.split("\n")
    if seed % 2:
        lines.insert(int(rng.integers(len(lines))), junk_line(rng))
    text = "\n".join(lines).encode()
    mode = int(
        rng.choice(
            [svmlight_kernels.ZERO_BASED, svmlight_kernels.ONE_BASED, svmlight_kernels.AUTO_BASED]
        )
    )
    n_features = int(rng.choice([-1, 10, 13]))
    buf = np.frombuffer(text, dtype=np.uint8)
    out = svmlight_kernels.parse_lines(buf, mode, n_features, False)
    status, err_line, _, _, n_rows, n_nl, n_slow, y, indptr, indices, data = out[:11]
    r_status, r_line, ry, rindptr, rindices, rdata, rstarts = ref_parse(text, mode, n_features)
    assert status == r_status
    if status != svmlight_kernels.OK:
        assert err_line == r_line
    assert n_nl == text.count(b"\n")
    assert n_rows == len(ry)
    np.testing.assert_array_equal(indptr[: n_rows + 1], rindptr)
    nnz = int(indptr[n_rows])
    np.testing.assert_array_equal(indices[:nnz], rindices)
    n_nan = check_values(y[:n_rows], ry) + check_values(data[:nnz], rdata)
    assert n_slow == n_nan
    np.testing.assert_array_equal(svmlight_kernels.row_offsets(buf, np.arange(n_rows)), rstarts)


def test_kernel_qid_values():
    buf = np.frombuffer(b"1 qid:7 1:1\n# c\n2 qid:-3\n3 qid:+1_0 2:2\n", dtype=np.uint8)
    out = svmlight_kernels.parse_lines(buf, svmlight_kernels.AUTO_BASED, -1, True)
    assert out[0] == svmlight_kernels.OK and out[4] == 3
    np.testing.assert_array_equal(out[11][:3], [7, -3, 10])
    out = svmlight_kernels.parse_lines(
        np.frombuffer(b"1 qid:7 1:1\n2 1:1\n", dtype=np.uint8), 2, -1, True
    )
    assert out[0] == svmlight_kernels.MISSING_QID and out[1] == 1


def float_tokens(rng: np.random.Generator) -> list[str]:
    bits = rng.integers(0, 2**63 - 1, 3000, dtype=np.int64).view(np.float64)
    bits = bits[np.isfinite(bits)]
    normal = rng.standard_normal(3000) * 10.0 ** rng.integers(-30, 30, 3000)
    toks = [repr(float(x)) for x in bits] + [f"{x:.17g}" for x in normal]
    toks += [f"{x:.6e}" for x in normal] + [f"{x:.30g}" for x in bits[:500]]
    for _ in range(3000):
        digits = "".join(rng.choice(list("0123456789"), int(rng.integers(1, 28))))
        cut = int(rng.integers(0, len(digits) + 1))
        t = digits[:cut] + "." + digits[cut:] if rng.random() < 0.7 else digits
        if rng.random() < 0.5:
            t += str(rng.choice(["e", "E"])) + str(rng.choice(["", "+", "-"]))
            t += str(rng.integers(0, 340))
        toks.append(str(rng.choice(["", "-", "+"])) + t)
    # exact decimal expansions of midpoints between neighbouring doubles: ties and near-ties
    with localcontext() as ctx:
        ctx.prec = 800
        for x in np.abs(bits[:300]):
            nx = np.nextafter(x, np.inf)
            if np.isfinite(nx):
                mid = (Decimal(float(x)) + Decimal(float(nx))) / 2
                toks += [format(mid, "e"), format(mid.next_plus(), "e"), format(mid, ".25e")]
    toks += ["1e22", "1e23", "9007199254740993", "5e-324", "2.4703282292062328e-324"]
    toks += ["2.4703282292062327e-324", "1.7976931348623158e308", "1.7976931348623159e308"]
    toks += [".", "e5", "1e", "1e+", "--1", "inf", "nan", "1_0", "0x10", "1e100000000"]
    return toks


@pytest.mark.parametrize("seed", range(3))
def test_float_parsers_are_exact(seed):
    toks = float_tokens(np.random.default_rng(seed))
    n_fast = 0
    for t in toks:
        b = t.encode()
        buf = np.frombuffer(b + b" ", dtype=np.uint8)
        try:
            ref = float(b)
        except ValueError:
            ref = None
        ok, v = svmlight_numbers.parse_float(buf, 0, len(b))
        ok2, v2, end = svmlight_numbers.scan_float(buf, 0, len(buf))
        for good, val in ((ok, v), (ok2 and end == len(b), v2)):
            if good:
                n_fast += 1
                assert ref is not None and struct.pack("<d", val) == struct.pack("<d", ref), t
        if ref is not None and np.isfinite(ref) and "_" not in t:
            # refused only for an ambiguous long mantissa
            digits = t.lower().split("e")[0].lstrip("+-").replace(".", "").lstrip("0")
            assert ok or len(digits) > 19, t
    assert n_fast > len(toks)


def test_eisel_lemire_against_integers():
    rng = np.random.default_rng(0)
    ws = rng.integers(1, 2**63, 2000, dtype=np.uint64)
    qs = rng.integers(-345, 312, 2000)
    for w, q in zip(ws.tolist(), qs.tolist(), strict=True):
        ok, v = svmlight_numbers.eisel_lemire(np.uint64(w), q)
        ref = float(f"{w}e{q}")
        assert ok == np.isfinite(ref)
        if ok:
            assert struct.pack("<d", v) == struct.pack("<d", ref), (w, q)


def test_memory_bound_formula():
    b, blk, p, n = 1 << 20, 1 << 18, 1000, 77
    parse = 2 * (b + 12 * (b // 4) + 16 * (b // 2))
    append = 48 * (b // 4) + 8 * (b // 2)
    expected = parse + append + 64 * blk + 40 * p + 16 * n
    assert memory_bound(b, blk, p, n) == expected
    assert memory_bound(b, blk, p, n, np.float32) == expected + 4 * (b // 4)
    assert expected < 40 * b + 64 * blk + 40 * p + 16 * n + 1


def test_truncated_compressed_file_is_refused(tmp_path):
    rng = np.random.default_rng(8)
    src = write(tmp_path / "a.svm", make_text(rng, 2000, 30, 1), "gz")
    data = src.read_bytes()
    src.write_bytes(data[: len(data) // 2])
    with pytest.raises(EOFError):
        from_svmlight(src, tmp_path / "s", batch_bytes=4096)
    assert_not_finalised(tmp_path / "s")


def test_reader_thread_stops_after_an_error(tmp_path):
    rng = np.random.default_rng(9)
    text = b"1 2:1 1:1\n" + make_text(rng, 3000, 30, 1)
    src = write(tmp_path / "a.svm", text)
    with pytest.raises(SvmlightFormatError, match="line 1: "):
        from_svmlight(src, tmp_path / "s", batch_bytes=512)
    assert not [t for t in threading.enumerate() if t.name == "dl1-svmlight-reader"]
