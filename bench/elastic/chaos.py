"""``python -m bench.elastic --chaos``: a checkpointed job under random SIGKILLs of its servers and
workers, never two at once, against a failure-free run of the same job.

Issue 30 asks that "during a job of a few minutes with checkpoints, 10 random SIGKILLs hit servers and
workers (never two at once); the job finishes and reaches the failure-free run's final objective
within 2 extra clocks; with servers only killed and integer addition, its tables equal the
failure-free run's exactly". ``measure`` runs the failure-free job for E clocks, then the same job for
E + 2 clocks through ``bosen launch`` while a killer picks a live server or worker at random (each
at most ``MAX_REPLACEMENTS`` times in a row without a newer complete checkpoint: the launcher gives up
after that many) once every process of the
job is up again (each server answers STATUS, each worker rank has a process) and the job has moved
on by ``gap`` clocks since the last kill. The launcher replaces each: a server from its newest
checkpoint part while the others run on (SCAR partial recovery), a worker from the newest complete
checkpoint (its lost updates since then taken back).

Exactness: LDA's word-topic counts are integers added by the workers; after the job, the final table
(``word_topic.npy``) must hold every token exactly once (its sum is the corpus's token count, no
count negative), however many processes died. Runs of an SSP job are not bit-identical even without
failures (reads race with updates), so this, not equality with another run, is the exact check.
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench.recovery.runs import curve
from bench.workerloss import JOBS, _finish, _launcher, _reported, extra_clocks, run, write_job
from bosen import checkpoint
from bosen.config import load
from bosen.errors import BosenError
from bosen.jobs import status as status_mod
from bosen.jobs.job import read_metrics
from bosen.jobs.launch import MAX_REPLACEMENTS


def _processes(launcher_pid: int) -> tuple[dict[int, psutil.Process], dict[int, psutil.Process]]:
    """The job's live servers (by rank) and workers (by rank) under the launcher."""
    servers: dict[int, psutil.Process] = {}
    workers: dict[int, psutil.Process] = {}
    for c in psutil.Process(launcher_pid).children(recursive=True):
        try:
            cmd = c.cmdline()
            if c.status() == psutil.STATUS_ZOMBIE:
                continue
            if "bosen.server" in cmd and "--rank" in cmd:
                servers[int(cmd[cmd.index("--rank") + 1])] = c
                continue
            rank = c.environ().get("BOSEN_RANK")
        except (psutil.AccessDenied, psutil.NoSuchProcess, ValueError, IndexError):
            continue
        if rank is not None and "BOSEN_CONFIG" in c.environ():
            workers[int(rank)] = c
    return servers, workers


SETTLE_S = 1.5  # a process younger than this may still be joining the job


def _all_up(launcher_pid: int, addresses: list[str], workers: int) -> bool:
    """Every process of the job is up and in it: a server per address answering with every worker
    joined (a replacement's clients back), a worker process per rank, none just started."""
    servers, ws = _processes(launcher_pid)
    if len(servers) < len(addresses) or len(ws) < workers:
        return False
    now = time.time()
    try:
        if any(now - p.create_time() < SETTLE_S for p in [*servers.values(), *ws.values()]):
            return False
        for a in addresses:
            st = status_mod.query(a, timeout=0.5)
            if st["clients_joined"] < workers or st.get("awaiting_replacement"):
                return False  # a lost worker's replacement not joined yet: its recovery is still under way
    except (BosenError, psutil.NoSuchProcess):
        return False
    return True


def _progress(run_dir: Path, workers: int) -> int:
    """The clock every worker has reported (a replacement's redo reports nothing new)."""
    return min(_reported(run_dir, r) for r in range(workers))


def run_with_chaos(cfg: Path, run_dir: Path, *, kills: int, gap: int, last: int, seed: int,
                   servers_only: bool = False, timeout: float = 600.0) -> dict[str, Any]:
    """The job under ``kills`` SIGKILLs (random targets, ``gap`` clocks of progress between them, none
    once a worker passed clock ``last``: a worker that left cannot resend to a server replaced after
    it, so what it sent since that server's checkpoint would be lost): its curve, the kills and the
    launcher's output."""
    config = load(cfg)
    addresses = list(config.cluster.servers)
    n_workers = config.cluster.workers
    rng = random.Random(seed)
    killed: dict[str, int] = {}  # per target, kills since the job last made a newer complete checkpoint
    killed_at: dict[str, int] = {}  # per target, the newest complete checkpoint at its last kill
    done: list[dict[str, Any]] = []
    t0 = time.monotonic()
    p = _launcher(cfg, run_dir)
    try:
        mark = -1
        while len(done) < kills:
            if p.poll() is not None or time.monotonic() - t0 > timeout:
                break
            now = _progress(run_dir, n_workers)
            if max(_reported(run_dir, r) for r in range(n_workers)) > last:
                break  # a worker near its end: it may leave before a server killed now is back
            if now < mark + gap or not _all_up(p.pid, _addresses(run_dir, addresses), n_workers):
                time.sleep(0.05)
                continue
            servers, ws = _processes(p.pid)
            targets = [(f"server-{r}", proc) for r, proc in servers.items()]
            if not servers_only:
                targets += [(f"worker-{r}", proc) for r, proc in ws.items()]
            targets = [(n, proc) for n, proc in sorted(targets, key=lambda x: x[0])
                       if killed.get(n, 0) < MAX_REPLACEMENTS or _newest(run_dir) > killed_at.get(n, -1)]
            if not targets:
                break
            name, proc = rng.choice(targets)
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                continue
            newest = _newest(run_dir)
            killed[name] = 1 if newest > killed_at.get(name, -1) else killed.get(name, 0) + 1
            killed_at[name] = newest
            done.append({"target": name, "at_s": round(time.monotonic() - t0, 2), "clock": now})
            mark = now
            time.sleep(0.3)  # the launcher sees the exit before the next check
    except BaseException:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        raise
    out = _finish(p, max(timeout - (time.monotonic() - t0), 60.0))
    return {"curve": curve([r for r in read_metrics(run_dir) if r["kind"] == "clock"]), "kills": done,
            "seconds": time.monotonic() - t0, "output": out}


