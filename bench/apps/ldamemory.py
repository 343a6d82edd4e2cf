"""What an LDA worker holds for a large vocabulary (issue 29, point 3): resident memory per worker.

    python -m bench.apps.ldamemory [--quick] [--vocab 100000] [--K 1000] [--docs 4000] [--doc-len 40]
                                   [--iterations 3] [--storage dense,sparse] [--cache-rows N] [--repeats 1]

A synthetic corpus with Zipf word frequencies (exponent 1.07, word ids shuffled) over ``vocab`` words,
``docs`` documents of Poisson(``doc_len``) tokens, written as a UCI file, trains through ``bosen
launch`` (2 workers, 1 server, staleness 2, the app's default sampler: sparse at K >= 64) with
``word_topic`` rows = the vocabulary, the given ``storage`` and, with ``--cache-rows``, that bound on
the rows each worker's cache keeps. While the job runs, the bench reads
each worker's /proc status every 20 ms: ``VmHWM`` (peak resident set) at its last reading, and
``VmRSS`` once the worker's first training tick is in its records (``RUN_DIR/workers/RANK.jsonl``).
The workers' final ``client.stats()`` give what each holds of ``word_topic`` (``rows_held``,
``slots``; a row-indexed table reports neither).

Results (``bench="apps"``, ``case="lda-vocab-memory"``, one line per storage and rank, progress on
stderr): ``metric="worker-peak-rss-MB"`` with ``ours`` the median over ``repeats`` jobs and
``rss_after_first_clock_MB``, ``rows_held``, ``slots``, ``words`` (distinct words in the worker's
documents) beside it. No baseline runs in the same invocation: a before/after comparison runs this
same command on both versions of the code (docs/performance-log.md says how).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import yaml

from bench.common import emit, log, spread
from bosen.apps.lda.data import Corpus, write_uci
from bosen.jobs.job import WORKER_RECORDS, run_job

MiB = 1 << 20
ZIPF_S = 1.07


def zipf_corpus(docs: int, vocab: int, doc_len: float, seed: int = 0) -> Corpus:
    """``docs`` documents of Poisson(doc_len) tokens (at least 1), words drawn by Zipf frequencies."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, vocab + 1, dtype=np.float64) ** ZIPF_S
    p /= p.sum()
    ids = rng.permutation(vocab).astype(np.int32)  # frequent words spread over the id range
    lens = np.maximum(rng.poisson(doc_len, docs), 1)
    d = np.repeat(np.arange(docs, dtype=np.int32), lens)
    w = ids[rng.choice(vocab, size=int(lens.sum()), p=p)]
    order = np.lexsort((w, d))
    return Corpus(d[order], w[order], docs, vocab, source="<zipf>")


