"""The flush window and the server link, without TCP: a link whose socket records what it transmits."""

import asyncio

import numpy as np
import pytest
import zmq

from bosen import wire
from bosen.client.link import ServerLink
from bosen.client.window import FlushWindow
from bosen.ratelimit import LeakyBucket
from bosen.wire import Msg

MIB = 1 << 20


class RecordingSocket:
    """Stands in for the link's LoopSocket: keeps every message it is given, in order."""

    def __init__(self) -> None:
        self.sent: list[list] = []

    def send(self, frames: list) -> None:
        self.sent.append(list(frames))

    def headers(self) -> list[dict]:
        return [wire.decode_header(f[0]) for f in self.sent]


def make_link(bucket: LeakyBucket | None = None) -> tuple[ServerLink, RecordingSocket]:
    counters = {"msgs_sent": 0, "bytes_sent": 0}
    link = ServerLink(1, "127.0.0.1:1", counters, bucket)
    sock = RecordingSocket()
    link.sock = sock  # type: ignore[assignment]
    return link, sock


def inc(nbytes: int) -> tuple[dict, np.ndarray, np.ndarray]:
    rows = nbytes // 1024
    header = {"t": Msg.INC, "tb": 0, "n": rows, "dt": "int64", "sp": False}
    return header, np.arange(rows), np.ones((rows, 128), np.int64)


def owing_window(rows: int, clock: int) -> tuple[FlushWindow, RecordingSocket]:
    """A window that owes its server ``rows`` rows of table 0 and then ``clock``."""
    link, sock = make_link()
    window = FlushWindow(link)
    window.owe(0, np.arange(rows))
    window.owe_clock(clock)
    return window, sock


def send_update(link: ServerLink, nbytes: int) -> None:
    """An update message of ``nbytes`` of values, sent at once and counted as in flight."""
    h, rows, vals = inc(nbytes)
    link.sent_update(link.send(h, rows, vals))


def test_link_numbers_counts_and_charges_every_message():
    bucket = LeakyBucket(1000)
    link, sock = make_link(bucket)
    n1 = link.send({"t": Msg.CLOCK, "c": 1})
    h, rows, vals = inc(MIB)
    n2 = link.send(h, rows, vals)
    assert [h["s"] for h in sock.headers()] == [1, 2] and link.seq == 2
    assert n2 == len(sock.sent[1][0]) + rows.nbytes + vals.nbytes
    assert link.counters == {"msgs_sent": 2, "bytes_sent": n1 + n2}
    assert bucket.bytes_charged == n1 + n2


def test_link_acknowledgements_are_cumulative_and_settle_bytes_in_flight():
    link, _ = make_link()
    for size in (100, 200, 300):
        send_update(link, size * 1024)
    assert link.unacked == 3 and link.inflight_bytes > 0
    settled, ms = link.acked(2)  # covers messages 1 and 2
    assert settled == 2 and ms is not None and ms >= 0
    assert link.unacked == 1 and link.acked_seq == 2
    assert link.acked(2) == (0, None), "an old ACK again settles nothing"
    settled, _ = link.acked(3)
    assert settled == 1 and link.inflight_bytes == 0 and link.unacked == 0


def test_link_requests_fail_when_the_connection_is_gone():
    loop = asyncio.new_event_loop()
    try:
        link, sock = make_link()
        fut = link.request({"t": Msg.STATUS}, loop)
        assert sock.headers()[0]["s"] in link.pending
        link.fail_requests(ConnectionError("gone"))
        with pytest.raises(ConnectionError, match="gone"):
            loop.run_until_complete(fut)
    finally:
        loop.close()


def test_a_pass_holds_back_its_latest_message_and_thins_acks():
    """Four 1 MiB updates with ACKs every 2 MiB: the 1st and 3rd carry "na", the 2nd asks; the 4th
    is held until close(), then asks for its ACK and carries the clock (nothing else was due)."""
    link, sock = make_link()
    window = FlushWindow(link, window_bytes=16 * MIB, ack_spacing=2 * MIB)
    window.owe_clock(7)
    window.start()
    for _ in range(4):
        h, rows, vals = inc(MIB)
        window.send(h, rows, vals)
    assert len(sock.sent) == 3, "the latest message is held back"
    window.close()
    hs = sock.headers()
    assert [h["s"] for h in hs] == [1, 2, 3, 4], "sent in number order"
    assert [bool(h.get("na")) for h in hs] == [True, False, True, False]
    assert [h.get("c") for h in hs] == [None, None, None, 7]
    assert not window.busy


def test_the_clock_waits_while_rows_are_due_and_goes_alone_when_nothing_is_held():
    window, sock = owing_window(3, clock=2)
    window.start()
    window.close()
    assert sock.sent == [] and window.busy, "rows still due: no clock yet"
    window.due.clear()
    window.start()
    window.close()
    assert [(h["t"], h["c"]) for h in sock.headers()] == [(Msg.CLOCK, 2)]
    assert not window.busy


