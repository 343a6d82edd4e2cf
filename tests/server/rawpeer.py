"""A hand-driven ZeroMQ DEALER for tests that speak the wire to a real server directly."""

from __future__ import annotations

import pytest
import zmq

from bosen import wire
from bosen.wire import Msg


class Raw:
    """A hand-driven DEALER connected to one server."""

    def __init__(self, ctx: zmq.Context, address: str) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(f"tcp://{address}")
        self.seq = 0

    def close(self) -> None:
        self.sock.close(0)

    def send_frames(self, frames) -> None:
        self.sock.send_multipart(frames)

    def send(self, header, *arrays, seq: int | None = None) -> int:
        if "s" not in header:
            if seq is None:
                self.seq += 1
                seq = self.seq
            header = {**header, "s": seq}
        self.send_frames(wire.encode(header, *arrays))
        return header["s"]

    def recv(self, timeout: float = 5.0) -> tuple[dict, list[bytes]]:
        if not self.sock.poll(int(timeout * 1000)):
            pytest.fail("no reply from the server")
        frames = self.sock.recv_multipart()
        return wire.decode_header(frames[0]), frames[1:]

    def silent(self, timeout: float = 0.3) -> bool:
        return not self.sock.poll(int(timeout * 1000))

    def expect_error(self, match: str, rq: int | None = None) -> str:
        h, _ = self.recv()
        assert h["t"] == Msg.ERROR, f"expected ERROR naming {match!r}, got {h}"
        if rq is not None:
            assert h["rq"] == rq, h
        assert match in h["m"], f"error text {h['m']!r} does not name {match!r}"
        return h["m"]

    def bad(self, match: str, header, *arrays) -> str:
        """Send one well-framed but bad message; expect an ERROR answering it."""
        s = self.send(header, *arrays)
        return self.expect_error(match, rq=s)

    def bad_frames(self, match: str, frames) -> str:
        self.send_frames(frames)
        return self.expect_error(match, rq=-1)
