"""Gradient buckets: the dense parameters' flat range cut into pieces that are sent as soon as the
backward pass has produced every gradient in them (as DDP's reducer does), in one fixed order.

``PSModule`` lays the dense parameters end to end in one flat tensor (layout.py). A bucket is a range
of it, cut at ``align`` (the dense table's row width for pushes: a push sends whole rows; 1 for an
all-reduce), of about ``size`` values. Backward produces the last layers' gradients first, so buckets
run from the end of the range to its start, and a bucket goes out only after every bucket before it
in that order: every process then issues its collectives (or pushes) in the same order, whatever
order its hooks fired in, which a collective needs to pair its calls across ranks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

Send = Callable[[int, int, int], None]  # (bucket index, first value, end value) of the flat range


class Buckets:
    """Tracks which parameters (``slots``: (offset, numel) in the flat range of ``total`` values) have
    their gradient this step and calls ``send`` for each bucket once all of its parameters have."""

    def __init__(self, slots: Sequence[tuple[int, int]], total: int, send: Send, *, size: int,
                 align: int = 1) -> None:
        if size < 1 or align < 1:
            raise ValueError(f"buckets: size and align must be positive, got size={size}, align={align}")
        self.send_fn = send
        step = max(align, size // align * align)
        cuts = list(range(total, 0, -step))[1:]  # bucket ends, from the range's end down
        ends = [total, *cuts]
        starts = [*cuts, 0]
        self.ranges = [(lo, hi) for lo, hi in zip(starts, ends, strict=True)]  # in sending order
        # per bucket, the parameters overlapping it; per parameter, its buckets
        self.members = [[k for k, (o, n) in enumerate(slots) if o < hi and o + n > lo and n > 0]
                        for lo, hi in self.ranges]
        self.of_slot: list[list[int]] = [[] for _ in slots]
        for b, ms in enumerate(self.members):
            for k in ms:
                self.of_slot[k].append(b)
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """A new step: no gradient seen, no bucket sent."""
        self.missing = [len(ms) for ms in self.members]
        self.seen = [False] * len(self.of_slot)
        self.sent = 0  # buckets sent so far (a prefix of the sending order)

    def ready(self, slot: int) -> None:
        """Parameter ``slot``'s gradient is in place: send every bucket that is now complete and whose
        predecessors have gone (a parameter seen twice in one step, e.g. a shared one, counts once)."""
        with self._lock:
            if self.seen[slot]:
                return
            self.seen[slot] = True
            for b in self.of_slot[slot]:
                self.missing[b] -= 1
            self._drain()

    def flush(self) -> None:
        """Send every bucket not sent yet, in order (parameters without a gradient this step: their
        part of the buffer holds zeros); then start the next step."""
        with self._lock:
            for b in range(self.sent, len(self.ranges)):
                self.missing[b] = 0
            self._drain()
            self.reset()

    def _drain(self) -> None:
        while self.sent < len(self.ranges) and self.missing[self.sent] == 0:
            b = self.sent
            self.sent += 1
            lo, hi = self.ranges[b]
            self.send_fn(b, lo, hi)
