"""One server's part in moving partitions between servers (docs/design.md, "Partitions").

Whoever moves partitions (``bosen.jobs.moves``) drives every server through MOVE steps; this class
answers them for one server, beside the daemon that owns it:

1. ``plan`` (server 0 only): PLAN to every client: send PAUSED to every server now, after whatever
   is under way, and nothing more until the new map (an idle client pauses too: a pause at each
   client's next clock would wait on clients that do not clock).
2. ``wait``: answered once every client's PAUSED is in (each server's FIFO fence: everything a
   client sent before it is applied here), no clock-advance push is under way and no message is
   held at a checkpoint boundary (clients paused on both sides of one: the move is refused, to be
   tried again); the answer says where each backup table's step is (``BackupStep.position``).
3. ``export``: the rows of the partitions leaving this server, all their per-row state (a backup
   table's gradients in progress too, and its step, ``BackupStep.hand_over``).
4. ``map``: the new map and the rows of the partitions this server gains: every shard laid out anew;
   with checkpoints, this server's part of the move is written (what a replacement restores until its
   next checkpoint part, docs/recovery.md); a server whose partitions changed starts its take-back
   log again past the clients' clocks (``UndoLog.moved``: it cannot take back from before); reads
   parked here (for a clock or a backup table's iteration) are answered "moved" (the client asks
   again under the new map); then MAP to every client, after everything this server sent under the
   old map.
``abort``: a plan given up before any ``map`` (clients resume as they were).

Servers join and leave through the same steps. A server added to a running job (``bosen-server
--join``, :class:`Joining`) starts with no partition; the ``plan`` names the servers after the move
(``sv``), so each client connects to the new one (HELLO with its clock) before its PAUSED, and the
``map`` gives it partitions. A server leaving is given none in the ``map``: its clients say BYE to it
once they take the map, and ``retire`` answers when all have, then stops it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from bosen import wire
from bosen.errors import ConfigError, ProtocolError
from bosen.partition import Partition
from bosen.server.backup import BackupStep
from bosen.server.checkpoints import ServerCheckpoints
from bosen.server.shard import TableShard
from bosen.server.undo import UndoLog
from bosen.wire import Msg

log = logging.getLogger("bosen.server")


@dataclass(frozen=True)
class Joining:
    """What a server added to a running job takes from server 0's STATUS (``bosen-server --join``):
    the job's servers (it becomes the next), clock, worker clocks and partition map; and per worker
    rank the clock it joined at and (BYE) left at, which a lost server's replacement needs where
    workers joined or left (None: never joined, or not left)."""

    address: str  # its own
    servers: list[str]
    clock: int
    client_clocks: list[int | str]  # "left": a worker that left the job (or a rank kept for a joiner)
    owner: np.ndarray
    version: int
    joined_at: list[int | None] | None = None  # None: a server that does not say (all ranks from the start)
    left_at: list[int | None] | None = None

    @classmethod
    def from_status(cls, address: str, stats: Mapping[str, Any]) -> Joining:
        servers = list(stats["servers"])
        if address in servers:
            raise ValueError(f"--join {address}: the job already has a server there ({', '.join(servers)})")
        parts = stats["partitions"]
        return cls(address, servers, int(stats["clock"]), list(stats["client_clocks"]),
                   np.asarray(parts["owner"], dtype=np.int32), int(parts["version"]), *_ranks(stats))

    @classmethod
    def of_job(cls, stats: Mapping[str, Any]) -> Joining:
        """The running job's shape from one of its servers' STATUS, for a replacement of a lost server
        in a job whose servers changed (``bosen-server --recover --shape-from``; ``address`` unused)."""
        parts = stats["partitions"]
        return cls("", list(stats["servers"]), int(stats["clock"]), list(stats["client_clocks"]),
                   np.asarray(parts["owner"], dtype=np.int32), int(parts["version"]), *_ranks(stats))


def _ranks(stats: Mapping[str, Any]) -> tuple[list[int | None] | None, list[int | None] | None]:
    """STATUS's ``joined_at`` and ``left_at`` (per worker rank; None where it has none)."""
    joined, left = stats.get("joined_at"), stats.get("left_at")
    n = len(stats["client_clocks"])
    if not (isinstance(joined, list) and isinstance(left, list) and len(joined) == len(left) == n):
        return None, None
    return [None if j is None else int(j) for j in joined], [None if x is None else int(x) for x in left]


class Host(Protocol):
    """What of its server a ``PartitionMoves`` reads and changes (``server/daemon.py``'s ``Server``)."""

    rank: int
    addresses: list[str]
    num_clients: int
    clock: int
    client_clock: np.ndarray
    by_rank: dict[int, Any]  # rank -> Peer (ident, gone)
    shards: list[TableShard]
    partition: Partition
    parked: dict[int, list[Any]]  # clock -> reads waiting for it (peer, number, connection, shard, rows)
    backup_parked: dict[int, list[Any]]  # backup table -> reads waiting for an iteration (peer, number, ...)
    checkpoints: ServerCheckpoints | None
    undo: UndoLog | None  # a lost worker's take-back log (server/undo.py)

    @property
    def pushing(self) -> bool: ...

    def send(self, ident: bytes, header: dict[str, Any], *arrays: np.ndarray) -> int: ...

    def send_frames(self, ident: bytes, frames: list[Any], kind: Msg) -> int: ...

    def retire(self) -> None: ...

    def save_move_part(self, version: int) -> float: ...

    def live_ranks(self) -> list[int]: ...


