"""``python -m bench.elastic.scale [--steps 6] [--quick] [--ray] [--rounds 3]``: how long ``bosen scale``
takes, from the command to the job running with the new shape, on an LDA job launched by ``bosen launch``
(8 micro-tasks, managed communication, checkpoints), scaled 2 -> 3 workers and back, alternately.

Per direction one result line: the median step time and its min-max over the steps (``bosen.scale``'s
own measure: the request, a new worker process started and its data loaded, the agreed boundary, the
joiner joined, the tasks' hand-off, until every new worker passed the boundary or every leaving one
exited), the job's *stall* at the boundary (what the running workers lost: the four clocks around
the boundary took this much longer than four clocks before it, from ``metrics.jsonl``), and the load
average. ``--docs`` makes the corpus (and so a new worker's start) larger.

``--ray``: the same steps on a job launched with ``bosen launch --ray ADDRESS`` against a Ray cluster
started here (one ``ray.cluster_utils.Cluster`` node, as ``ray start --head`` would), beside the plain
launch's, in ``--rounds`` alternated rounds (one job per mode and round, plain first in even rounds);
each job does workers 2 -> 3 -> 2, then servers 2 -> 3 -> 2. One result line per step kind: the Ray
job's median and min-max, the plain job's as the baseline, and their ratio (plain / Ray); beside
them each mode's time inside the launcher (``in_launcher_s``: from taking the request to the step's
last line; the rest is the launcher's watch loop taking the request, which pruning old checkpoints
can hold up for a second or two).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import bosen
from bench.common import emit, log, median, repo_env, spread

CONFIG: dict[str, Any] = {
    "cluster": {"servers": ["127.0.0.1:0", "127.0.0.1:0"], "workers": 2},
    "consistency": {"staleness": 1}, "comm": {"enabled": True},
    "checkpoint": {"every_clocks": 10, "keep": 2},
    "tables": {"word_topic": {"rows": 150, "cols": 5, "dtype": "int32"},
               "topic_summary": {"rows": 1, "cols": 5, "dtype": "int32"}},
    "app": {"module": "bosen.apps.lda",
            "args": {"data": "synthetic", "K": 5, "synth_docs": 600, "synth_vocab": 150,
                     "synth_doc_len": 20.0, "iterations": 1_000_000, "micro_tasks": 8, "seed": 2}},
}
RAY_STEPS = [("workers-out-2-3", {"workers": 3}), ("workers-in-3-2", {"workers": 2}),
             ("servers-out-2-3", {"servers": 3}), ("servers-in-3-2", {"servers": 2})]


def job_steps(folder: Path, steps: list[tuple[str, dict[str, int]]], launch_args: list[str],
              loads: list[float], inside: dict[str, list[float]] | None = None, config: dict[str, Any] = CONFIG,
              boundaries: dict[str, int] | None = None, pause: float = 1.0) -> dict[str, float]:
    """Launch the job in ``folder``, wait until it runs, do ``steps`` (``bosen.scale`` keywords) with
    ``pause`` seconds between them, stop it; each step's seconds by its name (the command's), in
    ``inside`` the launcher's own (its last progress line's time since it took the request: without the
    wait for the launcher's loop to take the request and the progress question), and in ``boundaries``
    the clock each workers step moved its micro-tasks at."""
    path, run = folder / "job.yaml", folder / "run"
    folder.mkdir(parents=True)
    path.write_text(json.dumps(config))
    job = subprocess.Popen([sys.executable, "-m", "bosen", "launch", str(path), "--run-dir", str(run),
                            "--no-plot", "--quiet", *launch_args], env={**os.environ, **repo_env()},
                           start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    took: dict[str, float] = {}
    try:
        while True:  # worker 0 past its start
            try:
                lines = (run / "workers" / "0.jsonl").read_text().splitlines()
                if lines and json.loads(lines[-1]).get("clock", 0) >= 5:
                    break
            except (OSError, ValueError):
                pass
            if job.poll() is not None:
                raise SystemExit(f"the job ended (status {job.returncode}); logs in {run / 'logs'}")
            time.sleep(0.05)
        for name, kw in steps:
            lines: list[str] = []
            took[name] = bosen.scale(run, out=lines.append, **kw)
            if inside is not None:
                inside.setdefault(name, []).append(float(lines[-1].split("s ", 1)[0]))
            if boundaries is not None:
                moved = [int(b) for x in lines for b in re.findall(r"micro-tasks move at clock (\d+)", x)]
                if moved:
                    boundaries[name] = moved[-1]
            loads.append(os.getloadavg()[0])
            time.sleep(pause)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGTERM)
            try:
                job.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
    return took


def plain(steps: int, docs: int) -> None:
    loads = [os.getloadavg()[0]]
    out: dict[str, list[float]] = {"out": [], "in": []}
    stalls: dict[str, list[float]] = {"out": [], "in": []}
    plan = [(f"{k}", {"workers": 3 if k % 2 == 0 else 2}) for k in range(steps)]
    config = json.loads(json.dumps(CONFIG))
    config["app"]["args"]["synth_docs"] = docs
    moved: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as d:
        # clocks after each boundary before the next step: the stall needs a few on both sides
        took = job_steps(Path(d) / "job", plan, [], loads, config=config, boundaries=moved, pause=1.0 + 0.1 * steps)
        times = clock_times(Path(d) / "job" / "run")
    for k, (name, _) in enumerate(plan):
        way = "out" if k % 2 == 0 else "in"
        out[way].append(took[name])
        st = stall(times, moved[name]) if name in moved else None
        if st is not None:
            stalls[way].append(st)
        log(f"step {k}: {'2 -> 3' if way == 'out' else '3 -> 2'} in {took[name]:.3f}s, stall {st}")
    for way, xs in out.items():
        if xs:
            emit(bench="elastic", case=f"scale-{way}-{'2-3' if way == 'out' else '3-2'}-lda", metric="scale_step_s",
                 unit="s", ours=median(xs), spread=spread(xs), steps=len(xs),
                 stall_s=median(stalls[way]) if stalls[way] else None,
                 stall_spread=spread(stalls[way]) if stalls[way] else None, docs=docs, load_avg=spread(loads))


def clock_times(run: Path) -> dict[int, float]:
    """Each clock's record time (seconds since the job's start) in the run's ``metrics.jsonl``."""
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {r["clock"]: float(r["time"]) for r in recs if r.get("kind") == "clock" and "time" in r}


