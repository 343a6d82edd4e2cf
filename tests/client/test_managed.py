"""Managed communication against real servers: what goes out early, in which order, and when not."""

from __future__ import annotations

import json
import os
import signal
import time

import numpy as np
import pytest
from conftest import wait_until, worker

from bosen.client import Client

pytestmark = pytest.mark.timeout(120)



def test_relative_policy_sends_largest_relative_change_first(bosen_cluster):
    rows = 8
    c = bosen_cluster(1, 1, staleness=5, tables={"W": {"rows": rows, "cols": 2, "init": {"uniform": [1.0, 1.0]}}},
                      comm={"client_bandwidth_mbps": 0.002, "client_send_rows": 2, "priority": "relative"})
    client = Client.connect(c.path)
    try:
        W = client.table("W")
        # give rows different magnitudes x, so |δ/x| and |δ| disagree
        scale = np.array([1, 100, 2, 1000, 4, 8, 16, 0.5])
        W.get_rows(np.arange(rows))  # cached (x = 1 everywhere)
        client.clock()
        st = client._state("W")
        deltas = np.repeat(((scale - 1)[:, None]), 2, axis=1)  # x becomes `scale` after this tick
        W.inc_rows(np.arange(rows), deltas)
        client.clock()
        W.get_rows(np.arange(rows))
        # clock() flushes asynchronously: the server's clock reaching 2 proves both flushes are out
        assert wait_until(lambda: client.stats()["server_clocks"] == [2], timeout=10)
        base = st.send_count.copy()
        d = np.array([3.0, 50.0, 3.0, 100.0, 3.0, 3.0, 3.0, 1.0])
        W.inc_rows(np.arange(rows), np.repeat(d[:, None], 2, axis=1))  # |δ/x|: rows 7 (2.0) then 0 (3/1)
        ok = wait_until(lambda: (st.send_count - base).sum() >= 2, timeout=30)
        assert ok, f"nothing sent: bucket wait {client._comm.bucket.wait_s():.2f}s, stats {client.stats()}"
        sent = np.flatnonzero(st.send_count - base)
        assert sorted(sent.tolist()) == [0, 7], f"relative policy sent rows {sent.tolist()}"
        # the communication thread counts a budgeted send once it has gone, just after send_count
        assert wait_until(lambda: client.stats()["rows_sent_budgeted"] >= 2, timeout=10)
    finally:
        client.close()


def test_server_pushes_changed_rows_early_to_subscribers(bosen_cluster):
    """With managed communication a reader sees another process's update before any clock advance."""
    c = bosen_cluster(1, 2, staleness=3, tables={"W": {"rows": 4, "cols": 2}},
                      comm={"client_bandwidth_mbps": 100, "server_bandwidth_mbps": 100})
    a, b = Client.connect(c.path), Client.connect(c.path)
    try:
        b.table("W").get_rows(np.arange(4))  # subscribe
        a.table("W").inc_row(2, [5.0, 6.0])  # sent early by a, pushed early by the server
        assert wait_until(lambda: b.table("W").get_row(2)[0] == 5.0, timeout=10)
        assert c.status()[0]["clock"] == 0  # nobody has clocked: this was an early push
        assert b.stats()["rows_pushed_early_to_us"] >= 1
    finally:
        a.close()
        b.close()


def test_without_comm_updates_wait_for_the_clock(bosen_cluster):
    c = bosen_cluster(1, 2, staleness=3, tables={"W": {"rows": 4, "cols": 2}})
    a, b = Client.connect(c.path), Client.connect(c.path)
    try:
        b.table("W").get_rows(np.arange(4))
        a.table("W").inc_row(2, [5.0, 6.0])
        time.sleep(0.5)
        assert b.table("W").get_row(2)[0] == 0.0  # plain SSP: buffered until a's clock
        a.clock()
        b.clock()
        assert wait_until(lambda: b.table("W").get_row(2)[0] == 5.0, timeout=10)
    finally:
        a.close()
        b.close()


