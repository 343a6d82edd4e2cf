"""The shared byte parsers of the apps' readers, and the one DataError every reader raises."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np
import pytest

from bosen.apps import textparse as tp
from bosen.apps.lda.data import read_ldac, read_uci
from bosen.apps.mf.data import load_csv
from bosen.apps.mlr.data import read_libsvm
from bosen.errors import BosenError, DataError


def _buf(text: str) -> np.ndarray:
    return np.frombuffer(text.encode(), dtype=np.uint8)


def _float(text: str) -> tuple[bool, float]:
    b = _buf(text)
    return tp.parse_float(b, 0, b.size)


def _int(text: str) -> tuple[bool, int]:
    b = _buf(text)
    return tp.parse_int(b, 0, b.size)


@pytest.mark.parametrize("text", ["0", "-0", "1", "+7", "-1.5", ".5", "5.", "1e-3", "2E+10", "0.1", "123456789.125",
                                  "0.000001234", "00012", "6.02214076e23", "1e22", "1234567890123456e-5"])
def test_parse_float_matches_python(text):
    ok, v = _float(text)
    assert ok and v == float(text)


@pytest.mark.parametrize("text", ["1e308", "-4.9e-324", "2.5e-310", "1.7976931348623157e308", "3e-200",
                                  "123456789012345678901234567890", "3.14159265358979323846",
                                  "12345678901234567e-5"])
def test_parse_float_far_exponents_and_long_mantissas_within_two_ulps(text):
    ok, v = _float(text)
    want = float(text)
    assert ok and abs(v - want) <= 2 * math.ulp(want)


def test_parse_float_round_trips_printed_values():
    """Values as data files print them (up to 9 significant digits, exponents within ±22) come back
    exactly; full-precision reprs over the whole range within two ulps."""
    rng = np.random.default_rng(0)
    xs = rng.standard_normal(3000) * 10.0 ** rng.integers(-8, 8, 3000)
    for fmt in (".6g", ".9g", ".4f", ".7e"):
        for x in xs:
            s = format(float(x), fmt)
            assert _float(s) == (True, float(s)), s
    for x in rng.standard_normal(3000) * 10.0 ** rng.integers(-300, 300, 3000):
        ok, v = _float(repr(float(x)))
        assert ok and abs(v - x) <= 2 * math.ulp(x), repr(x)


@pytest.mark.parametrize("text, want", [("nan", np.nan), ("NaN", np.nan), ("inf", np.inf), ("-Infinity", -np.inf),
                                        ("1e400", np.inf)])
def test_parse_float_non_finite_parses(text, want):
    ok, v = _float(text)
    assert ok and (np.isnan(v) if np.isnan(want) else v == want)


@pytest.mark.parametrize("text", ["", "-", "+", ".", "e5", "1e", "1e+", "1.2.3", "1,5", "abc", "infinit", "1 2",
                                  "0x10", "1_000"])
def test_parse_float_rejects(text):
    assert _float(text) == (False, 0.0)


@pytest.mark.parametrize("text, want", [("0", 0), ("42", 42), ("-17", -17), ("+3", 3),
                                        ("999999999999999999", 10**18 - 1)])
def test_parse_int(text, want):
    assert _int(text) == (True, want)


@pytest.mark.parametrize("text", ["", "-", "1.0", "1e3", "12a", "1000000000000000000", " 1"])
def test_parse_int_rejects(text):
    assert _int(text) == (False, 0)


def test_lines_blanks_and_tokens():
    b = _buf(" \tab  c\r\nx,y#z\n")
    end = tp.line_end(b, 0)
    assert end == 8 and tp.line_end(b, end + 1) == b.size - 1 and tp.line_end(b, b.size) == b.size
    assert tp.trim(b, 0, end) == (2, 7)  # the CR counts as blank
    i = tp.skip_blanks(b, 0, end)
    assert (i, tp.token_end(b, i, end)) == (2, 4)
    assert tp.find_byte(b, 9, b.size, tp.COMMA) == 10 and tp.find_byte(b, 9, b.size, tp.HASH) == 12
    assert tp.find_byte(b, 9, 12, tp.COLON) == 12
    assert tp.count_byte(b, tp.NEWLINE) == 2
    assert tp.line_text(b, 0) == " \tab  c" and tp.line_text(b, 9) == "x,y#z"
    assert tp.line_text(_buf("abcdef\n"), 0, limit=3) == "abc..."
    assert tp.token_text(b, 9) == "x,y" and tp.token_text(b, 9, b",") == "x"


def test_read_bytes(tmp_path):
    p = tmp_path / "a.txt"
    p.write_bytes(b"1 2\n")
    assert bytes(tp.read_bytes(p, "data")) == b"1 2\n"
    with gzip.open(tmp_path / "a.txt.gz", "wb") as f:
        f.write(b"1 2\n")
    assert bytes(tp.read_bytes(tmp_path / "a.txt.gz", "data")) == b"1 2\n"
    with pytest.raises(DataError, match=r"b\.txt: ratings file not found"):
        tp.read_bytes(tmp_path / "b.txt", "ratings")
    with pytest.raises(DataError, match="docword path is not a regular file"):
        tp.read_bytes(tmp_path, "docword")
    (tmp_path / "bad.gz").write_bytes(b"not gzip")
    with pytest.raises(DataError, match=r"bad\.gz: cannot read data file"):
        tp.read_bytes(tmp_path / "bad.gz", "data")


def _gz(path: Path, text: str) -> Path:
    with gzip.open(path, "wt") as f:
        f.write(text)
    return path


@pytest.mark.parametrize("name, text, read, line", [
    ("r.csv", "0,1,2\n1,x,3\n", load_csv, 2),
    ("d.svm", "1 1:1\n2 1:x\n", read_libsvm, 2),
    ("docword.t.txt", "1\n2\n1\n1 3 1\n", read_uci, 4),
    ("c.ldac", "1 0:1\n2 1:1\n", read_ldac, 2),
])
def test_every_reader_raises_the_one_data_error_naming_file_and_line(tmp_path, name, text, read, line):
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(DataError) as e:
        read(p)
    assert isinstance(e.value, ValueError) and isinstance(e.value, BosenError)
    assert str(e.value).startswith(f"{p}:{line}: ")
    gz = _gz(tmp_path / (name + ".gz"), text)  # every reader takes gzip files alike
    with pytest.raises(DataError, match=f"{gz}:{line}: "):
        read(gz)


def test_csv_reader_takes_crlf_gzip_and_signs(tmp_path):
    u, i, r = load_csv(_gz(tmp_path / "r.csv.gz", "user, item, rating\r\n+3 ,4, -2.5\r\n5,6.0,1e-1\r\n"))
    assert u.tolist() == [3, 5] and i.tolist() == [4, 6] and u.dtype == i.dtype == np.int64
    np.testing.assert_array_equal(r, np.array([-2.5, 0.1], np.float32))
