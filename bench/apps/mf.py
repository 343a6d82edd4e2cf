"""MF benchmarks: our SGD kernel beside scikit-surprise's SVD, and whole jobs beside the bare kernel.

Kernel (case "mf"). The peer is scikit-surprise's ``SVD(biased=False)``: the same model (r ≈ p_u·q_i),
the same per-rating SGD step (Funk's, both rows from their pre-update values), same hyperparameters:
rank 16, lr 0.005, reg 0.02, 20 epochs, no learning-rate decay, factors initialized N(0, 0.1²); each
pair of runs starts from the same factors (the ones surprise draws for the pair's seed), because the
draw alone moves the 20-epoch RMSE on the synthetic set by about ±0.008, more than half an epoch
(measured over 9 seeds), and hides the algorithms' difference. Ours visits the ratings in a fresh
random order each epoch (``sgd_pass`` in a shuffled ``order``); surprise visits them in its fixed
user-grouped order. From the same start, ours in surprise's order gives surprise's RMSE per epoch to
float32 rounding (the diagnostic below), so what remains between the two is the order: a shuffle is
ahead on MovieLens, behind on the synthetic set. Data: MovieLens-100K (``bosen data movielens``:
data/movielens/{train,test}.csv) and a synthetic set of ~2M ratings (apps/mf/data.synthetic, 10% held
out). Measured per data set, runs alternated (ours, surprise, surprise, ours, ...):

- ratings/s of each over the 20 epochs (surprise: its ``fit``, the trainset built beforehand; ours:
  the epochs' permutations and sgd_pass calls);
- test RMSE (predictions clipped to the training ratings' range, as surprise does; a user or item
  without training ratings is predicted as the global mean, surprise's rule, for both);
- epochs and seconds for ours to reach surprise's final test RMSE (ours evaluated after each epoch,
  evaluation not timed), and surprise's fit time over ours: the goal is no more epochs and >= 3x.

Jobs (case "mf-job"). The same data through ``bosen launch`` (bosen.jobs.job.run_job) with
configs/mf-movielens.yaml's settings, 1 and 2 workers, beside the bare kernel doing the same epochs
in one process (sgd_pass over all ratings plus the held-out RMSE per epoch, as the job's workers
score theirs). Job time = the slowest worker's span from its clock-0 report to its last report
(epochs 2..E: start-up and first-touch costs are outside); bare time = the same epochs. The goal is
1-worker job / bare <= 1.3x. The record splits the job's per-clock time with the workers' own
reports (kernel ``seconds``, ``read_s``, ``send_s``, ``eval_s``, ``clock_s``; the rest is the
worker's Python between them).

``python -m bench.apps.mf [--quick]`` prints one JSON line per result (``python -m bench.apps`` runs it too);
``--kernels`` runs the kernel cases only.
``--quick`` uses small synthetic data and a short MovieLens run, and records the missing peer or
data set as missing.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.apps import tickprofile
from bench.common import REPO
from bosen.apps.mf.data import Triples, load_csv, synthetic
from bosen.apps.mf.kernels import clipped_squared_error, sgd_pass
from bosen.jobs.job import JobRun, run_job

CONFIG = REPO / "configs" / "mf-movielens.yaml"
MOVIELENS = REPO / "data" / "movielens"
RANK, LR, REG, EPOCHS, INIT_STD = 16, 0.005, 0.02, 20, 0.1
MAX_EPOCHS = 30  # ours runs on past surprise's 20 epochs, to say how many it needs when it needs more
PEER = "scikit-surprise SVD(biased=False)"


def movielens() -> tuple[Triples, Triples, int, int] | None:
    """(train, test, n_users, n_items) of data/movielens, or None when it has not been prepared."""
    tr, te = MOVIELENS / "train.csv", MOVIELENS / "test.csv"
    if not (tr.exists() and te.exists()):
        return None
    train, test = load_csv(tr), load_csv(te)
    return train, test, int(max(train[0].max(), test[0].max())) + 1, int(max(train[1].max(), test[1].max())) + 1


def synthetic_split(n_users: int, n_items: int, nnz: int) -> tuple[Triples, Triples, int, int]:
    """A seeded synthetic set (rank-16 truth, Zipf degrees), 10% held out."""
    u, i, r = synthetic(n_users, n_items, RANK, nnz, noise=0.1, seed=0, alpha=0.8)
    k = nnz // 10
    return (u[k:], i[k:], r[k:]), (u[:k], i[:k], r[:k]), n_users, n_items


class Scorer:
    """Test RMSE with one rule for both models: clip(p_u·q_i) to the training range; the training
    mean where the user or item has no training rating (what surprise predicts there)."""

    def __init__(self, train: Triples, test: Triples, n_users: int, n_items: int) -> None:
        seen_u = np.zeros(n_users, bool)
        seen_i = np.zeros(n_items, bool)
        seen_u[train[0]] = True
        seen_i[train[1]] = True
        known = seen_u[test[0]] & seen_i[test[1]]
        self.u, self.i, self.r = test[0][known], test[1][known], test[2][known]
        self.lo, self.hi = float(train[2].min()), float(train[2].max())
        mean = float(np.clip(train[2].astype(np.float64).mean(), self.lo, self.hi))
        self.unknown_se = float(((test[2][~known].astype(np.float64) - mean) ** 2).sum())
        self.n = test[2].size

    def rmse(self, L: np.ndarray, R: np.ndarray) -> float:
        se = clipped_squared_error(self.u, self.i, self.r, L, R, self.lo, self.hi)
        return float(np.sqrt((se + self.unknown_se) / self.n))


def init_factors(n_users: int, n_items: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return ((rng.standard_normal((n_users, RANK)) * INIT_STD).astype(np.float32),
            (rng.standard_normal((n_items, RANK)) * INIT_STD).astype(np.float32))


def surprise_order(users: np.ndarray) -> np.ndarray:
    """The order surprise's fit visits the ratings in: users by first appearance, each user's ratings
    in file order (its trainset groups them so)."""
    _, first, inv = np.unique(users, return_index=True, return_inverse=True)
    return np.lexsort((np.arange(users.size), np.argsort(np.argsort(first))[inv]))


def surprise_init(trainset: Any, n_users: int, n_items: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The initial factors surprise's SVD draws with ``random_state=seed`` (numpy RandomState, users then
    items, N(0, INIT_STD²) by inner id), placed at our raw ids: a pair of runs then starts from the same
    point, and the comparison is of the algorithms, not of two random draws."""
    rng = np.random.RandomState(seed)
    pu = rng.normal(0.0, INIT_STD, (trainset.n_users, RANK))
    qi = rng.normal(0.0, INIT_STD, (trainset.n_items, RANK))
    L = np.zeros((n_users, RANK), np.float32)
    R = np.zeros((n_items, RANK), np.float32)
    raw_u = np.fromiter(trainset._raw2inner_id_users.keys(), np.int64)
    raw_i = np.fromiter(trainset._raw2inner_id_items.keys(), np.int64)
    L[raw_u] = pu[np.fromiter(trainset._raw2inner_id_users.values(), np.int64)]
    R[raw_i] = qi[np.fromiter(trainset._raw2inner_id_items.values(), np.int64)]
    return L, R


