"""LDA benchmark: our sampler kernels beside the ``lda`` package, and 1-vs-2-worker scaling.

``run_bench(quick)`` returns result dicts (``bench/apps.py`` prints them as JSON lines):

* ``case="lda"`` per K: tokens/s of our kernel and of ``lda`` 3.0.2 (plain collapsed Gibbs in Cython,
  the ``lda.LDA`` inner loop ``_sample_topics``) on the same corpus, same K, α, β and iterations, in
  this process; both timed over sampling only (log-likelihood excluded,
  ``lda``'s Python-loop initialization excluded). Fields ``ours_loglik``/``baseline_loglik`` give
  log p(w, z) (same formula) after the same iterations, ``equal_quality_speedup`` the ratio of the
  time the baseline needs for its final log-likelihood to the time we need to first reach it
  (None if we do not within 2x the iterations). The two alternate iteration by iteration;
  ``ratio_paired_median`` is the median over iterations of baseline time / our time, which is
  steadier than ``ratio`` when other processes load the machine.
* ``case="lda-scaling"``: the same job through ``python -m bosen launch`` with 1 and 2 workers;
  tokens/s = tokens sampled / wall time of the sampling ticks after the first (steady state);
  ``ratio`` = 2-worker / 1-worker,
  beside ``machine_parallelism``, the ratio two bare kernel processes get on the machine right now.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bosen.apps.lda.data import Corpus, generate
from bosen.apps.lda.model import Sampler, loglikelihood
from bosen.jobs import run_job

BASELINE = "lda 3.0.2 (collapsed Gibbs, Cython)"


class _Ours:
    """Our kernel on the whole corpus, one iteration per ``step`` (timed: sampling + alias build)."""

    def __init__(self, corpus: Corpus, K: int, alpha: float, beta: float, method: str, mh_steps: int,
                 seed: int = 1) -> None:
        s = Sampler(corpus, K, alpha, beta, corpus.n_vocab, method, mh_steps, seed)
        self.nwk = np.zeros((corpus.n_vocab, K), dtype=np.int32)
        w, k, c = s.word_topic_coo()
        self.nwk[w, k] = c
        self.nk = s.topic_counts()
        # compile / load the kernels outside the timing, on a throwaway copy of the state
        z, ndk = s.z.copy(), s.ndk.copy()
        s.sweep(self.nwk.copy(), self.nk.copy(), corpus.words, 0, min(2, corpus.n_docs))
        s.z[:], s.ndk[:] = z, ndk
        self.s, self.words, self.alpha, self.beta = s, corpus.words, alpha, beta

    def step(self) -> float:
        t0 = time.perf_counter()
        self.s.sweep(self.nwk, self.nk, self.words)
        return time.perf_counter() - t0

    def loglik(self) -> float:
        return loglikelihood(self.s.ndk, self.nwk, self.nk, self.alpha, self.beta)


class _Baseline:
    """``lda.LDA`` (the PyPI package) driven exactly like its ``_fit`` loop, timing the kernel."""

    def __init__(self, corpus: Corpus, K: int, iters: int, alpha: float, beta: float, seed: int = 1) -> None:
        import logging

        import lda  # the PyPI package "lda"; ImportError when missing

        logging.getLogger("lda").setLevel(logging.ERROR)
        self.m = lda.LDA(K, iters, alpha=alpha, eta=beta, random_state=seed, refresh=10**9)
        self.m._initialize(corpus.doc_word_matrix())  # a Python loop over tokens: not timed
        self.rands = self.m._rands.copy()
        self.rs = np.random.RandomState(seed)

    def step(self) -> float:
        self.rs.shuffle(self.rands)
        t0 = time.perf_counter()
        self.m._sample_topics(self.rands)
        return time.perf_counter() - t0

    def loglik(self) -> float:
        return float(self.m.loglikelihood())


def kernel_case(corpus: Corpus, K: int, iters: int, alpha: float = 0.1, beta: float = 0.01,
                method: str | None = None, mh_steps: int = 4) -> dict[str, Any]:
    """One ``case="lda"`` result: our kernel vs the lda package on ``corpus`` with K topics.

    The two alternate iteration by iteration, so load from other processes on a shared machine
    hits both alike. Ours then runs on (up to 2x the iterations) to find when it first reaches the
    baseline's final log-likelihood.
    """
    method = method or ("dense" if K < 64 else "mh")
    ours = _Ours(corpus, K, alpha, beta, method, mh_steps)
    try:
        base: _Baseline | None = _Baseline(corpus, K, iters, alpha, beta)
    except ImportError:
        base = None
    t = tb = 0.0
    times, lls, pairs = [], [], []
    for _ in range(iters):
        if base is not None:
            dtb = base.step()
            tb += dtb
        dt = ours.step()
        t += dt
        if base is not None:
            pairs.append(dtb / dt)
        times.append(t)
        lls.append(ours.loglik())
    n = corpus.n_tokens
    rate = n * iters / t
    rec: dict[str, Any] = {
        "bench": "apps", "case": "lda", "metric": "tokens_per_s", "unit": "tokens/s",
        "K": K, "tokens": n, "docs": corpus.n_docs, "vocab": corpus.n_vocab, "iterations": iters,
        "alpha": alpha, "beta": beta,
        "sampler": "dense collapsed Gibbs" if method == "dense" else f"LightLDA MH ({mh_steps} steps)",
        "ours": round(rate), "ours_loglik": round(lls[-1], 1),
    }
    if base is None:
        rec.update(baseline=None, baseline_name=f"{BASELINE}: not installed (pip install lda==3.0.2)",
                   ratio=None)
        return rec
    target = base.loglik()
    while lls[-1] < target and len(lls) < 2 * iters:
        t += ours.step()
        times.append(t)
        lls.append(ours.loglik())
    hit = next((i for i, v in enumerate(lls) if v >= target), None)
    rec.update(baseline=round(n * iters / tb), baseline_name=BASELINE, baseline_loglik=round(target, 1),
               ratio=round(rate / (n * iters / tb), 3),
               ratio_paired_median=round(float(np.median(pairs)), 3),
               ours_iters_to_baseline_loglik=None if hit is None else hit + 1,
               equal_quality_speedup=None if hit is None else round(tb / times[hit], 3))
    return rec


# ----------------------------------------------------------------------------------------------
# scaling through the launcher


def _lda_config(V: int, K: int, workers: int, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "cluster": {"servers": ["127.0.0.1:0"], "workers": workers},
        "consistency": {"staleness": 2},
        "tables": {"word_topic": {"rows": V, "cols": K, "dtype": "int32"},
                   "topic_summary": {"rows": 1, "cols": K, "dtype": "int32"}},
        "app": {"module": "bosen.apps.lda", "args": args},
    }


def launch_throughput(workers: int, args: dict[str, Any], V: int, K: int,
                      timeout: float = 600) -> dict[str, Any]:
    """Run one LDA job via ``python -m bosen launch``; tokens/s over its sampling ticks."""
    import yaml

    with tempfile.TemporaryDirectory(prefix="lda-bench-") as tmp:
        cfg = Path(tmp, "lda.yaml")
        cfg.write_text(yaml.safe_dump(_lda_config(V, K, workers, args)))
        job = run_job(cfg, Path(tmp, "run"), workers=workers, timeout=timeout).check()
        wall, recs = job.seconds, job.records
    work = [r for r in recs if r.get("kind") == "worker" and "tokens" in r and "step_s" in r]
    if not work:
        raise RuntimeError("no worker records with tokens in metrics.jsonl")
    # steady state: per worker, from the end of its first sampling tick (which also waits for the
    # slowest worker to start) to its last tick's report. Worker clocks are relative to each
    # client's start, so spans are not compared across workers.
    tokens, spans = 0, []
    for rank in {r["rank"] for r in work}:
        mine = sorted((r for r in work if r["rank"] == rank), key=lambda r: r["clock"])[1:]
        if not mine:
            raise RuntimeError("need at least 2 sampling ticks to measure throughput")
        tokens += sum(r["tokens"] for r in mine)
        spans.append(max(r["time"] for r in mine) - min(r["time"] - r["step_s"] for r in mine))
    seconds = max(spans)
    clocks = [r for r in recs if r.get("kind") == "clock" and "objective" in r]
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
            "launch_wall_s": wall, "final_objective": clocks[-1]["objective"] if clocks else None,
            "final_loglik": next((r["final_loglik"] for r in reversed(recs)
                                  if r.get("kind") == "clock" and "final_loglik" in r), None)}


_SOLO = """
import sys, time
from bosen.apps.lda.data import generate
from bosen.apps.lda.model import fit
docs, vocab, K, iters = map(int, sys.argv[1:5])
c = generate(docs, vocab, 50, 150.0, 0.1, 0.05, 0)
fit(c, K, 1, 0.1, 0.01, "mh" if K >= 64 else "dense", 4, 1, track_loglik=False)  # load kernels
r = fit(c, K, iters, 0.1, 0.01, "mh" if K >= 64 else "dense", 4, 1, track_loglik=False)
print(c.n_tokens * iters / sum(r.sample_s))
"""


def machine_parallelism(docs: int, vocab: int, K: int, iters: int) -> float:
    """Control for the scaling case: total kernel tokens/s of two independent processes running at
    once over one process alone (no PS). On an idle 2-core machine about 2; less when other load or
    shared caches limit what two processes can get."""
    def run(n: int) -> float:
        ps = [subprocess.Popen([sys.executable, "-c", _SOLO, str(docs), str(vocab), str(K), str(iters)],
                               stdout=subprocess.PIPE, text=True) for _ in range(n)]
        return sum(float(p.communicate(timeout=600)[0].split()[-1]) for p in ps)
    return run(2) / run(1)


def scaling_case(quick: bool) -> dict[str, Any]:
    """``case="lda-scaling"``: the same job with 2 workers vs 1 (tokens/s ratio).

    Runs alternate 1-worker and 2-worker jobs ``repeats`` times; ``ratio`` is the median over the
    adjacent pairs (load from other processes on a small shared machine moves single runs a lot),
    and ``machine_parallelism`` the same ratio for two bare kernel processes, measured alongside.
    """
    if quick:
        docs, vocab, K, iters, repeats = 8000, 5000, 100, 10, 1
    else:
        docs, vocab, K, iters, repeats = 20000, 5000, 100, 20, 3
    args = {"data": "synthetic", "K": K, "iterations": iters, "synth_docs": docs, "synth_vocab": vocab,
            "synth_doc_len": 150.0, "synth_beta": 0.05, "beta": 0.01, "top_words": 5}
    pairs = []
    for _ in range(repeats):
        pairs.append((launch_throughput(1, args, vocab, K), launch_throughput(2, args, vocab, K)))
    ratios = [two["tokens_per_s"] / one["tokens_per_s"] for one, two in pairs]
    mid = sorted(range(len(ratios)), key=ratios.__getitem__)[len(ratios) // 2]
    one, two = pairs[mid]
    control = machine_parallelism(docs // 2, vocab, K, max(iters // 2, 3))
    return {"bench": "apps", "case": "lda-scaling", "metric": "tokens_per_s", "unit": "tokens/s",
            "K": K, "tokens_per_pass": one["tokens"] // (iters - 1), "iterations": iters,
            "staleness": 2,
            "ours": round(two["tokens_per_s"]), "baseline": round(one["tokens_per_s"]),
            "baseline_name": "same job, 1 worker", "ratio": round(ratios[mid], 3),
            "ratios": [round(r, 3) for r in ratios], "machine_parallelism": round(control, 3),
            "workers": 2, "cores": os.cpu_count(), "repeats": repeats,
            "final_loglik_1w": one["final_loglik"], "final_loglik_2w": two["final_loglik"],
            "seconds_1w": round(one["seconds"], 3), "seconds_2w": round(two["seconds"], 3)}


def run_bench(quick: bool) -> list[dict[str, Any]]:
    """All LDA results: kernel vs ``lda`` for K=20 and K>=100, then 2-vs-1-worker scaling."""
    out = []
    if quick:
        corpus = generate(2000, 2000, 20, 100.0, alpha=0.1, beta=0.05, seed=3)
        cases = [(20, 20), (100, 20)]
    else:
        corpus = generate(10000, 10000, 100, 150.0, alpha=0.1, beta=0.05, seed=3)
        cases = [(20, 50), (100, 50), (1000, 5)]
    for K, iters in cases:
        rec = kernel_case(corpus, K, iters)
        out.append(rec)
        if rec.get("baseline") is not None:
            # quality after equal work; log-likelihoods are negative, so baseline/ours > 1 = ours higher
            out.append({"bench": "apps", "case": "lda", "metric": "loglik_after_equal_iterations",
                        "unit": "log p(w,z) (higher is better)", "K": K, "iterations": iters,
                        "ours": rec["ours_loglik"], "baseline": rec["baseline_loglik"],
                        "baseline_name": BASELINE, "ratio": round(rec["baseline_loglik"] / rec["ours_loglik"], 5)})
    try:
        out.append(scaling_case(quick))
    except Exception as e:  # noqa: BLE001 - report, do not hide the kernel results
        out.append({"bench": "apps", "case": "lda-scaling", "metric": "tokens_per_s", "unit": "tokens/s",
                    "ours": None, "error": f"{type(e).__name__}: {e}"[:500]})
    return out


if __name__ == "__main__":
    for r in run_bench("--quick" in sys.argv):
        print(json.dumps(r), flush=True)
