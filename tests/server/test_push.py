"""Pushes to several subscribers (docs/design.md, "Zero-copy sends"; "Consistency", decision 3):
each chunk of rows is gathered once and its frames are shared by every subscriber that gets all of it;
what each client gets, and the values it gets, are those of one row-by-row send per client."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import pytest
from conftest import wait_until

from bosen import config as config_mod
from bosen import wire
from bosen.client import Client
from bosen.jobs.job import job_config
from bosen.server import daemon
from bosen.server.daemon import Peer, Server
from bosen.wire import Msg, UpdateBatch

pytestmark = pytest.mark.timeout(120)


def server(rows: int = 16, cols: int = 4, clients: int = 3, read_my_writes: bool = True,
           push_to: str = "subscribers") -> Server:
    data = job_config(["127.0.0.1:1"], clients, tables={"W": {"rows": rows, "cols": cols, "dtype": "float32",
                                                               "read_my_writes": read_my_writes}},
                      comm={"server_bandwidth_mbps": 1000, "push_to": push_to})
    s = Server(config_mod.load(data), 0)
    for r in range(clients):
        p = Peer(ident=b"c%d" % r, rank=r, last_seq=0, applied=10 * r)
        s.peers[p.ident], s.by_rank[r] = p, p
    return s


Sent = list[tuple[bytes, dict[str, Any], list[Any]]]


def capture(s: Server) -> Sent:
    """Every message the server sends, as (to whom, header, array frames), instead of a socket."""
    sent: Sent = []

    def send_frames(ident: bytes, frames: list[Any], kind: Msg) -> int:
        sent.append((ident, wire.decode_header(frames[0]), frames[1:]))
        return sum(len(f) if not isinstance(f, memoryview) else f.nbytes for f in frames)

    s._send_frames = send_frames  # type: ignore[method-assign]
    return sent


def rows_of(frames: list[Any], n: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    return (wire.ids(frames[0], n, "rows"),
            wire.array(frames[1], np.dtype(np.float32), n * cols, "values").reshape(n, cols))


def inc(s: Server, rows: np.ndarray, value: float, client: int) -> None:
    shard = s.shards[0]
    shard.apply(UpdateBatch(rows.astype(np.int64), np.full((rows.shape[0], shard.cfg.cols), value, np.float32)),
                client)


def test_every_subscriber_of_all_rows_gets_the_same_frames_and_its_own_header():
    s = server()
    sent = capture(s)
    shard = s.shards[0]
    local = np.arange(16)
    for r in range(3):
        shard.subscribe(local, r)
    inc(s, local, 2.0, client=0)
    inc(s, local, 1.0, client=1)  # two writers: nobody's own rows are left out
    s._push(shard, shard.take_changed(), s._live(), budgeted=True)
    assert [ident for ident, _, _ in sent] == [b"c0", b"c1", b"c2"]
    assert len({id(f[1]) for _, _, f in sent}) == 1  # one values frame, sent three times
    for r, (_, h, frames) in enumerate(sent):
        assert (h["a"], h["ss"], h["ps"], h["rq"], h["n"]) == (10 * r, 1, 1, -1, 16)
        rows, values = rows_of(frames, 16, 4)
        assert rows.tolist() == list(range(16)) and (values == 3.0).all()
    assert s.counters["push_gathers"] == 1 and s.counters["push_shared_msgs"] == 3
    assert s.push_stall.n == 1


def test_the_table_changing_right_after_a_push_leaves_the_sent_frames_alone():
    s = server(rows=2048, cols=64)  # 512 KiB chunks: the frames hold the gathered copy without a copy
    sent = capture(s)
    shard = s.shards[0]
    local = np.arange(2048)
    for r in range(3):
        shard.subscribe(local, r)
    inc(s, local, 1.0, client=0)
    inc(s, local, 1.0, client=1)
    s._push(shard, shard.take_changed(), s._live(), budgeted=False)
    inc(s, local, 5.0, client=2)  # applied while ZeroMQ would still be sending
    shard.values[:] = -1.0
    assert len(sent) == 3
    for _, h, frames in sent:
        _, values = rows_of(frames, h["n"], 64)
        assert (values == 2.0).all()


def test_chunks_and_a_subscriber_of_a_few_runs_share_the_gather(monkeypatch):
    monkeypatch.setattr(daemon, "CHUNK_BYTES", 4 * 4 * 4)  # 4 rows per message
    s = server(rows=16)
    sent = capture(s)
    shard = s.shards[0]
    local = np.arange(16)
    shard.subscribe(local, 0)
    shard.subscribe(local, 1)
    shard.subscribe(np.arange(2, 11), 2)  # one run, across three chunks, two of them in part
    inc(s, local, 1.0, client=0)
    inc(s, local, 1.0, client=1)
    s._push(shard, shard.take_changed(), s._live(), budgeted=False)
    got: dict[bytes, list[int]] = {}
    msgs: dict[bytes, int] = {}
    for ident, h, frames in sent:
        rows, values = rows_of(frames, h["n"], 4)
        assert (values == 2.0).all()
        got.setdefault(ident, []).extend(rows.tolist())
        msgs[ident] = msgs.get(ident, 0) + 1
        assert h["ss"] == msgs[ident]  # each client's ROWS numbered in order
    assert got == {b"c0": list(range(16)), b"c1": list(range(16)), b"c2": list(range(2, 11))}
    assert s.counters["push_gathers"] == 4 and s.counters["push_own_gathers"] == 0
    assert s.counters["push_part_msgs"] == 2  # rows 2-3 and 8-10


def test_a_scattered_selection_gets_its_own_gather_and_own_rows_stay_home():
    s = server(rows=16)
    sent = capture(s)
    shard = s.shards[0]
    local = np.arange(16)
    for r in range(3):
        shard.subscribe(local, r)
    inc(s, local, 1.0, client=1)
    inc(s, local[local % 2 == 0], 1.0, client=2)  # odd rows: client 1 alone changed them (skip_own)
    s._push(shard, shard.take_changed(), s._live(), budgeted=False)
    got = {ident: rows_of(frames, h["n"], 4) for ident, h, frames in sent}
    assert sorted(got) == [b"c0", b"c1", b"c2"]
    assert got[b"c0"][0].tolist() == list(range(16))
    assert got[b"c1"][0].tolist() == list(range(0, 16, 2))  # not its own odd rows
    for ident, (rows, values) in got.items():
        assert (values[:, 0] == np.where(rows % 2 == 0, 2.0, 1.0)).all(), ident
    assert s.counters["push_own_gathers"] == 1  # client 1's eight runs


def test_a_push_in_turns_applies_what_arrives_between_chunks_and_sclock_follows_the_last(monkeypatch):
    monkeypatch.setattr(daemon, "CHUNK_BYTES", 4 * 4 * 4)  # 4 rows per chunk: this push is 4 turns
    s = server(rows=16)
    sent = capture(s)
    s._sock = cast(Any, object())  # serving (sends go to ``capture``)
    shard = s.shards[0]
    local = np.arange(16)
    for r in range(3):
        shard.subscribe(local, r)

    async def advance() -> None:
        inc(s, local, 1.0, client=0)
        inc(s, local, 1.0, client=1)
        s.client_clock[:] = 1
        assert s._maybe_advance() and s._pushing is not None
        await asyncio.sleep(0)  # the first turn: rows 0-3
        assert not s._maybe_advance()  # no other advance while a push is under way
        inc(s, local, 10.0, client=2)  # an update of tick 1 read between turns
        await s._pushing

    asyncio.run(advance())
    assert s.clock == 1 and s._pushing is None and s.counters["pushes_in_turns"] == 1
    for ident in (b"c0", b"c1", b"c2"):
        mine = [(h, f) for i, h, f in sent if i == ident]
        assert [h["t"] for h, _ in mine] == [Msg.ROWS] * 4 + [Msg.SCLOCK]  # SCLOCK after every chunk
        assert mine[-1][0]["c"] == 1
        firsts = [float(rows_of(f, h["n"], 4)[1][0, 0]) for h, f in mine[:4]]
        assert firsts == [2.0, 12.0, 12.0, 12.0]  # later turns carry the update applied meanwhile
    assert shard.dirty.tolist() == [True] * 4 + [False] * 12  # rows 0-3 go again at the next push


def one_writer_two_readers(path: Any, rows: int, cols: int, ticks: int,
                           check: Callable[[int, int, np.ndarray], None]) -> None:
    """Three clients subscribe to every row; client 0 adds t + 1 to every cell at tick t, and every
    client reads all rows (``check(tick, client, values)``) and clocks; at the end every client must
    come to read the exact total."""
    clients = [Client.connect(path) for _ in range(3)]
    try:
        all_rows = np.arange(rows)
        for cl in clients:
            cl.table("W").get_rows(all_rows)
        for t in range(ticks):
            clients[0].table("W").inc_rows(all_rows, np.full((rows, cols), t + 1, np.float32))
            for i, cl in enumerate(clients):
                check(t, i, cl.table("W").get_rows(all_rows))
                cl.clock()
        want = ticks * (ticks + 1) / 2
        for cl in clients:
            assert wait_until(lambda cl=cl: (cl.table("W").get_rows(all_rows) == want).all(), timeout=20)
    finally:
        for cl in clients:
            cl.close()


@pytest.mark.parametrize("read_my_writes", [True, False])
def test_three_subscribers_of_the_same_rows_read_exact_values(bosen_cluster, read_my_writes):
    """One writer, two readers, budgeted pushes at a high budget and clock-advance pushes of 1.5 MiB
    (two chunks); the writer's own rows skip it where its cache mirrors them (read-my-writes)."""
    rows, cols, ticks = 1536, 256, 6
    c = bosen_cluster(1, 3, staleness=1, tables={"W": {"rows": rows, "cols": cols, "dtype": "float32",
                                                      "read_my_writes": read_my_writes}},
                      comm={"client_bandwidth_mbps": 2000, "server_bandwidth_mbps": 2000,
                            "server_push_rows": 2048, "client_send_rows": 2048})

    def check(t: int, i: int, v: np.ndarray) -> None:
        # any value seen is a whole number of the writer's ticks, the same in every column
        assert (v == v[:, :1]).all() and np.isin(v[:, 0], [k * (k + 1) / 2 for k in range(t + 2)]).all()

    one_writer_two_readers(c.path, rows, cols, ticks, check)
    st = c.status()[0]
    assert st["push_shared_msgs"] > 0 and st["errors"] == 0


