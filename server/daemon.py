"""The server daemon: one ROUTER socket, one event loop, a table of message handlers.

Lifecycle follows setup / serve / stop: ``start()`` binds, ``serve()`` runs until ``stop()`` (or a
signal) and ``close()`` releases the socket. Handlers are plain functions keyed by message type; a
handler that raises ProtocolError produces an ERROR reply to the sender and one log line, and the
loop goes on. All state lives in this object: no globals.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from bosen import checkpoint, rowmath, wire
from bosen.config import Config
from bosen.errors import ConfigError, Moving, NotOwned, ProtocolError
from bosen.metrics import Durations, mbps, send_histogram
from bosen.partition import Partition
from bosen.phases import Phases
from bosen.procedure import StoredProcedure
from bosen.ratelimit import LeakyBucket, paced_sender
from bosen.security import Authenticator, KeyFileError, Security, is_loopback, load_allowed, server_socket
from bosen.security import describe as describe_security
from bosen.server import procedures
from bosen.server.backup import BackupStep
from bosen.server.checkpoints import Complete, ServerCheckpoints, restore
from bosen.server.moves import Joining, PartitionMoves
from bosen.server.shard import TableShard
from bosen.server.undo import UndoLog
from bosen.server.warmup import warm_up
from bosen.wire import Msg
from bosen.zsocket import LoopSocket

log = logging.getLogger("bosen.server")

GONE = np.iinfo(np.int64).max  # clock of a client that left: it holds nobody back
YIELD_EVERY = 8  # messages handled before other tasks (the push loop) get a turn
CHUNK_BYTES = 1 << 20  # most value bytes in one ROWS message
MAX_RUNS = 4  # a push to a subscriber whose rows are at most this many runs of the pushed ones shares their frames
# A joined client not heard from for this long gets a PING. A client that died without BYE (killed,
# its machine gone) has no connection left (its TCP connection closed, or ZeroMQ's heartbeats below
# timed out), so the send fails and the client is let go: the job's clock no longer waits for it, and
# the row versions it held are released. Busy clients are never pinged.
PROBE_S = 2.0
HEARTBEAT_IVL_MS = 2000
HEARTBEAT_TIMEOUT_MS = 10000


def _left_since(shape: Joining | None, gone: Sequence[int]) -> list[int]:
    """The clocks at which worker ranks left the job (BYE; ``bosen scale``'s leavers): what they sent
    after a part is in no resend log, so a replacement restores no part older than those clocks. A
    rank that ended its clocks (``gone``) counts as leaving at the end (GONE): when is not known here."""
    left = [GONE for _ in gone]
    if shape is not None and shape.left_at is not None:
        left += [int(x) for r, (live, x) in enumerate(zip(shape.client_clocks, shape.left_at, strict=True))
                 if live == "left" and x is not None and r not in gone]
    return left


@dataclass
class Peer:
    """A joined client process."""

    ident: bytes
    rank: int
    last_seq: int
    hello_seq: int = -1  # its HELLO's number: a peer that sent nothing since may be replaced by a new HELLO
    applied: int = -1  # sequence number of the last INC applied
    gone: bool = False
    leaving: bool = False  # sent BYE with "ph" (prepare): gets no more pushes
    heard: float = 0.0  # when its last message came (time.monotonic)
    pushes_sent: int = 0  # budgeted pushes, acknowledged with PUSH_ACK
    pushes_acked: int = 0
    rows_msgs: int = 0  # ROWS messages sent to it, on any of its connections ("ss": their order)
    clock: int = 0  # the last clock it sent (a replacement's redo runs below the rank's clock in client_clock)


@dataclass
class Reader:
    """A client's extra connection for a worker thread's blocking reads: READ in, ROWS out."""

    peer: Peer
    last_seq: int


class Server:
    def __init__(self, config: Config, rank: int, bind: str | None = None, resume: Path | None = None,
                 recover: bool = False, gone: tuple[int, ...] = (), hold_lost: bool = False,
                 join: Joining | None = None, shape: Joining | None = None) -> None:
        """``resume``: start from a checkpoint (the whole job's, or with ``recover`` this server's own
        newest part, replacing a lost server while the others run on); ``gone``: worker ranks that
        already left the job (a replacement does not wait for them); ``hold_lost``: a worker lost
        without BYE keeps its clock until a replacement of its rank joins (``bosen launch`` starts
        one in a job with checkpoints), so the others are not released early; ``join``: a server
        added to a running job (``rank`` is then the next after its servers; it holds no partition
        until a move gives it some: server/moves.py); ``shape``: with ``recover``, the running job's
        servers and partition map (servers joined or left it), which its newest part must have been
        saved under."""
        config.require_tables()
        if join is not None:
            if resume is not None or recover:
                raise ValueError("--join: a server joining a running job starts empty (no --resume/--recover)")
            rank = len(join.servers)
            self.addresses = [*join.servers, join.address]
        elif shape is not None:
            if not recover or not 0 <= rank < len(shape.servers):
                raise ValueError(f"--shape-from: --recover --rank N with N one of the job's {len(shape.servers)} "
                                 f"servers, not {rank}")
            if len(shape.client_clocks) != config.cluster.workers and shape.joined_at is None:
                raise ValueError(f"--shape-from: workers joined or left the job ({len(shape.client_clocks)} ranks, the "
                                 f"config has {config.cluster.workers}), but that server's STATUS does not say when "
                                 "(no joined_at/left_at): start the replacement from a server of this version")
            self.addresses = list(shape.servers)
        elif not 0 <= rank < len(config.cluster.servers):
            raise ValueError(f"--rank {rank}: the config lists {len(config.cluster.servers)} servers "
                             f"(ranks 0..{len(config.cluster.servers) - 1}) in {config.source}")
        else:
            self.addresses = list(config.cluster.servers)  # the job's servers now (servers/moves.py changes it)
        self.config = config
        self.rank = rank
        self.address = self.addresses[rank]
        self.joined_live = join is not None  # its clients send HELLO with their clock ("jc")
        port = self.address.rpartition(":")[2]
        self.bind_address = f"tcp://{bind or self.address.rpartition(':')[0]}:{port}"
        # a replacement in a job whose workers joined or left counts the job's ranks now, not the config's
        self.num_clients = len(join.client_clocks) if join is not None else len(shape.client_clocks) \
            if shape is not None else config.cluster.workers
        self.hold_lost = hold_lost
        self.partition = Partition(len(self.addresses), config.cluster.num_partitions) if join is None \
            else Partition(len(self.addresses), join.owner.shape[0], join.owner, join.version)
        self.fingerprint = config.fingerprint()
        self.security = Security.load(config, "server")  # None: no CURVE (bosen/security.py)
        bind_host = self.bind_address.removeprefix("tcp://").rpartition(":")[0]
        if self.security is None and config.security.mode == "auto" and not is_loopback(bind_host):
            raise ConfigError(f"{config.source}: --bind {bind_host} listens beyond loopback, but cluster.servers "
                              "are all loopback, so security would be off: set security.mode: on (with keys, "
                              "`bosen keys DIR`), or security.mode: off to accept plaintext there")
        self._auth: Authenticator | None = None
        self.shards = [
            TableShard(i, t, self.partition, rank, self.num_clients, procedures.load(t, config.source), config.comm,
                       counts=config.metrics.freshness_every > 0)
            for i, t in enumerate(config.tables)
        ]
        # per table, what clients may do (WELCOME "tf"): the server is the source of truth
        self.table_flags = [(wire.TF_READ_MY_WRITES if procedures.read_my_writes(s.cfg, s.procedure) else 0)
                            | (wire.TF_VERSIONED if s.procedure.versioned else 0) for s in self.shards]
        for s, f in zip(self.shards, self.table_flags, strict=True):
            # plain addition mirrored in the writer's cache: a row only it changed need not go back to it
            s.skip_own = bool(f & wire.TF_READ_MY_WRITES) and type(s.procedure) is StoredProcedure
        self.comm = config.comm
        self.bucket = LeakyBucket(config.comm.server_bandwidth_mbps) if config.comm.enabled else None
        self._rotation = 0
        self._restored_redo: dict[int, tuple[int, int]] = {}  # a recovered part's corrections: rank -> (C, T)
        part: dict[str, Any] = {}  # the restored part's info (partial recovery)
        # a replacement of a server whose lost workers are taken back restores its part of the newest
        # complete checkpoint (where it can): it then takes back anything a lost worker's replacement redoes
        complete = Complete(_left_since(shape, gone)) if recover and hold_lost and config.checkpoint else None
        self.clock = restore(config, rank, self.shards, resume, own=recover, redo=self._restored_redo,
                             servers=len(self.addresses), info=part, complete=complete) if resume is not None else 0
        if shape is not None and self.shards[0].partition.version != shape.version:
            # rows it gained by a move after its part are in no part of its own: the job must resume whole
            raise ValueError(f"--recover: server {rank}'s newest checkpoint part was saved under partition map "
                             f"{self.shards[0].partition.version}, but the job follows map {shape.version} (partitions "
                             "moved since): it cannot be replaced alone; resume the whole job from its checkpoint")
        if join is not None:
            self.clock = join.clock
        self.restored = self.clock if resume is not None else None  # WELCOME "rc": clients resend from it
        self.partition = self.shards[0].partition  # a checkpoint saved after partitions moved keeps their map
        if recover and any(s.procedure.versioned for s in self.shards):
            raise ValueError("--recover: versioned tables (AdaRevision) cannot be recovered on their own (clients "
                             "hold row versions of the lost server); resume the whole job instead")
        self.client_clock = np.full(self.num_clients, self.clock, dtype=np.int64)
        # per rank, the clock it joined at and (said BYE) left at: which ranks' parts make a checkpoint
        self.joined_at = [self.clock] * self.num_clients
        self.left_at: dict[int, int] = {}
        for r in gone:
            if not 0 <= r < self.num_clients:
                raise ValueError(f"--gone {r}: no such worker rank (cluster.workers is {self.num_clients})")
            self.client_clock[r] = GONE
        if join is not None:  # ranks that left; the others' clocks come with their HELLO
            self.client_clock[[c == "left" for c in join.client_clocks]] = GONE
            if join.joined_at is not None and join.left_at is not None:  # as server 0 knows them (its STATUS)
                self.joined_at = [GONE if j is None else j for j in join.joined_at]
                self.left_at = {r: x for r, x in enumerate(join.left_at) if x is not None}
        if shape is not None:
            self._take_ranks(shape, gone, part.get("client_clocks"))
        # restored from its part of a partition move (server/checkpoints.py save_move): each client resends
        # what followed its PAUSED, of ticks from its clock then on (WELCOME "rf")
        moved = part.get("move")
        self.moved_from: int | None = moved if isinstance(moved, int) and recover else None
        self._move_clocks: dict[int, int] = {}
        if self.moved_from is not None:
            for r, c in enumerate(part.get("client_clocks", [])):
                if r < self.num_clients and c != GONE and self.client_clock[r] != GONE:
                    self._move_clocks[r] = int(c)
                    self.client_clock[r] = max(int(self.client_clock[r]), int(c))
        # synchronous tables with backup workers (server/backup.py): their own iteration, their parked reads
        self.backups = {s.index: s.procedure for s in self.shards if isinstance(s.procedure, BackupStep)}
        self.backup_parked: dict[int, list[tuple[Peer, int, bytes, int, np.ndarray]]] = {i: [] for i in self.backups}
        # the job's ranks now (a server started in a job that scaled: fewer, or others); a replacement
        # restored at C counts a rank that joined after C from the clock it joined at, as its resend does
        later = {r: int(self.joined_at[r]) for r in range(self.num_clients)
                 if self.client_clock[r] != GONE and self.joined_at[r] != GONE and self.joined_at[r] > self.clock}
        members = [r for r in range(self.num_clients) if (self.client_clock[r] != GONE or r in gone) and r not in later]
        for b in self.backups.values():
            b.start(config.cluster.workers, self.clock, time.monotonic(),
                    None if members == list(range(config.cluster.workers)) else members)
            for r in gone:
                b.left(r, time.monotonic())
            for r, at in later.items():
                b.joined(r, at)
        self.checkpoints = ServerCheckpoints(config, rank) if config.checkpoint is not None else None
        if self.checkpoints is not None and complete is not None and complete.clock is not None:
            self.checkpoints.restored_complete(complete.clock, complete.kept)
        if self.checkpoints is not None:
            self.checkpoints.start_running(self.shards)
            if resume is not None:  # priority checkpoints: parts before a restart are never chained with later ones
                self.checkpoints.base_next(self.shards)
        # a lost worker's updates since the checkpoint its replacement restarts from, taken back when
        # the replacement joins (plain-addition tables; server/undo.py). Restored from a move part: its
        # values hold every update of ticks up to each client's clock at the move, none of them logged
        start = max([self.clock, *(c + 1 for c in self._move_clocks.values())])
        self.undo = UndoLog(start) if hold_lost and self.checkpoints is not None else None
        self._undoable = [type(s.procedure) is StoredProcedure for s in self.shards]
        self._redoing: dict[int, int] = {}  # rank -> the clock its replacement restarted from, while it redoes
        # rank -> the last clock it sends (BYE or HELLO "fc": a scale-in's leaver at its boundary, connected
        # until it may leave); once its clock is there it holds the server's clock back no more
        self.final: dict[int, int] = {}
        # rank -> (C, T): parts of clocks in (C, T] were saved before rank's updates since C were taken
        # back; until a part after T is on disk, that rank's client keeps what it sent since C (SCLOCK cp)
        self._redo_cp: dict[int, tuple[int, int]] = dict(self._restored_redo)
        self._advancing = False
        self._pushing: asyncio.Task[None] | None = None  # a clock-advance push sent in turns with reading
        self._failed: BaseException | None = None  # what ended it, if not stop()
        self.peers: dict[bytes, Peer] = {}
        self.by_rank: dict[int, Peer] = {}
        self.readers: dict[bytes, Reader] = {}
        # reads waiting for a clock: (client, its READ's number, the connection to answer on, rows)
        self.parked: dict[int, list[tuple[Peer, int, bytes, TableShard, np.ndarray]]] = {}
        self.counters = dict(bytes_in=0, bytes_out=0, msgs_in=0, msgs_out=0, rows_applied=0,
                             rows_pushed=0, rows_pushed_budgeted=0, budgeted_pushes=0, push_holds=0, idle_polls=0,
                             rows_read=0, reads_parked=0, errors=0, clock_advances=0, window_paused_s=0.0,
                             clients_lost=0, push_gathers=0, push_shared_msgs=0, push_part_msgs=0,
                             push_own_gathers=0, pushes_in_turns=0, probes=0, rows_taken_back=0,
                             rows_lapsed=0, checkpoints_deferred=0)
        # an INC's time from being read off the socket to being applied (longer only when held at a
        # checkpoint boundary), and each push's time, during which the loop reads nothing
        self.apply_lag = Durations()
        self.push_stall = Durations()
        # metrics.profile: the loop thread's time per message kind handled, and "push" (row pushes,
        # taken out of the CLOCK handling that makes them): STATUS's "phases"
        self.phases = Phases() if config.metrics.profile else None
        self._kind: Msg | None = None  # the kind of the message being handled
        self._read_at = 0.0  # when the message being handled was read off the socket
        self.started = time.time()
        self._cpu_at_start = time.process_time()  # reset by start(), after the warm-up
        self.handlers: dict[Msg, Callable[[bytes, dict[str, Any], list[Any]], None]] = {
            Msg.HELLO: self.on_hello,
            Msg.INC: self.on_inc,
            Msg.READ: self.on_read,
            Msg.CLOCK: self.on_clock,
            Msg.BYE: self.on_bye,
            Msg.STATUS: self.on_status,
            Msg.PUSH_ACK: self.on_push_ack,
            Msg.PROBE: self.on_probe,
            Msg.FLUSH: self.on_flush,
            Msg.PAUSED: self.on_paused,
            Msg.MOVE: self.on_move,
            Msg.LEFT: self.on_left,
            Msg.SAVE: self.on_save,
        }
        self.moves = PartitionMoves(self)
        self._ctx: zmq.Context | None = None
        self._sock: LoopSocket | None = None
        self._stopped = asyncio.Event()
        self._linger_ms = 0  # on close: what is still queued is dropped (but see retire)

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        # numba kernels loaded before anyone is answered (server/warmup.py); a server that joined: a rank's
        warm_up(self.config, min(self.rank, len(self.config.cluster.servers) - 1))
        self._cpu_at_start = time.process_time()  # STATUS's cpu_s: serving, not imports and warm-up
        self._ctx = zmq.Context()
        sock, self._auth = server_socket(self._ctx, zmq.ROUTER, self.security, f"server {self.rank}")
        sock.setsockopt(zmq.SNDHWM, 0)  # never drop: flow control is the clients' unacked window
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a vanished peer is an error, not a silent drop
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        try:
            sock.bind(self.bind_address)
        except zmq.ZMQError:
            sock.close(0)
            self.close()  # the authenticator's thread and the context, before the error is reported
            raise
        self._sock = LoopSocket(sock, asyncio.get_running_loop(), self._dispatch, batch=YIELD_EVERY)
        rows = sum(s.stored for s in self.shards)
        log.info("server %d listening on %s: %d tables, %d rows, %d clients expected; %s", self.rank,
                 self.bind_address, len(self.shards), rows, self.num_clients, describe_security(self.config))

    async def serve(self) -> None:
        assert self._sock is not None, "start() first"
        self._sock.start()  # messages are handled by the socket's reader callback from here on
        tasks = [asyncio.ensure_future(self._probe_loop())]
        if self.bucket is not None:
            tasks.append(asyncio.ensure_future(self._push_loop()))
        stopper = asyncio.ensure_future(self._stopped.wait())
        try:
            done, _ = await asyncio.wait({*tasks, stopper}, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if t is not stopper:
                    t.result()  # re-raise what killed a background task
            if self._failed is not None:
                raise self._failed
        finally:
            if self._pushing is not None:
                tasks.append(self._pushing)
            for t in (*tasks, stopper):
                t.cancel()
            await asyncio.gather(*tasks, stopper, return_exceptions=True)

    def stop(self) -> None:
        self._stopped.set()

    def live_ranks(self) -> list[int]:
        """The worker ranks in the job now (not left): those a partition move waits for."""
        return [r for r in range(self.num_clients) if self.client_clock[r] != GONE]

    def retire(self) -> None:
        """Stop after leaving the job (server/moves.py): what is queued (the answer saying so) still goes."""
        self._linger_ms = 2000
        self.stop()

    def reload_keys(self) -> None:
        """Read ``security.allowed_clients`` again (``bosen-server`` on SIGHUP): clients added or
        revoked while the job runs. A list that cannot be read is logged and the old one kept: the
        server keeps serving whom it served."""
        if self._auth is None:
            log.warning("SIGHUP: this server runs without CURVE security; no client keys to reload")
            return
        try:
            allowed = load_allowed(self.config.security.allowed_clients)
        except KeyFileError as e:
            log.error("SIGHUP: security.allowed_clients not reloaded, the %d keys in use stay: %s",
                      len(self._auth.allowed), e)
            return
        added, removed = len(allowed - self._auth.allowed), len(self._auth.allowed - allowed)
        self._auth.reload(allowed)
        log.info("SIGHUP: security.allowed_clients reloaded: %d keys (%d added, %d removed; connections "
                 "already made stay)", len(allowed), added, removed)

    def close(self) -> None:
        if self.checkpoints is not None:
            self.checkpoints.close()  # what was saved so far reaches the disk
        if self._sock is not None:
            self._sock.close(linger=self._linger_ms)
            self._sock = None
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        log.info("server %d stopped at clock %d", self.rank, self.clock)

    # -- plumbing ------------------------------------------------------------------------------

    def _dispatch(self, frames: list[Any]) -> None:
        ph = self.phases
        if ph is None:
            self._handle(frames)
            return
        t = ph.start()
        try:
            self._handle(frames)
        finally:  # per message kind: "inc" (apply), "clock" (less its pushes), "read", ...
            ph.stop(self._kind.name.lower() if self._kind is not None else "bad", t)

    def _handle(self, frames: list[Any]) -> None:
        self._kind = None
        ident, body = frames[0].bytes, frames[1:]
        self._read_at = time.perf_counter()
        self.counters["msgs_in"] += 1
        self.counters["bytes_in"] += sum(map(len, body))
        seq = -1
        try:
            if not body:
                raise ProtocolError("empty message")
            h = wire.decode_header(body[0])
            self._kind = h.get("t")
            seq = h.get("s", -1) if isinstance(h.get("s"), int) else -1
            handler = self.handlers.get(h["t"])
            if handler is None:
                raise ProtocolError(f"{h['t'].name} is not a message a server accepts")
            wire.check_frames(h, len(body) - 1)
            handler(ident, h, body[1:])
        except ProtocolError as e:
            self.counters["errors"] += 1
            log.warning("rejected message from %s: %s", self._who(ident), e)
            self._send(ident, {"t": Msg.ERROR, "rq": seq, "m": str(e)})
        except Exception as e:  # a bug must not take the server down; say so loudly
            self.counters["errors"] += 1
            log.exception("internal error handling a message from %s", self._who(ident))
            self._send(ident, {"t": Msg.ERROR, "rq": seq, "m": f"internal server error: {e!r}"})

    def _send(self, ident: bytes, header: dict[str, Any], *arrays: np.ndarray, owned: np.ndarray | None = None) -> int:
        """Arrays are copied into the message, except ``owned`` (one that is never written again)."""
        return self._send_frames(ident, wire.encode(header, *arrays, owned=owned), header["t"])

    def _send_frames(self, ident: bytes, frames: list[Any], kind: Msg) -> int:
        sock = self._sock
        assert sock is not None, "start() first"
        try:
            sock.send([ident, *frames])
        except zmq.ZMQError as e:  # EHOSTUNREACH: the peer disconnected
            self._send_failed(ident, kind, e)
        nbytes = sum(f.nbytes if isinstance(f, memoryview) else len(f) for f in frames)
        self.counters["msgs_out"] += 1
        self.counters["bytes_out"] += nbytes
        if self.bucket is not None:
            self.bucket.charge(nbytes)  # every byte counts against the budget, delayed or not
        return nbytes

    def _send_failed(self, ident: bytes, kind: Msg, err: Exception) -> None:
        if self.readers.pop(ident, None) is not None:  # a worker's read connection closed: nothing lost
            log.info("cannot send %s to a read connection of %s: %s", Msg(kind).name, self._who(ident), err)
            return
        peer = self.peers.get(ident)
        log.warning("cannot send %s to %s: %s", Msg(kind).name, self._who(ident), err)
        if peer is not None and not peer.gone:
            self._leave(peer)

    def _who(self, ident: bytes) -> str:
        reader = self.readers.get(ident)
        if reader is not None:
            return f"client rank {reader.peer.rank} (read connection)"
        peer = self.peers.get(ident)
        return f"client rank {peer.rank}" if peer else f"unjoined peer {ident.hex()}"

    def _peer(self, ident: bytes, h: dict[str, Any]) -> Peer:
        reader = self.readers.get(ident)
        if reader is not None:
            if h["t"] != Msg.READ:
                raise ProtocolError(f"{h['t'].name}: a read connection sends READ only")
            if h["s"] <= reader.last_seq:
                raise ProtocolError(f"READ: sequence number {h['s']} not above {reader.last_seq}")
            reader.last_seq = h["s"]
            return reader.peer
        peer = self.peers.get(ident)
        if peer is None or peer.gone:
            raise ProtocolError(f"{h['t'].name}: sender has not joined (send HELLO first) or has left")
        if h["s"] <= peer.last_seq:
            raise ProtocolError(f"{h['t'].name}: sequence number {h['s']} not above {peer.last_seq}")
        peer.last_seq = h["s"]
        peer.heard = time.monotonic()
        return peer

    def _shard(self, h: dict[str, Any]) -> TableShard:
        tb = h["tb"]
        if not 0 <= tb < len(self.shards):
            raise ProtocolError(f"{h['t'].name}: unknown table index {tb} (job has {len(self.shards)} tables)")
        return self.shards[tb]

    # -- handlers ------------------------------------------------------------------------------

    def on_hello(self, ident: bytes, h: dict[str, Any], frames: list[Any]) -> None:
        if h["fp"] != self.fingerprint:
            raise ProtocolError(f"HELLO: client config differs from this server's (cluster/tables fingerprint "
                                f"{h['fp']} vs {self.fingerprint}): start every process from the same config")
        if ident in self.peers or ident in self.readers:
            raise ProtocolError("HELLO: this connection has already joined")
        rank = h["rank"]
        if wire.is_reader(h):  # a joined client's read connection (one per worker thread)
            peer = self.by_rank.get(rank) if isinstance(rank, int) else None
            if peer is None or peer.gone:
                raise ProtocolError(f"HELLO: read connection for worker rank {rank}, which has not joined "
                                    f"(or has left)")
            self.readers[ident] = Reader(peer, last_seq=h["s"])
            self._send(ident, {"t": Msg.WELCOME, "rq": h["s"], "rank": rank, "c": self.clock})
            return
        if "jn" in h:
            self._join(ident, h, rank)
            return
        if rank == -1:
            if self.rank != 0:
                raise ProtocolError("HELLO: only server 0 assigns ranks; send the rank it gave you")
            free = [r for r in range(self.num_clients) if r not in self.by_rank]
            if not free:
                raise ProtocolError(f"HELLO: the job is full: all {self.num_clients} worker ranks have joined")
            rank = free[0]
        if not 0 <= rank < self.num_clients:
            raise ProtocolError(f"HELLO: rank {rank} out of range: cluster.workers is {self.num_clients}")
        if "rp" in h:
            self._rejoin(ident, h, rank)
            return
        old = self.by_rank.get(rank)
        if old is not None and self.restored is not None and not old.gone and old.last_seq == old.hello_seq:
            # a client rejoining a replacement server whose first WELCOME it gave up waiting for
            del self.peers[old.ident]
            del self.by_rank[rank]
        elif old is not None:
            state = "left the job" if old.gone else "already joined"
            raise ProtocolError(f"HELLO: worker rank {rank} {state}")
        if "jc" in h:  # a running client connecting to this server, added to the job: its clock so far
            self._check_clock_field(h["jc"], "HELLO", "jc")
            if not self.joined_live or self.client_clock[rank] == GONE:
                raise ProtocolError("HELLO: 'jc' (a running client's clock) is only for a server added to a "
                                    "running job, from a worker still in it")
            self.client_clock[rank] = max(int(self.client_clock[rank]), h["jc"])
        clock = int(self.client_clock[rank])
        if "cs" in h:  # rejoining a replacement of this server: its CLOCKs go on from the last it sent
            self._check_clock_field(h["cs"], "HELLO", "cs")
            clock = min(clock, h["cs"])  # below the rank's clock: a replacement worker redoing its ticks
            if self.restored is not None:  # it resends its gradients of ticks below "cs": they may be ahead
                for backup in self.backups.values():
                    backup.resending(rank, h["cs"])
        if self.restored is not None:  # what it resends (from the clock WELCOME names, or since it joined) comes first
            clock = min(clock, self._resent_from_clock(rank))
        if "fc" in h:  # it ended its clocks (a leaver waiting at its boundary): it counts until its resend gets there
            self._end_clocks(rank, clock, h["fc"], "HELLO")
        peer = Peer(ident, rank, last_seq=h["s"], hello_seq=h["s"], heard=time.monotonic(), clock=clock)
        self.peers[ident] = peer
        self.by_rank[rank] = peer
        log.info("client rank %d joined (%d/%d)", rank, len(self.by_rank), self.num_clients)
        self._welcome(ident, h, rank)
        if "jc" in h or "fc" in h:
            self._maybe_advance()

    def _take_ranks(self, shape: Joining, gone: tuple[int, ...], recorded: Any) -> None:
        """A lost server's replacement in a job whose workers joined or left (``--shape-from``): the
        job's ranks now, against those its restored part (clock C) recorded (``recorded``: the
        clocks it saved per rank). A rank in the job at C counts from C (its resend starts there); one
        that joined since, from the clock it joined at (its whole resend log is since then, so its
        messages past a boundary are held as they should be); one kept for a joiner not yet joined,
        or gone, holds nobody back. A rank that left by BYE after C (``bosen scale`` let it go) sent
        this server updates since C that nobody can resend (its process and resend log are gone):
        refused, since the tables would not be exact, unless the launcher names it as finished
        (``gone``: it ended its clocks, and what it sent since C is lost as in a job that never
        scaled, docs/recovery.md)."""
        if shape.joined_at is None or shape.left_at is None:
            return  # a server that does not say: the config's ranks, as before
        c = self.clock
        saved = [int(x) for x in recorded] if isinstance(recorded, list) else None
        if saved is not None and len(saved) > self.num_clients:
            raise ValueError(f"--recover: this server's part of clock {c} records {len(saved)} worker ranks, but the "
                             f"running job has {self.num_clients}: the part is not of this job")
        joined, left_since = [], []
        for r, (live, j, left) in enumerate(zip(shape.client_clocks, shape.joined_at, shape.left_at, strict=True)):
            if j is None:  # kept for a joiner that has not joined yet: its HELLO ("jn") comes here as well
                self.joined_at[r] = GONE
                self.client_clock[r] = GONE
                continue
            in_part = saved is not None and r < len(saved) and saved[r] != GONE
            if j < c and saved is not None and not in_part and (left is None or left > c):
                raise ValueError(f"--recover: worker rank {r} joined the job at clock {j}, before this server's part "
                                 f"of clock {c}, which does not record it: the part is not of this job")
            self.joined_at[r] = j
            if left is not None:
                self.left_at[r] = left
            if live == "left":
                self.client_clock[r] = GONE
                if left is not None and left > c:
                    if r not in gone:
                        raise ValueError(
                            f"--recover: worker rank {r} left the job at clock {left} (bosen scale), after this "
                            f"server's newest checkpoint part (clock {c}): the updates it sent this server since "
                            "then left with it (its process, which would resend them, has exited), so a "
                            "replacement would not be exact; resume the whole job from its newest complete "
                            "checkpoint (bosen launch --resume)")
                    left_since.append(r)
            elif j > c:
                self.client_clock[r] = j
                joined.append(r)
        if joined or left_since:
            log.warning("replacing server %d of a job whose workers changed: from clock %d, %d ranks; joined since: "
                        "%s; finished since (what they sent here after clock %d is lost): %s", self.rank, c,
                        self.num_clients, joined, c, left_since)

    def _welcome(self, ident: bytes, h: dict[str, Any], rank: int) -> None:
        welcome = {"t": Msg.WELCOME, "rq": h["s"], "rank": rank, "c": self.clock, "tf": self.table_flags}
        if self.restored is not None:
            welcome["rc"] = self._resend_from(rank)
            if self.moved_from is not None:
                welcome["rf"] = self.moved_from
        if self.addresses != list(self.config.cluster.servers):  # servers joined or left: clients follow
            welcome["sv"] = self.addresses
        if self.partition.version:  # partitions moved (or a checkpoint saved after they did): the map follows
            welcome["mv"] = self.partition.version
            self._send(ident, welcome, self.partition.owner_of)
            return
        self._send(ident, welcome)

    def _join(self, ident: bytes, h: dict[str, Any], rank: Any) -> None:
        """HELLO with ``jn`` = C: a worker joins the running job as a new rank (``bosen scale``), starting
        at clock C: one never used (ranks are never reused), past those so far (server 0 gives the next
        to ``rank`` -1; the scaler names them). Several joining at once may arrive in any order: ranks
        skipped are kept free (clock GONE, holding nobody back) until theirs joins. C must not be below
        this server's clock: the server's clock, the minimum over the clients, then does not go back,
        and the newcomer's updates of ticks >= C reach values that vouch only for earlier ones (SSP stays
        exact). Its reads wait as any worker's at tick C (for clock C - s)."""
        start = h["jn"]
        if not isinstance(start, int) or isinstance(start, bool) or start < 0:
            raise ProtocolError(f"HELLO: field 'jn' (the clock a joining worker starts at) must be an int >= 0, "
                                f"got {start!r}")
        if start < self.clock:
            raise ProtocolError(f"HELLO: a worker joining at clock {start}, but this server is at clock {self.clock} "
                                f"already (every worker passed it): join at a later boundary")
        if rank == -1 and self.rank == 0:
            rank = self.num_clients
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
            raise ProtocolError(f"HELLO: a joining worker needs a rank (-1 at server 0: the next), got {rank!r}")
        if rank < self.num_clients and (rank in self.by_rank or self.joined_at[rank] != GONE):
            raise ProtocolError(f"HELLO: worker rank {rank} is taken (ranks are never reused): a joining worker takes "
                                f"a new one, {self.num_clients} or above here")
        while self.num_clients <= rank:
            self.add_client()
        self.client_clock[rank] = start
        self.joined_at[rank] = start
        peer = Peer(ident, rank, last_seq=h["s"], hello_seq=h["s"], heard=time.monotonic(), clock=start)
        self.peers[ident] = peer
        self.by_rank[rank] = peer
        log.info("worker rank %d joined the running job at clock %d (server clock %d; %d ranks)", rank, start,
                 self.clock, self.num_clients)
        for b in self.backups.values():  # one of the synchronous tables' n from iteration ``start`` on
            b.joined(rank, start)
        self._welcome(ident, h, rank)

    def add_client(self) -> int:
        """One more worker rank, free until a worker joins as it (clock GONE): every per-client array
        grows by one; returns the rank."""
        rank = self.num_clients
        self.client_clock = np.append(self.client_clock, np.int64(GONE))
        self.joined_at.append(GONE)
        for shard in self.shards:
            shard.add_client()
        self.num_clients += 1
        return rank

    def _resent_from_clock(self, rank: int) -> int:
        """The clock of the first message a client of a restored server resends: its clock at the
        move the part was saved at, the clock it joined at if that was after the part, or else the
        clock WELCOME names."""
        if rank in self._move_clocks:
            return self._move_clocks[rank]
        start = self.joined_at[rank]  # a rank that joined after the restored part resends all since then
        assert self.restored is not None
        return self._resend_from(rank) if start <= self.restored else start

    def _resend_from(self, rank: int) -> int:
        """The clock a client of a restored server resends from (WELCOME ``rc``): the part's, or for a
        rank whose updates since C the part lacks (taken back after it was saved), C."""
        assert self.restored is not None
        return self._restored_redo[rank][0] if rank in self._restored_redo else self.restored

    def _rejoin(self, ident: bytes, h: dict[str, Any], rank: int) -> None:
        """HELLO with ``rp`` = C: a replacement for worker ``rank``, restored from the job's checkpoint
        at clock C, takes the rank over (docs/recovery.md, "A lost worker is replaced"). The rank's
        clock stays where the lost worker left it (T; the server clock if it had left): the
        replacement's CLOCKs of its redone ticks C..T move nothing, so no other worker is released
        early and they wait for it only as for a worker at T. The lost worker's updates since C are
        taken back first (``_take_back``); until the redo adds them again the others may read values
        without them (docs/recovery.md, "A lost worker is replaced")."""
        since = h["rp"]
        if not isinstance(since, int) or isinstance(since, bool) or since < 0:
            raise ProtocolError(f"HELLO: field 'rp' (the clock a replacement restarts from) must be an int >= 0, "
                                f"got {since!r}")
        if since > self.clock:
            raise ProtocolError(f"HELLO: a replacement for worker rank {rank} restored from clock {since}, but this "
                                f"server is at clock {self.clock}: that checkpoint is not this job's")
        old = self.by_rank.pop(rank, None)
        if old is not None:
            if not old.gone:  # its connection is gone, but this server has not tried to send to it yet
                self._leave(old, lost=True, hold=True)
            self.peers.pop(old.ident, None)
        held = int(self.client_clock[rank])
        if held == GONE:  # it had said BYE, or was let go: it rejoins at the server's clock
            held = self.client_clock[rank] = self.clock
        self.final.pop(rank, None)  # the replacement redoes the rank's ticks and ends its clocks itself
        self._take_back(rank, since)
        self._redoing[rank] = since
        peer = Peer(ident, rank, last_seq=h["s"], hello_seq=h["s"], heard=time.monotonic(), clock=since)
        self.peers[ident] = peer
        self.by_rank[rank] = peer
        log.warning("a replacement for worker rank %d joined: it redoes clocks %d..%d (the rank's clock stays at %d)",
                    rank, since, held, held)
        self._welcome(ident, h, rank)

    def _take_back(self, rank: int, since: int) -> None:
        """Before a replacement for worker ``rank`` redoes its ticks from ``since`` on: take back the
        lost worker's updates of those ticks (plain-addition tables, server/undo.py) and drop its messages
        held past a checkpoint boundary (of those ticks too), so every update counts once."""
        if self.checkpoints is not None:
            if self.checkpoints.drop_moves():
                log.warning("lost worker rank %d's updates are taken back: this server's move parts, which hold "
                            "them, are deleted (until its next part, a replacement of it is refused)", rank)
            dropped = self.checkpoints.held.pop(rank, [])
            if dropped:
                log.warning("dropped %d held messages of lost worker rank %d (its replacement redoes them)",
                            len(dropped), rank)
        if self.undo is None:
            return
        back = self.undo.take_since(rank, since)
        if back is None:
            log.warning("cannot take back lost worker rank %d's updates since clock %d (kept from clock %d on): "
                        "its replacement's redo counts them twice", rank, since, self.undo.floor)
            return
        if since < self.undo.start:  # restored from its part of that clock (a lost server's), joined then, or
            # its partitions moved (server/moves.py)
            log.error("lost worker rank %d's updates of ticks %d..%d are in the values this server started from "
                      "or took at a partition move (its log starts at clock %d), not in its log: they cannot be "
                      "taken back, and its replacement's redo of them counts twice here (bosen launch restarts "
                      "the whole job instead, STATUS take_back_from)", rank, since, self.undo.start - 1,
                      self.undo.start)
        rows = 0
        for _, table, batch in back:
            rows += self.shards[table].apply(batch, rank)
        self.counters["rows_taken_back"] += rows
        log.warning("took back %d row updates of lost worker rank %d since clock %d", rows, rank, since)
        if self.checkpoints is not None:  # parts saved since `since` still hold them: say so beside them
            held = int(self.client_clock[rank])
            fixed = self.checkpoints.correct(rank, since, held, back)
            if fixed:
                self._redo_cp[rank] = (since, held)
                log.warning("checkpoint parts of clocks %s hold lost worker rank %d's updates since clock %d: "
                            "corrections written beside them", fixed, rank, since)

    def _held(self, peer: Peer, seq: int, handle: Callable[[], None]) -> bool:
        """Hold a message of ``peer`` (in order) while it is past a checkpoint boundary the server has
        not reached (server/checkpoints.py); True if held."""
        ck = self.checkpoints
        if ck is None or not (ck.holding(peer.rank) or ck.holds(peer.clock, self.clock)):
            return False
        ck.hold(peer.rank, seq, handle)
        return True

    def on_inc(self, ident: bytes, h: dict[str, Any], frames: list[Any]) -> None:
        peer = self._peer(ident, h)
        read_at = self._read_at
        if not self._held(peer, h["s"], lambda: self._on_inc(peer, ident, h, frames, read_at)):
            self._on_inc(peer, ident, h, frames, read_at)

    def _on_inc(self, peer: Peer, ident: bytes, h: dict[str, Any], frames: list[Any], read_at: float) -> None:
        shard = self._shard(h)
        batch = wire.decode_update(h, frames, shard.cfg.cols, shard.dtype)
        clock = h.get("c")  # the end-of-tick flush's last update carries the sender's new clock
        if clock is not None:
            self._check_clock(peer, clock, "INC")  # before applying: a bad message changes nothing
        ack = wire.wants_ack(h)
        self.counters["rows_applied"] += shard.apply(batch, peer.rank)
        if self.undo is not None and self._undoable[shard.index]:
            self.undo.record(peer.rank, peer.clock, shard.index, batch)
        self._applied(peer, ident, h, read_at, clock, ack)

    def _applied(self, peer: Peer, ident: bytes, h: dict[str, Any], read_at: float, clock: int | None,
                 ack: bool, reads: list[np.ndarray] | None = None) -> None:
        """After the updates of message ``h`` are applied: its clock (with its read set), if it carries
        one, and its ACK (or the SCLOCK that acknowledges it)."""
        peer.applied = h["s"]
        self.apply_lag.add(time.perf_counter() - read_at)
        if clock is not None:
            self._set_clock(peer, clock)
            if reads is not None:
                self._note_reads(peer, reads)
            if h.get("ck") is True and peer.rank == 0 and self.checkpoints is not None:
                self.checkpoints.choose(clock)
            if self._maybe_advance() and not peer.leaving:
                return  # its SCLOCK carries "a" (this message's number): that acknowledges it
        if ack:
            self._send(ident, {"t": Msg.ACK, "rq": h["s"]})

    def on_flush(self, ident: bytes, h: dict[str, Any], frames: list[Any]) -> None:
        """The end-of-tick flush in one message: the updates of several tables, then (with ``c``) the
        sender's clock, as INCs and a CLOCK would be, with one acknowledgement."""
        peer = self._peer(ident, h)
        read_at = self._read_at
        if not self._held(peer, h["s"], lambda: self._on_flush(peer, ident, h, frames, read_at)):
            self._on_flush(peer, ident, h, frames, read_at)

    def _on_flush(self, peer: Peer, ident: bytes, h: dict[str, Any], frames: list[Any], read_at: float) -> None:
        # every part and the clock are checked before anything is applied: a bad message changes nothing
        checked = []
        k = 0
        for part in wire.flush_parts(h):
            shard = self._shard(part)
            nf = wire.part_frames(part)
            batch = wire.decode_update(part, frames[k:k + nf], shard.cfg.cols, shard.dtype)
            k += nf
            checked.append((shard, shard.check(batch)))
        clock = h.get("c")
        if clock is not None:
            self._check_clock(peer, clock, "FLUSH")
        elif "rs" in h or h.get("ck") is True:
            raise ProtocolError("FLUSH: a read set ('rs') or checkpoint word ('ck') needs a clock ('c')")
        reads = wire.read_set(h, frames[k:], [s.local_count for s in self.shards])
        ack = wire.wants_ack(h)
        for shard, c in checked:
            self.counters["rows_applied"] += shard.commit(c, peer.rank)
            if self.undo is not None and self._undoable[shard.index]:
                self.undo.record(peer.rank, peer.clock, shard.index, c[0])
        self._applied(peer, ident, h, read_at, clock, ack, reads)

    def on_read(self, ident: bytes, h: dict[str, Any], frames: list[Any]) -> None:
        peer = self._peer(ident, h)
        shard = self._shard(h)
        rows = wire.ids(frames[0], h["n"], "READ rows") if h["n"] >= 0 else None
        if rows is None:
            raise ProtocolError(f"READ: negative row count {h['n']}")
        try:
            local, index = shard.local_rows(rows, "READ")
        except NotOwned as e:
            if not self.partition.version and not isinstance(e, Moving):
                raise
            # asked under an older map (a direct read that overtook the new one): ask again
            self._send(ident, {"t": Msg.ERROR, "rq": h["s"], "m": "rows moved: ask again",
                               "mv": self.partition.version})
            return
        shard.subscribe(local, peer.rank, index, peer.clock)
        backup = self.backups.get(shard.index)
        if backup is not None:  # a synchronous table: the read waits for its iteration, not the clock
            if h["c"] <= backup.iteration:
                self._send_rows(peer, shard, local, h["s"], ident, index=index)
            else:
                self.counters["reads_parked"] += 1
                self.backup_parked[shard.index].append((peer, h["s"], ident, h["c"], local.copy()))
            return
        if h["c"] <= self.clock:
            self._send_rows(peer, shard, local, h["s"], ident, index=index)
        else:
            self.counters["reads_parked"] += 1
            self.parked.setdefault(h["c"], []).append((peer, h["s"], ident, shard, local.copy()))

    def on_clock(self, ident: bytes, h: dict[str, Any], frames: list[Any]) -> None:
        peer = self._peer(ident, h)
        reads = wire.read_set(h, frames, [s.local_count for s in self.shards])
        if not self._held(peer, h["s"], lambda: self._on_clock(peer, h, reads)):
            self._on_clock(peer, h, reads)

    def _on_clock(self, peer: Peer, h: dict[str, Any], reads: list[np.ndarray] | None = None) -> None:
        self._check_clock(peer, h["c"], "CLOCK")
        for backup in self.backups.values():  # a gradient ahead of a synchronous table is refused here
            backup.check_clock(peer.rank, h["c"])
        self._set_clock(peer, h["c"])
        if reads is not None:
            self._note_reads(peer, reads)
        if h.get("ck") is True and peer.rank == 0 and self.checkpoints is not None:
            self.checkpoints.choose(h["c"])
        self._maybe_advance()

    def _note_reads(self, peer: Peer, reads: list[np.ndarray]) -> None:
        """The rows ``peer`` read in the tick it just ended (its CLOCK's read set): the readers of
        budgeted pushes (``comm.push_to: readers``), and where a table's subscriptions lapse
        (``tables.X.lapse``), the rows it has not read for that many clocks, which it is told it no
        longer gets (LAPSED, before any later push or SCLOCK of this server)."""
        for shard, read in zip(self.shards, reads, strict=True):
            shard.set_recent(peer.rank, read)
            if shard.lapse:
                gone = shard.note_reads(peer.rank, read, peer.clock)
                if gone.shape[0]:
                    peer.rows_msgs += 1  # ordered among its ROWS: an older reply of these rows is ignored
                    self.counters["rows_lapsed"] += int(gone.shape[0])
                    self._send(peer.ident, {"t": Msg.LAPSED, "tb": shard.index, "n": int(gone.shape[0]),
                                            "ss": peer.rows_msgs}, shard.global_rows[gone])

    def _check_clock(self, peer: Peer, c: Any, what: str) -> None:
        if isinstance(c, int) and not isinstance(c, bool) and c < peer.clock:
            raise ProtocolError(f"{what}: clock {c} goes back from {peer.clock}")
        self._check_clock_field(c, what, "c")
        last = self.final.get(peer.rank)
        if last is not None and c > last:
            raise ProtocolError(f"{what}: clock {c} is past {last}, the last clock this client said it sends "
                                "(BYE 'fc')")

    @staticmethod
    def _check_clock_field(c: Any, what: str, field: str) -> None:
        if not isinstance(c, int) or isinstance(c, bool):
            raise ProtocolError(f"{what}: field '{field}' must be int, got {c!r}")
        if not 0 <= c < GONE:
            raise ProtocolError(f"{what}: clock {c} out of range (must be in [0, {GONE}))")

    def _set_clock(self, peer: Peer, c: int) -> None:
        """``peer`` sent clock ``c``; the rank's clock only rises (a replacement's redo stays below it)."""
        peer.clock = c
        if c > self.client_clock[peer.rank]:
            self.client_clock[peer.rank] = c
        if c >= self.client_clock[peer.rank]:
            self._redoing.pop(peer.rank, None)
        for i, backup in self.backups.items():
            if backup.clocked(peer.rank, c, time.monotonic()):
                self._backup_stepped(i)

    def _backup_stepped(self, index: int) -> None:
        """Table ``index`` (with backup workers) reached a new iteration: answer the reads that wait for it."""
        shard, it = self.shards[index], self.backups[index].iteration
        waiting, self.backup_parked[index] = self.backup_parked[index], []
        for peer, seq, ident, need, local in waiting:
            if need > it:
                self.backup_parked[index].append((peer, seq, ident, need, local))
            elif not peer.gone and (ident == peer.ident or ident in self.readers):
                self._send_rows(peer, shard, local, seq, ident)

    def on_bye(self, ident: bytes, h: dict[str, Any], frames: list[Any]) -> None:
        peer = self._peer(ident, h)
        if "fc" in h:  # not a leave: the rank's last clock, which takes effect when its clock gets there
            self._end_clocks(peer.rank, peer.clock, h["fc"], "BYE")
            self._send(ident, {"t": Msg.BYE_OK, "rq": h["s"]})
            self._maybe_advance()
            return
        if not self._held(peer, h["s"], lambda: self._on_bye(peer, ident, h)):  # after its held updates
            self._on_bye(peer, ident, h)

    def _end_clocks(self, rank: int, sent: int, c: Any, what: str) -> None:
        """Worker ``rank`` (its connection's clock ``sent``) sends no clock past ``c`` ("fc"): a scale-in's
        leaver at its boundary B, which stays connected until every server's part of B is on disk, so
        that it can resend to a lost server's replacement. Once the rank's clock reaches ``c`` it holds
        the server's clock back no more (``_floor``): the others run on while it waits, instead of
        stopping the staleness bound past B. Its updates are all of ticks < ``c`` and arrive before its
        CLOCK(c) (a replacement's too: they are resent before it), so no clock passes ``c`` without
        them. It stops counting in checkpoints after ``c`` (``left_at``), as if it had said BYE there,
        and a synchronous table (backup workers) leaves it out of its n from iteration ``c`` on."""
        self._check_clock_field(c, what, "fc")
        if c < sent:
            raise ProtocolError(f"{what}: field 'fc' (the last clock this client sends) is {c}, below clock {sent}, "
                                "which it sent already")
        old = self.final.get(rank)
        if old is not None and old != c:
            raise ProtocolError(f"{what}: field 'fc' is {c}, but worker rank {rank} said its last clock is {old}")
        if old is None:
            log.info("client rank %d ends its clocks at %d: from there on it holds nobody back (still connected)",
                     rank, c)
        self.final[rank] = c
        self.left_at[rank] = c
        # a synchronous table counts it no more from iteration c on, as its BYE would: the others' steps
        # of c and later do not wait for it while it waits for its release (its last gradient was of c - 1)
        for i, backup in self.backups.items():
            if backup.left(rank, time.monotonic(), c):
                self._backup_stepped(i)

    def _on_bye(self, peer: Peer, ident: bytes, h: dict[str, Any]) -> None:
        if h.get("ph") is True:  # prepare: no more pushes, so the client can release its row versions
            peer.leaving = True
            self._send(ident, {"t": Msg.BYE_OK, "rq": h["s"]})
            return
        self._send(ident, {"t": Msg.BYE_OK, "rq": h["s"]})
        log.info("client rank %d left at clock %d", peer.rank, self.client_clock[peer.rank])
        self.left_at[peer.rank] = peer.clock
        self._leave(peer, lost=False)

    def on_push_ack(self, ident: bytes, h: dict[str, Any], frames: list[Any]) -> None:
        peer = self._peer(ident, h)
        if not 0 < h["ps"] <= peer.pushes_sent:
            raise ProtocolError(f"PUSH_ACK: push {h['ps']} was never sent")
        peer.pushes_acked = max(peer.pushes_acked, h["ps"])

    def on_probe(self, ident: bytes, h: dict[str, Any], frames: list[Any]) -> None:
        """A freshness probe: rows a worker read and, per row, the count of other clients' updates its
        value included (``TableShard.others`` when it was sent). The answer is how many such updates
        this server has applied since: updates the read missed. It is counted when the probe is
        handled, not at the read, so updates applied in between (the probe's time in flight and in
        the queue) count as missing too: an upper bound, by that much."""
        peer = self._peer(ident, h)
        shard = self._shard(h)
        if not shard.counts:
            raise ProtocolError("PROBE: freshness probes are off on this server (metrics.freshness_every: 0)")
        n = h["n"]
        if n < 0:
            raise ProtocolError(f"PROBE: negative row count {n}")
        rows = wire.array(frames[0], wire.ROW_DTYPE, n, "PROBE rows")
        seen = wire.array(frames[1], wire.COUNT_DTYPE, n, "PROBE counts")
        local, _ = shard.local_rows(rows, "PROBE")
        if n and seen.min() < 0:
            raise ProtocolError("PROBE: update counts must be >= 0")
        # a count above the server's (a value from before this server was replaced): nothing missed
        missing = np.maximum(shard.others(local, peer.rank) - seen, 0) if n else seen
        self.counters["probes"] += 1
        self._send(ident, {"t": Msg.PROBE_REPLY, "rq": h["s"], "n": n, "ms": int(missing.sum()),
                           "mx": int(missing.max()) if n else 0})

    # what PartitionMoves uses (server/moves.py, its Host)
    def save_move_part(self, version: int) -> float:
        """Partitions moved to map ``version`` (every client paused): a copy of this server's rows now,
        before any client hears of the map, written as its move part in the background
        (``ServerCheckpoints.save_move``); the seconds the copy took."""
        if self.checkpoints is None:
            return 0.0
        servers = {"servers": self.addresses} if self.addresses != list(self.config.cluster.servers) else {}
        took = self.checkpoints.save_move(version, self.clock, self.shards,
                                          {"client_clocks": self.client_clock.tolist(), **servers})
        log.info("partition map %d: this server's rows at clock %d copied in %.3fs for its move part (a "
                 "replacement restores it until its next checkpoint part)", version, self.clock, took)
        return took

    @property
    def pushing(self) -> bool:
        """A clock-advance push is being sent in turns."""
        return self._pushing is not None

    def send(self, ident: bytes, header: dict[str, Any], *arrays: np.ndarray) -> int:
        return self._send(ident, header, *arrays)

    def send_frames(self, ident: bytes, frames: list[Any], kind: Msg) -> int:
        return self._send_frames(ident, frames, kind)

    def on_paused(self, ident: bytes, h: dict[str, Any], frames: list[Any]) -> None:
        """A client sent everything it will send before partitions move (server/moves.py)."""
        self.moves.on_paused(self._peer(ident, h).rank, h["mv"])

    def on_move(self, ident: bytes, h: dict[str, Any], frames: list[Any]) -> None:
        self.moves.on_move(ident, h, frames)

    def on_left(self, ident: bytes, h: dict[str, Any], frames: list[Any]) -> None:
        """Worker ranks that left the job, from whoever runs it: a server restored from a checkpoint
        after their BYE (which the lost server had), or one that joined the job after its STATUS
        counted them (they finished without connecting to it), would otherwise wait for them for ever."""
        ranks = h["r"]
        if not all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r < self.num_clients for r in ranks):
            raise ProtocolError(f"LEFT: field 'r' must list worker ranks in [0, {self.num_clients}), got {ranks!r}")
        for r in ranks:
            peer = self.by_rank.get(r)
            if peer is not None and not peer.gone:
                raise ProtocolError(f"LEFT: worker rank {r} is in the job (connected, no BYE)")
        news = [r for r in ranks if self.client_clock[r] != GONE]
        for r in news:
            self.client_clock[r] = GONE
        if news:
            log.info("worker ranks %s left the job (said BYE to a server lost since, or finished before they "
                     "connected to this one)", news)
        self._send(ident, {"t": Msg.ACK, "rq": h["s"]})
        self.moves.check_waiting()  # a partition move waits for their PAUSED no more
        self._maybe_advance()

    def on_save(self, ident: bytes, h: dict[str, Any], frames: list[Any]) -> None:
        """The launcher asks for a checkpoint part at boundary ``c`` whatever the rule (a scale-in's
        boundary: leavers leave once every server's part of it is on disk, bosen/jobs/scale.py).
        ACK ``ok``: it will be saved (or was); false: this server passed it unsaved."""
        ck, c = self.checkpoints, h["c"]
        if ck is None:
            raise ProtocolError("SAVE: this server makes no checkpoints")
        if c < 0 or not checkpoint.is_boundary(c, ck.cfg.every_clocks):
            raise ProtocolError(f"SAVE: clock {c} is not a checkpoint boundary (every {ck.cfg.every_clocks} clocks)")
        self._send(ident, {"t": Msg.ACK, "rq": h["s"], "ok": ck.will_save(c, self.clock)})

    def on_status(self, ident: bytes, h: dict[str, Any], frames: list[Any]) -> None:
        self._send_frames(ident, wire.encode_status(h["s"], self.stats()), Msg.STATUS_REPLY)

    # -- clocks and pushes ---------------------------------------------------------------------

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(PROBE_S / 2)
            quiet = time.monotonic() - PROBE_S
            for p in [p for p in self.by_rank.values() if not p.gone and p.heard < quiet]:
                self._send(p.ident, {"t": Msg.PING})  # a failed send lets the client go (_send_failed)

    def _leave(self, peer: Peer, lost: bool = True, hold: bool | None = None) -> None:
        """``peer`` is gone: it said BYE, or it was ``lost`` (its connection closed or stopped
        answering heartbeats), in which case the row versions it held are released for it. With
        ``hold`` (default: lost under ``hold_lost``) its rank keeps its clock for a replacement."""
        peer.gone = True
        released = sum(s.release_client(peer.rank, lost) for s in self.shards)
        if lost:
            self.counters["clients_lost"] += 1
        if released:
            log.warning("client rank %d was lost without BYE: released %d row versions it held", peer.rank, released)
        if self.checkpoints is not None and self.checkpoints.drop(peer.rank):
            log.warning("client rank %d left with updates held past a checkpoint boundary: they are dropped",
                        peer.rank)
        self.readers = {k: r for k, r in self.readers.items() if r.peer is not peer}
        for backup in self.backups.values():  # a gradient it had not completed is dropped
            backup.forget(peer.rank)
        if (lost and self.hold_lost) if hold is None else hold:
            self.final.pop(peer.rank, None)  # held for a replacement, which ends its clocks itself
            log.warning("client rank %d was lost at clock %d: its clock is held for a replacement", peer.rank,
                        self.client_clock[peer.rank])
            return
        self.client_clock[peer.rank] = GONE
        self.final.pop(peer.rank, None)
        self.moves.check_retiring()
        self.moves.check_waiting()  # a partition move waiting for its PAUSED waits for it no more
        # k_t is at most the workers left: an iteration may end now; one that said BYE after its CLOCK(c)
        # is no more one of the n from iteration c (``bosen scale``: its last gradient was of c - 1)
        for i, backup in self.backups.items():
            if backup.left(peer.rank, time.monotonic(), None if lost else peer.clock):
                self._backup_stepped(i)
        self._maybe_advance()

    def _awaiting_replacement(self) -> list[int]:
        """Ranks lost without BYE whose clock is held for a replacement that has not joined yet."""
        return [r for r, p in self.by_rank.items() if p.gone and self.client_clock[r] != GONE]

    def _maybe_advance(self) -> bool:
        """Advance the server clock if every client has passed it: push, then SCLOCK to each client.
        At a checkpoint boundary, save first, then apply what was held (which may advance again)."""
        if self._advancing or self._pushing is not None:  # a held message applied below, or a push in
            return False  # turns with reading: the loop there, or the push when done, looks again
        self._advancing = True
        try:
            advanced = self._save_deferred()
            while self._pushing is None and self._advance_once():
                advanced = True
            return advanced
        finally:
            self._advancing = False

    def _floor(self) -> int:
        """The clock every rank has passed: the minimum over the ranks' clocks, but a rank whose clock
        reached the last one it sends (``final``) no longer counts."""
        if not self.final:
            return int(self.client_clock.min())
        clocks = self.client_clock.copy()
        for r, c in self.final.items():
            if clocks[r] >= c:
                clocks[r] = GONE
        return int(clocks.min())

    def _advance_once(self) -> bool:
        new = self._floor()
        if new <= self.clock or new == GONE:
            return False
        old, self.clock = self.clock, new
        ck = self.checkpoints
        boundary = ck.crossed(old, new) if ck is not None else None
        behind = self._behind(boundary) if ck is not None and boundary is not None else []
        if ck is not None and boundary is not None and behind:
            # a lost worker's updates since the newest complete checkpoint are taken back only when its
            # replacement joins: a part saved now would hold them, and if this server were lost before
            # then, its replacement restored from that part would count them twice (the redo adds them
            # again); once it has joined, a part saved before its redo reaches the boundary would lack
            # them. So the part waits until the replacement has redone its ticks up to the boundary,
            # and what anyone sends of later ticks is held until then (``_save_deferred``).
            log.warning("checkpoint part at clock %d deferred: worker rank(s) %s lost, their replacement not yet "
                        "joined or redoing its ticks", boundary, behind)
            ck.deferred = boundary
            self.counters["checkpoints_deferred"] += 1
        elif ck is not None and boundary is not None:
            self._save(boundary)
        self.counters["clock_advances"] += 1
        live = self._live()
        work = [(shard, changed) for shard in self.shards if (changed := shard.take_changed()).shape[0]]
        if self._in_turns(work):
            self.counters["pushes_in_turns"] += 1
            pushing = self._pushing = asyncio.ensure_future(self._push_in_turns(work))
            pushing.add_done_callback(lambda task: self._pushed(task, new))
            return True
        for shard, changed in work:
            self._push(shard, changed, live, budgeted=False)
        self._advanced(new, live)
        return True

    def _save(self, boundary: int) -> None:
        """This server's checkpoint part at ``boundary`` (its shards hold exactly the ticks below it)."""
        assert self.checkpoints is not None
        servers = {"servers": self.addresses} if self.addresses != list(self.config.cluster.servers) else {}
        self.checkpoints.save(boundary, self.shards, {"client_clocks": self.client_clock.tolist(),
                                                      **self._makers(boundary), **servers})

    def _behind(self, clock: int) -> list[int]:
        """Ranks whose updates of ticks below ``clock`` are not all here: lost ones awaiting their
        replacement, and replacements still redoing ticks below it (the rank's clock stays the lost
        worker's, so the server clock can reach ``clock`` meanwhile). A rank that ended its clocks at F
        (``final``) owes nothing past F."""
        redoing = [r for r, p in self.by_rank.items()
                   if not p.gone and self.client_clock[r] != GONE and p.clock < min(clock, self.final.get(r, clock))]
        return sorted({*self._awaiting_replacement(), *redoing})

    def _save_deferred(self) -> bool:
        """The deferred boundary D's part, once no lost worker awaits its replacement and every rank in
        the job has sent CLOCK(D): the replacements redid their ticks below D (the lost workers' own
        were taken back as they joined), and everything of ticks >= D was held, so the shards hold
        exactly the ticks below D. Then the held messages go. True if it saved."""
        ck = self.checkpoints
        if ck is None or ck.deferred is None or self._behind(ck.deferred):
            return False
        d = ck.deferred
        ck.deferred = None
        self._save(d)
        log.warning("checkpoint part at clock %d saved: the lost workers' replacements redid their ticks up to it", d)
        if ck.held:
            self._release_held(ck)
        return True

    def _makers(self, clock: int) -> dict[str, Any]:
        """``{"ranks": [...]}``, the worker ranks whose parts make the checkpoint at ``clock``, where
        workers joined or left the job (``bosen scale``): those that ran tick ``clock`` - 1 (joined
        before ``clock``, not left by BYE before it). Empty (ranks 0..workers-1) otherwise."""
        ranks = [r for r in range(self.num_clients)
                 if self.joined_at[r] < clock and self.left_at.get(r, clock) >= clock]
        return {} if ranks == list(range(self.config.cluster.workers)) else {"ranks": ranks}

    def _in_turns(self, work: list[tuple[TableShard, np.ndarray]]) -> bool:
        """Whether a clock-advance push is sent in turns with reading the socket: when it is more than
        one chunk (versioned tables, whose clients' row versions a push in turns would complicate,
        and a server not serving, push at once)."""
        if self._sock is None or any(shard.versioned for shard, _ in work):
            return False
        return sum(c.shape[0] * s.cfg.cols * s.dtype.itemsize for s, c in work) > CHUNK_BYTES

    async def _push_in_turns(self, work: list[tuple[TableShard, np.ndarray]]) -> None:
        """The clock-advance push one chunk at a time, the socket read between chunks: updates that
        arrive meanwhile are applied rather than waiting behind the whole push. They are of ticks at or
        past the new clock (every client had sent all earlier ones), so the values still vouch for it;
        a chunk's rows are marked sent as it goes, so a row changed after its chunk is pushed again
        later. Rows a budgeted push sent meanwhile, and not changed since, are left out. SCLOCK, the
        parked reads and the held messages follow the last chunk, as they would at once."""
        for shard, changed in work:
            per = max(1, CHUNK_BYTES // (shard.cfg.cols * shard.dtype.itemsize))
            for k in range(0, changed.shape[0], per):
                chunk = changed[k:k + per]
                chunk = chunk[shard.dirty[chunk]]
                if chunk.shape[0]:
                    self._push(shard, chunk, self._live(), budgeted=False)
                await asyncio.sleep(0)  # the socket's drain runs before the next chunk

    def _pushed(self, task: asyncio.Task[None], new: int) -> None:
        """A push in turns ended: finish the advance to clock ``new``, and look for the next one."""
        self._pushing = None
        if task.cancelled():
            return
        err = task.exception()
        if err is not None:  # a bug: the server cannot keep its clock promise any more; say so and stop
            log.error("clock-advance push failed", exc_info=err)
            self._failed = err
            self.stop()
            return
        self._advancing = True
        try:
            self._advanced(new, self._live())
        finally:
            self._advancing = False
        self._maybe_advance()

    def _advanced(self, new: int, live: list[Peer]) -> None:
        """After the push of clock ``new``: parked reads, SCLOCK to each client, held messages."""
        ck = self.checkpoints
        for c in [c for c in self.parked if c <= new]:
            for peer, seq, ident, shard, local in self.parked.pop(c):
                if not peer.gone and (ident == peer.ident or ident in self.readers):
                    self._send_rows(peer, shard, local, seq, ident)
        extra: dict[str, Any] = {}
        if ck is not None:  # the newest part on disk; Young's Ts for rank 0's time rule
            extra["cp"] = ck.durable()
            if self.undo is not None:  # what came before the newest complete checkpoint is not taken back
                # a replacement redoing its ticks rewrites its parts of them: until it is past its rank's
                # clock the newest complete checkpoint may go back to the one it restarted from
                floor = min([ck.undo_floor(), *self._redoing.values()])
                self.undo.trim(floor)
                # a replacement of this server restores the newest complete checkpoint's part: clients
                # keep what they sent from there (not from this server's newest part)
                extra["cp"] = min(extra["cp"], floor)
            if ck.timed:
                extra["ts"] = ck.mean_save_s()
        redo = {}
        if ck is not None and self._redo_cp:
            durable = ck.durable()
            self._redo_cp = {r: ct for r, ct in self._redo_cp.items() if durable <= ct[1]}
            redo = {r: min(durable, c) for r, (c, _) in self._redo_cp.items()}
        for p in live:
            cp = {"cp": redo[p.rank]} if p.rank in redo else {}
            self._send(p.ident, {"t": Msg.SCLOCK, "c": new, "a": p.applied, **extra, **cp})
        if ck is not None and ck.held:
            self._release_held(ck)
        self.moves.check_waiting()

    def _release_held(self, ck: ServerCheckpoints) -> None:
        """Handle the held messages in order, each client's until one must be held again (it is past
        the next boundary)."""
        for rank in list(ck.held):
            queue = ck.held.pop(rank)
            peer = self.by_rank[rank]
            for k, (seq, handle) in enumerate(queue):
                if ck.holds(peer.clock, self.clock):
                    ck.held[rank] = queue[k:]
                    break
                try:
                    handle()
                except ProtocolError as e:  # the sender learns it now; its later messages still apply
                    self.counters["errors"] += 1
                    log.warning("rejected held message %d from client rank %d: %s", seq, rank, e)
                    self._send(peer.ident, {"t": Msg.ERROR, "rq": seq, "m": str(e)})

    def _live(self) -> list[Peer]:
        return [p for p in self.by_rank.values() if not p.gone and not p.leaving]

    def _push(self, shard: TableShard, local: np.ndarray, live: list[Peer], budgeted: bool) -> int:
        """Send rows ``local`` to every client subscribed to them (a budgeted push under
        ``comm.push_to: readers``: to those that read them in their last tick); returns bytes sent."""
        t0 = time.perf_counter()
        tp = self.phases.start() if self.phases is not None else None
        ranks = np.fromiter((p.rank for p in live), np.int64, len(live))
        masks = shard.push_masks(local, ranks)
        done = None
        if budgeted and shard.readers_only:
            masks, done = shard.to_readers(local, ranks, masks)
        if shard.versioned:  # per-client row versions and holdings: each client its own messages
            sent = 0
            for p, mine in zip(live, masks, strict=True):
                if mine.any():
                    sent += self._send_rows(p, shard, local[mine], -1, p.ident, budgeted)
        else:
            sent = self._push_shared(shard, local, live, budgeted, masks)
        if done is None:
            shard.mark_sent(local)
        else:
            shard.mark_given(local, ranks, masks, done)
        self.push_stall.add(time.perf_counter() - t0)
        if tp is not None:
            self.phases.stop("push", tp)  # type: ignore[union-attr]
        return sent

    def _push_shared(self, shard: TableShard, local: np.ndarray, live: list[Peer], budgeted: bool,
                     masks: np.ndarray) -> int:
        """Push ``local`` with each chunk's row ids and values gathered once and shared by every
        subscriber whose selection is the whole chunk: their messages differ only in the header.
        A selection made of a few runs of ``local`` (``MAX_RUNS``) gets slices of the shared chunks;
        any other gets its own gather (``_send_rows``)."""
        per = max(1, CHUNK_BYTES // (shard.cfg.cols * shard.dtype.itemsize))
        n = int(local.shape[0])
        chunks: dict[int, tuple[np.ndarray, np.ndarray, zmq.Frame, zmq.Frame]] = {}
        sent = 0
        counts = masks.sum(axis=1)
        for p, mine, count in zip(live, masks, counts.tolist(), strict=True):
            if count == 0:
                continue
            runs = [(0, n)] if count == n else rowmath.mask_runs(mine, MAX_RUNS)  # all rows: the common case
            if runs is None:  # scattered: a gather of its own
                self.counters["push_own_gathers"] += 1
                sent += self._send_rows(p, shard, local[mine], -1, p.ident, budgeted)
                continue
            for lo, hi in runs:
                for k in range(lo // per, (hi - 1) // per + 1):
                    c = chunks.get(k)
                    if c is None:
                        c = chunks[k] = self._gather_chunk(shard, local[k * per:(k + 1) * per])
                    a, b = max(lo - k * per, 0), min(hi - k * per, c[0].shape[0])
                    # freshness counts are the subscriber's own (others' updates): never shared
                    counts = shard.others(local[k * per + a:k * per + b], p.rank) if shard.counts else None
                    if b - a == c[0].shape[0]:  # the whole chunk: the shared frames
                        self.counters["push_shared_msgs"] += 1
                        sent += self._send_push(p, shard, b - a, budgeted, c[2], c[3], counts)
                    else:  # part of it: a copy of that part (the chunk is never written again)
                        self.counters["push_part_msgs"] += 1
                        sent += self._send_push(p, shard, b - a, budgeted, zmq.Frame(c[0][a:b]),
                                                zmq.Frame(c[1][a:b]), counts)
            shard.rows_sent(local if count == n else local[mine], p.rank)  # not versioned: no versions
        return sent

    def _gather_chunk(self, shard: TableShard, local: np.ndarray) -> tuple[np.ndarray, np.ndarray, zmq.Frame,
                                                                           zmq.Frame]:
        """Row ids and values of ``local``, copied out of the table once (it changes while ZeroMQ
        still sends), and ZeroMQ messages of them that any number of sends share. A frame of 64 KiB
        or more holds the copy itself (pyzmq's collector thread releases it once, after the last
        send); smaller ones are copied into their message (``zmq.COPY_THRESHOLD``)."""
        index = rowmath.rows_index(local)
        rows = shard.global_rows[index]
        values = shard.values[index].copy() if type(index) is slice else shard.values[local]
        packed = wire.wire_ids(rows)  # int32 where they fit: a copy then
        if type(index) is slice and packed is rows:
            packed = rows.copy()
        rows = packed
        self.counters["push_gathers"] += 1
        return rows, values, zmq.Frame(rows), zmq.Frame(values)

    def _send_push(self, peer: Peer, shard: TableShard, n: int, budgeted: bool, rows: zmq.Frame,
                   values: zmq.Frame, counts: np.ndarray | None = None) -> int:
        """One ROWS push of ``n`` rows to ``peer`` from ready-made frames: only the header is its own
        (and ``counts``, the rows' freshness counts for it, where those are on)."""
        self.counters["rows_pushed"] += n
        peer.rows_msgs += 1  # "ss" orders a client's ROWS across its connections
        header = {"t": Msg.ROWS, "tb": shard.index, "n": n, "c": self.clock, "a": peer.applied, "rq": -1,
                  "dt": wire.DTYPE_NAMES[shard.dtype], "ss": peer.rows_msgs}
        if budgeted:
            peer.pushes_sent += 1
            header["ps"] = peer.pushes_sent
            self.counters["rows_pushed_budgeted"] += n
        if counts is not None:
            header["fr"] = True
            header["ft"] = time.time()  # the content's time: the client's probes report its age
            return self._send_frames(peer.ident, [wire.pack_header(header), rows, values, zmq.Frame(counts)],
                                     Msg.ROWS)
        return self._send_frames(peer.ident, [wire.pack_header(header), rows, values], Msg.ROWS)

    def _send_rows(self, peer: Peer, shard: TableShard, local: np.ndarray, rq: int, ident: bytes,
                   budgeted: bool = False, index: slice | np.ndarray | None = None) -> int:
        """Send rows to one client, on connection ``ident`` (its own, or a read connection of its), in
        messages of at most CHUNK_BYTES of values; returns bytes sent. ``index``: ``local`` as an
        index, if known."""
        per = max(1, CHUNK_BYTES // (shard.cfg.cols * shard.dtype.itemsize))
        if local.shape[0] <= per:
            return self._send_row_chunk(peer, shard, local, rq, ident, budgeted, index)
        return sum(self._send_row_chunk(peer, shard, local[k:k + per], rq, ident, budgeted)
                   for k in range(0, local.shape[0], per))

    def _send_row_chunk(self, peer: Peer, shard: TableShard, local: np.ndarray, rq: int, ident: bytes,
                        budgeted: bool, index: slice | np.ndarray | None = None) -> int:
        n = int(local.shape[0])
        self.counters["rows_pushed" if rq < 0 else "rows_read"] += n
        # "ss" orders a client's ROWS across its connections: the client keeps a row's newest
        peer.rows_msgs += 1
        backup = self.backups.get(shard.index)
        clock = self.clock if backup is None else backup.iteration  # a backup table's value is of its iteration
        header = {"t": Msg.ROWS, "tb": shard.index, "n": n, "c": clock, "a": peer.applied, "rq": rq,
                  "dt": wire.DTYPE_NAMES[shard.dtype], "ss": peer.rows_msgs}
        if budgeted:
            peer.pushes_sent += 1
            header["ps"] = peer.pushes_sent
            self.counters["rows_pushed_budgeted"] += n
        versions = shard.rows_sent(local, peer.rank)
        if index is None:
            index = rowmath.rows_index(local)
        if type(index) is slice and rq >= 0:
            # a read of a run of rows: one memcpy from the table straight into the message
            rows, values, owned = shard.global_rows[index], shard.values[index], None
        else:
            # Pushes come in bursts (every changed row at a clock advance): each message gets its own
            # numpy copy (a memcpy for a run, else a gather) and goes without another one. Copying
            # into ZeroMQ's frames instead costs the same, but after a burst the allocator then held
            # up to twice as much memory (bench/throughput/ memory-server 1.5-2.0x against 1.1-1.2x).
            # A single reply avoids the zero-copy release through pyzmq's garbage-collector thread,
            # which measured 35-220 us per 1 MiB send here.
            rows = shard.global_rows[index]
            values = owned = shard.values[index].copy() if type(index) is slice else shard.values[local]
        extra = () if versions is None else (versions,)
        if versions is not None:
            header["v"] = True
        if shard.counts:  # freshness counts: the others' updates these values include
            header["fr"] = True
            header["ft"] = time.time()
            extra = (*extra, shard.others(local, peer.rank))
        return self._send(ident, header, wire.wire_ids(rows), values, *extra, owned=owned)

    # -- managed communication -----------------------------------------------------------------

    async def _push_loop(self) -> None:
        """Between clock advances, push the most changed rows whenever the bucket is empty."""
        assert self.bucket is not None  # started only with managed communication on
        max_unacked = self.comm.max_unacked
        await paced_sender(self.bucket, self.comm.idle_ms / 1000,
                           lambda: any(p.pushes_sent - p.pushes_acked > max_unacked for p in self._live()),
                           lambda: self._push_budgeted(self._live()), self.counters)

    def _push_budgeted(self, live: list[Peer]) -> int:
        for i in range(len(self.shards)):
            shard = self.shards[(self._rotation + i) % len(self.shards)]
            if not shard.procedure.allow_push():
                self.counters["push_holds"] += 1
                continue
            if shard.readers_only:  # changed since last pushed, and read by someone in its last tick
                candidates = np.flatnonzero(shard.dirty & shard.fresh & shard.read_recently)
            else:
                candidates = np.flatnonzero(shard.dirty & shard.subscribed)
            if shard.leaving is not None:  # exported to their next server (versioned): sent to nobody now
                candidates = shard.staying(candidates)
            if candidates.shape[0] == 0:
                continue
            assert shard.policy is not None  # the push loop runs only with managed communication on
            picked = np.sort(shard.policy.choose(candidates, shard.importance, self.comm.server_push_rows))
            self._rotation = (self._rotation + i + 1) % len(self.shards)
            sent = self._push(shard, picked, live, budgeted=True)
            self.counters["budgeted_pushes"] += 1
            return sent
        return 0

    def stats(self, histograms: bool = True) -> dict[str, Any]:
        """STATUS; without ``histograms`` (a Prometheus scrape) no pass over each table's send counts."""
        clocks = [int(c) if c != GONE else "left" for c in self.client_clock]
        uptime = time.time() - self.started
        comm: dict[str, Any] = {}
        if self.bucket is not None:
            comm = {"budget_mbps": self.comm.server_bandwidth_mbps, "egress_mbps": round(mbps(
                self.counters["bytes_out"], uptime), 3), "priority": self.comm.priority}
        if self.checkpoints is not None:
            # the newest own part on disk (a replacement's: the one it restored from, until it writes one)
            restored = -1 if self.restored is None else self.restored
            comm["checkpoints"] = {**self.checkpoints.stats(), "durable": max(self.checkpoints.durable(), restored),
                                   "deferred": self.checkpoints.deferred}
        return {**comm,
            "rank": self.rank,
            "address": self.address,
            "servers": self.addresses,  # the job's servers now (servers join and leave: server/moves.py)
            "clock": self.clock,
            "client_clocks": clocks,
            # per rank, the clock it joined at (None: a rank kept for a joiner) and left at by BYE
            "joined_at": [None if j == GONE else int(j) for j in self.joined_at],
            "left_at": [self.left_at.get(r) for r in range(self.num_clients)],
            # per rank, the last clock it said it sends (a scale-in's leaver waiting to leave), else None
            "final_clocks": [self.final.get(r) for r in range(self.num_clients)],
            "clients_joined": len(self.by_rank),
            "awaiting_replacement": self._awaiting_replacement(),  # lost ranks whose replacement has not joined
            # a lost worker's replacement restarted from an older clock is not taken back whole here (None:
            # no take-back, not --hold-lost): the launcher restarts the whole job instead (server/undo.py)
            "take_back_from": None if self.undo is None else self.undo.reach,
            "read_connections": len(self.readers),
            # CURVE: handshakes refused by ZAP (a client key not in security.allowed_clients)
            "security": {"curve": self.security is not None,
                         "refused": self._auth.refused if self._auth is not None else 0},
            # the partition map this server follows (bosen/partition.py): version, owner per partition
            "partitions": {"version": self.partition.version, "count": self.partition.partitions,
                           "owned": int(self.partition.owned[self.rank].shape[0]),
                           "owner": self.partition.owner_of.tolist()},
            "uptime_s": round(uptime, 3),
            # CPU since start(), the whole process: its loop and ZeroMQ's I/O thread
            "cpu_s": round(time.process_time() - self._cpu_at_start, 4),
            "apply_lag_ms": self.apply_lag.stats(),
            "push_stall_ms": self.push_stall.stats(),
            **({"phases": self.phases.stats()} if self.phases is not None else {}),
            "tables": {s.cfg.name: {"rows": s.stored, "bytes": s.nbytes, **s.procedure.stats(),
                                    **({"send_count_hist": send_histogram(s.send_count[:s.stored])} if histograms
                                       else {})}
                       for s in self.shards},
            **self.counters,
        }
