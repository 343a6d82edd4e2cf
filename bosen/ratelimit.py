"""The leaky bucket that paces budgeted sends (docs/design.md, "Managed communication").

Sending B bytes makes the next budgeted send wait B·8/budget seconds after the previous one's slot;
debt carries over, so a burst (an end-of-tick flush, which is never delayed) is paid back by waiting
before the next budgeted send. The average egress therefore tracks the budget whatever the mix.

A sender wakes up a little after its slot (timer granularity, a busy event loop). Lateness up to
``slack_s``, or up to the transmission time of the largest message charged so far if that is longer,
is credited rather than lost; otherwise every wake-up delay (and every small ack charged meanwhile)
would shave the rate. Longer idle time is not banked: an idle sender gains at most one large
message's worth of burst.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class LeakyBucket:
    def __init__(self, mbps: float, clock=time.monotonic, slack_s: float = 0.01) -> None:
        if mbps <= 0:
            raise ValueError("bandwidth budget must be > 0 Mbps")
        self.bytes_per_s = mbps * 1e6 / 8
        self.slack_s = slack_s
        self._credit = slack_s
        self._clock = clock
        self._free_at = clock()  # when the bucket is empty again
        self.bytes_charged = 0

    def charge(self, nbytes: int) -> None:
        """Account for ``nbytes`` just sent (budgeted or not)."""
        now = self._clock()
        duration = nbytes / self.bytes_per_s
        if duration > self._credit:
            self._credit = duration
        self._free_at = max(self._free_at, now - self._credit) + duration
        self.bytes_charged += nbytes

    def wait_s(self) -> float:
        """Seconds until a budgeted send is allowed (0 when the bucket is empty)."""
        return max(self._free_at - self._clock(), 0.0)

    def ready(self) -> bool:
        return self._free_at <= self._clock()


async def paced_sender(bucket: LeakyBucket, idle_s: float, window_full: Callable[[], bool],
                       send_once: Callable[[], int], counters: dict) -> None:
    """The budgeted-send loop both sides run (on their own event loop): whenever the bucket is
    empty and the unacked window is clear, ``send_once()`` (bytes sent; 0 = nothing to send, poll
    again after ``idle_s``). Counts ``window_paused_s`` and ``idle_polls`` in ``counters``."""
    while True:
        wait = bucket.wait_s()
        if wait > 0:
            await asyncio.sleep(wait)
            continue
        if window_full():  # too many unacknowledged messages: the network is overused
            t0 = time.monotonic()
            await asyncio.sleep(idle_s)
            counters["window_paused_s"] += time.monotonic() - t0
            continue
        if not send_once():
            counters["idle_polls"] += 1
            await asyncio.sleep(idle_s)
