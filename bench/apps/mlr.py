"""MLR benchmarks: our softmax-regression SGD kernel beside scikit-learn on Fashion-MNIST, and whole
jobs beside the bare kernel.

Kernel (case "mlr"). Data: Fashion-MNIST (``bosen data fashion-mnist``: data/fashion-mnist/{train,test}.npz,
60,000 training and 10,000 test images, pixels / 255). Peers, default settings, on the dense pixels:

- ``LogisticRegression()`` (lbfgs, multinomial softmax, C=1, max_iter=100): its fit seconds and test
  accuracy. The goal: ours reaches that accuracy in <= 0.5x its fit time.
- ``SGDClassifier(loss="log_loss")`` (one-vs-rest logistic models, its own stopping rule): the same
  measures; ours is timed to its accuracy too.

Ours: ``LocalModel.train`` (bosen.apps.mlr.kernels.sgd_pass) over a fresh shuffle per epoch, batch
16, lr 0.1 / (1 + epoch), L2 reg 1/(C·n) = 1.67e-5 (the per-sample weight of LogisticRegression's
penalty at C=1, so both minimize the same objective; biases unpenalized in both). Test accuracy is
measured after every epoch and not timed; the time to a peer's accuracy is the training time of the
epochs up to the first that reaches it. Ours runs over several shuffling seeds (the margin over
LogisticRegression's accuracy is small, so one seed could be lucky); runs alternate with the peers'.
``ours`` is the median over seeds (a seed that never gets there counts as infinitely slow, so the
goal needs most seeds to reach it); ``seeds_reached`` and the per-seed times are in the record, and
so are the times to within 0.001 of the peer's accuracy.

Jobs (case "mlr-job"). The same data through ``bosen launch`` (bosen.jobs.job.run_job) with
configs/mlr-fashion.yaml, 1 and 2 workers, beside the bare kernel doing the same epochs in one
process (the training pass and rank 0's test evaluation per epoch). Job time = the slowest worker's
span from its clock-0 report to its last (epochs 2..E); the worker's own ``compute_s`` / ``comm_s``
split it. The goal: 1-worker job / bare <= 1.3x.

``python -m bench.apps.mlr [--quick]`` prints one JSON line per result (``python -m bench.apps`` runs it too).
``--quick`` uses slices of Fashion-MNIST (or synthetic data when it is missing; the job then runs on
the slice, one worker) and records a missing peer or data set as missing.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from bench.apps import tickprofile
from bench.common import REPO
from bosen.apps.mlr import data as D
from bosen.apps.mlr.model import LocalModel
from bosen.jobs.job import JobRun, run_job

CONFIG = REPO / "configs" / "mlr-fashion.yaml"
FASHION = REPO / "data" / "fashion-mnist"
BATCH, LR, DECAY = 16, 0.1, 1.0  # lr / (1 + DECAY * epoch)


def fashion(n_train: int | None = None, n_test: int | None = None) -> tuple[D.Dataset, D.Dataset] | None:
    """(train, test) of data/fashion-mnist (optionally the first n of each), or None when not prepared."""
    tr, te = FASHION / "train.npz", FASHION / "test.npz"
    if not (tr.exists() and te.exists()):
        return None
    train, test = D.load_npz(tr)[0], D.load_npz(te)[0]
    if n_train:
        train = train.take(np.arange(n_train))
    if n_test:
        test = test.take(np.arange(n_test))
    return train, test


def run_ours(train: D.Dataset, test: D.Dataset, reg: float, epochs: int, seed: int) -> dict[str, Any]:
    """Our kernel, shuffled epochs: training seconds and test accuracy after each."""
    m = LocalModel(train.classes, train.features)
    rng = np.random.default_rng(seed)
    secs, acc = [], []
    for e in range(epochs):
        t0 = time.perf_counter()
        order = rng.permutation(train.n).astype(np.int64)
        m.train(train, order, BATCH, LR / (1.0 + DECAY * e), reg)
        secs.append(time.perf_counter() - t0)
        acc.append(m.evaluate(test)[0] / test.n)
    return {"epoch_s": secs, "accuracy": acc}


def run_peer(kind: str, Xtr: np.ndarray, ytr: np.ndarray, Xte: np.ndarray, yte: np.ndarray) -> dict[str, Any]:
    """One scikit-learn fit with default settings: seconds, test accuracy, iterations, convergence warning."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression, SGDClassifier

    model = LogisticRegression() if kind == "logreg" else SGDClassifier(loss="log_loss", random_state=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        t0 = time.perf_counter()
        model.fit(Xtr, ytr)
        fit_s = time.perf_counter() - t0
    return {"fit_s": fit_s, "accuracy": float((model.predict(Xte) == yte).mean()),
            "n_iter": int(np.max(model.n_iter_)),
            "converged": not any(issubclass(w.category, ConvergenceWarning) for w in caught)}


def _time_to(run: dict[str, Any], target: float) -> tuple[int | None, float | None]:
    """(epochs, training seconds) for ours to first reach ``target`` accuracy; (None, None) if never."""
    hit = next((e for e, a in enumerate(run["accuracy"]) if a >= target), None)
    return (None, None) if hit is None else (hit + 1, float(sum(run["epoch_s"][:hit + 1])))


PEERS = {"logreg": "scikit-learn LogisticRegression() (lbfgs, multinomial)",
         "sgd": 'scikit-learn SGDClassifier(loss="log_loss")'}


def kernel_case(name: str, data: tuple[D.Dataset, D.Dataset], epochs: int, seeds: int,
                with_sgd: bool = True) -> list[dict[str, Any]]:
    """Ours over ``seeds`` shuffling seeds, alternated with LogisticRegression fits; SGDClassifier once."""
    train, test = data
    reg = 1.0 / train.n  # LogisticRegression's C=1 penalty, per sample
    common = {"bench": "apps", "case": "mlr", "dataset": name, "train_samples": train.n, "test_samples": test.n,
              "features": train.features, "classes": train.classes,
              "ours_settings": {"batch_size": BATCH, "lr": LR, "lr_schedule": f"lr / (1 + {DECAY} * epoch)",
                                "reg": reg, "epochs_max": epochs, "shuffle": "fresh permutation per epoch"}}
    m = LocalModel(train.classes, train.features)
    m.train(train, np.arange(BATCH, dtype=np.int64), BATCH, LR, reg)  # compile / load the numba cache
    m.evaluate(test)
    try:
        import sklearn  # noqa: F401
    except ImportError:
        runs = [run_ours(train, test, reg, epochs, 0)]
        missing = "scikit-learn not installed (pip install -e '.[bench]')"
        return [{**common, "metric": f"time_to_{p}_accuracy", "baseline_name": PEERS[p], "ours": None,
                 "baseline": None, "ratio": None, "missing": missing, "ours_accuracy_per_epoch": runs[0]["accuracy"],
                 **({"goal": "reach LogisticRegression's test accuracy in <= 0.5x its fit time", "met": False}
                    if p == "logreg" else {})} for p in PEERS]
    Xtr, Xte = train.dense(), test.dense()
    ytr, yte = train.labels, test.labels
    ours, peer = [], []
    for s in range(seeds):
        for who in ("ours", "peer") if s % 2 == 0 else ("peer", "ours"):
            if who == "ours":
                ours.append(run_ours(train, test, reg, epochs, s))
            elif s < max(1, seeds - 1) or s == 0:  # LogisticRegression is deterministic: fit it 1-2 times
                peer.append(run_peer("logreg", Xtr, ytr, Xte, yte))
    sgd = run_peer("sgd", Xtr, ytr, Xte, yte) if with_sgd else None
    out = []
    for key, fits in (("logreg", peer), ("sgd", [sgd] if sgd else [])):
        if not fits:
            continue
        target = fits[0]["accuracy"]
        fit_s = statistics.median(f["fit_s"] for f in fits)
        hits = [_time_to(r, target) for r in ours]
        # median over seeds, a seed that never reaches the target counting as infinitely slow
        times = sorted(float("inf") if t is None else t for _, t in hits)
        t_med = times[len(times) // 2] if times[len(times) // 2] != float("inf") else None
        rec: dict[str, Any] = {
            **common, "metric": f"time_to_{key}_accuracy", "unit": "s", "baseline_name": PEERS[key],
            "baseline": fit_s, "baseline_fit_s": [f["fit_s"] for f in fits], "baseline_accuracy": target,
            "baseline_n_iter": fits[0]["n_iter"], "baseline_converged": fits[0]["converged"],
            "ours": t_med, "ours_per_seed_s": [t for _, t in hits], "ours_epochs_per_seed": [e for e, _ in hits],
            "seeds_reached": sum(t is not None for _, t in hits),
            # the same within 0.001 of the peer's accuracy (a stated tolerance; the goal uses the exact target)
            "ours_per_seed_s_within_0.001": [_time_to(r, target - 0.001)[1] for r in ours],
            "ours_epochs_per_seed_within_0.001": [_time_to(r, target - 0.001)[0] for r in ours],
            "ratio": fit_s / t_med if t_med else None, "ours_over_baseline_time": t_med / fit_s if t_med else None,
            "ours_final_accuracy_per_seed": [r["accuracy"][-1] for r in ours],
            "ours_accuracy_per_epoch_seed0": ours[0]["accuracy"],
            "ours_epoch_s_median": statistics.median(x for r in ours for x in r["epoch_s"]),
            "seeds": seeds}
        if key == "logreg":
            rec.update(goal="reach LogisticRegression's test accuracy in <= 0.5x its fit time",
                       met=bool(t_med is not None and t_med <= 0.5 * fit_s))
        out.append(rec)
    return out


# ----------------------------------------------------------------------------------------------
# whole jobs beside the bare kernel


def _job_span(job: JobRun) -> dict[str, Any]:
    """Slowest worker's span from its clock-0 report to its last; rank 0's per-clock split."""
    work = [r for r in job.kind("worker") if "samples" in r]
    spans, split, clocks = [], {"compute_s": 0.0, "comm_s": 0.0}, 0
    for rank in {r["rank"] for r in work}:
        mine = sorted((r for r in work if r["rank"] == rank), key=lambda r: r["clock"])
        spans.append(mine[-1]["time"] - mine[0]["time"])
        if rank == 0:
            clocks = len(mine) - 1
            for r in mine[1:]:
                for k in split:
                    split[k] += r.get(k, 0.0)
            span0 = spans[-1]
    per_clock = {k: v / clocks for k, v in split.items()}
    per_clock["other (eval, report, python)"] = span0 / clocks - sum(per_clock.values())
    final = sorted((r for r in job.kind("clock") if "heldout_total" in r), key=lambda r: r["clock"])
    return {"span_s": max(spans), "clocks": clocks, "per_clock_s_rank0": per_clock, "launch_wall_s": job.seconds,
            "profile": tickprofile.job_profile(job, "compute_s"),
            "heldout_accuracy": final[-1]["heldout_correct"] / final[-1]["heldout_total"] if final else None}


def _config_args() -> dict[str, Any]:
    import yaml

    return yaml.safe_load(CONFIG.read_text())["app"]["args"]


def _bare(train: D.Dataset, test: D.Dataset, a: dict[str, Any], epochs: int) -> float:
    """Seconds of epochs 2..E of the bare kernel with the config's settings, evaluating per epoch as rank 0 does."""
    m = LocalModel(train.classes, train.features)
    rng = np.random.default_rng(0)
    total = 0.0
    for e in range(epochs):
        t0 = time.perf_counter()
        m.train(train, rng.permutation(train.n).astype(np.int64), a["batch_size"],
                a["lr"] / (1.0 + a["lr_decay"] * e), a["reg"])
        m.evaluate(test)
        if e:
            total += time.perf_counter() - t0
    return total


def job_case(epochs: int, reps: int, workers: tuple[int, ...] = (1, 2),
             data: tuple[D.Dataset, D.Dataset] | None = None) -> dict[str, Any]:
    """configs/mlr-fashion.yaml with 1 and 2 workers beside the bare kernel, alternated; medians.
    ``data``: a slice to run on instead of the config's files (written to .npz files for the job)."""
    a = _config_args()
    if a.get("lr_schedule", "inverse") != "inverse":
        raise ValueError(f"{CONFIG}: the bench's bare run follows lr_schedule inverse")
    sets: dict[str, Any] = {"app.args.epochs": epochs, **tickprofile.SETS}
    bare: list[float] = []
    jobs: dict[int, list[dict[str, Any]]] = {w: [] for w in workers}
    with tempfile.TemporaryDirectory(prefix="bosen-mlr-bench-") as tmp:
        if data is None:
            data = fashion()
            if data is None:
                raise FileNotFoundError(f"{FASHION}/train.npz, test.npz (run: bosen data fashion-mnist)")
        else:
            for part, ds in zip(("data", "test_data"), data, strict=True):
                D.save_npz(Path(tmp) / f"{part}.npz", ds)
                sets[f"app.args.{part}"] = str(Path(tmp) / f"{part}.npz")
        train, test = data
        for rep in range(reps):
            bare.append(_bare(train, test, a, epochs))
            for w in workers if rep % 2 == 0 else workers[::-1]:
                job = run_job(CONFIG, Path(tmp) / f"{rep}-{w}", workers=w, sets=sets, timeout=600, cwd=REPO).check()
                jobs[w].append(_job_span(job))
    rec: dict[str, Any] = {"bench": "apps", "case": "mlr-job", "dataset": f"fashion-mnist ({train.n} training samples)",
                           "metric": "job_time_over_bare", "unit": "x (lower is better)",
                           "config": str(CONFIG.relative_to(REPO)), "sets": sets, "epochs_timed": epochs - 1,
                           "bare_s": statistics.median(bare), "repeats": reps}
    for w in workers:
        rec[f"job_{w}w"] = sorted(jobs[w], key=lambda j: j["span_s"])[len(jobs[w]) // 2]
        print(f"apps_mlr: job, {w} worker(s): where a tick goes (bare kernel "
              f"{statistics.median(bare) * 1e3 / max(epochs - 1, 1):.3f} ms per epoch)\n"
              f"{tickprofile.table(rec[f'job_{w}w']['profile'])}", file=sys.stderr, flush=True)
        rec[f"ratio_{w}w"] = statistics.median(j["span_s"] / b for j, b in zip(jobs[w], bare, strict=True))
    rec.update(ours=rec["job_1w"]["span_s"], baseline=rec["bare_s"], baseline_name="bare kernel, one process",
               ratio=rec["ratio_1w"], goal="1-worker job <= 1.2x the bare kernel", met=bool(rec["ratio_1w"] <= 1.2))
    return rec


def run_bench(quick: bool = False) -> list[dict[str, Any]]:
    """Kernel vs scikit-learn on Fashion-MNIST (slices when quick), then jobs vs the bare kernel."""
    out: list[dict[str, Any]] = []
    data = fashion(3000, 1000) if quick else fashion()
    if data is None:
        out.append({"bench": "apps", "case": "mlr", "dataset": "fashion-mnist", "ours": None, "baseline": None,
                    "ratio": None, "missing": f"{FASHION}/train.npz, test.npz (run: bosen data fashion-mnist)"})
        full = D.synthetic(6000, 784, 10, nnz=40, seed=1)
        data = D.split_holdout(full, 0.2, 0)
        name = "synthetic-6k"
    else:
        name = "fashion-mnist" + ("-3k-slice" if quick else "")
    out += kernel_case(name, data, epochs=8 if quick else 15, seeds=1 if quick else 3, with_sgd=True)
    if not name.startswith("synthetic"):
        out.append(job_case(epochs=3, reps=1, workers=(1,), data=data) if quick else job_case(epochs=10, reps=2))
    else:
        out.append({"bench": "apps", "case": "mlr-job", "dataset": "fashion-mnist", "ours": None, "baseline": None,
                    "ratio": None, "missing": f"{FASHION}/train.npz, test.npz (run: bosen data fashion-mnist)"})
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    for rec in run_bench(quick="--quick" in argv):
        print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
