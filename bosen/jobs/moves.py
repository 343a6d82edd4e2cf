"""Move partitions between a running job's servers (docs/design.md, "Partitions"): the steps that
``server/moves.py`` answers, driven from outside the job over each server's own socket, as
``bosen status`` asks. Synchronous, no loop.

``move_partitions(config, owner)`` gives partition ``p`` to server ``owner[p]``: server 0 tells the
clients to pause after their next clock, every server waits until each client paused (a FIFO fence:
everything sent before is applied), the servers losing partitions export their rows, every server
takes the new map with the rows it gains and tells its clients, and the clients go on under the new
map. A plan that meets clients paused on both sides of a checkpoint boundary is given up and tried
again a clock later. The workers compute on throughout; only their sends wait (``pause_s``).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq

from bosen import wire
from bosen.config import Config
from bosen.errors import BosenError
from bosen.jobs import status as status_mod
from bosen.wire import Msg

RETRIES = 5  # plans given up at a checkpoint boundary before the move fails


@dataclass(frozen=True)
class MoveReport:
    version: int  # the new map's
    moved: int  # partitions that changed server
    bytes: int  # row data that travelled
    pause_s: float  # from the plan to the last server's new map: how long clients held their sends
    wait_s: float  # of which: waiting for every client to pause,
    export_s: float  # the rows of leaving partitions coming out (and over to here),
    map_s: float  # every server laying its rows out for the new map (and the rows going there)
    tries: int


class _Mover:
    def __init__(self, config: Config, timeout: float) -> None:
        self.servers = list(config.cluster.servers)
        self.timeout = timeout
        self.ctx = zmq.Context()
        self.socks = []
        for addr in self.servers:
            s = self.ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(f"tcp://{addr}")
            self.socks.append(s)
        self.seq = itertools.count(1)

    def close(self) -> None:
        for s in self.socks:
            s.close()
        self.ctx.term()

    def send(self, j: int, op: str, version: int, arrays: dict[str, np.ndarray] | None = None) -> int:
        seq = next(self.seq)
        self.socks[j].send_multipart(wire.encode_arrays({"t": Msg.MOVE, "s": seq, "op": op, "mv": version},
                                                        arrays or {}))
        return seq

    def reply(self, j: int, seq: int, timeout: float | None = None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        wait = self.timeout if timeout is None else timeout
        if not self.socks[j].poll(int(wait * 1000)):
            raise BosenError(f"server {j} ({self.servers[j]}): no answer to the partition move within {wait:g}s")
        frames = self.socks[j].recv_multipart(copy=False)
        h = wire.decode_header(frames[0])
        if h["t"] == Msg.ERROR:
            raise BosenError(f"server {j} ({self.servers[j]}) refused the partition move: {h['m']}")
        if h["t"] != Msg.MOVE_REPLY or h["rq"] != seq:
            raise BosenError(f"server {j} ({self.servers[j]}): unexpected {h['t'].name} to a partition move")
        wire.check_frames(h, len(frames) - 1)
        return h, wire.decode_arrays(h, frames[1:])  # views of the frames, which they keep alive

    def ask(self, j: int, op: str, version: int, arrays: dict[str, np.ndarray] | None = None,
            timeout: float | None = None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        return self.reply(j, self.send(j, op, version, arrays), timeout)


def current_map(config: Config, timeout: float = 5.0) -> tuple[int, np.ndarray]:
    """The partition map the job's servers follow now: (version, owner per partition)."""
    stats = [status_mod.query(addr, timeout=timeout) for addr in config.cluster.servers]
    versions = {s["partitions"]["version"] for s in stats}
    if len(versions) != 1:
        raise BosenError(f"servers follow different partition maps (versions {sorted(versions)}): a move is "
                         "under way or was cut off")
    return versions.pop(), np.asarray(stats[0]["partitions"]["owner"], dtype=np.int32)


def move_partitions(config: Config, owner: np.ndarray, timeout: float = 60.0) -> MoveReport:
    """Give partition ``p`` to server ``owner[p]`` in the running job of ``config``."""
    version, old = current_map(config)
    owner = np.asarray(owner, dtype=np.int32)
    servers = len(config.cluster.servers)
    if owner.shape != old.shape or (owner.shape[0] and (owner.min() < 0 or owner.max() >= servers)):
        raise ValueError(f"owner: one server in [0, {servers}) for each of the {old.shape[0]} partitions")
    new = version + 1
    mover = _Mover(config, timeout)
    tries = 0
    try:
        while True:
            tries += 1
            t0 = time.perf_counter()
            mover.ask(0, "plan", new)
            seqs = [mover.send(j, "wait", new) for j in range(servers)]
            answers = [mover.reply(j, seq)[0] for j, seq in enumerate(seqs)]
            wait_s = time.perf_counter() - t0
            if not any(a.get("held") for a in answers):
                break
            mover.ask(0, "abort", new)  # clients paused on both sides of a checkpoint boundary
            for j in range(1, servers):
                mover.ask(j, "abort", new)
            if tries == RETRIES:
                raise BosenError(f"partitions could not move: {RETRIES} plans met a checkpoint boundary between "
                                 "the workers' clocks")
            time.sleep(0.05)
        incoming: list[dict[str, np.ndarray]] = [{} for _ in range(servers)]
        nbytes = 0
        t1 = time.perf_counter()
        asked = {}  # every server that loses partitions exports at once
        for j in range(servers):
            leaving = np.flatnonzero((old == j) & (owner != j))
            if leaving.shape[0]:
                asked[j] = mover.send(j, "export", new, {"parts": leaving.astype(np.int64)})
        for j, seq in asked.items():
            _, rows = mover.reply(j, seq)
            nbytes += sum(a.nbytes for a in rows.values())
            for name, arr in rows.items():  # "tI.rows" etc.: split by the new owner of each row
                table, _, field = name.partition(".")
                ids = rows[f"{table}.rows"]
                dest = owner[ids % old.shape[0]]
                axis = 1 if field == "applied_by" else 0
                for k in np.unique(dest):
                    got = incoming[int(k)]
                    part = arr if (dest == k).all() else np.take(arr, np.flatnonzero(dest == k), axis=axis)
                    got[name] = part if name not in got else np.concatenate([got[name], part], axis=axis)
        t2 = time.perf_counter()
        seqs = [mover.send(j, "map", new, {"owner": owner, **incoming[j]}) for j in range(servers)]
        for j, seq in enumerate(seqs):  # every server lays its rows out at once
            mover.reply(j, seq)
        pause_s = time.perf_counter() - t0
    finally:
        mover.close()
    return MoveReport(version=new, moved=int(np.count_nonzero(old != owner)), bytes=nbytes, pause_s=pause_s,
                      wait_s=wait_s, export_s=t2 - t1, map_s=t0 + pause_s - t2, tries=tries)
