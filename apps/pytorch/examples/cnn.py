"""A small CNN on Fashion-MNIST, its parameters in the PS (``configs/torch-cnn.yaml``).

The 60k training images are cut into ``micro_tasks`` shards (apps/microtasks.py; 0: one per worker),
task t every T-th image from image t. Each task keeps its own generator, its epoch's order of its
images and its step count, so it takes the same mini-batches whichever worker runs it, and tasks
move between workers at clock boundaries (``bosen scale``, a resume with another worker count, a
lost worker's tasks restored). One clock is ``clock_every`` steps of every task a worker owns (its
steps interleaved task by task), through ``PSModule`` and a server-side optimizer (or a local torch
optimizer pushing deltas). Every worker reports each clock; rank 0 also scores the 10k test images
at the end of every epoch (``heldout_correct`` / ``heldout_total``).

With ``backup`` the model's table is synchronous (docs/design.md, "Backup workers"): a step is every
worker's gradient of w_t, drawn from the worker's micro-tasks (static k = the workers: the job scales
as MLR's) or from the whole training set (backup workers proper), and the servers take SGD steps of
``lr``. ``goodput`` on it is Pollux's agent (apps/goodput.py): the step's batch and learning-rate gain
follow the goodput (``configs/torch-cnn-goodput.yaml``).

With ``dense: allreduce`` (hybrid mode, apps/pytorch/allreduce.py) no table holds the model: every
worker keeps it, its gradients are averaged by all-reduce and a local torch optimizer (``delta-sgd``,
``delta-adam``) takes the same step on every rank, in lockstep (one PS clock an iteration, for the
agent's table). ``goodput`` there is Pollux's agent for Adam: the learning rate by the square-root rule
and the efficiency of that rule, √((φ + M0)/(φ + M)) of the plain φ (``bosen.goodput.efficiency``;
``configs/torch-cnn-adam-goodput.yaml``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bosen.apps import goodput as gp
from bosen.apps import microtasks
from bosen.apps.datasets.images import fashion_sources, read_idx
from bosen.apps.protocol import PSClient
from bosen.apps.pytorch import DeltaOptimizer, PSModule, ServerOptimizer, declare
from bosen.apps.pytorch.examples.shards import STATE, Schedule, Shard
from bosen.apps.state import restored
from bosen.config import check, follows_workers, from_dict
from bosen.errors import ConfigError

ELASTIC = True  # workers may join and leave a running job (bosen scale): micro-tasks move to them
SYNC_ELASTIC = True  # its synchronous path (a backup table) reads the task plan at every clock too

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
    clock_every: int = 4  # optimizer steps of each micro-task per clock tick
    train_samples: int = 0  # first N training images (0: all 60,000)
    test_samples: int = 0  # first N test images (0: all 10,000)
    threads: int = 1  # torch intra-op threads per worker
    seed: int = 0
    micro_tasks: int = 0  # training shards that can move between workers; 0 = one per worker
    # the model's table with backup workers (a ``backup:`` entry, e.g. {mode: static, k: 2}; its lr is
    # ``lr``): synchronous SGD on the servers, ``iterations`` steps (0: ``epochs`` at M0)
    backup: dict[str, Any] | None = None
    iterations: int = 0
    eval_every: int = 0  # synchronous: rank 0 scores the test images every so many iterations (and the last)
    # Pollux's agent on the synchronous table (or in hybrid mode): the batch and learning rate follow the goodput
    goodput: gp.GoodputArgs | None = None
    # hybrid mode: "allreduce" keeps the model in every worker, its gradients averaged by all-reduce and
    # stepped by the local torch optimizer (delta-sgd, delta-adam), ``iterations`` steps in lockstep
    dense: Literal["ps", "allreduce"] = "ps"

    def __post_init__(self) -> None:
        check(self.lr > 0, "lr: must be > 0")
        check(0 <= self.momentum < 1, "momentum: must be in [0, 1)")
        check(self.batch_size >= 1, "batch_size: must be >= 1")
        check(self.epochs >= 1, "epochs: must be >= 1")
        check(self.clock_every >= 1, "clock_every: must be >= 1")
        check(self.train_samples >= 0 and self.test_samples >= 0, "train_samples, test_samples: must be >= 0")
        check(self.threads >= 1, "threads: must be >= 1")
        check(self.micro_tasks >= 0, "micro_tasks: must be >= 0 (0 = one per worker)")
        check(self.iterations >= 0 and self.eval_every >= 0, "iterations, eval_every: must be >= 0")
        check(self.backup is None or self.optimizer == "sgd",
              f"optimizer: with backup the servers take SGD steps: sgd, got {self.optimizer!r}")
        if self.dense == "allreduce":
            check(self.backup is None and self.micro_tasks == 0 and self.optimizer in ("delta-sgd", "delta-adam"),
                  f"dense: allreduce steps a local torch optimizer on every rank in lockstep: optimizer delta-sgd or "
                  f"delta-adam, no backup, no micro_tasks (got optimizer {self.optimizer!r}, backup "
                  f"{self.backup!r}, micro_tasks {self.micro_tasks})")
        check(self.goodput is None or self.backup is not None or self.dense == "allreduce",
              "goodput: Pollux's agent needs a synchronous step: give backup: {mode: static, k: <workers>} (the "
              "servers' SGD) or dense: allreduce (a local torch optimizer)")
        if self.goodput is not None and self.optimizer == "delta-adam":
            check(self.goodput.rule != "adascale",
                  "goodput.rule: adascale is SGD's gain; Adam takes sqrt (the square-root rule, P:258) or linear")
        if self.goodput is not None and self.eval_every:
            check(self.eval_every % self.goodput.interval_clocks == 0,
                  f"eval_every: with goodput, a multiple of goodput.interval_clocks ({self.goodput.interval_clocks}): "
                  f"an evaluation then delays only an interval's first step, which the agent does not time")


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
    if a.dense == "allreduce":
        return declare(Net(), out_dir, dense="allreduce")  # no table: the workers keep the model
    if a.backup is not None:
        return declare(Net(), out_dir, backup={"lr": a.lr, **a.backup})
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
    if a.backup is not None:
        _train_sync(client, a, x, y)
        return
    if a.dense == "allreduce":
        _train_hybrid(client, a, x, y)
        return
    saved = client.restored_state()
    T = microtasks.count(a.micro_tasks, client.num_workers, saved)
    tasks, received, plan, folder = microtasks.start(T, client.rank, client.num_workers, saved)
    sched = Schedule(x.shape[0], T, a.batch_size, a.clock_every)
    test = images(False, a.test_samples) if client.rank == 0 else None
    model = PSModule(Net(), client, clock_every=0)  # a tick is every owned task's clock_every steps
    opt = optimizer(a, model)
    c, source = 0, client.config.source  # clocks done

    def shard(t: int) -> Shard:  # task t: every T-th image from image t, rank t's generator of before
        return Shard(len(range(t, x.shape[0], T)), a.seed * 1000 + t)

    mine = {t: shard(t) for t in tasks.mine}
    # a checkpoint holds the clocks done and each task's generator, epoch order and steps
    client.checkpoint_state(lambda: {"tick": np.array([c]), **microtasks.pack({t: k.state() for t, k in mine.items()})})
    if saved is not None:
        got = restored(saved, ("tick",))
        assert got is not None
        c = int(got["tick"][0])
        for t, st in microtasks.unpack(saved, mine, STATE).items():
            mine[t].load(st, t, sched.span(c)[0], source)
    if (joined := microtasks.join_clock()) is not None:  # its tasks as their givers left them
        c = joined
        for t, st in received.items():
            mine[t].load(st, t, sched.span(c)[0], source)
    if plan is not None:  # no boundary at or past the training's end: nothing would run on a moved task
        plan.ends_at(a.epochs * sched.clocks)
    while c < a.epochs * sched.clocks:
        lo, hi = sched.span(c)
        loss_sum, n, t0 = 0.0, 0, time.perf_counter()
        for step in range(lo, hi):
            for t, k in mine.items():  # the tasks' steps interleaved: one mini-batch of each in turn
                idx = k.batch(step, sched) * T + t  # positions in the shard -> image ids
                loss = F.cross_entropy(model(x[idx]), y[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
                k.steps += 1
                loss_sum += float(loss) * idx.shape[0]
                n += idx.shape[0]
        fields: dict[str, Any] = {"compute_s": time.perf_counter() - t0, "pull_s": model.pull_s,
                                  "push_s": model.push_s}
        if test is not None and hi % sched.steps == 0:  # the end of an epoch
            correct, hloss = accuracy(model, *test)
            fields.update(heldout_correct=correct, heldout_total=int(test[1].shape[0]), heldout_loss=hloss)
        client.report(objective=loss_sum, samples=n, **fields)
        c += 1
        model.clock()
        if plan is not None and folder is not None and (new := plan.at(c, T)) is not None:
            # a new assignment from this clock on: hand tasks off, take the received ones
            got_states = tasks.handoff(c, new, folder, partial(_state, mine))
            if plan.leaving(end=client.end_clocks):  # its tasks are given away: it leaves here (BYE on close)
                break
            mine = {t: mine[t] if t in mine else shard(t) for t in tasks.mine}
            for t, st in got_states.items():
                mine[t].load(st, t, sched.span(c)[0], source)
    model.close()  # the read ahead in flight ends before the runner closes the client


def _train_sync(client: PSClient, a: CNNArgs, x: torch.Tensor, y: torch.Tensor) -> None:
    """A synchronous table: each iteration this worker's mean gradient of ``batch_size`` images at w_t;
    the servers step. Where every worker's gradient is applied (static k = the workers) the images
    come from the micro-tasks the worker runs (``microtasks.Draws``: each task's images once per its
    pass, whichever worker runs it), which move at a ``bosen scale`` boundary, so the job's workers can
    change as MLR's; with backup workers proper each worker draws from the whole training set (as DBW
    assumes every worker holds the data) and the tasks only say who is in the job. With ``goodput``
    the batch is the agent's m·(s + 1), computed in micro-batches (``_accumulated``) that measure the
    gradient statistics, and the pushed gradient is scaled by the agent's gain (the servers' step is
    ``lr`` times the mean pushed: AdaScale's rate). Per iteration it reports ``objective``,
    ``samples``, ``iteration``, ``compute_s`` (and the agent's fields); rank 0 scores the test images
    every ``eval_every`` iterations and at the last (w of the last iteration's start)."""
    rank, workers = client.rank, client.num_workers
    total = a.iterations or a.epochs * -(-x.shape[0] // (workers * a.batch_size))
    test = images(False, a.test_samples) if rank == 0 else None
    model = PSModule(Net(), client)
    opt = ServerOptimizer(model, "sgd", lr=a.lr)
    flat = torch.zeros(model.flat.numel(), dtype=model.flat.dtype)
    saved = client.restored_state()
    T = microtasks.count(a.micro_tasks, workers, saved)
    tasks, received, plan, folder = microtasks.start(T, rank, workers, saved)
    spec = cast(Any, client.config).table(model.table.name).backup if model.table is not None else None
    draws: microtasks.Draws | None = None
    gen = torch.Generator().manual_seed(a.seed * 1000 + rank)
    if spec is not None and follows_workers(spec, workers):
        draws = microtasks.Draws(x.shape[0], tasks.mine, T, a.seed)
        if saved is not None:
            draws.load(microtasks.unpack(saved, draws.tasks, microtasks.Draws.NAMES), client.config.source)
        if microtasks.join_clock() is not None:  # its tasks as their givers left them
            draws.load(received, client.config.source)
        client.checkpoint_state(lambda: microtasks.pack({t: draws.state(t) for t in draws.tasks})
                                if draws is not None else {})
    else:  # backup workers proper: the rank's sampler over the whole set is its checkpoint state, so a
        # resumed or replaced worker draws on where it was (a rank the checkpoint has none of starts afresh)
        client.checkpoint_state(lambda: {SAMPLER_STATE: gen.get_state().numpy().copy()})
        if saved is not None and SAMPLER_STATE in saved:
            _load_generator(gen, saved[SAMPLER_STATE], client.config.source)

    def draw(b: int) -> torch.Tensor:
        if draws is not None:
            return torch.from_numpy(draws.draw(b))
        return torch.randint(0, x.shape[0], (b,), generator=gen)

    agent = None
    if a.goodput is not None:  # a push of the table a step: what the client's bandwidth budget paces
        agent = gp.start(client, a.goodput, a.batch_size, float(model.flat.numel() * model.flat.element_size()))
    left = False
    if plan is not None:  # no boundary at or past the last iteration's end: nothing would run on a moved task
        plan.ends_at(total)

    def boundary() -> bool:
        """After a clock: where the job's workers change from this clock on, hand tasks off and draw from
        ours; False: this worker left the job here (as MLR's ``_train_sync``)."""
        nonlocal draws, left
        tick = cast(Any, client).tick  # bosen.client.Client's
        if plan is None or folder is None or (new := plan.at(tick, T)) is None:
            return True
        kept = {t: draws.state(t) for t in draws.tasks if new[t] == rank} if draws is not None else {}
        given = tasks.mine
        first = int(given[0]) if given.size and not (new == rank).any() and agent is not None else -1

        def state(t: int) -> dict[str, np.ndarray]:
            st = draws.state(t) if draws is not None else {}
            if t == first and agent is not None:  # a leaver's goodput sums of the interval in progress
                st[gp.HANDED] = agent.hand_over()
            return st
        got_states = tasks.handoff(tick, new, folder, state)
        if plan.leaving(end=client.end_clocks):  # its clocks end here: nobody's step waits on it meanwhile
            left = True
            return False
        for got in got_states.values():
            if agent is not None and gp.HANDED in got:
                agent.take_over(got[gp.HANDED])
        if draws is not None:
            draws = microtasks.Draws(x.shape[0], tasks.mine, T, a.seed)
            draws.load({**kept, **got_states}, client.config.source)
        return True

    def skipping(it: int) -> None:
        """Before the clock of an iteration passed without a gradient: where every gradient is applied
        only a replacement clocks so, and its lost process drew that iteration's images from the
        tasks: drawn and dropped here (the agent's m·(s + 1) with goodput; before the clock, as a step
        draws), so this worker's batches stay the lost one's (as MLR's)."""
        if draws is not None:
            draws.draw(a.batch_size if agent is None else (st := agent.skipped(it, tasks.workers)).m * (st.s + 1))

    while True:
        model.pull(boundary, skipping)  # w_t, and t (a dropped gradient's worker clocks up to it, through boundaries)
        it = model.iteration
        if left or it >= total:
            break
        t0 = time.perf_counter()
        fields: dict[str, Any] = {}
        if agent is None:
            idx = draw(a.batch_size)
            opt.zero_grad()
            loss = F.cross_entropy(model.module(x[idx]), y[idx])
            loss.backward()
            model.gradients(flat)
            objective, samples, block = float(loss) * a.batch_size, a.batch_size, flat.numpy()
        else:
            st = agent.at(it, t0, tasks.workers)
            objective, block, pieces, each = _accumulated(model, x, y, gen, st.m, st.s, idx=draw(st.m * (st.s + 1)))
            if pieces is not None:
                agent.rec.moments(pieces, each)
            block *= st.gain  # the learning-rate gain: the servers step with lr times the mean pushed
            samples = st.m * (st.s + 1)
            fields.update(agent.fields(rank, a.lr))
        compute_s = time.perf_counter() - t0
        if agent is not None:
            agent.computed(compute_s)
        if test is not None and (it == total - 1 or (a.eval_every and it % a.eval_every == 0)):
            correct, hloss = accuracy(model.module, *test)  # w_t
            fields.update(heldout_correct=correct, heldout_total=int(test[1].shape[0]), heldout_loss=hloss)
        client.report(objective=objective, samples=samples, iteration=it, compute_s=compute_s, **fields)
        if agent is not None:
            agent.before_clock(it)  # the interval's row goes out with this iteration's clock
        model.push(block.astype(np.float32, copy=False))  # the gradient, and the clock
        if not boundary():
            break
    model.close()


def _accumulated(model: PSModule, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator, m: int, s: int,
                 measure: bool = True, idx: torch.Tensor | None = None
                 ) -> tuple[float, np.ndarray, np.ndarray | None, int]:
    """One step of the agent's setting: s + 1 micro-batches of m images (accumulation), or m in two
    halves when s = 0, so that the step's micro-batch gradients (the flat dense gradient of each)
    measure the gradient statistics (``Recorder.moments``; ``measure`` false: one piece). Returns the
    summed cross-entropy, the mean gradient over the step's images (float64, flat), the pieces'
    gradients (rows; None for one piece) and the images in each. Each piece's gradient comes from
    ``torch.autograd.grad``, which leaves ``.grad`` alone: hybrid mode's backward hooks, which
    all-reduce what a backward accumulates, see only the step's mean (set by ``_set_grads``)."""
    pieces = s + 1 if s > 0 else min(2, m) if measure else 1
    if idx is None:  # the step's images: drawn here from the whole set, or given (a worker's micro-tasks)
        idx = torch.randint(0, x.shape[0], (m * (s + 1),), generator=gen)
    cuts = np.linspace(0, idx.shape[0], pieces + 1).round().astype(np.int64)
    grads = np.zeros((pieces, model.flat.numel()))
    loss_sum = 0.0
    slots = model.layout.slots
    for j in range(pieces):
        piece = idx[cuts[j]:cuts[j + 1]]
        loss = F.cross_entropy(model.module(x[piece]), y[piece])  # the piece's mean
        for sl, g in zip(slots, torch.autograd.grad(loss, model.params), strict=True):
            grads[j, sl.offset:sl.offset + sl.numel] = g.reshape(-1).numpy()
        loss_sum += float(loss) * piece.shape[0]
    weights = np.diff(cuts).astype(np.float64)
    mean = weights @ grads / idx.shape[0]
    return loss_sum, mean, grads if pieces >= 2 else None, idx.shape[0] // pieces


def _set_grads(model: PSModule, flat: np.ndarray) -> None:
    """Each dense parameter's ``.grad`` from the flat gradient (hybrid mode: ``PSModule.sync`` then
    all-reduces them)."""
    for sl, p in zip(model.layout.slots, model.params, strict=True):
        p.grad = torch.from_numpy(flat[sl.offset:sl.offset + sl.numel]).to(p.dtype).view(p.shape).clone()


def _train_hybrid(client: PSClient, a: CNNArgs, x: torch.Tensor, y: torch.Tensor) -> None:
    """Hybrid mode: every worker holds the model (rank 0's initial values, broadcast), each iteration
    computes its mean gradient of ``batch_size`` images drawn from the whole training set (with
    ``goodput``: the agent's m·(s + 1) in micro-batches, ``_accumulated``), the gradients are averaged
    by all-reduce and the local optimizer steps at ``lr`` times the agent's gain (Adam: the square-root
    rule's, and its efficiency, of the plain φ: docs/design.md, "Pollux (goodput)"). One PS clock an
    iteration, so the agent's table read at staleness 0 waits for every worker's row. Reports as
    ``_train_sync`` does; rank 0 scores the model before the step of every ``eval_every``-th iteration
    and of the last."""
    rank, workers = client.rank, client.num_workers
    total = a.iterations or a.epochs * -(-x.shape[0] // (workers * a.batch_size))
    test = images(False, a.test_samples) if rank == 0 else None
    torch.manual_seed(a.seed)
    model = PSModule(Net(), client, clock_every=0, dense="allreduce")
    params = list(model.module.parameters())
    opt: torch.optim.Optimizer = (torch.optim.Adam(params, lr=a.lr) if a.optimizer == "delta-adam"
                                  else torch.optim.SGD(params, lr=a.lr, momentum=a.momentum))
    gen = torch.Generator().manual_seed(a.seed * 1000 + rank)
    agent = None
    if a.goodput is not None:  # what a step moves: the model's bytes (the all-reduce's, here)
        agent = gp.start(client, a.goodput, a.batch_size, float(model.flat.numel() * model.flat.element_size()))
    for it in range(total):
        t0 = time.perf_counter()
        fields: dict[str, Any] = {}
        if test is not None and (it == total - 1 or (a.eval_every and it % a.eval_every == 0)):
            correct, hloss = accuracy(model.module, *test)  # w_t, before its step (not timed: see eval_every)
            fields.update(heldout_correct=correct, heldout_total=int(test[1].shape[0]), heldout_loss=hloss)
        t1 = time.perf_counter()
        if agent is None:
            objective, mean, pieces, each = _accumulated(model, x, y, gen, a.batch_size, 0, measure=False)
            samples, gain = a.batch_size, 1.0
        else:
            st = agent.at(it, t0, workers)
            objective, mean, pieces, each = _accumulated(model, x, y, gen, st.m, st.s)
            samples, gain = st.m * (st.s + 1), st.gain
            fields.update(agent.fields(rank, a.lr))
        compute_s = time.perf_counter() - t1
        _set_grads(model, mean)
        model.sync()  # the mean over the workers, on every rank
        for group in opt.param_groups:
            group["lr"] = a.lr * gain
        opt.step()
        if agent is not None:
            agent.computed(compute_s)
            if pieces is not None:  # plain φ (P = I) for Adam too: the square-root rule's efficiency takes it
                agent.rec.moments(pieces, each)
        client.report(objective=objective, samples=samples, iteration=it, compute_s=compute_s, **fields)
        if agent is not None:
            agent.before_clock(it)  # the interval's row goes out with this iteration's clock
        model.clock()
    model.close()


SAMPLER_STATE = "sampler.generator"  # a DBW worker's torch generator over the whole training set (its bytes)


def _load_generator(gen: torch.Generator, state: np.ndarray, source: str) -> None:
    """Put ``gen`` back in a saved state; ConfigError if the array is not a CPU generator's state."""
    want = gen.get_state()
    if state.dtype != np.uint8 or state.shape != tuple(want.shape):
        raise ConfigError(f"{source}: the checkpoint's {SAMPLER_STATE} is {state.dtype} {state.shape}, not a CPU "
                          f"torch generator's state (uint8 {tuple(want.shape)})")
    gen.set_state(torch.from_numpy(np.ascontiguousarray(state).copy()))


def _state(tasks: Mapping[int, Shard], t: int) -> dict[str, np.ndarray]:
    return tasks[t].state()


if __name__ == "__main__":
    from bosen.apps.runner import run_app

    run_app(train)
