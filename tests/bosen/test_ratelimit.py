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
    assert b.ready()


def test_debt_carries_over():
    clk = FakeClock()
    b = LeakyBucket(8.0, clock=clk)
    b.charge(1_000_000)  # a big unbudgeted flush
    b.charge(1_000_000)
    assert b.wait_s() == pytest.approx(2.0)
    clk.t += 1.5
    assert b.wait_s() == pytest.approx(0.5)


def test_idle_time_is_not_banked_beyond_the_slack():
    """An idle bucket does not accumulate credit for a later burst (only the wake-up slack)."""
    clk = FakeClock()
    b = LeakyBucket(8.0, clock=clk, slack_s=0.01)
    clk.t += 10
    b.charge(1_000_000)
    assert b.wait_s() == pytest.approx(0.99)


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
