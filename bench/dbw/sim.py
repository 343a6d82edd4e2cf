"""DBW's experiment on a virtual clock, as the paper ran it (Xu et al. 2021, sect. 4): workers' round
trips are drawn (``bosen.apps.delays``), arrival order in virtual time decides which gradients each
step takes, and the step is the servers' own code (``server/backup.py`` ``BackupStep``, with
``bosen/backup.py``'s policy). Push & Wait: a worker whose gradient was taken waits for the step, one
whose gradient came late reads the newest value at once. Gradients are MLR's (``apps/mlr/kernels``).
Deterministic for a seed; one run takes well under a second on the digits set.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from bosen.apps.delays import DelayArgs, Delays
from bosen.apps.mlr import data as D
from bosen.apps.mlr.kernels import loss_grad
from bosen.apps.mlr.model import LocalModel
from bosen.config import BackupConfig, TableConfig
from bosen.server.backup import BackupStep


@dataclass
class Run:
    """One simulated job: when (virtual time) the training loss first reached the target."""

    time_to_target: float  # inf if not within the time limit
    steps: int
    loss: float
    k: list[int] = field(default_factory=list)
    dropped_late: int = 0


def training_loss(model: LocalModel, W: np.ndarray, ds: D.Dataset) -> float:
    model.load(W)
    return model.evaluate(ds)[1] / ds.n


def simulate(ds: D.Dataset, backup: BackupConfig, workers: int, batch: int, delay: DelayArgs, target: float,
             max_time: float, reg: float = 0.0, eval_ds: D.Dataset | None = None, max_steps: int | None = None) -> Run:
    """Train softmax regression on ``ds`` with ``workers`` virtual workers until the training loss (on
    ``eval_ds``, default ``ds``) is at most ``target``, ``max_time`` (in mean round trips) passes or
    ``max_steps`` steps were taken."""
    K, F = ds.classes, ds.features
    ev = eval_ds if eval_ds is not None else ds
    table = TableConfig(name="W", rows=K, cols=F + 1, dtype="float64", backup=backup)
    step = BackupStep(table)
    W = np.zeros((K, F + 1))
    step.create(np.arange(K, dtype=np.int64), W)
    step.start(workers, 0, 0.0)
    delays = [Delays(delay, r, workers) for r in range(workers)]
    rngs = [np.random.default_rng([delay.seed, r, 1]) for r in range(workers)]
    model = LocalModel(K, F)
    events: list[tuple[float, int, int, np.ndarray]] = []

    def begin(r: int, now: float) -> None:
        it = step.iteration
        ids = rngs[r].integers(0, ds.n, batch).astype(np.int64)
        _, g = loss_grad(ds.indptr, ds.indices, ds.values, ds.labels, ids, W)
        g /= batch
        if reg:
            g[:, :F] += reg * W[:, :F]
        heapq.heappush(events, (now + delays[r].rtt(it), r, it, g))

    for r in range(workers):
        begin(r, 0.0)
    waiting: list[int] = []
    loss = training_loss(model, W, ev)
    while events:
        now, r, it, g = heapq.heappop(events)
        if now > max_time:
            break
        step.put(r, g)
        if step.clocked(r, it + 1, now):
            loss = training_loss(model, W, ev)
            if loss <= target:
                return Run(now, step.iteration, loss, list(step.k_history), step.counts["dropped_late"])
            if max_steps is not None and step.iteration >= max_steps:
                break
            for q in [*waiting, r]:
                begin(q, now)
            waiting = []
        elif step.iteration > it:
            begin(r, now)  # came late: the newest value at once
        else:
            waiting.append(r)  # taken: waits for the step
    return Run(math.inf, step.iteration, loss, list(step.k_history), step.counts["dropped_late"])
