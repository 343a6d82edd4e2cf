"""SGD matrix factorization worker: ratings r ≈ L_u · R_i with L and R living in the parameter server.

Each worker keeps the ratings of its users (see data.partition) and, once per clock, fetches the L
rows of its users and the R rows of its items (one get_rows per table), measures the exact loss of
its chunk at those values, runs one numba SGD pass on local copies and sends ``new - old`` back
with inc_rows. One clock is one pass over the local data by default (the thesis' setting); with
``clocks_per_epoch = k`` each pass is split into k fixed chunks, one clock each (Bösen's "BS-k").

``send: gradient`` is for tables whose stored procedure takes the step on the server (``update:
sgd | adagrad | adarevision``): each clock the worker computes the gradient of its chunk's loss at
the values it read and sends it as is (``add`` tables get ``-lr * g`` instead); the chunks are then
mini-batches, so use several clocks per epoch. ``send: auto`` (default) picks gradient as soon as L
or R has a procedure other than ``add``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from bosen.apps.mf.data import Triples, load_csv, partition, synthetic
from bosen.apps.mf.kernels import grad_pass, sgd_pass, squared_loss
from bosen.config import from_dict


@dataclass(frozen=True)
class MFArgs:
    """``app.args`` of an MF job. ``None`` sizes default to the geometry of tables L and R."""

    data: str = "synthetic"  # "synthetic" or the path of a user,item,rating CSV file
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
    batches_per_clock: int = 1  # mini-batches per clock, each re-reading its rows from the cache
    seed: int = 0  # shuffling order (mixed with the worker's rank)
    send: str = "auto"  # "delta" (local SGD, new - old), "gradient" (raw gradients), "auto"

    def __post_init__(self) -> None:
        for k in ("n_users", "n_items", "rank"):
            v = getattr(self, k)
            if v is not None and v < 1:
                raise ValueError(f"{k}: must be >= 1, got {v}")
        checks = {"nnz": self.nnz >= 0, "noise": self.noise >= 0, "alpha": self.alpha >= 0,
                  "lr": self.lr > 0, "lr_decay": 0 < self.lr_decay <= 1, "reg": self.reg >= 0,
                  "epochs": self.epochs >= 1, "clocks_per_epoch": self.clocks_per_epoch >= 1,
                  "batches_per_clock": self.batches_per_clock >= 1}
        for k, ok in checks.items():
            if not ok:
                raise ValueError(f"{k}: invalid value {getattr(self, k)!r}")
        if not self.data:
            raise ValueError('data: expected "synthetic" or the path of a CSV file')
        if self.send not in ("auto", "delta", "gradient"):
            raise ValueError(f"send: expected auto, delta or gradient, got {self.send!r}")


@dataclass
class _Chunk:
    """The ratings of one clock, re-indexed into the local row blocks it fetches."""

    users: np.ndarray  # unique sorted global L row ids
    items: np.ndarray  # unique sorted global R row ids
    u_idx: np.ndarray  # per rating: index into users
    i_idx: np.ndarray  # per rating: index into items
    r: np.ndarray


def _chunks(part: Triples, k: int, rng: np.random.Generator) -> list[_Chunk]:
    """Split a partition into k fixed random chunks; each clock's loss then covers 1/k of it."""
    u, i, r = part
    out = []
    for sel in np.array_split(rng.permutation(u.size), k):
        sel = np.sort(sel)
        users, u_idx = np.unique(u[sel], return_inverse=True)
        items, i_idx = np.unique(i[sel], return_inverse=True)
        out.append(_Chunk(users.astype(np.int64), items.astype(np.int64), u_idx.astype(np.int64),
                          i_idx.astype(np.int64), np.ascontiguousarray(r[sel], dtype=np.float32)))
    return out


def _check_tables(client: Any, a: MFArgs) -> tuple[Any, Any, int, int, int]:
    """Tables L (users × rank) and R (items × rank) must exist and agree with the args."""
    cfg = getattr(client, "config", None)
    where = getattr(cfg, "source", "the config")
    tabs = {}
    for name in ("L", "R"):
        try:
            tabs[name] = client.table(name)
        except KeyError:
            raise ValueError(f"{where}: MF needs tables L (n_users x rank) and R (n_items x rank); "
                             f"table {name} is missing") from None
    L, R = tabs["L"], tabs["R"]
    for name, T in tabs.items():
        if np.dtype(T.dtype) != np.float32:
            raise ValueError(f"{where}: tables.{name}.dtype must be float32, got {np.dtype(T.dtype)}")
    if L.cols != R.cols:
        raise ValueError(f"{where}: tables.L.cols={L.cols} and tables.R.cols={R.cols} must both be the rank")
    want = {"n_users": (a.n_users, "tables.L.rows", L.rows), "n_items": (a.n_items, "tables.R.rows", R.rows),
            "rank": (a.rank, "tables.L.cols", L.cols)}
    for key, (v, tkey, tv) in want.items():
        if v is not None and v != tv:
            raise ValueError(f"{where}: app.args.{key}={v} does not match {tkey}={tv}")
    return L, R, L.rows, R.rows, L.cols


