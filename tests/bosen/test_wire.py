"""bosen.wire: round trips, and rejection of every kind of malformed header or update."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from bosen import wire
from bosen.errors import ProtocolError
from bosen.wire import Msg, UpdateBatch


def packed(h) -> bytes:
    return msgpack.packb(h, use_bin_type=True)


def as_bytes(frames):
    """What arrives on the other side: plain bytes per frame."""
    return [bytes(f) for f in frames]


INC_DENSE = {"t": Msg.INC, "s": 7, "tb": 0, "n": 2, "dt": "float32", "sp": False}


# ------------------------------------------------------------------------------------------------
# round trips


@pytest.mark.parametrize("header", [
    {"t": Msg.HELLO, "s": 1, "rank": -1, "fp": "abc123"},
    {"t": Msg.CLOCK, "s": 9, "c": 4},
    {"t": Msg.BYE, "s": 2},
    {"t": Msg.STATUS, "s": 3},
    {"t": Msg.WELCOME, "rq": 1, "rank": 3, "c": 0},
    {"t": Msg.SCLOCK, "c": 5, "a": -1},
    {"t": Msg.ACK, "rq": 11},
    {"t": Msg.ERROR, "rq": -1, "m": "bad thing ü"},
])
def test_header_round_trip(header):
    frames = wire.encode(header)
    assert len(frames) == 1
    h = wire.decode_header(as_bytes(frames)[0])
    assert h == header
    assert isinstance(h["t"], Msg) and h["t"] is header["t"]
    assert wire.expected_frames(h) == 0
    wire.check_frames(h, 0)
    with pytest.raises(ProtocolError, match=f"{h['t'].name}: expected 0 array frames, got 2"):
        wire.check_frames(h, 2)


def test_status_reply_carries_large_stats_in_their_own_frame():
    stats = {"clock": 3, "tables": {"W": {"rows": 2, "send_count_hist": {str(i): i for i in range(5000)}}}}
    frames = as_bytes(wire.encode_status(4, stats))
    h = wire.decode_header(frames[0])
    assert h == {"t": Msg.STATUS_REPLY, "rq": 4} and wire.expected_frames(h) == 1
    assert wire.decode_status(frames[1]) == stats
    with pytest.raises(ProtocolError, match="stats"):
        wire.decode_status(b"\xc1garbage")
    with pytest.raises(ProtocolError, match="must be a map"):
        wire.decode_status(packed([1, 2]))


def test_read_and_rows_round_trip():
    rows = np.array([4, 0, 9], dtype=np.int64)
    frames = as_bytes(wire.encode({"t": Msg.READ, "s": 5, "tb": 1, "n": 3, "c": 2}, rows))
    h = wire.decode_header(frames[0])
    assert wire.expected_frames(h) == 1
    np.testing.assert_array_equal(wire.array(frames[1], wire.ROW_DTYPE, h["n"], "READ rows"), rows)

    vals = np.arange(12, dtype=np.float64).reshape(3, 4)
    frames = as_bytes(wire.encode({"t": Msg.ROWS, "tb": 0, "n": 3, "c": 7, "a": 3, "rq": -1, "dt": "float64", "ss": 1},
                                  rows, vals))
    h = wire.decode_header(frames[0])
    assert wire.expected_frames(h) == 2
    got = wire.array(frames[2], wire.value_dtype(h["dt"]), 12, "ROWS values").reshape(3, 4)
    np.testing.assert_array_equal(got, vals)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
def test_dense_update_round_trip(dtype):
    rows = np.array([3, 1, 3], dtype=np.int64)  # duplicates are legal
    vals = (np.arange(3 * 5) - 4).astype(dtype).reshape(3, 5)
    b = UpdateBatch(rows, vals)
    assert not b.sparse and b.nbytes() == rows.nbytes // 2 + vals.nbytes  # ids travel as int32
    h0 = {"t": Msg.INC, "s": 1, "tb": 0, "n": 3, "dt": dtype, "sp": False}
    frames = as_bytes(wire.encode(h0, *b.arrays()))
    h = wire.decode_header(frames[0])
    assert wire.expected_frames(h) == 2 == len(frames) - 1
    out = wire.decode_update(h, frames[1:], 5, np.dtype(dtype))
    assert not out.sparse
    np.testing.assert_array_equal(out.rows, rows)
    np.testing.assert_array_equal(out.values, vals)
    assert out.values.dtype == np.dtype(dtype)


def test_sparse_update_round_trip():
    rows = np.array([0, 2, 5], dtype=np.int64)
    indptr = np.array([0, 2, 2, 5], dtype=np.int64)  # the middle row has no entries
    cols = np.array([1, 1, 0, 3, 3], dtype=np.int32)  # duplicate columns are legal
    vals = np.array([1, -2, 3, 4, 5], dtype=np.int64)
    b = UpdateBatch(rows, vals, indptr, cols)
    assert b.sparse
    frames = as_bytes(wire.encode({"t": Msg.INC, "s": 1, "tb": 0, "n": 3, "dt": "int64", "sp": True}, *b.arrays()))
    h = wire.decode_header(frames[0])
    assert wire.expected_frames(h) == 4 == len(frames) - 1
    out = wire.decode_update(h, frames[1:], 4, np.dtype("int64"))
    assert out.sparse
    for a, e in zip(out.arrays(), b.arrays(), strict=True):
        np.testing.assert_array_equal(a, e)


def test_float16_wire_is_accepted_for_float_tables_only():
    rows = np.array([0], dtype=np.int64)
    vals = np.array([[0.5, -1.25]], dtype=np.float16)
    frames = as_bytes(wire.encode({**INC_DENSE, "n": 1, "dt": "float16"}, rows, vals))
    h = wire.decode_header(frames[0])
    for table_dt in ("float32", "float64"):
        out = wire.decode_update(h, frames[1:], 2, np.dtype(table_dt))
        np.testing.assert_array_equal(out.values, vals)
    with pytest.raises(ProtocolError, match="does not match"):
        wire.decode_update(h, frames[1:], 2, np.dtype("int64"))


def test_encode_sends_arrays_without_pickle_and_handles_non_contiguous():
    a = np.arange(20, dtype=np.int64).reshape(4, 5)[:, ::2]  # not contiguous
    frames = wire.encode({"t": Msg.ACK, "rq": 1}, a)
    assert bytes(frames[1]) == np.ascontiguousarray(a).tobytes()


def test_zmq_frames_are_accepted():
    zmq = pytest.importorskip("zmq")
    f = zmq.Frame(packed({"t": 4, "s": 1, "c": 2}))
    assert wire.decode_header(f)["c"] == 2
    rows = np.array([1, 2], dtype=np.int64)
    np.testing.assert_array_equal(wire.array(zmq.Frame(rows.tobytes()), wire.ROW_DTYPE, 2, "rows"), rows)


# ------------------------------------------------------------------------------------------------
# decode_header rejects


@pytest.mark.parametrize("raw, match", [
    (b"", "not valid msgpack"),
    (b"\xc1", "not valid msgpack"),  # reserved byte
    (b"\xff\x00garbage\x13\x37", "not valid msgpack"),
    (b"\x82\xa1t\x04", "not valid msgpack"),  # truncated map
    (packed({"t": 4, "s": 1, "c": 1}) + b"extra", "not valid msgpack"),
    (packed([4, 1, 1]), "must be a map"),
    (packed(42), "must be a map"),
    (packed("CLOCK"), "must be a map"),
    (packed(None), "must be a map"),
    (packed({1: 4}), "not valid msgpack"),  # non-string key
    (packed({"t": 99, "s": 1}), "unknown message type 99"),
    (packed({"t": "INC", "s": 1}), "unknown message type 'INC'"),
    (packed({"s": 1, "c": 1}), "unknown message type None"),
    (packed({"t": -4, "s": 1}), "unknown message type -4"),
    (packed({"t": 4, "c": 1}), "field 's'"),
    (packed({"t": 4, "s": 1}), "field 'c'"),
    (packed({"t": 4, "s": "1", "c": 1}), "field 's'"),
    (packed({"t": 4, "s": 1.0, "c": 1}), "field 's'"),
    (packed({"t": 4, "s": True, "c": 1}), "field 's'"),
    (packed({"t": 4, "s": None, "c": 1}), "field 's'"),
    (packed({"t": 1, "s": 1, "rank": 0, "fp": 5}), "field 'fp'"),
    (packed({"t": 2, "s": 1, "tb": 0, "n": 1, "dt": "int64", "sp": 0}), "field 'sp'"),
    (packed({"t": 2, "s": 1, "tb": 0, "n": 1, "dt": b"int64", "sp": False}), "not valid msgpack"),  # bin
    (packed({"t": 2, "s": 1, "tb": [0], "n": 1, "dt": "int64", "sp": False}), "field 'tb'"),
    (packed({"t": 26, "rq": None}), "field 'rq'"),
    (packed({"t": 4, "s": 1, "c": 1, "x": "y" * 5000}), "exceeds"),
])
def test_decode_header_rejects(raw, match):
    with pytest.raises(ProtocolError, match=match):
        wire.decode_header(raw)


def test_oversize_header_is_rejected_before_parsing():
    raw = packed({"t": 4, "s": 1, "c": 1, "pad": "x" * (wire.MAX_HEADER_BYTES + 10)})
    with pytest.raises(ProtocolError, match=f"exceeds {wire.MAX_HEADER_BYTES}"):
        wire.decode_header(raw)
    # exactly at the limit is still parsed (and then judged on its fields)
    h = {"t": 4, "s": 1, "c": 1, "pad": ""}
    h["pad"] = "x" * (wire.MAX_HEADER_BYTES - len(packed(h)) - 2)
    assert len(packed(h)) <= wire.MAX_HEADER_BYTES
    assert wire.decode_header(packed(h))["c"] == 1


def test_huge_containers_are_rejected():
    longest = getattr(wire, "MAX_HEADER_ARRAY", 64)
    assert wire.decode_header(packed({"t": 4, "s": 1, "c": 1, "x": [0] * longest}))["c"] == 1
    with pytest.raises(ProtocolError, match="not valid msgpack"):
        wire.decode_header(packed({"t": 4, "s": 1, "c": 1, "x": [0] * (longest + 1)}))
    with pytest.raises(ProtocolError, match="not valid msgpack"):
        wire.decode_header(packed({"t": 4, "s": 1, "c": 1, **{f"k{i}": 0 for i in range(100)}}))


@pytest.mark.parametrize("t", [True, 1.0])
def test_message_type_must_be_a_plain_integer(t):
    """``t`` is checked like every other field: ``true`` or ``1.0`` is not message type 1."""
    with pytest.raises(ProtocolError, match="message type"):
        wire.decode_header(packed({"t": t, "s": 1, "rank": 0, "fp": "x"}))


def test_value_dtype():
    assert wire.value_dtype("float16") == np.float16
    for bad in ("complex64", "object", "O", "int8", ""):
        with pytest.raises(ProtocolError, match="unknown dtype"):
            wire.value_dtype(bad)


# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sparse", [False, True])
def test_update_weights_ride_last_and_only_when_flagged(sparse):
    """Freshness probes' INC weights (``w``): one int32 per row, after every other frame."""
    rows = np.array([0, 2], dtype=np.int64)
    vals = np.array([[1, 0, 0], [0, 0, 2]], dtype=np.int64)
    b = UpdateBatch(rows, vals) if not sparse else UpdateBatch(rows, np.array([1, 2]), np.array([0, 1, 2]),
                                                               np.array([0, 2], dtype=np.int32))
    b.weights = np.array([3, 1], dtype=np.int32)
    frames = as_bytes(wire.encode({"t": Msg.INC, "s": 1, "tb": 0, "n": 2, "dt": "int64", "sp": sparse, "w": True},
                                  *b.arrays()))
    h = wire.decode_header(frames[0])
    assert wire.expected_frames(h) == (5 if sparse else 3) == len(frames) - 1
    out = wire.decode_update(h, frames[1:], 3, np.dtype("int64"))
    assert out.weights is not None and out.weights.tolist() == [3, 1]
    with pytest.raises(ProtocolError, match="INC weights: frame has 16 bytes"):
        wire.decode_update(h, [*frames[1:-1], np.array([3, 1], np.int64).tobytes()], 3, np.dtype("int64"))
    with pytest.raises(ProtocolError, match="weights must be >= 0"):
        wire.decode_update(h, [*frames[1:-1], np.array([3, -1], np.int32).tobytes()], 3, np.dtype("int64"))
    assert wire.decode_update(inc(dt="int64", sp=sparse), frames[1:-1], 3, np.dtype("int64")).weights is None


