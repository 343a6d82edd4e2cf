"""SCAR's recovery experiments in miniature (Qiao thesis ch. 5, experiments E3-E5):
rework after a failure, full restart vs partial recovery, priority checkpoints, and what checkpoints cost.

Every run is a real job through ``bosen launch``, 2 servers, 2 workers, staleness 2: ``--app mf`` (the
default) MF on MovieLens-100K (configs/mf-movielens.yaml, objective: training loss, minimized);
``--app lda`` LDA on the news corpus (configs/lda-news.yaml with 2 servers, no held-out scoring,
objective: the training log-likelihood, maximized; the running checkpoint's distance is ``tv``).
For LDA ``--lose documents`` (the default, SCAR's LDA fault model) loses documents: their topic
assignments go back to the clock their copy was saved at and the word-topic counts are regenerated
from all assignments (``Documents``); ``--lose rows`` loses rows of the server tables as for MF.
Method (docs/recovery.md, "SCAR's experiments in miniature"):

1. A failure-free *baseline* run of E clocks with a checkpoint at every clock (``keep`` large) gives
   the exact state after every clock: each server part holds ``t{i}.values`` and their global rows
   ``t{i}.rows``. The target objective is the baseline's training objective at clock K.
2. A failure at clock T (seeded, uniform over the non-boundary clocks of [C+1, 3C)) loses a random
   fraction f of the rows of each table (seeded). With full checkpoints every C clocks:
   *full restart* resumes the job from the checkpoint at B = C·floor(T/C), as saved;
   *partial recovery* resumes from a checkpoint at T that holds the live rows at T and the lost rows
   from the running checkpoint (here: the full checkpoint at B). Workers keep their state at T
   (their parts of the checkpoint at T): in a live partial recovery they would go on.
   *Priority checkpoints* (f = 1/2): the running checkpoint starts at w(0) and every r·C clocks saves
   the fraction r of rows chosen by ``bosen.scar`` (priority / round_robin / random), emulated offline
   from the per-clock states, at clocks < T only (no save at the failed clock itself; the full
   checkpoints' failures never fall on a boundary either); the lost rows come back from it.
   Each modified checkpoint is written with ``bosen.checkpoint.write_part`` (same format, clock and
   fingerprint) into a copy of the run directory, and ``bosen launch CONFIG --resume COPY`` runs the
   rest of the job.
3. Rework = clocks executed to reach the target (before the failure and after the resume, the
   crossing interpolated linearly between clocks) minus the baseline's K. A *control* resumes at T
   with nothing lost: its rework is the run-to-run noise of an SSP job.
4. Cost: the same job with a checkpoint every 1 and every 8 clocks and without, runs alternated;
   time per clock from the clock records (clocks 3..E, start-up left out); ratio to the paired run
   without checkpoints.

``python -m bench.recovery [--app mf|lda] [--quick] [--seeds N]`` prints JSON lines (bench/common.py
``emit``) and draws bench/out/recovery_partial.png and bench/out/recovery_priority.png (``--app lda``:
recovery_lda_partial.png, recovery_lda_priority.png).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import REPO, emit, log
from bench.recovery.faults import Documents, lost_rows, perturbation, running_checkpoint, stacked, unstacked
from bench.recovery.runs import APPS, clocks_to, curve, launch, write_job
from bench.recovery.states import States
from bosen import checkpoint, scar

OUT = REPO / "bench" / "out"
BENCH = "recovery"
THESIS_PARTIAL = {0.75: (12, 42), 0.5: (31, 62), 0.25: (59, 89)}  # % less rework, T:1686
THESIS_PRIORITY = (78, 95)  # % less rework at r = 1/8, f = 1/2, T:1696
APP = APPS["mf"]  # the app of this run (main sets it)


# ----------------------------------------------------------------------------------------------
# experiments


def rework_run(states: States, cfg: Path, work: Path, name: str, clock: int, values: list[np.ndarray],
               failed_at: int, target: float, k_target: float,
               workers: list[dict[str, np.ndarray]] | None = None) -> dict[str, Any]:
    run = work / name
    states.write_resume(run, clock, values, workers)
    t = time.perf_counter()
    obj = curve(launch(cfg, run, resume=True))
    shutil.rmtree(run / "checkpoints", ignore_errors=True)
    reach = clocks_to(obj, target, clock, APP.maximize)
    rework = failed_at - clock + reach - k_target
    return {"rework": float(rework), "resumed_at": clock, "reached": float(reach), "seconds": time.perf_counter() - t}


def doc_run(docs: Documents, states: States, cfg: Path, work: Path, name: str, T: int, source: np.ndarray,
            target: float, k_target: float) -> dict[str, Any]:
    """LDA resumed at the failure clock ``T`` with the documents of ``source >= 0`` recovered from those
    clocks (the rest live), the server tables regenerated; the perturbation in the doc-topic rows."""
    zs = docs.recovered(T, source)
    tables, ndk = docs.counts(zs)
    live = docs.ndk(T)
    res = rework_run(states, cfg, work, name, T, tables, T, target, k_target, docs.worker_arrays(T, zs, ndk))
    res["perturbation_l2"] = float(np.linalg.norm(live.astype(np.float64) - ndk))
    res["perturbation_tv"] = float(scar.row_distance(live, ndk, "tv").sum())
    return res


def summary(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs, float)
    return {"median": float(np.median(a)), "min": float(a.min()), "max": float(a.max()), "reps": int(a.size)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="one seed, f = 1/2, r = 1/8 priority only, no control or cost runs (~1 min)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--period", type=int, default=8, help="clocks between full checkpoints (C)")
    p.add_argument("--no-cost", action="store_true", help="skip the checkpoint-cost runs")
    p.add_argument("--cost-only", action="store_true", help="only the checkpoint-cost runs")
    p.add_argument("--e2e-only", action="store_true",
                   help="only the baseline and the SIGKILLs of a server process (both arms)")
    p.add_argument("--app", choices=sorted(APPS), default="mf",
                   help="mf: MF on MovieLens-100K (default); lda: LDA on the news corpus (data/news)")
    p.add_argument("--lose", choices=("documents", "rows"), default="documents",
                   help="lda: what fails: documents (their topic assignments and doc-topic rows, the word-topic "
                        "table regenerated: SCAR's LDA fault model) or rows of the server tables")
    p.add_argument("--no-e2e", action="store_true", help="skip the end-to-end SIGKILL runs")
    p.add_argument("--ratios", default="", help="comma-separated r values for E4 (default 1/2, 1/4, 1/8)")
    p.add_argument("--fractions", default="", help="comma-separated lost fractions for E3 (default 1/4, 1/2, 3/4)")
    args = p.parse_args(argv)
    global APP
    APP = APPS[args.app]
    app_meta = {"bench": BENCH, "app": APP.name, "servers": 2, "workers": 2, "staleness": 2}
    if args.cost_only:
        work = Path(tempfile.mkdtemp(prefix="bosen-recovery-"))
        try:
            cost(work, {**app_meta, "quick": args.quick}, args.quick)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return 0
    quick = args.quick
    C = args.period
    seeds = 1 if quick else args.seeds
    fractions = [0.5] if quick else [0.25, 0.5, 0.75]
    ratios = [1 / 8] if quick else [1 / 2, 1 / 4, 1 / 8]
    if args.fractions:
        fractions = [float(eval_fraction(x)) for x in args.fractions.split(",")]
    if args.ratios:
        ratios = [float(eval_fraction(x)) for x in args.ratios.split(",")]
    if 0.5 not in fractions:
        fractions = sorted([*fractions, 0.5])  # E4 (r = 1) and the priority runs lose half the rows
    if 1 / 8 not in ratios:
        ratios.append(1 / 8)  # the goal's r
    policies = ["priority"] if quick else list(scar.POLICIES)
    k_target = 3 * C + 6 if not quick else 3 * C + 2  # the baseline's clock whose objective is the target
    epochs = k_target + C + 4  # resumed runs go on past the target by at least the longest rework
    base_meta = {**app_meta, "full_checkpoint_every": C, "target_clock": k_target, "quick": quick,
                 "maximize": APP.maximize, "distance": APP.metric}
    OUT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bosen-recovery-"))
    try:
        cfg_base = write_job(APP, work / "base.yaml", epochs, 1)
        cfg_resume = write_job(APP, work / "resume.yaml", epochs, None, keep=1)
        log(f"recovery: baseline run ({epochs} clocks, a checkpoint every clock) in {work}")
        base_dir = work / "base"
        obj = curve(launch(cfg_base, base_dir))
        target = float(obj[k_target])
        states = States(base_dir, cfg_base)
        emit(**base_meta, case="baseline", metric="objective_at_target_clock", value=target,
             clocks=int(obj.shape[0]), curve=[float(x) for x in obj])

        docs = Documents(states, cfg_base) if APP.name == "lda-news" and args.lose == "documents" else None
        base_meta["lost_unit"] = "documents" if docs is not None else "rows"
        rng_master = np.random.default_rng(12345)
        failures = []
        for _ in range(seeds):
            choices = [c for c in range(C + 1, 3 * C) if c % C]
            failures.append(int(rng_master.choice(choices)))
        if args.e2e_only:
            for kill_after in sorted(set(failures))[:3]:
                for arm in ("full-restart", "partial-live"):
                    end_to_end(work, base_meta, epochs, k_target, target, C, kill_after=kill_after, arm=arm)
            return 0
        results: dict[str, list[float]] = {}

        def record(key: str, seed: int, res: dict[str, Any], **fields: Any) -> None:
            results.setdefault(key, []).append(res["rework"])
            extra = {k: res[k] for k in ("perturbation_l2", "perturbation_tv") if k in res}
            emit(**base_meta, case=f"{key}/seed{seed}", metric="rework", unit="clocks", value=res["rework"],
                 failed_at=failures[seed], resumed_at=res["resumed_at"], reached=res["reached"], **extra, **fields)

        for s, T in enumerate(failures):
            B = C * (T // C)
            live = states.at(T)
            log(f"recovery: seed {s}: failure at clock {T}, last full checkpoint at {B}")
            if not quick:  # the run-to-run noise: resumed at T with nothing lost
                record("control", s, rework_run(states, cfg_resume, work, f"control{s}", T, live, T, target, k_target))
            record("full", s, rework_run(states, cfg_resume, work, f"full{s}", B, states.at(B), T, target, k_target))
            if docs is not None:  # LDA: documents fail (SCAR's LDA fault model)
                live_ndk = docs.ndk(T)
                for f in fractions:
                    lost = lost_rows([live_ndk], f, np.random.default_rng(1000 + s))
                    source = np.full(docs.n_docs, -1, np.int64)
                    source[lost] = B
                    res = doc_run(docs, states, cfg_resume, work, f"partial{s}-{f}", T, source, target, k_target)
                    record(f"partial/f={f:g}", s, res, lost_fraction=f)
                lost = lost_rows([live_ndk], 0.5, np.random.default_rng(1000 + s))
                for r in ratios:
                    for pol in policies:
                        ck = scar.RunningCheckpoint(docs.ndk(0), "tv", seed=s)
                        step = max(1, int(round(r * C)))
                        for c in range(step, T, step):  # saves before the failed clock
                            ck.step(pol, docs.ndk(c), r, c)  # type: ignore[arg-type]
                        source = np.full(docs.n_docs, -1, np.int64)
                        source[lost] = ck.saved_clock[lost]
                        res = doc_run(docs, states, cfg_resume, work, f"prio{s}-{pol}-{r}", T, source, target,
                                      k_target)
                        record(f"priority/{pol}/r={r:g}", s, res, policy=pol, r=r, lost_fraction=0.5,
                               rows_saved=ck.rows_saved,
                               saved_age_median=float(np.median(T - ck.saved_clock[lost])))
                continue
            saved = stacked(states.at(B))
            for f in fractions:
                lost = lost_rows(live, f, np.random.default_rng(1000 + s))
                mixed = stacked(live).copy()
                mixed[lost] = saved[lost]
                res = rework_run(states, cfg_resume, work, f"partial{s}-{f}", T, unstacked(mixed, live), T, target,
                                 k_target)
                record(f"partial/f={f:g}", s, res, lost_fraction=f, **perturbation(live, mixed, APP.metric))
            lost = lost_rows(live, 0.5, np.random.default_rng(1000 + s))
            for r in ratios:
                for pol in policies:
                    # saves before the failed clock
                    ck = running_checkpoint(states, APP.metric, pol, r, C, T - 1, seed=s)
                    mixed = ck.recover(stacked(live), lost)
                    res = rework_run(states, cfg_resume, work, f"prio{s}-{pol}-{r}", T, unstacked(mixed, live), T,
                                     target, k_target)
                    record(f"priority/{pol}/r={r:g}", s, res, policy=pol, r=r, lost_fraction=0.5,
                           rows_saved=ck.rows_saved, **perturbation(live, mixed, APP.metric))

        full = float(np.median(results["full"]))
        for key, xs in results.items():
            emit(**base_meta, case=f"{key}/median", metric="rework_median", unit="clocks", **summary(xs))

        def cut(xs: list[float]) -> float:
            return 100.0 * (1.0 - float(np.median(xs)) / full) if full > 0 else float("nan")

        def paired(key: str) -> float | None:
            """The cut with each seed's rework less its control's (the resumed runs' own offset against
            the baseline taken out; LDA's resumed runs reach the target ~1 clock early): a diagnostic."""
            if "control" not in results:
                return None
            ctl = np.asarray(results["control"])
            f = float(np.median(np.asarray(results["full"]) - ctl))
            return 100.0 * (1.0 - float(np.median(np.asarray(results[key]) - ctl)) / f) if f > 0 else float("nan")

        for f in fractions:
            if f not in THESIS_PARTIAL:
                continue
            lo, hi = THESIS_PARTIAL[f]
            c = cut(results[f"partial/f={f:g}"])
            emit(**base_meta, case=f"goal/partial/f={f:g}", metric="rework_cut_vs_full_restart", unit="%", value=c,
                 cut_less_control=paired(f"partial/f={f:g}"), thesis=[lo, hi],
                 goal=f">= {lo}% (the thesis' range {lo}-{hi}%)", met=bool(c >= lo))
        for pol in policies:
            c = cut(results[f"priority/{pol}/r=0.125"])
            emit(**base_meta, case=f"goal/priority/{pol}/r=0.125", metric="rework_cut_vs_full_restart", unit="%",
                 value=c, cut_less_control=paired(f"priority/{pol}/r=0.125"), thesis=list(THESIS_PRIORITY),
                 goal=">= 78%" if pol == "priority" else "(no goal)",
                 met=bool(c >= THESIS_PRIORITY[0]) if pol == "priority" else None)
        plot(results, fractions, ratios, policies, full)
        if not (quick or args.no_e2e):
            for kill_after in sorted(set(failures))[:3]:
                for arm in ("full-restart", "partial-live"):
                    end_to_end(work, base_meta, epochs, k_target, target, C, kill_after=kill_after, arm=arm)
        if not (args.no_cost or quick):
            cost(work, base_meta, quick)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def eval_fraction(x: str) -> float:
    """"1/8" or "0.125" as a number."""
    a, _, b = x.strip().partition("/")
    return float(a) / float(b) if b else float(a)


def end_to_end(work: Path, base_meta: dict[str, Any], epochs: int, k_target: int, target: float, period: int,
               kill_after: int, arm: str) -> None:
    """The real service: a job with a full checkpoint every ``period`` clocks, server 1 SIGKILLed once
    every worker recorded clock ``kill_after``. ``arm`` "full-restart": the whole job stops with it
    (Bösen's recovery) and ``bosen launch --resume`` restarts it from the newest complete checkpoint;
    "partial-live": the launcher replaces server 1 from its own checkpoint part, the other server
    keeps its live rows, the workers resend what they sent it since (docs/recovery.md). Rework as
    above; for the live arm also the seconds the job lost against a failure-free run."""
    import os
    import signal

    import psutil

    cfg = write_job(APP, work / "e2e.yaml", epochs, period, keep=2)
    run = work / f"e2e-{arm}-{kill_after}"
    cmd = [sys.executable, "-m", "bosen", "launch", str(cfg), "--quiet", "--no-plot", "--run-dir", str(run)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    killed_at, victim = None, None
    deadline = time.monotonic() + 240
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
            # the workers' own records (RUN_DIR/workers/RANK.jsonl) come at once; the merged metrics later
            files = [run / "workers" / f"{r}.jsonl" for r in range(2)]
            if not all(f.exists() for f in files):
                continue
            done = [max((json.loads(x).get("clock", -1) for x in f.read_text().splitlines() if x.strip().endswith("}")),
                        default=-1) for f in files]
            if min(done) >= kill_after:
                for c in psutil.Process(proc.pid).children(recursive=True):
                    cl = c.cmdline()
                    if "bosen.server" in cl and cl[cl.index("--rank") + 1] == "1":
                        victim = c.pid
                        os.kill(victim, signal.SIGKILL)  # a process this bench started (through the launcher)
                        killed_at = min(done)
                        break
                if arm == "full-restart":
                    proc.send_signal(signal.SIGTERM)  # the job goes down with its server, as in Bösen
                break
        rc = proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    case = f"e2e/{arm}"
    if killed_at is None:
        emit(**base_meta, case=case, metric="rework", value=None, error="the job ended before the kill")
        return
    # the failure clock: every worker had recorded clock ``killed_at`` when server 1 died (workers may
    # record a few more clocks before they block on it; those reached only one server)
    executed = killed_at + 1
    if arm == "partial-live":
        recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
        clocks = [r for r in recs if r.get("kind") == "clock"]
        reach = clocks_to(curve(clocks), target, 0, APP.maximize)
        free = launch(cfg, work / f"e2e-free-{kill_after}")
        lost_s = _time_at(clocks, k_target) - _time_at(free, k_target)
        emit(**base_meta, case=case, metric="rework", unit="clocks", value=float(reach - k_target),
             killed_after_clock=killed_at, launcher_rc=rc, seconds_lost_at_target=lost_s)
        return
    resumed_at = checkpoint.newest_complete(run / "checkpoints", 2, 2, None)[0]
    t0 = time.perf_counter()
    obj = curve(launch(cfg, run, resume=True))
    resume_s = time.perf_counter() - t0
    reach = clocks_to(obj, target, resumed_at, APP.maximize)
    rework = executed - resumed_at + reach - k_target
    emit(**base_meta, case=case, metric="rework", unit="clocks", value=float(rework),
         killed_after_clock=killed_at, clocks_executed_before=executed, resumed_at=resumed_at, launcher_rc=rc,
         resume_s=resume_s, expected_rework=executed - resumed_at)


def _time_at(records: list[dict[str, Any]], clock: int) -> float:
    """The record time (seconds since the job's start) of ``clock``; NaN if it has none."""
    return next((float(r["time"]) for r in records if r["clock"] == clock), float("nan"))


def cost(work: Path, base_meta: dict[str, Any], quick: bool) -> None:
    """Time per clock with a checkpoint every 1 and every 8 clocks vs none, alternated and paired."""
    epochs = 40 if quick else 160
    reps = 1 if quick else 3
    intervals = [1, 8] if quick else [1, 8, 32, 80]
    per: dict[int | None, list[float]] = {}
    save_s: dict[int, list[float]] = {n: [] for n in intervals}  # servers' write + copy seconds per clock
    ratios: dict[int, list[float]] = {n: [] for n in intervals}
    for rep in range(reps):
        order: list[int | None] = [None, *intervals] if rep % 2 == 0 else [*intervals[::-1], None]
        got: dict[int | None, float] = {}
        for n in order:
            cfg = write_job(APP, work / f"cost-{n}.yaml", epochs, n, keep=2)
            run = work / f"cost-{n}-{rep}"
            recs = launch(cfg, run, kinds=("clock", "server"))
            servers = [r for r in recs if r["kind"] == "server"]
            recs = [r for r in recs if r["kind"] == "clock"]
            if n is not None:
                ck = [r.get("checkpoints") or {} for r in servers]
                save_s[n].append(max(c.get("write_s", 0.0) + c.get("snapshot_s", 0.0) for c in ck) / epochs)
            times = sorted((r["clock"], r["time"]) for r in recs)
            got[n] = (times[-1][1] - times[2][1]) / (times[-1][0] - times[2][0])
            per.setdefault(n, []).append(got[n])
            shutil.rmtree(run, ignore_errors=True)
        for n in intervals:
            ratios[n].append(got[n] / got[None])
    for n in intervals:
        s = summary(ratios[n])
        # what one checkpoint adds to the job's time, and the interval at which that is 5% of it
        per_ck = [(a - b) * n for a, b in zip(per[n], per[None], strict=True)]
        needed = float(np.median(per_ck)) / (0.05 * float(np.median(per[None])))
        emit(**base_meta, case=f"cost/every={n}", metric="clock_time_ratio_vs_no_checkpoint", unit="x", **s,
             seconds_per_checkpoint=summary(per_ck), clocks_for_5_percent=needed,
             clock_s=summary(per[n]), clock_s_without=summary(per[None]), server_save_s_per_clock=summary(save_s[n]),
             goal="<= 1.05",
             met=bool(s["median"] <= 1.05))


def plot(results: dict[str, list[float]], fractions: list[float], ratios: list[float], policies: list[str],
         full: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def bars(xs: list[float]) -> tuple[float, list[float]]:
        m = float(np.median(xs))
        return m, [m - min(xs), max(xs) - m]

    fig, ax = plt.subplots(figsize=(5, 3.5))
    ms, errs = zip(*(bars(results[f"partial/f={f:g}"]) for f in fractions), strict=True)
    ax.errorbar(fractions, ms, yerr=np.array(errs).T, marker="o", capsize=3, label="partial recovery")
    ax.axhline(full, color="k", ls="--", label="full restart (median)")
    if "control" in results:
        ax.axhline(float(np.median(results["control"])), color="grey", ls=":", label="no loss (noise)")
    ax.set_xlabel("fraction of rows lost")
    ax.set_ylabel("rework (clocks)")
    ax.set_title(f"{APP.name}: partial vs full recovery")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT / f"{APP.prefix}_partial.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 3.5))
    xs = [1.0] + [1 / r for r in ratios]
    for pol in policies:
        series = [results.get("partial/f=0.5", [np.nan])] + [results[f"priority/{pol}/r={r:g}"] for r in ratios]
        ms, errs = zip(*(bars(s) for s in series), strict=True)
        ax.errorbar(xs, ms, yerr=np.array(errs).T, marker="o", capsize=3, label=pol)
    ax.axhline(full, color="k", ls="--", label="full restart (median)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("checkpoint frequency relative to full (fraction saved = 1/x)")
    ax.set_ylabel("rework (clocks), half the rows lost")
    ax.set_title(f"{APP.name}: priority checkpoints")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT / f"{APP.prefix}_priority.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
