"""Pollux's scheduler over running jobs (issue 33; docs/design.md, "Pollux (goodput)"): several jobs
that `bosen launch` runs with micro-tasks share W worker slots; every interval the scheduler reads
each job's measured seconds per clock, fits its throughput model, asks ``bosen.scheduling.allocate``
for each job's workers and applies the answer with ``bosen.jobs.scale.scale`` (scale-ins first, so
the slots are free before a scale-out asks for them).

A job is modelled as Pollux models a job that keeps its batch (P:310): a clock is one pass of the
job's micro-tasks, ``work`` examples over all its workers, so K workers take m = work/K each and the
seconds per clock are T_iter(work/K, 0, K) (``bosen.goodput.Throughput``), fitted by
``fit_throughput`` on every (K, seconds) seen; until two worker counts were seen its priors hold
(sync split from computation, no growth with K: the exploration the paper's priors make). φ is not
read (no agent reports it yet), so EFFICIENCY is 1 and only the workers adapt.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bosen import scheduling
from bosen.errors import BosenError
from bosen.goodput import fit_throughput

__all__ = ["Tracked", "clock_gaps", "Scheduler"]


@dataclass
class Tracked:
    """One running job the scheduler moves: its run directory, the examples of one clock over all its
    workers, its workers now, and what the policy needs of its history."""

    run_dir: Path
    work: int
    workers: int
    min_workers: int = 1
    max_workers: int | None = None
    started: float = field(default_factory=time.monotonic)  # when tracking began (monotonic clock)
    reallocations: int = 0
    samples: list[tuple[int, float]] = field(default_factory=list)  # (workers, seconds per clock)
    seen_clock: int = -1  # rank 0's newest clock already read
    ran_s: float = 0.0  # rank 0's newest record's time: seconds the job has run (its age, at least)
    skip_until: int = -1  # clocks up to this one straddle a change of workers: not measured

    def __post_init__(self) -> None:
        if self.work < 1 or self.workers < 1:
            raise ValueError(f"pollux.Tracked: work and workers must be >= 1, got {self.work}, {self.workers}")


def clock_gaps(run_dir: Path, after: int) -> tuple[list[tuple[int, float]], int, float]:
    """Rank 0's consecutive clock records past clock ``after`` (RUN_DIR/workers/0.jsonl): (clock,
    seconds since the previous clock) each, the newest clock seen and its time (seconds since rank 0
    started)."""
    path = Path(run_dir) / "workers" / "0.jsonl"
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return [], after, 0.0
    recs = []
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:
            continue  # a line being written
        if isinstance(r, dict) and "clock" in r and "time" in r:
            recs.append((int(r["clock"]), float(r["time"])))
    gaps = [(c, t - tp) for (cp, tp), (c, t) in zip(recs, recs[1:], strict=False) if c == cp + 1 and c > after]
    newest = max([after] + [c for c, _ in recs])
    return gaps, newest, max([0.0] + [t for _, t in recs])


class Scheduler:
    """Pollux's PolluxSched over ``jobs`` sharing ``slots`` worker slots (p, δ as ``allocate`` takes
    them); ``scale`` is ``bosen.jobs.scale.scale`` unless given."""

    def __init__(self, jobs: Sequence[Tracked], slots: int, p: float = -1.0, delay: float = 6.0,
                 scale: Callable[..., float] | None = None) -> None:
        if sum(j.workers for j in jobs) > slots:
            raise ValueError(f"pollux.Scheduler: the jobs hold {sum(j.workers for j in jobs)} workers, more than "
                             f"the {slots} slots")
        if scale is None:
            from bosen.jobs.scale import scale as scale_fn

            scale = scale_fn
        self.jobs = list(jobs)
        self.slots, self.p, self.delay = slots, p, delay
        self.refused: list[tuple[Path, str]] = []  # (run dir, why) of every scale request that failed
        self._scale = scale

    def observe(self) -> None:
        """Each job's new clocks: the median seconds per clock at its current workers, one sample."""
        for j in self.jobs:
            gaps, newest, ran = clock_gaps(j.run_dir, j.seen_clock)
            j.seen_clock, j.ran_s = newest, max(j.ran_s, ran)
            secs = [g for c, g in gaps if c > j.skip_until and g > 0]
            if secs:
                j.samples.append((j.workers, statistics.median(secs)))

    def model(self, j: Tracked) -> scheduling.Job | None:
        """The policy's view of a job, None before its first measured clock."""
        if not j.samples:
            return None
        ks = [float(k) for k, _ in j.samples]
        fit = fit_throughput([j.work / k for k in ks], [0.0] * len(ks), ks, [t for _, t in j.samples])
        return scheduling.Job(fit, float("inf"), j.work, j.work, j.work, workers=j.workers,
                              age=max(time.monotonic() - j.started, j.ran_s), reallocations=j.reallocations,
                              min_workers=j.min_workers, max_workers=j.max_workers, adaptive=False)

    def decide(self) -> list[int]:
        """Workers per job: ``allocate`` over the jobs measured so far; the others keep theirs."""
        models = [self.model(j) for j in self.jobs]
        known = [i for i, m in enumerate(models) if m is not None]
        held = sum(j.workers for i, j in enumerate(self.jobs) if models[i] is None)
        target = [j.workers for j in self.jobs]
        if known:
            alloc = scheduling.allocate([m for m in models if m is not None], self.slots - held, self.p, self.delay)
            for i, k in zip(known, alloc.workers, strict=True):
                target[i] = max(k, self.jobs[i].min_workers)  # a running job keeps at least one worker
        if sum(target) > self.slots:  # more running jobs than slots: nothing to gain by moving
            return [j.workers for j in self.jobs]
        return target

    def apply(self, target: Sequence[int]) -> list[tuple[Path, int, float]]:
        """Scale the jobs whose workers change, shrinking ones first; (run dir, workers, seconds) each."""
        done = []
        order = sorted(range(len(self.jobs)), key=lambda i: target[i] - self.jobs[i].workers)
        for i in order:
            j = self.jobs[i]
            if target[i] == j.workers:
                continue
            try:
                secs = self._scale(j.run_dir, workers=target[i], out=None)
            except BosenError as e:  # the job ended or refused: it keeps what it has; the next interval asks again
                self.refused.append((j.run_dir, str(e)))
                continue
            j.workers = target[i]
            j.reallocations += 1
            _, newest, _ = clock_gaps(j.run_dir, j.seen_clock)
            j.skip_until = newest + 1  # clocks up to the boundary and the first past it: not the new count's
            done.append((j.run_dir, target[i], secs))
        return done

    def step(self) -> list[tuple[Path, int, float]]:
        """One interval: observe, decide, apply."""
        self.observe()
        return self.apply(self.decide())
