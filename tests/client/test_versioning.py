"""Client side of parameter versioning and of per-table capabilities.

- VersionLog in process: which buffered updates are retired (end-of-version) and which versions are
  released when new ones arrive, with duplicates and version 0.
- The wire: versioned INC and ROWS frames round-trip and are checked.
- Against real servers: WELCOME tells the client, per table, whether it may show its own writes and
  whether rows are versioned; retired updates and releases really reach the server, which ends
  with no snapshot and no held version once the clients leave.
"""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from conftest import wait_until

from bosen import wire
from bosen.client import Client
from bosen.client.oplog import UpdateBuffer
from bosen.client.versions import VersionLog
from bosen.errors import ProtocolError
from bosen.wire import Msg, UpdateBatch

pytestmark = pytest.mark.timeout(180)



# ------------------------------------------------------------------------------------------------
# VersionLog


def test_receive_retires_buffered_updates_of_an_older_version_and_releases_the_rest():
    log = VersionLog(6)
    buf = UpdateBuffer(6, 2, np.dtype("float64"))
    importance = np.zeros(6)
    assert not log.receive(np.array([0, 1, 2, 3]), np.array([0, 4, 4, 4]), buf, importance)  # nothing held yet
    np.testing.assert_array_equal(log.version, [0, 4, 4, 4, 0, 0])
    buf.add_dense(np.array([1, 2, 5]), np.ones((3, 2)))  # tagged 4, 4 and 0 (never received)
    importance[[1, 2, 5]] = 7.0
    # row 1 moves to 6 with updates buffered: retired; row 2 re-sent at 4: release one hold, keep
    # the buffer; row 3 moves without updates: release 4; row 5 arrives at 2 over a tag-0 buffer: retired
    assert log.receive(np.array([1, 2, 3, 5]), np.array([6, 4, 5, 2]), buf, importance)
    rr, rt, rv, rw, lr, lt = log.take(2, np.dtype("float64"))
    assert (rr.tolist(), rt.tolist()) == ([1, 5], [4, 0])
    np.testing.assert_array_equal(rv, np.ones((2, 2)))
    assert rw.tolist() == [0, 0]  # inc operations not counted (freshness probes off)
    assert sorted(zip(lr.tolist(), lt.tolist(), strict=True)) == [(2, 4), (3, 4)]
    np.testing.assert_array_equal(buf.dirty_rows(), [2])  # row 2 keeps its (still valid) updates
    np.testing.assert_array_equal(importance[[1, 5]], [0, 0])
    assert importance[2] == 7.0
    np.testing.assert_array_equal(log.version, [0, 6, 4, 5, 0, 2])
    assert not log.pending and log.take(2, np.dtype("float64"))[0].size == 0


def test_receive_handles_a_row_twice_in_one_message_in_order():
    log = VersionLog(3)
    buf = UpdateBuffer(3, 1, np.dtype("float32"))
    log.receive(np.array([0]), np.array([1]), buf, None)
    buf.add_dense(np.array([0]), np.full((1, 1), 2.0, dtype=np.float32))
    log.receive(np.array([0, 0]), np.array([3, 3]), buf, None)
    rr, rt, rv, _, lr, lt = log.take(1, np.dtype("float32"))
    assert (rr.tolist(), rt.tolist(), rv.ravel().tolist()) == ([0], [1], [2.0])  # retired once, tag 1
    assert (lr.tolist(), lt.tolist()) == ([0], [3])  # the second receipt of 3 releases the first
    assert log.version[0] == 3


def test_release_all_hands_back_every_version_held():
    log = VersionLog(5)
    buf = UpdateBuffer(5, 1, np.dtype("float64"))
    log.receive(np.array([0, 1, 2]), np.array([2, 0, 7]), buf, None)
    log.release_all()
    _, _, _, _, lr, lt = log.take(1, np.dtype("float64"))
    assert sorted(zip(lr.tolist(), lt.tolist(), strict=True)) == [(0, 2), (2, 7)]
    assert not log.version.any()


# ------------------------------------------------------------------------------------------------
# wire


def _roundtrip(header, *arrays):
    frames = [bytes(f) for f in wire.encode(header, *arrays)]
    h = wire.decode_header(frames[0])
    assert wire.expected_frames(h) == len(frames) - 1
    return h, frames[1:]


