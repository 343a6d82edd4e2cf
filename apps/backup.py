"""A worker's side of a table with backup workers (DBW; docs/design.md, "Backup workers").

Each iteration a worker reads w_t, sends its gradient of w_t and clocks. Its tick must name the
iteration it computes on, since the servers take a gradient as one of tick t (the CLOCK that ends the
tick completes it). A worker whose last gradient was dropped, or that fell behind, reads a newer
iteration than its tick: it first clocks, with no gradient, up to that iteration.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from bosen.apps.protocol import PSClient


class ClockedTable(Protocol):
    """A table whose reads say which clock (here: iteration) each value is of (``bosen.client.Table``)."""

    def get_rows_clocked(self, rows: Any) -> tuple[np.ndarray, np.ndarray]: ...


class TickingClient(Protocol):
    """A client whose tick the worker can see (``bosen.client.Client``)."""

    @property
    def tick(self) -> int: ...

    def clock(self) -> None: ...


def is_backup(client: PSClient, table: str) -> bool:
    """Whether ``table`` has backup workers (the client's config says; a stand-in client: no)."""
    lookup = getattr(client.config, "table", None)
    return callable(lookup) and getattr(lookup(table), "backup", None) is not None


def read_iteration(client: TickingClient, table: ClockedTable, rows: np.ndarray,
                   on_clock: Callable[[], bool] | None = None,
                   skipping: Callable[[int], None] | None = None) -> tuple[np.ndarray, int]:
    """Rows of w_t for this worker's tick or later, and t; the tick is moved up to t (clocks with no
    gradient), so what the worker sends next is a gradient of iteration t. With several servers a
    table's rows may be at different iterations: t is the oldest (the others drop this gradient as late).
    ``on_clock`` is called after each of those clocks, as after any (a clock boundary where the job's
    workers change: ``bosen scale``); False from it (the worker left the job there) stops the clocks.
    ``skipping(i)`` is called before the clock that passes iteration i, where a step would have done
    its work before its clock (a replacement drawing the mini-batch its lost process drew, so that a
    checkpoint part it writes at that clock holds the state after the draw)."""
    values, it = read_iterations(client, [(table, rows)], on_clock, skipping)
    return values[0], it


def read_iterations(client: TickingClient, reads: Sequence[tuple[ClockedTable, np.ndarray]],
                    on_clock: Callable[[], bool] | None = None,
                    skipping: Callable[[int], None] | None = None) -> tuple[list[np.ndarray], int]:
    """``read_iteration`` over several synchronous tables at once (a model's dense table and one probe
    row per partition of each embedding table, ``PSModule``): each read for this worker's tick or
    later, t the oldest iteration of any row read, the tick moved up to t. Every server of every table
    is then at t or later before the worker computes, so its gradient is never ahead of one, and it
    skips an iteration only where every server has passed it (no server waits for it in vain)."""
    values: list[np.ndarray] = []
    oldest: int | None = None
    for table, rows in reads:
        table.get_rows_clocked(rows)
        # a read that waited returns the bound it waited for; the rows are cached now: their own clocks
        v, clocks = table.get_rows_clocked(rows)
        values.append(v)
        if clocks.shape[0]:
            oldest = int(clocks.min()) if oldest is None else min(oldest, int(clocks.min()))
    it = client.tick if oldest is None else oldest
    while client.tick < it:
        if skipping is not None:
            skipping(client.tick)
        client.clock()
        if on_clock is not None and not on_clock():
            break
    return values, it
