"""Backup workers (DBW, Xu, Neglia, Sebastianelli 2021): how many gradients k_t the step of iteration t
waits for (docs/design.md, "Backup workers"). Servers (``server/backup.py``) and the virtual-clock
bench (``bench/dbw``) run the same ``BackupPolicy``.

- ``RoundTrips``: T̂_k, the expected time from w_t to its k-th gradient when every iteration waits
  for k, by the paper's constrained least squares (eq. 17) over samples 𝒯_{h,i} (h = k_{t−1} workers
  idle when w_t came, i = arrival rank): a weighted isotonic regression on the n x n grid, solved by
  Dykstra's alternating projections, each a pool-adjacent-violators pass (numba).
- ``gains``: 𝒢̂_k = (η − L̂η²/2)‖∇F‖²^ − (L̂η²/2)𝕍̂/k (eq. 16).
- ``BackupPolicy``: k_t = static k; argmax 𝒢̂_k/T̂_k (dynamic, eq. 18: k = n when every gain is
  negative); argmax k/T̂_k (blind, B-DBW).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from bosen.config import BackupConfig, follows_workers
from bosen.gradstats import Moments, Window, smoothness

PRIOR_WEIGHT = 1e-6  # weight of an unobserved (h, i) cell's prior value, relative to one sample
SOLVE_ITERS = 300


@njit(nogil=True, cache=True)
def _pava(y: np.ndarray, w: np.ndarray) -> np.ndarray:  # pragma: no cover - numba
    """The weighted least-squares nondecreasing fit of ``y`` (pool adjacent violators)."""
    n = y.shape[0]
    val = np.empty(n)
    wt = np.empty(n)
    size = np.empty(n, np.int64)
    m = 0
    for i in range(n):
        val[m] = y[i]
        wt[m] = w[i]
        size[m] = 1
        m += 1
        while m > 1 and val[m - 2] > val[m - 1]:
            tw = wt[m - 2] + wt[m - 1]
            val[m - 2] = (val[m - 2] * wt[m - 2] + val[m - 1] * wt[m - 1]) / tw
            wt[m - 2] = tw
            size[m - 2] += size[m - 1]
            m -= 1
    out = np.empty(n)
    p = 0
    for b in range(m):
        for _ in range(size[b]):
            out[p] = val[b]
            p += 1
    return out


@njit(nogil=True, cache=True)
def isotonic_grid(y: np.ndarray, w: np.ndarray, iters: int) -> np.ndarray:  # pragma: no cover - numba
    """Weighted least squares x ≈ y (weights ``w`` > 0) on the n x n grid x[h, i] (0-based h = k_{t−1}
    − 1, i = rank − 1) subject to DBW's eq. 17: nondecreasing along i, nonincreasing along h,
    nondecreasing along the diagonal. Dykstra's algorithm over the three chain families."""
    n = y.shape[0]
    x = y.copy()
    p = np.zeros((n, n))
    q = np.zeros((n, n))
    r = np.zeros((n, n))
    for _ in range(iters):
        z = x + p
        a = np.empty((n, n))
        for h in range(n):
            a[h, :] = _pava(z[h, :], w[h, :])
        p = z - a
        z = a + q
        b = np.empty((n, n))
        for i in range(n):
            b[::-1, i] = _pava(z[::-1, i].copy(), w[::-1, i].copy())
        q = z - b
        z = b + r
        c = z.copy()  # the third set moves only the diagonal
        d = np.empty(n)
        dw = np.empty(n)
        for k in range(n):
            d[k] = z[k, k]
            dw[k] = w[k, k]
        d = _pava(d, dw)
        for k in range(n):
            c[k, k] = d[k]
        r = z - c
        change = np.abs(c - x).max()
        x = c
        if change <= 1e-12 * (1.0 + np.abs(x).max()):
            break
    return x


