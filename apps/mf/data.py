"""Rating data for SGD matrix factorization: a synthetic generator, a CSV reader and the partitioner.

All three return plain numpy triples ``(users int64, items int64, ratings float32)`` so the worker,
the tests and the benchmark share one representation and no per-rating Python loop is needed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numba import njit

from bosen.apps import textparse as tp
from bosen.errors import DataError

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


# ------------------------------------------------------------------------------------------------
# ratings CSV (numba pass over the bytes, on the shared primitives of bosen.apps.textparse)

_OK, _COLUMNS, _NUMBER, _ID, _FINITE = range(5)
_FIELDS = ("user", "item", "rating")
_MAX_ID = float(2**62)


@njit(cache=True, nogil=True)
def _parse_ratings(buf, users, items, ratings):  # pragma: no cover - numba
    """Parse ``user,item,rating`` lines (``#`` comments, blank lines; a first line that is not all
    numbers is a header). Returns (status, line, line_start, n, field, header): on an error the
    1-based line, the byte offset where it starts and the offending field (0-based), or for
    _COLUMNS the number of fields found."""
    size = buf.size
    vals = np.zeros(3, np.float64)
    bounds = np.zeros(4, np.int64)
    n = 0
    line = 0
    pos = 0
    header = False
    first = True
    while pos < size:
        line += 1
        start = pos
        end = tp.line_end(buf, pos)
        pos = end + 1
        a, b = tp.trim(buf, start, tp.find_byte(buf, start, end, tp.HASH))
        if a == b:
            continue
        nf = 1
        bounds[0] = a
        c = tp.find_byte(buf, a, b, tp.COMMA)
        while c < b:
            if nf < 3:
                bounds[nf] = c + 1
            nf += 1
            c = tp.find_byte(buf, c + 1, b, tp.COMMA)
        if nf != 3:
            return _COLUMNS, line, start, n, nf, header
        bounds[3] = b + 1
        bad = -1
        for f in range(3):
            fa, fb = tp.trim(buf, bounds[f], bounds[f + 1] - 1)
            ok, v = tp.parse_float(buf, fa, fb)
            if not ok and bad < 0:
                bad = f
            vals[f] = v
        if first:
            first = False
            if bad >= 0:  # the header line
                header = True
                continue
        if bad >= 0:
            return _NUMBER, line, start, n, bad, header
        for f in range(2):
            v = vals[f]
            if not (v >= 0 and v == np.floor(v) and v < _MAX_ID):
                return _ID, line, start, n, f, header
        if not np.isfinite(vals[2]):
            return _FINITE, line, start, n, 2, header
        users[n] = np.int64(vals[0])
        items[n] = np.int64(vals[1])
        ratings[n] = vals[2]
        n += 1
    return _OK, line, size, n, 0, header


def load_csv(path: str | Path) -> Triples:
    """Read ``user,item,rating`` lines (``.gz`` too) into numpy arrays: an optional header line,
    blank lines and ``#`` comments are skipped. Ids must be non-negative integers, ratings finite.

    One numba pass over the file's bytes; a bad line fails with a DataError naming the file and the
    1-based line.
    """
    path = Path(path)
    buf = tp.read_bytes(path, "ratings")
    cap = tp.count_byte(buf, tp.NEWLINE) + 1
    users = np.empty(cap, np.int64)
    items = np.empty(cap, np.int64)
    ratings = np.empty(cap, np.float32)
    st, line, start, n, field, header = _parse_ratings(buf, users, items, ratings)
    if st != _OK:
        text = tp.line_text(buf, start, limit=buf.size).split("#", 1)[0].strip()
        parts = text.split(",")
        where = f"{path}:{line}"
        if st == _COLUMNS:
            raise DataError(f"{where}: expected 3 columns user,item,rating, got {field}: {text!r}")
        name, value = _FIELDS[field], parts[field].strip()
        if st == _NUMBER:
            raise DataError(f"{where}: {name} {value!r} is not a number")
        if st == _ID:
            raise DataError(f"{where}: {name} id {value!r} must be a non-negative integer")
        raise DataError(f"{where}: rating {value!r} is not finite")
    if n == 0:
        if header:
            raise DataError(f"{path}: no ratings after the header line")
        raise DataError(f"{path}: empty ratings file (expected user,item,rating lines)")
    return users[:n].copy(), items[:n].copy(), ratings[:n].copy()


def user_owner(users: np.ndarray, n_users: int, num_workers: int, seed: int = 0) -> np.ndarray:
    """The worker that owns each user id in ``[0, n_users)``, from the training ratings' ``users``.

    Partitioning by user (as Bösen's MF does: ratings are split among workers by user) makes every L
    row private to one worker, so only R rows see concurrent updates under SSP and each worker fetches
    just its own L rows. To keep work even despite power-law degrees, users are shuffled (fixed
    ``seed``, so all workers agree) and cut where the cumulative rating count crosses multiples of
    nnz/num_workers; parts then differ by at most about one user's degree. Held-out ratings go to
    the owner of their user (users with no training rating are spread by id).
    """
    if num_workers < 1:
        raise ValueError(f"partition: num_workers={num_workers} must be >= 1")
    n_users = max(n_users, int(users.max()) + 1 if users.size else 0)
    counts = np.bincount(users, minlength=n_users)
    perm = np.random.default_rng(seed).permutation(n_users)
    cum = np.cumsum(counts[perm])
    total = max(int(cum[-1]), 1) if cum.size else 1
    owner_in_perm = np.minimum(((cum - counts[perm]) * num_workers) // total, num_workers - 1)
    owner = np.empty(n_users, dtype=np.int64)
    owner[perm] = owner_in_perm
    idle = counts == 0
    owner[idle] = np.nonzero(idle)[0] % num_workers
    return owner


def partition(users: np.ndarray, items: np.ndarray, ratings: np.ndarray, rank: int,
              num_workers: int, seed: int = 0, owner: np.ndarray | None = None) -> Triples:
    """The ratings worker ``rank`` of ``num_workers`` trains on: all ratings of its users
    (:func:`user_owner`; pass ``owner`` to split held-out ratings the way the training ones were).
    Every rating lands in exactly one part."""
    if not 0 <= rank < num_workers:
        raise ValueError(f"partition: rank {rank} not in [0, {num_workers})")
    if users.size == 0:
        return users[:0], items[:0], ratings[:0]
    if owner is None:
        owner = user_owner(users, 0, num_workers, seed)
    if int(users.max()) >= owner.size:
        raise ValueError(f"partition: user id {int(users.max())} has no owner (owner covers {owner.size} users)")
    mask = owner[users] == rank
    return users[mask], items[mask], ratings[mask]
