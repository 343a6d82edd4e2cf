"""The client library against real servers: read-my-writes, worker threads, sparse increments,
argument errors, read timeouts, stats, and close() flushing."""

from __future__ import annotations

import json
import os
import random
import threading
import time

import numpy as np
import pytest
from conftest import ahead_reader, worker

from bosen.client import Client
from bosen.client.send import HANDOVER_BYTES
from bosen.errors import BosenError, ClientClosed, ReadTimeout, ServerError

MANAGED = {"enabled": True, "priority": "relative", "client_bandwidth_mbps": 100, "server_bandwidth_mbps": 100}


def tri(n: int) -> int:
    return n * (n + 1) // 2


def wait_until(cond, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        time.sleep(0.05)


def server_values(path, rank: int, table: str, rows) -> np.ndarray:
    """Exact server values via a fresh client (its own cache starts empty). Needs a free rank."""
    with Client.connect(path, rank=rank) as c:
        return c.table(table).get_rows(np.asarray(rows, dtype=np.int64))


# ------------------------------------------------------------------------------------------------
# read-my-writes


@pytest.mark.timeout(90)
@pytest.mark.parametrize("comm", [None, MANAGED], ids=["bsp", "managed"])
@pytest.mark.slow
def test_read_my_writes_single_process_exactly_once(bosen_cluster, comm):
    """One process, staleness 0: each read at tick c waits for the server's clock c. Only this process
    changes the rows, so the server does not push them back (the cache already holds its own
    updates) and SCLOCK alone makes them fresh; the cache must show every update exactly once.
    test_read_my_writes_two_processes covers pushed values that hold our updates."""
    c = bosen_cluster(2, workers=2, staleness=0, comm=comm, tables={"W": {"rows": 6, "cols": 3, "dtype": "int64"},
                                                                    "F": {"rows": 4, "cols": 2, "dtype": "float32"}})
    reader = ahead_reader(c.path, 1, 20)
    client = Client.connect(c.path, rank=0)
    try:
        W, F = client.table("W"), client.table("F")
        rows = np.arange(6)
        want = np.zeros((6, 3), np.int64)
        np.testing.assert_array_equal(W.get_rows(rows), want)  # subscribe to every row
        fwant = np.zeros((4, 2), np.float32)
        pushed = []
        for tick in range(6):
            W.inc_rows(rows, np.full((6, 3), tick + 1, np.int64))
            W.inc(tick % 6, 1, 100)
            F.inc(1, 1, 0.5)
            want += tick + 1
            want[tick % 6, 1] += 100
            fwant[1, 1] += 0.5
            np.testing.assert_array_equal(W.get_rows(rows), want, err_msg=f"right after inc, tick {tick}")
            time.sleep(0.03)  # early sends, acks and early pushes may happen now
            np.testing.assert_array_equal(W.get_rows(rows), want, err_msg=f"30 ms after inc, tick {tick}")
            client.clock()
            np.testing.assert_array_equal(W.get_rows(rows), want, err_msg=f"after clock {tick + 1}")
            time.sleep(0.03)
            np.testing.assert_array_equal(W.get_rows(rows), want, err_msg=f"30 ms after clock {tick + 1}")
            np.testing.assert_array_equal(F.get_rows(np.arange(4)), fwant)
            pushed.append(client.stats()["rows_pushed_to_us"])
        assert pushed[-1] == 0, f"rows only we change came back to us: {pushed}"
        st = client.stats()
        assert st["server_errors"] == 0
        assert st["clock"] == 6
        client.close()
        # the servers hold each update exactly once
        np.testing.assert_array_equal(reader.table("W").get_rows(rows), want)
        np.testing.assert_array_equal(reader.table("F").get_rows(np.arange(4)), fwant)
    finally:
        client.close()
        reader.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("staleness, comm", [(0, None), (0, MANAGED), (2, MANAGED)],
                         ids=["s0-bsp", "s0-managed", "s2-managed"])
@pytest.mark.slow
def test_read_my_writes_two_processes(bosen_cluster, bosen_procs, tmp_path, staleness, comm):
    c = bosen_cluster(2, workers=3, staleness=staleness, comm=comm,
                      tables={"W": {"rows": 8, "cols": 2, "dtype": "int64"}})
    ticks = 8
    reader = ahead_reader(c.path, 2, ticks + staleness + 2)
    try:
        ws = [worker(bosen_procs, "rmw_worker.py", c.path, "--ticks", ticks, "--result", tmp_path / f"rmw-{i}.json",
                     name=f"rmw-{i}") for i in range(2)]
        assert bosen_procs.wait_all(ws, timeout=90) == [0, 0], "\n".join(p.tail() for p in ws)
        results = [json.loads((tmp_path / f"rmw-{i}.json").read_text()) for i in range(2)]
        assert sorted(r["rank"] for r in results) == [0, 1]
        for r in results:
            assert r["bad_count"] == 0, f"worker {r['rank']}: {r['bad'][:8]}"
            assert r["reads"] == ticks * 9
            assert r["rows_pushed_to_us"] > 0
        if comm is not None:
            assert sum(r["rows_sent_budgeted"] for r in results) > 0, "no early sends happened"
        np.testing.assert_array_equal(reader.table("W").get_rows(np.arange(8)), np.full((8, 2), tri(ticks)))
    finally:
        reader.close()
    c.check()


# ------------------------------------------------------------------------------------------------
# worker threads


@pytest.mark.timeout(90)
@pytest.mark.parametrize("comm", [None, MANAGED], ids=["bsp", "managed"])
@pytest.mark.slow
def test_worker_threads_share_one_process_clock(bosen_cluster, comm):
    nthreads, ticks = 3, 8
    c = bosen_cluster(2, workers=2, staleness=1, comm=comm,
                      tables={"W": {"rows": 5, "cols": nthreads, "dtype": "int64"}})
    reader = ahead_reader(c.path, 1, ticks + 3)
    client = Client.connect(c.path, rank=0, main_worker=False)
    errors: list[str] = []
    seen_clocks: list[tuple[int, int]] = []
    lock = threading.Lock()
    ready = threading.Barrier(nthreads)

    def run(k: int) -> None:
        rng = random.Random(k)
        try:
            with client.worker() as w:
                ready.wait(10)
                T = w.table("W")
                for tick in range(ticks):
                    assert w.tick == tick
                    T.inc_rows(np.arange(5), np.where(np.arange(nthreads) == k, tick + 1, 0)[None, :].repeat(5, 0))
                    own = T.get_rows(np.arange(5))[:, k]
                    if not (own == tri(tick + 1)).all():
                        errors.append(f"thread {k} tick {tick}: own column {own.tolist()}")
                    time.sleep(rng.uniform(0, 0.01))
                    w.clock()
                    with lock:
                        seen_clocks.append((w.tick, client.stats()["clock"]))
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(f"thread {k}: {e!r}")

    threads = [threading.Thread(target=run, args=(k,)) for k in range(nthreads)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "worker threads hung"
        assert not errors, errors
        # the process clock never runs ahead of any worker that has not finished
        assert all(proc <= mine for mine, proc in seen_clocks), seen_clocks
        assert client.stats()["clock"] == ticks
        wait_until(lambda: all(s["client_clocks"][0] == ticks for s in c.status()), "servers see clock")
        client.close()
        np.testing.assert_array_equal(reader.table("W").get_rows(np.arange(5)), np.full((5, nthreads), tri(ticks)))
    finally:
        client.close()
        reader.close()


@pytest.mark.timeout(60)
def test_process_clock_is_the_minimum_of_its_workers(bosen_cluster):
    c = bosen_cluster(1, workers=1, staleness=5)
    client = Client.connect(c.path)
    try:
        with client.worker() as a:
            assert (client.tick, a.tick) == (0, 0)
            a.clock()
            a.clock()
            assert client.stats()["clock"] == 0  # the main worker is still at tick 0
            client.clock()
            assert client.stats()["clock"] == 1
            with client.worker() as late:
                assert late.tick == 1  # a new worker starts at the process clock
                client.clock()
                client.clock()
                assert client.stats()["clock"] == 1  # held back by `late`
            assert client.stats()["clock"] == 2  # `late` left; now min(a=2, main=3)
        assert client.stats()["clock"] == 3  # `a` left: only the main worker (tick 3) remains
        client.clock()
        assert client.stats()["clock"] == 4
        wait_until(lambda: c.status()[0]["client_clocks"][0] == 4, "server sees clock 4")
    finally:
        client.close()


# ------------------------------------------------------------------------------------------------
# sparse increments


@pytest.mark.timeout(60)
@pytest.mark.parametrize("comm", [None, MANAGED], ids=["bsp", "managed"])
@pytest.mark.slow
def test_sparse_and_duplicate_increments(bosen_cluster, comm):
    c = bosen_cluster(2, workers=3, staleness=1, comm=comm, tables={"W": {"rows": 7, "cols": 5, "dtype": "int64"},
                                                                    "F": {"rows": 3, "cols": 4, "dtype": "float32"}})
    client = Client.connect(c.path, rank=0)
    try:
        W, F = client.table("W"), client.table("F")
        want = np.zeros((7, 5), np.int64)
        fwant = np.zeros((3, 4), np.float32)
        W.inc_rows([1, 1, 3, 6, 1], [5, 6, 7, -2, 1], cols=[2, 2, 0, 4, 2])
        want[1, 2] += 12
        want[3, 0] += 7
        want[6, 4] -= 2
        W.inc(3, 1, 4)
        W.inc(3, 1, 4)
        want[3, 1] += 8
        W.inc_rows(np.array([2, 2, 5]), np.arange(15).reshape(3, 5))  # duplicate rows in a dense block
        want[2] += np.arange(5) + np.arange(5, 10)
        want[5] += np.arange(10, 15)
        W.inc_row(0, [1, 2, 3, 4, 5])
        want[0] += [1, 2, 3, 4, 5]
        W.inc_rows(np.zeros(0, np.int64), np.zeros(0, np.int64), cols=np.zeros(0, np.int64))  # nothing
        F.inc_rows([0, 0, 2], np.array([0.25, 0.5, -1.0], np.float32), cols=[3, 3, 0])
        F.inc(1, 1, 2)  # an integer delta into a float table is fine
        fwant[0, 3] += 0.75
        fwant[2, 0] -= 1
        fwant[1, 1] += 2
        np.testing.assert_array_equal(W.get_rows(np.arange(7)), want)  # read-my-writes, before any send
        np.testing.assert_array_equal(F.get_rows(np.arange(3)), fwant)
        assert W.get(1, 2) == 12 and W.get(3, 1) == 8
        client.clock()
        np.testing.assert_array_equal(W.get_rows(np.arange(7)), want)
        client.close()
        np.testing.assert_array_equal(server_values(c.path, 1, "W", range(7)), want)
        np.testing.assert_array_equal(server_values(c.path, 2, "F", range(3)), fwant)
    finally:
        client.close()


# ------------------------------------------------------------------------------------------------
# API errors


@pytest.mark.timeout(60)
def test_api_errors(bosen_cluster):
    c = bosen_cluster(2, workers=2, staleness=1, tables={"W": {"rows": 10, "cols": 4, "dtype": "int64"},
                                                         "F": {"rows": 3, "cols": 2, "dtype": "float32"}})
    client = Client.connect(c.path, rank=0)
    try:
        with pytest.raises(KeyError) as ei:
            client.table("Nope")
        assert "Nope" in str(ei.value) and "W" in str(ei.value) and "F" in str(ei.value)
        W, F = client.table("W"), client.table("F")
        assert (W.rows, W.cols, W.dtype, W.staleness) == (10, 4, np.dtype("int64"), 1)

        out_of_range = [
            lambda: W.get_row(10), lambda: W.get_row(-1), lambda: W.get(0, 4), lambda: W.get(0, -1),
            lambda: W.get_rows([0, 10]), lambda: W.get_rows([-1]),
            lambda: W.inc(10, 0, 1), lambda: W.inc(0, 4, 1), lambda: W.inc(0, -1, 1),
            lambda: W.inc_row(12, [1, 2, 3, 4]), lambda: W.inc_rows([0, 11], np.ones((2, 4), np.int64)),
            lambda: W.inc_rows([0, 1], [1, 1], cols=[0, 9]), lambda: W.inc_rows([0], [1], cols=[-2]),
        ]
        for f in out_of_range:
            with pytest.raises(IndexError, match="out of range"):
                f()
        # (get_row of a bad row type: see test_get_row_checks_the_row_type_for_cached_rows)
        for f in (lambda: W.get_rows([[0, 1]]), lambda: W.get_rows([0.5]), lambda: W.get_rows([True]),
                  lambda: W.inc_row(1.0, [1, 2, 3, 4]), lambda: W.inc(True, 0, 1)):
            with pytest.raises(TypeError):
                f()
        wrong_shape = [
            lambda: W.inc_rows([0, 1], np.ones((2, 3), np.int64)),
            lambda: W.inc_rows([0, 1], np.ones((1, 4), np.int64)),
            lambda: W.inc_rows([0, 1], np.ones(8, np.int64)),
            lambda: W.inc_row(0, [1, 2, 3]),
            lambda: W.inc_rows([0, 1], [1, 2, 3], cols=[0, 1]),
            lambda: W.inc_rows([0, 1], [1, 2], cols=[0]),
        ]
        for f in wrong_shape:
            with pytest.raises(ValueError, match="shape|same length"):
                f()
        for f in (lambda: W.inc_rows([0], np.ones((1, 4))), lambda: W.inc(0, 0, 1.5),
                  lambda: W.inc_row(0, [0.5, 0, 0, 0]), lambda: W.inc_rows([0], [1.0], cols=[0])):
            with pytest.raises(TypeError, match="int64"):
                f()
        for f in (lambda: F.inc(0, 0, float("nan")), lambda: F.inc_row(1, [0, float("inf")]),
                  lambda: F.inc_rows([0, 2], np.array([[1, 2], [np.nan, 0]])),
                  lambda: F.inc_rows([0], [-np.inf], cols=[1])):
            with pytest.raises(ValueError, match="NaN or inf"):
                f()
        assert W.get_rows([]).shape == (0, 4) and W.get_rows(np.zeros(0, np.int32)).dtype == np.int64
        assert W.get_rows(np.array([3, 3, 1], np.int32)).shape == (3, 4)  # duplicates and int32 ids are fine
        # nothing of the rejected calls was buffered or applied
        W.inc(2, 3, 7)
        F.inc(2, 1, 0.5)
        client.clock()
        want = np.zeros((10, 4), np.int64)
        want[2, 3] = 7
        np.testing.assert_array_equal(W.get_rows(np.arange(10)), want)
        np.testing.assert_array_equal(F.get_rows(np.arange(3)), [[0, 0], [0, 0], [0, 0.5]])
        assert client.stats()["server_errors"] == 0
        client.close()
        np.testing.assert_array_equal(server_values(c.path, 1, "W", range(10)), want)
        # (get_row of a cached row after close: see test_get_row_after_close_raises)
        for f in (lambda: W.get_rows([0]), lambda: W.inc(0, 0, 1), client.clock, lambda: client.worker().__enter__()):
            with pytest.raises(ClientClosed):
                f()
        client.close()  # twice is fine
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_joining_with_a_different_config_or_a_full_job_fails(bosen_cluster, tmp_path):
    c = bosen_cluster(1, workers=1, tables={"W": {"rows": 4, "cols": 2, "dtype": "int64"}})
    other = dict(c.config, tables={"W": {"rows": 5, "cols": 2, "dtype": "int64"}})
    t0 = time.monotonic()
    with pytest.raises(BosenError, match="fingerprint"):
        Client.connect(other, join_timeout=10)
    assert time.monotonic() - t0 < 8
    first = Client.connect(c.path)
    try:
        assert first.rank == 0 and first.num_workers == 1
        with pytest.raises(ServerError, match="full"):
            Client.connect(c.path, join_timeout=10)
        with pytest.raises(ServerError, match="rank 0 already joined"):
            Client.connect(c.path, rank=0, join_timeout=10)
    finally:
        first.close()
    with pytest.raises(ServerError, match="rank 0 left the job"):
        Client.connect(c.path, rank=0, join_timeout=10)
    c.check()


@pytest.mark.timeout(60)
def test_every_client_connects_under_its_own_identity(bosen_cluster):
    """A ROUTER drops a second connection under an identity it knows, silently: the HELLO is never
    answered. Identities were once pid plus 12 bits of object address, which clashed now and then
    between two clients of one process (a CI hang) and would clash between containers (pid 1)."""
    import zmq
    c = bosen_cluster(2, workers=2)
    with Client.connect(c.path) as a, Client.connect(c.path) as b:
        ids = [link.sock.sock.getsockopt(zmq.IDENTITY) for cl in (a, b) for link in cl._comm.links]
        assert len(set(ids)) == 4, ids
        assert all(len(i) >= len(f"c{os.getpid()}-") + 16 for i in ids), ids  # 64 random bits
        assert {a.rank, b.rank} == {0, 1}
    c.check()


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_joining_a_job_whose_server_is_down_times_out(bosen_cluster):
    c = bosen_cluster(2, workers=1)
    c.stop_server(1)
    t0 = time.monotonic()
    with pytest.raises(BosenError, match="no answer to HELLO from server 1"):
        Client.connect(c.path, join_timeout=2)
    assert time.monotonic() - t0 < 20


# ------------------------------------------------------------------------------------------------
# read timeout


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_unsatisfiable_read_times_out_naming_table_row_and_clocks(bosen_cluster):
    # two worker processes make up the job, but only one ever joins: the servers' clock stays 0
    c = bosen_cluster(2, workers=2, staleness=0, read_timeout_s=2,
                      tables={"W": {"rows": 10, "cols": 3, "dtype": "int64"}})
    client = Client.connect(c.path)
    try:
        W = client.table("W")
        W.inc(3, 0, 5)
        assert W.get(3, 0) == 5  # tick 0: the servers' clock 0 is fresh enough
        client.clock()
        for row in (3, 6):  # cached (stale) and never read
            t0 = time.monotonic()
            with pytest.raises(ReadTimeout) as ei:
                W.get_row(row)
            elapsed = time.monotonic() - t0
            assert 1.5 <= elapsed < 10, elapsed
            msg = str(ei.value)
            assert "'W'" in msg and f"row {row}" in msg, msg
            assert "tick 1" in msg and ">= 1" in msg and "staleness 0" in msg, msg
        assert isinstance(ei.value, TimeoutError)
        st = client.stats()
        assert st["blocked_reads"] >= 2 and st["blocked_s"] >= 3.5
        rec = client.report()  # every record carries them too (metrics.jsonl, bosen_job_blocked_seconds)
        assert rec["blocked_reads"] == st["blocked_reads"]
        assert rec["blocked_s"] == pytest.approx(st["blocked_s"], abs=1e-5)
    finally:
        client.close()
    c.check()


# ------------------------------------------------------------------------------------------------
# stats and close


@pytest.mark.timeout(60)
@pytest.mark.parametrize("comm", [None, MANAGED], ids=["bsp", "managed"])
@pytest.mark.slow
def test_stats(bosen_cluster, comm):
    c = bosen_cluster(2, workers=1, staleness=2, comm=comm, tables={"W": {"rows": 10, "cols": 4, "dtype": "int64"}})
    client = Client.connect(c.path)
    try:
        W = client.table("W")
        s0 = client.stats()
        W.get_rows(np.arange(6))
        W.inc_rows(np.arange(10), np.ones((10, 4), np.int64))
        client.clock()
        client.clock()
        W.get_rows(np.arange(6))
        # clock() hands the flush to the communication thread; wait until it has gone out
        wait_until(lambda: client.stats()["rows_sent"] >= 10, "flush at clock")
        s = client.stats()
        for k in ("rank", "clock", "bytes_sent", "bytes_received", "msgs_sent", "msgs_received", "rows_sent",
                  "rows_received", "blocked_s", "blocked_reads", "server_clocks", "uptime_s", "tables"):
            assert k in s, k
        assert s["rank"] == 0 and s["clock"] == 2
        assert s["bytes_sent"] > s0["bytes_sent"] and s["bytes_received"] > s0["bytes_received"]
        assert s["rows_sent"] >= 10
        assert s["rows_received"] >= 6
        assert s["blocked_reads"] >= 1 and s["blocked_s"] >= 0
        assert len(s["server_clocks"]) == 2
        t = s["tables"]["W"]
        assert t["cached_rows"] == 6
        assert 0 <= t["staleness_mean"] <= t["staleness_max"] <= 2
        assert t["staged_bytes"] == t["pool_bytes"] == 0  # increments too small to stage
        # a blocking read goes on the worker's own connection, except under managed communication
        assert (s["direct_reads"] >= 1) if comm is None else (s["direct_reads"] == 0), s["direct_reads"]
        if comm is not None:
            for k in ("budget_mbps", "egress_mbps", "priority", "unacked"):
                assert k in s, k
            assert s["budget_mbps"] == 100 and s["priority"] == "relative"
        json.dumps(s)  # plain data
    finally:
        client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("comm", [None, MANAGED], ids=["bsp", "managed"])
@pytest.mark.slow
def test_close_flushes_updates_made_after_the_last_clock(bosen_cluster, comm):
    c = bosen_cluster(2, workers=2, staleness=1, comm=comm, tables={"W": {"rows": 9, "cols": 2, "dtype": "int64"},
                                                                    "F": {"rows": 2, "cols": 2, "dtype": "float64"}})
    client = Client.connect(c.path)
    W, F = client.table("W"), client.table("F")
    W.inc_rows(np.arange(9), np.ones((9, 2), np.int64))
    client.clock()
    W.inc_rows(np.arange(9), np.full((9, 2), 10, np.int64))  # tick 1, never clocked
    W.inc(8, 1, 1000)
    F.inc_row(1, [0.5, -0.25])
    client.close()
    want = np.full((9, 2), 11, np.int64)
    want[8, 1] += 1000
    np.testing.assert_array_equal(server_values(c.path, 1, "W", range(9)), want)
    for s in c.status():
        assert s["client_clocks"][0] == "left"
    c.check()


@pytest.mark.timeout(60)
def test_client_from_dict_and_context_manager(bosen_cluster):
    c = bosen_cluster(1, workers=2)
    with Client.connect(c.config) as client:
        assert client.rank == 0 and client.num_workers == 2
        client.table("W").inc(0, 0, 3)
    with Client.connect(c.config, overrides=["consistency.read_timeout_s=5"]) as client:
        assert client.rank == 1
        assert client.config.consistency.read_timeout_s == 5
        assert client.table("W").get(0, 0) == 3


@pytest.mark.timeout(60)
@pytest.mark.parametrize("comm", [
    pytest.param(None, id="bsp"),
    pytest.param({"enabled": True}, id="managed"),
    pytest.param({"enabled": True, "wire_dtype": "float16"}, id="managed-f16"),
])
@pytest.mark.slow
def test_float64_table(bosen_cluster, comm):
    c = bosen_cluster(2, workers=2, staleness=1, comm=comm, tables={"D": {"rows": 4, "cols": 3, "dtype": "float64"}})
    want = np.zeros((4, 3))
    reader = ahead_reader(c.path, 1, 10)
    with Client.connect(c.path, rank=0) as client:
        D = client.table("D")
        for tick in range(3):
            D.inc_rows(np.arange(4), np.full((4, 3), 0.125 * (tick + 1)))
            D.inc(1, 2, 1.5)
            want += 0.125 * (tick + 1)
            want[1, 2] += 1.5
            np.testing.assert_array_equal(D.get_rows(np.arange(4)), want)
            client.clock()
        assert client.stats()["server_errors"] == 0
    with reader:
        np.testing.assert_array_equal(reader.table("D").get_rows(np.arange(4)), want)


@pytest.mark.timeout(60)
def test_get_row_checks_the_row_type_for_cached_rows(bosen_cluster):
    c = bosen_cluster(1, workers=1, staleness=1)
    with Client.connect(c.path) as client:
        W = client.table("W")
        W.get_rows(np.arange(W.rows))  # everything cached now
        for bad in (True, 1.0, np.float64(2)):
            with pytest.raises(TypeError):
                W.get_row(bad)


@pytest.mark.timeout(60)
def test_get_row_after_close_raises(bosen_cluster):
    c = bosen_cluster(1, workers=1, staleness=1)
    client = Client.connect(c.path)
    W = client.table("W")
    W.get_rows(np.arange(W.rows))
    client.close()
    with pytest.raises(ClientClosed):
        W.get_rows([0])  # the slow path checks
    with pytest.raises(ClientClosed):
        W.get_row(0)


def test_the_clock_rides_on_the_last_update_and_sclock_acknowledges_it(bosen_cluster):
    """Per tick with updates for every server: one INC carrying the clock each way out and one SCLOCK
    back (no separate CLOCK, no ACK); every update batch still counts as acknowledged."""
    c = bosen_cluster(2, workers=1, staleness=0, tables={"W": {"rows": 8, "cols": 2, "dtype": "int64"}})
    with Client.connect(c.path) as client:
        W = client.table("W")
        W.get_rows(np.arange(8))
        before = client.stats()
        ticks = 5
        for tick in range(ticks):
            W.inc_rows(np.arange(8), np.ones((8, 2), np.int64))  # rows on both servers
            client.clock()
            np.testing.assert_array_equal(W.get_rows(np.arange(8)), np.full((8, 2), tick + 1))
        wait_until(lambda: client.stats()["acks"] - before["acks"] == 2 * ticks, "every INC acknowledged")
        s = client.stats()
        assert s["update_batches"] - before["update_batches"] == 2 * ticks
        assert s["msgs_sent"] - before["msgs_sent"] == 2 * ticks, "one message per server per tick"
        # per server and tick: one SCLOCK; the rows we read changed, but only we changed them, so they
        # are not pushed back (our cache holds them)
        assert s["msgs_received"] - before["msgs_received"] == 2 * ticks
        assert s["ack_latency_ms_max"] > 0
        assert [st["clock"] for st in client.server_status()] == [ticks, ticks]


def test_send_rows_sends_those_rows_before_the_clock_and_only_once(bosen_cluster):
    """A partial flush (``Table.send_rows``): the given rows' updates reach the servers before the
    clock, the others wait for it; the clock then sends only those, and every value is exact. A
    row sent twice is sent once; a row with nothing buffered is skipped."""
    c = bosen_cluster(1, workers=2, staleness=0, tables={"W": {"rows": 8, "cols": 2, "dtype": "int64"}})
    with Client.connect(c.path, rank=0) as client:
        W = client.table("W")
        W.inc_rows(np.arange(8), np.ones((8, 2), np.int64))
        W.send_rows(np.array([0, 1, 5, 5]))
        W.send_rows(np.array([1]))  # already sent: nothing more
        wait_until(lambda: sum(s["rows_applied"] for s in client.server_status()) == 3, "the three rows applied")
        time.sleep(0.2)
        assert sum(s["rows_applied"] for s in client.server_status()) == 3, "only the rows asked for went early"
        assert [s["clock"] for s in client.server_status()] == [0]
        s = client.stats()
        assert s["rows_sent"] == 3 and s["rows_sent_early"] == 4 and s["bytes_sent_early"] > 0
        client.clock()
        wait_until(lambda: sum(s["rows_applied"] for s in client.server_status()) == 8, "the rest at the clock")
        assert client.stats()["rows_sent"] == 8
        with pytest.raises(IndexError, match="row 8 out of range"):
            W.send_rows(np.array([8]))
    np.testing.assert_array_equal(server_values(c.path, 1, "W", np.arange(8)), np.ones((8, 2)))


def test_a_flush_asks_for_an_ack_once_per_2_MiB(bosen_cluster):
    """A tick of four 1 MiB update messages with a 16 MiB window: the second asks for an ACK (2 MiB
    unasked), the first and third carry "na", the fourth carries the clock (SCLOCK). Two messages
    back per tick, every update acknowledged, nothing lost."""
    rows, cols = 1024, 512  # int64: 4 KiB rows, 256 per 1 MiB message, 4 messages per tick
    c = bosen_cluster(1, workers=1, staleness=0, tables={"W": {"rows": rows, "cols": cols, "dtype": "int64"}})
    with Client.connect(c.path) as client:
        assert [link.window.window_bytes for link in client._comm.links] == [16 << 20]
        W = client.table("W")
        before = client.stats()
        ticks = 3
        for tick in range(ticks):
            W.inc_rows(np.arange(rows), np.full((rows, cols), tick + 1, np.int64))
            client.clock()  # ticks that pass before a flush share it: wait, to count each one's
            wait_until(lambda tick=tick: client.stats()["server_clocks"] == [tick + 1], "the server clock")
        s = client.stats()
        assert s["update_batches"] - before["update_batches"] == 4 * ticks
        assert s["msgs_received"] - before["msgs_received"] == 2 * ticks, "one ACK and one SCLOCK per tick"
        assert s["acks"] - before["acks"] == 4 * ticks, "the cumulative ACK and the SCLOCK cover every message"
        assert client._comm.unacked() == 0
        np.testing.assert_array_equal(W.get_rows(np.arange(rows)), np.full((rows, cols), ticks * (ticks + 1) // 2))
        assert client.server_status()[0]["rows_applied"] == ticks * rows


def test_ticks_larger_than_the_window_go_out_on_thinned_acks(bosen_cluster):
    """16 MiB per tick and server against an 8 MiB window: the flush stops at the window and goes on
    as the (fewer) ACKs arrive; each stop's last message asks for one, so nothing waits forever.
    (Ticks may share a flush, coalesced: the sums say whether every increment arrived once.)"""
    rows, cols = 8192, 512  # int64, 2 servers: 16 MiB per tick and server, 1 MiB messages
    c = bosen_cluster(2, workers=1, staleness=0, tables={"W": {"rows": rows, "cols": cols, "dtype": "int64"}})
    with Client.connect(c.path) as client:
        for link in client._comm.links:
            link.window.window_bytes = 8 << 20
        W = client.table("W")
        before = client.stats()
        ticks = 3
        for tick in range(ticks):
            W.inc_rows(np.arange(rows), np.full((rows, cols), tick + 1, np.int64))
            client.clock()
        wait_until(lambda: client.stats()["server_clocks"] == [ticks, ticks], "both server clocks")
        s = client.stats()
        sent = s["update_batches"] - before["update_batches"]
        assert sent >= 2 * 16, s
        assert s["acks"] - before["acks"] == sent and client._comm.unacked() == 0
        assert s["msgs_received"] - before["msgs_received"] <= 0.75 * sent, "ACKs are thinned"
        np.testing.assert_array_equal(W.get_rows(np.arange(rows)), np.full((rows, cols), ticks * (ticks + 1) // 2))


def test_a_worker_incrementing_back_to_back_hands_over_to_the_communication_thread(bosen_cluster):
    """Ticks of 1 MiB increments with nothing in between, which would keep the communication thread
    from the GIL and the table lock: it still takes up a flush at least once per HANDOVER_BYTES of
    increments, so updates go out while the worker runs; every increment arrives once."""
    rows, cols = 4096, 256  # float32: 1 KiB rows, 1024 rows per MiB
    c = bosen_cluster(1, workers=1, staleness=1000, tables={"W": {"rows": rows, "cols": cols, "dtype": "float32"}})
    with Client.connect(c.path) as client:
        W = client.table("W")
        before = client.stats()["flushes"]
        ticks = 64
        deltas = np.ones((1024, cols), np.float32)
        for tick in range(ticks):
            lo = (tick % 4) * 1024
            W.inc_rows(np.arange(lo, lo + 1024), deltas)
            client.clock()
        taken = client.stats()["flushes"] - before
        assert taken >= ticks // (HANDOVER_BYTES // (1 << 20) + 1), taken
        client.server_status()  # answered once every update is applied (increments of a row may coalesce)
        np.testing.assert_array_equal(W.get_rows(np.arange(rows)), np.full((rows, cols), ticks // 4, np.float32))


@pytest.mark.parametrize("dtype", ["int64", "float64"])
@pytest.mark.slow
def test_a_flush_larger_than_the_window_goes_out_as_acks_arrive(bosen_cluster, dtype):
    """With a window of one message, every update message waits for the last one's ACK; the ticks'
    updates still all arrive, each server gets its clock after them, and reads stay exact."""
    rows, cols = 300, 1024  # 8 KiB rows: 128 rows per 1 MiB message, several per server and flush
    c = bosen_cluster(2, workers=1, staleness=0, tables={"W": {"rows": rows, "cols": cols, "dtype": dtype}})
    with Client.connect(c.path) as client:
        for link in client._comm.links:
            link.window.window_bytes = 1
        W = client.table("W")
        want = np.zeros((rows, cols))
        for tick in range(4):
            W.inc_rows(np.arange(rows), np.full((rows, cols), tick + 1, dtype=dtype))
            client.clock()
            want += tick + 1
            np.testing.assert_array_equal(W.get_rows(np.arange(rows)), want)  # waits for the server clock
        assert [s["clock"] for s in client.server_status()] == [4, 4]
        s = client.stats()
        assert s["update_batches"] >= 4 * 4 and s["acks"] == s["update_batches"], s
        assert not client._comm.flushing()
        # every tick's increment (2.3 MiB, one run) went out as staged pieces, one server's rows each
        t = s["tables"]["W"]
        assert t["staged_bytes"] == 0 and t["pool_bytes"] > 0 and t["pool_reused"] >= 4, t


@pytest.mark.timeout(60)
def test_a_large_read_returns_its_own_array_with_buffered_updates_on_top(bosen_cluster):
    """A read of a run of at least 64 KiB hands over the received array when the cache took it as it
    came: it must be the caller's own (writing it changes no later read) and, where this process
    has increments the server has not seen, hold them like the cache does."""
    rows, cols = 128, 256  # 128 KiB of float32
    c = bosen_cluster(1, workers=1, staleness=0, tables={"F": {"rows": 2 * rows, "cols": cols, "dtype": "float32"}})
    with Client.connect(c.path) as client:
        F = client.table("F")
        F.inc_rows(np.arange(2 * rows), np.arange(2 * rows * cols, dtype=np.float32).reshape(2 * rows, cols))
        client.clock()
        want = np.arange(2 * rows * cols, dtype=np.float32).reshape(2 * rows, cols)
        first = F.get_rows(np.arange(rows))
        np.testing.assert_array_equal(first, want[:rows])
        assert first.flags.writeable
        first[:] = -1
        np.testing.assert_array_equal(F.get_rows(np.arange(rows)), want[:rows])  # from the cache
        F.inc_rows(np.arange(rows, rows + 4), np.ones((4, cols), np.float32))  # buffered, then read
        want[rows:rows + 4] += 1
        np.testing.assert_array_equal(F.get_rows(np.arange(rows, 2 * rows)), want[rows:])
        assert client.stats()["direct_reads"] >= 2


@pytest.mark.slow
def test_pieces_reused_under_pressure_carry_every_tick_exactly(bosen_cluster, monkeypatch):
    """Staged pieces go out as the ZeroMQ messages they live in and are reused only once the
    message that carried them is acknowledged. With a pool of a few buffers for two servers,
    buffers are reused many times while others are still queued in ZeroMQ (what the pool cannot
    lend goes to the dense buffer): each tick's distinct values must arrive exactly once."""
    monkeypatch.setattr("bosen.client.oplog.POOL_BYTES", 3 << 20)
    rows, cols = 4096, 256  # int64, 2 KiB rows: 8 MiB a tick, 1 MiB pieces of one server's rows
    # no read-my-writes: no in-flight log holds a sent piece, only the acknowledgement protects it
    c = bosen_cluster(2, workers=1, staleness=1,
                      tables={"W": {"rows": rows, "cols": cols, "dtype": "int64", "read_my_writes": False}})
    base = np.arange(rows, dtype=np.int64)[:, None] * 7 + np.arange(cols, dtype=np.int64)
    with Client.connect(c.path) as client:
        W = client.table("W")
        ticks = 20
        for tick in range(ticks):
            for lo in range(0, rows, 1024):  # two pieces a call, one per server
                W.inc_rows(np.arange(lo, lo + 1024), base[lo:lo + 1024] * (tick + 1) + tick)
            client.clock()
            if tick % 2:  # now and then let the flushes catch up, so that later runs are staged again
                wait_until(lambda tick=tick: client.stats()["server_clocks"] == [tick + 1] * 2, "both server clocks",
                           60)
        wait_until(lambda: client.stats()["server_clocks"] == [ticks, ticks], "both server clocks", 60)
        t = client.stats()["tables"]["W"]
        assert t["pool_bytes"] <= 5 << 20 and t["pool_reused"] >= ticks, t
        assert not client._comm.flushing() and client._comm.unacked() == 0
        want = base * tri(ticks) + tri(ticks - 1)
        np.testing.assert_array_equal(W.get_rows(np.arange(rows)), want)


def test_read_counters_count_rows_and_their_staleness(bosen_cluster):
    """rows_read counts rows handed out; read_staleness_sum adds (tick - the row's clock) per row."""
    c = bosen_cluster(1, 2, staleness=2, tables={"W": {"rows": 4, "cols": 2}})
    a, b = Client.connect(c.path), Client.connect(c.path)  # b never clocks: the server stays at 0
    try:
        W = a.table("W")
        W.get_rows(np.arange(4))  # tick 0, rows valid for clock 0: fresh
        W.get_row(1)
        s = a.stats()
        assert (s["rows_read"], s["read_staleness_sum"], s["rows_read_early"]) == (5, 0, 0)
        a.clock()
        a.clock()  # tick 2 with the server's clock at 0: every row read is 2 clocks stale
        W.get_rows(np.array([0, 2]))
        W.get_row(3)
        s = a.stats()
        assert (s["rows_read"], s["read_staleness_sum"]) == (8, 3 * 2), s
        rec = a.report(x=1)  # every report carries the totals
        assert (rec["rows_read"], rec["read_staleness_sum"], rec["rows_read_early"]) == (8, 6, 0)
    finally:
        a.close()
        b.close()


def test_a_tick_sends_each_server_one_message_whatever_the_number_of_tables(bosen_cluster):
    """Three tables, two servers: each end-of-tick flush sends one message to each server (a FLUSH with
    every table's updates and the clock), and the values come out exact."""
    tables = {name: {"rows": 20, "cols": 4, "dtype": "int64"} for name in ("A", "B", "C")}
    c = bosen_cluster(2, workers=1, staleness=0, tables=tables)
    client = Client.connect(c.path)
    try:
        handles = [client.table(name) for name in tables]
        for t in handles:
            t.get_rows(np.arange(20))  # cached: the ticks below read nothing from the servers
        client.clock()
        stats = client.stats()
        msgs, flushes = stats["msgs_sent"], stats["flushes"]
        for tick in range(20):
            for k, t in enumerate(handles):
                t.inc_rows(np.arange(20), np.full((20, 4), tick + k, np.int64))
            client.clock()
            time.sleep(0.01)  # let the flush of this tick go before the next (ticks may share one)
        assert wait_flushed(client)
        stats = client.stats()
        assert stats["flushes"] > flushes
        assert stats["msgs_sent"] - msgs == 2 * (stats["flushes"] - flushes), stats
        for k, t in enumerate(handles):
            np.testing.assert_array_equal(t.get_rows(np.arange(20)), np.full((20, 4), sum(range(20)) + 20 * k))
    finally:
        client.close()


def wait_flushed(client: Client, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while client._comm.flushing() or client._comm.unacked():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
