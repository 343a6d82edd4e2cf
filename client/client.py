"""``Client``: one per worker process; joins the job, owns the cache and the communication thread."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from bosen import checkpoint
from bosen import config as config_mod
from bosen.client.comm import START_TIMEOUT_S, CommThread
from bosen.client.reader import OWN_BUFFER_BYTES, Reader
from bosen.client.receive import receive_rows
from bosen.client.table import Table, TableState
from bosen.client.workers import WorkerClocks
from bosen.config import Config
from bosen.errors import BosenError, ClientClosed, ProtocolError, ReadTimeout, ServerError
from bosen.metrics import mbps, send_histogram
from bosen.wire import Msg

JOIN_TIMEOUT_S = 30.0
LEAVE_TIMEOUT_S = 30.0
# Bytes of increments after which a tick waits for the communication thread to take up the pending
# flush (Client._on_process_clock). 4 MiB: four update messages; ingest-1MiB +7.5% against no
# hand-over (20 rounds), 2 and 8 MiB gained less (docs/design.md, "Hand-over at the tick").
HANDOVER_BYTES = 4 << 20
POLL_SLICE_S = 0.05  # a direct read checks for close() and errors this often while it waits


# rows_read: rows handed to the worker by reads; rows_read_early: of those, rows whose value came in a
# budgeted push since their server's last clock (managed communication's mid-clock values);
# read_staleness_sum: Σ over rows read of (worker tick - the clock the row's value is valid for)
WORKER_COUNTERS = ("updates_buffered", "inc_bytes", "blocked_reads", "blocked_s", "rows_read", "rows_read_early",
                   "read_staleness_sum")


class Worker:
    """One worker thread's identity: its tick, its table handles (``with client.worker() as w``) and
    its counters, which only its own thread writes (``Client.stats`` adds them up)."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self.id, self.tick = client._clocks.join()
        self._tables: dict[str, Table] = {}
        self.updates_buffered = 0  # rows incremented
        self.inc_bytes = 0  # bytes of increments made
        self.blocked_reads = 0
        self.blocked_s = 0.0
        self.rows_read = 0
        self.rows_read_early = 0
        self.read_staleness_sum = 0

    def counters(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in WORKER_COUNTERS}

    def table(self, name: str) -> Table:
        t = self._tables.get(name)
        if t is None:
            t = self._tables[name] = Table(self._client, self._client._state(name), self)
        return t

    def clock(self) -> None:
        """End of this worker's tick: tick c becomes c + 1. At a checkpoint boundary it returns once
        the process's CLOCK went out (see ``Client._cross_boundary``)."""
        self._client._check()
        self.tick = self._client._clocks.tick(self.id)
        if self._client._every and self.tick % self._client._every == 0:
            self._client._cross_boundary(self.tick)


