"""What one client process keeps for one table: its cache, update buffer and in-flight logs, under
one lock, shared by every worker thread's ``Table`` handle and the communication thread.

A small dense table's arrays are indexed by row. A large one's, a sparse one's, or one with
``cache_rows``, by slot (``client/slots.py``): memory grows with the rows this process touches, and
stops at ``cache_rows`` by evicting the least recently used rows nothing refers to. ``to_slots`` and
``row_ids`` translate at the edges: the table's API, and the wire."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from bosen import priority, rowmath, wire
from bosen.client.cache import RowCache
from bosen.client.oplog import InflightLog, UpdateBuffer
from bosen.client.slots import SlotMap
from bosen.client.versions import VersionLog
from bosen.config import CommConfig, TableConfig
from bosen.partition import Partition

# A dense table whose values take more than this in one process, in rows narrower than a page, is
# cached by slot (only the rows touched); otherwise by row (no translation at all). 64 MiB: a
# row-indexed table's arrays are about 2.5x its values, written whole or a page per scattered row
# touched, and a process rarely reads most of a table that large. Rows of a page or more (a PyTorch
# model's dense table) fault in only what is touched, and their bulk increments keep staging.
DIRECT_MAX_BYTES = 64 << 20
PAGE_BYTES = 4096
INITIAL_SLOTS = 64  # slots per server of a slotted table at first
EVICT_FRACTION = 8  # an eviction frees this fraction of a server's slots at once (amortized scans)
NO_LIMIT = 1 << 62  # an operation's limit on a server's rows where the bound does not apply


class TableState:
    """Everything the process keeps for one table; ``lock`` guards cache, buffer and in-flight log."""

    def __init__(self, index: int, cfg: TableConfig, staleness: int, partition: Partition | int, comm: CommConfig,
                 probe_every: int = 0) -> None:
        """``partition``: the job's partition map (or the number of servers, for the map a job starts
        with); ``probe_every``: metrics.freshness_every (each worker probes one read in that many; 0 = off)."""
        if isinstance(partition, int):
            partition = Partition(partition)
        self.partition = partition  # the map this process follows (replaced when partitions move)
        num_servers = partition.num_servers
        self.index = index
        self.cfg = cfg
        self.name = cfg.name
        self.rows = cfg.rows
        self.cols = cfg.cols
        self.dtype = np.dtype(cfg.dtype)
        self.staleness = staleness
        self.read_my_writes = cfg.shows_own_writes  # until the server says otherwise (set_capabilities)
        self.vlog: VersionLog | None = None  # versioned tables: versions held, retired updates, releases
        self.lock = threading.Lock()
        self.probe_every = probe_every
        row_bytes = cfg.cols * self.dtype.itemsize
        slotted = (cfg.storage == "sparse" or cfg.cache_rows is not None
                   or (cfg.rows * row_bytes > DIRECT_MAX_BYTES and row_bytes < PAGE_BYTES))
        # slots a server's rows may take before eviction (cache_rows split evenly; None: no limit)
        self.slot_limit = None if cfg.cache_rows is None else -(-cfg.cache_rows // num_servers)
        first = min(INITIAL_SLOTS, self.slot_limit or INITIAL_SLOTS, -(-cfg.rows // num_servers))
        self.slots = SlotMap(num_servers, first) if slotted else None
        self.evicted = 0  # rows evicted (counters)
        self.over_limit = 0  # times a server's rows outgrew cache_rows because none could be evicted
        # asks the communication thread to send every buffered update now (set by the client): rows
        # with updates are never evicted, so a bounded cache full of them sends them rather than wait
        self.send_early: Callable[[], None] | None = None
        # asks the communication thread to send these rows' (as the buffer keeps them) buffered
        # updates now, before the clock (``Table.send_rows``; set by the client)
        self.send_now: Callable[[np.ndarray], None] | None = None
        size = cfg.rows if self.slots is None else self.slots.capacity
        self.pins = np.zeros(size if self.slots is not None else 0, dtype=np.int32)  # views holding a slot
        self.cache = RowCache(size, cfg.cols, self.dtype, partition, counts=probe_every > 0, pushed=cfg.push)
        if self.slots is not None:
            self.cache.ids = self.slots.ids
        self.oplog = UpdateBuffer(size, cfg.cols, self.dtype, stride=num_servers,
                                  staging=not comm.enabled and self.slots is None, ops=probe_every > 0)
        self.inflight = [InflightLog() for _ in range(num_servers)]
        # managed communication: which rows to send first, and how often each row went out
        self.policy = priority.make(comm.priority, seed=index) if comm.enabled else None
        self.importance = np.zeros(size) if self.policy and self.policy.uses_importance else None
        self.relative = comm.priority == "relative"
        self.send_count = np.zeros(size, dtype=np.int32)
        # float16 / bfloat16 updates for float tables that ask (or whose managed job does)
        narrow = cfg.wire_dtype or (comm.wire_dtype if comm.enabled else None)
        if narrow in ("float16", "bfloat16") and self.dtype.kind == "f":
            self.wire_dtype = wire.VALUE_DTYPES[narrow]
        else:
            self.wire_dtype = self.dtype

    @property
    def direct_reads(self) -> bool:
        """Whether a worker's blocking read goes on its own sockets (client/reader.py): not where
        budgets count every byte on the communication thread, nor where rows carry versions."""
        return self.policy is None and self.vlog is None

    def set_capabilities(self, read_my_writes: bool, versioned: bool) -> None:
        """What the server allows for this table (from WELCOME), applied before any row arrives."""
        with self.lock:
            self.read_my_writes = read_my_writes
            if versioned and self.vlog is None:
                self.vlog = VersionLog(self.cache.clock.shape[0])
                self.oplog.stop_staging()  # its flushes take every dirty row at once, with its version
            elif not versioned:
                self.vlog = None

    # -- rows and slots (client/slots.py) ----------------------------------------------------------

    def to_slots(self, rows: np.ndarray, op: int | None = None) -> np.ndarray:
        """The slots of ``rows`` (checked ids), new rows given one, each touched by operation ``op``
        (``SlotMap.begin``: the rows stay until it ends), or by an operation of its own, for work done
        before ``lock`` is released; makes room as needed. Under ``lock``; slotted tables only."""
        slots = self.slots
        assert slots is not None
        if op is None:
            op = slots.begin()
            try:
                return self.to_slots(rows, op)
            finally:
                slots.end(op)
        out = np.empty(rows.shape[0], dtype=np.int64)
        limit = NO_LIMIT if self.slot_limit is None else self.slot_limit
        start = slots.translate(rows, op, 0, out, limit)
        while start < rows.shape[0]:
            limit = self._make_room(int(rows[start] % slots.servers), limit)
            start = slots.translate(rows, op, start, out, limit)
        return out

    def servers_of(self, rows: np.ndarray) -> np.ndarray:
        """The server of each of ``rows`` (slots: of the row each holds) under the current map. A
        slot's class is its row's id mod S (client/slots.py): its server under a modular map only."""
        part = self.partition
        if self.slots is None or part.modular:
            return part.owner(rows)
        return part.owner_of[self.slots.ids[rows] % part.partitions]

    def by_server(self, rows: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """``Partition.rows_by_server`` for rows as this table keeps them (rows or slots)."""
        part = self.partition
        if self.slots is None or part.modular:
            return part.rows_by_server(rows)
        return part.rows_by_server(rows, self.servers_of(rows))

    def row_ids(self, slots: np.ndarray) -> np.ndarray:
        """The row ids of ``slots`` (rows, as they are, for a table indexed by row)."""
        return slots if self.slots is None else self.slots.ids[slots]

    def lookup(self, rows: np.ndarray) -> np.ndarray:
        """The slots of ``rows`` (ids from a server), -1 where this process holds none."""
        return rows if self.slots is None else self.slots.lookup(rows)

    def pin(self, slots: np.ndarray, by: int) -> None:
        """A view holds ``slots`` (``by`` = 1) or lets them go (-1); held slots are never evicted. The
        slots are unique, as a view's rows are."""
        with self.lock:
            self.pins[slots] += by

    def _make_room(self, server: int, limit: int) -> int:
        """``server`` holds ``limit`` rows, or has no slot left: at ``cache_rows``, evict its least
        recently used rows nothing refers to, down below the bound; if none can go, send the buffered
        updates early and let this operation go past the bound. Grow (double every per-row array)
        when no slot is left. Returns the limit for the rest of the operation."""
        slots = self.slots
        assert slots is not None
        bound = self.slot_limit
        # at the bound: evict (the room may also have run out below it: then only grow)
        if bound is not None and limit <= bound and self.vlog is None and slots.held(server) >= bound:
            count = slots.held(server) - bound + max(1, bound // EVICT_FRACTION)
            victims = slots.victims(server, count, self._referenced())
            if victims.shape[0]:
                self.cache.clear(victims)
                if self.importance is not None:
                    self.importance[victims] = 0
                self.send_count[victims] = 0
                if self.oplog.ops.shape[0]:
                    self.oplog.ops[victims] = 0
                slots.evict(victims)
                self.evicted += int(victims.shape[0])
                return limit
            self.over_limit += 1
            if self.send_early is not None:
                self.send_early()
            limit = NO_LIMIT
        elif bound is not None and self.vlog is not None:
            limit = NO_LIMIT  # versions held per row: never evicted (the bound is not kept)
        if slots.full(server):
            per = slots.per * 2
            if bound is not None and slots.per < bound:
                per = min(per, bound)
            per = min(per, -(-self.rows // slots.servers))  # no more slots than rows
            slots.grow(per)
            n = slots.capacity
            self.cache.grow(n)
            self.cache.ids = slots.ids
            self.oplog.grow(n)
            self.pins = rowmath.grown(self.pins, n, 0)
            self.send_count = rowmath.grown(self.send_count, n, 0)
            if self.importance is not None:
                self.importance = rowmath.grown(self.importance, n, 0)
            if self.vlog is not None:
                self.vlog.grow(n)
        return limit

    def _referenced(self) -> np.ndarray:
        """Slots something refers to (not to evict): a buffered update, a read waiting, a view, an
        update in flight that read-my-writes would put back on a value arriving later."""
        keep = self.oplog.dirty | self.cache.requested | (self.pins > 0)
        for log in self.inflight:
            for _, rows, _ in log.entries:
                keep[rows] = True
        return keep
