"""Where a job's tick goes, per thread and phase: the ``profile`` of an app's job case (issue 28).

A job launched with ``metrics.profile`` on has every thread time its phases (``bosen.phases``):
the client's record holds the worker thread's (``read``: get_rows, waits for fresh rows included;
``buffer``: inc_rows into the update buffer and cache; ``clock``: blocked in clock(); ``app``: the
rest of the tick, outside the client) and the communication thread's (``send``: flushes and what
acknowledgements let out, encoding included; ``receive``: pushed ROWS into the cache; ``other_in``:
acknowledgements and clocks), each server's record its loop's time per message kind handled
(``inc``: applying updates; ``read``; ``clock``) and ``push`` (row pushes). The app's own reports
split ``app``: its kernel (the field ``kernel_key``; CPU too where it reports ``kernel_cpu_key``),
and the remainder (deltas, evaluation, bookkeeping). Everything is in ms per ``clock()`` call of rank 0
(a job's clocks before and after its training ticks included: LDA's first and closing barriers).
"""

from __future__ import annotations

from typing import Any

from bosen.jobs.job import JobRun

SETS = {"metrics.profile": True}  # what a job case adds to its job for the profile


def job_profile(job: JobRun, kernel_key: str, kernel_cpu_key: str | None = None,
                has: str = "samples") -> dict[str, Any] | None:
    """Rank 0's worker and communication threads and every server: phase -> wall and CPU ms per clock.
    None where the job ran without ``metrics.profile``. ``has``: a field only training reports carry."""
    client = next((r for r in job.kind("client") if r.get("rank") == 0 and "phases" in r), None)
    if client is None:
        return None
    ph = client["phases"]
    clocks = ph["worker"].get("clock", {}).get("n", 0)
    if not clocks:
        return None
    # the reports made after a clock() call: "app" is timed from the first one on (a tick-0 report's
    # kernel, numba's first calls included, is in neither)
    mine = [r for r in job.kind("worker") if r.get("rank") == 0 and has in r and r.get("clock", 0) >= 1]

    def per(v: dict[str, Any]) -> dict[str, float]:
        return {"wall_ms": round(v["wall_s"] * 1e3 / clocks, 4), "cpu_ms": round(v["cpu_s"] * 1e3 / clocks, 4)}

    worker = {k: per(v) for k, v in ph["worker"].items()}
    app = worker.pop("app", {"wall_ms": 0.0, "cpu_ms": 0.0})
    kernel_wall = sum(r.get(kernel_key, 0.0) for r in mine) * 1e3 / clocks
    kernel: dict[str, float | None] = {"wall_ms": round(kernel_wall, 4), "cpu_ms": None}
    if kernel_cpu_key is not None and any(kernel_cpu_key in r for r in mine):
        kernel["cpu_ms"] = round(sum(r.get(kernel_cpu_key, 0.0) for r in mine) * 1e3 / clocks, 4)
    rest: dict[str, float | None] = {"wall_ms": round(app["wall_ms"] - kernel_wall, 4), "cpu_ms": None}
    if kernel["cpu_ms"] is not None:
        rest["cpu_ms"] = round(app["cpu_ms"] - kernel["cpu_ms"], 4)
    out: dict[str, Any] = {"clocks": clocks, "worker": {"kernel": kernel, "app rest (delta, eval)": rest, **worker},
                           "comm": {k: per(v) for k, v in ph["comm"].items()}}
    for s in sorted(job.kind("server"), key=lambda s: s.get("rank", 0)):
        if "phases" in s:
            out[f"server{s.get('rank', 0)}"] = {k: per(v) for k, v in s["phases"].items()
                                                if k not in ("hello", "status", "bye")}
    return out


def table(profile: dict[str, Any] | None) -> str:
    """The profile as lines: thread, phase, wall and CPU ms per clock."""
    if profile is None:
        return "(no profile: metrics.profile was off)"
    lines = [f"{'thread':8s} {'phase':24s} {'wall ms':>9s} {'cpu ms':>9s}   per clock, {profile['clocks']} clocks"]
    for thread, phases in profile.items():
        if thread == "clocks":
            continue
        for k, v in sorted(phases.items(), key=lambda kv: -kv[1]["wall_ms"]):
            cpu = "" if v["cpu_ms"] is None else f"{v['cpu_ms']:9.3f}"
            lines.append(f"{thread:8s} {k:24s} {v['wall_ms']:9.3f} {cpu:>9s}")
    return "\n".join(lines)
