"""The update buffer (oplog): increments coalesced per row until they are sent.

A dense delta matrix the size of the table, touched lazily (untouched pages stay unallocated), plus a
dirty flag per row. Coalescing is a scatter-add; taking rows out for a send zeroes them in the same
pass.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from bosen import rowmath


class UpdateBuffer:
    def __init__(self, rows: int, cols: int, dtype: np.dtype) -> None:
        self.delta = np.zeros((rows, cols), dtype=dtype)
        self.dirty = np.zeros(rows, dtype=bool)

    def add_dense(self, rows: np.ndarray, deltas: np.ndarray, mirror: np.ndarray | None = None,
                  held: np.ndarray | None = None) -> None:
        """Buffer ``deltas``; with ``mirror`` (the cache, for read-my-writes) add them there too, in
        the same pass over the deltas, to the rows where ``held`` (the cache's row clocks) is >= 0."""
        index = rowmath.rows_index(rows)
        if (type(index) is slice and not self.dirty[index].any()
                and (mirror is None or (held[index] < 0).all())):
            # a run of clean rows (a clean row's delta is zero) and nothing to mirror: a plain copy,
            # which writes the buffer without reading it first
            self.delta[index] = deltas
        elif mirror is None:
            rowmath.add_rows(self.delta, rows, deltas)
        else:
            rowmath.scatter_add_pair(self.delta, mirror, rows, deltas, held)
        self.dirty[index] = True

    def add_coo(self, rows: np.ndarray, cols: np.ndarray, deltas: np.ndarray) -> None:
        rowmath.scatter_add_coo(self.delta, rows, cols, deltas)
        self.dirty[rows] = True

    def dirty_rows(self) -> np.ndarray:
        return np.flatnonzero(self.dirty)

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Remove and return the buffered deltas of ``rows``."""
        return self.take_counted(rows)[0]

    def take_counted(self, rows: np.ndarray) -> tuple[np.ndarray, int]:
        """Remove and return the buffered deltas of ``rows`` (a new array) and how many of them are
        non-zero (dense or sparse on the wire), in one pass."""
        self.dirty[rowmath.rows_index(rows)] = False
        return rowmath.take_and_clear(self.delta, rows)


class InflightLog:
    """Updates sent to one server that its values may not contain yet (read-my-writes).

    Each entry is (sequence number, sorted rows, deltas). A value from the server says which of our
    sequence numbers it has applied; older entries are dropped, newer ones are added back on top.
    """

    def __init__(self) -> None:
        self.entries: deque[tuple[int, np.ndarray, np.ndarray]] = deque()

    def add(self, seq: int, rows: np.ndarray, deltas: np.ndarray) -> None:
        self.entries.append((seq, rows, deltas))

    def settle(self, applied: int) -> None:
        while self.entries and self.entries[0][0] <= applied:
            self.entries.popleft()

    def reapply(self, dst: np.ndarray, rows: np.ndarray) -> None:
        for _, erows, deltas in self.entries:
            pos = np.searchsorted(erows, rows)
            pos[pos == erows.shape[0]] = 0
            hit = erows[pos] == rows
            if hit.any():
                rowmath.scatter_add(dst, rows[hit], deltas[pos[hit]])

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes + d.nbytes for _, r, d in self.entries)
