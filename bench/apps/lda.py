"""LDA benchmark: our sampler kernel beside tomotopy and the ``lda`` package, then whole jobs.

``run_bench(quick)`` returns result dicts (``python -m bench.apps`` prints them as JSON lines).

Kernels (issue 17, point 3), per K in 20, 100, 1000 on the news corpus (``bosen data news``: 3,421
articles, 944,694 tokens, V = 13,994), α = 0.1, β = 0.01, the same iterations for every sampler:

* ours: :class:`bosen.apps.lda.model.Sampler` with the method an LDA job picks at that K
  (``LDAArgs.method()``: exact dense collapsed Gibbs below ``dense_max_k`` = 64, the exact sparse
  sampler (SparseLDA buckets) at or above, which sweeps densely while that is cheaper);
* tomotopy 0.14 ``LDAModel`` with fixed priors (``optim_interval=0``, ``min_cf=0``, ``rm_top=0``),
  trained with ``workers=1`` and with ``workers=2`` (``ParallelScheme.PARTITION``, named explicitly);
* ``lda`` 3.0.2 (collapsed Gibbs in Cython; its ``_sample_topics`` loop driven as its ``fit`` does).

The samplers alternate iteration by iteration (the order rotates), so load from other processes
hits all alike; each is timed over its sampling only. One formula scores all of them: log p(w, z)
(:func:`joint_loglik`) from each sampler's topic assignments (tomotopy's from its documents). Then
ours runs on (up to 2x the iterations) until it passes the best peer's final log-likelihood, and the
equal-quality ratio per peer is the peer's time for its iterations over the time ours needed to
first reach the peer's final log-likelihood (> 1: ours is faster at equal quality).

Jobs (point 4): the news corpus through ``bosen.jobs.job.run_job`` (``bosen launch``) with the settings of
``configs/lda-news.yaml`` (held-out scoring off, log-likelihood at the last tick only, so the work is
the sampling) with 1 and 2 workers, beside the bare kernel doing the same iterations in this process.
The job's time is each worker's span from the start of its first sampling tick to its last report
(the first tick also opens the client's read connection, reported apart as ``first_tick_s``); the
breakdown (sampling, word-row reads, sends, clock waits, alias tables) comes from the worker's
per-tick reports. The 1-worker job also runs with one mini-batch per tick, to show what the
mini-batches' extra reads and sends cost.

``--kernel K:ITERS`` (repeatable) runs only those kernel cases on the news corpus; ``--vs-tomotopy``
only the whole jobs beside tomotopy on Reuters (:func:`peer_job_case`). Goal records
carry ``goal`` (text) and ``met`` (bool). ``--quick`` uses a small generated corpus and
reports any peer that is not installed as missing (goals against it: ``met`` false, ``missing``).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from bench.apps import tickprofile
from bench.common import REPO
from bosen.apps.lda.data import Corpus, generate, load
from bosen.apps.lda.model import Sampler, loglikelihood
from bosen.apps.lda.worker import LDAArgs
from bosen.jobs.job import run_job

NEWS = REPO / "data" / "news" / "docword.news.txt"
NEWS_CONFIG = REPO / "configs" / "lda-news.yaml"
TOMOTOPY = "tomotopy 0.14 LDAModel"
LDA_PKG = "lda 3.0.2 (collapsed Gibbs, Cython)"


def joint_loglik(docs: np.ndarray, words: np.ndarray, z: np.ndarray, n_docs: int, n_vocab: int, K: int,
                 alpha: float, beta: float) -> float:
    """log p(w, z) of one sampler's state, from its per-token (document, word, topic) assignments.

    The same function for every sampler, so their log-likelihoods compare.
    """
    d, w, t = (np.asarray(a, dtype=np.int64) for a in (docs, words, z))
    ndk = np.bincount(d * K + t, minlength=n_docs * K).reshape(n_docs, K).astype(np.int32)
    nwk = np.bincount(w * K + t, minlength=n_vocab * K).reshape(n_vocab, K).astype(np.int32)
    nk = np.bincount(t, minlength=K).astype(np.int32)
    return loglikelihood(ndk, nwk, nk, alpha, beta)


# ----------------------------------------------------------------------------------------------
# the samplers, each one iteration per step()


class _Ours:
    """Our kernel on the whole corpus (timed: the sweep, alias tables included for MH)."""

    def __init__(self, corpus: Corpus, K: int, alpha: float, beta: float, seed: int = 1) -> None:
        self.method = LDAArgs(K=K).method()
        self.name = "ours: " + {"dense": "exact dense collapsed Gibbs", "sparse": "exact sparse collapsed Gibbs "
                                "(SparseLDA buckets)", "mh": "LightLDA MH (4 steps)"}[self.method]
        s = Sampler(corpus, K, alpha, beta, corpus.n_vocab, self.method, 4, seed)
        self.nwk = np.zeros((corpus.n_vocab, K), dtype=np.int32)
        w, k, c = s.word_topic_coo()
        self.nwk[w, k] = c
        self.nk = s.topic_counts()
        # compile / load the kernels outside the timing, on a throwaway copy of the state
        z, ndk, phase = s.z.copy(), s.ndk.copy(), s.dense_phase
        for dense_phase in (True, False):  # both kernels where the sparse sampler starts dense
            s.dense_phase = dense_phase and phase
            s.sweep(self.nwk.copy(), self.nk.copy(), corpus.words, 0, min(2, corpus.n_docs))
        s.z[:], s.ndk[:], s.dense_phase = z, ndk, phase
        self.s, self.corpus = s, corpus

    def step(self) -> float:
        t0 = time.perf_counter()
        self.s.sweep(self.nwk, self.nk, self.corpus.words)
        return time.perf_counter() - t0

    def assignments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.corpus.docs, self.corpus.words, self.s.z


class _Tomotopy:
    """tomotopy's LDAModel, fixed priors, ``workers`` threads; one ``train(1)`` per step."""

    def __init__(self, corpus: Corpus, K: int, alpha: float, beta: float, workers: int, seed: int = 1) -> None:
        import tomotopy as tp  # ImportError when missing

        # with workers > 1 tomotopy warns that results depend on the thread schedule: known, not news
        warnings.filterwarnings("ignore", message="The training result may differ", category=RuntimeWarning)

        self.name = f"{TOMOTOPY}, {workers} thread{'s' if workers > 1 else ''}"
        self.workers = workers
        # the parallel scheme, explicit: with 2 threads, PARTITION splits documents and vocabulary so
        # the threads sample disjoint blocks (no copies of the word-topic table to merge)
        self.scheme = tp.ParallelScheme.PARTITION if workers > 1 else tp.ParallelScheme.NONE
        m = tp.LDAModel(k=K, alpha=alpha, eta=beta, min_cf=0, min_df=0, rm_top=0, seed=seed)
        m.optim_interval = 0
        names = [str(i) for i in range(corpus.n_vocab)]
        ptr = corpus.doc_ptr()
        self.doc_ids = []
        for d in range(corpus.n_docs):
            if ptr[d + 1] > ptr[d]:
                m.add_doc([names[w] for w in corpus.words[ptr[d]:ptr[d + 1]]])
                self.doc_ids.append(d)
        m.train(0, workers=workers, parallel=self.scheme)  # initial assignment: not timed
        self.m = m

    def step(self) -> float:
        return self.run(1)

    def run(self, iterations: int) -> float:
        """Seconds of ``iterations`` in one ``train`` call, as a user runs it."""
        t0 = time.perf_counter()
        self.m.train(iterations, workers=self.workers, parallel=self.scheme)
        return time.perf_counter() - t0

    def assignments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        ours = np.array([int(v) for v in self.m.used_vocabs], dtype=np.int64)  # tomotopy's word id -> ours
        docs, words, z = [], [], []
        for d, doc in zip(self.doc_ids, self.m.docs, strict=True):
            w = np.asarray(doc.words, dtype=np.int64)
            docs.append(np.full(w.size, d, dtype=np.int64))
            words.append(ours[w])
            z.append(np.asarray(doc.topics, dtype=np.int64))
        return np.concatenate(docs), np.concatenate(words), np.concatenate(z)


