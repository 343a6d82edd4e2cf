"""Statistical efficiency under Adam, measured against Pollux's model (issue 33; docs/evaluation.md,
"The CNN with Adam"): the CNN example (``apps/pytorch/examples/cnn.py``'s ``Net``) trained in one
process with Adam at fixed batches M = S·M0 (learning rate η0·√S, the square-root rule), from one
seeded initial model, scored on held-out images every ``every`` examples. What it gives per batch:

- **measured** efficiency at a held-out loss L: the examples M0 needed to reach L over the examples
  M needed (the paper's definition, progress per example relative to M0; P:167);
- **predicted** efficiency, EFFICIENCY(M) = (φ + M0)/(φ + M) (eq. 6), with φ measured as the job's
  agent measures it during the M0 run up to L (k micro-batch gradients a step, ``NoiseScale``'s
  smoothing), harmonically averaged over those steps (the M run needs 1/EFFICIENCY examples for
  each example's worth of M0 progress). φ three ways: pre-conditioned by Adam's √v̂ + ε after the
  step (``pinv``: what the agent uses), before it (AdaptDL's hook sees the previous step's v̂), and
  plain (P = I: the SGD noise scale).

Statistical efficiency counts examples, not seconds: the machine's load does not enter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from bosen.goodput import efficiency
from bosen.gradstats import NoiseScale, adam_preconditioner, moments

ADAM_WARMUP = 5  # as the CNN's agent: the first steps' v̂ is noise
# the predictions: eq. 6 with φ three ways; appendix A.1's Adam form (the best learning rate at each batch);
# the square-root rule's own efficiency (``sqrt_rule_efficiency``), per coordinate (``rule``) and from one φ
# (``sqrt-plain``, ``sqrt-after``: √ of eq. 6)
# ``half``: φ = tr(PΣ)/GᵀPG (the moments of g·√P), McCandlish's B_noise where Adam's P is the Hessian's inverse
PHIS = ("after", "before", "plain", "half")
KINDS = (*PHIS, "adam", "rule", "sqrt-plain", "sqrt-after", "sqrt-half")


@dataclass
class Curve:
    """One run at batch ``batch``: held-out loss after each ``examples`` count, and per step the
    smoothed φ (three ways) after it."""

    batch: int
    examples: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    phi: dict[str, list[tuple[int, float]]] = field(default_factory=lambda: {k: [] for k in PHIS})
    # per step, Adam's own efficiency at each of ``targets`` batches (``adam_efficiency``) from the smoothed
    # per-coordinate statistics
    adam: list[tuple[int, dict[int, float]]] = field(default_factory=list)
    rule: list[tuple[int, dict[int, float]]] = field(default_factory=list)  # ``sqrt_rule_efficiency``, likewise

    def reach(self, target: float) -> float:
        """Examples to the first held-out loss <= ``target``, interpolated in log examples between the
        two evaluations around the crossing; inf if never."""
        for i, (n, x) in enumerate(zip(self.examples, self.loss, strict=True)):
            if x <= target:
                if i == 0:
                    return float(n)
                n0, x0 = self.examples[i - 1], self.loss[i - 1]
                f = (x0 - target) / (x0 - x) if x0 > x else 1.0
                return float(math.exp(math.log(max(n0, 1)) + f * (math.log(n) - math.log(max(n0, 1)))))
        return math.inf


def _flat_grads(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    loss = F.cross_entropy(model(x), y)
    gs = torch.autograd.grad(loss, list(model.parameters()))
    return torch.cat([g.reshape(-1) for g in gs]).double().numpy()


def _pinv(opt: torch.optim.Adam, params: list[torch.nn.Parameter]) -> np.ndarray | None:
    group = opt.param_groups[0]
    parts = []
    for p in params:
        st = opt.state.get(p)
        if not st or int(st["step"]) < ADAM_WARMUP:
            return None
        parts.append(adam_preconditioner(st["exp_avg_sq"].reshape(-1).numpy(), int(st["step"]),
                                         group["betas"][1], group["eps"]))
    return np.concatenate(parts)


def train(batch: int, m0: int, lr0: float, examples: int, every: int, seed: int, x: torch.Tensor, y: torch.Tensor,
          xt: torch.Tensor, yt: torch.Tensor, pieces: int = 4, smoothing: float = 0.999,
          targets: tuple[int, ...] = (256, 1024)) -> Curve:
    """Adam at ``batch`` (lr0·√(batch/m0)) for ``examples`` examples; φ from ``pieces`` micro-batches a step,
    and Adam's own efficiency (``adam_efficiency``) at each of ``targets``."""
    from bosen.apps.pytorch.examples.cnn import Net

    torch.manual_seed(seed)
    model = Net()
    params = list(model.parameters())
    opt = torch.optim.Adam(params, lr=lr0 * math.sqrt(batch / m0))
    gen = torch.Generator().manual_seed(seed * 7919 + 1)
    noise = {k: NoiseScale(m0, smoothing) for k in PHIS}
    out = Curve(batch)
    n = sum(p.numel() for p in params)
    sqr_b, var_b, weight = np.zeros(n), np.zeros(n), 0.0  # per coordinate: EMAs of G_i² and σ_i² (per example)
    seen, next_eval = 0, 0
    while True:
        if seen >= next_eval:
            with torch.no_grad():
                out.examples.append(seen)
                out.loss.append(float(F.cross_entropy(model(xt), yt)))
            next_eval += every
        if seen >= examples:
            return out
        idx = torch.randint(0, x.shape[0], (batch,), generator=gen)
        cuts = np.linspace(0, batch, pieces + 1).round().astype(np.int64)
        grads = np.stack([_flat_grads(model, x[idx[a:b]], y[idx[a:b]]) for a, b in zip(cuts, cuts[1:], strict=False)])
        before = _pinv(opt, params)
        mean = torch.from_numpy(grads.mean(axis=0))
        off = 0
        for p in params:
            p.grad = mean[off:off + p.numel()].view(p.shape).to(p.dtype).clone()
            off += p.numel()
        opt.step()
        seen += batch
        after = _pinv(opt, params)
        each = batch // pieces
        noise["plain"].update(moments(grads), each)
        if before is not None and after is not None:
            noise["before"].update(moments(grads, before), each)
            noise["after"].update(moments(grads, after), each)
            noise["half"].update(moments(grads, np.sqrt(after)), each)
        for k, ns in noise.items():
            out.phi[k].append((seen, ns.phi))
        gbar = grads.mean(axis=0)
        var_i = each * ((grads - gbar) ** 2).sum(axis=0) / (pieces - 1)  # σ_i² per example, unbiased
        sqr_i = gbar**2 - var_i / batch  # G_i², unbiased
        f = smoothing ** (batch / m0)
        sqr_b, var_b, weight = f * sqr_b + (1 - f) * sqr_i, f * var_b + (1 - f) * var_i, f * weight + (1 - f)
        out.adam.append((seen, {t: adam_efficiency(sqr_b / weight, var_b / weight, m0, t) for t in targets}))
        out.rule.append((seen, {t: sqrt_rule_efficiency(sqr_b / weight, var_b / weight, m0, t) for t in targets}))


