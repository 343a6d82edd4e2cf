"""Time per training step, split into where it goes (issue 31): ``python -m bench.torch.steps``.

Two cases, each a line of JSON per result (and per repetition with ``--each``):

- ``hybrid``: the CNN example (Fashion-MNIST shapes, batch 64 a worker, 2 worker processes) in hybrid
  mode (``PSModule(..., dense="allreduce")``, its dense layers all-reduced over gloo, SGD here) beside
  ``DistributedDataParallel`` (gloo, SGD) at the same batch: rank 0's median step time. The CNN has
  no embedding, so the hybrid job's only table is a one-row table nobody reads (a job needs one): what
  is measured is hybrid mode's own cost over DDP (bucketed hooks, the step's clock). Issue 31's
  target: hybrid <= 1.1x DDP.
- ``split``: ResNet-18 (``apps/pytorch/examples/resnet.py``, 11.2M parameters, 32x32 inputs), one
  worker: a local torch step (SGD) beside PS mode at staleness 2 (``ServerOptimizer`` SGD, a clock
  every step, servers on this machine), without and with ``overlap`` (gradients pushed per bucket from
  the backward hooks and sent at once; ``--held``: also buffered until the clock, as before partial
  flushes), optionally with bfloat16 updates (``--wire bfloat16``). Per step: wall
  time, and its split: waiting for the pull (``pull_s``), pushing (``push_s``), compute (the rest).

Systems alternate order between repetitions; ratios are per repetition, reported as the median with
min and max, beside the load average. ``--device cuda`` runs the models on the GPU (hybrid: NCCL
needs a GPU per rank, so on one GPU the hybrid case runs world size 1 on cuda, or gloo on the CPU:
``--hybrid-device``). Children are ``python -m bench.torch.steps --child SPEC`` in this directory
with this environment; nothing here imports ``bench.common`` (psutil), so a bare GPU machine with
the package installed runs it (``bench/torch/gpu.sh``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# -- the child: one worker process ------------------------------------------------------------------


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    if name == "cnn":
        from bosen.apps.pytorch.examples.cnn import Net
        return Net()
    from bosen.apps.pytorch.examples.resnet import ResNet18
    return ResNet18()


def _data(name: str, batch: int, device: torch.device, n: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    shape = (1, 28, 28) if name == "cnn" else (3, 32, 32)
    return [(torch.randn(batch, *shape, generator=g).to(device), torch.randint(0, 10, (batch,), generator=g).to(device))
            for _ in range(n)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def child(spec: dict[str, Any]) -> None:
    """One worker of one system; writes its step times (s), thread CPU times and split to spec['out']."""
    torch.set_num_threads(int(spec.get("threads", 1)))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    system, rank, world = spec["system"], int(spec["rank"]), int(spec["world"])
    device = torch.device(spec["device"])
    net = _model(spec["model"]).to(device)
    data = _data(spec["model"], int(spec["batch"]), device)
    lr = 0.01
    client: Any = None
    model: Any = None
    if system == "ddp":
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{spec['port']}", rank=rank, world_size=world)
        run: nn.Module = DDP(net)
        opt: Any = torch.optim.SGD(run.parameters(), lr=lr)
    elif system == "local":
        run = net
        opt = torch.optim.SGD(net.parameters(), lr=lr)
    else:
        from bosen.apps.pytorch import PSModule, ServerOptimizer
        from bosen.client import Client
        client = Client.connect(spec["config"], rank=rank)
        dense = "allreduce" if system == "hybrid" else "ps"
        model = PSModule(net, client, clock_every=1, dense=dense, overlap=bool(spec.get("overlap")))
        if model.overlap:
            model.send_buckets = bool(spec.get("send_buckets", True))
        for _ in range(int(spec.get("staleness", 0)) + 1):
            client.clock()  # start together (as the torch bench's workers do)
        run = model
        opt = ServerOptimizer(model, "sgd", lr=lr)
    warm, steps = int(spec["warm"]), int(spec["steps"])
    wall, cpu, splits = [], [], []
    for i in range(warm + steps):
        x, y = data[i % len(data)]
        before = model.split() if model is not None else None
        _sync(device)
        t0, c0 = time.perf_counter(), time.thread_time()
        loss = F.cross_entropy(run(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        _sync(device)
        dt, dc = time.perf_counter() - t0, time.thread_time() - c0
        if i >= warm:
            wall.append(dt)
            cpu.append(dc)
            if model is not None:
                after = model.split()
                splits.append({k: after[k] - before[k] for k in ("pull_s", "push_s", "allreduce_s")})
    out: dict[str, Any] = {"system": system, "rank": rank, "wall": wall, "cpu": cpu, "splits": splits}
    if model is not None:
        model.close()
    if client is not None:
        out["stats"] = {k: client.stats()[k] for k in ("bytes_sent", "bytes_received")}
        client.close()
    Path(spec["out"]).write_text(json.dumps(out))
    if system == "ddp":
        import torch.distributed as dist
        dist.barrier()  # no rank tears the group down while another still uses it
        dist.destroy_process_group()


# -- the parent: cases, repetitions, results --------------------------------------------------------


def emit(**fields: Any) -> None:
    print(json.dumps(fields, default=float), flush=True)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stats(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def _run(specs: list[dict[str, Any]], work: Path, timeout: float) -> list[dict[str, Any]]:
    """Start one child per spec, wait for all (killing all if one fails or time runs out); their results."""
    procs = []
    try:
        for s in specs:
            logf = open(work / f"{s['system']}-{s['rank']}.log", "w")  # noqa: SIM115 - closed below
            procs.append((subprocess.Popen([sys.executable, "-m", "bench.torch.steps", "--child", json.dumps(s)],
                                           stdout=logf, stderr=subprocess.STDOUT), logf))
        deadline = time.monotonic() + timeout
        for p, _ in procs:
            code = p.wait(max(1.0, deadline - time.monotonic()))
            if code != 0:
                raise RuntimeError(f"{specs[0]['system']} worker exited with {code}:\n"
                                   + "\n".join((work / f"{s['system']}-{s['rank']}.log").read_text()[-3000:]
                                               for s in specs))
    finally:
        for p, f in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            f.close()
    return [json.loads(Path(s["out"]).read_text()) for s in specs]


def run_system(system: str, a: argparse.Namespace, model: str, world: int, work: Path, *, device: str,
               overlap: bool = False, wire: str | None = None, send_buckets: bool = True) -> dict[str, Any]:
    """One run of one system with ``world`` workers; rank 0's results."""
    from bosen.jobs.cluster import start_cluster
    from bosen.jobs.job import job_config

    d = Path(tempfile.mkdtemp(prefix=f"{system}-", dir=work))
    base = {"system": system, "world": world, "model": model, "device": device, "batch": a.batch[model],
            "warm": a.warm, "steps": a.steps, "staleness": a.staleness, "overlap": overlap,
            "send_buckets": send_buckets, "threads": a.threads}
    specs = [{**base, "rank": r, "out": str(d / f"rank{r}.json")} for r in range(world)]
    if system in ("local", "ddp"):
        port = _free_port()
        for s in specs:
            s["port"] = port
        return _run(specs, d, a.timeout)[0]
    from bosen.apps.pytorch import declare
    if system == "hybrid":  # the CNN has no embedding: a one-row table nobody reads (a job needs one)
        tables: dict[str, Any] = {"unused": {"rows": 1, "cols": 1}}
    else:
        tables = declare(_model(model), d / "tables", update="sgd", lr=0.01, wire_dtype=wire)
    job = job_config([], workers=world, tables=tables, staleness=a.staleness, read_timeout_s=300)
    with start_cluster(job, d, a.servers if system == "ps" else 1, server_args=["--log-level", "WARNING"]) as c:
        for s in specs:
            s["config"] = str(c.path)
        return _run(specs, d, a.timeout)[0]


