"""Row versions a lost client held are released for it (server/holdings.py, Server._leave)."""

from __future__ import annotations

import signal

import numpy as np
import pytest
from conftest import WORKERS, wait_until

from bosen.client import Client
from bosen.server.holdings import Holdings, net


def test_net_keeps_what_was_sent_and_not_released() -> None:
    rows, versions = net(np.array([1, 1, 2, 3, 1]), np.array([5, 5, 2, 7, 5]), np.array([1, 1, 1, 1, -1.0]))
    assert sorted(zip(rows.tolist(), versions.tolist(), strict=True)) == [(1, 5), (2, 2), (3, 7)]


def test_holdings_compact_without_changing_the_balance() -> None:
    h = Holdings()
    rng = np.random.default_rng(0)
    for _ in range(300):
        rows = rng.integers(0, 50, 400)
        h.sent(rows, np.full(400, 3))
        h.released(rows, np.full(400, 3))
    h.sent(np.array([7, 7, 9]), np.array([4, 4, 0]))  # version 0 is no reference
    rows, versions = h.outstanding()
    assert rows.tolist() == [7, 7] and versions.tolist() == [4, 4]


def table_stats(c, name: str) -> list[dict]:
    return [s["tables"][name] for s in c.status(timeout=30)]


@pytest.mark.slow
@pytest.mark.parametrize("storage", ["dense", "sparse"])
def test_a_client_killed_without_bye_releases_its_row_versions(bosen_cluster, bosen_procs, storage: str) -> None:
    """Rank 0 updates (so rows have versions), rank 1 reads them all (holding a reference each) and
    is SIGKILLed: the servers notice the lost connection and release its references, and the job's
    clock goes on without it. (A sparse table's servers store the rows at rank 0's update.)"""
    rows = 12
    c = bosen_cluster(2, 2, staleness=0, read_timeout_s=30, tables={
        "V": {"rows": rows, "cols": 3, "dtype": "float32", "update": "adarevision", "storage": storage}})
    a = Client.connect(c.path, rank=0)
    try:
        V = a.table("V")
        V.inc_rows(np.arange(rows), np.ones((rows, 3), dtype=np.float32))  # never read: tagged version 0
        a.clock()
        a.server_status()  # a's update is applied: the rows have version 1
        b = bosen_procs.python("holder", WORKERS / "hold_worker.py", c.path, pipes=True)
        assert b.popen.stdout is not None and b.popen.stdout.readline().strip() == "ready", b.tail()
        assert wait_until(lambda: sum(t["versions_held"] for t in table_stats(c, "V")) == rows, timeout=10)
        b.popen.send_signal(signal.SIGKILL)
        b.popen.wait()
        assert wait_until(lambda: sum(t["versions_held"] for t in table_stats(c, "V")) == 0, timeout=10), \
            table_stats(c, "V")
        assert sum(s["clients_lost"] for s in c.status()) == 2
        a.clock()
        assert wait_until(lambda: min(a.stats()["server_clocks"]) >= 1, timeout=10)  # nobody waits for rank 1
    finally:
        a.close()
