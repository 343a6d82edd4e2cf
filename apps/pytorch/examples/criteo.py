"""A seeded, Criteo-shaped click data set with a planted teacher, so the best achievable AUC is known.

Each sample has 13 dense features (log-normal counts, normalized as ``(log1p(x) - mu) / sigma``, as
DLRM preprocesses Criteo), 26 categorical features whose ids follow a Zipf law per feature (the
cardinalities of Criteo Kaggle's 26 columns, capped at ``max_rows``), and a click label drawn from a
fixed random DLRM-like scoring function (the *teacher*): ``sigmoid(bias + scale * (pairwise dots of the
26 id embeddings and a projection of the dense features, plus a linear part))``, then Bernoulli.
Ranking by the teacher's own probability is Bayes optimal, so ``teacher_auc`` on a held-out sample
is the ceiling any student can reach; a student sees each rare id a few times only and stays below.

Everything is a pure function of the seed and the sample's index: sample ``i`` is the same whichever
worker generates it, so a worker makes its own shard (``shard(spec, rank, num_workers, ...)``) without
the others. The teacher's embeddings are not stored: a counter-based hash of (seed, feature, id, dim)
gives them, so a 1M-row feature costs no memory until its ids show up. Generation is numpy, in
vectorized chunks of ``CHUNK`` samples, each from its own seeded stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from bosen.config import check

DENSE = 13
SPARSE = 26
CHUNK = 8192  # samples per independently seeded chunk (always made whole, then cut)
# Criteo Kaggle (Display Advertising Challenge) cardinalities of C1..C26
KAGGLE_ROWS = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992,
               5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)
TRAIN, HELDOUT = 0, 1  # stream ids: the training set and the held-out set are disjoint streams


@dataclass(frozen=True)
class CriteoSpec:
    """What the generator makes; every field changes the data (``seed`` included)."""

    max_rows: int = 1_000_000  # cap on each feature's cardinality (Criteo's largest have 10M ids)
    rows: tuple[int, ...] = ()  # explicit cardinalities of the 26 features (default: Kaggle's, capped)
    zipf: float = 1.1  # exponent of the id distribution of each feature: P(rank k) ~ k^-zipf
    teacher_dim: int = 8  # width of the teacher's id embeddings
    teacher_scale: float = 4.5  # sharpness of the teacher's logit (higher: more separable, higher AUC)
    # weight of the teacher's pairwise-dot part against its first-order part (as on real Criteo, where
    # logistic regression on the ids gets most of DLRM's AUC)
    teacher_pairwise: float = 0.5
    ctr: float = 0.25  # about the mean click rate (the teacher's bias is set for it)
    seed: int = 0
    cardinalities: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        check(self.max_rows >= 1, "max_rows: must be >= 1")
        rows = tuple(int(r) for r in self.rows) if self.rows else tuple(min(r, self.max_rows) for r in KAGGLE_ROWS)
        check(len(rows) == SPARSE, f"rows: expected {SPARSE} cardinalities, got {len(rows)}")
        check(all(r >= 1 for r in rows), "rows: every cardinality must be >= 1")
        check(self.zipf > 0, "zipf: must be > 0")
        check(self.teacher_dim >= 1, "teacher_dim: must be >= 1")
        check(self.teacher_scale > 0, "teacher_scale: must be > 0")
        check(self.teacher_pairwise >= 0, "teacher_pairwise: must be >= 0")
        check(0 < self.ctr < 1, "ctr: must be in (0, 1)")
        check(self.seed >= 0, "seed: must be >= 0")
        object.__setattr__(self, "cardinalities", rows)


@dataclass(frozen=True)
class Samples:
    """``dense`` (n, 13) float32, ``ids`` (n, 26) int64 (column f in [0, cardinalities[f])), ``labels``
    (n,) float32 in {0, 1}, ``prob`` (n,) float64: the teacher's click probability."""

    dense: np.ndarray
    ids: np.ndarray
    labels: np.ndarray
    prob: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.shape[0])


