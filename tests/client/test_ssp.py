"""The SSP invariant under random worker delays: 6 worker processes, 2 servers, int64 table.

See tests/workers/ssp_worker.py for what each worker checks at every tick. Here: every worker
finishes with zero violations, and a client whose cache starts empty reads the exact final sums.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import worker

from bosen.client import Client

WORKERS = 6
TICKS = 12
ROWS = 10


def tri(n: int) -> int:
    return n * (n + 1) // 2


SLOTTED = {"storage": "sparse", "cache_rows": 4}  # kept by slot, 4 of the 10 rows cached (client/slots.py)
PULLED = {"push": False}  # no pushes: readers pull rows too old for the SSP rule


@pytest.mark.timeout(150)
@pytest.mark.parametrize("staleness, comm, table", [
    (0, None, {}),
    (1, {"enabled": True, "priority": "relative", "client_bandwidth_mbps": 50, "server_bandwidth_mbps": 50}, {}),
    (3, {"enabled": True, "priority": "random", "client_send_rows": 3, "server_push_rows": 3}, {}),
    (0, {"enabled": True, "priority": "round_robin", "client_send_rows": 5, "server_push_rows": 5}, {}),
    (2, {"enabled": True, "priority": "absolute", "wire_dtype": "float16", "client_send_rows": 4}, {}),
    (1, None, SLOTTED),
    (2, {"enabled": True, "priority": "relative", "client_send_rows": 3, "server_push_rows": 3}, SLOTTED),
    (1, None, PULLED),
    (2, {"enabled": True, "priority": "relative", "client_send_rows": 3, "server_push_rows": 3},
     {**PULLED, **SLOTTED}),
], ids=["s0-bsp", "s1-managed-relative", "s3-managed-random", "s0-managed-round_robin",
        "s2-managed-absolute-float16", "s1-bsp-sparse-cache4", "s2-managed-relative-sparse-cache4",
        "s1-bsp-no-push", "s2-managed-relative-no-push-sparse-cache4"])
@pytest.mark.slow
def test_ssp_invariant_under_random_delays(bosen_cluster, bosen_procs, tmp_path, staleness, comm, table):
    # rank WORKERS is the final reader: it joins first and clocks far ahead at once, so it never
    # holds the job back; it reads only after every worker has left.
    c = bosen_cluster(2, workers=WORKERS + 1, staleness=staleness, comm=comm, read_timeout_s=30,
                      tables={"W": {"rows": ROWS, "cols": WORKERS, "dtype": "int64", **table}})
    reader = Client.connect(c.path, rank=WORKERS)
    try:
        for _ in range(TICKS + staleness + 1):
            reader.clock()
        ws = [worker(bosen_procs, "ssp_worker.py", c.path, "--ticks", TICKS, "--result", tmp_path / f"result-{i}.json",
                     "--seed", i, name=f"ssp-{i}") for i in range(WORKERS)]
        codes = bosen_procs.wait_all(ws, timeout=100)
        assert codes == [0] * WORKERS, "\n".join(f"{p.name} exit {p.returncode}:\n{p.tail()}" for p in ws)

        results = [json.loads((tmp_path / f"result-{i}.json").read_text()) for i in range(WORKERS)]
        assert sorted(r["rank"] for r in results) == list(range(WORKERS))
        for p in ws:
            assert "bad message" not in p.output(), p.tail()
        for r in results:
            assert r["staleness"] == staleness
            assert r["violation_count"] == 0, f"worker {r['rank']}: {r['violations'][:10]}"
            # (ticks + 1) reads of get_rows plus ticks reads of get_row, each ROWS x WORKERS values
            assert r["checks"] == (2 * TICKS + 1) * ROWS * WORKERS
        if comm is not None:
            assert sum(r["rows_sent_budgeted"] for r in results) > 0, "managed communication sent nothing early"
        if table.get("push") is False:
            assert sum(r["rows_pushed_to_us"] for r in results) == 0, "a table with push: false was pushed"

        # fresh cache, after everyone left: exact final sums
        W = reader.table("W")
        final = W.get_rows(np.arange(ROWS))
        np.testing.assert_array_equal(final, np.full((ROWS, WORKERS), tri(TICKS), dtype=np.int64))
        assert W.get(ROWS - 1, WORKERS - 1) == tri(TICKS)
        stats = c.status()
        for s, server in zip(stats, c.servers, strict=True):
            assert s["client_clocks"][:WORKERS] == ["left"] * WORKERS
            # real clients never send anything a server rejects (not even an ack of a push that
            # crossed their BYE)
            rejected = [x for x in server.output().splitlines() if "rejected message" in x]
            assert not rejected, "\n".join(rejected)
            assert s["errors"] == 0
    finally:
        reader.close()
    c.check()


@pytest.mark.timeout(120)
def test_checker_detects_reads_outside_the_bound(bosen_cluster, bosen_procs, tmp_path):
    """The checker has teeth: a job run at staleness 3 with one slow worker, checked as if it were
    BSP, must report violations (the fast workers run up to 3 ticks ahead of the slow one)."""
    n, ticks = 3, 8
    c = bosen_cluster(2, workers=n, staleness=3, read_timeout_s=30,
                      tables={"W": {"rows": 4, "cols": n, "dtype": "int64"}})
    ws = [worker(bosen_procs, "ssp_worker.py", c.path, "--ticks", ticks, "--result", tmp_path / f"r-{i}.json",
                 "--seed", i, "--max-sleep-ms", 0, "--slow-rank", 0, "--slow-ms", 60,
                 "--assume-staleness", 0, name=f"ssp-{i}") for i in range(n)]
    assert bosen_procs.wait_all(ws, timeout=90) == [0] * n
    results = {r["rank"]: r for r in (json.loads((tmp_path / f"r-{i}.json").read_text()) for i in range(n))}
    slow = results[0]
    assert slow["violation_count"] > 0
    assert any("at most" in v for v in slow["violations"]), slow["violations"][:5]  # saw the future
    fast = [results[1], results[2]]
    assert any(any("need >=" in v for v in r["violations"]) for r in fast)  # saw a stale slow worker
    # no own-column or non-triangular problems: only the bound was (deliberately) wrong
    for r in results.values():
        assert not any("own" in v or "triangular" in v for v in r["violations"]), r["violations"][:5]


@pytest.mark.timeout(150)
@pytest.mark.slow
def test_ssp_invariant_when_every_tick_reads_rows_never_read_before(bosen_cluster, bosen_procs, tmp_path):
    """Every tick each worker adds to every row of V, then reads V rows it never read before: the
    read goes on the worker's own connection and may overtake its own update (still in flight on the
    main connection) and race pushes of other rows. Read-my-writes and the SSP bound must hold, and a
    fresh reader sees the exact sums."""
    n, ticks, block = 4, 10, 3
    c = bosen_cluster(2, workers=n + 1, staleness=1, read_timeout_s=30,
                      tables={"W": {"rows": 4, "cols": n, "dtype": "int64"},
                        "V": {"rows": ticks * block, "cols": n, "dtype": "int64"}})
    reader = Client.connect(c.path, rank=n)
    try:
        for _ in range(ticks + 2):
            reader.clock()
        ws = [worker(bosen_procs, "ssp_worker.py", c.path, "--ticks", ticks, "--result", tmp_path / f"r-{i}.json",
                     "--seed", i, "--max-sleep-ms", 5, "--fresh-block", block, name=f"ssp-{i}")
              for i in range(n)]
        assert bosen_procs.wait_all(ws, timeout=120) == [0] * n, "\n".join(p.tail() for p in ws)
        for i in range(n):
            r = json.loads((tmp_path / f"r-{i}.json").read_text())
            assert r["violation_count"] == 0, f"worker {r['rank']}: {r['violations'][:10]}"
            assert r["checks"] == (2 * ticks + 1) * 4 * n + ticks * block * n
        final = reader.table("V").get_rows(np.arange(ticks * block))
        np.testing.assert_array_equal(final, np.full((ticks * block, n), tri(ticks), dtype=np.int64))
        assert all(s["errors"] == 0 for s in c.status())
    finally:
        reader.close()
    c.check()


def test_a_read_ahead_waits_for_the_next_ticks_bound_but_never_for_its_own_clock(bosen_cluster):
    """``get_rows(rows, ahead=1)`` (a read of the next step's rows, issue 31) on a table without
    pushes returns values as fresh as a read one tick later needs, so the next step serves them from
    the cache; capped at this tick, so at staleness 0 it does not wait for this worker's own next
    clock. On a pushed table it reads at the current bound (the pushes bring the next clock's)."""
    import threading

    tables = {"W": {"rows": 4, "cols": 2, "dtype": "int64", "push": False},
              "P": {"rows": 4, "cols": 2, "dtype": "int64"}}
    c = bosen_cluster(1, workers=2, staleness=1, tables=tables)
    with Client.connect(c.path, rank=0) as a, Client.connect(c.path, rank=1) as b:
        A, B = a.table("W"), b.table("W")
        rows = np.arange(4)
        for _ in range(2):
            a.clock()
        b.clock()  # a at tick 2, b at 1: the server clock is 1
        np.testing.assert_array_equal(A.get_rows(rows), 0)  # tick 2 needs clock >= 1: no wait
        np.testing.assert_array_equal(a.table("P").get_rows(rows, ahead=1), 0)  # pushed: no wait
        # b's tick-1 update (an early budgeted send may bring it to the server before b's clock; read
        # from here on only by the read ahead, which waits for b's CLOCK(2) and so holds it for sure)
        B.inc_rows(rows, np.ones((4, 2), np.int64))
        got: list[np.ndarray] = []
        t = threading.Thread(target=lambda: got.append(A.get_rows(rows, ahead=1)))
        t.start()
        t.join(0.5)
        assert t.is_alive(), "a read ahead at tick 2 needs clock 2 (what tick 3 needs): b has not clocked it"
        b.clock()
        t.join(10)
        assert not t.is_alive() and (got[0] == 1).all()
        assert (a.table("W").get_rows_clocked(rows)[1] >= 2).all()  # tick 3 will serve them from the cache
    c0 = bosen_cluster(1, workers=1, staleness=0, tables={"W": {"rows": 4, "cols": 2, "dtype": "int64",
                                                                "push": False}})
    with Client.connect(c0.path, rank=0) as solo:
        solo.clock()
        assert (solo.table("W").get_rows(np.arange(4), ahead=1) == 0).all()  # at most its own tick: no wait
