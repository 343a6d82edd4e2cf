"""``PSModule``: a torch module whose parameters are read from the parameter server before each forward.

The module's dense parameters become views of one flat tensor (the table's rows end to end), so a
pull is one ``get_rows`` and one copy, and the optimizers read gradients and values in one piece. On
CUDA the copy goes through a persistent pinned host buffer with a non-blocking transfer.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bosen.apps.protocol import PSClient, require_table
from bosen.apps.pytorch.layout import DEFAULT_ROW_WIDTH, Layout
from bosen.apps.pytorch.tables import layout_file
from bosen.errors import ConfigError, UsageError


class PSModule(nn.Module):
    """Wraps ``module``; ``clock_every``: optimizer steps per clock tick (the SSP unit of staleness).

    ``device``: where the module is expected to be (e.g. ``Ranks.device()``); a module elsewhere is
    an error rather than a silent copy.
    """

    def __init__(self, module: nn.Module, client: PSClient, clock_every: int = 1, *, prefix: str = "",
                 row_width: int = DEFAULT_ROW_WIDTH, device: str | torch.device | None = None) -> None:
        super().__init__()
        if not isinstance(clock_every, int) or clock_every < 1:
            raise ValueError(f"clock_every: must be a positive integer, got {clock_every!r}")
        self.module = module
        self.client = client
        self.clock_every = clock_every
        self.layout = layout = Layout.of(module, prefix, row_width)
        self.table = require_table(client, layout.table, "PSModule keeps the model's parameters in it "
                                   "(declare the tables with bosen.apps.pytorch.declare)")
        self._check_table()
        self.device = self._device(device)
        n = layout.rows * layout.row_width
        dtype = next(p.dtype for p in module.parameters() if p.requires_grad)
        self.flat = torch.zeros(n, dtype=dtype, device=self.device)
        self.params: list[nn.Parameter] = []
        named = dict(module.named_parameters())
        with torch.no_grad():
            for s in layout.slots:
                p = named[s.name]
                view = self.flat[s.offset:s.offset + s.numel].view(s.shape)
                view.copy_(p)
                p.data = view  # the parameter now lives in the flat tensor
                self.params.append(p)
        cuda = self.device.type == "cuda"
        self._host = torch.empty(n, dtype=dtype, pin_memory=cuda) if cuda else None
        self._rows = np.arange(layout.rows, dtype=np.int64)
        self.steps = 0
        self.pull_s = 0.0  # seconds spent reading the parameters (waiting at the SSP bound included)

    # -- the training loop's side ------------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self.pull()
        return self.module(*args, **kwargs)

    def pull(self) -> None:
        """Read the parameters as fresh as the table's staleness bound requires into the module."""
        t0 = time.perf_counter()
        values = torch.from_numpy(self.table.get_rows(self._rows)).view(-1)
        with torch.no_grad():
            if self._host is None:
                self.flat.copy_(values)
            else:
                self._host.copy_(values)
                self.flat.copy_(self._host, non_blocking=True)
        self.pull_s += time.perf_counter() - t0

    # -- the optimizers' side ----------------------------------------------------------------------

    def gradients(self, out: torch.Tensor) -> None:
        """The parameters' gradients into ``out`` (flat, on the host; zeros where a parameter has none)."""
        have = False
        for s, p in zip(self.layout.slots, self.params, strict=True):
            g = p.grad
            seg = out[s.offset:s.offset + s.numel]
            if g is None:
                seg.zero_()
                continue
            if g.is_sparse:
                raise UsageError(f"parameter {s.name} has a sparse gradient, but it lives in the dense table "
                                 f"{self.layout.table!r}: build its nn.Embedding with sparse=False")
            seg.copy_(g.reshape(-1))
            have = True
        if not have:
            raise UsageError("step() before backward(): no parameter has a gradient")

    def values(self) -> np.ndarray:
        """A host copy of the current parameters, flat."""
        return self.flat.detach().cpu().numpy().copy()

    def push(self, block: np.ndarray) -> None:
        """Send one update for every row (gradients or deltas, as the table's procedure takes), and
        end the clock tick every ``clock_every`` steps."""
        self.table.inc_rows(self._rows, block.reshape(self.layout.rows, self.layout.row_width))
        self.steps += 1
        if self.steps % self.clock_every == 0:
            self.client.clock()

    # -- checks ------------------------------------------------------------------------------------

    def _check_table(self) -> None:
        lay, t = self.layout, self.table
        source = self.client.config.source
        if t.cols != lay.row_width:
            raise ConfigError(f"{source}: table {lay.table} has {t.cols} cols; the model's layout uses rows of "
                              f"{lay.row_width} values (row_width)")
        if np.dtype(t.dtype) != np.dtype(lay.dtype):
            raise ConfigError(f"{source}: table {lay.table} is {t.dtype}; the model's parameters are {lay.dtype}")
        cfg = _table_config(self.client, lay.table)
        init = getattr(cfg, "init", None)
        if init is not None and init.kind == "file" and layout_file(init.file).is_file():
            saved = json.loads(Path(layout_file(init.file)).read_text())
            diff = lay.differences(saved)
            if diff:
                raise ConfigError(f"{source}: the model's parameters changed since table {lay.table} was made "
                                  f"({layout_file(init.file)}): " + "; ".join(diff[:3])
                                  + ("; ..." if len(diff) > 3 else ""))
        if t.rows < lay.rows:
            raise ConfigError(f"{source}: table {lay.table} is too small: {t.rows} rows x {t.cols} hold "
                              f"{t.rows * t.cols:,} values; the model has {lay.numel:,} parameters "
                              f"({lay.rows} rows)")
        if t.rows > lay.rows:
            raise ConfigError(f"{source}: table {lay.table} has {t.rows} rows; the model's {lay.numel:,} parameters "
                              f"fill {lay.rows}: was it made for another model?")

    def _device(self, want: str | torch.device | None) -> torch.device:
        devices = sorted({str(p.device) for p in self.module.parameters() if p.requires_grad})
        if len(devices) > 1:
            raise ConfigError(f"model on unexpected devices: parameters on {', '.join(devices)}; "
                              "move the whole model to one device first")
        have = torch.device(devices[0])
        w = torch.device(want) if want is not None else None
        if w is not None and (w.type != have.type or (w.index is not None and w.index != have.index)):
            raise ConfigError(f"model on unexpected device: its parameters are on {have}, expected {want}; "
                              f"call model.to({str(want)!r}) before PSModule")
        return have


def _table_config(client: PSClient, name: str) -> Any:
    """The table's config entry, where the client exposes it (the real client does)."""
    table = getattr(client.config, "table", None)
    return table(name) if callable(table) else None