def run_ours(train: Triples, scorer: Scorer, n_users: int, n_items: int, epochs: int, seed: int,
             evaluate: bool = True, fixed: np.ndarray | None = None,
             init: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, Any]:
    """Our kernel for ``epochs`` epochs, shuffled (or in the ``fixed`` order), from ``init`` (default: our
    own N(0, INIT_STD²) draw): per-epoch seconds (permutation + sgd_pass) and test RMSE."""
    u, i, r = train
    L, R = init_factors(n_users, n_items, seed) if init is None else (init[0].copy(), init[1].copy())
    rng = np.random.default_rng(seed)
    secs, rmse = [], []
    for _ in range(epochs):
        t0 = time.perf_counter()
        order = rng.permutation(r.size) if fixed is None else fixed
        sgd_pass(u, i, r, L, R, LR, REG, order)
        secs.append(time.perf_counter() - t0)
        if evaluate:
            rmse.append(scorer.rmse(L, R))
    return {"epoch_s": secs, "rmse": rmse}


def surprise_trainset(train: Triples) -> Any:
    """surprise's Trainset of the same ratings (built once, outside the timed fit)."""
    from surprise import Dataset, Reader

    lo, hi = float(train[2].min()), float(train[2].max())
    ds = Dataset(Reader(rating_scale=(lo, hi)))
    return ds.construct_trainset(list(zip(train[0].tolist(), train[1].tolist(), train[2].tolist(),
                                          [None] * train[2].size, strict=True)))


