"""What one client process keeps for one table: its cache, update buffer and in-flight logs, under
one lock, shared by every worker thread's ``Table`` handle and the communication thread."""

from __future__ import annotations

import threading

import numpy as np

from bosen import priority, wire
from bosen.client.cache import RowCache
from bosen.client.oplog import InflightLog, UpdateBuffer
from bosen.client.versions import VersionLog
from bosen.config import CommConfig, TableConfig
from bosen.errors import ConfigError


class TableState:
    """Everything the process keeps for one table; ``lock`` guards cache, buffer and in-flight log."""

    def __init__(self, index: int, cfg: TableConfig, staleness: int, num_servers: int, comm: CommConfig,
                 probe_every: int = 0) -> None:
        """``probe_every``: metrics.freshness_every (each worker probes one read in that many; 0 = off)."""
        if not cfg.bounded:
            raise ConfigError(f"tables.{cfg.name}.rows: this client caches a table densely and needs its row "
                              "count; a sparse table without rows (64-bit ids) waits for the bounded client "
                              "cache (issue 29)")
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
        self.cache = RowCache(cfg.rows, cfg.cols, self.dtype, num_servers, counts=probe_every > 0)
        self.oplog = UpdateBuffer(cfg.rows, cfg.cols, self.dtype, stride=num_servers, staging=not comm.enabled,
                                  ops=probe_every > 0)
        self.inflight = [InflightLog() for _ in range(num_servers)]
        # managed communication: which rows to send first, and how often each row went out
        self.policy = priority.make(comm.priority, seed=index) if comm.enabled else None
        self.importance = np.zeros(cfg.rows) if self.policy and self.policy.uses_importance else None
        self.relative = comm.priority == "relative"
        self.send_count = np.zeros(cfg.rows, dtype=np.int32)
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
                self.vlog = VersionLog(self.rows)
                self.oplog.stop_staging()  # its flushes take every dirty row at once, with its version
            elif not versioned:
                self.vlog = None
