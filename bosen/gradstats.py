"""Statistics of k stochastic gradients of one parameter version: the variance of one gradient and the
squared norm of the true gradient, from Σ‖g_j‖² and ‖ḡ‖² alone (docs/design.md, "Backup workers").

DBW's eqs. 10-11 (Xu et al. 2021) and AdaptDL's gradient noise scale (Pollux) are the same unbiased
estimators: with ``local`` = (1/k) Σ_j ‖g_j‖² and ``total`` = ‖ḡ‖²,
𝕍̂ = Σ_j ‖g_j − ḡ‖²/(k − 1) = k(local − total)/(k − 1) and ‖∇F‖²^ = (k·total − local)/(k − 1).
Both are sums over coordinates, so the shares of a table on several servers add up. Scalars in,
scalars out: who holds the gradients (a server's accumulator, a simulator) computes the two sums
(``moments`` does it for gradients held as one array).

Pollux (Qiao et al., OSDI'21, sect. 3.1) reads the same moments per example
(docs/design.md, "Pollux (goodput)"): k gradients of b examples each (k workers of one version, or
k micro-batches within one worker: the same estimator) give tr Σ = b·𝕍̂ (Σ the covariance of one
example's gradient) and φ = tr Σ / ‖G‖², the gradient noise scale in examples. ``NoiseScale``
smooths the numerator and the denominator apart, as AdaptDL does: bias-corrected exponential moving
averages with factor ``smoothing ** (M/M0)`` per step, and φ is their ratio.

For a pre-conditioned optimizer, Pollux's eq. 5 reads φ = tr(PΣPᵀ)/‖PG‖² (thesis appendix A.1): the
same estimators on the gradients multiplied by P, for Adam the diagonal 1/(√v̂ + ε) of its step
(``adam_preconditioner``; ``moments(grads, pinv)`` divides by it). The agent does not use it for
Adam: under the square-root rule the plain φ in that rule's efficiency predicts the measured progress
(``bosen.goodput.efficiency``; docs/evaluation.md).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Moments:
    """``k`` gradients of one version: ``local`` the mean of their squared norms, ``total`` the
    squared norm of their mean."""

    k: int
    local: float
    total: float

    @property
    def defined(self) -> bool:
        """Whether the variance is measurable (k >= 2; eq. 10 divides by k - 1)."""
        return self.k >= 2

    @property
    def variance(self) -> float:
        """𝕍̂: the summed per-coordinate variance of one gradient (eq. 10); nan for k < 2."""
        if self.k < 2:
            return math.nan
        return max(self.k * (self.local - self.total) / (self.k - 1), 0.0)

    @property
    def sqnorm_raw(self) -> float:
        """Eq. 11 without the clip at 0: unbiased, so it is what a moving average should take; nan
        for k < 2."""
        if self.k < 2:
            return math.nan
        return (self.k * self.total - self.local) / (self.k - 1)

    def trace(self, batch: int) -> float:
        """tr Σ per example, b·𝕍̂, where each of the k gradients averages ``batch`` examples."""
        return self.variance * batch

    def phi(self, batch: int) -> float:
        """One step's gradient noise scale in examples, tr Σ / ‖G‖² (Pollux's eq. 5 with P = I):
        ``batch`` times ``noise_scale``; noisy alone, ``NoiseScale`` smooths it."""
        return self.noise_scale * batch

    @property
    def sqnorm(self) -> float:
        """‖∇F‖²^: the true gradient's squared norm, at least 0 (eq. 11); nan for k < 2."""
        if self.k < 2:
            return math.nan
        return max((self.k * self.total - self.local) / (self.k - 1), 0.0)

    @property
    def noise_scale(self) -> float:
        """𝕍̂ / ‖∇F‖²^: Pollux's φ divided by the examples b in one gradient (``phi``); inf where the norm is 0."""
        s = self.sqnorm
        return self.variance / s if s > 0 else math.inf