def test_a_clock_advance_push_of_several_chunks_goes_in_turns_and_stays_exact(bosen_cluster):
    """Plain SSP at staleness 0: every read sees every update of the ticks before it, although the
    server reads its socket between the chunks of each 3 MiB clock-advance push (updates of the next
    tick may already be applied)."""
    rows, cols, ticks = 3072, 256, 5
    c = bosen_cluster(1, 3, staleness=0, tables={"W": {"rows": rows, "cols": cols, "dtype": "float32"}})

    def check(t: int, i: int, v: np.ndarray) -> None:
        seen = {t * (t + 1) / 2, (t + 1) * (t + 2) / 2} if i else {(t + 1) * (t + 2) / 2}
        assert (v == v[:, :1]).all() and set(np.unique(v[:, 0]).tolist()) <= seen, (t, i)

    one_writer_two_readers(c.path, rows, cols, ticks, check)
    st = c.status()[0]
    # (a loaded machine may advance two clocks with one push: at least one went in turns)
    assert st["pushes_in_turns"] >= 1 and st["push_stall_ms"]["n"] > st["pushes_in_turns"]
    assert st["errors"] == 0
    # CPU since start (bench.convergence's server CPU per MB out): some, and no more than the uptime allows
    assert 0 < st["cpu_s"] < 4 * st["uptime_s"] and st["bytes_out"] > ticks * rows * cols * 4


