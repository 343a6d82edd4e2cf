"""Subscriptions that lapse (``tables.X.lapse``): a reader that stops reading rows stops getting their
pushes, forgets them, and reads exact values when it reads them again. Real servers, two clients."""

from __future__ import annotations

import numpy as np
import pytest

from bosen.client import Client


@pytest.mark.timeout(120)
@pytest.mark.parametrize("storage", ["dense", "sparse"])
def test_rows_not_read_for_lapse_clocks_are_no_longer_pushed_and_read_exactly_again(bosen_cluster, storage):
    """BSP, 2 servers, lapse 2: a writer adds 1 to each of 20 rows per tick; a reader reads rows 0-9
    for 4 ticks, then only rows 0-4 for 8 ticks (rows 5-9 lapse: the servers say so and push them no
    more), then all 20 rows. Every value read is exact for BSP (it holds every tick before the
    reader's and at most the writer's current one): a lapsed row whose cached value were still taken
    as fresh would read 4 ticks old."""
    rows = 20
    c = bosen_cluster(2, workers=2, staleness=0, read_timeout_s=20,
                      tables={"W": {"rows": rows, "cols": 1, "dtype": "int64", "lapse": 2, "storage": storage}})
    writer, reader = Client.connect(c.path, rank=0), Client.connect(c.path, rank=1)
    try:
        W, R = writer.table("W"), reader.table("W")
        ones = np.ones((rows, 1), np.int64)
        pushed = []

        def tick(t: int, read: np.ndarray) -> None:
            W.inc_rows(np.arange(rows), ones)
            writer.clock()
            got = R.get_rows(read)[:, 0]
            assert ((got >= t) & (got <= t + 1)).all(), (t, read, got)
            reader.clock()
            pushed.append(reader.stats()["rows_pushed_to_us"])

        for t in range(4):
            tick(t, np.arange(10))
        for t in range(4, 12):
            tick(t, np.arange(5))
        lapsed = reader.stats()["rows_lapsed"]
        assert lapsed == 5, lapsed  # rows 5-9, each once (rows 10-19 were never read)
        assert sum(s["rows_lapsed"] for s in c.status()) == 5
        # once lapsed, a tick's pushes carry rows 0-4 only (before: rows 0-9); pushes arrive as they
        # come, so a tick's may be counted at the next one
        per_tick = np.diff(pushed)
        # (10 rows a tick would be 40 in these 4 ticks, 5 rows 20)
        assert per_tick[-4:].sum() <= 4 * 5 + 5, per_tick
        for t in range(12, 15):
            tick(t, np.arange(rows))
        assert reader.stats()["rows_lapsed"] == 5
    finally:
        writer.close()
        reader.close()
    c.check()
