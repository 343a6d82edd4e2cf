"""Pollux's agent on real MLR jobs (``apps/goodput.py``; docs/design.md, "Pollux (goodput)"): the
adaptive batch against a fixed M0 and a fixed large M, all synchronous (a ``backup: static`` table
with k = the workers), all through the same agent (the fixed ones measure φ alike and scale their
learning rate by AdaScale: the paper's baselines, P:347), and the chosen M under two bandwidth
budgets. ``bench.pollux --experiments adaptive`` runs them; one ``bosen launch`` per run."""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import REPO
from bosen.apps.goodput import table_spec

MODES = ("adaptive", "fixed-m0", "fixed-large")


@dataclass(frozen=True)
class Plan:
    """One job: ``mode``, ``iterations``, and the knobs all runs share."""

    mode: str
    iterations: int
    data: str = "fashion-mnist"
    # or "cnn": the PyTorch CNN example on Fashion-MNIST's images (``data`` unused), the servers' SGD; or
    # "cnn-adam": the same CNN in hybrid mode (all-reduce, a local Adam, the square-root rule)
    app: str = "mlr"
    train_samples: int = 20000  # cnn: the first training images, and the test images scored
    test_samples: int = 2000
    workers: int = 2
    m0_local: int = 32  # M0 = workers x m0_local
    large: int = 16  # fixed-large: M = large x M0
    lr: float = 0.1
    interval: int = 20
    seed: int = 0
    bandwidth_mbps: float | None = None  # managed communication at this client budget; None: unmanaged
    smoothing: float = 0.999  # the agent's φ smoothing per M0 step (AdaptDL's)
    delay_s: float = 0.0  # an injected round trip a step pays, from its read (``app.args.delay``, fixed)
    link_mbit: float | None = None  # the whole job in a network namespace whose loopback runs at this rate
    timeout: float = 600.0


@dataclass
class Run:
    """What one job gave: rank 0's held-out loss (mean per sample) and accuracy over (seconds since
    the first iteration, iteration), the agent's choices, the job's wall seconds."""

    plan: Plan
    job_seconds: float
    evals: list[tuple[float, int, float, float]] = field(default_factory=list)  # (s, it, loss, acc)
    choices: list[dict[str, float]] = field(default_factory=list)  # rank 0's goodput_* per interval
    startup: float = 0.0  # seconds from the launcher's start to the first iteration

    def time_to(self, target: float) -> float:
        """Seconds from the first iteration to the first evaluation at or below ``target``; inf if never."""
        return next((t for t, _, loss, _ in self.evals if loss <= target), math.inf)

    @property
    def best_loss(self) -> float:
        return min(loss for _, _, loss, _ in self.evals)

    @property
    def best_acc(self) -> float:
        return max(acc for *_, acc in self.evals)


