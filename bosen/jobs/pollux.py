"""Pollux's scheduler over running jobs (issue 33; docs/design.md, "Pollux (goodput)"): several jobs
that `bosen launch` runs with micro-tasks share W worker slots; every interval the scheduler reads
each job's measured seconds per clock, fits its throughput model, asks ``bosen.scheduling.allocate``
for each job's workers and applies the answer with ``bosen.jobs.scale.scale`` (scale-ins first, so
the slots are free before a scale-out asks for them).

A job is modelled as Pollux models a job that keeps its batch (P:310): a clock is one pass of the
job's micro-tasks, ``work`` examples over all its workers, so K workers take m = work/K each and the
seconds per clock are T_iter(work/K, 0, K) (``bosen.goodput.Throughput``), fitted by
``fit_throughput`` on every (K, seconds) seen; until two worker counts were seen its priors hold
(sync split from computation, no growth with K: the exploration the paper's priors make). Where the
job's goodput agent reports φ (rank 0's ``goodput_phi``, and each clock's per-worker ``m`` and
accumulation ``s``), the job is modelled as Pollux models an adaptive job: T_iter fitted on the (m, s,
K) it ran, its agent picking the batch at each K (M0, the largest batch and a worker's from
``app.args.goodput``); elsewhere EFFICIENCY is 1 and only the workers adapt.

``schedule`` (``bosen schedule RUN_DIR... --slots W``) runs the loop over jobs that ``bosen launch``
runs: every interval a step, its moves printed, until every job has ended; ``track`` reads what a
job's run directory says of it and refuses, naming why, one that the scheduler cannot move.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bosen import config as config_mod
from bosen import scheduling
from bosen.errors import BosenError
from bosen.goodput import fit_throughput

__all__ = ["Tracked", "Agent", "clock_gaps", "Scheduler", "track", "schedule", "WORK"]

WORK = 1000  # examples a clock for a job without an agent: the fit is the same for any value (m = WORK/K scales β_g)


@dataclass(frozen=True)
class Agent:
    """What a job's goodput agent adapts within (``app.args.goodput``): M0, the largest total batch and
    a worker's largest batch (examples)."""

    m0: int
    max_batch: int
    max_local: int


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
    agent: Agent | None = None  # the job adapts its batch (app.args.goodput)
    phi: float | None = None  # the agent's newest φ (rank 0's goodput_phi), None before one is reported
    runs: list[tuple[int, float, float, float]] = field(default_factory=list)  # (workers, m, s, seconds) clocks
    attained: float = 0.0  # worker-seconds run since tracking began (who runs first under overload)

    def __post_init__(self) -> None:
        if self.work < 1 or self.workers < 1:
            raise ValueError(f"pollux.Tracked: work and workers must be >= 1, got {self.work}, {self.workers}")


def _records(run_dir: Path) -> list[dict[str, Any]]:
    """Rank 0's clock records (RUN_DIR/workers/0.jsonl), those with a clock and a time."""
    try:
        lines = (Path(run_dir) / "workers" / "0.jsonl").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:
            continue  # a line being written
        if isinstance(r, dict) and "clock" in r and "time" in r:
            out.append(r)
    return out


def clock_gaps(run_dir: Path, after: int) -> tuple[list[tuple[int, float]], int, float]:
    """Rank 0's consecutive clock records past clock ``after`` (RUN_DIR/workers/0.jsonl): (clock,
    seconds since the previous clock) each, the newest clock seen and its time (seconds since rank 0
    started)."""
    recs = [(int(r["clock"]), float(r["time"])) for r in _records(run_dir)]
    gaps = [(c, t - tp) for (cp, tp), (c, t) in zip(recs, recs[1:], strict=False) if c == cp + 1 and c > after]
    newest = max([after] + [c for c, _ in recs])
    return gaps, newest, max([0.0] + [t for _, t in recs])