def run_surprise(trainset: Any, scorer: Scorer, n_users: int, n_items: int, seed: int) -> dict[str, Any]:
    """surprise SVD(biased=False) with our hyperparameters: fit seconds and test RMSE (our scorer,
    its factors mapped back to raw ids)."""
    from surprise import SVD

    algo = SVD(biased=False, n_factors=RANK, n_epochs=EPOCHS, lr_all=LR, reg_all=REG, init_mean=0.0,
               init_std_dev=INIT_STD, random_state=seed)
    t0 = time.perf_counter()
    algo.fit(trainset)
    fit_s = time.perf_counter() - t0
    L = np.zeros((n_users, RANK), np.float32)
    R = np.zeros((n_items, RANK), np.float32)
    for raw, inner in trainset._raw2inner_id_users.items():
        L[raw] = algo.pu[inner]
    for raw, inner in trainset._raw2inner_id_items.items():
        R[raw] = algo.qi[inner]
    return {"fit_s": fit_s, "rmse": scorer.rmse(L, R)}


def _missing_peer() -> str | None:
    try:
        import surprise  # noqa: F401
    except ImportError:
        return "scikit-surprise not installed (pip install -e '.[bench]')"
    return None


def kernel_case(name: str, data: tuple[Triples, Triples, int, int], reps: int) -> list[dict[str, Any]]:
    """Ours vs surprise on one data set, ``reps`` alternated pairs; medians over pairs."""
    train, test, nu, ni = data
    n = int(train[2].size)
    scorer = Scorer(train, test, nu, ni)
    common: dict[str, Any] = {"bench": "apps", "case": "mf", "dataset": name, "baseline_name": PEER,
                              "n_users": nu, "n_items": ni, "train_ratings": n, "test_ratings": int(test[2].size),
                              "rank": RANK, "lr": LR, "reg": REG, "epochs": EPOCHS, "init_std": INIT_STD,
                              "order": "ours: shuffled each epoch; surprise: its fixed order",
                              "init": "each pair starts from the factors surprise draws for its seed"}
    sgd_pass(train[0][:8], train[1][:8], train[2][:8], *init_factors(nu, ni, 0), LR, REG,
             np.arange(8))  # compile / load the numba cache
    missing = _missing_peer()
    ours_runs, peer_runs = [], []
    trainset = None if missing else surprise_trainset(train)
    inits = [None if trainset is None else surprise_init(trainset, nu, ni, rep) for rep in range(reps)]
    for rep in range(reps):
        first_ours = rep % 2 == 0
        for who in ("ours", "peer") if first_ours else ("peer", "ours"):
            if who == "ours":
                ours_runs.append(run_ours(train, scorer, nu, ni, MAX_EPOCHS, seed=rep, init=inits[rep]))
            elif trainset is not None:
                peer_runs.append(run_surprise(trainset, scorer, nu, ni, seed=rep))
    ours_s = [sum(o["epoch_s"][:EPOCHS]) for o in ours_runs]
    thr: dict[str, Any] = {**common, "metric": "sgd_throughput", "unit": "ratings/s",
                           "ours": n * EPOCHS / statistics.median(ours_s),
                           "ours_test_rmse": ours_runs[0]["rmse"][EPOCHS - 1],
                           "ours_rmse_per_epoch": ours_runs[0]["rmse"], "repeats": reps}
    if missing:
        thr.update(baseline=None, ratio=None, missing=missing)
        return [thr, {**common, "metric": "time_to_peer_rmse", "ours": None, "baseline": None, "ratio": None,
                      "missing": missing, "goal": "reach surprise's test RMSE in <= its epochs and >= 3x faster",
                      "met": False}]
    peer_s = [p["fit_s"] for p in peer_runs]
    thr.update(baseline=n * EPOCHS / statistics.median(peer_s), baseline_test_rmse=peer_runs[0]["rmse"],
               ratio=statistics.median(p / o for p, o in zip(peer_s, ours_s, strict=True)))
    # time to the peer's final RMSE, pair by pair (same seed: ours run rep vs surprise run rep)
    ratios, epochs_needed, t_ours = [], [], []
    for o, p in zip(ours_runs, peer_runs, strict=True):
        hit = next((e for e, x in enumerate(o["rmse"]) if x <= p["rmse"]), None)
        if hit is None:
            epochs_needed.append(None)
            continue
        t = float(sum(o["epoch_s"][:hit + 1]))
        epochs_needed.append(hit + 1)
        t_ours.append(t)
        ratios.append(p["fit_s"] / t)
    reached = all(e is not None for e in epochs_needed)
    ratio = statistics.median(ratios) if reached else None
    tt = {**common, "metric": "time_to_peer_rmse", "unit": "s",
          "ours": statistics.median(t_ours) if reached else None, "baseline": statistics.median(peer_s),
          "ratio": ratio, "ratios": ratios, "epochs_ours": epochs_needed, "epochs_baseline": EPOCHS,
          "peer_test_rmse": [p["rmse"] for p in peer_runs],
          "ours_test_rmse_at_20": [o["rmse"][EPOCHS - 1] for o in ours_runs],
          # diagnostics (not timed against it): our kernel from pair 0's start in surprise's own order
          # (it reproduces surprise's RMSE to float32 rounding), and from our own draw of the factors
          "ours_in_surprise_order_rmse_per_epoch": run_ours(train, scorer, nu, ni, EPOCHS, 0, fixed=surprise_order(
              train[0]), init=inits[0])["rmse"],
          "ours_own_init_rmse_per_epoch": run_ours(train, scorer, nu, ni, EPOCHS, 0)["rmse"],
          "goal": "reach surprise's test RMSE in <= its epochs and >= 3x faster",
          "met": bool(reached and max(epochs_needed) <= EPOCHS and ratio is not None and ratio >= 3.0)}
    return [thr, tt]


