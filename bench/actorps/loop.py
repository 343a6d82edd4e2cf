"""The iteration every system runs (ours and Ray's), so both do the same work: draw rows, read them,
add a delta, end the iteration; and the window bookkeeping that turns iterations into a rate.

An iteration's rows: ``sparse``, ``rows_per_iter`` distinct random rows (the worker's own seeded
generator, a fresh draw each iteration); dense cases, every row of the table. The delta is constant,
2^-10 in every element: sums of it stay exact in float32 for the lengths run here, so the final table
checks that every increment arrived exactly once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

DELTA = np.float32(2.0**-10)
PHASES = ("draw", "read", "inc", "end")


@dataclass
class Workload:
    """One case's table and iteration (the JSON spec a worker gets carries these fields)."""

    rows: int
    cols: int
    rows_per_iter: int  # == rows: every iteration reads and adds the whole table
    seed: int

    def draws(self, rank: int) -> Callable[[], np.ndarray]:
        """The row sets of worker ``rank``: distinct random rows, or all of them."""
        if self.rows_per_iter >= self.rows:
            every = np.arange(self.rows, dtype=np.int64)
            return lambda: every
        rng = np.random.default_rng([self.seed, rank])
        n, k = self.rows, self.rows_per_iter
        return lambda: rng.choice(n, size=k, replace=False)

    def deltas(self) -> np.ndarray:
        return np.full((self.rows_per_iter, self.cols), DELTA, dtype=np.float32)


@dataclass
class Window:
    """Counts the iterations that end inside [t0, t1] (wall clock, ``time.time()``: the same in every
    process) and sums their phases' wall and thread-CPU seconds."""

    t0: float
    t1: float
    iterations: int = 0
    total: int = 0  # every iteration, warm-up and after the window included (the final check)
    first_end: float | None = None
    last_end: float | None = None
    wall: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    cpu: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    on_open: Callable[[], None] | None = None  # called once, when the first iteration ends in the window
    on_close: Callable[[], None] | None = None  # called once, after the last iteration of the window

    def run(self, phases: list[Callable[[], Any]]) -> None:
        """Run iterations (each the four ``phases`` in order: draw, read, inc, end) until one ends past t1."""
        perf, cpu_now, now = time.perf_counter, time.thread_time, time.time
        k = len(phases)
        w = [0.0] * k
        c = [0.0] * k
        while True:
            for i in range(k):
                a, b = perf(), cpu_now()
                phases[i]()
                w[i] = perf() - a
                c[i] = cpu_now() - b
            self.total += 1
            end = now()
            if end < self.t0:
                continue
            if end > self.t1:
                if self.on_close is not None:
                    self.on_close()
                return
            if self.first_end is None:
                self.first_end = end
                if self.on_open is not None:
                    self.on_open()
                continue  # the window's rate counts iterations after the first one that ended in it
            self.iterations += 1
            self.last_end = end
            for i, name in enumerate(PHASES[:k]):
                self.wall[name] += w[i]
                self.cpu[name] += c[i]

    def result(self) -> dict[str, Any]:
        n = max(self.iterations, 1)
        span = (self.last_end or 0.0) - (self.first_end or 0.0)
        return {"iterations": self.iterations, "total_iterations": self.total, "span_s": span,
                "it_per_s": self.iterations / span if span > 0 else 0.0,
                "phase_wall_us": {k: v / n * 1e6 for k, v in self.wall.items()},
                "phase_cpu_us": {k: v / n * 1e6 for k, v in self.cpu.items()}}
