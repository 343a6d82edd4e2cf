"""Row ownership: round-robin, and rows grouped by server in their order."""

import numpy as np

from bosen.partition import Partition


def test_rows_by_server_keeps_order_and_skips_servers_without_rows():
    p = Partition(3)
    rows = np.array([7, 0, 3, 4, 10, 9], dtype=np.int64)
    got = [(j, r.tolist()) for j, r in p.rows_by_server(rows)]
    assert got == [(0, [0, 3, 9]), (1, [7, 4, 10])]  # server 2 owns none of them
    assert p.rows_by_server(np.zeros(0, np.int64)) == []


def test_rows_by_server_with_one_server_is_the_rows_themselves():
    rows = np.array([5, 1, 2], dtype=np.int64)
    ((j, got),) = Partition(1).rows_by_server(rows)
    assert j == 0 and got is rows
    assert Partition(1).rows_by_server(np.zeros(0, np.int64)) == []
