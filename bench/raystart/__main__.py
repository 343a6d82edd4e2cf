"""What ``bosen launch --ray`` costs at start-up: the same small job launched plainly, on a local Ray
started for the job (``--ray``), and on a Ray cluster already running (``--ray ADDRESS``: a one-node
``ray.cluster_utils.Cluster`` started here, as ``ray start --head`` would), in alternated rounds.

``python -m bench.raystart [--rounds 7] [--config configs/mf.yaml]``: one result line per Ray mode,
the wall time of the whole ``bosen launch`` command (what a user waits for), median and min-max,
beside the plain launch's (``ratio`` = plain / ours, per the bench convention; ``over_plain_s``: the
per-round difference, median and min-max) and the load average over the runs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import emit, log, median, spread

# a small MF job: 2 servers, 2 workers, 2 clocks over 50,000 ratings, no checkpoints
SMALL = ["--set", "app.args.nnz=50000", "--set", "app.args.epochs=2", "--set", "checkpoint=null"]


def run(config: str, run_dir: Path, ray: list[str]) -> float:
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "bosen", "launch", config, *SMALL, "--run-dir", str(run_dir),
                        "--quiet", "--no-plot", *ray], capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"bosen launch {' '.join(ray)} failed:\n{r.stdout}\n{r.stderr}")
    return wall


def main() -> None:
    p = argparse.ArgumentParser(description="start-up cost of bosen launch --ray")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--config", default="configs/mf.yaml")
    args = p.parse_args()
    try:
        from ray.cluster_utils import Cluster
    except ImportError:
        raise SystemExit("bench.raystart needs Ray: pip install -e '.[ray]'") from None

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 8, "include_dashboard": False})
    loads = [os.getloadavg()[0]]
    modes = {"plain": [], "ray-local": ["--ray"], "ray-address": ["--ray", cluster.address]}
    walls: dict[str, list[float]] = {m: [] for m in modes}
    try:
        with tempfile.TemporaryDirectory(prefix="raystart-") as tmp:
            for i in range(args.rounds):
                for mode in list(modes) if i % 2 == 0 else list(reversed(modes)):
                    walls[mode].append(run(args.config, Path(tmp) / f"{mode}-{i}", modes[mode]))
                    loads.append(os.getloadavg()[0])
                log(f"round {i}: " + ", ".join(f"{m} {w[-1]:.2f}s" for m, w in walls.items()))
    finally:
        cluster.shutdown()
    plain = walls["plain"]
    for mode in ("ray-local", "ray-address"):
        w = walls[mode]
        over = [a - b for a, b in zip(w, plain, strict=True)]
        emit(bench="raystart", case=mode, metric="launch_wall_s", unit="s", ours=median(w), ours_spread=spread(w),
             baseline=median(plain), baseline_spread=spread(plain), baseline_name="plain bosen launch",
             ratio=median(plain) / median(w), over_plain_s=spread(over),
             load_1min={"min": min(loads), "max": max(loads)})


if __name__ == "__main__":
    main()
