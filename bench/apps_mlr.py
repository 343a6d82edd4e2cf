"""MLR benchmarks: kernel throughput beside PyTorch, and 2-worker vs 1-worker scaling through the PS.

Baseline choice. The computation is softmax (multinomial) regression trained by minibatch SGD with L2
on the weights. scikit-learn has no such trainer: ``SGDClassifier(loss="log_loss")`` fits K
independent one-vs-rest binary models (a different model and gradient), and
``LogisticRegression(multinomial)`` uses full-batch solvers (lbfgs, saga), a different algorithm.
PyTorch expresses exactly our computation: logits = X W^T + b, mean cross-entropy over a minibatch,
``torch.optim.SGD`` with ``weight_decay`` on W only, the same learning rate per epoch. So the baseline
is PyTorch (CPU), on the same data, the same zero initial weights, the same sample order in every
epoch, batch size, lr schedule and L2; both then report the held-out accuracy and the training
log-loss their models reach (measured by one evaluation function), so speed is compared at equal
work and the quality columns show it is also equal quality.

For each data set PyTorch gets its fastest formulation that we measured: dense ``X @ W.T`` for the
dense digits, ``F.embedding_bag(mode="sum", per_sample_weights=...)`` (the standard sparse linear
layer; faster than ``torch.sparse`` CSR matmul here) for the sparse synthetic set. Sparse minibatch
tensors are built before its clock starts, which favours the baseline. Both run on one thread
(``torch.set_num_threads(1)``): our kernel is single-threaded by design, parallelism comes from PS
workers, and on this shared 2-core machine a second PyTorch thread mostly spins.

Scaling (case "mlr-scaling"): the same synthetic job launched for real (``python -m bosen launch
configs/mlr.yaml``) with 1 and with 2 workers; job throughput = samples of clocks 1..T-1 (the first
clock holds start-up) over the longest worker's time from its clock-0 report to its last report.
On 2 cores, two workers share the CPU with the server process, so the ideal ratio is below 2.

``python bench/apps_mlr.py [--quick]`` prints one JSON line per result (``bench/apps.py`` runs it too).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bosen.apps.mlr import data as D
from bosen.apps.mlr.model import LocalModel
from bosen.jobs import JobRun, run_job

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "mlr.yaml"


def _lr(lr: float, decay: float, epoch: int) -> float:
    return lr / (1.0 + decay * epoch)  # the worker's "inverse" schedule, one clock per epoch


def _quality(V: np.ndarray, b: np.ndarray, train: D.Dataset, held: D.Dataset) -> dict[str, float]:
    """Held-out accuracy and mean training log-loss of a model (F x K weights V, biases b)."""
    m = LocalModel(train.classes, train.features)
    m.V[:] = V
    m.b[:] = b
    correct, _ = m.evaluate(held)
    _, tl = m.evaluate(train)
    return {"heldout_accuracy": correct / held.n, "train_logloss": tl / train.n}


def _ours(train: D.Dataset, orders: list[np.ndarray], batch: int, lr: float, decay: float,
          reg: float) -> tuple[float, np.ndarray, np.ndarray]:
    m = LocalModel(train.classes, train.features)
    m.train(train, orders[0][:batch], batch, lr, reg)  # compile / load the numba cache
    m = LocalModel(train.classes, train.features)
    t0 = time.perf_counter()
    for e, order in enumerate(orders):
        m.train(train, order, batch, _lr(lr, decay, e), reg)
    dt = time.perf_counter() - t0
    return dt, m.V * np.float32(m.scale[0]), m.b.copy()


def _torch(train: D.Dataset, orders: list[np.ndarray], batch: int, lr: float, decay: float,
           reg: float, sparse: bool) -> tuple[float, np.ndarray, np.ndarray]:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    K, nf = train.classes, train.features
    W = torch.zeros(nf, K, requires_grad=True)  # F x K: embedding_bag's layout; dense uses X @ W
    b = torch.zeros(K, requires_grad=True)
    opt = torch.optim.SGD([{"params": [W], "weight_decay": reg}, {"params": [b], "weight_decay": 0.0}], lr=lr)
    y_all = torch.from_numpy(train.labels.astype(np.int64))
    X = None if sparse else torch.from_numpy(train.dense())

    def batches(order: np.ndarray) -> list[tuple]:
        out = []
        for s in range(0, len(order), batch):
            sub = train.take(order[s:s + batch])
            out.append((torch.from_numpy(sub.indices.astype(np.int64)), torch.from_numpy(sub.indptr[:-1].copy()),
                        torch.from_numpy(sub.values), torch.from_numpy(sub.labels.astype(np.int64))))
        return out

    def step(z: torch.Tensor, y: torch.Tensor) -> None:
        loss = F.cross_entropy(z, y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()

    total = 0.0
    for e, order in enumerate(orders):
        for g in opt.param_groups:
            g["lr"] = _lr(lr, decay, e)
        if sparse:
            prepared = batches(order)  # outside the timed region: favours the baseline
            t0 = time.perf_counter()
            for idx, off, val, y in prepared:
                step(F.embedding_bag(idx, W, off, mode="sum", per_sample_weights=val) + b, y)
        else:
            order_t = torch.from_numpy(order)
            t0 = time.perf_counter()
            for s in range(0, len(order), batch):
                i = order_t[s:s + batch]
                step(X[i] @ W + b, y_all[i])
        total += time.perf_counter() - t0
    return total, W.detach().numpy().copy(), b.detach().numpy().copy()


def kernel_case(name: str, full: D.Dataset, epochs: int, batch: int, lr: float, decay: float, reg: float,
                sparse: bool) -> dict[str, Any]:
    """One data set: samples/s of our kernel and of PyTorch over the same epochs, and their quality."""
    train, held = D.split_holdout(full, 0.2, 0)
    rng = np.random.default_rng(0)
    orders = [rng.permutation(train.n).astype(np.int64) for _ in range(epochs)]
    work = epochs * train.n
    t_ours, V, b = _ours(train, orders, batch, lr, decay, reg)
    q_ours = _quality(V, b, train, held)
    rec: dict[str, Any] = {
        "bench": "apps", "case": "mlr", "dataset": name, "metric": "kernel_throughput", "unit": "samples/s",
        "ours": work / t_ours, "baseline": None, "baseline_name": "pytorch SGD (1 thread)", "ratio": None,
        "ours_quality": q_ours, "epochs": epochs, "batch_size": batch, "samples": train.n,
        "features": full.features, "classes": full.classes, "nnz_per_sample": full.nnz / full.n,
    }
    try:
        import torch
    except ImportError:
        rec["baseline_name"] = "pytorch (not installed: pip install torch==2.13.0)"
        return rec
    t_base, Vt, bt = _torch(train, orders, batch, lr, decay, reg, sparse)
    rec.update(baseline=work / t_base, ratio=t_base / t_ours, baseline_quality=_quality(Vt, bt, train, held),
               baseline_name=f"pytorch {torch.__version__} SGD, "
                             f"{'embedding_bag' if sparse else 'dense matmul'} (1 thread)")
    return rec


# ----------------------------------------------------------------------------------------------
# scaling through the real system


def _job_throughput(job: JobRun) -> tuple[float, float, int]:
    """(samples/s over clocks 1..T-1, final held-out accuracy, clocks) from a run's metrics."""
    workers = job.kind("worker")
    clocks = sorted(job.kind("clock"), key=lambda r: r["clock"])
    last = clocks[-1]["clock"]
    samples = sum(r["samples"] for r in workers if r["clock"] >= 1)
    spans = []
    for rank in {r["rank"] for r in workers}:
        t = {r["clock"]: r["time"] for r in workers if r["rank"] == rank}
        spans.append(t[last] - t[0])
    final = clocks[-1]
    return samples / max(spans), final["heldout_correct"] / final["heldout_total"], len(clocks)


