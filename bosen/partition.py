"""Which server owns which row: rows to partitions, partitions to servers.

Rows are split into ``P`` partitions round-robin (partition = row mod P), many more than servers
(Litz's over-decomposition, ``cluster.partitions``): the partition map (``owner[p]``, the server of
partition ``p``) is what moves when a job scales, never the row-to-partition rule. Modulo hashing is
free to compute, vectorizes, and keeps every partition's share of a contiguous row range within one
row of equal.

A server stores the rows of its partitions interleaved: with ``k`` partitions, sorted, row ``r`` of
the one at position ``i`` is at local index ``(r // P) * k + i``. Local indices are then dense (the
rows past the table's end are the last ones) and, for the map a job starts with (``owner[p] = p mod
S`` with ``S`` dividing ``P``: *modular*), equal to ``r // S`` with server ``r mod S``: the layout
where one server's rows of a run are a stride, which the client's staged pieces and the server's
runs rely on. Moving a partition changes the layout of the two servers involved (``server/shard.py``
rebuilds theirs); everyone else only learns the new map.

``server_of``, ``server_of_jit`` and ``rows_of`` are the round-robin rule itself (a row's class among
n classes: its server under a modular map, its partition with n = P); ``Partition`` is the map.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit


def server_of(rows: Any, num_servers: int) -> Any:
    """The class of ``rows`` among ``num_servers`` round-robin classes (an int or an integer array):
    the partition of a row when ``num_servers`` is the number of partitions."""
    return rows % num_servers


server_of_jit = njit(nogil=True, cache=True, inline="always")(server_of)


def rows_of(server: int, num_servers: int) -> slice:
    """Every row of class ``server`` (of ``num_servers``), as a slice of an array indexed by row."""
    return slice(server, None, num_servers)


class Partition:
    """The partition map: ``P`` partitions (row mod P), each owned by one of ``num_servers`` servers.

    ``version`` counts the moves the map has seen (0: the map a job starts with); servers and clients
    compare versions, never maps."""

    def __init__(self, num_servers: int, partitions: int | None = None, owner: np.ndarray | None = None,
                 version: int = 0, classes: int | None = None) -> None:
        """``classes``: the round-robin classes its holder's arrays interleave rows by (a client's
        buffers keep the layout of the servers it started with): the map counts as modular only for
        that many servers. None: the holder lays its rows out by this map (a server)."""
        self.num_servers = num_servers
        self.partitions = partitions if partitions is not None else num_servers
        p = self.partitions
        if owner is None:
            owner = np.arange(p, dtype=np.int32) % num_servers
        owner = np.ascontiguousarray(owner, dtype=np.int32)
        if owner.shape != (p,) or (p and (owner.min() < 0 or owner.max() >= num_servers)):
            raise ValueError(f"partition map: {owner.shape[0]} owners for {p} partitions, each in [0, {num_servers})")
        self.owner_of = owner
        self.version = version
        self.modular = p % num_servers == 0 and bool((owner == np.arange(p) % num_servers).all()) \
            and classes in (None, num_servers)
        self.owned = [np.flatnonzero(owner == j) for j in range(num_servers)]  # sorted
        self.position = np.zeros(p, dtype=np.int64)  # each partition's place among its owner's
        for parts in self.owned:
            self.position[parts] = np.arange(parts.shape[0])

    def moved(self, owner: np.ndarray, num_servers: int | None = None) -> Partition:
        """The map after a move: partitions owned by ``owner`` (the next version)."""
        return Partition(num_servers or self.num_servers, self.partitions, owner, self.version + 1)

    def owner(self, rows: np.ndarray) -> np.ndarray:
        if self.modular:
            return server_of(rows, self.num_servers)
        return self.owner_of[rows % self.partitions]

    def local(self, rows: np.ndarray, server: int) -> np.ndarray:
        """Local indices on ``server`` of ``rows`` (all of them its own)."""
        if self.modular:
            return rows // self.num_servers if self.num_servers > 1 else rows
        k = self.owned[server].shape[0]
        return (rows // self.partitions) * k + self.position[rows % self.partitions]

    def global_of(self, local: np.ndarray, server: int) -> np.ndarray:
        """The rows at local indices ``local`` of ``server`` (``local``'s inverse)."""
        if self.modular:
            return local * self.num_servers + server
        parts = self.owned[server]
        k = parts.shape[0]
        return (local // k) * self.partitions + parts[local % k]

    def global_rows(self, server: int, total_rows: int) -> np.ndarray:
        """Every row ``server`` owns of a table of ``total_rows``, in local order."""
        if self.modular:
            return np.arange(*rows_of(server, self.num_servers).indices(total_rows), dtype=np.int64)
        parts = self.owned[server].astype(np.int64)
        q = -(-total_rows // self.partitions)
        rows = (np.arange(q, dtype=np.int64)[:, None] * self.partitions + parts[None, :]).ravel()
        return rows[rows < total_rows]

    def local_count(self, server: int, total_rows: int) -> int:
        """How many rows of a table of ``total_rows`` ``server`` owns (its local indices' range)."""
        if self.modular:
            s = self.num_servers
            return max(0, (total_rows - server + s - 1) // s)
        p = self.partitions
        full, rest = divmod(total_rows, p)
        parts = self.owned[server]
        return full * parts.shape[0] + int(np.count_nonzero(parts < rest))

    def split(self, rows: np.ndarray, owners: np.ndarray | None = None) -> list[np.ndarray]:
        """Positions in ``rows`` grouped by owning server (one vectorized pass per server);
        ``owners``: each row's server, if the caller knows it (rows that are slots)."""
        if self.num_servers == 1:
            return [np.arange(rows.shape[0])]
        own = self.owner(rows) if owners is None else owners
        return [np.flatnonzero(own == j) for j in range(self.num_servers)]

    def rows_by_server(self, rows: np.ndarray, owners: np.ndarray | None = None) -> list[tuple[int, np.ndarray]]:
        """(server, its rows of ``rows`` in their order) for every server that owns some; with one
        server, ``rows`` as they are (no gather). ``owners``: as for ``split``."""
        if self.num_servers == 1:
            return [(0, rows)] if rows.shape[0] else []
        return [(j, rows[pos]) for j, pos in enumerate(self.split(rows, owners)) if pos.shape[0]]
