"""The receive path: a server's rows applied to the cache whichever connection brought them."""

import numpy as np


def rows_state(rows=6, cols=2, servers=1):
    from bosen import config as config_mod
    from bosen.client.state import TableState

    cfg = config_mod.load({"cluster": {"workers": 1, "servers": [f"127.0.0.1:{9000 + i}" for i in range(servers)]},
                           "tables": {"W": {"rows": rows, "cols": cols, "dtype": "int64"}}})
    return TableState(0, cfg.tables[0], 0, servers, cfg.comm)


def test_a_row_keeps_the_newest_of_the_servers_messages_whatever_the_arrival_order():
    """A client's ROWS come on its main and its read connections: a reply overtaken by a later push
    must not put older values back (the server numbers its ROWS to a client: ``ss``)."""
    from bosen.client.receive import apply_rows

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
    from bosen.client.receive import apply_rows

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


def test_apply_rows_says_whether_the_cache_took_the_values_as_they_came():
    """A direct read hands the received array to the caller only when the cache holds exactly it:
    not when buffered or in-flight updates went on top, nor for a run a newer message overlaps."""
    from bosen.client.receive import apply_rows

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


def test_a_push_of_a_row_evicted_and_touched_again_keeps_the_updates_sent_meanwhile():
    """A bounded cache (``cache_rows``) evicts a row the server still pushes (subscriptions stay). An
    increment makes the row again (not cached, not asked for) and goes out; a push the server sent
    before that update arrived, applied now, must get it back on top: the in-flight log keeps it."""
    from bosen import config as config_mod
    from bosen.client import encode
    from bosen.client.receive import apply_rows
    from bosen.client.state import TableState

    # managed communication: reads go on the main connection, behind the updates sent before them
    cfg = config_mod.load({"cluster": {"workers": 1, "servers": ["127.0.0.1:9000"]}, "comm": {"enabled": True},
                           "tables": {"W": {"rows": 12, "cols": 2, "dtype": "int64", "storage": "sparse",
                                            "cache_rows": 4}}})
    st = TableState(0, cfg.tables[0], 0, 1, cfg.comm)
    assert not st.direct_reads
    # rows 0-3 read (subscribed) and cached; row 3, the least recently used, evicted for row 4
    slots = st.to_slots(np.arange(4))
    apply_rows(st, 0, {"c": 1, "a": -1, "ss": 1}, slots, np.full((4, 2), 10, np.int64))
    st.to_slots(np.arange(3))
    st.to_slots(np.array([4]))
    assert st.evicted > 0 and st.lookup(np.array([3]))[0] < 0
    # an increment of row 3 makes it again, as never received; the flush sends it as message 7
    s3 = st.to_slots(np.array([3]))
    st.oplog.add_dense(s3, np.full((1, 2), 5, np.int64), st.cache.values, st.cache.clock)
    update, _ = encode.take_chunk(st, s3, 0, 0, 7)
    assert update is not None and not st.oplog.dirty[s3].any()
    # a push of row 3 that the server sent before it applied message 7 (a = 6): own update on top
    apply_rows(st, 0, {"c": 2, "a": 6, "ss": 2}, s3, np.full((1, 2), 10, np.int64))
    assert st.cache.values[s3[0]].tolist() == [15, 15]
    # and the row is not evicted while the update is in flight
    assert st._referenced()[s3[0]]
