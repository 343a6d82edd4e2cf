"""Injected round-trip delays for tests and benches of backup workers (docs/design.md, "Backup workers").

A worker's round trip for its j-th gradient is ``mean_s * (1 - alpha + alpha * Exp(1))`` (the DBW
paper's model: alpha = 0 deterministic, 1 exponential), drawn from a generator seeded by
(``seed``, rank), so every run sees the same sequence; from iteration ``slow_from`` on, the upper half
of the ranks (n/2 .. n-1) take ``slow_factor`` times longer. With ``start_file`` the first round trip
begins only when that file exists: a bench's start barrier, so that workers forked one after another
all begin iteration 0 together (bench/dbw/processes.py).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from bosen.config import check

BARRIER_POLL_S = 0.002  # how often a worker at the start barrier looks for its file


@dataclass(frozen=True)
class DelayArgs:
    """``app.args.delay`` of a worker: off (``mean_s`` 0) unless a test or bench asks for it."""

    mean_s: float = 0.0
    alpha: float = 1.0
    seed: int = 0
    slow_from: int = -1  # iteration from which the upper half of the ranks is slower; -1: never
    slow_factor: float = 5.0
    start_file: str = ""  # the first round trip waits for this file to exist; "" = no barrier

    def __post_init__(self) -> None:
        check(self.mean_s >= 0, "mean_s: must be >= 0")
        check(0 <= self.alpha <= 1, "alpha: must be in [0, 1]")
        check(self.slow_factor > 0, "slow_factor: must be > 0")


class Delays:
    """One worker's round-trip times."""

    def __init__(self, args: DelayArgs, rank: int, workers: int) -> None:
        self.args = args
        self.slow_rank = rank >= workers - workers // 2 and workers >= 2
        self.rng = np.random.default_rng([args.seed, rank])
        self.begun = not args.start_file

    def rtt(self, iteration: int) -> float:
        """The round trip of this worker's next gradient, of ``iteration``."""
        a = self.args
        t = a.mean_s * (1.0 - a.alpha + a.alpha * float(self.rng.exponential()))
        if self.slow_rank and 0 <= a.slow_from <= iteration:
            t *= a.slow_factor
        return t

    def wait(self, iteration: int, since: float) -> None:
        """Sleep until the round trip that began at ``since`` (time.perf_counter) is over; the first
        one begins at the start barrier, if any."""
        if not self.begun:
            while not os.path.exists(self.args.start_file):
                time.sleep(BARRIER_POLL_S)
            self.begun = True
            since = time.perf_counter()
        if self.args.mean_s > 0:
            left = self.rtt(iteration) - (time.perf_counter() - since)
            if left > 0:
                time.sleep(left)