class _LdaPackage:
    """``lda.LDA`` driven exactly like its ``_fit`` loop, timing the kernel ``_sample_topics``."""

    name = LDA_PKG

    def __init__(self, corpus: Corpus, K: int, alpha: float, beta: float, seed: int = 1) -> None:
        import logging

        import lda  # the PyPI package "lda"; ImportError when missing

        logging.getLogger("lda").setLevel(logging.ERROR)
        self.m = lda.LDA(K, 1, alpha=alpha, eta=beta, random_state=seed, refresh=10**9)
        self.m._initialize(corpus.doc_word_matrix())  # a Python loop over tokens: not timed
        self.rands = self.m._rands.copy()
        self.rs = np.random.RandomState(seed)

    def step(self) -> float:
        self.rs.shuffle(self.rands)
        t0 = time.perf_counter()
        self.m._sample_topics(self.rands)
        return time.perf_counter() - t0

    def assignments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.m.DS, self.m.WS, self.m.ZS


_PEERS: list[tuple[str, str, Any]] = [
    ("tomotopy-1t", f"{TOMOTOPY}, 1 thread", lambda c, K, a, b: _Tomotopy(c, K, a, b, 1)),
    ("tomotopy-2t", f"{TOMOTOPY}, 2 threads", lambda c, K, a, b: _Tomotopy(c, K, a, b, 2)),
    ("lda", LDA_PKG, lambda c, K, a, b: _LdaPackage(c, K, a, b)),
]
_INSTALL = {"tomotopy-1t": "pip install tomotopy==0.14.0", "tomotopy-2t": "pip install tomotopy==0.14.0",
            "lda": "pip install lda==3.0.2"}