@pytest.mark.parametrize("sparse", [False, True])
def test_versioned_inc_round_trips(sparse):
    rows = np.array([3, 1, 3], dtype=np.int64)
    block = np.array([[0.0, 2.0], [1.0, 0.0], [0.0, 0.0]])
    b = UpdateBatch(rows, block)
    if sparse:
        from bosen import rowmath
        indptr, cols, vals = rowmath.to_csr(block)
        b = UpdateBatch(rows, vals, indptr, cols)
    b.tags = np.array([5, 0, 6], dtype=np.int64)
    b.eov = np.array([1, 0, 0], dtype=np.uint8)
    b.rel_rows, b.rel_tags = np.array([0, 2], dtype=np.int64), np.array([9, 4], dtype=np.int64)
    h, frames = _roundtrip({"t": Msg.INC, "s": 1, "tb": 0, "n": 3, "dt": "float64", "sp": sparse, "v": True,
                            "nr": 2}, *b.arrays())
    out = wire.decode_update(h, frames, 2, np.dtype("float64"))
    assert out.versioned and out.sparse == sparse
    assert out.tags.tolist() == [5, 0, 6] and out.eov.tolist() == [True, False, False]
    assert out.rel_rows.tolist() == [0, 2] and out.rel_tags.tolist() == [9, 4]


def test_versioned_inc_and_rows_are_checked():
    rows = np.array([1], dtype=np.int64)
    base = {"t": Msg.INC, "s": 1, "tb": 0, "n": 1, "dt": "float64", "sp": False, "v": True}
    arrays = [rows, np.ones((1, 2)), np.array([1], np.int64), np.array([1], np.uint8), np.empty(0, np.int64),
              np.empty(0, np.int64)]
    for bad, match in [({"nr": -1}, "'nr' must be a count"), ({"nr": True}, "'nr' must be a count"), ({}, "'nr'")]:
        h, frames = _roundtrip({**base, **bad}, *arrays)
        with pytest.raises(ProtocolError, match=match):
            wire.decode_update(h, frames, 2, np.dtype("float64"))
    for i, arr, match in [(3, np.array([2], np.uint8), "end-of-version marks must be 0 or 1"),
                          (2, np.array([-1], np.int64), "versions must be >= 0"),
                          (2, np.array([1, 2], np.int64), "INC tags: frame has 16 bytes")]:
        a = list(arrays)
        a[i] = arr
        h, frames = _roundtrip({**base, "nr": 0}, *a)
        with pytest.raises(ProtocolError, match=match):
            wire.decode_update(h, frames, 2, np.dtype("float64"))
    with pytest.raises(ProtocolError, match="field 'v' must be bool"):
        wire.expected_frames(wire.decode_header(msgpack.packb({**base, "v": 1, "nr": 0})))
    h = wire.decode_header(msgpack.packb({"t": int(Msg.ROWS), "tb": 0, "n": 1, "c": 0, "a": 0, "rq": 1, "ss": 1,
                                          "dt": "float64", "v": True}))
    assert wire.expected_frames(h) == 3
    # a long per-table flag list fits in a header
    h = wire.decode_header(msgpack.packb({"t": int(Msg.WELCOME), "rq": 1, "rank": 0, "c": 0, "tf": [3] * 500}))
    assert len(h["tf"]) == 500


# ------------------------------------------------------------------------------------------------
# against real servers


TABLES = {
    "A": {"rows": 6, "cols": 2, "dtype": "float64"},  # add: read-my-writes
    "Q": {"rows": 6, "cols": 2, "dtype": "float64", "read_my_writes": False},  # add, but turned off in YAML
    "S": {"rows": 6, "cols": 2, "dtype": "float64", "update": "sgd", "update_args": {"lr": 0.5}},
    "V": {"rows": 6, "cols": 2, "dtype": "float64", "update": "adarevision"},
}


@pytest.mark.slow
def test_welcome_tells_each_table_its_capabilities(bosen_cluster):
    c = bosen_cluster(2, 1, staleness=3, tables=TABLES, read_timeout_s=60)
    client = Client.connect(c.path)
    try:
        got = {n: (client.table(n).read_my_writes, client.table(n).versioned, client.table(n).update) for n in TABLES}
        assert got == {"A": (True, False, "add"), "Q": (False, False, "add"), "S": (False, False, "sgd"),
                       "V": (False, True, "adarevision")}
        rows = np.arange(6)
        for n in TABLES:
            client.table(n).get_rows(rows)
        for n in TABLES:
            client.table(n).inc_rows(rows, np.ones((6, 2)))
        # only A shows its own write before the server has it
        assert client.table("A").get_row(0).tolist() == [1.0, 1.0]
        for n in ("Q", "S", "V"):
            assert client.table(n).get_row(0).tolist() == [0.0, 0.0]
        client.clock()
        client.clock()  # staleness 3: wait for the pushes explicitly
        assert wait_until(lambda: client.table("Q").get_row(0).tolist() == [1.0, 1.0])
        assert wait_until(lambda: client.table("S").get_row(0).tolist() == [-0.5, -0.5])
        assert wait_until(lambda: client._state("V").vlog.version[0] == 1)
        np.testing.assert_allclose(client.table("V").get_row(0), -0.1 / np.sqrt(2.0))
    finally:
        client.close()
    tabs = [s["tables"]["V"] for s in c.status(timeout=10)]
    assert [(t["versions_held"], t["snapshots"], t["release_errors"]) for t in tabs] == [(0, 0, 0)] * 2
    assert all(s["errors"] == 0 for s in c.status())


