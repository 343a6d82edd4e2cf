"""Measured step and computation times of the CNN-with-Adam job (hybrid mode, 2 workers: the agent's
``--adaptive-app cnn-adam`` job) at fixed M = 64, 256 and 1024, alternated over rounds: what the
agent's throughput fit should predict (docs/evaluation.md, "The CNN with Adam"). Rank 0's seconds
between consecutive reports (the iterations around an evaluation and the first 5 left out) and its
``compute_s``, the median of each job.

    python -m bench.pollux.stepcost [ROUNDS]
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench.common import REPO
from bench.pollux.adaptive import Plan, config

LARGE = (1, 4, 16)  # M = 64·L


def measure(large: int, seed: int, iterations: int = 60) -> tuple[float, float]:
    """(median step seconds, median computation seconds) of one fixed job at M = 64·``large``."""
    from bosen.jobs.job import run_job, write_config

    p = Plan(mode="fixed-large", iterations=iterations, app="cnn-adam", lr=0.002, large=large, seed=seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_config(Path(tmp) / "job.yaml", config(p))
        job = run_job(path, Path(tmp) / "run", timeout=300, cwd=REPO).check()
    mine = sorted((r for r in job.kind("worker") if r.get("rank") == 0 and "iteration" in r),
                  key=lambda r: r["iteration"])
    step, comp = [], []
    for a, b in zip(mine, mine[1:], strict=False):
        if "heldout_loss" in a or "heldout_loss" in b or a["iteration"] < 5:
            continue
        step.append(float(b["time"]) - float(a["time"]))
        comp.append(float(a["compute_s"]))
    if not step:
        raise RuntimeError(f"bench.pollux.stepcost: no timed iterations at M = {64 * large}")
    return float(np.median(step)), float(np.median(comp))


def main(rounds: int) -> dict[int, list[tuple[float, float]]]:
    out: dict[int, list[tuple[float, float]]] = {}
    for rnd in range(rounds):
        for large in LARGE:
            step, comp = measure(large, rnd)
            out.setdefault(64 * large, []).append((step, comp))
            print(json.dumps({"bench": "pollux", "case": f"stepcost M={64 * large} round={rnd}", "step_s": step,
                              "compute_s": comp}), flush=True)
    return out


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
