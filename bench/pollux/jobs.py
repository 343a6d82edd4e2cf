"""``python -m bench.pollux --experiments jobs``: Pollux's scheduler on real jobs (issue 33; docs/design.md,
"Pollux (goodput)"): two checkpointed MLR jobs launched together on this machine (plain ``bosen
launch``, micro-tasks) share W worker slots, either under ``bosen.jobs.pollux.schedule`` (each job
starts at one worker, as Pollux starts a job, and the loop moves slots every ``interval``) or under a
fixed equal split (W/2 each, all along); the modes alternate, a pair per repetition, and each job's
completion time is its launcher's wall time. With ``--jobs-ray ADDRESS`` both jobs run as actors on
that Ray cluster (``bosen launch --ray``).

The kinds differ in why they scale, not only in CPU: ``small`` (20 000 synthetic samples, batch 64)
spends a clock coordinating: a second worker adds a synchronisation to every clock and no
computation worth splitting, so it is slower on two workers; ``large`` (200 000 samples, batch 256)
spends a clock computing, which a second worker splits (on a shared machine it gains what CPU the
extra process gets). Pollux should learn this from the clocks and give ``large`` the slots.

With ``--jobs-agent`` the jobs are Pollux's adaptive ones: synchronous MLR (a backup table, static k =
the workers, so `bosen scale` moves it) whose goodput agent picks (m, s) and re-picks them for each
new worker count, a clock an iteration; the kinds then differ in the features a sample has
(``small`` 20: coordination-bound; ``large`` 200: computation grows with the batch), both at M0 =
64 whatever their first workers, and the scheduler models them from the agent's records (φ, m, s,
K).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import REPO, emit, log
from bosen.jobs.pollux import Move, schedule

KINDS: dict[str, dict[str, Any]] = {
    "small": {"synthetic": {"n": 20000, "nnz": 20}, "batch_size": 64},
    "large": {"synthetic": {"n": 200000, "nnz": 20}, "batch_size": 256},
}
AGENT_KINDS: dict[str, dict[str, Any]] = {
    "small": {"synthetic": {"n": 20000, "nnz": 20}},
    "large": {"synthetic": {"n": 20000, "nnz": 200}},
}
MICRO_TASKS = 12  # divides 1..4 workers evenly
AGENT_M0 = 64  # the adaptive jobs' M0, the same whatever workers they start with
AGENT_INTERVAL = 20  # iterations between the agent's choices


def job_config(kind: str, clocks: int, agent: bool = False, workers: int = 1) -> dict[str, Any]:
    """A checkpointed MLR job of ``clocks`` clocks (one epoch each) that `bosen scale` can move; with
    ``agent`` a synchronous one of ``clocks`` iterations whose goodput agent adapts its batch, launched
    with ``workers`` (its backup table's k, which follows later counts)."""
    if agent:
        return {"cluster": {"servers": ["127.0.0.1:0"], "workers": workers}, "comm": {"enabled": True},
                "checkpoint": {"every_clocks": 100, "keep": 2},
                "tables": {"W": {"rows": 10, "cols": 201, "dtype": "float32", "init": {"zeros": True},
                                 "backup": {"mode": "static", "k": workers, "lr": 0.5}},
                           "goodput": {"rows": clocks // AGENT_INTERVAL + 1, "cols": 10, "dtype": "float64",
                                       "staleness": 0, "init": {"zeros": True}}},
                "app": {"module": "bosen.apps.mlr",
                        "args": {"data": "synthetic", "batch_size": AGENT_M0 // workers, "micro_tasks": MICRO_TASKS,
                                 "seed": 3, "eval_every": 0, "epochs": clocks,
                                 "goodput": {"interval_clocks": AGENT_INTERVAL, "m0": AGENT_M0}} | AGENT_KINDS[kind]}}
    return {"cluster": {"servers": ["127.0.0.1:0"], "workers": 1}, "consistency": {"staleness": 1},
            "comm": {"enabled": True}, "checkpoint": {"every_clocks": 100, "keep": 2},
            "tables": {"W": {"rows": 10, "cols": 101, "dtype": "float32", "init": {"zeros": True}}},
            "app": {"module": "bosen.apps.mlr",
                    "args": {"data": "synthetic", "lr": 0.5, "micro_tasks": MICRO_TASKS, "seed": 3, "eval_every": 0,
                             "epochs": clocks} | KINDS[kind]}}


def run_once(mode: str, root: Path, clocks: dict[str, int], slots: int, interval: float, delay: float,
             timeout: float, ray: str | None = None, agent: bool = False) -> dict[str, Any]:
    """Both jobs under ``mode`` (``pollux`` or ``fixed``): each job's completion time (s), the moves; with
    ``ray`` (a Ray cluster's address) the jobs run as actors there (``bosen launch --ray``); with
    ``agent`` the adaptive synchronous jobs (``job_config``)."""
    root.mkdir(parents=True)
    start = 1 if mode == "pollux" else slots // len(clocks)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    runs: dict[str, Path] = {}
    ends: dict[str, float] = {}
    t0 = time.monotonic()
    for name, n in clocks.items():
        cfg = root / f"{name}.yaml"
        cfg.write_text(json.dumps(job_config(name, n, agent, start)))
        runs[name] = root / name
        procs[name] = subprocess.Popen([sys.executable, "-m", "bosen", "launch", str(cfg), "--run-dir", str(runs[name]),
                                        "--workers", str(start), "--no-plot", "--quiet", "--timeout", str(timeout)]
                                       + ([] if ray is None else ["--ray", ray]),
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO,
                                       start_new_session=True)
    moves: list[Move] = []
    lines: list[str] = []
    failed: list[str] = []

    def loop() -> None:
        while not all((r / "control.json").exists() for r in runs.values()):  # the launchers are up
            if any(p.poll() is not None for p in procs.values()) or time.monotonic() - t0 > timeout:
                return
            time.sleep(0.05)
        try:
            moves.extend(schedule(list(runs.values()), slots, interval=interval, delay=delay, out=lines.append))
        except Exception as e:  # reported below: the run is not counted
            failed.append(f"{type(e).__name__}: {e}")

    thread = threading.Thread(target=loop, daemon=True) if mode == "pollux" else None
    if thread is not None:
        thread.start()
    try:
        while len(ends) < len(procs):
            for name, p in procs.items():
                if name not in ends and p.poll() is not None:
                    ends[name] = time.monotonic() - t0
                    if p.returncode != 0:
                        failed.append(f"{name} exited with {p.returncode} (logs in {runs[name] / 'logs'})")
            time.sleep(0.05)
        if thread is not None:
            thread.join(interval + 30)
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    for line in lines:
        log(f"  {mode}: {line}")
    return {"mode": mode, "jct_s": ends, "avg_jct_s": statistics.mean(ends.values()), "failed": failed,
            "moves": [(m.run_dir.name, m.before, m.after, round(m.at, 1)) for m in moves],
            "load": float(Path("/proc/loadavg").read_text().split()[0])}


def run(reps: int, clocks: dict[str, int], slots: int, interval: float, delay: float, timeout: float,
        ray: str | None = None, agent: bool = False) -> None:
    """``reps`` pairs (fixed then Pollux, alternating which goes first): one line per run, then the ratio
    fixed / Pollux of the average JCT per pair (> 1: Pollux sooner), median and spread."""
    ratios = []
    with tempfile.TemporaryDirectory(prefix="pollux-jobs-") as tmp:
        for rep in range(reps):
            got = {}
            for mode in (("fixed", "pollux") if rep % 2 == 0 else ("pollux", "fixed")):
                r = run_once(mode, Path(tmp) / f"{rep}-{mode}", clocks, slots, interval, delay, timeout, ray, agent)
                got[mode] = r
                emit(bench="pollux", case=f"jobs {mode} rep={rep}", metric="avg_jct", unit="s", ours=r["avg_jct_s"],
                     experiment="jobs", rep=rep, slots=slots, interval=interval, delay=delay, clocks=clocks, ray=ray,
                     agent=agent, **r)
            if not (got["fixed"]["failed"] or got["pollux"]["failed"]):
                ratios.append(got["fixed"]["avg_jct_s"] / got["pollux"]["avg_jct_s"])
    if ratios:
        emit(bench="pollux", case="jobs avg_jct fixed / pollux", metric="avg_jct_ratio",
             unit="fixed equal split / pollux (> 1 = pollux sooner)", ours=statistics.median(ratios),
             spread={"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}, pairs=len(ratios),
             summary=True, experiment="jobs", slots=slots, interval=interval, delay=delay, clocks=clocks, ray=ray,
             agent=agent)
