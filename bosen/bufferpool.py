"""Arrays lent to messages and taken back once nothing references them any more.

A message sent without a copy keeps its array alive until ZeroMQ has sent it (pyzmq's garbage
collector thread drops the last reference), and a client's in-flight log may keep it longer. Rather
than asking to be told when that happens (a tracker per message costs more than it saves), the pool
looks at the reference count when it next needs a buffer: if only the pool holds one, nobody else can
read it and it may be written again. Reused buffers stay resident and often warm in cache, where a
fresh megabyte array costs page faults and then memory traffic. CPython reference counts: this relies
on them, as pyzmq does, and checks at import that they behave as it expects (``_free_refs``).

After ``send_as_frames``, each buffer lives in a ZeroMQ message of its own, made once,
and goes on the wire as that message (a reference-counted copy, no data copied). pyzmq then has
nothing to release through its collector thread, which otherwise wakes for every zero-copy send
(one more thread on the core per message). ZeroMQ's hold on the memory is invisible to Python's
reference count, so such a buffer is lent again only once its receiver has also acknowledged the
message that last carried it (``carried``): the receiver has every byte, so ZeroMQ has read them all.

Thread safety: ``take`` must be called under the owner's lock. Other threads only ever drop
references and record acknowledgements and carriers, which can only turn a buffer the pool saw as
busy into a free one (a sender records the carrier before it lets go of the buffer).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np
import zmq


def _free_refs() -> int:
    """What ``sys.getrefcount`` says of a buffer only the pool holds, seen as ``take`` sees it (the
    pool's list, a local name, the call's argument): measured, not assumed, because it differs
    between Python versions. Raises ImportError where reference counts cannot tell a held buffer
    from a free one (an interpreter without them): lending would then corrupt messages."""
    bufs = [np.empty(1)]
    b = bufs[0]
    free = sys.getrefcount(b)
    held = b
    if sys.getrefcount(b) != free + 1:
        raise ImportError("bosen.bufferpool needs CPython's reference counts to tell when a buffer is free")
    del held
    return free


_FREE_REFS = _free_refs()


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
        # frame mode: per receiver, the highest sequence number it acknowledged; per buffer (by id,
        # stable while the pool holds it) its message and the (receiver, sequence) that last carried it
        self.acked: Sequence[int] | None = None
        self._frames: dict[int, zmq.Frame] = {}
        self._carried: dict[int, tuple[int, int]] = {}
        self._zeros: np.ndarray | None = None

    def send_as_frames(self, acked: Sequence[int]) -> None:
        """From now on, make buffers inside ZeroMQ messages; ``acked[r]``: the highest sequence number
        receiver ``r`` has acknowledged (kept up to date by the caller)."""
        self.acked = acked

    def frame(self, buf: np.ndarray) -> zmq.Frame | None:
        """The message ``buf`` (a whole buffer of the pool) lives in, or None."""
        return self._frames.get(id(buf))

    def carried(self, buf: np.ndarray, receiver: int, seq: int) -> None:
        """Message ``seq`` to ``receiver`` carries ``buf``'s frame: it is not lent again before that is
        acknowledged."""
        self._carried[id(buf)] = (receiver, seq)

    def _delivered(self, key: int) -> bool:
        last = self._carried.get(key)
        return last is None or self.acked is None or self.acked[last[0]] >= last[1]

    def _make(self) -> np.ndarray:
        if self.acked is None:
            return np.empty(self.shape, dtype=self.dtype)
        nbytes = self.shape[0] * self.shape[1] * self.dtype.itemsize
        if self._zeros is None:  # the one source every frame is made from (a Frame keeps its source)
            self._zeros = np.zeros(nbytes, dtype=np.uint8)
        frame = zmq.Frame(self._zeros, copy=True)
        b = np.frombuffer(frame.buffer, dtype=self.dtype).reshape(self.shape)
        self._frames[id(b)] = frame
        return b

    def take(self, rows: int) -> np.ndarray | None:
        """An array of ``rows`` rows (at most ``shape[0]``) that nothing else references, contents
        undefined; None when all ``keep`` buffers are lent (the caller has another way)."""
        bufs = self._bufs
        if bufs:
            # Buffers come back in about the order they were lent (messages are sent in order), so
            # the oldest lent one is the only one worth looking at: O(1) per message.
            b = bufs[self._next]
            if sys.getrefcount(b) == _FREE_REFS and (self.acked is None or self._delivered(id(b))):
                self._next = (self._next + 1) % len(bufs)
                self.reused += 1
                return b if rows == b.shape[0] else b[:rows]
        if len(bufs) >= self.keep:
            self.refused += 1
            return None
        b = self._make()
        self.allocated += 1
        bufs.insert(self._next, b)
        self._next = (self._next + 1) % len(bufs)
        return b if rows == b.shape[0] else b[:rows]

    @property
    def nbytes(self) -> int:
        """Bytes the pool holds on to (lent or not)."""
        return sum(b.nbytes for b in self._bufs)
