"""The row cache: the freshest value the client has of each row and the clock it is valid for.

``clock[r]`` is -1 for rows never received; otherwise the value contains every update of every tick
below ``clock[r]`` (SSP, DESIGN §5). Values of a table are one dense matrix, touched lazily.
"""

from __future__ import annotations

import numpy as np


class RowCache:
    def __init__(self, rows: int, cols: int, dtype: np.dtype) -> None:
        self.values = np.zeros((rows, cols), dtype=dtype)
        self.clock = np.full(rows, -1, dtype=np.int64)
        self.requested = np.zeros(rows, dtype=bool)

    def raise_clock(self, server: int, num_servers: int, clock: int) -> None:
        """A server clock message: every cached row of that server is now valid for ``clock``."""
        view = self.clock[server::num_servers]
        np.maximum(view, clock, out=view, where=view >= 0)

    def cached_count(self) -> int:
        return int(np.count_nonzero(self.clock >= 0))