def adarev_steps(alpha, steps):
    """x, starting at 0 with z = z' = 1, after scalar AdaRevision steps (g, ḡ_old) in order."""
    x, z, zmax, gsum = 0.0, 1.0, 1.0, 0.0
    for g, gold in steps:
        g_bck = gsum - gold
        eta_old = alpha / np.sqrt(zmax)
        z = z + g * g + 2.0 * g * g_bck
        zmax = max(z, zmax)
        eta = alpha / np.sqrt(zmax)
        x = x - eta * g + (eta_old - eta) * g_bck
        gsum = gsum + g
    return x


@pytest.mark.parametrize("chunk", [None, 16])
@pytest.mark.slow
def test_buffered_updates_are_retired_when_a_newer_version_arrives(bosen_cluster, monkeypatch, chunk):
    """B is a clock ahead and buffers updates for rows it holds at version 1; A's clock then moves
    the servers' clock, and the push of version 2 reaches B before B flushes: B must send its
    version-1 updates at once, marked end-of-version (and release version 1 of the other rows).
    ``chunk``: one row per update message."""
    if chunk:
        monkeypatch.setattr("bosen.client.oplog.CHUNK_BYTES", chunk)
    c = bosen_cluster(2, 2, staleness=10, tables={"V": TABLES["V"]}, read_timeout_s=60)
    a, b = Client.connect(c.path, rank=0), Client.connect(c.path, rank=1)
    try:
        A, B = a.table("V"), b.table("V")
        va, vb = a._state("V").vlog, b._state("V").vlog
        rows = np.arange(6)
        A.get_rows(rows)
        B.get_rows(rows)
        A.inc_rows(rows, np.ones((6, 2)))
        a.clock()
        b.clock()  # clock 1: version 1 of every row goes to both
        assert wait_until(lambda: (vb.version == 1).all() and (va.version == 1).all())
        b.clock()  # b runs ahead (tick 2)
        b.server_status()  # (the clock's flush runs on the communication thread: let it finish first)
        B.inc_rows(rows[:3], np.full((3, 2), 2.0))  # buffered, tagged with version 1
        A.inc_rows(rows, np.ones((6, 2)))  # tagged 1 too; rows -> version 2 on arrival
        a.clock()  # servers' clock -> 2: version 2 is pushed to both while B still buffers
        assert wait_until(lambda: vb.retired_rows == 3)
        assert wait_until(lambda: (vb.version == 2).all() and (va.version == 2).all())
        b.server_status()  # B's retired updates and releases have been applied
        a.server_status()
        stats = c.status(timeout=10)
        # nobody holds version 1 any more (6 copies freed); B's retired updates changed rows 0-2
        # after version 2 went out, so version 2 of those is now a held copy (until clock 3's push)
        assert sum(s["tables"]["V"]["snapshots"] for s in stats) == 3
        assert sum(s["tables"]["V"]["snapshots_peak"] for s in stats) >= 6
        with b._state("V").lock:
            assert not b._state("V").oplog.dirty.any()
        a.clock()
        b.clock()  # clock 3: the rows B changed (version 3) reach both
        assert wait_until(lambda: (va.version[:3] == 3).all() and (va.version[3:] == 2).all())
        assert wait_until(lambda: (vb.version[:3] == 3).all())
        a.server_status()
        b.server_status()
        assert sum(s["tables"]["V"]["snapshots"] for s in c.status(timeout=10)) == 0
        # rows 0-2: A's g=1 (no delay), A's g=1 (no delay), then B's g=2 read at version 1 (ḡ_old = 1)
        want = adarev_steps(0.1, [(1.0, 0.0), (1.0, 1.0), (2.0, 1.0)])
        np.testing.assert_array_equal(A.get_rows(rows[:3]), np.full((3, 2), want))
        np.testing.assert_array_equal(A.get_rows(rows[3:]), np.full((3, 2), adarev_steps(0.1, [(1, 0), (1, 1)])))
    finally:
        a.close()
        b.close()
    for s in c.status(timeout=10):
        t = s["tables"]["V"]
        assert (t["snapshots"], t["versions_held"], t["release_errors"], s["errors"]) == (0, 0, 0, 0)
