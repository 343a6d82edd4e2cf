"""The client's communication thread: its own event loop, one DEALER socket per server.

It owns the client's main connection to every server: updates, clocks, pushes, acknowledgements.
(A worker blocked on uncached rows asks for them on its own read connection: ``client/reader.py``.)
Worker threads hand it work with ``submit`` (fire and forget) or ``call`` (wait for a coroutine's
result). Incoming rows and clocks are written into the shared table state under each table's lock,
then ``notify`` wakes blocked readers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import threading
import time
from collections import deque
from typing import Any, Callable, Coroutine

import numpy as np
import uvloop
import zmq

from bosen import rowmath, wire
from bosen.config import Config
from bosen.malloc import reuse_large_buffers
from bosen.ratelimit import LeakyBucket, paced_sender
from bosen.errors import BosenError, ProtocolError, ServerError
from bosen.partition import Partition
from bosen.wire import Msg, UpdateBatch
from bosen.zsocket import LoopSocket
from bosen.client.oplog import UpdateBuffer
from bosen.client.table import TableState

log = logging.getLogger("bosen.client")
F16_MAX = float(np.finfo(np.float16).max)
YIELD_EVERY = 32  # messages handled (then readers woken) before other tasks (the budget loop) get a turn
# Most update bytes in flight to one server before a flush waits for ACKs. 16 MiB, not 8: the client's
# ZeroMQ I/O thread then always has a message queued behind the one it sends, and ingest-1MiB took
# 4-6% less CPU per MiB (design.md, "Throughput mechanics").
WINDOW_BYTES = 16 << 20
# A flush's update messages ask for an ACK once per ACK_SPACING_BYTES (and on its last message); the
# rest carry "na" and are acknowledged by a later ACK, which is cumulative. An ACK wakes four threads
# on two machines; acknowledging 1 MiB messages in twos cut ingest's CPU per MiB by ~8% (design.md).
ACK_SPACING_BYTES = 2 << 20


def apply_rows(st: TableState, j: int, h: dict[str, Any], rows: np.ndarray, vals: np.ndarray) -> bool:
    """Write rows from server ``j`` (a ROWS message: header ``h``) into the cache, under ``st.lock``,
    from the communication thread or a worker's direct read. Rows for which a later message of the
    server's (header ``ss``) was already applied are left alone: a client's ROWS come on more than
    one connection, and a reply may be overtaken by a later push. With read-my-writes, this
    process's updates not yet in the values (buffered, or sent after the server's ``a``) go back on
    top. Returns True if the cache rows now hold exactly ``vals``, every one of them."""
    cache = st.cache
    ss = h["ss"]
    n = rows.shape[0]
    lo = rowmath.run_start(rows)
    exact = lo >= 0 and cache.receive_run(lo, n, ss, h["c"])  # the usual case: one pass over the metadata
    if exact:
        index: slice | np.ndarray = slice(lo, lo + n)
        cache.values[index] = vals  # a memcpy
        exact = vals.dtype == cache.values.dtype
    else:
        index = slice(lo, lo + n) if lo >= 0 else rows
        cache.requested[index] = False
        newer = cache.ss[index] < ss
        if not newer.all():
            rows, vals = rows[newer], vals[newer]
            index = rows
        cache.values[index] = vals
        cache.ss[index] = ss
        if type(index) is slice:
            np.maximum(cache.clock[index], h["c"], out=cache.clock[index])
        else:
            cache.clock[rows] = np.maximum(cache.clock[rows], h["c"])
    if st.read_my_writes:
        log_j = st.inflight[j]
        log_j.settle(h["a"])
        if st.oplog.add_buffered_to(cache.values, rows, index):
            exact = False
        if log_j.reapply(cache.values, rows, h["a"]):
            exact = False
    return exact


class CommThread:
    def __init__(self, config: Config, tables: list[TableState], notify: Callable[[], None]) -> None:
        self.config = config
        self.addresses = list(config.cluster.servers)
        self.n = len(self.addresses)
        self.partition = Partition(self.n)
        self.tables = tables
        self.notify = notify
        self.seq = [0] * self.n
        self.server_clock = [0] * self.n
        self.pending: dict[tuple[int, int], asyncio.Future] = {}
        self.error: BosenError | None = None
        self.counters = dict(bytes_sent=0, bytes_received=0, msgs_sent=0, msgs_received=0, rows_sent=0,
                             rows_sent_budgeted=0, budgeted_sends=0, rows_received=0, rows_pushed_to_us=0,
                             rows_pushed_early_to_us=0, update_batches=0, sparse_batches=0, acks=0,
                             server_errors=0, window_paused_s=0.0, idle_polls=0, flushes=0)
        self.comm = config.comm
        self.bucket = LeakyBucket(config.comm.client_bandwidth_mbps) if config.comm.enabled else None
        self.incs_sent = [0] * self.n
        # during an end-of-tick flush, the latest INC to each server is kept back: the flush's last
        # one carries the clock, or asks for an ACK; update bytes sent since one asked for an ACK
        self._holding = False
        self._held: list[tuple[dict[str, Any], list[Any]] | None] = [None] * self.n
        self._unasked = [0] * self.n
        # an end-of-tick flush in progress: per server, rows still to send (by table) and the clock
        # to send after them; update bytes sent and not yet acknowledged
        self._due: list[dict[int, deque[np.ndarray]]] = [{} for _ in range(self.n)]
        self._clock_due: list[int | None] = [None] * self.n
        self._inflight_bytes = [0] * self.n
        self.window_bytes = WINDOW_BYTES
        self._flush_waiters: list[asyncio.Future] = []
        self._retired_scheduled = False
        self.incs_acked = [0] * self.n
        self.acked_seq = [0] * self.n  # per server, the highest update sequence number it acknowledged
        for st in tables:
            st.oplog.send_pieces_as_frames(self.acked_seq)
        # update latency: send time of each unacknowledged INC, per server
        self._inc_times: list[deque[tuple[int, float, int]]] = [deque() for _ in range(self.n)]
        self.ack_latency = {"last_ms": 0.0, "max_ms": 0.0, "sum_ms": 0.0, "count": 0}
        self._rotation = 0
        self.leaving = False
        self._handlers: dict[Msg, Callable[[int, dict[str, Any], list[Any]], None]] = {
            Msg.ROWS: self._on_rows,
            Msg.SCLOCK: self._on_sclock,
            Msg.ACK: self._on_ack,
            Msg.ERROR: self._on_error,
            Msg.WELCOME: self._on_reply,
            Msg.BYE_OK: self._on_reply,
            Msg.STATUS_REPLY: self._on_reply,
        }
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._ctx: zmq.Context | None = None
        self._socks: list[LoopSocket] = []
        self._tasks: list[asyncio.Task] = []

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        reuse_large_buffers()  # process-wide, but only affects how freed big buffers are kept
        self._thread = threading.Thread(target=self._run, name="bosen-comm", daemon=True)
        self._thread.start()
        self._ready.wait()

    def _run(self) -> None:
        loop = uvloop.new_event_loop()
        asyncio.set_event_loop(loop)
        self.loop = loop
        self._ctx = zmq.Context()
        # A ROUTER silently drops a second connection under an identity it already knows, so the
        # identity must be unique across every client of the job: pids repeat across hosts and
        # containers, and several clients may share a process. 64 random bits make a clash moot.
        token = secrets.token_hex(8)
        for j, addr in enumerate(self.addresses):
            s = self._ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.SNDHWM, 0)
            s.setsockopt(zmq.RCVHWM, 0)
            s.setsockopt(zmq.LINGER, 2000)
            s.setsockopt(zmq.IDENTITY, f"c{os.getpid()}-{token}-{j}".encode())
            s.connect(f"tcp://{addr}")
            # readers are woken after each batch of messages (or when the queue is drained)
            self._socks.append(LoopSocket(s, loop, lambda frames, j=j: self._dispatch(j, frames),
                                          after_batch=self.notify, batch=YIELD_EVERY))
        for s in self._socks:
            s.start()
        if self.bucket is not None:
            self._tasks.append(loop.create_task(self._budget_loop()))
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            for t in self._tasks:
                t.cancel()
            loop.run_until_complete(asyncio.gather(*self._tasks, return_exceptions=True))
            for s in self._socks:
                s.close()
            self._ctx.term()
            loop.close()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def context(self) -> zmq.Context:
        """The ZeroMQ context (thread-safe): workers' read sockets share its I/O thread."""
        assert self._ctx is not None, "start() first"
        return self._ctx

    def stop(self) -> None:
        if self.loop is not None and self._thread is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on the communication thread, soon."""
        self.loop.call_soon_threadsafe(self._guard, fn, args)

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float) -> Any:
        """Run a coroutine on the communication thread and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def _guard(self, fn: Callable[..., None], args: tuple) -> None:
        try:
            fn(*args)
        except BosenError as e:
            self._fail(e)
        except Exception as e:
            log.exception("communication thread error")
            self._fail(BosenError(f"communication thread error: {e!r}"))

    def _fail(self, err: BosenError) -> None:
        if self.error is None:
            self.error = err
        self.notify()

    # -- sending -------------------------------------------------------------------------------

    def _send(self, j: int, header: dict[str, Any], *arrays: np.ndarray, owned: np.ndarray | None = None,
              frame: Any = None) -> int:
        """Send one message to server ``j``; returns its size in bytes. Every byte is charged to the
        bucket (budgeted or not), so egress tracks the budget whatever the traffic mix. Arrays are
        copied into the message, except ``owned`` (one that is never written again), which goes as
        ``frame`` where it lives in one (a staged piece: ``bosen.bufferpool``)."""
        self.seq[j] += 1
        header["s"] = self.seq[j]
        payload = 0
        for a in arrays:
            payload += a.nbytes
        hold = self._holding and header["t"] == Msg.INC
        if hold:
            self._unasked[j] += payload
            if self._unasked[j] < ACK_SPACING_BYTES:
                header["na"] = True  # a later ACK covers it
            else:
                self._unasked[j] = 0
        frames = wire.encode(header, *arrays, owned=owned, frame=frame)
        if self._held[j] is not None:
            self._release(j)  # in sequence order
        if hold:
            self._held[j] = (header, frames)  # the pump sends it, perhaps as the flush's last message
        else:
            self._socks[j].send(frames)
        nbytes = len(frames[0]) + payload  # the header, then one frame per array
        self.counters["msgs_sent"] += 1
        self.counters["bytes_sent"] += nbytes
        if self.bucket is not None:
            self.bucket.charge(nbytes)
        return nbytes

    def _release(self, j: int, last: bool = False) -> None:
        """Send the INC that a flush kept back for server ``j``. The ``last`` one the pump sends
        must be acknowledged (nothing later may come to cover it), or answered by an SCLOCK when it
        carries the clock: its header loses ``na`` and may have gained ``c``."""
        held, self._held[j] = self._held[j], None
        if held is not None:
            header, frames = held
            if last and header.pop("na", False):
                self._unasked[j] = 0
                frames[0] = wire.pack_header(header)
            elif "c" in header:
                frames[0] = wire.pack_header(header)
            self._socks[j].send(frames)

    async def _request(self, j: int, header: dict[str, Any], timeout: float) -> dict[str, Any]:
        fut = self.loop.create_future()
        seq = self.seq[j] + 1
        self.pending[(j, seq)] = fut
        self._send(j, header)  # assigns sequence number ``seq``
        try:
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise BosenError(f"no answer to {Msg(header['t']).name} from server {j} at {self.addresses[j]} "
                             f"within {timeout:g}s (is it running?)") from None
        finally:
            self.pending.pop((j, seq), None)

    async def join(self, rank: int, fingerprint: str, timeout: float) -> int:
        """HELLO to server 0 (which assigns a rank if ``rank`` is -1), then to the others."""
        h = await self._request(0, {"t": Msg.HELLO, "rank": rank, "fp": fingerprint}, timeout)
        rank = h["rank"]
        self._set_capabilities(h.get("tf"))
        await asyncio.gather(*(self._request(j, {"t": Msg.HELLO, "rank": rank, "fp": fingerprint}, timeout)
                               for j in range(1, self.n)))
        return rank

    def _set_capabilities(self, flags: Any) -> None:
        """Per-table flags from server 0's WELCOME: read-my-writes and versioning (absent: the config's
        defaults, no versioning)."""
        if flags is None:
            return
        if not (isinstance(flags, list) and len(flags) == len(self.tables)
                and all(isinstance(f, int) and not isinstance(f, bool) for f in flags)):
            raise ProtocolError(f"WELCOME: field 'tf' must list one int per table ({len(self.tables)}), got {flags!r}")
        for st, f in zip(self.tables, flags):
            st.set_capabilities(bool(f & wire.TF_READ_MY_WRITES), bool(f & wire.TF_VERSIONED))

    async def leave(self, timeout: float) -> None:
        """Flush everything, say BYE, and wait until every server has processed it."""
        self.flush(None)
        await self._until_flushed(timeout)
        self.leaving = True  # pushes that cross our BYE are not acknowledged: we are gone
        versioned = [st for st in self.tables if st.vlog is not None]
        if versioned:
            # Versioned tables: first ask every server to stop pushing to us ("ph"); once it answers,
            # every row it sent us has arrived, so releasing the versions we hold now releases all.
            await asyncio.gather(*(self._request(j, {"t": Msg.BYE, "ph": True}, timeout) for j in range(self.n)))
            for st in versioned:
                with st.lock:
                    st.vlog.release_all()
                self._send_retired(st)
        await asyncio.gather(*(self._request(j, {"t": Msg.BYE}, timeout) for j in range(self.n)))

    async def status(self, timeout: float) -> list[dict[str, Any]]:
        """Every server's STATUS, asked once this process's flushes so far have gone out (so it
        reflects them: a server answers after handling every earlier message)."""
        await self._until_flushed(timeout)
        replies = await asyncio.gather(*(self._request(j, {"t": Msg.STATUS}, timeout) for j in range(self.n)))
        return [r["stats"] for r in replies]

    def flush(self, clock: int | None) -> None:
        """Send every buffered update; then, if ``clock`` is given, CLOCK(clock) to every server.

        This is the end-of-tick flush SSP needs: never delayed by the bucket, but charged to it. It
        is paced by acknowledgements instead: at most WINDOW_BYTES of updates are in flight to one
        server, and the rest is sent as acknowledgements arrive (updates made meanwhile keep
        coalescing in the buffer; memory for messages stays bounded). A server gets its CLOCK(c) once
        every row that was buffered for it when the flush began has gone out; the clock rides on the
        last update message to it (header ``c``) where there is one, and the server answers with
        SCLOCK alone: one message each way per tick.
        """
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
                    # appended in order; a row queued twice is sent once (dirty flag)
                    self._due[j].setdefault(st.index, deque()).append(rj)
        for j in range(self.n):
            if clock is not None:
                self._clock_due[j] = clock
            self._pump(j)

    def _pump(self, j: int) -> None:
        """Send what the flush owes server ``j`` while its window allows; then its clock, if due and
        nothing is left."""
        due = self._due[j]
        clock = self._clock_due[j]
        self._holding = True  # _send keeps back the latest INC: the last one gets the clock or an ACK
        try:
            for tb in list(due):
                queue = due[tb]
                while queue:
                    left = self._send_rows_to(j, self.tables[tb], queue[0], windowed=True)
                    if left.shape[0]:
                        queue[0] = left
                        break
                    queue.popleft()
                if not queue:
                    del due[tb]
        finally:
            self._holding = False
            held = self._held[j]
            if clock is not None and not due:
                self._clock_due[j] = None
                if held is None:
                    self._send(j, {"t": Msg.CLOCK, "c": clock})
                else:
                    held[0]["c"] = clock
            self._release(j, last=True)
            if self._flush_waiters and not self.flushing():
                for fut in self._flush_waiters:
                    if not fut.done():
                        fut.set_result(None)
                self._flush_waiters.clear()

    def flushing(self) -> bool:
        """Whether an end-of-tick flush is still waiting for acknowledgements to go on."""
        return any(self._due) or any(c is not None for c in self._clock_due)

    async def _until_flushed(self, timeout: float) -> None:
        if not self.flushing():
            return
        fut = self.loop.create_future()
        self._flush_waiters.append(fut)
        try:
            await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise BosenError(f"buffered updates not acknowledged within {timeout:g}s (is every server "
                             f"running? updates in flight: {self._inflight_bytes} bytes)") from None

    def _send_buffered(self, st: TableState, rows: np.ndarray) -> int:
        """Take ``rows`` (sorted) out of the update buffer and send them now; returns bytes sent."""
        if st.vlog is not None:
            return self._send_versioned(st, rows)
        before = self.counters["bytes_sent"]
        for j, rj in self.partition.rows_by_server(rows):
            self._send_rows_to(j, st, rj, windowed=False)
        return self.counters["bytes_sent"] - before

    def _send_rows_to(self, j: int, st: TableState, rows: np.ndarray, windowed: bool) -> np.ndarray:
        """Take ``rows`` (sorted, all of server ``j``) out of the update buffer and send them to ``j``;
        ``windowed``: stop while WINDOW_BYTES are in flight to ``j``. Returns the rows not sent.

        Messages carry at most ``oplog.CHUNK_BYTES`` of values: the server applies one while the
        next is on the way, memory peaks stay small, and the table lock is held only while a chunk is
        taken. A chunk is taken into an array that nothing writes again (a staged piece as it is), so
        the message carries it without a copy, and the in-flight log (read-my-writes) keeps that same
        array.
        """
        k = 0
        while k < rows.shape[0]:
            if windowed and self._inflight_bytes[j] >= self.window_bytes:
                break
            with st.lock:
                piece = st.oplog.take_piece(rows, k)
                if piece is not None:  # the common case of bulk increments, in O(1)
                    rj, index, block, nnz = piece
                    k += rj.shape[0]
                else:
                    rj, k = self._next_chunk(st.oplog, rows, k)
                    if rj.shape[0] == 0:
                        continue
                    index = rowmath.rows_index(rj)
                    block, nnz = st.oplog.take_counted(rj, index)
                wire_block, applied = self._quantize(st, rj, block)
                if st.read_my_writes:
                    self._log_inflight(st, j, rj, index, applied)
                if st.importance is not None:
                    st.importance[index] = 0
                st.send_count[index] += 1
            if wire_block is not block:
                nnz = None  # float16 rounding may have zeroed some values
            batch = self._update_batch(rj, wire_block, nnz)
            if batch.sparse:
                self._send_update(j, st, batch)
            elif wire_block is block and (frame := st.oplog.frame_of(block)) is not None:
                self._send_update(j, st, batch, owned=block, frame=frame)
                st.oplog.carried(block, j, self.seq[j])  # before this thread lets go of it
            else:
                self._send_update(j, st, batch, owned=wire_block)
        return rows[k:]

    @staticmethod
    def _next_chunk(oplog: UpdateBuffer, rows: np.ndarray, k: int) -> tuple[np.ndarray, int]:
        """The next message's rows from ``rows[k:]`` and where the rest begins: only rows still
        buffered (a budgeted send, or a flush that queued them too, may have sent some since), up to
        a chunk of them so that messages stay full, and a staged piece on its own."""
        n, per = rows.shape[0], oplog.chunk_rows
        end = min(k + per, n)
        rj = rows[k:end]
        index = rowmath.rows_index(rj)
        if not oplog.dirty[index].all():
            rj = rj[oplog.dirty[rj]]
            while rj.shape[0] < per and end < n:
                more = rows[end:end + per - rj.shape[0]]
                end += more.shape[0]
                rj = np.concatenate([rj, more[oplog.dirty[more]]])
            if rj.shape[0] == 0:
                return rj, end
            index = rowmath.rows_index(rj)
        cut = oplog.chunk_end(rj, index)
        if cut < rj.shape[0]:
            end = k + int(np.searchsorted(rows[k:end], rj[cut]))
            rj = rj[:cut]
        return rj, end

    def _log_inflight(self, st: TableState, j: int, rows: np.ndarray, index: slice | np.ndarray,
                      deltas: np.ndarray) -> None:
        """Remember what the very next message to server ``j`` adds, for read-my-writes. Without
        direct reads, only for rows the cache holds or has asked for: any later read of another row
        reaches the server after this message (one FIFO socket), so the value it gets back already
        contains these updates. A direct read travels on another socket and may overtake it, so
        then every update is logged. ``index``: ``rows`` as an index (a slice for a run).
        ``deltas`` is never written again: the log may keep it as it is."""
        if st.direct_reads:
            st.inflight[j].add(self.seq[j] + 1, rows, deltas)
            return
        known = st.cache.known(rows)
        if known == rows.shape[0]:
            st.inflight[j].add(self.seq[j] + 1, rows, deltas)
        elif known:
            seen = (st.cache.clock[index] >= 0) | st.cache.requested[index]
            st.inflight[j].add(self.seq[j] + 1, rows[seen], deltas[seen])

    def _send_versioned(self, st: TableState, rows: np.ndarray) -> int:
        """Versioned table: per server one INC with the retired updates first (end-of-version), then
        ``rows`` taken from the buffer (tagged with their cached versions), then the releases."""
        batches = []
        with st.lock:
            rr, rt, rv, lr, lt = st.vlog.take(st.cols, st.dtype)
            cur = st.oplog.take(rows) if rows.shape[0] else np.empty((0, st.cols), dtype=st.dtype)
            if rows.shape[0]:
                if st.importance is not None:
                    st.importance[rows] = 0
                st.send_count[rows] += 1
            all_rows = np.concatenate([rr, rows])
            tags = np.concatenate([rt, st.vlog.version[rows]])
            eov = np.zeros(all_rows.shape[0], dtype=wire.EOV_DTYPE)
            eov[:rr.shape[0]] = 1
            block = np.concatenate([rv, cur]) if rr.shape[0] else cur
            rel_parts = self.partition.split(lr)
            per = st.oplog.chunk_rows
            for j, pos in enumerate(self.partition.split(all_rows)):
                rpos = rel_parts[j]
                # in order (retired first), at most a chunk of values per message; the
                # releases ride with the last message to this server
                for k in range(0, max(pos.shape[0], 1), per):
                    p = pos[k:k + per]
                    last = k + per >= pos.shape[0]
                    if p.shape[0] == 0 and (rpos.shape[0] == 0 or not last):
                        continue
                    rj = all_rows[p]
                    wire_block, _ = self._quantize(st, rj, block[p], keep_residual=eov[p] == 0)
                    batch = self._update_batch(rj, wire_block)
                    batch.tags, batch.eov = tags[p], eov[p]
                    batch.rel_rows, batch.rel_tags = (lr[rpos], lt[rpos]) if last else (lr[:0], lt[:0])
                    batches.append((j, batch))
        return sum(self._send_update(j, st, batch) for j, batch in batches)

    def _send_retired(self, st: TableState) -> int:
        """Send what version changes queued (retired updates, releases) now; returns bytes sent.
        Never delayed by the bucket (it frees server memory), but charged to it like every send."""
        with st.lock:
            pending = st.vlog is not None and st.vlog.pending
        return self._send_versioned(st, np.empty(0, dtype=np.int64)) if pending else 0

    def _send_all_retired(self) -> None:
        self._retired_scheduled = False
        for st in self.tables:
            if st.vlog is not None:
                self._send_retired(st)

    def _quantize(self, st: TableState, rows: np.ndarray, block: np.ndarray,
                  keep_residual: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(what goes on the wire, what the server will add). With a float16 wire the rounding
        residual goes back into the buffer, so it is sent later rather than lost (except where
        ``keep_residual`` is False: retired updates of a version being released)."""
        if st.wire_dtype == st.dtype:
            return block, block
        q = np.clip(block, -F16_MAX, F16_MAX).astype(st.wire_dtype)
        applied = q.astype(st.dtype)
        resid = block - applied
        keep_rows = (resid != 0).any(axis=1)
        if keep_residual is not None:
            keep_rows &= keep_residual
        keep = np.flatnonzero(keep_rows)
        if keep.shape[0]:
            st.oplog.add_dense(rows[keep], resid[keep])
        return q, applied

    def _update_batch(self, rows: np.ndarray, block: np.ndarray, nnz: int | None = None) -> UpdateBatch:
        """Dense rows, or CSR when that is smaller (sparse updates such as topic-count changes)."""
        if nnz is None:
            nnz = np.count_nonzero(block)
        if 8 * (rows.shape[0] + 1) + nnz * (4 + block.itemsize) < block.nbytes // 2:
            indptr, cols, vals = rowmath.to_csr(block)
            return UpdateBatch(rows, vals, indptr, cols)
        return UpdateBatch(rows, block)

    def _send_update(self, j: int, st: TableState, batch: UpdateBatch, owned: np.ndarray | None = None,
                     frame: Any = None) -> int:
        h = {"t": Msg.INC, "tb": st.index, "n": int(batch.rows.shape[0]), "dt": wire.DTYPE_NAMES[batch.values.dtype],
             "sp": batch.sparse}
        if batch.versioned:
            h["v"] = True
            h["nr"] = int(batch.rel_rows.shape[0])
        nbytes = self._send(j, h, *batch.arrays(), owned=owned, frame=frame)
        self._inc_times[j].append((self.seq[j], time.monotonic(), nbytes))
        self._inflight_bytes[j] += nbytes
        self.incs_sent[j] += 1
        self.counters["update_batches"] += 1
        self.counters["sparse_batches"] += batch.sparse
        self.counters["rows_sent"] += batch.rows.shape[0]
        return nbytes

    # -- managed communication -----------------------------------------------------------------

    def unacked(self) -> int:
        return max(s - a for s, a in zip(self.incs_sent, self.incs_acked))

    async def _budget_loop(self) -> None:
        """Between ticks, send the most important buffered rows whenever the bucket is empty."""
        await paced_sender(self.bucket, self.comm.idle_ms / 1000,
                           lambda: self.unacked() > self.comm.max_unacked, self._send_budgeted_guarded,
                           self.counters)

    def _send_budgeted_guarded(self) -> int:
        try:
            return self._send_budgeted()
        except Exception as e:  # report it to the workers, keep the loop alive
            log.exception("budgeted send failed")
            self._fail(BosenError(f"budgeted send failed: {e!r}"))
            return 0

    def _send_budgeted(self) -> int:
        k = self.comm.client_send_rows
        for i in range(len(self.tables)):
            st = self.tables[(self._rotation + i) % len(self.tables)]
            with st.lock:
                candidates = st.oplog.dirty_rows()
                if candidates.shape[0] == 0:
                    continue
                picked = np.sort(st.policy.choose(candidates, st.importance, k))
            self._rotation = (self._rotation + i + 1) % len(self.tables)
            sent = self._send_buffered(st, picked)
            self.counters["rows_sent_budgeted"] += picked.shape[0]
            self.counters["budgeted_sends"] += 1
            return sent
        return 0

    def request_rows(self, st: TableState, rows: np.ndarray, min_clock: int) -> None:
        for j, rj in self.partition.rows_by_server(rows):
            self._send(j, {"t": Msg.READ, "tb": st.index, "n": int(rj.shape[0]), "c": min_clock}, rj)

    # -- receiving -----------------------------------------------------------------------------

    def _dispatch(self, j: int, frames: list[Any]) -> None:
        self.counters["msgs_received"] += 1
        self.counters["bytes_received"] += sum(map(len, frames))
        try:
            h = wire.decode_header(frames[0])
            handler = self._handlers.get(h["t"])
            if handler is None:
                raise ProtocolError(f"{h['t'].name} is not a message a client accepts")
            wire.check_frames(h, len(frames) - 1)
            handler(j, h, frames[1:])
        except BosenError as e:
            log.error("bad message from server %d: %s", j, e)
            self._fail(e if isinstance(e, ServerError) else ProtocolError(f"server {j}: {e}"))
        except Exception as e:
            log.exception("error handling a message from server %d", j)
            self._fail(BosenError(f"error handling a message from server {j}: {e!r}"))

    def rows_of(self, h: dict[str, Any], frames: list[Any]) -> tuple[TableState, np.ndarray, np.ndarray, bool]:
        """A ROWS message's table, rows and values, checked (``frames``: the array frames)."""
        tb = h["tb"]
        if not 0 <= tb < len(self.tables):
            raise ProtocolError(f"ROWS for unknown table {tb}")
        st = self.tables[tb]
        n = h["n"]
        rows = wire.array(frames[0], wire.ROW_DTYPE, n, "ROWS rows")
        vals = wire.array(frames[1], wire.value_dtype(h["dt"]), n * st.cols, "ROWS values").reshape(n, st.cols)
        versioned = wire.is_versioned(h)
        if versioned != (st.vlog is not None):
            raise ProtocolError(f"ROWS for table {st.name!r}: versions {'present' if versioned else 'missing'}, "
                                f"but the server said the table is {'not ' if versioned else ''}versioned")
        return st, rows, vals, versioned

    def _on_rows(self, j: int, h: dict[str, Any], frames: list[Any]) -> None:
        st, rows, vals, versioned = self.rows_of(h, frames)
        n = h["n"]
        versions = wire.array(frames[2], wire.VERSION_DTYPE, n, "ROWS versions") if versioned else None
        with st.lock:
            if versioned and st.vlog.receive(rows, versions, st.oplog, st.importance) and not self._retired_scheduled:
                self._retired_scheduled = True  # one INC per server after this burst of ROWS
                self.loop.call_soon(self._guard, self._send_all_retired, ())
            apply_rows(st, j, h, rows, vals)
        self.counters["rows_received"] += n
        if h["rq"] < 0:
            self.counters["rows_pushed_to_us"] += n
        ps = h.get("ps")
        if isinstance(ps, int) and not isinstance(ps, bool) and not self.leaving:  # budgeted push: ack it
            self.counters["rows_pushed_early_to_us"] += n
            self._send(j, {"t": Msg.PUSH_ACK, "ps": ps})

    def _on_sclock(self, j: int, h: dict[str, Any], frames: list[Any]) -> None:
        c = h["c"]
        self.server_clock[j] = c
        for st in self.tables:
            with st.lock:
                st.inflight[j].settle(h["a"])
                st.cache.raise_clock(j, c)
        self._acked(j, h["a"])  # the server sends no ACK for an INC that carried the clock it answers

    def _on_ack(self, j: int, h: dict[str, Any], frames: list[Any]) -> None:
        self._acked(j, h["rq"])
        for st in self.tables:
            if st.read_my_writes and st.inflight[j].entries:
                with st.lock:
                    st.inflight[j].settle(h["rq"])

    def _acked(self, j: int, through: int) -> None:
        """Every update message to server ``j`` up to sequence number ``through`` is applied
        (acknowledgements are cumulative)."""
        if through > self.acked_seq[j]:
            self.acked_seq[j] = through
        times = self._inc_times[j]
        popped = False
        while times and times[0][0] <= through:
            seq, t, nbytes = times.popleft()
            popped = True
            self._inflight_bytes[j] -= nbytes
            self.counters["acks"] += 1
            self.incs_acked[j] += 1
            if seq == through:
                ms = (time.monotonic() - t) * 1000
                lat = self.ack_latency
                lat["last_ms"] = ms
                lat["max_ms"] = max(lat["max_ms"], ms)
                lat["sum_ms"] += ms
                lat["count"] += 1
        if popped and (self._due[j] or self._clock_due[j] is not None):
            self._pump(j)  # the window opened: the flush goes on

    def _on_error(self, j: int, h: dict[str, Any], frames: list[Any]) -> None:
        self.counters["server_errors"] += 1
        err = ServerError(f"server {j} ({self.addresses[j]}) rejected message {h['rq']}: {h['m']}")
        fut = self.pending.get((j, h["rq"]))
        if fut is not None and not fut.done():
            fut.set_exception(err)
        else:
            raise err

    def _on_reply(self, j: int, h: dict[str, Any], frames: list[Any]) -> None:
        fut = self.pending.get((j, h["rq"]))
        if fut is not None and not fut.done():
            if h["t"] == Msg.STATUS_REPLY:
                h["stats"] = wire.decode_status(frames[0])
            fut.set_result(h)