# -- counter-based randomness (the teacher) --------------------------------------------------------


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on uint64 arrays (wraps mod 2^64)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _hash_normal(seed: int, feature: int, ids: np.ndarray, dim: int) -> np.ndarray:
    """Standard normals (len(ids), dim), a fixed function of (seed, feature, id, column) (Box-Muller)."""
    key = _mix(np.array([(seed * 1_000_003 + feature) * 2 + 1], dtype=np.uint64))[0]
    base = (ids.astype(np.uint64)[:, None] * np.uint64(2 * dim) + np.arange(2 * dim, dtype=np.uint64)[None, :])
    with np.errstate(over="ignore"):
        h = _mix(base ^ key)
    u = ((h >> np.uint64(11)).astype(np.float64) + 0.5) * (1.0 / (1 << 53))  # (0, 1)
    u1, u2 = u[:, :dim], u[:, dim:]
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


@dataclass(frozen=True)
class _Teacher:
    project: np.ndarray  # (13, k): the dense features' vector in the interaction
    linear: np.ndarray  # (k,): the linear part's direction
    bias: float


@lru_cache(maxsize=8)
def _teacher(spec: CriteoSpec) -> _Teacher:
    rng = np.random.default_rng(np.random.SeedSequence([spec.seed, 7919]))
    k = spec.teacher_dim
    project = rng.normal(0, 1 / np.sqrt(DENSE), (DENSE, k))
    linear = rng.normal(0, 1, k)
    t = _Teacher(project, linear, 0.0)
    # the bias that gives about the requested click rate, from a calibration sample
    logits = _logits(spec, t, *_features(spec, HELDOUT + 1, 0, 16384))
    lo, hi = -20.0, 20.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if (1 / (1 + np.exp(-(logits + mid)))).mean() < spec.ctr else (lo, mid)
    return _Teacher(project, linear, (lo + hi) / 2)


# -- the samples -------------------------------------------------------------------------------------


@lru_cache(maxsize=32)
def _zipf_cdf(rows: int, s: float) -> np.ndarray:
    w = np.arange(1, rows + 1, dtype=np.float64) ** -s
    c = np.cumsum(w)
    return c / c[-1]


def _shuffle_key(spec: CriteoSpec, f: int) -> tuple[int, int]:
    """An affine bijection rank -> id of feature f (a*r + b mod rows), so hot ids are spread over the table."""
    rows = spec.cardinalities[f]
    rng = np.random.default_rng(np.random.SeedSequence([spec.seed, 104729, f]))
    while True:
        a = int(rng.integers(1, max(rows, 2)))
        if np.gcd(a, rows) == 1:
            return a, int(rng.integers(0, rows))