# decode_update rejects


def inc(n=2, dt="float32", sp=False, **kw):
    return {"t": Msg.INC, "s": 1, "tb": 0, "n": n, "dt": dt, "sp": sp, **kw}


def dense_frames(n=2, ncols=3, dtype="float32"):
    return [np.arange(n, dtype=np.int64).tobytes(), np.ones((n, ncols), dtype=dtype).tobytes()]


def sparse_frames(indptr, cols, vals=None, rows=None, dtype="int64"):
    n = len(indptr) - 1
    rows = np.arange(n, dtype=np.int64) if rows is None else rows
    vals = np.ones(len(cols), dtype=dtype) if vals is None else vals
    return [rows.tobytes(), np.asarray(indptr, dtype=np.int64).tobytes(), np.asarray(cols, dtype=np.int32).tobytes(),
            np.asarray(vals).tobytes()]


def test_decode_update_dense_ok():
    b = wire.decode_update(inc(), dense_frames(), 3, np.dtype("float32"))
    assert b.values.shape == (2, 3)


@pytest.mark.parametrize("frames, match", [
    ([np.arange(3, dtype=np.int64).tobytes(), np.ones((2, 3), np.float32).tobytes()], "INC rows"),
    ([np.arange(2, dtype=np.int16).tobytes(), np.ones((2, 3), np.float32).tobytes()], "INC rows"),
    ([np.arange(2, dtype=np.int64).tobytes(), np.ones((2, 2), np.float32).tobytes()], "INC values"),
    ([np.arange(2, dtype=np.int64).tobytes(), np.ones((2, 3), np.float64).tobytes()], "INC values"),
    ([np.arange(2, dtype=np.int64).tobytes(), np.ones((2, 3), np.float32).tobytes()[:-1]], "INC values"),
    ([np.arange(2, dtype=np.int64).tobytes(), b""], "INC values"),
])
def test_decode_update_rejects_wrong_byte_lengths(frames, match):
    with pytest.raises(ProtocolError, match=match):
        wire.decode_update(inc(), frames, 3, np.dtype("float32"))