def config(p: Plan) -> dict[str, Any]:
    """The job's config data (``bosen.jobs.job.job_config``)."""
    from bosen.jobs.job import job_config

    m0 = p.workers * p.m0_local
    adapt = p.mode == "adaptive"
    local = p.m0_local * (p.large if p.mode == "fixed-large" else 1)
    if p.app in ("cnn", "cnn-adam"):
        return _cnn_config(p, m0, adapt, local)
    data = "digits" if p.data == "digits" else str(REPO / "data" / p.data / "train.npz")
    geo = (10, 65) if p.data == "digits" else (10, 785)
    dtype = "float64" if p.bandwidth_mbps is None else "float32"  # managed: gradients travel as comm.wire_dtype
    tables = {"W": {"rows": geo[0], "cols": geo[1], "dtype": dtype, "init": {"zeros": True},
                    "backup": {"mode": "static", "k": p.workers, "lr": p.lr}},
              "goodput": table_spec(p.iterations // p.interval + 1)}
    app = {"module": "bosen.apps.mlr",
           "args": {"data": data, "holdout": 0.05 if p.data != "digits" else 0.1, "batch_size": local,
                    "reg": 1.6667e-5, "epochs": p.iterations, "eval_every": p.interval, "seed": p.seed,
                    "goodput": {"interval_clocks": p.interval, "m0": m0, "adapt": adapt,
                                "smoothing": p.smoothing},
                    **({"delay": {"mean_s": p.delay_s, "alpha": 0.0}} if p.delay_s else {})}}
    comm = None if p.bandwidth_mbps is None else {"enabled": True, "client_bandwidth_mbps": p.bandwidth_mbps}
    return job_config(["127.0.0.1:0"], p.workers, tables=tables, app=app, comm=comm)


def _cnn_config(p: Plan, m0: int, adapt: bool, local: int) -> dict[str, Any]:
    """The CNN example on a synchronous table (its model's table declared by ``app.tables``), or in
    hybrid mode with Adam (``cnn-adam``: no table for the model, the square-root rule)."""
    from bosen.jobs.job import job_config

    if p.bandwidth_mbps is not None or p.delay_s:
        raise ValueError(f"bench.pollux adaptive: --adaptive-app {p.app} runs without budgets or injected delays")
    args: dict[str, Any] = {"lr": p.lr, "batch_size": local, "seed": p.seed, "iterations": p.iterations,
                            "eval_every": p.interval, "train_samples": p.train_samples,
                            "test_samples": p.test_samples,
                            "goodput": {"interval_clocks": p.interval, "m0": m0, "adapt": adapt, "max_local": 1024,
                                        "smoothing": p.smoothing}}
    app: dict[str, Any] = {"module": "bosen.apps.pytorch.examples.cnn", "args": args}
    if p.app == "cnn-adam":
        args.update(optimizer="delta-adam", dense="allreduce")
        args["goodput"]["rule"] = "sqrt"
    else:
        args.update(optimizer="sgd", backup={"mode": "static", "k": p.workers})
        app["tables"] = "bosen.apps.pytorch.examples.cnn:tables"
    return job_config(["127.0.0.1:0"], p.workers, tables={"goodput": table_spec(p.iterations // p.interval + 1)},
                      app=app)


@contextlib.contextmanager
def shaped_loopback(mbit: float) -> Iterator[str]:
    """A network namespace (its name) whose loopback sends ``mbit`` Mbit/s (``tc tbf``, MTU 1500 so
    every packet fits the bucket): a job run inside has every byte between its processes share one
    slow link. Needs root and iproute2 (``ip``, ``tc``)."""
    ns = f"bosenlink{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True, text=True)
    try:
        for cmd in (["ip", "link", "set", "lo", "mtu", "1500"], ["ip", "link", "set", "lo", "up"],
                    ["tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", f"{mbit:g}mbit", "burst", "32kbit",
                     "latency", "400ms"]):
            subprocess.run(["ip", "netns", "exec", ns, *cmd], check=True, capture_output=True, text=True)
        yield ns
    finally:
        for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), 9)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _launch_in(ns: str, path: Path, run_dir: Path, timeout: float) -> Any:
    """``bosen launch`` inside namespace ``ns``: the launcher, its servers and workers all there."""
    from bosen.jobs.job import JobRun, read_metrics

    run_dir.mkdir(parents=True)
    log = run_dir.parent / "launch.log"
    t0 = time.monotonic()
    with open(log, "w") as out:
        code = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "bosen", "launch", str(path),
                               "--run-dir", str(run_dir), "--timeout", repr(timeout), "--quiet", "--no-plot"],
                              cwd=REPO, stdout=out, stderr=subprocess.STDOUT, timeout=timeout + 60).returncode
    return JobRun(run_dir, code, time.monotonic() - t0, log, read_metrics(run_dir))


