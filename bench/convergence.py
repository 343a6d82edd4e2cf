"""Convergence benchmark (docs/design.md, "Benchmarks"): the Bösen evaluation in miniature, run as real jobs.

    python bench/convergence.py [--scenario adarev|managed|all] [--quick] [--out bench/out]

Every job is ``python -m bosen launch CONFIG --set ...`` (servers and workers as processes, run by
``bosen.jobs.run_job``); the bench reads ``RUN_DIR/metrics.jsonl`` (per-clock objective summed over
workers) and turns it into a per-epoch curve: epoch e's loss is the sum of its clocks' objectives
(the running training loss).
Each result is one JSON line on stdout (progress on stderr) with ``bench="convergence"``, ``case``,
``metric``, ``unit``, ``ours`` and, where a baseline ran in the same invocation, ``baseline``,
``baseline_name`` and ``ratio`` (> 1 means ours is better); a plot per scenario goes to ``--out``.

Scenarios (add one by writing ``def scenario_NAME(args) -> None`` and listing it in SCENARIOS):

adarev -- thesis §3.2.3 / Fig 3.3 in miniature: SGD matrix factorization (apps/mf, synthetic
    Netflix-shaped ratings, 2 servers, 2 workers, staleness 2) with AdaRevision on the servers
    (``configs/mf-adarev.yaml``: workers send mini-batch gradients, one clock per mini-batch) at
    initial step sizes alpha spanning 5x, against worker-side SGD with multiplicative decay
    (``configs/mf.yaml``: lr * 0.95^epoch, deltas to ``add`` tables, same mini-batches per epoch)
    at initial steps spanning 5x. Per run: epochs (and seconds) until the epoch loss first reaches
    the target (default 2.5 x the noise floor nnz * noise^2; --quick: 5 x, smaller data). Summary
    lines: AdaRevision's worst and best alpha against the best decay schedule (ratio = decay epochs /
    AdaRevision epochs; the thesis saw 2x), and sensitivity (max/min epochs over the step sizes of each method; ratio =
    decay's spread / AdaRevision's). A run that never reaches the target counts as ``epochs + 1``
    (a lower bound) and says ``reached: false``.

managed -- BS vs MC-X-R vs MC-X-RM (thesis Fig 3.4/3.6 in miniature): MF from configs/mf.yaml with 10
    mini-batches per clock (each re-reads its rows from the cache), plain bounded staleness against
    managed communication at per-process budgets X with random (R) and relative-magnitude (RM)
    priority; 4 workers, lr 0.02. Target = the best loss BS reaches; ratio = BS epochs / MC epochs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, log  # noqa: E402

from bosen.jobs import run_job  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs"
BENCH = "convergence"


# ----------------------------------------------------------------------------------------------
# running jobs


@dataclass
class Run:
    """One finished job: its name, per-epoch loss and end time, and the servers' final stats."""

    name: str
    losses: list[float]
    times: list[float]
    seconds: float
    servers: list[dict[str, Any]] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    failure: str | None = None  # the job stopped early (e.g. SGD diverged: non-finite deltas)

    def epochs_to(self, target: float) -> int | None:
        """1-based index of the first epoch whose loss is <= target (None: never)."""
        for e, loss in enumerate(self.losses):
            if loss <= target:
                return e + 1
        return None

    def seconds_to(self, target: float) -> float | None:
        e = self.epochs_to(target)
        return None if e is None else self.times[e - 1]


def launch(name: str, config: Path, sets: dict[str, Any], clocks_per_epoch: int, work: Path,
           timeout: float) -> Run:
    """Run one job with ``bosen launch`` and return its per-epoch curve."""
    log(f"[{BENCH}] {name}: {config.name} {' '.join(f'{k}={v}' for k, v in sets.items())}")
    job = run_job(config, work / name, sets=sets, timeout=timeout, cwd=REPO)
    failure = None
    if not job.ok:
        lines = [x.strip() for x in job.output().splitlines() if x.strip()]
        failure = next((x for x in reversed(lines) if x.startswith("worker")), lines[-1] if lines else "?")
        log(f"[{BENCH}] {name}: job failed ({job.returncode}): {failure}")
    clocks = sorted(job.kind("clock"), key=lambda x: x["clock"])
    n = len(clocks) // clocks_per_epoch
    losses = [sum(c["objective"] for c in clocks[e * clocks_per_epoch:(e + 1) * clocks_per_epoch]) for e in range(n)]
    times = [max(c["time"] for c in clocks[e * clocks_per_epoch:(e + 1) * clocks_per_epoch]) for e in range(n)]
    if failure is None and n == 0:
        failure = "no complete epoch"
    run = Run(name, losses, times, job.seconds, job.kind("server"), dict(sets), failure)
    log(f"[{BENCH}] {name}: {run.seconds:.1f}s, epoch losses {[round(x) for x in losses]}")
    return run


