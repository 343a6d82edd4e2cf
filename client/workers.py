"""Worker threads of one client process and the process clock (the minimum of their ticks)."""

from __future__ import annotations

import itertools
import threading
from typing import Callable


class WorkerClocks:
    """Tracks each worker's tick; calls ``on_advance(c)`` when the process clock rises to ``c``.

    A worker that joins starts at the current process clock; one that leaves stops holding it back.
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
            self._advance()
        return new

    def leave(self, wid: int) -> None:
        with self._lock:
            del self._ticks[wid]
            self._advance()

    def _advance(self) -> None:
        if not self._ticks:
            return
        low = min(self._ticks.values())
        if low > self.clock:
            self.clock = low
            self._on_advance(low)
