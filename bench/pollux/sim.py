"""A discrete-time cluster simulator for Pollux's scheduler (the paper's sect. 5.3 in miniature): jobs
arrive from a synthetic trace, each of a measured kind (``bench/pollux/profiles.py``: φ over training and
T_iter), and every ``interval`` seconds a policy gives each job its workers of W slots; between two
decisions a job progresses at the goodput of its workers and batch, in steps of M0 (a step at M counts
EFFICIENCY(M)·M/M0: AdaScale for every policy, as the paper's baselines, P:347).

Policies:

- ``pollux``: ``bosen.scheduling.allocate`` (FITNESS_p, p = -1 or 1, the re-allocation penalty with δ,
  least attained service deciding who runs when more jobs than slots; ``pollux p=-1 paper``: FITNESS_p
  decides there too, the paper's policy), and each job's agent takes the best (m, s) at its workers
  (``goodput_curve``). The scheduler sees
  the true φ and T_iter (the paper's simulator replays measured values too; the agent's estimation
  noise and Pollux's exploration priors are left out).
- ``fair``: a static fair share: every active job ⌊W/J⌋ workers (the remainder to the oldest; the
  oldest W when J > W), batch M0 (``fair-tuned``: the job's tuned batch at its workers).
- ``tiresias``: Tiresias as the paper ran it (2D-LAS, two priority queues by attained service =
  workers × seconds run, PromoteKnob off, FIFO by arrival within a queue, a job that does not fit is
  skipped, preemptive), each job fixed at its requested workers and batch. Requests are the paper's
  TunedJobs (P:343): a worker count drawn from those where the job's best fixed batch reaches 50-80% of
  ideal scaling over one worker, and that batch (``tiresias tuned``), or that worker count and M0 per
  worker (``tiresias M0xK``: how users configure a job, the paper's "realistic" baseline, P:382).
  The queue threshold is tuned per trace (the best of ``TIRESIAS_THRESHOLDS``, as the paper tuned it).

Every change of a job's workers (a start, a resume, a resize) stalls it δ seconds (``delay``: a
`bosen scale` step, measured 5.8 s for a scale-out on 16 cores, docs/evaluation.md; Pollux pays 30 s
for a checkpoint-restart). Finish-time fairness ρ (Themis, P:416) is a job's JCT over its time alone on
an exclusive W/N̄ share (N̄ the time-average of active jobs over its life; a share below one worker
time-shares it, between two counts the speed is interpolated), adaptive there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.pollux.profiles import STEPS, SYNC_GROWTH
from bosen.goodput import Throughput, efficiency
from bosen.scheduling import Job, allocate, goodput_curve

TIRESIAS_THRESHOLDS = (0.25, 1.0, 4.0)  # worker-hours of attained service before a job drops to queue 1
MAX_BATCH_FACTOR = 32  # the largest batch: 32·M0 ("works well in most cases", P:179)
MAX_LOCAL = 4096  # per-worker batch bound (memory)


@dataclass(frozen=True)
class Kind:
    """A job kind: M0, its T_iter and φ as a function of the fraction of training done."""

    name: str
    m0: int
    throughput: Throughput
    phi_steps: np.ndarray  # steps of the measured run (its length STEPS)
    phi_values: np.ndarray

    def phi_at(self, fraction: float) -> float:
        """φ at a fraction of training: the measured run stretched over the job's length (linear in
        log(1 + step), as the paper's simulator interpolates between measured points)."""
        x = np.log1p(min(max(fraction, 0.0), 1.0) * STEPS)
        return float(np.interp(x, np.log1p(self.phi_steps), self.phi_values))

    @property
    def max_batch(self) -> int:
        return self.m0 * MAX_BATCH_FACTOR


def kinds_from_profiles(data: dict[str, Any], sync_growth: float = SYNC_GROWTH) -> dict[str, Kind]:
    """The kinds of ``profiles.json`` (α_g, β_g, α_s as ``profiles.derive`` took them from the
    measurements), β_s = ``sync_growth``·α_s (the assumption the profiles state), γ = 1 (a
    synchronous step: compute, then push and pull)."""
    out = {}
    for name, k in data["kinds"].items():
        mod = k["model"]
        tp = Throughput(alpha_grad=mod["alpha_grad"], beta_grad=mod["beta_grad"], alpha_sync=mod["alpha_sync"],
                        beta_sync=sync_growth * mod["alpha_sync"], gamma=1.0)
        out[name] = Kind(name, int(k["m0"]), tp, np.asarray(k["phi"]["steps"], np.float64),
                         np.asarray(k["phi"]["phi"], np.float64))
    return out


