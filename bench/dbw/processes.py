"""``python -m bench.dbw --processes``: DBW's experiments as real jobs (docs/design.md, "Backup workers").

Each job is one ``bosen-server`` and n MLR worker processes (``bosen.apps.mlr``, digits, a 10 x 65
float64 table with ``backup``) over loopback, forked from one zygote; the round trips of the delay
model are slept (``bosen.apps.delays``, ``--unit-s`` seconds per time unit). The workers are forked
one after another, so their first round trips wait at a start barrier (``delay.start_file``) that
the bench opens once the server counts all n: the time to target is from there. Rank 0 evaluates the
training loss of every iteration's value; the job is stopped as soon as it reaches the target, or
after ``--cap`` time units without (then its time is ``null``: not reached), so a job costs its own
time to target. Before the stop the server's STATUS gives the k_t history.

Jobs run seed-major (for seed: for alpha: for method; the slowdown job of a seed first), one JSON
line each as it ends (``job: true``), so a run cut short still has every method at the same seeds;
the summary at the end uses, per alpha, only the seeds every method finished. ``--from FILE`` takes
the job lines of an earlier run: those jobs are not run again and count in the summary.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import emit, log
from bosen.config import BackupConfig
from bosen.jobs.cluster import start_cluster
from bosen.jobs.job import job_config
from bosen.jobs.status import query
from bosen.jobs.supervise import ProcessGroup
from bosen.jobs.zygote import PRELOAD, Zygote

POLL_S = 0.05  # how often rank 0's records are read
START_S = 60.0  # a job's processes up to rank 0's first report, on a loaded machine
ENV = {"PYTHONUNBUFFERED": "1", "BOSEN_CONFIG": None, "BOSEN_RANK": None, "BOSEN_T0": None}
TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Job:
    """One job of the run: ``alpha`` (time to target of ``method``) or ``slowdown`` (dynamic, Fig. 9)."""

    experiment: str
    seed: int
    alpha: float
    method: str

    @property
    def key(self) -> tuple[str, int, float, str]:
        return (self.experiment, self.seed, self.alpha, self.method)


def plan(a: argparse.Namespace, methods: list[tuple[str, BackupConfig]]) -> list[Job]:
    """Every job, seed-major: a partial run has whole seeds (and the rest of one)."""
    out = []
    for seed in range(a.seeds):
        if "slowdown" in a.experiments and seed < a.slow_seeds:
            out.append(Job("slowdown", seed, 0.0, "dynamic"))
        if "alpha" in a.experiments:
            out += [Job("alpha", seed, alpha, name) for alpha in a.alphas for name, _ in methods]
    return out


def _cpu_s(pid: int) -> float:
    """User + system seconds of a live process (``/proc/PID/stat``); 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


class _Tail:
    """The records a worker has written so far to its JSONL file (complete lines only)."""

    def __init__(self, path: Path) -> None:
        self.path, self.pos, self.part = path, 0, ""

    def __iter__(self) -> Iterator[dict[str, Any]]:
        try:
            with self.path.open() as f:
                f.seek(self.pos)
                chunk = f.read()
                self.pos = f.tell()
        except FileNotFoundError:
            return
        lines = (self.part + chunk).split("\n")
        self.part = lines.pop()
        for line in lines:
            if line.strip():
                yield json.loads(line)


