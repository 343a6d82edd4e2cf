"""The receive path: a server's message checked, and its rows written into the cache.

Rows reach a client on two kinds of connection: the communication thread's (pushes, replies to its
READs) and a worker thread's own read sockets (``client/reader.py``). Both decode and apply them here,
so a row means the same whichever way it came: the cache keeps each row's newest by the server's
per-client message number (``ss``) and, with read-my-writes, puts this process's pending updates
back on top.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bosen import rowmath, wire
from bosen.client.state import TableState
from bosen.errors import ProtocolError


def decode(frames: list[Any]) -> tuple[dict[str, Any], list[Any]]:
    """A message's checked header and its array frames."""
    h = wire.decode_header(frames[0])
    wire.check_frames(h, len(frames) - 1)
    return h, frames[1:]


@dataclass
class Rows:
    """A ROWS message as applied (``rows``: where the cache keeps them, client/slots.py): ``exact``
    says the cache now holds exactly ``values``, every row;
    ``retired`` that a versioned table retired updates that must now go out (``VersionLog``)."""

    table: TableState
    rows: np.ndarray
    values: np.ndarray
    exact: bool
    retired: bool


def receive_rows(tables: Sequence[TableState], j: int, h: dict[str, Any], arrays: Sequence[Any]) -> Rows:
    """Check a ROWS message from server ``j`` and write its rows into their table's cache."""
    tb = h["tb"]
    if not 0 <= tb < len(tables):
        raise ProtocolError(f"ROWS for unknown table {tb}")
    st = tables[tb]
    n = h["n"]
    rows = wire.ids(arrays[0], n, "ROWS rows")
    vals = wire.array(arrays[1], wire.value_dtype(h["dt"]), n * st.cols, "ROWS values").reshape(n, st.cols)
    versioned = wire.is_versioned(h)
    if versioned != (st.vlog is not None):
        raise ProtocolError(f"ROWS for table {st.name!r}: versions {'present' if versioned else 'missing'}, "
                            f"but the server said the table is {'not ' if versioned else ''}versioned")
    retired = False
    versions = wire.array(arrays[2], wire.VERSION_DTYPE, n, "ROWS versions") if versioned else None
    counts = wire.others_frame(h, arrays)
    with st.lock:
        if st.slots is not None:  # ids -> slots; rows this process no longer holds (evicted) are dropped
            rows = st.lookup(rows)
            held = rows >= 0
            if not held.all():
                rows, vals = rows[held], vals[held]
                versions = None if versions is None else versions[held]
                counts = None if counts is None else counts[held]
        if versions is not None:
            assert st.vlog is not None
            retired = st.vlog.receive(rows, versions, st.oplog, st.importance)
        exact = apply_rows(st, j, h, rows, vals, counts)
    return Rows(st, rows, vals, exact, retired)


def apply_rows(st: TableState, j: int, h: dict[str, Any], rows: np.ndarray, vals: np.ndarray,
               counts: np.ndarray | None = None) -> bool:
    """Write rows from server ``j`` (a ROWS message: header ``h``) into the cache, under ``st.lock``.
    Rows for which a later message of the server's (header ``ss``) was already applied are left
    alone: a client's ROWS come on more than one connection, and a reply may be overtaken by a later
    push. With read-my-writes, this process's updates not yet in the values (buffered, or sent after
    the server's ``a``) go back on top. Returns True if the cache rows now hold exactly ``vals``,
    every one of them. ``counts``: the rows' freshness counts (ROWS "fr"), kept beside the values
    with their send time (``ft``). Every row written gets a new stamp (``RowCache.stamp``)."""
    cache = st.cache
    if not cache.seen.shape[0]:
        counts = None  # freshness probes off here
    sent_at = wire.send_time(h) if counts is not None else None
    ss = h["ss"]
    n = rows.shape[0]
    lo = rowmath.run_start(rows)
    exact = lo >= 0 and cache.receive_run(lo, n, ss, h["c"])  # the usual case: one pass over the metadata
    if exact:
        index: slice | np.ndarray = slice(lo, lo + n)
        cache.values[index] = vals  # a memcpy
        if counts is not None:
            cache.seen[index] = counts
            if sent_at is not None:
                cache.seen_at[index] = sent_at
        exact = vals.dtype == cache.values.dtype
    else:
        index = slice(lo, lo + n) if lo >= 0 else rows
        cache.requested[index] = False
        newer = cache.ss[index] < ss
        if not newer.all():
            rows, vals = rows[newer], vals[newer]
            counts = None if counts is None else counts[newer]
            index = rows
        cache.values[index] = vals
        if counts is not None:
            cache.seen[index] = counts
            if sent_at is not None:
                cache.seen_at[index] = sent_at
        cache.ss[index] = ss
        if type(index) is slice:
            np.maximum(cache.clock[index], h["c"], out=cache.clock[index])
        else:
            cache.clock[rows] = np.maximum(cache.clock[rows], h["c"])
    cache.touch(index)  # the values (and below, own updates put back on top) changed: views copy them anew
    cache.early[index] = isinstance(h.get("ps"), int)  # a budgeted push: a value from mid-clock
    if st.read_my_writes:
        log_j = st.inflight[j]
        log_j.settle(h["a"])
        if st.oplog.add_buffered_to(cache.values, rows, index):
            exact = False
        if log_j.reapply(cache.values, rows, h["a"]):
            exact = False
    return exact
