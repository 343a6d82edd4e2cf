"""PyTorch workers on the PS beside DistributedDataParallel and a torch.distributed.rpc parameter server.

Two tasks, each on CPU with 2 worker processes, the same model, data, order and batch in every system
(``bench/torch/workers.py`` holds the loop they share):

- ``cnn``: the CNN example on Fashion-MNIST; held-out accuracy. Ours: local SGD pushing deltas
  (``DeltaOptimizer``, lr 0.1, a clock every 4 steps, staleness 1); DDP: SGD on the averaged gradient
  with lr 0.1 x 2 workers (the linear scaling rule: both then move 0.1 per 64 samples); RPC PS: the
  server takes an SGD step (lr 0.1) per trainer gradient.
- ``dlrm``: the DLRM example (fused sparse embedding) on Criteo-shaped data, 1M-row features; held-out
  AUC. Ours: server AdaGrad (lr 0.05), a clock every step (server-side steps cannot show a worker its
  own updates inside a clock; at 4 steps a clock it learned measurably slower per step), the embeddings
  at staleness 2 (and 0: ``ours-s0``), the dense parameters' table at the example's ``dense_staleness``
  (0), the next batch's embedding rows read in the background during each step
  (``PSModule.prefetch_rows``); ``ours-hybrid``: hybrid mode (``dense: allreduce``), the MLPs' gradients
  all-reduced and stepped by torch's AdaGrad on every rank (DDP's rule), the embeddings as ours; DDP:
  torch AdaGrad on the averaged gradient, sparse embedding gradients all-reduced sparse (gloo supports
  that, so DDP moves only the touched rows too); RPC PS: AdaGrad per trainer gradient on the server.

Measured: rank 0's training seconds (its held-out evaluations left out) until the held-out metric
first reaches the target, which is the best value every system reached in this run (so "the same
accuracy" is one all of them attain); the final metric once every worker has finished (DLRM: on a
larger held-out set, 200,000 samples, whose first 20,000 are the evaluation points' set: at 20,000 an
AUC's own sampling noise is about 0.004, twice the 0.002 the final-AUC goal allows). Repetition i
runs every system at seed i (the model's initial values and each worker's sample order; the data stay
the same), so a system's final metric pairs with DDP's at the same seed: the final-AUC goal takes the
median over seeds of ours less DDP, and ``{task}/final-<metric>-paired`` gives every difference with
the noise floor, DDP's own spread over the seeds (DDP is deterministic at one seed; ours also varies
with its update order); bytes moved,
summed over workers: ours (one server process: the machine has 2 cores for 2 workers already) from
the clients' stats (bytes_sent + bytes_received), DDP from a comm hook
(ring all-reduce: 2 (P-1)/P x bucket bytes each way; sparse buckets: every rank's coalesced rows and
ids to every other), RPC from the tensors each call carries. Systems alternate order between
repetitions. Goal records carry ``met``.

``python -m bench.torch [--quick] [--tasks cnn,dlrm] [--reps N] [--systems ours,ddp]`` prints JSON lines
(bench/common.py); ``--systems`` runs only those (the paired final metrics; the goals need ours, ddp, rpc).
``--tasks hybrid,split`` runs ``bench.torch.steps`` (issue 31: time per step of hybrid mode beside
DDP on the CNN; ResNet-18's step split, local against PS mode, without and with overlap).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import Child, emit, log, median, prewarm_memory, servers
from bosen.jobs.cluster import free_ports
from bosen.jobs.job import job_config

WORKERS = 2
STEP_CASES = ("hybrid", "split")  # bench/torch/steps.py's cases


def cases(quick: bool) -> dict[str, dict[str, Any]]:
    """Per task: its app.args, evaluation steps, and the systems with their optimizer settings."""
    if quick:
        cnn = {"train_samples": 12_000, "test_samples": 2000, "epochs": 1}
        dlrm = {"max_rows": 100_000, "train_samples": 60_000, "test_samples": 10_000}
    else:
        cnn = {"train_samples": 0, "test_samples": 10_000, "epochs": 1}
        dlrm = {"max_rows": 1_000_000, "train_samples": 400_000, "test_samples": 20_000}
    final = {"cnn": None, "dlrm": 40_000 if quick else 200_000}
    cnn_steps = (cnn["train_samples"] or 60_000) // WORKERS // 64
    dlrm_steps = dlrm["train_samples"] // WORKERS // 128
    return {
        "cnn": {"args": {**cnn, "batch_size": 64, "lr": 0.1, "optimizer": "delta-sgd", "clock_every": 4},
                "steps": cnn_steps, "final_samples": final["cnn"], "evals": 4 if quick else 12,
                "metric": "heldout_accuracy",
                "systems": {"ours": {"optimizer": "delta-sgd", "lr": 0.1, "staleness": 1},
                            "ddp": {"optimizer": "sgd", "lr": 0.1 * WORKERS},
                            "rpc": {"optimizer": "sgd", "lr": 0.1}}},
        "dlrm": {"args": {**dlrm, "batch_size": 128, "lr": 0.05, "optimizer": "adagrad", "clock_every": 1,
                          "embedding": "fused"},
                 "steps": dlrm_steps, "final_samples": final["dlrm"], "evals": 3 if quick else 8,
                 "metric": "heldout_auc",
                 # ours-nopush: the embedding table with push: false (readers pull rows too old)
                 "systems": {"ours": {"optimizer": "adagrad", "lr": 0.05, "staleness": 2},
                             "ours-nopush": {"optimizer": "adagrad", "lr": 0.05, "staleness": 2,
                                             "args": {"push": False}},
                             # subscriptions that lapse after 8 clocks without a read (the default: never)
                             "ours-lapse8": {"optimizer": "adagrad", "lr": 0.05, "staleness": 2,
                                             "args": {"lapse": 8}},
                             **({} if quick else {"ours-s0": {"optimizer": "adagrad", "lr": 0.05, "staleness": 0}}),
                             # hybrid mode: the MLPs all-reduced and stepped by torch's AdaGrad on every
                             # rank (DDP's rule), the embeddings in the PS at staleness 2
                             "ours-hybrid": {"optimizer": "adagrad", "lr": 0.05, "staleness": 2,
                                             "args": {"dense": "allreduce"}},
                             # the same with the embeddings at staleness 0 (everything synchronous, as DDP);
                             # runs only when --systems names it
                             "ours-hybrid-s0": {"optimizer": "adagrad", "lr": 0.05, "staleness": 0,
                                                "args": {"dense": "allreduce"}, "named_only": True},
                             "ddp": {"optimizer": "adagrad", "lr": 0.05},
                             "rpc": {"optimizer": "adagrad", "lr": 0.05},
                             "ddp-dense": {"optimizer": "adagrad", "lr": 0.05, "max_steps": 8 if quick else 25}}},
    }


def tables(task: str, args: dict[str, Any], out: Path) -> dict[str, Any]:
    if task == "cnn":
        from bosen.apps.pytorch.examples import cnn
        return cnn.tables(args, out)
    from bosen.apps.pytorch.examples import dlrm
    return dlrm.tables(args, out)


def _wait(procs: list[Child], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for p in procs:
        code = p.wait(max(1.0, deadline - time.monotonic()))
        if code != 0:
            for q in procs:
                q.stop()
            raise RuntimeError(f"{p.name} exited with {code}:\n{p.tail(40)}")


def run_system(task: str, case: dict[str, Any], system: str, work: Path, table_cache: dict[str, Any],
               seed: int = 0) -> dict:
    """One run of one system: rank 0's evaluation points, final metric, bytes moved, wall seconds.
    ``seed``: the model's initial values and every worker's sample order (the data stay the same), so
    runs of different systems at one seed start from the same point and see the same batches."""
    cfg = case["systems"][system]
    kind = system.split("-")[0]
    steps = case["steps"]
    every = max(1, steps // case["evals"])
    evals = sorted({min(steps, every * (i + 1)) for i in range(case["evals"])} | {steps})
    args = {**case["args"], **cfg.get("args", {}), "seed": seed}
    base = {"task": task, "args": args, "epochs": 1, "evals": evals, "world": WORKERS, "seed": seed,
            "optimizer": cfg["optimizer"], "lr": cfg["lr"], "clock_every": case["args"]["clock_every"],
            "final_samples": case.get("final_samples")}
    run_dir = Path(tempfile.mkdtemp(prefix=f"{task}-{system}-", dir=work))
    outs = [run_dir / f"rank{r}.json" for r in range(WORKERS)]
    t0 = time.perf_counter()

    def spawn(name: str, spec: dict[str, Any]) -> Child:
        return Child(["-m", "bench.torch.workers", json.dumps(spec)], name, run_dir)

    if kind == "ours":
        key = (f"{task}-{system}" if "args" in cfg else task) + f"-seed{seed}"
        if key not in table_cache:
            table_cache[key] = tables(task, args, work / f"{key}-tables")
        job = job_config([], workers=WORKERS, tables=table_cache[key], staleness=cfg["staleness"],
                         read_timeout_s=300)
        with servers(job, int(cfg.get("servers", 1)), workdir=run_dir) as cluster:
            procs = [spawn(f"ours-{r}", {**base, "system": "ours", "rank": r, "config": str(cluster.path),
                                         "staleness": cfg["staleness"], "out": str(outs[r]),
                                         "dense": args.get("dense", "ps"),
                                         **{k: cfg[k] for k in ("read_ahead", "prefault") if k in cfg}})
                     for r in range(WORKERS)]
            _wait(procs, 900)
    elif kind == "ddp":
        port = free_ports(1)[0]
        extra = {"dense_embedding": True, "max_steps": cfg["max_steps"]} if system == "ddp-dense" else {}
        procs = [spawn(f"ddp-{r}", {**base, **extra, "system": "ddp", "rank": r, "port": port, "out": str(outs[r])})
                 for r in range(WORKERS)]
        _wait(procs, 900)
    else:
        port = free_ports(1)[0]
        ps = spawn("rpc-ps", {**base, "system": "rpc-ps", "port": port, "out": str(run_dir / "ps.json")})
        procs = [spawn(f"rpc-{r}", {**base, "system": "rpc-trainer", "rank": r, "port": port, "out": str(outs[r])})
                 for r in range(WORKERS)]
        _wait([*procs, ps], 900)
    wall = time.perf_counter() - t0
    res = [json.loads(o.read_text()) for o in outs]
    if "step_s" in res[0]:
        return {"step_s": res[0]["step_s"], "timed_steps": res[0]["steps"], "wall_s": wall,
                "bytes_per_step": sum(r["bytes_sent"] + r["bytes_received"] for r in res) / (cfg["max_steps"])}
    return {"points": res[0]["points"], "final": res[0]["final"], "train_s": res[0]["train_s"],
            "bytes": sum(r["bytes_sent"] + r["bytes_received"] for r in res), "wall_s": wall}


def time_to(points: list[dict[str, Any]], target: float) -> float | None:
    for p in points:
        if p["metric"] >= target:
            return float(p["train_s"])
    return None


def _median(xs: list[float | None]) -> float | None:
    """The median; None when some run never reached the target."""
    return median(xs) if xs and all(x is not None for x in xs) else None


def paired(finals: dict[str, list[float]], base: str = "ddp") -> dict[str, Any]:
    """Each system's final metric less ``base``'s at the same seed (``finals[s][i]``: seed i), median with
    [min-max]; and the noise floor: ``base``'s spread over seeds and its median |difference| between two
    seeds, which is how far apart two runs of the same system land by their seed alone."""
    b = finals[base]
    gaps = [abs(x - y) for i, x in enumerate(b) for y in b[i + 1:]]
    out: dict[str, Any] = {"noise_floor": {"system": base, "median": median(b), "min": min(b), "max": max(b),
                                           "pair_abs_diff_median": median(gaps) if gaps else None,
                                           "pair_abs_diff_max": max(gaps) if gaps else None}}
    for s, xs in finals.items():
        if s != base:
            d = [x - y for x, y in zip(xs, b, strict=True)]
            out[s] = {"diffs": d, "median": median(d), "min": min(d), "max": max(d)}
    return out


def selected(case: dict[str, Any], only: list[str] | None) -> list[str]:
    """The systems of ``case`` a run compares: those ``only`` names, else every one but those marked
    ``named_only`` (variants run to answer one question, which would lengthen every default run)."""
    return [s for s, c in case["systems"].items() if s != "ddp-dense"
            and (s in only if only is not None else not c.get("named_only"))]


def bench_task(task: str, case: dict[str, Any], reps: int, work: Path, quick: bool,
               only: list[str] | None = None) -> None:
    """Repetition i runs every system at seed i (the model's initial values and the sample order), in
    alternating order, so each system's final metric pairs with DDP's at the same seed."""
    systems = selected(case, only)
    runs: dict[str, list[dict]] = {s: [] for s in systems}
    cache: dict[str, Any] = {}
    for rep in range(reps):
        order = systems if rep % 2 == 0 else systems[::-1]  # interleave: no system always runs first
        for s in order:
            log(f"torch bench: {task} {s} (rep {rep + 1}/{reps}, seed {rep}, load {os.getloadavg()[0]:.1f})")
            r = run_system(task, case, s, work, cache, seed=rep)
            log(f"  final {r['final']:.4f}, train {r['train_s']:.1f} s, wall {r['wall_s']:.1f} s, "
                f"{r['bytes'] / 1e6:.1f} MB")
            runs[s].append(r)
    # the target: the best metric every run of every system reached
    target = min(max(p["metric"] for p in r["points"]) for rs in runs.values() for r in rs)
    summary = {}
    for s, rs in runs.items():
        summary[s] = {"seconds": _median([time_to(r["points"], target) for r in rs]),
                      "final": median(r["final"] for r in rs), "bytes": median(r["bytes"] for r in rs),
                      "train_s": median(r["train_s"] for r in rs), "train_s_all": [r["train_s"] for r in rs],
                      "final_all": [r["final"] for r in rs],
                      "curve": [[p["train_s"], p["metric"]] for p in rs[0]["points"]]}
    base = {"bench": "torch", "quick": quick, "workers": WORKERS, "reps": reps, "args": case["args"],
            "seeds": list(range(reps))}
    names = {"ddp": "DistributedDataParallel (gloo)", "rpc": "torch.distributed.rpc parameter server"}
    pairs = paired({s: v["final_all"] for s, v in summary.items()}) if "ddp" in summary else None
    if pairs is not None:
        emit(**base, case=f"{task}/final-{case['metric']}-paired", metric=f"final_{case['metric']}_minus_ddp",
             unit="", baseline_name=names["ddp"], finals={s: v["final_all"] for s, v in summary.items()},
             **pairs)
    if not {"ours", "ddp", "rpc"} <= set(summary):  # --systems left some out: the paired finals only
        return
    ours = summary["ours"]
    for b in ("ddp", "rpc"):
        o, x = ours["seconds"], summary[b]["seconds"]
        emit(**base, case=f"{task}/time-to-{case['metric']}", metric="seconds_to_target", unit="s", ours=o,
             baseline=x, baseline_name=names[b], ratio=(x / o) if o and x else None, target=target,
             systems={k: {kk: v[kk] for kk in ("seconds", "final", "train_s", "train_s_all", "final_all")}
                      for k, v in summary.items()})
        emit(**base, case=f"{task}/bytes", metric="bytes_moved", unit="B", ours=ours["bytes"],
             baseline=summary[b]["bytes"], baseline_name=names[b], ratio=summary[b]["bytes"] / ours["bytes"])
        emit(**base, case=f"{task}/final-{case['metric']}", metric=f"final_{case['metric']}", unit="",
             ours=ours["final"], baseline=summary[b]["final"], baseline_name=names[b],
             ratio=ours["final"] / summary[b]["final"], diff=ours["final"] - summary[b]["final"])
    emit(**base, case=f"{task}/curves", metric="train_s_vs_metric", unit="[s, metric]", ours=ours["curve"],
         curves={k: v["curve"] for k, v in summary.items()})
    o, d, r = ours["seconds"], summary["ddp"]["seconds"], summary["rpc"]["seconds"]
    if "ddp-dense" in case["systems"]:
        # DDP with dense embedding gradients (what NCCL, which has no sparse all-reduce, forces): AdaGrad
        # leaves rows with a zero gradient unchanged, so it takes the same steps as sparse DDP to the
        # target; its time is those steps times its measured time per step
        log(f"torch bench: {task} ddp-dense ({case['systems']['ddp-dense']['max_steps']} steps, timed per step)")
        dd = run_system(task, case, "ddp-dense", work, cache)
        first = next((p for p in runs["ddp"][0]["points"] if p["metric"] >= target), None)
        est = first["step"] * dd["step_s"] if first else None
        emit(**base, case=f"{task}/time-to-{case['metric']}-vs-ddp-dense", metric="seconds_to_target", unit="s",
             ours=o, baseline=est, baseline_name="DDP (gloo), dense embedding gradients: steps to target x "
             "measured s/step", ratio=(est / o) if o and est else None, target=target, step_s=dd["step_s"],
             timed_steps=dd["timed_steps"], steps_to_target=first["step"] if first else None,
             bytes_per_step=dd["bytes_per_step"], extrapolated=True)
        emit(**base, case="dlrm/goal/time-to-auc-vs-ddp-dense", goal="DLRM (1M-row tables) >= 3x faster than DDP "
             "to the same AUC (DDP with dense embedding gradients, extrapolated)", met=bool(o and est and est / o >= 3),
             metric="seconds_to_target", unit="s", ours=o, baseline=est, baseline_name="DDP dense gradients",
             ratio=(est / o) if o and est else None, target=target)
    if task == "cnn":
        emit(**base, case="cnn/goal/time-to-accuracy-vs-ddp", goal="CNN time to accuracy <= DDP's",
             met=bool(o and d and o <= d), metric="seconds_to_target", unit="s", ours=o, baseline=d,
             baseline_name=names["ddp"], ratio=(d / o) if o and d else None, target=target)
        return
    emit(**base, case="dlrm/goal/time-to-auc-vs-ddp", goal="DLRM >= 1.5x faster than DDP (gloo, sparse "
         "gradients) to the same AUC", met=bool(o and d and d / o >= 1.5), metric="seconds_to_target", unit="s",
         ours=o, baseline=d,
         baseline_name=names["ddp"], ratio=(d / o) if o and d else None, target=target)
    emit(**base, case="dlrm/goal/time-to-auc-vs-rpc", goal="DLRM >= 1.2x faster than the RPC PS to the same AUC",
         met=bool(o and r and r / o >= 1.2), metric="seconds_to_target", unit="s", ours=o, baseline=r,
         baseline_name=names["rpc"], ratio=(r / o) if o and r else None, target=target)
    if "ours-nopush" in summary:  # the embedding table without pushes beside the default
        p = summary["ours-nopush"]
        emit(**base, case="dlrm/no-push-vs-push", metric="seconds_to_target", unit="s", ours=p["seconds"],
             baseline=o, baseline_name="ours with push: true (the default: servers push changed embedding rows)",
             ratio=(o / p["seconds"]) if o and p["seconds"] else None, target=target,
             bytes=p["bytes"], baseline_bytes=ours["bytes"], final=p["final"], baseline_final=ours["final"])
    if "ours-lapse8" in summary:  # subscriptions that lapse, beside the default (every past reader pushed to)
        p = summary["ours-lapse8"]
        emit(**base, case="dlrm/lapse-vs-no-lapse", metric="bytes", unit="B", ours=p["bytes"], baseline=ours["bytes"],
             baseline_name="ours with lapse: 0 (the default: subscriptions never lapse)",
             ratio=(ours["bytes"] / p["bytes"]) if ours["bytes"] and p["bytes"] else None,
             seconds=p["seconds"], baseline_seconds=o, final=p["final"], baseline_final=ours["final"],
             rpc_bytes=summary["rpc"]["bytes"] if "rpc" in summary else None)
    assert pairs is not None
    for s in (k for k in summary if k.startswith("ours") and k not in ("ours-nopush", "ours-lapse8")):
        st = case["systems"][s]["staleness"]
        d = pairs[s]  # ours less DDP at the same seed
        mode = "hybrid-" if s.startswith("ours-hybrid") else ""  # hybrid mode's records apart from PS mode's
        emit(**base, case=f"dlrm/goal/final-auc-{mode}s{st}", goal="at staleness <= 2, final AUC within 0.002 of DDP's "
             "(median over seeds of the difference at each seed)", met=abs(d["median"]) <= 0.002,
             metric="final_heldout_auc", unit="", ours=summary[s]["final"], baseline=summary["ddp"]["final"],
             baseline_name=names["ddp"], diff=d["median"], diff_min=d["min"], diff_max=d["max"], staleness=st,
             not_worse=d["median"] >= -0.002, ours_all=summary[s]["final_all"],
             ddp_all=summary["ddp"]["final_all"], noise_floor=pairs["noise_floor"],
             final_samples=case.get("final_samples"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small data, one repetition (about a minute)")
    p.add_argument("--tasks", default="cnn,dlrm", help="comma-separated: cnn, dlrm, hybrid, split")
    p.add_argument("--reps", type=int, default=None,
                   help="repetitions per system, repetition i at seed i (default 1 quick, 2 full)")
    p.add_argument("--systems", default=None, help="comma-separated: only these systems of each task (e.g. "
                   "ours,ddp; the goals' records need ours, ddp and rpc)")
    a = p.parse_args(argv)
    reps = a.reps or (1 if a.quick else 2)
    all_cases = cases(a.quick)
    tasks = [t for t in a.tasks.split(",") if t]
    bad = [t for t in tasks if t not in all_cases and t not in STEP_CASES]
    if bad:
        p.error(f"--tasks: unknown task {bad[0]!r} (known: {', '.join([*all_cases, *STEP_CASES])})")
    only = [s for s in a.systems.split(",") if s] if a.systems else None
    known = {s for t in tasks if t in all_cases for s in all_cases[t]["systems"]}
    if only is not None and (bad := [s for s in only if s not in known]):
        p.error(f"--systems: unknown system {bad[0]!r} (known: {', '.join(sorted(known))})")
    step_cases = [t for t in tasks if t in STEP_CASES]
    tasks = [t for t in tasks if t not in STEP_CASES]
    if step_cases:  # time per step (bench/torch/steps.py)
        from bench.torch import steps
        steps.main(["--cases", ",".join(step_cases), *(["--quick"] if a.quick else []),
                    *(["--reps", str(a.reps)] if a.reps else [])])
    if not tasks:
        return 0
    if "cnn" in tasks:
        from bosen.apps.datasets import images
        if not images.FASHION_DIR.is_dir():
            log(f"torch bench: skipping cnn, {images.FASHION_DIR} missing: {images.FASHION_INSTALL}")
            tasks.remove("cnn")
    # first touches of never-used guest pages cost about 2.5 ms per MiB on these VMs (common.prewarm_memory);
    # the PS touches its caches and AdaGrad state lazily, inside the timed region, so warm the machine first
    gib = 1 if a.quick else 4
    log(f"torch bench: warming {gib} GiB of memory took {prewarm_memory(gib << 30):.1f} s")
    with tempfile.TemporaryDirectory(prefix="bosen-torch-bench-") as tmp:
        for t in tasks:
            bench_task(t, all_cases[t], reps, Path(tmp), a.quick, only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