class RoundTrips:
    """Samples 𝒯_{h,i} kept as a weighted sum and count per cell; ``memory`` < 1 fades older samples
    at each iteration (a slowdown shows within a few iterations; the paper keeps all)."""

    def __init__(self, n: int, memory: float) -> None:
        self.n = n
        self.memory = memory
        self.sums = np.zeros((n, n))
        self.counts = np.zeros((n, n))
        self._solved: np.ndarray | None = None

    def add(self, h: int, i: int, dt: float) -> None:
        """The i-th gradient (or notification) of a version arrived ``dt`` after it, h workers idle."""
        if 1 <= h <= self.n and 1 <= i <= self.n:
            self.sums[h - 1, i - 1] += dt
            self.counts[h - 1, i - 1] += 1.0
            self._solved = None

    def age(self) -> None:
        """One iteration passed."""
        if self.memory < 1.0:
            self.sums *= self.memory
            self.counts *= self.memory
            self._solved = None

    @property
    def observed(self) -> bool:
        return bool(self.counts.sum() > 0)

    def load(self, sums: np.ndarray, counts: np.ndarray) -> None:
        """Samples saved by a checkpoint (``sums``, ``counts``: n x n)."""
        if sums.shape != (self.n, self.n) or counts.shape != (self.n, self.n):
            raise ValueError(f"round-trip samples of shape {sums.shape} and {counts.shape}, but the job has "
                             f"{self.n} workers (n x n)")
        self.sums = np.array(sums, dtype=np.float64)
        self.counts = np.array(counts, dtype=np.float64)
        self._solved = None

    def grid(self) -> np.ndarray:
        """x*[h, i], eq. 17's solution; an unobserved cell starts from the mean of its column (the same
        arrival rank under any h), or of all samples, with a vanishing weight."""
        if self._solved is None:
            c = self.counts
            total = c.sum()
            if total <= 0:
                self._solved = np.zeros((self.n, self.n))
                return self._solved
            overall = self.sums.sum() / total
            col_c = c.sum(axis=0)
            col_mean = np.where(col_c > 0, self.sums.sum(axis=0) / np.maximum(col_c, 1e-300), overall)
            seen = c > 0
            y = np.where(seen, self.sums / np.where(seen, c, 1.0), col_mean[None, :])
            w = np.where(seen, c, PRIOR_WEIGHT * total / c.size)
            self._solved = isotonic_grid(y, w, SOLVE_ITERS)
        return self._solved

    def expected(self) -> np.ndarray:
        """T̂_k for k = 1..n: x*_{k,k}, the iteration time if k were used every time."""
        return np.diag(self.grid()).copy()


def gains(lr: float, L: float, sqnorm: float, variance: float, n: int) -> np.ndarray:
    """𝒢̂_k for k = 1..n (eq. 16)."""
    k = np.arange(1, n + 1, dtype=np.float64)
    return (lr - L * lr * lr / 2) * sqnorm - (L * lr * lr / 2) * variance / k