def _gradient_mode(a: MFArgs, L: Any, R: Any) -> bool:
    """Whether to send gradients (see the module docstring); delta mode needs ``add`` tables."""
    takes_gradients = [T.name for T in (L, R) if getattr(T, "update", "add") != "add"]
    if a.send == "delta" and takes_gradients:
        name = takes_gradients[0]
        raise ValueError(f"app.args.send: delta sends new - old, but table {name} has update: "
                         f"{getattr(L if name == L.name else R, 'update')}, which takes raw gradients; "
                         "use send: gradient (or auto)")
    return a.send == "gradient" or (a.send == "auto" and bool(takes_gradients))


def load_data(a: MFArgs, n_users: int, n_items: int, rank: int) -> Triples:
    """All ratings of the job (every worker loads the same, deterministically) with ids checked."""
    if a.data == "synthetic":
        return synthetic(n_users, n_items, rank, a.nnz, a.noise, a.data_seed, a.alpha)
    u, i, r = load_csv(a.data)
    if u.size and u.max() >= n_users:
        raise ValueError(f"{a.data}: user id {int(u.max())} does not fit table L with {n_users} rows")
    if i.size and i.max() >= n_items:
        raise ValueError(f"{a.data}: item id {int(i.max())} does not fit table R with {n_items} rows")
    return u, i, r


def train(client: Any, args: Mapping[str, Any]) -> None:
    """Run ``epochs * clocks_per_epoch`` clocks of data-parallel SGD on this worker's partition."""
    a: MFArgs = from_dict(MFArgs, args, "app.args")
    L, R, n_users, n_items, rank = _check_tables(client, a)
    part = partition(*load_data(a, n_users, n_items, rank), client.rank, client.num_workers,
                     seed=a.data_seed)
    rng = np.random.default_rng([a.seed, client.rank])
    b = a.batches_per_clock
    batches = _chunks(part, a.clocks_per_epoch * b, rng)
    clocks = [batches[k:k + b] for k in range(0, len(batches), b)]
    gradient = _gradient_mode(a, L, R)
    for epoch in range(a.epochs):
        lr = a.lr * a.lr_decay ** epoch
        for batch_list in clocks:
            loss = seconds = 0.0
            samples = 0
            for c in batch_list:
                dl, ds = _step(c, L, R, a, lr, gradient, rng)
                loss, seconds, samples = loss + dl, seconds + ds, samples + int(c.r.size)
            client.report(objective=loss, samples=samples, seconds=seconds)
            client.clock()


def _step(c: _Chunk, L: Any, R: Any, a: MFArgs, lr: float, gradient: bool,
          rng: np.random.Generator) -> tuple[float, float]:
    """One mini-batch: read its rows (fresh as the cache allows), compute, send; (loss, seconds).

    The loss is measured at the values read, before this batch's own update. Several batches per
    clock re-read the cache in between, which is what lets early (managed) communication help."""
    loss, seconds = 0.0, 0.0
    if c.r.size == 0:
        return loss, seconds
    if gradient:
        Lv = L.get_rows(c.users)
        Rv = R.get_rows(c.items)
        t0 = time.perf_counter()
        gL = np.zeros(Lv.shape, dtype=np.float32)
        gR = np.zeros(Rv.shape, dtype=np.float32)
        loss = grad_pass(c.u_idx, c.i_idx, c.r, np.ascontiguousarray(Lv, dtype=np.float32),
                         np.ascontiguousarray(Rv, dtype=np.float32), a.reg, gL, gR)
        seconds = time.perf_counter() - t0
        L.inc_rows(c.users, gL if L.update != "add" else gL * np.float32(-lr))
        R.inc_rows(c.items, gR if R.update != "add" else gR * np.float32(-lr))
    else:
        Lv = L.get_rows(c.users)
        Rv = R.get_rows(c.items)
        t0 = time.perf_counter()
        Lw = np.array(Lv, dtype=np.float32, order="C")  # local working copies
        Rw = np.array(Rv, dtype=np.float32, order="C")
        loss = squared_loss(c.u_idx, c.i_idx, c.r, Lw, Rw)
        sgd_pass(c.u_idx, c.i_idx, c.r, Lw, Rw, lr, a.reg, rng.permutation(c.r.size))
        seconds = time.perf_counter() - t0
        L.inc_rows(c.users, Lw - Lv)
        R.inc_rows(c.items, Rw - Rv)
    return loss, seconds
