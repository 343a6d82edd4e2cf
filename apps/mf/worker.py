"""SGD matrix factorization worker: ratings r ≈ L_u · R_i with L and R living in the parameter server.

Users are split into ``micro_tasks`` sets (data.user_owner over the tasks; default one per worker),
each with its own generator, and a worker runs a contiguous block of them (apps/microtasks.py): it
keeps its tasks' ratings, each task's cut into fixed batches (model.batches), a worker's batch being
its tasks' batches together (model.merge). One clock is one pass over the local data by default (the
thesis' setting); with ``clocks_per_epoch = k`` each pass is split into k fixed chunks, one clock
each (Bösen's "BS-k"), and ``batches_per_clock = b`` (default 10) splits a clock's chunk into b
mini-batches. Per mini-batch the worker refreshes its rows of the worker's views of L and R (one
view per table over every row the worker touches, kept for the run: only rows written since are
copied, so a row another batch pushed is not copied again; rows managed communication refreshed
mid-clock are seen), runs one numba SGD pass on the views' arrays (its running loss, each rating's
error just before its update, is the clock's objective) and pushes ``new - old`` of its rows at once
(one compiled pass per table), so it can leave under the budget before the tick ends
(docs/design.md, "Apps on the live cache").

Held-out ratings (``test_data``, or a ``holdout`` share of synthetic data) go to the worker that
owns their user; after each clock (every ``eval_every``) it scores them against its cache and
reports the sums the launcher turns into ``heldout_rmse``.

Per clock the worker reports ``objective`` and ``samples``, and where the clock's time went (all
additive over workers): ``seconds`` in the kernels, ``read_s`` reading (view refreshes), ``send_s``
sending (view pushes, inc_rows), ``eval_s`` scoring held-out ratings and ``clock_s`` in the previous
``clock()`` call (bench/apps/mf.py uses them to show the PS's cost beside the bare kernel).

``send: gradient`` is for tables whose stored procedure takes the step on the server (``update:
sgd | adagrad | adarevision``): per batch the worker computes the gradient of the loss at the
values it read and sends it as is (``add`` tables get ``-lr * g`` instead); the batches are then
mini-batches, so use several per epoch. ``send: auto`` (default) picks gradient as soon as L or R
has a procedure other than ``add``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from bosen.apps import microtasks
from bosen.apps.mf.data import Triples, load_csv, synthetic, user_owner
from bosen.apps.mf.kernels import clipped_squared_error, sgd_pass
from bosen.apps.mf.model import Batch, batches, merge
from bosen.apps.protocol import PSClient, PSTable, require_table
from bosen.apps.state import restored, rng_state, set_rng_state
from bosen.config import Config, check, from_dict
from bosen.errors import ConfigError, DataError


@dataclass(frozen=True)
class MFArgs:
    """``app.args`` of an MF job. ``None`` sizes default to the geometry of tables L and R."""

    data: str = "synthetic"  # "synthetic" or the path of a user,item,rating CSV file
    test_data: str = ""  # held-out ratings (CSV); "" with synthetic data: a seeded `holdout` share of it
    holdout: float = 0.0  # synthetic data only: the share of ratings held out
    eval_every: int = 1  # clocks between held-out RMSE measurements (the last clock always); 0 = never
    n_users: int | None = None
    n_items: int | None = None
    rank: int | None = None
    nnz: int = 500_000
    noise: float = 0.1
    alpha: float = 0.8  # Zipf exponent of user/item popularity (0 = uniform degrees)
    data_seed: int = 0
    lr: float = 0.08
    lr_decay: float = 0.95  # multiplicative, per epoch
    reg: float = 0.02
    epochs: int = 25
    clocks_per_epoch: int = 1
    batches_per_clock: int = 10  # mini-batches per clock, each reading its rows from the live cache
    seed: int = 0  # shuffling order (mixed with the worker's rank)
    send: str = "auto"  # "delta" (local SGD, new - old), "gradient" (raw gradients), "auto"
    micro_tasks: int = 0  # user sets that can move between workers; 0 = one per worker

    def __post_init__(self) -> None:
        for k in ("n_users", "n_items", "rank"):
            v = getattr(self, k)
            check(v is None or v >= 1, f"{k}: must be >= 1, got {v}")
        check(self.nnz >= 0, f"nnz: must be >= 0, got {self.nnz}")
        check(self.noise >= 0, f"noise: must be >= 0, got {self.noise}")
        check(self.alpha >= 0, f"alpha: must be >= 0, got {self.alpha}")
        check(self.lr > 0, f"lr: must be > 0, got {self.lr}")
        check(0 < self.lr_decay <= 1, f"lr_decay: must be in (0, 1], got {self.lr_decay}")
        check(self.reg >= 0, f"reg: must be >= 0, got {self.reg}")
        check(self.epochs >= 1, f"epochs: must be >= 1, got {self.epochs}")
        check(self.clocks_per_epoch >= 1, f"clocks_per_epoch: must be >= 1, got {self.clocks_per_epoch}")
        check(self.batches_per_clock >= 1, f"batches_per_clock: must be >= 1, got {self.batches_per_clock}")
        check(bool(self.data), 'data: expected "synthetic" or the path of a CSV file')
        check(self.send in ("auto", "delta", "gradient"), f"send: expected auto, delta or gradient, got {self.send!r}")
        check(0 <= self.holdout < 1, f"holdout: must be in [0, 1), got {self.holdout}")
        check(self.eval_every >= 0, f"eval_every: must be >= 0, got {self.eval_every}")
        check(self.micro_tasks >= 0, f"micro_tasks: must be >= 0 (0 = one per worker), got {self.micro_tasks}")
        check(not (self.holdout and self.test_data), "holdout and test_data: give one of them, not both")


def _check_tables(client: PSClient, a: MFArgs) -> tuple[PSTable, PSTable]:
    """Tables L (users × rank) and R (items × rank) must exist and agree with the args."""
    where = client.config.source
    need = "MF needs tables L (n_users x rank) and R (n_items x rank)"
    L, R = require_table(client, "L", need), require_table(client, "R", need)
    for T in (L, R):
        if np.dtype(T.dtype) != np.float32:
            raise ConfigError(f"{where}: tables.{T.name}.dtype must be float32, got {np.dtype(T.dtype)}")
    if L.cols != R.cols:
        raise ConfigError(f"{where}: tables.L.cols={L.cols} and tables.R.cols={R.cols} must both be the rank")
    want = {"n_users": (a.n_users, "tables.L.rows", L.rows), "n_items": (a.n_items, "tables.R.rows", R.rows),
            "rank": (a.rank, "tables.L.cols", L.cols)}
    for key, (v, tkey, tv) in want.items():
        if v is not None and v != tv:
            raise ConfigError(f"{where}: app.args.{key}={v} does not match {tkey}={tv}")
    return L, R


def _gradient_mode(a: MFArgs, L: PSTable, R: PSTable) -> bool:
    """Whether to send gradients (see the module docstring); delta mode needs ``add`` tables."""
    takes_gradients = [T for T in (L, R) if T.update != "add"]
    if a.send == "delta" and takes_gradients:
        T = takes_gradients[0]
        raise ConfigError(f"app.args.send: delta sends new - old, but table {T.name} has update: {T.update}, "
                          "which takes raw gradients; use send: gradient (or auto)")
    return a.send == "gradient" or (a.send == "auto" and bool(takes_gradients))


def _check_ids(path: str, data: Triples, n_users: int, n_items: int) -> Triples:
    u, i, r = data
    if u.size and u.max() >= n_users:
        raise DataError(f"{path}: user id {int(u.max())} does not fit table L with {n_users} rows")
    if i.size and i.max() >= n_items:
        raise DataError(f"{path}: item id {int(i.max())} does not fit table R with {n_items} rows")
    return u, i, r


def load_data(a: MFArgs, n_users: int, n_items: int, rank: int) -> tuple[Triples, Triples]:
    """(training, held-out) ratings of the job, ids checked; every worker loads the same ones."""
    if a.data == "synthetic":
        u, i, r = synthetic(n_users, n_items, rank, a.nnz, a.noise, a.data_seed, a.alpha)
        k = int(round(u.size * a.holdout))  # synthetic() returns its ratings in random order
        return (u[k:], i[k:], r[k:]), (u[:k], i[:k], r[:k])
    train = _check_ids(a.data, load_csv(a.data), n_users, n_items)
    if a.test_data:
        return train, _check_ids(a.test_data, load_csv(a.test_data), n_users, n_items)
    return train, (train[0][:0], train[1][:0], train[2][:0])


class HeldOut:
    """One worker's share of the held-out ratings, scored against the rows its cache holds now."""

    def __init__(self, test: Triples, lo: float, hi: float) -> None:
        u, i, r = test
        self.users, u_idx = np.unique(u, return_inverse=True)
        self.items, i_idx = np.unique(i, return_inverse=True)
        self.u_idx, self.i_idx = u_idx.astype(np.int64), i_idx.astype(np.int64)
        self.r = np.ascontiguousarray(r, dtype=np.float32)
        self.lo, self.hi = lo, hi

    def score(self, L: PSTable, R: PSTable) -> dict[str, float]:
        """``heldout_se`` (Σ squared error, predictions clipped to the training ratings' range) and
        ``heldout_count``; the launcher reports sqrt(Σ se / Σ count) over workers as ``heldout_rmse``."""
        if self.r.size == 0:
            return {"heldout_se": 0.0, "heldout_count": 0}
        Lv = np.ascontiguousarray(L.get_rows(self.users), dtype=np.float32)
        Rv = np.ascontiguousarray(R.get_rows(self.items), dtype=np.float32)
        se = clipped_squared_error(self.u_idx, self.i_idx, self.r, Lv, Rv, self.lo, self.hi)
        return {"heldout_se": float(se), "heldout_count": int(self.r.size)}


