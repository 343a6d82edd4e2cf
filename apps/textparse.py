"""Byte-level pieces of the apps' text readers: lines, blanks, tokens, integers and decimals.

Data files can be large (NYTimes in UCI bag-of-words: 100M tokens), so every reader parses the raw
bytes of its file in one numba pass instead of looping over lines in Python. The pass for a format
(UCI and LDA-C in ``lda/data.py``, libsvm in ``mlr/data.py``, ratings CSV in ``mf/data.py``) is
built from the kernels here, all ``@njit(nogil=True, cache=True)`` over a ``uint8`` array and
half-open byte ranges ``[a, b)``. Numba code cannot build a message, so the kernels return
``(ok, value)`` instead of raising, and a format pass returns a status code with the line number and
byte offset where it stopped; its Python side turns that into a :class:`DataError` that starts with
``FILE:LINE:`` and quotes the offending text (:func:`line_text`, :func:`token_text`).

Numba's cache keys on the file of the function it compiled, not on the files of the functions that
one calls: after editing this module, delete ``apps/*/__pycache__`` so the format passes recompile.
"""

from __future__ import annotations

import gzip
import os
from fractions import Fraction
from pathlib import Path

import numpy as np
from numba import njit

from bosen.apps.datasets.packaged import prepare_hint
from bosen.errors import DataError

__all__ = [
    "NEWLINE", "HASH", "COLON", "COMMA", "is_blank", "line_end", "find_byte", "skip_blanks", "token_end",
    "trim", "count_byte", "parse_int", "parse_float", "read_bytes", "line_text", "token_text",
]

NEWLINE, HASH, COMMA, COLON = 10, 35, 44, 58

_POW10_MIN = -350  # 10**k correctly rounded to float64, k = _POW10_MIN..308 (exact for 0..22)
_POW10 = np.array([float(Fraction(10) ** k) for k in range(_POW10_MIN, 309)])
_EXACT_MANTISSA = 1 << 53


@njit(nogil=True, cache=True)
def is_blank(c: int) -> bool:
    """Space, tab, CR, VT or FF (CR so that CRLF files read like LF files)."""
    return c == 32 or c == 9 or c == 13 or c == 11 or c == 12


@njit(nogil=True, cache=True)
def line_end(buf: np.ndarray, pos: int) -> int:
    """Offset of the newline ending the line that starts at ``pos`` (``buf.size`` if there is none)."""
    n = buf.size
    while pos < n and buf[pos] != NEWLINE:
        pos += 1
    return pos


@njit(nogil=True, cache=True)
def find_byte(buf: np.ndarray, a: int, b: int, byte: int) -> int:
    """First offset in ``[a, b)`` holding ``byte``, or ``b``."""
    while a < b and buf[a] != byte:
        a += 1
    return a


@njit(nogil=True, cache=True)
def skip_blanks(buf: np.ndarray, a: int, b: int) -> int:
    """First offset in ``[a, b)`` that is not blank, or ``b``."""
    while a < b and is_blank(buf[a]):
        a += 1
    return a


@njit(nogil=True, cache=True)
def token_end(buf: np.ndarray, a: int, b: int) -> int:
    """End of the blank-delimited token starting at ``a`` (first blank in ``[a, b)``, or ``b``)."""
    while a < b and not is_blank(buf[a]):
        a += 1
    return a


@njit(nogil=True, cache=True)
def trim(buf: np.ndarray, a: int, b: int) -> tuple[int, int]:
    """``[a, b)`` without leading and trailing blanks."""
    a = skip_blanks(buf, a, b)
    while b > a and is_blank(buf[b - 1]):
        b -= 1
    return a, b


@njit(nogil=True, cache=True)
def count_byte(buf: np.ndarray, byte: int) -> int:
    """How often ``byte`` occurs (readers size their output arrays by newlines or colons)."""
    n = 0
    for i in range(buf.size):
        if buf[i] == byte:
            n += 1
    return n


@njit(nogil=True, cache=True)
def parse_int(buf: np.ndarray, a: int, b: int) -> tuple[bool, int]:
    """Decimal integer filling ``[a, b)``: optional sign, then 1 to 18 digits (no int64 overflow)."""
    neg = False
    if a < b and (buf[a] == 45 or buf[a] == 43):  # - +
        neg = buf[a] == 45
        a += 1
    if a >= b or b - a > 18:
        return False, 0
    v = 0
    for j in range(a, b):
        c = buf[j]
        if c < 48 or c > 57:
            return False, 0
        v = v * 10 + (c - 48)
    return True, -v if neg else v


@njit(nogil=True, cache=True)
def _is_word(buf: np.ndarray, a: int, b: int, word: bytes) -> bool:
    """Whether ``[a, b)`` spells ``word`` (lower case ASCII), ignoring case."""
    if b - a != len(word):
        return False
    for k in range(b - a):
        if buf[a + k] | 32 != word[k]:
            return False
    return True


