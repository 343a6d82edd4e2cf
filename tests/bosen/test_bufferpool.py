"""The buffer pool lends a buffer again only once nothing else references it (and, for buffers that
live in ZeroMQ messages, once the message that carried one is acknowledged)."""

import time

import numpy as np
import pytest
import zmq

from bosen.bufferpool import BufferPool
from bosen.jobs.cluster import free_ports


def test_a_buffer_is_lent_again_only_when_nothing_references_it():
    pool = BufferPool((4, 2), np.float32, keep=2)
    a = pool.take(4)
    b = pool.take(3)
    assert a.shape == (4, 2) and b.shape == (3, 2) and b.base is not a
    assert pool.take(4) is None  # both lent, none more may be made
    view = a[1:]
    del a
    assert pool.take(4) is None  # a view of the one lent first still lives
    del view
    c = pool.take(4)
    assert c is not None and pool.allocated == 2 and pool.reused == 1 and pool.refused == 2
    del b
    assert pool.take(1).shape == (1, 2) and pool.reused == 2


@pytest.fixture
def unheard():
    """(push, deliver): a PUSH socket whose peer is not listening yet, so what it sends waits in
    ZeroMQ; ``deliver()`` starts the peer and returns the one message as float32 values."""
    ctx = zmq.Context()
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    (port,) = free_ports(1)
    push.connect(f"tcp://127.0.0.1:{port}")

    def deliver() -> np.ndarray:
        pull.bind(f"tcp://127.0.0.1:{port}")
        assert pull.poll(10_000), "the queued message never arrived"
        return np.frombuffer(pull.recv(), dtype=np.float32)

    try:
        yield push, deliver
    finally:
        push.close(0)
        pull.close(0)
        ctx.term()


def test_a_message_in_flight_keeps_its_buffer(unheard):
    """A buffer sent without a copy stays lent until ZeroMQ lets go of it."""
    push, deliver = unheard
    pool = BufferPool((1024, 256), np.float32, keep=1)
    buf = pool.take(1024)
    buf[:] = 7
    push.send(np.ascontiguousarray(buf).data, copy=False, flags=zmq.NOBLOCK)
    del buf
    assert pool.take(1024) is None
    got = deliver()
    assert got.shape == (1024 * 256,) and (got == 7).all()
    again = None
    for _ in range(500):  # pyzmq's collector thread drops its reference soon after the send
        again = pool.take(1024)
        if again is not None:
            break
        time.sleep(0.01)
    assert again is not None and pool.reused == 1


def test_a_buffer_in_a_message_is_lent_again_once_its_carrier_is_acknowledged(unheard):
    """Frame mode: the buffer goes on the wire as its own ZeroMQ message (no copy, no collector
    thread); ZeroMQ's hold on it is invisible to reference counts, so the acknowledgement decides."""
    push, deliver = unheard
    acked = [0, 0]
    pool = BufferPool((1024, 256), np.float32, keep=1)
    pool.send_as_frames(acked)
    buf = pool.take(1024)
    frame = pool.frame(buf)
    assert frame is not None and pool.frame(buf[:10]) is None  # only a whole buffer is a message
    buf[:] = 7
    push.send(frame, copy=False, flags=zmq.NOBLOCK)
    pool.carried(buf, 1, 5)  # message 5 to receiver 1
    del buf, frame
    assert pool.take(1024) is None  # nothing references it, but message 5 is not acknowledged
    acked[0] = 9
    assert pool.take(1024) is None  # another receiver's acknowledgement says nothing
    got = deliver()
    assert got.shape == (1024 * 256,) and (got == 7).all()
    acked[1] = 5
    again = pool.take(1024)
    assert again is not None and pool.reused == 1 and pool.allocated == 1
    again[:] = 8  # written in place: the same message's memory
    assert (np.frombuffer(pool.frame(again), dtype=np.float32) == 8).all()
