"""The job's tables for a model, declared from the model itself rather than written by hand.

``declare(model, out_dir, update=...)`` returns the ``tables:`` entries for the config and writes the
model's initial parameters (``<table>.npy``, the table's ``init: {file: ...}``) and its layout
(``<table>.layout.json``) into ``out_dir``. The servers start from the model's own initialization
(a seeded generator on the servers could not reproduce PyTorch's per-layer schemes), and ``PSModule``
later compares the model it wraps with the saved layout, parameter by parameter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from bosen.apps.pytorch.layout import DEFAULT_ROW_WIDTH, Layout

# each built-in server optimizer's step-size argument (its update_args key)
STEP_ARG = {"sgd": "lr", "adagrad": "alpha", "adarevision": "alpha"}
# what declare() adds unless told otherwise, so a server optimizer means what its torch namesake does:
# AdaGrad's accumulator starts near 0 as torch.optim.Adagrad's (the procedure's default of 1 suits
# hand-tuned apps, but turns AdaGrad into plain SGD for the first steps on small gradients)
TORCH_DEFAULTS = {"adagrad": {"init_z": 1e-8}}


def step_args(update: str, lr: float | None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The table's ``update_args`` for a server optimizer with step size ``lr`` (``add``: none), with
    ``TORCH_DEFAULTS`` under ``extra``."""
    args = {**TORCH_DEFAULTS.get(update, {}), **(extra or {})}
    if update == "add":
        if lr is not None:
            raise ValueError("lr: the 'add' table takes deltas; the step size belongs to the local optimizer")
        return args
    if update not in STEP_ARG:
        raise ValueError(f"update: {update!r} is not a server optimizer (one of add, {', '.join(STEP_ARG)})")
    if lr is None or not lr > 0:
        raise ValueError(f"lr: {update} needs a positive step size, got {lr!r}")
    args[STEP_ARG[update]] = float(lr)
    return args


def declare(model: nn.Module, out_dir: str | Path, *, update: str = "add", lr: float | None = None,
            update_args: dict[str, Any] | None = None, prefix: str = "",
            row_width: int = DEFAULT_ROW_WIDTH, staleness: int | None = None,
            wire_dtype: str | None = None) -> dict[str, dict[str, Any]]:
    """Config entries (``tables:``) for ``model``'s parameters; writes their initial values and layout.

    ``update``: ``add`` for ``DeltaOptimizer`` (workers push parameter deltas), or ``sgd`` /
    ``adagrad`` / ``adarevision`` with step size ``lr`` for ``ServerOptimizer`` (workers push
    gradients, the server takes the step). Every table of the model gets the same procedure.
    ``wire_dtype``: ``bfloat16`` or ``float16`` pushes half the bytes; each worker keeps the rounding
    residual and sends it later (nothing is lost), and the servers keep float32 values.
    """
    layout = Layout.of(model, prefix, row_width)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    args = step_args(update, lr, update_args)
    entries: dict[str, dict[str, Any]] = {}

    def entry(name: str, values: np.ndarray) -> None:
        init = out / f"{name}.npy"
        np.save(init, values)
        entries[name] = {"rows": values.shape[0], "cols": values.shape[1], "dtype": layout.dtype, "update": update,
                         "update_args": dict(args), "init": {"file": str(init.resolve())}}
        if staleness is not None:
            entries[name]["staleness"] = staleness
        if wire_dtype is not None:
            entries[name]["wire_dtype"] = wire_dtype

    if layout.slots:
        entry(layout.table, layout.values(model))
    params = dict(model.named_parameters())
    for e in layout.sparse:
        entry(e.table, params[e.param].detach().cpu().numpy())
    layout_file(out / f"{layout.table}.npy").write_text(json.dumps(layout.describe()))
    return entries


def layout_file(init_file: str | Path, table: str | None = None) -> Path:
    """Where ``declare`` saved the layout beside a table's initial values ``init_file``: named for the
    model's dense table (``table``; by default the one ``init_file`` belongs to)."""
    p = Path(init_file)
    return p.with_name(f"{table or p.name[:-len('.npy')]}.layout.json")
