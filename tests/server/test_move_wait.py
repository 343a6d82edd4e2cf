"""server/moves.py: a partition move's ``wait`` step against a real server, driven by hand-made peers
(tests/bosen/jobs/test_moves.py moves partitions under real clients)."""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import pytest
import zmq
from rawpeer import Raw

from bosen import config as config_mod
from bosen import wire
from bosen.errors import BosenError
from bosen.jobs.job import job_config
from bosen.jobs.moves import current_map, move_partitions
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


@pytest.mark.timeout(60)
def test_plans_that_keep_meeting_a_checkpoint_boundary_are_retried_until_the_moves_timeout(bosen_cluster, tmp_path):
    """One server checkpointing every clock, rank 0 clocked past the boundary that rank 1 has not reached:
    its CLOCK is held there for good, so every plan meets a boundary. The mover (``move_partitions``)
    gives each plan up and tries again after a backoff until its timeout, not after a fixed count of
    plans (a legitimate scale under load used to fail after five), and its error says how many plans
    met a boundary and for how long it tried. The hand-made clients pause on each PLAN."""
    data = job_config([], 2, tables={"W": {"rows": 4, "cols": 1}}, partitions=2)
    data["checkpoint"] = {"every_clocks": 1, "dir": str(tmp_path / "ck")}
    c = bosen_cluster(1, config=data)
    cfg = config_mod.load(c.path)
    fp = cfg.fingerprint()
    ctx = zmq.Context()
    peers = [Raw(ctx, c.addresses[0]), Raw(ctx, c.addresses[0])]
    stop = threading.Event()
    plans: list[int] = []

    def pause() -> None:  # each client pauses on every plan, as a real one does after its next clock
        poller = zmq.Poller()
        for p in peers:
            poller.register(p.sock, zmq.POLLIN)
        while not stop.is_set():
            for sock, _ in poller.poll(50):
                p = next(q for q in peers if q.sock is sock)
                h, _ = p.recv()
                if h["t"] == Msg.PLAN and not h.get("x"):
                    plans.append(h["mv"])  # to both clients, each plan
                    p.send({"t": Msg.PAUSED, "mv": h["mv"]})

    t = threading.Thread(target=pause)
    try:
        for rank, p in enumerate(peers):
            p.send({"t": Msg.HELLO, "rank": rank, "fp": fp})
            assert p.recv()[0]["t"] == Msg.WELCOME
        peers[0].send({"t": Msg.CLOCK, "c": 1})
        peers[0].send({"t": Msg.CLOCK, "c": 2})  # past the boundary at 1, which rank 1 has not reached: held
        deadline = time.monotonic() + 20
        while c.status()[0]["checkpoints"]["held_clients"] != 1:
            assert time.monotonic() < deadline, c.status()[0]["checkpoints"]
            time.sleep(0.02)
        t.start()
        start = time.monotonic()
        with pytest.raises(BosenError, match=r"could not move within 2s: (\d+) plans in [\d.]+s, \1 met a checkpoint "
                                             r"boundary") as e:
            move_partitions(cfg, np.zeros(2, dtype=np.int32), timeout=2.0)
        took = time.monotonic() - start
        tries = int(re.search(r"(\d+) plans", str(e.value)).group(1))
        assert tries >= 3 and len(plans) == 2 * tries and took >= 1.0, (str(e.value), plans, took)
        assert current_map(cfg)[0] == 0  # nothing moved
    finally:
        stop.set()
        if t.is_alive():
            t.join(timeout=10)
        for p in peers:
            p.close()
        ctx.term()
    c.check()