def plot(path: Path, title: str, target: float, groups: Sequence[tuple[str, Sequence[Run]]]) -> None:
    """Loss per epoch (log scale) of every run, one line style per group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = ["-", "--", ":", "-."]
    for (label, runs), style in zip(groups, styles, strict=False):
        for run in runs:
            ax.plot(range(1, len(run.losses) + 1), run.losses, style, marker=".",
                    label=f"{label} {run.name}{' (stopped: diverged)' if run.failure else ''}")
    ax.axhline(target, color="gray", lw=0.8, label="target")
    ax.set_yscale("log")
    ax.set_xlabel("epoch")
    ax.set_ylabel("training loss (sum over the epoch)")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    log(f"[{BENCH}] plot: {path}")


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
    sgd = [launch(f"lr={lr:g}", CONFIGS / "mf.yaml", {**common, "app.args.lr": lr, "app.args.lr_decay": 0.95}, k,
                  work, timeout)
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
                 reached=reached, seconds_to_target=s, final_loss=run.losses[-1] if run.losses else None,
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
    plot(Path(args.out) / f"convergence-adarev{'-quick' if args.quick else ''}.png",
         f"MF: AdaRevision (alpha) vs SGD with x0.95/epoch decay (lr), {k} clocks/epoch", target,
         [("adarevision", ada), ("sgd-decay", sgd)])


def scenario_managed(args: argparse.Namespace) -> None:
    """BS vs MC-X-R vs MC-X-RM on MF (configs/mf.yaml, same data, seed and step sizes).

    Workers run ``batches_per_clock`` mini-batches per clock and re-read their rows from the cache
    before each, so values that managed communication delivers early are used within the clock.
    The target is the best loss BS reaches in its run ("the same training loss"); each MC run reports
    epochs and seconds to it, ratio = BS epochs / MC epochs (> 1: fewer epochs)."""
    if args.quick:
        data = {"tables.L.rows": 4000, "tables.R.rows": 1000, "app.args.nnz": 100_000}
        epochs, budgets = 10, [200]
    else:
        data = {}
        epochs, budgets = 20, [50, 200]
    epochs = args.epochs or epochs
    work = Path(args.work)
    timeout = args.job_timeout
    # 4 workers: enough data parallelism for staleness to matter; lr 0.02 keeps BS stable longest
    common = {**data, "cluster.workers": 4, "app.args.epochs": epochs, "app.args.batches_per_clock": 10,
              "app.args.lr": 0.02}
    launch("warmup-mf", CONFIGS / "mf.yaml", {"tables.L.rows": 300, "tables.R.rows": 100, "app.args.nnz": 3000,
                                               "app.args.epochs": 1}, 1, work, timeout)
    bs = launch("BS", CONFIGS / "mf.yaml", common, 1, work, timeout)
    runs = []
    for mbps in budgets:
        for pol, tag in (("random", "R"), ("relative", "RM")):
            sets = {**common, "comm.enabled": True, "comm.priority": pol, "comm.client_bandwidth_mbps": mbps,
                    "comm.server_bandwidth_mbps": mbps}
            runs.append(launch(f"MC-{mbps}-{tag}", CONFIGS / "mf.yaml", sets, 1, work, timeout))
    if not bs.losses:
        raise SystemExit(f"[{BENCH}] BS run failed: {bs.failure}")
    target = min(bs.losses)  # BS's best (its curve can turn unstable late)
    bs_epochs = bs.epochs_to(target)
    base = {"bench": BENCH, "target_loss": target, "epochs_run": epochs, "batches_per_clock": 10}
    emit(**base, case="mf/BS", metric="epochs_to_target", unit="epochs", ours=bs_epochs,
         seconds_to_target=bs.seconds_to(target), seconds_per_epoch=bs.times[-1] / len(bs.times))
    for run in runs:
        e = run.epochs_to(target)
        mbytes = sum(srv.get("bytes_out", 0) + srv.get("bytes_in", 0) for srv in run.servers) / 1e6
        emit(**base, case=f"mf/{run.name}", metric="epochs_to_target", unit="epochs",
             ours=e if e is not None else epochs + 1, reached=e is not None, baseline=bs_epochs,
             baseline_name="BS", ratio=bs_epochs / (e if e is not None else epochs + 1),
             seconds_to_target=run.seconds_to(target), baseline_seconds=bs.seconds_to(target),
             seconds_per_epoch=run.times[-1] / len(run.times) if run.times else None,
             bs_seconds_per_epoch=bs.times[-1] / len(bs.times), server_traffic_mb=mbytes,
             final_loss=run.losses[-1] if run.losses else None, failed=run.failure)
    plot(Path(args.out) / f"convergence-managed{'-quick' if args.quick else ''}.png",
         "MF: bounded staleness (BS) vs managed communication (MC-Mbps-policy)", target,
         [("", [bs]), ("", runs)])


SCENARIOS: dict[str, Callable[[argparse.Namespace], None]] = {
    "adarev": scenario_adarev,
    "managed": scenario_managed,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    p.add_argument("--quick", action="store_true", help="small data, fewer runs (CI)")
    p.add_argument("--out", default=str(REPO / "bench" / "out"), help="where plots go")
    p.add_argument("--work", default=None, help="keep run directories here (default: a temporary folder)")
    p.add_argument("--target", type=float, default=None, help="adarev: target training loss (default 2.5 x floor)")
    p.add_argument("--job-timeout", type=float, default=900.0, help="seconds one job may take")
    p.add_argument("--alphas", type=lambda v: [float(x) for x in v.split(",")], default=None,
                   help="adarev: AdaRevision initial step sizes, comma-separated")
    p.add_argument("--lrs", type=lambda v: [float(x) for x in v.split(",")], default=None,
                   help="adarev: SGD initial learning rates, comma-separated")
    p.add_argument("--epochs", type=int, default=None, help="adarev: epochs per job")
    p.add_argument("--clocks-per-epoch", type=int, default=None, help="adarev: mini-batches (clocks) per epoch")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bosen-conv-") as tmp:
        if args.work is None:
            args.work = tmp
        names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
        for name in names:
            SCENARIOS[name](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
