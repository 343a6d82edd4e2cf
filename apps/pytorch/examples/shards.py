"""The PyTorch examples' micro-tasks: training shards that keep their own place in the data.

A task (apps/microtasks.py) is a fixed shard of the training samples with its own generator, its
epoch's sample order (positions in the shard, drawn by that generator when an epoch starts) and its
step count, so it takes the same mini-batches whichever worker runs it. Every task takes the same
number of mini-batches per epoch (:class:`Schedule`), so the job's clocks keep in step: one clock is
``clock_every`` mini-batches of each task a worker owns. Their state goes into checkpoints and
hand-offs as the arrays ``rng``, ``order`` and ``steps`` (no pickle).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from bosen.apps.state import rng_state, set_rng_state
from bosen.errors import ConfigError

STATE = ("rng", "order", "steps")  # a shard's arrays in checkpoints and hand-offs


class Schedule:
    """``steps`` mini-batches of ``batch`` samples per task and epoch (the smallest shard's, of ``n``
    samples in ``tasks`` shards), in ``clocks`` clocks of ``every`` steps (an epoch's last one the rest)."""

    def __init__(self, n: int, tasks: int, batch: int, every: int) -> None:
        self.batch, self.every = batch, every
        self.steps = (n // tasks) // batch
        if self.steps < 1:
            raise ConfigError(f"app.args: {n} training samples in {tasks} micro-tasks give a task no batch of "
                              f"{batch} (fewer micro_tasks or workers, or a smaller batch_size)")
        self.clocks = -(-self.steps // every)

    def span(self, c: int) -> tuple[int, int]:
        """Each task's steps in clock ``c`` (counted from the job's start): [lo, hi)."""
        e, part = divmod(c, self.clocks)
        base = e * self.steps
        return base + part * self.every, base + min((part + 1) * self.every, self.steps)


class Shard:
    """One task's place in its ``n`` samples: generator, the epoch's order, the steps it did."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.rng = n, np.random.default_rng(seed)
        self.order = np.arange(n, dtype=np.int64)
        self.steps = 0

    def batch(self, step: int, s: Schedule) -> torch.Tensor:
        """The positions of step ``step``'s samples; the first step of an epoch draws its order."""
        i = step % s.steps
        if i == 0:
            self.order = self.rng.permutation(self.n).astype(np.int64)
        return torch.from_numpy(self.order[i * s.batch:(i + 1) * s.batch])

    def peek(self, step: int, s: Schedule) -> torch.Tensor | None:
        """Step ``step``'s positions without drawing (None if it starts an epoch: not drawn yet)."""
        i = step % s.steps
        return None if i == 0 else torch.from_numpy(self.order[i * s.batch:(i + 1) * s.batch])

    def state(self) -> dict[str, np.ndarray]:
        return {"rng": rng_state(self.rng), "order": self.order, "steps": np.array([self.steps], dtype=np.int64)}

    def load(self, st: Mapping[str, np.ndarray], t: int, step: int, source: str) -> None:
        """Task ``t``'s saved or handed-off state, which must be at ``step`` (the clock's first)."""
        if st["order"].shape != (self.n,) or int(st["steps"][0]) != step:
            raise ConfigError(f"{source}: micro-task {t} was saved with {st['order'].size} samples at step "
                              f"{int(st['steps'][0])}, this job gives it {self.n} at step {step}: another "
                              "train_samples, batch_size or clock_every?")
        set_rng_state(self.rng, st["rng"])
        self.order = np.asarray(st["order"], dtype=np.int64).copy()
        self.steps = step
