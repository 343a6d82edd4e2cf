"""A DLRM embedding table no process holds whole (issue 29): memory, step time and held-out AUC.

    python -m bench.torchsparse [--quick] [--samples 1200000] [--cache-rows 500000] [--rows 100000000]
                                [--dense-rows 1000000] [--cases sparse,dense]

Two jobs through ``bosen launch configs/torch-dlrm-100m.yaml`` (2 servers, 2 workers, batch 1024,
dim 64, server AdaGrad, staleness 1), on the same data: Criteo's uncapped cardinalities (33.8M ids),
Zipf 0.9, every (feature, id) hashed (``hash_ids``) into the table's rows.

- ``sparse``: ``--rows`` (100M) x 64, ``storage: sparse``, ``PSEmbedding`` workers (only a batch's
  rows in torch; the client caches at most ``--cache-rows`` of them), the servers storing the rows
  touched, started from the model's uniform(-0.05, 0.05) per row id. 25.6 GB if it were dense.
- ``dense`` (the baseline that fits): the same ids hashed into ``--dense-rows`` (1M) rows of a dense
  table, full ``nn.Embedding`` weights in every worker, the same server initializer.

Per job, one JSON line per metric (bench/common.py): peak resident memory of each worker and each
server (sampled every 0.5 s, psutil, whole processes: torch and the data included), the rows the
servers store and their bytes (``bosen status``: values, AdaGrad state, per-row metadata), the
distinct rows each worker's shard touches, rank 0's training seconds per step (its held-out
evaluations left out), the held-out AUC (rank 0, 50,000 samples) beside the teacher's ceiling.
``ratio`` on the AUC line: sparse / dense. Progress on stderr.

``--cases cpu`` (``--rounds`` N, ``--steps``, ``--dense-rows``): what the worker-side path costs, apart
from the servers and the table's size: one worker and one server in this process's control, the same
ids hashed into ``--dense-rows`` (1M) rows, a ``PSEmbedding`` over a sparse table against an
``nn.Embedding`` over a dense one, fresh servers each run, the order alternating every round; the
worker's main-thread CPU (``time.thread_time``) and wall time per step over steps 20..``--steps`` - 1
(batch 1024), and the per-round ratio sparse / dense (median and spread; below 1: the new path is
cheaper).

``--cases devcache`` (``--device``, ``--rounds``, ``--steps``, ``--device-cache-rows``, ``--staleness``,
``--zipf``, ``--storage``): the same step with and without the device row cache, alternated
(devcache.py); ``gpu.sh`` runs it on a CUDA machine.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench.common import REPO, MiB, emit, log
from bosen.apps.pytorch.examples import criteo, dlrm
from bosen.jobs.job import JobRun, run_job

CONFIG = REPO / "configs" / "torch-dlrm-100m.yaml"


def _role(p: psutil.Process) -> str | None:
    try:
        cmd = " ".join(p.cmdline())
    except psutil.Error:
        return None
    if "bosen.server" in cmd or "bosen-server" in cmd:
        return "server"
    if "examples.dlrm" in cmd:
        return "worker"
    return None


def run(sets: dict[str, Any], run_dir: Path) -> tuple[JobRun, dict[str, list[int]]]:
    """The job, and the peak RSS of each server and worker process (by role)."""
    out: list[JobRun] = []
    # exec'd processes (BOSEN_FORK=0): one forked from the launcher's zygote shares its pages, and its
    # RSS would not be the footprint this measures
    job = threading.Thread(target=lambda: out.append(run_job(CONFIG, run_dir, sets=sets, timeout=1800,
                                                             env={"BOSEN_FORK": "0"})))
    job.start()
    peak: dict[int, tuple[str, int]] = {}
    me = psutil.Process()
    while job.is_alive():
        for p in me.children(recursive=True):
            role = _role(p)
            if role is None:
                continue
            try:
                rss = p.memory_info().rss
            except psutil.Error:
                continue
            peak[p.pid] = (role, max(rss, peak.get(p.pid, (role, 0))[1]))
        job.join(0.5)
    by: dict[str, list[int]] = defaultdict(list)
    for role, rss in peak.values():
        by[role].append(rss)
    return out[0].check(), by


def touched(args: dict[str, Any], workers: int) -> list[int]:
    """Distinct embedding rows in each worker's shard of the training samples."""
    a = dlrm.DLRMArgs(**args)
    out = []
    for r in range(workers):
        keys = a.keys(criteo.shard(a.spec, r, workers, a.train_samples).ids)
        out.append(int(np.unique(keys).shape[0]))
        del keys
    return out


