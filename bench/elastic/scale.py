"""``python -m bench.elastic.scale [--steps 6] [--quick] [--ray] [--rounds 3]``: how long ``bosen scale``
takes, from the command to the job running with the new shape, on an LDA job launched by ``bosen launch``
(8 micro-tasks, managed communication, checkpoints), scaled 2 -> 3 workers and back, alternately.

Per direction one result line: the median step time and its min-max over the steps (``bosen.scale``'s
own measure: the request, the agreed boundary, a new worker process started and joined, the tasks'
hand-off, until every new worker passed the boundary or every leaving one exited), and the load average.

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
              loads: list[float], inside: dict[str, list[float]] | None = None) -> dict[str, float]:
    """Launch the job in ``folder``, wait until it runs, do ``steps`` (``bosen.scale`` keywords) with a
    second between them, stop it; each step's seconds by its name (the command's), and in ``inside``
    the launcher's own (its last progress line's time since it took the request: without the wait
    for the launcher's loop to take the request and the progress question)."""
    path, run = folder / "job.yaml", folder / "run"
    folder.mkdir(parents=True)
    path.write_text(json.dumps(CONFIG))
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
            loads.append(os.getloadavg()[0])
            time.sleep(1.0)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGTERM)
            try:
                job.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
    return took


def plain(steps: int) -> None:
    loads = [os.getloadavg()[0]]
    out: dict[str, list[float]] = {"out": [], "in": []}
    plan = [(f"{k}", {"workers": 3 if k % 2 == 0 else 2}) for k in range(steps)]
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as d:
        took = job_steps(Path(d) / "job", plan, [], loads)
    for k, (name, _) in enumerate(plan):
        way = "out" if k % 2 == 0 else "in"
        out[way].append(took[name])
        log(f"step {k}: {'2 -> 3' if way == 'out' else '3 -> 2'} in {took[name]:.3f}s")
    for way, xs in out.items():
        if xs:
            emit(bench="elastic", case=f"scale-{way}-{'2-3' if way == 'out' else '3-2'}-lda", metric="scale_step_s",
                 unit="s", ours=median(xs), spread=spread(xs), steps=len(xs), load_avg=spread(loads))


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
    a = p.parse_args()
    if a.ray:
        on_ray(1 if a.quick else a.rounds)
    else:
        plain(2 if a.quick else a.steps)


if __name__ == "__main__":
    main()