def scaling_case(quick: bool) -> dict[str, Any]:
    """The same synthetic MLR job through ``bosen launch`` with 2 workers vs 1: throughput ratio."""
    n, epochs = (100_000, 4) if quick else (300_000, 6)
    K, nf = 100, 1000
    sets = [f"tables.W.rows={K}", f"tables.W.cols={nf + 1}", "app.args.data=synthetic",
            f"app.args.synthetic.n={n}", "app.args.synthetic.nnz=40", f"app.args.epochs={epochs}",
            "app.args.batch_size=64", "app.args.lr=1.0", "app.args.reg=1.0e-6", "app.args.holdout=0.05",
            f"app.args.eval_every={epochs}", "consistency.staleness=2"]
    out: dict[int, tuple[float, float, int]] = {}
    with tempfile.TemporaryDirectory(prefix="bosen-mlr-bench-") as tmp:
        for w in (1, 2):
            job = run_job(CONFIG, Path(tmp) / f"w{w}", workers=w, sets=sets, timeout=600, cwd=REPO).check()
            out[w] = _job_throughput(job)
    (t1, a1, c1), (t2, a2, _) = out[1], out[2]
    return {"bench": "apps", "case": "mlr-scaling", "metric": "job_throughput", "unit": "samples/s",
            "ours": t2, "baseline": t1, "baseline_name": "same job, 1 worker", "ratio": t2 / t1,
            "ours_quality": {"heldout_accuracy": a2}, "baseline_quality": {"heldout_accuracy": a1},
            "workers": [2, 1], "clocks": c1, "samples": n, "features": nf, "classes": K,
            "cpus": os.cpu_count(), "staleness": 2}


def run_bench(quick: bool = False) -> list[dict]:
    """All MLR results: kernel vs PyTorch on digits (real) and sparse synthetic data, then scaling."""
    results = [
        kernel_case("digits", D.digits(), 10 if quick else 40, 32, 0.5, 0.1, 1e-4, sparse=False),
        kernel_case("synthetic-sparse",
                    D.synthetic(30_000 if quick else 150_000, 1000, 100, nnz=40, seed=1),
                    2 if quick else 4, 64, 1.0, 0.1, 1e-6, sparse=True),
        scaling_case(quick),
    ]
    return results


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    for rec in run_bench(quick="--quick" in argv):
        print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
