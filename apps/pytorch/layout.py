"""How a module's parameters map onto a PS table: fixed-width chunked rows.

Every dense parameter, in ``named_parameters()`` order, is laid end to end in one flat vector that is
cut into rows of ``row_width`` values (the last row padded with zeros): table ``<prefix>params`` of
``ceil(total / row_width)`` rows. One table for the whole model means one read and one update message
per server per step, whatever the number of tensors; fixed-width rows give the server's priority
(relative magnitude) and the partition an even grain. ``row_width`` trades priority resolution
against per-row overhead; 1024 float32 values (4 KiB) keeps the per-row cost under 1%.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

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
class Layout:
    """The table a module's dense parameters live in, and where each parameter sits in it."""

    table: str
    row_width: int
    dtype: str
    slots: tuple[Slot, ...]

    @classmethod
    def of(cls, module: nn.Module, prefix: str = "", row_width: int = DEFAULT_ROW_WIDTH) -> Layout:
        if not isinstance(module, nn.Module):
            raise TypeError(f"expected a torch.nn.Module, got {type(module).__name__}")
        if not isinstance(row_width, int) or row_width < 1:
            raise ValueError(f"row_width: must be a positive integer, got {row_width!r}")
        slots, offset, dtypes = [], 0, set()
        for name, p in module.named_parameters():
            if not p.requires_grad:
                continue  # frozen parameters stay local, as in DDP
            if p.dtype not in DTYPES:
                raise ConfigError(f"parameter {name}: dtype {p.dtype} is not supported (float32 or float64)")
            dtypes.add(DTYPES[p.dtype])
            slots.append(Slot(name, tuple(p.shape), offset, p.numel()))
            offset += p.numel()
        if not slots:
            raise ConfigError("the module has no trainable parameters: nothing to keep in the parameter server")
        if len(dtypes) > 1:
            raise ConfigError(f"the module mixes parameter dtypes ({', '.join(sorted(dtypes))}): one table "
                              "holds one dtype; convert the module with .float() or .double()")
        return cls(f"{prefix}params", row_width, dtypes.pop(), tuple(slots))

    @property
    def numel(self) -> int:
        return self.slots[-1].offset + self.slots[-1].numel

    @property
    def rows(self) -> int:
        return math.ceil(self.numel / self.row_width)

    def describe(self) -> dict[str, Any]:
        """Plain data saved beside the table's initial values, to tell later which parameters changed."""
        return {"row_width": self.row_width, "dtype": self.dtype,
                "params": [[s.name, list(s.shape)] for s in self.slots]}

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
        return out
