"""Worker threads of one client process and the process clock (the minimum of their ticks)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable


class WorkerClocks:
    """Tracks each worker's tick; calls ``on_advance(c)`` when the process clock rises to ``c``.

    A worker that joins starts at the current process clock; one that leaves stops holding it back.
    ``on_advance`` runs in the thread whose tick (or leave) raised the clock, after this object's
    lock is released (it may block, and other workers must still be able to tick); so two calls
    can arrive in either order, and the receiver keeps the larger clock.
    """

    def __init__(self, on_advance: Callable[[int], None]) -> None:
        self._lock = threading.Lock()
        self._ticks: dict[int, int] = {}
        self._ids = itertools.count()
        self.clock = 0
        self._on_advance = on_advance

    def join(self) -> tuple[int, int]:
        with self._lock:
            wid = next(self._ids)
            self._ticks[wid] = self.clock
            return wid, self.clock

    def tick(self, wid: int) -> int:
        with self._lock:
            self._ticks[wid] += 1
            new = self._ticks[wid]
            advanced = self._advance()
        if advanced is not None:
            self._on_advance(advanced)
        return new

    def leave(self, wid: int) -> None:
        with self._lock:
            del self._ticks[wid]
            advanced = self._advance()
        if advanced is not None:
            self._on_advance(advanced)

    def _advance(self) -> int | None:
        """The new process clock if it rose (under the lock)."""
        if not self._ticks:
            return None
        low = min(self._ticks.values())
        if low > self.clock:
            self.clock = low
            return low
        return None