def _newest(run_dir: Path) -> int:
    """The run's newest complete checkpoint (-1: none yet)."""
    try:
        servers = len(_addresses(run_dir, []))
        return checkpoint.newest_complete(run_dir / "checkpoints", servers, None, None, verify=False)[0]
    except checkpoint.CheckpointError:
        return -1


def _addresses(run_dir: Path, fallback: list[str]) -> list[str]:
    """The servers' addresses as the launcher resolved them (its run directory's config)."""
    path = run_dir / "config.yaml"
    return list(load(path).cluster.servers) if path.exists() else fallback


def _finite(curve: np.ndarray) -> np.ndarray:
    """A curve up to its last clock with an objective (LDA's last clock may be a barrier's, without)."""
    ok = np.flatnonzero(np.isfinite(curve))
    return curve[:ok[-1] + 1] if ok.shape[0] else curve


def exact_counts(run_dir: Path) -> dict[str, Any]:
    """LDA: whether the final word-topic table holds every token once (its sum, the token count)."""
    tokens = max((r.get("tokens", 0) for r in read_metrics(run_dir) if r["kind"] == "clock"), default=0)
    path = run_dir / "word_topic.npy"
    if not path.exists():
        return {}
    wt = np.load(path)
    return {"table_sum": int(wt.sum()), "tokens": int(tokens), "negative_counts": int((wt < 0).sum()),
            "exact": bool(int(wt.sum()) == tokens and (wt >= 0).all())}


def measure(app: str, workdir: Path, *, epochs: int, every: int, kills: int, gap: int, seed: int,
            servers_only: bool = False, extra: int = 2, repeats: int = 3, scale: int = 1) -> dict[str, Any]:
    """``repeats`` failure-free runs of ``app`` (E clocks) and as many under chaos (E + ``extra``),
    alternated. Runs of an SSP job differ (each settles at its own level), so as in
    ``bench.workerloss`` the target is the median failure-free curve's final value, the extra
    clocks are those of the median chaos curve, and the noise is each failure-free run's own."""
    job = JOBS[app]
    if scale > 1:  # a longer job: ``scale`` times the data (LDA's documents, MF's ratings)
        job = dataclasses.replace(job, args=tuple((k, v * scale if k in ("synth_docs", "nnz") else v)
                                                   for k, v in job.args))
    base_cfg = write_job(job, workdir / f"{app}-base.yaml", epochs, every)
    long_cfg = write_job(job, workdir / f"{app}-chaos.yaml", epochs + extra, every)
    bases: list[np.ndarray] = []
    chaos: list[np.ndarray] = []
    runs: list[dict[str, Any]] = []
    base_s: list[float] = []
    for i in range(repeats):
        t = time.monotonic()
        bases.append(_finite(run(base_cfg, workdir / f"{app}-base-{i}", timeout=600)[0]))
        base_s.append(time.monotonic() - t)
        got = run_with_chaos(long_cfg, workdir / f"{app}-chaos-{i}", kills=kills, gap=gap, last=epochs - gap,
                             seed=seed + i, servers_only=servers_only)
        (workdir / f"{app}-chaos-{i}" / "launcher.out").write_text(got["output"])
        chaos.append(got["curve"])
        runs.append({"kills": got["kills"], "seconds": round(got["seconds"], 2),
                     "replacements": sum(1 for line in got["output"].splitlines() if " replaces " in line),
                     "final": float(got["curve"][epochs - 1]),
                     **(exact_counts(workdir / f"{app}-chaos-{i}") if app == "lda" else {})})
    n = min(c.shape[0] for c in bases)
    base = np.median(np.stack([c[:n] for c in bases]), axis=0)
    m = min(c.shape[0] for c in chaos)
    median_chaos = np.median(np.stack([c[:m] for c in chaos]), axis=0)
    return {
        "app": app, "epochs": epochs, "every": every, "repeats": repeats, "kills_asked": kills,
        "servers_only": servers_only, "kills": [len(r["kills"]) for r in runs],
        "target": float(base[-1]), "extra_clocks": extra_clocks(base, median_chaos, job.maximize),
        "noise_extra_clocks": [extra_clocks(base, b, job.maximize) for b in bases],
        "run_extra_clocks": [extra_clocks(base, c, job.maximize) for c in chaos],
        "exact": all(r.get("exact", True) for r in runs), "base_s": base_s, "runs": runs,
    }