def _summary(r: dict[str, Any]) -> dict[str, Any]:
    out = {"step_s": statistics.median(r["wall"]), "cpu_s": statistics.median(r["cpu"])}
    if r["splits"]:
        for k in ("pull_s", "push_s", "allreduce_s"):
            out[k] = statistics.median(s[k] for s in r["splits"])
        out["compute_s"] = statistics.median(w - s["pull_s"] - s["push_s"] - s["allreduce_s"]
                                             for w, s in zip(r["wall"], r["splits"], strict=True))
    return out


def case_hybrid(a: argparse.Namespace, work: Path) -> None:
    dev = a.hybrid_device or a.device
    world = 2 if dev == "cpu" else 1  # NCCL needs a GPU per rank
    runs: dict[str, list[dict[str, Any]]] = {"hybrid": [], "ddp": []}
    for rep in range(a.reps):
        order = ["hybrid", "ddp"] if (rep + a.rep0) % 2 == 0 else ["ddp", "hybrid"]
        for s in order:
            log(f"steps bench: hybrid case, {s} (rep {rep + 1}/{a.reps}, {world} workers on {dev})")
            runs[s].append(_summary(run_system(s, a, "cnn", world, work, device=dev)))
        # after every repetition (a timeout keeps the ones done): the last line of a case is its result
        ratios = [h["step_s"] / d["step_s"] for h, d in zip(runs["hybrid"], runs["ddp"], strict=True)]
        cpu = [h["cpu_s"] / d["cpu_s"] for h, d in zip(runs["hybrid"], runs["ddp"], strict=True)]
        emit(bench="torch.steps", case="hybrid-vs-ddp", model="cnn", device=dev, workers=world,
             batch=a.batch["cnn"], reps=rep + 1, steps=a.steps, metric="step_s_ratio", ratio=_stats(ratios),
             cpu_ratio=_stats(cpu), hybrid=runs["hybrid"], ddp=runs["ddp"], goal="hybrid <= 1.1x DDP",
             met=statistics.median(ratios) <= 1.1, loadavg=_loadavg())


