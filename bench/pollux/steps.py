"""Measured step times of a real synchronous MLR job (servers and K worker processes over loopback:
``bosen launch``, a table with ``backup: {mode: static, k: K}``, so each step waits for every worker's
gradient, the PS analogue of Pollux's all-reduce step), and the throughput model's error predicting a
configuration it was not fitted on (``bosen.goodput.fit_throughput``;
docs/design.md, "Pollux (goodput)")."""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import numpy as np

from bench.common import REPO
from bosen.goodput import fit_throughput


def step_seconds(m: int, workers: int, iterations: int, skip: int, seed: int, timeout: float,
                 data: str = "digits", cols: int = 65) -> float:
    """The median seconds between rank 0's reports of consecutive iterations (read, gradient of m
    samples, push, wait for the servers' step) after the first ``skip``; ``data`` as the MLR app takes
    it (digits, or a path), ``cols`` its features + 1."""
    from bosen.jobs.job import job_config, run_job, write_config

    app = {"module": "bosen.apps.mlr", "args": {"data": data, "holdout": 0.0, "batch_size": m,
                                                 "epochs": iterations, "eval_every": 0, "seed": seed}}
    tables = {"W": {"rows": 10, "cols": cols, "dtype": "float64", "init": {"zeros": True},
                    "backup": {"mode": "static", "k": workers, "lr": 0.5}}}
    with tempfile.TemporaryDirectory() as tmp:
        path = write_config(Path(tmp) / "job.yaml", job_config(["127.0.0.1:0"], workers, tables=tables, app=app))
        run = run_job(path, Path(tmp) / "run", timeout=timeout, cwd=REPO).check()
    mine = sorted((r["iteration"], float(r["time"])) for r in run.kind("worker")
                  if r.get("rank") == 0 and "iteration" in r)
    gaps = [b[1] - a[1] for a, b in zip(mine, mine[1:], strict=False) if a[0] >= skip]
    if not gaps:
        raise RuntimeError(f"bench.pollux: no iterations after {skip} in the job of m={m}, K={workers}")
    return statistics.median(gaps)


def noise_floor(reps: list[list[float]]) -> list[float]:
    """The machine's own error: each round's step time of a configuration predicted by the median of
    its other rounds, |predicted / measured − 1|, for every configuration (rows of ``reps``) and round.
    A model fitted on such measurements cannot be expected to predict a configuration more closely."""
    out = []
    for rs in reps:
        for i in range(len(rs)):
            others = rs[:i] + rs[i + 1:]
            if others:
                out.append(abs(statistics.median(others) / rs[i] - 1))
    return out


def in_sample_errors(ms: list[int], ks: list[int], secs: list[float], curved: bool = False) -> list[float]:
    """Fit on every configuration: |predicted / measured − 1| of each (the paper's "average error of
    the fitted model", P:239, is the mean of these); ``curved``: T_grad's exponent fitted too (default a line)."""
    m, k, t = (np.asarray(x, np.float64) for x in (ms, ks, secs))
    fit = fit_throughput(m, np.zeros(m.size), k, t, curved=curved)
    return [float(x) for x in np.abs(fit.t_iter(m, 0, k) / t - 1)]


def held_out_errors(ms: list[int], ks: list[int], secs: list[float], curved: bool = False) -> list[float]:
    """Leave one configuration out: fit on the others, |predicted / measured − 1| for the one left."""
    m, k, t = (np.asarray(x, np.float64) for x in (ms, ks, secs))
    errs = []
    for i in range(m.size):
        keep = np.arange(m.size) != i
        fit = fit_throughput(m[keep], np.zeros(keep.sum()), k[keep], t[keep], curved=curved)
        errs.append(abs(float(fit.t_iter(m[i], 0, k[i])) / t[i] - 1))
    return errs