def kernel_case(corpus: Corpus, K: int, iters: int, alpha: float = 0.1, beta: float = 0.01,
                data: str = "") -> list[dict[str, Any]]:
    """Records for one K: per sampler, per peer (speed and equal-quality ratios), and the goals."""
    base = {"bench": "apps", "case": "lda-kernel", "K": K, "alpha": alpha, "beta": beta, "iterations": iters,
            "data": data, "tokens": corpus.n_tokens, "docs": corpus.n_docs, "vocab": corpus.n_vocab}
    out: list[dict[str, Any]] = []
    ours = _Ours(corpus, K, alpha, beta)
    runners: dict[str, Any] = {"ours": ours}
    for key, name, make in _PEERS:
        try:
            runners[key] = make(corpus, K, alpha, beta)
        except ImportError as e:
            out.append({**base, "metric": "tokens_per_s", "sampler": name, "ours": None, "missing": True,
                        "error": f"{name} not installed ({e}): {_INSTALL[key]}"})
    keys = list(runners)
    times: dict[str, list[float]] = {k: [] for k in keys}
    ours_curve: list[tuple[float, float]] = []  # (cumulative seconds, log p(w, z)) after each iteration

    def ours_ll() -> float:
        return joint_loglik(*ours.assignments(), corpus.n_docs, corpus.n_vocab, K, alpha, beta)

    for it in range(iters):
        order = keys[it % len(keys):] + keys[:it % len(keys)]
        for k in order:
            times[k].append(runners[k].step())
        ours_curve.append((sum(times["ours"]), ours_ll()))
    final = {k: (ours_curve[-1][1] if k == "ours" else
                 joint_loglik(*runners[k].assignments(), corpus.n_docs, corpus.n_vocab, K, alpha, beta))
             for k in keys}
    peers = [k for k in keys if k != "ours"]
    target = max((final[k] for k in peers), default=-np.inf)
    t = ours_curve[-1][0]
    while ours_curve[-1][1] < target and len(ours_curve) < 2 * iters:
        t += ours.step()
        ours_curve.append((t, ours_ll()))

    n = corpus.n_tokens
    for k in keys:
        out.append({**base, "metric": "tokens_per_s", "unit": "tokens/s",
                    "sampler": ours.name if k == "ours" else runners[k].name,
                    "ours": round(n * iters / sum(times[k])), "seconds": round(sum(times[k]), 4),
                    "loglik": round(final[k], 1), "loglik_per_token": round(final[k] / n, 5)})
    ratios: dict[str, float | None] = {}
    for k in peers:
        hit = next((i for i, (_, ll) in enumerate(ours_curve) if ll >= final[k]), None)
        eq = None if hit is None else sum(times[k]) / ours_curve[hit][0]
        ratios[k] = eq
        paired = float(np.median(np.array(times[k]) / np.array(times["ours"])))
        out.append({**base, "metric": "equal_quality_speedup", "unit": "peer time / our time to its log-lik",
                    "ours": ours.name, "baseline_name": runners[k].name,
                    "ratio": None if eq is None else round(eq, 3),
                    "ours_iters_to_peer_loglik": None if hit is None else hit + 1,
                    "ours_iters_run": len(ours_curve),
                    "tokens_per_s_ratio": round(sum(times[k]) / sum(times["ours"]), 3),
                    "tokens_per_s_ratio_paired_median": round(paired, 3),
                    "ours_loglik": round(ours_curve[iters - 1][1], 1), "baseline_loglik": round(final[k], 1)})
    out.extend(_kernel_goals(base, K, ratios, runners))
    return out


