"""Numba kernels of the svmlight/libsvm parser: bytes in, CSR arrays out.

The kernels take a ``uint8`` array of whole lines and scalars only. Tokens are separated by
ASCII whitespace (``bytes.split()``); a ``#`` ends the content of its line, as in
scikit-learn. Numbers are converted by :mod:`dl1.kernels.svmlight_numbers`, exactly as
Python's ``float()`` / ``int()`` convert them; a token those kernels cannot convert exactly
is stored as NaN and counted as "slow": the caller converts those tokens again with
``float()``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from dl1.kernels.svmlight_numbers import parse_float, parse_int, scan_float

# Status codes of parse_lines.
OK = 0
BAD_PAIR = 1
BAD_INDEX = 2
INDEX_OVERFLOW = 3
NEGATIVE_INDEX = 4
ZERO_INDEX = 5
INDEX_TOO_LARGE = 6
UNSORTED = 7
DUPLICATE = 8
MISSING_LABEL = 9
BAD_QID = 10
MISSING_QID = 11

# Index-base modes of parse_lines.
ZERO_BASED = 0
ONE_BASED = 1
AUTO_BASED = 2

#: Largest column index the store accepts (indices are int32).
MAX_INDEX = (1 << 31) - 1


@njit(nogil=True, cache=True, inline="always")
def _is_blank(c):  # pragma: no cover - compiled
    """ASCII whitespace other than the newline: space, \\t, \\v, \\f, \\r."""
    return c == 32 or c == 9 or c == 11 or c == 12 or c == 13


@njit(nogil=True, cache=True, inline="always")
def _ends_token(c):  # pragma: no cover - compiled
    """ASCII whitespace (newline included) or ``#``."""
    return c == 32 or (9 <= c <= 13) or c == 35


@njit(nogil=True, cache=True, inline="always")
def _token_end(buf, i, n):  # pragma: no cover - compiled
    while i < n and not _ends_token(buf[i]):
        i += 1
    return i


@njit(nogil=True, cache=True)
def count_lines(buf, n):  # pragma: no cover - compiled
    """Number of newlines in ``buf[:n]``."""
    k = 0
    for i in range(n):
        k += buf[i] == 10
    return k


@njit(nogil=True, cache=True)
def last_newline(buf, n):  # pragma: no cover - compiled
    """Position of the last newline in ``buf[:n]``, or -1."""
    for i in range(n - 1, -1, -1):
        if buf[i] == 10:
            return i
    return -1


@njit(nogil=True, cache=True)
def line_end(buf, start):  # pragma: no cover - compiled
    """Position of the newline ending the line that starts at ``start`` (or the length)."""
    i = start
    while i < buf.shape[0] and buf[i] != 10:
        i += 1
    return i


@njit(nogil=True, cache=True)
def row_offsets(buf, rows):  # pragma: no cover - compiled
    """Byte offsets of the lines of the given rows (ascending) of :func:`parse_lines`."""
    out = np.empty(rows.shape[0], dtype=np.int64)
    n = buf.shape[0]
    pos = 0
    row = 0
    j = 0
    while pos < n and j < rows.shape[0]:
        ls = pos
        while pos < n and _is_blank(buf[pos]):
            pos += 1
        if pos < n and buf[pos] != 10 and buf[pos] != 35:
            while j < rows.shape[0] and rows[j] == row:
                out[j] = ls
                j += 1
            row += 1
        while pos < n and buf[pos] != 10:
            pos += 1
        pos += 1
    return out