@pytest.mark.parametrize("push_to", ["readers", "subscribers"])
def test_budgeted_pushes_go_to_last_ticks_readers_and_the_clock_advance_to_everyone(bosen_cluster, push_to):
    """Clients 1 and 2 subscribe to rows A and B; in tick 1 client 1 reads only A and client 2 only B
    (their CLOCKs say so). Client 0's tick-2 updates of both then go early only to their last tick's
    readers (``push_to: readers``; to both subscribers with ``subscribers``), and the clock-advance
    push brings the rest: at staleness 0 a read at tick 3 must show every tick-2 update."""
    A, B, cols = 0, 1, 4
    c = bosen_cluster(1, 3, staleness=0, tables={"W": {"rows": 8, "cols": cols, "dtype": "float32"}},
                      comm={"client_bandwidth_mbps": 1000, "server_bandwidth_mbps": 1000, "push_to": push_to})
    clients = [Client.connect(c.path, rank=r) for r in range(3)]
    try:
        w, r1, r2 = (cl.table("W") for cl in clients)
        for t in (r1, r2):
            t.get_rows(np.array([A, B]))  # subscribed to both
        for cl in clients:
            cl.clock()  # tick 0 -> 1
        r1.get_row(A)
        r2.get_row(B)
        for cl in clients:
            cl.clock()  # tick 1 -> 2: the CLOCKs carry {A} and {B}
        for cl in clients:
            assert wait_until(lambda cl=cl: cl.stats()["server_clocks"] == [2], timeout=20)
        w.inc_rows(np.array([A, B]), np.ones((2, cols), np.float32))  # sent early (budgeted)
        assert wait_until(lambda: r1.get_row(A)[0] == 1.0, timeout=20)
        assert wait_until(lambda: r2.get_row(B)[0] == 1.0, timeout=20)
        early = [cl.stats()["rows_pushed_early_to_us"] for cl in clients[1:]]
        st = c.status()[0]
        if push_to == "readers":
            assert early == [1, 1] and st["rows_pushed_budgeted"] == 2
        else:
            assert wait_until(lambda: c.status()[0]["rows_pushed_budgeted"] == 4, timeout=20)
        for cl in clients:
            cl.clock()  # tick 2 -> 3: the clock-advance push
        for t in (r1, r2):  # staleness 0: every tick-2 update, at once
            np.testing.assert_array_equal(t.get_rows(np.array([A, B])), np.ones((2, cols), np.float32))
        st = c.status()[0]
        assert st["rows_pushed"] == 4 and st["errors"] == 0  # each row once to each subscriber
    finally:
        for cl in clients:
            cl.close()


