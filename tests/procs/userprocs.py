"""A user-defined stored procedure, loaded by import path (``update: userprocs:ScaledAdd``).

Tests put this folder on PYTHONPATH for the server processes.
"""

from __future__ import annotations

from typing import Any

from bosen import rowmath
from bosen.procedure import StoredProcedure


class ScaledAdd(StoredProcedure):
    """x ← x + scale·δ, with a count of applied rows in the server's stats."""

    read_my_writes = False  # the cache cannot mirror the scaling
    float_only = True

    def __init__(self, table, scale: float = 1.0) -> None:
        super().__init__(table)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise ValueError(f"scale must be a number, got {scale!r}")
        self.scale = float(scale)
        self.applied = 0

    def apply(self, values, local_rows, batch, client) -> None:
        upd = batch.values.astype(values.dtype) * values.dtype.type(self.scale)
        if batch.sparse:
            rowmath.scatter_add_csr(values, local_rows, batch.indptr, batch.cols, upd)
        else:
            rowmath.scatter_add(values, local_rows, upd)
        self.applied += int(local_rows.shape[0])

    def stats(self) -> dict[str, Any]:
        return {"procedure": "ScaledAdd", "scale": self.scale, "applied_rows": self.applied}


class NotAProcedure:
    """Not a StoredProcedure subclass: loading it must fail with a clear message."""
