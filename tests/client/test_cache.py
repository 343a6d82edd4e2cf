"""The row cache's clocks: a row's own clock and its server's last SCLOCK (an O(1) raise)."""

import numpy as np

from bosen.client.cache import RowCache
from bosen.partition import Partition

ONE = Partition(1)


def test_row_cache_clock_is_the_later_of_row_and_server_clock():
    two = Partition(2, 4)
    c = RowCache(6, 1, np.float32, two)  # rows 0, 2, 4 on server 0; 1, 3, 5 on server 1
    c.clock[[0, 1, 2]] = [3, 1, 5]
    c.raise_clock(0, 4, two)
    c.raise_clock(1, 2, two)
    c.raise_clock(0, 2, two)  # clocks never go back
    assert c.fresh_clock(np.arange(6)).tolist() == [4, 2, 5, -1, -1, -1]
    assert c.min_clock(np.array([0, 1, 2])) == 2
    assert c.min_clock(np.array([0, 3])) == -1
    assert sorted(c.cached_clocks().tolist()) == [2, 4, 5]
    one = RowCache(3, 1, np.float32)
    one.clock[:] = [1, 7, 2]
    one.raise_clock(0, 5, ONE)
    assert one.min_clock(np.arange(3)) == 5 and one.min_clock(np.array([1])) == 7


def test_a_moved_partition_takes_its_rows_clock_rule_to_its_new_server():
    """Partition 1 (rows 1, 5) moves from server 1 to server 0: server 0's clock messages raise those
    rows now, server 1's no longer; their message numbers start again and every row asked for is asked anew."""
    old = Partition(2, 4)
    c = RowCache(8, 1, np.float32, old)
    c.clock[:] = 0
    c.raise_clock(0, 3, old)
    c.raise_clock(1, 3, old)
    c.ss[[1, 5, 2]] = 7
    c.requested[[5, 6]] = True
    new = old.moved(np.array([0, 0, 0, 1]))
    c.moved(np.array([1]))
    assert c.ss.tolist() == [0, 0, 7, 0, 0, 0, 0, 0] and not c.requested.any()
    c.raise_clock(1, 5, new)
    assert c.fresh_clock(np.arange(8)).tolist() == [3, 3, 3, 5, 3, 3, 3, 5]
    c.raise_clock(0, 6, new)
    assert c.fresh_clock(np.arange(8)).tolist() == [6, 6, 6, 5, 6, 6, 6, 5]
    c.early[:] = True
    c.raise_clock(1, 7, new)  # a server's clock message clears the early marks of its rows only
    assert np.flatnonzero(~c.early).tolist() == [3, 7]



def test_claim_returns_each_row_to_ask_for_once_and_marks_it():
    c = RowCache(8, 1, np.float32)
    c.clock[1] = 0  # cached
    c.requested[2] = True  # someone asked already
    got = c.claim(np.array([5, 1, 2, 3, 5, 0], dtype=np.int64), 4)
    assert got.tolist() == [5, 3, 0]  # in order, duplicates once, cached and asked-for ones left out
    assert np.flatnonzero(c.requested).tolist() == [0, 2, 3, 5]
    assert c.claim(np.array([5, 3], dtype=np.int64), 4).shape == (0,)


def test_rows_no_server_pushes_are_claimed_again_once_too_old():
    """``push: false``: a server clock does not raise the rows, and a cached row older than the
    read's need is asked for again (a pushed table's would wait for the server's clock)."""
    c = RowCache(4, 1, np.float32, pushed=False)
    c.clock[:] = [3, 5, -1, 2]
    c.raise_clock(0, 9, ONE)
    assert c.min_clock(np.array([0, 1])) == 3
    assert c.claim(np.arange(4, dtype=np.int64), 4).tolist() == [0, 2, 3]
    pushed = RowCache(4, 1, np.float32)
    pushed.clock[:] = [3, 5, -1, 2]
    assert pushed.claim(np.arange(4, dtype=np.int64), 4).tolist() == [2]