def run_job(job: Job, cfg: BackupConfig, a: argparse.Namespace, zygote: Zygote, tmp: Path) -> dict[str, Any]:
    """Run one job until its stop rule; the fields of its JSON line."""
    slow = job.experiment == "slowdown"
    bk: dict[str, Any] = {"mode": cfg.mode, "lr": a.lr, "window": a.window, "memory": a.memory}
    if cfg.k is not None:
        bk["k"] = cfg.k
    stop_at = a.slow_from + 40 if slow else a.iterations  # rank 0's iteration that ends the job
    start_file = tmp / "start"  # the barrier every worker's first round trip waits for (bosen.apps.delays)
    delay: dict[str, Any] = {"mean_s": a.unit_s, "alpha": job.alpha, "seed": job.seed, "start_file": str(start_file)}
    if slow:
        delay["slow_from"] = a.slow_from
    app = {"module": "bosen.apps.mlr", "args": {
        "data": "digits", "holdout": 0.0, "batch_size": a.batch, "epochs": stop_at + 1, "reg": 0.0,
        "eval_every": 0 if slow else 1, "seed": job.seed, "delay": delay}}
    tables = {"W": {"rows": 10, "cols": 65, "dtype": "float64", "init": {"zeros": True}, "backup": bk}}
    run_dir = tmp / "run"
    cap_s = a.cap * a.unit_s if a.unit_s > 0 else math.inf
    t_start, t0 = time.monotonic(), time.time()
    with ProcessGroup(tmp / "logs", env={**ENV, "BOSEN_T0": repr(t0)}, zygote=zygote) as group:
        cfg_data = job_config([], a.workers, tables=tables, app=app)
        cluster = start_cluster(cfg_data, tmp, 1, group=group)
        server_s = time.monotonic() - t_start
        workers = [group.python(f"mlr{r}", "-m", "bosen.apps.mlr", "--config", cluster.path, "--rank", r,
                                env={"BOSEN_RUN_DIR": str(run_dir)}) for r in range(a.workers)]
        while query(cluster.addresses[0], timeout=10.0)["clients_joined"] < a.workers:
            if any(w.returncode not in (None, 0) for w in workers) or time.monotonic() > t_start + START_S:
                raise RuntimeError(f"{job}: not every worker joined; logs in {tmp / 'logs'}")
            time.sleep(POLL_S)
        start_file.touch()  # every worker in: iteration 0's round trips begin now, together
        started = time.monotonic() - t_start
        origin = time.time() - t0  # the barrier, on the workers' clock (BOSEN_T0)
        cpu0 = sum(_cpu_s(p.pid) for p in [*cluster.servers, *workers])
        tail = _Tail(run_dir / "workers" / "0.jsonl")
        first: float | None = None
        reached: float | None = None
        last: dict[str, Any] = {}
        deadline = t_start + START_S
        done = False
        while True:
            finished = all(w.returncode == 0 for w in workers)  # every iteration run: its records are all in
            for rec in tail:
                last = rec
                if first is None:
                    first = float(rec["time"])
                    deadline = time.monotonic() + min(cap_s, 1e6) + START_S
                since = float(rec["time"]) - origin
                if not slow and rec.get("train_loss", math.inf) <= a.target:
                    reached, done = since, True
                    break
                if (not slow and since > cap_s) or rec["iteration"] >= stop_at:
                    done = True
                    break
            if done or finished:
                break
            failed = [w for w in workers if w.returncode not in (None, 0)]
            if failed:
                raise RuntimeError(f"{job}: worker {failed[0].name} exited {failed[0].returncode}:\n{failed[0].tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{job}: rank 0 stalled (last record {last}); logs in {tmp / 'logs'}")
            time.sleep(POLL_S)
        run_s = time.monotonic() - t_start
        cpu = sum(_cpu_s(p.pid) for p in [*cluster.servers, *workers])
        status = query(cluster.addresses[0], timeout=10.0)["tables"]["W"]["backup"]
        cluster.terminate()
        cluster.stop(check=True)
    k = [int(x) for x in status["k_history"]]
    out: dict[str, Any] = {
        "experiment": job.experiment, "seed": job.seed, "alpha": job.alpha, "method": job.method,
        "time_to_target": reached, "iterations": int(last.get("iteration", -1)) + 1,
        "train_loss": last.get("train_loss"), "mean_k": statistics.mean(k) if k else None,
        "dropped_late": status.get("dropped_late"), "run_s": run_s, "server_s": server_s, "start_s": started,
        "cpu_s": cpu, "cpu_cores": cpu / run_s, "cpu_cores_training": (cpu - cpu0) / (run_s - started),
        "training_s": float(last["time"]) - origin if first is not None else None, "loadavg": list(os.getloadavg())}
    if slow:
        out.update(slowdown_stats(k, a.slow_from, a.workers // 2), k=k)
    return out


def slowdown_stats(k: list[int], slow_from: int, half: int) -> dict[str, float]:
    """Fig. 9's two figures from a k_t history: iterations after ``slow_from`` until k_t stays at or
    below ``half`` for 10 iterations (inf: never), k_t's mean 20-40 iterations after, and before."""
    first = next((t for t in range(slow_from, len(k) - 9) if max(k[t:t + 10]) <= half), None)
    return {"iterations_to_half": math.inf if first is None else first - slow_from,
            "k_after": float(statistics.mean(k[slow_from + 20:slow_from + 40])),
            "k_before": float(statistics.mean(k[max(0, slow_from - 10):slow_from]))}


def load(paths: list[str]) -> dict[tuple[str, int, float, str], dict[str, Any]]:
    """The job lines of earlier runs (JSONL; other lines skipped), by job."""
    out = {}
    for p in paths:
        for line in Path(p).read_text().splitlines():
            if line.startswith("{"):
                rec = json.loads(line)
                if rec.get("job"):
                    out[Job(rec["experiment"], rec["seed"], float(rec["alpha"]), rec["method"]).key] = rec
    return out


SETTINGS = ("workers", "unit_s", "lr", "batch", "target", "cap")  # what a job line of --from must share


def check_same(done: dict[tuple[str, int, float, str], dict[str, Any]], a: argparse.Namespace) -> None:
    """Refuse earlier job lines run with other settings than this run's: they would not compare."""
    for key, rec in done.items():
        for name in SETTINGS:
            if not math.isclose(float(rec[name]), float(getattr(a, name)), rel_tol=1e-4):
                raise ValueError(f"--from: the job {key} ran with {name} = {rec[name]}, this run has "
                                 f"{getattr(a, name)}")


def run(a: argparse.Namespace, methods: list[tuple[str, BackupConfig]]) -> list[dict[str, Any]]:
    """Every planned job not in ``--from``, one line each as it ends; all job lines, old and new."""
    done = load(a.from_files or [])
    check_same(done, a)
    cfgs = dict(methods)
    cfgs["dynamic"] = BackupConfig(mode="dynamic")
    todo = [j for j in plan(a, methods) if j.key not in done]
    log(f"bench.dbw --processes: {len(todo)} jobs to run, {len(done)} from --from")
    lock = threading.Lock()
    # a background run (SIGINT ignored) or one stopped with SIGTERM: the running jobs' processes stopped
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.default_int_handler)

    def one(i: int, job: Job, root: Path, zygote: Zygote) -> None:
        rec = run_job(job, cfgs[job.method], a, zygote, root / f"job{i}")
        with lock:
            done[job.key] = emit(bench="dbw", job=True, clock="wall", workers=a.workers, unit_s=a.unit_s, lr=a.lr,
                                 batch=a.batch, target=a.target, cap=a.cap, parallel=a.parallel, **rec)

    with tempfile.TemporaryDirectory(prefix="dbw-") as root, \
            Zygote(Path(root) / "zygote.log", (*PRELOAD, "bench.dbw.warm")) as zygote, \
            ThreadPoolExecutor(a.parallel) as pool:
        futures = [pool.submit(one, i, job, Path(root), zygote) for i, job in enumerate(todo)]
        try:
            for f in futures:
                f.result()
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return list(done.values())
