"""Numba kernels converting the numbers of svmlight/libsvm files: decimal floats and integers.

The line parser (:mod:`dl1.kernels.svmlight`) calls them on each token of a line.
Numbers are converted exactly as Python's ``float()`` / ``int()`` (and so scikit-learn's
``load_svmlight_file``) convert them:

* decimal mantissas with at most 19 significant digits are converted exactly, by Clinger's
  fast path (mantissa ``<= 2**53``, ``|exponent| <= 22``: one correctly rounded multiply or
  divide by an exact power of ten) or otherwise by the Eisel-Lemire algorithm (a 128-bit
  product with a truncated power of five, proven sufficient by Mushtak and Lemire, 2023);
* longer mantissas are converted from their first 19 digits ``w`` and from ``w + 1``; when
  both round to the same double, that double is the answer;
* anything else (``inf``, ``nan``, underscores, hexadecimal, an overflow, garbage, or a
  long mantissa whose rounding is ambiguous) is refused (``ok`` is False): the line parser
  stores it as NaN and counts it as "slow", and its caller converts those tokens again
  with ``float()``.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

_SMALLEST_POW10 = -342
_LARGEST_POW10 = 308


def _pow5_table() -> np.ndarray:
    """128-bit truncated powers of five, 5**q for q in [-342, 308], as (hi, lo) uint64 pairs.

    The same table as fast_float's ``power_of_five_128`` (its ``table_generation.py``).
    """
    words = []
    for q in range(_SMALLEST_POW10, 0):
        p5 = 5**-q
        z = p5.bit_length()  # the smallest z with 2**z >= 5**-q (never a power of two)
        if q >= -27:
            c = 2 ** (z + 127) // p5 + 1
        else:
            c = 2 ** (2 * z + 128) // p5 + 1
            c >>= max(0, c.bit_length() - 128)
        words.append(c)
    for q in range(0, _LARGEST_POW10 + 1):
        p5 = 5**q
        shift = 128 - p5.bit_length()
        c = p5 << shift if shift >= 0 else p5 >> -shift
        words.append(c)
    out = np.empty(2 * len(words), dtype=np.uint64)
    for i, c in enumerate(words):
        out[2 * i] = c >> 64
        out[2 * i + 1] = c & ((1 << 64) - 1)
    return out


POW5 = _pow5_table()
POW10 = np.array([10.0**k for k in range(23)], dtype=np.float64)

_U0 = np.uint64(0)
_U1 = np.uint64(1)
_U3 = np.uint64(3)
_U32 = np.uint64(32)
_U63 = np.uint64(63)
_MASK32 = np.uint64(0xFFFFFFFF)
_PREC_MASK = np.uint64(0x1FF)  # low 64 - (52 + 3) bits of the high product word
_HIDDEN = np.uint64(1 << 52)
_TWO_HIDDEN = np.uint64(1 << 53)
_NOT_HIDDEN = np.uint64(((1 << 64) - 1) ^ (1 << 52))
_NOT_ONE = np.uint64(((1 << 64) - 1) ^ 1)
_MAX_19 = np.uint64(10**19 - 1)
_TWO53 = np.uint64(1 << 53)


@njit(nogil=True, cache=True, inline="always")
def _mul128(a, b):  # pragma: no cover - compiled
    """High and low 64-bit words of the 128-bit product of two uint64."""
    a_lo = a & _MASK32
    a_hi = a >> _U32
    b_lo = b & _MASK32
    b_hi = b >> _U32
    p0 = a_lo * b_lo
    p1 = a_lo * b_hi
    p2 = a_hi * b_lo
    p3 = a_hi * b_hi
    mid = (p0 >> _U32) + (p1 & _MASK32) + (p2 & _MASK32)
    lo = (mid << _U32) | (p0 & _MASK32)
    hi = p3 + (p1 >> _U32) + (p2 >> _U32) + (mid >> _U32)
    return hi, lo


@njit(nogil=True, cache=True, inline="always")
def _clz64(x):  # pragma: no cover - compiled
    """Leading zero bits of a nonzero uint64."""
    n = 0
    if (x >> np.uint64(32)) == _U0:
        n += 32
        x = x << np.uint64(32)
    if (x >> np.uint64(48)) == _U0:
        n += 16
        x = x << np.uint64(16)
    if (x >> np.uint64(56)) == _U0:
        n += 8
        x = x << np.uint64(8)
    if (x >> np.uint64(60)) == _U0:
        n += 4
        x = x << np.uint64(4)
    if (x >> np.uint64(62)) == _U0:
        n += 2
        x = x << np.uint64(2)
    if (x >> _U63) == _U0:
        n += 1
    return n


@njit(nogil=True, cache=True)
def eisel_lemire(w, q):  # pragma: no cover - compiled
    """Correctly rounded ``w * 10**q`` for a nonzero uint64 ``w``.

    Returns ``(ok, value)``; ``ok`` is False when the result overflows to infinity.
    """
    if q < _SMALLEST_POW10:
        return True, 0.0
    if q > _LARGEST_POW10:
        return False, np.inf
    lz = _clz64(w)
    w = w << np.uint64(lz)
    idx = 2 * (q - _SMALLEST_POW10)
    hi, lo = _mul128(w, POW5[idx])
    if (hi & _PREC_MASK) == _PREC_MASK:
        hi2, _ = _mul128(w, POW5[idx + 1])
        lo = lo + hi2
        if hi2 > lo:
            hi = hi + _U1
    upperbit = hi >> _U63
    shift = upperbit + np.uint64(9)
    mantissa = hi >> shift
    # floor(q * log2(10)) + 63, exact for |q| <= 1650
    power2 = ((217706 * q) >> 16) + 63 + np.int64(upperbit) - lz + 1023
    if power2 <= 0:
        if -power2 + 1 >= 64:
            return True, 0.0
        mantissa = mantissa >> np.uint64(-power2 + 1)
        mantissa = mantissa + (mantissa & _U1)
        mantissa = mantissa >> _U1
        # a subnormal, or the smallest normal when rounding carried into the hidden bit
        return True, math.ldexp(np.float64(mantissa), -1074)
    if lo <= _U1 and -4 <= q <= 23 and (mantissa & _U3) == _U1:
        # exactly halfway: round to even instead of up
        if (mantissa << shift) == hi:
            mantissa = mantissa & _NOT_ONE
    mantissa = mantissa + (mantissa & _U1)
    mantissa = mantissa >> _U1
    if mantissa >= _TWO_HIDDEN:
        mantissa = _HIDDEN
        power2 += 1
    mantissa = mantissa & _NOT_HIDDEN
    if power2 >= 0x7FF:
        return False, np.inf
    return True, math.ldexp(np.float64(mantissa | _HIDDEN), power2 - 1075)


@njit(nogil=True, cache=True)
def parse_float(buf, s, e):  # pragma: no cover - compiled
    """Parse ``buf[s:e]`` as a plain decimal float.

    Returns ``(ok, value)``; ``ok`` is False when the token is not a plain decimal
    (``[+-]digits[.digits][(e|E)[+-]digits]``), when the result is not finite, or when a
    mantissa of more than 19 digits cannot be rounded without all its digits.
    """
    i = s
    neg = False
    c = buf[i]
    if c == 45 or c == 43:
        neg = c == 45
        i += 1
    w = _U0
    nd = 0
    exp10 = 0
    any_digit = False
    truncated = False
    while i < e:
        c = buf[i]
        if c < 48 or c > 57:
            break
        any_digit = True
        if nd < 19:
            if w != _U0 or c != 48:
                w = w * np.uint64(10) + np.uint64(c - 48)
                nd += 1
        else:
            exp10 += 1
            if c != 48:
                truncated = True
        i += 1
    if i < e and buf[i] == 46:
        i += 1
        while i < e:
            c = buf[i]
            if c < 48 or c > 57:
                break
            any_digit = True
            if nd < 19:
                if w != _U0 or c != 48:
                    w = w * np.uint64(10) + np.uint64(c - 48)
                    nd += 1
                exp10 -= 1
            elif c != 48:
                truncated = True
            i += 1
    if not any_digit:
        return False, 0.0
    if i < e and (buf[i] == 101 or buf[i] == 69):
        i += 1
        eneg = False
        if i < e and (buf[i] == 45 or buf[i] == 43):
            eneg = buf[i] == 45
            i += 1
        if i >= e:
            return False, 0.0
        ex = 0
        while i < e:
            c = buf[i]
            if c < 48 or c > 57:
                return False, 0.0
            ex = ex * 10 + (c - 48)
            if ex > 100000:
                return False, 0.0
            i += 1
        exp10 += -ex if eneg else ex
    if i != e:
        return False, 0.0
    if w == _U0:
        return True, -0.0 if neg else 0.0
    if not truncated:
        if w <= _TWO53 and -22 <= exp10 <= 22:
            v = np.float64(w)
            if exp10 >= 0:
                v = v * POW10[exp10]
            else:
                v = v / POW10[-exp10]
            return True, -v if neg else v
        ok, v = eisel_lemire(w, exp10)
        return ok, -v if neg else v
    ok, v = eisel_lemire(w, exp10)
    ok2, v2 = eisel_lemire(w + _U1, exp10)
    if ok and ok2 and v == v2:
        return True, -v if neg else v
    return False, 0.0


@njit(nogil=True, cache=True)
def parse_int(buf, s, e, limit):  # pragma: no cover - compiled
    """Parse ``buf[s:e]`` as Python's ``int()`` would (sign, digits, single underscores
    between digits).

    Returns ``(status, value)``: status 0 valid, 1 malformed, 2 magnitude above ``limit``.
    """
    i = s
    neg = False
    if i < e and (buf[i] == 45 or buf[i] == 43):
        neg = buf[i] == 45
        i += 1
    if i >= e:
        return 1, 0
    v = 0
    big = False
    prev_digit = False
    while i < e:
        c = buf[i]
        if 48 <= c <= 57:
            if not big:
                v = v * 10 + (c - 48)
                if v > limit:
                    big = True
            prev_digit = True
        elif c == 95 and prev_digit and i + 1 < e and 48 <= buf[i + 1] <= 57:
            prev_digit = False
        else:
            return 1, 0
        i += 1
    if big:
        return 2, 0
    return 0, -v if neg else v


@njit(nogil=True, cache=True, inline="always")
def scan_float(buf, s, n):  # pragma: no cover - compiled
    """Fast path of :func:`parse_float` without a known token end.

    Parses the longest plain decimal starting at ``s`` and returns ``(ok, value, end)``.
    ``ok`` is False when there is no digit, the exponent is malformed or huge, the mantissa
    has more than 19 significant digits, or the value overflows; the caller then checks
    that ``buf[end]`` ends the token, else the token is converted by :func:`parse_float`.
    """
    i = s
    neg = False
    if i < n and (buf[i] == 45 or buf[i] == 43):
        neg = buf[i] == 45
        i += 1
    d0 = i
    w = _U0
    while i < n:
        d = np.int64(buf[i]) - 48
        if d < 0 or d > 9:
            break
        w = w * np.uint64(10) + np.uint64(d)
        i += 1
    nd = i - d0
    exp10 = 0
    if i < n and buf[i] == 46:
        i += 1
        f0 = i
        while i < n:
            d = np.int64(buf[i]) - 48
            if d < 0 or d > 9:
                break
            w = w * np.uint64(10) + np.uint64(d)
            i += 1
        exp10 = f0 - i
        nd += i - f0
    if nd == 0:
        return False, 0.0, i
    if i < n and (buf[i] == 101 or buf[i] == 69):
        i += 1
        eneg = False
        if i < n and (buf[i] == 45 or buf[i] == 43):
            eneg = buf[i] == 45
            i += 1
        e0 = i
        ex = 0
        while i < n:
            d = np.int64(buf[i]) - 48
            if d < 0 or d > 9:
                break
            ex = ex * 10 + d
            if ex > 100000:
                return False, 0.0, i
            i += 1
        if i == e0:
            return False, 0.0, i
        exp10 += -ex if eneg else ex
    if nd > 19:
        # leading zeros do not count; w wrapped around if more than 19 digits remain
        j = d0
        while j < i and (buf[j] == 48 or buf[j] == 46):
            j += 1
        sig = 0
        while j < i:
            c = buf[j]
            if c == 101 or c == 69:
                break
            sig += c != 46
            j += 1
        if sig > 19:
            return False, 0.0, i
    if w == _U0:
        return True, -0.0 if neg else 0.0, i
    if w <= _TWO53 and -22 <= exp10 <= 22:
        v = np.float64(w)
        if exp10 >= 0:
            v = v * POW10[exp10]
        else:
            v = v / POW10[-exp10]
        return True, -v if neg else v, i
    ok, v = eisel_lemire(w, exp10)
    return ok, -v if neg else v, i
