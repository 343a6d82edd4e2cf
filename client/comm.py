"""The client's communication thread: its own event loop, one ``ServerLink`` per server.

It owns the client's main connection to every server: updates, clocks, pushes, acknowledgements.
(A worker blocked on uncached rows asks for them on its own read connection: ``client/reads.py``.)
Worker threads hand it work through its ``LoopThread`` (``submit``, ``call``). By concept: this
module is the thread and its sockets, joining and leaving the job, and the receive path (a handler
per message type; rows go into the cache through ``client/receive.py``, then ``notify`` wakes
blocked readers); sending is ``client/send.py`` (the flush and budgeted sends); replacing a lost
server is ``client/recovery.py``.

Its first fatal error (a server lost or rejecting an update, a malformed message, a bug) fails the
client's ``Lifecycle``: every worker thread raises it at its next call.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import secrets
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import numpy as np
import zmq
from zmq.utils.monitor import parse_monitor_message

from bosen import wire
from bosen.client import receive
from bosen.client.lifecycle import Lifecycle, Phase
from bosen.client.link import LinkState, ServerLink
from bosen.client.loopthread import LoopThread
from bosen.client.moves import MapFollower
from bosen.client.oplog import InflightLog
from bosen.client.recovery import RECOVERY_TIMEOUT_S, Recovery, ResendLog
from bosen.client.send import Sender
from bosen.client.state import TableState
from bosen.config import Config
from bosen.errors import BosenError, ProtocolError, ServerError, ServerLost
from bosen.malloc import reuse_large_buffers
from bosen.partition import Partition
from bosen.phases import Phases
from bosen.ratelimit import LeakyBucket
from bosen.security import HANDSHAKE_FAILED, Refused, Security, client_socket, handshake_error
from bosen.wire import Msg
from bosen.zsocket import LoopSocket

log = logging.getLogger("bosen.client")
YIELD_EVERY = 32  # messages handled (then readers woken) before other tasks (the budget loop) get a turn
START_TIMEOUT_S = 10.0  # the thread's sockets are set up within this, or Client.connect raises
# ZeroMQ heartbeats: a server that stops answering them (its machine is gone, no TCP reset comes) is
# lost after HEARTBEAT_TIMEOUT_MS, like one whose connection closed. libzmq answers them on its own
# I/O thread, so a server busy in Python still does.
HEARTBEAT_IVL_MS = 2000
HEARTBEAT_TIMEOUT_MS = 10000


class _AckedSeqs(Sequence[int]):
    """Per server, the highest update number it acknowledged (read by the buffer pools)."""

    def __init__(self, links: list[ServerLink]) -> None:
        self._links = links

    def __getitem__(self, j: int) -> int:  # type: ignore[override]
        return self._links[j].acked_seq

    def __len__(self) -> int:
        return len(self._links)


class CommThread:
    def __init__(self, config: Config, tables: list[TableState], life: Lifecycle,
                 notify: Callable[[], None], made_bytes: Callable[[], int], partition: Partition | None = None) -> None:
        """``made_bytes()``: bytes of increments the process's workers made so far (``Sender``'s
        hand-over at the tick)."""
        self.config = config
        self.partition = partition or Partition(len(config.cluster.servers), config.cluster.num_partitions)
        # the classes the tables' buffers interleave rows by (the servers of the config): a map with
        # another number of servers (servers joined or left) is never treated as modular here
        self.classes = len(config.cluster.servers)
        self.servers_changed = False  # servers joined or left the job since this client's start
        self.tables = tables
        self.life = life
        self.notify = notify
        # written on this thread only; Client.stats reads them
        self.counters: dict[str, Any] = dict(bytes_sent=0, bytes_received=0, msgs_sent=0, msgs_received=0, rows_sent=0,
                             rows_sent_budgeted=0, budgeted_sends=0, rows_sent_early=0, bytes_sent_early=0,
                             rows_received=0, rows_pushed_to_us=0,
                             rows_pushed_early_to_us=0, update_batches=0, sparse_batches=0, acks=0,
                             server_errors=0, window_paused_s=0.0, idle_polls=0, flushes=0, bytes_resent=0,
                             recoveries=0, rows_lapsed=0)
        if config.metrics.freshness_every:  # freshness probes (``probe``), answered by PROBE_REPLY
            self.counters.update(freshness_probes=0, freshness_probes_answered=0, freshness_probed_rows=0,
                                 missing_updates_sum=0, missing_updates_max=0, content_age_sum=0.0)
        # freshness probes: per (server, probe number), the summed content age of its rows, counted
        # once answered (beside the rows and the missing updates); a lost server's never are
        self._probe_ages: dict[tuple[int, int], float] = {}
        self.ack_latency = {"last_ms": 0.0, "max_ms": 0.0, "sum_ms": 0.0, "count": 0}
        self.bucket = LeakyBucket(config.comm.client_bandwidth_mbps) if config.comm.enabled else None
        self.links = [ServerLink(j, addr, self.counters, self.bucket) for j, addr in enumerate(config.cluster.servers)]
        if config.checkpoint is not None:  # what was sent since each server's checkpoint, for a replacement
            for link in self.links:
                link.log = ResendLog()
        self.rank = -1
        self.final_clock: int | None = None  # the last clock this process sends (end_clocks); every HELLO says it
        self._fingerprint = config.fingerprint()
        self._token = secrets.token_hex(8)
        for st in tables:
            st.oplog.send_pieces_as_frames(_AckedSeqs(self.links))
        self._handlers: dict[Msg, Callable[[ServerLink, dict[str, Any], Sequence[Any]], None]] = {
            Msg.ROWS: self._on_rows,
            Msg.SCLOCK: self._on_sclock,
            Msg.ACK: self._on_ack,
            Msg.ERROR: self._on_error,
            Msg.WELCOME: self._on_reply,
            Msg.BYE_OK: self._on_reply,
            Msg.STATUS_REPLY: self._on_reply,
            Msg.PING: lambda link, h, arrays: None,  # the server checks that we are still there
            Msg.PROBE_REPLY: self._on_probe_reply,
            Msg.PLAN: self._on_plan,
            Msg.MAP: self._on_map,
            Msg.LAPSED: self._on_lapsed,
        }
        self.thread = LoopThread("bosen-comm", self._fail)
        # metrics.profile: this thread's phases, "receive" (ROWS into the cache), "send" (flushes and
        # what acknowledgements let out), "other_in" (other messages)
        self.phases = Phases() if config.metrics.profile else None
        self.sender = Sender(tables, self.links, self.partition, config.comm, self.bucket, self.counters,
                             self.thread, life, notify, self._fail, made_bytes)
        self.sender.phases = self.phases
        self.moves = MapFollower(tables, self.links, self.partition, self._take_map, self._handle, self._resume,
                                 self.classes)
        self.sender.moves = self.moves
        self._last_kind: Msg | None = None  # the kind of the message being handled (for the profile)
        self.recovery = Recovery(tables, life, self._reconnect, self._hello_again, self.sender.pump, notify,
                                 self._fail, lambda: self.partition)
        self.security = Security.load(config, "client")  # None: no CURVE (bosen/security.py)
        self._ctx: zmq.Context | None = None
        self._socks: list[LoopSocket] = []  # every socket the loop serves, the monitors' too
        self._tasks: list[asyncio.Task] = []

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        reuse_large_buffers()  # process-wide, but only affects how freed big buffers are kept
        self.thread.start(self._open, self._close, timeout)

    def _open(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the thread, before its loop runs: a DEALER per server, watched for disconnection."""
        self._ctx = zmq.Context()
        for link in self.links:
            self._connect(link, loop, start=False)
        for s in self._socks:
            s.start()
        if self.bucket is not None:
            self._tasks.append(loop.create_task(self.sender.budget_loop()))

    def _connect(self, link: ServerLink, loop: asyncio.AbstractEventLoop, start: bool = True, attempt: int = 0) -> None:
        """A DEALER to ``link``'s server, watched for disconnection (again, after a loss)."""
        assert self._ctx is not None
        # A ROUTER silently drops a second connection under an identity it already knows, so the
        # identity must be unique across every client of the job: pids repeat across hosts and
        # containers, and several clients may share a process. 64 random bits make a clash moot.
        dealer = client_socket(self._ctx, zmq.DEALER, self.security)
        dealer.setsockopt(zmq.SNDHWM, 0)
        dealer.setsockopt(zmq.RCVHWM, 0)
        dealer.setsockopt(zmq.LINGER, 2000)
        dealer.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
        dealer.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        dealer.setsockopt(zmq.IDENTITY, f"c{os.getpid()}-{self._token}-{link.index}-{attempt}".encode())
        # a refused security handshake is heard here too: ZeroMQ otherwise answers it with silence
        monitor = dealer.get_monitor_socket(zmq.EVENT_DISCONNECTED | HANDSHAKE_FAILED)
        dealer.connect(f"tcp://{link.address}")
        # readers are woken after each batch of messages (or when the queue is drained)
        link.sock = LoopSocket(dealer, loop, functools.partial(self._dispatch, link),
                               after_batch=self.notify, batch=YIELD_EVERY)
        link.monitor = LoopSocket(monitor, loop, functools.partial(self._on_monitor, link))
        self._socks += [link.sock, link.monitor]
        if start:
            link.sock.start()
            link.monitor.start()

    def _reconnect(self, link: ServerLink) -> None:
        """Close ``link``'s sockets at once (what is queued there was for a server that is gone) and
        open new ones to the same address."""
        self._close_sockets(link)
        assert self.thread.loop is not None
        self._connect(link, self.thread.loop, attempt=1 + self.counters["recoveries"])

    def _close_sockets(self, link: ServerLink) -> None:
        """``link``'s sockets closed at once, its monitor first (their closing is no loss)."""
        if link.sock is not None:
            link.sock.sock.disable_monitor()
        for s in (link.sock, link.monitor):
            if s is not None:
                s.close(linger=0)
                self._socks.remove(s)
        link.sock = link.monitor = None

    def _close(self) -> None:
        """On the thread, once its loop stopped: tasks cancelled, sockets closed, context ended."""
        loop = self.thread.loop
        for t in self._tasks:
            t.cancel()
        if loop is not None and self._tasks:
            loop.run_until_complete(asyncio.gather(*self._tasks, return_exceptions=True))
        for link in self.links:
            if link.sock is not None:
                link.sock.sock.disable_monitor()
        for s in self._socks:
            s.close()
        self._socks.clear()
        if self._ctx is not None:
            self._ctx.term()

    @property
    def running(self) -> bool:
        return self.thread.running

    @property
    def error(self) -> BosenError | None:
        """The client's kept failure (``Lifecycle.error``)."""
        return self.life.error

    @property
    def no_direct_reads(self) -> bool:
        """A server was lost and replaced, or servers joined or left: workers' read connections know
        the servers of the config only, so no more direct reads."""
        return self.servers_changed or any(link.losses for link in self.links)

    @property
    def context(self) -> zmq.Context:
        """The ZeroMQ context (thread-safe): workers' read sockets share its I/O thread."""
        assert self._ctx is not None, "start() first"
        return self._ctx

    def stop(self) -> None:
        self.thread.stop()

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on the communication thread, soon."""
        self.thread.submit(fn, *args)

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float) -> Any:
        """Run a coroutine on the communication thread and wait for its result."""
        return self.thread.call(coro, timeout)

    def unacked(self) -> int:
        return self.sender.unacked()

    def flushing(self) -> bool:
        return self.sender.flushing()

    def _fail(self, err: BosenError) -> None:
        """Fail the client with its first fatal error; nothing waits any more for what will not come."""
        if self.life.fail(err):
            for link in self.links:
                link.window.abort()
                link.fail_requests(err)
            self.sender.wake_flush_waiters()
        self.notify()

    # -- requests ------------------------------------------------------------------------------

    async def _request(self, link: ServerLink, header: dict[str, Any], timeout: float,
                       during_recovery: bool = False) -> dict[str, Any]:
        self.life.raise_failure()
        if link.recovering and not during_recovery:
            raise BosenError(f"{link} was lost and is being replaced; try again")
        seq = link.seq + 1
        assert self.thread.loop is not None
        fut = link.request(header, self.thread.loop)
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise BosenError(f"no answer to {Msg(header['t']).name} from {link} within {timeout:g}s "
                             f"(is it running?)") from None
        finally:
            link.pending.pop(seq, None)

    def _hello_again(self, link: ServerLink) -> Coroutine[Any, Any, dict[str, Any]]:
        """HELLO to a lost server's replacement (partial recovery)."""
        # "cs": the last clock it sent there (a replacement worker redoing its clocks is below its rank's)
        return self._request(link, {"t": Msg.HELLO, "rank": self.rank, "fp": self._fingerprint,
                                    "cs": max(link.window.clock_sent, 0), **self._final()}, RECOVERY_TIMEOUT_S,
                             during_recovery=True)

    def _final(self) -> dict[str, int]:
        """HELLO's ``fc`` once this process ended its clocks: a replacement (or a server added since)
        stops counting its clock once what it resends gets there."""
        return {} if self.final_clock is None else {"fc": self.final_clock}

    async def join(self, rank: int, fingerprint: str, timeout: float, rejoin: int | None = None,
                   joining: int | None = None) -> tuple[int, int]:
        """HELLO to server 0 (which assigns a rank if ``rank`` is -1), then to the others; returns the
        rank and the servers' clock (where this process's workers start: 0, or a resumed checkpoint's).
        ``rejoin`` = C: this process replaces the lost worker ``rank`` from the checkpoint at clock C
        (HELLO ``rp``); its workers start at C, each server at its own clock (at least C). ``joining`` = C:
        this process joins a running job as a new rank at clock C (HELLO ``jn``, ``bosen scale``)."""
        first, rest = self.links[0], self.links[1:]
        hello: dict[str, Any] = {"t": Msg.HELLO, "rank": rank, "fp": fingerprint}
        if rejoin is not None:
            if rank < 0:
                raise BosenError("a replacement for a lost worker needs its rank (BOSEN_RANK)")
            hello["rp"] = rejoin
        if joining is not None:
            hello["jn"] = joining
        h = await self._request(first, dict(hello), timeout)
        first.state = LinkState.JOINED
        rank = self.rank = h["rank"]
        hello["rank"] = rank
        if "sv" in h:  # servers joined or left the job since it started: connect to those it has now
            self._follow_servers(h["sv"], None)
            rest = self.links[1:]
        self._set_capabilities(h.get("tf"))
        welcomes = await asyncio.gather(*(self._request(link, dict(hello), timeout) for link in rest))
        for link in rest:
            link.state = LinkState.JOINED
        self._follow_map((h, *welcomes))
        if rejoin is not None or joining is not None:
            for link, w in zip(self.links, (h, *welcomes), strict=True):
                link.server_clock = w["c"]
            start = rejoin if rejoin is not None else joining
            assert start is not None
            for link in self.links:
                link.window.clock_sent = start  # what it sends now is of ticks >= it (the resend log's tag)
            return rank, start
        clocks = {h["c"], *(w["c"] for w in welcomes)}
        if len(clocks) != 1:
            raise ProtocolError(f"WELCOME: the servers are at different clocks {sorted(clocks)} (resumed from "
                                "different checkpoints?)")
        for link in self.links:
            link.server_clock = h["c"]
            link.window.clock_sent = h["c"]  # the start: what it sends now is of ticks >= it
        return rank, h["c"]

    def _follow_map(self, welcomes: Sequence[dict[str, Any]]) -> None:
        """The partition map the servers follow (WELCOME ``mv``: partitions moved, or the job resumed
        from a checkpoint saved after they did); every server must follow the same one. A lost
        worker's replacement follows it too: ``bosen launch`` replaces one only from a checkpoint
        past the move (before it, no server takes it back and the whole job restarts,
        docs/recovery.md), so its redo is all under the new map."""
        versions = {w.get("mv", 0) for w in welcomes}
        if len(versions) != 1:
            raise ProtocolError(f"WELCOME: the servers follow different partition maps (versions {sorted(versions)}): "
                                "a server restored from a checkpoint older than a partition move cannot rejoin; "
                                "resume the whole job from its checkpoint")
        version = versions.pop()
        if version == self.partition.version:
            return
        if not isinstance(version, int) or "pm" not in welcomes[0]:
            raise ProtocolError(f"WELCOME: partition map version {version!r}, but this client follows "
                                f"{self.partition.version}")
        self.moves.follow(Partition(len(self.links), self.partition.partitions, welcomes[0]["pm"], version,
                                    classes=self.classes))

    def _set_capabilities(self, flags: Any) -> None:
        """Per-table flags from server 0's WELCOME: read-my-writes and versioning (absent: the config's
        defaults, no versioning)."""
        if flags is None:
            return
        if not (isinstance(flags, list) and len(flags) == len(self.tables)
                and all(isinstance(f, int) and not isinstance(f, bool) for f in flags)):
            raise ProtocolError(f"WELCOME: field 'tf' must list one int per table ({len(self.tables)}), got {flags!r}")
        for st, f in zip(self.tables, flags, strict=True):
            st.set_capabilities(bool(f & wire.TF_READ_MY_WRITES), bool(f & wire.TF_VERSIONED))

    async def leave(self, timeout: float) -> None:
        """Flush everything, say BYE, and wait until every server has processed it (the client is
        CLOSING; it is LEAVING once every update is acknowledged)."""
        deadline = asyncio.get_running_loop().time() + RECOVERY_TIMEOUT_S
        while any(link.recovering for link in self.links) and not self.life.failed:  # its replacement first
            if asyncio.get_running_loop().time() > deadline:
                raise BosenError("leaving: a lost server was not replaced in time")
            await asyncio.sleep(0.1)
        self.sender.flush(None)
        await self.sender.until_flushed(timeout)
        self.life.raise_failure()
        self.life.to(Phase.LEAVING)  # pushes that cross our BYE are not acknowledged: we are gone
        versioned = [st for st in self.tables if st.vlog is not None]
        if versioned:
            # Versioned tables: first ask every server to stop pushing to us ("ph"); once it answers,
            # every row it sent us has arrived, so releasing the versions we hold now releases all.
            await asyncio.gather(*(self._request(link, {"t": Msg.BYE, "ph": True}, timeout) for link in self.links))
            end = asyncio.get_running_loop().time() + timeout
            while self.moves.moving and asyncio.get_running_loop().time() < end:  # releases go by the new map
                await asyncio.sleep(0.01)  # (kept back while partitions move, they would follow our BYE)
            for st in versioned:
                with st.lock:
                    if st.vlog is not None:
                        st.vlog.release_all()
                self.sender.send_retired(st)
        await asyncio.gather(*(self._bye(link, timeout) for link in self.links))

    async def end_clocks(self, clock: int, timeout: float) -> None:
        """This process sends no clock past ``clock`` (its clock now) but stays connected (a scale-in's
        leaver waiting at its boundary until it may leave): BYE ``fc`` to every server, answered, after
        every update so far is out. Each server stops counting this rank's clock once it reaches
        ``clock``, so the other workers run on; a lost server's replacement hears it again in HELLO."""
        self.sender.flush(None)
        await self.sender.until_flushed(timeout)
        self.final_clock = clock
        await asyncio.gather(*(self._answered(link, {"t": Msg.BYE, "fc": clock}, timeout) for link in self.links))

    async def _bye(self, link: ServerLink, timeout: float) -> None:
        """BYE to ``link``'s server, answered. A server lost before it answered is replaced from its
        checkpoint, which may not hold this client's last updates: recovery resends them, and the
        BYE goes to the replacement (a loss is no loss only once BYE is answered)."""
        await self._answered(link, {"t": Msg.BYE}, timeout)
        link.said_bye = True

    async def _answered(self, link: ServerLink, header: dict[str, Any], timeout: float) -> None:
        """``header`` to ``link``'s server, answered; where the server is lost first, to its replacement."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RECOVERY_TIMEOUT_S + timeout
        while True:
            while link.recovering and not self.life.failed:
                if loop.time() > deadline:
                    raise BosenError(f"leaving: {link} was lost and not replaced in time")
                await asyncio.sleep(0.05)
            self.life.raise_failure()
            losses = link.losses
            ask = asyncio.ensure_future(self._request(link, dict(header), timeout, during_recovery=True))
            while not ask.done() and link.losses == losses:
                await asyncio.wait({ask}, timeout=0.05)
            if ask.done():
                ask.result()
                return
            ask.cancel()  # its server was lost meanwhile: the replacement gets it
            await asyncio.gather(ask, return_exceptions=True)

    async def status(self, timeout: float) -> list[dict[str, Any]]:
        """Every server's STATUS, asked once this process's flushes so far have gone out (so it
        reflects them: a server answers after handling every earlier message)."""
        await self.sender.until_flushed(timeout)
        replies = await asyncio.gather(*(self._request(link, {"t": Msg.STATUS}, timeout) for link in self.links))
        return [r["stats"] for r in replies]

    # -- receiving -----------------------------------------------------------------------------

    def _dispatch(self, link: ServerLink, frames: list[Any]) -> None:
        ph = self.phases
        if ph is None:
            self._handle(link, frames)
            return
        t = ph.start()
        try:
            self._handle(link, frames)
        finally:
            ph.stop("receive" if self._last_kind is Msg.ROWS else "other_in", t)

    def _take_map(self, partition: Partition) -> None:
        self.partition = partition
        self.sender.partition = partition
        if partition.num_servers < len(self.links):
            self._follow_servers([link.address for link in self.links[:partition.num_servers]], None)

    def _on_plan(self, link: ServerLink, h: dict[str, Any], arrays: Sequence[Any]) -> None:
        sv = h.get("sv")
        if sv is not None:
            if not (isinstance(sv, list) and sv and all(isinstance(a, str) for a in sv)):
                raise ProtocolError(f"PLAN: field 'sv' must list the servers' addresses, got {sv!r}")
            if len(sv) > len(self.links):  # joining: connected before the PAUSED that follows
                self._follow_servers(sv, max(min(lk.window.clock_sent for lk in self.links), 0))
        self.moves.on_plan(link, h)

    def _follow_servers(self, addresses: list[str], clock: int | None) -> None:
        """Servers joined the job (connect to them; ``clock``: this client's clock so far, in the HELLO
        to a server added while the job runs) or left it (BYE to them once the map without them is
        taken, then their sockets close). Servers join and leave at the end of the list."""
        current = [link.address for link in self.links]
        common = min(len(addresses), len(current))
        if addresses[:common] != current[:common]:
            raise ProtocolError(f"the job's servers changed to {addresses}, which does not extend or shorten "
                                f"{current}")
        self.servers_changed = True
        loop = self.thread.loop
        assert loop is not None
        for j in range(len(current), len(addresses)):
            link = ServerLink(j, addresses[j], self.counters, self.bucket)
            if self.config.checkpoint is not None:
                link.log = ResendLog()
            if current:  # the new server has what this client sent the others: its clocks so far
                link.window.clock_sent = min(lk.window.clock_sent for lk in self.links[:len(current)])
                due = [lk.window.clock_due for lk in self.links[:len(current)] if lk.window.clock_due is not None]
                link.window.clock_due = max(due) if due else None
            self.links.append(link)
            for st in self.tables:
                with st.lock:
                    st.inflight.append(InflightLog())
            self._connect(link, loop)
            if clock is not None:
                hello = {"t": Msg.HELLO, "rank": self.rank, "fp": self._fingerprint, "jc": clock,
                         **self._final()}
                link.state = LinkState.JOINED
                link.request(hello, loop).add_done_callback(functools.partial(self._joined, link))
            log.info("server %d (%s) joined the job", j, link.address)
        if len(addresses) < len(current):
            gone = self.links[len(addresses):]
            del self.links[len(addresses):]
            for st in self.tables:
                with st.lock:
                    del st.inflight[len(addresses):]
            for link in gone:
                joined = link.state is LinkState.JOINED
                link.state = LinkState.LEFT  # its connection closing is no loss
                link.window.abort()
                link.window.clock_due = None
                if joined:
                    link.request({"t": Msg.BYE}, loop).add_done_callback(functools.partial(self._left, link))
                else:  # joining a job whose servers left since its config was written
                    self._left(link, None)

    def _joined(self, link: ServerLink, fut: asyncio.Future[dict[str, Any]]) -> None:
        if fut.cancelled():
            return
        err = fut.exception()
        if err is not None:
            self._fail(err if isinstance(err, BosenError) else BosenError(f"joining {link}: {err!r}"))
            return
        link.server_clock = fut.result()["c"]

    def _left(self, link: ServerLink, fut: asyncio.Future[dict[str, Any]] | None) -> None:
        """A server that left the job answered our BYE: its sockets close."""
        if fut is not None and not fut.cancelled() and fut.exception() is not None:
            log.warning("%s left the job; our BYE to it failed: %s", link, fut.exception())
        self._close_sockets(link)
        log.info("%s left the job", link)

    def _resume(self) -> None:
        self.sender.send_held()  # versioned updates kept back during a partition move, before any CLOCK
        for link in self.links:
            self.sender.pump(link)
        self.notify()

    def _on_map(self, link: ServerLink, h: dict[str, Any], arrays: Sequence[Any]) -> None:
        owner = wire.decode_arrays(h, arrays).get("owner")
        servers = self.moves.servers or len(self.links)
        if owner is None or owner.shape != (self.partition.partitions,) or owner.dtype.kind not in "iu" \
                or (owner.shape[0] and (owner.min() < 0 or owner.max() >= servers)):
            raise ProtocolError(f"MAP: needs an 'owner' array of {self.partition.partitions} servers in "
                                f"[0, {servers})")
        self.moves.on_map(link, h, owner)

    def _handle(self, link: ServerLink, frames: list[Any]) -> None:
        if self.moves.held and self.moves.hold(link, frames):
            return  # after this server's new map: handled once every server's is in
        self.counters["msgs_received"] += 1
        self.counters["bytes_received"] += sum(map(len, frames))
        self._last_kind = None
        try:
            h, arrays = receive.decode(frames)
            self._last_kind = h["t"]
            if link.state is LinkState.LEFT and h["t"] not in (Msg.BYE_OK, Msg.ERROR):
                return  # a server that left the job: nothing it says changes what this client holds
            handler = self._handlers.get(h["t"])
            if handler is None:
                raise ProtocolError(f"{h['t'].name} is not a message a client accepts")
            handler(link, h, arrays)
        except BosenError as e:
            log.error("bad message from %s: %s", link, e)
            self._fail(e if isinstance(e, ServerError) else ProtocolError(f"{link}: {e}"))
        except Exception as e:
            log.exception("error handling a message from %s", link)
            err = BosenError(f"error handling a message from {link}: {e!r}")
            err.__cause__ = e
            self._fail(err)

    def _on_monitor(self, link: ServerLink, frames: list[Any]) -> None:
        msg = parse_monitor_message([f.bytes for f in frames])
        event = msg["event"]
        # while a lost server is being replaced, a handshake cut short is that server going away
        refused = handshake_error(event, msg["value"], link.address, link.state is not LinkState.RECOVERING)
        if refused is not None:  # keys or security modes that do not match: no retry will help
            for other in self.links:  # the client fails: what waits to go need not hold its closing up
                if other.sock is not None:
                    other.sock.sock.setsockopt(zmq.LINGER, 0)
            if link.state is not LinkState.LEFT and self.life.phase is not Phase.CLOSED:
                log.error("server %d: %s", link.index, refused)
                self._fail(Refused(f"server {link.index}: {refused}"))
            return
        if event != zmq.EVENT_DISCONNECTED or link.state is not LinkState.JOINED or link.said_bye \
                or self.life.phase is Phase.CLOSED or (self.life.leaving and not self.recovery.possible(link)):
            return
        if self.recovery.possible(link):
            log.warning("lost the connection to %s: waiting for a replacement", link)
            link.state = LinkState.RECOVERING
            link.losses += 1
            self.counters["recoveries"] += 1
            assert self.thread.loop is not None
            self._tasks.append(self.thread.loop.create_task(self.recovery.run(link)))
            return
        log.error("lost the connection to %s", link)
        self._fail(ServerLost(f"lost the connection to {link}: it stopped, crashed or stopped answering"))

    def _on_rows(self, link: ServerLink, h: dict[str, Any], arrays: Sequence[Any]) -> None:
        got = receive.receive_rows(self.tables, link.index, h, arrays)
        if got.retired:
            self.sender.retired_arrived()
        n = h["n"]
        self.counters["rows_received"] += n
        if h["rq"] < 0:
            self.counters["rows_pushed_to_us"] += n
        ps = h.get("ps")
        if isinstance(ps, int) and not isinstance(ps, bool) and not self.life.leaving:  # budgeted push: ack it
            self.counters["rows_pushed_early_to_us"] += n
            link.send({"t": Msg.PUSH_ACK, "ps": ps})

    def _on_lapsed(self, link: ServerLink, h: dict[str, Any], arrays: Sequence[Any]) -> None:
        """The server stopped pushing these rows to this process (not read for ``tables.X.lapse``
        clocks): their cached values are forgotten, as if never received, so a later read pulls them.
        The message's ``ss`` counts among the server's ROWS: a reply of these rows sent before it (on
        a read connection, which may overtake it) is older and ignored, one sent after is taken."""
        tb, n = h["tb"], h["n"]
        if not 0 <= tb < len(self.tables) or n < 0:
            raise ProtocolError(f"LAPSED: table {tb} or row count {n} out of range")
        rows = wire.array(arrays[0], wire.ROW_DTYPE, n, "LAPSED rows")
        st = self.tables[tb]
        with st.lock:
            slots = st.lookup(rows)
            slots = slots[(slots >= 0) & (slots < st.cache.clock.shape[0])]
            st.cache.clear(slots)
            st.cache.ss[slots] = h["ss"]
        self.counters["rows_lapsed"] += n

    def probe(self, st: TableState, rows: np.ndarray, seen: np.ndarray, age: np.ndarray) -> None:
        """A freshness probe of rows a worker read (``seen``: per row, the other processes' update
        count of the value read; ``age``: per row, seconds from the server's send to the read) to
        each owning server; the replies are counted as they come
        (``_on_probe_reply``), never awaited. Probes still unanswered when the client leaves are
        dropped: ``freshness_probes`` - ``freshness_probes_answered`` says how many."""
        if self.life.leaving or self.life.failed or self.moves.moving:
            return
        part = self.partition
        for j, pos in enumerate(part.split(rows)) if part.num_servers > 1 else [(0, None)]:
            link = self.links[j]
            if (pos is not None and not pos.shape[0]) or link.recovering:
                continue
            rj, sj, aj = (rows, seen, age) if pos is None else (rows[pos], seen[pos], age[pos])
            link.send({"t": Msg.PROBE, "tb": st.index, "n": int(rj.shape[0])}, rj, sj)
            self._probe_ages[(j, link.seq)] = float(aj.sum())
            self.counters["freshness_probes"] += 1

    def _on_probe_reply(self, link: ServerLink, h: dict[str, Any], arrays: Sequence[Any]) -> None:
        if h["n"] < 0 or h["ms"] < 0 or h["mx"] < 0:
            raise ProtocolError(f"PROBE_REPLY: negative counts {h!r}")
        c = self.counters
        c["freshness_probes_answered"] += 1
        c["freshness_probed_rows"] += h["n"]
        c["missing_updates_sum"] += h["ms"]
        c["missing_updates_max"] = max(c["missing_updates_max"], h["mx"])
        c["content_age_sum"] += self._probe_ages.pop((link.index, h["rq"]), 0.0)

    def _on_sclock(self, link: ServerLink, h: dict[str, Any], arrays: Sequence[Any]) -> None:
        c = h["c"]
        link.server_clock = c
        durable = h.get("cp")
        if isinstance(durable, int) and not isinstance(durable, bool) and link.log is not None:
            link.log.forget(durable)
        save_s = h.get("ts")
        if isinstance(save_s, float):  # the server's mean time to save a checkpoint (Young's Ts)
            link.save_s = save_s
        for st in self.tables:
            with st.lock:
                st.inflight[link.index].settle(h["a"])
                st.cache.raise_clock(link.index, c, self.partition)
        self._acked(link, h["a"])  # the server sends no ACK for an INC that carried the clock it answers

    def _on_ack(self, link: ServerLink, h: dict[str, Any], arrays: Sequence[Any]) -> None:
        self._acked(link, h["rq"])
        for st in self.tables:
            if st.read_my_writes and st.inflight[link.index].entries:
                with st.lock:
                    st.inflight[link.index].settle(h["rq"])

    def _acked(self, link: ServerLink, through: int) -> None:
        settled, ms = link.acked(through)
        if not settled:
            return
        self.counters["acks"] += settled
        if ms is not None:
            lat = self.ack_latency
            lat["last_ms"] = ms
            lat["max_ms"] = max(lat["max_ms"], ms)
            lat["sum_ms"] += ms
            lat["count"] += 1
        if link.window.busy:
            self.sender.pump(link)  # the window opened: the flush goes on

    def _on_error(self, link: ServerLink, h: dict[str, Any], arrays: Sequence[Any]) -> None:
        if isinstance(h.get("mv"), int):  # a read parked there while its rows moved: asked again
            return
        self.counters["server_errors"] += 1
        err = ServerError(f"{link} rejected message {h['rq']}: {h['m']}")
        fut = link.pending.get(h["rq"])
        if fut is not None and not fut.done():
            fut.set_exception(err)
        else:
            raise err

    def _on_reply(self, link: ServerLink, h: dict[str, Any], arrays: Sequence[Any]) -> None:
        fut = link.pending.get(h["rq"])
        if fut is not None and not fut.done():
            if h["t"] == Msg.STATUS_REPLY:
                h["stats"] = wire.decode_status(arrays[0])
            elif h["t"] == Msg.WELCOME and arrays:
                h["pm"] = wire.array(arrays[0], np.dtype(np.int32), self.partition.partitions, "WELCOME partition map")
            fut.set_result(h)
