"""``DeviceRowCache``: hot embedding rows kept on the model's device, reused within the SSP bound.

A ``PSEmbedding`` reads its batch's distinct rows through the client each step: on a GPU every row
crosses the host (a ``get_rows`` into a host array, then a copy to the device), even when the batch
repeats the ids of the last one, as Zipf-distributed categorical features do. This cache keeps up to
``capacity`` rows on the device with, per row, the clock its value is valid for (it holds every update
of every tick below that clock, as ``RowCache.clock`` in docs/design.md, "Consistency"). A row is
served from here only while that clock is at least the worker's tick minus the table's staleness:
the rule the client's own cache applies, so a read from here is never staler than one through the
client. Rows that miss, or are too old, are read in one ``get_rows`` of the client.

The clock of a row read through the client is a lower bound: where the client's cache serves the
read, the clock of each value copied, taken under the same lock (``Table.get_rows_clocked``); else
the bound the read itself waited for (tick - staleness). Own updates: on a read-my-writes table (plain ``add``)
``add`` applies the pushed delta to the cached copy, as the client does to its cache, so the worker
sees its writes at once. On a table whose stored procedure transforms the update on the server (sgd,
adagrad, ...) the client's copy does not show the worker's own step before the server's answer either;
the device copy is then simply not reused past its clock, which is the same guarantee.
Versioned tables (AdaRevision) are refused by ``PSModule``: an update carries the version of the
client's copy of its row, and a device copy may be older than that.

Everything is torch ops on index tensors (one sorted id tensor, ``searchsorted`` to find slots,
``topk`` for the least recently used victims): no Python per row, on any device.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from bosen.apps.protocol import PSTable
from bosen.config import UNBOUNDED

# the sorted id of an empty slot: past every id a table takes ([0, 2**63 - 1))
_EMPTY = UNBOUNDED

# fetch(ids on the host) -> (their rows, on any device; the clock each row's value is valid for)
Fetch = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def fetch_through(table: PSTable, need: Callable[[], int]) -> Fetch:
    """A ``Fetch`` reading rows through the client's ``table`` (one ``get_rows``), each with the clock
    its value is valid for: ``Table.get_rows_clocked``'s (the clocks of a read served from the
    client's cache, taken with the values), else ``need()``, the bound the read itself waits for."""
    clocked = getattr(table, "get_rows_clocked", None)

    def fetch(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keys = ids.numpy()
        if clocked is not None:
            values, clocks = clocked(keys)
        else:
            values, clocks = table.get_rows(keys), np.full(keys.shape[0], need(), np.int64)
        return torch.from_numpy(values), torch.from_numpy(clocks)
    return fetch


class DeviceRowCache:
    """At most ``capacity`` rows of ``dim`` values on ``device``, least recently used evicted.

    Counters: ``hits`` (rows served from here), ``misses`` (rows read through the client: never
    cached, evicted, or older than the bound; ``stale`` of them were here but too old), and
    ``bytes_saved`` (the row bytes that did not cross the host because of a hit).
    """

    def __init__(self, capacity: int, dim: int, dtype: torch.dtype, device: torch.device) -> None:
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"device cache: capacity must be a positive integer, got {capacity!r}")
        self.capacity = capacity
        self.dim = dim
        self.device = device
        i64 = torch.int64
        self.ids = torch.full((capacity,), -1, dtype=i64, device=device)  # per slot, -1: empty
        # per slot, and one scratch entry past the last, where writes for rows without a slot go (so
        # that a read needs no boolean masks): the values, the clock they are valid for, the last
        # step that read the slot (0: never)
        self._values = torch.zeros((capacity + 1, dim), dtype=dtype, device=device)
        self._clock = torch.full((capacity + 1,), -1, dtype=i64, device=device)
        self._used = torch.zeros((capacity + 1,), dtype=i64, device=device)
        self.values, self.clock, self.used = self._values[:capacity], self._clock[:capacity], self._used[:capacity]
        self._sorted = torch.full((capacity,), _EMPTY, dtype=i64, device=device)  # slots' ids, ascending
        self._order = torch.arange(capacity, dtype=i64, device=device)  # the slot of each sorted position
        self._row_bytes = dim * self.values.element_size()
        self.step = 0
        self.hits = 0
        self.misses = 0
        self.stale = 0

    @property
    def bytes_saved(self) -> int:
        return self.hits * self._row_bytes

    def __len__(self) -> int:
        return int((self.ids >= 0).sum())

    def find(self, rows: torch.Tensor) -> torch.Tensor:
        """The slot of each of ``rows`` (on the device), -1 where none holds it."""
        pos = torch.searchsorted(self._sorted, rows).clamp_(max=self.capacity - 1)
        return torch.where(self._sorted[pos] == rows, self._order[pos], -1)

    def valid(self, rows: torch.Tensor, need: int) -> torch.Tensor:
        """Whether each of ``rows`` is held with a value valid for clock ``need``."""
        slot = self.find(rows)
        return (slot >= 0) & (self.clock[slot.clamp(min=0)] >= need)

    def read(self, rows: torch.Tensor, need: int, fetch: Fetch) -> torch.Tensor:
        """The values of distinct ``rows`` (on the device) as a new tensor: held rows valid for clock
        ``need`` from here, the others through ``fetch`` in one call (and kept, evicting the least
        recently used rows this read does not use)."""
        self.step += 1
        count = int(rows.shape[0])
        slot = self.find(rows)
        held = slot >= 0
        fresh = held & (self._clock[slot.clamp(min=0)] >= need)
        # every held row is used by this read (the scratch entry takes the others' writes)
        self._used[torch.where(held, slot, self.capacity)] = self.step
        out = self.values.index_select(0, slot.clamp(min=0))
        miss = (~fresh).nonzero().squeeze(1)
        n = int(miss.shape[0])  # the one wait for the device of a read that only hits
        self.hits += count - n
        self.misses += n
        if n:
            n_held = int(held.sum())
            self.stale += n_held - (count - n)
            ids = rows[miss]
            values, clocks = fetch(ids.cpu())
            values = values.to(self.device, non_blocking=True)
            clocks = clocks.to(self.device, non_blocking=True)
            out.index_copy_(0, miss, values)
            self._store(ids, slot[miss], values, clocks, self.capacity - n_held)
        return out

    def add(self, rows: torch.Tensor, deltas: torch.Tensor) -> None:
        """The worker pushed ``deltas`` to ``rows`` of a read-my-writes table: its cached copies show
        them, as the client's cache does (rows not held are left alone)."""
        rows = rows.to(self.device)
        slot = self.find(rows)
        held = slot >= 0
        self.values.index_add_(0, slot[held], deltas.to(self.device, self.values.dtype)[held])

    def clear(self) -> None:
        """Forget every row (e.g. the table's values were replaced)."""
        self.ids.fill_(-1)
        self.clock.fill_(-1)
        self.used.zero_()
        self._sorted.fill_(_EMPTY)
        self._order = torch.arange(self.capacity, dtype=torch.int64, device=self.device)

    def _store(self, ids: torch.Tensor, slot: torch.Tensor, values: torch.Tensor, clocks: torch.Tensor,
               room: int) -> None:
        """Keep the rows just read: in their own slot where held (too old), else in the least recently
        used of the ``room`` slots this read did not use; rows beyond that room are not kept."""
        held = slot >= 0
        at = torch.where(held, slot, self.capacity)  # the not held ones write the scratch row
        self._values[at] = values
        self._clock[at] = clocks
        new = (~held).nonzero().squeeze(1)
        k = min(int(new.shape[0]), room)
        if k:
            victims = torch.topk(self.used, k, largest=False).indices  # empty slots (0) first
            take = new[:k]
            self.ids[victims] = ids[take]
            self.values[victims] = values[take]
            self.clock[victims] = clocks[take]
            self.used[victims] = self.step
            self._sorted, self._order = torch.sort(torch.where(self.ids >= 0, self.ids, _EMPTY))
