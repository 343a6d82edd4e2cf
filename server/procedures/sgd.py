"""``update: sgd``: the server takes the step, x ← x − lr·g. Clients send raw gradients g."""

from __future__ import annotations

from typing import Any

import numpy as np

from bosen import rowmath
from bosen.config import TableConfig
from bosen.procedure import StoredProcedure
from bosen.server.procedures.common import gradients, positive
from bosen.wire import UpdateBatch


class SGD(StoredProcedure):
    """Plain SGD with a constant step ``lr`` (update_args: ``lr``, default 0.01)."""

    read_my_writes = False
    float_only = True

    def __init__(self, table: TableConfig, lr: float = 0.01) -> None:
        super().__init__(table)
        self.lr = positive("lr", lr)

    def apply(self, values: np.ndarray, local_rows: np.ndarray, batch: UpdateBatch, client: int) -> None:
        step = gradients(values, batch) * values.dtype.type(-self.lr)
        if batch.sparse:
            rowmath.scatter_add_csr(values, local_rows, batch.indptr, batch.cols, step)
        else:
            rowmath.add_rows(values, local_rows, step)

    def stats(self) -> dict[str, Any]:
        return {"procedure": "sgd", "lr": self.lr}
