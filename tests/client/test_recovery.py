"""What a client keeps for a lost server's replacement (``ResendLog``): only INC and CLOCK, only since
the server's newest durable checkpoint, in order."""

from bosen.client.recovery import ResendLog
from bosen.wire import Msg


def entry(t: Msg, n: int) -> dict:
    return {"t": t, "s": n}


def test_only_updates_and_clocks_are_kept_in_order():
    log = ResendLog()
    log.record(0, entry(Msg.INC, 1), ["a"])
    log.record(0, entry(Msg.READ, 2), ["b"])
    log.record(0, entry(Msg.CLOCK, 3), [])
    log.record(1, entry(Msg.PUSH_ACK, 4), [])
    log.record(1, entry(Msg.INC, 5), ["c"])
    assert len(log) == 3
    assert [h["s"] for _, h, _ in log.since(0)] == [1, 3, 5]


def test_a_durable_checkpoint_drops_what_went_before_it_and_raises_the_floor():
    log = ResendLog()
    for clock, seq in [(0, 1), (1, 2), (2, 3), (2, 4), (3, 5)]:
        log.record(clock, entry(Msg.INC, seq), [])
    log.forget(2)
    assert log.floor == 2 and [h["s"] for _, h, _ in log.entries] == [3, 4, 5]
    log.forget(1)  # an older checkpoint changes nothing
    assert log.floor == 2 and len(log) == 3
    assert [h["s"] for _, h, _ in log.since(3)] == [5]  # a replacement restarted at clock 3
    assert len(log) == 1