def prepare(config: Config) -> tuple[Triples, Triples] | None:
    """(training, held-out) ratings, loaded before the worker joins the servers (``run_app``'s
    ``prepare``); None where the config lacks a table (``train`` then says what is missing)."""
    a: MFArgs = from_dict(MFArgs, config.app.args, "app.args")
    names = {t.name for t in config.tables}
    if not {"L", "R"} <= names:
        return None
    L, R = config.table("L"), config.table("R")
    return load_data(a, L.rows, R.rows, L.cols)


def train(client: PSClient, args: Mapping[str, Any], data: tuple[Triples, Triples] | None = None) -> None:
    """Run ``epochs * clocks_per_epoch`` clocks of data-parallel SGD on this worker's partition; ``data``
    as :func:`prepare` loaded it, or None to load it here."""
    a: MFArgs = from_dict(MFArgs, args, "app.args")
    L, R = _check_tables(client, a)
    train_all, test_all = data if data is not None else load_data(a, L.rows, R.rows, L.cols)
    saved = client.restored_state()
    rank, P = client.rank, client.num_workers
    n_tasks = microtasks.count(a.micro_tasks, P, saved)
    tasks, received, plan, handoff_dir = microtasks.start(n_tasks, rank, P, saved)
    joining = microtasks.join_clock()  # a worker joining the running job (bosen scale) at that clock
    owner = user_owner(train_all[0], L.rows, n_tasks, seed=a.data_seed)  # each user's micro-task
    scale = (float(train_all[2].min()), float(train_all[2].max())) if train_all[2].size else (0.0, 0.0)
    evaluate = a.eval_every > 0 and test_all[2].size > 0
    gradient = _gradient_mode(a, L, R)
    lay = _Layout(train_all, test_all, owner, tasks.mine, a, L, R, gradient, scale)
    tick = 0
    # a checkpoint holds the clocks done and each task's generator (its batches' order is fixed by the seed)
    client.checkpoint_state(lambda: {"tick": np.array([tick]),
                                     **microtasks.pack({t: lay.state(t) for t in lay.tasks})})
    if saved is not None:
        got = restored(saved, ("tick",))
        assert got is not None
        tick = int(got["tick"][0])
        lay.load(microtasks.unpack(saved, lay.tasks, ("rng",)))
    if joining is not None:  # its tasks' generators as their givers left them at the boundary
        tick = joining
        lay.load(received)
    last = a.epochs * a.clocks_per_epoch
    if plan is not None:  # no boundary at or past the training's end: nothing would run on a moved task
        plan.ends_at(last)
    clock_s = 0.0  # time in the previous clock() call: counted in the next report
    while tick < last:
        epoch, k = divmod(tick, a.clocks_per_epoch)
        lr = a.lr * a.lr_decay ** epoch
        cost = np.zeros(4)  # loss, compute s, read s, send s
        samples = 0
        for batch, at, sizes in lay.clocks[k]:
            cost += _step(batch, lay.views, at, L, R, a, lr, gradient, lay.order(sizes))
            samples += int(batch.r.size)
        tick += 1
        t0 = time.perf_counter()
        fields = lay.held.score(L, R) if evaluate and (tick % a.eval_every == 0 or tick == last) else {}
        eval_s = time.perf_counter() - t0
        client.report(objective=float(cost[0]), samples=samples, seconds=float(cost[1]),
                      read_s=float(cost[2]), send_s=float(cost[3]), eval_s=eval_s, clock_s=clock_s, **fields)
        t0 = time.perf_counter()
        client.clock()
        clock_s = time.perf_counter() - t0
        if plan is not None and handoff_dir is not None and (new := plan.at(tick, n_tasks)) is not None:
            # a new assignment from this clock on: hand tasks off, rebuild for ours
            kept = {t: lay.state(t) for t in lay.tasks if new[t] == rank}
            got_states = tasks.handoff(tick, new, handoff_dir, lay.state)
            if plan.leaving(end=client.end_clocks):  # its tasks are given away: it leaves here (BYE on close)
                return
            lay = _Layout(train_all, test_all, owner, tasks.mine, a, L, R, gradient, scale)
            lay.load({**kept, **got_states})


