"""``update: adagrad``: per-coordinate AdaGrad on the server. Clients send raw gradients g.

Per coordinate: z ← z + g², x ← x − α/√z · g, with z starting at ``init_z`` (1, as AdaRevision's
z and z', so that AdaRevision with no delay equals this rule exactly).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from bosen.config import TableConfig
from bosen.procedure import StoredProcedure
from bosen.server.procedures.common import gradients, positive
from bosen.wire import UpdateBatch


@njit(nogil=True, cache=True)
def adagrad_dense(x, z, rows, g, alpha):  # pragma: no cover - compiled
    for i in range(rows.shape[0]):
        r = rows[i]
        for j in range(x.shape[1]):
            gj = np.float64(g[i, j])
            zz = z[r, j] + gj * gj
            z[r, j] = zz
            eta = alpha / np.sqrt(zz)
            x[r, j] = np.float64(x[r, j]) - eta * gj


@njit(nogil=True, cache=True)
def adagrad_csr(x, z, rows, indptr, cols, g, alpha):  # pragma: no cover - compiled
    for i in range(rows.shape[0]):
        r = rows[i]
        for k in range(indptr[i], indptr[i + 1]):
            j = cols[k]
            gj = np.float64(g[k])
            zz = z[r, j] + gj * gj
            z[r, j] = zz
            eta = alpha / np.sqrt(zz)
            x[r, j] = np.float64(x[r, j]) - eta * gj


class AdaGrad(StoredProcedure):
    """update_args: ``alpha`` (default 0.1), ``init_z`` (default 1.0)."""

    read_my_writes = False
    float_only = True

    def __init__(self, table: TableConfig, alpha: float = 0.1, init_z: float = 1.0) -> None:
        super().__init__(table)
        self.alpha = positive("alpha", alpha)
        self.init_z = positive("init_z", init_z)
        self.z = np.empty((0, table.cols))

    def create(self, global_rows: np.ndarray, values: np.ndarray) -> None:
        self.z = np.full(values.shape, self.init_z, dtype=np.float64)

    def apply(self, values: np.ndarray, local_rows: np.ndarray, batch: UpdateBatch, client: int) -> None:
        g = gradients(values, batch)
        if batch.sparse:
            adagrad_csr(values, self.z, local_rows, batch.indptr, batch.cols, g, self.alpha)
        else:
            adagrad_dense(values, self.z, local_rows, g, self.alpha)

    def state(self) -> dict[str, np.ndarray]:
        return {"z": self.z}

    def stats(self) -> dict[str, Any]:
        return {"procedure": "adagrad", "alpha": self.alpha}