def fixed_goodput(kind: Kind, workers: int, batch: int, phi: float) -> float:
    """Progress (M0-equivalent examples per second) at a fixed total batch on ``workers`` workers:
    the fewest accumulation steps whose per-worker batch fits MAX_LOCAL."""
    if workers < 1:
        return 0.0
    s = max(math.ceil(batch / (workers * MAX_LOCAL)) - 1, 0)
    m = math.ceil(batch / (workers * (s + 1)))
    real = workers * m * (s + 1)
    return float(kind.throughput.throughput(m, s, workers)) * float(efficiency(phi, kind.m0, real))


def _fractions(n: int = 64) -> np.ndarray:
    return (np.arange(n) + 0.5) / n


def tuned(kind: Kind, workers: int) -> tuple[int, float]:
    """The fixed batch that trains a job fastest on ``workers`` workers (over its whole φ profile, as
    the paper's users who "fully trained each model using a range of different batch sizes", P:343),
    and its speed in steps of M0 per second (averaged harmonically over the profile)."""
    phis = np.array([kind.phi_at(f) for f in _fractions()])
    best = (kind.m0, 0.0)
    for batch in np.unique(np.round(np.geomspace(kind.m0, kind.max_batch, 24)).astype(int)).tolist():
        s = max(math.ceil(batch / (workers * MAX_LOCAL)) - 1, 0)
        m = math.ceil(batch / (workers * (s + 1)))
        tput = float(kind.throughput.throughput(m, s, workers))
        eff = (phis + kind.m0) / (phis + workers * m * (s + 1))  # efficiency(φ, M0, M) over the profile
        speed = 1.0 / float(np.mean(kind.m0 / (tput * eff)))
        if speed > best[1]:
            best = (batch, speed)
    return best


def adaptive_speed(kind: Kind, workers: int) -> float:
    """Steps of M0 per second over a whole job alone on ``workers`` workers, the agent adapting (m, s)."""
    secs = []
    for f in _fractions():
        job = Job(kind.throughput, kind.phi_at(f), kind.m0, kind.max_batch, MAX_LOCAL)
        secs.append(kind.m0 / goodput_curve(job, workers)[workers])
    return 1.0 / float(np.mean(secs))


# ----------------------------------------------------------------------------------------------
# traces


@dataclass(frozen=True)
class TraceJob:
    name: str
    kind: str
    arrival: float  # seconds
    steps: float  # the job's size in steps of M0
    workers: int  # requested (Tiresias)
    batch: int  # requested (Tiresias)


# the paper's size classes by GPU-time (P:341) and their shares (Table 1): worker-hours at the job's
# requested (TunedJobs) configuration, before ``size_scale``; S starts at 0.1 (log-uniform within).
# XL (100-1000, 2%) is left out: the paper's XL job (ImageNet) scales to 64 GPUs, no kind here scales
# past a few workers (the PS's sync, measured), so an XL job would run 50-500 h under any policy.
SIZE_CLASSES = ((0.1, 1.0, 0.72), (1.0, 10.0, 0.20), (10.0, 100.0, 0.06))


def make_trace(kinds: dict[str, Kind], seed: int, jobs: int, hours: float, slots: int,
               size_scale: float = 0.25) -> list[TraceJob]:
    """``jobs`` arrivals, Poisson over ``hours`` (uniform order statistics), kinds drawn evenly, sizes
    from the paper's S/M/L/XL classes times ``size_scale`` (default W/64 of the paper's 64 GPUs at
    W = 16: a job takes the same share of this cluster as of the paper's), each job's TunedJobs request
    for Tiresias; a size is worker-hours at that request, as the trace's GPU-hours are."""
    rng = np.random.default_rng(seed)
    arrivals = np.sort(rng.uniform(0, hours * 3600, jobs))
    names = sorted(kinds)
    probs = np.array([c[2] for c in SIZE_CLASSES])
    requests = {n: _requests(kinds[n], slots) for n in names}
    out = []
    for i, t in enumerate(arrivals):
        kind = kinds[names[int(rng.integers(len(names)))]]
        lo, hi, _ = SIZE_CLASSES[int(rng.choice(len(SIZE_CLASSES), p=probs / probs.sum()))]
        worker_hours = size_scale * float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
        options = requests[kind.name]
        k, batch, speed = options[int(rng.integers(len(options)))]
        out.append(TraceJob(f"job{i}", kind.name, float(t), worker_hours / k * 3600 * speed, k, batch))
    return out


