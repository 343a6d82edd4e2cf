"""bosen.phases: a thread's time per phase, nested phases taken out of the outer one."""

from __future__ import annotations

import time

from bosen.phases import Phases, merge


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_nested_phase_is_taken_out_of_the_outer_one():
    ph = Phases()
    outer = ph.start()
    _spin(0.02)
    inner = ph.start()
    _spin(0.03)
    ph.stop("inner", inner)
    time.sleep(0.03)  # waiting: wall, not CPU
    ph.stop("outer", outer)
    s = ph.stats()
    assert s["inner"]["n"] == 1 and s["outer"]["n"] == 1
    assert 0.03 <= s["inner"]["cpu_s"] < 0.045
    assert 0.02 <= s["outer"]["cpu_s"] < 0.03  # its own spin only, not the inner one's
    assert s["outer"]["wall_s"] >= 0.05 > s["outer"]["cpu_s"] + 0.02  # the sleep shows as wall above CPU


def test_merge_adds_threads():
    a, b = Phases(), Phases()
    for ph in (a, b, b):
        ph.stop("read", ph.start())
    m = merge([a.stats(), b.stats(), {}])
    assert m["read"]["n"] == 3 and m["read"]["wall_s"] >= 0