class _Layout:
    """What a worker holds for its micro-tasks: each task is the ratings of a fixed set of users
    (``owner``: each user's task, :func:`user_owner` over the tasks) with its own generator, which
    cuts them into its fixed batches and orders each batch's SGD pass, so a task does the same work
    whichever worker runs it. The worker's k-th batch is the union of its tasks' k-th batches (one
    read, one numba pass; the pass visits task by task, each in its own order). One task per worker is
    the worker's ratings as a job without micro-tasks cut them."""

    def __init__(self, train: Triples, test: Triples, owner: np.ndarray, tasks: np.ndarray, a: MFArgs,
                 L: PSTable, R: PSTable, gradient: bool, scale: tuple[float, float]) -> None:
        self.tasks = [int(t) for t in tasks]
        self.rng = {t: np.random.default_rng([a.seed, t]) for t in self.tasks}
        b = a.batches_per_clock
        n = a.clocks_per_epoch * b
        per_task = [batches(_of_tasks(train, owner, [t]), n, self.rng[t]) for t in self.tasks]
        cut = [merge([p[k] for p in per_task]) for k in range(n)]
        sizes = [np.array([int(p[k].r.size) for p in per_task], dtype=np.int64) for k in range(n)]
        self.views = Views(L, R, cut, push=not gradient)
        self.clocks = [list(zip(cut[k:k + b], self.views.at[k:k + b], sizes[k:k + b], strict=True))
                       for k in range(0, n, b)]
        self.held = HeldOut(_of_tasks(test, owner, self.tasks), *scale)

    def order(self, sizes: np.ndarray) -> np.ndarray:
        """A merged batch's SGD order: each task's ratings in its own generator's order, task by task."""
        if len(sizes) == 1:
            return self.rng[self.tasks[0]].permutation(int(sizes[0]))
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        return np.concatenate([s + self.rng[t].permutation(int(k))
                               for t, s, k in zip(self.tasks, starts, sizes, strict=True)]).astype(np.int64)

    def state(self, t: int) -> dict[str, np.ndarray]:
        """Task ``t``'s generator (its batches follow from the seed)."""
        return {"rng": rng_state(self.rng[t])}

    def load(self, states: Mapping[int, Mapping[str, np.ndarray]]) -> None:
        for t in self.tasks:
            set_rng_state(self.rng[t], states[t]["rng"])