@njit(nogil=True, cache=True)
def parse_lines(buf, mode, n_features, want_qid):  # pragma: no cover - compiled
    """Parse whole svmlight lines.

    Parameters
    ----------
    buf : uint8 array
        Lines of the file; every line but the last ends with a newline.
    mode : int
        ``ZERO_BASED``, ``ONE_BASED`` or ``AUTO_BASED``.
    n_features : int
        Number of columns, or -1 when unknown.
    want_qid : bool
        Every line must carry ``qid:N``; the values are returned.

    Returns
    -------
    status, err_line, err_start, err_end : int
        Status (``OK`` or the first problem); its line (0-based, within ``buf``) and the byte
        range of the offending token.
    n_rows, n_newlines, n_slow : int
        Rows parsed (complete rows before the problem), newlines in ``buf``, and NaN
        placeholders in the complete rows of ``y`` and ``data``, to convert with ``float()``.
    y, indptr, indices, data : arrays
        Labels and CSR arrays, valid up to ``n_rows`` rows (raw, unshifted indices, int32).
    qid : int64 array
        Query id of each row (empty unless ``want_qid``).
    min_index, max_index : int
        Smallest and largest index of the complete rows (``MAX_INDEX + 1`` / -1 if none).
    eq_line, eq_start, eq_end : int
        In ``AUTO_BASED`` mode, the first line (-1 if none) with index ``== n_features``,
        out of range only if the file turns out to be zero-based.
    """
    n = buf.shape[0]
    n_nl = 0
    n_colon = 0
    for i in range(n):
        c = buf[i]
        n_nl += c == 10
        n_colon += c == 58
    rows_cap = n_nl + 1
    y = np.empty(rows_cap, dtype=np.float64)
    indptr = np.empty(rows_cap + 1, dtype=np.int64)
    qid = np.empty(rows_cap if want_qid else 0, dtype=np.int64)
    indices = np.empty(n_colon, dtype=np.int32)
    data = np.empty(n_colon, dtype=np.float64)
    indptr[0] = 0
    status = OK
    err_s = 0
    err_e = 0
    eq_line = -1
    eq_s = 0
    eq_e = 0
    min_idx = MAX_INDEX + 1
    max_idx = -1
    n_slow = 0
    row = 0
    k = 0
    line = 0
    pos = 0
    while pos < n:
        ls = pos
        while pos < n and _is_blank(buf[pos]):
            pos += 1
        if pos >= n:
            break
        c = buf[pos]
        if c == 10 or c == 35:
            while pos < n and buf[pos] != 10:
                pos += 1
            pos += 1
            line += 1
            continue
        # label
        ts = pos
        ok, v, end = scan_float(buf, pos, n)
        if ok and (end >= n or _ends_token(buf[end])):
            pos = end
        else:
            te = _token_end(buf, pos, n)
            has_colon = False
            for j in range(ts, te):
                if buf[j] == 58:
                    has_colon = True
            if has_colon:
                status = MISSING_LABEL
                err_s = ts
                err_e = te
                break
            ok, v = parse_float(buf, ts, te)
            if not ok:
                v = np.nan
                n_slow += 1
            pos = te
        y[row] = v
        k0 = k
        prev = -1
        first = True
        has_qid = False
        while True:
            while pos < n and _is_blank(buf[pos]):
                pos += 1
            if pos >= n:
                break
            c = buf[pos]
            if c == 10:
                break
            if c == 35:
                while pos < n and buf[pos] != 10:
                    pos += 1
                break
            ts = pos
            # index: fast path for plain digits followed by ':'
            idx = 0
            i = pos
            while i < n:
                d = np.int64(buf[i]) - 48
                if d < 0 or d > 9:
                    break
                idx = idx * 10 + d
                i += 1
            if pos < i <= pos + 10 and i < n and buf[i] == 58 and idx <= MAX_INDEX:
                colon = i
            else:
                te = _token_end(buf, pos, n)
                colon = -1
                for j in range(ts, te):
                    if buf[j] == 58:
                        colon = j
                        break
                if first and te - ts >= 3 and buf[ts] == 113 and buf[ts + 1] == 105:
                    if buf[ts + 2] == 100:  # "qid"
                        first = False
                        st = 1
                        qv = 0
                        if colon == ts + 3:
                            st, qv = parse_int(buf, ts + 4, te, (1 << 63) - 1)
                        if st != 0:
                            status = BAD_QID
                            err_s = ts
                            err_e = te
                            break
                        if want_qid:
                            qid[row] = qv
                        has_qid = True
                        pos = te
                        continue
                if colon < 0 or colon == ts:
                    status = BAD_PAIR
                    err_s = ts
                    err_e = te
                    break
                st, idx = parse_int(buf, ts, colon, MAX_INDEX)
                if st == 1:
                    status = BAD_INDEX
                elif idx < 0 or (st == 2 and buf[ts] == 45):
                    status = NEGATIVE_INDEX
                elif st == 2:
                    status = INDEX_OVERFLOW
                if status != OK:
                    err_s = ts
                    err_e = te
                    break
            first = False
            if idx == 0 and mode == ONE_BASED:
                status = ZERO_INDEX
            elif idx <= prev:
                status = DUPLICATE if idx == prev else UNSORTED
            elif n_features >= 0:
                if idx > n_features or (idx == n_features and mode == ZERO_BASED):
                    status = INDEX_TOO_LARGE
                elif idx == n_features and mode == AUTO_BASED and eq_line < 0:
                    eq_line = line
                    eq_s = ts
                    eq_e = _token_end(buf, ts, n)
            if status != OK:
                err_s = ts
                err_e = _token_end(buf, ts, n)
                break
            # value
            vs = colon + 1
            if vs >= n or _ends_token(buf[vs]):
                status = BAD_PAIR
                err_s = ts
                err_e = _token_end(buf, ts, n)
                break
            ok, v, end = scan_float(buf, vs, n)
            if ok and (end >= n or _ends_token(buf[end])):
                pos = end
            else:
                te = _token_end(buf, vs, n)
                ok, v = parse_float(buf, vs, te)
                if not ok:
                    v = np.nan
                    n_slow += 1
                pos = te
            indices[k] = idx
            data[k] = v
            k += 1
            prev = idx
        if status == OK and want_qid and not has_qid:
            status = MISSING_QID
            err_s = ls
            err_e = pos
        if status != OK:
            break
        if k > k0:
            if indices[k0] < min_idx:
                min_idx = indices[k0]
            if indices[k - 1] > max_idx:
                max_idx = indices[k - 1]
        indptr[row + 1] = k
        row += 1
        pos += 1
        line += 1
    if status != OK:
        # placeholders of the failing line are not counted
        n_slow = 0
        for r in range(row):
            if np.isnan(y[r]):
                n_slow += 1
        for j in range(indptr[row]):
            if np.isnan(data[j]):
                n_slow += 1
    return (
        status,
        line,
        err_s,
        err_e,
        row,
        n_nl,
        n_slow,
        y,
        indptr,
        indices,
        data,
        qid,
        min_idx,
        max_idx,
        eq_line,
        eq_s,
        eq_e,
    )