@njit(nogil=True, cache=True)
def parse_float(buf: np.ndarray, a: int, b: int) -> tuple[bool, float]:
    """Decimal number filling ``[a, b)``: sign, digits, ``.``, exponent; or nan / inf / infinity.

    The value is correctly rounded when the significant digits fit 2^53 and the decimal exponent is
    within ±22 (the values data files hold), and otherwise within two ulps.
    nan and inf parse (ok, not finite), so a reader can tell "not a number" from "not finite".
    """
    neg = False
    if a < b and (buf[a] == 45 or buf[a] == 43):
        neg = buf[a] == 45
        a += 1
    if a < b and buf[a] > 57:  # a letter: nan, inf, infinity
        if _is_word(buf, a, b, b"nan"):
            return True, np.nan
        if _is_word(buf, a, b, b"inf") or _is_word(buf, a, b, b"infinity"):
            return True, -np.inf if neg else np.inf
        return False, 0.0
    mant = 0
    kept = 0  # significant digits in mant (at most 18)
    scale = 0  # decimal exponent correction for digits dropped or after the point
    digits = 0
    i = a
    while i < b and 48 <= buf[i] <= 57:
        if kept < 18:
            if mant or buf[i] != 48:
                kept += 1
            mant = mant * 10 + (buf[i] - 48)
        else:
            scale += 1
        i += 1
        digits += 1
    if i < b and buf[i] == 46:  # .
        i += 1
        while i < b and 48 <= buf[i] <= 57:
            if kept < 18:
                if mant or buf[i] != 48:
                    kept += 1
                mant = mant * 10 + (buf[i] - 48)
                scale -= 1
            i += 1
            digits += 1
    if digits == 0:
        return False, 0.0
    if i < b and (buf[i] == 101 or buf[i] == 69):  # e E
        i += 1
        eneg = False
        if i < b and (buf[i] == 43 or buf[i] == 45):
            eneg = buf[i] == 45
            i += 1
        e = 0
        edigits = 0
        while i < b and 48 <= buf[i] <= 57:
            if e < 100000:
                e = e * 10 + (buf[i] - 48)
            i += 1
            edigits += 1
        if edigits == 0:
            return False, 0.0
        scale += -e if eneg else e
    if i != b:
        return False, 0.0
    if mant == 0 or scale < _POW10_MIN:  # mant < 10**18: below the smallest subnormal
        v = 0.0
    elif scale > 308:
        v = np.inf
    elif mant < _EXACT_MANTISSA and -22 <= scale <= 22:  # both operands exact: one rounding
        v = mant * _POW10[scale - _POW10_MIN] if scale >= 0 else mant / _POW10[-scale - _POW10_MIN]
    elif scale < -300:  # subnormal range: scale in two steps so the first product stays normal
        v = (mant * _POW10[scale + 300 - _POW10_MIN]) * 1e-300
    else:
        v = mant * _POW10[scale - _POW10_MIN]
    return True, -v if neg else v


# ------------------------------------------------------------------------------------------------
# the Python side: reading a file, quoting the text an error is about


def read_bytes(path: str | os.PathLike, what: str) -> np.ndarray:
    """The bytes of a data file as ``uint8`` (``.gz`` files decompressed), or a DataError that says
    ``what`` file could not be read (``what``: "ratings", "docword", ...)."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: {what} file not found, cannot read it{prepare_hint(p)}")
    if not p.is_file():
        raise DataError(f"{p}: {what} path is not a regular file, cannot read it")
    try:
        if p.suffix == ".gz":
            with gzip.open(p, "rb") as f:
                raw = f.read()
        else:
            raw = p.read_bytes()
    except (OSError, EOFError) as e:
        raise DataError(f"{p}: cannot read {what} file: {e}") from None
    return np.frombuffer(raw, dtype=np.uint8)


def line_text(buf: np.ndarray, start: int, limit: int = 80) -> str:
    """The line starting at offset ``start`` (at most ``limit`` characters, "..." when cut)."""
    n = buf.size
    end = start
    while end < n and buf[end] != NEWLINE and end - start < limit:
        end += 1
    text = bytes(buf[start:end]).decode("utf-8", "replace").rstrip("\r")
    return text + ("..." if end < n and buf[end] != NEWLINE else "")


def token_text(buf: np.ndarray, pos: int, stops: bytes = b" \t\r\n#") -> str:
    """The token starting at offset ``pos``: up to the first byte in ``stops``."""
    n = buf.size
    end = pos
    while end < n and buf[end] not in stops:
        end += 1
    return bytes(buf[pos:end]).decode("utf-8", "replace")
