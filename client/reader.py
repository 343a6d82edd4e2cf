"""A worker thread's own sockets for blocking reads: READ out and ROWS back on the thread that waits.

A read through the communication thread crosses two threads more than the network needs: the worker
hands the request over, and is woken once the rows are in, each a wake-up that costs tens of
microseconds on a busy machine (a 1 MiB read took 1059 us that way against 720 direct). A worker
that is going to block anyway can make the round trip itself: one DEALER per server, registered as
a read connection of this client (HELLO with ``rd``) and used by this thread only. The server
answers there; pushes and everything else stay on the client's main connection. ROWS carry the
server's per-client message number (``ss``), so the cache keeps each row's newest whichever
connection it came on (``comm.apply_rows``).
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import zmq

from bosen import wire
from bosen.client.receive import decode
from bosen.errors import BosenError, ProtocolError, ServerError
from bosen.security import Security, client_socket
from bosen.wire import Msg
from bosen.zsocket import recv_frames, send_frames

CONNECT_POLL_MS = 50  # a read connection's HELLO is awaited in slices this long, checking ``interrupt``
# A received frame this large has a buffer of its own (ZeroMQ packs only messages under its 8 KiB
# receive batch into shared buffers), so an array over it can be handed to a caller without pinning
# other messages' memory.
OWN_BUFFER_BYTES = 64 << 10


class Reader:
    """One thread's read sockets, made on first use per server. Its thread holds ``lock`` while it
    reads; whoever closes it takes the lock first, so no socket is closed while in use."""

    def __init__(self, ctx: zmq.Context, addresses: list[str], rank: int, fingerprint: str,
                 security: Security | None = None) -> None:
        self._ctx = ctx
        self._security = security  # the client's CURVE keys (bosen/security.py); None: plaintext
        self._addresses = addresses
        self._rank = rank
        self._fp = fingerprint
        self._socks: list[zmq.Socket | None] = [None] * len(addresses)
        self._seq = [0] * len(addresses)
        self._rcvtimeo = [-1] * len(addresses)  # as last set: setting it costs microseconds per read
        self._token = f"r{os.getpid()}-{secrets.token_hex(8)}"  # unique across the job, like the main ones
        self._poller = zmq.Poller()
        self.lock = threading.Lock()
        # this thread's: traffic, rows received, reads made (client.stats() adds them up)
        self.counters = dict(bytes_sent=0, bytes_received=0, msgs_sent=0, msgs_received=0, rows_received=0,
                             direct_reads=0)

    def send_read(self, j: int, table: int, rows: np.ndarray, min_clock: int, timeout: float,
                  interrupt: Callable[[], None]) -> int:
        """Send READ of ``rows`` to server ``j``; returns its sequence number (the reply's ``rq``).
        ``interrupt`` is called while a new connection waits for its WELCOME, and may raise."""
        sock = self._socks[j] or self._connect(j, timeout, interrupt)
        self._seq[j] += 1
        frames = wire.encode({"t": Msg.READ, "tb": table, "n": int(rows.shape[0]), "c": min_clock,
                              "s": self._seq[j]}, ids := wire.wire_ids(rows))
        send_frames(sock, frames)
        self.counters["msgs_sent"] += 1
        self.counters["bytes_sent"] += len(frames[0]) + ids.nbytes
        return self._seq[j]

    def poll(self, servers: list[int], timeout: float) -> list[tuple[int, dict[str, Any], list[Any]]]:
        """Messages from ``servers`` that arrived within ``timeout`` seconds: (server, checked header,
        array frames). Waiting on one server is a plain blocking receive: no poller, one wake-up."""
        ms = max(0, int(timeout * 1000))
        if len(servers) == 1:
            j = servers[0]
            sock = self._socks[j]
            assert sock is not None, "poll() before send_read()"
            if self._rcvtimeo[j] != ms:
                sock.setsockopt(zmq.RCVTIMEO, ms)
                self._rcvtimeo[j] = ms
            try:
                return [self._decode(j, recv_frames(sock))]
            except zmq.Again:
                return []
        out = []
        for sock, _ in self._poller.poll(ms):
            j = self._socks.index(sock)
            while True:
                try:
                    out.append(self._decode(j, recv_frames(sock, zmq.NOBLOCK)))
                except zmq.Again:
                    break
        return out

    def _decode(self, j: int, frames: list[Any]) -> tuple[int, dict[str, Any], list[Any]]:
        self.counters["msgs_received"] += 1
        self.counters["bytes_received"] += sum(map(len, frames))
        h, arrays = decode(frames)
        return j, h, arrays

    def close(self) -> None:
        for i, sock in enumerate(self._socks):
            if sock is not None:
                sock.close(0)
                self._socks[i] = None

    def _connect(self, j: int, timeout: float, interrupt: Callable[[], None]) -> zmq.Socket:
        sock = client_socket(self._ctx, zmq.DEALER, self._security)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IDENTITY, f"{self._token}-{j}".encode())
        sock.connect(f"tcp://{self._addresses[j]}")
        self._seq[j] += 1
        sock.send_multipart(wire.encode({"t": Msg.HELLO, "rank": self._rank, "fp": self._fp, "rd": True,
                                         "s": self._seq[j]}))
        waited = 0
        while not sock.poll(CONNECT_POLL_MS):
            waited += CONNECT_POLL_MS
            try:
                interrupt()
            except BaseException:
                sock.close(0)
                raise
            if waited < timeout * 1000:
                continue
            sock.close(0)
            raise BosenError(f"no answer to a read connection's HELLO from server {j} at {self._addresses[j]} "
                             f"within {timeout:g}s (is it running?)")
        h = wire.decode_header(sock.recv_multipart()[0])
        if h["t"] == Msg.ERROR:
            sock.close(0)
            raise ServerError(f"server {j} ({self._addresses[j]}) refused a read connection: {h['m']}")
        if h["t"] != Msg.WELCOME:
            sock.close(0)
            raise ProtocolError(f"server {j}: {h['t'].name} in answer to a read connection's HELLO")
        self._socks[j] = sock
        self._rcvtimeo[j] = -1
        self._poller.register(sock, zmq.POLLIN)
        return sock