class PartitionMoves:
    def __init__(self, server: Host) -> None:
        self.server = server
        self.paused: dict[int, set[int]] = {}  # map version -> client ranks paused for it
        self.waiting: list[tuple[int, bytes, int]] = []  # (version, the mover's connection, its MOVE's number)
        self.retiring: tuple[bytes, int] | None = None  # the mover's ``retire`` step, answered once clients left
        self.steps: dict[str, Callable[[bytes, dict[str, Any], dict[str, np.ndarray]], None]] = {
            "plan": self._plan, "wait": self._wait, "export": self._export, "map": self._map, "abort": self._abort,
            "retire": self._retire}

    def on_move(self, ident: bytes, h: dict[str, Any], frames: list[Any]) -> None:
        step = self.steps.get(h["op"])
        if step is None:
            raise ProtocolError(f"MOVE: unknown step {h['op']!r} (one of {', '.join(self.steps)})")
        step(ident, h, wire.decode_arrays(h, frames))

    def on_paused(self, rank: int, version: int) -> None:
        self.paused.setdefault(version, set()).add(rank)
        self.check_waiting()

    def check_waiting(self) -> None:
        """Answer the ``wait`` steps whose condition now holds (also called after a clock advance)."""
        if not self.waiting:
            return
        still = []
        for version, ident, seq in self.waiting:
            answer = self._ready(version)
            if answer is None:
                still.append((version, ident, seq))
            else:
                self._reply(ident, seq, answer)
        self.waiting = still

    def _reply(self, ident: bytes, seq: int, info: dict[str, Any], arrays: dict[str, np.ndarray] | None = None) -> None:
        self.server.send_frames(ident, wire.encode_arrays({"t": Msg.MOVE_REPLY, "rq": seq, **info}, arrays or {}),
                                 Msg.MOVE_REPLY)

    def _connected(self) -> None:
        s = self.server
        missing = [r for r in s.live_ranks() if r not in s.by_rank or s.by_rank[r].gone]
        if missing:
            raise ProtocolError(f"MOVE: worker rank {missing[0]} is not connected; partitions move only "
                                "while every worker is in the job")

    def _plan(self, ident: bytes, h: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        s = self.server
        if s.rank != 0:
            raise ProtocolError("MOVE plan: only server 0 tells the clients")
        self._connected()
        try:
            for shard in s.shards:
                shard.check_movable()
        except ConfigError as e:
            raise ProtocolError(f"MOVE plan: {e}") from None
        plan: dict[str, Any] = {"t": Msg.PLAN, "mv": h["mv"], "c": -1}
        if "sv" in h:  # servers join or leave: the list after the move (clients connect to new ones now)
            plan["sv"] = _servers(h, s.addresses)
        for p in s.by_rank.values():
            if not p.gone:  # a rank that left is waited for no more (its rank is GONE)
                s.send(p.ident, plan)
        log.info("partition move %d: clients pause their sends", h["mv"])
        self._reply(ident, h["s"], {})

    def _abort(self, ident: bytes, h: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        s = self.server
        self.paused.pop(h["mv"], None)
        self.waiting = [w for w in self.waiting if w[0] != h["mv"]]
        for shard in s.shards:  # rows exported for the move given up are this server's to send again
            shard.stay()
        if s.rank == 0:
            for p in s.by_rank.values():
                if not p.gone:
                    s.send(p.ident, {"t": Msg.PLAN, "mv": h["mv"], "c": -1, "x": True})
        self._reply(ident, h["s"], {})

    def _ready(self, version: int) -> dict[str, Any] | None:
        s = self.server
        if not set(s.live_ranks()) <= self.paused.get(version, set()) or s.pushing:
            return None
        if s.checkpoints is not None and s.checkpoints.held:
            return {"held": True}  # clients paused on both sides of a checkpoint boundary
        # backup tables: where each step is, on the servers that hold rows of it (the mover compares)
        steps = {str(sh.index): sh.procedure.position() for sh in s.shards
                 if isinstance(sh.procedure, BackupStep) and sh.stored}
        return {"c": s.clock, **({"bk": steps} if steps else {})}

    def _wait(self, ident: bytes, h: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        self.waiting.append((h["mv"], ident, h["s"]))
        self.check_waiting()

    def _export(self, ident: bytes, h: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        parts = arrays.get("parts")
        if parts is None or parts.ndim != 1:
            raise ProtocolError("MOVE export: needs a 1-d 'parts' array")
        out: dict[str, np.ndarray] = {}
        for shard in self.server.shards:
            try:
                got = shard.export_partitions(parts.astype(np.int64))
            except ConfigError as e:
                raise ProtocolError(f"MOVE export: {e}") from None
            out.update({f"t{shard.index}.{k}": v for k, v in got.items()})
        self._reply(ident, h["s"], {}, out)

    def _map(self, ident: bytes, h: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        s = self.server
        owner = arrays.get("owner")
        old = s.partition
        if owner is None or owner.shape != (old.partitions,):
            raise ProtocolError(f"MOVE map: needs an 'owner' array of {old.partitions} servers")
        if h["mv"] <= old.version:
            raise ProtocolError(f"MOVE map: version {h['mv']} is not newer than this server's {old.version}")
        servers = _servers(h, s.addresses) if "sv" in h else s.addresses
        if owner.shape[0] and int(owner.max()) >= len(servers):
            raise ProtocolError(f"MOVE map: an owner beyond the {len(servers)} servers of the job")
        try:  # a server leaving the job (its rank beyond the list) keeps a map in which it owns nothing
            new = Partition(max(len(servers), s.rank + 1), old.partitions, owner, h["mv"])
        except ValueError as e:
            raise ProtocolError(f"MOVE map: {e}") from None
        gains = {}
        for shard in s.shards:  # every check before any shard changes
            prefix = f"t{shard.index}."
            gains[shard.index] = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)} or None
            whole = {k[6:]: v for k, v in (gains[shard.index] or {}).items() if k.startswith("whole.")}
            shard.procedure.check_take_over(shard.stored, whole or None)
        for shard in s.shards:
            shard.relayout(new, gains[shard.index])
        s.partition = new
        gained = int(np.count_nonzero((new.owner_of == s.rank) & (old.owner_of != s.rank)))
        lost = int(np.count_nonzero((old.owner_of == s.rank) & (new.owner_of != s.rank)))
        if s.undo is not None and (gained or lost):  # clients paused: none sent past its clock now
            s.undo.moved(1 + max([s.clock, *(int(s.client_clock[r]) for r in s.live_ranks())]))
        if s.rank < len(servers):
            s.addresses = list(servers)
        took = 0.0
        if s.rank < len(servers):  # before any client sends under the new map (a server leaving owns nothing)
            took = s.save_move_part(new.version)
        parked, s.parked = s.parked, {}
        waiting = [(seq, rident) for reads in parked.values() for _peer, seq, rident, _shard, _local in reads]
        for index, reads in s.backup_parked.items():  # reads waiting for an iteration: local rows of the old map
            waiting += [(seq, rident) for _peer, seq, rident, _need, _local in reads]
            s.backup_parked[index] = []
        for seq, rident in waiting:
            s.send(rident, {"t": Msg.ERROR, "rq": seq, "m": "rows moved: ask again", "mv": new.version})
        for p in s.by_rank.values():
            if not p.gone:
                s.send_frames(p.ident, wire.encode_arrays({"t": Msg.MAP, "mv": new.version},
                                                           {"owner": new.owner_of}), Msg.MAP)
        self.paused.pop(h["mv"], None)
        log.info("partition map %d: server %d gained %d partitions and gave %d away%s", new.version, s.rank,
                 gained, lost, "" if s.undo is None or not (gained or lost) else
                 f"; a lost worker is taken back here from clock {s.undo.reach} on")
        self._reply(ident, h["s"], {"ps": round(took, 6)})

    def _retire(self, ident: bytes, h: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """This server leaves the job: answered (and the server stopped) once it owns no partition and
        every client has said BYE (clients do once they take a map without it)."""
        s = self.server
        if s.rank == 0:
            raise ProtocolError("MOVE retire: server 0 coordinates the job and cannot leave it")
        if s.partition.owned[s.rank].shape[0]:
            raise ProtocolError(f"MOVE retire: this server still owns {s.partition.owned[s.rank].shape[0]} "
                                "partitions: move them away first")
        self.retiring = (ident, h["s"])
        self.check_retiring()

    def check_retiring(self) -> None:
        """Called as clients leave: a retiring server with no client left answers and stops."""
        s = self.server
        if self.retiring is None or any(not p.gone for p in s.by_rank.values()):
            return
        ident, seq = self.retiring
        self.retiring = None
        self._reply(ident, seq, {})
        log.info("server %d left the job (its partitions moved to the others)", s.rank)
        s.retire()


def _servers(h: dict[str, Any], current: list[str]) -> list[str]:
    """A MOVE's ``sv``: the job's servers after the move; the current ones keep their ranks."""
    sv = h["sv"]
    if not (isinstance(sv, list) and sv and all(isinstance(a, str) for a in sv)):
        raise ProtocolError(f"MOVE: field 'sv' must list the servers' addresses, got {sv!r}")
    common = min(len(sv), len(current))
    if sv[:common] != current[:common]:
        raise ProtocolError(f"MOVE: servers join or leave at the end of the list: {sv} does not extend or "
                            f"shorten {current}")
    return sv
