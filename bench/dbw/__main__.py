"""``python -m bench.dbw``: dynamic backup workers against every static k and B-DBW (docs/design.md,
"Backup workers"; the DBW paper's sect. 4.1 and Fig. 9 in miniature).

Two experiments, one JSON line per result (``experiment``):

Each line has ``bench``, ``case``, ``metric``, ``unit``, ``ours`` (a median over the seeds) and, on
summary lines, ``baseline``, ``baseline_name`` and ``ratio`` (baseline / DBW: above 1, DBW is faster).

- ``alpha``: n workers, round trips ``1 - alpha + alpha * Exp(1)`` (mean 1: the time unit), softmax
  regression (MLR) on a real data set, the virtual time until the training loss reaches ``--target``,
  over ``--seeds`` seeds, for static k = 1..n (learning rate lr·k/n), ``dynamic`` (DBW) and ``blind``
  (B-DBW), both at lr. One line per (alpha, method): median, min, max, mean k_t; then per alpha two
  ``summary`` lines: DBW against the best static k (and whether it is within 10%) and against B-DBW.
- ``slowdown`` (Fig. 9): deterministic equal round trips, then from iteration ``--slow-from`` the upper
  half of the workers 5x slower: per seed, the first iteration from which k_t stays at or below n/2
  for 10 iterations (how long DBW takes to notice), and k_t's mean 20-40 iterations after.

Default: the virtual-clock simulation (``bench/dbw/sim.py``: the servers' own ``BackupStep``), the
only way to repeat a run over many seeds on a small machine. ``--processes`` runs both as real jobs
instead (``bench/dbw/processes.py``: a server and n MLR worker processes over loopback per job,
round trips injected as sleeps of ``--unit-s`` per time unit, a job stopped at its target or after
``--cap`` time units; one JSON line per job as it ends, ``--from`` to resume): wall seconds.
``--quick``: 4 workers, 3 seeds, fewer alphas, for CI.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np

from bench.common import REPO, emit
from bosen.apps.delays import DelayArgs
from bosen.apps.mlr import data as D
from bosen.config import BackupConfig

VIRTUAL = "mean round trips (virtual time)"


def dataset(name: str, samples: int) -> D.Dataset:
    """``digits`` (sklearn's, 1797 samples) or ``fashion-mnist`` (``bosen data fashion-mnist``: its
    first ``samples`` training samples)."""
    if name == "digits":
        return D.digits()
    ds, _ = D.load_npz(str(REPO / "data" / name / "train.npz"))
    return ds.take(np.arange(min(samples, ds.n), dtype=np.int64))


def methods(n: int, only: list[str] | None = None) -> list[tuple[str, BackupConfig]]:
    """static1..staticN, dynamic, blind (those named in ``only``, if given)."""
    every = [(f"static{k}", BackupConfig(mode="static", k=k)) for k in range(1, n + 1)] + \
        [("dynamic", BackupConfig(mode="dynamic")), ("blind", BackupConfig(mode="blind"))]
    return [m for m in every if only is None or m[0] in only]


def _spread(xs: list[float]) -> dict[str, float]:
    finite = [x for x in xs if math.isfinite(x)]
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "reached": len(finite)}


def alpha_sim(a: argparse.Namespace, ds: D.Dataset) -> None:
    from bench.dbw.sim import simulate

    for alpha in a.alphas:
        medians: dict[str, float] = {}
        for name, cfg in methods(a.workers, a.methods):
            cfg = BackupConfig(mode=cfg.mode, k=cfg.k, lr=a.lr, window=a.window, memory=a.memory)
            times, ks = [], []
            for seed in range(a.seeds):
                r = simulate(ds, cfg, a.workers, a.batch, DelayArgs(mean_s=1.0, alpha=alpha, seed=seed), a.target,
                             a.max_time)
                times.append(r.time_to_target)
                ks.append(float(np.mean(r.k)) if r.k else math.nan)
            s = _spread(times)
            medians[name] = s["median"]
            emit(bench="dbw", case=f"alpha={alpha:g} {name}", metric="time_to_target", unit=VIRTUAL,
                 ours=s["median"], experiment="alpha", clock="virtual", workers=a.workers, alpha=alpha, method=name,
                 lr=cfg.lr if cfg.mode != "static" else a.lr * (cfg.k or 1) / a.workers, batch=a.batch,
                 target=a.target, seeds=a.seeds, time_to_target=s, mean_k=statistics.mean(ks))
        _summary(a, alpha, medians, VIRTUAL, a.seeds)


def _summary(a: argparse.Namespace, alpha: float, medians: dict[str, float], unit: str, seeds: int) -> None:
    """Two lines: DBW against the best static k, and against B-DBW (median times; ratio = baseline /
    DBW, above 1 when DBW is faster)."""
    if not ("dynamic" in medians and "blind" in medians and any(k.startswith("static") for k in medians)):
        return
    static = {k: v for k, v in medians.items() if k.startswith("static")}
    best = min(static, key=lambda k: static[k])
    dbw = medians["dynamic"]
    for vs, base in (("best static", best), ("B-DBW", "blind")):
        emit(bench="dbw", case=f"alpha={alpha:g} DBW vs {vs}", metric="time_to_target", unit=unit, ours=dbw,
             baseline=medians[base], baseline_name=base, ratio=medians[base] / dbw, experiment="alpha",
             summary=True, workers=a.workers, alpha=alpha, seeds=seeds,
             **({"within_10pct": bool(dbw <= 1.1 * medians[base])} if base == best else {}))


def slowdown_sim(a: argparse.Namespace, ds: D.Dataset) -> None:
    from bench.dbw.processes import slowdown_stats
    from bench.dbw.sim import simulate

    n = a.workers
    detect, after = [], []
    for seed in range(a.seeds):
        cfg = BackupConfig(mode="dynamic", lr=a.lr, window=a.window, memory=a.memory)
        r = simulate(ds, cfg, n, a.batch, DelayArgs(mean_s=1.0, alpha=0.0, seed=seed, slow_from=a.slow_from),
                     0.0, math.inf, max_steps=a.slow_from + 40)
        st = slowdown_stats(r.k, a.slow_from, n // 2)
        detect.append(st["iterations_to_half"])
        after.append(st["k_after"])
        emit(bench="dbw", case=f"slowdown seed={seed}", metric="iterations_to_half", unit="iterations",
             ours=detect[-1], experiment="slowdown", clock="virtual", workers=n, seed=seed, slow_from=a.slow_from,
             k_before=st["k_before"], k_after=after[-1], k=r.k)
    _slowdown_summary(a, detect, after, clock="virtual")


def _slowdown_summary(a: argparse.Namespace, detect: list[float], after: list[float], clock: str) -> None:
    emit(bench="dbw", case="slowdown", metric="k_after", unit="gradients per step", ours=_spread(after)["median"],
         experiment="slowdown", summary=True, clock=clock, workers=a.workers, seeds=len(detect),
         slow_from=a.slow_from, iterations_to_half=_spread(detect), k_after=_spread(after), half=a.workers // 2,
         within_20=bool(all(d <= 20 for d in detect)))


def processes(a: argparse.Namespace) -> None:
    """Real jobs (``bench/dbw/processes.py``), one line each, then the summary of every job line."""
    from bench.dbw import processes as P

    recs = P.run(a, methods(a.workers, a.methods))
    unit = "s"
    for alpha in a.alphas:
        mine = [r for r in recs if r["experiment"] == "alpha" and float(r["alpha"]) == alpha]
        names = [m for m, _ in methods(a.workers, a.methods)]
        seeds = sorted(set.intersection(*({r["seed"] for r in mine if r["method"] == m} for m in names)))
        if not seeds:
            continue
        medians: dict[str, float] = {}
        for name in names:
            got = {r["seed"]: r for r in mine if r["method"] == name and r["seed"] in seeds}
            times = [math.inf if got[s]["time_to_target"] is None else float(got[s]["time_to_target"]) for s in seeds]
            s = _spread(times)
            medians[name] = s["median"]
            emit(bench="dbw", case=f"alpha={alpha:g} {name}", metric="time_to_target", unit=unit, ours=s["median"],
                 experiment="alpha", clock="wall", workers=a.workers, alpha=alpha, method=name, unit_s=a.unit_s,
                 lr=a.lr, batch=a.batch, target=a.target, cap=a.cap, seeds=len(seeds), time_to_target=s,
                 mean_k=statistics.mean(float(got[s]["mean_k"]) for s in seeds),
                 cpu_cores=statistics.median(float(got[s]["cpu_cores"]) for s in seeds),
                 load=[min(got[s]["loadavg"][0] for s in seeds), max(got[s]["loadavg"][0] for s in seeds)])
        _summary(a, alpha, medians, unit, len(seeds))
    slow = [r for r in recs if r["experiment"] == "slowdown"]
    if slow:
        _slowdown_summary(a, [float(r["iterations_to_half"]) for r in slow], [float(r["k_after"]) for r in slow],
                          clock="wall")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.dbw", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="4 workers, 3 seeds, alphas 0 and 1 (CI)")
    p.add_argument("--workers", type=int, default=None, help="n (default 8, --quick 4)")
    p.add_argument("--seeds", type=int, default=None, help="seeds per setting (default 10, --quick 3)")
    p.add_argument("--alphas", type=float, nargs="+", default=None, help="default 0 0.2 1 (--quick: 0 1)")
    p.add_argument("--data", default="digits", help="digits, or a `bosen data` MLR set under data/ (fashion-mnist)")
    p.add_argument("--samples", type=int, default=5000, help="training samples taken of a data/ set")
    p.add_argument("--lr", type=float, default=1.0, help="the step at k = n (static k: lr*k/n)")
    p.add_argument("--batch", type=int, default=16, help="samples per worker gradient")
    p.add_argument("--target", type=float, default=0.3, help="training loss to reach")
    p.add_argument("--max-time", type=float, default=3000.0, help="virtual time limit of one run")
    p.add_argument("--slow-from", type=int, default=None, help="slowdown: its iteration (default 40, --quick 20)")
    p.add_argument("--window", type=int, default=BackupConfig.window, help="backup.window (D)")
    p.add_argument("--memory", type=float, default=BackupConfig.memory, help="backup.memory")
    p.add_argument("--methods", nargs="+", default=None, help="only these (static1.., dynamic, blind)")
    p.add_argument("--experiments", nargs="+", default=["alpha", "slowdown"], choices=["alpha", "slowdown"])
    p.add_argument("--processes", action="store_true", help="real jobs (bench/dbw/processes.py), wall time")
    p.add_argument("--unit-s", type=float, default=0.05, help="--processes: seconds per time unit")
    p.add_argument("--iterations", type=int, default=400, help="--processes: most iterations of a job")
    p.add_argument("--cap", type=float, default=250.0, help="--processes: time units a job may take to the target")
    p.add_argument("--parallel", type=int, default=1, help="--processes: jobs at a time (each its own processes)")
    p.add_argument("--slow-seeds", type=int, default=None, help="--processes: slowdown seeds (default 5, --quick 1)")
    p.add_argument("--from", dest="from_files", nargs="+", default=None,
                   help="--processes: JSONL of earlier runs; their jobs are not run again and count in the summary")
    a = p.parse_args(argv)
    for key, full, quick in (("workers", 8, 4), ("seeds", 10, 3), ("alphas", [0.0, 0.2, 1.0], [0.0, 1.0]),
                             ("slow_from", 40, 20), ("slow_seeds", 5, 1)):
        if getattr(a, key) is None:
            setattr(a, key, quick if a.quick else full)
    t0 = time.perf_counter()
    if a.processes:
        processes(a)
        emit(bench="dbw", done=True, seconds=time.perf_counter() - t0, data="digits", processes=True)
        return
    ds = dataset(a.data, a.samples)
    if "alpha" in a.experiments:
        alpha_sim(a, ds)
    if "slowdown" in a.experiments:
        slowdown_sim(a, ds)
    emit(bench="dbw", done=True, seconds=time.perf_counter() - t0, data=a.data, samples=ds.n)


if __name__ == "__main__":
    main()