def test_a_budgeted_push_to_readers_leaves_the_rest_to_the_clock_advance_push():
    """Clients mirror their own writes (a row only its writer changed skips it). Row 0, changed by
    client 0, read last tick by client 1; row 1, changed by 1, read by all; row 2, changed by 2, read by
    0. The budgeted push gives each row to its last tick's readers; rows 0 and 2 then still owe a
    subscriber (client 2, client 1) and stay dirty for the clock-advance push, which sends only that."""
    s = server(rows=4, push_to="readers")
    sent = capture(s)
    shard = s.shards[0]
    local = np.arange(3)
    for c in range(3):
        shard.subscribe(local, c)
        shard.set_recent(c, np.array({0: [1, 2], 1: [0, 1], 2: [1]}[c], np.int64))
    shard.skip_own = True
    for r in range(3):
        inc(s, np.array([r]), 1.0, client=r)
    assert s._push_budgeted(s._live()) > 0
    got = {i: rows_of(f, h["n"], 4)[0].tolist() for i, h, f in sent}
    assert got == {b"c0": [1, 2], b"c1": [0], b"c2": [1]}
    assert shard.dirty.tolist() == [True, False, True, False] and not shard.importance.any()
    assert s._push_budgeted(s._live()) == 0  # rows 0 and 2 are not picked again until they change
    sent.clear()
    s.client_clock[:] = 1
    s._maybe_advance()
    got = {i: rows_of(f, h["n"], 4)[0].tolist() for i, h, f in sent if h["t"] == Msg.ROWS}
    assert got == {b"c1": [2], b"c2": [0]} and not shard.dirty.any()
