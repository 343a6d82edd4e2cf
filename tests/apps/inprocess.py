"""An in-process stand-in for the PS client, to test an app's worker loop without servers.

One worker, exact reads (every read sees every increment at once, no staleness), tables as numpy
arrays. It implements ``bosen.apps.protocol.PSClient`` (test_protocol.py checks), and it records what
the app did: the rows of every ``get_rows``, the number of ``inc_rows`` calls, every report, the clocks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class _Config:
    source: str


class InProcessTable:
    """A table held in one numpy array; reads must ask for unique sorted int64 rows, as apps do."""

    def __init__(self, name: str, rows: int, cols: int, dtype: str = "float32", data: np.ndarray | None = None,
                 staleness: int = 2, update: str = "add") -> None:
        self.name, self.rows, self.cols, self.dtype = name, rows, cols, np.dtype(dtype)
        self.staleness, self.update = staleness, update
        self.data = np.zeros((rows, cols), self.dtype) if data is None else data
        self.reads: list[np.ndarray] = []  # the rows of every get_rows call
        self.incs = 0  # inc_rows calls

    def get(self, row: int, col: int) -> Any:
        return self.data[row, col].item()

    def get_row(self, row: int) -> np.ndarray:
        return self.data[row].copy()

    def get_rows(self, rows: Any, ahead: int = 0) -> np.ndarray:
        assert rows.dtype == np.int64 and np.all(np.diff(rows) > 0)  # unique, sorted
        self.reads.append(rows)
        return self.data[rows].copy()

    def inc(self, row: int, col: int, delta: Any) -> None:
        self.data[row, col] += delta

    def inc_row(self, row: int, deltas: Any) -> None:
        self.data[row] += deltas

    def view(self, rows: Any, base: bool = True) -> InProcessView:
        return InProcessView(self, np.asarray(rows, dtype=np.int64))

    def send_rows(self, rows: Any) -> None:
        """Updates apply at once here: nothing is buffered."""

    def inc_rows(self, rows: Any, deltas: Any, cols: Any = None) -> None:
        self.incs += 1
        if cols is None:
            np.add.at(self.data, rows, deltas)
        else:
            assert rows.shape == cols.shape == deltas.shape
            np.add.at(self.data, (rows, cols), deltas)


class InProcessView:
    """``PSView`` over an ``InProcessTable``: a refresh is a ``get_rows`` (recorded), a push an
    ``inc_rows`` of the changes."""

    def __init__(self, table: InProcessTable, rows: np.ndarray) -> None:
        self.table, self.rows = table, rows
        self.values = np.zeros((rows.shape[0], table.cols), table.dtype)
        self.base = self.values.copy()

    def refresh(self, at: np.ndarray | None = None) -> np.ndarray:
        at = np.arange(self.rows.shape[0]) if at is None else np.asarray(at, dtype=np.int64)
        got = self.table.get_rows(self.rows[at])
        self.values[at] = got
        self.base[at] = got
        return self.values

    def push(self, at: np.ndarray | None = None) -> int:
        at = np.arange(self.rows.shape[0]) if at is None else np.asarray(at, dtype=np.int64)
        changed = at[(self.values[at] != self.base[at]).any(axis=1)]
        self.table.inc_rows(self.rows[changed], (self.values - self.base)[changed])
        self.base[changed] = self.values[changed]
        return int(changed.shape[0])


class InProcessClient:
    """The client of worker ``rank`` of ``num_workers`` over the given tables (shareable between
    clients, so workers run one after the other on one model)."""

    def __init__(self, *tables: InProcessTable, rank: int = 0, num_workers: int = 1,
                 source: str = "fake.yaml") -> None:
        self.tables = {t.name: t for t in tables}
        self.rank, self.num_workers = rank, num_workers
        self.config = _Config(source)
        self.clocks = 0
        self.reports: list[dict[str, Any]] = []
        self.provider: Callable[[], Mapping[str, np.ndarray]] | None = None
        self.restored: dict[str, np.ndarray] | None = None

    def table(self, name: str) -> InProcessTable:
        if name not in self.tables:
            raise KeyError(f"no table {name!r}")
        return self.tables[name]

    def clock(self) -> None:
        self.clocks += 1

    def end_clocks(self) -> None:
        """One process, no servers: nobody waits for its clock."""

    def report(self, **fields: Any) -> dict[str, Any]:
        rec = {"clock": self.clocks, **fields}
        self.reports.append(rec)
        return rec

    def stats(self) -> dict[str, Any]:
        return {"clocks": self.clocks, "reports": len(self.reports)}

    def checkpoint_state(self, provider: Callable[[], Mapping[str, np.ndarray]]) -> None:
        self.provider = provider  # the stand-in makes no checkpoints; tests may call it

    def restored_state(self) -> dict[str, np.ndarray] | None:
        return self.restored

    @contextlib.contextmanager
    def worker(self) -> Iterator[InProcessClient]:
        """The stand-in has one worker: extra worker threads share its tables and clock."""
        yield self