# ----------------------------------------------------------------------------------------------
# whole jobs beside the bare kernel

PARTS = ("seconds", "read_s", "send_s", "eval_s", "clock_s")


def _job_span(job: JobRun) -> dict[str, Any]:
    """Slowest worker's span from its clock-0 report to its last, and the per-clock split of it."""
    work = [r for r in job.kind("worker") if "samples" in r]
    spans, parts = [], {p: 0.0 for p in PARTS}
    clocks, span0 = 0, 0.0
    for rank in {r["rank"] for r in work}:
        mine = sorted((r for r in work if r["rank"] == rank), key=lambda r: r["clock"])
        spans.append(mine[-1]["time"] - mine[0]["time"])
        if rank == 0:
            clocks, span0 = len(mine) - 1, spans[-1]
            for r in mine[1:]:
                for p in PARTS:
                    parts[p] += r.get(p, 0.0)
    span = max(spans)
    per_clock = {p: v / clocks for p, v in parts.items()}
    per_clock["other"] = span0 / clocks - sum(per_clock.values()) if clocks else 0.0
    final = sorted(job.kind("clock"), key=lambda r: r["clock"])[-1]
    return {"span_s": span, "clocks": clocks, "per_clock_s_rank0": per_clock,
            "heldout_rmse": final.get("heldout_rmse"), "launch_wall_s": job.seconds,
            "profile": tickprofile.job_profile(job, "seconds")}


def _bare(train: Triples, scorer: Scorer, nu: int, ni: int, epochs: int, evaluate: bool) -> float:
    """Seconds of epochs 2..E of the bare kernel, with the held-out RMSE per epoch when the job scores too."""
    u, i, r = train
    L, R = init_factors(nu, ni, 0)
    rng = np.random.default_rng(0)
    total = 0.0
    for e in range(epochs):
        t0 = time.perf_counter()
        sgd_pass(u, i, r, L, R, LR, REG, rng.permutation(r.size))
        if evaluate:
            scorer.rmse(L, R)
        if e:
            total += time.perf_counter() - t0
    return total


