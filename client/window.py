"""``FlushWindow``: one server's share of the end-of-tick flush, paced by acknowledgements.

The flush SSP needs is never delayed by the bandwidth budget, but it must not queue unbounded memory
either: at most ``window_bytes`` of updates are in flight to a server, and the rest waits in the
update buffer (where new increments keep coalescing) until acknowledgements open the window. The
window keeps what the flush still owes its server: rows per table, and the clock to send once they
are out.

A pass gathers its updates (one part per table chunk) into messages of about ``bundle_bytes``: the
parts of a message go as one INC when it has one, else as one FLUSH (``bosen.wire``), so a tick that
changed a little of several tables sends each server one message, not one per table and a CLOCK. The
message being gathered is held back until the pass ends or it is full, so that the pass's last
message can ask for an ACK (nothing later may come to cover it) and carry the clock (header ``c``, and
``ck``, ``rs``: the server answers with SCLOCK alone, one message each way per tick).

Acknowledgements are thinned: an ACK wakes four threads on two machines, so within a pass only one
update message per ``ack_spacing`` bytes asks for one; the others carry ``na`` and are covered by a
later, cumulative ACK.

A pass has an explicit lifecycle: ``start()``, then for each part ``ready()`` (the number its message
will have) and ``send()``, then ``close()``; or ``abort()`` when the connection is gone. The window
talks to its server through a link that numbers, encodes and transmits messages and counts the
updates in flight (``ServerLink``, or any object with ``encode``, ``send``, ``transmit``,
``sent_update``, ``seq`` and ``inflight_bytes``).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

import numpy as np

from bosen import wire
from bosen.wire import Msg

# Most update bytes in flight to one server before a flush waits for ACKs. 16 MiB, not 8: the client's
# ZeroMQ I/O thread then always has a message queued behind the one it sends, and ingest-1MiB took
# 4-6% less CPU per MiB (docs/design.md, "Flush window").
WINDOW_BYTES = 16 << 20
# A flush's update messages ask for an ACK once per ACK_SPACING_BYTES (and on a pass's last message);
# acknowledging 1 MiB messages in twos cut ingest's CPU per MiB by ~8% (docs/design.md, "ACK spacing").
ACK_SPACING_BYTES = 2 << 20
# A pass's message takes no more parts once it holds this many bytes: small updates of several tables
# share one message; a chunk of a large flush (1 MiB, ``client/oplog.CHUNK_BYTES``) still goes alone.
BUNDLE_BYTES = 1 << 20


# One part of a pass's message: its INC header, its arrays, and the arrays that go without a copy
# with the ZeroMQ message each lives in (or None)
Part = tuple[dict[str, Any], tuple[np.ndarray, ...], tuple[tuple[np.ndarray, Any], ...]]


class Link(Protocol):
    inflight_bytes: int
    seq: int

    def encode(self, header: dict[str, Any], *arrays: np.ndarray, owned: np.ndarray | None = None,
               frame: Any = None, lent: tuple[tuple[np.ndarray, Any], ...] = ()) -> tuple[list[Any], int]: ...

    def sent_update(self, nbytes: int) -> None: ...

    def send(self, header: dict[str, Any], *arrays: np.ndarray, owned: np.ndarray | None = None,
             frame: Any = None) -> int: ...
    def transmit(self, frames: list[Any]) -> None: ...


class FlushWindow:
    def __init__(self, link: Link, window_bytes: int = WINDOW_BYTES, ack_spacing: int = ACK_SPACING_BYTES,
                 bundle_bytes: int = BUNDLE_BYTES) -> None:
        self.link = link
        self.window_bytes = window_bytes
        self.ack_spacing = ack_spacing
        self.bundle_bytes = bundle_bytes
        self.due: dict[int, deque[np.ndarray]] = {}  # rows still to send, by table, in order
        self.clock_due: int | None = None  # the clock to send once nothing is due
        self.clock_sent = -1  # the last clock that went out (checkpoint boundaries wait for it)
        self.checkpoint_clocks: set[int] = set()  # clocks whose message asks the servers to save (rank 0)
        # rows read (per table: sorted local indices, the server's local row count) to report with the
        # next clock (comm.push_to: readers); None: the clock carries no read set
        self.reads_due: dict[int, tuple[np.ndarray, int]] | None = None
        self._open = False
        self._parts: list[Part] = []  # the message being gathered
        self._part_bytes = 0
        self._unasked = 0  # update bytes sent since one asked for an ACK

    # -- what the flush owes -------------------------------------------------------------------

    def owe(self, table: int, rows: np.ndarray) -> None:
        """Queue ``rows`` (sorted) of ``table``; a row queued twice is sent once (the buffer's dirty flag)."""
        self.due.setdefault(table, deque()).append(rows)

    def owe_clock(self, clock: int) -> None:
        self.clock_due = clock

    def owe_reads(self, reads: dict[int, tuple[np.ndarray, int]]) -> None:
        """Rows read since the last clock went out, reported with the next one (merged with any
        not yet reported: ticks that share one CLOCK share one read set)."""
        if self.reads_due is None:
            self.reads_due = dict(reads)
            return
        for tb, (local, n) in reads.items():
            old = self.reads_due.get(tb)
            self.reads_due[tb] = (local if old is None else np.union1d(old[0], local), n)

    @property
    def busy(self) -> bool:
        """Whether the flush still owes this server anything (it goes on as acknowledgements come)."""
        return bool(self.due) or self.clock_due is not None

    def has_room(self) -> bool:
        return self.link.inflight_bytes < self.window_bytes

    # -- one pass ------------------------------------------------------------------------------

    def start(self) -> None:
        if self._open:
            raise RuntimeError("FlushWindow.start: a pass is already open")
        self._open = True

    def ready(self) -> int:
        """Before a part is taken: the number of the message it will travel in (read-my-writes logs
        it under that number). The message being gathered goes first if it is full."""
        if not self._open:
            raise RuntimeError("FlushWindow.ready outside a pass: call start() first")
        if self._part_bytes >= self.bundle_bytes:
            self._emit(last=False)
        return self.link.seq + 1

    def send(self, header: dict[str, Any], *arrays: np.ndarray, owned: np.ndarray | None = None,
             frame: Any = None) -> int:
        """Add an update part (an INC's header and arrays) to the pass's message, which goes once it is
        full (at the next ``ready``) or the pass ends; returns the part's size in bytes. ``owned``:
        an array that goes without a copy, living in ZeroMQ message ``frame`` if not None."""
        self.ready()
        nbytes = 0
        for a in arrays:
            nbytes += a.nbytes
        self._parts.append((header, arrays, () if owned is None else ((owned, frame),)))
        self._part_bytes += nbytes
        return nbytes

    def close(self) -> None:
        """End the pass: its last message goes, asking for an ACK, and carries the clock if nothing
        else is due (a CLOCK message goes alone if there are no updates)."""
        self._open = False
        clock = None
        if self.clock_due is not None and not self.due:
            clock, self.clock_due = self.clock_due, None
        if clock is None:
            if self._parts:
                self._emit(last=True)
            return
        extra: dict[str, Any] = {"c": clock}
        if clock in self.checkpoint_clocks:
            self.checkpoint_clocks.discard(clock)
            extra["ck"] = True
        reads: list[np.ndarray] = []
        if self.reads_due is not None:
            due, self.reads_due = self.reads_due, None
            extra["rs"], reads = wire.pack_read_set([(tb, *due[tb]) for tb in sorted(due)])
        if self._parts:
            self._emit(last=True, extra=extra, reads=reads)
        else:
            self.link.send({"t": Msg.CLOCK, **extra}, *reads)
        self.clock_sent = clock

    def _emit(self, last: bool, extra: dict[str, Any] | None = None, reads: list[np.ndarray] | None = None) -> None:
        """Send the message gathered: one part alone as an INC, several (or one with a read set) as a
        FLUSH. A pass's last message asks for an ACK; the others only once per ``ack_spacing``."""
        parts, self._parts = self._parts, []
        nbytes, self._part_bytes = self._part_bytes, 0
        self._unasked += nbytes
        if last or self._unasked >= self.ack_spacing:
            self._unasked = 0
            ask = True
        else:
            ask = False
        reads = reads or []
        lent = tuple(x for _, _, own in parts for x in own)
        if len(parts) == 1 and not reads:
            header, arrays, _ = parts[0]
            header.pop("na", None)
        else:
            header = {"t": Msg.FLUSH, "u": [wire.flush_part(h) for h, _, _ in parts]}
            arrays = tuple(a for _, arr, _ in parts for a in arr) + tuple(reads)
        if extra:
            header.update(extra)
        if not ask:
            header["na"] = True  # a later ACK covers it
        frames, size = self.link.encode(header, *arrays, lent=lent)
        self.link.transmit(frames)
        self.link.sent_update(size)

    def abort(self) -> None:
        """Drop the pass and everything owed: the connection is gone."""
        self._open = False
        self._parts = []
        self._part_bytes = 0
        self._unasked = 0
        self.due.clear()
        self.clock_due = None
        self.reads_due = None
