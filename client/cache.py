"""The row cache: the freshest value the client has of each row and the clock it is valid for.

``clock[r]`` is -1 for rows never received, otherwise the clock of the last value received for the
row. A server clock message (SCLOCK) says every cached row of that server is now valid for its clock
(SSP, docs/design.md, "Consistency"); rather than raising every such row's clock (work in the table's size, on every
clock), the cache keeps the last SCLOCK per server, and a cached row's clock is the larger of the two.
Values of a table are one dense matrix, touched lazily.

Every write of a row's cached value bumps the row's *stamp* (``stamp[r]``): a ROWS receipt, this
process's increments on read-my-writes tables, a view's push. A ``RowView`` (``client/view.py``)
remembers the stamp of each row it copied, so a refresh copies only the rows whose stamp moved.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from bosen import rowmath
from bosen.partition import Partition, rows_of


@njit(nogil=True, cache=True)
def _claim(clock, requested, rows, floor):  # pragma: no cover - compiled
    out = np.empty_like(rows)
    k = 0
    for i in range(rows.shape[0]):
        r = rows[i]
        if clock[r] < floor and not requested[r]:
            requested[r] = True
            out[k] = r
            k += 1
    return out[:k]


@njit(nogil=True, cache=True)
def _receive_run(ss, requested, clock, lo, n, msg, c):  # pragma: no cover - compiled
    for i in range(lo, lo + n):
        if ss[i] >= msg:
            return False
    for i in range(lo, lo + n):
        ss[i] = msg
        requested[i] = False
        if clock[i] < c:
            clock[i] = c
    return True


@njit(nogil=True, cache=True)
def _count_known(clock, requested, rows):  # pragma: no cover - compiled
    n = 0
    for i in range(rows.shape[0]):
        r = rows[i]
        n += clock[r] >= 0 or requested[r]
    return n


@njit(nogil=True, cache=True, inline="always")
def _part(ids, r, parts):  # pragma: no cover - compiled
    """The partition of row (or slot: ``ids`` non-empty, the slot's row id) ``r``."""
    return (ids[r] if ids.shape[0] else r) % parts


@njit(nogil=True, cache=True)
def _read_stats(early, clock, server_clock, ids, rows, tick, read_now):  # pragma: no cover - compiled
    n_early = 0
    stale = 0
    parts = server_clock.shape[0]
    for i in range(rows.shape[0]):
        r = rows[i]
        read_now[r] = True
        if early[r]:
            n_early += 1
        c = clock[r]
        sc = server_clock[_part(ids, r, parts)]
        stale += tick - (c if c > sc else sc)
    return n_early, stale


@njit(nogil=True, cache=True)
def _read_fresh(values, clock, server_clock, ids, early, rows, need, tick, out,
                read_now):  # pragma: no cover - compiled
    """Copy ``values[rows]`` into ``out`` if every row is in range and fresh for ``need``; returns
    (0, rows holding an early-pushed value, Σ tick - their clocks), or (1, i, 0) at the first row
    ``i`` out of range, or (2, i, 0) at the first row not fresh (``out`` is then partly written)."""
    parts = server_clock.shape[0]
    nrows = clock.shape[0]
    cols = values.shape[1]
    n_early = 0
    stale = 0
    for i in range(rows.shape[0]):
        r = rows[i]
        if r < 0 or r >= nrows:
            return 1, i, 0
        c = clock[r]
        if c < 0:
            return 2, i, 0
        sc = server_clock[_part(ids, r, parts)]
        f = c if c > sc else sc
        if f < need:
            return 2, i, 0
        stale += tick - f
        if early[r]:
            n_early += 1
        read_now[r] = True
        for k in range(cols):
            out[i, k] = values[r, k]
    return 0, n_early, stale


@njit(nogil=True, cache=True)
def _refresh_fresh(values, clock, server_clock, ids, early, stamp, rows, pos, need, tick, out, base, seen,
                   read_now, both):  # pragma: no cover - compiled
    """``_read_fresh`` for a view's rows at positions ``pos`` (rows known to be in range): checks each
    row's clock and counts what the read counters want, but copies into ``out`` and ``base`` only the
    rows whose stamp is not ``seen`` (the stamp at the view's last copy), recording the new one
    (``both`` False: ``base`` is ``out``, written once). Returns (0, rows holding an early-pushed
    value, Σ tick - their clocks, rows copied), or (2, i, 0, rows copied) at the first row not fresh
    (rows before it may be copied already: correct values, stamps kept)."""
    parts = server_clock.shape[0]
    n_early = 0
    stale = 0
    copied = 0
    for i in range(pos.shape[0]):
        p = pos[i]
        r = rows[p]
        c = clock[r]
        if c < 0:
            return 2, i, 0, copied
        sc = server_clock[_part(ids, r, parts)]
        f = c if c > sc else sc
        if f < need:
            return 2, i, 0, copied
        stale += tick - f
        if early[r]:
            n_early += 1
        read_now[r] = True
        copied += _copy_if_moved(values, stamp, r, p, out, base, seen, both)
    return 0, n_early, stale, copied


@njit(nogil=True, cache=True)
def _copy_changed(values, stamp, rows, pos, out, base, seen, both):  # pragma: no cover - compiled
    """Copy into ``out`` and ``base`` (``both`` False: only ``out``, which is ``base``) the rows at
    ``pos`` whose stamp is not ``seen``; returns how many."""
    copied = 0
    for i in range(pos.shape[0]):
        p = pos[i]
        copied += _copy_if_moved(values, stamp, rows[p], p, out, base, seen, both)
    return copied


@njit(nogil=True, cache=True, inline="always")
def _copy_if_moved(values, stamp, r, p, out, base, seen, both):  # pragma: no cover - compiled
    """Row ``r`` into ``out[p]`` and ``base[p]`` if its stamp moved since ``seen[p]`` (then 1, else 0).
    ``both`` False (a read-only view: ``base`` is ``out``): one write, a plain copy loop; writing
    the same row twice took 1.5x the CPU of ``get_rows``'s copy at 1 MiB."""
    s = stamp[r]
    if s == seen[p]:
        return 0
    if both:
        for k in range(values.shape[1]):
            v = values[r, k]
            out[p, k] = v
            base[p, k] = v
    else:
        for k in range(values.shape[1]):
            out[p, k] = values[r, k]
    seen[p] = s
    return 1


class RowCache:
    """Indexed by row, or by slot for a table whose client keeps only the rows it touches
    (client/slots.py): the same rules either way.

    A server clock holds for the partitions that server owns (bosen/partition.py): ``server_clock``
    is kept per partition, raised for all of a server's at its clock message, so a partition that
    moves takes its clock rules to its new owner. A row's partition is its id mod P (for a slot, the
    id it holds: ``ids``, the slot map's, set by the table's state)."""

    def __init__(self, rows: int, cols: int, dtype: np.dtype, partition: Partition | None = None,
                 counts: bool = False, pushed: bool = True) -> None:
        """``pushed`` False: the servers never push these rows (``push: false``), so a server clock
        says nothing about them: a row is as fresh as the value last received, and a read of a row
        too old asks for it again (``claim``)."""
        self.pushed = pushed
        self.values = np.zeros((rows, cols), dtype=dtype)
        # per row, bumped by every write of its value (module docstring); a view starts at -1
        self.stamp = np.zeros(rows, dtype=np.int64)
        self.clock = np.full(rows, -1, dtype=np.int64)  # as received; see fresh_clock
        self.requested = np.zeros(rows, dtype=bool)
        self.ss = np.zeros(rows, dtype=np.int64)  # the server's number of the ROWS message last applied
        partition = partition or Partition(1)
        self.num_servers = partition.num_servers
        self.server_clock = np.zeros(partition.partitions, dtype=np.int64)  # last SCLOCK of each partition's owner
        self.ids = np.zeros(0, dtype=np.int64)  # a slotted table's row id per slot (empty: indexed by row)
        # rows whose value came in a budgeted (mid-clock) push since their server's last clock message
        self.early = np.zeros(rows, dtype=bool)
        # rows read since the process's last CLOCK (its read set under comm.push_to: readers)
        self.read_now = np.zeros(rows, dtype=bool)
        # freshness probes on (``counts``): per row, how many updates of other processes the cached
        # value includes, as its server said (ROWS "fr"); own updates are never missing (read-my-writes)
        self.seen = np.zeros(rows if counts else 0, dtype=np.int64)
        # and when the server sent that value (ROWS "ft", seconds): a probe reports the content's age.
        # A server clock (SCLOCK) raises a row's clock but says nothing new about its content: kept.
        self.seen_at = np.zeros(rows if counts else 0, dtype=np.float64)

    def _per_slot(self) -> list[tuple[str, int | float | bool]]:
        """(attribute, fill of a row never received) of every per-row array."""
        return [("values", 0), ("stamp", 0), ("clock", -1), ("requested", False), ("ss", 0), ("early", False),
                ("read_now", False)] + ([("seen", 0), ("seen_at", 0.0)] if self.seen.shape[0] else [])

    def grow(self, rows: int) -> None:
        """Room for ``rows`` rows (slots, client/slots.py): every per-row array extended, new rows
        never received. The arrays are new objects: holders of the old ones must fetch them anew."""
        for name, fill in self._per_slot():
            setattr(self, name, rowmath.grown(getattr(self, name), rows, fill))

    def clear(self, slots: np.ndarray) -> None:
        """Forget rows ``slots`` (evicted): as if never received; their stamps move on, so nothing that
        copied them keeps a value as current."""
        for name, fill in self._per_slot():
            if name != "stamp":
                getattr(self, name)[slots] = fill
        self.stamp[slots] += 1

    def raise_clock(self, server: int, clock: int, partition: Partition) -> None:
        """A server clock message: every cached row of that server's partitions is now valid for
        ``clock``."""
        if not self.pushed or server >= partition.num_servers:  # a server joining: no partition yet
            return
        parts = partition.owned[server]
        if not parts.shape[0] or clock <= self.server_clock[parts].min():
            return
        self.server_clock[parts] = np.maximum(self.server_clock[parts], clock)
        if partition.modular:
            self.early[rows_of(server, partition.num_servers)] = False
        else:  # only the rows marked: an SCLOCK would otherwise build per-row arrays of the whole table
            marked = np.flatnonzero(self.early)
            if marked.shape[0]:
                self.early[marked[partition.owner_of[self.partition_of(marked)] == server]] = False

    def rows_of(self, server: int, partition: Partition) -> slice | np.ndarray:
        """The rows (slots) this cache holds of ``server``'s partitions, as an index: a slice under a
        modular map (a slot's class is its row's id mod S, client/slots.py), else a mask."""
        if partition.modular:
            return rows_of(server, partition.num_servers)
        return partition.owner_of[self.partition_of(np.arange(self.clock.shape[0]))] == server

    def partition_of(self, rows: np.ndarray) -> np.ndarray:
        """The partition of each of ``rows`` (slots: of the row each holds)."""
        return (self.ids[rows] if self.ids.shape[0] else rows) % self.server_clock.shape[0]

    def read_stats(self, rows: np.ndarray, tick: int) -> tuple[int, int]:
        """(rows of ``rows`` holding an early-pushed value, Σ tick - their clocks) for read counters:
        one compiled pass, no temporaries (a numpy version doubled a one-row cache hit's cost)."""
        # Python ints
        return _read_stats(self.early, self.clock, self.server_clock, self.ids, rows, tick, self.read_now)

    def read_fresh(self, rows: np.ndarray, need: int, tick: int, out: np.ndarray) -> tuple[int, int, int]:
        """A read whose rows are all cached and fresh for clock ``need``, in one compiled pass (the
        caller holds the table's lock): checks each row's range and clock, counts what the read
        counters want and copies the values into ``out``. See ``_read_fresh`` for the result."""
        return _read_fresh(self.values, self.clock, self.server_clock, self.ids, self.early, rows, need, tick, out,
                           self.read_now)

    def refresh_fresh(self, rows: np.ndarray, pos: np.ndarray, need: int, tick: int, out: np.ndarray,
                      base: np.ndarray, seen: np.ndarray) -> tuple[int, int, int, int]:
        """``read_fresh`` for a view's ``rows`` at positions ``pos``: copies only rows written since the
        view's last copy of them (``seen``: their stamps then; updated). See ``_refresh_fresh``."""
        return _refresh_fresh(self.values, self.clock, self.server_clock, self.ids, self.early, self.stamp, rows, pos,
                              need, tick, out, base, seen, self.read_now, base is not out)

    def copy_changed(self, rows: np.ndarray, pos: np.ndarray, out: np.ndarray, base: np.ndarray,
                     seen: np.ndarray) -> int:
        """Copy into ``out`` and ``base`` the view's rows at ``pos`` written since its last copy of them."""
        return int(_copy_changed(self.values, self.stamp, rows, pos, out, base, seen, base is not out))

    def touch(self, index: slice | np.ndarray) -> None:
        """Rows ``index`` were written (not through a compiled pass that bumps their stamps itself)."""
        self.stamp[index] += 1

    def fresh_clock(self, rows: np.ndarray) -> np.ndarray:
        """The clock each row's cached value is valid for (-1: not cached)."""
        own = self.clock[rows]
        return np.where(own >= 0, np.maximum(own, self.server_clock[self.partition_of(rows)]), -1)

    def min_clock(self, rows: np.ndarray, index: slice | np.ndarray | None = None) -> int:
        """The lowest clock among ``rows`` (-1 if one is not cached); ``rows`` must not be empty.
        ``index``: ``rows`` as an index (``rowmath.rows_index``), if known."""
        low = rowmath.min_max(self.clock[rows if index is None else index])[0]
        if low < 0:
            return -1
        if self.num_servers == 1:  # min over rows of max(own, s) = max(min own, s)
            return max(low, int(self.server_clock[0]))
        return int(self.fresh_clock(rows).min())

    def known(self, rows: np.ndarray) -> int:
        """How many of ``rows`` are cached or asked for (one pass; boolean masks took five calls)."""
        return int(_count_known(self.clock, self.requested, rows))

    def claim(self, rows: np.ndarray, need: int) -> np.ndarray:
        """Rows of ``rows`` never received (of rows no server pushes: whose value is older than
        ``need``) and not yet asked for, in their order and each once, now marked as asked for: the
        ones this reader must request (one pass, where boolean masks and fancy indexing took five)."""
        return _claim(self.clock, self.requested, rows, need if not self.pushed else 0)

    def receive_run(self, lo: int, n: int, msg: int, clock: int) -> bool:
        """Rows ``lo:lo+n`` arrive in the server's ROWS message number ``msg``, valid for ``clock``:
        if none has a newer message's value, record that (the caller writes the values) and return
        True; else change nothing and return False."""
        return _receive_run(self.ss, self.requested, self.clock, lo, n, msg, clock)

    def forget_server(self, server: int, partition: Partition) -> None:
        """``server`` was replaced by one restarted from a checkpoint: nothing cached from it holds,
        and its clock and message numbers start again. Its rows are read anew (and so subscribed)."""
        sl = self.rows_of(server, partition)
        self.clock[sl] = -1
        self.requested[sl] = False
        self.ss[sl] = 0
        self.early[sl] = False
        self.server_clock[partition.owned[server]] = 0

    def moved(self, parts: np.ndarray) -> None:
        """Partitions ``parts`` moved to another server (where every cached value and clock still
        holds): their rows' message numbers start again with the new owner's, and every row asked
        for is asked again."""
        mine = np.isin(self.partition_of(np.arange(self.clock.shape[0])), parts)
        self.ss[mine] = 0
        self.requested[:] = False  # reads parked on any server were answered "moved"

    def take_reads(self) -> np.ndarray:
        """Rows read since the last call, sorted; the marks start again (the caller holds the lock)."""
        rows = np.flatnonzero(self.read_now)
        self.read_now[rows] = False
        return rows

    def cached_clocks(self) -> np.ndarray:
        """Clocks of every cached row (for staleness statistics)."""
        return self.fresh_clock(np.flatnonzero(self.clock >= 0))
