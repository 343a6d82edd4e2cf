"""server/moves.py: a partition move's ``wait`` step against a real server, driven by hand-made peers
(tests/bosen/jobs/test_moves.py moves partitions under real clients)."""

from __future__ import annotations

import pytest
import zmq
from rawpeer import Raw

from bosen import config as config_mod
from bosen import wire
from bosen.wire import Msg


def _step(mover: Raw, op: str, version: int) -> int:
    mover.seq += 1
    mover.send_frames(wire.encode_arrays({"t": Msg.MOVE, "s": mover.seq, "op": op, "mv": version}, {}))
    return mover.seq


def _answered(mover: Raw, seq: int) -> dict:
    h, _ = mover.recv()
    assert h["t"] == Msg.MOVE_REPLY and h["rq"] == seq, h
    return h


def _plan(mover: Raw, version: int, clients: list[Raw]) -> None:
    _answered(mover, _step(mover, "plan", version))
    for c in clients:
        h, _ = c.recv()
        assert h["t"] == Msg.PLAN and h["mv"] == version, h


@pytest.mark.timeout(60)
def test_a_move_waits_for_no_rank_that_left_or_finished_without_connecting(bosen_cluster):
    """Two servers, three worker ranks: rank 2 finished (BYE to server 0) without ever connecting to
    server 1 (as to a server that joined the job after its STATUS counted the rank). Server 1's
    ``wait`` is answered once LEFT names rank 2 (the launcher's, when that rank's process ends), and in
    a second move each server's once rank 1, the last not paused, says BYE there. Neither advances a
    server's clock, which was the only other time a wait was looked at again: it used to wait until
    the mover gave up. PLAN goes to connected ranks only."""
    c = bosen_cluster(2, workers=3)
    fp = config_mod.load(c.path).fingerprint()
    ctx = zmq.Context()
    peers: list[Raw] = []
    try:
        a0, a1, b0, b1, c0, m0, m1, launcher = (Raw(ctx, c.addresses[j]) for j in (0, 1, 0, 1, 0, 0, 1, 1))
        peers += [a0, a1, b0, b1, c0, m0, m1, launcher]
        for rank, p in ((0, a0), (0, a1), (1, b0), (1, b1), (2, c0)):
            p.send({"t": Msg.HELLO, "rank": rank, "fp": fp})
            assert p.recv()[0]["t"] == Msg.WELCOME
        s = c0.send({"t": Msg.BYE})
        assert c0.recv()[0] == {"t": Msg.BYE_OK, "rq": s}
        _plan(m0, 1, [a0, b0])
        assert c0.silent(), "PLAN to a rank that left"
        for p in (a0, a1, b0, b1):
            p.send({"t": Msg.PAUSED, "mv": 1})
        waits = [_step(m0, "wait", 1), _step(m1, "wait", 1)]
        assert "held" not in _answered(m0, waits[0])
        assert m1.silent(), "server 1 answered while rank 2 is in the job there"
        launcher.send({"t": Msg.LEFT, "r": [2]})
        assert launcher.recv()[0]["t"] == Msg.ACK
        assert "held" not in _answered(m1, waits[1])
        for m in (m0, m1):
            _answered(m, _step(m, "abort", 1))
        for p in (a0, b0):
            h, _ = p.recv()
            assert h["t"] == Msg.PLAN and h.get("x") is True, h  # given up: the clients resume
        _plan(m0, 2, [a0, b0])
        for p in (a0, a1):
            p.send({"t": Msg.PAUSED, "mv": 2})
        waits = [_step(m0, "wait", 2), _step(m1, "wait", 2)]
        assert m0.silent() and m1.silent(), "answered while rank 1 has not paused"
        for p in (b0, b1):
            s = p.send({"t": Msg.BYE})
            assert p.recv()[0] == {"t": Msg.BYE_OK, "rq": s}
        for m, w in zip((m0, m1), waits, strict=True):
            assert "held" not in _answered(m, w)
        assert [st["client_clocks"] for st in c.status()] == [[0, "left", "left"]] * 2
        for m in (m0, m1):
            _answered(m, _step(m, "abort", 2))
    finally:
        for p in peers:
            p.close()
        ctx.term()
    c.check()