class Client:
    """A worker process's connection to the parameter servers.

    Create it with ``Client.connect(config)``. The calling thread is the process's main worker
    (``client.table``, ``client.clock``); more worker threads come from ``client.worker()``.
    """

    def __init__(self, config: Config, rank: int | None = None, main_worker: bool = True,
                 join_timeout: float = JOIN_TIMEOUT_S) -> None:
        config.require_tables()
        self.config = config
        servers = len(config.cluster.servers)
        self._tables = [TableState(i, t, config.staleness_of(t), servers, config.comm)
                        for i, t in enumerate(config.tables)]
        self._by_name = {st.name: st for st in self._tables}
        self._fresh = threading.Condition()
        self._closed = False
        self._comm = CommThread(config, self._tables, self._notify)
        self._flush_lock = threading.Lock()
        self._flush_to = 0
        self._flush_pending = False
        self._flush_taken = threading.Condition(self._flush_lock)  # notified when a flush is taken up
        self._taken_bytes = 0  # increments made (all workers) when the last flush was taken up
        self._clocks = WorkerClocks(self._on_process_clock)
        # checkpoints (bosen/checkpoint.py): boundaries every ``_every`` clocks; what the app saves
        ck = config.checkpoint
        self._every = ck.every_clocks if ck is not None else 0
        self._state_provider: Callable[[], Mapping[str, np.ndarray]] | None = None
        self._parts = checkpoint.PartWriter(checkpoint.root(config), checkpoint.model_fingerprint(config)) \
            if ck is not None else None
        self._restored: dict[str, np.ndarray] | None = None
        self._last_choice = time.monotonic()  # rank 0: when it last chose a checkpoint (time rules)
        # workers in this process, and the counters of those that left
        self._workers: tuple[Worker, ...] = ()  # replaced, never changed in place: read without the lock
        self._workers_lock = threading.Lock()
        self._departed: dict[str, float] = dict.fromkeys(WORKER_COUNTERS, 0)
        # direct reads (client/reader.py): one Reader per thread that blocked on a read
        self._local = threading.local()
        self._readers: list[Reader] = []
        self._readers_lock = threading.Lock()
        self._direct_traffic: dict[str, int] = {}  # counters of closed Readers
        self._started = time.time()
        # reports' "time" counts from the job's start when launched (so workers' times compare)
        self._t0 = float(os.environ.get("BOSEN_T0", self._started))
        self.reports: list[dict[str, Any]] = []
        self._report_file = None
        self._comm.start(min(join_timeout, START_TIMEOUT_S))
        want = rank if rank is not None else int(os.environ.get("BOSEN_RANK", -1))
        try:
            self.rank, start = self._comm.call(self._comm.join(want, config.fingerprint(), join_timeout),
                                               join_timeout + 5)
            self._clocks.clock = start  # 0, or the clock of the checkpoint the servers resumed from
            resume = os.environ.get("BOSEN_RESUME")
            if resume:
                self._restored = self._load_state(Path(resume), start)
        except BaseException:
            self._comm.stop()
            if self._parts is not None:
                self._parts.close()
            raise
        self.num_workers: int = config.cluster.workers
        self._main = self._add_worker() if main_worker else None
        run_dir = os.environ.get("BOSEN_RUN_DIR")
        if run_dir:
            path = Path(run_dir) / "workers" / f"{self.rank}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            self._report_file = path.open("a", buffering=1)

    @classmethod
    def connect(cls, config: str | os.PathLike | Mapping[str, Any] | Config, *, rank: int | None = None,
                main_worker: bool = True, overrides: Any = (), join_timeout: float = JOIN_TIMEOUT_S) -> Client:
        """Join the job described by ``config`` (a YAML path, a mapping or a Config).

        ``rank`` (or the BOSEN_RANK environment variable) fixes this process's worker rank;
        otherwise server 0 assigns the lowest free one.
        """
        return cls(config_mod.load(config, overrides), rank=rank, main_worker=main_worker,
                   join_timeout=join_timeout)

    # -- public API ----------------------------------------------------------------------------

    def table(self, name: str) -> Table:
        return self._main_worker().table(name)

    def clock(self) -> None:
        self._main_worker().clock()

    @property
    def tick(self) -> int:
        return self._main_worker().tick

    def checkpoint_state(self, provider: Callable[[], Mapping[str, np.ndarray]]) -> None:
        """What this process saves at each checkpoint: ``provider()`` is called when the process clock
        reaches a boundary (every worker of the process waits there), and its arrays (copied at once,
        written in the background) are the worker's part of the checkpoint; ``restored_state()`` gives
        them back to the process that resumes from it. Without a provider the part holds no arrays."""
        self._state_provider = provider

    def restored_state(self) -> dict[str, np.ndarray] | None:
        """The arrays this rank saved in the checkpoint the job resumed from (``$BOSEN_RESUME``), or
        None in a job that did not resume. The worker's tick is then that checkpoint's clock."""
        return self._restored

    @contextlib.contextmanager
    def worker(self) -> Iterator[Worker]:
        """An extra worker for the calling thread; it starts at the process clock and leaves on exit."""
        self._check()
        w = self._add_worker()
        try:
            yield w
        finally:
            self._clocks.leave(w.id)
            with self._workers_lock:
                self._workers = tuple(x for x in self._workers if x is not w)
                for k, v in w.counters().items():
                    self._departed[k] += v
            self._drop_reader()

    def stats(self) -> dict[str, Any]:
        """Counters: traffic, rows, blocked time and how stale cached rows are."""
        s: dict[str, Any] = dict(self._comm.counters)
        uptime = time.time() - self._started
        s["direct_reads"] = 0
        with self._readers_lock:  # workers' read connections, closed ones included
            for c in [self._direct_traffic, *(r.counters for r in self._readers)]:
                for k, v in c.items():
                    s[k] += v
        w = self._worker_totals()
        s.update(rank=self.rank, clock=self._clocks.clock, blocked_s=round(w["blocked_s"], 6),
                 blocked_reads=w["blocked_reads"], updates_buffered=w["updates_buffered"],
                 rows_read=w["rows_read"], rows_read_early=w["rows_read_early"],
                 read_staleness_sum=w["read_staleness_sum"],
                 server_clocks=[link.server_clock for link in self._comm.links], uptime_s=round(uptime, 3))
        lat = self._comm.ack_latency
        s.update(ack_latency_ms_last=round(lat["last_ms"], 3), ack_latency_ms_max=round(lat["max_ms"], 3),
                 ack_latency_ms_mean=round(lat["sum_ms"] / lat["count"], 3) if lat["count"] else 0.0)
        comm = self.config.comm
        if comm.enabled:
            s.update(budget_mbps=comm.client_bandwidth_mbps, egress_mbps=round(mbps(s["bytes_sent"], uptime), 3),
                     priority=comm.priority, unacked=self._comm.unacked())
        tables = {}
        for st in self._tables:
            with st.lock:
                cached = st.cache.cached_clocks()
                hist = send_histogram(st.send_count)
                staged = st.oplog.staged_bytes
                pool = st.oplog.pool_stats()
            stale = self._clocks.clock - cached if cached.size else np.zeros(1, dtype=np.int64)
            tables[st.name] = {"cached_rows": int(cached.size), "staleness_mean": float(stale.mean()),
                               "staleness_max": int(stale.max()), "send_count_hist": hist,
                               "staged_bytes": staged, **pool}
            if st.vlog is not None:  # versioned: updates retired by a newer version, versions released
                tables[st.name].update(rows_retired=st.vlog.retired_rows, versions_released=st.vlog.released)
        s["tables"] = tables
        return s

    def report(self, **fields: Any) -> dict[str, Any]:
        """Record metrics for the current tick (written to $BOSEN_RUN_DIR/workers/RANK.jsonl)."""
        c = self._comm.counters
        rec = {"rank": self.rank, "clock": self.tick if self._main else self._clocks.clock,
               "time": round(time.time() - self._t0, 6), "bytes_sent": c["bytes_sent"],
               "bytes_received": c["bytes_received"], "rows_sent": c["rows_sent"],
               "rows_sent_budgeted": c["rows_sent_budgeted"], **self._read_totals(), **fields}
        self.reports.append(rec)
        if self._report_file is not None:
            self._report_file.write(json.dumps(rec, default=float) + "\n")
        return rec

    def server_status(self, timeout: float = 10.0) -> list[dict[str, Any]]:
        self._check()
        return self._comm.call(self._comm.status(timeout), timeout + 5)

    def close(self) -> None:
        """Send every buffered update, leave the job, stop the communication thread. A client that
        failed cannot leave cleanly: it stops, and raises its failure."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._comm.error is None:
                self._comm.call(self._comm.leave(LEAVE_TIMEOUT_S), LEAVE_TIMEOUT_S + 5)
        finally:
            self._shut_down()
        if self._comm.error is not None:
            raise _again(self._comm.error)
        if self._parts is not None and self._parts.error is not None:
            raise BosenError(f"cannot write this worker's checkpoint: {self._parts.error}")

    def abort(self) -> None:
        """Stop communicating without leaving the job (after an unrecoverable error)."""
        if not self._closed:
            self._closed = True
            self._shut_down()

    def _shut_down(self) -> None:
        self._notify()  # threads waiting for rows see the client closed now, not at their next wake-up
        self._close_readers()
        self._comm.stop()
        if self._parts is not None:
            self._parts.close()  # what was saved so far reaches the disk
        if self._report_file is not None:
            self._report_file.close()
            # final counters (traffic vs budget, send-count histograms) for the run's metrics
            stats_path = Path(self._report_file.name).with_suffix(".stats.json")
            stats_path.write_text(json.dumps(self.stats(), default=float))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:  # the error in flight is the one to see; leave as cleanly as this client still can
            try:
                self.close()
            except BosenError:
                pass

    # -- internals used by Table and Worker ----------------------------------------------------

    def _main_worker(self) -> Worker:
        if self._main is None:
            raise BosenError("this client was created with main_worker=False: use client.worker()")
        return self._main

    def _state(self, name: str) -> TableState:
        st = self._by_name.get(name)
        if st is None:
            raise KeyError(f"no table {name!r} in {self.config.source}; tables: {', '.join(self._by_name)}")
        return st

    def _add_worker(self) -> Worker:
        w = Worker(self)
        with self._workers_lock:
            self._workers = (*self._workers, w)
        return w

    def _inc_bytes(self) -> int:
        """Bytes of increments made by this process's workers, those that left included (on every
        tick: no lock, no dict)."""
        n = int(self._departed["inc_bytes"])
        for w in self._workers:
            n += w.inc_bytes
        return n

    def _read_totals(self) -> dict[str, int]:
        """Rows read so far, how many held mid-clock values and their summed staleness (all workers)."""
        w = self._worker_totals()
        return {k: int(w[k]) for k in ("rows_read", "rows_read_early", "read_staleness_sum")}

    def _worker_totals(self) -> dict[str, float]:
        with self._workers_lock:
            totals = dict(self._departed)
            for w in self._workers:
                for k, v in w.counters().items():
                    totals[k] += v
        return totals

    def _check(self) -> None:
        """Raise if this client is closed or has failed. A failure is kept: every worker thread raises
        it (a copy, caused by the original) at its next call."""
        if self._closed:
            raise ClientClosed("client is closed")
        err = self._comm.error
        if err is not None:
            raise _again(err)

    def _notify(self) -> None:
        with self._fresh:
            self._fresh.notify_all()

    def _on_process_clock(self, clock: int) -> None:
        """The process clock rose: flush and send CLOCK. Ticks that pass before the communication
        thread gets to it share one flush and one CLOCK (the latest): same guarantee, fewer messages.
        Called by the worker whose tick raised it, outside the clocks' lock; two such calls may come
        in either order, so the later clock wins.

        A worker that increments back to back keeps the GIL and its table's lock busy, and the
        communication thread, woken at each tick, finds one of them taken each time it gets to run:
        it can starve until the worker stops, and nothing goes out meanwhile. So once HANDOVER_BYTES
        of increments were made since it last took up a flush, the worker waits until it has taken
        up the pending one (not until anything is sent)."""
        if self._every and clock % self._every == 0 and self._parts is not None:
            self._save_state(clock)
            if self.rank == 0 and self._chooses(clock):
                self._comm.choose_checkpoint(clock)
        with self._flush_lock:
            self._flush_to = max(self._flush_to, clock)
            if self._flush_pending:
                if self._inc_bytes() - self._taken_bytes >= HANDOVER_BYTES:
                    while self._flush_pending and self._comm.running and self._comm.error is None:
                        self._flush_taken.wait(POLL_SLICE_S)
                return
            self._flush_pending = True
        self._comm.submit(self._flush_clock)

    def _cross_boundary(self, clock: int) -> None:
        """A worker entered boundary tick ``clock``: wait until every server got this process's
        CLOCK(clock), so that no update of a later tick joins the updates before it (the servers'
        checkpoint at ``clock`` holds exactly the ticks below; server/checkpoints.py). With several
        workers, those that come first wait for the last."""
        links = self._comm.links
        with self._fresh:
            while min(link.window.clock_sent for link in links) < clock:
                self._check()
                self._fresh.wait(POLL_SLICE_S)

    def _chooses(self, clock: int) -> bool:
        """Rank 0, at boundary ``clock``: whether the servers save there. Every boundary, or under a
        time rule the first one after its interval since the last save (Young's interval from the
        servers' measured save time). The other workers save their part at every boundary: the
        checkpoints the servers skip stay incomplete and are deleted."""
        ck = self.config.checkpoint
        assert ck is not None
        if ck.every_s is None and ck.mttf_s is None:
            return True
        processes = len(self.config.cluster.servers) + self.num_workers
        interval = ck.interval_s(max(link.save_s for link in self._comm.links), processes)
        now = time.monotonic()
        if now - self._last_choice < interval:
            return False
        self._last_choice = now
        return True

    def _save_state(self, clock: int) -> None:
        """The process clock reached boundary ``clock``: the app's state goes to the writer (copies)."""
        assert self._parts is not None
        state = self._state_provider() if self._state_provider is not None else {}
        arrays = {k: np.array(v, copy=True) for k, v in state.items()}
        self._parts.submit(clock, "worker", self.rank, arrays, {"tick": clock})

    def _load_state(self, path: Path, clock: int) -> dict[str, np.ndarray]:
        """This rank's part of checkpoint ``path`` (``$BOSEN_RESUME``), which must be at ``clock``."""
        try:
            part = checkpoint.read_part(path / checkpoint.part_name("worker", self.rank),
                                        checkpoint.model_fingerprint(self.config))
        except checkpoint.CheckpointError as e:
            raise BosenError(f"BOSEN_RESUME: {e}") from None
        if part.meta["clock"] != clock:
            raise BosenError(f"BOSEN_RESUME: {part.path} is at clock {part.meta['clock']}, the servers at {clock}")
        return part.load()

    def _flush_clock(self) -> None:  # on the communication thread
        with self._flush_lock:
            clock, self._flush_pending = self._flush_to, False
            self._taken_bytes = self._inc_bytes()
            self._flush_taken.notify_all()
        self._comm.counters["flushes"] += 1
        self._comm.flush(clock)

    def _wait_fresh(self, st: TableState, rows: np.ndarray, worker: Worker,
                    index: slice | np.ndarray | None = None) -> np.ndarray | None:
        """Block until every row's cached clock satisfies the SSP rule for ``worker``'s tick
        (``index``: ``rows`` as an index, if known). Where this thread's own read brought exactly
        ``rows`` (a run) and the cache took the values as they came, returns them: an array nothing
        else refers to, so the caller needs no copy of its own."""
        tick = worker.tick
        need = max(tick - st.staleness, 0)
        cache = st.cache
        if rows.shape[0] == 0 or cache.min_clock(rows, index) >= need:
            return None
        with st.lock:
            missing = cache.claim(rows)  # each once
            if type(index) is not slice and missing.shape[0] > 1 and not (missing[1:] > missing[:-1]).all():
                missing = np.sort(missing)
        start = time.monotonic()
        deadline = start + self.config.consistency.read_timeout_s
        worker.blocked_reads += 1
        got = None
        try:
            if missing.shape[0] and st.direct_reads and not self._comm.lost_a_server:
                got = self._read_direct(st, missing, need, tick, deadline)
                if got is not None and (type(index) is not slice or missing.shape[0] != rows.shape[0]):
                    got = None
            elif missing.shape[0]:
                self._comm.submit(self._comm.request_rows, st, missing, need)
            while True:
                with self._fresh:
                    self._check()
                    if cache.min_clock(rows, index) >= need:
                        return got
                    got = None  # what arrives later is in the cache
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise self._timeout(st, rows, tick, need)
                    self._fresh.wait(min(left, POLL_SLICE_S * 4))
                with st.lock:  # rows asked of a server that was lost meanwhile are asked again
                    again = cache.claim(rows)
                if again.shape[0]:
                    self._comm.submit(self._comm.request_rows, st, np.sort(again), need)
        finally:
            worker.blocked_s += time.monotonic() - start

    def _read_direct(self, st: TableState, rows: np.ndarray, need: int, tick: int,
                     deadline: float) -> np.ndarray | None:
        """READ ``rows`` (sorted, claimed as requested) on this thread's own sockets and write the
        answers into the cache (client/reader.py). The in-flight logs are pinned meanwhile: the
        answer may say less is applied than pushes that overtake it. Returns the values of all
        ``rows`` if one message brought them and the cache took them unchanged, else None."""
        reader = self._reader()
        parts = self._comm.partition.rows_by_server(rows)
        with st.lock:
            pins = [(j, st.inflight[j].pin()) for j, _ in parts]
        left: dict[int, tuple[int, int]] = {}  # server -> (its READ's number, rows still to come)
        whole = None
        try:
            with reader.lock:  # close() waits for this read to notice it and stop
                timeout = max(deadline - time.monotonic(), 0.001)
                for j, rj in parts:
                    left[j] = (reader.send_read(j, st.index, rj, need, timeout, self._check), rj.shape[0])
                while left:
                    self._check()
                    if any(self._comm.links[j].recovering for j in left):
                        return None  # its replacement gets the rows asked again (``_wait_fresh``)
                    wait = min(POLL_SLICE_S, deadline - time.monotonic())
                    if wait <= 0:
                        raise self._timeout(st, rows, tick, need)
                    for j, h, frames in reader.poll(list(left), wait):
                        if j not in left or h.get("rq", -1) != left[j][0]:
                            continue  # the answer to an abandoned read: its rows were asked for again
                        if h["t"] == Msg.ERROR:
                            raise ServerError(f"server {j} ({self.config.cluster.servers[j]}) rejected a read: "
                                              f"{h['m']}")
                        if h["t"] != Msg.ROWS:
                            raise ProtocolError(f"server {j}: {h['t'].name} on a read connection")
                        got = receive_rows(self._tables, j, h, frames)
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
                    st.cache.requested[rows[self._comm.partition.owner(rows) == j]] = False
        self._notify()  # other threads may wait for these rows
        return whole

    def _reader(self) -> Reader:
        reader = getattr(self._local, "reader", None)
        if reader is None:
            reader = Reader(self._comm.context, list(self.config.cluster.servers), self.rank,
                            self.config.fingerprint())
            with self._readers_lock:
                if self._closed:
                    raise ClientClosed("client is closed")
                self._readers.append(reader)
            self._local.reader = reader
        return reader

    def _drop_reader(self) -> None:
        """The calling thread is done reading: close its read sockets."""
        reader = getattr(self._local, "reader", None)
        if reader is not None:
            self._local.reader = None
            with self._readers_lock:
                if reader in self._readers:
                    self._readers.remove(reader)
                self._fold(reader)
            with reader.lock:
                reader.close()

    def _close_readers(self) -> None:
        """Close every thread's read sockets (before the context ends). A read in progress holds its
        reader's lock and notices close() within POLL_SLICE_S; each socket is closed only once no
        read uses it."""
        with self._readers_lock:
            readers, self._readers = self._readers, []
            for r in readers:
                self._fold(r)
        for r in readers:
            with r.lock:
                r.close()

    def _fold(self, reader: Reader) -> None:
        for k, v in reader.counters.items():
            self._direct_traffic[k] = self._direct_traffic.get(k, 0) + v

    def _timeout(self, st: TableState, rows: np.ndarray, tick: int, need: int) -> ReadTimeout:
        fresh = st.cache.fresh_clock(rows)
        r = int(rows[np.argmin(fresh)])
        j = r % len(self.config.cluster.servers)
        have = int(fresh.min())
        return ReadTimeout(
            f"read of table {st.name!r} row {r} timed out after {self.config.consistency.read_timeout_s:g}s: "
            f"worker tick {tick} needs row clock >= {need} (staleness {st.staleness}), cached row clock "
            f"{'none (never received)' if have < 0 else have}; server {j} ({self.config.cluster.servers[j]}) "
            f"last reported clock {self._comm.links[j].server_clock}. A worker process may have stopped clocking "
            f"or a server may be down.")


def _again(err: BosenError) -> BosenError:
    """A fresh copy of a kept failure to raise in one more thread (an exception object raised in
    several threads at once would share, and garble, one traceback), caused by the original."""
    try:
        again = type(err)(*err.args)
    except Exception:
        again = BosenError(str(err))
    again.__cause__ = err
    return again
