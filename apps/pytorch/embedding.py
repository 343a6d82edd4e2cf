"""``PSEmbedding``: an embedding whose table stays in the parameter server, for tables bigger than a
worker's memory (issue 29: 10^8 rows, or raw 64-bit ids such as hashed categorical values).

``nn.Embedding(rows, dim)`` holds every row in the worker; at 100M x 64 that is 25.6 GB in each
process. A ``PSEmbedding`` holds none: each forward reads the batch's distinct ids from the PS
(through ``PSModule``, the client's cache and its SSP bound) into a small leaf tensor of those rows,
looks the batch up in it, and keeps it so the optimizer can push the leaf's gradient rows. A worker
then costs memory with the rows its batches touch (the client's cache of them, bounded by the
table's ``cache_rows``), not with the table. The servers start each row from a seeded initializer
(``init``: the table's ``init:``, the distribution of ``nn.Embedding``'s own N(0, 1) unless told),
so no file of every row is written either; ``declare`` makes the table ``storage: sparse``.

``hash_ids`` turns raw per-feature values into one id space (for a table without ``rows``, or one
of a fixed number of rows: the hashing trick), without a dictionary of the values seen.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bosen.config import UNBOUNDED
from bosen.errors import UsageError

# nn.Embedding's own reset_parameters: N(0, 1)
DEFAULT_INIT: dict[str, Any] = {"normal": 1.0}

Lookup = Callable[[torch.Tensor], torch.Tensor]


class PSEmbedding(nn.Module):
    """``num_embeddings`` rows (None: any id in [0, 2**63 - 1)) of ``embedding_dim`` values, read
    from the PS a batch at a time; ``init``: how the servers start a row (``init:`` of the table
    config, e.g. ``{"uniform": [-0.05, 0.05], "seed": 0}``). Works only inside a ``PSModule``, which
    binds it to its table."""

    def __init__(self, num_embeddings: int | None, embedding_dim: int, *, init: Mapping[str, Any] | None = None,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        if num_embeddings is not None and (not isinstance(num_embeddings, int) or not 1 <= num_embeddings < UNBOUNDED):
            raise ValueError(f"num_embeddings: must be an integer in [1, 2**63 - 1) or None (any 64-bit id), "
                             f"got {num_embeddings!r}")
        if not isinstance(embedding_dim, int) or embedding_dim < 1:
            raise ValueError(f"embedding_dim: must be a positive integer, got {embedding_dim!r}")
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype: float32 or float64, got {dtype}")
        self.num_embeddings = UNBOUNDED if num_embeddings is None else num_embeddings
        self.embedding_dim = embedding_dim
        self.init = dict(DEFAULT_INIT if init is None else init)
        self.dtype = dtype
        self._lookup: Lookup | None = None
        # (distinct ids, their leaf rows) of each forward with gradients on, since the last push
        self._batches: list[tuple[torch.Tensor, torch.Tensor]] = []

    def extra_repr(self) -> str:
        rows = "any 64-bit id" if self.num_embeddings == UNBOUNDED else str(self.num_embeddings)
        return f"{rows}, {self.embedding_dim}, in the parameter server"

    def bind(self, lookup: Lookup) -> None:
        """``lookup(ids)``: the rows of distinct, sorted ``ids`` as a tensor on the model's device."""
        self._lookup = lookup

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self._lookup is None:
            raise UsageError("PSEmbedding reads its rows from the parameter server: wrap the model in PSModule "
                             "(and declare its tables with bosen.apps.pytorch.declare)")
        if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"PSEmbedding: ids must be an int64 (or int32) tensor, got "
                            f"{getattr(ids, 'dtype', type(ids).__name__)}")
        rows, inverse = torch.unique(ids, sorted=True, return_inverse=True)
        values = self._lookup(rows)
        if torch.is_grad_enabled():
            values.requires_grad_(True)
            self._batches.append((rows, values))
        # a sparse gradient of the leaf, summed per row as nn.Embedding(sparse=True)'s own is
        return F.embedding(inverse, values, sparse=True)

    def gradient(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(distinct ids, their gradient rows) of the forwards since the last ``clear``; None when
        none had a gradient."""
        parts = []
        for rows, leaf in self._batches:
            g = leaf.grad
            if g is None:
                continue
            if g.is_sparse:
                g = g.coalesce()
                parts.append((rows[g.indices()[0].to(rows.device)], g.values()))
            else:
                parts.append((rows, g))
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0]
        ids, inverse = torch.unique(torch.cat([r for r, _ in parts]), sorted=True, return_inverse=True)
        vals = torch.cat([v for _, v in parts])
        out = torch.zeros((ids.numel(), vals.shape[1]), dtype=vals.dtype, device=vals.device)
        return ids, out.index_add_(0, inverse.to(vals.device), vals)

    def zero_grad_rows(self) -> None:
        """Forget the gradients of the rows read so far (``optimizer.zero_grad()``), keeping the rows."""
        for _, leaf in self._batches:
            leaf.grad = None

    def scale_grad(self, factor: float) -> None:
        """Multiply the gradients of the rows read so far by ``factor`` (hybrid mode's 1 / workers)."""
        for _, leaf in self._batches:
            if leaf.grad is not None:
                leaf.grad = leaf.grad * factor

    def clear(self) -> None:
        """Drop the rows read so far (after their gradient was pushed)."""
        self._batches = []


def hash_ids(values: np.ndarray, feature: int | np.ndarray = 0, rows: int | None = None) -> np.ndarray:
    """Ids for raw categorical ``values`` (any int64, e.g. Criteo's hashed strings) of ``feature``:
    splitmix64 of (feature, value), in [0, 2**63 - 1) (a table without ``rows``: distinct pairs
    collide with probability ~n^2 / 2^64) or, with ``rows``, in [0, rows) (the hashing trick).
    ``feature`` broadcasts against ``values`` (e.g. ``np.arange(26)`` for a (n, 26) array)."""
    v = np.asarray(values)
    if v.dtype.kind not in "iu":
        raise TypeError(f"hash_ids: values must be integers, got {v.dtype}")
    if rows is not None and not (isinstance(rows, int | np.integer) and 1 <= rows < UNBOUNDED):
        raise ValueError(f"hash_ids: rows must be an integer in [1, 2**63 - 1) or None, got {rows!r}")
    f = np.asarray(feature, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = v.astype(np.uint64) ^ ((f + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15))
        x = x ^ (x >> np.uint64(30))
        x = x * np.uint64(0xBF58476D1CE4E5B9)
        x = x ^ (x >> np.uint64(27))
        x = x * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    top = UNBOUNDED if rows is None else int(rows)
    return (x % np.uint64(top)).astype(np.int64)