def test_decode_update_rejects_negative_count():
    with pytest.raises(ProtocolError, match="negative"):
        wire.decode_update(inc(n=-1), [b"", b""], 3, np.dtype("float32"))


@pytest.mark.parametrize("wire_dt, table_dt", [
    ("float64", "float32"), ("float32", "float64"), ("int64", "float32"), ("float32", "int64"),
    ("int32", "int64"), ("int64", "int32"), ("float16", "int32"),
])
def test_decode_update_rejects_dtype_mismatch(wire_dt, table_dt):
    with pytest.raises(ProtocolError, match="does not match"):
        wire.decode_update(inc(dt=wire_dt), dense_frames(dtype=wire_dt), 3, np.dtype(table_dt))


def test_decode_update_rejects_unknown_dtype():
    with pytest.raises(ProtocolError, match="unknown dtype"):
        wire.decode_update(inc(dt="complex128"), dense_frames(), 3, np.dtype("float32"))


def test_decode_update_sparse_ok_and_empty():
    b = wire.decode_update(inc(n=2, dt="int64", sp=True), sparse_frames([0, 1, 3], [0, 2, 2]), 3, np.dtype("int64"))
    assert b.sparse and b.values.shape == (3,)
    b = wire.decode_update(inc(n=0, dt="int64", sp=True), sparse_frames([0], []), 3, np.dtype("int64"))
    assert b.rows.shape == (0,) and b.values.shape == (0,)


