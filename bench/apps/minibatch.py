"""What mini-batches cost a worker: one mini-batch per clock against eight, per worker-thread CPU.

Managed communication pays only if workers read the cache and add to the update buffer many times a
clock (docs/design.md, "Apps on the live cache"), so the client's cost per mini-batch must be small
beside the kernel's: issue 28 asks that one mini-batch per clock run at >= 0.9 of eight's speed per
worker CPU (``cpu(b = 1) / cpu(b = 8)`` per clock, same work).

Each measurement is a fresh process: the servers as real processes on free ports, one worker
in-process (``Client.connect``, the app's ``train``) with a P = 8 worker's share of the data, and the
worker thread's CPU time (``time.thread_time``) between consecutive clock reports, the first three
clocks left out; the median per clock. Rounds alternate the order of b = 8 and b = 1; the record
gives the median ratio over rounds and its spread. The shares (issue 16's): MF 62,500 ratings of
2,500 x 5,000 at rank 16; MLR 3,906 samples of 1,000 features, 10 classes; LDA 1,000 documents of
100 tokens, V = 2,000, K = 20.

    python -m bench.apps.minibatch [--quick] [--rounds N] [--only mf,mlr,lda]
    python -m bench.apps.minibatch --one APP B CLOCKS      (one measurement, one JSON line)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.common import REPO, emit, log, repo_env

APPS = ("mf", "mlr", "lda")
GOAL = 0.9


def _setup(app: str, b: int, clocks: int) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(app module, tables, app args) of a P = 8 worker's share."""
    if app == "mf":
        return "bosen.apps.mf", {
            "L": {"rows": 2500, "cols": 16, "dtype": "float32", "init": {"normal": 0.1, "seed": 1}},
            "R": {"rows": 5000, "cols": 16, "dtype": "float32", "init": {"normal": 0.1, "seed": 2}}}, {
            "n_users": 2500, "n_items": 5000, "rank": 16, "nnz": 62500, "epochs": clocks,
            "batches_per_clock": b, "eval_every": 0, "lr": 0.005, "lr_decay": 1.0}
    if app == "mlr":
        return "bosen.apps.mlr", {"W": {"rows": 10, "cols": 1001, "dtype": "float32", "init": "zeros"}}, {
            "data": "synthetic", "synthetic": {"n": 3906}, "epochs": clocks, "batches_per_clock": b,
            "eval_every": 0}
    if app == "lda":
        return "bosen.apps.lda", {"word_topic": {"rows": 2000, "cols": 20, "dtype": "int32"},
                                  "topic_summary": {"rows": 1, "cols": 20, "dtype": "int32"}}, {
            "K": 20, "iterations": clocks, "batches_per_clock": b, "synth_docs": 1000, "synth_vocab": 2000,
            "synth_topics": 20, "synth_doc_len": 100, "synth_beta": 0.05, "ll_every": 10**6,
            "save_model": False}
    raise SystemExit(f"bench.apps.minibatch: unknown app {app!r} (one of {', '.join(APPS)})")


def measure(app: str, b: int, clocks: int) -> dict[str, Any]:
    """One in-process worker of ``app`` with ``b`` mini-batches per clock: its CPU per clock."""
    import importlib

    from bosen.client import Client
    from bosen.jobs.cluster import start_cluster
    from bosen.jobs.job import job_config
    from bosen.jobs.supervise import ProcessGroup

    module, tables, args = _setup(app, b, clocks)
    train = importlib.import_module(module + ".worker").train
    marks: list[tuple[float, float, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="bosen-minibatch-") as tmp:
        cfg = job_config([], 1, tables=tables, staleness=2, read_timeout_s=60, app={"module": module, "args": args})
        with ProcessGroup(os.path.join(tmp, "logs")) as group:
            cluster = start_cluster(cfg, tmp, 1, group=group)
            try:
                client = Client.connect(cluster.path, rank=0)
                report = client.report

                def marked(**fields: Any) -> None:
                    marks.append((time.thread_time(), time.perf_counter(), fields))
                    report(**fields)

                client.report = marked  # type: ignore[method-assign]
                try:
                    train(client, args)
                finally:
                    client.close()
            finally:
                cluster.stop(check=False)
    ticks = [i for i in range(1, len(marks)) if "samples" in marks[i][2] or "tokens" in marks[i][2]][3:]
    if not ticks:
        raise RuntimeError(f"{app}: no clock reports to time ({len(marks)} reports)")
    cpu = [marks[i][0] - marks[i - 1][0] for i in ticks]
    wall = [marks[i][1] - marks[i - 1][1] for i in ticks]
    return {"app": app, "b": b, "clocks": len(cpu), "cpu_ms": 1e3 * statistics.median(cpu),
            "wall_ms": 1e3 * statistics.median(wall)}


def _child(app: str, b: int, clocks: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "bench.apps.minibatch", "--one", app, str(b), str(clocks)],
                         cwd=REPO, env=repo_env(), capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"{app} b={b}: exit {out.returncode}: {out.stderr[-800:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_bench(quick: bool = False, rounds: int = 4, only: tuple[str, ...] = APPS) -> list[dict[str, Any]]:
    clocks = 12 if quick else 40
    rounds = 1 if quick else rounds
    out = []
    for app in only:
        got: dict[int, list[dict[str, Any]]] = {1: [], 8: []}
        loads = []
        for rnd in range(rounds):
            for b in (8, 1) if rnd % 2 == 0 else (1, 8):
                got[b].append(_child(app, b, clocks))
            loads.append(os.getloadavg()[0])
        ratios = [one["cpu_ms"] / eight["cpu_ms"] for one, eight in zip(got[1], got[8], strict=True)]
        ratio = statistics.median(ratios)
        out.append({"bench": "apps", "case": "minibatch", "app": app, "metric": "cpu_b1_over_b8",
                    "unit": "worker CPU per clock, 1 mini-batch / 8 (higher is better)",
                    "ours": round(statistics.median(r["cpu_ms"] for r in got[8]), 3),
                    "baseline": round(statistics.median(r["cpu_ms"] for r in got[1]), 3),
                    "baseline_name": "the same worker with 1 mini-batch per clock (ms of CPU per clock)",
                    "ratio": round(ratio, 3), "ratios": [round(r, 3) for r in ratios],
                    "wall_ms_b8": round(statistics.median(r["wall_ms"] for r in got[8]), 3),
                    "wall_ms_b1": round(statistics.median(r["wall_ms"] for r in got[1]), 3),
                    "clocks_timed": got[8][0]["clocks"], "rounds": rounds, "load_1m": [round(x, 2) for x in loads],
                    "goal": f"one mini-batch per clock >= {GOAL} of eight's speed per worker CPU",
                    "met": bool(ratio >= GOAL)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="few clocks, one round (CI)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--only", default=",".join(APPS))
    ap.add_argument("--one", nargs=3, metavar=("APP", "B", "CLOCKS"), help="one measurement (a child process)")
    a = ap.parse_args()
    if a.one:
        print(json.dumps(measure(a.one[0], int(a.one[1]), int(a.one[2]))), flush=True)
        return
    for app in a.only.split(","):
        if app not in APPS:
            raise SystemExit(f"bench.apps.minibatch: unknown app {app!r} (one of {', '.join(APPS)})")
    for rec in run_bench(a.quick, a.rounds, tuple(a.only.split(","))):
        log(f"minibatch {rec['app']}: b1/b8 {rec['ratio']}")
        emit(**rec)


if __name__ == "__main__":
    main()
