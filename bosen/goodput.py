"""Pollux's goodput model (Qiao et al., OSDI'21, sect. 3; docs/design.md, "Pollux (goodput)"): how fast
a job progresses per second at per-worker batch m, s accumulation steps and K workers, so that an agent
can pick (m, s) and a scheduler can compare worker counts. Pure numbers, no I/O.

GOODPUT = THROUGHPUT × EFFICIENCY (eq. 4), with M = K·m·(s + 1) examples per step:

- EFFICIENCY(M) = (φ + M0)/(φ + M) (eq. 6): the progress per example at M relative to M0, from the
  gradient noise scale φ (``bosen.gradstats.NoiseScale``). Eq. 6 holds where the learning rate at each
  M is (near) the best one, as AdaScale's is; under the square-root rule (Adam) the rule's own rate
  gives its square root, √((φ + M0)/(φ + M)) (``efficiency(..., rule="sqrt")``; docs/design.md).
- THROUGHPUT = M / T_iter (eq. 7), T_iter(m, s, K) = s·T_grad(m) + (T_grad(m)^γ + T_sync(K)^γ)^(1/γ)
  (eqs. 10-11), T_grad(m) = α_g + β_g·m^p (eq. 8 is p = 1: linear; a kernel that batches better as m grows,
  as the CNN's convolutions do on a CPU, costs less per example at large m, 0 < p < 1; ``fit_grad``).
  On a parameter server T_sync is a worker's push and
  pull, T_sync(K) = α_s + β_s·(K − 1): unlike an all-reduce it is there for one worker too (the model
  lives on the servers), and β_s is the servers' load growing with the workers (eq. 9's retrogression,
  one "node" on one machine). α_s can be seeded from the bandwidth budget (``sync_seed``). γ ≥ 1 is
  how much communication overlaps computation (the client's background thread): 1 adds, ∞ is max.
- The learning rate follows the batch: AdaScale's gain for SGD, (M/M0)·EFFICIENCY, the square root of
  M/M0 for Adam (P:258), linear as a baseline.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["efficiency", "lr_gain", "Throughput", "sync_seed", "fit_throughput", "fit_grad", "Choice", "best_config",
           "POWER_MIN", "CURVE_SIZES"]

GAMMA_MAX = 10.0  # the paper's bound on γ (P:266)
# T_grad's exponent p is fitted in [POWER_MIN, 1]: at 1/4 a 4x batch costs 1.4x the time, beyond any batching
# economy measured here (the CNN's computation in a job fits p ≈ 0.7 over m = 32-512, about 0.9 in one process);
# it bounds what noise in three points can claim, since the agent extrapolates up to 4x past its largest batch
POWER_MIN = 0.25
CURVE_SIZES = 3  # p is fitted from this many distinct batch sizes on (two sizes fix a line, three a curve)
_FLOOR = 1e-8  # the paper's lower bound on α and β


def efficiency(phi: float, m0: int, batch: float | np.ndarray, rule: str = "adascale") -> float | np.ndarray:
    """EFFICIENCY(M) = (φ + M0)/(φ + M), in (0, 1] for M ≥ M0; φ = inf (no measurable signal yet
    against noise: every example counts) gives 1. ``rule``: the learning-rate rule the job runs. Eq. 6
    assumes the best rate at each batch (AdaScale's, ``adascale``; ``linear`` is taken alike). Under
    ``sqrt`` (Adam), a step moves each coordinate by lr·m̂_i/√v̂_i with v̂_i ≈ G_i² + σ_i²/M, so to first
    order it gains lr·G²/√(G² + σ²/M); with lr ∝ √M that is √((φ + M0)/(φ + M)) per example relative
    to M0, φ = σ²/G²: the square root of eq. 6 (a large batch loses less, since its rate grows too)."""
    if m0 < 1:
        raise ValueError(f"goodput.efficiency: m0 must be >= 1, got {m0}")
    if not phi >= 0:
        raise ValueError(f"goodput.efficiency: phi must be >= 0 (examples), got {phi}")
    if rule not in ("adascale", "sqrt", "linear"):
        raise ValueError(f"goodput.efficiency: rule must be adascale, sqrt or linear, got {rule!r}")
    if math.isinf(phi):
        return np.ones_like(batch, dtype=np.float64) if isinstance(batch, np.ndarray) else 1.0
    eff = (phi + m0) / (phi + batch)
    return np.sqrt(eff) if rule == "sqrt" else eff


def lr_gain(rule: str, phi: float, m0: int, batch: float) -> float:
    """The learning-rate multiplier at batch M for a job tuned at M0: ``adascale`` (SGD):
    r = (var + sqr)/(var/S + sqr) with S = M/M0, which is S·EFFICIENCY(M) written with φ = M0·var/sqr;
    ``sqrt`` (Adam): √S; ``linear``: S."""
    if batch < m0:
        raise ValueError(f"goodput.lr_gain: batch {batch} below m0 {m0}: Pollux only grows the batch")
    s = batch / m0
    if rule == "adascale":
        return s * float(efficiency(phi, m0, batch))
    if rule == "sqrt":
        return math.sqrt(s)
    if rule == "linear":
        return s
    raise ValueError(f"goodput.lr_gain: rule must be adascale, sqrt or linear, got {rule!r}")


@dataclass(frozen=True)
class Throughput:
    """θ_sys of eq. 12 for a parameter server: seconds per step from (m, s, K); ``power``: T_grad's p."""

    alpha_grad: float
    beta_grad: float
    alpha_sync: float
    beta_sync: float = 0.0
    gamma: float = 1.0
    power: float = 1.0

    def __post_init__(self) -> None:
        for name in ("alpha_grad", "beta_grad", "alpha_sync", "beta_sync"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"goodput.Throughput: {name} must be >= 0, got {getattr(self, name)}")
        if not 1.0 <= self.gamma <= GAMMA_MAX:
            raise ValueError(f"goodput.Throughput: gamma must be in [1, {GAMMA_MAX}], got {self.gamma}")
        if not POWER_MIN <= self.power <= 1.0:
            raise ValueError(f"goodput.Throughput: power must be in [{POWER_MIN}, 1], got {self.power}")

    def as_array(self) -> np.ndarray:
        return np.array([self.alpha_grad, self.beta_grad, self.alpha_sync, self.beta_sync, self.gamma, self.power])

    def t_iter(self, m: np.ndarray | float, s: np.ndarray | float, workers: np.ndarray | float) -> np.ndarray:
        """Seconds per step (eq. 11 with the PS's T_sync); broadcasts over arrays."""
        return _t_iter(self.as_array(), np.asarray(m, np.float64), np.asarray(s, np.float64),
                       np.asarray(workers, np.float64))

    def throughput(self, m: np.ndarray | float, s: np.ndarray | float,
                   workers: np.ndarray | float) -> np.ndarray:
        """Examples per second, M / T_iter (eq. 7)."""
        m_, s_, k_ = (np.asarray(x, np.float64) for x in (m, s, workers))
        return k_ * m_ * (s_ + 1) / self.t_iter(m_, s_, k_)


def _t_iter(p: np.ndarray, m: np.ndarray, s: np.ndarray, k: np.ndarray) -> np.ndarray:
    ag, bg, as_, bs, g, pw = p
    grad = ag + bg * m**pw
    sync = as_ + bs * np.maximum(k - 1.0, 0.0)
    # (a^γ + b^γ)^(1/γ) = hi·(1 + (lo/hi)^γ)^(1/γ): no overflow for large γ
    hi = np.maximum(grad, sync)
    lo = np.minimum(grad, sync)
    ratio = np.divide(lo, hi, out=np.zeros_like(hi), where=hi > 0)
    return s * grad + hi * (1.0 + ratio**g) ** (1.0 / g)


def sync_seed(bytes_per_step: float, bandwidth_mbps: float) -> float:
    """α_s from the bandwidth budget: a step's pushed and pulled bytes at ``bandwidth_mbps``
    (``client_bandwidth_mbps`` in a job's config), the time the budget alone imposes."""
    if bytes_per_step < 0 or not bandwidth_mbps > 0:
        raise ValueError(f"goodput.sync_seed: needs bytes >= 0 and a bandwidth > 0, got {bytes_per_step}, "
                         f"{bandwidth_mbps}")
    return bytes_per_step * 8.0 / (bandwidth_mbps * 1e6)


# ----------------------------------------------------------------------------------------------
# the online fit: least squares on log times (the paper's RMSLE, P:266), numpy only


def _to_free(p: np.ndarray) -> np.ndarray:
    """Bounded parameters to unbounded ones: log for α, β ≥ 1e-8; a logit for γ in [1, 10] and for p in
    [POWER_MIN, 1]."""
    return np.concatenate([np.log(np.maximum(p[:4], _FLOOR)),
                           [_logit(p[4], 1.0, GAMMA_MAX), _logit(p[5], POWER_MIN, 1.0)]])


def _from_free(x: np.ndarray) -> np.ndarray:
    return np.concatenate([np.exp(np.clip(x[:4], math.log(_FLOOR), math.log(1e6))),
                           [_sigmoid(x[4], 1.0, GAMMA_MAX), _sigmoid(x[5], POWER_MIN, 1.0)]])


def _logit(v: float, lo: float, hi: float) -> float:
    u = (min(max(float(v), lo + 1e-9), hi - 1e-9) - lo) / (hi - lo)
    return math.log(u / (1.0 - u))


def _sigmoid(x: float, lo: float, hi: float) -> float:
    return lo + (hi - lo) / (1.0 + math.exp(-min(max(float(x), -40.0), 40.0)))


def fit_throughput(m: Sequence[float], s: Sequence[float], workers: Sequence[float], seconds: Sequence[float],
                   prior: Throughput | None = None, iterations: int = 100, curved: bool = False) -> Throughput:
    """θ_sys minimising the RMSLE of T_iter against measured steps (Levenberg-Marquardt on α, β > 0
    through their logs, γ in [1, 10] through a logit: the paper's bounds). Like Pollux's priors
    (P:268-272), what the data cannot show is held at ``prior`` (default: the data's mean step split
    evenly between computation and sync, no retrogression, γ = 1): α_s and β_s while all steps had
    one worker count (on a PS, unlike eq. 9's all-reduce, two counts show β_s: sync is there at K = 1),
    γ until both the batch and the worker count varied, the split of T_grad while one batch size was
    seen (β_g is then fitted, α_g kept). ``curved``: T_grad's p fitted too, once ``CURVE_SIZES`` batch
    sizes were seen (two sizes fix a line, not a curve). Off by default: on whole step times, whose load
    swings dwarf the curvature, a free p fits the noise (on MLR it went to its bound with β_g at its
    floor, a step flat in m, and a scheduler then saw no gain in a second worker; docs/evaluation.md);
    the curve is fitted where computation is timed apart (``fit_grad``)."""
    ms, ss, ks, ts = (np.asarray(x, np.float64) for x in (m, s, workers, seconds))
    if not (ms.shape == ss.shape == ks.shape == ts.shape and ms.ndim == 1 and ms.size >= 1):
        raise ValueError("goodput.fit_throughput: m, s, workers and seconds must be equal-length sequences")
    if np.any(ms < 1) or np.any(ss < 0) or np.any(ks < 1) or not np.all(ts > 0):
        raise ValueError("goodput.fit_throughput: needs m >= 1, s >= 0, workers >= 1 and seconds > 0")
    if prior is None:
        half = float(np.exp(np.mean(np.log(ts / (ss + 1))))) / 2
        prior = Throughput(half / 2, half / 2 / float(np.mean(ms)), half)
    free = np.ones(6, bool)
    n_m, n_k = len(np.unique(ms)), len(np.unique(ks))
    if n_m < CURVE_SIZES or not curved:
        free[5] = False
    if n_k < 2:  # one worker count: no slope in K, and α_s is not told apart from α_g
        free[2] = free[3] = False
    if n_k < 2 or n_m < 2:  # the overlap shows only where both vary
        free[4] = False
    if n_m < 2:
        free[0] = False
    logt = np.log(ts)
    m_mid = float(np.exp(np.mean(np.log(ms))))

    def residual(xf: np.ndarray) -> np.ndarray:
        return np.log(_t_iter(_from_free(xf), ms, ss, ks)) - logt

    best = _to_free(prior.as_array())
    best_r = residual(best)
    # γ makes the fit non-convex (and a logit at γ = 1, or at p = 1, has no slope): start from a few γ and
    # p, keep the best
    for gamma in (1.5, 3.0, 6.0) if free[4] else (prior.gamma,):
        for power in (0.9, 0.5) if free[5] else (prior.power,):
            start = prior.as_array()
            start[1] *= m_mid ** (prior.power - power)  # the same T_grad at the data's typical m
            x0 = _to_free(np.concatenate([start[:4], [gamma, power]]))
            x, r = _lm(residual, x0, np.flatnonzero(free), iterations)
            if r @ r < best_r @ best_r:
                best, best_r = x, r
    p = np.where(free, _from_free(best), prior.as_array())  # pinned: exactly the prior
    return Throughput(*(float(v) for v in p))


def fit_grad(m: Sequence[float] | np.ndarray, seconds: Sequence[float] | np.ndarray) -> tuple[float, float, float]:
    """T_grad(m) = α + β·m^p, (α, β, p), from measured computation ``seconds`` of micro-batches of ``m``
    examples: least squares on the relative error (the times span 10x and more; an error of 10% matters
    alike at either end), α, β ≥ 0. p ∈ [POWER_MIN, 1] is fitted once ``CURVE_SIZES`` distinct sizes were
    measured (each p's best α, β are a weighted linear fit; p on a grid, then refined by golden section);
    with two sizes the form is the line through them (p = 1). Fewer than two sizes: a ValueError, nothing
    to fit a slope to."""
    ms, ts = (np.asarray(x, np.float64) for x in (m, seconds))
    if not (ms.shape == ts.shape and ms.ndim == 1):
        raise ValueError("goodput.fit_grad: m and seconds must be equal-length sequences")
    if np.any(ms < 1) or not np.all(ts > 0):
        raise ValueError("goodput.fit_grad: needs m >= 1 and seconds > 0")
    n_m = len(np.unique(ms))
    if n_m < 2:
        raise ValueError(f"goodput.fit_grad: needs two distinct batch sizes, got {n_m}")
    if n_m < CURVE_SIZES:
        return (*_line(ms**1.0, ts), 1.0)
    lm = np.log(ms)

    def loss(p: float) -> float:
        a, b = _line(np.exp(p * lm), ts)
        return float(np.sum(((a + b * np.exp(p * lm)) / ts - 1.0) ** 2))

    grid = np.linspace(POWER_MIN, 1.0, 76)
    i = int(np.argmin([loss(float(p)) for p in grid]))
    lo, hi = float(grid[max(i - 1, 0)]), float(grid[min(i + 1, grid.size - 1)])
    g = (math.sqrt(5.0) - 1.0) / 2.0
    c, d = hi - g * (hi - lo), lo + g * (hi - lo)
    fc, fd = loss(c), loss(d)
    while hi - lo > 1e-9:
        if fc <= fd:
            hi, d, fd = d, c, fc
            c = hi - g * (hi - lo)
            fc = loss(c)
        else:
            lo, c, fc = c, d, fd
            d = lo + g * (hi - lo)
            fd = loss(d)
    p = min(((lo + hi) / 2, float(grid[i])), key=loss)
    return (*_line(np.exp(p * lm), ts), p)


def _line(x: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """α, β ≥ 0 minimising Σ((α + β·x)/t − 1)²: the weighted linear fit, or on a bound where it leaves one."""
    w = 1.0 / t
    a_mat = np.stack([w, w * x], axis=1)
    a, b = np.linalg.lstsq(a_mat, np.ones_like(t), rcond=None)[0]
    if a >= 0 and b >= 0:
        return float(a), float(b)
    b0 = max(float((w * x) @ np.ones_like(t) / ((w * x) @ (w * x))), 0.0)  # through the origin
    a0 = float(w.sum() / (w @ w))  # flat
    through = float(np.sum((b0 * x * w - 1) ** 2))
    flat = float(np.sum((a0 * w - 1) ** 2))
    return (0.0, b0) if through <= flat else (a0, 0.0)


def _lm(residual: Callable[[np.ndarray], np.ndarray], x: np.ndarray, idx: np.ndarray,
        iterations: int) -> tuple[np.ndarray, np.ndarray]:
    """Levenberg-Marquardt on the coordinates ``idx`` of x, the Jacobian by central differences (six
    parameters: cheap); returns the last x and its residuals."""
    r = residual(x)
    lam = 1e-2
    for _ in range(iterations):
        jac = np.empty((r.size, idx.size))
        for c, i in enumerate(idx):
            h = 1e-6 * max(1.0, abs(x[i]))
            xp, xm = x.copy(), x.copy()
            xp[i] += h
            xm[i] -= h
            jac[:, c] = (residual(xp) - residual(xm)) / (2 * h)
        g = jac.T @ r
        a = jac.T @ jac
        improved = False
        step = np.zeros(idx.size)
        while lam < 1e10:
            step = np.linalg.solve(a + lam * np.diag(np.diag(a) + 1e-12), -g)
            xn = x.copy()
            xn[idx] += step
            rn = residual(xn)
            if rn @ rn < r @ r:
                x, r, lam, improved = xn, rn, max(lam / 3, 1e-9), True
                break
            lam *= 4
        if not improved or np.max(np.abs(step)) < 1e-9:
            break
    return x, r


# ----------------------------------------------------------------------------------------------
# the agent's choice (eq. 13)


@dataclass(frozen=True)
class Choice:
    """The (m, s) of highest goodput for K workers: M = K·m·(s + 1)."""

    m: int
    s: int
    batch: int
    goodput: float
    throughput: float
    efficiency: float


def best_config(model: Throughput, phi: float, m0: int, workers: int, max_batch: int, max_local: int,
                candidates: int = 50, rule: str = "adascale") -> Choice:
    """argmax over (m, s) of THROUGHPUT × EFFICIENCY for ``workers`` workers (eq. 13), as AdaptDL
    searches it: ``candidates`` total batches M geometric in [M0, ``max_batch``], and for each the
    fewest accumulation steps s whose per-worker micro-batch m = ⌈M/(K(s + 1))⌉ fits ``max_local``
    (the memory bound). Only M ≥ M0 counts (the efficiency is relative to M0); ``rule``: the learning-rate
    rule, which sets the efficiency's form (``efficiency``)."""
    if workers < 1 or m0 < 1 or max_local < 1 or candidates < 1:
        raise ValueError("goodput.best_config: workers, m0, max_local and candidates must be >= 1")
    if max_batch < m0:
        raise ValueError(f"goodput.best_config: max_batch {max_batch} is below m0 {m0}")
    big = np.unique(np.round(np.geomspace(m0, max_batch, candidates)).astype(np.int64))
    s = np.ceil(big / (workers * max_local)).astype(np.int64) - 1
    s = np.maximum(s, 0)
    m = np.ceil(big / (workers * (s + 1))).astype(np.int64)
    batch = workers * m * (s + 1)  # rounding up: at least the candidate, >= M0
    tput = model.throughput(m, s, workers)
    eff = np.asarray(efficiency(phi, m0, batch.astype(np.float64), rule), np.float64)
    good = tput * eff
    i = int(np.argmax(good))
    return Choice(int(m[i]), int(s[i]), int(batch[i]), float(good[i]), float(tput[i]), float(eff[i]))
