"""The stored-procedure interface: how a server table turns incoming updates into new values.

A procedure is chosen per table in YAML (``update: add`` or ``update: mypkg.rules:MyRule`` with
``update_args``). The server calls its hooks; everything is vectorized over rows. ``add`` is the
default and the only one that lets clients show their own updates before the server has applied
them (read-my-writes), because only plain addition commutes with the cache's local copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bosen.config import TableConfig
from bosen.wire import UpdateBatch


class StoredProcedure:
    """Base class; the default behaviour is plain addition."""

    #: whether a client may apply its own updates to its cache (only true for plain addition)
    read_my_writes: bool = True

    def __init__(self, table: TableConfig, **args: Any) -> None:
        if args:
            raise TypeError(f"unexpected update_args: {', '.join(sorted(args))}")
        self.table = table

    def create(self, global_rows: np.ndarray, values: np.ndarray) -> None:
        """Rows were created with their initial values (may adjust them or allocate state)."""

    def apply(self, values: np.ndarray, local_rows: np.ndarray, batch: UpdateBatch, client: int) -> None:
        """Apply one client's batch to ``values`` (local row indices already checked)."""
        from bosen import rowmath  # local: keeps numba out of config-only imports

        upd = batch.values if batch.values.dtype == values.dtype else batch.values.astype(values.dtype)
        if batch.sparse:
            rowmath.scatter_add_csr(values, local_rows, batch.indptr, batch.cols, upd)
        else:
            rowmath.scatter_add(values, local_rows, upd)

    def rows_sent(self, local_rows: np.ndarray, num_clients: int) -> None:
        """These rows' current values were sent to ``num_clients`` clients."""

    def allow_push(self) -> bool:
        """Whether budgeted (early) pushes may go out now."""
        return True

    def stats(self) -> dict[str, Any]:
        return {}