def _kernel_goals(base: dict[str, Any], K: int, ratios: dict[str, float | None],
                  runners: dict[str, Any]) -> list[dict[str, Any]]:
    """Ours >= 1x the strongest peer at equal quality; at K >= 100 also >= 1.5x tomotopy on 1 thread."""
    goals = []
    missing = [k for k, _, _ in _PEERS if k not in runners]
    known = {k: r for k, r in ratios.items()}
    strongest = min(known, key=lambda k: -np.inf if known[k] is None else known[k], default=None)
    r = None if strongest is None else known[strongest]
    goals.append({**base, "case": "lda-goal", "goal": f"K={K}: our kernel >= 1x the strongest peer at equal quality",
                  "met": bool(r is not None and r >= 1.0 and not missing), "ratio": None if r is None else round(r, 3),
                  "strongest_peer": None if strongest is None else runners[strongest].name,
                  **({"missing": missing} if missing else {})})
    if K >= 100:
        r1 = known.get("tomotopy-1t")
        goals.append({**base, "case": "lda-goal",
                      "goal": f"K={K}: our kernel >= 1.5x tomotopy on 1 thread at equal quality",
                      "met": bool(r1 is not None and r1 >= 1.5), "ratio": None if r1 is None else round(r1, 3),
                      **({"missing": ["tomotopy-1t"]} if "tomotopy-1t" not in runners else {})})
    return goals


# ----------------------------------------------------------------------------------------------
# whole jobs through bosen launch, beside the bare kernel


def _job_config(args: dict[str, Any], V: int, K: int, workers: int, staleness: int | None = None) -> dict[str, Any]:
    import yaml

    cfg = yaml.safe_load(NEWS_CONFIG.read_text())
    cfg["cluster"]["workers"] = workers
    if staleness is not None:
        cfg["consistency"]["staleness"] = staleness
    cfg["tables"]["word_topic"].update(rows=V, cols=K)
    cfg["tables"]["topic_summary"]["cols"] = K
    cfg["app"]["args"] = args
    cfg["metrics"] = {**cfg.get("metrics", {}), "profile": True}  # per-thread phases (bench/apps/tickprofile.py)
    return cfg


def run_lda_job(args: dict[str, Any], V: int, K: int, workers: int, timeout: float = 600,
                staleness: int | None = None) -> dict[str, Any]:
    """One job through ``bosen launch``: its sampling span per worker and where the time went."""
    import yaml

    with tempfile.TemporaryDirectory(prefix="lda-bench-") as tmp:
        cfg = Path(tmp, "lda.yaml")
        cfg.write_text(yaml.safe_dump(_job_config(args, V, K, workers, staleness)))
        job = run_job(cfg, Path(tmp, "run"), workers=workers, timeout=timeout).check()
    work = [r for r in job.records if r.get("kind") == "worker" and "tokens" in r]
    if not work:
        raise RuntimeError("no worker records with tokens in metrics.jsonl")
    spans, parts = [], {}
    for rank in sorted({r["rank"] for r in work}):
        mine = sorted((r for r in work if r["rank"] == rank), key=lambda r: r["clock"])
        # from the start of the first sampling tick to the last report (clock waits in between included)
        spans.append(mine[-1]["time"] - (mine[0]["time"] - mine[0]["tick_s"]))
        parts.setdefault("first_tick_s", []).append(mine[0]["tick_s"])
        for key in ("compute_s", "read_s", "send_s", "clock_wait_s", "alias_s", "ll_s", "tick_s"):
            parts.setdefault(key, []).append(sum(r.get(key, 0.0) for r in mine))
    final = next((r["final_loglik"] for r in reversed(job.records)
                  if r.get("kind") == "clock" and "final_loglik" in r), None)
    slow = int(np.argmax(spans))  # the slowest worker's breakdown
    return {"seconds": max(spans), "launch_wall_s": job.seconds, "final_loglik": final,
            **{k: v[slow] for k, v in parts.items()},
            "profile": tickprofile.job_profile(job, "compute_s", "sample_cpu_s", has="tokens")}


