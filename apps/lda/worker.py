"""LDA worker: collapsed Gibbs sampling with the word-topic table and topic summary in the PS.

Tables (declared in the job's config, both int32):

* ``word_topic``: rows = vocabulary, cols = K; ``n_wk`` counts summed over all workers.
* ``topic_summary``: 1 row, cols = K; ``n_k``.

Doc-topic counts ``n_dk`` stay local to the worker that owns the document. Documents are split among
workers in contiguous ranges balanced by token count; a worker's range is split again into
``clocks_per_epoch`` slices, one per clock tick (default: one pass over the partition per tick).

Per tick a worker fetches the word rows its slice needs (one ``get_rows`` call, unique sorted ids)
plus the summary row, samples its tokens against these local copies while updating them (Bösen's
read-my-writes, thesis §7.2: "the new statistics are used for sampling the next topic"), then sends
the net count changes as sparse COO increments and clocks.

Log-likelihood, reported as ``objective`` each tick (additive over workers, the launcher sums):

* doc part ``Σ_d lgamma(Kα) - lgamma(N_d+Kα) + Σ_k lgamma(n_dk+α) - lgamma(α)``: each worker, over
  its own documents (exact: doc-topic counts are local).
* word part ``Σ_{w,k} lgamma(n_wk+β) - lgamma(β)``: each worker over the words it *owns* for this
  purpose (``w % num_workers == rank``), from the rows it fetched this tick plus its own updates, so
  the word part lags the truth by at most the staleness bound.
* topic part ``Σ_k lgamma(Vβ) - lgamma(n_k+Vβ)``: rank 0 only.

After the last tick all workers clock ``staleness`` more times, so rank 0 can then read the complete
table; it reports the exact final log-likelihood (``final_loglik``), writes top words per topic to
stdout and ``$BOSEN_RUN_DIR/topics.txt``, and the counts to ``$BOSEN_RUN_DIR/word_topic.npy``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from bosen.apps.lda import kernels as K_
from bosen.apps.lda.data import Corpus, generate, load
from bosen.apps.lda.model import Sampler, top_words
from bosen.apps.protocol import PSClient, PSTable, require_table
from bosen.config import check, from_dict
from bosen.errors import ConfigError


@dataclass(frozen=True)
class LDAArgs:
    """``app.args`` of an LDA job."""

    data: str = "synthetic"            # "synthetic", a UCI docword.*.txt[.gz] path, or an LDA-C path
    vocab: str = ""                    # vocabulary file; UCI default: vocab.NAME.txt beside docword
    format: Literal["auto", "uci", "ldac"] = "auto"
    K: int = 20                        # topics (= cols of both tables)
    alpha: float = 0.1                 # doc-topic Dirichlet prior (thesis: 0.1)
    beta: float = 0.1                  # topic-word Dirichlet prior (thesis: 0.1)
    iterations: int = 20               # passes over the data (epochs)
    clocks_per_epoch: int = 1          # clock ticks per pass: work per tick = 1/clocks_per_epoch pass
    sampler: Literal["auto", "dense", "mh"] = "auto"
    dense_max_k: int = 64              # auto: exact dense Gibbs below this K, LightLDA MH at or above
    mh_steps: int = 4                  # MH steps per token (alternating word / doc proposals)
    ll_every: int = 1                  # compute the log-likelihood every this many ticks (and last)
    top_words: int = 10
    seed: int = 0                      # generator seed and base of the sampler seeds
    synth_docs: int = 1000
    synth_vocab: int = 500
    synth_topics: int = 0              # planted topics; 0 = K
    synth_doc_len: float = 100.0
    synth_alpha: float = 0.1
    synth_beta: float = 0.1
    init_barrier: bool = True          # wait (staleness+1 ticks) until all initial counts are visible
    save_model: bool = True            # rank 0 writes word_topic.npy to $BOSEN_RUN_DIR

    def __post_init__(self) -> None:
        for name in ("K", "iterations", "clocks_per_epoch", "mh_steps", "ll_every", "top_words",
                     "synth_docs", "dense_max_k"):
            check(getattr(self, name) >= 1, f"{name}: must be >= 1")
        check(self.synth_vocab >= 2, "synth_vocab: must be >= 2")
        check(self.synth_topics >= 0, "synth_topics: must be >= 0 (0 = K)")
        for name in ("alpha", "beta", "synth_doc_len", "synth_alpha", "synth_beta"):
            check(getattr(self, name) > 0, f"{name}: must be > 0")

    def method(self) -> str:
        """The sampler actually used ("dense" or "mh")."""
        if self.sampler != "auto":
            return self.sampler
        return "dense" if self.K < self.dense_max_k else "mh"


def load_corpus(a: LDAArgs) -> Corpus:
    """The job's corpus; every worker builds the same one (synthetic data is seeded)."""
    if a.data == "synthetic":
        return generate(a.synth_docs, a.synth_vocab, a.synth_topics or a.K, a.synth_doc_len,
                        a.synth_alpha, a.synth_beta, a.seed)
    return load(a.data, a.vocab or None, a.format)


# ----------------------------------------------------------------------------------------------
# the PS worker


