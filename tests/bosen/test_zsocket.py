"""LoopSocket: messages in order both ways, no lost wake-ups, and sends ZeroMQ refuses for now (EAGAIN)
queued and flushed in order once the peer reads again."""

import asyncio
import threading

import numpy as np
import pytest
import uvloop
import zmq

from bosen.zsocket import LoopSocket


def run(coro):
    loop = uvloop.new_event_loop()
    try:
        return loop.run_until_complete(asyncio.wait_for(coro, 30))
    finally:
        loop.close()


@pytest.mark.timeout(60)
def test_echo_in_order_with_sends_interleaved_with_receives():
    """A peer echoes every message; the loop side sends a burst, then one more after each echo it
    receives (a send inside the receive callback: the case where an edge can be consumed)."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    n = 2000
    stop = threading.Event()

    def echo():
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        while not stop.is_set():
            if poller.poll(50):
                router.send_multipart(router.recv_multipart())

    t = threading.Thread(target=echo)
    t.start()
    got: list[int] = []

    async def main():
        loop = asyncio.get_running_loop()
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(f"tcp://127.0.0.1:{port}")
        done = loop.create_future()
        sent = [0]

        def send_next():
            if sent[0] < n:
                payload = np.full(1000 if sent[0] % 7 else 100_000, sent[0], dtype=np.int32)
                ls.send([str(sent[0]).encode(), payload.data])
                sent[0] += 1

        def on_message(frames):
            got.append(int(frames[0].bytes))
            assert np.frombuffer(frames[1].buffer, dtype=np.int32)[0] == got[-1]
            send_next()
            if len(got) == n:
                done.set_result(None)

        ls = LoopSocket(dealer, loop, on_message, batch=8)
        ls.start()
        for _ in range(50):
            send_next()
        await done
        ls.close(linger=0)

    try:
        run(main())
    finally:
        stop.set()
        t.join()
        router.close(0)
        ctx.term()
    assert got == list(range(n))


@pytest.mark.timeout(60)
def test_sends_refused_for_now_wait_in_order_and_go_when_the_peer_reads():
    ctx = zmq.Context()
    pull = ctx.socket(zmq.DEALER)
    pull.setsockopt(zmq.RCVHWM, 1)
    pull.setsockopt(zmq.RCVBUF, 4096)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    n = 200
    payload = np.zeros(256 * 1024, dtype=np.uint8)  # 256 KiB: kernel buffers fill after a few

    async def main():
        loop = asyncio.get_running_loop()
        push = ctx.socket(zmq.DEALER)
        push.setsockopt(zmq.SNDHWM, 1)
        push.setsockopt(zmq.SNDBUF, 4096)
        push.connect(f"tcp://127.0.0.1:{port}")
        ls = LoopSocket(push, loop, lambda frames: None)
        ls.start()
        await asyncio.sleep(0.2)  # connected
        for i in range(n):
            ls.send([str(i).encode(), payload.data])
        queued = len(ls._pending)
        received = []
        while len(received) < n:  # read without blocking the loop, so the reader can flush the queue
            try:
                received.append(int(pull.recv_multipart(zmq.NOBLOCK)[0]))
            except zmq.Again:
                await asyncio.sleep(0.001)
        ls.close(linger=0)
        return queued, received

    try:
        queued, received = run(main())
    finally:
        pull.close(0)
        ctx.term()
    assert queued > 0, "the peer never pushed back: the test did not reach the EAGAIN path"
    assert received == list(range(n))


def test_recv_frames_returns_every_part_of_one_message_only():
    from bosen.zsocket import recv_frames

    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        port = a.bind_to_random_port("tcp://127.0.0.1")
        b.connect(f"tcp://127.0.0.1:{port}")
        big = np.arange(1 << 16, dtype=np.int64)
        b.send_multipart([b"h", b"", big])
        b.send(b"next")
        got = recv_frames(a)
        assert [bytes(f.buffer) for f in got[:2]] == [b"h", b""]
        np.testing.assert_array_equal(np.frombuffer(got[2].buffer, np.int64), big)
        assert [f.bytes for f in recv_frames(a)] == [b"next"]
        with pytest.raises(zmq.Again):
            recv_frames(a, zmq.NOBLOCK)
    finally:
        a.close(0)
        b.close(0)
        ctx.term()
