"""A small CNN on Fashion-MNIST, its parameters in the PS (``configs/torch-cnn.yaml``).

Each worker trains on its shard of the 60k training images (every P-th one) in mini-batches, through
``PSModule`` and a server-side optimizer (or a local torch optimizer pushing deltas); rank 0 scores
the 10k test images at the end of every epoch (``heldout_correct`` / ``heldout_total``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bosen.apps.datasets.images import fashion_sources, read_idx
from bosen.apps.protocol import PSClient
from bosen.apps.pytorch import DeltaOptimizer, PSModule, ServerOptimizer, declare
from bosen.config import check, from_dict

SERVER = ("sgd", "adagrad", "adarevision")


@dataclass(frozen=True)
class CNNArgs:
    """``app.args`` of the CNN example."""

    # delta-*: a local torch optimizer pushing deltas; its worker sees its own steps at once (read-my-
    # writes), which the server-side optimizers (sgd, adagrad, adarevision) cannot offer inside a clock
    optimizer: Literal["sgd", "adagrad", "adarevision", "delta-sgd", "delta-adam"] = "delta-sgd"
    lr: float = 0.1
    # delta-sgd only; P workers' momenta add up (an effective step of about P * lr / (1 - momentum)),
    # so asynchronous momentum needs a smaller lr
    momentum: float = 0.0
    batch_size: int = 64
    epochs: int = 2
    clock_every: int = 4  # optimizer steps per clock tick
    train_samples: int = 0  # first N training images (0: all 60,000)
    test_samples: int = 0  # first N test images (0: all 10,000)
    threads: int = 1  # torch intra-op threads per worker
    seed: int = 0

    def __post_init__(self) -> None:
        check(self.lr > 0, "lr: must be > 0")
        check(0 <= self.momentum < 1, "momentum: must be in [0, 1)")
        check(self.batch_size >= 1, "batch_size: must be >= 1")
        check(self.epochs >= 1, "epochs: must be >= 1")
        check(self.clock_every >= 1, "clock_every: must be >= 1")
        check(self.train_samples >= 0 and self.test_samples >= 0, "train_samples, test_samples: must be >= 0")
        check(self.threads >= 1, "threads: must be >= 1")


class Net(nn.Module):
    """Two 5x5 convolutions with max pooling, then one linear layer: 18,378 parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5)
        self.conv2 = nn.Conv2d(16, 32, 5)
        self.fc = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def tables(args: Mapping[str, Any], out_dir: Path) -> dict[str, dict[str, Any]]:
    """``app.tables``: the model's table, its initial values from a seeded ``Net()``."""
    a: CNNArgs = from_dict(CNNArgs, args, "app.args")
    torch.manual_seed(a.seed)
    if a.optimizer in SERVER:
        return declare(Net(), out_dir, update=a.optimizer, lr=a.lr)
    return declare(Net(), out_dir)


def images(train: bool, limit: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Fashion-MNIST as (N, 1, 28, 28) float32 in [0, 1] and int64 labels (the Debian package's files)."""
    s = fashion_sources()
    x = read_idx(s["train_x" if train else "test_x"], 3)
    y = read_idx(s["train_y" if train else "test_y"], 1)
    if limit:
        x, y = x[:limit], y[:limit]
    return (torch.from_numpy(x.astype(np.float32) / 255.0).unsqueeze(1),
            torch.from_numpy(y.astype(np.int64)))


def optimizer(a: CNNArgs, model: PSModule) -> ServerOptimizer | DeltaOptimizer:
    if a.optimizer in SERVER:
        return ServerOptimizer(model, a.optimizer, lr=a.lr)
    if a.optimizer == "delta-sgd":
        return DeltaOptimizer(model, torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum))
    return DeltaOptimizer(model, torch.optim.Adam(model.parameters(), lr=a.lr))


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[int, float]:
    """Correct predictions and summed cross-entropy over ``x`` (in batches of 1000)."""
    correct, loss = 0, 0.0
    with torch.no_grad():
        for lo in range(0, x.shape[0], 1000):
            out = model(x[lo:lo + 1000])
            correct += int((out.argmax(1) == y[lo:lo + 1000]).sum())
            loss += float(F.cross_entropy(out, y[lo:lo + 1000], reduction="sum"))
    return correct, loss


def train(client: PSClient, args: Mapping[str, Any]) -> None:
    a: CNNArgs = from_dict(CNNArgs, args, "app.args")
    torch.set_num_threads(a.threads)
    x, y = images(True, a.train_samples)
    mine = np.arange(client.rank, x.shape[0], client.num_workers)
    # every worker takes the same number of steps, so the job's clocks line up
    steps = (x.shape[0] // client.num_workers) // a.batch_size
    test = images(False, a.test_samples) if client.rank == 0 else None
    model = PSModule(Net(), client, clock_every=a.clock_every)
    opt = optimizer(a, model)
    rng = np.random.default_rng(a.seed * 1000 + client.rank)
    start = model.resume()  # steps done before a checkpoint this job resumed from
    for epoch in range(a.epochs):
        order = torch.from_numpy(rng.permutation(mine)[:steps * a.batch_size])  # drawn every epoch
        first = min(max(start - epoch * steps, 0), steps)
        if first == steps:
            continue
        loss_sum, t0 = 0.0, time.perf_counter()
        for i in range(first, steps):
            idx = order[i * a.batch_size:(i + 1) * a.batch_size]
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_sum += float(loss) * idx.shape[0]
        fields: dict[str, Any] = {"compute_s": time.perf_counter() - t0, "pull_s": model.pull_s,
                                  "push_s": model.push_s}
        if test is not None:
            correct, hloss = accuracy(model, *test)
            fields.update(heldout_correct=correct, heldout_total=int(test[1].shape[0]), heldout_loss=hloss)
        client.report(objective=loss_sum, samples=(steps - first) * a.batch_size, **fields)


if __name__ == "__main__":
    from bosen.apps.runner import run_app

    run_app(train)
