"""A server's consistent checkpoints: which clock to save, what to hold back meanwhile, and the save.

Clocks that are multiples of ``checkpoint.every_clocks`` are *boundaries*. Clients cut their update
stream there: a client sends CLOCK(B) (or the INC that carries it) only after every update of its
ticks < B, and nothing of tick >= B before it (``Client`` waits at the boundary until CLOCK(B) is
out). So at this server, a client's messages after its CLOCK(B) hold only updates of ticks >= B.
Under SSP a fast client gets there while slow ones still send tick < B updates; its later INC and
CLOCK messages are *held*, in order, until the server clock reaches B. At that moment the shard holds
every update of ticks < B and none later: its values and stored-procedure state are copied (the
copy-on-write protection of the thesis, done eagerly: a copy runs at memory speed, and no check
on the apply path is needed), the held messages are applied, and a ``PartWriter`` thread writes the
copy while training goes on.

Holding delays only what fast clients sent past a boundary, by at most the time the slowest client
needs to reach it; their reads and everyone else's messages go on. A held update is not
acknowledged until it is applied, so read-my-writes keeps showing it from the client's in-flight log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bosen import checkpoint
from bosen.config import Config
from bosen.errors import ConfigError
from bosen.server.shard import TableShard

log = logging.getLogger("bosen.server")

Held = Callable[[], None]  # a message's handling, deferred


class ServerCheckpoints:
    """Boundaries, held messages and saves of one server (``Server.checkpoints``)."""

    def __init__(self, config: Config, rank: int) -> None:
        assert config.checkpoint is not None
        self.cfg = config.checkpoint
        self.rank = rank
        self.base = checkpoint.root(config)
        self.fingerprint = checkpoint.model_fingerprint(config)
        self.writer = checkpoint.PartWriter(self.base, self.fingerprint)
        self.held: dict[int, list[Held]] = {}  # client rank -> its messages held past the boundary
        self.saved: list[int] = []  # boundary clocks saved (submitted to the writer)
        self.snapshot_s = 0.0  # time spent copying shards, all saves
        self.held_msgs = 0  # messages ever held
        self.timed = self.cfg.every_s is not None or self.cfg.mttf_s is not None
        self.chosen: set[int] = set()  # under a time rule: boundaries rank 0 chose (CLOCK "ck")

    def boundary_after(self, clock: int) -> int:
        """The first boundary above ``clock``."""
        n = self.cfg.every_clocks
        return (clock // n + 1) * n

    def holds(self, client_clock: int, server_clock: int) -> bool:
        """Whether a message from a client at ``client_clock`` must wait: the client has passed a
        boundary the server has not reached."""
        return client_clock >= self.boundary_after(server_clock)

    def hold(self, rank: int, handle: Held) -> None:
        self.held.setdefault(rank, []).append(handle)
        self.held_msgs += 1

    def holding(self, rank: int) -> bool:
        return bool(self.held.get(rank))

    def drop(self, rank: int) -> int:
        """A client is gone: its held messages with it. Returns how many."""
        return len(self.held.pop(rank, []))

    def choose(self, clock: int) -> None:
        """Client rank 0 asked for a save at boundary ``clock`` (under a time rule)."""
        if clock % self.cfg.every_clocks == 0:
            self.chosen.add(clock)

    def crossed(self, old: int, new: int) -> int | None:
        """The boundary to save at, reached moving the server clock from ``old`` to ``new``, if any:
        every boundary, or under a time rule those client rank 0 chose."""
        b = self.boundary_after(old)
        if b > new:
            return None
        if self.timed:
            if b not in self.chosen:
                return None
            self.chosen.discard(b)
        if b != new:  # clients cut at every boundary, so the min of their clocks lands on it
            log.error("server clock jumped from %d to %d over boundary %d: no checkpoint", old, new, b)
            return None
        return b

    def save(self, clock: int, shards: list[TableShard], info: dict[str, Any]) -> None:
        """Copy every shard (values and procedure state) as it is now, and hand the copy to the writer."""
        t = time.perf_counter()
        arrays: dict[str, np.ndarray] = {}
        tables = {}
        for s in shards:  # files are named by table index (names may hold any character)
            key = f"t{s.index}"
            arrays[f"{key}.values"] = s.values.copy()
            arrays[f"{key}.rows"] = s.global_rows  # never changes: no copy
            state = s.procedure.state()
            for k, v in state.items():
                arrays[f"{key}.{k}"] = v.copy()
            tables[key] = {"name": s.cfg.name, "rows": int(s.global_rows.shape[0]), "cols": s.cfg.cols,
                           "dtype": s.dtype.name, "update": s.cfg.update, "state": sorted(state)}
        self.snapshot_s += time.perf_counter() - t
        self.writer.submit(clock, "server", self.rank, arrays, {"tables": tables, **info})
        self.saved.append(clock)

    def close(self) -> None:
        self.writer.close()
        if self.writer.error is not None:
            log.error("a checkpoint write failed: %s", self.writer.error)

    def durable(self) -> int:
        """The newest clock whose part is on disk (-1: none yet): clients may forget what they sent
        before it (partial recovery starts from it)."""
        w = self.writer.written
        return w[-1][0] if w else -1

    def mean_save_s(self) -> float:
        """Mean seconds a save took (copy and write): Young's Ts, sent to clients in SCLOCK."""
        return (self.snapshot_s / len(self.saved) if self.saved else 0.0) + self.writer.mean_save_s()

    def stats(self) -> dict[str, Any]:
        w = self.writer.written
        return {"saved": self.saved[-5:], "written": len(w), "write_s": round(sum(x[1] for x in w), 4),
                "snapshot_s": round(self.snapshot_s, 4), "held_msgs": self.held_msgs,
                "held_clients": sum(1 for v in self.held.values() if v),
                "error": None if self.writer.error is None else str(self.writer.error)}


