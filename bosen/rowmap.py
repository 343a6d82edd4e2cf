"""Row id -> slot: where a table that stores only the rows it touches keeps each row.

A sparse table cannot index its arrays by ``row // S``: row ids go up to 2**63 - 1. The map gives
each id a dense slot (0, 1, 2, ... in order of first touch), so every per-row array stays a plain
numpy array indexed by slot. Open addressing with linear probing over an int32 table of slots, the
ids kept once, by slot (``ids``): about 19 bytes per row at the worst load, no Python object per row.
Lookups and inserts are numba kernels over whole arrays of ids.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_EMPTY = -1
_MAX_LOAD = 0.75  # the table doubles (rehash) before more slots than this fraction are taken
_MIN_CAPACITY = 16


@njit(nogil=True, cache=True)
def _shift(table: np.ndarray) -> np.uint64:
    """64 - log2 of the table's size (a power of two): ``_home`` keeps the product's top bits."""
    bits = 0
    while (1 << bits) < table.shape[0]:
        bits += 1
    return np.uint64(64 - bits)


@njit(nogil=True, cache=True)
def _home(key: int, shift: np.uint64) -> np.int64:
    """Fibonacci hashing: the top bits of ``key`` times 2**64 / golden ratio. One multiply (a third of
    splitmix64's work: lookups are most of a sparse shard's cost per row), and it spreads arithmetic
    progressions (a shard's ids r, r + S, r + 2S, ...; runs) evenly over the table."""
    return np.int64((np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)) >> shift)


@njit(nogil=True, cache=True, inline="always")
def _entry(table: np.ndarray, ids: np.ndarray, key: int, mask: int, shift: np.uint64) -> np.int64:
    """Where ``key`` sits in ``table`` (linear probing from its home), or the empty entry its probe
    chain ends at: where a lookup stops and an insert writes (the client's slot map; see ``_lookup``)."""
    h = _home(key, shift)
    while True:
        s = table[h]
        if s < 0 or ids[s] == key:
            return h
        h = (h + 1) & mask


@njit(nogil=True, cache=True)
def _lookup(table: np.ndarray, ids: np.ndarray, keys: np.ndarray, out: np.ndarray) -> int:
    """Slots of ``keys`` into ``out`` (-1 where absent); returns how many are absent. The probe loop
    is written out here and in ``_insert`` (not ``_entry``): a lookup through ``_entry`` took 1.3x
    the thread CPU (200,000 ids in a 1M-row map: 5.2 -> 6.8 ms), and it is a sparse shard's cost per row."""
    mask, shift = table.shape[0] - 1, _shift(table)
    missing = 0
    for i in range(keys.shape[0]):
        k = keys[i]
        h = _home(k, shift)
        while True:
            s = table[h]
            if s < 0:
                out[i] = -1
                missing += 1
                break
            if ids[s] == k:
                out[i] = s
                break
            h = (h + 1) & mask
    return missing


@njit(nogil=True, cache=True)
def _insert(table: np.ndarray, ids: np.ndarray, count: int, limit: int, keys: np.ndarray, start: int,
            out: np.ndarray) -> tuple[int, int]:
    """Slots of ``keys[start:]`` where ``out`` has none yet (-1), new ids taking slots ``count,
    count + 1, ...``; stops early (returns where) when ``limit`` slots are taken or ``ids`` is full,
    for the caller to grow and go on."""
    mask, shift = table.shape[0] - 1, _shift(table)
    for i in range(start, keys.shape[0]):
        if out[i] >= 0:
            continue
        k = keys[i]
        h = _home(k, shift)
        while True:
            s = table[h]
            if s < 0:
                if count >= limit or count >= ids.shape[0]:
                    return i, count
                table[h] = count
                ids[count] = k
                out[i] = count
                count += 1
                break
            if ids[s] == k:
                out[i] = s
                break
            h = (h + 1) & mask
    return keys.shape[0], count


@njit(nogil=True, cache=True)
def _rehash(table: np.ndarray, ids: np.ndarray, count: int) -> None:
    """Enter slots ``0 .. count - 1`` into an empty ``table``; a negative id is a free slot."""
    mask, shift = table.shape[0] - 1, _shift(table)
    for s in range(count):
        if ids[s] >= 0:
            h = _home(ids[s], shift)
            while table[h] >= 0:
                h = (h + 1) & mask
            table[h] = s


