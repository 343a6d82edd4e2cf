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



def rows_state(rows=6, cols=2, servers=1):
    from bosen import config as config_mod
    from bosen.client.table import TableState

    cfg = config_mod.load({"cluster": {"workers": 1, "servers": [f"127.0.0.1:{9000 + i}" for i in range(servers)]},
                           "tables": {"W": {"rows": rows, "cols": cols, "dtype": "int64"}}})
    return TableState(0, cfg.tables[0], 0, servers, cfg.comm)


def test_a_row_keeps_the_newest_of_the_servers_messages_whatever_the_arrival_order():
    """A client's ROWS come on its main and its read connections: a reply overtaken by a later push
    must not put older values back (the server numbers its ROWS to a client: ``ss``)."""
    from bosen.client.comm import apply_rows

    st = rows_state()
    push = {"c": 3, "a": -1, "ss": 7}
    reply = {"c": 2, "a": -1, "ss": 5}
    apply_rows(st, 0, push, np.array([1, 2]), np.full((2, 2), 30, np.int64))
    apply_rows(st, 0, reply, np.array([0, 1, 2, 3]), np.full((4, 2), 20, np.int64))
    assert st.cache.values[:, 0].tolist() == [20, 30, 30, 20, 0, 0]
    assert st.cache.clock.tolist() == [2, 3, 3, 2, -1, -1]
    assert st.cache.ss.tolist() == [5, 7, 7, 5, 0, 0]
    assert not st.cache.requested.any()


def test_a_pinned_in_flight_log_keeps_what_a_slower_answer_needs():
    """Read-my-writes with a direct read outstanding: a push saying updates up to 5 are applied must
    not drop the entries the read's answer (which may say only 3) must re-apply."""
    from bosen.client.comm import apply_rows

    st = rows_state()
    log = st.inflight[0]
    log.settle(3)
    floor = log.pin()
    assert floor == 3
    for seq in (4, 5, 6):
        log.add(seq, np.array([0]), np.full((1, 2), seq, np.int64))
    apply_rows(st, 0, {"c": 1, "a": 5, "ss": 2}, np.array([1]), np.zeros((1, 2), np.int64))  # a push, row 1
    assert [e[0] for e in log.entries] == [4, 5, 6]  # kept: pinned at 3
    # the read's answer for row 0 says only 3 is applied: 4, 5 and 6 go back on top
    apply_rows(st, 0, {"c": 1, "a": 3, "ss": 1}, np.array([0]), np.full((1, 2), 100, np.int64))
    assert st.cache.values[0, 0] == 100 + 4 + 5 + 6
    log.unpin(floor)
    log.settle(5)
    assert [e[0] for e in log.entries] == [6]
    # an answer saying 5 re-applies only what came after it
    st.cache.ss[0] = 0
    apply_rows(st, 0, {"c": 1, "a": 5, "ss": 3}, np.array([0]), np.full((1, 2), 100, np.int64))
    assert st.cache.values[0, 0] == 106


def test_claim_returns_each_row_to_ask_for_once_and_marks_it():
    c = RowCache(8, 1, np.float32)
    c.clock[1] = 0  # cached
    c.requested[2] = True  # someone asked already
    got = c.claim(np.array([5, 1, 2, 3, 5, 0], dtype=np.int64))
    assert got.tolist() == [5, 3, 0]  # in order, duplicates once, cached and asked-for ones left out
    assert np.flatnonzero(c.requested).tolist() == [0, 2, 3, 5]
    assert c.claim(np.array([5, 3], dtype=np.int64)).shape == (0,)


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


def test_apply_rows_says_whether_the_cache_took_the_values_as_they_came():
    """A direct read hands the received array to the caller only when the cache holds exactly it:
    not when buffered or in-flight updates went on top, nor for a run a newer message overlaps."""
    from bosen.client.comm import apply_rows

    st = rows_state(rows=8)
    vals = np.arange(8, dtype=np.int64).reshape(4, 2)
    assert apply_rows(st, 0, {"c": 1, "a": -1, "ss": 1}, np.arange(4), vals)
    assert st.cache.values[:4].tolist() == vals.tolist()
    st.oplog.add_dense(np.array([5]), np.ones((1, 2), np.int64))  # buffered, not sent
    assert not apply_rows(st, 0, {"c": 1, "a": -1, "ss": 2}, np.arange(4, 8), vals)
    assert st.cache.values[5].tolist() == [3, 4]
    st.inflight[0].add(4, np.array([6]), np.ones((1, 2), np.int64))  # sent, not yet in the values
    assert not apply_rows(st, 0, {"c": 1, "a": 3, "ss": 3}, np.arange(6, 8), vals[:2])
    assert st.cache.values[6].tolist() == [1, 2]
    assert not apply_rows(st, 0, {"c": 1, "a": 4, "ss": 1}, np.arange(2), vals[:2])  # older than what it has
    assert apply_rows(st, 0, {"c": 1, "a": 4, "ss": 4}, np.array([1, 3]), vals[:2]) is False  # not a run
