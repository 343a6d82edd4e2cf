"""Rating data for SGD matrix factorization: a synthetic generator, a CSV loader and the partitioner.

All three return plain numpy triples ``(users int64, items int64, ratings float32)`` so the worker,
the tests and the benchmark share one representation and no per-rating Python loop is needed.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np

Triples = tuple[np.ndarray, np.ndarray, np.ndarray]


def _zipf_weights(n: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    """Popularity weights ``(k+1)^-alpha`` assigned to ids in random order (normalized to sum 1).

    The random order matters: hash-partitioned servers and id-ordered data would otherwise see all
    heavy rows at small ids.
    """
    w = np.arange(1, n + 1, dtype=np.float64) ** -alpha
    w = w[rng.permutation(n)]
    return w / w.sum()


def synthetic(n_users: int, n_items: int, rank: int, nnz: int, noise: float = 0.1, seed: int = 0,
              alpha: float = 0.8) -> Triples:
    """Ratings ``r = u*·v* + N(0, noise²)`` from a random rank-``rank`` model, Netflix-like in shape.

    Users and items draw their degree from Zipf-like popularities ``(k+1)^-alpha`` (alpha = 0 gives
    uniform degrees), so a few users/items have far more ratings than the median, as in Netflix.
    Pairs are sampled in vectorized rounds, deduplicated and thinned to exactly ``nnz`` distinct
    (user, item) pairs, returned in random order. Factors have entries ~ N(0, rank^-1/2) so the
    noiseless ratings have unit variance whatever the rank. Deterministic in ``seed``: every worker
    that calls this with the same arguments gets the same data.
    """
    if n_users < 1 or n_items < 1 or rank < 1:
        raise ValueError("synthetic: n_users, n_items and rank must be >= 1")
    if not 0 <= nnz <= n_users * n_items:
        raise ValueError(f"synthetic: nnz={nnz} must be in [0, n_users*n_items={n_users * n_items}]")
    if noise < 0 or alpha < 0:
        raise ValueError("synthetic: noise and alpha must be >= 0")
    rng = np.random.default_rng(seed)
    wu = _zipf_weights(n_users, alpha, rng)
    wi = _zipf_weights(n_items, alpha, rng)
    total = n_users * n_items
    if nnz > total // 2:
        # dense regime: rejection sampling would stall at the saturated head; take distinct cells
        keys = rng.choice(total, size=nnz, replace=False).astype(np.int64)
    else:
        keys = np.empty(0, dtype=np.int64)
        for _ in range(64):
            need = nnz - keys.size
            if need <= 0:
                break
            m = int(need * 1.3) + 64
            u = rng.choice(n_users, size=m, p=wu)
            i = rng.choice(n_items, size=m, p=wi)
            keys = np.union1d(keys, u.astype(np.int64) * n_items + i)
        if keys.size < nnz:  # head saturated under strong skew: top up uniformly over free cells
            extra = rng.choice(total, size=2 * (nnz - keys.size) + 64, replace=False).astype(np.int64)
            keys = np.union1d(keys, extra)
        keys = rng.choice(keys, size=nnz, replace=False)
    keys = keys[rng.permutation(keys.size)]
    users, items = np.divmod(keys, n_items)
    scale = rank ** -0.25
    U = (rng.standard_normal((n_users, rank)) * scale).astype(np.float32)
    V = (rng.standard_normal((n_items, rank)) * scale).astype(np.float32)
    r = np.einsum("ij,ij->i", U[users], V[items]) + noise * rng.standard_normal(nnz).astype(np.float32)
    return users.astype(np.int64), items.astype(np.int64), r.astype(np.float32)


_NUM = re.compile(r"^\s*[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?\s*$|^\s*[+-]?(nan|inf|infinity)\s*$",
                  re.IGNORECASE)
_INT = re.compile(r"^\s*\+?\d+(\.0*)?\s*$")


def _first_bad_line(path: Path, lines: list[str], first: int) -> str:
    """Find the offending line after the vectorized parse failed, for a message that names it."""
    for n, line in enumerate(lines[first:], start=first + 1):
        line = line.split("#", 1)[0]
        if not line.strip():
            continue
        parts = line.split(",")
        if len(parts) != 3:
            return f"{path}:{n}: expected 3 columns user,item,rating, got {len(parts)}: {line.strip()!r}"
        for name, p in zip(("user", "item", "rating"), parts):
            if not _NUM.match(p):
                return f"{path}:{n}: {name} {p.strip()!r} is not a number"
        for name, p in zip(("user", "item"), parts[:2]):
            if not _INT.match(p):
                return f"{path}:{n}: {name} id {p.strip()!r} must be a non-negative integer"
        if not np.isfinite(float(parts[2])):
            return f"{path}:{n}: rating {parts[2].strip()!r} is not finite"
    return f"{path}: cannot parse ratings"


def load_csv(path: str | Path) -> Triples:
    """Read ``user,item,rating`` lines into numpy arrays (optional header; blank lines and
    ``#`` comments are skipped).

    Parsing is one vectorized ``np.loadtxt`` call; only when it fails, or the values are out of
    range, is the file scanned line by line to name the first bad line (1-based) in a ValueError.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ValueError(f"{path}: cannot read ratings file: {e.strerror}") from None
    lines = text.splitlines()
    first = next((k for k, ln in enumerate(lines) if ln.split("#", 1)[0].strip()), None)
    if first is None:
        raise ValueError(f"{path}: empty ratings file (expected user,item,rating lines)")
    head = lines[first].split(",")
    if len(head) == 3 and not all(_NUM.match(p) for p in head):
        first += 1  # header line
    body = "\n".join(lines[first:])
    if not body.strip():
        raise ValueError(f"{path}: no ratings after the header line")
    try:
        a = np.loadtxt(io.StringIO(body), delimiter=",", dtype=np.float64, ndmin=2)
    except ValueError:
        raise ValueError(_first_bad_line(path, lines, first)) from None
    if a.shape[1] != 3:
        raise ValueError(_first_bad_line(path, lines, first))
    ids = a[:, :2]
    bad = ~((ids >= 0) & (ids == np.floor(ids)) & np.isfinite(ids)).all(axis=1) | ~np.isfinite(a[:, 2])
    if bad.any():
        raise ValueError(_first_bad_line(path, lines, first))
    return a[:, 0].astype(np.int64), a[:, 1].astype(np.int64), a[:, 2].astype(np.float32)


def partition(users: np.ndarray, items: np.ndarray, ratings: np.ndarray, rank: int,
              num_workers: int, seed: int = 0) -> Triples:
    """The ratings worker ``rank`` of ``num_workers`` trains on: all ratings of a set of users.

    Partitioning by user (as Bösen's MF does, thesis L1040) makes every L row private to one
    worker, so only R rows see concurrent updates under SSP and each worker fetches just its own L
    rows. To keep work even despite power-law degrees, users are shuffled (fixed ``seed``, so all
    workers agree) and cut where the cumulative rating count crosses multiples of nnz/num_workers;
    parts then differ by at most about one user's degree. Every rating lands in exactly one part.
    """
    if not 0 <= rank < num_workers:
        raise ValueError(f"partition: rank {rank} not in [0, {num_workers})")
    if users.size == 0:
        return users[:0], items[:0], ratings[:0]
    n_users = int(users.max()) + 1
    counts = np.bincount(users, minlength=n_users)
    perm = np.random.default_rng(seed).permutation(n_users)
    cum = np.cumsum(counts[perm])
    owner_in_perm = np.minimum(((cum - counts[perm]) * num_workers) // max(int(cum[-1]), 1),
                               num_workers - 1)
    owner = np.empty(n_users, dtype=np.int64)
    owner[perm] = owner_in_perm
    mask = owner[users] == rank
    return users[mask], items[mask], ratings[mask]