def case_split(a: argparse.Namespace, work: Path) -> None:
    systems: dict[str, dict[str, Any]] = {"local": {}, "ps": {}, "ps-overlap": {"overlap": True}}
    if a.held:  # overlap as it was before partial flushes: each bucket buffered, all sent at the clock
        systems["ps-overlap-held"] = {"overlap": True, "send_buckets": False}
    if a.wire:
        systems[f"ps-overlap-{a.wire}"] = {"overlap": True, "wire": a.wire}
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    for rep in range(a.reps):
        order = list(systems) if (rep + a.rep0) % 2 == 0 else list(systems)[::-1]
        for s in order:
            log(f"steps bench: split case, {s} (rep {rep + 1}/{a.reps}, {a.device})")
            runs[s].append(_summary(run_system(s.split("-")[0], a, "resnet18", 1, work, device=a.device,
                                               **systems[s])))
        _emit_split(a, systems, runs, rep + 1)


def _emit_split(a: argparse.Namespace, systems: dict[str, dict[str, Any]], runs: dict[str, list[dict[str, Any]]],
                reps: int) -> None:
    """The split case's results after ``reps`` repetitions (a timeout keeps the ones done)."""
    for s in systems:
        if s == "local":
            continue
        ratios = [p["step_s"] / loc["step_s"] for p, loc in zip(runs[s], runs["local"], strict=True)]
        split = {k: statistics.median(r[k] for r in runs[s]) for k in ("compute_s", "pull_s", "push_s")}
        emit(bench="torch.steps", case=f"split/{s}", model="resnet18", params=11_173_962, device=a.device,
             batch=a.batch["resnet18"], staleness=a.staleness, servers=a.servers, reps=reps, steps=a.steps,
             metric="step_s_ratio_vs_local", ratio=_stats(ratios),
             local_step_s=statistics.median(r["step_s"] for r in runs["local"]),
             step_s=statistics.median(r["step_s"] for r in runs[s]), split=split, runs=runs[s],
             local_runs=runs["local"], goal="PS mode (staleness 2) <= 2x the local step",
             met=statistics.median(ratios) <= 2.0, loadavg=_loadavg())


def _loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return ""


CASES = {"hybrid": case_hybrid, "split": case_split}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--cases", default="hybrid,split", help="comma-separated: hybrid, split")
    p.add_argument("--quick", action="store_true", help="few steps, one repetition (CI)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--hybrid-device", default=None, help="the hybrid case's device (default --device)")
    p.add_argument("--reps", type=int, default=None, help="repetitions per system (default 1 quick, 3)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per run")
    p.add_argument("--warm", type=int, default=3, help="untimed steps first")
    p.add_argument("--batch", type=int, default=None, help="ResNet-18's batch (default 8 on cpu, 256 on cuda)")
    p.add_argument("--servers", type=int, default=None, help="servers in the split case (default 1 cpu, 2 cuda)")
    p.add_argument("--staleness", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--wire", default=None, help="also PS mode with overlap and these updates (bfloat16, float16)")
    p.add_argument("--held", action="store_true", help="also PS mode with overlap whose buckets wait in the "
                   "update buffer for the clock (send_buckets=False: overlap before partial flushes)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    p.add_argument("--rep0", type=int, default=0, help="the first repetition's number (odd: systems in reverse "
                   "order), so that separate invocations alternate")
    a = p.parse_args(argv)
    # a timeout's TERM unwinds (children killed, servers stopped) instead of leaving them running
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if a.child:
        child(json.loads(a.child))
        # skip the interpreter's teardown: gloo's threads have aborted it ("terminate called without an
        # active exception") after the results were written
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    cuda = a.device.startswith("cuda")
    a.reps = a.reps or (1 if a.quick else 3)
    a.steps = a.steps or (5 if a.quick else 20)
    a.batch = {"cnn": 64, "resnet18": a.batch or (256 if cuda else 8)}
    a.servers = a.servers or (2 if cuda else 1)
    cases = [c for c in a.cases.split(",") if c]
    bad = [c for c in cases if c not in CASES]
    if bad:
        p.error(f"--cases: unknown case {bad[0]!r} (known: {', '.join(CASES)})")
    np.random.seed(0)
    with tempfile.TemporaryDirectory(prefix="bosen-steps-") as tmp:
        for c in cases:
            CASES[c](a, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
