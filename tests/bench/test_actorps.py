"""bench.actorps (the plain PS workload beside a Ray actor PS): its window arithmetic, its exactness
check, and a short run of our side (real servers and worker processes)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from bench.actorps import __main__ as actorps
from bench.actorps.loop import DELTA, Window, Workload


def test_draws_are_distinct_rows_fresh_each_iteration_and_seeded_per_worker():
    wl = Workload(rows=1000, cols=4, rows_per_iter=100, seed=1)
    a, b = wl.draws(0), wl.draws(0)
    first, second = a(), a()
    assert np.unique(first).size == 100 and first.min() >= 0 and first.max() < 1000
    assert not np.array_equal(first, second)
    assert np.array_equal(first, b())  # same seed and rank: same stream
    assert not np.array_equal(first, wl.draws(1)())
    dense = Workload(rows=8, cols=4, rows_per_iter=8, seed=1).draws(0)()
    assert np.array_equal(dense, np.arange(8))


def test_window_counts_only_iterations_that_end_inside_it():
    t0 = time.time() + 0.05
    win = Window(t0, t0 + 0.1)
    win.run([lambda: time.sleep(0.01)] * 4)
    assert win.total > win.iterations > 0
    assert win.first_end is not None and win.last_end is not None
    assert t0 <= win.first_end < win.last_end <= t0 + 0.1
    r = win.result()
    assert r["it_per_s"] == pytest.approx(win.iterations / (win.last_end - win.first_end))
    assert r["phase_wall_us"]["read"] >= 8000  # the second phase slept 10 ms each iteration


def test_finish_fails_when_an_increment_is_lost():
    wl = Workload(rows=10, cols=4, rows_per_iter=10, seed=0)
    done = [{"rows_incremented": 30, "it_per_s": 5.0}, {"rows_incremented": 20, "it_per_s": 5.0}]
    exact = 50 * 4 * float(DELTA)
    assert actorps.finish(wl, done, exact, {}, {}, 1.0)["it_per_s"] == 10.0
    with pytest.raises(AssertionError, match="increments lost or doubled"):
        actorps.finish(wl, done, exact - 4 * float(DELTA), {}, {}, 1.0)


@pytest.mark.slow
@pytest.mark.parametrize(("staleness", "rows_per_iter"), [(0, 100), (2, 100), (0, 64), (2, 64)])
def test_ours_runs_two_workers_and_every_increment_arrives(tmp_path, staleness, rows_per_iter):
    # 100 of 2000 rows: get_rows of a fresh draw; 64 of 64 (dense): a view refreshed every iteration
    rows = 2000 if rows_per_iter == 100 else 64
    wl = Workload(rows=rows, cols=8, rows_per_iter=rows_per_iter, seed=3)
    r = actorps.run_ours(wl, staleness, 1, warmup=0.5, window=1.0, work=tmp_path)  # checks the table's sum
    assert r["it_per_s"] > 0
    assert len(r["workers"]) == 2 and all(w["iterations"] > 0 for w in r["workers"])
    assert r["cpu_us_per_iteration"].get("bosen.server", 0) > 0