def _of_tasks(data: Triples, owner: np.ndarray, tasks: list[int]) -> Triples:
    """The ratings of the users of ``tasks`` (in data order)."""
    u, i, r = data
    if u.size == 0:
        return u[:0], i[:0], r[:0]
    if int(u.max()) >= owner.size:
        raise ValueError(f"user id {int(u.max())} has no micro-task (owner covers {owner.size} users)")
    mask = np.isin(owner[u], np.asarray(tasks, dtype=np.int64))
    return u[mask], i[mask], r[mask]


class Views:
    """One view (client/view.py) of every L row and one of every R row the worker's batches touch,
    kept for the whole run: a batch refreshes and pushes its own rows of them (``at``: their
    positions, and each rating's, to run the SGD pass on the views' arrays), so what one batch
    pushed the next one does not copy again, and the rows are held once, not per batch. Gradient mode
    sends gradients with inc_rows, so its views only read (``push=False``: no base copy kept)."""

    def __init__(self, L: PSTable, R: PSTable, cut: list[Batch], push: bool = True) -> None:
        users = np.unique(np.concatenate([x.users for x in cut])) if cut else np.zeros(0, np.int64)
        items = np.unique(np.concatenate([x.items for x in cut])) if cut else np.zeros(0, np.int64)
        self.L, self.R = L.view(users, base=push), R.view(items, base=push)
        self.at: list[Positions] = []
        for x in cut:
            pu, pi = np.searchsorted(users, x.users), np.searchsorted(items, x.items)
            self.at.append(Positions(pu, pi, pu[x.u_idx], pi[x.i_idx]))