def moments(grads: np.ndarray, pinv: np.ndarray | None = None) -> Moments:
    """The moments of k gradients, the rows of a (k, ...) array (k workers' gradients of one version,
    or k micro-batch gradients of one worker), summed in float64. ``pinv``: the inverse of a diagonal
    pre-conditioner P, one value per coordinate (``adam_preconditioner``): the moments of P·g_j, whose
    ``phi`` is Pollux's pre-conditioned noise scale tr(PΣPᵀ)/‖PG‖²."""
    g = np.asarray(grads)
    if g.ndim < 1 or g.shape[0] < 1:
        raise ValueError(f"gradstats.moments: needs a (k, ...) array of k >= 1 gradients, got shape {g.shape}")
    k = g.shape[0]
    g = g.reshape(k, -1).astype(np.float64, copy=False)
    if pinv is not None:
        d = np.asarray(pinv, np.float64).reshape(-1)
        if d.size != g.shape[1] or not np.all(d > 0):
            raise ValueError(f"gradstats.moments: pinv must hold {g.shape[1]} values > 0 (one per coordinate), "
                             f"got {d.size}" + ("" if d.size != g.shape[1] else " with some <= 0"))
        g = g / d
    local = float(np.einsum("ij,ij->", g, g)) / k
    mean = g.mean(axis=0)
    return Moments(k, local, float(mean @ mean))


def adam_preconditioner(exp_avg_sq: np.ndarray, step: int, beta2: float, eps: float) -> np.ndarray:
    """P⁻¹ of Adam's step, per coordinate: √v̂ + ε, v̂ = v/(1 − β2^t) the bias-corrected average of the
    squared gradients after ``step`` = t steps (torch.optim.Adam's ``exp_avg_sq`` and ``step``). Adam
    moves each coordinate by lr·m̂/(√v̂ + ε): SGD on the gradient times P = diag(1/(√v̂ + ε))."""
    if step < 1 or not 0.0 <= beta2 < 1.0 or not eps > 0:
        raise ValueError(f"gradstats.adam_preconditioner: needs step >= 1, beta2 in [0, 1) and eps > 0, got "
                         f"{step}, {beta2}, {eps}")
    v = np.asarray(exp_avg_sq, np.float64)
    return np.sqrt(np.maximum(v, 0.0) / (1.0 - beta2**step)) + eps


def differenced(prev: np.ndarray, cur: np.ndarray) -> Moments:
    """A single worker's one gradient per step: the last two gradients taken as two samples (the
    differenced estimator Pollux falls back to, P:181). They are of different versions, so the
    variance is overestimated by ‖ΔG‖²/2: fine while steps are small."""
    return moments(np.stack([np.asarray(prev), np.asarray(cur)]))


class Ema:
    """An exponential moving average with bias correction (Adam's, AdaptDL's ``_update_avg``): the
    average of the values added so far, each weighted by the factors of the later ones; nan before
    the first."""

    def __init__(self) -> None:
        self.biased = 0.0
        self.weight = 0.0

    def add(self, value: float, factor: float) -> None:
        if not 0.0 <= factor < 1.0:
            raise ValueError(f"gradstats.Ema: factor must be in [0, 1), got {factor}")
        self.biased = factor * self.biased + (1.0 - factor) * value
        self.weight = factor * self.weight + (1.0 - factor)

    @property
    def value(self) -> float:
        return self.biased / self.weight if self.weight > 0 else math.nan


