"""The client's communication thread: its own event loop, one ``ServerLink`` per server.

It owns the client's main connection to every server: updates, clocks, pushes, acknowledgements.
(A worker blocked on uncached rows asks for them on its own read connection: ``client/reader.py``.)
Worker threads hand it work through its ``LoopThread`` (``submit``, ``call``). What it does, by
concept: the end-of-tick flush (``flush``, paced per server by a ``FlushWindow``), budgeted sends of
the most important rows between ticks (``_budget_loop``), both taking updates out of the buffer
through ``client/encode.py``; and the receive path (a handler per message type; rows go into the
cache through ``client/receive.py``, then ``notify`` wakes blocked readers).

Its first fatal error (a server lost or rejecting an update, a malformed message, a bug) is kept in
``error`` and never cleared: every worker thread raises it at its next call (``Client._check``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import secrets
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import numpy as np
import zmq
from zmq.utils.monitor import parse_monitor_message

from bosen import wire
from bosen.client import encode, receive
from bosen.client.link import ServerLink
from bosen.client.loopthread import LoopThread
from bosen.client.table import TableState
from bosen.client.window import FlushWindow
from bosen.config import Config
from bosen.errors import BosenError, ProtocolError, ServerError, ServerLost
from bosen.malloc import reuse_large_buffers
from bosen.partition import Partition
from bosen.ratelimit import LeakyBucket, paced_sender
from bosen.wire import Msg, UpdateBatch
from bosen.zsocket import LoopSocket

log = logging.getLogger("bosen.client")
YIELD_EVERY = 32  # messages handled (then readers woken) before other tasks (the budget loop) get a turn
START_TIMEOUT_S = 10.0  # the thread's sockets are set up within this, or Client.connect raises
# Partial recovery: a lost server's replacement must welcome us within RECOVERY_TIMEOUT_S, and apply
# what we resend within it too.
RECOVERY_TIMEOUT_S = 120.0
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
    def __init__(self, config: Config, tables: list[TableState], notify: Callable[[], None]) -> None:
        self.config = config
        self.comm = config.comm
        self.partition = Partition(len(config.cluster.servers))
        self.tables = tables
        self.notify = notify
        self.error: BosenError | None = None  # the first fatal error, kept
        # written on this thread only; Client.stats reads them
        self.counters: dict[str, Any] = dict(bytes_sent=0, bytes_received=0, msgs_sent=0, msgs_received=0, rows_sent=0,
                             rows_sent_budgeted=0, budgeted_sends=0, rows_received=0, rows_pushed_to_us=0,
                             rows_pushed_early_to_us=0, update_batches=0, sparse_batches=0, acks=0,
                             server_errors=0, window_paused_s=0.0, idle_polls=0, flushes=0, bytes_resent=0,
                             recoveries=0)
        self.ack_latency = {"last_ms": 0.0, "max_ms": 0.0, "sum_ms": 0.0, "count": 0}
        self.bucket = LeakyBucket(config.comm.client_bandwidth_mbps) if config.comm.enabled else None
        self.links = [ServerLink(j, addr, self.counters, self.bucket) for j, addr in enumerate(config.cluster.servers)]
        if config.checkpoint is not None:  # what was sent since each server's checkpoint, for a replacement
            for link in self.links:
                link.log = deque()
        self.rank = -1
        self.lost_a_server = False
        self._fingerprint = config.fingerprint()
        self._token = secrets.token_hex(8)
        for st in tables:
            st.oplog.send_pieces_as_frames(_AckedSeqs(self.links))
        self._flush_waiters: list[asyncio.Future] = []
        self._retired_scheduled = False
        self._rotation = 0
        self.leaving = False
        self._handlers: dict[Msg, Callable[[ServerLink, dict[str, Any], Sequence[Any]], None]] = {
            Msg.ROWS: self._on_rows,
            Msg.SCLOCK: self._on_sclock,
            Msg.ACK: self._on_ack,
            Msg.ERROR: self._on_error,
            Msg.WELCOME: self._on_reply,
            Msg.BYE_OK: self._on_reply,
            Msg.STATUS_REPLY: self._on_reply,
            Msg.PING: lambda link, h, arrays: None,  # the server checks that we are still there
        }
        self.thread = LoopThread("bosen-comm", self._fail)
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
            self._tasks.append(loop.create_task(self._budget_loop()))

    def _connect(self, link: ServerLink, loop: asyncio.AbstractEventLoop, start: bool = True, attempt: int = 0) -> None:
        """A DEALER to ``link``'s server, watched for disconnection (again, after a loss)."""
        assert self._ctx is not None
        # A ROUTER silently drops a second connection under an identity it already knows, so the
        # identity must be unique across every client of the job: pids repeat across hosts and
        # containers, and several clients may share a process. 64 random bits make a clash moot.
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.SNDHWM, 0)
        dealer.setsockopt(zmq.RCVHWM, 0)
        dealer.setsockopt(zmq.LINGER, 2000)
        dealer.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
        dealer.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        dealer.setsockopt(zmq.IDENTITY, f"c{os.getpid()}-{self._token}-{link.index}-{attempt}".encode())
        monitor = dealer.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        dealer.connect(f"tcp://{link.address}")
        # readers are woken after each batch of messages (or when the queue is drained)
        link.sock = LoopSocket(dealer, loop, functools.partial(self._dispatch, link),
                               after_batch=self.notify, batch=YIELD_EVERY)
        link.monitor = LoopSocket(monitor, loop, functools.partial(self._on_monitor, link))
        self._socks += [link.sock, link.monitor]
        if start:
            link.sock.start()
            link.monitor.start()

    def _disconnect(self, link: ServerLink) -> None:
        """Close ``link``'s sockets at once: what is queued there was for a server that is gone."""
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

    def _fail(self, err: BosenError) -> None:
        """Keep the first fatal error; nothing waits any more for what will not come."""
        if self.error is None:
            self.error = err
            for link in self.links:
                link.window.abort()
                link.fail_requests(err)
            self._wake_flush_waiters()
        self.notify()

    # -- requests ------------------------------------------------------------------------------

    async def _request(self, link: ServerLink, header: dict[str, Any], timeout: float,
                       during_recovery: bool = False) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        if link.recovering and not during_recovery:
            raise BosenError(f"{link} was lost and is being replaced; try again")
        seq = link.seq + 1
        fut = link.request(header, self.thread.loop)
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise BosenError(f"no answer to {Msg(header['t']).name} from {link} within {timeout:g}s "
                             f"(is it running?)") from None
        finally:
            link.pending.pop(seq, None)

    async def join(self, rank: int, fingerprint: str, timeout: float) -> tuple[int, int]:
        """HELLO to server 0 (which assigns a rank if ``rank`` is -1), then to the others; returns the
        rank and the servers' clock (where this process's workers start: 0, or a resumed checkpoint's)."""
        first, rest = self.links[0], self.links[1:]
        h = await self._request(first, {"t": Msg.HELLO, "rank": rank, "fp": fingerprint}, timeout)
        first.joined = True
        rank = self.rank = h["rank"]
        self._set_capabilities(h.get("tf"))
        welcomes = await asyncio.gather(*(self._request(link, {"t": Msg.HELLO, "rank": rank, "fp": fingerprint},
                                                        timeout) for link in rest))
        for link in rest:
            link.joined = True
        clocks = {h["c"], *(w["c"] for w in welcomes)}
        if len(clocks) != 1:
            raise ProtocolError(f"WELCOME: the servers are at different clocks {sorted(clocks)} (resumed from "
                                "different checkpoints?)")
        for link in self.links:
            link.server_clock = h["c"]
        return rank, h["c"]

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
        """Flush everything, say BYE, and wait until every server has processed it."""
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        while any(link.recovering for link in self.links) and self.error is None:  # its replacement first
            if time.monotonic() > deadline:
                raise BosenError("leaving: a lost server was not replaced in time")
            await asyncio.sleep(0.1)
        self.flush(None)
        await self._until_flushed(timeout)
        self.leaving = True  # pushes that cross our BYE are not acknowledged: we are gone
        versioned = [st for st in self.tables if st.vlog is not None]
        if versioned:
            # Versioned tables: first ask every server to stop pushing to us ("ph"); once it answers,
            # every row it sent us has arrived, so releasing the versions we hold now releases all.
            await asyncio.gather(*(self._request(link, {"t": Msg.BYE, "ph": True}, timeout) for link in self.links))
            for st in versioned:
                with st.lock:
                    st.vlog.release_all()
                self._send_retired(st)
        await asyncio.gather(*(self._request(link, {"t": Msg.BYE}, timeout) for link in self.links))

    async def status(self, timeout: float) -> list[dict[str, Any]]:
        """Every server's STATUS, asked once this process's flushes so far have gone out (so it
        reflects them: a server answers after handling every earlier message)."""
        await self._until_flushed(timeout)
        replies = await asyncio.gather(*(self._request(link, {"t": Msg.STATUS}, timeout) for link in self.links))
        return [r["stats"] for r in replies]

    # -- the end-of-tick flush -----------------------------------------------------------------

    def choose_checkpoint(self, clock: int) -> None:
        """Ask every server to save at boundary ``clock``: rank 0 decides under a time rule
        (``checkpoint.every_s`` / ``mttf_s``), and its CLOCK(clock) carries the word (``ck``)."""
        for link in self.links:
            link.window.checkpoint_clocks.add(clock)

    def flush(self, clock: int | None) -> None:
        """Send every buffered update; then, if ``clock`` is given, CLOCK(clock) to every server.

        This is the end-of-tick flush SSP needs: never delayed by the bucket, but charged to it. It
        is paced by acknowledgements instead (``FlushWindow``): the rest is sent as they arrive
        (updates made meanwhile keep coalescing in the buffer; memory for messages stays bounded).
        A server gets its CLOCK(c) once every row that was buffered for it when the flush began has
        gone out; the clock rides on the last update message to it where there is one.
        """
        if self.error is not None:
            return  # nothing more goes out; the workers raise the error
        for st in self.tables:
            with st.lock:
                rows = st.oplog.dirty_rows()
                pending = st.vlog is not None and st.vlog.pending
            if st.vlog is not None:  # versioned tables (retired updates, releases): sent at once
                if rows.shape[0] or pending:
                    self._send_versioned(st, rows)
                continue
            if rows.shape[0]:
                for j, rj in self.partition.rows_by_server(rows):
                    self.links[j].window.owe(st.index, rj)
        for link in self.links:
            if clock is not None:
                link.window.owe_clock(clock)
            self._pump(link)

    def _pump(self, link: ServerLink) -> None:
        """One pass of ``link``'s flush window: what the flush owes its server while the window has
        room; then its clock, if nothing is left."""
        if link.recovering:
            return  # goes on once the replacement has what the lost server had (``_recover``)
        window = link.window
        sent = window.clock_sent
        window.start()
        try:
            for tb in list(window.due):
                queue = window.due[tb]
                while queue:
                    left = self._send_rows_to(link, self.tables[tb], queue[0], window)
                    if left.shape[0]:
                        queue[0] = left
                        break
                    queue.popleft()
                if queue:
                    break
                del window.due[tb]
        finally:
            window.close()
        if window.clock_sent != sent:
            self.notify()  # workers waiting at a checkpoint boundary for this clock to go out
        if self._flush_waiters and not self.flushing():
            self._wake_flush_waiters()

    def flushing(self) -> bool:
        """Whether an end-of-tick flush is still waiting for acknowledgements to go on."""
        return any(link.window.busy for link in self.links)

    async def _until_flushed(self, timeout: float) -> None:
        if self.error is not None:
            raise self.error
        if not self.flushing():
            return
        fut = self.thread.loop.create_future()
        self._flush_waiters.append(fut)
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            inflight = [link.inflight_bytes for link in self.links]
            raise BosenError(f"buffered updates not acknowledged within {timeout:g}s (is every server "
                             f"running? updates in flight: {inflight} bytes)") from None
        if self.error is not None:
            raise self.error

    def _wake_flush_waiters(self) -> None:
        for fut in self._flush_waiters:
            if not fut.done():
                fut.set_result(None)
        self._flush_waiters.clear()

    # -- taking updates out of the buffer ------------------------------------------------------

    def _send_rows_to(self, link: ServerLink, st: TableState, rows: np.ndarray,
                      window: FlushWindow | None) -> np.ndarray:
        """Take ``rows`` (sorted, all of ``link``'s server) out of the update buffer and send them;
        through ``window`` (a flush pass: stop while it is full), else at once. Returns the rows
        not sent."""
        out = link if window is None else window
        k = 0
        while k < rows.shape[0]:
            if window is not None and not window.has_room():
                break
            with st.lock:
                update, k = encode.take_chunk(st, rows, k, link.index, link.seq + 1)
                if update is None:
                    continue
                batch, owned, frame = update
                nbytes = out.send(encode.inc_header(st, batch), *batch.arrays(), owned=owned, frame=frame)
                if frame is not None:
                    st.oplog.carried(owned, link.index, link.seq)  # before this thread lets go of it
            self._sent_update(link, batch, nbytes)
        return rows[k:]

    def _sent_update(self, link: ServerLink, batch: UpdateBatch, nbytes: int) -> None:
        link.sent_update(nbytes)
        c = self.counters
        c["update_batches"] += 1
        c["sparse_batches"] += batch.sparse
        c["rows_sent"] += batch.rows.shape[0]

    def _send_versioned(self, st: TableState, rows: np.ndarray) -> int:
        """Versioned table: retired updates, ``rows`` from the buffer and releases, sent at once."""
        with st.lock:
            batches = encode.take_versioned(st, rows, self.partition)
        total = 0
        for j, batch in batches:
            link = self.links[j]
            nbytes = link.send(encode.inc_header(st, batch), *batch.arrays())
            self._sent_update(link, batch, nbytes)
            total += nbytes
        return total

    def _send_retired(self, st: TableState) -> int:
        """Send what version changes queued (retired updates, releases) now; returns bytes sent.
        Never delayed by the bucket (it frees server memory), but charged to it like every send."""
        with st.lock:
            pending = st.vlog is not None and st.vlog.pending
        return self._send_versioned(st, np.empty(0, dtype=np.int64)) if pending else 0

    def send_all_retired(self) -> None:
        self._retired_scheduled = False
        for st in self.tables:
            if st.vlog is not None:
                self._send_retired(st)

    # -- managed communication -----------------------------------------------------------------

    def unacked(self) -> int:
        return max(link.unacked for link in self.links)

    async def _budget_loop(self) -> None:
        """Between ticks, send the most important buffered rows whenever the bucket is empty."""
        assert self.bucket is not None
        await paced_sender(self.bucket, self.comm.idle_ms / 1000,
                           lambda: self.unacked() > self.comm.max_unacked, self._send_budgeted_guarded,
                           self.counters)

    def _send_budgeted_guarded(self) -> int:
        if self.error is not None:
            return 0
        try:
            return self._send_budgeted()
        except Exception as e:  # report it to the workers, keep the loop alive
            log.exception("budgeted send failed")
            err = BosenError(f"budgeted send failed: {e!r}")
            err.__cause__ = e
            self._fail(err)
            return 0

    def _send_budgeted(self) -> int:
        k = self.comm.client_send_rows
        if any(link.recovering for link in self.links):
            return 0  # the flush sends everything once the lost server is replaced
        for i in range(len(self.tables)):
            st = self.tables[(self._rotation + i) % len(self.tables)]
            with st.lock:
                candidates = st.oplog.dirty_rows()
                if candidates.shape[0] == 0:
                    continue
                picked = np.sort(st.policy.choose(candidates, st.importance, k))
            self._rotation = (self._rotation + i + 1) % len(self.tables)
            if st.vlog is not None:
                sent = self._send_versioned(st, picked)
            else:
                before = self.counters["bytes_sent"]
                for j, rj in self.partition.rows_by_server(picked):
                    self._send_rows_to(self.links[j], st, rj, None)
                sent = self.counters["bytes_sent"] - before
            self.counters["rows_sent_budgeted"] += picked.shape[0]
            self.counters["budgeted_sends"] += 1
            return sent
        return 0

    def request_rows(self, st: TableState, rows: np.ndarray, min_clock: int) -> None:
        for j, rj in self.partition.rows_by_server(rows):
            if self.links[j].recovering:  # asked again once it is back (Client._wait_fresh)
                with st.lock:
                    st.cache.requested[rj] = False
                continue
            self.links[j].send({"t": Msg.READ, "tb": st.index, "n": int(rj.shape[0]), "c": min_clock}, rj)

    # -- receiving -----------------------------------------------------------------------------

    def _dispatch(self, link: ServerLink, frames: list[Any]) -> None:
        self.counters["msgs_received"] += 1
        self.counters["bytes_received"] += sum(map(len, frames))
        try:
            h, arrays = receive.decode(frames)
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
        event = parse_monitor_message([f.bytes for f in frames])["event"]
        if event != zmq.EVENT_DISCONNECTED or not link.joined or self.leaving or link.recovering:
            return
        if link.log is not None and all(st.vlog is None for st in self.tables):
            log.warning("lost the connection to %s: waiting for a replacement", link)
            link.recovering = True
            self.counters["recoveries"] += 1
            self._tasks.append(self.thread.loop.create_task(self._recover(link)))
            return
        log.error("lost the connection to %s", link)
        self._fail(ServerLost(f"lost the connection to {link}: it stopped, crashed or stopped answering"))

    async def _recover(self, link: ServerLink) -> None:
        """Partial recovery: rejoin ``link``'s replacement (restarted from its newest checkpoint, at
        clock C), resend every update and clock sent to it since C, and once it has applied them
        read its rows anew. Meanwhile nothing else goes to it, and workers wait only where they
        need it. A replacement that does not come, or comes without the checkpoint this process
        kept its updates for, fails the client with the reason."""
        try:
            self.lost_a_server = True  # workers' read connections know only the lost server: no more direct reads
            link.fail_requests(BosenError(f"{link} was lost; waiting for its replacement"))
            deadline = time.monotonic() + RECOVERY_TIMEOUT_S
            # a new connection (what the old one queued was for the lost server); the HELLO waits in
            # it until a replacement listens at the address
            self._disconnect(link)
            self._connect(link, self.thread.loop, attempt=1 + self.counters["recoveries"])
            try:
                h = await self._request(link, {"t": Msg.HELLO, "rank": self.rank, "fp": self._fingerprint},
                                        RECOVERY_TIMEOUT_S, during_recovery=True)
            except ServerError as e:
                raise ServerLost(f"{link} was lost and came back refusing this client: {e}") from None
            except BosenError:
                raise ServerLost(f"{link} was lost and no replacement answered within {RECOVERY_TIMEOUT_S:g}s") \
                    from None
            since = h.get("rc")
            if not isinstance(since, int) or isinstance(since, bool):
                raise ServerLost(f"{link} was lost and came back without its checkpoint (start the replacement "
                                 "with --resume DIR --recover): the updates it had are gone")
            if since < link.log_floor:
                raise ServerLost(f"{link} came back from its checkpoint at clock {since}, but this client kept "
                                 f"its updates only from clock {link.log_floor} on: they cannot be replayed")
            for st in self.tables:  # read anew from the replacement (and so subscribed to it)
                with st.lock:
                    st.inflight[link.index].entries.clear()
                    st.cache.forget_server(link.index)
            last = link.resend(since)
            log.warning("%s is back from its checkpoint at clock %d: resent %d messages", link, since,
                        len(link.log or ()))
            while link.acked_seq < last:  # applied (held past a boundary, until the others catch up)
                if self.error is not None:
                    return
                if time.monotonic() > deadline:
                    raise ServerLost(f"{link}'s replacement did not apply the resent updates within "
                                     f"{RECOVERY_TIMEOUT_S:g}s")
                await asyncio.sleep(0.005)
            for st in self.tables:  # acknowledged: nothing resent is in flight any more
                with st.lock:
                    st.inflight[link.index].entries.clear()
            link.recovering = False
            self.notify()
            self._pump(link)
        except BosenError as e:
            self._fail(e)
        except Exception as e:
            log.exception("recovering %s failed", link)
            err = BosenError(f"recovering {link} failed: {e!r}")
            err.__cause__ = e
            self._fail(err)

    def _on_rows(self, link: ServerLink, h: dict[str, Any], arrays: Sequence[Any]) -> None:
        got = receive.receive_rows(self.tables, link.index, h, arrays)
        if got.retired and not self._retired_scheduled:
            self._retired_scheduled = True  # one INC per server after this burst of ROWS
            self.thread.loop.call_soon(self.thread.guard, self.send_all_retired, ())
        n = h["n"]
        self.counters["rows_received"] += n
        if h["rq"] < 0:
            self.counters["rows_pushed_to_us"] += n
        ps = h.get("ps")
        if isinstance(ps, int) and not isinstance(ps, bool) and not self.leaving:  # budgeted push: ack it
            self.counters["rows_pushed_early_to_us"] += n
            link.send({"t": Msg.PUSH_ACK, "ps": ps})

    def _on_sclock(self, link: ServerLink, h: dict[str, Any], arrays: Sequence[Any]) -> None:
        c = h["c"]
        link.server_clock = c
        durable = h.get("cp")
        if isinstance(durable, int) and not isinstance(durable, bool):
            link.forget(durable)
        save_s = h.get("ts")
        if isinstance(save_s, float):  # the server's mean time to save a checkpoint (Young's Ts)
            link.save_s = save_s
        for st in self.tables:
            with st.lock:
                st.inflight[link.index].settle(h["a"])
                st.cache.raise_clock(link.index, c)
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
            self._pump(link)  # the window opened: the flush goes on

    def _on_error(self, link: ServerLink, h: dict[str, Any], arrays: Sequence[Any]) -> None:
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
            fut.set_result(h)
