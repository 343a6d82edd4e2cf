"""Pollux's cluster policy (Qiao et al., OSDI'21, sect. 4.2; docs/design.md, "Pollux (goodput)"): how
many of W worker slots each of several jobs gets, so that the jobs' speed-ups are high and fair. Pure
numbers, no I/O: a simulator (``bench/pollux/sim.py``) and a scheduler over running jobs ask it alike.

- SPEEDUP_j(K) = max_{m,s} GOODPUT_j(K, m, s) / max_{m,s} GOODPUT_j(K_fair, m, s) (eq. 15), the fair
  share K_fair = ⌈W/J⌉ (AdaptDL's simulator: an exclusive 1/J of the cluster, at least one worker).
  A job that may not change its batch (``adaptive=False``) keeps M = M0 and only its workers move.
- FITNESS_p = (mean_j SPEEDUP_j^p)^(1/p) (eq. 14) over every job, running or pending; p = -1 by
  default ("most goodput improvements and reasonable fairness", P:298), p = 1 the plain mean.
  Like AdaptDL's search each speed-up is offset by 1e-3, so a pending job (0 workers) makes p < 0
  finite (it costs 1000 in the sum of inverses: every slot is worth giving out).
- The re-allocation penalty (P:300-304): a job whose worker count changes has its speed-up scaled by
  (T_j − R_j·δ)/(T_j + δ), T_j its age, R_j its re-allocations so far, δ the delay of one: a
  `bosen scale` step (seconds: the model stays on the servers) where Pollux restarts from a checkpoint.
- Overload (more jobs than their minimum workers fit, not the paper's): there every speed-up at the
  fair share of one worker is 1, FITNESS_p cannot tell which jobs should wait and the penalty keeps
  the running ones running (first come, first served: a short job waits behind long ones). With
  ``overload="las"`` (the default) who runs is decided as Tiresias does, by least attained service in
  levels that double from ``LAS_QUANTUM``·δ worker-seconds (so a job pre-empted has run at least 100
  moves' worth at its level: pre-emption costs it at most 1%), a running job first within a level,
  then the caller's order; the jobs chosen get at least their minimum and FITNESS_p splits the rest.
  ``overload="paper"`` keeps the paper's policy there too.

The search is exact: FITNESS_p is monotone in Σ_j (SPEEDUP_j + ε)^p (p > 0; −Σ for p < 0, Σ log for
p = 0), a sum of one term per job, so maximising it under Σ_j K_j ≤ W is a knapsack over jobs solved by
dynamic programming in O(J·W·K_max) (``allocate``); Pollux's genetic search (NSGA-II over nodes)
is needed for placements on many nodes, which a single pool of slots does not have.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bosen.goodput import Throughput, efficiency

__all__ = ["Job", "Allocation", "goodput_curve", "fair_share", "speedups", "realloc_factor", "fitness",
           "allocate", "service_level", "runnable", "EPSILON", "LAS_QUANTUM", "OVERLOAD"]

EPSILON = 1e-3  # AdaptDL's offset of every speed-up in the power mean
LAS_QUANTUM = 100.0  # the first attained-service level, in re-allocation delays (worker-seconds / δ)
OVERLOAD = ("las", "paper")  # who runs when not every job fits: least attained service, or FITNESS_p alone
CANDIDATES = 50  # total batches searched per worker count (best_config's default)


@dataclass(frozen=True)
class Job:
    """What the policy knows of one job: its goodput model (θ_sys, φ now, M0, the largest total batch and
    per-worker batch) and where it stands (workers now, age in seconds, re-allocations so far)."""

    throughput: Throughput
    phi: float
    m0: int
    max_batch: int
    max_local: int
    workers: int = 0
    age: float = 0.0
    reallocations: int = 0
    min_workers: int = 1
    max_workers: int | None = None
    adaptive: bool = True
    attained: float = 0.0  # worker-seconds run so far (who runs first under overload)

    def __post_init__(self) -> None:
        if self.m0 < 1 or self.max_local < 1:
            raise ValueError(f"scheduling.Job: m0 and max_local must be >= 1, got {self.m0}, {self.max_local}")
        if self.max_batch < self.m0:
            raise ValueError(f"scheduling.Job: max_batch {self.max_batch} is below m0 {self.m0}")
        if not self.phi >= 0:
            raise ValueError(f"scheduling.Job: phi must be >= 0 (examples), got {self.phi}")
        if self.workers < 0 or self.reallocations < 0 or not self.age >= 0 or not self.attained >= 0:
            raise ValueError(f"scheduling.Job: workers, age, reallocations and attained must be >= 0, got "
                             f"{self.workers}, {self.age}, {self.reallocations}, {self.attained}")
        if self.min_workers < 1 or (self.max_workers is not None and self.max_workers < self.min_workers):
            raise ValueError(f"scheduling.Job: needs 1 <= min_workers <= max_workers, got {self.min_workers}, "
                             f"{self.max_workers}")


@dataclass(frozen=True)
class Allocation:
    """The policy's answer: workers per job (in the order given; 0 = pending), the fitness it reaches
    (penalties included) and each job's speed-up there."""

    workers: tuple[int, ...]
    fitness: float
    speedups: tuple[float, ...]