@pytest.mark.parametrize("indptr, cols, match", [
    ([1, 1, 2], [0, 1], "indptr"),        # does not start at 0
    ([0, 2, 1], [0], "indptr"),           # decreases
    ([0, 3, 2], [0, 1], "indptr"),        # decreases
    ([0, 1, 2], [0, 3], "column index out of range"),   # col == ncols
    ([0, 1, 2], [-1, 0], "column index out of range"),  # negative col
    ([0, 1, 2], [0, 1000000], "column index out of range"),
])
def test_decode_update_sparse_rejects_bad_structure(indptr, cols, match):
    with pytest.raises(ProtocolError, match=match):
        wire.decode_update(inc(n=2, dt="int64", sp=True), sparse_frames(indptr, cols), 3, np.dtype("int64"))


def test_decode_update_sparse_rejects_wrong_lengths():
    good = sparse_frames([0, 1, 3], [0, 2, 2])
    for i, what in ((1, "INC indptr"), (2, "INC cols"), (3, "INC values")):
        frames = list(good)
        frames[i] = frames[i][:-1]
        with pytest.raises(ProtocolError, match=what):
            wire.decode_update(inc(n=2, dt="int64", sp=True), frames, 3, np.dtype("int64"))
    # indptr claims more entries than the cols frame holds
    frames = sparse_frames([0, 1, 5], [0, 2, 2])
    with pytest.raises(ProtocolError, match="INC cols"):
        wire.decode_update(inc(n=2, dt="int64", sp=True), frames, 3, np.dtype("int64"))