def _check_geometry(client: PSClient, a: LDAArgs, V: int, source: str) -> tuple[PSTable, PSTable]:
    need = ("LDA needs tables word_topic (rows = vocabulary, cols = K, int32) and "
            "topic_summary (rows 1, cols = K, int32)")
    wt = require_table(client, "word_topic", need)
    ts = require_table(client, "topic_summary", need)
    where = client.config.source
    if wt.rows != V:
        raise ConfigError(f"{where}: tables.word_topic.rows={wt.rows} but the corpus {source} has a vocabulary "
                          f"of {V} words: set tables.word_topic.rows={V}")
    if wt.cols != a.K:
        raise ConfigError(f"{where}: tables.word_topic.cols={wt.cols} but app.args.K={a.K}: they must be equal")
    if ts.cols != a.K:
        raise ConfigError(f"{where}: tables.topic_summary.cols={ts.cols} but app.args.K={a.K}: they must be equal")
    for t in (wt, ts):
        if np.dtype(t.dtype).kind != "i":
            raise ConfigError(f"{where}: tables.{t.name}.dtype={np.dtype(t.dtype).name}: "
                              "LDA counts need int32 or int64")
    return wt, ts


def train(client: PSClient, args: Mapping[str, Any]) -> None:
    """Run LDA as one worker of a Bösen job (see the module docstring for the protocol)."""
    a: LDAArgs = from_dict(LDAArgs, args, "app.args")
    corpus = load_corpus(a)
    V = corpus.n_vocab
    wt, ts = _check_geometry(client, a, V, corpus.source)
    rank, P = int(client.rank), int(client.num_workers)
    stale_bound = wt.staleness  # how many ticks the barriers must span
    lo, hi = corpus.doc_range(rank, P)
    part = corpus.subset(lo, hi)
    sampler = Sampler(part, a.K, a.alpha, a.beta, V, a.method(), a.mh_steps, a.seed * 7919 + rank + 1)

    # slices (one per tick within an epoch) and their word sets
    m = a.clocks_per_epoch
    ptr = sampler.doc_ptr
    cuts = [part.doc_range(i, m) for i in range(m)] if part.n_docs else [(0, 0)] * m
    owned = np.arange(rank, V, P, dtype=np.int64)
    words_local = np.empty(part.n_tokens, dtype=np.int32)
    slices = []
    for d0, d1 in cuts:
        t0, t1 = int(ptr[d0]), int(ptr[d1])
        U = np.unique(part.words[t0:t1]).astype(np.int64)
        words_local[t0:t1] = np.searchsorted(U, part.words[t0:t1])
        U_all = np.union1d(U, owned)
        slices.append((d0, d1, t1 - t0, U, U_all, np.searchsorted(U_all, U), (U_all % P) == rank))

    # initial counts, then (optionally) wait until everyone's are visible
    w, k, n = sampler.word_topic_coo()
    if w.size:
        wt.inc_rows(w, n, cols=k)
    ts.inc_rows(np.zeros(1, dtype=np.int64), sampler.topic_counts()[None, :].astype(ts.dtype))
    client.clock()
    for _ in range(stale_bound if a.init_barrier else 0):
        client.clock()

    zero = np.zeros(1, dtype=np.int64)
    T = a.iterations * m
    for c in range(T):
        d0, d1, ntok, U, U_all, pos, owned_mask = slices[c % m]
        do_ll = (c + 1) % a.ll_every == 0 or c == T - 1
        t_start = time.perf_counter()
        fetched = wt.get_rows(U_all if do_ll else U)
        nk = np.array(ts.get_rows(zero)[0], dtype=np.int32)
        t_fetch = time.perf_counter()
        cur = np.ascontiguousarray(fetched[pos] if do_ll else fetched, dtype=np.int32)
        snap = cur.copy()
        nk_snap = nk.copy()
        st = sampler.sweep(cur, nk, words_local, d0, d1, snap, nk_snap)
        # net changes as sparse COO (most entries of a dense delta are zero)
        delta = cur - snap
        r, kk = np.nonzero(delta)
        if r.size:
            wt.inc_rows(U[r], delta[r, kk], cols=kk.astype(np.int64))
        dn = nk - nk_snap
        if dn.any():
            ts.inc_rows(zero, dn[None, :].astype(ts.dtype))
        rec: dict[str, float] = {"tokens": ntok, "fetch_s": t_fetch - t_start, **st}
        if do_ll:
            fetched = np.asarray(fetched, dtype=np.int32)
            fetched[pos] = cur
            ll_doc = sampler.loglik_docs()
            ll_word = float(K_.loglik_words(fetched, a.beta, owned_mask))
            if rank == 0:
                ll_word += float(K_.loglik_summary(nk, V, a.beta))
            rec.update(objective=ll_doc + ll_word, ll_doc=ll_doc, ll_word=ll_word)
        rec["step_s"] = time.perf_counter() - t_start
        client.report(**rec)
        client.clock()

    # closing barrier: after `staleness` more ticks every training update is readable
    for _ in range(stale_bound):
        client.clock()
    final = sampler.loglik_docs()
    if rank == 0:
        nwk = np.asarray(wt.get_rows(np.arange(V, dtype=np.int64)), dtype=np.int64)
        nk_final = np.asarray(ts.get_rows(zero)[0], dtype=np.int64)
        final += float(K_.loglik_words(np.clip(nwk, 0, None).astype(np.int32), a.beta,
                                       np.ones(V, dtype=np.bool_)))
        final += float(K_.loglik_summary(nk_final.astype(np.int32), V, a.beta))
        lines = top_words(nwk, corpus.word_names(), a.top_words)
        print("\n".join(lines), flush=True)
        run_dir = os.environ.get("BOSEN_RUN_DIR")
        if run_dir:
            Path(run_dir).mkdir(parents=True, exist_ok=True)
            Path(run_dir, "topics.txt").write_text("\n".join(lines) + "\n")
            if a.save_model:
                np.save(Path(run_dir, "word_topic.npy"), nwk.astype(np.int32))
        neg = int((nwk < 0).sum())
        if neg:
            print(f"lda: {neg} negative word-topic counts in the final table", file=sys.stderr)
    client.report(final_loglik=final)
