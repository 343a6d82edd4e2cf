"""Incremental reads: a worker's own array of some rows of a table, re-read only where they changed.

A worker that reads the same rows again and again (a mini-batch's rows every clock, a local model
every mini-batch) copies them from the cache each time, keeps a snapshot to subtract, and scatters
the difference into the update buffer and the cache: about five passes over rows that mostly did
not change. A ``RowView`` (``table.view(rows)``) keeps ``values`` (the worker's array) and ``base``
(the values as of its last refresh or push) and, per row, the cache's write stamp at its last copy
(``RowCache.stamp``):

- ``refresh()`` reads like ``get_rows`` (the same SSP rule, blocking, counters and probes) but
  copies only rows whose stamp moved; ``refresh(at)`` reads only the rows at positions ``at`` (one
  view over every row a worker touches, each mini-batch reading its own: what one mini-batch pushed
  the next does not copy again);
- ``push()`` adds ``values - base`` of the rows that changed to the update buffer and, with
  read-my-writes, to the cache, in one compiled pass (``rowmath.push_view``); a row nobody else
  wrote meanwhile takes the cache's new value and stamp, so the next refresh copies nothing.

``view.refresh(); compute on view.values; view.push()`` leaves the tables exactly as ``v =
get_rows(rows); compute on v; inc_rows(rows, v - v_as_read)`` does (tests/client/test_view.py).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class ViewOwner(Protocol):
    """The table a view reads and writes (``client/table.py``)."""

    def refresh_view(self, view: RowView, at: np.ndarray | None = None) -> int: ...

    def push_view(self, view: RowView, at: np.ndarray | None = None) -> int: ...


class RowView:
    """Rows ``rows`` (unique) of a table as the worker's own ``values`` array (len(rows) x cols).

    Change ``values`` in place and ``push()`` the changes before the next ``refresh()``: a refresh
    leaves rows that nobody wrote as they are, changes not pushed included. A view made with
    ``base=False`` only reads."""

    def __init__(self, owner: ViewOwner, rows: np.ndarray, cols: int, dtype: np.dtype, base: bool = True) -> None:
        self._owner = owner
        self.rows = rows
        self.slots = rows  # where the table keeps them: the rows, or their slots (client/slots.py)
        self.values = np.zeros((rows.shape[0], cols), dtype=dtype)
        # values as of the last refresh or push; a view without (``base=False``: read only) saves the
        # memory of a second copy (a refresh then writes its rows once)
        self.base = np.zeros((rows.shape[0], cols), dtype=dtype) if base else self.values
        self.seen = np.full(rows.shape[0], -1, dtype=np.int64)  # cache stamps at the last copy (-1: none)
        self.all = np.arange(rows.shape[0], dtype=np.int64)  # every position
        self.copied = 0  # rows the last refresh copied
        self.pushed = 0  # rows the last push added

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def refresh(self, at: np.ndarray | None = None) -> np.ndarray:
        """Read the rows as ``get_rows`` would (blocks until fresh enough for the worker's tick),
        copying only those written since this view last copied them; returns ``values``. ``at``:
        positions of the rows to read (``values[at]`` are then current), else all."""
        self.copied = self._owner.refresh_view(self, at)
        return self.values

    def push(self, at: np.ndarray | None = None) -> int:
        """Add ``values - base`` to the table (as ``inc_rows`` would), rows without a change left
        out; then ``base`` is ``values``. ``at``: positions of the rows to push (unique), else all.
        Returns how many rows were added."""
        self.pushed = self._owner.push_view(self, at)
        return self.pushed
