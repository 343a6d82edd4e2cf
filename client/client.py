"""``Client``: one per worker process; joins the job and owns everything the process shares.

It puts the parts together: the tables' shared state (``state.TableState``), the communication
thread (``comm.CommThread``, sending through ``send.Sender``), the blocking read path
(``reads.ReadPath``), the worker's checkpoint part (``checkpoints.WorkerCheckpoints``), the worker
threads (``worker.Worker``) and their process clock (``clocks.WorkerClocks``), all under one
``lifecycle.Lifecycle``. What is left here is the public API, joining and leaving, and counters.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from bosen import config as config_mod
from bosen import faults
from bosen.client.checkpoints import WorkerCheckpoints
from bosen.client.clocks import WorkerClocks
from bosen.client.comm import START_TIMEOUT_S, CommThread
from bosen.client.lifecycle import Lifecycle, Phase
from bosen.client.reads import ReadPath
from bosen.client.state import TableState
from bosen.client.table import Table
from bosen.client.worker import WORKER_COUNTERS, Shared, Worker
from bosen.config import Config
from bosen.errors import BosenError
from bosen.metrics import mbps, send_histogram
from bosen.partition import Partition
from bosen.phases import merge

JOIN_TIMEOUT_S = 30.0
LEAVE_TIMEOUT_S = 30.0


def _rejoin_clock(value: str | None, name: str = "BOSEN_REJOIN",
                  what: str = "a replacement worker restarts from") -> int | None:
    """``$BOSEN_REJOIN``: this process replaces a lost worker of its rank, restarting at that clock
    (``bosen launch`` sets it, with ``$BOSEN_RESUME`` the checkpoint there; docs/recovery.md).
    ``$BOSEN_JOIN``: this process joins a running job as a new rank at that clock (``bosen scale``)."""
    if not value:
        return None
    try:
        clock = int(value)
    except ValueError:
        clock = -1
    if clock < 0:
        raise BosenError(f"{name}={value!r}: the clock {what}, an int >= 0")
    return clock


class Client:
    """A worker process's connection to the parameter servers.

    Create it with ``Client.connect(config)``. The calling thread is the process's main worker
    (``client.table``, ``client.clock``); more worker threads come from ``client.worker()``.
    """

    def __init__(self, config: Config, rank: int | None = None, main_worker: bool = True,
                 join_timeout: float = JOIN_TIMEOUT_S) -> None:
        config.require_tables()
        self.config = config
        self._fault = faults.from_env()  # None unless a recovery test injects one (bosen/faults.py)
        partition = Partition(len(config.cluster.servers), config.cluster.num_partitions)
        self._tables = [TableState(i, t, config.staleness_of(t), partition, config.comm,
                                   config.metrics.freshness_every) for i, t in enumerate(config.tables)]
        self._life = Lifecycle()
        # workers in this process, and the counters of those that left
        self._workers: tuple[Worker, ...] = ()  # replaced, never changed in place: read without the lock
        self._workers_lock = threading.Lock()
        self._departed: dict[str, float] = dict.fromkeys(WORKER_COUNTERS, 0)
        self._departed_phases: dict[str, dict[str, Any]] = {}  # metrics.profile: workers that left
        self._fresh = fresh = threading.Condition()  # rows arrived, a clock went out, failed or closing
        self._comm = CommThread(config, self._tables, self._life, self._notify, self._inc_bytes, partition)
        for st in self._tables:  # a bounded cache full of unsent updates sends them early (client/slots.py)
            st.send_now = functools.partial(self._comm.submit, self._comm.sender.send_rows, st)
            if st.slot_limit is not None:
                st.send_early = functools.partial(self._comm.submit, self._comm.sender.flush, None)
        self._reads = ReadPath(config, self._tables, self._comm, self._life, fresh)
        self._checkpoints = WorkerCheckpoints(config, self._comm.links, self._life, fresh,
                                              self._fault.skips_part if self._fault is not None else None)
        self._clocks = WorkerClocks(self._on_process_clock)
        self._shared = Shared(self._clocks, {st.name: st for st in self._tables}, str(config.source), self._life,
                              self._reads, self._checkpoints.after_tick, config.metrics.profile)
        self._started = time.time()
        # reports' "time" counts from the job's start when launched (so workers' times compare)
        self._t0 = float(os.environ.get("BOSEN_T0", self._started))
        self.reports: list[dict[str, Any]] = []
        self._report_file = None
        self._comm.start(min(join_timeout, START_TIMEOUT_S))
        want = rank if rank is not None else int(os.environ.get("BOSEN_RANK", -1))
        try:
            rejoin = _rejoin_clock(os.environ.get("BOSEN_REJOIN"))
            joining = _rejoin_clock(os.environ.get("BOSEN_JOIN"), "BOSEN_JOIN", "a worker joining a running job "
                                    "starts at")
            self.rank, start = self._comm.call(self._comm.join(want, config.fingerprint(), join_timeout, rejoin,
                                                               joining), join_timeout + 5)
            # 0, the clock of the checkpoint the servers resumed from, or (replacing a lost worker) the
            # clock of the checkpoint this rank's state comes from
            self._clocks.clock = start
            resume = os.environ.get("BOSEN_RESUME")
            if resume:
                self._checkpoints.load(Path(resume), self.rank, start)
        except BaseException:
            self._comm.stop()
            self._checkpoints.close()
            self._life.to(Phase.CLOSED)
            raise
        self._life.to(Phase.RUNNING)
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
        if self._comm.final_clock is not None:
            raise BosenError(f"clock(): this process ended its clocks at {self._comm.final_clock} (end_clocks); "
                             "close() leaves the job")
        if self._fault is not None:
            self._fault.before_clock(self.rank, self.tick + 1, self._life.check)
        self._main_worker().clock()

    def end_clocks(self) -> None:
        """This process clocks no more, but stays in the job until ``close()`` (a scale-in's leaver, at
        its boundary after giving its tasks away, waits there until its updates are in every server's
        checkpoint part): the servers stop counting its clock once its clock so far reaches them, so
        the other workers are not held back meanwhile, and it still resends to a lost server's
        replacement. Its updates so far are sent first; it makes none after (no clock would count them)."""
        self._life.check()
        self._comm.call(self._comm.end_clocks(self._clocks.clock, LEAVE_TIMEOUT_S), LEAVE_TIMEOUT_S + 5)

    @property
    def tick(self) -> int:
        return self._main_worker().tick

    def checkpoint_state(self, provider: Callable[[], Mapping[str, np.ndarray]]) -> None:
        """What this process saves at each checkpoint: ``provider()`` is called when the process clock
        reaches a boundary (every worker of the process waits there), and its arrays (copied at once,
        written in the background) are the worker's part of the checkpoint; ``restored_state()`` gives
        them back to the process that resumes from it. Without a provider the part holds no arrays."""
        self._checkpoints.provider = provider

    def restored_state(self) -> dict[str, np.ndarray] | None:
        """The arrays this rank saved in the checkpoint the job resumed from (``$BOSEN_RESUME``), or
        None in a job that did not resume. The worker's tick is then that checkpoint's clock."""
        return self._checkpoints.restored

    @contextlib.contextmanager
    def worker(self) -> Iterator[Worker]:
        """An extra worker for the calling thread; it starts at the process clock and leaves on exit."""
        self._life.check()
        w = self._add_worker()
        try:
            yield w
        finally:
            w.leave()
            with self._workers_lock:
                self._workers = tuple(x for x in self._workers if x is not w)
                for k, v in w.counters().items():
                    self._departed[k] += v
                if w.phases is not None:
                    self._departed_phases = merge([self._departed_phases, w.phases.stats()])
            self._reads.drop_reader()

    def stats(self) -> dict[str, Any]:
        """Counters: traffic, rows, blocked time and how stale cached rows are."""
        s: dict[str, Any] = dict(self._comm.counters)
        uptime = time.time() - self._started
        s["direct_reads"] = 0
        for k, v in self._reads.traffic().items():  # workers' read connections, closed ones included
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
            if st.slots is not None:  # cached by slot (client/slots.py): rows held, room, evictions
                tables[st.name].update(slots=st.slots.capacity, rows_held=len(st.slots), rows_evicted=st.evicted,
                                       cache_over_limit=st.over_limit)
            if st.vlog is not None:  # versioned: updates retired by a newer version, versions released
                tables[st.name].update(rows_retired=st.vlog.retired_rows, versions_released=st.vlog.released)
        s["tables"] = tables
        if self.config.metrics.profile:  # per thread: the workers' (summed) and the communication thread's
            with self._workers_lock:
                mine = [w.phases.stats() for w in self._workers if w.phases is not None]
            s["phases"] = {"worker": merge(mine + [self._departed_phases]), "comm": self._comm.phases.stats()
                           if self._comm.phases is not None else {}}
        return s

    def report(self, **fields: Any) -> dict[str, Any]:
        """Record metrics for the current tick (written to $BOSEN_RUN_DIR/workers/RANK.jsonl)."""
        c = self._comm.counters
        rec = {"rank": self.rank, "clock": self.tick if self._main else self._clocks.clock,
               "time": round(time.time() - self._t0, 6), "bytes_sent": c["bytes_sent"],
               "bytes_received": c["bytes_received"], "rows_sent": c["rows_sent"],
               "rows_sent_budgeted": c["rows_sent_budgeted"], **self._read_totals(), **fields}
        if "freshness_probed_rows" in c:  # metrics.freshness_every on: rows probed, updates they missed
            rec.update(freshness_probed_rows=c["freshness_probed_rows"], missing_updates_sum=c["missing_updates_sum"],
                       content_age_sum=c["content_age_sum"])
        self.reports.append(rec)
        if self._report_file is not None:
            self._report_file.write(json.dumps(rec, default=float) + "\n")
        return rec

    def server_status(self, timeout: float = 10.0) -> list[dict[str, Any]]:
        self._life.check()
        return self._comm.call(self._comm.status(timeout), timeout + 5)

    def close(self) -> None:
        """Send every buffered update, leave the job, stop the communication thread. A client that
        failed cannot leave cleanly: it stops, and raises its failure."""
        life = self._life
        if life.phase in (Phase.CLOSING, Phase.LEAVING, Phase.CLOSED):
            return
        try:
            if not life.failed:
                life.to(Phase.CLOSING)
                self._comm.call(self._comm.leave(LEAVE_TIMEOUT_S), LEAVE_TIMEOUT_S + 5)
        finally:
            self._shut_down()
        life.raise_failure()
        self._checkpoints.raise_failure()

    def abort(self) -> None:
        """Stop communicating without leaving the job (after an unrecoverable error)."""
        life = self._life
        if life.phase in (Phase.CLOSING, Phase.LEAVING, Phase.CLOSED):
            return
        if not life.failed:
            life.to(Phase.CLOSING)
        self._shut_down()

    def _shut_down(self) -> None:
        self._notify()  # threads waiting for rows see the client closed now, not at their next wake-up
        self._reads.close()
        self._comm.stop()
        self._life.to(Phase.CLOSED)
        self._checkpoints.close()  # what was saved so far reaches the disk
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

    # -- internals -----------------------------------------------------------------------------

    def _main_worker(self) -> Worker:
        if self._main is None:
            raise BosenError("this client was created with main_worker=False: use client.worker()")
        return self._main

    def _state(self, name: str) -> TableState:
        return self._shared.table_state(name)

    def _add_worker(self) -> Worker:
        w = Worker(self._shared)
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

    def _read_totals(self) -> dict[str, int | float]:
        """Rows read so far, how many held mid-clock values and their summed staleness, and the reads
        that blocked and their time: who holds the job back (all workers; Prometheus's
        ``bosen_job_blocked_seconds``)."""
        w = self._worker_totals()
        totals: dict[str, int | float] = {k: int(w[k]) for k in ("rows_read", "rows_read_early", "read_staleness_sum",
                                                                 "blocked_reads")}
        totals["blocked_s"] = round(float(w["blocked_s"]), 6)
        return totals

    def _worker_totals(self) -> dict[str, float]:
        with self._workers_lock:
            totals = dict(self._departed)
            for w in self._workers:
                for k, v in w.counters().items():
                    totals[k] += v
        return totals

    def _notify(self) -> None:
        with self._fresh:
            self._fresh.notify_all()

    def _on_process_clock(self, clock: int) -> None:
        """The process clock rose (called by the worker whose tick raised it, outside the clocks'
        lock): this rank's checkpoint part at a boundary, then the flush and CLOCK."""
        self._checkpoints.at_process_clock(clock, self.rank, self._comm.sender.choose_checkpoint)
        self._comm.sender.clock_reached(clock)
