"""A real server subprocess fed malformed and hostile messages by a raw ZeroMQ DEALER.

Every bad message gets an ERROR reply whose text names the problem and changes nothing; afterwards
a real Client sees exactly the valid updates, and ``bosen status`` still answers.
"""

from __future__ import annotations

import time

import msgpack
import numpy as np
import pytest
import zmq
from conftest import PY, run_cmd, wait_until, write_config
from rawpeer import Raw

from bosen import config as config_mod
from bosen import wire
from bosen.client import Client
from bosen.wire import Msg

TABLES = {
    "W": {"rows": 10, "cols": 4, "dtype": "int64"},
    "F": {"rows": 6, "cols": 3, "dtype": "float32"},
}


def i64(*x):
    return np.array(x, dtype=np.int64)


def inc_header(tb=0, n=1, dt="int64", sp=False):
    return {"t": Msg.INC, "tb": tb, "n": n, "dt": dt, "sp": sp}


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_hostile_messages_get_errors_and_change_nothing(bosen_cluster, tmp_path):
    c = bosen_cluster(2, workers=2, tables=TABLES, staleness=1)
    fp = config_mod.load(c.path).fingerprint()
    s0, s1 = c.addresses
    ctx = zmq.Context()
    socks = []
    try:
        r0 = Raw(ctx, s0)
        r1 = Raw(ctx, s1)
        other = Raw(ctx, s0)
        socks += [r0, r1, other]
        errors = {0: 0, 1: 0}

        def bad0(match, header, *arrays):
            errors[0] += 1
            return r0.bad(match, header, *arrays)

        def bad1(match, header, *arrays):
            errors[1] += 1
            return r1.bad(match, header, *arrays)

        def bad_frames0(match, frames):
            errors[0] += 1
            return r0.bad_frames(match, frames)

        # -- before joining: framing and header garbage ------------------------------------
        bad_frames0("not valid msgpack", [b"\xc1\xc1 garbage \xff"])
        bad_frames0("not valid msgpack", [b""])
        bad_frames0("not valid msgpack", [b"\x00" * 3, b"\x01" * 1000])
        bad_frames0("must be a map", [msgpack.packb([2, 1, 0])])
        bad_frames0("unknown message type 77", [msgpack.packb({"t": 77, "s": 1})])
        bad_frames0("exceeds", [msgpack.packb({"t": 4, "s": 1, "c": 0, "x": "y" * 10000})])
        bad_frames0("field 'c'", [msgpack.packb({"t": 4, "s": 1, "c": "later"})])
        bad_frames0("field 's'", [msgpack.packb({"t": 4, "c": 3})])
        bad0("not a message a server accepts", {"t": Msg.WELCOME, "rq": 1, "rank": 0, "c": 0})
        bad0("not a message a server accepts", {"t": Msg.ERROR, "rq": 1, "m": "x"})

        # header-only INC / wrong frame counts
        bad0("INC: expected 2 array frames, got 0", inc_header())
        bad0("INC: expected 4 array frames, got 2", inc_header(sp=True), i64(0), i64(1, 2, 3, 4))
        bad0("READ: expected 1 array frames, got 0", {"t": Msg.READ, "tb": 0, "n": 1, "c": 0})
        bad0("CLOCK: expected 0 array frames, got 1", {"t": Msg.CLOCK, "c": 1}, i64(1))

        # not joined yet
        bad0("has not joined", inc_header(), i64(0), i64(1, 2, 3, 4))
        bad0("has not joined", {"t": Msg.CLOCK, "c": 1})
        bad0("has not joined", {"t": Msg.READ, "tb": 0, "n": 1, "c": 0}, i64(0))
        bad0("has not joined", {"t": Msg.BYE})

        # bad HELLOs
        bad0("fingerprint", {"t": Msg.HELLO, "rank": 1, "fp": "0123456789abcdef"})
        bad0("rank 5 out of range", {"t": Msg.HELLO, "rank": 5, "fp": fp})
        bad0("rank -3 out of range", {"t": Msg.HELLO, "rank": -3, "fp": fp})
        bad1("only server 0 assigns ranks", {"t": Msg.HELLO, "rank": -1, "fp": fp})

        # -- join as rank 1 on both servers --------------------------------------------------
        for r in (r0, r1):
            s = r.send({"t": Msg.HELLO, "rank": 1, "fp": fp})
            h, _ = r.recv()
            assert h["t"] == Msg.WELCOME and h["rank"] == 1 and h["rq"] == s and h["c"] == 0, h
        bad0("already joined", {"t": Msg.HELLO, "rank": 1, "fp": fp})
        errors[0] += 1
        other.bad("worker rank 1 already joined", {"t": Msg.HELLO, "rank": 1, "fp": fp})

        # -- joined: bad updates -----------------------------------------------------------
        bad0("unknown table index 7", inc_header(tb=7), i64(0), i64(1, 2, 3, 4))
        bad0("unknown table index -1", inc_header(tb=-1), i64(0), i64(1, 2, 3, 4))
        bad0("row 10 out of range", inc_header(), i64(10), i64(1, 2, 3, 4))
        bad0("row -2 out of range", inc_header(), i64(-2), i64(1, 2, 3, 4))
        bad0("row 3 of table 'W' belongs to server 1, not 0", inc_header(n=2), i64(0, 3), i64(*range(8)))
        bad1("row 4 of table 'W' belongs to server 0, not 1", inc_header(), i64(4), i64(1, 2, 3, 4))
        bad0("dtype float32 does not match the table's int64", inc_header(dt="float32"), i64(0),
             np.ones(4, np.float32))
        bad0("dtype int64 does not match the table's float32", inc_header(tb=1, dt="int64"), i64(0),
             i64(1, 2, 3))
        bad0("unknown dtype 'complex64'", inc_header(dt="complex64"), i64(0), np.ones(4, np.complex64))
        bad0("INC values: frame has 24 bytes, expected 4 x int64", inc_header(), i64(0), i64(1, 2, 3))
        bad0("INC values: frame has 64 bytes, expected 4 x int64", inc_header(), i64(0), i64(*range(8)))
        bad0("INC rows: frame has 16 bytes, expected 1 x int64", inc_header(), i64(0, 2), i64(1, 2, 3, 4))
        bad0("INC: field 'na' must be bool, got 1", {**inc_header(), "na": 1}, i64(0), i64(1, 2, 3, 4))
        bad0("non-finite", inc_header(tb=1, dt="float32"), i64(0), np.array([1, np.nan, 2], np.float32))
        bad1("non-finite", inc_header(tb=1, dt="float32"), i64(1), np.array([np.inf, 0, 0], np.float32))
        bad0("non-finite", inc_header(tb=1, dt="float16"), i64(2), np.array([0, 0, -np.inf], np.float16))
        bad0("column index out of range", inc_header(sp=True), i64(0), i64(0, 2),
             np.array([0, 4], np.int32), i64(1, 1))
        bad0("indptr", inc_header(sp=True), i64(0), i64(1, 2), np.array([0, 1], np.int32), i64(1, 1))
        bad0("negative row count", {"t": Msg.READ, "tb": 0, "n": -1, "c": 0}, np.zeros(0, np.int64))
        bad0("READ: row 99 out of range", {"t": Msg.READ, "tb": 0, "n": 1, "c": 0}, i64(99))
        bad0("READ: row 1 of table 'W' belongs to server 1", {"t": Msg.READ, "tb": 0, "n": 1, "c": 0}, i64(1))
        bad0("unknown table index 2", {"t": Msg.READ, "tb": 2, "n": 1, "c": 0}, i64(0))
        bad0("PUSH_ACK: push 5 was never sent", {"t": Msg.PUSH_ACK, "ps": 5})

        # -- valid updates (each acknowledged) -------------------------------------------
        s = r0.send(inc_header(n=2), i64(0, 2), i64(1, 2, 3, 4, 10, 20, 30, 40))
        h, _ = r0.recv()
        assert h["t"] == Msg.ACK and h["rq"] == s, h
        # sparse, with a duplicate (row, col) pair that must add up
        s = r1.send(inc_header(n=2, sp=True), i64(1, 3), i64(0, 3, 4), np.array([0, 0, 3, 1], np.int32),
                    i64(5, 6, 7, 8))
        h, _ = r1.recv()
        assert h["t"] == Msg.ACK and h["rq"] == s, h
        s = r1.send(inc_header(tb=1, dt="float16"), i64(1), np.array([0.5, -1.5, 2], np.float16))
        h, _ = r1.recv()
        assert h["t"] == Msg.ACK and h["rq"] == s, h
        # "na": applied without an ACK of its own; the next ACK (cumulative) covers it
        r0.send({**inc_header(), "na": True}, i64(6), i64(100, 0, 0, 0))
        assert r0.silent(), "an INC with na gets no ACK"
        s = r0.send({**inc_header(), "na": False}, i64(8), i64(0, 100, 0, 0))
        h, _ = r0.recv()
        assert h["t"] == Msg.ACK and h["rq"] == s, h

        # -- clocks and sequence numbers ---------------------------------------------------
        r0.send({"t": Msg.CLOCK, "c": 3})
        assert r0.silent(), "a valid CLOCK gets no reply"
        bad0("CLOCK: clock 1 goes back from 3", {"t": Msg.CLOCK, "c": 1})
        bad0("CLOCK: clock -1 goes back from 3", {"t": Msg.CLOCK, "c": -1})
        s = r0.send({"t": Msg.CLOCK, "c": 3})  # same clock again is fine
        assert r0.silent()
        # the last INC of an end-of-tick flush may carry the sender's clock; it is checked first
        bad0("INC: field 'c' must be int", {**inc_header(), "c": "4"}, i64(0), i64(*[1000] * 4))
        bad0("INC: clock 2 goes back from 3", {**inc_header(), "c": 2}, i64(0), i64(*[1000] * 4))
        s = r0.send({**inc_header(), "c": 4}, i64(4), i64(1, 1, 1, 1))
        h, _ = r0.recv()
        assert h["t"] == Msg.ACK and h["rq"] == s, h  # rank 1 holds the server clock back: no SCLOCK
        assert r0.silent()
        # FLUSH: several tables' updates and the clock in one message; every part and the clock are
        # checked before anything is applied
        w4, f0 = [0, 1, "int64", False, False], [1, 1, "float32", False, False]  # row 2 of W, row 0 of F
        f32 = np.array([1, 2, 3], np.float32)
        bad0("FLUSH: field 'u' must list 1 to 256 parts, got 0", {"t": Msg.FLUSH, "u": []})
        errors[0] += 1
        r0.send({"t": Msg.FLUSH, "u": 3})
        r0.expect_error("FLUSH: field 'u' must be list", rq=-1)  # a header check: before its number is read
        bad0("FLUSH: part 1 must be [table, count, dtype, sparse, weights]", {"t": Msg.FLUSH, "u": [w4, [1, 1]]})
        bad0("FLUSH: expected 4 array frames, got 3", {"t": Msg.FLUSH, "u": [w4, f0]}, i64(2), i64(4), i64(1, 2))
        bad0("belongs to server 1, not 0", {"t": Msg.FLUSH, "u": [w4, f0]}, i64(2), i64(*[1] * 4), i64(1), f32)
        bad0("unknown table index 5", {"t": Msg.FLUSH, "u": [w4, [5, 1, "int64", False, False]]},
             i64(2), i64(*[1] * 4), i64(0), i64(1, 2, 3))
        bad0("FLUSH: clock 3 goes back from 4", {"t": Msg.FLUSH, "u": [w4, f0], "c": 3},
             i64(2), i64(*[1] * 4), i64(0), f32)
        bad0("FLUSH: a read set ('rs') or checkpoint word ('ck') needs a clock ('c')",
             {"t": Msg.FLUSH, "u": [w4], "rs": [[0, 1]]}, i64(2), i64(*[1] * 4), i64(0))
        bad0("FLUSH: read set names table 7", {"t": Msg.FLUSH, "u": [w4], "c": 5, "rs": [[7, 1]]},
             i64(2), i64(*[1] * 4), i64(0))
        bad0("INC: non-finite value", {"t": Msg.FLUSH, "u": [w4, f0], "c": 5},
             i64(2), i64(*[1] * 4), i64(0), np.array([1, np.nan, 3], np.float32))
        s = r0.send({"t": Msg.FLUSH, "u": [w4, f0], "c": 5}, i64(2), i64(*[1] * 4), i64(0), f32)
        h, _ = r0.recv()
        assert h["t"] == Msg.ACK and h["rq"] == s, h  # one acknowledgement for the whole message
        r0.send({"t": Msg.FLUSH, "u": [w4], "na": True}, i64(2), i64(*[2] * 4))
        assert r0.silent(), "a FLUSH with na gets no ACK"
        # a replayed sequence number is rejected, whatever the message
        replay = r0.seq
        errors[0] += 1
        r0.send(inc_header(n=2), i64(0, 2), i64(*[1000] * 8), seq=replay)
        r0.expect_error(f"sequence number {replay} not above {replay}", rq=replay)
        errors[0] += 1
        r0.send({"t": Msg.CLOCK, "c": 4}, seq=replay - 5)
        r0.expect_error(f"sequence number {replay - 5} not above", rq=replay - 5)
        errors[0] += 1
        r0.send({"t": Msg.CLOCK, "c": 4}, seq=-7)
        r0.expect_error("sequence number -7 not above", rq=-7)

        # leave cleanly so the real client below is not held back by this fake rank
        for r in (r0, r1):
            s = r.send({"t": Msg.BYE})
            h, _ = r.recv()
            assert h["t"] == Msg.BYE_OK and h["rq"] == s, h
        bad0("has not joined (send HELLO first) or has left", {"t": Msg.CLOCK, "c": 9})
        errors[0] += 1
        other.bad("worker rank 1 left the job", {"t": Msg.HELLO, "rank": 1, "fp": fp})
    finally:
        for r in socks:
            r.close()
        ctx.term()

    c.check()  # both servers still running
    stats = c.status()
    assert stats[0]["errors"] == errors[0], (stats[0]["errors"], errors[0])
    assert stats[1]["errors"] == errors[1], (stats[1]["errors"], errors[1])
    assert stats[0]["client_clocks"][1] == "left"
    log0 = c.servers[0].output()
    assert "rejected message" in log0 and "fingerprint" in log0

    # -- a real client sees exactly the valid updates, and the job works ----------------------
    client = Client.connect(c.path)
    try:
        assert client.rank == 0
        W = client.table("W")
        F = client.table("F")
        want_w = np.zeros((10, 4), np.int64)
        want_w[0] = [1, 2, 3, 4]
        want_w[2] = [10, 20, 30, 40]
        want_w[1, 0] = 5 + 6
        want_w[1, 3] = 7
        want_w[3, 1] = 8
        want_w[4] = 1  # the INC that carried a clock
        want_w[6, 0] = want_w[8, 1] = 100  # the INC with "na" and the one whose ACK covered it
        want_w[2] += 1 + 2  # the two valid FLUSH messages (and none of the bad ones)
        want_f = np.zeros((6, 3), np.float32)
        want_f[0] = [1, 2, 3]
        want_f[1] = [0.5, -1.5, 2]
        np.testing.assert_array_equal(W.get_rows(np.arange(10)), want_w)
        np.testing.assert_array_equal(F.get_rows(np.arange(6)), want_f)
        for tick in range(3):
            W.inc_rows(np.arange(10), np.full((10, 4), tick + 1, np.int64))
            F.inc(5, 2, 0.25)
            client.clock()
            want_w += tick + 1
            want_f[5, 2] += 0.25
            np.testing.assert_array_equal(W.get_rows(np.arange(10)), want_w)
            assert W.get(3, 1) == want_w[3, 1]
            np.testing.assert_array_equal(F.get_row(5), want_f[5])
        client.clock()
        client.clock()
        # at tick 5 with staleness 1 the rows are server values of clock >= 4: no local help
        np.testing.assert_array_equal(W.get_rows(np.arange(10)), want_w)
        assert client.stats()["server_errors"] == 0
        deadline = time.monotonic() + 10  # the server clock messages follow the pushed rows
        while min(client.stats()["server_clocks"]) < 4:
            assert time.monotonic() < deadline, client.stats()["server_clocks"]
            time.sleep(0.02)
    finally:
        client.close()
    c.check()

    r = run_cmd([PY, "-m", "bosen", "status", c.path], timeout=30)
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stdout.splitlines() if x.strip()]
    assert len(lines) == 3, r.stdout
    assert s0 in lines[1] and s1 in lines[2]