def test_the_window_has_room_until_its_bytes_are_in_flight():
    link, _ = make_link()
    window = FlushWindow(link, window_bytes=2 * MIB)
    assert window.has_room()
    send_update(link, MIB)
    assert window.has_room()
    send_update(link, MIB)
    assert not window.has_room()
    link.acked(1)
    assert window.has_room()


def test_send_outside_a_pass_and_a_second_start_are_errors():
    link, _ = make_link()
    window = FlushWindow(link)
    h, rows, vals = inc(MIB)
    with pytest.raises(RuntimeError, match="outside a pass"):
        window.send(h, rows, vals)
    window.start()
    with pytest.raises(RuntimeError, match="already open"):
        window.start()


def test_abort_drops_the_held_message_and_everything_owed():
    window, sock = owing_window(3, clock=1)
    window.start()
    h, rows, vals = inc(MIB)
    window.send(h, rows, vals)
    window.abort()
    assert sock.sent == [] and not window.busy
    window.start()  # a new pass may begin after an abort
    window.close()
    assert sock.sent == []


def small(tb: int, rows: int) -> tuple[dict, np.ndarray, np.ndarray]:
    header = {"t": Msg.INC, "tb": tb, "n": rows, "dt": "int64", "sp": False}
    return header, np.arange(rows), np.ones((rows, 4), np.int64)


def test_a_tick_of_small_updates_to_several_tables_is_one_flush_message_with_the_clock():
    """Three tables' updates and the clock (with the checkpoint word and a read set) go as one FLUSH
    whose parts decode as the INCs they replace; its read set follows their frames."""
    link, sock = make_link()
    window = FlushWindow(link)
    window.owe_clock(4)
    window.checkpoint_clocks.add(4)
    window.owe_reads({1: (np.array([0, 5], np.int64), 100)})
    window.start()
    sent = [small(tb, 2 + tb) for tb in range(3)]
    for h, rows, vals in sent:
        assert window.ready() == 1, "every part goes in message 1"
        window.send(h, rows, vals)
    assert sock.sent == [], "held until the pass ends"
    window.close()
    assert len(sock.sent) == 1 and not window.busy and window.clock_sent == 4
    frames = sock.sent[0]
    h = wire.decode_header(frames[0])
    assert h["t"] == Msg.FLUSH and h["s"] == 1 and h["c"] == 4 and h["ck"] and "na" not in h
    wire.check_frames(h, len(frames) - 1)
    k = 0
    for part, (_, rows, vals) in zip(wire.flush_parts(h), sent, strict=True):
        nf = wire.part_frames(part)
        batch = wire.decode_update(part, [bytes(f) for f in frames[1 + k:1 + k + nf]], 4, np.dtype(np.int64))
        k += nf
        np.testing.assert_array_equal(batch.rows, rows)
        np.testing.assert_array_equal(batch.values, vals)
    reads = wire.read_set(h, [bytes(f) for f in frames[1 + k:]], [10, 100, 10])
    assert reads is not None and reads[1].tolist() == [0, 5] and reads[0].shape[0] == 0
    assert link.unacked == 1 and link.inflight_bytes > 0, "counted in flight as one update message"


def test_a_single_part_still_goes_as_an_inc_carrying_the_clock():
    link, sock = make_link()
    window = FlushWindow(link)
    window.owe_clock(2)
    window.start()
    window.send(*small(0, 3))
    window.close()
    (h,) = sock.headers()
    assert h["t"] == Msg.INC and h["c"] == 2 and h["n"] == 3 and "na" not in h


def test_a_full_message_goes_before_the_next_part_and_ready_says_its_number():
    """Parts gather until ``bundle_bytes``; ``ready`` sends the full message first, so the number it
    returns is the one the next part travels under (read-my-writes relies on it)."""
    link, sock = make_link()
    window = FlushWindow(link, bundle_bytes=100, ack_spacing=1 << 30)
    window.start()
    assert window.ready() == 1
    window.send(*small(0, 2))  # 16 + 64 bytes: room for more
    assert window.ready() == 1
    window.send(*small(1, 2))
    assert window.ready() == 2 and len(sock.sent) == 1, "full: message 1 went"
    window.send(*small(2, 2))
    window.close()
    hs = sock.headers()
    assert [(h["t"], h["s"], len(h.get("u", []))) for h in hs] == [(Msg.FLUSH, 1, 2), (Msg.INC, 2, 0)]
    assert hs[0].get("na") is True and "na" not in hs[1], "only the pass's last message asks for an ACK"


def test_a_lent_array_goes_without_a_copy_in_a_flush():
    link, sock = make_link()
    window = FlushWindow(link)
    window.start()
    h, rows, vals = small(0, 2000)  # 64 KB of values: above pyzmq's copy threshold
    frame = zmq.Frame(vals)
    window.send(h, rows, vals, owned=vals, frame=frame)
    window.send(*small(1, 2))
    window.close()
    frames = sock.sent[0]
    assert frames[2] is frame, "the part's own ZeroMQ message travels as it is"
