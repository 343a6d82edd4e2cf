"""The measured profiles that drive the cluster simulator (``bench/pollux/sim.py``), as Pollux's
simulator replays measured throughput and gradient noise scales (P:404-408): one per job kind, written
to ``bench/pollux/profiles.json`` by ``python -m bench.pollux.profiles`` and read by the simulator.

A kind is MLR (softmax regression, plain SGD, M0 = 64) on a data set here:

- ``phi``: the exact φ (``bench/pollux/phi.py``, closed form) along a training run at M0, at steps
  geometric in [0, ``STEPS``], over ``seeds`` runs (the ratio of the seeds' mean tr Σ to their mean
  ‖G‖², as the estimator's averages take it). ``digits`` at lr 0.5 (the run ``bench.pollux`` checks
  φ on), ``fashion`` (Fashion-MNIST, 5000 samples, 784 features) at lr 0.01.
- ``steps``: a real synchronous job's step at K = 1 (``bench/pollux/steps.py``: server and worker over
  loopback, push, pull and the server's step), median over ``reps`` rounds, per m; a line through
  them (least squares on relative error) is α + β_g·m: β_g the computation per example.
- ``compute``: the app's gradient kernel timed in this process (thread CPU time, median of 5) at m = 1
  and the largest m: its α_g splits the step's α into α_g and the sync α_s = α − α_g (the kernel's
  slope is not used: the job's data access makes its own larger).

One more kind is derived, not measured here: ``resnet18``, ResNet-18 (11.2M parameters) as PS mode ran
it on the H200 machine (docs/performance-log.md: batch 256, a local torch step 12.8-14.8 ms, a PS
step 71.4-75.8 ms): T_grad = 13.8 ms·m/256, α_s = 73.6 − 13.8 ms, M0 = 128 (the paper's CIFAR-10
ResNet-18), and, as no φ of it is measured here, the fashion run's φ scaled by M0/64 (stated
wherever its results are).

What one machine cannot measure is how sync grows with workers on a cluster (a worker per machine;
here K = 2 shares 2 cores and doubles computation too, docs/evaluation.md): the simulator takes
β_s = ``SYNC_GROWTH``·α_s (the one server handles each worker's push and pull in turn; half of a
loopback round trip is the server's), stated wherever its results are.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import REPO, log

PATH = Path(__file__).with_name("profiles.json")
STEPS = 4000  # the φ profile's run, in steps of M0
SYNC_GROWTH = 0.5  # β_s / α_s: an assumption (see the module's docstring)


@dataclass(frozen=True)
class KindSpec:
    data: str  # bench.pollux.dataset's name
    samples: int  # of a data/ set
    lr: float
    m0: int
    job_data: str  # what the MLR app's ``data`` takes
    cols: int


KINDS = {
    "digits": KindSpec("digits", 0, 0.5, 64, "digits", 65),
    "fashion": KindSpec("fashion-mnist", 5000, 0.01, 64, str(REPO / "data" / "fashion-mnist" / "train.npz"), 785),
}


def phi_profile(spec: KindSpec, points: list[int], seeds: int) -> list[float]:
    from bench.pollux.__main__ import dataset
    from bench.pollux.phi import ExactStats, trajectory

    ds = dataset(spec.data, spec.samples)
    exact = ExactStats(ds)
    sq = np.zeros(len(points))
    tr = np.zeros(len(points))
    for seed in range(seeds):
        for i, W in enumerate(trajectory(ds, 8, spec.m0 // 8, spec.lr, points, seed)):
            e = exact.at(W)
            sq[i] += e.sqnorm
            tr[i] += e.trace
    return [float(x) for x in tr / sq]


def compute_line(spec: KindSpec, m_max: int, reps: int) -> tuple[float, float]:
    """(α_g, β_g) from the gradient kernel's thread CPU time at m = 1 and ``m_max``."""
    from bench.pollux.__main__ import dataset
    from bosen.apps.mlr.kernels import loss_grad

    ds = dataset(spec.data, spec.samples)
    W = np.zeros((ds.classes, ds.features + 1))
    rng = np.random.default_rng(0)
    times = {}
    for m in (1, m_max):
        rows = rng.integers(0, ds.n, size=m).astype(np.int64)
        loss_grad(ds.indptr, ds.indices, ds.values, ds.labels, rows, W)  # compiled
        per = []
        for _ in range(reps):
            n = max(1, 20000 // m)
            t0 = time.thread_time()
            for _ in range(n):
                loss_grad(ds.indptr, ds.indices, ds.values, ds.labels, rows, W)
            per.append((time.thread_time() - t0) / n)
        times[m] = statistics.median(per)
    beta = max((times[m_max] - times[1]) / (m_max - 1), 1e-12)
    return max(times[1] - beta, 1e-9), beta


def measure(ms: list[int], reps: int, seeds: int, iterations: int, kinds: list[str]) -> dict[str, Any]:
    from bench.pollux.steps import step_seconds

    points = sorted({0} | set(np.unique(np.round(np.geomspace(1, STEPS, 16)).astype(int)).tolist()))
    out: dict[str, Any] = {"command": "python -m bench.pollux.profiles", "loadavg": os.getloadavg()[0],
                           "sync_growth": SYNC_GROWTH, "kinds": {}}
    for name in kinds:
        spec = KINDS[name]
        log(f"profiles: {name}: phi along {STEPS} steps x {seeds} seeds")
        phi = phi_profile(spec, points, seeds)
        ag, bg = compute_line(spec, max(ms), 5)
        steps: dict[int, list[float]] = {m: [] for m in ms}
        for rep in range(reps):
            for m in ms:
                log(f"profiles: {name}: a job at m={m}, round {rep}")
                steps[m].append(step_seconds(m, 1, iterations, 20, rep, 300.0, spec.job_data, spec.cols))
        med = {m: statistics.median(v) for m, v in steps.items()}
        raw = {"m0": spec.m0, "data": spec.data, "samples": spec.samples, "lr": spec.lr,
               "phi": {"steps": points, "phi": phi, "seeds": seeds},
               "compute": {"alpha_grad": ag, "beta_grad": bg},
               "steps": {str(m): {"median": med[m], "all": steps[m]} for m in ms}}
        out["kinds"][name] = raw | {"model": derive(raw)}
    if "fashion" in out["kinds"]:
        out["kinds"]["resnet18"] = resnet18(out["kinds"]["fashion"])
    return out


def derive(raw: dict[str, Any]) -> dict[str, float]:
    """α_g, β_g and α_s of a kind from its measured steps and kernel (see the module's docstring)."""
    ms = np.array([float(m) for m in raw["steps"]])
    ts = np.array([v["median"] for v in raw["steps"].values()])
    beta, alpha = np.polyfit(ms, ts, 1, w=1.0 / ts)
    ag = min(float(raw["compute"]["alpha_grad"]), float(alpha) / 2)
    return {"alpha_grad": ag, "beta_grad": max(float(beta), 1e-12), "alpha_sync": max(float(alpha) - ag, 1e-6)}


def resnet18(fashion: dict[str, Any]) -> dict[str, Any]:
    """The derived kind (docs/performance-log.md, the H200 machine; see the module's docstring)."""
    local, ps = (12.8e-3 + 14.8e-3) / 2, (71.4e-3 + 75.8e-3) / 2
    return {"m0": 128, "derived": "docs/performance-log.md: ResNet-18 PS mode on the H200, batch 256; "
                                  "phi: fashion's run times M0/64",
            "phi": {"steps": fashion["phi"]["steps"], "phi": [2.0 * x for x in fashion["phi"]["phi"]]},
            "model": {"alpha_grad": 1e-6, "beta_grad": local / 256, "alpha_sync": ps - local}}


def load(path: Path = PATH) -> dict[str, Any]:
    """The profiles ``measure`` wrote (the simulator's input)."""
    with path.open() as f:
        data: dict[str, Any] = json.load(f)
    return data


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.pollux.profiles", description=__doc__.split("\n\n")[0])
    p.add_argument("--ms", type=int, nargs="+", default=[32, 256, 2048], help="per-worker batches of the jobs")
    p.add_argument("--reps", type=int, default=2, help="rounds of jobs (median)")
    p.add_argument("--seeds", type=int, default=2, help="runs the φ profile averages")
    p.add_argument("--iterations", type=int, default=200, help="iterations of a job")
    p.add_argument("--kinds", nargs="+", default=sorted(KINDS), choices=sorted(KINDS))
    p.add_argument("--out", type=Path, default=PATH)
    a = p.parse_args(argv)
    data = measure(a.ms, a.reps, a.seeds, a.iterations, a.kinds)
    a.out.write_text(json.dumps(data, indent=1) + "\n")
    log(f"profiles: wrote {a.out}")


if __name__ == "__main__":
    main()
