"""``ServerLink``: the client's connection to one server, the counterpart of the server's ``Peer``.

It numbers the messages to its server (one FIFO socket each way), charges their bytes to the
client's bucket, and keeps what the server told us: its clock, the updates it acknowledged, the
requests waiting for an answer. Used on the communication thread only.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections import deque
from typing import Any, Protocol

import numpy as np

from bosen import wire
from bosen.client.window import FlushWindow
from bosen.ratelimit import LeakyBucket
from bosen.zsocket import LoopSocket


class SentLog(Protocol):
    """Keeps what was sent for a replacement server (``recovery.ResendLog``)."""

    floor: int

    def __len__(self) -> int: ...

    def record(self, clock_sent: int, header: dict[str, Any], payload: list[Any]) -> None: ...

    def forget(self, durable: int) -> None: ...

    def mark(self, version: int) -> None: ...


class LinkState(enum.Enum):
    """Where a connection to one server stands. Losing it is fatal only once JOINED (or, with
    checkpoints on, starts partial recovery: RECOVERING until the replacement has what the lost
    server had, then JOINED again; ``client/recovery.py``)."""

    CONNECTING = "connecting"
    JOINED = "joined"
    RECOVERING = "recovering"
    LEFT = "left"  # the server left the job (its partitions moved): BYE sent, closing


class ServerLink:
    def __init__(self, index: int, address: str, counters: dict[str, Any], bucket: LeakyBucket | None) -> None:
        self.index = index
        self.address = address
        self.sock: LoopSocket | None = None  # set once the communication thread's loop runs
        self.monitor: LoopSocket | None = None  # tells of the connection's loss
        self.counters = counters  # the client's traffic counters (the communication thread's)
        self.bucket = bucket
        self.seq = 0  # number of the last message sent
        self.server_clock = 0
        self.save_s = 0.0  # the server's mean time to save a checkpoint, from SCLOCK "ts"
        self.state = LinkState.CONNECTING
        self.losses = 0  # times the server was lost and replaced
        self.said_bye = False  # our BYE was answered: its connection closing is no loss
        # updates: messages sent and acknowledged, the highest acknowledged number, bytes in flight,
        # and per unacknowledged one (number, send time, bytes) for the update latency
        self.incs_sent = 0
        self.incs_acked = 0
        self.acked_seq = 0
        self.inflight_bytes = 0
        self._inc_times: deque[tuple[int, float, int]] = deque()
        self.pending: dict[int, asyncio.Future] = {}  # requests by number, until answered
        self.window = FlushWindow(self)
        # Partial recovery (checkpoints on): what was sent since the server's newest checkpoint
        self.log: SentLog | None = None  # recovery.ResendLog

    def __repr__(self) -> str:
        return f"server {self.index} ({self.address})"

    def encode(self, header: dict[str, Any], *arrays: np.ndarray, owned: np.ndarray | None = None,
               frame: Any = None, lent: tuple[tuple[np.ndarray, Any], ...] = ()) -> tuple[list[Any], int]:
        """Number a message and encode it; returns its frames and size in bytes. Every byte is charged
        to the bucket (budgeted or not), so egress tracks the budget whatever the traffic mix. Arrays
        are copied into the message, except ``owned`` (one that is never written again), which goes
        as ``frame`` where it lives in one (a staged piece: ``bosen.bufferpool``); ``lent``: more such
        (array, frame or None) pairs (a FLUSH of several parts)."""
        self.seq += 1
        header["s"] = self.seq
        frames = wire.encode(header, *arrays, owned=owned, frame=frame, lent=lent)
        if self.log is not None:
            self.log.record(self.window.clock_sent, header, frames[1:])
        nbytes = len(frames[0])  # the header, then one frame per array
        for a in arrays:
            nbytes += a.nbytes
        c = self.counters
        c["msgs_sent"] += 1
        c["bytes_sent"] += nbytes
        if self.bucket is not None:
            self.bucket.charge(nbytes)
        return frames, nbytes

    def transmit(self, frames: list[Any]) -> None:
        assert self.sock is not None, "the communication thread has not started"
        self.sock.send(frames)

    def send(self, header: dict[str, Any], *arrays: np.ndarray, owned: np.ndarray | None = None,
             frame: Any = None) -> int:
        """Send one message now; returns its size in bytes."""
        frames, nbytes = self.encode(header, *arrays, owned=owned, frame=frame)
        self.transmit(frames)
        return nbytes

    def request(self, header: dict[str, Any], loop: asyncio.AbstractEventLoop) -> asyncio.Future:
        """Send a message whose answer (``rq`` = its number) completes the returned future."""
        fut = loop.create_future()
        self.pending[self.seq + 1] = fut
        self.send(header)  # numbered seq + 1
        return fut

    # -- updates and their acknowledgements ----------------------------------------------------

    def sent_update(self, nbytes: int) -> None:
        self._inc_times.append((self.seq, time.monotonic(), nbytes))
        self.inflight_bytes += nbytes
        self.incs_sent += 1

    def acked(self, through: int) -> tuple[int, float | None]:
        """Every update message up to number ``through`` is applied (acknowledgements are cumulative).
        Returns how many this settled, and the latency in ms of message ``through`` if it is one."""
        if through > self.acked_seq:
            self.acked_seq = through
        times = self._inc_times
        settled = 0
        latency = None
        while times and times[0][0] <= through:
            seq, t, nbytes = times.popleft()
            settled += 1
            self.inflight_bytes -= nbytes
            if seq == through:
                latency = (time.monotonic() - t) * 1000
        self.incs_acked += settled
        return settled, latency

    @property
    def unacked(self) -> int:
        return self.incs_sent - self.incs_acked

    @property
    def joined(self) -> bool:
        return self.state is not LinkState.CONNECTING

    @property
    def recovering(self) -> bool:
        """The server was lost: nothing goes to it until its replacement is back."""
        return self.state is LinkState.RECOVERING

    def reset_inflight(self) -> None:
        """Nothing sent so far is in flight any more: the lost server will never acknowledge it."""
        self.inflight_bytes = 0
        self._inc_times.clear()
        self.incs_acked = self.incs_sent
        self.acked_seq = self.seq

    def fail_requests(self, err: BaseException) -> None:
        """The connection is gone: nothing will answer what is pending."""
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(err)
