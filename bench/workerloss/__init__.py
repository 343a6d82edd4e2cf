"""A lost worker is replaced (docs/recovery.md): how much the objective loses, measured.

Issue 30 asks that after a worker SIGKILL in a checkpointed job "the job finishes, and its objective
reaches the failure-free run's final value within 2 extra clocks (MF, LDA)". ``measure`` runs the
job twice through ``bosen launch``: failure-free for E clocks (the target: its objective at the last
clock), and with one worker SIGKILLed once it has
reported clock ``at``, run for E + ``extra`` clocks so it can catch up. The launcher replaces
the worker from the newest complete checkpoint; the *extra clocks* are the clock (interpolated,
``bench.recovery.runs.clocks_to``) at which the failure run first reaches the target, minus E (negative:
sooner), of the median curves of ``repeats`` runs each.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import yaml

from bench.common import REPO
from bench.recovery.runs import clocks_to, curve
from bosen.jobs.job import read_metrics


@dataclass(frozen=True)
class Job:
    """One app's job for the measurement: its config, its pass count argument, its objective's sense."""

    name: str
    config: str  # under configs/
    epochs_arg: str
    maximize: bool
    args: tuple[tuple[str, Any], ...] = ()
    tables: tuple[tuple[str, int], ...] = ()  # (table, rows) overrides that shrink the model


JOBS: dict[str, Job] = {
    "mf": Job("mf", "mf.yaml", "epochs", False, args=(("nnz", 100000),), tables=(("L", 4000), ("R", 1000))),
    "lda": Job("lda", "lda.yaml", "iterations", True, args=(("synth_docs", 1000),)),
}


def write_job(job: Job, path: Path, epochs: int, every: int) -> Path:
    """``job``'s config with ``epochs`` passes and a checkpoint every ``every`` clocks."""
    c = yaml.safe_load((REPO / "configs" / job.config).read_text())
    c["app"]["args"].update(dict(job.args))
    c["app"]["args"][job.epochs_arg] = epochs
    for name, rows in job.tables:
        c["tables"][name]["rows"] = rows
    c["checkpoint"] = {"every_clocks": every, "keep": 2, "dir": "checkpoints"}
    path.write_text(yaml.safe_dump(c, sort_keys=False))
    return path


def _launcher(cfg: Path, run_dir: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "bosen", "launch", str(cfg), "--run-dir", str(run_dir), "--no-plot"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _finish(p: subprocess.Popen[str], timeout: float) -> str:
    try:
        out, _ = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    if p.returncode != 0:
        raise RuntimeError(f"bosen launch failed ({p.returncode}):\n{out[-4000:]}")
    return out


def run(cfg: Path, run_dir: Path, timeout: float = 300.0) -> tuple[np.ndarray, str]:
    """A failure-free job: its objective per clock and what the launcher printed."""
    out = _finish(_launcher(cfg, run_dir), timeout)
    return curve([r for r in read_metrics(run_dir) if r["kind"] == "clock"]), out


def worker_process(launcher_pid: int, rank: int) -> psutil.Process:
    """The (original) worker process of ``rank`` under the launcher."""
    for c in psutil.Process(launcher_pid).children(recursive=True):
        try:
            env = c.environ()
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            continue
        if env.get("BOSEN_RANK") == str(rank) and "BOSEN_REJOIN" not in env and "BOSEN_CONFIG" in env:
            return c
    raise RuntimeError(f"no worker of rank {rank} under the launcher (pid {launcher_pid})")


def _reported(run_dir: Path, rank: int) -> int:
    """The newest clock worker ``rank`` has reported (-1: none)."""
    path = run_dir / "workers" / f"{rank}.jsonl"
    last = -1
    if path.exists():
        for line in path.read_text().splitlines():
            if line.endswith("}") and '"clock": ' in line:
                last = max(last, int(line.split('"clock": ')[1].split(",")[0].rstrip("}")))
    return last


def run_with_kill(cfg: Path, run_dir: Path, *, rank: int, at: int, timeout: float = 300.0
                  ) -> tuple[np.ndarray, str, float, int]:
    """The job with worker ``rank`` SIGKILLed once it has reported clock ``at``: its objective per
    clock, what the launcher printed, when (seconds into the job) the kill came, and the newest
    clock the worker had reported then (the clocks it redoes run from the checkpoint before)."""
    t0 = time.monotonic()
    p = _launcher(cfg, run_dir)
    try:
        while True:
            if p.poll() is not None:
                raise RuntimeError(f"the job ended before the kill:\n{p.stdout.read() if p.stdout else ''}")
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"worker {rank} did not reach clock {at} within {timeout:g}s")
            if _reported(run_dir, rank) >= at:
                break
            time.sleep(0.005)
        worker_process(p.pid, rank).send_signal(signal.SIGKILL)
        killed_at = time.monotonic() - t0
        last = _reported(run_dir, rank)
    except BaseException:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        raise
    out = _finish(p, timeout)
    return curve([r for r in read_metrics(run_dir) if r["kind"] == "clock"]), out, killed_at, last


