"""Arrays lent to messages and taken back once nothing references them any more.

A message sent without a copy keeps its array alive until ZeroMQ has sent it (pyzmq's garbage
collector thread drops the last reference), and a client's in-flight log may keep it longer. Rather
than asking to be told when that happens (a tracker per message costs more than it saves), the pool
looks at the reference count when it next needs a buffer: if only the pool holds one, nobody else can
read it and it may be written again. Reused buffers stay resident and often warm in cache, where a
fresh megabyte array costs page faults and then memory traffic. CPython reference counts: this relies
on them, as pyzmq does.

Thread safety: ``take`` must be called under the owner's lock. Other threads only ever drop
references, which can only turn a buffer the pool saw as busy into a free one.
"""

from __future__ import annotations

import sys

import numpy as np

_FREE_REFS = 3  # the pool's list, the loop variable and getrefcount's own argument


class BufferPool:
    def __init__(self, shape: tuple[int, int], dtype: np.dtype, keep: int) -> None:
        self.shape = shape
        self.dtype = np.dtype(dtype)
        self.keep = keep  # most buffers the pool makes
        self._bufs: list[np.ndarray] = []
        self._next = 0  # the buffer lent longest ago
        self.allocated = 0  # counters: buffers made, lendings served by a reused one, and refused
        self.reused = 0
        self.refused = 0

    def take(self, rows: int) -> np.ndarray | None:
        """An array of ``rows`` rows (at most ``shape[0]``) that nothing else references, contents
        undefined; None when all ``keep`` buffers are lent (the caller has another way)."""
        bufs = self._bufs
        if bufs:
            # Buffers come back in about the order they were lent (messages are sent in order), so
            # the oldest lent one is the only one worth looking at: O(1) per message.
            b = bufs[self._next]
            if sys.getrefcount(b) == _FREE_REFS:
                self._next = (self._next + 1) % len(bufs)
                self.reused += 1
                return b if rows == b.shape[0] else b[:rows]
        if len(bufs) >= self.keep:
            self.refused += 1
            return None
        b = np.empty(self.shape, dtype=self.dtype)
        self.allocated += 1
        bufs.insert(self._next, b)
        self._next = (self._next + 1) % len(bufs)
        return b if rows == b.shape[0] else b[:rows]

    @property
    def nbytes(self) -> int:
        """Bytes the pool holds on to (lent or not)."""
        return sum(b.nbytes for b in self._bufs)
