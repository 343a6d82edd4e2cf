"""Where one thread's time goes, by phase: wall and CPU seconds and how many times (``metrics.profile``).

A job's tick spends its time in phases on several threads: the worker's kernel, reads, delta and
buffering; the client's communication thread sending and receiving; each server applying, clocking
and pushing. ``Phases`` belongs to one thread (only that thread writes it; a reader on another
thread sees totals that may be one phase behind) and times a phase with a ``perf_counter`` /
``thread_time`` pair at its start and end: per call or message, never per row. Wall above CPU is
time the thread waited: for a lock, the GIL, a core (2 cores, 4 busy threads), or a reply.

A phase timed inside another is taken out of the outer one, so a thread's phases never count a
moment twice (the server's CLOCK handler less the pushes it makes; a receive less the sends an
acknowledgement lets out). ``thread_time`` costs a system call (0.3 to 0.8 µs measured), so the
counters are off unless ``metrics.profile`` is set.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

R = TypeVar("R")

_now = time.perf_counter
_cpu = time.thread_time


class Phases:
    """Wall and CPU seconds and counts per phase of the thread that owns it (exclusive of nested phases)."""

    __slots__ = ("wall", "cpu", "n", "_inner")

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.n: dict[str, int] = {}
        self._inner: list[list[float]] = []  # per open phase: wall and CPU of the phases timed inside it

    def start(self) -> tuple[float, float]:
        """Open a phase: pass what this returns to :meth:`stop`."""
        self._inner.append([0.0, 0.0])
        return _now(), _cpu()

    def stop(self, phase: str, t0: tuple[float, float]) -> None:
        """Close the phase opened by :meth:`start` and add its time, less its nested phases', to ``phase``."""
        wall, cpu = _now() - t0[0], _cpu() - t0[1]
        inner = self._inner.pop()
        if self._inner:  # the enclosing phase's own time excludes this one
            self._inner[-1][0] += wall
            self._inner[-1][1] += cpu
        self.wall[phase] = self.wall.get(phase, 0.0) + wall - inner[0]
        self.cpu[phase] = self.cpu.get(phase, 0.0) + cpu - inner[1]
        self.n[phase] = self.n.get(phase, 0) + 1

    def reset(self) -> None:
        """Forget the totals so far (start-up: first reads, numba's first calls); open phases stay open."""
        self.wall.clear()
        self.cpu.clear()
        self.n.clear()

    def stats(self) -> dict[str, dict[str, Any]]:
        """phase -> {wall_s, cpu_s, n}."""
        return {k: {"wall_s": round(self.wall[k], 6), "cpu_s": round(self.cpu.get(k, 0.0), 6), "n": self.n.get(k, 0)}
                for k in list(self.wall)}


def timed(phases: Phases | None, phase: str, fn: Callable[..., R], *args: Any) -> R:
    """``fn(*args)``, timed as ``phase`` of ``phases`` when the profile is on (``phases`` not None):
    the one way a call site wraps a phase, at the cost of one call when it is off."""
    if phases is None:
        return fn(*args)
    t = phases.start()
    try:
        return fn(*args)
    finally:
        phases.stop(phase, t)


def merge(parts: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """The sum of several threads' :meth:`Phases.stats` (a process's workers)."""
    out: dict[str, dict[str, Any]] = {}
    for p in parts:
        for k, v in p.items():
            o = out.setdefault(k, {"wall_s": 0.0, "cpu_s": 0.0, "n": 0})
            o["wall_s"] = round(o["wall_s"] + v["wall_s"], 6)
            o["cpu_s"] = round(o["cpu_s"] + v["cpu_s"], 6)
            o["n"] += v["n"]
    return out
