"""``python -m bench.pollux``: Pollux's checks in miniature (issue 33; docs/design.md,
"Pollux (goodput)"). So far the first: the gradient noise scale φ (``bosen.gradstats``) against
its exact value on softmax regression (MLR, ``bench/pollux/phi.py``), and the throughput model's
held-out error; one JSON line per result.

- ``fixed``: W at a few steps of a training run (M0 = 64 examples a step, lr ``--lr``); at each, the
  estimate after ``--warmup`` steps at that version against the exact φ there (the estimator alone).
  Cases: ``workers`` (8 workers' gradients of 8 examples), ``micro`` (one worker's 64 in 4
  micro-batches of 16), ``differenced`` (one worker, one gradient of 64 a step), each also at
  ``--scales`` times the batch (the larger batch Pollux would choose where φ is large: the estimate's
  noise shrinks with it). One line per (case, batch, point, seed): the ratio estimate/exact; a summary
  per (case, batch): median, min, max and the share within ±20%.
- ``along``: during the run itself, the estimate against the exact φ smoothed with the same factors
  (what a moving average can track), and against the exact φ at the current W alone, from step
  ``--warmup-along`` on.
- ``throughput``: real synchronous MLR jobs (digits; servers and K worker processes over loopback) at
  per-worker batches ``--ms`` and worker counts ``--ks`` (no more workers than cores: the model
  has each worker on its own machine, and workers sharing a core slow each other's computation),
  ``--reps`` rounds: each configuration's median step time, then the throughput model's error fitted
  on all configurations (the paper's "average error of the fitted model", P:239) and, stricter, fitted
  on all but one and predicting the one left out (``inside``: the mean over those whose m lies inside
  the range, where the fit interpolates), each fitted on the configurations' medians over rounds and
  on their fastest rounds; and the noise floor, each round's step time predicted by the median of the
  configuration's other rounds. Each fit twice on the same measurements: T_grad linear (eq. 8) and
  curved (α + β·m^p, p fitted: ``fit_throughput(curved=True)``). Not in ``--quick``: a job takes
  seconds to start.

- ``adaptive``: Pollux's agent (``apps/goodput.py``) on real synchronous MLR jobs (``--adaptive-data``,
  2 workers, M0 = 64, lr ``--adaptive-lr`` at M0): the adaptive batch against a fixed M0 and a fixed
  16·M0 (both through the same agent: φ measured, AdaScale's learning rate), ``--adaptive-reps``
  rounds alternating the modes: seconds from the first iteration to the first held-out loss at or
  below each ``--target`` (several: each reported on the same runs), the best held-out loss and
  accuracy, the chosen M over training; then the adaptive job under each ``--bandwidths`` budget
  (managed communication) and each ``--delays`` injected round trip (a slower link, on one machine)
  and each ``--links`` rate (the job's processes in a network namespace whose loopback is shaped to
  it, the budget at that rate): the chosen M. A plot, ``--plot``. Not in ``--quick`` (a job takes
  seconds to start) unless named. ``--adaptive-app cnn``: the same comparison on the PyTorch CNN
  example (Fashion-MNIST images, the servers' SGD, ``--adaptive-large`` for the fixed large M),
  without budgets or delays; ``--adaptive-app cnn-adam``: the CNN in hybrid mode (all-reduce, a
  local Adam at ``--adaptive-lr`` 0.002, the square-root rule and its efficiency, √((φ + M0)/(φ + M))).

- ``adam-efficiency``: statistical efficiency under Adam (``bench/pollux/adamstat.py``): the CNN at
  fixed batches ``--adam-batches`` (the first is M0) with Adam at ``--adam-lr`` (0.002) times
  √(M/M0), ``--adam-examples`` examples each, ``--seeds`` seeds; per held-out loss in ``--adam-targets``
  the measured efficiency (examples M0 needed over examples M needed) against EFFICIENCY(M) of the φ
  the agent measures during the M0 run (pre-conditioned after the step, before it, by √P, plain), of
  appendix A.1's Adam form, and of the square-root rule's own efficiency (per coordinate, and √ of
  eq. 6 of each φ). Counts examples, not seconds: the load does not enter.

``--quick``: fewer points, steps and seeds, for CI.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import numpy as np

from bench.common import REPO, emit
from bench.pollux.phi import Case, ExactStats, along, at_point, trajectory
from bosen.apps.mlr import data as D

CASES = [Case("workers", 8, 8), Case("micro", 4, 16), Case("differenced", 1, 64)]
M0 = 64  # the run's batch: a step of M counts M/M0 in the smoothing


def dataset(name: str, samples: int) -> D.Dataset:
    """``digits`` (sklearn's, 1797 samples) or a `bosen data` MLR set under data/ (its first
    ``samples`` training samples: the exact statistics hold the set densely)."""
    if name == "digits":
        return D.digits()
    ds, _ = D.load_npz(str(REPO / "data" / name / "train.npz"))
    return ds.take(np.arange(min(samples, ds.n), dtype=np.int64))


def _spread(xs: list[float]) -> dict[str, float | None]:
    """Median, min and max; a target never reached (inf) is null, JSON has no infinity."""
    return {"median": _none_if_inf(statistics.median(xs)), "min": _none_if_inf(min(xs)),
            "max": _none_if_inf(max(xs))}


def _none_if_inf(x: float) -> float | None:
    return x if math.isfinite(x) else None


def fixed(a: argparse.Namespace, ds: D.Dataset, exact: ExactStats) -> None:
    runs = {seed: trajectory(ds, 8, 8, a.lr, a.points, seed) for seed in range(a.seeds)}
    for scale in a.scales:
        for base in CASES:
            case = Case(base.name, base.k, base.b * scale)
            ratios: list[float] = []
            for seed, Ws in runs.items():
                for t, W in zip(a.points, Ws, strict=True):
                    e = exact.at(W).phi
                    r = at_point(ds, W, case, a.warmup, a.smoothing, 1000 + seed, m0=M0) / e
                    ratios.append(r)
                    emit(bench="pollux", case=f"phi fixed {case.name} M={case.k * case.b} step={t} seed={seed}",
                         metric="phi_ratio", unit="estimate / exact", ours=r, experiment="fixed", estimator=case.name,
                         k=case.k, b=case.b, batch=case.k * case.b, step=t, seed=seed, exact_phi=e,
                         phi_over_batch=e / (case.k * case.b), warmup=a.warmup, smoothing=a.smoothing)
            s = _spread(ratios)
            within = sum(abs(r - 1) <= 0.2 for r in ratios) / len(ratios)
            emit(bench="pollux", case=f"phi fixed {case.name} M={case.k * case.b}", metric="phi_ratio",
                 unit="estimate / exact", ours=s["median"], spread=s, within_20pct=within, summary=True,
                 experiment="fixed", estimator=case.name, batch=case.k * case.b, points=a.points, seeds=a.seeds,
                 warmup=a.warmup, lr=a.lr, data=a.data)


def along_run(a: argparse.Namespace, ds: D.Dataset, exact: ExactStats) -> None:
    for case in CASES:
        if case.name == "micro":
            continue  # the same estimator as workers, statistically: only the sampling differs in a PS
        smooth, inst = [], []
        for seed in range(a.seeds):
            for t, est, sm, now in along(ds, exact, case, a.steps, a.lr, a.smoothing, a.every, seed):
                if t >= a.warmup_along:
                    smooth.append(est / sm)
                    inst.append(est / now)
        s, i = _spread(smooth), _spread(inst)
        emit(bench="pollux", case=f"phi along {case.name}", metric="phi_ratio", unit="estimate / exact smoothed",
             ours=s["median"], spread=s, within_20pct=sum(abs(r - 1) <= 0.2 for r in smooth) / len(smooth),
             vs_instant=i, summary=True, experiment="along", estimator=case.name, steps=a.steps, every=a.every,
             from_step=a.warmup_along, seeds=a.seeds, lr=a.lr, smoothing=a.smoothing, data=a.data)


def throughput(a: argparse.Namespace) -> None:
    from bench.pollux.steps import held_out_errors, in_sample_errors, noise_floor, step_seconds

    configs = [(m, k) for m in a.ms for k in a.ks]
    times: dict[tuple[int, int], list[float]] = {c: [] for c in configs}
    for rep in range(a.reps):  # rounds over every configuration: the machine's drift hits all alike
        for m, k in configs:
            times[(m, k)].append(step_seconds(m, k, a.iterations, a.skip, rep, a.timeout))
    for (m, k) in configs:
        emit(bench="pollux", case=f"step m={m} K={k}", metric="step_seconds", unit="s",
             ours=statistics.median(times[(m, k)]), spread=_spread(times[(m, k)]), rounds=times[(m, k)],
             experiment="throughput", m=m, workers=k, iterations=a.iterations, skip=a.skip, reps=a.reps)
    ms, ks = [m for m, _ in configs], [k for _, k in configs]
    inside = [min(a.ms) < m < max(a.ms) for m in ms]  # held out inside the range of m: no extrapolation
    floor = noise_floor([times[c] for c in configs])
    emit(bench="pollux", case="throughput noise floor", metric="throughput_error", unit="|predicted/measured - 1|",
         ours=statistics.mean(floor), spread=_spread(floor), summary=True, experiment="throughput",
         predictor="a round's step time from the median of the configuration's other rounds", reps=a.reps)
    # the samples a fit takes: each configuration's median over rounds, or its fastest round (the load
    # of other processes only ever adds to a step: the minimum is the machine's own step, less noisy)
    # T_grad linear (eq. 8, fit_throughput's default) and curved (α + β·m^p, p fitted from three batch sizes
    # on), on the same measurements: the comparison is paired, the machine's drift the same for both
    for samples, pick in (("median", statistics.median), ("min", min)):
        secs = [pick(times[c]) for c in configs]
        for curved in (False, True):
            errs = held_out_errors(ms, ks, secs, curved)
            form = "curved" if curved else "linear"
            if samples == "median" and not curved:
                for (m, k), e in zip(configs, errs, strict=True):
                    emit(bench="pollux", case=f"held out m={m} K={k}", metric="throughput_error",
                         unit="|predicted/measured - 1|", ours=e, experiment="throughput", m=m, workers=k)
            within = [e for e, i in zip(errs, inside, strict=True) if i]
            name = ("throughput model held out" + ("" if samples == "median" else " (fit on each configuration's min)")
                    + (" (curved T_grad)" if curved else ""))
            emit(bench="pollux", case=name, metric="throughput_error", unit="|predicted/measured - 1|",
                 ours=statistics.mean(errs), spread=_spread(errs), inside=statistics.mean(within) if within else None,
                 errors=errs, summary=True, experiment="throughput", samples=samples, form=form,
                 configurations=len(errs), ms=a.ms, ks=a.ks, reps=a.reps)
            fitted = in_sample_errors(ms, ks, secs, curved)
            emit(bench="pollux", case=name.replace("held out", "fitted on all"), metric="throughput_error",
                 unit="|predicted/measured - 1|", ours=statistics.mean(fitted), spread=_spread(fitted), summary=True,
                 experiment="throughput", samples=samples, form=form, configurations=len(fitted), ms=a.ms, ks=a.ks,
                 reps=a.reps)


def sim_run(a: argparse.Namespace) -> None:
    from bench.pollux import sim
    from bench.pollux.profiles import load

    kinds = sim.kinds_from_profiles(load(), a.sync_growth)
    results: dict[str, list[dict[str, float]]] = {p: [] for p in sim.POLICIES}
    for seed in range(a.traces):
        trace = sim.make_trace(kinds, seed, a.jobs, a.hours, a.slots)
        for policy in sim.POLICIES:
            r = sim.run_policy(policy, trace, kinds, a.slots, a.interval, a.delay)
            results[policy].append(r)
            emit(bench="pollux", case=f"sim {policy} trace={seed}", metric="avg_jct", unit="h", ours=r["avg_jct_h"],
                 experiment="sim", policy=policy, trace=seed, slots=a.slots, interval=a.interval, delay=a.delay,
                 sync_growth=a.sync_growth, **{k: v for k, v in r.items() if k != "rho"})
    ours = results["pollux p=-1"]
    for base in ("fair M0", "fair tuned", "tiresias M0xK", "tiresias tuned", "pollux p=-1 paper"):
        for key in ("avg_jct_h", "p99_jct_h", "makespan_h", "rho_max", "rho_p99"):
            ratios = [b[key] / o[key] for b, o in zip(results[base], ours, strict=True)]
            emit(bench="pollux", case=f"sim {key} {base} / pollux p=-1", metric=f"{key}_ratio",
                 unit="baseline / pollux (> 1 = pollux better)", ours=statistics.median(ratios), spread=_spread(ratios),
                 reduction=1 - 1 / statistics.median(ratios), summary=True, experiment="sim", baseline=base,
                 traces=a.traces, jobs=a.jobs, slots=a.slots, hours=a.hours, delay=a.delay,
                 sync_growth=a.sync_growth)
    for key in ("rho_max", "rho_p99", "rho_p90", "rho_std"):
        ratios = [b[key] / o[key] for b, o in zip(results["pollux p=1"], ours, strict=True)]
        emit(bench="pollux", case=f"sim {key} pollux p=1 / p=-1", metric=f"{key}_ratio",
             unit="p=1 / p=-1 (> 1 = p=-1 fairer)", ours=statistics.median(ratios), spread=_spread(ratios),
             summary=True, experiment="sim", traces=a.traces, jobs=a.jobs, slots=a.slots)
    if a.plot:
        from bench.pollux.plot import sim_figure

        sim_figure(results, a.plot)


def adaptive(a: argparse.Namespace) -> None:
    from bench.pollux.adaptive import Plan, Run, grows, plot, run

    iters = dict(zip(("adaptive", "fixed-m0", "fixed-large"), a.adaptive_iters, strict=True))
    runs: dict[str, list[Run]] = {m: [] for m in a.modes}
    for rep in range(a.adaptive_reps):  # rounds: each runs every mode, so the machine's drift hits all alike
        for mode in a.modes:
            r = run(Plan(mode, iters[mode], data=a.adaptive_data, app=a.adaptive_app, large=a.adaptive_large,
                         lr=a.adaptive_lr, seed=rep,
                         smoothing=a.agent_smoothing))
            runs[mode].append(r)
            ms = [c["goodput_batch"] for c in r.choices]
            emit(bench="pollux", case=f"adaptive {mode} rep={rep}", metric="seconds_to_target", unit="s",
                 ours=_none_if_inf(r.time_to(a.target[0])), experiment="adaptive", mode=mode, rep=rep,
                 target=a.target[0],
                 seconds_to={str(x): _none_if_inf(r.time_to(x)) for x in a.target},
                 best_loss=r.best_loss, best_acc=r.best_acc, job_seconds=r.job_seconds, startup=r.startup,
                 trained_seconds=r.evals[-1][0], iterations=iters[mode], batches=ms,
                 phis=[c["goodput_phi"] for c in r.choices], m_over_training=grows(ms), data=a.adaptive_data,
                 app=a.adaptive_app, large=a.adaptive_large, curve=[[t, loss] for t, _, loss, _ in r.evals])
    ref = runs.get("adaptive")
    for target in a.target:  # each held-out loss target, on the same runs
        for mode, rs in runs.items():
            tt = [r.time_to(target) for r in rs]
            fields: dict[str, object] = {}
            if ref and mode != "adaptive":
                pairs = list(zip([r.time_to(target) for r in ref], tt, strict=True))
                ratios = [b / x for x, b in pairs if math.isfinite(x) and math.isfinite(b)]  # rounds where both hit it
                fields.update(speedup_of_adaptive=_spread(ratios) if ratios else None,
                              missed={"adaptive": sum(not math.isfinite(x) for x, _ in pairs),
                                      mode: sum(not math.isfinite(b) for _, b in pairs)},
                              best_acc_gap=_spread([x.best_acc - r.best_acc for x, r in zip(ref, rs, strict=True)]),
                              best_loss_gap=_spread([x.best_loss / r.best_loss - 1
                                                     for x, r in zip(ref, rs, strict=True)]))
            emit(bench="pollux", case=f"adaptive {mode} target={target:g}", metric="seconds_to_target", unit="s",
                 ours=_none_if_inf(statistics.median(tt)),
                 spread=_spread(tt), best_acc=_spread([r.best_acc for r in rs]),
                 best_loss=_spread([r.best_loss for r in rs]), summary=True, experiment="adaptive", mode=mode,
                 target=target, reps=len(rs), data=a.adaptive_data, lr=a.adaptive_lr, smoothing=a.agent_smoothing,
                 app=a.adaptive_app, large=a.adaptive_large, **fields)
    if ref:
        g = [grows([c["goodput_batch"] for c in r.choices])["ratio"] for r in ref]
        emit(bench="pollux", case="adaptive M over training", metric="m_growth", unit="second-half / first-half M",
             ours=statistics.median(g), spread=_spread(g), summary=True, experiment="adaptive", mode="adaptive")
    # the sync a step costs: a client bandwidth budget (managed communication), or an injected round trip
    conds = [(f"budget {bw:g} Mbps", {"bandwidth_mbps": bw}) for bw in a.bandwidths]
    conds += [(f"round trip {d * 1e3:g} ms", {"delay_s": d}) for d in a.delays]
    conds += [(f"link {m:g} Mbit", {"link_mbit": m, "bandwidth_mbps": m}) for m in a.links]
    budgets: dict[str, list[Run]] = {label: [] for label, _ in conds}
    for rep in range(a.adaptive_reps):
        for label, kw in conds:
            r = run(Plan("adaptive", a.bandwidth_iterations, data=a.adaptive_data, lr=a.adaptive_lr, seed=rep,
                         smoothing=a.agent_smoothing, **kw))  # type: ignore[arg-type]
            budgets[label].append(r)
            ms = [c["goodput_batch"] for c in r.choices][1:]  # the first interval runs M0, not a choice
            emit(bench="pollux", case=f"adaptive {label} rep={rep}", metric="chosen_batch", unit="examples",
                 ours=statistics.median(ms) if ms else math.nan, experiment="adaptive-sync", condition=label, rep=rep,
                 batches=[c["goodput_batch"] for c in r.choices], job_seconds=r.job_seconds,
                 trained_seconds=r.evals[-1][0] if r.evals else None, **kw)
    for label, rs in budgets.items():
        med = [statistics.median([c["goodput_batch"] for c in r.choices][1:] or [math.nan]) for r in rs]
        secs = [r.evals[-1][0] for r in rs if r.evals]
        if med:
            emit(bench="pollux", case=f"adaptive {label}", metric="chosen_batch", unit="examples",
                 ours=statistics.median(med), spread=_spread(med), summary=True, experiment="adaptive-sync",
                 condition=label, iterations=a.bandwidth_iterations, trained_seconds=_spread(secs) if secs else None)
    if a.adaptive_plot or not a.quick:
        name = "pollux-adaptive.png" if a.adaptive_app == "mlr" else f"pollux-adaptive-{a.adaptive_app}.png"
        out = Path(a.adaptive_plot) if a.adaptive_plot else REPO / "docs" / "img" / name
        path = plot(runs, budgets, a.target[0], out)
        emit(bench="pollux", case="adaptive plot", plot=str(path), experiment="adaptive")


def adam_efficiency(a: argparse.Namespace) -> None:
    import torch

    from bench.pollux.adamstat import KINDS, PHIS, median_phi, predicted, train
    from bosen.apps.pytorch.examples.cnn import images

    torch.set_num_threads(1)  # one core: the machine is shared; examples, not seconds, are measured
    x, y = images(True, 20000)
    xt, yt = images(False, 2000)
    m0, lr0 = a.adam_batches[0], a.adam_lr
    big = tuple(a.adam_batches[1:])
    rows: dict[tuple[float, int], list[dict[str, float]]] = {}
    for seed in range(a.seeds):
        runs = {b: train(b, m0, lr0, a.adam_examples, a.adam_every, seed, x, y, xt, yt, targets=big)
                for b in a.adam_batches}  # the batches in turn within a seed, from the same initial model
        base = runs[m0]
        for target in a.adam_targets:
            n0 = base.reach(target)
            for b in big:
                nb = runs[b].reach(target)
                row = {"measured": n0 / nb if math.isfinite(n0) and math.isfinite(nb) and nb > 0 else math.nan,
                       **{k: predicted(base, b, m0, n0, k) for k in KINDS},
                       **{f"phi_{k}": median_phi(base, n0, k) for k in PHIS}}
                rows.setdefault((target, b), []).append(row)
                emit(bench="pollux", case=f"adam-efficiency M={b} loss={target} seed={seed}", metric="efficiency",
                     unit="examples at M0 / examples at M", ours=_none_if_inf(row["measured"]),
                     experiment="adam-efficiency", seed=seed, batch=b, m0=m0, target=target, m0_examples=n0,
                     examples=nb, **{k: round(v, 4) for k, v in row.items() if k != "measured"})
    for (target, b), rs in sorted(rows.items()):
        ok = [r for r in rs if math.isfinite(r["measured"])]
        if ok:
            emit(bench="pollux", case=f"adam-efficiency M={b} loss={target}", metric="efficiency",
                 unit="examples at M0 / examples at M", ours=statistics.median(r["measured"] for r in ok),
                 spread=_spread([r["measured"] for r in ok]), summary=True, experiment="adam-efficiency", batch=b,
                 m0=m0, target=target, seeds=len(ok), lr=lr0,
                 predicted={k: _spread([r[k] for r in ok]) for k in KINDS},
                 phi={k: _spread([r[f"phi_{k}"] for r in ok]) for k in PHIS})


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.pollux", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer points, steps and seeds (CI)")
    p.add_argument("--data", default="digits", help="digits, or a `bosen data` MLR set under data/ (fashion-mnist)")
    p.add_argument("--samples", type=int, default=10000, help="training samples taken of a data/ set")
    p.add_argument("--lr", type=float, default=0.5, help="the SGD step of the training run")
    p.add_argument("--smoothing", type=float, default=0.999, help="NoiseScale's factor per M0 (AdaptDL's 0.999)")
    p.add_argument("--seeds", type=int, default=None, help="default 3 (--quick 2)")
    p.add_argument("--points", type=int, nargs="+", default=None, help="steps of the run where φ is checked")
    p.add_argument("--scales", type=int, nargs="+", default=None,
                   help="fixed: estimate with M = M0 times these (default 1 16, --quick 1)")
    p.add_argument("--warmup", type=int, default=None, help="fixed: estimator steps at a point (default 1000)")
    p.add_argument("--steps", type=int, default=None, help="along: steps of the run (default 2000)")
    p.add_argument("--every", type=int, default=None, help="along: a comparison every this many steps")
    p.add_argument("--warmup-along", type=int, default=None, help="along: compare from this step on")
    p.add_argument("--ms", type=int, nargs="+", default=[32, 128, 512, 2048], help="throughput: per-worker batches")
    p.add_argument("--ks", type=int, nargs="+", default=[1, 2],
                   help="throughput: worker counts (at most the cores: the model has a worker per machine)")
    p.add_argument("--reps", type=int, default=3, help="throughput: rounds over the configurations (median)")
    p.add_argument("--iterations", type=int, default=200, help="throughput: iterations of a job")
    p.add_argument("--skip", type=int, default=20, help="throughput: first iterations not timed")
    p.add_argument("--timeout", type=float, default=300.0, help="throughput: seconds one job may take")
    p.add_argument("--traces", type=int, default=None, help="sim: synthetic traces (seeds; default 8, --quick 2)")
    p.add_argument("--jobs", type=int, default=None, help="sim: jobs per trace (default 160, --quick 12)")
    p.add_argument("--slots", type=int, default=None,
                   help="sim: worker slots W (default 12: contended part of the time; --quick 8)")
    p.add_argument("--hours", type=float, default=None, help="sim: hours the arrivals spread over (default 8)")
    p.add_argument("--interval", type=float, default=60.0, help="sim: seconds between scheduling decisions")
    p.add_argument("--delay", type=float, default=6.0, help="sim: seconds a job stalls when its workers change")
    p.add_argument("--sync-growth", type=float, default=None, help="sim: beta_s / alpha_s (profiles.SYNC_GROWTH)")
    p.add_argument("--plot", type=Path, default=None, help="sim: write the figure here (a .png)")
    p.add_argument("--jobs-reps", type=int, default=3, help="jobs: pairs of runs (fixed split, Pollux), alternated")
    p.add_argument("--jobs-clocks", type=int, nargs=2, default=[3000, 400], metavar=("SMALL", "LARGE"),
                   help="jobs: clocks of the small and the large job")
    p.add_argument("--jobs-slots", type=int, default=4, help="jobs: worker slots the two jobs share")
    p.add_argument("--jobs-interval", type=float, default=5.0, help="jobs: seconds between Pollux's decisions")
    p.add_argument("--jobs-delay", type=float, default=2.0, help="jobs: the re-allocation penalty's delta (s)")
    p.add_argument("--jobs-timeout", type=float, default=400.0, help="jobs: seconds a job may take")
    p.add_argument("--jobs-agent", action="store_true",
                   help="jobs: adaptive jobs (synchronous MLR whose goodput agent picks the batch; --jobs-clocks are "
                        "then iterations), which the scheduler scales and whose agent re-picks for each count")
    p.add_argument("--jobs-ray", default=None, metavar="ADDRESS",
                   help="jobs: run the jobs on the Ray cluster at ADDRESS (bosen launch --ray; `ray start --head`)")
    p.add_argument("--adaptive-data", default=None, help="adaptive: fashion-mnist (default; --quick: digits)")
    p.add_argument("--adaptive-app", choices=["mlr", "cnn", "cnn-adam"], default="mlr",
                   help="adaptive: MLR (default) or the PyTorch CNN example on Fashion-MNIST (no budgets, no delays; "
                        "defaults: target 0.70, iterations 400 400 150, docs/img/pollux-adaptive-cnn.png); "
                        "cnn-adam: the CNN in hybrid mode with Adam and the square-root rule (lr 0.002)")
    p.add_argument("--adaptive-large", type=int, default=16, help="adaptive: fixed-large's M over M0 (default 16)")
    p.add_argument("--adaptive-lr", type=float, default=None, help="adaptive: the servers' lr at M0 (0.1; --quick 0.5)")
    p.add_argument("--adaptive-reps", type=int, default=None, help="adaptive: rounds over the modes (default 3)")
    p.add_argument("--agent-smoothing", type=float, default=0.999, help="adaptive: the agent's φ smoothing per M0")
    p.add_argument("--modes", nargs="*", default=["adaptive", "fixed-m0", "fixed-large"],
                   choices=["adaptive", "fixed-m0", "fixed-large"], help="adaptive: the jobs of a round")
    p.add_argument("--adaptive-iterations", dest="adaptive_iters", type=int, nargs=3, default=None,
                   metavar=("ADAPTIVE", "M0", "LARGE"), help="adaptive: iterations of each mode's job")
    p.add_argument("--target", type=float, nargs="+", default=None,
                   help="adaptive: held-out loss targets, each reported on the same runs (default 0.50; the CNN 0.70)")
    p.add_argument("--bandwidths", type=float, nargs="*", default=None,
                   help="adaptive: client budgets (Mbps) the adaptive job runs under (default none: a synchronous "
                        "step's flush is not budgeted, docs/evaluation.md; e.g. 1000 2)")
    p.add_argument("--delays", type=float, nargs="*", default=None,
                   help="adaptive: injected round trips (s) a step pays, the adaptive job under each (default 0 0.05)")
    p.add_argument("--links", type=float, nargs="*", default=[],
                   help="adaptive: link rates (Mbit/s) the adaptive job runs on, its budget set to the rate: the "
                        "whole job in a network namespace whose loopback is shaped to it (root, iproute2)")
    p.add_argument("--bandwidth-iterations", type=int, default=None, help="adaptive: iterations of those jobs")
    p.add_argument("--adaptive-plot", default=None, help="adaptive: the figure (default docs/img/pollux-adaptive.png)")
    p.add_argument("--experiments", nargs="+", default=None,
                   choices=["fixed", "along", "throughput", "sim", "adaptive", "jobs", "adam-efficiency"],
                   help="default fixed along throughput sim adaptive (--quick: fixed along); jobs (real jobs under "
                        "the scheduler, minutes) only when named")
    p.add_argument("--adam-batches", type=int, nargs="+", default=[64, 256, 1024],
                   help="adam-efficiency: the fixed batches, the first M0 (default 64 256 1024)")
    p.add_argument("--adam-lr", type=float, default=0.002, help="adam-efficiency: Adam's learning rate at M0")
    p.add_argument("--adam-examples", type=int, default=61440, help="adam-efficiency: examples each run trains on")
    p.add_argument("--adam-every", type=int, default=2048, help="adam-efficiency: examples between evaluations")
    p.add_argument("--adam-targets", type=float, nargs="+", default=[1.0, 0.85, 0.70, 0.60, 0.55],
                   help="adam-efficiency: the held-out losses at which the efficiency is measured")
    a = p.parse_args(argv)
    if a.adaptive_app in ("cnn", "cnn-adam"):  # the CNN's own defaults: no injected delays, its loss scale
        lr = 0.1 if a.adaptive_app == "cnn" else 0.002
        for key, value in (("delays", []), ("target", [0.70]), ("adaptive_iters", [400, 400, 150]),
                           ("adaptive_lr", lr), ("bandwidth_iterations", 0)):
            if getattr(a, key) is None:
                setattr(a, key, value)
    for key, full, quick in (("seeds", 3, 2), ("scales", [1, 16], [1]), ("points", [20, 100, 500, 2000], [20, 100]),
                             ("warmup", 1000, 150),
                             ("steps", 2000, 200), ("every", 50, 25), ("warmup_along", 200, 50),
                             ("traces", 8, 2), ("jobs", 160, 12), ("slots", 12, 8), ("hours", 8.0, 2.0),
                             ("adaptive_data", "fashion-mnist", "digits"), ("adaptive_lr", 0.1, 0.5),
                             ("adaptive_reps", 3, 1),
                             ("adaptive_iters", [1500, 2000, 1000], [60, 60, 60]), ("bandwidths", [], []),
                             ("delays", [0.0, 0.05], []),
                             ("bandwidth_iterations", 300, 60), ("target", [0.50], [1.0]),
                             ("experiments", ["fixed", "along", "throughput", "sim", "adaptive"], ["fixed", "along"])):
        if getattr(a, key) is None:
            setattr(a, key, quick if a.quick else full)
    if a.sync_growth is None:
        from bench.pollux.profiles import SYNC_GROWTH

        a.sync_growth = SYNC_GROWTH
    t0 = time.perf_counter()
    samples = None
    if "fixed" in a.experiments or "along" in a.experiments:
        ds = dataset(a.data, a.samples)
        samples = ds.n
        exact = ExactStats(ds)
        if "fixed" in a.experiments:
            fixed(a, ds, exact)
        if "along" in a.experiments:
            along_run(a, ds, exact)
    if "throughput" in a.experiments:
        throughput(a)
    if "sim" in a.experiments:
        sim_run(a)
    if "jobs" in a.experiments:
        from bench.pollux import jobs

        jobs.run(a.jobs_reps, dict(zip(("small", "large"), a.jobs_clocks, strict=True)), a.jobs_slots, a.jobs_interval,
                 a.jobs_delay, a.jobs_timeout, a.jobs_ray, a.jobs_agent)
    if "adaptive" in a.experiments:
        adaptive(a)
    if "adam-efficiency" in a.experiments:
        adam_efficiency(a)
    emit(bench="pollux", done=True, seconds=time.perf_counter() - t0, data=a.data, samples=samples)


if __name__ == "__main__":
    main()