def stall(times: dict[int, float], b: int, around: int = 2, before: int = 20) -> float | None:
    """How much longer the ``2 * around`` clocks around boundary ``b`` took than as many clocks of the
    ``before`` ones preceding them (median); None where the records do not reach that far."""
    lo, hi = b - around, b + around
    gaps = [times[c + 1] - times[c] for c in range(lo - before, lo) if c in times and c + 1 in times]
    if lo not in times or hi not in times or len(gaps) < before // 2:
        return None
    return round(times[hi] - times[lo] - (hi - lo) * median(gaps), 3)


def on_ray(rounds: int) -> None:
    try:
        from ray.cluster_utils import Cluster
    except ImportError:
        raise SystemExit("--ray needs Ray: pip install -e '.[ray]'") from None
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 8, "include_dashboard": False})
    loads = [os.getloadavg()[0]]
    modes = {"plain": [], "ray": ["--ray", cluster.address]}
    took: dict[str, dict[str, list[float]]] = {m: {s: [] for s, _ in RAY_STEPS} for m in modes}
    inside: dict[str, dict[str, list[float]]] = {m: {} for m in modes}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-scale-ray-") as d:
            for i in range(rounds):
                for mode in list(modes) if i % 2 == 0 else list(reversed(modes)):
                    for name, s in job_steps(Path(d) / f"{mode}-{i}", RAY_STEPS, modes[mode], loads,
                                             inside[mode]).items():
                        took[mode][name].append(s)
                log(f"round {i}: " + "; ".join(f"{m} " + ", ".join(f"{s} {v[-1]:.2f}s" for s, v in t.items())
                                               for m, t in took.items()))
    finally:
        cluster.shutdown()
    for name, _ in RAY_STEPS:
        ours, base = took["ray"][name], took["plain"][name]
        emit(bench="elastic", case=f"scale-{name}-lda-ray", metric="scale_step_s", unit="s", ours=median(ours),
             ours_spread=spread(ours), baseline=median(base), baseline_spread=spread(base),
             baseline_name="the same step on a plain bosen launch", ratio=median(base) / median(ours),
             over_plain_s=spread([a - b for a, b in zip(ours, base, strict=True)]),
             in_launcher_s=spread(inside["ray"][name]), baseline_in_launcher_s=spread(inside["plain"][name]),
             rounds=rounds, load_avg=spread(loads))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=6, help="scale steps (out and in alternately)")
    p.add_argument("--quick", action="store_true", help="2 steps (CI); with --ray, 1 round")
    p.add_argument("--ray", action="store_true", help="the steps on a job launched with --ray, beside the plain one")
    p.add_argument("--rounds", type=int, default=3, help="with --ray: alternated rounds (one job per mode each)")
    p.add_argument("--docs", type=int, default=600, help="synthetic documents of 20 tokens (without --ray)")
    a = p.parse_args()
    if a.ray:
        on_ray(1 if a.quick else a.rounds)
    else:
        plain(2 if a.quick else a.steps, a.docs)


if __name__ == "__main__":
    main()
