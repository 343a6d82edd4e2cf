"""The lost worker's updates a replacement takes back (server/undo.py)."""

from __future__ import annotations

import numpy as np

from bosen.server.undo import UndoLog
from bosen.wire import UpdateBatch


def batch(rows: list[int], v: float) -> UpdateBatch:
    return UpdateBatch(np.array(rows, dtype=np.int64), np.full((len(rows), 2), v, dtype=np.float32))


def test_a_rank_s_updates_since_a_clock_come_back_negated_and_leave_the_log():
    log = UndoLog()
    log.record(0, 3, 0, batch([1, 2], 1.0))
    log.record(1, 4, 0, batch([5], 7.0))
    log.record(0, 4, 1, batch([3], 2.0))
    log.record(0, 6, 0, batch([4], 3.0))
    back = log.take_since(0, 4)
    assert back is not None
    assert [(c, t, b.rows.tolist(), b.values[:, 0].tolist()) for c, t, b in back] == [(4, 1, [3], [-2.0]),
                                                                                      (6, 0, [4], [-3.0])]
    assert log.take_since(0, 4) == []  # taken once
    assert [b.rows.tolist() for _, _, b in log.take_since(0, 0) or []] == [[1, 2]]  # the older one stayed
    assert [b.values[0, 0] for _, _, b in log.take_since(1, 0) or []] == [-7.0]  # another rank's, its own


def test_a_log_trimmed_past_a_clock_cannot_take_back_from_it():
    log = UndoLog()
    for c in range(6):
        log.record(0, c, 0, batch([c], 1.0))
    log.trim(3)
    assert log.take_since(0, 2) is None  # updates of ticks 2 are gone: the caller knows it cannot
    back = log.take_since(0, 3)
    assert back is not None and [b.rows.tolist() for _, _, b in back] == [[3], [4], [5]]
    assert log.nbytes == 0


def test_its_reach_is_the_clock_its_values_start_from_or_its_floor_if_newer():
    """STATUS ``take_back_from``: a server restored from its part of clock 20 holds the ticks below 20
    in its values, so a replacement from 10 is not taken back whole; trimmed past 20, from there."""
    log = UndoLog(20)
    assert log.reach == 20
    log.trim(10)
    assert log.reach == 20
    log.trim(30)
    assert log.reach == 30
    assert UndoLog().reach == 0


def test_after_a_partition_move_it_takes_back_only_from_past_the_clients_clocks_then():
    """A move gave rows away and brought others logged elsewhere: what was logged before goes, and a
    replacement from before the move's clocks is not taken back whole here (reach)."""
    log = UndoLog(0)
    log.record(0, 20, 0, batch([3], 1.0))
    log.moved(27)
    assert log.reach == 27 and log.nbytes == 0
    log.record(0, 27, 0, batch([4], 1.0))
    back = log.take_since(0, 20)
    assert back is not None and [b.rows.tolist() for _, _, b in back] == [[4]]  # the move's updates stay
    log.moved(5)
    assert log.reach == 27  # never falls
