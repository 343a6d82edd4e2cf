"""What an app may use of a parameter-server client: the types every app's ``train()`` takes.

An app's worker loop is written against these protocols, not against ``bosen.client.Client``, so
that it names exactly what it relies on and runs unchanged on anything that provides it: the real
client (tests/apps/test_protocol.py checks that ``Client`` satisfies them, with mypy and at run
time) or an in-process stand-in that tests a worker loop without servers. They are
``runtime_checkable``, so ``isinstance`` checks that the members exist (not their signatures).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

import numpy as np

from bosen.errors import ConfigError

__all__ = ["PSView", "PSTable", "PSWorker", "PSClient", "JobConfig", "require_table"]


@runtime_checkable
class PSView(Protocol):
    """Rows a worker reads again and again (``table.view(rows)``, client/view.py): ``values`` is the
    worker's own array; ``refresh()`` re-reads (copying only rows that changed), ``push()`` adds
    ``values`` minus what the last refresh or push left there; ``at``: only the rows at those
    positions (unique) of the view's rows."""

    values: np.ndarray

    def refresh(self, at: np.ndarray | None = None) -> np.ndarray: ...
    def push(self, at: np.ndarray | None = None) -> int: ...


@runtime_checkable
class PSTable(Protocol):
    """A worker's handle on one shared table (``client.table(name)``); see docs/app-contract.md."""

    @property
    def name(self) -> str: ...
    @property
    def rows(self) -> int: ...
    @property
    def cols(self) -> int: ...
    @property
    def dtype(self) -> np.dtype: ...
    @property
    def staleness(self) -> int:
        """The table's SSP bound: reads at tick c see every update of ticks < c - staleness."""
    @property
    def update(self) -> str:
        """The table's stored procedure (``add``, ``sgd``, ``adagrad``, ``adarevision``, ...)."""

    def get(self, row: int, col: int) -> Any: ...
    def get_row(self, row: int) -> np.ndarray: ...
    def get_rows(self, rows: Any, ahead: int = 0) -> np.ndarray:
        """Copies of ``rows``; ``ahead``: as fresh as a read that many ticks later needs (at most this tick's)."""
    def inc(self, row: int, col: int, delta: Any) -> None: ...
    def inc_row(self, row: int, deltas: Any) -> None: ...
    def inc_rows(self, rows: Any, deltas: Any, cols: Any = None) -> None: ...
    def send_rows(self, rows: Any) -> None:
        """Send these rows' buffered updates now, before the clock (a partial flush; SSP unchanged)."""
    def view(self, rows: Any, base: bool = True) -> PSView: ...


@runtime_checkable
class PSWorker(Protocol):
    """One more worker thread of the process (``with client.worker() as w``): own tables, own clock."""

    def table(self, name: str) -> PSTable: ...
    def clock(self) -> None: ...


@runtime_checkable
class JobConfig(Protocol):
    """The part of the job's configuration an app may read: where it came from, for messages."""

    @property
    def source(self) -> str: ...


@runtime_checkable
class PSClient(Protocol):
    """A worker process's connection to the job, as ``train(client, args)`` receives it."""

    @property
    def rank(self) -> int:
        """This process's worker rank, 0..num_workers-1."""
    @property
    def num_workers(self) -> int: ...
    @property
    def config(self) -> JobConfig: ...

    def table(self, name: str) -> PSTable:
        """The main worker's handle on a table declared in the config; KeyError if there is none."""
    def clock(self) -> None:
        """End of the main worker's tick."""
    def end_clocks(self) -> None:
        """No more clocks from this process, which stays in the job until closed (a scale-in's leaver
        waiting to leave): the others are not held back by it meanwhile."""
    def report(self, **fields: Any) -> Any:
        """One metrics record for the current tick (additive fields; see docs/app-contract.md)."""
    def stats(self) -> dict[str, Any]: ...
    def worker(self) -> AbstractContextManager[PSWorker]: ...
    def checkpoint_state(self, provider: Callable[[], Mapping[str, np.ndarray]]) -> None:
        """What this process saves at each checkpoint (``provider()``, called at the boundary)."""
    def restored_state(self) -> dict[str, np.ndarray] | None:
        """The arrays saved by this rank in the checkpoint the job resumed from; None if it did not."""


def require_table(client: PSClient, name: str, need: str) -> PSTable:
    """``client.table(name)``, or a ConfigError naming the config and what the app needs (``need``)."""
    try:
        return client.table(name)
    except KeyError:
        raise ConfigError(f"{client.config.source}: {need}; table {name} is missing") from None
