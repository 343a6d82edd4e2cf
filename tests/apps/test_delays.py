"""bosen.apps.delays: the start barrier a bench's workers wait at before their first round trip."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from bosen.apps.delays import DelayArgs, Delays


def test_the_first_round_trip_begins_at_the_start_barrier(tmp_path: Path):
    start = tmp_path / "start"
    d = Delays(DelayArgs(mean_s=0.05, alpha=0.0, start_file=str(start)), rank=0, workers=2)
    opened = threading.Timer(0.2, start.touch)
    t0 = time.perf_counter()
    opened.start()
    try:
        d.wait(0, since=t0 - 10.0)  # a round trip long over: without the barrier it would not sleep
    finally:
        opened.cancel()
    assert start.exists() and time.perf_counter() - t0 >= 0.2 + 0.05  # the barrier, then a whole round trip
    t1 = time.perf_counter()
    d.wait(1, since=t1 - 10.0)  # later round trips do not wait for it again
    assert time.perf_counter() - t1 < 5.0
    assert Delays(DelayArgs(), rank=0, workers=2).begun  # no start_file: no barrier