def goodput_curve(job: Job, max_workers: int) -> np.ndarray:
    """The best goodput (examples of M0-equivalent progress per second) at K = 0..``max_workers``
    workers, 0 at K = 0: ``bosen.goodput.best_config`` for every K at once (the same candidates:
    total batches geometric in [M0, max_batch], the fewest accumulation steps that fit max_local).
    A job that is not adaptive runs M0 whatever K (efficiency 1 up to the rounding of m)."""
    if max_workers < 0:
        raise ValueError(f"scheduling.goodput_curve: max_workers must be >= 0, got {max_workers}")
    out = np.zeros(max_workers + 1)
    if max_workers == 0:
        return out
    top = job.max_batch if job.adaptive else job.m0
    big = np.unique(np.round(np.geomspace(job.m0, top, CANDIDATES)).astype(np.int64))[None, :]
    k = np.arange(1, max_workers + 1, dtype=np.int64)[:, None]
    s = np.maximum(np.ceil(big / (k * job.max_local)).astype(np.int64) - 1, 0)
    m = np.ceil(big / (k * (s + 1))).astype(np.int64)
    batch = (k * m * (s + 1)).astype(np.float64)
    good = job.throughput.throughput(m, s, k) * np.asarray(efficiency(job.phi, job.m0, batch), np.float64)
    out[1:] = good.max(axis=1)
    return out


def fair_share(slots: int, jobs: int) -> int:
    """K_fair: an exclusive 1/J of W slots, rounded up, at least one worker (AdaptDL's simulator)."""
    if slots < 1 or jobs < 1:
        raise ValueError(f"scheduling.fair_share: needs slots >= 1 and jobs >= 1, got {slots}, {jobs}")
    return max(1, math.ceil(slots / jobs))


def speedups(job: Job, slots: int, jobs: int) -> np.ndarray:
    """SPEEDUP_j(K) for K = 0..W (eq. 15): goodput at K over goodput at the fair share."""
    curve = goodput_curve(job, max(slots, fair_share(slots, jobs)))
    base = curve[fair_share(slots, jobs)]
    if not base > 0:
        raise ValueError("scheduling.speedups: the job's goodput at its fair share is 0 (check its throughput model)")
    return curve[: slots + 1] / base


def realloc_factor(age: float, reallocations: int, delay: float) -> float:
    """REALLOC_FACTOR = (T − R·δ)/(T + δ), floored at 0 (AdaptDL): what a move costs a job of age T that
    was moved R times, if moves keep coming at its historical rate."""
    if not (age >= 0 and delay >= 0 and reallocations >= 0):
        raise ValueError(f"scheduling.realloc_factor: needs age, delay, reallocations >= 0, got {age}, {delay}, "
                         f"{reallocations}")
    if age + delay == 0:
        return 1.0
    return max(age - reallocations * delay, 0.0) / (age + delay)


def fitness(values: Sequence[float] | np.ndarray, p: float = -1.0) -> float:
    """FITNESS_p of speed-ups (eq. 14), each offset by EPSILON; p = 0 is the geometric mean."""
    v = np.asarray(values, np.float64) + EPSILON
    if v.size == 0 or np.any(v <= 0):
        raise ValueError("scheduling.fitness: needs at least one speed-up, all >= 0")
    if p == 0:
        return float(np.exp(np.mean(np.log(v))))
    return float(np.mean(v**p) ** (1.0 / p))


def _utility(s: np.ndarray, p: float) -> np.ndarray:
    """The per-job term whose sum FITNESS_p is monotone in (larger is better)."""
    v = s + EPSILON
    if p == 0:
        return np.log(v)
    return np.sign(p) * v**p


