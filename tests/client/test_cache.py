"""The row cache's clocks: a row's own clock and its server's last SCLOCK (an O(1) raise)."""

import numpy as np

from bosen.client.cache import RowCache


def test_row_cache_clock_is_the_later_of_row_and_server_clock():
    c = RowCache(6, 1, np.float32, num_servers=2)  # rows 0, 2, 4 on server 0; 1, 3, 5 on server 1
    c.clock[[0, 1, 2]] = [3, 1, 5]
    c.raise_clock(0, 4)
    c.raise_clock(1, 2)
    c.raise_clock(0, 2)  # clocks never go back
    assert c.fresh_clock(np.arange(6)).tolist() == [4, 2, 5, -1, -1, -1]
    assert c.min_clock(np.array([0, 1, 2])) == 2
    assert c.min_clock(np.array([0, 3])) == -1
    assert sorted(c.cached_clocks().tolist()) == [2, 4, 5]
    one = RowCache(3, 1, np.float32)
    one.clock[:] = [1, 7, 2]
    one.raise_clock(0, 5)
    assert one.min_clock(np.arange(3)) == 5 and one.min_clock(np.array([1])) == 7

