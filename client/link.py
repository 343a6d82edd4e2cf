"""``ServerLink``: the client's connection to one server, the counterpart of the server's ``Peer``.

It numbers the messages to its server (one FIFO socket each way), charges their bytes to the
client's bucket, and keeps what the server told us: its clock, the updates it acknowledged, the
requests waiting for an answer. Used on the communication thread only.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any

import numpy as np

from bosen import wire
from bosen.client.window import FlushWindow
from bosen.ratelimit import LeakyBucket
from bosen.zsocket import LoopSocket


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
        self.joined = False  # the server welcomed us: losing the connection now is fatal
        # updates: messages sent and acknowledged, the highest acknowledged number, bytes in flight,
        # and per unacknowledged one (number, send time, bytes) for the update latency
        self.incs_sent = 0
        self.incs_acked = 0
        self.acked_seq = 0
        self.inflight_bytes = 0
        self._inc_times: deque[tuple[int, float, int]] = deque()
        self.pending: dict[int, asyncio.Future] = {}  # requests by number, until answered
        self.window = FlushWindow(self)
        # Partial recovery (checkpoints on): every INC and CLOCK sent since the server's newest
        # checkpoint, as (the last clock sent before it, its header, its array frames), to resend to
        # a replacement that restarts from that checkpoint. ``log_floor``: the clock from which the
        # log is complete. ``recovering``: the server was lost; nothing goes to it until it is back.
        self.log: deque[tuple[int, dict[str, Any], list[Any]]] | None = None
        self.log_floor = 0
        self.recovering = False

    def __repr__(self) -> str:
        return f"server {self.index} ({self.address})"

    def encode(self, header: dict[str, Any], *arrays: np.ndarray, owned: np.ndarray | None = None,
               frame: Any = None) -> tuple[list[Any], int]:
        """Number a message and encode it; returns its frames and size in bytes. Every byte is charged
        to the bucket (budgeted or not), so egress tracks the budget whatever the traffic mix. Arrays
        are copied into the message, except ``owned`` (one that is never written again), which goes
        as ``frame`` where it lives in one (a staged piece: ``bosen.bufferpool``)."""
        self.seq += 1
        header["s"] = self.seq
        frames = wire.encode(header, *arrays, owned=owned, frame=frame)
        if self.log is not None and header["t"] in (wire.Msg.INC, wire.Msg.CLOCK):
            # the header itself: a flush window adds the clock to its pass's last message after this
            self.log.append((self.window.clock_sent, header, frames[1:]))
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

    def forget(self, durable: int) -> None:
        """The server's checkpoint at clock ``durable`` is on disk: what was sent before that clock
        went out is in it, and need not be kept for a replacement."""
        log = self.log
        if log is None or durable <= self.log_floor:
            return
        while log and log[0][0] < durable:
            log.popleft()
        self.log_floor = durable

    def resend(self, since: int) -> int:
        """Send again, in order and renumbered, what the log holds from clock ``since`` on (to a
        replacement restarted from its checkpoint at ``since``); the last update asks for an ACK.
        Returns the number of that update (0: none). Nothing sent before is counted in flight any
        more: the lost server will never acknowledge it."""
        assert self.log is not None
        self.inflight_bytes = 0
        self._inc_times.clear()
        self.incs_acked = self.incs_sent
        self.acked_seq = self.seq
        while self.log and self.log[0][0] < since:
            self.log.popleft()
        last_inc = 0
        entries = list(self.log)
        final = max((k for k, e in enumerate(entries) if e[1]["t"] == wire.Msg.INC), default=-1)
        for k, (_, header, payload) in enumerate(entries):
            self.seq += 1
            header["s"] = self.seq
            if k == final:
                header.pop("na", None)
                last_inc = self.seq
            frames = [wire.pack_header(header), *payload]
            nbytes = self._charge(frames)
            self.transmit(frames)
            if header["t"] == wire.Msg.INC:
                self.sent_update(nbytes)
        return last_inc

    def _charge(self, frames: list[Any]) -> int:
        """Count a resent message's bytes (header and arrays) as sent, and charge the bucket."""
        nbytes = sum(f.nbytes if isinstance(f, memoryview) else len(f) for f in frames)
        self.counters["msgs_sent"] += 1
        self.counters["bytes_sent"] += nbytes
        self.counters["bytes_resent"] += nbytes
        if self.bucket is not None:
            self.bucket.charge(nbytes)
        return nbytes

    def fail_requests(self, err: BaseException) -> None:
        """The connection is gone: nothing will answer what is pending."""
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(err)
