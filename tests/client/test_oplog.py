"""The update buffer: a run of clean rows is copied in, anything else scatter-added."""

import numpy as np

from bosen.client.oplog import UpdateBuffer


def test_update_buffer_adds_whatever_path_it_takes():
    """A run of clean rows is copied, anything else scatter-added; the sums are the same."""
    buf = UpdateBuffer(8, 2, np.dtype(np.float64))
    cache = np.zeros((8, 2))
    held = np.full(8, -1, dtype=np.int64)
    buf.add_dense(np.arange(2, 5), np.ones((3, 2)), cache, held)  # clean run, nothing held: copy
    buf.add_dense(np.arange(3, 6), np.ones((3, 2)), cache, held)  # run with dirty rows: add
    held[6] = 0
    buf.add_dense(np.arange(6, 8), np.full((2, 2), 2.0), cache, held)  # clean run, row 6 held: mirror
    buf.add_dense(np.array([0, 0]), np.ones((2, 2)))  # duplicates, not a run
    assert buf.delta[:, 0].tolist() == [2, 0, 1, 2, 2, 1, 2, 2]
    assert buf.dirty.tolist() == [True, False, True, True, True, True, True, True]
    assert cache[:, 0].tolist() == [0, 0, 0, 0, 0, 0, 2, 0]  # only the held row mirrors