def test_known_counts_rows_cached_or_asked_for():
    c = RowCache(8, 1, np.float32)
    c.clock[1] = 0
    c.requested[2] = True
    assert c.known(np.array([0, 1, 2, 3], dtype=np.int64)) == 2
    assert c.known(np.array([1, 2], dtype=np.int64)) == 2
    assert c.known(np.array([4, 5], dtype=np.int64)) == 0


def test_receive_run_records_a_run_only_if_no_row_has_a_newer_message():
    c = RowCache(8, 1, np.float32)
    c.requested[2:6] = True
    c.clock[3] = 9
    c.ss[4] = 6
    assert not c.receive_run(2, 4, 6, 5)  # row 4 came in message 6 already: change nothing
    assert c.requested[2:6].all() and c.ss[2:6].tolist() == [0, 0, 6, 0] and c.clock[2:6].tolist() == [-1, 9, -1, -1]
    assert c.receive_run(2, 4, 7, 5)
    assert not c.requested.any()
    assert c.ss[2:6].tolist() == [7] * 4 and c.clock[2:6].tolist() == [5, 9, 5, 5]  # clocks never go back


def test_read_fresh_copies_and_counts_only_when_every_row_is_fresh():
    two = Partition(2, 4)
    c = RowCache(6, 2, np.float32, two)  # rows 0, 2, 4 on server 0; 1, 3, 5 on server 1
    c.values[:] = np.arange(12, dtype=np.float32).reshape(6, 2)
    c.clock[[0, 1, 2, 3]] = [3, 0, 1, 2]
    c.raise_clock(1, 2, two)  # rows 1 and 3 of server 1: valid for clock 2 as cached rows
    c.early[1] = True
    rows = np.array([3, 0, 1, 0], dtype=np.int64)  # any order, repeats allowed
    out = np.full((4, 2), -1, np.float32)
    status, early, stale = c.read_fresh(rows, 2, 5, out)
    assert status == 0 and early == 1 and stale == (5 - 2) + (5 - 3) + (5 - 2) + (5 - 3)
    np.testing.assert_array_equal(out, c.values[rows])
    out[:] = 0  # a copy: the cache is untouched
    assert c.values[3, 1] == 7
    assert c.read_fresh(np.array([0, 2], dtype=np.int64), 2, 5, out[:2])[:2] == (2, 1)  # row 2: clock 1 < 2
    assert c.read_fresh(np.array([0, 4], dtype=np.int64), 0, 5, out[:2])[:2] == (2, 1)  # row 4: never received
    assert c.read_fresh(np.array([0, 6], dtype=np.int64), 0, 5, out[:2])[:2] == (1, 1)  # out of range
    assert c.read_fresh(np.array([-1], dtype=np.int64), 0, 5, out[:1])[:2] == (1, 0)


def test_refresh_copies_only_moved_rows_into_a_view_with_or_without_a_base():
    c = RowCache(5, 3, np.float32)
    c.clock[:] = 2
    c.values[:] = np.arange(15, dtype=np.float32).reshape(5, 3)
    rows, pos = np.array([4, 1, 3], dtype=np.int64), np.arange(3, dtype=np.int64)
    for with_base in (True, False):
        out = np.zeros((3, 3), np.float32)
        base = np.zeros_like(out) if with_base else out  # a read-only view: base is values
        seen = np.full(3, -1, dtype=np.int64)
        assert c.refresh_fresh(rows, pos, 2, 2, out, base, seen)[::3] == (0, 3)  # status 0, 3 rows copied
        np.testing.assert_array_equal(out, c.values[rows])
        np.testing.assert_array_equal(base, c.values[rows])
        out[:] = -1  # the worker's own changes, not pushed: rows nobody wrote stay as they are
        c.values[1] += 100
        c.touch(np.array([1]))
        assert c.refresh_fresh(rows, pos, 2, 2, out, base, seen)[3] == 1
        np.testing.assert_array_equal(out, [[-1] * 3, c.values[1], [-1] * 3])
        c.values[3] += 1
        c.touch(np.array([3]))
        assert c.copy_changed(rows, pos, out, base, seen) == 1
        np.testing.assert_array_equal(out[2], c.values[3])
        np.testing.assert_array_equal(base[2], c.values[3])
        np.testing.assert_array_equal(base[0], out[0] if not with_base else c.values[4])