class BackupPolicy:
    """k_t for one table of ``n`` workers, and the learning rate each step uses."""

    def __init__(self, cfg: BackupConfig, n: int) -> None:
        if cfg.k is not None and cfg.k > n:
            raise ValueError(f"k: {cfg.k} gradients per step, but the job has {n} workers (cluster.workers)")
        self.cfg = cfg
        self.n = n
        self.k_static = cfg.k  # static k now: it follows the workers where it was all of them (``resize``)
        self.follows = follows_workers(cfg, n)
        self.rtt = RoundTrips(n, cfg.memory)
        self.variance = Window(cfg.window)
        self.sqnorm = Window(cfg.window)
        self.smooth = Window(cfg.window)
        self._prev: tuple[Moments, float] | None = None  # the last step's moments and step size

    def resize(self, n: int) -> None:
        """The job now has ``n`` workers (``bosen scale``, from an iteration on): a static k that was all
        the workers stays all of them (so the rate stays lr), another is capped at n; the round-trip
        samples (a grid per (k_{t−1}, arrival rank) of n workers) start afresh, the windows stay."""
        if n < 1:
            raise ValueError(f"backup: a job of {n} workers")
        if n == self.n:
            return
        self.n = n
        if self.cfg.k is not None:
            self.k_static = n if self.follows else min(self.cfg.k, n)
        self.rtt = RoundTrips(n, self.cfg.memory)

    def lr(self, k: int) -> float:
        """The step size for a mean of k gradients: proportional (lr·k/n) for static k, the k = n
        value for dynamic and blind (they pick k_t, not the rate; paper, sect. 4)."""
        if self.cfg.mode == "static":
            return self.cfg.lr * k / self.n
        return self.cfg.lr

    def observe(self, m: Moments, cross: float) -> None:
        """A step was taken from ``m`` (its moments; ``cross`` = ḡ_tᵀḡ_{t−1}, nan if unknown)."""
        if self._prev is not None and not math.isnan(cross):
            pm, pstep = self._prev
            self.smooth.add(smoothness(pm, cross, pstep))
        if m.defined:
            self.variance.add(m.variance)
            self.sqnorm.add(m.sqnorm)
        self._prev = (m, self.lr(m.k))
        self.rtt.age()

    def choose(self, alive: int) -> int:
        """k for the next iteration, at most the ``alive`` workers (at least 1)."""
        alive = max(1, min(alive, self.n))
        mode = self.cfg.mode
        if mode == "static":
            assert self.k_static is not None
            return min(self.k_static, alive)
        if not self.rtt.observed:
            return alive
        T = self.rtt.expected()[:alive]
        T = np.maximum(T, 1e-9)
        if mode == "blind":
            return int(np.argmax(np.arange(1, alive + 1) / T)) + 1
        if not (len(self.variance) and len(self.smooth)):
            return alive  # warm-up: every gradient until each estimate has a sample (the paper averages
            # over the first t - 1 iterations while t <= D)
        L = max(self.smooth.mean(), 0.0)  # noise may make it negative: no curvature seen
        G = gains(self.lr(alive), L, self.sqnorm.mean(), self.variance.mean(), alive)
        if not (G >= 0).any():
            return alive  # every gain negative: the largest batch (eq. 18)
        score = np.where(G >= 0, G / T, -np.inf)
        score[0] = -np.inf  # k >= 2: every step measures the variance (eq. 10 needs two gradients)
        if alive == 1:
            return 1
        return int(np.argmax(score)) + 1

    def snapshot(self) -> dict[str, np.ndarray]:
        """Everything k_t depends on, as arrays for a checkpoint (``restore`` takes them back): the
        round-trip samples, the windows of the three estimates, the last step's moments and rate."""
        prev = [math.nan] * 4 if self._prev is None else [self._prev[0].k, self._prev[0].local,
                                                         self._prev[0].total, self._prev[1]]
        return {"rtt_sums": self.rtt.sums.copy(), "rtt_counts": self.rtt.counts.copy(),
                "variance": np.array(self.variance.values, dtype=np.float64),
                "sqnorm": np.array(self.sqnorm.values, dtype=np.float64),
                "smooth": np.array(self.smooth.values, dtype=np.float64),
                "prev": np.array(prev, dtype=np.float64)}

    def restore(self, arrays: dict[str, np.ndarray]) -> None:
        """Continue from a ``snapshot``. ValueError says what does not fit: round-trip samples of
        another worker count (their grid is per (k_{t−1}, arrival rank) of n workers) are refused
        after everything else was taken."""
        for name in ("variance", "sqnorm", "smooth"):
            w: Window = getattr(self, name)
            w.values.clear()
            for v in np.asarray(arrays[name], dtype=np.float64).ravel().tolist():
                w.add(v)
        prev = np.asarray(arrays["prev"], dtype=np.float64)
        if prev.shape != (4,):
            raise ValueError(f"the last step's moments: 4 numbers, got shape {prev.shape}")
        self._prev = None if math.isnan(prev[0]) else (Moments(int(prev[0]), float(prev[1]), float(prev[2])),
                                                      float(prev[3]))
        self.rtt.load(arrays["rtt_sums"], arrays["rtt_counts"])  # last: the rest stays if this does not fit

    def state(self) -> dict[str, float]:
        """The estimates, for STATUS."""
        return {"variance": self.variance.mean(), "sqnorm": self.sqnorm.mean(), "L": self.smooth.mean()}
