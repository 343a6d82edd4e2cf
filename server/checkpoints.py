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
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bosen import checkpoint, scar
from bosen.config import Config
from bosen.errors import ConfigError, ProtocolError
from bosen.partition import Partition
from bosen.server.shard import TableShard
from bosen.wire import UpdateBatch


def _correction_path(base: Path, clock: int, server: int, rank: int) -> Path:
    """Beside checkpoint ``clock``'s parts: what server ``server``'s part holds of worker ``rank``'s
    updates that were taken back after it was saved (a lost worker's, its replacement redoing them)."""
    return checkpoint.clock_dir(base, clock) / f"redo.server-{server}.rank-{rank}.npz"

log = logging.getLogger("bosen.server")

Held = tuple[int, Callable[[], None]]  # a message's number and its handling, deferred
# Priority checkpoints: after partial saves worth this many full checkpoints (ceil(BASE_AFTER / r)
# saves of the fraction r), the next save is a *base*: every row, as a full checkpoint. A restore
# starts at the newest base, so older parts can go (``bosen.checkpoint.prune_bases``): disk stays
# within ``keep`` bases and the partial saves between them, for 1/BASE_AFTER more bytes written.
BASE_AFTER = 2


class ServerCheckpoints:
    """Boundaries, held messages and saves of one server (``Server.checkpoints``)."""

    def __init__(self, config: Config, rank: int) -> None:
        assert config.checkpoint is not None
        self.cfg = config.checkpoint
        self.rank = rank
        self.base = checkpoint.root(config)
        self.fingerprint = checkpoint.model_fingerprint(config)
        self.writer = checkpoint.PartWriter(self.base, self.fingerprint, config.cluster.workers)
        self.held: dict[int, list[Held]] = {}  # client rank -> its messages held past the boundary
        self.saved: list[int] = []  # boundary clocks saved (submitted to the writer)
        self.snapshot_s = 0.0  # time spent copying shards, all saves
        self.held_msgs = 0  # messages ever held
        self.timed = self.cfg.every_s is not None or self.cfg.mttf_s is not None
        self.chosen: set[int] = set()  # under a time rule: boundaries rank 0 chose (CLOCK "ck") or SAVE asked for
        # a boundary reached while a lost worker's replacement had not joined: saved once it has and every
        # rank is there (``deferred_ready``); meanwhile messages of ticks at or past it are held
        self.deferred: int | None = None
        self.running: list[scar.RunningCheckpoint] = []  # priority checkpoints: the saved copy per shard
        self.partials = 0  # priority checkpoints: partial saves since the last base (or the start)
        self.base_every = -(-BASE_AFTER * 1_000_000 // round(self.cfg.priority_fraction * 1_000_000))
        self.servers = len(config.cluster.servers)
        self._floor = 0  # undo_floor's last answer
        self.moved: list[tuple[int, int]] = []  # (clock, map version) of the move parts saved (save_move)
        # a replacement restored from the newest complete checkpoint: its predecessor's parts of later
        # boundaries, on disk and holding exactly the ticks below their clock, are not saved again
        self.kept: set[int] = set()

    def restored_complete(self, clock: int, kept: list[int]) -> None:
        """This server (a lost one's replacement) was restored from its part of the newest complete
        checkpoint, ``clock``; its predecessor's parts of the boundaries ``kept`` stay as they are
        (their corrections too) rather than being rewritten while a replacement may read them."""
        self._floor = max(self._floor, clock)
        self.kept = set(kept)

    def base_next(self, shards: list[TableShard]) -> None:
        """Priority checkpoints: partitions moved (or this server was restored from its part of a
        move), so rows sit at other local places and parts saved under the old map do not restore the
        new one: the running checkpoint starts again from the shards as they are now, and the next
        save is a base, from which a restore of a later part chains (``restore``)."""
        if self.running:
            self.start_running(shards)
            self.partials = self.base_every

    def start_running(self, shards: list[TableShard]) -> None:
        """Priority checkpoints: the in-memory running checkpoint starts as the shards are now
        (initial or restored values; a sparse shard's stored rows, its later rows joining at their
        initial values); counts rows are compared as distributions (SCAR's scaled total variation),
        float rows by L2."""
        if self.cfg.priority_fraction < 1.0:  # a sparse shard's: its stored rows (more join at each save)
            self.running = [scar.RunningCheckpoint(s.values[:s.stored], "tv" if s.dtype.kind == "i" else "l2",
                                                   seed=1000 * self.rank + s.index) for s in shards]

    def boundary_after(self, clock: int) -> int:
        """The first boundary above ``clock``."""
        return checkpoint.next_boundary(clock, self.cfg.every_clocks)

    def holds(self, client_clock: int, server_clock: int) -> bool:
        """Whether a message from a client at ``client_clock`` must wait: the client has passed a
        boundary the server has not reached, or not yet saved (``deferred``)."""
        if self.deferred is not None and client_clock >= self.deferred:
            return True
        return client_clock >= self.boundary_after(server_clock)

    def hold(self, rank: int, seq: int, handle: Callable[[], None]) -> None:
        self.held.setdefault(rank, []).append((seq, handle))
        self.held_msgs += 1

    def holding(self, rank: int) -> bool:
        return bool(self.held.get(rank))

    def drop(self, rank: int) -> int:
        """A client is gone: its held messages with it. Returns how many."""
        return len(self.held.pop(rank, []))

    def choose(self, clock: int) -> None:
        """Client rank 0 asked for a save at boundary ``clock`` (under a time rule), or the launcher did
        (SAVE: a scale-in's boundary)."""
        if checkpoint.is_boundary(clock, self.cfg.every_clocks):
            self.chosen.add(clock)

    def will_save(self, clock: int, server_clock: int) -> bool:
        """SAVE asked for a part at boundary ``clock``: chosen if the server has not reached it (True),
        True too if it saved it or defers it; False where it passed it unsaved (too late)."""
        if clock > server_clock:
            self.choose(clock)
            return True
        return clock in self.saved or clock in self.kept or clock == self.deferred

    def crossed(self, old: int, new: int) -> int | None:
        """The boundary to save at, reached moving the server clock from ``old`` to ``new``, if any:
        every boundary, or under a time rule those client rank 0 chose."""
        b = self.boundary_after(old)
        if b > new or b in self.kept:
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
        base = bool(self.running) and self.partials >= self.base_every
        for s in shards:  # files are named by table index (names may hold any character)
            key = f"t{s.index}"
            state = s.procedure.state()
            if self.running:  # the running checkpoint follows every save (a base saves every row)
                run, n = self.running[s.index], s.stored
                if run.n_rows < n:  # a sparse shard stored rows since: saved as what a restore gives them
                    run.extend(s.initial(s.global_rows[run.n_rows:n]))
                if base:
                    run.save(s.values[:n], np.arange(n), clock)
            if self.running and not base:  # priority checkpoint: the rows the policy picks, and their state
                rows = run.step(self.cfg.policy, s.values[:n], self.cfg.priority_fraction, clock)
                arrays[f"{key}.values"] = s.values[rows]
                arrays[f"{key}.rows"] = s.global_rows[rows]
                for k, v in state.items():
                    arrays[f"{key}.{k}"] = v[rows]
            else:
                n = s.stored  # a sparse shard's touched rows (its arrays may have room for more)
                arrays[f"{key}.values"] = s.values[:n].copy()
                # never changes (a sparse shard only appends its ids, into room past these): no copy
                arrays[f"{key}.rows"] = s.global_rows[:n]
                for k, v in state.items():
                    arrays[f"{key}.{k}"] = v[:n].copy()
            for k, v in s.procedure.table_state().items():  # not per row: in every part, priority ones too
                arrays[f"p{s.index}.{k}"] = v
            tables[key] = {"name": s.cfg.name, "rows": s.stored, "storage": s.cfg.storage, "cols": s.cfg.cols,
                           "dtype": s.dtype.name, "update": s.cfg.update, "state": sorted(state)}
        self.snapshot_s += time.perf_counter() - t
        partial: dict[str, Any] = {}
        if base:  # a restore starts here: no "partial"
            partial = {"base": True, "policy": self.cfg.policy}
            self.partials = 0
        elif self.running:
            partial = {"partial": self.cfg.priority_fraction, "policy": self.cfg.policy}
            self.partials += 1
        part = shards[0].partition  # the map the rows were saved under: a resume lays its shards out so
        pmap = {"version": part.version, "owner": part.owner_of.tolist()} if part.version else {}
        self.writer.submit(clock, "server", self.rank, arrays,
                           {"tables": tables, **partial, **info, **({"map": pmap} if pmap else {})})
        self.saved.append(clock)

    def save_move(self, version: int, clock: int, shards: list[TableShard], info: dict[str, Any]) -> float:
        """Partitions just moved to map ``version`` (server clock ``clock``; every client paused, so
        this server holds exactly what each client sent before its PAUSED): a copy of this server's
        rows now, before any client sends under the new map, written as this server's move part by
        the part writer's thread while training goes on. A lost server's replacement restores it
        (it is newer than every part saved before) and the clients resend what followed their
        PAUSED, so a loss between a move and the next checkpoint part is exact (docs/recovery.md); a
        loss before the copy is on disk finds no move part and is refused, as a loss during the move
        is. Returns the seconds the copy took (the part of it inside the move's pause)."""
        t = time.perf_counter()
        arrays: dict[str, np.ndarray] = {}
        tables = {}
        for s in shards:  # every row: as a full save
            key, n, state = f"t{s.index}", s.stored, s.procedure.state()
            arrays[f"{key}.values"], arrays[f"{key}.rows"] = s.values[:n].copy(), s.global_rows[:n].copy()
            arrays.update({f"{key}.{k}": v[:n].copy() for k, v in state.items()})
            # not per row (a backup table's iteration and estimator), as in every part
            arrays.update({f"p{s.index}.{k}": v for k, v in s.procedure.table_state().items()})
            tables[key] = {"name": s.cfg.name, "rows": n, "storage": s.cfg.storage, "cols": s.cfg.cols,
                           "dtype": s.dtype.name, "update": s.cfg.update, "state": sorted(state)}
        part = shards[0].partition
        pmap = {"version": part.version, "owner": part.owner_of.tolist()}
        self.writer.submit(clock, "server", self.rank, arrays, {"tables": tables, "move": version, "map": pmap, **info},
                           directory=checkpoint.move_dir(self.base, clock, version))
        self.moved.append((clock, version))
        self.base_next(shards)
        return time.perf_counter() - t

    def drop_moves(self) -> int:
        """A lost worker's updates are being taken back: this server's move parts hold them (and,
        unlike its checkpoint parts, are no cut at a clock that says which), so they go; until its
        next checkpoint part a replacement of this server restores an older part, which a move since
        makes refused rather than inexact. Returns how many went."""
        self.writer.drain()  # a move part still queued would land after the deletion
        for clock, version in self.moved:
            shutil.rmtree(checkpoint.move_dir(self.base, clock, version) / checkpoint.part_name("server", self.rank),
                          ignore_errors=True)
        n, self.moved = len(self.moved), []
        return n

    def close(self) -> None:
        self.writer.close()
        if self.writer.error is not None:
            log.error("a checkpoint write failed: %s", self.writer.error)

    def durable(self) -> int:
        """The newest clock whose part is on disk (-1: none yet): clients may forget what they sent
        before it (partial recovery starts from it)."""
        w = self.writer.written
        return max(w[-1][0] if w else -1, max(self.kept, default=-1))

    def correct(self, rank: int, since: int, held: int, back: list[tuple[int, int, UpdateBatch]]) -> list[int]:
        """Worker ``rank``'s updates of ticks >= ``since`` were just taken back (``back``: (tick, table,
        batch negated)); this server's parts of clocks in (since, held] were saved with those of ticks
        below their clock. Beside each goes the correction a restore from it adds (those batches; no
        pickle), so a replacement of this server restored from it holds none of them, and that
        rank's client resends from ``since`` (docs/recovery.md). Returns the clocks corrected."""
        fixed = []
        for c in sorted(set(self.saved) | set(self.on_disk())):
            if not since < c <= held:
                continue
            arrays: dict[str, np.ndarray] = {"since": np.array([since]), "held": np.array([held])}
            for i, (_, table, b) in enumerate(x for x in back if x[0] < c):
                arrays[f"b{i}.table"] = np.array([table])
                arrays[f"b{i}.rows"], arrays[f"b{i}.values"] = b.rows, b.values
                if b.indptr is not None and b.cols is not None:
                    arrays[f"b{i}.indptr"], arrays[f"b{i}.cols"] = b.indptr, b.cols
            path = _correction_path(self.base, c, self.rank, rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.partial")
            with open(tmp, "wb") as f:
                np.savez(f, **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds as its allow_pickle
            tmp.replace(path)
            fixed.append(c)
        return fixed

    def on_disk(self) -> list[int]:
        """The clocks of this server's checkpoint parts on disk: those it saved, and those of the lost
        server it replaces (``saved`` holds only its own), which a take-back makes stale as well."""
        return [c for c in checkpoint.clocks(self.base)
                if (checkpoint.clock_dir(self.base, c) / checkpoint.part_name("server", self.rank) / checkpoint.META)
                .exists()]

    def undo_floor(self) -> int:
        """The newest complete checkpoint on disk (every server's and worker's part finished; 0: none
        yet): a lost worker's replacement restarts from it or a newer one, never an older one, so its
        updates before it need no taking back. Not this server's own parts: a worker's part may still
        be on its way (or never come, its worker killed while writing it) when this server's is done.
        Looked up again only while this server's newest part is not yet known complete."""
        w = self.writer.written
        if not w or self._floor >= w[-1][0]:
            return self._floor
        try:
            clock, _, _ = checkpoint.newest_complete(self.base, self.servers, None, None, verify=False)
        except checkpoint.CheckpointError:
            return self._floor
        self._floor = max(self._floor, clock)
        return self._floor

    def mean_save_s(self) -> float:
        """Mean seconds a save took (copy and write): Young's Ts, sent to clients in SCLOCK."""
        return (self.snapshot_s / len(self.saved) if self.saved else 0.0) + self.writer.mean_save_s()

    def stats(self) -> dict[str, Any]:
        w = self.writer.written
        return {"saved": self.saved[-5:], "written": len(w), "write_s": round(sum(x[1] for x in w), 4),
                "snapshot_s": round(self.snapshot_s, 4), "held_msgs": self.held_msgs,
                "held_clients": sum(1 for v in self.held.values() if v),
                "error": None if self.writer.error is None else str(self.writer.error)}


def restore(config: Config, rank: int, shards: list[TableShard], path: Path, own: bool = False,
            redo: dict[int, tuple[int, int]] | None = None, servers: int | None = None,
            info: dict[str, Any] | None = None, complete: Complete | None = None) -> int:
    """Load this server's part of a checkpoint into ``shards``; returns its clock.

    ``path`` is a checkpoint (``.../clock-N``) or a directory of them: then the newest complete one
    is used (every process's part; not one a take-back made stale, ``checkpoint.taken_back``), or
    with ``own`` (partial recovery: the other servers keep their live values and the clients resend
    what came later) the newest valid part of this server's.
    The newer ones skipped are logged. Priority checkpoints (parts of some rows each) are put
    together: every valid part of this server up to that clock, oldest first, from the newest
    valid base (a part of every row) or else the initial values. ``servers``: the job's servers now,
    where they joined or left (default the config's); ``info``: filled with the restored part's info
    (the ranks' clocks it saved); ``complete`` (with ``own``, a server whose lost workers are taken
    back): restore from this server's part of the newest *complete* checkpoint where it can, not its
    newest own part (``_complete_instead``), and say so there. ConfigError says what does not fit."""
    servers = len(config.cluster.servers) if servers is None else servers
    any_fp = checkpoint.fingerprint_for(config)  # a resumed job may have other workers (micro-tasks)
    base = path
    try:
        if own and not _has_own(path, rank):
            # lost before its first part was saved: the job's start is its checkpoint (the initial
            # values, a function of each row alone), and the clients resend all they sent it
            log.warning("server %d has no checkpoint part of its own yet: it starts from the initial values at "
                        "clock 0 and the clients resend everything", rank)
            return 0
        if own and (checkpoint.clocks(path) or checkpoint.moves(path)):
            part = _newest_own(path, rank, config, any_fp)
            if complete is not None:
                older = _complete_instead(path, rank, part, servers, any_fp, complete)
                if older is None:  # no complete checkpoint yet: the initial values, every client resends all
                    return 0
                part = older
            clock = int(part.meta["clock"])
        elif checkpoint.clocks(path):
            clock, parts, skipped = checkpoint.newest_complete(path, servers, None, any_fp, exact=True)
            for why in skipped:
                log.warning("skipped checkpoint %s", why)
            if checkpoint.recorded_servers(checkpoint.clock_dir(path, clock)) not in (None, servers):
                return _restore_regrouped(config, rank, shards, checkpoint.clock_dir(path, clock))
            part = parts[checkpoint.part_name("server", rank)]
        else:
            if not own and checkpoint.recorded_servers(path) not in (None, servers):
                return _restore_regrouped(config, rank, shards, path)
            part = checkpoint.read_part(path / checkpoint.part_name("server", rank), None)
            _check_fingerprint(part, config, any_fp)
            clock = int(part.meta["clock"])
            base = path.parent
    except checkpoint.CheckpointError as e:
        raise ConfigError(f"--resume {path}: {e}") from None
    chain = _chain(base, part, clock, config, any_fp)
    made_by = part.info.get("servers")
    if own and isinstance(made_by, list) and len(made_by) != servers:
        raise ConfigError(f"--resume {part.path}: made by {len(made_by)} servers (servers joined or left the job), "
                          f"but this config has {servers}: a lost server of such a job is not restored alone")
    saved = part.info.get("map")
    if saved is not None:  # saved after partitions moved: this server holds the partitions it held then
        try:
            pmap = Partition(servers, config.cluster.num_partitions, np.asarray(saved["owner"]), int(saved["version"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"--resume {part.path}: its partition map does not fit this job ({e})") from None
        for s in shards:
            s.relayout(pmap, fresh=True)
    for p in chain:
        _load(shards, p)
    if own:
        _apply_corrections(part.path.parent, clock, rank, shards, redo if redo is not None else {})
    if info is not None:
        info.update(part.info)
    log.info("server %d resumed from %s at clock %d (%d part%s)", rank, part.path, clock, len(chain),
             "" if len(chain) == 1 else "s")
    return clock


class Complete:
    """A replacement server's choice between its newest own part and its part of the newest complete
    checkpoint (``_complete_instead``): ``left``, in: the clocks at which ranks left the job by BYE
    (not finished ones); out: ``clock``, the complete checkpoint restored from (None: the newest own
    part was), and ``kept``, the clocks of this server's parts on disk newer than it (its
    predecessor's), which hold exactly the ticks below their clock and are not saved again."""

    def __init__(self, left: list[int]) -> None:
        self.left = left
        self.clock: int | None = None
        self.kept: list[int] = []


def _complete_instead(base: Path, rank: int, own: checkpoint.Part, servers: int, any_fp: Callable[[int], str],
                      how: Complete) -> checkpoint.Part | None:
    """The part a replacement of a server whose lost workers are taken back restores: its part of the
    newest complete checkpoint C (None: there is none; the initial values at clock 0), not its newest
    own part (clock S), so its take-back log reaches back to C, the oldest clock a lost worker's
    replacement restarts from; the clients resend from C (they keep their logs from there, SCLOCK
    ``cp``). Its newest own part where C's cannot serve: a partition move or servers joined or left
    since C (C's part has another map), or a rank left the job after C (what it sent since is in no
    resend log); there a worker lost later and restarted from before S cannot be taken back on this
    server (its updates of ticks below S are in the values, not in the take-back log; STATUS
    ``take_back_from`` says S), and ``bosen launch`` restarts the whole job instead (docs/recovery.md)."""
    try:
        clock, parts, _ = checkpoint.newest_complete(base, servers, None, any_fp)
        older: checkpoint.Part | None = parts.get(checkpoint.part_name("server", rank))
    except checkpoint.CheckpointError:
        clock, older = 0, None
    s = int(own.meta["clock"])
    if clock >= s and own.info.get("move") is None:  # the newest own part is the complete one's
        how.clock = s
        return own
    if own.info.get("move") is not None:
        why = "a partition move since"
    elif _map_version(own) != (0 if older is None else _map_version(older)) \
            or own.info.get("servers") != (None if older is None else older.info.get("servers")):
        why = "partitions moved or servers joined or left since"
    elif any(left > clock for left in how.left):
        why = "a worker rank left the job since"
    elif clock and older is None:
        why = "no part of this server there"
    else:
        how.clock = clock
        how.kept = [c for c in checkpoint.clocks(base) if clock < c <= s
                    and (checkpoint.clock_dir(base, c) / own.path.name / checkpoint.META).exists()]
        log.warning("server %d restores its part of the newest complete checkpoint (clock %d), not its newest part "
                    "(clock %d): a lost worker's replacement restarts from there, and this server takes back its "
                    "updates since then; the clients resend from clock %d", rank, clock, s, clock)
        return older
    log.warning("server %d restores its newest part (clock %d), not its part of the newest complete checkpoint "
                "(clock %d): %s; a worker lost later cannot be taken back here if it restarts from before clock %d "
                "(STATUS take_back_from): bosen launch then restarts the whole job from its newest complete "
                "checkpoint", rank, s, clock, why, s)
    return own


def _chain(base: Path, part: checkpoint.Part, clock: int, config: Config,
           any_fp: Callable[[int], str]) -> list[checkpoint.Part]:
    """The parts that put ``part`` (of checkpoint ``clock`` under ``base``) together, oldest first: itself
    where it holds every row; for a priority (SCAR) part, every valid part of its server up to it from
    the newest valid base under the same partition map (or, under the config's map, from the initial
    values). ConfigError where a part of a moved map has no base under that map before it."""
    if not part.info.get("partial"):
        return [part]
    version = _map_version(part)
    chain: list[checkpoint.Part] = []
    for c in sorted(checkpoint.clocks(base)):
        if c > clock:
            break
        try:
            p = checkpoint.read_part(checkpoint.clock_dir(base, c) / part.path.name, None)
            _check_fingerprint(p, config, any_fp)
        except checkpoint.CheckpointError as e:  # its rows keep an older save
            log.warning("priority checkpoint part skipped: %s", e)
            continue
        if _map_version(p) != version:  # saved under another partition map: never chained with this one's
            chain = []
        elif p.info.get("partial"):
            chain.append(p)
        else:  # a base holds every row: what came before it is not needed
            chain = [p]
    if version and (not chain or chain[0].info.get("partial")):
        raise ConfigError(f"--resume {part.path}: a priority (SCAR) part saved under partition map {version}, "
                          "but no valid base (a part of every row) of this server under that map before it; "
                          "resume from an older checkpoint")
    return chain


def _map_version(part: checkpoint.Part) -> int:
    """The partition map a part was saved under (0: the config's, no move yet)."""
    saved = part.info.get("map")
    return int(saved.get("version", 0)) if isinstance(saved, dict) else 0


def _restore_regrouped(config: Config, rank: int, shards: list[TableShard], ck: Path) -> int:
    """Resume from checkpoint ``ck``, made while servers other than the config's ran (``bosen scale
    --servers``): this server takes, from every server's part, the rows the config's own map gives it
    (rows are saved with their global ids, so who held them then does not matter). A priority (SCAR)
    part holds some rows: its server's chain (its base under the map the part was saved under, and
    the partial parts after it, ``_chain``) is replayed in order, each part's rows of this server
    written over the older ones, so each old server's rows are as its latest state had them. Every
    row belongs to one old server under that map, so the chains never overlap."""
    any_fp = checkpoint.fingerprint_for(config)
    made_by = checkpoint.recorded_servers(ck) or 0
    try:
        parts = [checkpoint.read_part(ck / checkpoint.part_name("server", r), None) for r in range(made_by)]
        for p in parts:
            _check_fingerprint(p, config, any_fp)
    except checkpoint.CheckpointError as e:
        raise ConfigError(f"--resume {ck}: {e}") from None
    clock = int(parts[0].meta["clock"])
    chains = [_chain(ck.parent, p, clock, config, any_fp) for p in parts]
    for chain in chains:
        for p in chain:
            _load(shards, p, owned_only=True)
    _adopt_steps(shards, parts, chains)
    log.info("server %d resumed from %s at clock %d: the rows the config's map gives it, from the parts of the "
             "%d servers that made it (%d parts)", rank, ck, clock, made_by, sum(len(c) for c in chains))
    return clock


def _adopt_steps(shards: list[TableShard], parts: list[checkpoint.Part], chains: list[list[checkpoint.Part]]) -> None:
    """A regrouped resume: each shard whose table keeps a whole-shard state (backup workers: the
    iteration, k_t, its history and the estimator) takes the state of the old server that gives it
    the most rows, as a server joining by a partition move takes over its first giver's step, so a
    dynamic k_t goes on from its history instead of starting afresh. The last step's mean gradient
    is per row of the old server's layout and is not carried: the next smoothness sample is skipped."""
    for s in shards:
        key = f"p{s.index}."
        best: dict[str, np.ndarray] | None = None
        most = 0
        for part, chain in zip(parts, chains, strict=True):
            whole = {k[len(key):]: v for k, v in part.load().items() if k.startswith(key)}
            if not whole:
                continue
            rows = np.unique(np.concatenate([q.load()[f"t{s.index}.rows"].astype(np.int64) for q in chain]))
            mine = int(np.count_nonzero(s.partition.owner(rows) == s.rank)) if rows.size else 0
            if best is None or mine > most:
                best, most = whole, mine
        if best is not None:
            best["prev_mean"] = np.empty((0,))
            try:
                s.procedure.load_table_state(best)
            except ValueError as e:
                raise ConfigError(f"--resume {parts[0].path.parent}: table {s.cfg.name!r}: {e}") from None


def _apply_corrections(where: Path, clock: int, rank: int, shards: list[TableShard],
                       redo: dict[int, tuple[int, int]]) -> None:
    """Take the corrections beside this server's part of ``clock`` (in directory ``where``;
    ``ServerCheckpoints.correct``) back out of the restored shards; ``redo``: each corrected worker
    rank -> (C, T): its client resends from C."""
    for path in sorted(where.glob(f"redo.server-{rank}.rank-*.npz")):
        worker = int(path.stem.rpartition("-")[2])
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        n = sum(1 for k in arrays if k.endswith(".table"))
        for i in range(n):
            table = int(arrays[f"b{i}.table"][0])
            batch = UpdateBatch(arrays[f"b{i}.rows"], arrays[f"b{i}.values"], arrays.get(f"b{i}.indptr"),
                                arrays.get(f"b{i}.cols"))
            shards[table].apply(batch, worker)
        redo[worker] = (int(arrays["since"][0]), int(arrays["held"][0]))
        log.warning("server %d's part of clock %d held worker rank %d's updates since clock %d, taken back "
                    "after it was saved: %d batches taken out again; that rank resends from clock %d", rank,
                    clock, worker, redo[worker][0], n, redo[worker][0])


def _check_fingerprint(part: checkpoint.Part, config: Config, any_fp: Callable[[int], str]) -> None:
    """``part`` is of this job's model, made by the workers its manifest records (a job with
    micro-tasks may have resumed with another count since)."""
    made_by = part.meta.get("workers", config.cluster.workers)
    if part.meta.get("fingerprint") != any_fp(int(made_by)):
        raise checkpoint.CheckpointError(f"{part.path}: made for another job (tables/servers/workers fingerprint "
                                         f"{part.meta.get('fingerprint')}, this job's is {any_fp(int(made_by))})")


def _load(shards: list[TableShard], part: checkpoint.Part, owned_only: bool = False) -> None:
    """Put a part's rows (all of a shard's, or those a priority checkpoint saved) and their
    stored-procedure state into ``shards``; with ``owned_only``, only the rows this server owns
    (a part made by another server of a job whose servers changed)."""
    arrays = part.load()
    saved = part.info.get("tables", {})
    for s in shards:
        name, key = s.cfg.name, f"t{s.index}"
        values = arrays.get(f"{key}.values")
        rows = arrays.get(f"{key}.rows")
        if values is None or rows is None or saved.get(key, {}).get("name") != name:
            raise ConfigError(f"--resume {part.path}: table {name!r} is not in the checkpoint")
        if values.ndim != 2 or values.shape[1:] != s.values.shape[1:] or values.dtype != s.values.dtype \
                or rows.shape != values.shape[:1]:
            raise ConfigError(f"--resume {part.path}: table {name!r} is {values.shape} {values.dtype} there, "
                              f"rows of {s.values.shape[1]} {s.values.dtype} here")
        mine = s.partition.owner(rows.astype(np.int64)) == s.rank if owned_only else None
        if mine is not None:
            rows, values = rows[mine], values[mine]
        try:
            local, _ = s.local_rows(rows.astype(np.int64), "checkpoint")
        except ProtocolError as e:
            raise ConfigError(f"--resume {part.path}: {e}") from None
        s.values[local] = values
        live = s.procedure.state()
        extra = sorted({k[len(key) + 1:] for k in arrays if k.startswith(f"{key}.")} - {"values", "rows", *live})
        if extra:
            raise ConfigError(f"--resume {part.path}: table {name!r}: procedure state {extra[0]!r} is not kept by "
                              f"update {s.cfg.update!r}")
        for k, arr in live.items():
            got = arrays.get(f"{key}.{k}")
            if got is not None and mine is not None and got.shape[:1] == mine.shape:
                got = got[mine]
            if got is None or got.shape[1:] != arr.shape[1:] or got.shape[0] != local.shape[0]:
                raise ConfigError(f"--resume {part.path}: table {name!r}: procedure state {k!r} is missing or "
                                  f"misshapen")
            arr[local] = got
        whole = {k[len(f"p{s.index}."):]: v for k, v in arrays.items() if k.startswith(f"p{s.index}.")}
        if whole and not owned_only:  # another server's part: its own shard's iteration and estimator
            try:
                s.procedure.load_table_state(whole)
            except ValueError as e:
                raise ConfigError(f"--resume {part.path}: table {name!r}: {e}") from None


def _has_own(base: Path, rank: int) -> bool:
    """Whether this server finished any part under ``base`` (a meta.json is written last)."""
    name = checkpoint.part_name("server", rank)
    if (base / name / "meta.json").exists():  # ``base`` is one checkpoint
        return True
    return any((checkpoint.clock_dir(base, c) / name / "meta.json").exists() for c in checkpoint.clocks(base)) \
        or any((checkpoint.move_dir(base, c, v) / name / "meta.json").exists() for c, v in checkpoint.moves(base))


def _newest_own(base: Path, rank: int, config: Config, any_fp: Callable[[int], str]) -> checkpoint.Part:
    """This server's newest valid part, made by this job's model with the workers its manifest
    records (a lost server right after a resume with another worker count restores the part the job
    resumed from, made by the workers before). Its part of a partition move at clock S is newer than
    its checkpoint parts of clocks up to S (the one of S was saved when its clock got there, before the
    clients paused for the move) and older than those after."""
    name = checkpoint.part_name("server", rank)
    problems = []
    found = [(c, 0, 0, checkpoint.clock_dir(base, c) / name) for c in checkpoint.clocks(base)]
    found += [(c, 1, v, p) for c, v in checkpoint.moves(base) if (p := checkpoint.move_dir(base, c, v) / name).exists()]
    for _, _, _, where in sorted(found, key=lambda x: x[:3], reverse=True):
        try:
            part = checkpoint.read_part(where, None)
            _check_fingerprint(part, config, any_fp)
            return part
        except checkpoint.CheckpointError as e:
            problems.append(str(e))
            log.warning("skipped checkpoint part: %s", e)
    raise checkpoint.CheckpointError(f"{base}: no valid part {name} ({'; '.join(problems) or 'none written'})")
