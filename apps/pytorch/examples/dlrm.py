"""A DLRM-style click model on Criteo-shaped data, its parameters in the PS (``configs/torch-dlrm.yaml``).

The model (Naumov et al. 2019, "Deep Learning Recommendation Model"): a bottom MLP turns the 13 dense
features into a vector of the embedding width; the 26 categorical features' embeddings are sparse
(``sparse=True``), by default fused into one ``nn.Embedding`` with per-feature row offsets (one PS
table: one read per step instead of 26, measured 4.4x faster per step), or one table per feature
(``embedding: per_feature``); a step reads and writes only the rows its batch touches, and reads the next
batch's rows in the background meanwhile; the 27 vectors
interact by pairwise dot products (or are concatenated), and a top MLP gives the click logit (binary
cross-entropy).

Tables bigger than a worker (issue 29): ``storage: sparse`` makes the embeddings ``PSEmbedding``s
over ``storage: sparse`` tables, so neither the servers nor the workers hold rows no batch touched,
and the servers start each row from the same uniform(-init_scale, init_scale) the model's own
embeddings draw from (seeded per row id: no file of every row). ``hashed: true`` gives the table
raw 64-bit ids: each (feature, id) pair hashed (``hash_ids``) into [0, table_rows), or into any
63-bit id when ``table_rows`` is 0 (a table without rows), as production DLRMs take Criteo's hashed
categorical values. ``configs/torch-dlrm-100m.yaml``: a 100M-row x 64 table.

Data: ``criteo.py``'s generator. The training samples are cut into ``micro_tasks`` contiguous shards
(apps/microtasks.py, ``shards.py``; 0: one per worker, each worker's share of before), each with its
own generator, epoch order and step count, that move between workers at clock boundaries (``bosen
scale``, a resume with another worker count, a lost worker's tasks restored); a worker generates the
shards it owns, rank 0 the held-out samples. One clock is ``clock_every`` steps of every task a
worker owns. In hybrid mode (``dense: allreduce``) every rank steps in lockstep with the others, so
each runs one task, always: such a job neither scales nor resumes with another worker count.
Rank 0 scores the held-out set ``evals_per_epoch`` times per epoch (at the end of the clock that
passes each point; every worker reports then) and reports ``heldout_auc`` (exact, over the whole
held-out set) beside the teacher's, which is the ceiling (``teacher_auc``). AUC is not a sum, so only
rank 0 reports it: the launcher's sum over workers of a field that one worker reports is that
worker's value.

``backup`` (e.g. ``{mode: static, k: 2}``, with ``optimizer: sgd``) makes every table synchronous with
backup workers (docs/design.md, "Backup workers"): ``train_sync`` runs one mini-batch an iteration per
worker and the servers step from the first k_t gradients (the MLPs' and the embedding rows touched) at
``lr`` (static: lr·k/n). Where every gradient is applied (static k = the workers) the mini-batches come
from the worker's micro-tasks (``microtasks.Draws``), whose samplers are its checkpoint state and move
at a ``bosen scale`` boundary: such a job resumes, survives a lost worker exactly and scales; with
backup workers proper (k < n) each rank draws from its own share of the samples by iteration
(``sync_batch``): it resumes with the same workers, and does not scale.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bosen.apps import microtasks
from bosen.apps.protocol import PSClient
from bosen.apps.pytorch import DeltaOptimizer, PSEmbedding, PSModule, ServerOptimizer, declare, hash_ids
from bosen.apps.pytorch.examples import criteo
from bosen.apps.pytorch.examples.shards import STATE, Schedule, Shard
from bosen.apps.state import restored
from bosen.config import UNBOUNDED, BackupConfig, check, follows_workers, from_dict
from bosen.errors import ConfigError

ELASTIC = True  # workers may join and leave a running job (bosen scale): micro-tasks move to them
SYNC_ELASTIC = True  # its synchronous path (static k = the workers) reads the task plan at every clock too

SERVER = ("sgd", "adagrad", "adarevision")


@dataclass(frozen=True)
class DLRMArgs:
    """``app.args`` of the DLRM example."""

    # sgd / adagrad / adarevision: gradients to the servers, which keep one accumulator per coordinate
    # for every worker; delta-*: a local torch optimizer pushing deltas (read-my-writes inside a clock)
    optimizer: Literal["sgd", "adagrad", "adarevision", "delta-sgd", "delta-adagrad"] = "adagrad"
    lr: float = 0.05
    batch_size: int = 128
    epochs: int = 1
    evals_per_epoch: int = 4  # held-out AUC this many times per epoch (rank 0), at equal step counts
    clock_every: int = 4  # optimizer steps of each micro-task per clock tick
    train_samples: int = 200_000  # the job's training samples, split among the workers
    test_samples: int = 20_000  # held-out samples (rank 0 scores them all)
    dim: int = 16  # embedding width (and the bottom MLP's output)
    bottom: int = 64  # hidden width of the bottom MLP
    top: int = 64  # hidden width of the top MLP
    interaction: Literal["dot", "cat"] = "dot"
    # per_feature: one nn.Embedding (one PS table) per feature; fused: the 26 features' rows end to end
    # in one nn.Embedding (row offsets per feature, as FBGEMM's table-batched embeddings do): the same
    # model and values, but a step reads and writes one table (one round trip per server, not 26)
    embedding: Literal["per_feature", "fused"] = "fused"
    init_scale: float = 0.05  # embeddings start uniform in [-init_scale, init_scale]
    max_rows: int = 10_000  # the data's cardinality cap (Criteo's largest features have 10M ids)
    zipf: float = 1.1
    data_seed: int = 0
    # dense: nn.Embedding(sparse=True), every row in each worker and server; sparse: PSEmbedding over a
    # storage: sparse table, each holds only the rows touched (fused or per_feature alike)
    storage: Literal["dense", "sparse"] = "dense"
    # the embeddings' first values: the model's own (written to a file; dense only) or drawn by the
    # servers per row id from the same uniform distribution (None: model for dense, server for sparse)
    embedding_init: Literal["model", "server"] | None = None
    hashed: bool = False  # ids (feature, id) hashed into one id space (fused only), see table_rows
    table_rows: int = 0  # with hashed: the table's rows (ids hashed mod it); 0: no bound (sparse only)
    cache_rows: int | None = None  # the most embedding rows a worker caches (sparse storage)
    # the most embedding rows a worker keeps on its device (PSModule's device cache; 0: off); with storage:
    # dense, the local weights keep each row's clock instead and are read again only where too old
    device_cache_rows: int = 0
    # servers push changed embedding rows to the workers that read them (true), or never (false): a
    # worker reads a row again once it is too old for the staleness bound (bench.torch's
    # dlrm/no-push-vs-push: on the quick case, 6% fewer bytes but no faster, so pushes stay the default)
    push: bool = True
    # a worker's subscription to an embedding row lapses after this many of its clocks without reading
    # the row (tables.X.lapse): rows it stopped using are pushed to it no more; 0: never (the default:
    # bench.torch's dlrm/lapse-vs-no-lapse moved more bytes and trained slower with 8 or 64, the read
    # sets and re-pulls costing more than the pushes saved). Not with adarevision (versioned rows)
    lapse: int = 0
    # hybrid mode (issue 31): "allreduce" keeps the MLPs in sync by all-reduce, the embeddings in the PS
    dense: Literal["ps", "allreduce"] = "ps"
    # the staleness of the dense parameters' table (dense: ps), over the job's (None: the job's). 0: every
    # worker changes every MLP weight at every step, and server AdaGrad's first steps are lr-sized, so
    # reading them stale (job staleness 2) cost 0.002-0.005 held-out AUC against DDP on bench.torch,
    # median over seeds (the embeddings' rows, a few per step, stay at the job's staleness: docs/design.md
    # "PyTorch workers", docs/performance-log.md session 44)
    dense_staleness: int | None = 0
    threads: int = 1  # torch intra-op threads per worker
    seed: int = 0  # the model's initialization and the sample order
    micro_tasks: int = 0  # training shards that can move between workers; 0 = one per worker
    # synchronous SGD with backup workers on every table (a ``backup:`` entry, e.g. {mode: static, k: 2};
    # its lr is ``lr``; docs/design.md, "Backup workers"): each iteration a gradient of the MLPs and of the
    # embedding rows the batch touched per worker, the servers step from the first k_t of them
    backup: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.backup is not None:
            check(self.optimizer == "sgd", f"optimizer: with backup the servers take plain SGD steps on every table "
                                           f"(no AdaGrad accumulators on a backup table): sgd, got {self.optimizer!r}")
            check(self.storage == "dense" and self.dense == "ps" and not self.lapse and not self.device_cache_rows,
                  "backup: needs storage: dense, dense: ps, lapse: 0, device_cache_rows: 0 (got "
                  f"{self.storage}, {self.dense}, {self.lapse}, {self.device_cache_rows})")
        check(self.lr > 0, "lr: must be > 0")
        check(self.batch_size >= 1, "batch_size: must be >= 1")
        check(self.epochs >= 1, "epochs: must be >= 1")
        check(self.dense_staleness is None or self.dense_staleness >= 0, "dense_staleness: must be >= 0 (or null)")
        check(self.evals_per_epoch >= 1, "evals_per_epoch: must be >= 1")
        check(self.clock_every >= 1, "clock_every: must be >= 1")
        check(self.train_samples >= 1 and self.test_samples >= 1, "train_samples, test_samples: must be >= 1")
        check(self.dim >= 1 and self.bottom >= 1 and self.top >= 1, "dim, bottom, top: must be >= 1")
        check(self.init_scale > 0, "init_scale: must be > 0")
        check(self.threads >= 1, "threads: must be >= 1")
        check(self.lapse >= 0, "lapse: clocks without a read, >= 0 (0: never)")
        check(self.micro_tasks >= 0, "micro_tasks: must be >= 0 (0 = one per worker)")
        check(not (self.micro_tasks and self.dense == "allreduce"),
              "micro_tasks: hybrid mode (dense: allreduce) steps every rank in lockstep, one task each: leave "
              "micro_tasks at 0")
        check(self.storage in ("dense", "sparse"), f"storage: dense or sparse, got {self.storage!r}")
        check(not (self.storage == "sparse" and self.embedding_init == "model"),
              "embedding_init: a sparse table starts from the servers' initializer (no file of every row): "
              "leave it out or say server")
        check(not self.hashed or self.embedding == "fused", "hashed: hashes every feature into one table: needs "
                                                            "embedding: fused")
        check(self.table_rows >= 0, "table_rows: must be >= 0")
        check(self.device_cache_rows >= 0, "device_cache_rows: must be >= 0")
        check(not self.table_rows or self.hashed, "table_rows: the row count of a hashed table: needs hashed: true")
        check(not (self.hashed and not self.table_rows and self.storage == "dense"),
              "table_rows: 0 (any 64-bit id) needs storage: sparse; give a row count for a dense table")
        _ = self.spec  # the data's own checks (max_rows, zipf), named as app.args keys

    @property
    def spec(self) -> criteo.CriteoSpec:
        return criteo.CriteoSpec(max_rows=self.max_rows, zipf=self.zipf, seed=self.data_seed)

    @property
    def server_init(self) -> dict[str, Any] | None:
        """The embeddings' server-side initializer (the model's own distribution), if they take one."""
        if (self.embedding_init or ("server" if self.storage == "sparse" else "model")) == "model":
            return None
        return {"uniform": [-self.init_scale, self.init_scale], "seed": self.seed}

    def keys(self, ids: np.ndarray) -> np.ndarray:
        """The embedding ids of a batch's raw categorical ids (n, 26): hashed, or as they are."""
        if not self.hashed:
            return ids
        return hash_ids(ids, np.arange(criteo.SPARSE), self.table_rows or None)


