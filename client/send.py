"""Sending updates: the end-of-tick flush, budgeted sends between ticks, and row requests.

Everything here runs on the communication thread (``Sender`` is the communication thread's, built by
``CommThread``), except ``clock_reached``, which a worker thread calls when its tick raised the
process clock: the hand-over of a flush to the communication thread.

- **The flush** (``flush``): every buffered update, then ``CLOCK(c)`` to every server. Never delayed
  by the bucket, but charged to it; paced per server by acknowledgements (``FlushWindow``). A
  server gets its CLOCK(c) once every row that was buffered for it when the flush began has gone
  out; the clock rides on the last update message to it where there is one.
- **Budgeted sends** (``budget_loop``): between ticks, the most important buffered rows whenever the
  leaky bucket allows (managed communication, docs/design.md, "Managed communication").
- Updates leave the buffer through ``client/encode.py``; versioned tables' retired updates and
  releases go at once.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from bosen import phases
from bosen.client import encode
from bosen.client.lifecycle import Lifecycle
from bosen.client.link import ServerLink
from bosen.client.loopthread import LoopThread
from bosen.client.moves import MapFollower
from bosen.client.state import TableState
from bosen.client.window import FlushWindow
from bosen.config import CommConfig
from bosen.errors import BosenError
from bosen.partition import Partition
from bosen.phases import Phases
from bosen.ratelimit import LeakyBucket, paced_sender
from bosen.wire import Msg, UpdateBatch, wire_ids

log = logging.getLogger("bosen.client")
# Bytes of increments after which a tick waits for the communication thread to take up the pending
# flush (``Sender.clock_reached``). 4 MiB: four update messages; ingest-1MiB +7.5% against no
# hand-over (20 rounds), 2 and 8 MiB gained less (docs/design.md, "Hand-over at the tick").
HANDOVER_BYTES = 4 << 20
POLL_SLICE_S = 0.05


class Sender:
    """The communication thread's sending side, for one client's ``links`` and ``tables``.
    ``made_bytes()`` counts the bytes of increments this process's workers made (the hand-over's
    measure); ``notify()`` wakes workers that wait for a clock to go out; ``fail(err)`` fails the
    client."""

    def __init__(self, tables: Sequence[TableState], links: Sequence[ServerLink], partition: Partition,
                 comm: CommConfig, bucket: LeakyBucket | None, counters: dict[str, Any], thread: LoopThread,
                 life: Lifecycle, notify: Callable[[], None], fail: Callable[[BosenError], None],
                 made_bytes: Callable[[], int]) -> None:
        self.tables = tables
        self.links = links
        self.partition = partition
        self.moves: MapFollower | None = None  # set by the communication thread (client/moves.py)
        self.comm = comm
        self.bucket = bucket
        self.counters = counters
        self.phases: Phases | None = None  # metrics.profile: the communication thread's (set by CommThread)
        self.thread = thread
        self.life = life
        self.notify = notify
        self.fail = fail
        self.made_bytes = made_bytes
        self._rotation = 0
        self._retired_scheduled = False
        self._versioned_held = False  # a versioned send was kept back during a partition move
        self._flush_waiters: list[asyncio.Future] = []
        # the hand-over at the tick (worker threads and the communication thread)
        self._handover = threading.Lock()
        self._flush_to = 0
        self._flush_pending = False
        self._flush_taken = threading.Condition(self._handover)  # notified when a flush is taken up
        self._taken_bytes = 0  # increments made (all workers) when the last flush was taken up
        # the tables whose rows read each tick go to the servers with the CLOCK: every table under
        # comm.push_to: readers (budgeted pushes' readers), else those whose subscriptions lapse
        readers = comm.enabled and comm.push_to == "readers"
        self.read_tables = [st for st in tables if readers or st.cfg.lapse]

    # -- the hand-over at the tick -------------------------------------------------------------

    def clock_reached(self, clock: int) -> None:
        """The process clock rose to ``clock`` (called by the worker whose tick raised it): flush and
        send CLOCK. Ticks that pass before the communication thread gets to it share one flush and
        one CLOCK (the latest): same guarantee, fewer messages. Two such calls may come in either
        order, so the later clock wins.

        A worker that increments back to back keeps the GIL and its table's lock busy, and the
        communication thread, woken at each tick, finds one of them taken each time it gets to run:
        it can starve until the worker stops, and nothing goes out meanwhile. So once
        HANDOVER_BYTES of increments were made since it last took up a flush, the worker waits
        until it has taken up the pending one (not until anything is sent)."""
        with self._handover:
            self._flush_to = max(self._flush_to, clock)
            if self._flush_pending:
                if self.made_bytes() - self._taken_bytes >= HANDOVER_BYTES:
                    while self._flush_pending and self.thread.running and not self.life.failed:
                        self._flush_taken.wait(POLL_SLICE_S)
                return
            self._flush_pending = True
        self.thread.submit(self._take_flush)

    def _take_flush(self) -> None:  # on the communication thread
        with self._handover:
            clock, self._flush_pending = self._flush_to, False
            self._taken_bytes = self.made_bytes()
            self._flush_taken.notify_all()
        self.counters["flushes"] += 1
        self.flush(clock)

    # -- the end-of-tick flush -----------------------------------------------------------------

    def choose_checkpoint(self, clock: int) -> None:
        """Ask every server to save at boundary ``clock``: rank 0 decides under a time rule
        (``checkpoint.every_s`` / ``mttf_s``), and its CLOCK(clock) carries the word (``ck``)."""
        for link in self.links:
            link.window.checkpoint_clocks.add(clock)

    def flush(self, clock: int | None) -> None:
        """Send every buffered update; then, if ``clock`` is given, CLOCK(clock) to every server.
        The rest is sent as acknowledgements arrive (updates made meanwhile keep coalescing in the
        buffer; memory for messages stays bounded)."""
        phases.timed(self.phases, "send", self._flush, clock)  # metrics.profile: "send"

    def _flush(self, clock: int | None) -> None:
        if self.life.failed:
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
                for j, rj in st.by_server(rows):
                    self.links[j].window.owe(st.index, rj)
        reads = self._take_reads() if clock is not None and self.read_tables else None
        for j, link in enumerate(self.links):
            if clock is not None:
                link.window.owe_clock(clock)
                if reads is not None:
                    link.window.owe_reads(reads[j])
            self.pump(link)

    def _take_reads(self) -> list[dict[int, tuple[np.ndarray, int]]]:
        """Per server, the rows of each table this process read since its last clock (the union over
        its workers) as that server's local indices and its local row count; the marks start again."""
        # one per connection: a server joining the job is connected before its map (it owns no row yet)
        out: list[dict[int, tuple[np.ndarray, int]]] = [{} for _ in range(max(self.partition.num_servers,
                                                                               len(self.links)))]
        for st in self.read_tables:
            with st.lock:
                rows = st.row_ids(st.cache.take_reads())
            if st.slots is not None:
                rows = np.sort(rows)
            for j, rj in self.partition.rows_by_server(rows):
                out[j][st.index] = (self.partition.local(rj, j), self.partition.local_count(j, st.rows))
        return out

    def pump(self, link: ServerLink) -> None:
        """One pass of ``link``'s flush window: what the flush owes its server while the window has
        room; then its clock, if nothing is left."""
        phases.timed(self.phases, "send", self._pump, link)  # inside a flush, or on an acknowledgement

    def _pump(self, link: ServerLink) -> None:
        if link.recovering:
            return  # goes on once the replacement has what the lost server had (client/recovery.py)
        moves = self.moves
        if moves is not None and moves.should_pause(link):
            return  # partitions are moving: nothing more until the new map (client/moves.py)
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
        if moves is not None and moves.moving:
            moves.should_pause(link)  # its PAUSED right after the clock that pauses it
        if window.clock_sent != sent:
            self.notify()  # workers waiting at a checkpoint boundary for this clock to go out
        if self._flush_waiters and not self.flushing():
            self.wake_flush_waiters()

    def flushing(self) -> bool:
        """Whether an end-of-tick flush is still waiting for acknowledgements to go on."""
        return any(link.window.busy for link in self.links)

    async def until_flushed(self, timeout: float) -> None:
        """Wait until every flush so far is out (acknowledged as far as the windows need)."""
        self.life.raise_failure()
        if not self.flushing():
            return
        assert self.thread.loop is not None
        fut = self.thread.loop.create_future()
        self._flush_waiters.append(fut)
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            inflight = [link.inflight_bytes for link in self.links]
            raise BosenError(f"buffered updates not acknowledged within {timeout:g}s (is every server "
                             f"running? updates in flight: {inflight} bytes)") from None
        self.life.raise_failure()

    def wake_flush_waiters(self) -> None:
        for fut in self._flush_waiters:
            if not fut.done():
                fut.set_result(None)
        self._flush_waiters.clear()

    # -- a partial flush: given rows now, before the clock ---------------------------------------

    def send_rows(self, st: TableState, rows: np.ndarray) -> None:
        """Send the buffered updates of ``rows`` (sorted, as the buffer keeps them) now (``Table.send_rows``,
        handed over by a worker before its clock, so this runs before that clock's flush: the CLOCK
        still follows every update of its tick, on the same connection). At once, not through a
        flush window, and charged to the bucket like every send, as budgeted sends are. Rows of a
        server being recovered, or while partitions move, stay in the buffer for the flush."""
        if self.life.failed or (self.moves is not None and self.moves.moving):
            return
        if st.vlog is not None:
            self._send_versioned(st, rows)
            return
        before = self.counters["bytes_sent"]
        for j, rj in st.by_server(rows):
            if not self.links[j].recovering:
                self._send_rows_to(self.links[j], st, rj, None)
        self.counters["rows_sent_early"] += int(rows.shape[0])
        self.counters["bytes_sent_early"] += self.counters["bytes_sent"] - before

    # -- taking updates out of the buffer ------------------------------------------------------

    def _send_rows_to(self, link: ServerLink, st: TableState, rows: np.ndarray,
                      window: FlushWindow | None) -> np.ndarray:
        """Take ``rows`` (sorted, all of ``link``'s server) out of the update buffer and send them;
        through ``window`` (a flush pass: stop while it is full), else at once. Returns the rows
        not sent."""
        out: ServerLink | FlushWindow = link if window is None else window
        k = 0
        while k < rows.shape[0]:
            if window is not None and not window.has_room():
                break
            # the number of the message the chunk goes in (a window's message may take several)
            seq = link.seq + 1 if window is None else window.ready()
            with st.lock:
                update, k = encode.take_chunk(st, rows, k, link.index, seq)
                if update is None:
                    continue
                batch, owned, frame = update
                nbytes = out.send(encode.inc_header(st, batch), *batch.arrays(), owned=owned, frame=frame)
                if frame is not None:
                    assert owned is not None  # a frame carries an owned array
                    st.oplog.carried(owned, link.index, seq)  # before this thread lets go of it
            if window is None:
                link.sent_update(nbytes)  # a window counts its messages in flight as they go
            self._sent_update(batch)
        return rows[k:]

    def _sent_update(self, batch: UpdateBatch) -> None:
        c = self.counters
        c["update_batches"] += 1
        c["sparse_batches"] += batch.sparse
        c["rows_sent"] += batch.rows.shape[0]

    def _send_versioned(self, st: TableState, rows: np.ndarray) -> int:
        """Versioned table: retired updates, ``rows`` from the buffer and releases, sent at once; while
        partitions move, kept (in the buffer and the version log) for ``send_held`` once the map is
        taken: sent now, they could reach a server after it handed the rows' versions over."""
        if self.moves is not None and self.moves.moving:
            self._versioned_held = True
            return 0
        with st.lock:
            batches = encode.take_versioned(st, rows, self.partition)
        total = 0
        for j, batch in batches:
            link = self.links[j]
            nbytes = link.send(encode.inc_header(st, batch), *batch.arrays())
            link.sent_update(nbytes)
            self._sent_update(batch)
            total += nbytes
        return total

    def send_held(self) -> None:
        """After a partition move (before the windows go on, so each CLOCK owed follows them): what
        ``_send_versioned`` kept back, by the new map: each versioned table's buffered rows, retired
        updates and releases."""
        if not self._versioned_held:
            return
        self._versioned_held = False
        for st in self.tables:
            if st.vlog is not None:
                with st.lock:
                    rows = st.oplog.dirty_rows()
                    pending = st.vlog.pending
                if rows.shape[0] or pending:
                    self._send_versioned(st, rows)

    def send_retired(self, st: TableState) -> int:
        """Send what version changes queued (retired updates, releases) now; returns bytes sent.
        Never delayed by the bucket (it frees server memory), but charged to it like every send."""
        with st.lock:
            pending = st.vlog is not None and st.vlog.pending
        return self._send_versioned(st, np.empty(0, dtype=np.int64)) if pending else 0

    def retired_arrived(self) -> None:
        """A ROWS message retired updates of a versioned table: one INC per server after this burst
        of ROWS carries them."""
        if not self._retired_scheduled:
            self._retired_scheduled = True
            assert self.thread.loop is not None
            self.thread.loop.call_soon(self.thread.guard, self._send_all_retired, ())

    def _send_all_retired(self) -> None:
        self._retired_scheduled = False
        for st in self.tables:
            if st.vlog is not None:
                self.send_retired(st)

    # -- managed communication -----------------------------------------------------------------

    def unacked(self) -> int:
        return max(link.unacked for link in self.links)

    async def budget_loop(self) -> None:
        """Between ticks, send the most important buffered rows whenever the bucket is empty."""
        assert self.bucket is not None
        await paced_sender(self.bucket, self.comm.idle_ms / 1000,
                           lambda: self.unacked() > self.comm.max_unacked, self._send_budgeted_guarded,
                           self.counters)

    def _send_budgeted_guarded(self) -> int:
        if self.life.failed:
            return 0
        ph = self.phases
        t = ph.start() if ph is not None else None
        try:
            return self._send_budgeted()
        except Exception as e:  # report it to the workers, keep the loop alive
            log.exception("budgeted send failed")
            err = BosenError(f"budgeted send failed: {e!r}")
            err.__cause__ = e
            self.fail(err)
            return 0
        finally:
            if t is not None:
                ph.stop("send", t)  # type: ignore[union-attr]

    def _send_budgeted(self) -> int:
        k = self.comm.client_send_rows
        if any(link.recovering for link in self.links) or (self.moves is not None and self.moves.moving):
            return 0  # the flush sends everything once the lost server is replaced, or the map taken
        for i in range(len(self.tables)):
            st = self.tables[(self._rotation + i) % len(self.tables)]
            policy = st.policy
            assert policy is not None, "budgeted sends run only with managed communication"
            with st.lock:
                candidates = st.oplog.dirty_rows()
                if candidates.shape[0] == 0:
                    continue
                picked = np.sort(policy.choose(candidates, st.importance, k))
            self._rotation = (self._rotation + i + 1) % len(self.tables)
            if st.vlog is not None:
                sent = self._send_versioned(st, picked)
            else:
                before = self.counters["bytes_sent"]
                for j, rj in st.by_server(picked):
                    self._send_rows_to(self.links[j], st, rj, None)
                sent = self.counters["bytes_sent"] - before
            self.counters["rows_sent_budgeted"] += picked.shape[0]
            self.counters["budgeted_sends"] += 1
            return sent
        return 0

    def request_rows(self, st: TableState, rows: np.ndarray, min_clock: int) -> None:
        """READ ``rows`` (as the cache keeps them: rows or slots, asked for, so not evicted) on the
        main connection (a read that cannot use its own sockets)."""
        if self.moves is not None and self.moves.moving:  # asked again under the new map
            with st.lock:
                st.cache.requested[rows] = False
            return
        for j, rj in st.by_server(rows):
            if self.links[j].recovering:  # asked again once it is back (ReadPath.wait_fresh)
                with st.lock:
                    st.cache.requested[rj] = False
                continue
            with st.lock:
                ids = st.row_ids(rj)
            self.links[j].send({"t": Msg.READ, "tb": st.index, "n": int(rj.shape[0]), "c": min_clock},
                               wire_ids(ids))
