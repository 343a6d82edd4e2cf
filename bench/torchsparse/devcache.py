"""The DLRM step with and without the device row cache (issue 31 point 3), alternated.

    python -m bench.torchsparse --cases devcache [--device cpu|cuda] [--rounds 3] [--steps 120]
                                [--device-cache-rows 100000] [--staleness 1] [--zipf 0.9]
                                [--storage sparse|dense]

One worker and one server in this process's control, fresh servers each run; the DLRM example's
model (``configs/torch-dlrm-100m.yaml``: dim 64, batch 1024, server AdaGrad, clock every 4 steps) over
the same hashed ids in a 1M-row ``storage: sparse`` table read by a ``PSEmbedding``, the next batch's
rows read ahead as ``dlrm.train`` does; ``--zipf``: the ids' skew (the config's 0.9: about 30% of a
step's distinct rows were read in the last few steps; 1.1, the small DLRM config's, repeats more).
``--storage dense``: an ``nn.Embedding``
over a dense table instead, whose weight keeps each row's clock when the cache is on (no bound).
Each round runs the cache off and on (the order alternating every round). Per run, over the steps
after the first 20: the main thread's CPU (``time.thread_time``) and wall time per step (CUDA
synchronized at the end), the seconds per step in the embedding reads (``PSModule.rows_s``), the
rows read through the client per step and their bytes (what crossed the host; row values only), the
device cache's hit rate. One JSON line per run, one per setting with the median and spread, and
the per-round ratios on / off (below 1: the cache is cheaper).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from bench.common import emit, log, servers
from bosen.apps.pytorch import PSModule, ServerOptimizer
from bosen.apps.pytorch.examples import criteo, dlrm
from bosen.client import Client

WARM = 20


def one(base: dict[str, Any], cache_rows: int, staleness: int, steps: int, device: torch.device,
        data: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> dict[str, float]:
    """One run of ``steps`` steps on fresh servers; per-step figures over the steps after ``WARM``."""
    keys, dense, labels = data
    args = {**base, "device_cache_rows": cache_rows}
    a = dlrm.DLRMArgs(**args)
    batch = a.batch_size
    with tempfile.TemporaryDirectory(prefix="bosen-devcache-") as d:
        job = {"cluster": {"workers": 1}, "consistency": {"staleness": staleness}, "tables": dlrm.tables(args, Path(d))}
        with servers(job, 1, workdir=d) as c, Client.connect(c.path, rank=0) as client:
            net = dlrm.model(a).to(device)
            m = PSModule(net, client, clock_every=a.clock_every, device=device, device_cache_rows=cache_rows)
            opt = ServerOptimizer(m, a.optimizer, lr=a.lr)
            c0 = w0 = r0 = 0.0
            p0 = h0 = 0
            for i in range(steps):
                if i == WARM:
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    c0, w0, r0, p0 = time.thread_time(), time.perf_counter(), m.rows_s, m.rows_pulled
                    h0 = sum(x.hits for x in m.device_caches.values()) + m.weight_hits
                idx = slice(i * batch, (i + 1) * batch)
                if i + 1 < steps:  # the next batch's rows, read ahead as dlrm.train does
                    m.prefetch_rows(net.rows(keys[(i + 1) * batch:(i + 2) * batch]))
                x, k, y = dense[idx].to(device), keys[idx].to(device), labels[idx].to(device)
                loss = F.binary_cross_entropy_with_logits(m(x, k), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            n = steps - WARM
            hits = sum(x.hits for x in m.device_caches.values()) + m.weight_hits - h0
            pulled = m.rows_pulled - p0
            out = {"cpu_ms": (time.thread_time() - c0) / n * 1000, "wall_ms": (time.perf_counter() - w0) / n * 1000,
                   "rows_ms": (m.rows_s - r0) / n * 1000, "host_rows": pulled / n,
                   "host_mb": pulled * a.dim * 4 / n / 1e6, "hit_rate": hits / max(hits + pulled, 1)}
            m.close()
            return out


def run(rounds: int, steps: int, cache_rows: int, staleness: int, device_name: str, zipf: float | None = None,
        storage: str = "sparse") -> None:
    from bench.torchsparse.__main__ import CONFIG, _args

    device = torch.device(device_name)
    torch.set_num_threads(1 if device.type == "cpu" else 4)
    base = {**_args(CONFIG), "table_rows": 1_000_000, "cache_rows": None, "train_samples": 200_000}
    if zipf is not None:
        base["zipf"] = zipf
    if storage == "dense":
        base.update(storage="dense", embedding_init="server")
    a0 = dlrm.DLRMArgs(**base)
    data = criteo.generate(a0.spec, 0, steps * a0.batch_size)
    tensors = tuple(torch.from_numpy(x) for x in (a0.keys(data.ids), data.dense, data.labels))
    assert len(tensors) == 3
    setting = {"bench": "torchsparse", "case": "devcache", "device": str(device),
               "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
               "staleness": staleness, "zipf": a0.zipf, "storage": storage, "device_cache_rows": cache_rows,
               "steps": steps - WARM,
               "batch": a0.batch_size, "dim": a0.dim, "torch": torch.__version__}
    got: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    for r in range(rounds):
        for s in ("off", "on") if r % 2 == 0 else ("on", "off"):
            res = one(base, cache_rows if s == "on" else 0, staleness, steps, device, tensors)  # type: ignore[arg-type]
            got[s].append(res)
            log(f"devcache: round {r} {s}: " + ", ".join(f"{k} {v:.3g}" for k, v in res.items()))
            emit(**setting, cache=s, round=r, loadavg=os.getloadavg()[0], **res)
    for s, runs in got.items():
        emit(**setting, cache=s, metric="per_step", loadavg=os.getloadavg()[0],
             **{k: {"median": statistics.median(v), "min": min(v), "max": max(v)}
                for k in runs[0] for v in [[x[k] for x in runs]]})
    for k in ("cpu_ms", "wall_ms", "rows_ms", "host_mb"):
        ratio = [on[k] / off[k] if off[k] else float("nan") for on, off in zip(got["on"], got["off"], strict=True)]
        emit(**setting, metric=f"{k}_on_vs_off", unit="x", ours=statistics.median(ratio), min=min(ratio),
             max=max(ratio), rounds=rounds)
