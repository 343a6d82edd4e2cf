"""The baseline: an actor parameter server in a few lines of Ray, as a user would write it.

``PS`` holds the table as one numpy array; ``get(rows)`` returns those rows, ``inc(rows, deltas)``
adds to them. Each ``Worker`` actor runs the same iteration as ours (``loop``): draw rows,
``ray.get(ps.get.remote(rows))``, ``ps.inc.remote(rows, deltas)`` without waiting (a Ray actor runs
one caller's calls in the order they were made, so the next read sees this increment; nothing piles
up). Ray's own processes (GCS, raylet, the object store) run beside them, as they would for a user.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import ray

from bench.actorps.loop import Window, Workload


@ray.remote
class PS:
    def __init__(self, rows: int, cols: int) -> None:
        self.table = np.zeros((rows, cols), dtype=np.float32)

    def get(self, rows: np.ndarray) -> np.ndarray:
        return self.table[rows]

    def inc(self, rows: np.ndarray, deltas: np.ndarray) -> None:
        self.table[rows] += deltas

    def total(self) -> float:
        return float(self.table.sum(dtype=np.float64))

    def pid(self) -> int:
        return os.getpid()


@ray.remote
class Worker:
    def __init__(self, ps: Any, workload: dict[str, Any], rank: int) -> None:
        self.ps = ps
        self.wl = Workload(**workload)
        self.draw = self.wl.draws(rank)
        self.deltas = self.wl.deltas()

    def pid(self) -> int:
        return os.getpid()

    def ready(self) -> None:
        """One iteration before the window is set (as our workers do)."""
        rows = self.draw()
        ray.get(self.ps.get.remote(rows))
        self.ps.inc.remote(rows, self.deltas)

    def run(self, t0: float, t1: float) -> dict[str, Any]:
        state: dict[str, Any] = {}
        ps, deltas = self.ps, self.deltas

        def d() -> None:
            state["rows"] = self.draw()

        def r() -> None:
            state["vals"] = ray.get(ps.get.remote(state["rows"]))

        def i() -> None:
            ps.inc.remote(state["rows"], deltas)

        win = Window(t0, t1)
        win.run([d, r, i])
        ray.get(ps.pid.remote())  # runs after this worker's last inc: every one of them is applied
        return {**win.result(), "rows_incremented": (win.total + 1) * self.wl.rows_per_iter}
