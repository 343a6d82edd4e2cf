"""Optimizers for a ``PSModule``: the training loop keeps ``zero_grad()`` / ``backward()`` / ``step()``.

- ``ServerOptimizer(model, "sgd" | "adagrad" | "adarevision", lr=...)`` pushes raw gradients; the
  table's stored procedure takes the step on the servers (one float32 master copy, no optimizer
  state on the workers).
- ``DeltaOptimizer(model, torch_optimizer)`` steps any local torch optimizer and pushes the change
  of the parameters, on an ``add`` table whose cache shows this worker's own deltas at once.

In hybrid mode (``PSModule(..., dense="allreduce")``) both first average the dense gradients over the
workers (``model.sync()``); the dense parameters are then stepped here, by the same local torch
optimizer on every rank (``ServerOptimizer``: torch's namesake of the servers' procedure, or the
``dense=`` optimizer given), and only the embeddings' part goes to the servers.
"""

from __future__ import annotations

import torch

from bosen.apps.pytorch.module import PSModule
from bosen.apps.pytorch.tables import STEP_ARG
from bosen.errors import ConfigError, UsageError


class _PSOptimizer:
    def __init__(self, model: PSModule) -> None:
        if not isinstance(model, PSModule):
            raise TypeError(f"expected a PSModule, got {type(model).__name__}: wrap the model first")
        self.model = model

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.model.module.zero_grad(set_to_none=set_to_none)
        for emb in self.model.remote.values():
            emb.zero_grad_rows()

    def _table_error(self, what: str) -> ConfigError:
        return ConfigError(f"{self.model.client.config.source}: table {self.model.layout.table} {what}")


class ServerOptimizer(_PSOptimizer):
    """Pushes gradients for the table's stored procedure ``name`` with step size ``lr``; both must be
    what the tables were declared with (``declare(..., update=name, lr=lr)``), which the servers run."""

    def __init__(self, model: PSModule, name: str, lr: float, *, dense: torch.optim.Optimizer | None = None) -> None:
        super().__init__(model)
        if name not in STEP_ARG:
            raise ValueError(f"ServerOptimizer: {name!r} is not a server optimizer (one of {', '.join(STEP_ARG)})")
        self.dense = self._dense_optimizer(name, lr, dense)
        backup = getattr(model, "backup", None)
        if backup is not None:  # the servers step with backup.lr (docs/design.md, "Backup workers")
            if name != "sgd" or abs(backup.lr - lr) > 1e-12 * max(1.0, abs(lr)):
                raise self._table_error(f"has backup workers, whose servers take SGD steps of lr={backup.lr}: "
                                        f"use ServerOptimizer(model, 'sgd', lr={backup.lr})")
            self.name, self.lr = name, lr
            self._grads = torch.zeros(model.flat.numel(), dtype=model.flat.dtype)
            return
        if model.update is not None and model.update != name:
            raise self._table_error(f"applies {model.update!r} on the servers, not {name!r}: declare the tables "
                                    f"with update={name!r}")
        cfg = model.config_entry
        if cfg is not None:
            have = cfg.update_args.get(STEP_ARG[name])
            if have is None or abs(float(have) - lr) > 1e-12 * max(1.0, abs(lr)):
                raise self._table_error(f"steps with {STEP_ARG[name]}={have} on the servers, not lr={lr}: "
                                        "declare the tables with the same lr")
        self.name, self.lr = name, lr
        self._grads = torch.zeros(model.flat.numel(), dtype=model.flat.dtype)

    def _dense_optimizer(self, name: str, lr: float,
                         given: torch.optim.Optimizer | None) -> torch.optim.Optimizer | None:
        """Hybrid mode: the local optimizer of the dense parameters (``given``, else torch's SGD or
        AdaGrad as the servers run them); PS mode: None (``given`` is then an error)."""
        m = self.model
        if m.allreduce is None:
            if given is not None:
                raise ValueError("ServerOptimizer: dense= is for hybrid mode (PSModule(..., dense='allreduce')); "
                                 "here the servers step the dense parameters")
            return None
        if given is not None:
            return given
        if name == "sgd":
            return torch.optim.SGD(m.params, lr=lr)
        if name == "adagrad":  # the servers' AdaGrad: accumulator from near 0 (declare's init_z)
            return torch.optim.Adagrad(m.params, lr=lr, eps=1e-10)
        raise ConfigError(f"ServerOptimizer: torch has no {name!r}; in hybrid mode pass the dense parameters' "
                          "optimizer: ServerOptimizer(model, ..., dense=torch.optim.X(model.params, ...))")

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        if self.dense is not None:
            self.dense.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        m = self.model
        if m.overlap:
            dense = m.push_rest()  # the rest of the buckets the backward pushed
        elif m.allreduce is not None:
            m.sync()
            dense = any(p.grad is not None for p in m.params)
        else:
            dense = m.gradients(self._grads)
        rows = m.sparse_gradients()
        if not dense and not rows:
            raise UsageError("step() before backward(): no parameter has a gradient")
        if self.dense is not None:
            self.dense.step()
        block = self._grads.numpy() if dense and m.table is not None and not m.overlap else None
        m.push(block, rows)


