"""``Worker``: one worker thread's identity: its tick, its table handles and its counters.

The process's main thread has one (``client.table``, ``client.clock``); ``with client.worker() as w``
gives another thread its own. A worker reaches the rest of its client only through ``Shared``: the
process clock, the tables, the lifecycle, the read path and what happens after a tick (checkpoint
boundaries).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from bosen.client.clocks import WorkerClocks
from bosen.client.lifecycle import Lifecycle
from bosen.client.state import TableState
from bosen.client.table import FreshReads, Table
from bosen.phases import Phases

# rows_read: rows handed to the worker by reads; rows_read_early: of those, rows whose value came in a
# budgeted push since their server's last clock (managed communication's mid-clock values);
# read_staleness_sum: Σ over rows read of (worker tick - the clock the row's value is valid for)
WORKER_COUNTERS = ("updates_buffered", "inc_bytes", "blocked_reads", "blocked_s", "rows_read", "rows_read_early",
                   "read_staleness_sum")


@dataclass(frozen=True)
class Shared:
    """What every worker of one client process shares."""

    clocks: WorkerClocks
    tables: Mapping[str, TableState]
    source: str  # where the config came from, for errors
    life: Lifecycle
    reads: FreshReads
    after_tick: Callable[[int], None]  # called with the worker's new tick (checkpoint boundaries wait)
    profile: bool = False  # metrics.profile: workers time their phases (bosen.phases)

    def table_state(self, name: str) -> TableState:
        st = self.tables.get(name)
        if st is None:
            raise KeyError(f"no table {name!r} in {self.source}; tables: {', '.join(self.tables)}")
        return st


class Worker:
    """A worker thread's tick, table handles and counters; only its own thread writes them
    (``Client.stats`` adds them up)."""

    def __init__(self, shared: Shared) -> None:
        self._shared = shared
        self.id, self.tick = shared.clocks.join()
        self._tables: dict[str, Table] = {}
        self.updates_buffered = 0  # rows incremented
        self.inc_bytes = 0  # bytes of increments made
        self.blocked_reads = 0
        self.blocked_s = 0.0
        self.rows_read = 0
        self.rows_read_early = 0
        self.read_staleness_sum = 0
        self.phases = Phases() if shared.profile else None  # read, buffer, clock, app (metrics.profile)
        self._app: tuple[float, float] | None = None  # when the open "app" phase began (after a clock)
        self.reads_to_probe = 1  # the first read is probed, then one in metrics.freshness_every
        # gaps between probes are drawn (mean freshness_every), so that a worker reading its tables
        # in a fixed rotation does not probe only one of them
        self.probe_gaps = random.Random(self.id)

    def counters(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in WORKER_COUNTERS}

    def table(self, name: str) -> Table:
        t = self._tables.get(name)
        if t is None:
            sh = self._shared
            t = self._tables[name] = Table(sh.table_state(name), self, sh.life, sh.reads)
        return t

    def clock(self) -> None:
        """End of this worker's tick: tick c becomes c + 1. At a checkpoint boundary it returns once
        the process's CLOCK went out (``checkpoints.WorkerCheckpoints.after_tick``)."""
        ph = self.phases
        t = None
        if ph is not None:
            if self._app is not None:
                ph.stop("app", self._app)
            t = ph.start()
        self._shared.life.check()
        self.tick = self._shared.clocks.tick(self.id)
        self._shared.after_tick(self.tick)
        if t is not None:
            ph.stop("clock", t)  # type: ignore[union-attr]
            if self._app is None:  # the first tick's start-up (connections, numba's first calls) left out
                ph.reset()  # type: ignore[union-attr]
            # from here to the next clock() the thread is in the app (kernel, delta) but for the
            # reads and increments timed inside: "app" is the tick's time outside the client
            self._app = ph.start()  # type: ignore[union-attr]

    def leave(self) -> None:
        """This worker stops holding the process clock back."""
        self._shared.clocks.leave(self.id)
