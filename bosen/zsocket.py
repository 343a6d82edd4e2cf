"""A ZeroMQ socket served by the caller's asyncio event loop, without per-message futures.

pyzmq's asyncio sockets wrap every send and receive in a Future and re-arm poll events after each
one: tens of microseconds of Python per message, which dominated small messages and a 1 MiB fetch's
round trip. Here a reader callback drains the socket when its file descriptor fires, handing each
message to ``on_message`` synchronously, and a send is one non-blocking ``send_frames``.

ZeroMQ's descriptor is edge-triggered: it fires when the socket's state may have changed, and any
operation (a send, reading ``EVENTS`` too) may consume that edge. So after every send the socket's
``EVENTS`` are checked and a drain is scheduled if messages wait or queued sends can go; a drain that
stops at its batch limit reschedules itself (other tasks run in between). Sends that ZeroMQ refuses
for now (EAGAIN, which high-water marks of 0 make rare) wait in order in a queue flushed when the
socket becomes writable.

For sockets that both send and receive (DEALER, ROUTER). The socket's owner (one event loop thread)
is the only user: ZeroMQ sockets are not thread-safe.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq

DRAIN_BATCH = 32  # messages handled per drain before other tasks get a turn
# pyzmq types every ``getsockopt`` as ``int | bytes``; FD and EVENTS are int options. The ``type: ignore``
# comments below say so where narrowing would cost a call on every message.
# plain ints: pyzmq's constants are enum flags, and ``int & flag`` is Python-level enum arithmetic
# (about a microsecond, several times per message)
_POLLIN, _POLLOUT, _NOBLOCK, _SNDMORE = int(zmq.POLLIN), int(zmq.POLLOUT), int(zmq.NOBLOCK), int(zmq.SNDMORE)


def send_frames(sock: zmq.Socket, frames: list[Any], flags: int = 0) -> None:
    """``send_multipart(frames, flags, copy=False)`` without its per-call type checks and enum
    arithmetic (a third of its cost). Frames are bytes, zmq.Frame or buffers; buffers of 64 KiB and
    more go without a copy (pyzmq's threshold), smaller ones are copied."""
    more = _SNDMORE | flags
    for f in frames[:-1]:
        sock.send(f, more, copy=False)
    sock.send(frames[-1], flags, copy=False)


def recv_frames(sock: zmq.Socket, flags: int = 0) -> list[zmq.Frame]:
    """One multipart message, without copying: ``recv_multipart(copy=False)`` minus its option
    lookup per frame (a few microseconds on every message)."""
    frame = sock.recv(flags, copy=False)
    frames = [frame]
    while frame.more:
        frame = sock.recv(flags, copy=False)
        frames.append(frame)
    return frames


class LoopSocket:
    def __init__(self, sock: zmq.Socket, loop: asyncio.AbstractEventLoop,
                 on_message: Callable[[list[zmq.Frame]], None], after_batch: Callable[[], None] | None = None,
                 batch: int = DRAIN_BATCH) -> None:
        self.sock = sock
        self.loop = loop
        self.on_message = on_message
        self.after_batch = after_batch  # called after each drain that handled messages
        self.batch = batch
        self._pending: deque[list[Any]] = deque()
        self._scheduled = False
        self._draining = False  # in _drain, which reads EVENTS after every message anyway
        fd = sock.getsockopt(zmq.FD)
        assert isinstance(fd, int)
        self._fd = fd
        self._closed = False

    def start(self) -> None:
        self.loop.add_reader(self._fd, self._drain)
        self._schedule()  # messages may have arrived before the reader was added

    def send(self, frames: list[Any]) -> None:
        """Queue one multipart message (frames: bytes, buffers or zmq.Frame) for sending, in order.
        Errors other than EAGAIN (e.g. EHOSTUNREACH on a ROUTER) are raised to the caller."""
        if self._pending:
            self._pending.append(frames)
            return
        try:
            send_frames(self.sock, frames, _NOBLOCK)
        except zmq.Again:
            self._pending.append(frames)
        finally:  # a failed send may have consumed the descriptor's edge too
            if not self._draining:
                self._schedule_if_readable()

    def close(self, linger: int | None = None) -> None:
        if not self._closed:
            self._closed = True
            self.loop.remove_reader(self._fd)
            self.sock.close(linger)

    # -- internals -----------------------------------------------------------------------------

    def _schedule_if_readable(self) -> None:
        """Reading EVENTS may consume the descriptor's edge: whatever it reports must be acted on."""
        if not self._scheduled and self._wants_drain(self.sock.getsockopt(zmq.EVENTS)):  # type: ignore[arg-type]
            self._schedule()

    def _wants_drain(self, events: int) -> bool:
        return bool(events & _POLLIN or (self._pending and events & _POLLOUT))

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._scheduled = False
        if self._closed:
            return
        sock = self.sock
        handled = 0
        events = _POLLIN  # the descriptor fired: try once; after that, EVENTS says whether to go on
        self._draining = True
        try:
            while events & _POLLIN and handled < self.batch:
                try:
                    frames = recv_frames(sock, _NOBLOCK)
                except zmq.Again:
                    events = sock.getsockopt(zmq.EVENTS)  # type: ignore[assignment]
                    break
                handled += 1
                self.on_message(frames)
                if self._closed:
                    return
                events = sock.getsockopt(zmq.EVENTS)  # type: ignore[assignment]
        finally:
            self._draining = False
        if self._pending and events & _POLLOUT:
            self._flush_pending()
            events = sock.getsockopt(zmq.EVENTS)  # type: ignore[assignment]
        if self._wants_drain(events):
            self._schedule()  # batch limit reached, more arrived, or room for queued sends meanwhile
        if handled and self.after_batch is not None:
            self.after_batch()

    def _flush_pending(self) -> None:
        while self._pending:
            try:
                send_frames(self.sock, self._pending[0], _NOBLOCK)
            except zmq.Again:
                return
            self._pending.popleft()