def _bare(corpus: Corpus, a: LDAArgs) -> tuple[list[float], float]:
    """The kernel alone, the job's iterations in this process: (seconds per iteration, final log p(w, z))."""
    s = Sampler(corpus, a.K, a.alpha, a.beta, corpus.n_vocab, a.method(), a.mh_steps, a.seed * 7919 + 1)
    nwk = np.zeros((corpus.n_vocab, a.K), dtype=np.int32)
    w, k, c = s.word_topic_coo()
    nwk[w, k] = c
    nk = s.topic_counts()
    times = []
    for _ in range(a.iterations):
        t0 = time.perf_counter()
        s.sweep(nwk, nk, corpus.words)
        times.append(time.perf_counter() - t0)
    return times, loglikelihood(s.ndk, nwk, nk, a.alpha, a.beta)


def job_case(quick: bool, corpus: Corpus, data: str, repeats: int) -> list[dict[str, Any]]:
    """1- and 2-worker jobs beside the bare kernel (alternated, ``repeats`` rounds; medians)."""
    import yaml

    args = dict(yaml.safe_load(NEWS_CONFIG.read_text())["app"]["args"])
    if quick:
        args = {"data": "synthetic", "synth_docs": corpus.n_docs, "synth_vocab": corpus.n_vocab,
                "synth_topics": 20, "synth_doc_len": 100.0, "K": 20, "alpha": 0.1, "beta": 0.1, "iterations": 10}
        corpus = generate(corpus.n_docs, corpus.n_vocab, 20, 100.0, 0.1, 0.1, 0)  # what the job generates
    else:
        args["data"] = str(NEWS)
    args.update(test_data="", eval_every=0, ll_every=args.get("iterations", 20), save_model=False, top_words=3)
    a = LDAArgs(**args)
    _bare(corpus.subset(0, min(2, corpus.n_docs)), a)  # compile outside the timing
    rounds = []
    for _ in range(repeats):
        bare_t, bare_ll = _bare(corpus, a)
        one = run_lda_job(args, corpus.n_vocab, a.K, 1)
        one_b8 = run_lda_job({**args, "batches_per_clock": 8}, corpus.n_vocab, a.K, 1)
        two = run_lda_job(args, corpus.n_vocab, a.K, 2)
        bare_s = sum(bare_t)
        rounds.append((one["seconds"] / bare_s, bare_s, bare_ll, one, two, one_b8,
                       (one["seconds"] - one["first_tick_s"]) / sum(bare_t[1:]),
                       one_b8["seconds"] / bare_s))
    rounds.sort(key=lambda r: r[0])
    ratio, bare_s, bare_ll, one, two, one_b8, steady, ratio_b8 = rounds[len(rounds) // 2]
    base = {"bench": "apps", "case": "lda-job", "data": data, "K": a.K, "alpha": a.alpha, "beta": a.beta,
            "iterations": a.iterations, "sampler": a.method(), "batches_per_clock": {n: a.batches(n) for n in (1, 2)},
            "clocks_per_epoch": a.clocks_per_epoch, "tokens": corpus.n_tokens, "repeats": repeats}
    extra = one["seconds"] - bare_s
    out = [{**base, "metric": "seconds", "unit": "s", "ours": round(one["seconds"], 3), "baseline": round(bare_s, 3),
            "baseline_name": "bare kernel, same iterations, one process", "workers": 1,
            "ratio": round(ratio, 3), "ratios": [round(r[0], 3) for r in rounds],
            # the first tick opens the read connection to the server (one-off); after it:
            "first_tick_s": round(one["first_tick_s"], 3), "ratio_after_first_tick": round(steady, 3),
            "ratios_after_first_tick": [round(r[6], 3) for r in rounds],
            # the same job with eight mini-batches per tick (as a job with other workers runs them)
            "ratio_8_batches_per_clock": round(ratio_b8, 3),
            "ratios_8_batches_per_clock": [round(r[7], 3) for r in rounds],
            "read_rows_s_8_batches": round(one_b8["read_s"], 3), "send_s_8_batches": round(one_b8["send_s"], 3),
            "launch_wall_s": round(one["launch_wall_s"], 2),
            "job_loglik": one["final_loglik"], "bare_loglik": round(bare_ll, 1),
            # where the job's extra time goes (the 1-worker job's own per-tick reports, summed)
            "extra_s": round(extra, 3), "sampling_s": round(one["compute_s"], 3),
            "alias_tables_s": round(one["alias_s"], 3), "read_rows_s": round(one["read_s"], 3),
            "send_s": round(one["send_s"], 3), "clock_wait_s": round(one["clock_wait_s"], 3),
            "loglik_s": round(one["ll_s"], 3),
            "other_s": round(one["seconds"] - one["compute_s"] - one["read_s"] - one["send_s"]
                             - one["clock_wait_s"] - one["ll_s"], 3),
            # per thread and phase, ms per clock (bench/apps/tickprofile.py), beside the bare kernel's
            "bare_ms_per_clock": round(bare_s * 1e3 / a.iterations, 3), "profile": one["profile"],
            "profile_8_batches_per_clock": one_b8["profile"]},
           {**base, "metric": "seconds", "unit": "s", "ours": round(two["seconds"], 3),
            "baseline": round(one["seconds"], 3), "baseline_name": "same job, 1 worker", "workers": 2,
            "ratio": round(one["seconds"] / two["seconds"], 3), "launch_wall_s": round(two["launch_wall_s"], 2),
            "job_loglik": two["final_loglik"], "sampling_s": round(two["compute_s"], 3),
            "read_rows_s": round(two["read_s"], 3), "send_s": round(two["send_s"], 3),
            "clock_wait_s": round(two["clock_wait_s"], 3), "profile": two["profile"]},
           # as bench/apps/mf.py: iterations 2..E on both sides (the job's first tick opens the read
           # connection and fills a cold cache: start-up, which the bare kernel's timing leaves out too)
           {**base, "case": "lda-goal", "goal": "a 1-worker LDA job through the PS within 1.2x the bare kernel's time "
            "(iterations 2..E)", "met": bool(steady <= 1.2), "ratio": round(steady, 3),
            "ratio_with_first_tick": round(ratio, 3)}]
    _log_profiles(f"lda-job {data}", bare_s * 1e3 / a.iterations,
                  {"1 worker": one["profile"], "1 worker, 8 batches per clock": one_b8["profile"],
                   "2 workers": two["profile"]})
    return out


def _log_profiles(case: str, bare_ms: float, profiles: dict[str, dict[str, Any] | None]) -> None:
    """The human tables of a case's job profiles, on stderr (the JSON records hold them too)."""
    for name, prof in profiles.items():
        print(f"apps_lda: {case}, {name}: where a tick goes (bare kernel {bare_ms:.3f} ms per clock)\n"
              f"{tickprofile.table(prof)}", file=sys.stderr, flush=True)


def reuters() -> tuple[Corpus, str] | None:
    """The ``lda`` package's Reuters corpus (395 documents, 84,010 tokens, LDA-C), if it is installed."""
    try:
        import lda
    except ImportError:
        return None
    path = Path(lda.__file__).parent / "tests" / "reuters.ldac"
    return (load(str(path)), str(path)) if path.exists() else None


def peer_job_case(corpus: Corpus, path: str, data: str, K: int = 100, alpha: float = 0.1, beta: float = 0.01,
                  iterations: int = 100, repeats: int = 3, staleness: int | None = None,
                  batches: int | None = None) -> list[dict[str, Any]]:
    """Whole LDA jobs through ``bosen launch`` (1 worker, 2 workers) beside tomotopy doing the same
    iterations on 1 and 2 threads (issue 28), alternated over ``repeats`` rounds; medians.

    The job's time is its slowest worker's span from the start of its first sampling tick to its last
    report, less the one log-likelihood it computes at the last tick (tomotopy computes none);
    tomotopy's is one ``train(iterations)`` call after its initial assignment. Both log p(w, z) by one
    formula (the job's exact ``final_loglik``; :func:`joint_loglik` of tomotopy's assignments). A
    goal is met when ours is at least as fast (1 worker >= 1.0x tomotopy on 1 thread, 2 workers >=
    1.3x on 2 threads) at a log-likelihood no worse than tomotopy's by more than 0.1%. ``staleness``
    and ``batches`` override the config's staleness and the mini-batches per tick (defaults: the
    news config's, and the app's default).
    """
    import yaml

    args = dict(yaml.safe_load(NEWS_CONFIG.read_text())["app"]["args"])
    args.update(data=path, test_data="", eval_every=0, ll_every=iterations, save_model=False, top_words=3,
                K=K, alpha=alpha, beta=beta, iterations=iterations)
    if batches is not None:
        args["batches_per_clock"] = batches
    rounds: list[dict[str, Any]] = []
    for rep in range(repeats):
        got: dict[str, Any] = {}
        steps = [("job-1w", 1), ("tomotopy-1t", 1), ("job-2w", 2), ("tomotopy-2t", 2)]
        for key, n in steps if rep % 2 == 0 else steps[::-1]:
            if key.startswith("job"):
                job = run_lda_job(args, corpus.n_vocab, K, n, staleness=staleness)
                got[key] = (job["seconds"] - job["ll_s"], job["final_loglik"], job["profile"])
            else:
                try:
                    t = _Tomotopy(corpus, K, alpha, beta, n)
                except ImportError as e:
                    return [{"bench": "apps", "case": "lda-job-vs-tomotopy", "data": data, "ours": None,
                             "missing": True, "error": f"tomotopy not installed ({e}): {_INSTALL['tomotopy-1t']}"}]
                secs = t.run(iterations)
                got[key] = (secs, joint_loglik(*t.assignments(), corpus.n_docs, corpus.n_vocab, K, alpha, beta))
        rounds.append(got)
    base = {"bench": "apps", "case": "lda-job-vs-tomotopy", "data": data, "K": K, "alpha": alpha, "beta": beta,
            "iterations": iterations, "staleness": staleness, "tokens": corpus.n_tokens, "docs": corpus.n_docs,
            "repeats": repeats,
            "batches_per_clock": {n: LDAArgs(**args).batches(n) for n in (1, 2)}}
    out = []
    for n, need in ((1, 1.0), (2, 1.3)):
        ours = [r[f"job-{n}w"][0] for r in rounds]
        peer = [r[f"tomotopy-{n}t"][0] for r in rounds]
        ratios = [p / o for o, p in zip(ours, peer, strict=True)]
        ll_ours = float(np.median([r[f"job-{n}w"][1] for r in rounds]))
        ll_peer = float(np.median([r[f"tomotopy-{n}t"][1] for r in rounds]))
        ratio = float(np.median(ratios))
        ll_ok = ll_ours >= ll_peer - 1e-3 * abs(ll_peer)
        prof = sorted((r[f"job-{n}w"] for r in rounds), key=lambda j: j[0])[len(rounds) // 2][2]  # the median job's
        _log_profiles(f"lda-job-vs-tomotopy {data}", float(np.median(peer)) * 1e3 / iterations,
                      {f"{n} worker(s) (the 'bare' figure: tomotopy's ms per iteration)": prof})
        out.append({**base, "metric": "seconds", "unit": "s", "workers": n,
                    "ours": round(float(np.median(ours)), 3), "baseline": round(float(np.median(peer)), 3),
                    "baseline_name": f"{TOMOTOPY}, {n} thread{'s' if n > 1 else ''}, same iterations",
                    "ratio": round(ratio, 3), "ratios": [round(x, 3) for x in ratios],
                    "ours_loglik": round(ll_ours, 1), "baseline_loglik": round(ll_peer, 1), "profile": prof,
                    "goal": f"an LDA job with {n} worker{'s' if n > 1 else ''} >= {need}x tomotopy on {n} "
                            f"thread{'s' if n > 1 else ''} at equal or better log-likelihood (within 0.1%)",
                    "met": bool(ratio >= need and ll_ok)})
    return out


def run_bench(quick: bool) -> list[dict[str, Any]]:
    """Kernels vs tomotopy and ``lda`` at each K, then the jobs (see the module docstring)."""
    if quick or not NEWS.exists():
        corpus = generate(400, 400, 20, 80.0, alpha=0.1, beta=0.05, seed=3)
        data = "synthetic (400 docs, V=400)"
        cases = [(20, 8), (100, 8)]
    else:
        corpus = load(str(NEWS))
        data = "news (bosen data news)"
        cases = [(20, 50), (100, 50), (1000, 10)]
    out: list[dict[str, Any]] = []
    if not quick and not NEWS.exists():
        out.append({"bench": "apps", "case": "lda-kernel", "missing": True, "ours": None,
                    "error": f"{NEWS} missing (run: bosen data news); measured on a generated corpus instead"})
    for K, iters in cases:
        print(f"apps_lda: K={K}, {iters} iterations ...", file=sys.stderr, flush=True)
        out.extend(kernel_case(corpus, K, iters, data=data))
    print("apps_lda: jobs ...", file=sys.stderr, flush=True)
    try:
        out.extend(job_case(quick, corpus, data, 1 if quick else 3))
    except Exception as e:  # noqa: BLE001 - report, do not hide the kernel results
        out.append({"bench": "apps", "case": "lda-job", "ours": None, "error": f"{type(e).__name__}: {e}"[:500]})
    print("apps_lda: jobs beside tomotopy ...", file=sys.stderr, flush=True)
    peers = [] if quick else [("news (bosen data news)", corpus, str(NEWS), 50)] if NEWS.exists() else []
    rt = reuters()
    if rt is not None:
        peers.insert(0, ("reuters (the lda package's)", rt[0], rt[1], 10 if quick else 100))
    for name, c, path, iters in peers:
        try:
            out.extend(peer_job_case(c, path, name, iterations=iters, repeats=1 if quick else 3))
        except Exception as e:  # noqa: BLE001 - report, do not hide the other results
            out.append({"bench": "apps", "case": "lda-job-vs-tomotopy", "data": name, "ours": None,
                        "error": f"{type(e).__name__}: {e}"[:500]})
    return out


def kernels_only(specs: list[str]) -> list[dict[str, Any]]:
    """Only the kernel cases ``K:iterations`` named (e.g. ``100:50``) on the news corpus."""
    if not NEWS.exists():
        raise SystemExit(f"{NEWS} missing (run: bosen data news)")
    corpus = load(str(NEWS))
    out: list[dict[str, Any]] = []
    for spec in specs:
        K, _, iters = spec.partition(":")
        out.extend(kernel_case(corpus, int(K), int(iters or 50), data="news (bosen data news)"))
    return out


if __name__ == "__main__":
    # python -m bench.apps.lda [--quick] | --kernel K:ITERS [--kernel K:ITERS ...]
    #                          | --vs-tomotopy [--news] [--quick] [--staleness S] [--batches B]
    args = sys.argv[1:]
    ks = [args[j + 1] for j, x in enumerate(args) if x == "--kernel" and j + 1 < len(args)]

    def _opt(name: str) -> int | None:
        return int(args[args.index(name) + 1]) if name in args[:-1] else None

    if "--vs-tomotopy" in args:  # only the whole jobs beside tomotopy: on Reuters, or (--news) the news corpus
        quick = "--quick" in args
        over = {"staleness": _opt("--staleness"), "batches": _opt("--batches")}
        if "--news" in args:
            if not NEWS.exists():
                raise SystemExit(f"{NEWS} missing (run: bosen data news)")
            results = peer_job_case(load(str(NEWS)), str(NEWS), "news (bosen data news)",
                                    iterations=5 if quick else 50, repeats=1 if quick else 3, **over)
        else:
            rt = reuters()
            if rt is None:
                raise SystemExit("the lda package's Reuters corpus is missing: pip install lda==3.0.2")
            results = peer_job_case(rt[0], rt[1], "reuters (the lda package's)", iterations=10 if quick else 100,
                                    repeats=1 if quick else 3, **over)
    else:
        results = kernels_only(ks) if ks else run_bench("--quick" in args)
    for r in results:
        print(json.dumps(r), flush=True)
