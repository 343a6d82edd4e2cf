"""The blocking read path: a worker waits until every row it reads is fresh enough for its tick.

A read of cached, fresh rows never comes here (``Table.get_rows``' one compiled pass). A read that
must wait claims the rows nobody asked for yet and asks for them: on the worker thread's own read
sockets (``client/reader.py``: one round trip, no thread crossing) where the table allows it, else
through the communication thread. Rows that arrive by either way, or by a push, wake it
(``notify``). Failures and ``close()`` wake it too, and a read that waits past
``consistency.read_timeout_s`` raises ``ReadTimeout`` naming the row, its clock and its server.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np

from bosen.client.comm import CommThread
from bosen.client.lifecycle import Lifecycle
from bosen.client.reader import OWN_BUFFER_BYTES, Reader
from bosen.client.receive import receive_rows
from bosen.client.state import TableState
from bosen.client.table import TableWorker
from bosen.config import Config
from bosen.errors import ClientClosed, ProtocolError, ReadTimeout, ServerError
from bosen.wire import Msg

POLL_SLICE_S = 0.05  # a waiting read checks for close() and errors this often


class ReadPath:
    """Blocking reads for every worker thread of one client. ``fresh`` is the condition that
    arriving rows, failures and ``close()`` notify."""

    def __init__(self, config: Config, tables: Sequence[TableState], comm: CommThread, life: Lifecycle,
                 fresh: threading.Condition) -> None:
        self.config = config
        self.tables = tables
        self.comm = comm
        self.life = life
        self.fresh = fresh
        self._local = threading.local()  # the calling thread's Reader
        self._readers: list[Reader] = []
        self._lock = threading.Lock()
        self._closed = False
        self._traffic: dict[str, int] = {}  # counters of closed Readers

    def notify(self) -> None:
        with self.fresh:
            self.fresh.notify_all()

    def probe(self, st: TableState, rows: np.ndarray, seen: np.ndarray, age: np.ndarray) -> None:
        """Ask the rows' servers how many updates of other processes the values just read miss
        (``seen``: the counts they include; ``age``: seconds since their servers sent them;
        ``CommThread.probe``). Called with ``st.lock`` held: only hands the work over, never blocks
        the worker."""
        self.comm.submit(self.comm.probe, st, rows, seen, age)

    def wait_fresh(self, st: TableState, rows: np.ndarray, worker: TableWorker,
                   index: slice | np.ndarray | None = None, need: int | None = None) -> np.ndarray | None:
        """Block until every row's cached clock satisfies the SSP rule for ``worker``'s tick, or is at
        least ``need`` where given (``index``: ``rows`` as an index, if known). Where this thread's
        own read brought exactly ``rows`` (a run) and the cache took the values as they came, returns
        them: an array nothing else refers to, so the caller needs no copy of its own."""
        tick = worker.tick
        need = max(tick - st.staleness, 0) if need is None else need
        cache = st.cache
        if rows.shape[0] == 0 or cache.min_clock(rows, index) >= need:
            return None
        with st.lock:
            missing = cache.claim(rows, need)  # each once
            if type(index) is not slice and missing.shape[0] > 1 and not (missing[1:] > missing[:-1]).all():
                missing = np.sort(missing)
        start = time.monotonic()
        deadline = start + self.config.consistency.read_timeout_s
        worker.blocked_reads += 1
        got = None
        try:
            moves = self.comm.moves
            if missing.shape[0] and st.direct_reads and not self.comm.no_direct_reads and moves.begin_direct_read():
                try:
                    got = self._read_direct(st, missing, need, tick, deadline)
                finally:
                    moves.end_direct_read()
                    if moves.moving:  # the new map waits for reads on workers' sockets to end
                        self.comm.submit(moves.try_take)
                if got is not None and (type(index) is not slice or missing.shape[0] != rows.shape[0]):
                    got = None
            elif missing.shape[0]:
                self.comm.submit(self.comm.sender.request_rows, st, missing, need)
            while True:
                with self.fresh:
                    self.life.check()
                    if cache.min_clock(rows, index) >= need:
                        return got
                    got = None  # what arrives later is in the cache
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise self._timeout(st, rows, tick, need)
                    self.fresh.wait(min(left, POLL_SLICE_S * 4))
                with st.lock:  # rows asked of a server that was lost meanwhile are asked again
                    again = cache.claim(rows, need)
                if again.shape[0]:
                    self.comm.submit(self.comm.sender.request_rows, st, np.sort(again), need)
        finally:
            worker.blocked_s += time.monotonic() - start

    def _read_direct(self, st: TableState, rows: np.ndarray, need: int, tick: int,
                     deadline: float) -> np.ndarray | None:
        """READ ``rows`` (sorted, claimed as requested) on this thread's own sockets and write the
        answers into the cache. The in-flight logs are pinned meanwhile: the answer may say less is
        applied than pushes that overtake it. Returns the values of all ``rows`` if one message
        brought them and the cache took them unchanged, else None."""
        reader = self._reader()
        comm = self.comm
        with st.lock:
            parts = st.by_server(rows)
        with st.lock:
            pins = [(j, st.inflight[j].pin()) for j, _ in parts]
        left: dict[int, tuple[int, int]] = {}  # server -> (its READ's number, rows still to come)
        whole = None
        try:
            with reader.lock:  # close() waits for this read to notice it and stop
                timeout = max(deadline - time.monotonic(), 0.001)
                for j, rj in parts:
                    with st.lock:
                        ids = st.row_ids(rj)
                    left[j] = (reader.send_read(j, st.index, ids, need, timeout, self.life.check), rj.shape[0])
                while left:
                    self.life.check()
                    if any(comm.links[j].recovering for j in left):
                        return None  # its replacement gets the rows asked again (``wait_fresh``)
                    wait = min(POLL_SLICE_S, deadline - time.monotonic())
                    if wait <= 0:
                        raise self._timeout(st, rows, tick, need)
                    for j, h, frames in reader.poll(list(left), wait):
                        if j not in left or h.get("rq", -1) != left[j][0]:
                            continue  # the answer to an abandoned read: its rows were asked for again
                        if h["t"] == Msg.ERROR:
                            if isinstance(h.get("mv"), int):
                                return None  # its rows moved: asked again under the new map
                            raise ServerError(f"server {j} ({self.config.cluster.servers[j]}) rejected a read: "
                                              f"{h['m']}")
                        if h["t"] != Msg.ROWS:
                            raise ProtocolError(f"server {j}: {h['t'].name} on a read connection")
                        got = receive_rows(self.tables, j, h, frames)
                        if got.table is not st:
                            raise ProtocolError(f"server {j}: ROWS of table {got.table.name!r} for a read of "
                                                f"{st.name!r}")
                        n = got.rows.shape[0]
                        if got.exact and n == rows.shape[0] and got.values.nbytes >= OWN_BUFFER_BYTES:
                            whole = got.values
                        reader.counters["rows_received"] += n
                        seq, todo = left[j]
                        if todo - n > 0:
                            left[j] = (seq, todo - n)
                        else:
                            del left[j]
                reader.counters["direct_reads"] += 1
        finally:
            with st.lock:
                for j, floor in pins:
                    st.inflight[j].unpin(floor)
                for j in left:  # not answered: whoever reads them next asks again
                    st.cache.requested[rows[st.servers_of(rows) == j]] = False
        self.notify()  # other threads may wait for these rows
        return whole

    # -- the threads' read sockets --------------------------------------------------------------

    def _reader(self) -> Reader:
        reader = getattr(self._local, "reader", None)
        if reader is None:
            reader = Reader(self.comm.context, list(self.config.cluster.servers), self.comm.rank,
                            self.config.fingerprint(), self.comm.security)
            with self._lock:
                if self._closed:
                    raise ClientClosed("client is closed")
                self.life.check()
                self._readers.append(reader)
            self._local.reader = reader
        return reader

    def drop_reader(self) -> None:
        """The calling thread is done reading: close its read sockets."""
        reader = getattr(self._local, "reader", None)
        if reader is not None:
            self._local.reader = None
            with self._lock:
                if reader in self._readers:
                    self._readers.remove(reader)
                self._fold(reader)
            with reader.lock:
                reader.close()

    def close(self) -> None:
        """Close every thread's read sockets (before the context ends). A read in progress holds its
        reader's lock and notices close() within POLL_SLICE_S; each socket is closed only once no
        read uses it."""
        with self._lock:
            self._closed = True
            readers, self._readers = self._readers, []
            for r in readers:
                self._fold(r)
        for r in readers:
            with r.lock:
                r.close()

    def traffic(self) -> dict[str, int]:
        """The read connections' counters, closed ones included."""
        with self._lock:
            total = dict(self._traffic)
            for r in self._readers:
                for k, v in r.counters.items():
                    total[k] = total.get(k, 0) + v
        return total

    def _fold(self, reader: Reader) -> None:
        for k, v in reader.counters.items():
            self._traffic[k] = self._traffic.get(k, 0) + v

    def _timeout(self, st: TableState, rows: np.ndarray, tick: int, need: int) -> ReadTimeout:
        fresh = st.cache.fresh_clock(rows)
        k = int(np.argmin(fresh))
        with st.lock:
            r = int(st.row_ids(rows[k:k + 1])[0])
        servers = self.config.cluster.servers
        j = int(self.comm.partition.owner(np.array([r]))[0])
        have = int(fresh.min())
        return ReadTimeout(
            f"read of table {st.name!r} row {r} timed out after {self.config.consistency.read_timeout_s:g}s: "
            f"worker tick {tick} needs row clock >= {need} (staleness {st.staleness}), cached row clock "
            f"{'none (never received)' if have < 0 else have}; server {j} ({servers[j]}) "
            f"last reported clock {self.comm.links[j].server_clock}. A worker process may have stopped clocking "
            f"or a server may be down.")
