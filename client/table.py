"""Tables as workers see them: a handle bound to one worker over state shared by the process.

A ``Table`` knows three things besides its table's ``TableState``: the worker it belongs to (its
tick and counters, ``TableWorker``), the client's ``Lifecycle`` (may it go on?) and the read path
that blocks until rows are fresh enough (``FreshReads``, ``client/reads.py``). It reaches nothing
else of the client.
"""

from __future__ import annotations

import random
import time
import weakref
from typing import Any, Protocol

import numpy as np

from bosen import phases, priority, rowmath
from bosen.client.lifecycle import Lifecycle, Phase
from bosen.client.prefault import prefault
from bosen.client.state import TableState
from bosen.client.view import RowView
from bosen.phases import Phases


class TableWorker(Protocol):
    """The worker a handle belongs to: its tick, and counters only its own thread writes."""

    tick: int
    updates_buffered: int
    inc_bytes: int
    blocked_reads: int
    blocked_s: float
    rows_read: int
    rows_read_early: int
    read_staleness_sum: int
    reads_to_probe: int  # reads until the next freshness probe (metrics.freshness_every)
    probe_gaps: random.Random  # draws the gap to the next probe
    phases: Phases | None  # metrics.profile: this worker thread's phases ("read", "buffer", "clock")


class FreshReads(Protocol):
    """The client's blocking read path (``reads.ReadPath``)."""

    def wait_fresh(self, st: TableState, rows: np.ndarray, worker: TableWorker,
                   index: slice | np.ndarray | None = None, need: int | None = None) -> np.ndarray | None: ...

    def probe(self, st: TableState, rows: np.ndarray, seen: np.ndarray, age: np.ndarray) -> None: ...


_RUNNING = Phase.RUNNING
_FAST_INDEX = (int, np.int64, np.int32)  # row types the cache-hit path takes without further checks