def service_level(attained: float, quantum: float) -> float:
    """A job's attained-service level: 0 below ``quantum`` worker-seconds, then one more each time its
    service doubles (Tiresias's discretised LAS with levels that double); the service itself when
    ``quantum`` is 0 (moves cost nothing: plain LAS)."""
    if quantum <= 0:
        return attained
    return 0.0 if attained < quantum else 1.0 + math.floor(math.log2(attained / quantum))


def runnable(jobs: Sequence[Job], slots: int, delay: float) -> list[bool] | None:
    """Under overload (the jobs' minimum workers exceed ``slots``) which jobs run: by attained-service
    level (``service_level`` at ``LAS_QUANTUM``·δ), a running job first within a level, then the order
    given; a job whose minimum does not fit the slots left is skipped. None when every job fits."""
    if sum(j.min_workers for j in jobs) <= slots:
        return None
    quantum = LAS_QUANTUM * delay
    order = sorted(range(len(jobs)), key=lambda i: (service_level(jobs[i].attained, quantum), jobs[i].workers == 0, i))
    chosen, free = [False] * len(jobs), slots
    for i in order:
        if jobs[i].min_workers <= free:
            chosen[i], free = True, free - jobs[i].min_workers
    return chosen


def allocate(jobs: Sequence[Job], slots: int, p: float = -1.0, delay: float = 0.0,
             overload: str = "las") -> Allocation:
    """The allocation of at most ``slots`` workers that maximises FITNESS_p with the re-allocation
    penalty of ``delay`` seconds; each job gets 0 (pending) or between its min and max workers. Exact
    (dynamic programming over jobs and slots used); among equal fitnesses it keeps the earlier job's
    smaller count, so ties resolve the same way every time. Under overload (``overload="las"``) the
    jobs that run are ``runnable``'s, each at least at its minimum; ``"paper"``: FITNESS_p decides alone."""
    if slots < 0:
        raise ValueError(f"scheduling.allocate: slots must be >= 0, got {slots}")
    if not math.isfinite(p):
        raise ValueError(f"scheduling.allocate: p must be finite, got {p}")
    if overload not in OVERLOAD:
        raise ValueError(f"scheduling.allocate: overload must be one of {OVERLOAD}, got {overload!r}")
    if not jobs:
        return Allocation((), math.nan, ())
    n = len(jobs)
    chosen = runnable(jobs, slots, delay) if overload == "las" else None
    table = []  # per job: the penalised speed-up at K = 0..slots, -inf where K is not allowed
    for i, job in enumerate(jobs):
        sp = speedups(job, max(slots, 1), n)[: slots + 1]
        factor = realloc_factor(job.age, job.reallocations, delay)
        ks = np.arange(slots + 1)
        sp = np.where(ks == job.workers, sp, sp * factor)
        top = slots if job.max_workers is None else min(slots, job.max_workers)
        allowed = (ks == 0) | ((ks >= job.min_workers) & (ks <= top))
        if chosen is not None:  # overload: the chosen run (at least their minimum), the others wait
            allowed = allowed & (ks > 0) if chosen[i] else ks == 0
        table.append((sp, allowed))
    # best[c]: the best sum of utilities of the jobs so far using exactly c slots
    best = np.full(slots + 1, -np.inf)
    best[0] = 0.0
    choice = np.zeros((n, slots + 1), np.int64)
    for j, (sp, allowed) in enumerate(table):
        u = np.where(allowed, _utility(sp, p), -np.inf)
        new = np.full(slots + 1, -np.inf)
        for k in np.flatnonzero(allowed).tolist():
            cand = np.full(slots + 1, -np.inf)
            cand[k:] = best[: slots + 1 - k] + u[k]
            slack = np.where(np.isfinite(new), 1e-12 * np.maximum(1.0, np.abs(new)), 0.0)
            better = np.isfinite(cand) & (cand > new + slack)
            new = np.where(better, cand, new)
            choice[j] = np.where(better, k, choice[j])
        best = new
    c = int(np.argmax(best))  # fewest slots among the best (argmax takes the first)
    workers = [0] * n
    for j in range(n - 1, -1, -1):
        workers[j] = int(choice[j, c])
        c -= workers[j]
    sps = tuple(float(table[j][0][workers[j]]) for j in range(n))
    return Allocation(tuple(workers), fitness(sps, p), sps)