def run(p: Plan) -> Run:
    """Launch the job and read rank 0's records."""
    from bosen.jobs.job import run_job, write_config

    with tempfile.TemporaryDirectory() as tmp:
        path = write_config(Path(tmp) / "job.yaml", config(p))
        if p.link_mbit is None:
            job = run_job(path, Path(tmp) / "run", timeout=p.timeout, cwd=REPO).check()
        else:
            with shaped_loopback(p.link_mbit) as ns:
                job = _launch_in(ns, path, Path(tmp) / "run", p.timeout).check()
    mine = sorted((r for r in job.kind("worker") if r.get("rank") == 0 and "iteration" in r),
                  key=lambda r: r["iteration"])
    t0 = float(mine[0]["time"])
    out = Run(p, job.seconds, startup=t0)
    for r in mine:
        if "heldout_loss" in r:
            out.evals.append((float(r["time"]) - t0, int(r["iteration"]), r["heldout_loss"] / r["heldout_total"],
                              r["heldout_correct"] / r["heldout_total"]))
        if "goodput_batch" in r:
            out.choices.append({k: r[k] for k in r if k.startswith("goodput_")} | {"iteration": r["iteration"]})
    return out


def grows(ms: list[float]) -> dict[str, float]:
    """How the chosen M moved over a run: the median of its first and of its second half (the first
    interval, M0 before any choice, left out), and their ratio."""
    xs = ms[1:] if len(ms) > 2 else ms
    half = len(xs) // 2
    first, second = sorted(xs[:half] or xs), sorted(xs[half:])
    a, b = first[len(first) // 2], second[len(second) // 2]
    return {"first_half": a, "second_half": b, "ratio": b / a if a else math.nan}


def plot(runs: dict[str, list[Run]], budgets: dict[str, list[Run]], target: float, path: Path) -> Path:
    """Held-out loss against seconds per mode (every repetition), and the chosen M over the adaptive
    runs (and under each sync cost: a budget, an injected round trip), with φ."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    colors = {"adaptive": "C0", "fixed-m0": "C1", "fixed-large": "C2"}
    for mode, rs in runs.items():
        for i, r in enumerate(rs):
            ax.plot([t for t, *_ in r.evals], [x[2] for x in r.evals], color=colors.get(mode, "k"), lw=1.0,
                    alpha=0.8, label=mode if i == 0 else None)
    ax.axhline(target, color="k", lw=0.6, ls=":", label=f"target {target}")
    ax.set_xlabel("seconds since the first iteration")
    ax.set_ylabel("held-out loss (mean per example)")
    ax.set_ylim(max(0.0, target - 0.1), target + 0.6)
    ax.legend(fontsize=8)
    app = next((r.plan.app for rs in runs.values() for r in rs), "mlr").upper()
    large = next((r.plan.large for rs in runs.values() for r in rs), 16)
    ax.set_title(f"{app}, 2 workers: adaptive batch vs fixed M0 and {large}·M0")
    series = [("unmanaged", runs.get("adaptive", []), "C0")]
    series += [(label, rs, f"C{3 + i}") for i, (label, rs) in enumerate(budgets.items())]
    for label, rs, color in series:
        for i, r in enumerate(rs):
            bx.step([c["iteration"] for c in r.choices], [c["goodput_batch"] for c in r.choices], where="post",
                    color=color, lw=1.0, alpha=0.8, label=f"M, {label}" if i == 0 else None)
    if runs.get("adaptive"):
        r = runs["adaptive"][0]
        cx = bx.twinx()
        cx.plot([c["iteration"] for c in r.choices if c["goodput_phi"] > 0],
                [c["goodput_phi"] for c in r.choices if c["goodput_phi"] > 0], color="gray", lw=0.8, ls="--")
        cx.set_ylabel("φ (examples), unmanaged run 0", color="gray")
    bx.set_yscale("log", base=2)
    bx.set_xlabel("iteration")
    bx.set_ylabel("chosen total batch M")
    bx.legend(fontsize=8, loc="upper left")
    bx.set_title("the agent's choice over training")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
