"""Pollux's job-level agent for synchronous workers (issue 33; docs/design.md, "Pollux (goodput)"):
every interval the job refits its throughput model, updates its gradient noise scale φ and picks the
per-worker batch m, the accumulation steps s and the learning-rate gain of highest goodput; every
worker switches to the same (m, s, gain) at the same iteration.

How the workers agree: a small PS table (``goodput.table``, staleness 0, one row per interval, COLS
columns) holds each interval's sums over all workers: the gradient statistics each worker measured
from the micro-batches of its steps and its step times. Every worker adds its sums to row i in the
last iteration of interval i and, at the first iteration of interval i + 1, reads row i at staleness
0: the read waits until every worker has clocked past interval i, and nobody ever adds to row i
again, so all read the same numbers. ``Agent`` is a pure function of those rows (the fit, φ and the
choice are deterministic numpy), so every worker computes the same choice without a leader: no
rank's failure or lateness decides for the others, and the rows are the whole state (a worker that
reads rows 0..i gets the agent of every other).

The pure model (efficiency, the throughput fit, the search over (m, s)) is ``bosen.goodput``; the
statistics are ``bosen.gradstats``; this module is the protocol between workers and the agent's
state. The app computes the gradients (``Recorder.moments`` takes its micro-batch gradients).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from bosen.config import check, from_dict
from bosen.errors import ConfigError
from bosen.goodput import Throughput, best_config, efficiency, fit_grad, fit_throughput, lr_gain, sync_seed
from bosen.gradstats import NoiseScale, moments

EXPLORE = 4  # the search goes up to this times the largest batch measured (the paper's 2x the most GPUs, P:272)

__all__ = ["GoodputArgs", "Setting", "Agent", "Recorder", "WorkerAgent", "COLS", "HANDED", "table_spec", "start"]

# the columns of a row: one interval's sums over the workers (C_COMPUTE: the timed steps' seconds
# computing gradients, the rest of a step is its sync: push, the servers' step, pull; C_K: the job's
# worker count at each timed step, so an interval whose timed steps ran at several counts shows it)
C_STEPS, C_SQNORM, C_TRACE, C_SECONDS, C_TIMED, C_M, C_S, C_WORKERS, C_COMPUTE, C_K = range(10)
COLS = 10
HANDED = "goodput"  # the name of a leaver's sums (``WorkerAgent.hand_over``) among a handed-off task's arrays


@dataclass(frozen=True)
class GoodputArgs:
    """``app.args.goodput`` (absent: no agent). ``m0``: the initial total batch M0 (examples a step,
    Pollux's user-given M0); None: the workers times the app's ``batch_size``. ``max_batch``: the
    largest total batch (None: 32·M0, the paper's guidance, P:179). ``max_local``: the most examples
    one worker computes at once (the memory bound: past it, accumulation steps s). ``rule``: the
    learning-rate gain (``adascale`` for SGD, ``sqrt`` for Adam). ``adapt``: false keeps the app's
    batch (a fixed-M baseline) while measuring φ and scaling the learning rate alike."""

    table: str = "goodput"
    interval_clocks: int = 20
    m0: int | None = None
    max_batch: int | None = None
    max_local: int = 4096
    rule: Literal["adascale", "sqrt", "linear"] = "adascale"
    smoothing: float = 0.999
    adapt: bool = True

    def __post_init__(self) -> None:
        check(type(self.interval_clocks) is int and self.interval_clocks >= 3,
              f"interval_clocks: must be an integer >= 3 (a step is timed between two reads, the first of an "
              f"interval is not timed), got {self.interval_clocks!r}")
        check(self.m0 is None or self.m0 >= 1, f"m0: must be >= 1, got {self.m0!r}")
        check(self.max_batch is None or self.max_batch >= 1, f"max_batch: must be >= 1, got {self.max_batch!r}")
        check(self.max_local >= 2, f"max_local: must be >= 2 (two micro-batches measure φ), got {self.max_local!r}")
        check(self.rule in ("adascale", "sqrt", "linear"), f"rule: must be adascale, sqrt or linear, got {self.rule!r}")
        check(0.0 < self.smoothing < 1.0, f"smoothing: must be in (0, 1), got {self.smoothing!r}")


def table_spec(intervals: int) -> dict[str, Any]:
    """The agent's table for a job of ``intervals`` intervals, as config data (``tables.goodput``)."""
    return {"rows": intervals, "cols": COLS, "dtype": "float64", "staleness": 0, "init": {"zeros": True}}


@dataclass(frozen=True)
class Setting:
    """What every worker runs in one interval: ``m`` examples per micro-batch, ``s`` accumulation
    steps, ``gain`` times the learning rate; the choice's φ and predicted figures (nan: not chosen
    by the model, the first interval or φ not yet measurable)."""

    interval: int
    m: int
    s: int
    workers: int
    gain: float
    phi: float = math.nan
    efficiency: float = 1.0
    throughput: float = math.nan

    @property
    def batch(self) -> int:
        """M = K·m·(s + 1), examples a step."""
        return self.workers * self.m * (self.s + 1)


class Agent:
    """The job's agent, a pure function of the interval rows it has observed (in order): φ
    (``NoiseScale`` over the intervals' mean statistics), the throughput observations (m, s, K,
    mean step seconds) and the fit, and the next ``Setting``."""

    def __init__(self, args: GoodputArgs, m0: int, workers: int, m_start: int,
                 sync_alpha: float | None = None) -> None:
        if m_start * workers < m0:
            raise ConfigError(f"goodput: the first batch {workers} x {m_start} is below m0 {m0}")
        self.args = args
        self.m0 = m0
        self.max_batch = args.max_batch if args.max_batch is not None else 32 * m0
        if self.max_batch < m0:
            raise ConfigError(f"goodput.max_batch: {self.max_batch} is below m0 {m0}")
        self.sync_alpha = sync_alpha  # α_s from the bandwidth budget (``sync_seed``), or None
        self.noise = NoiseScale(m0, args.smoothing)
        self.obs: list[tuple[int, int, int, float]] = []  # (m, s, K, mean step seconds)
        self.compute: list[float] = []  # per observation: mean seconds computing a step (0: not timed)
        self.prior: Throughput | None = None
        self.model: Throughput | None = None
        # AdaScale's gain stays 1 until φ is measured (with no estimate it would scale linearly); the
        # sqrt and linear rules need no φ, so a job launched past M0 (a fixed large batch) starts at its gain
        first = workers * m_start
        gain = 1.0 if args.rule == "adascale" else lr_gain(args.rule, 0.0, m0, first)
        self.setting = Setting(0, m_start, 0, workers, gain)

    def observe(self, row: np.ndarray) -> None:
        """Fold in the row of the current interval (the sums over the workers that reported: those in
        the job at its last iteration). Where the job's workers changed during the interval, the
        workers switched to the setting for the new count (``decide``); so does the agent here, before
        it reads the row, whatever count it was deciding for (a joiner replaying the rows)."""
        n_workers = int(round(row[C_WORKERS]))
        if n_workers == 0:
            return
        if n_workers != self.setting.workers:
            self.decide(self.setting.interval, n_workers)
        st = self.setting
        if not (row[C_M] == n_workers * st.m and row[C_S] == n_workers * st.s):
            raise ConfigError(f"goodput: interval {st.interval}'s workers ran (m, s) summing to ({row[C_M]}, "
                              f"{row[C_S]}) over {n_workers}, the agent chose ({st.m}, {st.s}): the workers disagree")
        if row[C_STEPS] > 0:
            steps = row[C_STEPS] / n_workers  # steps each worker measured
            self.noise.add(row[C_SQNORM] / row[C_STEPS], row[C_TRACE] / row[C_STEPS], st.batch / self.m0,
                           max(int(round(steps)), 1))
        if row[C_TIMED] > 0 and row[C_K] == n_workers * row[C_TIMED]:  # every timed step at this count
            t = float(row[C_SECONDS] / row[C_TIMED])
            c = float(row[C_COMPUTE] / row[C_TIMED])
            self.obs.append((st.m, st.s, st.workers, t))
            self.compute.append(c if 0 < c < t else 0.0)
            if self.prior is None:
                self.prior = self._prior(st, t, c)

    def _prior(self, st: Setting, t: float, compute: float) -> Throughput:
        """From the first measured steps (what one batch size and one worker count cannot tell apart,
        ``fit_throughput`` keeps here): α_s the step's measured sync, its time outside computation
        (the budget's time, capped at 90% of the step, where computation was not measured); T_grad
        the measured computation of one micro-batch, split evenly between α_g and β_g·m."""
        if 0 < compute < t:
            sync = t - compute
        else:
            sync = min(self.sync_alpha, 0.9 * t) if self.sync_alpha is not None else t / 2
        grad = (t - sync) / (st.s + 1)
        return Throughput(grad / 2, grad / 2 / st.m, sync)

    def _fit(self) -> Throughput:
        """θ_sys from the observations. With one worker count and every step's computation timed, the
        parts are measured apart: T_grad(m) = α_g + β_g·m^p by least squares on the computation per
        micro-batch (``fit_grad``: p = 1, a line, until three batch sizes were measured; a CNN's time
        per example falls as m grows, and a line through its small batches overprices the large ones),
        T_sync the mean of (step − computation), γ = 1 (a synchronous worker computes, then pushes and
        waits: nothing overlaps). Step times alone swing with the machine's load, and a
        slope fitted to them swung the choice 3x between runs (docs/evaluation.md); the computation
        timed alone does not. Otherwise ``fit_throughput`` on the step times (eq. 11, RMSLE). Either fit
        takes one sample per configuration (m, s, K): the median of its intervals, so that an interval
        slowed by the machine's other load does not pull the fit, and a configuration run for many
        intervals does not outweigh the others."""
        groups: dict[tuple[int, int, int], list[tuple[float, float]]] = {}
        for (m_, s_, k_, t_), c_ in zip(self.obs, self.compute, strict=True):
            groups.setdefault((m_, s_, k_), []).append((t_, c_))
        keys = sorted(groups)
        m, s, k = (np.array(x, np.float64) for x in zip(*keys, strict=True))
        t = np.array([float(np.median([x for x, _ in groups[g]])) for g in keys])
        c = np.array([float(np.median([y for _, y in groups[g]])) if all(y > 0 for _, y in groups[g]) else 0.0
                      for g in keys])
        if len(np.unique(k)) > 1 or not np.all(c > 0):
            return fit_throughput([float(v) for v in m], [float(v) for v in s], [float(v) for v in k],
                                  [float(v) for v in t], prior=self.prior)
        per = c / (s + 1)  # one micro-batch's computation
        sync = max(float(np.mean(t - c)), 1e-8)
        if len(np.unique(m)) > 1:
            alpha, beta, power = fit_grad(m, per)
            if beta > 0:
                return Throughput(alpha, beta, sync, power=power)
        # one batch size (or a fit without sense): the computation split evenly, as the prior does
        half = float(np.mean(per)) / 2
        return Throughput(half, half / float(np.mean(m)), sync)

    def decide(self, interval: int, workers: int) -> Setting:
        """The setting of ``interval`` for ``workers`` workers from what was observed: the (m, s) of
        highest goodput and its learning-rate gain; the current (m, s) while φ or the step time is not
        yet measured (or the agent does not adapt)."""
        cur = self.setting
        phi = self.noise.phi
        if math.isnan(phi) or not self.obs:
            batch = workers * cur.m * (cur.s + 1)
            # the sqrt and linear rules need no φ: the gain follows the batch when the count changes
            keep = self.args.rule == "adascale" or batch < self.m0
            gain = cur.gain if keep else lr_gain(self.args.rule, 0.0, self.m0, batch)
            self.setting = Setting(interval, cur.m, cur.s, workers, gain)
            return self.setting
        self.model = self._fit()
        if self.args.adapt:
            # like Pollux's bound on GPUs, a batch far past those measured waits: the fit extrapolates there
            seen = max(k_ * m_ * (s_ + 1) for m_, s_, k_, _ in self.obs)
            bound = max(self.m0, min(self.max_batch, EXPLORE * seen))
            c = best_config(self.model, phi, self.m0, workers, bound, self.args.max_local, rule=self.args.rule)
            new_m, new_s, eff, tput = c.m, c.s, c.efficiency, c.throughput
        else:
            new_m, new_s = cur.m, cur.s
            batch = workers * new_m * (new_s + 1)
            eff = float(efficiency(phi, self.m0, float(batch), self.args.rule))
            tput = float(self.model.throughput(new_m, new_s, workers))
        batch = workers * new_m * (new_s + 1)
        gain = lr_gain(self.args.rule, phi, self.m0, batch) if batch >= self.m0 else 1.0
        self.setting = Setting(interval, new_m, new_s, workers, gain, phi, eff, tput)
        return self.setting


class Recorder:
    """One worker's sums over the current interval (a row's worth: ``row``)."""

    def __init__(self) -> None:
        self.sums = np.zeros(COLS)

    def moments(self, grads: np.ndarray, examples: int, pinv: np.ndarray | None = None) -> None:
        """One step's k >= 2 micro-batch gradients (rows of ``grads``, each the mean of ``examples``
        examples): their unbiased ‖G‖² and tr Σ (``bosen.gradstats``); pre-conditioned by the inverse
        ``pinv`` where given (eq. 5's P; Adam's agent uses P = I with the square-root rule's efficiency)."""
        mo = moments(grads, pinv)
        self.sums[C_STEPS] += 1
        self.sums[C_SQNORM] += mo.sqnorm_raw
        self.sums[C_TRACE] += mo.trace(examples)

    def step(self, seconds: float, compute: float, workers: int) -> None:
        """One timed step: ``seconds`` from its read of w_t to the next, ``compute`` of them in kernels,
        run by ``workers`` workers."""
        self.sums[C_SECONDS] += seconds
        self.sums[C_COMPUTE] += compute
        self.sums[C_TIMED] += 1
        self.sums[C_K] += workers

    def row(self, st: Setting) -> np.ndarray:
        out = self.sums.copy()
        out[C_M], out[C_S], out[C_WORKERS] = st.m, st.s, 1
        return out

    def reset(self) -> None:
        self.sums[:] = 0


class WorkerAgent:
    """A worker's side: at each iteration ``at(it)`` gives the setting (reading the rows of the
    intervals that ended), ``step_seconds`` times the steps, ``before_clock(it)`` adds this worker's
    row in the last iteration of an interval, ``fields`` says what to report."""

    def __init__(self, table: Any, args: GoodputArgs, agent: Agent) -> None:
        self.table = table
        self.args = args
        self.agent = agent
        self.rec = Recorder()
        self.seen = 0  # intervals whose rows were read
        self.last_read: float | None = None  # when the previous iteration's w_t came
        self.last_it = -1
        self.last_k = -1  # the job's workers at the previous iteration
        self.compute = 0.0  # the previous iteration's seconds of computation
        self.decided = True  # the setting of the current interval was just made (report it)

    @property
    def setting(self) -> Setting:
        return self.agent.setting

    def at(self, it: int, now: float, workers: int) -> Setting:
        """The setting of iteration ``it`` (its w_t read at ``now``) for the job's ``workers`` then: the
        step that ended now is timed (not the first of an interval, nor one across a change of the
        workers: its hand-off), the rows of every interval that ended are read and decided on, and
        where the workers changed the agent re-picks (m, s) for their count at once (every worker at
        ``it`` sees the same count, so all switch alike)."""
        every = self.args.interval_clocks
        prev = self.last_it
        if self.last_read is not None and it == prev + 1 and prev % every != 0 and (prev + 1) % every != 0 \
                and workers == self.last_k:
            self.rec.step(now - self.last_read, self.compute, workers)  # not an interval's first step nor the one
            # after its row went out
        self.last_read, self.last_it, self.last_k, self.compute = now, it, workers, 0.0
        interval = it // every
        while self.seen < interval:
            if self.seen >= self.table.rows:
                raise ConfigError(f"goodput.table: {self.args.table!r} has {self.table.rows} rows, the job needs one "
                                  f"per interval of {every} iterations")
            row = self.table.get_rows(np.array([self.seen], np.int64))[0]  # staleness 0: every worker's sums
            self.agent.observe(row)
            self.seen += 1
            self.agent.decide(self.seen, workers)
            self.rec.reset()
            self.decided = True
        if workers != self.agent.setting.workers:  # a scale step: the same observations, the new K
            self.agent.decide(self.agent.setting.interval, workers)
            self.decided = True
        return self.agent.setting

    def skipped(self, it: int, workers: int) -> Setting:
        """The setting of iteration ``it``, which this worker clocks past without a gradient (a
        replacement catching up to the servers' iteration: its lost process ran it): the rows of the
        intervals that ended are read and decided on as in ``at``, but no step is timed, neither this
        one nor the next (its time would span the catch-up)."""
        self.last_read = None
        setting = self.at(it, 0.0, workers)
        self.last_read = None
        return setting

    def computed(self, seconds: float) -> None:
        """This iteration's seconds computing its gradient (timed with its step at the next read)."""
        self.compute = seconds

    def before_clock(self, it: int) -> None:
        """In the last iteration of an interval: add this worker's sums to its row."""
        every = self.args.interval_clocks
        if (it + 1) % every == 0:
            i = it // every
            if i < self.table.rows:
                self.table.inc_rows(np.array([i], np.int64), self.rec.row(self.setting)[None, :])
            self.rec.reset()

    def hand_over(self) -> np.ndarray:
        """A leaver's sums of the interval in progress (its statistics and timed steps since its last
        row; zeros at an interval's end), which it gives to a worker that stays (``take_over``) with its
        micro-tasks: it leaves before the interval's row is added, and the row should hold every step
        measured in the interval (the setting's columns stay for those who add the row)."""
        out = self.rec.sums.copy()
        self.rec.reset()
        return out

    def take_over(self, sums: np.ndarray) -> None:
        """Add a leaver's ``hand_over`` to this worker's sums of the interval (its row then carries them)."""
        sums = np.asarray(sums, dtype=np.float64)
        if sums.shape != (COLS,):
            raise ConfigError(f"goodput: a leaver's hand-over has shape {sums.shape}, expected ({COLS},)")
        self.rec.sums += sums

    def fields(self, rank: int, lr: float) -> dict[str, float]:
        """Per iteration: ``m``, ``s`` and ``lr_gain`` (every worker); at the first iteration of an
        interval rank 0 adds the choice (``goodput_*``: M, φ, the learning rate, the predicted
        efficiency and throughput)."""
        st = self.setting
        out: dict[str, float] = {"m": st.m, "s": st.s, "lr_gain": st.gain}
        if rank == 0:
            out["goodput_workers"] = st.workers  # the K this step ran at (the scheduler reads it)
        if rank == 0 and self.decided:
            out.update(goodput_interval=st.interval, goodput_batch=st.batch, goodput_lr=lr * st.gain,
                       goodput_phi=_finite(st.phi), goodput_efficiency=st.efficiency,
                       goodput_throughput=_finite(st.throughput))
        self.decided = False
        return out


def _finite(x: float) -> float:
    return x if math.isfinite(x) else -1.0  # JSON has no nan or inf: -1 says "not measured, or unbounded"


def start(client: Any, spec: Mapping[str, Any] | GoodputArgs, batch_size: int, bytes_per_step: float) -> WorkerAgent:
    """This worker's agent for ``app.args.goodput``: checks the table (its geometry named in the error)
    and seeds α_s from ``comm.client_bandwidth_mbps`` where communication is managed."""
    args = spec if isinstance(spec, GoodputArgs) else from_dict(GoodputArgs, dict(spec), "app.args.goodput")
    try:
        t = client.table(args.table)
    except (KeyError, ValueError) as e:
        raise ConfigError(f"goodput: needs table {args.table!r} ({table_spec(1) | {'rows': 'intervals'}}): {e}") from e
    cfg = client.config
    staleness = cfg.staleness_of(cfg.table(args.table)) if hasattr(cfg, "staleness_of") else 0
    if t.cols != COLS or np.dtype(t.dtype) != np.float64 or staleness != 0:
        raise ConfigError(f"goodput: table {args.table!r} must have cols={COLS}, dtype float64 and staleness 0 "
                          f"(every worker reads each interval's complete row); it has cols={t.cols}, dtype "
                          f"{np.dtype(t.dtype)}, staleness {staleness}")
    workers = client.num_workers
    m0 = args.m0 if args.m0 is not None else workers * batch_size
    comm = getattr(cfg, "comm", None)
    seed = sync_seed(bytes_per_step, comm.client_bandwidth_mbps) if comm is not None and comm.enabled else None
    # Pollux starts at M0; a fixed baseline runs the app's batch_size throughout
    m_start = -(-m0 // workers) if args.adapt else batch_size
    return WorkerAgent(t, args, Agent(args, m0, workers, m_start, seed))