def job_case(name: str, data: tuple[Triples, Triples, int, int], sets: dict[str, Any], epochs: int,
             reps: int, workers: tuple[int, ...] = (1, 2)) -> dict[str, Any]:
    """The job with 1 (and 2) workers beside the bare kernel, alternated; medians over ``reps``."""
    train, test, nu, ni = data
    scorer = Scorer(train, test, nu, ni)
    evaluate = sets.get("app.args.eval_every", 1) != 0 and test[2].size > 0
    sets = {"app.args.epochs": epochs, "app.args.lr_decay": 1.0, **tickprofile.SETS, **sets}
    bare, jobs = [], {w: [] for w in workers}
    with tempfile.TemporaryDirectory(prefix="bosen-mf-bench-") as tmp:
        for rep in range(reps):
            bare.append(_bare(train, scorer, nu, ni, epochs, evaluate))
            for w in workers if rep % 2 == 0 else workers[::-1]:
                job = run_job(CONFIG, Path(tmp) / f"{rep}-{w}", workers=w, sets=sets, timeout=600, cwd=REPO).check()
                jobs[w].append(_job_span(job))
    rec: dict[str, Any] = {"bench": "apps", "case": "mf-job", "dataset": name, "metric": "job_time_over_bare",
                           "unit": "x (lower is better)", "config": str(CONFIG.relative_to(REPO)), "sets": sets,
                           "epochs_timed": epochs - 1, "bare_s": statistics.median(bare), "repeats": reps,
                           "train_ratings": int(train[2].size)}
    for w in workers:
        mid = sorted(jobs[w], key=lambda j: j["span_s"])[len(jobs[w]) // 2]
        rec[f"job_{w}w"] = mid
        print(f"apps_mf: {name} job, {w} worker(s): where a tick goes (bare kernel "
              f"{statistics.median(bare) * 1e3 / max(epochs - 1, 1):.3f} ms per epoch)\n"
              f"{tickprofile.table(mid['profile'])}", file=sys.stderr, flush=True)
        rec[f"ratio_{w}w"] = statistics.median(j["span_s"] / b for j, b in zip(jobs[w], bare, strict=True))
    rec.update(ours=rec["job_1w"]["span_s"], baseline=rec["bare_s"], baseline_name="bare kernel, one process",
               ratio=rec["ratio_1w"], goal="1-worker job <= 1.2x the bare kernel", met=bool(rec["ratio_1w"] <= 1.2))
    return rec


def _missing_data(case: str) -> dict[str, Any]:
    return {"bench": "apps", "case": case, "dataset": "movielens-100k", "ours": None, "baseline": None,
            "ratio": None, "missing": f"{MOVIELENS}/train.csv, test.csv (run: bosen data movielens)"}


def run_bench(quick: bool = False) -> list[dict[str, Any]]:
    """Kernel vs surprise on MovieLens-100K and synthetic data; jobs vs the bare kernel."""
    out: list[dict[str, Any]] = []
    ml = movielens()
    syn = synthetic_split(5_000, 1_000, 100_000) if quick else synthetic_split(50_000, 10_000, 2_200_000)
    syn_name = f"synthetic-{syn[0][2].size // 1000}k"
    reps = 1 if quick else 3
    if ml is None:
        out.append(_missing_data("mf"))
    else:
        out += kernel_case("movielens-100k", ml, reps)
    out += kernel_case(syn_name, syn, reps)
    ml_sets: dict[str, Any] = {}
    if ml is None:
        out.append(_missing_data("mf-job"))
    else:
        out.append(job_case("movielens-100k", ml, ml_sets, epochs=5 if quick else EPOCHS, reps=reps))
    nu, ni = syn[2], syn[3]
    syn_sets = {"tables.L.rows": nu, "tables.R.rows": ni, "app.args.data": "synthetic", "app.args.test_data": "",
                "app.args.nnz": int(syn[0][2].size + syn[1][2].size), "app.args.holdout": 0.1,
                "app.args.noise": 0.1, "app.args.alpha": 0.8, "app.args.data_seed": 0}
    out.append(job_case(syn_name, syn, syn_sets, epochs=4 if quick else 10, reps=1 if quick else 2,
                        workers=(1,) if quick else (1, 2)))
    return out


def kernels_only() -> list[dict[str, Any]]:
    """Only the kernel cases (MovieLens-100K when prepared, the 2M synthetic set), 3 pairs each."""
    ml = movielens()
    syn = synthetic_split(50_000, 10_000, 2_200_000)
    return (kernel_case("movielens-100k", ml, 3) if ml else [_missing_data("mf")]) + \
        kernel_case(f"synthetic-{syn[0][2].size // 1000}k", syn, 3)


if __name__ == "__main__":
    # python -m bench.apps.mf [--quick | --kernels]
    for rec in kernels_only() if "--kernels" in sys.argv[1:] else run_bench(quick="--quick" in sys.argv[1:]):
        print(json.dumps(rec), flush=True)