def case(name: str, sets: dict[str, Any], workers: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bosen-torchsparse-") as tmp:
        log(f"torchsparse: {name}: {sets}")
        job, rss = run(sets, Path(tmp) / "run")
    clocks = job.kind("clock")
    last = clocks[-1]
    servers = job.kind("server")
    emb = [s["tables"]["emb"] for s in servers]
    clients = [c["tables"]["emb"] for c in job.kind("client")]
    a = dlrm.DLRMArgs(**{**_args(CONFIG), **{k[len("app.args."):]: v for k, v in sets.items()}})
    steps = a.train_samples // workers // a.batch_size
    base = {"bench": "torchsparse", "case": name, "table_rows": a.table_rows, "storage": a.storage,
            "train_samples": a.train_samples, "steps_per_worker": steps, "cache_rows": a.cache_rows}
    res = {"worker_rss_mb": sorted(x / MiB for x in rss["worker"]),
           "server_rss_mb": sorted(x / MiB for x in rss["server"]),
           "rows_stored": sum(e["rows"] for e in emb), "stored_mb": sum(e["bytes"] for e in emb) / MiB,
           "rows_touched_per_worker": touched(dict(a.__dict__), workers),
           "client_rows_held": [c.get("rows_held") for c in clients],
           "client_rows_evicted": [c.get("rows_evicted") for c in clients],
           "step_ms": 1000 * last["train_s"] / steps, "heldout_auc": last["heldout_auc"],
           "teacher_auc": last["teacher_auc"], "heldout_logloss": last["heldout_logloss"] / last["heldout_count"],
           "job_s": job.seconds}
    for metric, unit in (("worker_rss_mb", "MB"), ("server_rss_mb", "MB"), ("rows_stored", "rows"),
                         ("stored_mb", "MB"), ("rows_touched_per_worker", "rows"), ("step_ms", "ms"),
                         ("heldout_auc", "auc")):
        emit(**base, metric=metric, unit=unit, ours=res[metric],
             **({"teacher_auc": res["teacher_auc"], "heldout_logloss": res["heldout_logloss"]}
                if metric == "heldout_auc" else {}),
             **({"client_rows_held": res["client_rows_held"], "client_rows_evicted": res["client_rows_evicted"]}
                if metric == "worker_rss_mb" else {}))
    return res


def path_cpu(rounds: int, steps: int = 120, rows: int = 1_000_000) -> None:
    """Worker main-thread CPU per step, PSEmbedding over a sparse table against nn.Embedding over a
    dense one (same hashed ids, ``rows`` rows), alternated; one JSON line per storage and one ratio line."""
    import statistics
    import time

    import torch
    import torch.nn.functional as F

    from bench.common import servers
    from bosen.apps.pytorch import PSModule, ServerOptimizer
    from bosen.client import Client

    base = {**_args(CONFIG), "table_rows": rows, "cache_rows": None, "train_samples": 200_000}
    a0 = dlrm.DLRMArgs(**base)
    warm, batch = 20, a0.batch_size
    if steps <= warm:
        raise SystemExit(f"--steps: {steps} leaves no step to measure after the first {warm}")
    data = criteo.generate(a0.spec, 0, steps * batch)
    keys, dense, labels = (torch.from_numpy(x) for x in (a0.keys(data.ids), data.dense, data.labels))

    def one(storage: str) -> tuple[float, float]:
        args = {**base, **({"storage": "sparse"} if storage == "sparse" else
                           {"storage": "dense", "embedding_init": "server"})}
        a = dlrm.DLRMArgs(**args)
        with tempfile.TemporaryDirectory(prefix="bosen-torchsparse-") as d:
            job = {"cluster": {"workers": 1}, "consistency": {"staleness": 1}, "tables": dlrm.tables(args, Path(d))}
            with servers(job, 1, workdir=d) as c, Client.connect(c.path, rank=0) as client:
                torch.set_num_threads(1)
                m = PSModule(dlrm.model(a), client, clock_every=a.clock_every)
                opt = ServerOptimizer(m, a.optimizer, lr=a.lr)
                c0 = w0 = 0.0
                for i in range(steps):
                    if i == warm:
                        c0, w0 = time.thread_time(), time.perf_counter()
                    idx = slice(i * batch, (i + 1) * batch)
                    loss = F.binary_cross_entropy_with_logits(m(dense[idx], keys[idx]), labels[idx])
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                n = steps - warm
                out = ((time.thread_time() - c0) / n * 1000, (time.perf_counter() - w0) / n * 1000)
                m.close()
                return out

    got: dict[str, list[tuple[float, float]]] = {"dense": [], "sparse": []}
    for r in range(rounds):
        for s in ("dense", "sparse") if r % 2 == 0 else ("sparse", "dense"):
            got[s].append(one(s))
            log(f"torchsparse cpu: round {r} {s}: {got[s][-1][0]:.1f} ms CPU, {got[s][-1][1]:.1f} ms wall a step")
    for s, v in got.items():
        cpu, wall = [x[0] for x in v], [x[1] for x in v]
        emit(bench="torchsparse", case=f"cpu-{s}", metric="worker_cpu_ms_per_step", unit="ms",
             ours=statistics.median(cpu), min=min(cpu), max=max(cpu), wall_ms=statistics.median(wall),
             wall_min=min(wall), wall_max=max(wall), rounds=rounds)
    ratio = [sp[0] / de[0] for sp, de in zip(got["sparse"], got["dense"], strict=True)]
    emit(bench="torchsparse", case="cpu-sparse-vs-dense", metric="worker_cpu_ratio", unit="x",
         ours=statistics.median(ratio), min=min(ratio), max=max(ratio), rounds=rounds,
         baseline_name="nn.Embedding over a dense table")


def _args(path: Path) -> dict[str, Any]:
    import yaml

    return dict(yaml.safe_load(path.read_text())["app"]["args"])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.torchsparse", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="100,000 samples, 10,000 held out")
    p.add_argument("--samples", type=int, default=None, help="training samples (default 1,200,000)")
    p.add_argument("--rows", type=int, default=100_000_000)
    p.add_argument("--dense-rows", type=int, default=1_000_000, help="dense, cpu: the table's rows")
    p.add_argument("--cache-rows", type=int, default=500_000)
    p.add_argument("--cases", default="sparse,dense", help="sparse, dense, cpu, devcache (comma-separated)")
    p.add_argument("--rounds", type=int, default=4, help="cpu, devcache: alternated rounds")
    p.add_argument("--steps", type=int, default=120, help="cpu, devcache: steps a run (the first 20 not measured)")
    p.add_argument("--device", default="cpu", help="devcache: the model's device (cpu, cuda)")
    p.add_argument("--device-cache-rows", type=int, default=100_000, help="devcache: the cache's rows")
    p.add_argument("--staleness", type=int, default=1, help="devcache: the SSP bound")
    p.add_argument("--zipf", type=float, default=None, help="devcache: the ids' Zipf exponent (default: the config's)")
    p.add_argument("--storage", choices=("sparse", "dense"), default="sparse",
                   help="devcache: PSEmbedding over a sparse table, or nn.Embedding over a dense one")
    o = p.parse_args(argv)
    samples = o.samples if o.samples is not None else 100_000 if o.quick else 1_200_000
    common: dict[str, Any] = {"app.args.train_samples": samples}
    if o.quick:
        common["app.args.test_samples"] = 10_000
    cases = {"sparse": {**common, "app.args.table_rows": o.rows, "app.args.cache_rows": o.cache_rows},
             "dense": {**common, "app.args.table_rows": o.dense_rows, "app.args.storage": "dense",
                       "app.args.embedding_init": "server", "app.args.cache_rows": None}}
    got = {}
    for name in o.cases.split(","):
        if name == "cpu":
            path_cpu(o.rounds, o.steps, o.dense_rows)
        elif name == "devcache":
            from bench.torchsparse import devcache

            devcache.run(o.rounds, o.steps, o.device_cache_rows, o.staleness, o.device, o.zipf, o.storage)
        elif name in cases:
            got[name] = case(name, cases[name], 2)
        else:
            p.error(f"--cases: {name!r} is not one of sparse, dense, cpu, devcache")
    if "sparse" in got and "dense" in got:
        s, d = got["sparse"], got["dense"]
        emit(bench="torchsparse", case="sparse-vs-dense", metric="heldout_auc", unit="auc", ours=s["heldout_auc"],
             baseline=d["heldout_auc"], baseline_name=f"dense {o.dense_rows:,}-row table",
             ratio=s["heldout_auc"] / d["heldout_auc"])
        emit(bench="torchsparse", case="sparse-vs-dense", metric="step_ms", unit="ms", ours=s["step_ms"],
             baseline=d["step_ms"], baseline_name=f"dense {o.dense_rows:,}-row table",
             ratio=d["step_ms"] / s["step_ms"])


if __name__ == "__main__":
    main()
