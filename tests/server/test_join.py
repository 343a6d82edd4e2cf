"""A worker joins a running job as a new rank (server/daemon.py ``_join``, HELLO ``jn``; ``bosen scale``):
a real server, driven by raw DEALERs speaking the wire."""

from __future__ import annotations

import numpy as np
import pytest
import zmq
from rawpeer import Raw
from test_rejoin import _clock, _hello, _next, _quiet

from bosen import config as config_mod
from bosen.wire import Msg


@pytest.mark.timeout(60)
def test_a_worker_joins_as_the_next_rank_at_a_clock_that_holds_nobody_back(bosen_cluster) -> None:
    """Rank 0 (of 1) reaches clock 2; a worker joins at clock 3 as rank 1 (the next: server 0 assigns it
    to rank -1): the server's clock stays 2 (the newcomer is ahead of it), its per-client state grows
    (its reads are answered, its updates applied), and the clock moves only as both pass it. A join
    below the server's clock, or as a rank that is taken, is refused naming why; a rank that left by BYE
    holds nobody back and is never given out again; joiners may come in any order."""
    c = bosen_cluster(1, workers=1, tables={"t": {"rows": 8, "cols": 2, "dtype": "int64"}})
    fp = config_mod.load(c.path).fingerprint()
    ctx = zmq.Context()
    peers: list[Raw] = []
    try:
        a, h = _hello(ctx, c.addresses[0], fp, 0)
        peers.append(a)
        _clock(a, 1)
        _clock(a, 2)
        assert [a.recv()[0]["c"] for _ in range(2)] == [1, 2]

        late = Raw(ctx, c.addresses[0])
        peers.append(late)
        late.bad("a worker joining at clock 1, but this server is at clock 2 already",
                 {"t": Msg.HELLO, "rank": -1, "fp": fp, "jn": 1})
        late.bad("worker rank 0 is taken (ranks are never reused): a joining worker takes a new one, 1 or above",
                 {"t": Msg.HELLO, "rank": 0, "fp": fp, "jn": 3})
        late.bad("field 'jn' (the clock a joining worker starts at) must be an int >= 0",
                 {"t": Msg.HELLO, "rank": -1, "fp": fp, "jn": -2})

        b, h = _hello(ctx, c.addresses[0], fp, -1, jn=3)
        peers.append(b)
        assert h["t"] == Msg.WELCOME and h["rank"] == 1 and h["c"] == 2, h
        st = c.status()[0]
        assert st["clock"] == 2 and st["client_clocks"] == [2, 3], st
        # the newcomer's update and read go through its new per-client state
        rows = np.array([4], np.int64)
        b.send({"t": Msg.INC, "tb": 0, "n": 1, "dt": "int64", "sp": False}, rows, np.array([[5, 7]], np.int64))
        assert _next(b)["t"] == Msg.ACK
        _clock(a, 3)  # both at 3 now: the server's clock moves to 3
        for r in (a, b):
            h = _next(r)
            assert h["t"] == Msg.SCLOCK and h["c"] == 3, h
        _clock(a, 4)
        assert _quiet(a) and _quiet(b, 0.2), "the clock waits for rank 1's CLOCK(4)"
        _clock(b, 4)
        for r in (a, b):
            h = _next(r)
            assert h["t"] == Msg.SCLOCK and h["c"] == 4, h
        b.send({"t": Msg.READ, "tb": 0, "n": 1, "c": 4}, rows)
        h, frames = b.recv()
        assert h["t"] == Msg.ROWS and np.frombuffer(frames[1], np.int64).tolist() == [5, 7], h

        b.send({"t": Msg.BYE})
        assert _next(b)["t"] == Msg.BYE_OK
        _clock(a, 5)
        assert _next(a)["c"] == 5, "a rank that left holds nobody back"
        again = Raw(ctx, c.addresses[0])
        peers.append(again)
        again.bad("worker rank 1 is taken", {"t": Msg.HELLO, "rank": 1, "fp": fp, "jn": 6})
        # two join at once, the later rank first: rank 2 stays free (holding nobody back) until it joins
        d, h = _hello(ctx, c.addresses[0], fp, 3, jn=6)
        peers.append(d)
        assert h["t"] == Msg.WELCOME and h["rank"] == 3, h
        assert c.status()[0]["client_clocks"] == [5, "left", "left", 6]
        e, h = _hello(ctx, c.addresses[0], fp, -1, jn=6)  # server 0's next: 4
        peers.append(e)
        assert h["t"] == Msg.WELCOME and h["rank"] == 4, "ranks are never reused"
        f, h = _hello(ctx, c.addresses[0], fp, 2, jn=6)
        peers.append(f)
        assert h["t"] == Msg.WELCOME and h["rank"] == 2, h
        assert c.status()[0]["client_clocks"] == [5, "left", 6, 6, 6]
    finally:
        for r in peers:
            r.close()
        ctx.term()