class _Watch:
    """Polls the job's LDA worker processes (children of this one): peak and current RSS by rank."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.peak: dict[int, int] = {}
        self.after_first: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-watch", daemon=True)

    def __enter__(self) -> _Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _workers(self) -> dict[int, psutil.Process]:
        out = {}
        for p in psutil.Process().children(recursive=True):
            try:
                if "bosen.apps.lda" in p.cmdline():
                    out[int(p.environ().get("BOSEN_RANK", "-1"))] = p
            except (psutil.Error, ValueError):
                continue
        return out

    def _ticked(self, rank: int) -> bool:
        path = self.run_dir / WORKER_RECORDS / f"{rank}.jsonl"
        try:
            return any("tokens" in json.loads(line) for line in path.read_text().splitlines() if line.strip())
        except (OSError, ValueError):
            return False

    def _run(self) -> None:
        procs: dict[int, psutil.Process] = {}
        while not self._stop.wait(0.02):
            if len(procs) < 2:
                procs.update(self._workers())
            for rank, p in procs.items():
                try:
                    status = Path(f"/proc/{p.pid}/status").read_text()
                except OSError:
                    continue
                fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
                if "VmHWM" not in fields:
                    continue  # exiting
                self.peak[rank] = int(fields["VmHWM"].split()[0]) * 1024
                if rank not in self.after_first and self._ticked(rank):
                    self.after_first[rank] = int(fields["VmRSS"].split()[0]) * 1024


def one_job(data: Path, V: int, K: int, iterations: int, storage: str, tmp: Path,
            cache_rows: int | None = None) -> dict[int, dict[str, Any]]:
    """One 2-worker job; per rank: peak RSS, RSS after the first training tick, rows held."""
    table: dict[str, Any] = {"rows": V, "cols": K, "dtype": "int32"}
    if storage != "dense":
        table["storage"] = storage
    if cache_rows is not None:
        table["cache_rows"] = cache_rows
    cfg = {"cluster": {"servers": ["127.0.0.1:0"], "workers": 2}, "consistency": {"staleness": 2},
           "tables": {"word_topic": table, "topic_summary": {"rows": 1, "cols": K, "dtype": "int32"}},
           "app": {"module": "bosen.apps.lda",
                   "args": {"data": str(data), "K": K, "alpha": 0.1, "beta": 0.01, "iterations": iterations,
                            "top_words": 3, "save_model": False}}}
    path = tmp / f"lda-{storage}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run_dir = tmp / f"run-{storage}-{time.monotonic_ns()}"
    with _Watch(run_dir) as watch:
        # exec'd processes (BOSEN_FORK=0): a worker forked from the launcher's zygote shares its pages,
        # and its RSS would not be the footprint this measures
        job = run_job(path, run_dir, timeout=900, env={"BOSEN_FORK": "0"}).check()
    held = {r.get("rank", -1): r.get("tables", {}).get("word_topic", {}) for r in job.kind("client")}
    return {rank: {"peak": watch.peak.get(rank), "after_first": watch.after_first.get(rank),
                   "rows_held": held.get(rank, {}).get("rows_held"), "slots": held.get(rank, {}).get("slots"),
                   "cached_rows": held.get(rank, {}).get("cached_rows"),
                   "rows_evicted": held.get(rank, {}).get("rows_evicted")}
            for rank in (0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="V = 20,000, K = 200, 1,000 documents (CI)")
    ap.add_argument("--vocab", type=int, default=100_000)
    ap.add_argument("--K", type=int, default=1000)
    ap.add_argument("--docs", type=int, default=4000)
    ap.add_argument("--doc-len", type=float, default=40.0)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--storage", default="dense,sparse")
    ap.add_argument("--cache-rows", type=int, default=None, help="tables.word_topic.cache_rows")
    ap.add_argument("--repeats", type=int, default=1)
    a = ap.parse_args()
    if a.quick:
        a.vocab, a.K, a.docs = 20_000, 200, 1000
    corpus = zipf_corpus(a.docs, a.vocab, a.doc_len)
    words = []
    for rank in (0, 1):
        lo, hi = corpus.doc_range(rank, 2)
        words.append(int(np.unique(corpus.subset(lo, hi).words).size))
    with tempfile.TemporaryDirectory(prefix="lda-vocab-") as tmp_name:
        tmp = Path(tmp_name)
        data = tmp / "docword.zipf.txt"
        write_uci(corpus, data)
        runs: dict[str, list[dict[int, dict[str, Any]]]] = {s: [] for s in a.storage.split(",")}
        for rep in range(a.repeats):
            for storage in list(runs) if rep % 2 == 0 else list(runs)[::-1]:
                log(f"ldamemory: V={a.vocab} K={a.K} storage={storage} round {rep + 1}/{a.repeats} ...")
                runs[storage].append(one_job(data, a.vocab, a.K, a.iterations, storage, tmp, a.cache_rows))
    for storage, jobs in runs.items():
        for rank in (0, 1):
            peaks = [j[rank]["peak"] / MiB for j in jobs if j[rank]["peak"]]
            firsts = [j[rank]["after_first"] / MiB for j in jobs if j[rank]["after_first"]]
            last = jobs[-1][rank]
            emit(bench="apps", case="lda-vocab-memory", metric="worker-peak-rss-MB", unit="MB",
                 ours=spread(peaks)["median"] if peaks else None, peak_spread=spread(peaks) if peaks else None,
                 rss_after_first_clock_MB=spread(firsts) if firsts else None, rank=rank, storage=storage,
                 cache_rows_limit=a.cache_rows, vocab=a.vocab, K=a.K, docs=a.docs, tokens=corpus.n_tokens,
                 words=words[rank],
                 rows_held=last["rows_held"], slots=last["slots"], cached_rows=last["cached_rows"],
                 rows_evicted=last["rows_evicted"], row_bytes=4 * a.K)


if __name__ == "__main__":
    main()
