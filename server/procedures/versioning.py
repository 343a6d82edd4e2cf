"""Row versions and refcounted snapshots for versioned stored procedures (AdaRevision).

Every row has a version (int64, 0 until the row is first updated) that goes up by one with every
update entry applied to it. When the server sends a row at version v to a client, that client holds
a reference to (row, v) until it releases it (an update marked end-of-version, or an explicit
release; clients release every version they received exactly once). A procedure that needs per-row
state "as of version v" (AdaRevision: the gradient sum ḡ) reads it through ``SnapshotStore``.

Copy on write: the state of a row's *current* version is the live row itself, so a snapshot is only
copied when a row whose current version is still held by clients is about to change. Those copies
are the live snapshots that cost memory and that ``max_snapshots`` caps: rows updated since their
holders last received them. A copy is freed when its reference count reaches zero.

Layout, with no Python object per row: ``cur_ref[r]`` counts holders of row r's current version;
copies live in a pool array ``pool[slot]`` with ``refcnt[slot]``, found through a numba typed dict
``index[(r, v)] -> slot``; free slots form a stack. The pool grows by doubling, in Python, before a
kernel that may need slots runs (a kernel needs at most one slot per update entry). All loops are
numba kernels (``nogil``): the procedure kernels call the ``@njit`` helpers below per entry.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit, types
from numba.typed import Dict

KEY = types.UniTuple(types.int64, 2)

# what ``lookup`` says about a tag
CURRENT = -1  # the tag is the row's current version: its state is the live row
ZERO = -2  # version 0 (never read / never updated): the state is the initial state (zeros)
INVALID = -3  # no such version is held: a protocol error


@njit(nogil=True, cache=True)
def lookup(index, versions, r, t):  # pragma: no cover - compiled
    """Where the state of (row r, version t) is: a pool slot, CURRENT, ZERO or INVALID."""
    v = versions[r]
    if t == v:
        return CURRENT
    if t == 0:
        return ZERO
    if t > v or (r, t) not in index:
        return INVALID
    return index[(r, t)]


@njit(nogil=True, cache=True)
def copy_on_write(index, versions, cur_ref, pool, refcnt, free, nfree, src, r):  # pragma: no cover
    """Row r is about to change: if clients hold its current version, copy ``src[r]`` to a slot.

    ``nfree`` is a 1-element array (the free-stack height); the caller guarantees a free slot.
    """
    if cur_ref[r] > 0:
        nfree[0] -= 1
        slot = free[nfree[0]]
        for j in range(src.shape[1]):
            pool[slot, j] = src[r, j]
        refcnt[slot] = cur_ref[r]
        index[(r, versions[r])] = slot
        cur_ref[r] = 0


@njit(nogil=True, cache=True)
def validate(index, versions, rows, tags):  # pragma: no cover - compiled
    """Index of the first entry whose tag names no held version of its row, or -1."""
    for i in range(rows.shape[0]):
        if lookup(index, versions, rows[i], tags[i]) == INVALID:
            return i
    return -1


@njit(nogil=True, cache=True)
def add_holders(versions, cur_ref, rows, n):  # pragma: no cover - compiled
    """Rows were sent at their current versions to ``n`` clients each (version 0 needs no reference)."""
    for i in range(rows.shape[0]):
        r = rows[i]
        if versions[r] > 0:
            cur_ref[r] += n


@njit(nogil=True, cache=True)
def release(index, versions, cur_ref, refcnt, free, nfree, rows, tags):  # pragma: no cover - compiled
    """Drop one reference to each (rows[i], tags[i]); frees copies that nobody holds. Returns the
    number of releases that matched nothing (a client bug; they change nothing)."""
    errors = 0
    for i in range(rows.shape[0]):
        r = rows[i]
        t = tags[i]
        if t == 0:
            continue
        if t == versions[r]:
            if cur_ref[r] > 0:
                cur_ref[r] -= 1
            else:
                errors += 1
            continue
        if t > versions[r] or (r, t) not in index:
            errors += 1
            continue
        slot = index[(r, t)]
        refcnt[slot] -= 1
        if refcnt[slot] == 0:
            del index[(r, t)]
            free[nfree[0]] = slot
            nfree[0] += 1
    return errors


@njit(nogil=True, cache=True)
def _entries(index, rows, tags, slots):  # pragma: no cover - compiled
    """Every (row, version) -> slot of ``index`` into the arrays (sized ``len(index)``)."""
    k = 0
    for key, slot in index.items():
        rows[k] = key[0]
        tags[k] = key[1]
        slots[k] = slot
        k += 1


@njit(nogil=True, cache=True)
def _insert(index, rows, tags, slots):  # pragma: no cover - compiled
    for i in range(rows.shape[0]):
        index[(rows[i], tags[i])] = slots[i]


def new_index() -> Any:
    return Dict.empty(key_type=KEY, value_type=types.int64)


class SnapshotStore:
    """Versions, holder counts and copied snapshots of ``width`` float64 values per row."""

    def __init__(self, n_rows: int, width: int, capacity: int = 64) -> None:
        self.versions = np.zeros(n_rows, dtype=np.int64)
        self.cur_ref = np.zeros(n_rows, dtype=np.int64)
        self.index = new_index()
        self.pool = np.zeros((capacity, width), dtype=np.float64)
        self.refcnt = np.zeros(capacity, dtype=np.int64)
        self.free = np.arange(capacity - 1, -1, -1, dtype=np.int64)  # stack: slot 0 on top
        self.nfree = np.array([capacity], dtype=np.int64)
        self.release_errors = 0
        self.peak = 0

    def grow(self, n_rows: int) -> None:
        """Room for ``n_rows`` rows (a sparse shard grew): the new rows at version 0, held by nobody.
        Copies, refcounts and the index stay as they are: they are keyed by row, which does not move."""
        old = self.versions.shape[0]
        if n_rows < old:
            raise ValueError(f"SnapshotStore.grow: {n_rows} rows, fewer than the {old} it has")
        for name in ("versions", "cur_ref"):
            a = np.zeros(n_rows, dtype=np.int64)
            a[:old] = getattr(self, name)
            setattr(self, name, a)

    @property
    def capacity(self) -> int:
        return self.pool.shape[0]

    @property
    def live(self) -> int:
        """Snapshot copies in use (row versions that changed while clients held them)."""
        return self.capacity - int(self.nfree[0])

    def reserve(self, need: int) -> None:
        """Make sure ``need`` slots are free (grow the pool by doubling)."""
        nfree = int(self.nfree[0])
        if nfree >= need:
            return
        old = self.capacity
        new = max(2 * old, old + need - nfree)
        pool = np.zeros((new, self.pool.shape[1]), dtype=np.float64)
        pool[:old] = self.pool
        refcnt = np.zeros(new, dtype=np.int64)
        refcnt[:old] = self.refcnt
        free = np.empty(new, dtype=np.int64)
        free[:nfree] = self.free[:nfree]
        free[nfree:nfree + new - old] = np.arange(new - 1, old - 1, -1)
        self.pool, self.refcnt, self.free = pool, refcnt, free
        self.nfree[0] = nfree + new - old

    def note_peak(self) -> None:
        live = self.live
        if live > self.peak:
            self.peak = live

    def copies(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """The snapshot copies of rows ``rows`` (a bool mask over rows): "row", "version", "refcnt" and
        "values" per copy (arrays; a partition move carries them to the rows' new server)."""
        n = len(self.index)
        r, t, slot = (np.empty(n, dtype=np.int64) for _ in range(3))
        if n:
            _entries(self.index, r, t, slot)
        keep = rows[r]
        r, t, slot = r[keep], t[keep], slot[keep]
        return {"row": r, "version": t, "refcnt": self.refcnt[slot], "values": self.pool[slot]}

    def adopt(self, rows: np.ndarray, cur_ref: np.ndarray, copies: dict[str, np.ndarray]) -> None:
        """Rows ``rows`` (at the versions ``versions`` already says) come with ``cur_ref`` holders of
        their current versions and the snapshot ``copies`` (``copies()``, "row" already in this
        store's rows): what a partition move hands over, so an update tagged with a version read from
        the old server finds its snapshot here."""
        self.cur_ref[rows] = cur_ref
        n = copies["row"].shape[0]
        if not n:
            return
        self.reserve(n)
        top = int(self.nfree[0])
        slots = self.free[top - n:top][::-1].copy()
        self.nfree[0] = top - n
        self.pool[slots] = copies["values"]
        self.refcnt[slots] = copies["refcnt"]
        _insert(self.index, copies["row"].astype(np.int64), copies["version"].astype(np.int64), slots)
        self.note_peak()

    def first_invalid(self, rows: np.ndarray, tags: np.ndarray) -> int:
        return int(validate(self.index, self.versions, rows, tags))

    def rows_sent(self, rows: np.ndarray, n: int) -> None:
        add_holders(self.versions, self.cur_ref, rows, n)

    def release(self, rows: np.ndarray, tags: np.ndarray) -> int:
        errors = int(release(self.index, self.versions, self.cur_ref, self.refcnt, self.free, self.nfree,
                             rows, tags))
        self.release_errors += errors
        return errors

    def held(self) -> int:
        """Client references outstanding (current versions plus copies)."""
        live = self.free[:int(self.nfree[0])]
        used = np.ones(self.capacity, dtype=bool)
        used[live] = False
        return int(self.cur_ref.sum() + self.refcnt[used].sum())

    def stats(self) -> dict[str, int]:
        return {"snapshots": self.live, "snapshots_peak": self.peak, "snapshot_pool": self.capacity,
                "versions_held": self.held(), "release_errors": self.release_errors}
