"""The leaky bucket: B bytes cost B·8/budget seconds, debt carries over."""

import pytest

from bosen.ratelimit import LeakyBucket


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_charge_sets_wait_from_budget():
    clk = FakeClock()
    b = LeakyBucket(8.0, clock=clk)  # 1 MB/s
    assert b.ready()
    b.charge(500_000)
    assert b.wait_s() == pytest.approx(0.5)
    clk.t += 0.5
    b.charge(500_000)
    assert b.wait_s() == pytest.approx(0.5)
    clk.t += 0.5
    assert b.ready()


def test_debt_carries_over():
    clk = FakeClock()
    b = LeakyBucket(8.0, clock=clk, slack_s=0.0)
    b.charge(100_000)
    clk.t += 0.05  # half way through the first message's slot
    b.charge(1_000_000)  # a big unbudgeted flush on top
    assert b.wait_s() == pytest.approx(1.05)
    clk.t += 0.55
    assert b.wait_s() == pytest.approx(0.5)


def test_idle_time_is_not_banked_beyond_one_message():
    """An idle bucket does not accumulate credit for a later burst: at most one message's time."""
    clk = FakeClock()
    b = LeakyBucket(8.0, clock=clk, slack_s=0.01)
    clk.t += 10
    b.charge(1_000)  # 1 ms of transmission: the 10 ms slack is the larger credit
    assert b.wait_s() == pytest.approx(0.0)
    b.charge(1_000_000)  # still bounded: 1 s message, credit at most 1 s, and it was mostly used
    assert b.wait_s() == pytest.approx(0.991)
    clk.t += 100
    b.charge(1_000_000)
    b.charge(1_000_000)  # two back to back after a long idle: the second one waits a full slot
    assert b.wait_s() == pytest.approx(1.0)


def test_small_charges_during_a_late_wakeup_do_not_forfeit_the_credit():
    clk = FakeClock()
    b = LeakyBucket(8.0, clock=clk, slack_s=0.0)
    for _ in range(10):  # 100 ms sends; the sender wakes 30 ms late, an ack goes out meanwhile
        b.charge(100_000)
        clk.t += b.wait_s() + 0.02
        b.charge(10)
        clk.t += 0.01
    assert b.wait_s() == pytest.approx(0.0)
    # 10 slots of 100 ms (+ 10 us of acks): the wake-up delays cost nothing
    assert b._free_at - 100.0 == pytest.approx(1.0001, abs=1e-6)


def test_late_wakeups_are_credited():
    clk = FakeClock()
    b = LeakyBucket(8.0, clock=clk, slack_s=0.01)
    for _ in range(100):  # each send's slot is 10 ms; the sender always wakes 2 ms late
        b.charge(10_000)
        clk.t += b.wait_s() + 0.002
    # 100 slots of 10 ms plus one final wake-up delay: the lateness did not cost throughput
    assert clk.t - 100.0 == pytest.approx(1.002, abs=1e-6)


def test_rejects_nonpositive_budget():
    with pytest.raises(ValueError):
        LeakyBucket(0)
