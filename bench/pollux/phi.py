"""φ, the gradient noise scale, exactly on softmax regression (MLR): the per-example gradient of
sample i is the outer product r_i x̃_iᵀ (r_i = softmax(W x̃_i) − e_{y_i}, x̃_i = [x_i, 1]), so over a
data set of N samples G = (1/N) Σ_i r_i x̃_iᵀ, tr Σ = (1/N) Σ_i ‖r_i‖²‖x̃_i‖² − ‖G‖² (the covariance of
one example drawn uniformly) and φ = tr Σ / ‖G‖², all in numpy at once. The estimates come from the
gradients a run actually takes (``apps/mlr/kernels.loss_grad``, the app's kernel), through
``bosen.gradstats``: the check of ``bench/pollux`` (docs/design.md, "Pollux (goodput)").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from bosen.apps.mlr import data as D
from bosen.apps.mlr.kernels import loss_grad
from bosen.gradstats import Ema, NoiseScale, differenced, moments


@dataclass(frozen=True)
class Exact:
    """The full-data gradient's squared norm, tr Σ per example and their ratio φ at one W."""

    sqnorm: float
    trace: float

    @property
    def phi(self) -> float:
        return self.trace / self.sqnorm if self.sqnorm > 0 else math.inf


class ExactStats:
    """Exact statistics of a data set at any W (K x (F + 1), bias last: the PS layout)."""

    def __init__(self, ds: D.Dataset) -> None:
        x = ds.dense().astype(np.float64)
        self.x = np.concatenate([x, np.ones((ds.n, 1))], axis=1)
        self.xsq = np.einsum("ij,ij->i", self.x, self.x)
        self.onehot = np.eye(ds.classes)[ds.labels]

    def at(self, W: np.ndarray) -> Exact:
        z = self.x @ W.T
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        r = p - self.onehot
        n = self.x.shape[0]
        G = r.T @ self.x / n
        sq = float(np.einsum("ij,ij->", G, G))
        mean_sq = float(np.einsum("ij,ij->i", r, r) @ self.xsq) / n
        return Exact(sq, mean_sq - sq)


@dataclass(frozen=True)
class Case:
    """How the estimate sees a step of M = k·b examples: ``workers`` (k workers of one version),
    ``micro`` (one worker's batch in k micro-batches: the same estimator) or ``differenced`` (one
    worker, one gradient per step: the last two steps' gradients)."""

    name: str
    k: int
    b: int


def _gradients(ds: D.Dataset, W: np.ndarray, k: int, b: int, rng: np.random.Generator) -> np.ndarray:
    """k gradients (means over b samples drawn uniformly with replacement) at W, the app's kernel."""
    grads = np.empty((k,) + W.shape)
    for j in range(k):
        rows = rng.integers(0, ds.n, size=b).astype(np.int64)
        grads[j] = loss_grad(ds.indptr, ds.indices, ds.values, ds.labels, rows, W)[1] / b
    return grads


def trajectory(ds: D.Dataset, k: int, b: int, lr: float, at: list[int], seed: int) -> list[np.ndarray]:
    """W after each of the steps in ``at`` of plain SGD with k·b examples per step."""
    rng = np.random.default_rng(seed)
    W = np.zeros((ds.classes, ds.features + 1))
    out = []
    for t in range(max(at) + 1):
        if t in at:
            out.append(W.copy())
        W -= lr * _gradients(ds, W, k, b, rng).mean(axis=0)
    return out


def at_point(ds: D.Dataset, W: np.ndarray, case: Case, steps: int, smoothing: float, seed: int,
             m0: int | None = None) -> float:
    """The smoothed estimate after ``steps`` steps of k gradients of b at one version W (the version
    held fixed: the estimator alone, no drift of φ). Differenced: consecutive gradients of one worker.
    ``m0`` (default k·b) sets the factor per step, ``smoothing ** (k·b/m0)``."""
    rng = np.random.default_rng(seed)
    ns = NoiseScale(m0=m0 or case.k * case.b, smoothing=smoothing)
    prev: np.ndarray | None = None
    for _ in range(steps):
        grads = _gradients(ds, W, case.k, case.b, rng)
        if case.name == "differenced":
            if prev is not None:
                ns.update(differenced(prev, grads[0]), case.b)
            prev = grads[0]
        else:
            ns.update(moments(grads), case.b)
    return ns.phi


def along(ds: D.Dataset, exact: ExactStats, case: Case, steps: int, lr: float, smoothing: float, every: int,
          seed: int) -> list[tuple[int, float, float, float]]:
    """Train with steps of M = k·b examples and return every ``every`` steps (step, estimated φ, exact φ
    smoothed with the same factors (the quantity the estimate tracks: φ of the recent iterates), exact
    φ at the current W alone)."""
    rng = np.random.default_rng(seed)
    W = np.zeros((ds.classes, ds.features + 1))
    ns = NoiseScale(m0=case.k * case.b, smoothing=smoothing)
    sq, tr = Ema(), Ema()
    factor = smoothing ** 1.0  # M = M0 throughout
    prev: np.ndarray | None = None
    out = []
    for t in range(1, steps + 1):
        grads = _gradients(ds, W, case.k, case.b, rng)
        e = exact.at(W)
        if case.name == "differenced":
            if prev is not None:
                ns.update(differenced(prev, grads[0]), case.b)
                sq.add(e.sqnorm, factor)
                tr.add(e.trace, factor)
            prev = grads[0]
        else:
            ns.update(moments(grads), case.b)
            sq.add(e.sqnorm, factor)
            tr.add(e.trace, factor)
        W -= lr * grads.mean(axis=0)
        if t % every == 0:
            out.append((t, ns.phi, tr.value / sq.value, exact.at(W).phi))
    return out