def adam_efficiency(sqr: np.ndarray, var: np.ndarray, m0: int, batch: int) -> float:
    """Appendix A.1's progress per step at the best learning rate, ΔL(B) ∝ (gᵀP g)²/tr((Σ/B + ggᵀ)PᵀP),
    with Adam's own P(B) = (Σ/B + g²)^(-1/2) at each batch (diagonal): tr(...) is then the coordinates'
    count and ΔL(B) ∝ (Σ_i G_i²/√(σ_i²/B + G_i²))². Per example, relative to M0."""
    g2 = np.maximum(sqr, 0.0)
    v = np.maximum(var, 0.0)

    def t(b: int) -> float:
        d = np.sqrt(v / b + g2)
        return float(np.sum(np.divide(g2, d, out=np.zeros_like(g2), where=d > 0)))

    return (m0 / batch) * (t(batch) / t(m0)) ** 2 if t(m0) > 0 else 1.0


def sqrt_rule_efficiency(sqr: np.ndarray, var: np.ndarray, m0: int, batch: int) -> float:
    """Adam at the square-root rule's own learning rate (not the best one): each coordinate moves by
    lr·m̂_i/√v̂_i, v̂_i ≈ G_i² + σ_i²/B, so to first order a step gains lr(B)·Σ_i G_i²/√(G_i² + σ_i²/B);
    per example relative to M0, with lr(B) ∝ √B: √(M0/B)·T(B)/T(M0). One coordinate (or all alike,
    φ = σ²/G²) gives √((φ + M0)/(φ + B)): the square root of eq. 6."""
    g2 = np.maximum(sqr, 0.0)
    v = np.maximum(var, 0.0)

    def t(b: int) -> float:
        d = np.sqrt(v / b + g2)
        return float(np.sum(np.divide(g2, d, out=np.zeros_like(g2), where=d > 0)))

    return math.sqrt(m0 / batch) * t(batch) / t(m0) if t(m0) > 0 else 1.0


def predicted(m0_run: Curve, batch: int, m0: int, until: float, kind: str) -> float:
    """EFFICIENCY(batch) harmonically averaged over the M0 run's steps up to ``until`` examples, φ of ``kind``
    (steps where φ is not yet measured are left out)."""
    if kind in ("adam", "rule"):
        inv = [1.0 / e[batch] for n, e in getattr(m0_run, kind) if n <= until and e[batch] > 0]
    else:
        root = kind.startswith("sqrt-")
        inv = [1.0 / float(efficiency(phi, m0, float(batch))) ** (0.5 if root else 1.0)
               for n, phi in m0_run.phi[kind.removeprefix("sqrt-")] if n <= until and math.isfinite(phi) and phi >= 0]
    return len(inv) / sum(inv) if inv else math.nan


def median_phi(run: Curve, until: float, kind: str) -> float:
    vals = [phi for n, phi in run.phi[kind] if n <= until and math.isfinite(phi)]
    return float(np.median(vals)) if vals else math.nan