class DLRM(nn.Module):
    """Bottom MLP, one sparse embedding per categorical feature, dot (or concat) interaction, top MLP."""

    offsets: torch.Tensor  # buffers
    pairs: torch.Tensor

    def __init__(self, rows: tuple[int, ...], dim: int = 16, bottom: int = 64, top: int = 64,
                 interaction: str = "dot", init_scale: float = 0.05, fused: bool = False,
                 remote: dict[str, Any] | None = None, hashed: int | None = None) -> None:
        """``remote``: the embeddings are ``PSEmbedding``s the servers start with this ``init:`` (no
        local rows); ``hashed``: the ids given are already the fused table's (``DLRMArgs.keys``), of a table
        of that many rows (``UNBOUNDED``: any 64-bit id), and no offsets are added."""
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(criteo.DENSE, bottom), nn.ReLU(), nn.Linear(bottom, dim), nn.ReLU())
        self.fused = fused
        self.hashed = hashed is not None
        sizes = [hashed] if hashed is not None else [sum(rows)] if fused else list(rows)
        # the embeddings draw from a generator of their own, so the MLPs start the same whether the
        # rows are here (nn.Embedding) or on the servers (PSEmbedding, which draws nothing here)
        gen = torch.Generator().manual_seed(torch.initial_seed() + 1)
        embs: list[nn.Module] = ([PSEmbedding(None if r == UNBOUNDED else r, dim, init=remote) for r in sizes]
                                 if remote is not None else
                                 [nn.Embedding(r, dim, sparse=True, _weight=nn.init.uniform_(
                                     torch.empty(r, dim), -init_scale, init_scale, generator=gen)) for r in sizes])
        self.emb: nn.Module = embs[0] if fused or self.hashed else nn.ModuleList(embs)
        if fused and not self.hashed:
            self.register_buffer("offsets", torch.tensor(np.cumsum((0, *rows[:-1])), dtype=torch.int64),
                                 persistent=False)
        n = len(rows) + 1
        self.interaction = interaction
        width = dim + n * (n - 1) // 2 if interaction == "dot" else n * dim
        self.top = nn.Sequential(nn.Linear(width, top), nn.ReLU(), nn.Linear(top, 1))
        iu = torch.triu_indices(n, n, 1)
        self.register_buffer("pairs", iu[0] * n + iu[1], persistent=False)

    def rows(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """The embedding rows a batch of categorical ``ids`` reads, per embedding module name (what
        ``PSModule.prefetch_rows`` takes)."""
        if self.hashed:
            return {"emb": ids}
        if self.fused:
            return {"emb": ids + self.offsets}
        return {f"emb.{f}": ids[:, f] for f in range(ids.shape[1])}

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        if self.fused:
            v = torch.cat([x.unsqueeze(1), self.emb(ids if self.hashed else ids + self.offsets)], 1)
        else:
            v = torch.stack([x] + [e(ids[:, f]) for f, e in enumerate(self.emb.children())], 1)
        if self.interaction == "dot":
            z = torch.bmm(v, v.transpose(1, 2)).flatten(1)[:, self.pairs]
            h = torch.cat([x, z], 1)
        else:
            h = v.flatten(1)
        return self.top(h).squeeze(1)


def model(a: DLRMArgs) -> DLRM:
    """The seeded model (same initial values wherever it is built)."""
    torch.manual_seed(a.seed)
    return DLRM(a.spec.cardinalities, a.dim, a.bottom, a.top, a.interaction, a.init_scale, a.embedding == "fused",
                a.server_init if a.storage == "sparse" else None,
                (a.table_rows or UNBOUNDED) if a.hashed else None)


def tables(args: Mapping[str, Any], out_dir: Path) -> dict[str, dict[str, Any]]:
    """``app.tables``: the dense table and one table per embedding, initial values from ``model()``."""
    a: DLRMArgs = from_dict(DLRMArgs, args, "app.args")
    kw: dict[str, Any] = {"storage": a.storage, "init": a.server_init, "cache_rows": a.cache_rows, "push": a.push,
                          "lapse": a.lapse if a.optimizer != "adarevision" else 0, "dense": a.dense,
                          "dense_staleness": a.dense_staleness}
    if a.backup is not None:
        return declare(model(a), out_dir, backup={"lr": a.lr, **a.backup}, **kw)
    if a.optimizer in SERVER:
        return declare(model(a), out_dir, update=a.optimizer, lr=a.lr, **kw)
    return declare(model(a), out_dir, **kw)


def optimizer(a: DLRMArgs, m: PSModule) -> ServerOptimizer | DeltaOptimizer:
    if a.optimizer in SERVER:
        return ServerOptimizer(m, a.optimizer, lr=a.lr)
    if a.optimizer == "delta-sgd":
        return DeltaOptimizer(m, torch.optim.SGD(m.parameters(), lr=a.lr))
    return DeltaOptimizer(m, torch.optim.Adagrad(m.parameters(), lr=a.lr))


def scores(m: nn.Module, s: criteo.Samples, batch: int = 8192) -> np.ndarray:
    """The model's click logits for samples ``s`` (in batches)."""
    out = []
    with torch.no_grad():
        for lo in range(0, len(s), batch):
            out.append(m(torch.from_numpy(s.dense[lo:lo + batch]), torch.from_numpy(s.ids[lo:lo + batch])).numpy())
    return np.concatenate(out) if out else np.zeros(0, np.float32)


def heldout(m: nn.Module, s: criteo.Samples) -> dict[str, float]:
    """``heldout_auc`` and the summed log-loss over ``s``."""
    z = scores(m, s)
    loss = float(F.binary_cross_entropy_with_logits(torch.from_numpy(z), torch.from_numpy(s.labels),
                                                    reduction="sum"))
    return {"heldout_auc": criteo.auc(z, s.labels), "heldout_logloss": loss, "heldout_count": len(s)}


def eval_steps(steps: int, evals: int, clock_every: int) -> list[int]:
    """The steps (1-based, within an epoch) after which to evaluate: ``evals`` about even points on
    clock boundaries where possible, the last one the epoch's end."""
    pts = {max(1, round(steps * (i + 1) / evals / clock_every) * clock_every) for i in range(evals - 1)}
    return sorted({min(p, steps) for p in pts} | {steps})


def not_elastic(args: Mapping[str, Any], workers: int) -> str | None:
    """Why a job of these ``app.args`` and ``workers`` worker processes (``cluster.workers``) cannot change
    its worker count (``bosen scale``), or None."""
    backup = args.get("backup")
    if backup is not None and not follows_workers(from_dict(BackupConfig, backup, "app.args.backup"), workers):
        return (f"its synchronous path with backup workers proper ({backup}, {workers} workers: not static k = "
                "the workers) draws each rank's mini-batches from its own share of the samples, without "
                "micro-tasks: its workers cannot change while it runs")
    if args.get("dense") == "allreduce":
        return ("hybrid mode (dense: allreduce) steps every rank in lockstep, one micro-task each: its workers "
                "cannot change while it runs")
    return None


def train(client: PSClient, args: Mapping[str, Any]) -> None:
    a: DLRMArgs = from_dict(DLRMArgs, args, "app.args")
    torch.set_num_threads(a.threads)
    if a.backup is not None:
        train_sync(client, a)[1].close()
        return
    spec = a.spec
    saved = client.restored_state()
    T = microtasks.count(a.micro_tasks, client.num_workers, saved)
    if a.dense == "allreduce" and T != client.num_workers:
        raise ConfigError(f"{client.config.source}: hybrid mode (dense: allreduce) runs one micro-task per worker, "
                          f"and this job's checkpoint holds {T} for {client.num_workers} workers: resume it with "
                          f"--workers {T}")
    tasks, received, plan, folder = microtasks.start(T, client.rank, client.num_workers, saved)
    sched = Schedule(a.train_samples, T, a.batch_size, a.clock_every)
    steps = sched.steps
    test = criteo.generate(spec, 0, a.test_samples, criteo.HELDOUT) if client.rank == 0 else None
    if test is not None:
        test = dataclasses.replace(test, ids=a.keys(test.ids))
    net = model(a)
    m = PSModule(net, client, clock_every=0, dense=a.dense, device_cache_rows=a.device_cache_rows)
    opt = optimizer(a, m)
    source = client.config.source

    def shard(t: int) -> tuple[Shard, tuple[torch.Tensor, ...]]:
        """Task t: a contiguous share of the samples, rank t's generator of before, and its data."""
        d = criteo.shard(spec, t, T, a.train_samples)
        return Shard(len(d), a.seed * 1000 + t), tuple(torch.from_numpy(x) for x in (d.dense, a.keys(d.ids), d.labels))

    mine = {t: shard(t) for t in tasks.mine}
    evals = eval_steps(steps, a.evals_per_epoch, a.clock_every)
    teacher = criteo.auc(test.prob, test.labels) if test is not None else None
    t_train, eval_s = time.perf_counter(), 0.0
    c = 0  # clocks done
    # a checkpoint holds the clocks done, each task's generator, epoch order and steps (and hybrid's dense values)
    client.checkpoint_state(lambda: {"tick": np.array([c]), **m.dense_state(),
                                     **microtasks.pack({t: k.state() for t, (k, _) in mine.items()})})
    if saved is not None:
        got = restored(saved, ("tick",))
        assert got is not None
        c = int(got["tick"][0])
        for t, st in microtasks.unpack(saved, mine, STATE).items():
            mine[t][0].load(st, t, sched.span(c)[0], source)
        m.load_dense_state(saved)
    if (joined := microtasks.join_clock()) is not None:  # its tasks as their givers left them
        c = joined
        for t, st in received.items():
            mine[t][0].load(st, t, sched.span(c)[0], source)
    total = a.epochs * sched.clocks
    if plan is not None:  # no boundary at or past the training's end: nothing would run on a moved task
        plan.ends_at(total)
    loss_sum, done, t0 = 0.0, 0, time.perf_counter()
    while c < total:
        lo, hi = sched.span(c)
        # the clock's steps, the tasks' interleaved: one mini-batch of each in turn
        order = [(t, step) for step in range(lo, hi) for t in mine]
        for j, (t, step) in enumerate(order):
            (k, (dense, ids, labels)) = mine[t]
            idx = k.batch(step, sched)
            t2, s2 = order[j + 1] if j + 1 < len(order) else (next(iter(mine)), hi)
            ahead = mine[t2][0].peek(s2, sched) if s2 < a.epochs * steps else None
            if ahead is not None:  # the next batch's rows, read in the background during this step
                m.prefetch_rows(net.rows(mine[t2][1][1][ahead]))
            loss = F.binary_cross_entropy_with_logits(m(dense[idx], ids[idx]), labels[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            k.steps += 1
            loss_sum += float(loss.detach()) * idx.shape[0]
            done += idx.shape[0]
        # the clock's epoch: evaluate after the eval points it passed, before the tick ends (a record is
        # its clock's work; what the score then sees: docs/design.md, "Micro-tasks (Litz's over-decomposed input)")
        e = lo // steps
        if any(lo - e * steps < p <= hi - e * steps for p in evals):
            fields: dict[str, Any] = {"compute_s": time.perf_counter() - t0, "pull_s": m.pull_s, "push_s": m.push_s,
                                      "rows_pulled": m.rows_pulled, "rows_pushed": m.rows_pushed}
            if a.device_cache_rows:  # rows served from the device (cumulative, as rows_pulled)
                fields["device_cache_hits"] = sum(x.hits for x in m.device_caches.values()) + m.weight_hits
            if test is not None:
                te = time.perf_counter()
                fields.update(heldout(m, test))
                eval_s += time.perf_counter() - te
                fields.update(train_s=time.perf_counter() - t_train - eval_s, eval_s=eval_s, teacher_auc=teacher)
            client.report(objective=loss_sum, samples=done, **fields)
            loss_sum, done, t0 = 0.0, 0, time.perf_counter()
        c += 1
        m.clock()
        if plan is not None and folder is not None and (new := plan.at(c, T)) is not None:
            # a new assignment from this clock on: hand tasks off, take the received ones
            if a.dense == "allreduce":
                raise ConfigError(f"{source}: {not_elastic(args, client.num_workers)}")
            got_states = tasks.handoff(c, new, folder, partial(_state, mine))
            if plan.leaving(end=client.end_clocks):  # its tasks are given away: it leaves here (BYE on close)
                break
            mine = {t: mine[t] if t in mine else shard(t) for t in tasks.mine}
            for t, st in got_states.items():
                mine[t][0].load(st, t, sched.span(c)[0], source)
    m.close()  # the reads in flight end before the runner closes the client


def sync_steps(a: DLRMArgs, workers: int) -> int:
    """Iterations per epoch of the synchronous path: mini-batches in the smallest of ``workers`` shares
    (``cluster.workers``, the same in every process of a job, a joiner's too)."""
    return Schedule(a.train_samples, workers, a.batch_size, 1).steps


def sync_batch(a: DLRMArgs, rank: int, size: int, steps: int, it: int) -> np.ndarray:
    """The positions, in rank ``rank``'s share of ``size`` samples, of its mini-batch at iteration ``it``
    of the synchronous path with backup workers proper (k < n; ``steps`` per epoch, each epoch a new
    order): a pure function, so a worker that skips iterations (its gradient dropped) draws on in step,
    a resumed or replaced worker draws from the iteration it reads, and a test can replay every batch."""
    epoch, i = divmod(it, steps)
    order = np.random.default_rng([a.seed, rank, epoch]).permutation(size)
    return order[i * a.batch_size:(i + 1) * a.batch_size].astype(np.int64)


class TaskSamples:
    """The training samples of the micro-tasks a worker runs (task t: ``microtasks.share`` of the
    ``train_samples``, generated here), gathered by their ids in the whole training set (what
    ``microtasks.Draws`` draws)."""

    def __init__(self, a: DLRMArgs, tasks: Sequence[int], T: int,
                 have: Mapping[int, tuple[int, criteo.Samples]] | None = None) -> None:
        """``have``: task -> (first id, samples) already generated (the kept tasks at a boundary)."""
        self.parts: dict[int, tuple[int, criteo.Samples]] = {}
        for t in sorted(int(x) for x in tasks):
            if have is not None and t in have:
                self.parts[t] = have[t]
                continue
            ids = microtasks.share(a.train_samples, t, T)  # not empty: train_sync refuses fewer samples than tasks
            lo = int(ids[0])
            d = criteo.generate(a.spec, lo, lo + ids.size, criteo.TRAIN)
            self.parts[t] = (lo, dataclasses.replace(d, ids=a.keys(d.ids)))
        self.starts = np.array([lo for lo, _ in self.parts.values()], dtype=np.int64)
        self.offsets = np.cumsum([0, *(len(d) for _, d in self.parts.values())])[:-1].astype(np.int64)
        self.data = tuple(torch.from_numpy(np.concatenate([getattr(d, f) for _, d in self.parts.values()]))
                          for f in ("dense", "ids", "labels"))

    def batch(self, ids: np.ndarray) -> tuple[torch.Tensor, ...]:
        """The samples ``ids`` (ids in the whole training set, each of a task held here), in that order."""
        j = np.searchsorted(self.starts, ids, side="right") - 1
        idx = torch.from_numpy(self.offsets[j] + ids - self.starts[j])
        return tuple(x[idx] for x in self.data)


def train_sync(client: PSClient, a: DLRMArgs) -> tuple[DLRM, PSModule]:
    """Synchronous SGD on backup tables (docs/design.md, "Backup workers"): ``epochs`` x ``sync_steps``
    iterations; at each the worker reads w_t (``PSModule.pull``: the dense values and the tick, moved up
    past iterations its dropped gradients missed), computes the gradient of its mini-batch and pushes
    it with the embedding rows it touched (``ServerOptimizer.step``, which clocks).

    Where every gradient is applied (static k = the workers, ``follows_workers``) the mini-batches come
    from the micro-tasks the worker runs (``microtasks.Draws`` over ``TaskSamples``: each task's samples
    once per its pass, whichever worker runs it), whose states
    are the worker's checkpoint state and move at a ``bosen scale`` boundary, as MLR's and the CNN's: a
    resumed job (any worker count) draws on where its checkpoint left each task, and a lost worker's
    replacement, restored at C, draws and drops one mini-batch for each iteration it clocks past
    without a gradient (with k = n only a replacement does: its lost process drew those), so its
    batches are the lost one's. With backup workers proper (k < n) each rank draws from its own share
    of the samples by iteration (``sync_batch``, a pure function: nothing to save).

    It reports per iteration ``objective`` (the batch's summed log-loss at w_t), ``samples`` and
    ``iteration``; rank 0 adds the held-out figures at the eval points it reaches. Returns the model
    and module, at w_T (the dense values pulled; the embeddings read through the module)."""
    rank, n = client.rank, client.num_workers
    source = client.config.source
    net = model(a)
    m = PSModule(net, client, clock_every=1)
    opt = optimizer(a, m)
    spec = cast(Any, client.config).table(m.table.name).backup if m.table is not None else None
    saved = client.restored_state()
    left = False
    draws: microtasks.Draws | None = None
    samples: TaskSamples | None = None
    plan = folder = None
    if spec is not None and follows_workers(spec, n):
        T = microtasks.count(a.micro_tasks, n, saved)
        if a.train_samples < T:
            raise ConfigError(f"{source}: app.args.train_samples={a.train_samples} for {T} micro-tasks: every task "
                              "needs a sample at least")
        tasks, received, plan, folder = microtasks.start(T, rank, n, saved)
        draws = microtasks.Draws(a.train_samples, tasks.mine, T, a.seed)
        if saved is not None:
            draws.load(microtasks.unpack(saved, draws.tasks, microtasks.Draws.NAMES), source)
        if microtasks.join_clock() is not None:  # its tasks as their givers left them
            draws.load(received, source)
        samples = TaskSamples(a, draws.tasks, T)
        client.checkpoint_state(lambda: microtasks.pack({t: draws.state(t) for t in draws.tasks})
                                if draws is not None else {})
    else:
        if a.micro_tasks:
            raise ConfigError(f"{source}: app.args.micro_tasks: the synchronous path runs micro-tasks only where "
                              f"every gradient is applied (backup {{mode: static, k: {n}}} for {n} workers); with "
                              "backup workers proper each rank draws from its own share: leave micro_tasks at 0")
        d = criteo.shard(a.spec, rank, n, a.train_samples)
        share = tuple(torch.from_numpy(x) for x in (d.dense, a.keys(d.ids), d.labels))
    steps = sync_steps(a, n)  # an epoch: a pass of the workers the job was launched (or resumed) with
    total = a.epochs * steps
    if plan is not None:  # no boundary at or past the last iteration's end: nothing would run on a moved task
        plan.ends_at(total)
    points = sorted({e * steps + p for e in range(a.epochs) for p in eval_steps(steps, a.evals_per_epoch, 1)})
    test = criteo.generate(a.spec, 0, a.test_samples, criteo.HELDOUT) if rank == 0 else None
    if test is not None:
        test = dataclasses.replace(test, ids=a.keys(test.ids))
    teacher = criteo.auc(test.prob, test.labels) if test is not None else None

    def boundary() -> bool:
        """After a clock: where the job's workers change from this clock on, hand tasks off and draw from
        ours; False: this worker left the job here (as MLR's and the CNN's ``_train_sync``)."""
        nonlocal draws, samples, left
        tick = cast(Any, client).tick  # bosen.client.Client's
        if plan is None or folder is None or draws is None or samples is None or (new := plan.at(tick, T)) is None:
            return True
        kept = {t: draws.state(t) for t in draws.tasks if new[t] == rank}
        got = tasks.handoff(tick, new, folder, draws.state)
        if plan.leaving(end=client.end_clocks):  # its clocks end here: nobody's step waits on it meanwhile
            left = True
            return False
        draws = microtasks.Draws(a.train_samples, tasks.mine, T, a.seed)
        draws.load({**kept, **got}, source)
        samples = TaskSamples(a, draws.tasks, T, samples.parts)
        return True

    def skipping(it: int) -> None:
        """Before a clock with no gradient: with every gradient applied only a replacement clocks so (up to
        the iteration its lost process reached), and that process drew a mini-batch for the iteration
        before its clock (so a checkpoint part written at that clock holds the draw)."""
        if draws is not None:
            draws.draw(a.batch_size)

    while True:
        m.pull(boundary, skipping)  # w_t, and t
        it = m.iteration
        fields: dict[str, Any] = {}
        if test is not None and points and points[0] <= it:  # the eval points this worker reached
            while points and points[0] <= it:
                points.pop(0)
            fields.update(heldout(net, test), teacher_auc=teacher)
        if left or it >= total:
            if fields:
                client.report(iteration=it, **fields)
            break
        if draws is not None and samples is not None:
            dense, ids, labels = samples.batch(draws.draw(a.batch_size))
        else:
            idx = torch.from_numpy(sync_batch(a, rank, len(share[2]), steps, it))
            dense, ids, labels = (x[idx] for x in share)
        loss = F.binary_cross_entropy_with_logits(net(dense, ids), labels)
        opt.zero_grad()
        loss.backward()
        client.report(objective=float(loss.detach()) * labels.shape[0], samples=labels.shape[0], iteration=it,
                      **fields)
        opt.step()  # the gradient of iteration t, then the clock that completes it
        if not boundary():
            break
    return net, m


def _state(tasks: Mapping[int, tuple[Shard, Any]], t: int) -> dict[str, np.ndarray]:
    return tasks[t][0].state()


if __name__ == "__main__":
    from bosen.apps.runner import run_app

    run_app(train)