def restore(config: Config, rank: int, shards: list[TableShard], path: Path, own: bool = False) -> int:
    """Load this server's part of a checkpoint into ``shards``; returns its clock.

    ``path`` is a checkpoint (``.../clock-N``) or a directory of them: then the newest complete one
    is used (every process's part), or with ``own`` (partial recovery: the other servers keep their
    live values and the clients resend what came later) the newest valid part of this server's.
    The newer ones skipped are logged. ConfigError says what does not fit."""
    fp = checkpoint.model_fingerprint(config)
    servers, workers = len(config.cluster.servers), config.cluster.workers
    try:
        if checkpoint.clocks(path) and own:
            part = _newest_own(path, rank, fp)
            clock = int(part.meta["clock"])
        elif checkpoint.clocks(path):
            clock, parts, skipped = checkpoint.newest_complete(path, servers, workers, fp)
            for why in skipped:
                log.warning("skipped checkpoint %s", why)
            part = parts[checkpoint.part_name("server", rank)]
        else:
            part = checkpoint.read_part(path / checkpoint.part_name("server", rank), fp)
            clock = int(part.meta["clock"])
    except checkpoint.CheckpointError as e:
        raise ConfigError(f"--resume {path}: {e}") from None
    arrays = part.load()
    saved = part.info.get("tables", {})
    for s in shards:
        name, key = s.cfg.name, f"t{s.index}"
        values = arrays.get(f"{key}.values")
        rows = arrays.get(f"{key}.rows")
        if values is None or rows is None or saved.get(key, {}).get("name") != name:
            raise ConfigError(f"--resume {part.path}: table {name!r} is not in the checkpoint")
        if values.shape != s.values.shape or values.dtype != s.values.dtype or not np.array_equal(rows, s.global_rows):
            raise ConfigError(f"--resume {part.path}: table {name!r} is {values.shape} {values.dtype} there, "
                              f"{s.values.shape} {s.values.dtype} here")
        s.values[...] = values
        prefix = f"{key}."
        state = {k[len(prefix):]: v for k, v in arrays.items()
                 if k.startswith(prefix) and k not in (f"{key}.values", f"{key}.rows")}
        try:
            s.procedure.load_state(state)
        except ValueError as e:
            raise ConfigError(f"--resume {part.path}: table {name!r}: {e}") from None
    log.info("server %d resumed from %s at clock %d", rank, part.path, clock)
    return clock


def _newest_own(base: Path, rank: int, fp: str) -> checkpoint.Part:
    name = checkpoint.part_name("server", rank)
    problems = []
    for c in checkpoint.clocks(base):
        try:
            return checkpoint.read_part(checkpoint.clock_dir(base, c) / name, fp)
        except checkpoint.CheckpointError as e:
            problems.append(str(e))
            log.warning("skipped checkpoint part: %s", e)
    raise checkpoint.CheckpointError(f"{base}: no valid part {name} ({'; '.join(problems) or 'none written'})")
