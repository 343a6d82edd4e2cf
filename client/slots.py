"""Row id -> cache slot: what lets a client keep only the rows it touches of a large table.

A table's cache, update buffer and per-row counters are numpy arrays indexed by row. For a table far
bigger than what a worker touches (a 20M-row embedding, a 64-bit keyed sparse table) they are
indexed by *slot* instead: the ``SlotMap`` gives each row id a slot on first touch, and every array
holds as many slots as the process has touched (doubling as needed), or at most ``cache_rows``.

A slot keeps its row's server: slot ``i * S + j`` holds a row of server ``j`` (S servers), so every
rule written for rows, ``partition.server_of`` and ``rows_of`` included, holds for slots unchanged;
row ids are translated at the edges only (the table's API, and the wire).

Past ``cache_rows`` the least recently used rows are evicted, in batches, to make room: only rows
nothing refers to (no buffered update, no read waiting for them, no update in flight that read-my-writes
would put back, no view holding them, not touched by an operation still running). The map keeps, per
slot, the number of the last operation that touched it (``last_used``); operations in progress
register theirs (``begin`` / ``end``).

Open addressing with linear probing over an int32 table of slots kept at most half full; deletion
by backward shift (no tombstones). Numba kernels over whole arrays of ids; no Python object per row.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from bosen.rowmap import entry, home, lookup_into, rehash_into, shift_of
from bosen.rowmath import grown

_EMPTY = -1


@njit(nogil=True, cache=True)
def _translate(table, ids, last_used, top, free, nfree, per, servers, keys, start, op, limit, out):  # pragma: no cover
    """Slots of ``keys[start:]`` into ``out``, each stamped ``op``; new ids take a free slot of their
    server's, else the next unused one. Returns where it stopped: ``keys.shape[0]``, or the first
    new key whose server holds ``limit`` rows or has no slot left (the caller makes room, goes on)."""
    mask, shift = table.shape[0] - 1, shift_of(table)
    for i in range(start, keys.shape[0]):
        k = keys[i]
        h = entry(table, ids, k, mask, shift)
        s = table[h]
        if s < 0:
            j = k % servers
            if top[j] - nfree[j] >= limit:
                return i
            if nfree[j] > 0:
                nfree[j] -= 1
                s = free[j, nfree[j]]
            elif top[j] < per:
                s = top[j] * servers + j
                top[j] += 1
            else:
                return i
            table[h] = s
            ids[s] = k
        last_used[s] = op
        out[i] = s
    return keys.shape[0]


@njit(nogil=True, cache=True)
def _delete(table, ids, slots):  # pragma: no cover - compiled
    """Remove ``slots``' ids from the table (backward-shift deletion: the probe chains stay whole)."""
    mask, shift = table.shape[0] - 1, shift_of(table)
    for t in range(slots.shape[0]):
        h = entry(table, ids, ids[slots[t]], mask, shift)
        if table[h] < 0:
            continue
        i = h
        j = h
        while True:
            j = (j + 1) & mask
            s = table[j]
            if s < 0:
                break
            at = home(ids[s], shift)
            # s stays at j if its home lies cyclically in (i, j]
            if (i <= j and i < at <= j) or (i > j and (at > i or at <= j)):
                continue
            table[i] = s
            i = j
        table[i] = _EMPTY
        ids[slots[t]] = -1