def test_row_ids_travel_as_int32_where_every_one_fits():
    small = np.array([5, 0, 2**31 - 1], dtype=np.int64)
    assert wire.wire_ids(small).dtype == np.int32 and wire.wire_ids(small).nbytes == 12
    for big in ([2**31], [-(2**31) - 1], [3, 1 << 62]):  # hashed 64-bit ids stay int64
        rows = np.array(big, dtype=np.int64)
        assert wire.wire_ids(rows) is rows
    for rows in (small, np.array([1 << 62, 7], dtype=np.int64), np.empty(0, np.int64)):
        got = wire.ids(wire.wire_ids(rows).tobytes(), rows.shape[0], "ROWS rows")
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, rows)
    np.testing.assert_array_equal(wire.ids(small.tobytes(), 3, "ROWS rows"), small)  # int64 still read
    with pytest.raises(ProtocolError, match="READ rows: frame has 6 bytes, expected 3 x int64"):
        wire.ids(b"\0" * 6, 3, "READ rows")
    # an update of such rows: half the id bytes, the same rows back
    b = UpdateBatch(np.array([1 << 40, 2], dtype=np.int64), np.ones((2, 3), np.float32))
    assert b.arrays()[0].dtype == np.int64
    frames = as_bytes(wire.encode({"t": Msg.INC, "s": 1, "tb": 0, "n": 2, "dt": "float32", "sp": False},
                                  *UpdateBatch(small[:2], np.ones((2, 3), np.float32)).arrays()))
    assert len(frames[1]) == 8
    np.testing.assert_array_equal(wire.decode_update(wire.decode_header(frames[0]), frames[1:], 3,
                                                     np.dtype("float32")).rows, small[:2])


def test_array_checks_exact_length():
    buf = np.arange(4, dtype=np.int64).tobytes()
    assert wire.array(buf, wire.ROW_DTYPE, 4, "x").tolist() == [0, 1, 2, 3]
    with pytest.raises(ProtocolError, match="x: frame has 32 bytes, expected 3 x int64"):
        wire.array(buf, wire.ROW_DTYPE, 3, "x")
    with pytest.raises(ProtocolError):
        wire.array(buf, wire.ROW_DTYPE, -4, "x")


def test_bfloat16_rounds_to_nearest_even_and_widens_exactly():
    x = np.array([1.0, 1.00390625, 1.01171875, -2.5e-8, 3e38, 0.1, 0.0, -7.0], np.float32)
    b = wire.to_bfloat16(x)
    assert b.dtype == np.uint16
    # ties to even: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 and goes to 1; 1 + 3 * 2^-8 goes up
    np.testing.assert_array_equal(wire.from_bfloat16(b)[:3], np.array([1.0, 1.0, 1.015625], np.float32))
    back = wire.from_bfloat16(b)
    assert np.all(np.abs(back - x) <= np.abs(x) * 2.0 ** -8)
    assert wire.from_bfloat16(wire.to_bfloat16(back)).tobytes() == back.tobytes()  # exact once rounded


