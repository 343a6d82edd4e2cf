"""Which server owns which row.

Rows are spread round-robin (row mod number-of-servers): a hash that is free to compute, vectorizes,
and keeps every server's share of any contiguous row range within one row of equal. A server stores
its rows densely at local index row // number-of-servers.

The rule is written once, here: ``server_of`` (Python, for scalars and arrays), ``server_of_jit``
(the same function compiled, for numba kernels) and ``rows_of`` (one server's rows of a dense
array, as a slice); everything else asks them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit


def server_of(rows: Any, num_servers: int) -> Any:
    """The server that owns ``rows`` (an int or an integer array)."""
    return rows % num_servers


server_of_jit = njit(nogil=True, cache=True, inline="always")(server_of)


def rows_of(server: int, num_servers: int) -> slice:
    """Every row ``server`` owns, as a slice of an array indexed by row."""
    return slice(server, None, num_servers)


class Partition:
    def __init__(self, num_servers: int) -> None:
        self.num_servers = num_servers

    def owner(self, rows: np.ndarray) -> np.ndarray:
        return server_of(rows, self.num_servers)

    def local(self, rows: np.ndarray) -> np.ndarray:
        return rows // self.num_servers if self.num_servers > 1 else rows

    def global_rows(self, server: int, total_rows: int) -> np.ndarray:
        return np.arange(*rows_of(server, self.num_servers).indices(total_rows), dtype=np.int64)

    def split(self, rows: np.ndarray) -> list[np.ndarray]:
        """Positions in ``rows`` grouped by owning server (one vectorized pass per server)."""
        if self.num_servers == 1:
            return [np.arange(rows.shape[0])]
        own = self.owner(rows)
        return [np.flatnonzero(own == j) for j in range(self.num_servers)]

    def rows_by_server(self, rows: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """(server, its rows of ``rows`` in their order) for every server that owns some; with one
        server, ``rows`` as they are (no gather)."""
        if self.num_servers == 1:
            return [(0, rows)] if rows.shape[0] else []
        return [(j, rows[pos]) for j, pos in enumerate(self.split(rows)) if pos.shape[0]]
