"""bosen.phases: a thread's time per phase, nested phases taken out of the outer one."""

from __future__ import annotations

import time

import numpy as np

from bosen.client import Client
from bosen.jobs.job import job_config
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


def test_profile_times_each_threads_phases(bosen_cluster):
    """metrics.profile: the worker thread's read, buffer, clock and app phases, the communication
    thread's send (and receive, of pushed rows), each server's inc, read and push handling, wall and
    CPU; without it, none."""
    data = job_config([], 1, tables={"W": {"rows": 10, "cols": 4, "dtype": "int64"}}, staleness=0)
    data["metrics"] = {"profile": True}
    c = bosen_cluster(2, config=data)
    client = Client.connect(c.path)
    try:
        W = client.table("W")
        for _ in range(3):
            W.get_rows(np.arange(10))
            W.inc_rows(np.arange(10), np.ones((10, 4), np.int64))
            client.clock()
        W.get_rows(np.arange(10))  # waits for the last clock's rows: every phase has run
        s = client.stats()["phases"]
        assert {"read", "buffer", "clock", "app"} <= set(s["worker"]), s
        # counted from the end of the first clock(): the first tick is start-up
        assert s["worker"]["read"]["n"] == 3 and s["worker"]["buffer"]["n"] == 2 and s["worker"]["clock"]["n"] == 2
        assert s["worker"]["app"]["n"] == 2  # between clocks
        assert "send" in s["comm"], s  # "receive" only once a server pushes rows (reads answer the worker's socket)
        assert ("receive" in s["comm"]) == (client.stats()["rows_pushed_to_us"] > 0), s
        for v in (*s["worker"].values(), *s["comm"].values()):
            assert v["wall_s"] >= 0 and v["cpu_s"] >= 0
        for st in c.status():
            assert {"inc", "read", "push"} <= set(st["phases"]), st["phases"]  # a clock rides on the last INC
            assert st["phases"]["inc"]["n"] >= 3 and st["phases"]["inc"]["cpu_s"] > 0
    finally:
        client.close()
    plain = bosen_cluster(1, tables={"W": {"rows": 4, "cols": 2, "dtype": "int64"}})
    client = Client.connect(plain.path)
    try:
        client.table("W").get_rows(np.arange(4))
        assert "phases" not in client.stats() and "phases" not in plain.status()[0]
    finally:
        client.close()