def _requests(kind: Kind, slots: int) -> list[tuple[int, int, float]]:
    """TunedJobs: (workers, batch, steps per second) where the tuned fixed batch reaches 50-80% of
    ideal scaling over one worker; the closest to that band when none does."""
    one = tuned(kind, 1)[1]
    scored = []
    for k in range(1, slots + 1):
        batch, speed = tuned(kind, k)
        scored.append((k, batch, speed, speed / (k * one)))
    ok = [(k, b, v) for k, b, v, e in scored if 0.5 <= e <= 0.8]
    if ok:
        return ok
    k, b, v, _ = min(scored, key=lambda x: min(abs(x[3] - 0.5), abs(x[3] - 0.8)))
    return [(k, b, v)]


# ----------------------------------------------------------------------------------------------
# the simulation


@dataclass
class _State:
    job: TraceJob
    kind: Kind
    done: float = 0.0  # steps of M0
    workers: int = 0
    stall: float = 0.0  # seconds of re-allocation delay still owed
    reallocations: int = 0
    attained: float = 0.0  # worker-seconds run (Tiresias)
    queue: int = 0
    finish: float | None = None
    active_time: float = 0.0  # Σ active jobs × dt over its life (N̄ for ρ)
    crowded: float = 0.0  # seconds of its life with more active jobs than slots
    ran: bool = False  # has had workers: a later change is a re-allocation

    @property
    def fraction(self) -> float:
        return self.done / self.job.steps


Policy = Callable[[float, list[_State], int], dict[str, int]]


def pollux_policy(p: float, delay: float, overload: str = "las") -> Policy:
    def decide(now: float, active: list[_State], slots: int) -> dict[str, int]:
        # the paper's simulator orders jobs by attained service, then submission, and its repair gives
        # slots to the first: ``allocate`` resolves ties in favour of earlier jobs, so this order is
        # who runs first when more jobs than slots tie (every speed-up at one worker is 1 there)
        active = sorted(active, key=lambda s: (s.attained, s.job.arrival))
        jobs = [Job(s.kind.throughput, s.kind.phi_at(s.fraction), s.kind.m0, s.kind.max_batch, MAX_LOCAL,
                    workers=s.workers, age=now - s.job.arrival, reallocations=s.reallocations,
                    attained=s.attained) for s in active]
        alloc = allocate(jobs, slots, p=p, delay=delay, overload=overload)
        return {s.job.name: k for s, k in zip(active, alloc.workers, strict=True)}
    return decide


def fair_policy(now: float, active: list[_State], slots: int) -> dict[str, int]:
    order = sorted(active, key=lambda s: s.job.arrival)
    n = min(len(order), slots)
    out = {s.job.name: 0 for s in order}
    for i, s in enumerate(order[:n]):
        out[s.job.name] = slots // n + (1 if i < slots % n else 0)
    return out


def tiresias_policy(threshold_hours: float) -> Policy:
    def decide(now: float, active: list[_State], slots: int) -> dict[str, int]:
        for s in active:
            if s.queue == 0 and s.attained >= threshold_hours * 3600:
                s.queue = 1
        free = slots
        out = {}
        for s in sorted(active, key=lambda s: (s.queue, s.job.arrival)):
            if s.job.workers <= free:
                out[s.job.name] = s.job.workers
                free -= s.job.workers
            else:
                out[s.job.name] = 0
        return out
    return decide


def simulate(trace: list[TraceJob], kinds: dict[str, Kind], policy: Policy, slots: int, adaptive: bool,
             batch_of: Callable[[_State, int], int], interval: float = 60.0, delay: float = 6.0,
             horizon_hours: float = 20000.0) -> list[_State]:
    """Run the trace to its last job's end; ``adaptive``: the agent picks (m, s) at the workers given,
    else ``batch_of(state, workers)`` is the job's fixed batch."""
    states = [_State(j, kinds[j.kind]) for j in trace]
    pending = list(states)
    active: list[_State] = []
    now = 0.0
    while pending or active:
        while pending and pending[0].job.arrival <= now:
            active.append(pending.pop(0))
        if not active:
            now = max(now + interval, math.floor(pending[0].job.arrival / interval) * interval)
            continue
        alloc = policy(now, active, slots)
        if sum(alloc.values()) > slots:
            raise RuntimeError(f"sim: the policy gave {sum(alloc.values())} workers of {slots}")
        finished = []
        for s in active:
            k = alloc[s.job.name]
            if k != s.workers:
                if k > 0:
                    s.stall = delay
                if k > 0 and s.ran:
                    s.reallocations += 1  # a resize or a resume after preemption
                s.ran = s.ran or k > 0
                s.workers = k
            s.active_time += len(active) * interval
            s.crowded += interval if len(active) > slots else 0.0
            if k == 0:
                continue
            phi = s.kind.phi_at(s.fraction)
            if adaptive:
                job = Job(s.kind.throughput, phi, s.kind.m0, s.kind.max_batch, MAX_LOCAL)
                rate = goodput_curve(job, k)[k] / s.kind.m0
            else:
                rate = fixed_goodput(s.kind, k, batch_of(s, k), phi) / s.kind.m0
            run = max(interval - s.stall, 0.0)
            stalled = interval - run
            s.stall = max(s.stall - interval, 0.0)
            need = (s.job.steps - s.done) / rate
            if need <= run:
                s.finish = now + stalled + need
                s.attained += k * need
                finished.append(s)
            else:
                s.done += rate * run
                s.attained += k * run
        for s in finished:
            active.remove(s)
        now += interval
        if now > horizon_hours * 3600:
            raise RuntimeError(f"sim: jobs still running after {horizon_hours} h: the policy starves them")
    return states


