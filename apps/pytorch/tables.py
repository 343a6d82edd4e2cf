"""The job's tables for a model, declared from the model itself rather than written by hand.

``declare(model, out_dir, update=...)`` returns the ``tables:`` entries for the config and writes the
model's initial parameters (``<table>.npy``, the table's ``init: {file: ...}``) and its layout
(``<table>.layout.json``) into ``out_dir``. The servers start from the model's own initialization
(a seeded generator on the servers could not reproduce PyTorch's per-layer schemes), and ``PSModule``
later compares the model it wraps with the saved layout, parameter by parameter.

``storage="sparse"`` makes the embeddings' tables ``storage: sparse`` (stored where touched, issue
29) and writes no file of their rows (25.6 GB at 100M x 64): the servers start each row from a
seeded initializer instead, deterministic per row id (``rowmath.init_rows``): ``init`` when given,
else a ``PSEmbedding``'s own, else N(0, 1), ``nn.Embedding``'s default. A ``PSEmbedding`` always
takes a server-side initializer (it has no local rows to save).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
from torch import nn

from bosen.apps.pytorch.allreduce import check_mode
from bosen.apps.pytorch.embedding import DEFAULT_INIT, PSEmbedding
from bosen.apps.pytorch.layout import DEFAULT_ROW_WIDTH, Layout
from bosen.config import UNBOUNDED

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
            wire_dtype: str | None = None, storage: Literal["dense", "sparse"] = "dense",
            init: Mapping[str, Any] | None = None, cache_rows: int | None = None,
            push: bool = True, lapse: int = 0, dense: str = "ps",
            backup: Mapping[str, Any] | None = None,
            dense_staleness: int | None = None) -> dict[str, dict[str, Any]]:
    """Config entries (``tables:``) for ``model``'s parameters; writes their initial values and layout.

    ``update``: ``add`` for ``DeltaOptimizer`` (workers push parameter deltas), or ``sgd`` /
    ``adagrad`` / ``adarevision`` with step size ``lr`` for ``ServerOptimizer`` (workers push
    gradients, the server takes the step). Every table of the model gets the same procedure.
    ``wire_dtype``: ``bfloat16`` or ``float16`` pushes half the bytes; each worker keeps the rounding
    residual and sends it later (nothing is lost), and the servers keep float32 values.
    ``storage``: the embeddings' tables ``dense`` or ``sparse`` (the dense parameters' table is always
    dense); ``init``: a server-side initializer of the embeddings' rows (an ``init:`` entry, e.g.
    ``{"uniform": [-0.05, 0.05]}``) in place of the model's values, which ``storage="sparse"``
    implies; ``cache_rows``: the most rows of each embedding a worker caches (client/slots.py).
    ``push=False``: the servers never push the embeddings' rows; a worker reads a row again once its
    copy is too old for the staleness bound (``push: false``, for rows each worker reads rarely).
    ``lapse``: a worker's subscription to an embedding row ends after that many of its clocks without
    reading it (``tables.X.lapse``): rows a worker stopped using are pushed to it no more.
    ``dense_staleness``: the staleness of the dense parameters' table alone (over ``staleness``; None:
    the same as the embeddings'). Every worker changes every dense parameter at every step, so a stale
    read of them costs more than one of the embeddings' rows, which a step touches a few of.
    ``dense="allreduce"`` (hybrid mode, ``PSModule(..., dense="allreduce")``): no table for the dense
    parameters, which the workers keep in sync by all-reduce.
    ``backup``: the dense parameters' table with backup workers (a ``backup:`` entry, e.g.
    ``{"mode": "dynamic", "lr": 0.05}``; docs/design.md, "Backup workers"): synchronous SGD whose
    servers step from the first k_t of the workers' gradients; train it with
    ``ServerOptimizer(model, "sgd", lr=backup["lr"])``. The embeddings' tables get the same entry
    (``storage="dense"``): each step's gradient is the dense one and the rows the batch touched.
    """
    check_mode(dense)
    if storage not in ("dense", "sparse"):
        raise ValueError(f"storage: dense or sparse, got {storage!r}")
    layout = Layout.of(model, prefix, row_width)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if backup is not None:
        if dense != "ps":
            raise ValueError("backup: the dense parameters in the PS (dense='ps'); hybrid mode's all-reduce is not "
                             "a synchronous table")
        if layout.sparse and storage != "dense":
            raise ValueError("backup: the embeddings' tables must be storage='dense' (a backup table's accepted sum "
                             "and last mean gradient are indexed by the share's rows)")
        if update not in ("add", "sgd"):
            raise ValueError(f"backup: the servers take plain SGD steps (backup.lr), not {update!r}")
        update, lr, update_args = "add", None, None
    args = step_args(update, lr, update_args)
    entries: dict[str, dict[str, Any]] = {}

    if dense_staleness is not None and (dense_staleness < 0 or isinstance(dense_staleness, bool)):
        raise ValueError(f"dense_staleness: a number of clocks >= 0, or None, got {dense_staleness!r}")

    def entry(name: str, rows: int, cols: int, values: np.ndarray | None, start: Mapping[str, Any] | None = None,
              sparse: bool = False, embedding: bool = False) -> None:
        if values is not None:
            file = out / f"{name}.npy"
            np.save(file, values)
            start = {"file": str(file.resolve())}
        e: dict[str, Any] = {"cols": cols, "dtype": layout.dtype, "update": update, "update_args": dict(args),
                             "init": dict(start or {})}
        if rows < UNBOUNDED:
            e["rows"] = rows
        if sparse:
            e["storage"] = "sparse"
            if cache_rows is not None:
                e["cache_rows"] = cache_rows
        if embedding and not push:
            e["push"] = False
        elif embedding and lapse:
            e["lapse"] = lapse
        if staleness is not None:
            e["staleness"] = staleness
        if dense_staleness is not None and not embedding:
            e["staleness"] = dense_staleness
        if backup is not None:
            e["backup"] = dict(backup)
        if wire_dtype is not None:
            e["wire_dtype"] = wire_dtype
        entries[name] = e

    if layout.slots and dense == "ps":
        values = layout.values(model)
        entry(layout.table, values.shape[0], values.shape[1], values)
    params = dict(model.named_parameters())
    modules = dict(model.named_modules())
    for e in layout.sparse:
        m = modules[e.module]
        if getattr(m, "padding_idx", None) is not None and (e.remote or storage == "sparse" or init is not None):
            raise ValueError(f"embedding {e.module}: padding_idx is a row kept at zero, which a server-side "
                             "initializer does not give; leave it out (or keep the table dense, from the model)")
        if e.rows == UNBOUNDED and storage != "sparse":
            raise ValueError(f"embedding {e.module}: takes any 64-bit id (no num_embeddings), so only a sparse "
                             "table holds it: declare(..., storage='sparse')")
        if e.remote or storage == "sparse" or init is not None:
            start = init if init is not None else m.init if isinstance(m, PSEmbedding) else DEFAULT_INIT
            entry(e.table, e.rows, e.cols, None, start, storage == "sparse", embedding=True)
        else:
            entry(e.table, e.rows, e.cols, params[e.param].detach().cpu().numpy(), embedding=True)
    layout_file(out / f"{layout.table}.npy").write_text(json.dumps(layout.describe()))
    return entries


def layout_file(init_file: str | Path, table: str | None = None) -> Path:
    """Where ``declare`` saved the layout beside a table's initial values ``init_file``: named for the
    model's dense table (``table``; by default the one ``init_file`` belongs to)."""
    p = Path(init_file)
    return p.with_name(f"{table or p.name[:-len('.npy')]}.layout.json")