class RowMap:
    """Non-negative int64 row ids -> slots ``0 .. len - 1``, in order of first insertion."""

    def __init__(self, expected: int = 0) -> None:
        capacity = _MIN_CAPACITY
        while capacity * _MAX_LOAD < expected:
            capacity *= 2
        self._table = np.full(capacity, _EMPTY, dtype=np.int32)
        self._ids = np.empty(max(expected, _MIN_CAPACITY), dtype=np.int64)
        self._count = 0

    def __len__(self) -> int:
        return self._count

    @property
    def ids(self) -> np.ndarray:
        """The id of each slot (a view: valid until the next insert)."""
        return self._ids[:self._count]

    @property
    def nbytes(self) -> int:
        return self._table.nbytes + self._ids.nbytes

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """The slot of each id, -1 where it was never inserted."""
        keys = _ids_array(keys)
        out = np.empty(keys.shape[0], dtype=np.int64)
        _lookup(self._table, self._ids, keys, out)
        return out

    def find(self, keys: np.ndarray) -> tuple[np.ndarray, int]:
        """``lookup`` of a contiguous int64 array, no checks, and how many ids are absent: the one pass a
        sparse shard makes when every row it is sent is stored already (then nothing needs checking:
        only checked ids were ever inserted)."""
        out = np.empty(keys.shape[0], dtype=np.int64)
        return out, _lookup(self._table, self._ids, keys, out)

    def insert(self, keys: np.ndarray, checked: bool = False) -> tuple[np.ndarray, int]:
        """The slot of each id, giving new ids the next free slots; and how many slots existed before
        (new slots are ``before .. len - 1``, their ids ``self.ids[before:]``). ``checked``: the caller
        already knows ``keys`` is a contiguous int64 array of ids >= 0 (a shard checked their range)."""
        if not checked:
            keys = _ids_array(keys)
            if keys.shape[0] and int(keys.min()) < 0:
                raise ValueError(f"row ids must be >= 0, got {int(keys.min())}")
        return self.fill(keys, np.full(keys.shape[0], _EMPTY, dtype=np.int64))

    def fill(self, keys: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, int]:
        """``insert`` of the checked ``keys`` whose ``out`` is -1 (``find`` left them absent), their
        slots written into ``out``; returns ``out`` and how many slots existed before."""
        before = self._count
        start = 0
        while True:
            limit = int(self._table.shape[0] * _MAX_LOAD)
            start, self._count = _insert(self._table, self._ids, self._count, limit, keys, start, out)
            if start == keys.shape[0]:
                return out, before
            if self._count >= limit:
                self._grow_table()
            if self._count >= self._ids.shape[0]:
                # 1.5x: amortized O(1) per insert, at most a third of the ids array unused
                grown = np.empty(self._ids.shape[0] * 3 // 2 + 1, dtype=np.int64)
                grown[:self._count] = self._ids[:self._count]
                self._ids = grown

    def _grow_table(self) -> None:
        self._table = np.full(self._table.shape[0] * 2, _EMPTY, dtype=np.int32)
        _rehash(self._table, self._ids, self._count)

    @classmethod
    def of(cls, ids: np.ndarray) -> RowMap:
        """A map holding ``ids`` (distinct) in slots ``0 .. len - 1``, e.g. a restored checkpoint's."""
        m = cls(expected=ids.shape[0])
        slots, _ = m.insert(ids)
        if len(m) != ids.shape[0]:
            raise ValueError(f"row ids must be distinct: {ids.shape[0]} ids, {len(m)} distinct")
        return m


def _ids_array(keys: np.ndarray) -> np.ndarray:
    keys = np.asarray(keys)
    if keys.ndim != 1 or keys.dtype.kind not in "iu":
        raise ValueError(f"row ids: expected a 1-d integer array, got {keys.dtype} of shape {keys.shape}")
    if keys.dtype.kind == "u" and keys.shape[0] and int(keys.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"row ids must be < 2**63, got {int(keys.max())}")
    return np.ascontiguousarray(keys, dtype=np.int64)


# the table's kernels, for other open-addressing tables of row ids laid out the same way (an int32
# table of slots, the ids by slot, -1 a free slot: client/slots.py)
home = _home
shift_of = _shift
entry = _entry
lookup_into = _lookup
rehash_into = _rehash