class SlotMap:
    """Row ids (int64 >= 0) -> slots of ``servers`` interleaved classes (``slot % servers`` is the
    row's server), ``per`` slots a class today (``capacity = per * servers``)."""

    def __init__(self, servers: int, per: int) -> None:
        self.servers = servers
        self.per = per
        self.ids = np.full(per * servers, -1, dtype=np.int64)  # the row id of each slot, -1: free
        self.last_used = np.zeros(per * servers, dtype=np.int64)  # the last operation that touched it
        self._table = np.full(_table_size(per * servers), _EMPTY, dtype=np.int32)
        self._top = np.zeros(servers, dtype=np.int64)  # slots of each class ever used
        self._free = np.zeros((servers, per), dtype=np.int64)  # each class's freed slots, a stack
        self._nfree = np.zeros(servers, dtype=np.int64)
        self._op = 0
        self._running: list[int] = []  # operations in progress (their rows are not evicted)

    @property
    def capacity(self) -> int:
        return self.per * self.servers

    def __len__(self) -> int:
        """Rows held."""
        return int(self._top.sum() - self._nfree.sum())

    @property
    def nbytes(self) -> int:
        return self.ids.nbytes + self.last_used.nbytes + self._table.nbytes + self._free.nbytes

    def begin(self) -> int:
        """Start an operation: the rows it touches (``translate``) are not evicted until ``end``."""
        self._op += 1
        self._running.append(self._op)
        return self._op

    def end(self, op: int) -> None:
        self._running.remove(op)

    @property
    def settled(self) -> int:
        """Rows last touched before this operation number are touched by no operation running now."""
        return min(self._running) if self._running else self._op + 1

    def translate(self, keys: np.ndarray, op: int, start: int, out: np.ndarray, limit: int = 1 << 62) -> int:
        """Slots of ``keys[start:]`` into ``out`` (new ids get slots), touched by operation ``op``;
        returns where it stopped: ``len(keys)``, or a new key whose server (``key % servers``) holds
        ``limit`` rows or has no slot left: evict or grow, then call again from there."""
        return int(_translate(self._table, self.ids, self.last_used, self._top, self._free, self._nfree, self.per,
                              self.servers, keys, start, op, limit, out))

    def held(self, server: int) -> int:
        """Rows of ``server`` held."""
        return int(self._top[server] - self._nfree[server])

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """The slot of each id, -1 where it holds none (never touched, or evicted)."""
        out = np.empty(keys.shape[0], dtype=np.int64)
        lookup_into(self._table, self.ids, keys, out)
        return out

    def full(self, server: int) -> bool:
        return bool(self._top[server] >= self.per and self._nfree[server] == 0)

    def grow(self, per: int) -> None:
        """Room for ``per`` slots a class; slots keep their numbers (``i * S + j``), so the caller
        only extends its per-slot arrays to the new ``capacity``."""
        old = self.capacity
        self.per = per
        self.ids = grown(self.ids, self.capacity, -1)
        self.last_used = grown(self.last_used, self.capacity, 0)
        self._free = grown(self._free, per, 0, axis=1)
        if _table_size(self.capacity) > self._table.shape[0]:
            self._table = np.full(_table_size(self.capacity), _EMPTY, dtype=np.int32)
            rehash_into(self._table, self.ids, old)

    def victims(self, server: int, count: int, keep: np.ndarray) -> np.ndarray:
        """Up to ``count`` held slots of ``server``, least recently used first, among those not
        ``keep`` (a mask over slots) and untouched by any operation running now."""
        sl = slice(server, self.capacity, self.servers)
        held = np.flatnonzero((self.ids[sl] >= 0) & ~keep[sl] & (self.last_used[sl] < self.settled))
        if held.shape[0] > count:
            held = held[np.argpartition(self.last_used[sl][held], count - 1)[:count]]
        return held * self.servers + server

    def evict(self, slots: np.ndarray) -> None:
        """Forget the rows of ``slots`` (of one server each; the caller cleared their state); the
        slots are free for new rows."""
        if not slots.shape[0]:
            return
        _delete(self._table, self.ids, slots)
        for j in range(self.servers):
            mine = slots[slots % self.servers == j]
            n = int(self._nfree[j])
            self._free[j, n:n + mine.shape[0]] = mine
            self._nfree[j] = n + mine.shape[0]


def _table_size(capacity: int) -> int:
    """A power of two at least twice ``capacity``: at most half full, short probe chains."""
    size = 16
    while size < 2 * capacity:
        size *= 2
    return size
