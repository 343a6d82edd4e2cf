"""Statistics of k stochastic gradients of one parameter version: the variance of one gradient and the
squared norm of the true gradient, from Σ‖g_j‖² and ‖ḡ‖² alone (docs/design.md, "Backup workers").

DBW's eqs. 10-11 (Xu et al. 2021) and AdaptDL's gradient noise scale (Pollux) are the same unbiased
estimators: with ``local`` = (1/k) Σ_j ‖g_j‖² and ``total`` = ‖ḡ‖²,
𝕍̂ = Σ_j ‖g_j − ḡ‖²/(k − 1) = k(local − total)/(k − 1) and ‖∇F‖²^ = (k·total − local)/(k − 1).
Both are sums over coordinates, so the shares of a table on several servers add up. Scalars in,
scalars out: who holds the gradients (a server's accumulator, a simulator) computes the two sums.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


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
    def sqnorm(self) -> float:
        """‖∇F‖²^: the true gradient's squared norm, at least 0 (eq. 11); nan for k < 2."""
        if self.k < 2:
            return math.nan
        return max((self.k * self.total - self.local) / (self.k - 1), 0.0)

    @property
    def noise_scale(self) -> float:
        """𝕍̂ / ‖∇F‖²^ (Pollux's φ per example times the batch size); inf where the norm is 0."""
        s = self.sqnorm
        return self.variance / s if s > 0 else math.inf


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