def finals(run_dir: Path) -> dict[str, Any]:
    """What a run ends with beyond its curve: LDA's exact final log-likelihood (``final_loglik``,
    negative counts read as 0), and the negative word-topic counts its rank 0 found in the final table."""
    out: dict[str, Any] = {}
    for r in read_metrics(run_dir):
        if r["kind"] == "clock" and "final_loglik" in r:
            out["final_loglik"] = float(r["final_loglik"])
    for log in sorted((run_dir / "logs").glob("worker-0*.log")):
        m = re.search(r"lda: (\d+) negative word-topic counts", log.read_text(errors="replace"))
        if m:
            out["negative_counts"] = int(m.group(1))
    return out


def extra_clocks(base: np.ndarray, other: np.ndarray, maximize: bool) -> float:
    """Clocks ``other`` needs beyond ``base``'s to reach ``base``'s final objective (interpolated;
    negative: it gets there sooner; inf: never within its clocks)."""
    target = float(base[-1])
    return clocks_to(other, target, 0, maximize) - (base.shape[0] - 1)


def _median_curve(curves: list[np.ndarray], n: int) -> np.ndarray:
    return np.median(np.stack([c[:n] for c in curves]), axis=0)


def measure(job: Job, workdir: Path, *, epochs: int, every: int, at: int, rank: int = 1, extra: int = 2,
            repeats: int = 3) -> dict[str, Any]:
    """``repeats`` failure-free jobs and as many with a worker SIGKILL (``run_with_kill``), alternated.
    Runs of one SSP job differ (each settles at its own level), so the target is the median
    failure-free curve's final value, and the extra clocks are those of the median failure curve;
    the noise is each failure-free run's own extra clocks against that target."""
    base_cfg = write_job(job, workdir / f"{job.name}-base.yaml", epochs, every)
    long_cfg = write_job(job, workdir / f"{job.name}-long.yaml", epochs + extra, every)
    bases: list[np.ndarray] = []
    kills: list[np.ndarray] = []
    kills_info: list[dict[str, Any]] = []
    base_info: list[dict[str, Any]] = []
    for i in range(repeats):
        bases.append(run(base_cfg, workdir / f"{job.name}-base-{i}")[0])
        base_info.append(finals(workdir / f"{job.name}-base-{i}"))
        killed, out, killed_at, last = run_with_kill(long_cfg, workdir / f"{job.name}-kill-{i}", rank=rank, at=at)
        kills.append(killed)
        line = next((x for x in out.splitlines() if "replacing it from" in x), "")
        kills_info.append({"killed_at_s": killed_at, "reported": last, "replaced": line.strip(),
                           **finals(workdir / f"{job.name}-kill-{i}")})
    base = _median_curve(bases, epochs)
    killed = _median_curve(kills, epochs + extra)
    return {
        "app": job.name, "epochs": epochs, "every": every, "killed_rank": rank, "kill_at": at, "repeats": repeats,
        "target": float(base[-1]), "extra_clocks": extra_clocks(base, killed, job.maximize),
        "noise_extra_clocks": [extra_clocks(base, b, job.maximize) for b in bases],
        "kill_extra_clocks": [extra_clocks(base, k, job.maximize) for k in kills],
        "base_finals": [float(b[epochs - 1]) for b in bases], "kill_finals": [float(k[epochs - 1]) for k in kills],
        "bases": base_info, "kills": kills_info, "base_curve": base.tolist(), "killed_curve": killed.tolist(),
    }