class NoiseScale:
    """Pollux's φ, smoothed: moving averages of ‖G‖² and of tr Σ (per example) apart, φ their ratio
    (a ratio of averages, not an average of ratios: one noisy ‖G‖² near 0 would blow the latter up).
    Each step's factor is ``smoothing ** scale``, scale = M/M0 (the step's examples over the initial
    batch), so a step of 4·M0 counts as four of M0; AdaptDL's default smoothing is 0.999."""

    def __init__(self, m0: int, smoothing: float = 0.999) -> None:
        if m0 < 1:
            raise ValueError(f"gradstats.NoiseScale: m0 (the initial batch) must be >= 1, got {m0}")
        if not 0.0 < smoothing < 1.0:
            raise ValueError(f"gradstats.NoiseScale: smoothing must be in (0, 1), got {smoothing}")
        self.m0 = m0
        self.smoothing = smoothing
        self._sqr = Ema()
        self._var = Ema()
        self.steps = 0

    def update(self, m: Moments, batch: int) -> None:
        """Add one step's moments: ``m.k`` gradients of ``batch`` examples each (M = k·batch).
        Steps whose variance is not measurable (k < 2) are skipped."""
        if batch < 1:
            raise ValueError(f"gradstats.NoiseScale.update: batch must be >= 1, got {batch}")
        if not m.defined:
            return
        self.add(m.sqnorm_raw, m.trace(batch), m.k * batch / self.m0)

    def add(self, sqnorm_raw: float, trace: float, scale: float, steps: int = 1) -> None:
        """Add an estimate made elsewhere: ``sqnorm_raw`` (unclipped ‖G‖²) and ``trace`` (tr Σ per
        example), averaged over ``steps`` steps of ``scale`` = M/M0 each (a job's agent folds an
        interval's mean over its workers and steps in at once: factor ``smoothing ** (steps·scale)``)."""
        if not (scale > 0 and steps >= 1):
            raise ValueError(f"gradstats.NoiseScale.add: needs scale > 0 and steps >= 1, got {scale}, {steps}")
        factor = self.smoothing ** (steps * scale)
        self._sqr.add(sqnorm_raw, factor)
        self._var.add(trace, factor)
        self.steps += steps

    @property
    def sqnorm(self) -> float:
        """Smoothed ‖G‖², at least 0."""
        v = self._sqr.value
        return max(v, 0.0) if not math.isnan(v) else v

    @property
    def trace(self) -> float:
        """Smoothed tr Σ per example."""
        return self._var.value

    @property
    def phi(self) -> float:
        """φ = tr Σ / ‖G‖² in examples; nan before the first step, inf while ‖G‖² averages to 0."""
        sq, tr = self.sqnorm, self.trace
        if math.isnan(sq) or math.isnan(tr):
            return math.nan
        return tr / sq if sq > 0 else math.inf


class Window:
    """The plain average of the last ``size`` values (DBW's eqs. 13-15, D = ``size``); nan values,
    estimates that could not be made, are left out."""

    def __init__(self, size: int) -> None:
        self.values: deque[float] = deque(maxlen=size)

    def add(self, value: float) -> None:
        if not math.isnan(value):
            self.values.append(value)

    def __len__(self) -> int:
        return len(self.values)

    @property
    def full(self) -> bool:
        return len(self.values) == self.values.maxlen

    def mean(self) -> float:
        return sum(self.values) / len(self.values) if self.values else math.nan


def smoothness(prev: Moments, cross: float, step: float) -> float:
    """L̂⁺, DBW's eq. 12 (with its minus sign: solving eq. 9 for L) where the loss decrease of the last
    step is estimated from gradients, since the servers receive no losses: by the trapezoid rule,
    F(w_{t−1}) − F(w_t) ≈ (η/2)(∇F(w_{t−1}) + ∇F(w_t))ᵀḡ_{t−1}, with ‖∇F(w_{t−1})‖²^ for the first
    term and ``cross`` = ḡ_tᵀḡ_{t−1} for the second (ḡ_t's noise is independent of ḡ_{t−1}).
    Then L̂⁺ = (‖∇F(w_{t−1})‖²^ − ḡ_tᵀḡ_{t−1}) / (η(‖∇F(w_{t−1})‖²^ + 𝕍̂_{t−1}/k_{t−1})): the curvature
    along the noisy step actually taken, exact in expectation for a quadratic. ``prev``: the moments
    of step t − 1, ``step`` its η. nan where it cannot be made; it may come out negative (noise)."""
    if not prev.defined or step <= 0:
        return math.nan
    sq = prev.sqnorm
    denom = step * (sq + prev.variance / prev.k)
    if denom <= 0:
        return math.nan
    return (sq - cross) / denom