class Table:
    """A worker's handle on a shared table (``client.table(name)`` or ``worker.table(name)``).

    Reads follow the SSP rule for this worker's tick; increments are buffered and, for tables with
    read-my-writes, visible to this process's reads at once.
    """

    def __init__(self, state: TableState, worker: TableWorker, life: Lifecycle, reads: FreshReads) -> None:
        self._life = life
        self._reads = reads
        self._st = state
        self._worker = worker
        self._values = state.cache.values
        self._clock = state.cache.clock
        self._server_clock = state.cache.server_clock
        self._early = state.cache.early
        self._read_now = state.cache.read_now
        self._probe_every = state.probe_every
        self._partitions = state.cache.server_clock.shape[0]  # a row's clock class (client/cache.py)
        # indexed by row (the arrays above never change), else by slot (state.to_slots; the arrays
        # grow, so they are fetched from the state each time)
        self._direct = state.slots is None
        self._pushed = state.cfg.push  # whether servers push this table's rows (``get_rows``'s ``ahead``)
        self.name = state.name
        self.rows = state.rows
        self.cols = state.cols
        self.dtype = state.dtype
        self.staleness = state.staleness

    def __repr__(self) -> str:
        return f"<Table {self.name!r} {self.rows}x{self.cols} {self.dtype.name} staleness={self.staleness}>"

    @property
    def read_my_writes(self) -> bool:
        """Whether this process's reads show its own increments (the server decides, per table)."""
        return self._st.read_my_writes

    @property
    def versioned(self) -> bool:
        """Whether rows carry versions (stored procedures such as adarevision); increments are then
        tagged with the version of the cached row they were computed from."""
        return self._st.vlog is not None

    @property
    def update(self) -> str:
        """The table's stored procedure (``update:`` in the YAML). Anything but ``add`` takes raw
        gradients for the built-ins (sgd, adagrad, adarevision): the server takes the step."""
        return self._st.cfg.update

    def prefault(self) -> tuple[int, float]:
        """Fault in this process's buffers of the table now (client/prefault.py): for large tables read
        and written at scattered rows, whose first touches would otherwise land mid-run. Returns
        (bytes, seconds)."""
        return prefault(self._st)

    # -- reads ---------------------------------------------------------------------------------

    def get_row(self, row: int) -> np.ndarray:
        """A copy of one row, at least as fresh as the SSP rule requires (blocks until it is)."""
        if self._life.phase is not _RUNNING:
            self._life.check()
        need = self._worker.tick - self.staleness
        if need < 0:
            need = 0
        if type(row) in _FAST_INDEX and 0 <= row < self.rows and self._direct:
            c = self._clock[row]  # the row's own clock, else the last server clock if it is cached
            sc = self._server_clock[row % self._partitions]
            if c >= need or (c >= 0 and sc >= need):
                w = self._worker
                w.rows_read += 1
                w.read_staleness_sum += w.tick - (c if c > sc else sc)
                if self._early[row]:
                    w.rows_read_early += 1
                with self._st.lock:
                    self._read_now[row] = True
                    if self._probe_every and self._probe_due():
                        self._probe(np.array([row], dtype=np.int64))
                    return self._values[row].copy()
        return self.get_rows(np.array([self._row(row)], dtype=np.int64))[0]

    def get_rows_clocked(self, rows: Any) -> tuple[np.ndarray, np.ndarray]:
        """``get_rows``, and the clock each value is valid for (a lower bound): for a read served
        from the cache, the clocks of the values copied, taken under the same lock; else the bound
        the read waited for (tick - staleness). What a copy kept outside the client (the PyTorch
        device cache) is reused by."""
        need = max(self._worker.tick - self.staleness, 0)  # a read now returns values at least this fresh
        got: list[np.ndarray] = []
        values = phases.timed(self._worker.phases, "read", self._get_rows, rows, got)
        clocks = got[0] if got else np.full(values.shape[0], need, dtype=np.int64)
        return values, np.maximum(clocks, need)

    def get(self, row: int, col: int) -> Any:
        if not 0 <= col < self.cols:
            raise IndexError(f"table {self.name!r}: column {col} out of range [0, {self.cols})")
        return self.get_row(row)[col]

    def get_rows(self, rows: Any, ahead: int = 0) -> np.ndarray:
        """Copies of many rows as a 2-D array (one request per server for those not fresh).
        ``ahead``: a read of rows for a step ``ahead`` ticks later. On a table without pushes
        (``push: false``) the rows are read as fresh as that tick needs, but never newer than this
        tick itself (at staleness 0 that would wait for this worker's own clock), so the later read
        finds them fresh rather than reading them again one clock short. On a table whose servers
        push, the current bound: the pushes of the coming clocks bring the rest, and waiting for
        them here would hold this step back."""
        # metrics.profile: the worker's "read" phase (waits for fresh rows included)
        return phases.timed(self._worker.phases, "read", self._get_rows, rows, None, ahead)

    def _get_rows(self, rows: Any, clocks: list[np.ndarray] | None = None, ahead: int = 0) -> np.ndarray:
        if self._direct:
            return self._read(rows, clocks=clocks, ahead=ahead)
        st = self._st
        slots = st.slots
        assert slots is not None
        ids, _ = self._rows_index(rows)
        with st.lock:
            op = slots.begin()
            try:
                held = st.to_slots(ids, op)
            except BaseException:
                slots.end(op)
                raise
        try:  # the rows stay (not evicted) until the read is done
            return self._read(held, ids=False, clocks=clocks, ahead=ahead)
        finally:
            with st.lock:
                slots.end(op)

    def _read(self, rows: Any, ids: bool = True, clocks: list[np.ndarray] | None = None, ahead: int = 0) -> np.ndarray:
        """Read ``rows``: row ids (``ids``), else the slots of a slotted table's rows (checked);
        ``clocks``: a read served from the cache appends the clock each value copied is valid for;
        ``ahead``: see ``get_rows``."""
        if type(rows) is np.ndarray and rows.dtype.kind in "iu" and rows.ndim == 1 and rows.shape[0]:
            # the usual read, of rows all cached and fresh: checked, counted and copied in one pass
            r64 = rows if rows.dtype == np.int64 else rows.astype(np.int64)  # a uint64 past int64: negative
            if self._life.phase is not _RUNNING:
                self._life.check()
            w = self._worker
            tick = w.tick
            need = tick - self.staleness if not ahead else self._ahead_need(tick, ahead)
            out = np.empty((rows.shape[0], self.cols), self.dtype)
            with self._st.lock:
                status, a, b = self._st.cache.read_fresh(r64, need if need > 0 else 0, tick, out)
                if status == 0 and clocks is not None:
                    clocks.append(self._st.cache.fresh_clock(r64))
                if status == 0 and self._probe_every and self._probe_due():
                    self._probe(r64.copy())
            if status == 0:
                w.rows_read += rows.shape[0]
                w.rows_read_early += a
                w.read_staleness_sum += b
                return out
        rows, index = self._rows_index(rows, ids)
        w = self._worker
        fresh = self._reads.wait_fresh(self._st, rows, w, index,
                                       self._ahead_need(w.tick, ahead) if ahead else None)
        early, stale = self._st.cache.read_stats(rows, w.tick)
        w.rows_read += rows.shape[0]
        w.rows_read_early += early
        w.read_staleness_sum += stale
        with self._st.lock:
            if self._probe_every and self._probe_due():
                self._probe(rows.copy())
            if fresh is not None:  # just read and not shared: no copy needed
                return fresh
            values = self._st.cache.values
            return values[index].copy() if type(index) is slice else values[index]

    def _ahead_need(self, tick: int, ahead: int) -> int:
        """The oldest clock a read ``ahead`` ticks later needs, at most this tick (see ``get_rows``)."""
        if self._pushed:
            ahead = 0
        return max(min(tick + ahead - self.staleness, tick), 0)

    def view(self, rows: Any, base: bool = True) -> RowView:
        """An incremental read of ``rows`` (unique): ``RowView.refresh()`` reads them like ``get_rows``
        but copies only rows written since its last copy, ``RowView.push()`` adds its changes like
        ``inc_rows`` in one compiled pass (client/view.py). Keep a view for rows read again and again.
        ``base=False``: a view that only reads (no second copy of the rows kept)."""
        rows, _ = self._rows_index(rows)
        if rows.shape[0] > 1 and np.unique(rows).shape[0] != rows.shape[0]:
            raise ValueError(f"table {self.name!r}: a view's rows must be unique")
        v = RowView(self, rows.copy(), self.cols, self.dtype, base)
        st = self._st
        if st.slots is not None:  # the view holds its rows' slots (never evicted) while it lives
            with st.lock:
                v.slots = st.to_slots(v.rows)
                st.pins[v.slots] += 1
            weakref.finalize(v, st.pin, v.slots, -1)
        return v

    def refresh_view(self, v: RowView, at: np.ndarray | None = None) -> int:
        """``v.refresh(at)`` (see ``_refresh_view``), timed as the worker's "read" phase under metrics.profile."""
        return phases.timed(self._worker.phases, "read", self._refresh_view, v, at)

    def _refresh_view(self, v: RowView, at: np.ndarray | None = None) -> int:
        """``v.refresh(at)``: the rule, counters and probes of ``get_rows`` for the view's rows (at
        positions ``at``, else all); copies only rows whose cache stamp moved since ``v`` copied them.
        Returns the rows copied."""
        if self._life.phase is not _RUNNING:
            self._life.check()
        pos = v.all if at is None else self._positions(v, at)
        if not pos.shape[0]:
            return 0
        self._check_view(v)
        st = self._st
        w = self._worker
        tick = w.tick
        need = tick - self.staleness
        with st.lock:
            status, a, b, copied = st.cache.refresh_fresh(v.slots, pos, need if need > 0 else 0, tick, v.values,
                                                          v.base, v.seen)
            if status == 0 and self._probe_every and self._probe_due():
                self._probe(v.slots[pos])
        if status != 0:  # some row is not fresh: wait as get_rows does, then copy what changed
            rows = v.slots if at is None else v.slots[pos]
            self._reads.wait_fresh(st, rows, w)
            a, b = st.cache.read_stats(rows, w.tick)
            with st.lock:
                if self._probe_every and self._probe_due():
                    self._probe(rows.copy())
                copied += st.cache.copy_changed(v.slots, pos, v.values, v.base, v.seen)
        w.rows_read += pos.shape[0]
        w.rows_read_early += a
        w.read_staleness_sum += b
        return int(copied)

    def push_view(self, v: RowView, at: np.ndarray | None = None) -> int:
        """``v.push(at)`` (see ``_push_view``), timed as the worker's "buffer" phase under metrics.profile."""
        return phases.timed(self._worker.phases, "buffer", self._push_view, v, at)

    def _push_view(self, v: RowView, at: np.ndarray | None = None) -> int:
        """``v.push(at)``: ``inc_rows(rows, values - base)`` of the view's rows (at positions ``at``,
        else all) that changed, in one compiled pass (``UpdateBuffer.add_view``). Versioned tables
        take the ``inc_rows`` path with every row, unchanged ones included (their updates are tagged
        with versions as they leave; a stored procedure sees exactly the updates ``inc_rows`` would
        give it). Returns the rows added."""
        self._life.check()
        if v.base is v.values:
            raise ValueError(f"table {self.name!r}: a view made with base=False only reads; it cannot push")
        pos = v.all if at is None else self._positions(v, at)
        self._check_view(v)
        st = self._st
        if st.vlog is not None:  # every row, unchanged ones too: what inc_rows(rows, values - base) sends
            if pos.shape[0]:
                self.inc_rows(v.rows[pos], v.values[pos] - v.base[pos])
                v.base[pos] = v.values[pos]
                v.seen[pos] = -1  # copied anew at the next refresh
            return int(pos.shape[0])
        with st.lock:
            n = st.oplog.add_view(v.slots, pos, at is None, v.values, v.base, v.seen, st.cache.values, st.cache.stamp,
                                  st.cache.clock, st.read_my_writes, st.importance, st.relative)
        if n < 0:
            raise ValueError(f"table {self.name!r}: view changes contain NaN or infinity")
        w = self._worker
        w.updates_buffered += n
        w.inc_bytes += n * self.cols * self.dtype.itemsize
        return n

    def _positions(self, v: RowView, at: Any) -> np.ndarray:
        """Checked positions into a view's rows: a 1-D integer array in [0, len(v))."""
        pos = np.asarray(at)
        if pos.ndim != 1 or (pos.dtype.kind not in "iu" and pos.size):
            raise TypeError(f"table {self.name!r}: view positions must be a 1-D integer array, got {pos.dtype} "
                            f"with shape {pos.shape}")
        pos = pos.astype(np.int64, copy=False)
        if pos.shape[0]:
            lo, hi = rowmath.min_max(pos)
            if lo < 0 or hi >= v.rows.shape[0]:
                raise IndexError(f"table {self.name!r}: view position {lo if lo < 0 else hi} out of range "
                                 f"[0, {v.rows.shape[0]})")
        return pos

    def _check_view(self, v: RowView) -> None:
        a = v.values
        if type(a) is not np.ndarray or a.shape != v.base.shape or a.dtype != self.dtype or not a.flags.c_contiguous:
            raise ValueError(f"table {self.name!r}: a view's values must stay its own C-contiguous "
                             f"{v.base.shape} {self.dtype.name} array (change it in place); got "
                             f"{type(a).__name__} {getattr(a, 'shape', '')} {getattr(a, 'dtype', '')}")

    def _probe(self, rows: np.ndarray) -> None:
        """Probe the freshness of ``rows`` (an array nothing else writes) just read, under the
        table's lock: the others' updates their values include, and their age in seconds now."""
        st = self._st
        self._reads.probe(st, st.row_ids(rows), st.cache.seen[rows], time.time() - st.cache.seen_at[rows])

    def _probe_due(self) -> bool:
        """Whether this read is probed: one in ``metrics.freshness_every`` on average, at drawn gaps
        (1 to 2N - 1 reads): a fixed period would alias with a worker that reads its tables in turn
        (MF: L, R, L, R, ...) and probe only one of them."""
        w = self._worker
        w.reads_to_probe -= 1
        if w.reads_to_probe > 0:
            return False
        w.reads_to_probe = w.probe_gaps.randrange(1, 2 * self._probe_every)
        return True

    # -- writes --------------------------------------------------------------------------------

    def inc(self, row: int, col: int, delta: Any) -> None:
        if not 0 <= col < self.cols:
            raise IndexError(f"table {self.name!r}: column {col} out of range [0, {self.cols})")
        self.inc_rows(np.array([self._row(row)]), np.array([delta]), cols=np.array([col]))

    def inc_row(self, row: int, deltas: Any) -> None:
        self.inc_rows(np.array([self._row(row)], dtype=np.int64), np.asarray(deltas).reshape(1, -1))

    def inc_rows(self, rows: Any, deltas: Any, cols: Any = None) -> None:
        """Add ``deltas`` to ``rows``: dense ``(len(rows), cols)``, or COO triples when ``cols`` is given."""
        # metrics.profile: the worker's "buffer" phase (update buffer and cache)
        phases.timed(self._worker.phases, "buffer", self._inc_rows, rows, deltas, cols)

    def _inc_rows(self, rows: Any, deltas: Any, cols: Any = None) -> None:
        rows, index = self._rows_index(rows)
        st = self._st
        if cols is None:
            deltas = self._deltas(deltas, check_finite=False)  # the buffer checks them as it copies them
            if deltas.shape != (rows.shape[0], self.cols):
                raise ValueError(f"table {self.name!r}: deltas have shape {deltas.shape}, expected "
                                 f"({rows.shape[0]}, {self.cols}) for {rows.shape[0]} rows")
            with st.lock:
                if not self._direct:
                    rows, index = self._slots_now(rows)
                ok = st.importance is None or rowmath.all_finite(deltas)
                if ok and st.importance is not None:  # relative to the values before this increment
                    priority.accumulate_dense(st.importance, rows, deltas, st.cache.values, st.cache.clock,
                                              st.relative)
                if ok and st.read_my_writes:
                    ok = st.oplog.add_dense(rows, deltas, st.cache.values, st.cache.clock, index)
                    if ok:
                        st.cache.touch(index)  # the mirror wrote the cached rows
                elif ok:
                    ok = st.oplog.add_dense(rows, deltas, index=index)
            if not ok:
                raise ValueError(f"table {self.name!r}: deltas contain NaN or infinity")
        else:
            deltas = self._deltas(deltas)
            cols = np.asarray(cols)
            if cols.dtype.kind not in "iu" or cols.shape != rows.shape or deltas.shape != rows.shape:
                raise ValueError(f"table {self.name!r}: sparse increments need 1-D integer cols and deltas "
                                 f"of the same length as rows ({rows.shape[0]}); got cols {cols.shape} "
                                 f"{cols.dtype}, deltas {deltas.shape}")
            cols = cols.astype(np.int64, copy=False)
            if cols.shape[0] and (cols.min() < 0 or cols.max() >= self.cols):
                bad = int(cols.min()) if cols.min() < 0 else int(cols.max())
                raise IndexError(f"table {self.name!r}: column {bad} out of range [0, {self.cols})")
            with st.lock:
                if not self._direct:
                    rows, _ = self._slots_now(rows)
                if st.importance is not None:
                    priority.accumulate_coo(st.importance, rows, cols, deltas, st.cache.values, st.cache.clock,
                                            st.relative)
                st.oplog.add_coo(rows, cols, deltas)
                if st.read_my_writes:
                    rowmath.scatter_add_coo(st.cache.values, rows, cols, deltas)
                    st.cache.touch(rows)
        w = self._worker  # its own counters: only this thread writes them
        w.updates_buffered += rows.shape[0]  # slots or rows: one per row
        w.inc_bytes += deltas.nbytes

    def send_rows(self, rows: Any) -> None:
        """Send the updates buffered for ``rows`` now rather than at the clock (a partial flush): a
        worker that has finished part of its tick's updates, such as a bucket of gradients during the
        backward, lets their bytes leave while it goes on. SSP is unchanged: the tick's CLOCK still
        follows every update of it on each server's connection; rows without buffered updates are
        skipped. The send happens on the communication thread, soon after this returns."""
        rows, _ = self._rows_index(rows)
        st = self._st
        if st.send_now is None or rows.shape[0] == 0:
            return
        if st.slots is not None:  # a row without a slot has nothing buffered; a slot held by updates stays
            with st.lock:
                rows = st.slots.lookup(rows)
            rows = rows[rows >= 0]
        st.send_now(np.unique(rows))

    # -- argument checks -----------------------------------------------------------------------

    def _row(self, row: Any) -> int:
        if isinstance(row, (bool, np.bool_)) or not isinstance(row, (int, np.integer)):
            raise TypeError(f"table {self.name!r}: row must be an integer, got {type(row).__name__}")
        if not 0 <= row < self.rows:
            raise IndexError(f"table {self.name!r}: row {row} out of range [0, {self.rows})")
        return int(row)

    def _slots_now(self, rows: np.ndarray) -> tuple[np.ndarray, slice | np.ndarray]:
        """The slots of ``rows`` (checked ids) for work done under the table's lock, which holds
        until it is done (nothing evicts them meanwhile), and them as an index."""
        held = self._st.to_slots(rows)
        return held, rowmath.rows_index(held)

    def _rows_index(self, rows: Any, ids: bool = True) -> tuple[np.ndarray, slice | np.ndarray]:
        """Checked int64 rows, and them as an index (a slice for a run: ``rowmath.rows_index``);
        ``ids`` False: slots of a slotted table (valid by construction), only indexed."""
        if not ids:
            return rows, rowmath.rows_index(rows)
        self._life.check()
        rows = np.asarray(rows)
        if rows.ndim != 1 or (rows.dtype.kind not in "iu" and rows.size):
            raise TypeError(f"table {self.name!r}: rows must be a 1-D integer array, got "
                            f"{rows.dtype} with shape {rows.shape}")
        rows = rows.astype(np.int64, copy=False)
        if not rows.shape[0]:
            return rows, rows
        lo, hi, index = rowmath.span(rows)
        if lo < 0 or hi >= self.rows:
            raise IndexError(f"table {self.name!r}: row {lo if lo < 0 else hi} out of range [0, {self.rows})")
        return rows, index

    def _deltas(self, deltas: Any, check_finite: bool = True) -> np.ndarray:
        deltas = np.asarray(deltas)
        if deltas.dtype != self.dtype:  # else nothing to check or cast (the usual case)
            if not np.can_cast(deltas.dtype, self.dtype, "same_kind"):
                raise TypeError(f"table {self.name!r} holds {self.dtype.name}; cannot add {deltas.dtype} deltas")
            deltas = deltas.astype(self.dtype)
        if check_finite and self.dtype.kind == "f" and not rowmath.all_finite(deltas):
            raise ValueError(f"table {self.name!r}: deltas contain NaN or infinity")
        return deltas