class DeltaOptimizer(_PSOptimizer):
    """Steps ``optimizer`` (built on ``model.parameters()``) here and pushes the parameters' change."""

    def __init__(self, model: PSModule, optimizer: torch.optim.Optimizer) -> None:
        super().__init__(model)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if model.remote:
            names = ", ".join(model.layout.sparse[i].module for i in model.remote)
            raise ConfigError(f"DeltaOptimizer steps a local torch optimizer over local weights; the PSEmbedding "
                              f"{names} has none (its rows stay in the parameter server): use ServerOptimizer")
        if getattr(model, "backup", None) is not None:
            raise ConfigError(f"DeltaOptimizer pushes parameter deltas; the model's tables have backup workers, whose "
                              f"servers take gradients: use ServerOptimizer(model, 'sgd', lr={model.backup.lr})")
        if model.overlap:
            raise ConfigError("DeltaOptimizer pushes the change after its local step, which the backward's "
                              "per-bucket pushes cannot send: PSModule(..., overlap=True) is for ServerOptimizer")
        if model.update not in ("add", None):
            raise self._table_error(f"applies {model.update!r} on the servers, which takes gradients: "
                                    "DeltaOptimizer pushes parameter deltas and needs update='add' "
                                    "(or use ServerOptimizer)")
        ours = {id(p) for p in [*model.params, *model.local.values()]}
        theirs = {id(p) for g in optimizer.param_groups for p in g["params"]}
        if theirs != ours:
            raise ValueError("DeltaOptimizer: the torch optimizer must be built on model.parameters() "
                             f"({len(theirs & ours)} of its {len(theirs)} parameters are the model's {len(ours)})")
        self.optimizer = optimizer

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        m = self.model
        m.sync()  # hybrid mode: the dense gradients averaged over the workers
        touched = [(i, rows) for i, rows, _ in m.sparse_gradients()]
        if not touched and all(p.grad is None for p in m.params):
            raise UsageError("step() before backward(): no parameter has a gradient")
        # the dense change: against the values pulled, in one pass (the view's push); without a pull
        # since the last push (steps without a forward) against a copy taken now
        before = m.values() if m.table is not None and not m.pulled else None
        rows_before = [m.local[i].detach()[rows].clone() for i, rows in touched]
        self.optimizer.step()
        dense = None
        if before is not None:
            dense = m.values()
            dense -= before
        deltas = [(i, rows, m.local[i].detach()[rows].cpu() - old.cpu())
                  for (i, rows), old in zip(touched, rows_before, strict=True)]
        m.push(dense, deltas, changed=m.table is not None and before is None)
