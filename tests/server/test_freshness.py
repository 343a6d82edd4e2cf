"""Freshness probes (metrics.freshness_every): a read's missing updates, counted by the servers.

Real servers on loopback. A reader's probe must report exactly the inc operations of other clients
the servers applied after the value it read, however many messages carried them, and the age of
the value read; with the knob off ROWS and INC are as before (no count, time or weight); a
malformed PROBE gets an ERROR and the server keeps serving.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq
from conftest import wait_until
from rawpeer import Raw

from bosen import config as config_mod
from bosen import wire
from bosen.client import Client
from bosen.jobs.job import job_config
from bosen.wire import Msg

TABLES = {"W": {"rows": 10, "cols": 4, "dtype": "int64"}}


def i64(*x):
    return np.array(x, dtype=np.int64)


def job(workers: int, every: int, comm: dict | None = None) -> dict:
    cfg = job_config([], workers, tables=TABLES, staleness=10, comm=comm)
    if every:
        cfg["metrics"] = {"freshness_every": every}
    return cfg


def answered(c: Client, n: int) -> bool:
    return c.stats()["freshness_probes_answered"] >= n


@pytest.mark.timeout(60)
def test_probe_counts_other_clients_updates_missed(bosen_cluster):
    c = bosen_cluster(2, config=job(2, 1))
    a = Client.connect(c.path, rank=0)
    b = Client.connect(c.path, rank=1)
    try:
        wa, wb = a.table("W"), b.table("W")
        assert wa.get_rows(i64(2, 3)).sum() == 0  # rows on both servers: two probes, nothing missed
        assert wait_until(lambda: answered(a, 2))
        s = a.stats()
        assert (s["freshness_probed_rows"], s["missing_updates_sum"]) == (2, 0)
        wa.inc_row(3, i64(1, 0, 0, 0))  # its own update: never missing
        for _ in range(5):  # five update messages of another client, one per tick (no push to a:
            wb.inc_row(3, i64(0, 1, 0, 0))  # a holds the server clock at 0)
            wb.inc_row(2, i64(0, 0, 1, 0))
            b.clock()
            b.server_status()  # answered once the tick's flush was applied (ticks in a row share one)
        a._comm.call(a._comm.sender.until_flushed(10), 15)
        row = wa.get_row(3)  # cached, fresh enough under staleness 10: misses b's five
        assert row.tolist() == [1, 0, 0, 0]
        assert wait_until(lambda: answered(a, 3))
        s = a.stats()
        assert (s["freshness_probed_rows"], s["missing_updates_sum"], s["missing_updates_max"]) == (3, 5, 5)
        wa.get_rows(i64(2, 3))
        assert wait_until(lambda: answered(a, 5))
        s = a.stats()
        assert (s["freshness_probed_rows"], s["missing_updates_sum"]) == (5, 15)
        a.clock()  # the servers reach clock 1: rows 2 and 3 are pushed to a with their counts
        assert wait_until(lambda: a.stats()["rows_pushed_to_us"] >= 2)
        assert wa.get_rows(i64(2, 3)).tolist() == [[0, 0, 5, 0], [1, 5, 0, 0]]
        assert wait_until(lambda: answered(a, 7))
        s = a.stats()
        assert (s["freshness_probed_rows"], s["missing_updates_sum"]) == (7, 15)  # nothing more missed
        rec = a.report()
        assert rec["freshness_probed_rows"] == 7 and rec["missing_updates_sum"] == 15
    finally:
        b.close()
        a.close()


def _probe_after(a: Client, b: Client, incs) -> dict:
    """``a`` caches rows 2 and 3 (probed), ``b`` makes its increments (``incs(table)``, within one
    tick) and has them applied, then ``a`` reads the cached rows again (probed): its stats."""
    wa, wb = a.table("W"), b.table("W")
    wa.get_rows(i64(2, 3))
    assert wait_until(lambda: answered(a, 2))
    incs(wb)
    b._comm.call(b._comm.sender.until_flushed(10), 15)
    b.server_status()  # answered once what b sent before it was applied
    assert wa.get_rows(i64(2, 3)).sum() == 0  # cached: misses every one of b's increments
    assert wait_until(lambda: answered(a, 4))
    return a.stats()


@pytest.mark.timeout(60)
def test_inc_operations_coalesced_in_one_flush_count_each(bosen_cluster):
    c = bosen_cluster(2, config=job(2, 1))
    a = Client.connect(c.path, rank=0)
    b = Client.connect(c.path, rank=1)
    try:
        def incs(wb):
            for _ in range(7):  # seven inc calls to row 3, two to row 2: one row each in one INC
                wb.inc_row(3, i64(0, 1, 0, 0))
            wb.inc_rows(i64(2, 3), np.ones((2, 4), np.int64))  # one more operation on each row
            wb.inc(2, 1, 1)
            b.clock()

        s = _probe_after(a, b, incs)
        assert b.stats()["rows_sent"] == 2  # one message per server, one row each
        assert (s["freshness_probed_rows"], s["missing_updates_sum"], s["missing_updates_max"]) == (4, 10, 8)
    finally:
        b.close()
        a.close()


@pytest.mark.timeout(60)
def test_probe_reports_the_content_age(bosen_cluster):
    c = bosen_cluster(1, config=job(1, 1))
    a = Client.connect(c.path, rank=0)
    try:
        wa = a.table("W")
        wa.get_row(4)  # fetched from the server: a fresh value
        assert wait_until(lambda: answered(a, 1))
        first = a.stats()["content_age_sum"]
        assert 0 <= first < 2
        time.sleep(0.3)
        wa.get_row(4)  # the cached value, 0.3 s older
        assert wait_until(lambda: answered(a, 2))
        age = a.stats()["content_age_sum"] - first
        assert 0.3 <= age < 5, age
        assert a.report()["content_age_sum"] == first + age
        cache = a._tables[0].cache
        a.clock()  # SCLOCK raises the row's clock, nothing pushed: the same content, as old as it was
        assert wait_until(lambda: cache.fresh_clock(i64(4))[0] >= 1)
        wa.get_row(4)
        assert wait_until(lambda: answered(a, 3))
        assert a.stats()["content_age_sum"] - first - age >= age  # older still, not reset
    finally:
        a.close()


@pytest.mark.timeout(60)
def test_inc_operations_sent_in_several_budgeted_messages_count_once(bosen_cluster):
    # the reader is a raw connection (rank 0) that never takes a value in: a probe of a value that
    # includes nothing of b's (counts 0) misses every inc operation of b's the server applied
    comm = {"client_bandwidth_mbps": 1000, "client_send_rows": 1}
    c = bosen_cluster(1, config=job(2, 1, comm=comm))
    ctx = zmq.Context()
    r = _join(c, ctx)
    b = Client.connect(c.path, rank=1)
    try:
        wb = b.table("W")
        for k in range(5):  # each message goes out (budgeted) before the next inc call
            before = b.stats()["rows_sent_budgeted"]
            wb.inc_row(3, i64(0, 1, 0, 0))
            if k % 2:
                wb.inc_row(3, i64(0, 0, 1, 0))  # two calls in one message
            assert wait_until(lambda before=before: b.stats()["rows_sent_budgeted"] > before)
        b.server_status()  # answered once what b sent before it was applied
        assert b.stats()["update_batches"] == 5  # five messages, seven inc operations
        s = r.send({"t": Msg.PROBE, "tb": 0, "n": 1}, i64(3), i64(0))
        while True:  # pushes and pings come too
            h, _ = r.recv()
            if h["t"] == Msg.PROBE_REPLY:
                break
        assert h["rq"] == s and (h["n"], h["ms"], h["mx"]) == (1, 7, 7), h
    finally:
        b.close()
        ctx.destroy(0)


def _join(c, ctx) -> Raw:
    r = Raw(ctx, c.addresses[0])
    r.send({"t": Msg.HELLO, "rank": 0, "fp": config_mod.load(c.path).fingerprint()})
    assert r.recv()[0]["t"] == Msg.WELCOME
    return r


@pytest.mark.timeout(60)
@pytest.mark.parametrize("every", [0, 4])
def test_rows_carry_counts_only_when_on(bosen_cluster, every):
    c = bosen_cluster(1, config=job(1, every))
    ctx = zmq.Context()
    try:
        r = _join(c, ctx)
        r.send({"t": Msg.INC, "tb": 0, "n": 2, "dt": "int64", "sp": False}, i64(1, 1), np.ones(8, np.int64))
        assert r.recv()[0]["t"] == Msg.ACK
        s = r.send({"t": Msg.READ, "tb": 0, "n": 2, "c": 0}, i64(1, 2))
        h, frames = r.recv()
        assert h["t"] == Msg.ROWS and h["rq"] == s
        if not every:
            assert "fr" not in h and "ft" not in h and len(frames) == 2  # the wire as before
        else:
            assert h["fr"] is True and len(frames) == 3
            assert abs(h["ft"] - time.time()) < 5  # the server's send time
            assert wire.others_frame(h, frames).tolist() == [0, 0]  # its own updates only
    finally:
        ctx.destroy(0)


@pytest.mark.timeout(60)
def test_malformed_probe_gets_error_and_server_keeps_serving(bosen_cluster):
    c = bosen_cluster(1, config=job(1, 2))
    ctx = zmq.Context()
    try:
        r = _join(c, ctx)

        def bad(match, header, *arrays):
            s = r.send({"t": Msg.PROBE, **header}, *arrays)
            h, _ = r.recv()
            assert h["t"] == Msg.ERROR and h["rq"] == s and match in h["m"], h

        bad("expected 2 array frames", {"tb": 0, "n": 1}, i64(1))
        bad("row 99 out of range", {"tb": 0, "n": 1}, i64(99), i64(0))
        bad("unknown table index 3", {"tb": 3, "n": 1}, i64(1), i64(0))
        bad("PROBE counts: frame has 8 bytes", {"tb": 0, "n": 2}, i64(1, 2), i64(0))
        bad("negative row count", {"tb": 0, "n": -1}, i64(), i64())
        bad("must be >= 0", {"tb": 0, "n": 1}, i64(1), i64(-4))
        s = r.send({"t": Msg.PROBE, "tb": 0, "n": 2}, i64(1, 2), i64(0, 0))
        h, _ = r.recv()
        assert h["t"] == Msg.PROBE_REPLY and h["rq"] == s and (h["n"], h["ms"], h["mx"]) == (2, 0, 0), h
    finally:
        ctx.destroy(0)
    off = bosen_cluster(1, config=job(1, 0))
    ctx = zmq.Context()
    try:
        r = _join(off, ctx)
        s = r.send({"t": Msg.PROBE, "tb": 0, "n": 1}, i64(1), i64(0))
        h, _ = r.recv()
        assert h["t"] == Msg.ERROR and "freshness probes are off" in h["m"]
    finally:
        ctx.destroy(0)


@pytest.mark.timeout(60)
def test_probes_reach_every_table_a_worker_reads_in_turn(bosen_cluster):
    """A worker that reads two tables in a fixed rotation (MF: L, R, L, R) with freshness_every = 2:
    a probe every second read would only ever see the first table; drawn gaps see both."""
    cfg = job(2, 2)
    cfg["tables"] = {"A": {"rows": 4, "cols": 2, "dtype": "int64"}, "B": {"rows": 4, "cols": 2, "dtype": "int64"}}
    c = bosen_cluster(1, config=cfg)
    a = Client.connect(c.path, rank=0)
    b = Client.connect(c.path, rank=1)
    try:
        ta, tb = a.table("A"), a.table("B")
        ta.get_row(0)
        tb.get_row(0)
        b.table("B").inc_row(0, i64(1, 1))  # only table B's row misses something
        b.clock()
        b.server_status()
        for _ in range(100):
            ta.get_row(0)
            tb.get_row(0)
        assert wait_until(lambda: a.stats()["freshness_probes"] >= 60)  # handed to the comm thread
        time.sleep(0.5)
        probes = a.stats()["freshness_probes"]
        assert probes <= 140, probes  # one read in 2 on average
        assert wait_until(lambda: answered(a, probes))
        assert a.stats()["missing_updates_sum"] >= 10  # table B was probed
    finally:
        b.close()
        a.close()
