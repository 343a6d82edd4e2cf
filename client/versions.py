"""Client side of parameter versioning (docs/design.md, "Versioning protocol"; thesis §3.2.3), for tables
the server marks versioned.

The cache keeps the version of every row it holds (``version[r]``, 0 = never received or never
updated on the server). Updates are tagged with the version of the cached row when they are
buffered; since a row's buffered updates are retired as soon as its cached version changes, every
buffered row's tag is simply ``version[r]`` (the invariant that keeps differently tagged updates
apart without a second buffer).

Every ROWS receipt of a row creates one server-side reference to its version; the next receipt of
that row ends it:

- the row has buffered updates tagged with an older version: they are *retired*, i.e. taken out of
  the buffer and queued to be sent before anything else, marked end-of-version;
- otherwise the old version (if > 0) is queued as a *release* (no values).

Retired updates and releases go out in one INC per server right after the ROWS burst that caused
them, or at the latest in front of the next flush, so the server's reference counts drop as soon
as possible. ``release_all`` hands back every held version when the client leaves.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from bosen import rowmath


@njit(nogil=True, cache=True)
def _receive(rows, new, version, dirty, ret_rows, ret_tags, rel_rows, rel_tags):  # pragma: no cover
    """Apply the versions of a ROWS message in order; fill retire / release lists; return counts."""
    nret = 0
    nrel = 0
    for i in range(rows.shape[0]):
        r = rows[i]
        old = version[r]
        v = new[i]
        if dirty[r] and old != v:
            ret_rows[nret] = r
            ret_tags[nret] = old
            nret += 1
        elif old > 0:
            rel_rows[nrel] = r
            rel_tags[nrel] = old
            nrel += 1
        version[r] = v
    return nret, nrel


class VersionLog:
    """Versions held and the queue of retired updates and releases of one table (under its lock)."""

    def __init__(self, rows: int) -> None:
        self.version = np.zeros(rows, dtype=np.int64)
        self._ret: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self._rel: list[tuple[np.ndarray, np.ndarray]] = []
        self.retired_rows = 0  # counters
        self.released = 0

    def grow(self, rows: int) -> None:
        """Room for ``rows`` rows (slots, client/slots.py)."""
        self.version = rowmath.grown(self.version, rows, 0)

    @property
    def pending(self) -> bool:
        return bool(self._ret or self._rel)

    def receive(self, rows: np.ndarray, versions: np.ndarray, oplog, importance: np.ndarray | None) -> bool:
        """New versions of ``rows`` arrived; returns whether retired updates or releases are queued."""
        n = rows.shape[0]
        ret_rows = np.empty(n, dtype=np.int64)
        ret_tags = np.empty(n, dtype=np.int64)
        rel_rows = np.empty(n, dtype=np.int64)
        rel_tags = np.empty(n, dtype=np.int64)
        nret, nrel = _receive(rows, versions, self.version, oplog.dirty, ret_rows, ret_tags, rel_rows, rel_tags)
        if nret:
            rr = ret_rows[:nret]
            ops = oplog.take_ops(rr)
            self._ret.append((rr, ret_tags[:nret], oplog.take(rr),
                              np.zeros(nret, np.int32) if ops is None else ops))
            if importance is not None:
                importance[rr] = 0
            self.retired_rows += nret
        if nrel:
            self._rel.append((rel_rows[:nrel], rel_tags[:nrel]))
            self.released += nrel
        return bool(nret or nrel)

    def release_all(self) -> None:
        """Queue a release of every version held (the client is leaving)."""
        held = np.flatnonzero(self.version > 0)
        if held.shape[0]:
            self._rel.append((held, self.version[held].copy()))
            self.released += held.shape[0]
            self.version[held] = 0

    def take(self, cols: int, dtype: np.dtype) -> tuple[np.ndarray, ...]:
        """(retired rows, their tags, their values, their inc operation counts (zeros where not
        counted), released rows, their versions); empties the queue."""
        if self._ret:
            rr = np.concatenate([x[0] for x in self._ret])
            rt = np.concatenate([x[1] for x in self._ret])
            rv = np.concatenate([x[2] for x in self._ret])
            rw = np.concatenate([x[3] for x in self._ret])
        else:
            rr = rt = np.empty(0, dtype=np.int64)
            rv = np.empty((0, cols), dtype=dtype)
            rw = np.empty(0, dtype=np.int32)
        if self._rel:
            lr = np.concatenate([x[0] for x in self._rel])
            lt = np.concatenate([x[1] for x in self._rel])
        else:
            lr = lt = np.empty(0, dtype=np.int64)
        self._ret.clear()
        self._rel.clear()
        return rr, rt, rv, rw, lr, lt