@dataclass(frozen=True)
class Positions:
    """A batch's rows in the views (``users``, ``items``) and each rating's (``u``, ``i``)."""

    users: np.ndarray
    items: np.ndarray
    u: np.ndarray
    i: np.ndarray


def _step(batch: Batch, views: Views, at: Positions, L: PSTable, R: PSTable, a: MFArgs, lr: float,
          gradient: bool, order: np.ndarray) -> tuple[float, float, float, float]:
    """One mini-batch: read its rows (fresh as the cache allows), compute, send; (loss, compute
    seconds, seconds reading, seconds sending): where a clock's time goes, for the report.

    The loss: sgd_pass's running loss (delta mode) or the exact loss at the values read (gradient
    mode). Several batches per clock re-read the cache in between, which is what lets early
    (managed) communication help. The batch refreshes its rows of the worker's views (only rows
    written since are copied); in delta mode the SGD pass runs on the views' arrays and their push
    sends new - old of the batch's rows in one pass per table."""
    if batch.r.size == 0:
        return 0.0, 0.0, 0.0, 0.0
    t0 = time.perf_counter()
    Lall = views.L.refresh(at.users)
    Rall = views.R.refresh(at.items)
    t1 = time.perf_counter()
    if gradient:
        loss, gL, gR = batch.gradient(Lall[at.users], Rall[at.items], a.reg)
        t2 = time.perf_counter()
        L.inc_rows(batch.users, gL if L.update != "add" else gL * np.float32(-lr))
        R.inc_rows(batch.items, gR if R.update != "add" else gR * np.float32(-lr))
    else:
        loss = float(sgd_pass(at.u, at.i, batch.r, Lall, Rall, lr, a.reg, order))
        t2 = time.perf_counter()
        views.L.push(at.users)
        views.R.push(at.items)
    return loss, t2 - t1, t1 - t0, time.perf_counter() - t2
