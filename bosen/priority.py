"""Which buffered rows a budgeted send takes first (docs/design.md, "Managed communication"; thesis §3.2.2).

Every policy works on a vector of candidate row ids (rows with something to send) plus, for the
magnitude policies, an importance score per row accumulated since the row was last sent. Choosing
costs one vectorized pass over the candidates: O(n) for ``argpartition`` (absolute, relative) and
``random``, O(log n + k) for ``round_robin`` on sorted candidates. No Python loop over rows.
"""

from __future__ import annotations

import numpy as np
from numba import njit

POLICIES = ("random", "round_robin", "absolute", "relative")


class Policy:
    """Picks at most ``k`` of ``candidates`` (sorted row ids); subclasses define the order.

    ``importance`` is None where the owner keeps no scores: only policies with ``uses_importance``
    read it, and their owners keep it."""

    uses_importance = False

    def choose(self, candidates: np.ndarray, importance: np.ndarray | None, k: int) -> np.ndarray:
        raise NotImplementedError


class RandomPolicy(Policy):
    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def choose(self, candidates: np.ndarray, importance: np.ndarray | None, k: int) -> np.ndarray:
        if candidates.shape[0] <= k:
            return candidates
        return candidates[self.rng.choice(candidates.shape[0], k, replace=False)]


class RoundRobinPolicy(Policy):
    """Walks the rows in a fixed order, resuming after the last row it sent."""

    def __init__(self) -> None:
        self.cursor = 0

    def choose(self, candidates: np.ndarray, importance: np.ndarray | None, k: int) -> np.ndarray:
        n = candidates.shape[0]
        if n <= k:
            picked = candidates
        else:
            start = int(np.searchsorted(candidates, self.cursor))
            idx = (start + np.arange(k)) % n
            picked = candidates[idx]
        if picked.shape[0]:
            self.cursor = int(picked[-1]) + 1
        return picked


class MagnitudePolicy(Policy):
    """Largest accumulated importance first: Σ|δ| (absolute) or Σ|δ/x| (relative)."""

    uses_importance = True

    def __init__(self, relative: bool) -> None:
        self.relative = relative

    def choose(self, candidates: np.ndarray, importance: np.ndarray | None, k: int) -> np.ndarray:
        if candidates.shape[0] <= k:
            return candidates
        assert importance is not None  # uses_importance: the owner keeps the scores
        score = importance[candidates]
        top = np.argpartition(score, candidates.shape[0] - k)[-k:]
        return candidates[top[np.argsort(-score[top], kind="stable")]]


def make(name: str, seed: int = 0) -> Policy:
    if name == "random":
        return RandomPolicy(seed)
    if name == "round_robin":
        return RoundRobinPolicy()
    if name in ("absolute", "relative"):
        return MagnitudePolicy(relative=name == "relative")
    raise ValueError(f"unknown priority policy {name!r} (one of {', '.join(POLICIES)})")


@njit(nogil=True, cache=True)
def accumulate_dense(importance, rows, deltas, base, known, relative):  # pragma: no cover - compiled
    """importance[r] += Σ_j |δ_rj / x_rj| (or |δ_rj| where x = 0 or unknown, or when not relative).

    ``base`` holds x, the value before the update (the cache on a client, the table on a server);
    rows with ``known[r] < 0`` (never received) fall back to |δ|.
    """
    for i in range(rows.shape[0]):
        r = rows[i]
        s = 0.0
        rel = relative and known[r] >= 0
        for j in range(deltas.shape[1]):
            d = abs(float(deltas[i, j]))
            if rel:
                x = abs(float(base[r, j]))
                if x > 0.0:
                    d = d / x
            s += d
        importance[r] += s


@njit(nogil=True, cache=True)
def accumulate_coo(importance, rows, cols, deltas, base, known, relative):  # pragma: no cover - compiled
    for k in range(rows.shape[0]):
        r = rows[k]
        d = abs(float(deltas[k]))
        if relative and known[r] >= 0:
            x = abs(float(base[r, cols[k]]))
            if x > 0.0:
                d = d / x
        importance[r] += d


@njit(nogil=True, cache=True)
def accumulate_csr(importance, rows, indptr, cols, deltas, base, relative):  # pragma: no cover - compiled
    """importance[rows[i]] += Σ |δ / x| over row i's entries ``indptr[i]:indptr[i+1]`` (x = base,
    the values before the update; |δ| where x = 0 or when not relative)."""
    for i in range(rows.shape[0]):
        r = rows[i]
        s = 0.0
        for k in range(indptr[i], indptr[i + 1]):
            d = abs(float(deltas[k]))
            if relative:
                x = abs(float(base[r, cols[k]]))
                if x > 0.0:
                    d = d / x
            s += d
        importance[r] += s