def metrics(states: list[_State], kinds: dict[str, Kind], slots: int) -> dict[str, Any]:
    """Average and tail (p99) JCT, makespan (hours), finish-time fairness ρ, and how contended the
    cluster was: the share of the jobs' time (summed over jobs) with more active jobs than slots."""
    jct = np.array([s.finish - s.job.arrival for s in states if s.finish is not None]) / 3600
    speeds: dict[tuple[str, int], float] = {}

    def speed(kind: Kind, k: int) -> float:
        if (kind.name, k) not in speeds:
            speeds[(kind.name, k)] = adaptive_speed(kind, k)
        return speeds[(kind.name, k)]

    rho = []
    for s in states:
        assert s.finish is not None
        life = s.finish - s.job.arrival
        share = slots / max(s.active_time / max(life, 1e-9), 1.0)  # W/N̄ workers, fractional
        if share < 1:  # a worker time-shared among more jobs than slots
            alone = speed(s.kind, 1) * share
        else:
            lo = math.floor(share)
            hi = min(lo + 1, slots)
            alone = speed(s.kind, lo) + (share - lo) * (speed(s.kind, hi) - speed(s.kind, lo))
        rho.append(life / (s.job.steps / alone))
    r = np.array(rho)
    first = min(s.job.arrival for s in states)
    return {"avg_jct_h": float(jct.mean()), "p99_jct_h": float(np.percentile(jct, 99)),
            "makespan_h": float((max(s.finish for s in states if s.finish is not None) - first) / 3600),
            "rho_max": float(r.max()), "rho_p90": float(np.percentile(r, 90)), "rho_p99": float(np.percentile(r, 99)),
            "rho_std": float(r.std()),
            "rho_under_2": float(np.mean(r < 2)), "jobs": len(states), "rho": [float(x) for x in r],
            "contended": min(sum(s.crowded for s in states) / max(float(jct.sum()) * 3600, 1e-9), 1.0)}



# ----------------------------------------------------------------------------------------------
# the experiment (``python -m bench.pollux --experiments sim``)

POLICIES = ("pollux p=-1", "pollux p=1", "pollux p=-1 paper", "fair M0", "fair tuned", "tiresias M0xK",
            "tiresias tuned")


def run_policy(name: str, trace: list[TraceJob], kinds: dict[str, Kind], slots: int, interval: float,
               delay: float) -> dict[str, Any]:
    """One policy on one trace: its metrics (Tiresias: the best of its queue thresholds, as tuned)."""
    if name.startswith("pollux"):
        p, *mode = name.split("=")[1].split()
        policy = pollux_policy(float(p), delay, "paper" if mode == ["paper"] else "las")
        st = simulate(trace, kinds, policy, slots, True, _no_batch, interval, delay)
        return metrics(st, kinds, slots)
    if name.startswith("fair"):
        batches: dict[tuple[str, int], int] = {}

        def batch_of(s: _State, k: int) -> int:
            if name == "fair M0":
                return s.kind.m0
            if (s.kind.name, k) not in batches:
                batches[(s.kind.name, k)] = tuned(s.kind, k)[0]
            return batches[(s.kind.name, k)]

        return metrics(simulate(trace, kinds, fair_policy, slots, False, batch_of, interval, delay), kinds, slots)
    def requested(s: _State, k: int) -> int:
        return s.job.batch if name == "tiresias tuned" else s.kind.m0 * s.job.workers

    best: dict[str, Any] | None = None
    for threshold in TIRESIAS_THRESHOLDS:
        st = simulate(trace, kinds, tiresias_policy(threshold), slots, False, requested, interval, delay)
        m = metrics(st, kinds, slots) | {"threshold_h": threshold}
        if best is None or m["avg_jct_h"] < best["avg_jct_h"]:
            best = m
    assert best is not None
    return best


def _no_batch(s: _State, k: int) -> int:
    raise AssertionError("adaptive jobs have no fixed batch")