def _features(spec: CriteoSpec, stream: int, chunk: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``n`` samples' raw features of chunk ``chunk`` of ``stream``: (raw dense counts, ids)."""
    t_mu, t_sigma = _dense_params(spec)
    rng = np.random.default_rng(np.random.SeedSequence([spec.seed, stream, chunk]))
    # a per-sample "activity" factor correlates the dense counts, as in the real logs
    z = rng.normal(size=(n, DENSE)) * 0.8 + rng.normal(size=(n, 1)) * 0.6
    raw = np.floor(np.exp(t_mu + t_sigma * z))
    ids = np.empty((n, SPARSE), dtype=np.int64)
    u = rng.random((n, SPARSE))
    for f, rows in enumerate(spec.cardinalities):
        rank = np.searchsorted(_zipf_cdf(rows, spec.zipf), u[:, f], side="right")
        np.minimum(rank, rows - 1, out=rank)
        a, b = _shuffle_key(spec, f)
        ids[:, f] = (rank * a + b) % rows
    return raw, ids


@lru_cache(maxsize=8)
def _dense_params(spec: CriteoSpec) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(np.random.SeedSequence([spec.seed, 7907]))
    return rng.uniform(0.5, 4.0, DENSE), rng.uniform(0.5, 1.5, DENSE)


def normalize(spec: CriteoSpec, raw: np.ndarray) -> np.ndarray:
    """Dense counts as DLRM feeds them: log1p, then centred and scaled by the generator's own log-scale
    parameters (so about zero mean, unit spread), float32."""
    mu, sigma = _dense_params(spec)
    return ((np.log1p(raw) - mu) / sigma).astype(np.float32)


def _logits(spec: CriteoSpec, t: _Teacher, raw: np.ndarray, ids: np.ndarray) -> np.ndarray:
    k = spec.teacher_dim
    vecs = np.empty((raw.shape[0], SPARSE + 1, k))
    vecs[:, 0] = normalize(spec, raw).astype(np.float64) @ t.project
    for f in range(SPARSE):
        uniq, inv = np.unique(ids[:, f], return_inverse=True)  # hash each distinct id once
        vecs[:, f + 1] = (_hash_normal(spec.seed, f, uniq, k) / np.sqrt(k))[inv]
    total = vecs.sum(1)
    # sum over pairs i < j of <v_i, v_j> = (|sum v|^2 - sum |v|^2) / 2
    pairs = ((total * total).sum(1) - (vecs * vecs).sum((1, 2))) / 2
    npairs = (SPARSE + 1) * SPARSE / 2
    first = vecs @ t.linear / np.sqrt(k)
    mixed = spec.teacher_pairwise * pairs / np.sqrt(npairs) + first.sum(1) / np.sqrt(SPARSE + 1)
    return spec.teacher_scale * mixed + t.bias


def chunk(spec: CriteoSpec, stream: int, index: int) -> Samples:
    """Samples ``index * CHUNK .. (index + 1) * CHUNK - 1`` of ``stream`` (TRAIN or HELDOUT)."""
    raw, ids = _features(spec, stream, index, CHUNK)
    t = _teacher(spec)
    prob = 1.0 / (1.0 + np.exp(-_logits(spec, t, raw, ids)))
    rng = np.random.default_rng(np.random.SeedSequence([spec.seed, stream, index, 1]))
    labels = (rng.random(CHUNK) < prob).astype(np.float32)
    return Samples(normalize(spec, raw), ids, labels, prob)


def generate(spec: CriteoSpec, start: int, stop: int, stream: int = TRAIN) -> Samples:
    """Samples ``start .. stop - 1`` of ``stream``: the same values whoever asks and in what pieces."""
    check(0 <= start <= stop, f"start, stop: need 0 <= start <= stop, got {start}, {stop}")
    parts = []
    for c in range(start // CHUNK, -(-stop // CHUNK)):
        lo, hi = max(start, c * CHUNK) - c * CHUNK, min(stop, (c + 1) * CHUNK) - c * CHUNK
        s = chunk(spec, stream, c)
        parts.append(Samples(*(a[lo:hi] for a in (s.dense, s.ids, s.labels, s.prob))))
    if not parts:
        return Samples(np.zeros((0, DENSE), np.float32), np.zeros((0, SPARSE), np.int64), np.zeros(0, np.float32),
                       np.zeros(0))
    return Samples(*(np.concatenate(a) for a in zip(*((p.dense, p.ids, p.labels, p.prob) for p in parts),
                                                    strict=True)))


def shard(spec: CriteoSpec, rank: int, num_workers: int, n: int, stream: int = TRAIN) -> Samples:
    """Worker ``rank``'s contiguous share of the first ``n`` samples (shares differ by at most one)."""
    check(num_workers >= 1 and 0 <= rank < num_workers, f"rank {rank} of {num_workers} workers: out of range")
    return generate(spec, n * rank // num_workers, n * (rank + 1) // num_workers, stream)


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U, ties count one half); NaN with one class only."""
    scores = np.asarray(scores, dtype=np.float64).ravel()
    pos = np.asarray(labels).ravel() > 0.5
    n_pos = int(pos.sum())
    n_neg = pos.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(s.size, dtype=np.float64)
    # average ranks over runs of equal scores
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    ends = np.r_[starts[1:], s.size]
    avg = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(avg, ends - starts)
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def teacher_auc(spec: CriteoSpec, n: int = 200_000) -> float:
    """The teacher's own AUC on the first ``n`` held-out samples: the ceiling for any model."""
    s = generate(spec, 0, n, HELDOUT)
    return auc(s.prob, s.labels)


if __name__ == "__main__":
    import json
    import sys
    import time

    spec = CriteoSpec(max_rows=int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
    t0 = time.perf_counter()
    s = generate(spec, 0, 200_000, HELDOUT)
    dt = time.perf_counter() - t0
    print(json.dumps({"max_rows": spec.max_rows, "samples_per_s": round(len(s) / dt),
                      "ctr": round(float(s.labels.mean()), 4), "teacher_auc": round(auc(s.prob, s.labels), 4)}))
