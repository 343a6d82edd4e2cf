"""A replacement for a lost worker takes its rank over (server/daemon.py ``_rejoin``; docs/recovery.md,
"A lost worker is replaced"): a real server, driven by raw DEALERs speaking the wire."""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq
from rawpeer import Raw

from bosen import config as config_mod
from bosen.wire import Msg


def _clock(r: Raw, c: int) -> int:
    return r.send({"t": Msg.CLOCK, "c": c})


def _next(r: Raw) -> dict:
    """The next message but PINGs (a raw peer silent for 2 s gets them)."""
    while True:
        h, _ = r.recv()
        if h["t"] != Msg.PING:
            return h


def _quiet(r: Raw, timeout: float = 0.5) -> bool:
    """Nothing but PINGs arrives for ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        if r.silent(left):
            return True
        if r.recv()[0]["t"] != Msg.PING:
            return False
    return True


def _hello(ctx: zmq.Context, address: str, fp: str, rank: int, **extra: int) -> tuple[Raw, dict]:
    r = Raw(ctx, address)
    r.send({"t": Msg.HELLO, "rank": rank, "fp": fp, **extra})
    h, _ = r.recv()
    return r, h


@pytest.mark.timeout(60)
def test_a_replacement_keeps_the_ranks_clock_until_its_redo_passes_it(bosen_cluster) -> None:
    """Ranks 0 and 1 reach clock 3, rank 1 goes on to 5; rank 0's process dies and a replacement
    restored from clock 1 joins (HELLO rp=1): the rank's clock stays at 3 through the replacement's
    CLOCK(2) and CLOCK(3) (the server's too, so rank 1 is neither held back nor released early), and
    its CLOCK(4) moves it. A replacement whose checkpoint is newer than the server, or a bad ``rp``,
    is refused, naming why."""
    c = bosen_cluster(1, workers=2)
    fp = config_mod.load(c.path).fingerprint()
    ctx = zmq.Context()
    peers: list[Raw] = []
    try:
        a, h = _hello(ctx, c.addresses[0], fp, 0)
        b, _ = _hello(ctx, c.addresses[0], fp, 1)
        peers += [a, b]
        for k in (1, 2, 3):
            _clock(a, k)
            _clock(b, k)
        for k in (4, 5):
            _clock(b, k)
        for r in (a, b):  # SCLOCKs 1..3
            assert [r.recv()[0]["c"] for _ in range(3)] == [1, 2, 3]
        assert c.status()[0]["client_clocks"] == [3, 5]
        a.close()  # the process dies; the server has not noticed yet

        bad, h = _hello(ctx, c.addresses[0], fp, 0, rp=4)
        peers.append(bad)
        assert h["t"] == Msg.ERROR and "restored from clock 4, but this server is at clock 3" in h["m"], h
        a2, h = _hello(ctx, c.addresses[0], fp, 0, rp=1)
        peers.append(a2)
        assert h["t"] == Msg.WELCOME and h["rank"] == 0 and h["c"] == 3, h
        _clock(a2, 2)
        _clock(a2, 3)
        assert _quiet(a2) and _quiet(b), "the redo's CLOCKs below the rank's clock move nothing"
        st = c.status()[0]
        assert st["clock"] == 3 and st["client_clocks"] == [3, 5], st
        a2.bad("CLOCK: clock 1 goes back from 3", {"t": Msg.CLOCK, "c": 1})
        _clock(a2, 4)
        for r in (a2, b):
            h = _next(r)
            assert h["t"] == Msg.SCLOCK and h["c"] == 4, h
        assert c.status()[0]["client_clocks"] == [4, 5]
    finally:
        for r in peers:
            r.close()
        ctx.term()


@pytest.mark.timeout(60)
def test_a_replacement_with_a_bad_checkpoint_clock_is_refused(bosen_cluster) -> None:
    c = bosen_cluster(1, workers=1)
    fp = config_mod.load(c.path).fingerprint()
    ctx = zmq.Context()
    peers: list[Raw] = []
    try:
        r = Raw(ctx, c.addresses[0])
        peers.append(r)
        r.bad("restored from clock 2, but this server is at clock 0: that checkpoint is not this job's",
              {"t": Msg.HELLO, "rank": 0, "fp": fp, "rp": 2})
        r.bad("field 'rp' (the clock a replacement restarts from) must be an int >= 0",
              {"t": Msg.HELLO, "rank": 0, "fp": fp, "rp": -1})
    finally:
        for p in peers:
            p.close()
        ctx.term()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("hold", [True, False])
def test_hold_lost_keeps_a_lost_ranks_clock(bosen_cluster, hold: bool) -> None:
    """Rank 0 dies at clock 2 without BYE; the server notices (its PING fails) and, under
    ``--hold-lost``, keeps the rank's clock at 2, so rank 1's CLOCKs 3..5 do not move the server's;
    without it the rank counts as gone and the server's clock follows rank 1."""
    c = bosen_cluster(1, workers=2, server_args=["--hold-lost"] if hold else [])
    fp = config_mod.load(c.path).fingerprint()
    ctx = zmq.Context()
    peers: list[Raw] = []
    try:
        a, _ = _hello(ctx, c.addresses[0], fp, 0)
        b, _ = _hello(ctx, c.addresses[0], fp, 1)
        peers += [a, b]
        for k in (1, 2):
            _clock(a, k)
            _clock(b, k)
        assert [b.recv()[0]["c"] for _ in range(2)] == [1, 2]
        a.close()
        deadline = time.monotonic() + 20
        while c.status()[0]["clients_lost"] == 0:  # PINGed after 2 s of silence
            assert time.monotonic() < deadline, "the server never noticed the lost client"
            time.sleep(0.1)
        for k in (3, 4, 5):
            _clock(b, k)
        if hold:
            assert _quiet(b, 1.0)
            st = c.status()[0]
            assert st["clock"] == 2 and st["client_clocks"] == [2, 5], st
        else:
            assert [_next(b)["c"] for _ in range(3)] == [3, 4, 5]
    finally:
        for r in peers:
            r.close()
        ctx.term()


@pytest.mark.timeout(60)
def test_ranks_that_left_unblock_a_server_that_waits_for_them(bosen_cluster) -> None:
    """LEFT (from the launcher: workers that said BYE to a server lost since, then exited) lets a
    replacement's clock go on without them; a connected rank cannot be declared gone, bad ranks are
    refused, and a LEFT repeated changes nothing."""
    c = bosen_cluster(1, workers=2)
    fp = config_mod.load(c.path).fingerprint()
    ctx = zmq.Context()
    a, h = _hello(ctx, c.addresses[0], fp, 0)
    boss = Raw(ctx, c.addresses[0])
    try:
        assert h["t"] == Msg.WELCOME
        _clock(a, 1)
        _clock(a, 2)
        assert _quiet(a)  # rank 1 never came: the server's clock waits at 0
        assert boss.bad("worker rank 0 is in the job", {"t": Msg.LEFT, "r": [0]})
        assert boss.bad("must list worker ranks", {"t": Msg.LEFT, "r": [5]})
        assert boss.bad("must list worker ranks", {"t": Msg.LEFT, "r": ["1"]})
        for _ in range(2):
            s = boss.send({"t": Msg.LEFT, "r": [1]})
            assert boss.recv()[0] == {"t": Msg.ACK, "rq": s}
        got = _next(a)
        assert got["t"] == Msg.SCLOCK and got["c"] == 2, got
        assert c.status()[0]["client_clocks"] == [2, "left"]
    finally:
        a.close()
        boss.close()
        ctx.term()
    c.check()


@pytest.mark.timeout(90)
def test_a_part_saved_before_a_take_back_is_corrected_and_a_worker_lost_after_the_server_is_taken_back_exactly(
        bosen_cluster, tmp_path) -> None:
    """Worker rank 1 is replaced from clock 2 while the server's part of clock 4 already holds its updates
    of ticks 2 and 3: the take-back writes a correction beside that part. The server is then lost; the
    newest complete checkpoint is 2 (the workers' parts of 4 never came), so its replacement restores
    its part of 2, not of 4, and every rank resends from 2. Worker rank 0 is then lost too and replaced
    from 2: the server takes back all of its ticks 2..5, and after the redo the table holds exactly the
    counts of a run without either loss (restored from 4, rank 0's ticks 2 and 3 would be in its values,
    not in its take-back log, and count twice: 8 instead of 6). The server lost once more, once 6 is
    complete, is restored from its part of 6 with the correction for rank 0 taken out again."""
    import signal

    from bosen import checkpoint
    from bosen.jobs import status as status_mod
    from bosen.jobs.job import job_config

    data = job_config([], 2, tables={"W": {"rows": 2, "cols": 1, "dtype": "int64"}})
    data["checkpoint"] = {"every_clocks": 2, "dir": str(tmp_path / "ck"), "keep": 10}
    c = bosen_cluster(1, config=data, server_args=["--hold-lost"])
    cfg = config_mod.load(c.path)
    fp = cfg.fingerprint()
    ctx = zmq.Context()
    peers: list[Raw] = []

    def inc(r: Raw, row: int, v: int) -> None:
        r.send({"t": Msg.INC, "tb": 0, "n": 1, "dt": "int64", "sp": False}, np.array([row], np.int64),
               np.array([[v]], np.int64))

    def ticks(r: Raw, row: int, v: int, first: int, last: int) -> None:
        for t in range(first, last):
            inc(r, row, v)
            _clock(r, t + 1)

    def wait_part(clock: int) -> None:
        meta = tmp_path / "ck" / f"clock-{clock:08d}" / "server-0" / "meta.json"
        deadline = time.monotonic() + 30
        while not meta.exists():
            assert time.monotonic() < deadline, f"no part at clock {clock}"
            time.sleep(0.02)

    def read(r: Raw) -> np.ndarray:
        s = r.send({"t": Msg.READ, "tb": 0, "n": 2, "c": 0}, np.array([0, 1], np.int64))
        while True:
            got, frames = r.recv()
            if got["t"] == Msg.ROWS and got.get("rq") == s:
                return np.frombuffer(frames[1], np.int64)

    try:
        a, _ = _hello(ctx, c.addresses[0], fp, 0)
        b, _ = _hello(ctx, c.addresses[0], fp, 1)
        peers += [a, b]
        for t in range(4):  # ticks 0-3: rank 0 adds 1 to row 0, rank 1 adds 10 to row 1
            ticks(a, 0, 1, t, t + 1)
            ticks(b, 1, 10, t, t + 1)
        wait_part(4)
        for rank in (0, 1):  # the workers' parts of clock 2 (not of 4): the newest complete checkpoint is 2
            checkpoint.write_part(tmp_path / "ck", 2, "worker", rank, {"tick": np.array([2])}, {},
                                  checkpoint.model_fingerprint(cfg), workers=2)
        b2, h = _hello(ctx, c.addresses[0], fp, 1, rp=2)  # rank 1 replaced from the checkpoint at clock 2
        peers.append(b2)
        assert h["t"] == Msg.WELCOME, h
        assert (tmp_path / "ck" / "clock-00000004" / "redo.server-0.rank-1.npz").exists()
        assert not (tmp_path / "ck" / "clock-00000002" / "redo.server-0.rank-1.npz").exists()
        c.stop_server(0, signal.SIGKILL)
        c.replace_server(0, ["--resume", str(tmp_path / "ck"), "--recover"])
        a2, h0 = _hello(ctx, c.addresses[0], fp, 0)
        b3, h1 = _hello(ctx, c.addresses[0], fp, 1)
        peers += [a2, b3]
        assert h1["rc"] == 2, h1  # rank 1's ticks 2 and 3 were taken back: it resends (redoes) them
        # what the replacement restored: each rank's ticks below the clock its resend starts at
        np.testing.assert_array_equal(read(a2), [h0["rc"], 20])
        ticks(a2, 0, 1, h0["rc"], 4)  # rank 0 resends what it sent since that clock, rank 1 redoes 2 and 3
        ticks(b3, 1, 10, 2, 4)
        ticks(a2, 0, 1, 4, 6)  # both run ticks 4 and 5: the replacement server's own part of clock 6
        ticks(b3, 1, 10, 4, 6)
        wait_part(6)
        np.testing.assert_array_equal(read(a2), [6, 60])
        # restored from the newest complete checkpoint: a worker's replacement from 2 is taken back whole
        assert status_mod.query(c.addresses[0], timeout=10.0)["take_back_from"] == 2
        # then rank 0 is lost and replaced from clock 2 (still the newest complete checkpoint): the take-back
        # makes this server's part of 6 stale and its predecessor's part of 4 too (a file it did not write,
        # found on disk, and kept: the replacement did not save 4 again)
        a3, h = _hello(ctx, c.addresses[0], fp, 0, rp=2)
        peers.append(a3)
        assert h["t"] == Msg.WELCOME, h
        ticks(a3, 0, 1, 2, 6)  # its redo
        # exact: the counts of a run without either loss (each rank's six ticks once)
        np.testing.assert_array_equal(read(a3), [6, 60])
        assert h0["rc"] == 2, h0  # every rank resent from the newest complete checkpoint
        for clock in (4, 6):
            assert (tmp_path / "ck" / f"clock-0000000{clock}" / "redo.server-0.rank-0.npz").exists(), clock
        out = c.servers[0].output()
        assert "restores its part of the newest complete checkpoint (clock 2), not its newest part (clock 4)" \
            in out, out[-2000:]
        assert "are in the values this server started from" not in out, out[-2000:]
        assert "Traceback" not in out
        # the workers' parts of 6 come: 6 is complete, and its server part holds rank 0's lost ticks 2..5
        # (corrected beside it). The server is lost again: its replacement restores 6, takes the correction
        # out, and rank 0 resends its redo from 2, rank 1 from 6
        for rank in (0, 1):
            checkpoint.write_part(tmp_path / "ck", 6, "worker", rank, {"tick": np.array([6])}, {},
                                  checkpoint.model_fingerprint(cfg), workers=2)
        c.stop_server(0, signal.SIGKILL)
        c.replace_server(0, ["--resume", str(tmp_path / "ck"), "--recover"])
        a4, h0 = _hello(ctx, c.addresses[0], fp, 0)
        b4, h1 = _hello(ctx, c.addresses[0], fp, 1)
        peers += [a4, b4]
        assert (h0["rc"], h1["rc"]) == (2, 6), (h0, h1)
        np.testing.assert_array_equal(read(a4), [2, 60])
        ticks(a4, 0, 1, 2, 6)
        np.testing.assert_array_equal(read(a4), [6, 60])
    finally:
        for r in peers:
            r.close()
        ctx.term()


@pytest.mark.timeout(90)
def test_a_boundary_reached_while_a_lost_worker_awaits_its_replacement_is_saved_after_its_redo(bosen_cluster,
                                                                                              tmp_path) -> None:
    """Under a time rule that picks nothing by itself, the launcher asks for a part at clock 4 (SAVE: a
    scale-in's boundary): ACK ok; a clock that is no boundary is refused, one passed unsaved answers not
    ok. Rank 0 sends CLOCK(4) and is lost; rank 1 then brings the server to 4 while rank 0's replacement
    has not joined: the part is deferred, not written (it would hold rank 0's updates that the
    replacement's take-back removes), and rank 1's tick-4 update is held. The replacement (restored from
    clock 0) redoes its ticks with other values; at its CLOCK(4) the part is written with exactly the
    redone updates and rank 1's ticks 0-3, and rank 1's held update is applied after it."""
    from bosen import checkpoint
    from bosen.jobs.job import job_config

    data = job_config([], 2, tables={"W": {"rows": 2, "cols": 1, "dtype": "int64"}})
    base = tmp_path / "ck"
    data["checkpoint"] = {"every_clocks": 2, "every_s": 3600.0, "dir": str(base), "keep": 10}
    c = bosen_cluster(1, config=data, server_args=["--hold-lost"])
    fp = config_mod.load(c.path).fingerprint()
    ctx = zmq.Context()
    peers: list[Raw] = []

    def inc(r: Raw, row: int, v: int) -> None:
        r.send({"t": Msg.INC, "tb": 0, "n": 1, "dt": "int64", "sp": False}, np.array([row], np.int64),
               np.array([[v]], np.int64))

    def save(clock: int) -> dict:
        ctl.send({"t": Msg.SAVE, "c": clock})
        return ctl.recv()[0]

    def until(what, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not what():
            assert time.monotonic() < deadline, what
            time.sleep(0.02)

    try:
        ctl = Raw(ctx, c.addresses[0])
        a, _ = _hello(ctx, c.addresses[0], fp, 0)
        b, _ = _hello(ctx, c.addresses[0], fp, 1)
        peers += [ctl, a, b]
        h = save(4)
        assert h["t"] == Msg.ACK and h["ok"] is True, h
        ctl.bad("SAVE: clock 3 is not a checkpoint boundary (every 2 clocks)", {"t": Msg.SAVE, "c": 3})
        for t in range(4):  # rank 0: ticks 0-3, row 0 += 1 each; it then waits at 4
            inc(a, 0, 1)
            _clock(a, t + 1)
        for t in range(3):  # rank 1: ticks 0-2, row 1 += 10 each
            inc(b, 1, 10)
            _clock(b, t + 1)
        until(lambda: c.status()[0]["clock"] == 3)
        h = save(2)  # passed without a part (nobody picked it)
        assert h["t"] == Msg.ACK and h["ok"] is False, h
        a.close()  # rank 0's process dies after its CLOCK(4)
        until(lambda: c.status()[0]["awaiting_replacement"] == [0])
        inc(b, 1, 10)  # tick 3
        _clock(b, 4)
        until(lambda: c.status()[0]["clock"] == 4)
        st = c.status()[0]
        assert st["checkpoints"]["deferred"] == 4 and st["checkpoints_deferred"] == 1, st["checkpoints"]
        part = checkpoint.clock_dir(base, 4) / "server-0" / checkpoint.META
        assert not part.exists()
        assert save(4)["ok"] is True  # it is coming
        inc(b, 1, 10)  # tick 4: held until the part is saved
        _clock(b, 5)
        a2, h = _hello(ctx, c.addresses[0], fp, 0, rp=0)
        peers.append(a2)
        assert h["t"] == Msg.WELCOME, h
        for t in range(4):  # the redo: other values than the lost process's
            inc(a2, 0, 100)
            _clock(a2, t + 1)
        until(part.exists)
        arrays = checkpoint.read_part(part.parent).load()
        np.testing.assert_array_equal(arrays["t0.values"][np.argsort(arrays["t0.rows"])], [[400], [40]])
        until(lambda: c.status()[0]["client_clocks"] == [4, 5])
        st = c.status()[0]
        assert st["checkpoints"]["deferred"] is None, st["checkpoints"]
        s = a2.send({"t": Msg.READ, "tb": 0, "n": 2, "c": 0}, np.array([0, 1], np.int64))
        while True:
            got, frames = a2.recv()
            if got["t"] == Msg.ROWS and got.get("rq") == s:
                break
        np.testing.assert_array_equal(np.frombuffer(frames[1], np.int64), [400, 50])  # the held tick 4 too
        assert "Traceback" not in c.servers[0].output()
    finally:
        for r in peers:
            r.close()
        ctx.term()


def _answer(r: Raw, seq: int) -> dict:
    """The reply to message ``seq`` (SCLOCKs, ACKs of other messages and PINGs skipped)."""
    while True:
        h, _ = r.recv()
        if h.get("rq") == seq:
            return h


@pytest.mark.timeout(90)
def test_a_rank_that_ended_its_clocks_holds_nobody_back_and_a_replacement_takes_its_resend(bosen_cluster,
                                                                                           tmp_path) -> None:
    """Rank 1 ends its clocks at 4 (BYE ``fc``=4: a scale-in's leaver, connected until it may leave)
    while at clock 3: the server's clock waits for its CLOCK(4), then goes on with rank 0 alone, no
    BYE needed. A clock past 4, or another ``fc``, is refused, naming why. The server is then lost and
    restored from its part of clock 2 (the parts of 4 and 6 removed: not yet on disk): rank 1 rejoins
    with HELLO ``fc``=4, its clock holds the replacement back until what it resends reaches 4, and the
    rows hold every update of both ranks exactly once."""
    import shutil
    import signal

    from bosen.jobs.job import job_config

    data = job_config([], 2, tables={"W": {"rows": 2, "cols": 1, "dtype": "int64"}})
    data["checkpoint"] = {"every_clocks": 2, "dir": str(tmp_path / "ck"), "keep": 10}
    c = bosen_cluster(1, config=data)
    fp = config_mod.load(c.path).fingerprint()
    ctx = zmq.Context()
    peers: list[Raw] = []

    def tick(r: Raw, row: int, v: int, clock: int) -> None:  # one tick: an update, then the clock
        r.send({"t": Msg.INC, "tb": 0, "n": 1, "dt": "int64", "sp": False}, np.array([row], np.int64),
               np.array([[v]], np.int64))
        _clock(r, clock)

    def server_clock(want: int) -> None:
        deadline = time.monotonic() + 20
        while (got := c.status()[0]["clock"]) != want:
            assert got < want and time.monotonic() < deadline, (got, want)
            time.sleep(0.02)

    try:
        a, _ = _hello(ctx, c.addresses[0], fp, 0)
        b, _ = _hello(ctx, c.addresses[0], fp, 1)
        peers += [a, b]
        for t in range(3):  # ticks 0-2: rank 0 adds 1 to row 0, rank 1 adds 10 to row 1
            tick(a, 0, 1, t + 1)
            tick(b, 1, 10, t + 1)
        s = b.send({"t": Msg.BYE, "fc": 4})
        assert _answer(b, s)["t"] == Msg.BYE_OK
        assert "below clock 3" in _answer(b, b.send({"t": Msg.BYE, "fc": 2}))["m"]
        for t in range(3, 6):  # rank 0 runs on to clock 6 (its ticks past 4 held until the server is there)
            tick(a, 0, 1, t + 1)
        server_clock(3)
        time.sleep(0.3)
        assert c.status()[0]["clock"] == 3  # rank 1, at 3, still counts
        tick(b, 1, 10, 4)  # its last tick: from CLOCK(4) on it holds nobody back
        server_clock(6)
        st = c.status()[0]
        assert (st["client_clocks"], st["final_clocks"], st["left_at"]) == ([6, 4], [None, 4], [None, 4]), st
        assert "past 4, the last clock" in _answer(b, _clock(b, 5))["m"]
        assert "said its last clock is 4" in _answer(b, b.send({"t": Msg.BYE, "fc": 5}))["m"]
        meta = tmp_path / "ck" / "clock-00000006" / "server-0" / "meta.json"
        deadline = time.monotonic() + 20
        while not meta.exists():
            assert time.monotonic() < deadline, "no part at clock 6"
            time.sleep(0.02)
        c.stop_server(0, signal.SIGKILL)
        for clock in (4, 6):
            shutil.rmtree(tmp_path / "ck" / f"clock-{clock:08d}")
        c.replace_server(0, ["--resume", str(tmp_path / "ck"), "--recover"])
        a2, h0 = _hello(ctx, c.addresses[0], fp, 0, cs=6)
        b2, h1 = _hello(ctx, c.addresses[0], fp, 1, cs=4, fc=4)
        peers += [a2, b2]
        assert (h0["rc"], h1["rc"]) == (2, 2), (h0, h1)
        for t in range(2, 6):  # rank 0 resends its ticks 2-5
            tick(a2, 0, 1, t + 1)
        tick(b2, 1, 10, 3)  # rank 1 resends tick 2: the replacement waits for its tick 3
        server_clock(3)
        time.sleep(0.3)  # what would move it has been handled by now (rank 0's resend, in order before it)
        assert c.status()[0]["clock"] == 3
        tick(b2, 1, 10, 4)
        server_clock(6)
        s = a2.send({"t": Msg.READ, "tb": 0, "n": 2, "c": 0}, np.array([0, 1], np.int64))
        while True:
            got, frames = a2.recv()
            if got["t"] == Msg.ROWS and got.get("rq") == s:
                break
        np.testing.assert_array_equal(np.frombuffer(frames[1], np.int64), [6, 40])  # each update once
        assert c.status()[0]["final_clocks"] == [None, 4]
        assert "Traceback" not in c.servers[0].output()
    finally:
        for r in peers:
            r.close()
        ctx.term()
