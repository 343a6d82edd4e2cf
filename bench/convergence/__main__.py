"""Convergence benchmark (docs/evaluation.md): the Bösen evaluation in miniature, run as real jobs.

    python -m bench.convergence [--scenario lda|mf|mlr|adarev|all] [--quick] [--out bench/out]
                                [--workers 4,8] [--seeds 0,1,2] [--budgets 4,16] [--ks 2,4,8]
                                [--link-mbit N] [--data synthetic|real] [--servers auto|config|N]
                                [--modes BS,MC-40-RM,...] [--set KEY=VALUE] [--comm-set KEY=VALUE]
                                [--sn-epochs N]

Every job is ``python -m bosen launch CONFIG --set ...`` (servers and workers as processes, run by
``bosen.jobs.job.run_job``); the bench reads ``RUN_DIR/metrics.jsonl`` (per-clock records summed over
workers) and turns them into per-epoch curves (bench/convergence/curves.py): the objective, seconds since the
launch and bytes the clients sent and received. Each result is one JSON line on stdout (progress on
stderr) with ``bench="convergence"``, ``case``, ``metric``, ``unit``, ``ours`` and, against a
baseline of the same run, ``baseline``, ``baseline_name`` and ``ratio`` (> 1 means ours is better);
figures go to ``--out`` (bench/convergence/figures.py).

lda, mf, mlr -- thesis §3.3 in miniature, per app at P = 4 and 8 worker processes and three seeds:
    BS (bounded staleness s = 2, one clock per pass, no managed communication); MC-X-R and MC-X-RM
    (managed communication at X Mbps per node: X per client, the servers together as much as the
    clients together; random and relative-magnitude priority); at the
    largest P also BS-k (k clocks per pass, s = 2k: the same bound of two passes) and BS/b1 (one
    mini-batch per clock: the apps as they read before the live cache, the overhead reference).
    Every mode has the same data, seeds, step sizes and mini-batches per pass, and one server
    process per 4 workers (``--servers auto``: ``bosen.jobs.launch.servers_for``). The target of a seed
    and P is the best BS reaches in 75% of its epochs (``--target-frac``; LDA's objective is scored on
    the servers' tables at each clock, apps/lda/consistent.py); each run reports epochs,
    seconds and bytes to it (``epochs + 1`` and ``reached: false`` if never), time and bytes per
    epoch, how much of its budget it used, the budget as a multiple of BS's own egress per client
    (``budget_over_bs_egress``, same seed), the share of rows read that held a value pushed mid-clock,
    the mean staleness of the rows read, and whether the servers kept up (``apply_lag_ms``: an update
    read off the socket until applied; ``push_wait_ms``: an update arriving at a random moment waits
    this long behind pushes on average; ``push_busy_share``: the loop's time spent pushing; from the
    servers' final STATUS, ``Run.server_totals``; ``server_cpu_ms_per_mb``: their CPU per MB sent).
    Per mode the medians over seeds (and min/max epochs), then one line per goal of issue 27 with
    ``met``: gap closed towards SN, no budget worse than BS's worst seed, MC-RM faster than BS and
    than the best BS-k with fewer bytes, RM against R where the budget binds (>= 90% used), reads'
    missing updates against BS's, the per-epoch overhead at the smallest budget. ``--modes`` runs a
    subset (BS always: the targets are BS's), ``--set`` overrides a config key in every job,
    ``--comm-set`` one of managed communication's in the MC modes only. ``--link-mbit N`` runs it all inside a
    network namespace whose loopback is shaped to N Mbit/s (bench/convergence/shaped_link.py). ``--data real``
    runs each app on its real data set instead (``REAL_APPS``: news articles, MovieLens-100K,
    Fashion-MNIST, prepared with ``bosen data`` into data/ when missing).

adarev -- thesis §3.2.3 / Fig 3.3 in miniature: SGD matrix factorization (apps/mf, synthetic
    Netflix-shaped ratings, 2 servers, 2 workers, staleness 2) with AdaRevision on the servers
    (``configs/mf-adarev.yaml``: workers send mini-batch gradients, one clock per mini-batch) at
    initial step sizes alpha spanning 5x, against worker-side SGD with multiplicative decay
    (``configs/mf.yaml``: lr * 0.95^epoch, deltas to ``add`` tables, same mini-batches per epoch)
    at initial steps spanning 5x. Per run: epochs (and seconds) until the epoch loss first reaches
    the target (default 2.5 x the noise floor nnz * noise^2; --quick: 5 x, smaller data). Summary
    lines: AdaRevision's worst and best alpha against the best decay schedule (ratio = decay epochs /
    AdaRevision epochs; the thesis saw 2x), and sensitivity (max/min epochs over the step sizes of
    each method; ratio = decay's spread / AdaRevision's). A run that never reaches the target counts
    as ``epochs + 1`` (a lower bound) and says ``reached: false``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.common import REPO, emit, log, repo_env
from bench.convergence import shaped_link
from bench.convergence.curves import Aggregate, Run, read_run
from bench.convergence.figures import app_figure, loss_figure, send_count_figure
from bosen.jobs.job import run_job
from bosen.jobs.launch import WORKERS_PER_SERVER, servers_for

CONFIGS = REPO / "configs"
BENCH = "convergence"


# ----------------------------------------------------------------------------------------------
# running jobs


def launch(name: str, config: Path, sets: dict[str, Any], clocks_per_epoch: int, work: Path, timeout: float, *,
           seed: int = 0, workers: int = 0, aggregate: Aggregate = "sum", maximize: bool = False) -> Run:
    """Run one job with ``bosen launch`` and return its per-epoch curves."""
    log(f"[{BENCH}] {name}: {config.name} {' '.join(f'{k}={v}' for k, v in sets.items())}")
    job = run_job(config, work / f"{name}-s{seed}-p{workers}", sets=sets, timeout=timeout, cwd=REPO)
    run = read_run(job, name, seed, workers, clocks_per_epoch, aggregate, maximize, sets)
    if run.failure:
        log(f"[{BENCH}] {name}: job failed ({job.returncode}): {run.failure}")
    log(f"[{BENCH}] {name}: {run.seconds:.1f}s, per epoch {[float(f'{x:.4g}') for x in run.objective]}")
    if run.objective_worker_view != run.objective:
        log(f"[{BENCH}] {name}: workers' own view {[float(f'{x:.4g}') for x in run.objective_worker_view]}")
    return run


# ----------------------------------------------------------------------------------------------
# scenario adarev


def _epochs_or_bound(run: Run, target: float) -> tuple[int, bool]:
    """Epochs to the target, or (epochs the job was asked to run + 1, False) if never reached."""
    e = run.epochs_to(target)
    return (e, True) if e is not None else (int(run.settings["app.args.epochs"]) + 1, False)


def scenario_adarev(args: argparse.Namespace) -> None:
    if args.quick:
        data = {"tables.L.rows": 4000, "tables.R.rows": 1000, "app.args.nnz": 100_000}
        nnz, epochs, k = 100_000, 20, 10
        alphas, lrs = [0.2, 1.0], [0.04, 0.2]
    else:
        data = {}
        nnz, epochs, k = 500_000, 30, 20
        alphas, lrs = [0.2, 0.4, 1.0], [0.04, 0.1, 0.2]  # each spans 5x around its best value
    alphas = args.alphas or alphas
    lrs = args.lrs or lrs
    epochs = args.epochs or epochs
    k = args.clocks_per_epoch or k
    noise = 0.1
    target = args.target or (5.0 if args.quick else 2.5) * nnz * noise ** 2  # x the noise floor
    # one mini-batch per clock for both methods (configs/mf.yaml defaults to 10 per clock)
    common = {**data, "app.args.epochs": epochs, "app.args.clocks_per_epoch": k, "app.args.noise": noise,
              "app.args.batches_per_clock": 1}
    timeout = args.job_timeout
    work = Path(args.work)
    # compile (or load) every numba kernel of both kinds of job first, so no timed run pays for it
    tiny = {"tables.L.rows": 300, "tables.R.rows": 100, "app.args.nnz": 3000, "app.args.epochs": 1,
            "app.args.clocks_per_epoch": 2}
    for cfg in ("mf-adarev.yaml", "mf.yaml"):
        launch(f"warmup-{cfg[:-5]}", CONFIGS / cfg, tiny, 2, work, timeout)
    ada = [launch(f"alpha={a:g}", CONFIGS / "mf-adarev.yaml",
                  {**common, "tables.L.update_args.alpha": a, "tables.R.update_args.alpha": a}, k, work, timeout)
           for a in alphas]
    sgd = [launch(f"lr={lr:g}", CONFIGS / "mf.yaml", {**common, "app.args.lr": lr, "app.args.lr_decay": 0.95,
                                                      "checkpoint": None}, k, work, timeout)
           for lr in lrs]
    base = {"bench": BENCH, "target_loss": target, "epochs_run": epochs, "clocks_per_epoch": k, "nnz": nnz}
    for method, runs in (("adarevision", ada), ("sgd-decay", sgd)):
        for run in runs:
            e, reached = _epochs_or_bound(run, target)
            s = run.seconds_to(target)
            extra = {}
            if method == "adarevision":
                tabs = [t for srv in run.servers for t in (srv.get("tables") or {}).values()]
                extra = {"snapshots_peak": sum(t.get("snapshots_peak", 0) for t in tabs),
                         "snapshots_at_end": sum(t.get("snapshots", 0) for t in tabs)}
            if run.failure:
                extra["failed"] = run.failure
            emit(**base, case=f"mf/{method}/{run.name}", metric="epochs_to_target", unit="epochs", ours=e,
                 reached=reached, seconds_to_target=s, final_loss=run.objective[-1] if run.objective else None,
                 seconds_per_epoch=run.times[-1] / len(run.times) if run.times else None, **extra)
    ea = {run.name: _epochs_or_bound(run, target) for run in ada}
    es = {run.name: _epochs_or_bound(run, target) for run in sgd}
    best_sgd = min(es, key=lambda n: es[n][0])
    worst_ada = max(ea, key=lambda n: ea[n][0])
    best_ada = min(ea, key=lambda n: ea[n][0])
    for label, name in (("worst", worst_ada), ("best", best_ada)):
        emit(**base, case=f"mf/adarevision-{label}-alpha-vs-best-decay", metric="epochs_to_target", unit="epochs",
             ours=ea[name][0], ours_name=f"adarevision {name}", baseline=es[best_sgd][0],
             baseline_name=f"sgd-decay {best_sgd}", ratio=es[best_sgd][0] / ea[name][0],
             reached=ea[name][1] and es[best_sgd][1])
    sa = [run.seconds_to(target) for run in ada]
    ss = [run.seconds_to(target) for run in sgd]
    if all(x is not None for x in sa) and any(x is not None for x in ss):
        emit(**base, case="mf/adarevision-worst-alpha-vs-best-decay", metric="seconds_to_target", unit="s",
             ours=max(sa), baseline=min(x for x in ss if x is not None), baseline_name="sgd-decay (best lr)",
             ratio=min(x for x in ss if x is not None) / max(sa))
    spread_a = max(v[0] for v in ea.values()) / min(v[0] for v in ea.values())
    spread_s = max(v[0] for v in es.values()) / min(v[0] for v in es.values())
    emit(**base, case="mf/step-size-sensitivity", metric="epochs_max_over_min", unit="x", ours=spread_a,
         ours_steps=alphas, baseline=spread_s, baseline_name="sgd-decay", baseline_steps=lrs,
         ratio=spread_s / spread_a, reached=all(v[1] for v in ea.values()) and all(v[1] for v in es.values()))
    loss_figure(Path(args.out) / f"convergence-adarev{'-quick' if args.quick else ''}.png",
         f"MF: AdaRevision (alpha) vs SGD with x0.95/epoch decay (lr), {k} clocks/epoch", target,
         [("adarevision", ada), ("sgd-decay", sgd)])


# ----------------------------------------------------------------------------------------------
# the evaluation: BS against MC-X-R / MC-X-RM and BS-k, per app (thesis §3.3 in miniature)


@dataclass(frozen=True)
class AppSpec:
    """How the evaluation runs one app: config, sizes, the settings every mode shares, the objective."""

    config: str
    epochs_key: str
    epochs: int
    quick_epochs: int
    data: dict[str, Any]           # full-size data (overrides of the config)
    quick_data: dict[str, Any]
    common: dict[str, Any]         # the same in every mode: step sizes, priors
    batches: int                   # mini-batches per epoch (a BS-k clock gets batches // k of them)
    budgets: tuple[float, ...]     # Mbps per process (client and server alike)
    quick_budgets: tuple[float, ...]
    aggregate: Aggregate           # how an epoch's clock objectives combine
    maximize: bool
    ylabel: str
    table: str                     # the table whose per-row send counts are drawn
    ll_every: bool = False         # LDA: compute the objective once per epoch (ll_every = clocks per epoch)
    send_rows: int = 100           # rows per budgeted message (client_send_rows, server_push_rows)
    dataset: str = ""              # a `bosen data` set the config reads (prepared into data/ when missing)


APPS: dict[str, AppSpec] = {
    # 100,000 documents x ~100 tokens, 2000 words, K = 20 (configs/lda.yaml; ~0.25 s clocks at P = 4
    # here); objective log p(w, z)
    "lda": AppSpec("lda.yaml", "app.args.iterations", 20, 8, {"app.args.synth_docs": 100_000},
                   {"app.args.synth_docs": 1000, "app.args.synth_vocab": 500, "tables.word_topic.rows": 500},
                   {"app.args.consistent_ll": True}, 8, (10.0, 40.0), (40.0,), "last", True,
                   "log-likelihood (higher is better)", "word_topic",
                   ll_every=True, send_rows=800),
    # 20000 users x 5000 items, rank 16, 500k ratings (configs/mf.yaml); objective: training squared loss
    "mf": AppSpec("mf.yaml", "app.args.epochs", 20, 6, {},
                  {"tables.L.rows": 4000, "tables.R.rows": 1000, "app.args.nnz": 100_000},
                  {"app.args.lr": 0.01}, 10, (10.0, 40.0), (40.0,), "sum", False,
                  "training squared loss (sum over the epoch)", "R", send_rows=1000),
    # softmax regression, 500,000 synthetic samples (400,000 to train), 1000 features, 10 classes (~0.15 s
    # clocks at P = 4 here); objective: training log-loss
    "mlr": AppSpec("mlr.yaml", "app.args.epochs", 20, 6,
                   {"app.args.data": "synthetic", "tables.W.cols": 1001, "app.args.synthetic.n": 500_000},
                   {"app.args.data": "synthetic", "tables.W.cols": 201, "app.args.synthetic.n": 4000},
                   {"app.args.lr": 0.005}, 8, (10.0, 40.0), (40.0,), "sum", False,
                   "training log-loss (sum over the epoch)", "W"),
}
# --data real: the data sets of `bosen data` (issue 17), each through its own config; the held-out
# measures are off (eval_every 0) so that the time per epoch is training alone
REAL_APPS: dict[str, AppSpec] = {
    # 3,421 news articles, 945k tokens, V = 13,994, K = 20
    "lda": AppSpec("lda-news.yaml", "app.args.iterations", 30, 6, {}, {},
                   {"app.args.eval_every": 0, "app.args.consistent_ll": True}, 8,
                   (10.0, 40.0), (40.0,), "last", True, "log-likelihood (higher is better)", "word_topic",
                   ll_every=True, send_rows=800, dataset="news"),
    # MovieLens-100K: 80,000 training ratings, 943 users, 1,682 movies, rank 16
    "mf": AppSpec("mf-movielens.yaml", "app.args.epochs", 20, 6, {}, {},
                  {"app.args.eval_every": 0, "app.args.lr": 0.01}, 10, (10.0, 40.0), (40.0,), "sum", False,
                  "training squared loss (sum over the epoch)", "R", send_rows=1000, dataset="movielens"),
    # Fashion-MNIST: 60,000 training images, 784 pixels, 10 classes
    "mlr": AppSpec("mlr-fashion.yaml", "app.args.epochs", 20, 4, {}, {}, {"app.args.eval_every": 0}, 8,
                   (10.0, 40.0), (40.0,), "sum", False, "training log-loss (sum over the epoch)", "W",
                   dataset="fashion-mnist"),
}
SEED_KEY = "app.args.seed"
# every mode probes one read in this many for the updates it misses (metrics.freshness_every; --set
# metrics.freshness_every=0 turns it off): content freshness beside the clock-stamp staleness
FRESHNESS_EVERY = 8
BASE_STALENESS = 2  # thesis: s = 2 at one clock per pass; BS-k keeps the bound at 2 passes (s = 2k)


@dataclass(frozen=True)
class Mode:
    """One way of running an app: BS (plain SSP), MC-X-P (managed, X Mbps, policy P), BS-k."""

    name: str
    workers: int | None = None            # None: the P being evaluated (SN: 1)
    clocks_per_epoch: int = 1
    batches_per_clock: int | None = None  # None: the app's mini-batches per epoch / clocks per epoch
    budget: float | None = None
    priority: str = ""

    def sets(self, spec: AppSpec, workers: int, servers: int) -> dict[str, Any]:
        """Config overrides of this mode. The budget X is per node, as in the thesis, where every node
        runs a client and a server share: clients get X each, and the servers together as much as the
        clients together (X * workers / servers each), since a server pushes to every subscriber."""
        k = self.clocks_per_epoch
        b = self.batches_per_clock or max(1, spec.batches // k)
        out: dict[str, Any] = {"app.args.clocks_per_epoch": k, "app.args.batches_per_clock": b,
                               "consistency.staleness": BASE_STALENESS * k}
        if spec.ll_every:
            out["app.args.ll_every"] = k
        if self.budget is not None:
            out.update({"comm.enabled": True, "comm.priority": self.priority,
                        "comm.client_bandwidth_mbps": self.budget,
                        "comm.server_bandwidth_mbps": self.budget * workers / servers,
                        "comm.client_send_rows": spec.send_rows, "comm.server_push_rows": spec.send_rows})
        return out


def modes_for(spec: AppSpec, budgets: Sequence[float], ks: Sequence[int], largest: bool) -> list[Mode]:
    """BS, MC at every budget with R and RM, and at the largest worker count BS-k, BS with one
    mini-batch per clock (the apps as they read before the live cache: the overhead reference) and SN
    (one worker: every read fresh, the fewest epochs any mode can hope for)."""
    modes = [Mode("BS")]
    for x in budgets:
        modes += [Mode(f"MC-{x:g}-R", budget=x, priority="random"), Mode(f"MC-{x:g}-RM", budget=x, priority="relative")]
    if largest:
        modes += [Mode(f"BS-{k}", clocks_per_epoch=k) for k in ks]
        modes.append(Mode("BS/b1", batches_per_clock=1))
        modes.append(Mode("SN", workers=1))
    return modes


def servers_count(choice: str, workers: int, config_servers: int) -> int:
    """``--servers``: a number, 'config' or 'auto'."""
    if choice == "auto":
        return servers_for(workers)
    if choice == "config":
        return config_servers
    try:
        n = int(choice)
    except ValueError:
        raise SystemExit(f"[{BENCH}] --servers {choice!r}: a number, 'config' or 'auto'") from None
    if n < 1:
        raise SystemExit(f"[{BENCH}] --servers {n}: at least 1")
    return n


def _epochs(run: Run, target: float, epochs: int) -> tuple[int, bool]:
    e = run.epochs_to(target)
    return (e, True) if e is not None else (epochs + 1, False)


def _med(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def _target(bs: Run, frac: float) -> float:
    """The best objective BS reaches in its first ceil(frac * epochs) epochs: where BS improves
    steadily, its value there; where it turns unstable (stale SGD can), its best before that."""
    n = math.ceil(frac * int(bs.settings["_epochs"]))
    got = bs.objective[:n]
    if not got:
        raise SystemExit(f"[{BENCH}] BS run (seed {bs.seed}, P {bs.workers}) has no epoch: {bs.failure}")
    return max(got) if bs.maximize else min(got)


def scenario_app(app: str, args: argparse.Namespace) -> None:
    """BS vs MC-X-R vs MC-X-RM vs BS-k for one app at each worker count and seed (module docstring)."""
    spec = (REAL_APPS if args.data == "real" else APPS)[app]
    quick = args.quick
    epochs = args.epochs or (spec.quick_epochs if quick else spec.epochs)
    workers = args.workers or ([4] if quick else [4, 8])
    seeds = args.seeds or ([0] if quick else [0, 1, 2])
    budgets = args.budgets or (spec.quick_budgets if quick else spec.budgets)
    ks = args.ks or ([2] if quick else [2, 4, 8])
    data = spec.quick_data if quick else spec.data
    work, timeout, cfg = Path(args.work), args.job_timeout, CONFIGS / spec.config
    extra = dict(_key_value(kv) for kv in args.sets)
    config_servers = len(yaml.safe_load(cfg.read_text())["cluster"]["servers"])
    tag = f"{app}{'-real' if spec.dataset else ''}{'-quick' if quick else ''}{args.tag}"
    if spec.dataset:
        data = {**data, **_prepared(spec.dataset, yaml.safe_load(cfg.read_text())["app"]["args"])}
    warm = {**data, **spec.common, spec.epochs_key: 1, "cluster.workers": 2, "app.args.batches_per_clock": 2}
    launch(f"warmup-{app}", cfg, warm, 1, work, timeout)  # numba caches filled before any timed run
    runs: dict[int, dict[str, list[Run]]] = {}
    targets: dict[tuple[int, int], float] = {}
    for P in workers:
        modes = [m for m in modes_for(spec, budgets, ks, P == max(workers)) if not args.modes or m.name in args.modes]
        if "BS" not in {m.name for m in modes}:
            raise SystemExit(f"[{BENCH}] --modes must include BS: the targets are BS's")
        servers = servers_count(args.servers, P, config_servers)
        runs[P] = {m.name: [] for m in modes}
        for seed in seeds:  # modes alternate within a seed, so machine noise spreads over all of them
            for m in modes:
                n_epochs = args.sn_epochs if m.name == "SN" and args.sn_epochs else epochs
                sets = {"metrics.freshness_every": FRESHNESS_EVERY, **data, **spec.common, **extra,
                        spec.epochs_key: n_epochs, "cluster.workers": m.workers or P,
                        "cluster.servers": ["127.0.0.1:0"] * servers, SEED_KEY: seed,
                        **m.sets(spec, m.workers or P, servers)}
                if m.budget is not None:  # --comm-set: managed communication's own knobs (e.g. push_to)
                    sets.update(args.comm_set)
                # with ll_every = k only an epoch's last clock has an objective: one record per epoch
                per_epoch = 1 if spec.ll_every else m.clocks_per_epoch
                run = launch(f"{app}-P{P}-{m.name.replace('/', '_')}", cfg, sets, per_epoch, work,
                             timeout, seed=seed, workers=P, aggregate=spec.aggregate, maximize=spec.maximize)
                run.name = m.name
                run.settings["_epochs"] = n_epochs
                runs[P][m.name].append(run)
            targets[(P, seed)] = _target(runs[P]["BS"][-1], args.target_frac)
        _report_app(app, spec, P, runs[P], targets, epochs, budgets, ks if P == max(workers) else [])
    out = Path(args.out)
    mid = {P: statistics.median(targets[(P, s)] for s in seeds) for P in workers}
    app_figure(out / f"convergence-{tag}.png", f"{app.upper()}", spec.ylabel, runs, mid)
    P = max(workers)
    hists = {name: _sum_hists([r.send_counts(spec.table) for r in rs]) for name, rs in runs[P].items()
             if name.startswith("MC-")}
    send_count_figure(out / f"convergence-{tag}-sendcounts.png",
                      f"{app.upper()} P = {P}: how often each row's updates left a client (table {spec.table})", hists)
    log(f"[{BENCH}] plots: {out}/convergence-{tag}.png, -sendcounts.png")


def _prepared(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """Prepare data set ``name`` into REPO/data/NAME when missing; the config's data paths made
    absolute (jobs run in their own directories)."""
    from bosen.apps import datasets

    if not (REPO / "data" / name / "dataset.json").is_file():
        log(f"[{BENCH}] bosen data {name} ...")
        datasets.prepare(name, REPO / "data" / name)
    return {f"app.args.{k}": str(REPO / args[k]) for k in ("data", "test_data") if args.get(k)}


def _sum_hists(hs: Sequence[dict[int, int]]) -> dict[int, int]:
    out: dict[int, int] = {}
    for h in hs:
        for k, v in h.items():
            out[k] = out.get(k, 0) + v
    return out


def _report_app(app: str, spec: AppSpec, P: int, by_mode: dict[str, list[Run]],
                targets: dict[tuple[int, int], float], epochs: int, budgets: Sequence[float],
                ks: Sequence[int]) -> None:
    """Per run, per mode (median over seeds) and per goal: one JSON line each."""
    base = {"bench": BENCH, "app": app, "workers": P, "epochs_run": epochs}
    summary: dict[str, dict[str, Any]] = {}
    bs_egress = {r.seed: r.egress_mbps() for r in by_mode.get("BS", [])}  # per client, Mbps
    for name, rs in by_mode.items():
        per = []
        for r in rs:
            budget, bs_mbps = r.settings.get("comm.client_bandwidth_mbps"), bs_egress.get(r.seed)
            t = targets[(P, r.seed)]
            e, reached = _epochs(r, t, int(r.settings["_epochs"]))
            c = r.client_totals()
            row = {"epochs": e, "reached": reached, "seconds": r.seconds_to(t), "bytes": r.bytes_to(t),
                   "seconds_per_epoch": r.seconds_per_epoch(), "bytes_per_epoch": r.bytes_per_epoch(),
                   "budget_use": r.budget_use(),
                   # the budget as a multiple of BS's own egress (same seed): < 1 means the budget binds
                   # before MC sends more than BS would
                   "budget_over_bs_egress": float(budget) / bs_mbps if budget and bs_mbps else None,
                   "early_read_share": c["rows_read_early"] / c["rows_read"] if c["rows_read"] else None,
                   "read_staleness_mean": c["read_staleness_sum"] / c["rows_read"] if c["rows_read"] else None,
                   # content freshness: of the rows probed, inc operations of other workers the
                   # servers had applied that the value read lacked (an upper bound:
                   # docs/design.md, "Freshness probes"), and the value's age at the read (ms since
                   # its server sent it)
                   "missing_updates_per_read": (c["missing_updates_sum"] / c["freshness_probed_rows"]
                                                if c["freshness_probed_rows"] else None),
                   "content_age_ms": (1000 * c["content_age_sum"] / c["freshness_probed_rows"]
                                      if c["freshness_probed_rows"] else None),
                   "rows_pushed_early_share": (c["rows_pushed_early_to_us"] / c["rows_pushed_to_us"]
                                               if c["rows_pushed_to_us"] else None),
                   "budgeted_row_share": c["rows_sent_budgeted"] / c["rows_sent"] if c["rows_sent"] else None,
                   "blocked_s": c["blocked_s"], **r.server_totals()}
            per.append(row)
            emit(**base, case=f"{app}/P{P}/{name}/seed{r.seed}", metric="epochs_to_target", unit="epochs",
                 ours=e, target=t, final=r.objective[-1] if r.objective else None, failed=r.failure,
                 **{k: v for k, v in row.items() if k != "epochs"})
        s = {k: _med([p[k] for p in per]) for k in per[0] if k not in ("reached",)}
        s["epochs_min"] = min(p["epochs"] for p in per)
        s["epochs_max"] = max(p["epochs"] for p in per)
        s["reached"] = sum(p["reached"] for p in per)
        summary[name] = s
    bs = summary["BS"]
    for name, s in summary.items():
        extra = {} if name == "BS" else {
            "baseline": bs["epochs"], "baseline_name": "BS", "ratio": bs["epochs"] / s["epochs"],
            "seconds_ratio": (bs["seconds"] / s["seconds"]) if bs["seconds"] and s["seconds"] else None}
        emit(**base, case=f"{app}/P{P}/{name}", metric="epochs_to_target_median", unit="epochs", ours=s["epochs"],
             seeds=len(by_mode[name]), **{k: v for k, v in s.items() if k != "epochs"}, **extra)
    _goals(app, P, summary, budgets, ks, base)


def _goal(base: dict[str, Any], case: str, goal: str, met: bool, **fields: Any) -> None:
    emit(**base, case=case, goal=goal, met=bool(met), **fields)


def _goals(app: str, P: int, s: dict[str, dict[str, Any]], budgets: Sequence[float], ks: Sequence[int],
           base: dict[str, Any]) -> None:
    """Issue 27's goals, as measured in this run (``met`` says whether each holds); a goal whose
    modes were left out (``--modes``) is not reported."""
    bs = s["BS"]
    budgets = [x for x in budgets if f"MC-{x:g}-RM" in s]
    ks = [k for k in ks if f"BS-{k}" in s]
    if not budgets:
        return
    rm = {x: s[f"MC-{x:g}-RM"] for x in budgets}
    r = {x: s[f"MC-{x:g}-R"] for x in budgets if f"MC-{x:g}-R" in s}
    best_x = min(budgets, key=lambda x: (rm[x]["epochs"], rm[x]["seconds"] or math.inf))
    best = rm[best_x]
    sn = s.get("SN")
    if sn is not None:  # gap closed: how much of the way from BS to fresh reads (SN) MC-RM gets
        gap = bs["epochs"] - sn["epochs"]
        closed = (bs["epochs"] - best["epochs"]) / gap if gap > 0 else None
        _goal(base, f"{app}/P{P}/goal/gap-closed", "(BS - MC-RM epochs) / (BS - SN epochs) >= 0.5",
              closed is not None and closed >= 0.5, metric="gap_closed", unit="fraction", ours=closed,
              ours_name=f"MC-{best_x:g}-RM", ours_epochs=best["epochs"], bs_epochs=bs["epochs"],
              sn_epochs=sn["epochs"])
    # no budget makes MC worse than BS beyond the seed spread (BS's worst seed)
    worst = max((m for m in s if m.startswith("MC-")), key=lambda m: s[m]["epochs"])
    _goal(base, f"{app}/P{P}/goal/no-budget-worse", "no MC mode's median epochs beyond BS's worst seed",
          s[worst]["epochs"] <= bs["epochs_max"], metric="epochs_to_target", unit="epochs", ours=s[worst]["epochs"],
          ours_name=worst, baseline=bs["epochs_max"], baseline_name="BS (worst seed)",
          ratio=bs["epochs_max"] / s[worst]["epochs"])
    # paid back: less wall time than BS and than the best BS-k, with fewer bytes than that BS-k
    secs_ok = best["seconds"] is not None and bs["seconds"] is not None and best["seconds"] < bs["seconds"]
    _goal(base, f"{app}/P{P}/goal/mc-rm-vs-bs-seconds", "MC-RM reaches the target in less wall time than BS",
          secs_ok, metric="seconds_to_target", unit="s", ours=best["seconds"], ours_name=f"MC-{best_x:g}-RM",
          baseline=bs["seconds"], baseline_name="BS",
          ratio=bs["seconds"] / best["seconds"] if best["seconds"] and bs["seconds"] else None)
    if ks:
        cand = [f"BS-{k}" for k in ks if s[f"BS-{k}"]["seconds"] is not None]
        if cand:
            bk = min(cand, key=lambda n: s[n]["seconds"])
            cheap = [x for x in budgets if rm[x]["bytes"] is not None and s[bk]["bytes"] is not None
                     and rm[x]["bytes"] < s[bk]["bytes"] and rm[x]["seconds"] is not None]
            pick = min(cheap, key=lambda x: rm[x]["seconds"]) if cheap else best_x
            m = rm[pick]
            _goal(base, f"{app}/P{P}/goal/mc-rm-vs-best-bs-k", "MC-RM beats the best BS-k in wall time with fewer "
                  "bytes", bool(cheap) and m["seconds"] < s[bk]["seconds"], metric="seconds_to_target", unit="s",
                  ours=m["seconds"], ours_name=f"MC-{pick:g}-RM", baseline=s[bk]["seconds"], baseline_name=bk,
                  ratio=s[bk]["seconds"] / m["seconds"] if m["seconds"] else None,
                  bytes_ratio=(m["bytes"] / s[bk]["bytes"]) if m["bytes"] and s[bk]["bytes"] else None)
    # priority matters where the budget binds (>= 90% used)
    for x in r:
        binds = (rm[x]["budget_use"] or 0) >= 0.9 and (r[x]["budget_use"] or 0) >= 0.9
        _goal(base, f"{app}/P{P}/goal/rm-vs-r-{x:g}", "at a binding budget (>= 90% used) RM needs <= 0.85x the "
              "epochs of R", binds and rm[x]["epochs"] <= 0.85 * r[x]["epochs"], metric="epochs_to_target",
              unit="epochs", ours=rm[x]["epochs"], baseline=r[x]["epochs"], baseline_name=f"MC-{x:g}-R",
              ratio=r[x]["epochs"] / rm[x]["epochs"], binding=binds, budget_use=rm[x]["budget_use"])
    # content freshness: updates a read misses, MC-RM against BS
    miss = "missing_updates_per_read"
    if bs.get(miss) is not None and best.get(miss) is not None:
        _goal(base, f"{app}/P{P}/goal/freshness", "reads under MC-RM miss <= 0.5x the updates BS's miss",
              best[miss] <= 0.5 * bs[miss], metric=miss, unit="updates", ours=best[miss],
              ours_name=f"MC-{best_x:g}-RM", baseline=bs[miss], baseline_name="BS",
              ratio=bs[miss] / best[miss] if best[miss] else None)
    lo = min(budgets)
    ov = (r[lo]["seconds_per_epoch"] if lo in r else None), rm[lo]["seconds_per_epoch"]
    if bs["seconds_per_epoch"] and all(ov):
        slow = max(v for v in ov if v is not None)
        _goal(base, f"{app}/P{P}/goal/mc-overhead-per-epoch", "MC's time per epoch <= 1.15x BS's at the smallest "
              "budget", slow <= 1.15 * bs["seconds_per_epoch"], metric="seconds_per_epoch", unit="s", ours=slow,
              baseline=bs["seconds_per_epoch"], baseline_name="BS", ratio=bs["seconds_per_epoch"] / slow)
    b1 = s.get("BS/b1")
    if b1 and b1["seconds_per_epoch"] and bs["seconds_per_epoch"]:
        _goal(base, f"{app}/P{P}/goal/minibatch-overhead", "BS with mini-batches on the live cache costs <= 1.10x "
              "BS reading once per clock, per epoch", bs["seconds_per_epoch"] <= 1.10 * b1["seconds_per_epoch"],
              metric="seconds_per_epoch", unit="s", ours=bs["seconds_per_epoch"], baseline=b1["seconds_per_epoch"],
              baseline_name="BS/b1", ratio=b1["seconds_per_epoch"] / bs["seconds_per_epoch"])


SCENARIOS: dict[str, Callable[[argparse.Namespace], None]] = {
    "lda": lambda a: scenario_app("lda", a),
    "mf": lambda a: scenario_app("mf", a),
    "mlr": lambda a: scenario_app("mlr", a),
    "adarev": scenario_adarev,
}


def _key_value(kv: str) -> tuple[str, Any]:
    key, sep, value = kv.partition("=")
    if not sep or not key:
        raise SystemExit(f"[{BENCH}] --set {kv!r}: expected KEY=VALUE")
    return key, yaml.safe_load(value)


def _ints(v: str) -> list[int]:
    return [int(x) for x in v.split(",")]


def _floats(v: str) -> list[float]:
    return [float(x) for x in v.split(",")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all", help="all = lda, mf, mlr, adarev")
    p.add_argument("--quick", action="store_true", help="small data, P = 4, one seed, one budget (CI)")
    p.add_argument("--data", choices=["synthetic", "real"], default="synthetic",
                   help="lda, mf, mlr: generated data, or the real data sets of `bosen data` (news, MovieLens-100K, "
                        "Fashion-MNIST)")
    p.add_argument("--out", default=str(REPO / "bench" / "out"), help="where plots go")
    p.add_argument("--work", default=None, help="keep run directories here (default: a temporary folder)")
    p.add_argument("--job-timeout", type=float, default=900.0, help="seconds one job may take")
    p.add_argument("--epochs", type=int, default=None, help="epochs per job")
    p.add_argument("--workers", type=_ints, default=None, help="worker processes, e.g. 4,8 (default 4,8)")
    p.add_argument("--seeds", type=_ints, default=None, help="seeds, e.g. 0,1,2 (default)")
    p.add_argument("--budgets", type=_floats, default=None, help="MC budgets in Mbps per process, e.g. 4,16")
    p.add_argument("--ks", type=_ints, default=None, help="BS-k clocks per pass (default 2,4,8)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="lda, mf, mlr: a config override for every job (after the app's own), e.g. app.args.lr=0.01")
    p.add_argument("--sn-epochs", type=int, default=None,
                   help="epochs of SN (one worker: the slowest per epoch), if fewer are enough to reach the target")
    p.add_argument("--modes", type=lambda v: v.split(","), default=None,
                   help="run only these modes, e.g. BS,MC-40-RM,SN (default: all; goals need their modes)")
    p.add_argument("--servers", default="auto",
                   help="server processes: a number, 'config' (the config's list) or 'auto' (servers_for(P), "
                        f"one per {WORKERS_PER_SERVER} worker processes, the default)")
    p.add_argument("--target-frac", type=float, default=0.75,
                   help="target = BS's best objective within this fraction of the epochs (per seed and P)")
    p.add_argument("--tag", default="", help="suffix of the plot names")
    p.add_argument("--link-mbit", type=float, default=None,
                   help="run inside a network namespace whose loopback is shaped to this rate (needs root)")
    p.add_argument("--target", type=float, default=None, help="adarev: target training loss (default 2.5 x floor)")
    p.add_argument("--alphas", type=_floats, default=None, help="adarev: AdaRevision initial step sizes")
    p.add_argument("--lrs", type=_floats, default=None, help="adarev: SGD initial learning rates")
    p.add_argument("--clocks-per-epoch", type=int, default=None, help="adarev: mini-batches (clocks) per epoch")
    p.add_argument("--comm-set", type=_comm_set, action="append", default=[],
                   help="a comm key for the MC runs, e.g. push_to=subscribers (repeatable)")
    args = p.parse_args(argv)
    args.comm_set = dict(kv for kv in args.comm_set)
    if args.link_mbit is not None:
        rest = list(argv if argv is not None else sys.argv[1:])
        i = rest.index("--link-mbit")
        return shaped_link.run_inside([sys.executable, "-m", "bench.convergence", *rest[:i], *rest[i + 2:],
                                       f"--tag={args.tag}-link{args.link_mbit:g}"], args.link_mbit,
                                      cwd=REPO, env=repo_env())
    with tempfile.TemporaryDirectory(prefix="bosen-conv-") as tmp:
        if args.work is None:
            args.work = tmp
        names = ["lda", "mf", "mlr", "adarev"] if args.scenario == "all" else [args.scenario]
        for name in names:
            SCENARIOS[name](args)
    return 0


def _comm_set(text: str) -> tuple[str, str]:
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE, e.g. push_to=subscribers")
    return f"comm.{key}", value


if __name__ == "__main__":
    raise SystemExit(main())