@pytest.mark.timeout(60)
def test_server_refuses_a_broken_config(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("cluster: {servers: [127.0.0.1:1\n  workers: : 2\n")
    r = run_cmd([PY, "-m", "bosen.server", "--config", p, "--rank", "0"], timeout=30)
    assert r.returncode == 2
    assert str(p) in r.stderr and "YAML" in r.stderr
    assert "Traceback" not in r.stderr

    p2 = write_config(tmp_path / "badkey.yaml", {"cluster": {"servers": ["127.0.0.1:1"], "wrokers": 2},
                                                "tables": {"W": {"rows": 1, "cols": 1}}})
    r = run_cmd([PY, "-m", "bosen.server", "--config", p2, "--rank", "0"], timeout=30)
    assert r.returncode == 2
    assert str(p2) in r.stderr and "cluster.wrokers" in r.stderr

    r = run_cmd([PY, "-m", "bosen.server", "--config", tmp_path / "missing.yaml", "--rank", "0"], timeout=30)
    assert r.returncode == 2 and "missing.yaml" in r.stderr


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_server_refuses_bad_rank_and_busy_port(tmp_path, bosen_cluster):
    c = bosen_cluster(1, workers=1)
    r = run_cmd([PY, "-m", "bosen.server", "--config", c.path, "--rank", "3"], timeout=30)
    assert r.returncode == 2 and "--rank 3" in r.stderr and str(c.path) in r.stderr
    # the address of rank 0 is taken by the running server
    r = run_cmd([PY, "-m", "bosen.server", "--config", c.path, "--rank", "0"], timeout=30)
    assert r.returncode == 1 and c.addresses[0].rpartition(":")[2] in r.stderr
    assert "Traceback" not in r.stderr
    c.check()


def _join_pair(ctx, address, fp):
    a, b = Raw(ctx, address), Raw(ctx, address)
    for rank, r in enumerate((a, b)):
        r.send({"t": Msg.HELLO, "rank": rank, "fp": fp})
        h, _ = r.recv()
        assert h["t"] == Msg.WELCOME and h["rank"] == rank, h
    return a, b


def _budgeted_push(a: Raw, b: Raw) -> dict:
    """``a`` subscribes to row 0, ``b`` changes it; return the early (budgeted) push ``a`` gets."""
    s = a.send({"t": Msg.READ, "tb": 0, "n": 1, "c": 0}, i64(0))
    h, frames = a.recv()
    assert h["t"] == Msg.ROWS and h["rq"] == s and "ps" not in h, h
    s = b.send(inc_header(), i64(0), i64(1, 2, 3, 4))
    h, _ = b.recv()
    assert h["t"] == Msg.ACK and h["rq"] == s, h
    h, frames = a.recv(timeout=10)  # the server's push loop sends it within a few ms
    assert h["t"] == Msg.ROWS and h["rq"] == -1 and isinstance(h.get("ps"), int) and h["ps"] >= 1, h
    assert h["c"] == 0  # server clock has not moved: this push is early
    np.testing.assert_array_equal(np.frombuffer(frames[1], np.int64), [1, 2, 3, 4])
    return h


@pytest.mark.timeout(60)
def test_budgeted_push_is_acknowledged(bosen_cluster):
    c = bosen_cluster(1, workers=2, comm={"enabled": True}, tables={"W": {"rows": 4, "cols": 4, "dtype": "int64"}})
    ctx = zmq.Context()
    a = b = None
    try:
        a, b = _join_pair(ctx, c.addresses[0], config_mod.load(c.path).fingerprint())
        h = _budgeted_push(a, b)
        a.send({"t": Msg.PUSH_ACK, "ps": h["ps"]})
        assert a.silent(), "a valid PUSH_ACK gets no reply"
        a.bad(f"PUSH_ACK: push {h['ps'] + 1} was never sent", {"t": Msg.PUSH_ACK, "ps": h["ps"] + 1})
        a.bad("PUSH_ACK: push 0 was never sent", {"t": Msg.PUSH_ACK, "ps": 0})
        st = c.status()[0]
        assert st["budgeted_pushes"] >= 1 and st["rows_pushed_budgeted"] >= 1
        assert st["errors"] == 2
    finally:
        for r in (a, b):
            if r is not None:
                r.close()
        ctx.term()
    c.check()


@pytest.mark.timeout(60)
def test_push_ack_after_bye_is_rejected(bosen_cluster):
    """Once a client has left, nothing more is accepted from it, acks included. (A real client stops
    acknowledging pushes when it starts leaving; tests/client/test_ssp.py checks that no server
    ever rejects anything from real clients.)"""
    c = bosen_cluster(1, workers=2, comm={"enabled": True}, tables={"W": {"rows": 4, "cols": 4, "dtype": "int64"}})
    ctx = zmq.Context()
    a = b = None
    try:
        a, b = _join_pair(ctx, c.addresses[0], config_mod.load(c.path).fingerprint())
        h = _budgeted_push(a, b)
        s = a.send({"t": Msg.BYE})
        bye, _ = a.recv()
        assert bye["t"] == Msg.BYE_OK and bye["rq"] == s
        a.bad("PUSH_ACK: sender has not joined (send HELLO first) or has left", {"t": Msg.PUSH_ACK, "ps": h["ps"]})
        assert c.status()[0]["errors"] == 1
    finally:
        for r in (a, b):
            if r is not None:
                r.close()
        ctx.term()
    c.check()


@pytest.mark.timeout(60)
def test_clock_out_of_int64_range_is_a_protocol_error(bosen_cluster):
    c = bosen_cluster(1, workers=1)
    fp = config_mod.load(c.path).fingerprint()
    ctx = zmq.Context()
    r = Raw(ctx, c.addresses[0])
    try:
        r.send({"t": Msg.HELLO, "rank": 0, "fp": fp})
        assert r.recv()[0]["t"] == Msg.WELCOME
        for bad in (2**64 - 1, 2**63, 2**63 - 1):
            m = r.bad("CLOCK", {"t": Msg.CLOCK, "c": bad})
            assert "internal" not in m, m
        assert c.status()[0]["client_clocks"] == [0]
        assert "Traceback" not in c.servers[0].output()
    finally:
        r.close()
        ctx.term()


def test_a_gradient_ahead_of_a_synchronous_table_is_refused_and_nothing_is_held(bosen_cluster):
    """A table with backup (synchronous): a worker computes on the iteration it read, so a gradient of a
    later one from a server that was not restored (no resend) is a buggy or hostile worker's: its CLOCK
    gets an ERROR naming it and is not held (before, every such gradient was kept until the table got
    there, without a bound); the rank's clock stays, and its correct gradient then steps the table."""
    c = bosen_cluster(1, workers=1, tables={"G": {"rows": 2, "cols": 3, "dtype": "float64",
                                                  "backup": {"mode": "static", "k": 1, "lr": 1.0}}})
    fp = config_mod.load(c.path).fingerprint()
    ctx = zmq.Context()
    r = Raw(ctx, c.addresses[0])
    try:
        r.send({"t": Msg.HELLO, "rank": 0, "fp": fp})
        assert r.recv()[0]["t"] == Msg.WELCOME
        grad = np.ones((2, 3), dtype=np.float64)
        for clock in (5, 1000):  # its gradient of iteration 4, of 999: the table is at 0
            r.send(inc_header(n=2, dt="float64"), i64(0, 1), grad)
            assert r.recv()[0]["t"] == Msg.ACK
            r.bad(f"gradient of iteration {clock - 1} is ahead of table 'G' (iteration 0)",
                  {"t": Msg.CLOCK, "c": clock})
        st = c.status()[0]
        b = st["tables"]["G"]["backup"]
        assert st["client_clocks"] == [0] and b["held_ahead"] == 0 and b["iteration"] == 0, b
        r.send(inc_header(n=2, dt="float64"), i64(0, 1), grad)
        r.send({"t": Msg.CLOCK, "c": 1})  # its gradient of iteration 0: accepted, the table steps
        assert wait_until(lambda: c.status()[0]["tables"]["G"]["backup"]["iteration"] == 1, timeout=30)
        assert c.status()[0]["tables"]["G"]["backup"]["accepted"] == 1
        assert "Traceback" not in c.servers[0].output()
    finally:
        r.close()
        ctx.term()


@pytest.mark.timeout(60)
def test_read_connections_are_checked_and_answer_reads_only(bosen_cluster):
    """A read connection (a worker thread's own socket) must name a joined rank; it may send READ and
    nothing else; its ROWS carry the client's message number ``ss``, shared with its main
    connection; once the client leaves, the read connection is refused too."""
    c = bosen_cluster(1, workers=2, tables={"W": {"rows": 4, "cols": 4, "dtype": "int64"}})
    fp = config_mod.load(c.path).fingerprint()
    ctx = zmq.Context()
    main, rd, rd2 = (Raw(ctx, c.addresses[0]) for _ in range(3))
    try:
        rd.bad("HELLO: read connection for worker rank 0, which has not joined",
               {"t": Msg.HELLO, "rank": 0, "fp": fp, "rd": True})
        rd.bad("field 'rd' must be bool", {"t": Msg.HELLO, "rank": 0, "fp": fp, "rd": 1})
        main.send({"t": Msg.HELLO, "rank": 0, "fp": fp})
        assert main.recv()[0]["t"] == Msg.WELCOME
        rd.send({"t": Msg.HELLO, "rank": 0, "fp": fp, "rd": True})
        h, _ = rd.recv()
        assert h["t"] == Msg.WELCOME and h["rank"] == 0, h
        rd.bad("HELLO: this connection has already joined", {"t": Msg.HELLO, "rank": 0, "fp": fp})
        rd.bad("INC: a read connection sends READ only", inc_header(), i64(0), i64(1, 2, 3, 4))
        rd.bad("CLOCK: a read connection sends READ only", {"t": Msg.CLOCK, "c": 1})
        s = main.send({"t": Msg.READ, "tb": 0, "n": 1, "c": 0}, i64(1))
        h, _ = main.recv()
        assert h["t"] == Msg.ROWS and h["rq"] == s and h["ss"] == 1, h
        s = rd.send({"t": Msg.READ, "tb": 0, "n": 2, "c": 0}, i64(0, 2))
        h, frames = rd.recv()
        assert h["t"] == Msg.ROWS and h["rq"] == s and h["ss"] == 2 and h["n"] == 2, h
        assert main.silent(), "the answer goes to the read connection only"
        rd.send({"t": Msg.READ, "tb": 0, "n": 1, "c": 0}, i64(0), seq=1)
        rd.expect_error("READ: sequence number 1 not above", rq=1)
        s = main.send({"t": Msg.BYE})
        assert main.recv()[0]["t"] == Msg.BYE_OK
        rd.bad("READ: sender has not joined", {"t": Msg.READ, "tb": 0, "n": 1, "c": 0}, i64(0))
        rd2.bad("HELLO: read connection for worker rank 0, which has not joined (or has left)",
                {"t": Msg.HELLO, "rank": 0, "fp": fp, "rd": True})
    finally:
        for r in (main, rd, rd2):
            r.close()
        ctx.term()
    c.check()


@pytest.mark.timeout(60)
def test_joining_servers_and_scaling_messages_are_checked(bosen_cluster):
    """``--join`` and the messages that add or retire servers: bad ones are refused with a reason, and
    the server goes on serving."""
    c = bosen_cluster(2, workers=1)
    r = run_cmd([PY, "-m", "bosen.server", "--config", c.path, "--join", c.addresses[1]], timeout=30)
    assert r.returncode == 2 and "the job already has a server there" in r.stderr, r.stderr
    r = run_cmd([PY, "-m", "bosen.server", "--config", c.path, "--rank", "0", "--join", "127.0.0.1:1"], timeout=30)
    assert r.returncode == 2 and "one of them" in r.stderr, r.stderr
    fp = config_mod.load(c.path).fingerprint()
    ctx = zmq.Context()
    raw = Raw(ctx, c.addresses[1])
    try:
        m = raw.bad("HELLO", {"t": Msg.HELLO, "rank": 0, "fp": fp, "jc": 3})
        assert "only for a server added to a running job" in m, m
        m = raw.bad("HELLO", {"t": Msg.HELLO, "rank": 0, "fp": fp, "jc": "x"})
        assert "'jc' must be int" in m, m
        owner = {"owner": np.zeros(c.status()[0]["partitions"]["count"], np.int32)}
        for sv, why in ((["10.0.0.1:1"], "does not extend or shorten"), ("x", "must list the servers")):
            frames = wire.encode_arrays({"t": Msg.MOVE, "s": 7, "op": "map", "mv": 1, "sv": sv}, owner)
            raw.send_frames(frames)
            h, _ = raw.recv()
            assert h["t"] == Msg.ERROR and why in h["m"], h
        raw.send_frames(wire.encode_arrays({"t": Msg.MOVE, "s": 8, "op": "retire", "mv": 1}, {}))
        assert "still owns" in raw.expect_error("MOVE retire", rq=8)
        assert [s["partitions"]["version"] for s in c.status()] == [0, 0]
        assert all(s["servers"] == c.addresses for s in c.status())
    finally:
        raw.close()
        ctx.term()
    c.check()
