"""How a module's parameters map onto PS tables.

Dense parameters: every one, in ``named_parameters()`` order, is laid end to end in one flat vector
that is cut into rows of ``row_width`` values (the last row padded with zeros): table
``<prefix>params`` of ``ceil(total / row_width)`` rows. One table for the whole dense model means one
read and one update message per server per step, whatever the number of tensors; fixed-width rows
give the server's priority (relative magnitude) and the partition an even grain. ``row_width`` trades
priority resolution against per-row overhead; 1024 float32 values (4 KiB) keeps it under 1%.

Sparse embeddings: the weight of each ``nn.Embedding`` / ``nn.EmbeddingBag`` built with
``sparse=True`` is a table of its own, ``<prefix><module name>``, one row per embedding, so a step
reads and writes only the rows its batch touches. A ``PSEmbedding`` (embedding.py) is such a table
too, with no local weight at all (``remote``): its rows are an upper bound on its ids, or
``config.UNBOUNDED``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from bosen.apps.pytorch.embedding import PSEmbedding
from bosen.errors import ConfigError

DEFAULT_ROW_WIDTH = 1024
DTYPES = {torch.float32: "float32", torch.float64: "float64"}


@dataclass(frozen=True)
class Slot:
    """One parameter's place in the flat vector."""

    name: str
    shape: tuple[int, ...]
    offset: int
    numel: int


@dataclass(frozen=True)
class Sparse:
    """A sparse embedding's weight: table ``table`` of ``rows`` x ``cols``."""

    module: str  # the embedding module's name in the model
    param: str  # its weight's parameter name
    table: str
    rows: int
    cols: int
    remote: bool = False  # a PSEmbedding: no local weight, only the rows of the current batch


@dataclass(frozen=True)
class Layout:
    """The table a module's dense parameters live in (``slots`` in order; none when every parameter
    is a sparse embedding), and one table per sparse embedding."""

    table: str
    row_width: int
    dtype: str
    slots: tuple[Slot, ...]
    sparse: tuple[Sparse, ...] = ()

    @classmethod
    def of(cls, module: nn.Module, prefix: str = "", row_width: int = DEFAULT_ROW_WIDTH) -> Layout:
        if not isinstance(module, nn.Module):
            raise TypeError(f"expected a torch.nn.Module, got {type(module).__name__}")
        if not isinstance(row_width, int) or row_width < 1:
            raise ValueError(f"row_width: must be a positive integer, got {row_width!r}")
        sparse = {f"{name}.weight" if name else "weight": name for name, m in module.named_modules()
                  if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse}
        slots, embeddings, offset, dtypes = [], [], 0, set()
        for name, p in module.named_parameters():
            if not p.requires_grad:
                continue  # frozen parameters stay local, as in DDP
            if p.dtype not in DTYPES:
                raise ConfigError(f"parameter {name}: dtype {p.dtype} is not supported (float32 or float64)")
            dtypes.add(DTYPES[p.dtype])
            if name in sparse:
                embeddings.append(Sparse(sparse[name], name, f"{prefix}{sparse[name] or 'embedding'}",
                                         p.shape[0], p.shape[1]))
                continue
            slots.append(Slot(name, tuple(p.shape), offset, p.numel()))
            offset += p.numel()
        for name, m in module.named_modules():
            if isinstance(m, PSEmbedding):
                dtypes.add(DTYPES[m.dtype])
                embeddings.append(Sparse(name, f"{name}.weight" if name else "weight",
                                         f"{prefix}{name or 'embedding'}", m.num_embeddings, m.embedding_dim, True))
        if not slots and not embeddings:
            raise ConfigError("the module has no trainable parameters: nothing to keep in the parameter server")
        if len(dtypes) > 1:
            raise ConfigError(f"the module mixes parameter dtypes ({', '.join(sorted(dtypes))}): one table "
                              "holds one dtype; convert the module with .float() or .double()")
        return cls(f"{prefix}params", row_width, dtypes.pop(), tuple(slots), tuple(embeddings))

    @property
    def numel(self) -> int:
        return self.slots[-1].offset + self.slots[-1].numel if self.slots else 0

    @property
    def rows(self) -> int:
        return math.ceil(self.numel / self.row_width)

    def describe(self) -> dict[str, Any]:
        """Plain data saved beside the table's initial values, to tell later which parameters changed."""
        return {"row_width": self.row_width, "dtype": self.dtype,
                "params": [[s.name, list(s.shape)] for s in self.slots],
                "sparse": [[e.param, [e.rows, e.cols]] for e in self.sparse]}

    def values(self, module: nn.Module) -> np.ndarray:
        """The module's current parameters as the table's (rows, row_width) array, zero padded."""
        out = np.zeros(self.rows * self.row_width, dtype=self.dtype)
        params = dict(module.named_parameters())
        for s in self.slots:
            out[s.offset:s.offset + s.numel] = params[s.name].detach().cpu().reshape(-1).numpy()
        return out.reshape(self.rows, self.row_width)

    def differences(self, saved: dict[str, Any]) -> list[str]:
        """What differs from a saved ``describe()``: one line per parameter, first differences first."""
        out = []
        if saved.get("row_width") != self.row_width:
            out.append(f"row_width {self.row_width} here, {saved.get('row_width')} when the tables were made")
        then = {name: tuple(shape) for name, shape in saved.get("params", [])}
        now = {s.name: s.shape for s in self.slots}
        for name, shape in now.items():
            if name not in then:
                out.append(f"parameter {name} {shape} is new since the tables were made")
            elif then[name] != shape:
                out.append(f"parameter {name}: shape {shape} here, {then[name]} when the tables were made")
        out += [f"parameter {name} {then[name]} is gone since the tables were made" for name in then if name not in now]
        was_sparse = {name: tuple(shape) for name, shape in saved.get("sparse", [])}
        for e in self.sparse:
            if was_sparse.get(e.param, (e.rows, e.cols)) != (e.rows, e.cols):
                out.append(f"embedding {e.param}: shape ({e.rows}, {e.cols}) here, {was_sparse[e.param]} when the "
                           "tables were made")
        return out