def agent_clocks(run_dir: Path, after: int) -> tuple[list[tuple[int, int, float, float, float]], float | None]:
    """What a goodput agent writes in rank 0's records past clock ``after``: (clock, the job's workers
    it ran at (``goodput_workers``; 0 where the record does not say), m, s, seconds since the previous
    clock) of each clock that names its per-worker batch and accumulation, and the newest φ reported
    (``goodput_phi``; -1 there means not measured yet), None if none."""
    recs = _records(run_dir)
    out, phi = [], None
    for prev, r in zip(recs, recs[1:], strict=False):
        c = int(r["clock"])
        if c == int(prev["clock"]) + 1 and c > after and "m" in r and "s" in r:
            k = r.get("goodput_workers")
            out.append((c, int(k) if isinstance(k, (int, float)) else 0, float(r["m"]), float(r["s"]),
                        float(r["time"]) - float(prev["time"])))
    for r in recs:
        if int(r["clock"]) > after and isinstance(r.get("goodput_phi"), (int, float)) and r["goodput_phi"] >= 0:
            phi = float(r["goodput_phi"])
    return out, phi


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
        """Each job's new clocks: the median seconds per clock at its current workers, one sample. A job
        scaled by someone else meanwhile (its launcher counts other workers) is taken at its new count,
        the clocks so far not measured as either."""
        for j in self.jobs:
            now = _workers_now(j.run_dir)
            if now is not None and now != j.workers:
                j.workers, j.reallocations = now, j.reallocations + 1
                j.skip_until = clock_gaps(j.run_dir, j.seen_clock)[1] + 1
            after = j.seen_clock
            gaps, newest, ran = clock_gaps(j.run_dir, after)
            j.attained += j.workers * max(ran - j.ran_s, 0.0)
            j.seen_clock, j.ran_s = newest, max(j.ran_s, ran)
            secs = [g for c, g in gaps if c > j.skip_until and g > 0]
            if secs:
                j.samples.append((j.workers, statistics.median(secs)))
            if j.agent is not None:
                clocks, phi = agent_clocks(j.run_dir, after)
                j.phi = phi if phi is not None else j.phi
                j.runs += [(k or j.workers, m, s, g) for c, k, m, s, g in clocks
                           if c > j.skip_until and g > 0 and m >= 1]

    def model(self, j: Tracked) -> scheduling.Job | None:
        """The policy's view of a job, None before its first measured clock. Like Pollux's exploration
        bound, a job gets at most twice the most workers it was measured at (its model knows nothing
        past that)."""
        age = max(time.monotonic() - j.started, j.ran_s)
        seen = max([j.workers] + [k for k, _ in j.samples] + [k for k, *_ in j.runs])
        top = 2 * seen if j.max_workers is None else min(j.max_workers, 2 * seen)
        if j.agent is not None and j.phi is not None and j.runs:  # Pollux's adaptive job: φ and the (m, s) run
            a = j.agent
            groups: dict[tuple[int, float, float], list[float]] = {}
            for k, m, acc, secs in j.runs:  # one point per configuration run: its median clock
                groups.setdefault((k, m, acc), []).append(secs)
            keys = sorted(groups)
            fit = fit_throughput([g[1] for g in keys], [g[2] for g in keys], [float(g[0]) for g in keys],
                                 [statistics.median(groups[g]) for g in keys])
            return scheduling.Job(fit, j.phi, a.m0, a.max_batch, a.max_local, workers=j.workers, age=age,
                                  reallocations=j.reallocations, min_workers=j.min_workers, max_workers=top,
                                  attained=j.attained)
        if not j.samples:
            return None
        ks = [float(k) for k, _ in j.samples]
        fit = fit_throughput([j.work / k for k in ks], [0.0] * len(ks), ks, [t for _, t in j.samples])
        return scheduling.Job(fit, float("inf"), j.work, j.work, j.work, workers=j.workers, age=age,
                              reallocations=j.reallocations, min_workers=j.min_workers, max_workers=top,
                              adaptive=False, attained=j.attained)

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


def _ended(run_dir: Path) -> bool:
    """The job's launcher has stopped (its control file is gone, or its process)."""
    from bosen.jobs.scale import ScaleError, control_address

    try:
        control_address(run_dir)
    except ScaleError:
        return True
    return False


def _workers_now(run_dir: Path) -> int | None:
    """The job's workers now as its launcher counts them; None where no launcher answers."""
    from bosen.jobs.scale import ScaleError, workers_now

    try:
        return workers_now(run_dir)
    except ScaleError:
        return None


