"""``FlushWindow``: one server's share of the end-of-tick flush, paced by acknowledgements.

The flush SSP needs is never delayed by the bandwidth budget, but it must not queue unbounded memory
either: at most ``window_bytes`` of updates are in flight to a server, and the rest waits in the
update buffer (where new increments keep coalescing) until acknowledgements open the window. The
window keeps what the flush still owes its server: rows per table, and the clock to send once they
are out.

Acknowledgements are thinned: an ACK wakes four threads on two machines, so within a pass only one
update message per ``ack_spacing`` bytes asks for one; the others carry ``na`` and are covered by a
later, cumulative ACK. The latest message of a pass is held back, so that the pass's last message can
ask for an ACK (nothing later may come to cover it) or carry the clock (header ``c``: the server
answers with SCLOCK alone, one message each way per tick).

A pass has an explicit lifecycle: ``start()``, ``send()`` for each update message, ``close()``; or
``abort()`` when the connection is gone. The window talks to its server through a link that numbers,
encodes and transmits messages (``ServerLink``, or any object with ``encode``, ``send``,
``transmit`` and ``inflight_bytes``).
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


class Link(Protocol):
    inflight_bytes: int

    def encode(self, header: dict[str, Any], *arrays: np.ndarray, owned: np.ndarray | None = None,
               frame: Any = None) -> tuple[list[Any], int]: ...

    def send(self, header: dict[str, Any], *arrays: np.ndarray, owned: np.ndarray | None = None,
             frame: Any = None) -> int: ...

    def transmit(self, frames: list[Any]) -> None: ...


class FlushWindow:
    def __init__(self, link: Link, window_bytes: int = WINDOW_BYTES, ack_spacing: int = ACK_SPACING_BYTES) -> None:
        self.link = link
        self.window_bytes = window_bytes
        self.ack_spacing = ack_spacing
        self.due: dict[int, deque[np.ndarray]] = {}  # rows still to send, by table, in order
        self.clock_due: int | None = None  # the clock to send once nothing is due
        self.clock_sent = -1  # the last clock that went out (checkpoint boundaries wait for it)
        self.checkpoint_clocks: set[int] = set()  # clocks whose message asks the servers to save (rank 0)
        # rows read (per table: sorted local indices, the server's local row count) to report with the
        # next clock (comm.push_to: readers); None: the clock carries no read set
        self.reads_due: dict[int, tuple[np.ndarray, int]] | None = None
        self._open = False
        self._held: tuple[dict[str, Any], list[Any]] | None = None
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

    def send(self, header: dict[str, Any], *arrays: np.ndarray, owned: np.ndarray | None = None,
             frame: Any = None) -> int:
        """Send an update message within the pass, holding it back until the next one (or close)
        goes; returns its size in bytes."""
        if not self._open:
            raise RuntimeError("FlushWindow.send outside a pass: call start() first")
        for a in arrays:
            self._unasked += a.nbytes
        if self._unasked < self.ack_spacing:
            header["na"] = True  # a later ACK covers it
        else:
            self._unasked = 0
        frames, nbytes = self.link.encode(header, *arrays, owned=owned, frame=frame)
        if self._held is not None:
            self.link.transmit(self._held[1])  # in number order
        self._held = (header, frames)
        return nbytes

    def close(self) -> None:
        """End the pass: its last message goes, asking for an ACK, and carries the clock if nothing
        else is due (or a CLOCK message goes alone)."""
        held, self._held = self._held, None
        self._open = False
        clock = None
        if self.clock_due is not None and not self.due:
            clock, self.clock_due = self.clock_due, None
        save = clock is not None and clock in self.checkpoint_clocks
        if save:
            self.checkpoint_clocks.discard(clock)
        reads = None
        if clock is not None and self.reads_due is not None:  # a CLOCK of its own carries the read set
            reads, self.reads_due = self.reads_due, None
            if held is not None:
                header, frames = held
                if header.pop("na", False):
                    self._unasked = 0
                    frames[0] = wire.pack_header(header)
                self.link.transmit(frames)
                held = None
        if held is None:
            if clock is not None:
                arrays: list[np.ndarray] = []
                extra: dict[str, Any] = {"ck": True} if save else {}
                if reads is not None:
                    extra["rs"], arrays = wire.pack_read_set([(tb, *reads[tb]) for tb in sorted(reads)])
                self.link.send({"t": Msg.CLOCK, "c": clock, **extra}, *arrays)
                self.clock_sent = clock
            return
        header, frames = held
        repack = header.pop("na", False)
        if repack:
            self._unasked = 0
        if clock is not None:
            header["c"] = clock
            if save:
                header["ck"] = True
            repack = True
        if repack:
            frames[0] = wire.pack_header(header)
        self.link.transmit(frames)
        if clock is not None:
            self.clock_sent = clock

    def abort(self) -> None:
        """Drop the pass and everything owed: the connection is gone."""
        self._open = False
        self._held = None
        self._unasked = 0
        self.due.clear()
        self.clock_due = None
        self.reads_due = None