def test_a_bfloat16_update_reaches_a_float_table_as_float32():
    rows = np.array([3, 5], np.int64)
    vals = np.array([[0.5, -1.25], [3.0, 0.1]], np.float32)
    b = wire.to_bfloat16(vals)
    h = {"t": wire.Msg.INC, "s": 1, "tb": 0, "n": 2, "dt": "bfloat16", "sp": False}
    batch = wire.decode_update(h, [rows.tobytes(), b.tobytes()], 2, np.dtype(np.float32))
    assert batch.values.dtype == np.float32
    np.testing.assert_array_equal(batch.values, wire.from_bfloat16(b).reshape(2, 2))
    with pytest.raises(ProtocolError, match="dtype bfloat16 does not match the table's int64"):
        wire.decode_update(h, [rows.tobytes(), b.tobytes()], 2, np.dtype(np.int64))


def test_a_read_set_travels_as_ids_or_a_bitmap_whichever_is_smaller():
    few, many = np.array([3, 70], np.int64), np.arange(0, 1000, 2, dtype=np.int64)
    rs, arrays = wire.pack_read_set([(0, few, 1000), (2, many, 1000)])
    assert rs == [[0, 2], [2, -1]] and arrays[1].nbytes == 125
    frames = wire.encode({"t": wire.Msg.CLOCK, "s": 1, "c": 3, "rs": rs}, *arrays)
    h = wire.decode_header(frames[0])
    wire.check_frames(h, len(frames) - 1)
    reads = wire.read_set(h, [f.bytes for f in frames[1:]], [1000, 5, 1000])
    assert reads is not None  # sorted local rows per table, whichever way they travelled
    assert reads[0].tolist() == [3, 70] and reads[1].shape[0] == 0
    assert (reads[2] == many).all()
    assert wire.read_set({"t": wire.Msg.CLOCK, "s": 1, "c": 3}, [], [1000]) is None


@pytest.mark.parametrize("rs, frame, msg", [
    ([[0, 1]], np.array([1000], np.int64).tobytes(), "out of range"),
    ([[4, 0]], b"", "does not exist"),
    ([[0, -2]], b"", "count -2"),
    ([[0, -1]], b"\0", "bytes, expected"),
    ("x", b"", "'rs'"),
])
def test_a_bad_read_set_is_a_protocol_error(rs, frame, msg):
    with pytest.raises(ProtocolError, match=msg):
        h = {"t": wire.Msg.CLOCK, "s": 1, "c": 3, "rs": rs}
        wire.check_frames(h, 1)
        wire.read_set(h, [frame], [1000])


def test_a_flush_counts_each_parts_frames_then_its_read_set():
    """FLUSH parts: dense 2 frames, sparse 4, each plus a weights frame when flagged; then ``rs``."""
    rs, arrays = wire.pack_read_set([(0, np.array([1], np.int64), 100)])
    h = {"t": wire.Msg.FLUSH, "s": 1, "c": 2, "rs": rs,
         "u": [[0, 3, "float32", False, True], [1, 2, "float32", True, False]]}
    assert wire.expected_frames(h) == 3 + 4 + 1
    parts = wire.flush_parts(h)
    assert [wire.part_frames(p) for p in parts] == [3, 4] and parts[0]["w"] and parts[1]["sp"]
    inc = {"t": wire.Msg.INC, "tb": 1, "n": 2, "dt": "float32", "sp": True, "w": True}
    assert wire.flush_part(inc) == [1, 2, "float32", True, True]
    with pytest.raises(ValueError, match="versioned updates travel as INC"):
        wire.flush_part({**inc, "v": True, "nr": 0})
    with pytest.raises(ProtocolError, match="part 0 must be"):
        wire.flush_parts({**h, "u": [[0, 3, "float32", 0, False]]})