def track(run_dir: str | os.PathLike[str]) -> Tracked:
    """A running job as the scheduler starts from: its workers now (as its launcher counts them: a job
    scaled since its launch has another count than its config's), at most one per micro-task, and
    its agent's bounds where it has one. BosenError, naming why, for a run directory without a
    running launcher or a job that cannot scale (no checkpoints)."""
    from bosen.jobs.scale import control_address, workers_now

    path = Path(run_dir).resolve()
    if not path.is_dir():
        raise BosenError(f"{run_dir}: not a run directory (bosen launch --run-dir makes one)")
    control_address(path)  # ScaleError: no launcher, or one that is not running any more
    try:
        cfg = config_mod.load(path / "config.yaml")
    except (OSError, ValueError) as e:
        raise BosenError(f"{path}: cannot read its config.yaml: {e}") from None
    if cfg.checkpoint is None:
        raise BosenError(f"{path}: the job makes no checkpoints (no checkpoint section), so its workers cannot "
                         "change while it runs: the scheduler can only move a job that `bosen scale` can")
    args = cfg.app.args
    tasks = args.get("micro_tasks")
    workers = cfg.cluster.workers  # as launched: M0 is counted from it
    agent = None
    spec = args.get("goodput")
    if isinstance(spec, dict) and spec.get("adapt", True):
        m0 = int(spec.get("m0") or workers * int(args.get("batch_size", 1)))
        # the agent's defaults: 32·M0 (P:179), 4096 a worker
        agent = Agent(m0, int(spec.get("max_batch") or 32 * m0), int(spec.get("max_local") or 4096))
    top = int(tasks) if isinstance(tasks, int) and tasks > 0 else None
    return Tracked(path, WORK, workers_now(path), max_workers=top, agent=agent)


@dataclass(frozen=True)
class Move:
    """One interval's change of one job: when (seconds since the loop began), which, from and to how many
    workers, the `bosen scale` step's seconds."""

    at: float
    run_dir: Path
    before: int
    after: int
    seconds: float


def schedule(run_dirs: Sequence[str | os.PathLike[str]], slots: int, interval: float = 30.0, p: float = -1.0,
             delay: float = 6.0, out: Callable[[str], None] | None = print,
             scale: Callable[..., float] | None = None) -> list[Move]:
    """Pollux's loop over running jobs (``bosen schedule``): every ``interval`` seconds observe, decide and
    apply (``Scheduler.step``), dropping jobs that ended (their slots go to the others), until none is
    left; each move and each refusal is printed through ``out``. Returns the moves."""
    if interval <= 0:
        raise ValueError(f"pollux.schedule: interval must be > 0 seconds, got {interval}")
    if not run_dirs:
        raise ValueError("pollux.schedule: no run directories given")
    sched = Scheduler([track(r) for r in run_dirs], slots, p, delay, scale)
    say = out or (lambda _: None)
    t0 = time.monotonic()
    say(f"pollux: {len(sched.jobs)} jobs on {slots} worker slots, p = {p:g}, every {interval:g}s: "
        + ", ".join(f"{j.run_dir.name} {j.workers}" for j in sched.jobs))
    moves: list[Move] = []
    while sched.jobs:
        time.sleep(interval)
        for j in [j for j in sched.jobs if _ended(j.run_dir)]:
            sched.jobs.remove(j)
            say(f"pollux: +{time.monotonic() - t0:.0f}s {j.run_dir.name} ended ({j.reallocations} moves)")
        if not sched.jobs:
            break
        before = {j.run_dir: j.workers for j in sched.jobs}
        refused = len(sched.refused)
        for run_dir, k, secs in sched.step():
            moves.append(Move(time.monotonic() - t0, run_dir, before[run_dir], k, secs))
            say(f"pollux: +{moves[-1].at:.0f}s {run_dir.name} {before[run_dir]} -> {k} workers ({secs:.1f}s)")
        for run_dir, why in sched.refused[refused:]:
            if not _ended(run_dir):
                say(f"pollux: {run_dir.name} kept its workers: {why}")
    return moves
