"""``python -m bench.elastic.scale [--steps 6] [--quick]``: how long ``bosen scale`` takes, from the
command to the job running with M workers, on an LDA job launched by ``bosen launch`` (8 micro-tasks,
managed communication, checkpoints), scaled 2 -> 3 and back, alternately.

Per direction one result line: the median step time and its min-max over the steps (``bosen.scale``'s
own measure: the request, a new worker process started and its data loaded, the agreed boundary, the
joiner joined, the tasks' hand-off, until every new worker passed the boundary or every leaving one
exited), the job's *stall* at the boundary (what the running workers lost: the four clocks around
the boundary took this much longer than four clocks before it, from ``metrics.jsonl``), and the load
average. ``--docs`` makes the corpus (and so a new worker's start) larger.
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

import bosen
from bench.common import emit, log, median, repo_env, spread


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=6, help="scale steps (out and in alternately)")
    p.add_argument("--quick", action="store_true", help="2 steps (CI)")
    p.add_argument("--docs", type=int, default=600, help="synthetic documents of 20 tokens")
    a = p.parse_args()
    steps = 2 if a.quick else a.steps
    cfg = {"cluster": {"servers": ["127.0.0.1:0", "127.0.0.1:0"], "workers": 2},
           "consistency": {"staleness": 1}, "comm": {"enabled": True},
           "checkpoint": {"every_clocks": 10, "keep": 2},
           "tables": {"word_topic": {"rows": 150, "cols": 5, "dtype": "int32"},
                      "topic_summary": {"rows": 1, "cols": 5, "dtype": "int32"}},
           "app": {"module": "bosen.apps.lda",
                   "args": {"data": "synthetic", "K": 5, "synth_docs": a.docs, "synth_vocab": 150,
                            "synth_doc_len": 20.0, "iterations": 1_000_000, "micro_tasks": 8, "seed": 2}}}
    loads = [os.getloadavg()[0]]
    out: dict[str, list[float]] = {"out": [], "in": []}
    boundaries: dict[str, list[int]] = {"out": [], "in": []}
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as d:
        path, run = Path(d) / "job.yaml", Path(d) / "run"
        path.write_text(json.dumps(cfg))
        job = subprocess.Popen([sys.executable, "-m", "bosen", "launch", str(path), "--run-dir", str(run),
                                "--no-plot", "--quiet"], env={**os.environ, **repo_env()}, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
            for k in range(steps):
                m, way = (3, "out") if k % 2 == 0 else (2, "in")
                lines: list[str] = []
                s = bosen.scale(run, workers=m, out=lines.append)
                out[way].append(s)
                boundaries[way] += [int(b) for x in lines for b in re.findall(r"micro-tasks move at clock (\d+)", x)]
                loads.append(os.getloadavg()[0])
                log(f"step {k}: {'2 -> 3' if way == 'out' else '3 -> 2'} in {s:.3f}s")
                time.sleep(1.0 + 0.1 * steps)  # clocks after the boundary, before the next step
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGTERM)
                try:
                    job.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(job.pid, signal.SIGKILL)
                    job.wait()
        times = clock_times(run)
    for way, xs in out.items():
        if xs:
            stalls = [stall(times, b) for b in boundaries[way]]
            stalls = [x for x in stalls if x is not None]
            emit(bench="elastic", case=f"scale-{way}-{'2-3' if way == 'out' else '3-2'}-lda", metric="scale_step_s",
                 unit="s", ours=median(xs), spread=spread(xs), steps=len(xs),
                 stall_s=median(stalls) if stalls else None, stall_spread=spread(stalls) if stalls else None,
                 docs=a.docs, load_avg=spread(loads))


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


if __name__ == "__main__":
    main()