def test_unacked_window_pauses_and_resumes(bosen_cluster):
    c = bosen_cluster(1, 1, staleness=5, tables={"W": {"rows": 64, "cols": 4}},
                      comm={"client_bandwidth_mbps": 1000, "client_send_rows": 1, "max_unacked": 3,
                      "priority": "round_robin"})
    client = Client.connect(c.path)
    server = c.servers[0].pid
    try:
        W = client.table("W")
        os.kill(server, signal.SIGSTOP)  # the network "stops delivering": no acks come back
        try:
            W.inc_rows(np.arange(64), np.ones((64, 4)))
            assert wait_until(lambda: client._comm.unacked() == 4, timeout=10)
            time.sleep(0.3)
            assert client._comm.unacked() == 4, "kept sending past the window"
            assert client.stats()["window_paused_s"] > 0.1
            assert client.stats()["rows_sent_budgeted"] == 4
        finally:
            os.kill(server, signal.SIGCONT)
        assert wait_until(lambda: client.stats()["rows_sent_budgeted"] == 64, timeout=20)
        assert wait_until(lambda: client._comm.unacked() == 0, timeout=10)
        client.clock()
        np.testing.assert_array_equal(W.get_rows(np.arange(64)), np.ones((64, 4)))
    finally:
        client.close()
    assert c.status()[0]["rows_applied"] == 64


FLOAT_BYTES: dict[str, int] = {}


@pytest.mark.parametrize("wire", ["float32", "float16"])
@pytest.mark.slow
def test_float16_wire_halves_update_bytes_and_loses_nothing(bosen_cluster, wire):
    rows, cols, ticks = 32, 64, 20
    c = bosen_cluster(2, 2, staleness=0, tables={"W": {"rows": rows, "cols": cols}},
                      comm={"client_bandwidth_mbps": 0.01, "wire_dtype": wire})
    rng = np.random.default_rng(0)
    exact = np.zeros((rows, cols))
    reader = Client.connect(c.path)  # the job's second worker: reads only at the end
    writer = Client.connect(c.path)
    try:
        W = writer.table("W")
        for _ in range(ticks):
            d = rng.normal(0, 1, (rows, cols)).astype(np.float32) * np.float32(1.001)
            exact += d
            W.inc_rows(np.arange(rows), d)
            writer.clock()
    finally:
        writer.close()  # flushes the last float16 residuals; BYE is answered after they are applied
    # bytes per row sent: how many ticks coalesce into one flush depends on timing, the width does not
    st = writer.stats()  # after close: clock() flushes asynchronously
    FLOAT_BYTES[wire] = st["bytes_sent"] / st["rows_sent"]
    try:
        got = reader.table("W").get_rows(np.arange(rows))
    finally:
        reader.close()
    np.testing.assert_allclose(got, exact, atol=2e-3 if wire == "float16" else 1e-4)
    if len(FLOAT_BYTES) == 2:
        assert FLOAT_BYTES["float16"] < 0.6 * FLOAT_BYTES["float32"], FLOAT_BYTES


@pytest.mark.parametrize("managed", [True, False], ids=["managed", "plain-ssp"])
@pytest.mark.slow
def test_row_pushed_mid_clock_is_read_by_the_next_mini_batch_of_the_same_clock(bosen_cluster, bosen_procs, tmp_path,
                                                                               managed):
    """Two worker processes in clock 0: one adds to a row in its mini-batch; the other's next
    mini-batches read it from their cache before anyone clocks, under managed communication only."""
    comm = {"client_bandwidth_mbps": 100, "server_bandwidth_mbps": 100} if managed else None
    c = bosen_cluster(1, 2, staleness=2, comm=comm, tables={"W": {"rows": 8, "cols": 4}})
    extra = [] if managed else ["--max-batches", "60"]
    ws = [worker(bosen_procs, "minibatch_worker.py", c.path, "--role", role, "--dir", tmp_path, *extra, name=role)
          for role in ("reader", "writer")]
    codes = bosen_procs.wait_all(ws, timeout=60)
    assert codes == [0, 0], "\n".join(f"{p.name} exit {p.returncode}:\n{p.tail()}" for p in ws)
    r = json.loads((tmp_path / "result.json").read_text())
    assert r["tick"] == 0 and r["server_clocks"] == [0], r  # nobody had clocked when it was read
    # rows handed out: the subscribing read, one read per mini-batch, and the read that saw the value
    assert r["rows_read"] == 8 * (1 + r["batches"] + (r["seen_at"] is not None)), r
    if managed:
        assert r["seen_at"] is not None and r["seen_at"] >= 1, r  # a later mini-batch of the same clock
        assert r["rows_read_early"] >= 1, r  # counted as a value pushed mid-clock
    else:
        assert r["seen_at"] is None and r["batches"] == 60, r  # plain SSP: buffered until the clock
        assert r["rows_read_early"] == 0, r
