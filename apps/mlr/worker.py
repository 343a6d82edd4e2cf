"""MLR worker: softmax regression trained by data-parallel minibatch SGD against the PS.

Table layout: one PS row per class, as in Bösen (rows = classes, cols = features + 1, the last
column the bias). Every minibatch needs every class's weights for its features, so a worker reads
all K rows (dense access, as Bösen's MLR does) and sends a dense K x (F+1) delta.

One clock = 1 / ``clocks_per_epoch`` of a pass over this worker's partition (default: a whole pass,
Bösen's setting: "1 logical clock tick to be 1 pass through the worker's local data partition").
Within a clock the worker cuts its minibatches into ``batches_per_clock`` pieces. Each piece
refreshes the worker's view of the table (client/view.py: only rows written since its last read are
copied; rows that managed communication refreshed since the last piece included), loads it into the
local model, runs its minibatches on that copy (seeing its own updates at once), stores the model
back into the view and pushes the accumulated delta (new - as read, one compiled pass), so it can
leave under the bandwidth budget before the tick ends (docs/design.md, "Apps on the live cache"). Reading per
minibatch would cost a K x (F+1) copy and a round of client-library calls per step, which outweighs
the step itself for small minibatches; a few pieces per clock keep that cost small.

Data parallelism follows Bösen: the training set is split evenly across workers, each sample is used
once per pass whatever the number of workers, and each worker's deltas add up in the table. The split
is into ``micro_tasks`` contiguous shares (default one per worker), each with its own generator and
epoch order, and a worker runs a contiguous block of them (apps/microtasks.py).
Learning rate per clock c: lr / (1 + lr_decay * t) ("inverse"), lr * lr_decay ** t ("exponential"),
or lr ("constant"), with t = c / clocks_per_epoch passes done.

Per clock each worker reports (all additive, the launcher sums them over workers):
``objective`` (summed training log-loss of the samples processed this clock, each taken just before
its minibatch's update), ``samples``, ``compute_s`` and ``comm_s`` (seconds in the kernels and in
table reads/updates, plus the previous ``clock()`` call); rank 0 also reports ``heldout_correct``, ``heldout_total`` and
``heldout_loss`` of its model at the end of the clock, and ``lr``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from bosen.apps import goodput as gp
from bosen.apps import microtasks
from bosen.apps.backup import is_backup, read_iteration
from bosen.apps.delays import DelayArgs, Delays
from bosen.apps.mlr import data as D
from bosen.apps.mlr import kernels as K
from bosen.apps.mlr.model import LocalModel
from bosen.apps.protocol import PSClient, require_table
from bosen.apps.state import restored, rng_state, set_rng_state
from bosen.config import Config, check, follows_workers, from_dict
from bosen.errors import ConfigError

__all__ = ["MLRArgs", "SyntheticArgs", "load_data", "lr_at", "train"]



@dataclass(frozen=True)
class SyntheticArgs:
    """Shape of the generated data set (features and classes come from the table)."""

    n: int = 20000
    nnz: int = 20
    temperature: float = 0.3
    seed: int = 1

    def __post_init__(self) -> None:
        check(self.n >= 2, "n: must be >= 2")
        check(self.nnz >= 1, "nnz: must be >= 1")
        check(self.temperature > 0, "temperature: must be > 0")


@dataclass(frozen=True)
class MLRArgs:
    """``app.args`` of the MLR worker."""

    data: str = "digits"  # "digits" | "synthetic" | a .npz (``bosen data``) or libsvm/svmlight file
    test_data: str = ""  # file of held-out samples, same format; "" = cut ``holdout`` off ``data``
    zero_based: bool | None = None  # libsvm feature ids; None = auto (1-based unless an id 0 occurs)
    table: str = "W"
    classes: int | None = None  # None: the table's rows
    features: int | None = None  # None: the table's cols - 1
    synthetic: SyntheticArgs = field(default_factory=SyntheticArgs)
    batch_size: int = 32
    lr: float = 0.5
    lr_schedule: Literal["inverse", "exponential", "constant"] = "inverse"
    lr_decay: float = 0.1
    reg: float = 1e-4  # L2 on the weights (not the biases)
    epochs: int = 10
    clocks_per_epoch: int = 1
    batches_per_clock: int = 4  # pieces of a clock's minibatches; each reads the table and sends its delta
    holdout: float = 0.2
    eval_every: int = 1  # clocks between held-out evaluations on rank 0 (the last clock always); 0 = never
    seed: int = 0
    micro_tasks: int = 0  # sample shares that can move between workers; 0 = one per worker
    delay: DelayArgs = field(default_factory=DelayArgs)  # injected round trips (tests, benches); off by default
    # Pollux's agent on a backup (synchronous) table: the batch and learning rate follow the goodput
    goodput: gp.GoodputArgs | None = None

    def __post_init__(self) -> None:
        check(self.batch_size >= 1, "batch_size: must be >= 1")
        check(self.micro_tasks >= 0, "micro_tasks: must be >= 0 (0 = one per worker)")
        check(self.lr > 0, "lr: must be > 0")
        check(self.lr_decay >= 0, "lr_decay: must be >= 0")
        if self.lr_schedule == "exponential":
            check(0 < self.lr_decay <= 1, "lr_decay: must be in (0, 1] for the exponential schedule")
        check(self.reg >= 0, "reg: must be >= 0")
        check(self.lr * self.reg < 1, "reg: lr * reg must be < 1 (each step scales the weights by 1 - lr * reg)")
        check(self.epochs >= 1, "epochs: must be >= 1")
        check(self.clocks_per_epoch >= 1, "clocks_per_epoch: must be >= 1")
        check(self.batches_per_clock >= 1, "batches_per_clock: must be >= 1")
        check(0 <= self.holdout < 1, "holdout: must be in [0, 1)")
        check(self.eval_every >= 0, "eval_every: must be >= 0")
        if self.classes is not None:
            check(self.classes >= 2, "classes: must be >= 2")
        if self.features is not None:
            check(self.features >= 1, "features: must be >= 1")
        if self.goodput is not None and self.eval_every:
            check(self.eval_every % self.goodput.interval_clocks == 0,
                  f"eval_every: with goodput, a multiple of goodput.interval_clocks ({self.goodput.interval_clocks}): "
                  f"an evaluation then delays only an interval's first step, which the agent does not time")


def lr_at(a: MLRArgs, clock: int) -> float:
    """Learning rate for one clock; decays with the passes done so far."""
    t = clock / a.clocks_per_epoch
    if a.lr_schedule == "inverse":
        return a.lr / (1.0 + a.lr_decay * t)
    if a.lr_schedule == "exponential":
        return a.lr * a.lr_decay ** t
    return a.lr


def load_data(a: MLRArgs, classes: int, features: int) -> tuple[D.Dataset, D.Dataset]:
    """(train, held-out) for a model of ``classes`` x ``features``; every worker gets the same split.

    Raises DataError (file and line named) for bad files and ConfigError when the data does not fit
    the table's geometry.
    """
    if a.data == "digits":
        full = D.digits()
    elif a.data == "synthetic":
        s = a.synthetic
        full = D.synthetic(s.n, features, classes, s.nnz, seed=s.seed, temperature=s.temperature)
    else:
        full, label_map = _read_file(a, a.data, features, None)
        if a.test_data:
            test, _ = _read_file(a, a.test_data, features, label_map)
            if full.classes > classes:
                raise ConfigError(f"{a.data}: {full.classes} classes do not fit a table of {classes} rows")
            return _with_geometry(full, classes, features), _with_geometry(test, classes, features)
    if full.features > features:
        raise ConfigError(f"{a.data}: {full.features} features do not fit a table of {features + 1} cols "
                         f"(features + 1 bias column)")
    if full.classes > classes:
        raise ConfigError(f"{a.data}: {full.classes} classes do not fit a table of {classes} rows")
    train, held = D.split_holdout(_with_geometry(full, classes, features), a.holdout, a.seed)
    return train, held


def _read_file(a: MLRArgs, path: str, features: int, label_map: np.ndarray | None) -> tuple[D.Dataset, np.ndarray]:
    """A ``.npz`` (``bosen data``, :func:`D.save_npz`) or a libsvm file, parsed once and cached beside it."""
    if path.endswith(".npz"):
        ds, _ = D.load_npz(path)
        if ds.features > features:
            raise ConfigError(f"{path}: {ds.features} features do not fit a table of {features + 1} cols "
                              f"(features + 1 bias column)")
        return ds, np.arange(ds.classes, dtype=np.int64)
    zb = "auto" if a.zero_based is None else a.zero_based
    return D.read_libsvm_cached(path, features=features, zero_based=zb, label_map=label_map)


def _with_geometry(ds: D.Dataset, classes: int, features: int) -> D.Dataset:
    return D.Dataset(ds.indptr, ds.indices, ds.values, ds.labels, features, classes)


def _geometry(a: MLRArgs, rows: int, cols: int, name: str) -> tuple[int, int]:
    classes = rows if a.classes is None else a.classes
    features = cols - 1 if a.features is None else a.features
    if classes != rows or features + 1 != cols:
        raise ConfigError(f"app.args: classes={classes}, features={features} need table {name!r} of "
                         f"rows={classes}, cols={features + 1} (one row per class, bias last); "
                         f"it has rows={rows}, cols={cols}")
    if classes < 2:
        raise ConfigError(f"table {name!r}: MLR needs rows (classes) >= 2")
    return classes, features


def prepare(config: Config) -> tuple[D.Dataset, D.Dataset] | None:
    """(train, held-out), loaded before the worker joins the servers (``run_app``'s ``prepare``);
    None where the config lacks the table (``train`` then says what is missing)."""
    a: MLRArgs = from_dict(MLRArgs, config.app.args, "app.args")
    if not any(t.name == a.table for t in config.tables):
        return None
    spec = config.table(a.table)
    return load_data(a, *_geometry(a, spec.rows, spec.cols, a.table))


def train(client: PSClient, args: Mapping[str, Any], data: tuple[D.Dataset, D.Dataset] | None = None) -> None:
    """Run the MLR job as one worker: ``epochs * clocks_per_epoch`` clocks, one report each; ``data``
    as :func:`prepare` loaded it, or None to load it here."""
    a: MLRArgs = from_dict(MLRArgs, args, "app.args")
    T = require_table(client, a.table, f"MLR needs table {a.table} (rows = classes, cols = features + 1)")
    if not np.issubdtype(np.dtype(T.dtype), np.floating):
        raise ConfigError(f"table {a.table!r}: MLR needs a float table, it is {np.dtype(T.dtype)}")
    classes, features = _geometry(a, T.rows, T.cols, a.table)
    if a.goodput is not None and not is_backup(client, a.table):
        raise ConfigError(f"app.args.goodput: Pollux's agent needs a synchronous table: give table {a.table!r} "
                          f"backup: {{mode: static, k: <workers>}}")
    train_ds, held = data if data is not None else load_data(a, classes, features)
    rank, workers = client.rank, client.num_workers
    if is_backup(client, a.table):
        _train_sync(client, T, a, train_ds, held, classes)
        return
    saved = client.restored_state()
    n_tasks = microtasks.count(a.micro_tasks, workers, saved)
    tasks, received, plan, handoff_dir = microtasks.start(n_tasks, rank, workers, saved)
    joining = microtasks.join_clock()  # a worker joining the running job (bosen scale) at that clock
    lay = _Layout(train_ds, tasks.mine, n_tasks, a)
    if lay.mine.n == 0:
        raise ConfigError(f"worker {rank}: no training samples ({train_ds.n} samples, {workers} workers)")

    view = T.view(np.arange(classes, dtype=np.int64))  # the table, re-read where it changed
    model = LocalModel(classes, features)
    cpe = a.clocks_per_epoch
    total = a.epochs * cpe
    c = 0  # clocks done
    # a checkpoint holds the clocks done and each task's generator and epoch order
    client.checkpoint_state(lambda: {"tick": np.array([c]),
                                     **microtasks.pack({t: lay.state(t) for t in lay.tasks})})
    if saved is not None:
        got = restored(saved, ("tick",))
        assert got is not None
        c = int(got["tick"][0])
        lay.load(microtasks.unpack(saved, lay.tasks, ("rng", "order")), client.config.source)
    if joining is not None:  # its tasks' generators and epoch orders as their givers left them
        c = joining
        lay.load(received, client.config.source)
    clock_wait = 0.0  # time in the previous clock() call: counted in the next report
    if plan is not None:  # no boundary at or past the training's end: nothing would run on a moved task
        plan.ends_at(total)

    while c < total:
        part = c % cpe
        if part == 0:
            lay.shuffle()
        segs = lay.segments(part)
        lr = lr_at(a, c)
        compute_s, comm_s = 0.0, clock_wait
        loss = 0.0

        # the clock's minibatches in batches_per_clock pieces; each reads the table from the cache and
        # runs every task's piece (a minibatch holds one task's samples)
        cuts = [np.linspace(0, -(-len(seg) // a.batch_size), a.batches_per_clock + 1).round().astype(np.int64)
                * a.batch_size for seg in segs]
        for j in range(a.batches_per_clock):
            pieces = [seg[cut[j]:cut[j + 1]] for seg, cut in zip(segs, cuts, strict=True)]
            if not any(p.shape[0] for p in pieces):
                continue
            t0 = time.perf_counter()
            model.load(view.refresh())
            t1 = time.perf_counter()
            for piece in pieces:
                if piece.shape[0]:
                    loss += model.train(lay.mine, piece, a.batch_size, lr, a.reg)
            t2 = time.perf_counter()
            model.store(view.values)
            view.push()
            compute_s += t2 - t1
            comm_s += (t1 - t0) + (time.perf_counter() - t2)
        seg_n = sum(len(seg) for seg in segs)

        fields: dict[str, float] = {}
        last = c == total - 1
        if rank == 0 and len(held.labels) and a.eval_every and ((c + 1) % a.eval_every == 0 or last):
            correct, hloss = model.evaluate(held)
            fields.update(heldout_correct=correct, heldout_total=held.n, heldout_loss=hloss)
        if rank == 0:
            fields["lr"] = lr
        client.report(objective=loss, samples=int(seg_n), compute_s=compute_s,
                      comm_s=comm_s, **fields)
        t3 = time.perf_counter()
        c += 1
        client.clock()
        clock_wait = time.perf_counter() - t3
        if plan is not None and handoff_dir is not None and (new := plan.at(c, n_tasks)) is not None:
            # a new assignment from this clock on: hand tasks off, rebuild for ours
            kept = {t: lay.state(t) for t in lay.tasks if new[t] == rank}
            got_states = tasks.handoff(c, new, handoff_dir, lay.state)
            if plan.leaving(end=client.end_clocks):  # its tasks are given away: it leaves here (BYE on close)
                return
            lay = _Layout(train_ds, tasks.mine, n_tasks, a)
            lay.load({**kept, **got_states}, client.config.source)


def _train_sync(client: Any, T: Any, a: MLRArgs, train_ds: D.Dataset, held: D.Dataset, classes: int) -> None:
    """A table with backup workers: ``epochs * clocks_per_epoch`` iterations, each this worker's mean
    gradient of one minibatch of ``batch_size`` samples at w_t; the servers step (docs/design.md,
    "Backup workers"). Per iteration it reports ``objective`` (the minibatch's summed log-loss at w_t),
    ``samples``, ``iteration`` and ``compute_s``; every ``eval_every`` iterations rank 0 adds
    ``train_loss`` (the mean log-loss of w_t on the whole training set) and the held-out figures.

    Where every worker's gradient is applied (static k = the workers, ``follows_workers``) the
    minibatches come from the micro-tasks the worker runs (``microtasks.Draws``: each task's samples once per
    its pass, whichever worker runs it), which move at a ``bosen scale`` boundary as in the
    asynchronous path, so the job's workers can change; with backup workers proper (k < n, dynamic,
    blind) gradients are dropped, and each worker draws from the whole training set, as DBW assumes:
    the micro-tasks then hold no data, but still move at a boundary, which is how a worker learns that
    it leaves, or that others join (a worker clocking up to a newer iteration passes each boundary).

    With ``goodput`` (Pollux's agent, ``apps/goodput.py``) the step's batch is the agent's m·(s + 1),
    computed in micro-batches that measure the gradient statistics, and the pushed gradient is scaled
    by the agent's learning-rate gain; the agent's fields join the report."""
    rank, workers = client.rank, client.num_workers
    total = a.epochs * a.clocks_per_epoch
    rows = np.arange(classes, dtype=np.int64)
    spec = client.config.table(a.table).backup
    delays = Delays(a.delay, rank, workers)
    model = LocalModel(classes, train_ds.features)
    F = train_ds.features
    draws: microtasks.Draws | None = None
    saved = client.restored_state()
    n_tasks = microtasks.count(a.micro_tasks, workers, saved)
    tasks, received, plan, handoff_dir = microtasks.start(n_tasks, rank, workers, saved)
    rng = None
    drawn = np.zeros(2, dtype=np.int64)  # mini-batches and samples drawn from the whole set so far (DBW)
    if follows_workers(spec, workers):
        draws = microtasks.Draws(train_ds.n, tasks.mine, n_tasks, a.seed)
        if saved is not None:
            draws.load(microtasks.unpack(saved, draws.tasks, microtasks.Draws.NAMES), client.config.source)
        if microtasks.join_clock() is not None:  # its tasks as their givers left them
            draws.load(received, client.config.source)
        client.checkpoint_state(lambda: microtasks.pack({t: draws.state(t) for t in draws.tasks}))
    else:  # the tasks hold no data here: they say which workers are in the job (they move at a boundary)
        gen = rng = np.random.default_rng([a.seed, rank])
        # the rank's sampler is its checkpoint state: a resumed or replaced worker draws on where it was
        # (a rank the checkpoint has none of, or one from before it was saved, starts afresh)
        client.checkpoint_state(lambda: {SAMPLER_RNG: rng_state(gen), SAMPLER_DRAWN: drawn.copy()})
        if saved is not None and SAMPLER_RNG in saved:
            got = restored(saved, (SAMPLER_RNG, SAMPLER_DRAWN))
            assert got is not None
            if got[SAMPLER_RNG].shape != (6,) or got[SAMPLER_DRAWN].shape != (2,):
                raise ConfigError(f"{client.config.source}: the checkpoint's {SAMPLER_RNG} / {SAMPLER_DRAWN} have "
                                  f"shapes {got[SAMPLER_RNG].shape} / {got[SAMPLER_DRAWN].shape}, not (6,) / (2,)")
            set_rng_state(gen, got[SAMPLER_RNG])
            drawn[:] = got[SAMPLER_DRAWN]

    def draw(b: int) -> np.ndarray:
        if draws is not None:
            return draws.draw(b)
        assert rng is not None
        drawn[0] += 1
        drawn[1] += b
        return rng.integers(0, train_ds.n, b).astype(np.int64)

    agent = None
    if a.goodput is not None:  # a push of the table a step: what the client's bandwidth budget paces
        agent = gp.start(client, a.goodput, a.batch_size, float(T.rows * T.cols * np.dtype(T.dtype).itemsize))
    left = False
    if plan is not None:  # no boundary at or past the last iteration's end: nothing would run on a moved task
        plan.ends_at(total)

    def boundary() -> bool:
        """After a clock: where the job's workers change from this clock on (``bosen scale``), hand
        tasks off (the servers count the new workers from that iteration on) and draw from ours.
        False: this worker left the job here (BYE on close)."""
        nonlocal draws, left
        c = client.tick
        if plan is None or handoff_dir is None or (new := plan.at(c, n_tasks)) is None:
            return True
        kept = {t: draws.state(t) for t in draws.tasks if new[t] == rank} if draws is not None else {}
        got_states = tasks.handoff(c, new, handoff_dir, _handing(draws, agent, tasks.mine, new, rank))
        if plan.leaving(end=client.end_clocks):  # its clocks end here: nobody's step waits on it meanwhile
            left = True
            return False
        for got in got_states.values():  # a leaver's goodput sums of the interval come with one of its tasks
            if agent is not None and gp.HANDED in got:
                agent.take_over(got[gp.HANDED])
        if draws is not None:
            draws = microtasks.Draws(train_ds.n, tasks.mine, n_tasks, a.seed)
            draws.load({**kept, **got_states}, client.config.source)
        return True

    def skipping(it: int) -> None:
        """Before the clock of an iteration passed without a gradient: where every gradient is applied
        only a replacement clocks so (up to the servers' iteration), and its lost process drew that
        iteration's mini-batch from the tasks: drawn and dropped here (before the clock, as a step
        draws, so a checkpoint part of that clock holds the draw), so this worker's batches stay the
        lost one's."""
        if draws is not None:
            draws.draw(a.batch_size if agent is None else (st := agent.skipped(it, tasks.workers)).m * (st.s + 1))

    while True:
        W, it = read_iteration(client, T, rows, boundary, skipping)  # a dropped gradient's worker clocks up to w_t's
        if left or it >= total:
            break
        t0 = time.perf_counter()
        W64 = W.astype(np.float64, copy=False)
        fields: dict[str, float] = {}
        if agent is None:
            batch = draw(a.batch_size)
            loss, G = K.loss_grad(train_ds.indptr, train_ds.indices, train_ds.values, train_ds.labels, batch, W64)
            G /= a.batch_size
            samples = a.batch_size
        else:
            st = agent.at(it, t0, tasks.workers)
            loss, G = _accumulated(train_ds, W64, draw(st.m * (st.s + 1)), st.s, a.reg, agent.rec)
            G *= st.gain  # the learning-rate gain: the servers step with backup.lr times the mean pushed
            samples = st.m * (st.s + 1)
            fields.update(agent.fields(rank, spec.lr))
        if a.reg and agent is None:
            G[:, :F] += a.reg * W64[:, :F]
        compute_s = time.perf_counter() - t0
        if agent is not None:
            agent.computed(compute_s)
        delays.wait(it, t0)  # the injected round trip, counted from the read
        T.inc_rows(rows, G.astype(T.dtype, copy=False))
        if rank == 0 and a.eval_every and it % a.eval_every == 0:  # the loss of w_t: on the whole training set
            model.load(W)
            fields["train_loss"] = model.evaluate(train_ds)[1] / train_ds.n
            if len(held.labels):
                correct, hloss = model.evaluate(held)
                fields.update(heldout_correct=correct, heldout_total=held.n, heldout_loss=hloss)
        client.report(objective=float(loss), samples=samples, iteration=it, compute_s=compute_s, **fields)
        if agent is not None:
            agent.before_clock(it)
        client.clock()
        if not boundary():
            return


SAMPLER_RNG = "sampler.rng"  # a DBW worker's generator over the whole training set (PCG64 words)
SAMPLER_DRAWN = "sampler.drawn"  # its mini-batches and samples drawn so far


def _handing(draws: microtasks.Draws | None, agent: gp.WorkerAgent | None, mine: np.ndarray, new: np.ndarray,
             rank: int) -> Callable[[int], dict[str, np.ndarray]]:
    """The states of the tasks handed off at a boundary (none where the tasks hold no data); a leaver's
    first task also carries its goodput sums of the interval in progress (``WorkerAgent.hand_over``),
    for the worker that takes it."""
    first = int(mine[0]) if mine.size and not (new == rank).any() and agent is not None else -1

    def state(t: int) -> dict[str, np.ndarray]:
        st = draws.state(t) if draws is not None else {}
        if t == first and agent is not None:
            st[gp.HANDED] = agent.hand_over()
        return st
    return state


def _accumulated(ds: D.Dataset, W: np.ndarray, rows: np.ndarray, s: int, reg: float,
                 rec: gp.Recorder) -> tuple[float, np.ndarray]:
    """One step of the agent's setting over ``rows`` (m·(s + 1) samples): s + 1 micro-batches of m
    (accumulation), or m in two halves when s = 0, so that the step's micro-batch gradients measure the
    gradient statistics (``Recorder.moments``) at the cost of one kernel call more. Returns the summed
    log-loss and the mean gradient over the step's samples, the L2 term ``reg`` included (in the
    statistics too)."""
    pieces = s + 1 if s > 0 else min(2, rows.shape[0])
    cuts = np.linspace(0, rows.shape[0], pieces + 1).round().astype(np.int64)
    grads = np.empty((pieces,) + W.shape)
    total = np.zeros_like(W)
    loss = 0.0
    for j in range(pieces):
        piece = rows[cuts[j]:cuts[j + 1]]
        lj, Gj = K.loss_grad(ds.indptr, ds.indices, ds.values, ds.labels, piece, W)
        loss += lj
        total += Gj
        grads[j] = Gj / piece.shape[0]
    mean = total / rows.shape[0]
    if reg:
        F = W.shape[1] - 1
        grads[:, :, :F] += reg * W[:, :F]
        mean[:, :F] += reg * W[:, :F]
    if pieces >= 2:
        rec.moments(grads, rows.shape[0] // pieces)
    return float(loss), mean


class _Layout:
    """What a worker holds for its micro-tasks: each task is a fixed contiguous share of the training
    samples (``D.partition`` over the tasks) with its own generator and epoch order, so a task visits
    the same minibatches whichever worker runs it (a minibatch never mixes tasks). The worker's
    samples are its tasks' shares side by side (one ``Dataset``: the kernels index it). One task per
    worker is the worker's share as a job without micro-tasks cut it."""

    def __init__(self, train: D.Dataset, tasks: np.ndarray, n_tasks: int, a: MLRArgs) -> None:
        self.tasks = [int(t) for t in tasks]
        ids = [D.partition(train.n, t, n_tasks) for t in self.tasks]
        self.mine = train.take(np.concatenate(ids) if ids else np.zeros(0, np.int64))
        sizes = np.array([x.size for x in ids], dtype=np.int64)
        self.start = dict(zip(self.tasks, (np.cumsum(sizes) - sizes).tolist(), strict=True))
        self.n = dict(zip(self.tasks, sizes.tolist(), strict=True))
        self.rng = {t: np.random.default_rng([a.seed, t]) for t in self.tasks}
        self.order = {t: np.arange(self.n[t], dtype=np.int64) for t in self.tasks}  # positions in the task
        self.bounds = {t: np.linspace(0, self.n[t], a.clocks_per_epoch + 1).round().astype(np.int64)
                       for t in self.tasks}

    def shuffle(self) -> None:
        """A new epoch: every task draws its order."""
        for t in self.tasks:
            self.order[t] = self.rng[t].permutation(self.n[t]).astype(np.int64)

    def segments(self, part: int) -> list[np.ndarray]:
        """Each task's samples of clock ``part`` of the epoch, as ids into :attr:`mine`."""
        return [self.start[t] + self.order[t][self.bounds[t][part]:self.bounds[t][part + 1]] for t in self.tasks]

    def state(self, t: int) -> dict[str, np.ndarray]:
        """Task ``t``'s generator and its epoch's order."""
        return {"rng": rng_state(self.rng[t]), "order": self.order[t]}

    def load(self, states: Mapping[int, Mapping[str, np.ndarray]], source: str) -> None:
        for t in self.tasks:
            st = states[t]
            if st["order"].shape != self.order[t].shape:
                raise ConfigError(f"{source}: micro-task {t}'s saved sample order has {st['order'].size} samples, "
                                  f"the task has {self.n[t]}: another data set?")
            self.order[t] = np.asarray(st["order"], dtype=np.int64).copy()
            set_rng_state(self.rng[t], st["rng"])
