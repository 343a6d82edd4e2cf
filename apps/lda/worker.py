"""LDA worker: collapsed Gibbs sampling with the word-topic table and topic summary in the PS.

Tables (declared in the job's config, both int32):

* ``word_topic``: rows = vocabulary, cols = K; ``n_wk`` counts summed over all workers.
* ``topic_summary``: 1 row, cols = K; ``n_k``.

Doc-topic counts ``n_dk`` stay local to the worker that owns the document. Documents are split into
``micro_tasks`` contiguous ranges balanced by token count (default: one per worker), each with its own
chain (seed, sweeps; ``_Layout``), and a worker runs a contiguous block of them (apps/microtasks.py:
they move between workers at clock boundaries and resume with another worker count); each task's
range is split again into ``clocks_per_epoch`` slices, one per clock tick (default: one pass over the
partition per tick), and each slice into ``batches_per_clock`` mini-batches of documents (a worker's
mini-batch: its tasks' pieces; default 8, or 1 when the job has one worker: mini-batches are for
reading other workers' counts as they arrive mid-tick).

With the MH sampler the word proposal's alias tables are built once per tick, from one read of all
the tick's word rows at its start; each mini-batch proposes from them (slightly stale counts) and
accepts against its own fresh read, which keeps the sampler exact (the acceptance ratio evaluates
the proposal from the counts the tables were built from).

Per mini-batch the worker refreshes its views (client/view.py) of the word rows it needs (unique
sorted ids; one view per mini-batch, kept across ticks: only rows written since are copied) and of
the summary row, samples the mini-batch's tokens on the views' arrays while updating them (each draw
sees the counts the previous ones left, as collapsed Gibbs sampling wants), and pushes the net count
changes at once (one compiled pass per table). So a row that managed
communication refreshed while the tick runs is sampled against by the next mini-batch, and this
worker's changes can leave under the bandwidth budget before the tick ends (docs/design.md,
"Apps on the live cache", says why mini-batches rather than kernels on views of the cache).

Log-likelihood, reported as ``objective`` every ``ll_every`` ticks (additive over workers, the
launcher sums):

* doc part ``Σ_d lgamma(Kα) - lgamma(N_d+Kα) + Σ_k lgamma(n_dk+α) - lgamma(α)``: each worker, over
  its own documents (exact: doc-topic counts are local).
* word part ``Σ_{w,k} lgamma(n_wk+β) - lgamma(β)``: each worker over the words it *scores*
  (:func:`scored_words`: those its documents hold that no earlier worker's documents hold; a word no
  document holds has only zero counts and adds 0), read from its cache at the end of the tick (its
  own updates included), so the word part lags the truth by at most the staleness bound. A worker
  thus reads and holds only rows of its own words, never a share of the whole vocabulary.
* topic part ``Σ_k lgamma(Vβ) - lgamma(n_k+Vβ)``: rank 0 only.

That sum mixes each worker's own stale view of the rows it scores. With ``consistent_ll`` the job
also scores a consistent state, the servers' tables at each scored clock (what a checkpoint there
would hold), without a barrier: the tables hold only plain-add increments of the workers' topic
assignments, so after exactly the updates of ticks <= c they are the sum of each worker's local
counts at the end of its tick c. Each worker saves those (and its doc part) at every scored tick
(``consistent_ll_s`` in its report: the time that takes); after the closing barrier rank 0 sums them
and writes ``$BOSEN_RUN_DIR/consistent-ll.jsonl`` (see ``consistent``). At the last clock it equals
``final_loglik``. The convergence benchmark's targets use it.

Each report also has ``compute_s`` (sampling) and ``comm_s`` (reads, sends and the previous clock),
split into ``read_s`` (refreshes of the word rows and the summary), ``send_s`` (the count changes,
pushed) and ``clock_wait_s`` (the previous ``clock()``), ``alias_s`` (MH: building the word
proposal's alias tables) and ``tick_s``: the tick's wall time, the previous clock wait included.
``negative_counts``: how many rows the tick's sampling reads (each mini-batch's word rows and summary
row, and MH's per-tick read) held a negative count. A count is negative only when a read shows
another worker's decrement without the increment it follows; with exact SSP and read-my-writes this
cannot happen for a worker's own changes, so under exact communication it stays 0.

With ``test_data`` (held-out documents in the training vocabulary) each worker scores its share of
them every ``eval_every`` ticks by document completion (``model.DocumentCompletion``) against the
rows its cache holds, and reports ``heldout_ll`` and ``heldout_tokens``; the launcher turns their
sums into ``heldout_ll_per_token``.

After the last tick all workers clock ``staleness`` more times, so every training update is then
readable: each worker adds the word part of its scored words to its doc part (rank 0 the topic
part), and their sum is the exact final log-likelihood (``final_loglik``). Rank 0 then reads the rows
of the corpus' words, a block of ``FINAL_CHUNK_BYTES`` at a time, for the top words per topic (stdout and
``$BOSEN_RUN_DIR/topics.txt``) and the counts (``$BOSEN_RUN_DIR/word_topic.npy``, written row range
by row range; rows of words no document holds are 0): with ``cache_rows`` set on ``word_topic`` that
pass stays within the bound (docs/design.md, "LDA for large vocabularies").
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

from bosen.apps import microtasks
from bosen.apps.lda import consistent, evaluation, sampling
from bosen.apps.lda.data import Corpus, generate, load
from bosen.apps.lda.model import AliasTables, DocumentCompletion, Sampler, TopWords, sweep_seed
from bosen.apps.protocol import PSClient, PSTable, PSView, require_table
from bosen.apps.state import restored
from bosen.config import Config, check, from_dict
from bosen.errors import ConfigError, DataError

KEEP_VIEW_BYTES = 256 << 20  # most memory the mini-batches' word-row views kept across ticks take
FINAL_CHUNK_BYTES = 16 << 20  # rank 0's final pass over the word rows: int64 bytes of a block
TASK_STATE = ("z", "ndk", "sweeps", "dense_phase")  # a micro-task's arrays in checkpoints and hand-offs


@dataclass(frozen=True)
class LDAArgs:
    """``app.args`` of an LDA job."""

    data: str = "synthetic"            # "synthetic", a UCI docword.*.txt[.gz] path, or an LDA-C path
    vocab: str = ""                    # vocabulary file; UCI default: vocab.NAME.txt beside docword
    format: Literal["auto", "uci", "ldac"] = "auto"
    test_data: str = ""                # held-out documents (same format and vocabulary) for document completion
    eval_every: int = 1                # ticks between held-out log-likelihoods (and the last); 0 = never
    foldin_sweeps: int = 20            # Gibbs sweeps that fold in θ on each held-out document's seen half
    K: int = 20                        # topics (= cols of both tables)
    alpha: float = 0.1                 # doc-topic Dirichlet prior (thesis: 0.1)
    beta: float = 0.1                  # topic-word Dirichlet prior (thesis: 0.1)
    iterations: int = 20               # passes over the data (epochs)
    clocks_per_epoch: int = 1          # clock ticks per pass: work per tick = 1/clocks_per_epoch pass
    batches_per_clock: int = 0         # mini-batches of documents per tick, each read from the live cache;
    #                                    0 = 8, or 1 in a one-worker job (nothing arrives mid-tick to read)
    sampler: Literal["auto", "dense", "sparse", "mh"] = "auto"
    dense_max_k: int = 64              # auto: exact dense Gibbs below this K, exact sparse (SparseLDA) at or above
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
    consistent_ll: bool = False        # also score the servers' tables at each scored clock (consistent-ll.jsonl)
    micro_tasks: int = 0               # document ranges that can move between workers; 0 = one per worker

    def __post_init__(self) -> None:
        for name in ("K", "iterations", "clocks_per_epoch", "mh_steps", "ll_every", "top_words",
                     "synth_docs", "dense_max_k"):
            check(getattr(self, name) >= 1, f"{name}: must be >= 1")
        check(self.batches_per_clock >= 0, "batches_per_clock: must be >= 1, or 0 (the default: 8, 1 with one worker)")
        check(self.synth_vocab >= 2, "synth_vocab: must be >= 2")
        check(self.synth_topics >= 0, "synth_topics: must be >= 0 (0 = K)")
        check(self.eval_every >= 0, "eval_every: must be >= 0")
        check(self.foldin_sweeps >= 1, "foldin_sweeps: must be >= 1")
        check(self.micro_tasks >= 0, "micro_tasks: must be >= 0 (0 = one per worker)")
        for name in ("alpha", "beta", "synth_doc_len", "synth_alpha", "synth_beta"):
            check(getattr(self, name) > 0, f"{name}: must be > 0")

    def batches(self, workers: int) -> int:
        """Mini-batches per tick: as set, else 8, or 1 with one worker. Mini-batches let a tick sample
        against counts that arrive while it runs (other workers' updates, pushed mid-tick); a lone
        worker's cache only ever holds its own counts, which one batch sees as it changes them, so
        there each extra batch is only its client calls and the sampler's per-batch setup."""
        if self.batches_per_clock:
            return self.batches_per_clock
        return 1 if workers == 1 else 8

    def method(self) -> str:
        """The sampler actually used ("dense", "sparse" or "mh")."""
        if self.sampler != "auto":
            return self.sampler
        return "dense" if self.K < self.dense_max_k else "sparse"


def load_corpus(a: LDAArgs) -> Corpus:
    """The job's corpus; every worker builds the same one (synthetic data is seeded)."""
    if a.data == "synthetic":
        return generate(a.synth_docs, a.synth_vocab, a.synth_topics or a.K, a.synth_doc_len,
                        a.synth_alpha, a.synth_beta, a.seed)
    return load(a.data, a.vocab or None, a.format)


def _held_out(a: LDAArgs, V: int, rank: int, P: int) -> DocumentCompletion | None:
    """This worker's share of the held-out documents (``test_data``), or None."""
    if not a.test_data:
        return None
    test = load(a.test_data, None, a.format)
    if test.n_vocab != V:
        raise DataError(f"{a.test_data}: a vocabulary of {test.n_vocab} words, but the training corpus "
                        f"has {V}: held-out documents must use the training vocabulary")
    lo, hi = test.doc_range(rank, P)
    return DocumentCompletion(test.subset(lo, hi), a.alpha, a.beta, a.foldin_sweeps, a.foldin_sweeps // 2,
                              a.seed * 7919 + rank + 1)


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


def prepare(config: Config) -> Corpus:
    """The corpus, loaded before the worker joins the servers (``run_app``'s ``prepare``)."""
    return load_corpus(from_dict(LDAArgs, config.app.args, "app.args"))


def train(client: PSClient, args: Mapping[str, Any], corpus: Corpus | None = None) -> None:
    """Run LDA as one worker of a Bösen job (see the module docstring for the protocol); ``corpus``
    as :func:`prepare` loaded it, or None to load it here."""
    a: LDAArgs = from_dict(LDAArgs, args, "app.args")
    corpus = corpus if corpus is not None else load_corpus(a)
    V = corpus.n_vocab
    wt, ts = _check_geometry(client, a, V, corpus.source)
    rank, P = int(client.rank), int(client.num_workers)
    stale_bound = wt.staleness  # how many ticks the barriers must span
    saved = client.restored_state()
    n_tasks = microtasks.count(a.micro_tasks, P, saved)
    tasks, received, plan, handoff_dir = microtasks.start(n_tasks, rank, P, saved)
    joining = microtasks.join_clock()  # a worker joining the running job (bosen scale) at that clock
    cuts = task_cuts(corpus, n_tasks)
    lay = _Layout(corpus, a, cuts, tasks.mine, wt, ts, P)
    held = _held_out(a, V, rank, P) if rank < P else None  # a rank that joined later has no share of them

    # clocks: the initial counts' tick, the opening barrier, T training ticks, the closing barrier
    T = a.iterations * a.clocks_per_epoch
    pre = 1 + (stale_bound if a.init_barrier else 0)
    if plan is not None:  # no boundary at or past the training's end: nothing would run on a moved task
        plan.ends_at(pre + T)
    tick = 0  # clocks done (the client's tick)
    # a checkpoint holds the clocks done and each micro-task's chain (the sweeps' seeds follow from it)
    client.checkpoint_state(lambda: {"tick": np.array([tick]),
                                     **microtasks.pack({t: lay.state(t) for t in lay.tasks})})
    if saved is not None:
        got = restored(saved, ("tick",))
        assert got is not None
        tick = int(got["tick"][0])
        lay.load(microtasks.unpack(saved, lay.tasks, TASK_STATE), client.config.source)
    if joining is not None:  # its tasks' chains as their givers left them at the boundary
        tick = joining
        lay.load(received, client.config.source)
    if tick == 0:  # initial counts (in the checkpoint's tables otherwise)
        w, k, n = lay.sampler.word_topic_coo()
        if w.size:
            wt.inc_rows(w, n, cols=k)
        ts.inc_rows(np.zeros(1, dtype=np.int64), lay.sampler.topic_counts()[None, :].astype(ts.dtype))
    while tick < pre:  # then (optionally) wait until everyone's are visible
        tick += 1
        client.clock()
    zero = np.zeros(1, dtype=np.int64)
    snapshots = consistent.snapshot_dir() if a.consistent_ll else None
    scored_clocks: list[int] = []  # the clocks this process scored (their snapshot files must all exist)
    clock_wait = 0.0  # time in the previous clock() call: counted in the next report
    for c in range(tick - pre, T):
        do_ll = (c + 1) % a.ll_every == 0 or c == T - 1
        t_tick = time.perf_counter()
        rec: dict[str, float] = {"tokens": 0.0, "negative_counts": 0.0, "compute_s": 0.0, "comm_s": clock_wait,
                                 "clock_wait_s": clock_wait, "read_s": 0.0, "send_s": 0.0}
        tables = None
        m = a.clocks_per_epoch
        allU, amaps = lay.tick_words[c % m]
        sampler, views = lay.sampler, lay.views
        if sampler.method == "mh" and allU.size:
            # MH's word proposal: alias tables built once per tick from the rows as read now; the
            # mini-batches' acceptance tests use their own fresh reads, so the chain stays exact
            t0 = time.perf_counter()
            stale = np.ascontiguousarray(wt.get_rows(allU), dtype=np.int32)
            stale_nk = np.array(ts.get_rows(zero)[0], dtype=np.int32)
            t1 = time.perf_counter()
            rec["negative_counts"] += negative_rows(stale) + negative_rows(stale_nk[None, :])
            tables = sampler.alias_tables(stale, stale_nk)
            rec["read_s"] += t1 - t0
            rec["comm_s"] += t1 - t0
            rec["alias_s"] = tables.build_s
        for j, ((ranges, U), amap) in enumerate(zip(lay.ticks[c % m], amaps, strict=True)):
            if not ranges:
                continue
            st = _minibatch(lay, views.batch(c % m, j, U), views.summary, ranges, tables, amap)
            for key, v in st.items():
                rec[key] = rec.get(key, 0.0) + v
            rec["batches"] = rec.get("batches", 0.0) + 1  # mini-batches run this tick
        if do_ll:
            t0 = time.perf_counter()
            # the rows this worker scores, as its cache has them now (its own updates included)
            mine = _counts(views.scored.refresh()) if lay.scored.size else np.zeros((0, a.K), np.int32)
            nk = _counts(views.summary.refresh())[0]
            t1 = time.perf_counter()
            ll_doc = sampler.loglik_docs()
            ll_word = float(evaluation.loglik_words(mine, a.beta, np.ones(mine.shape[0], dtype=np.bool_)))
            if rank == 0:
                ll_word += float(evaluation.loglik_summary(nk, V, a.beta))
            rec.update(objective=ll_doc + ll_word, ll_doc=ll_doc, ll_word=ll_word)
            rec["comm_s"] += t1 - t0
            rec["read_s"] += t1 - t0
            rec["ll_s"] = time.perf_counter() - t1
            if snapshots is not None:
                # the state the servers hold once every worker's tick-`tick` updates are in: this
                # worker's share is its own tokens' counts now (its z at the end of the tick)
                t3 = time.perf_counter()
                consistent.save(snapshots, tick, rank, consistent.local_counts(sampler.words, sampler.z, a.K, V),
                                ll_doc)
                scored_clocks.append(tick)
                rec["consistent_ll_s"] = time.perf_counter() - t3
        if held is not None and a.eval_every and ((c + 1) % a.eval_every == 0 or c == T - 1):
            t0 = time.perf_counter()
            rows = np.asarray(wt.get_rows(held.rows), dtype=np.int32)
            nk = np.asarray(ts.get_rows(zero)[0], dtype=np.int32)
            rec.update(heldout_ll=held.loglik(rows, nk), heldout_tokens=held.tokens,
                       heldout_s=time.perf_counter() - t0)
        rec["tick_s"] = time.perf_counter() - t_tick + clock_wait
        client.report(**rec)
        # tasks this rank gives away at the next boundary that a lost process of it handed off already:
        # their receiver runs on from those states, so this one does too (docs/recovery.md)
        if adopted := tasks.adopt(tick + 1, plan, handoff_dir):
            lay.adopt(adopted, wt, ts, client.config.source)
            print(f"lda: micro-task(s) {sorted(adopted)} were handed off at clock {tick + 1} already: this worker "
                  "goes on from those states, their counts corrected", flush=True)
        t2 = time.perf_counter()
        tick += 1
        client.clock()
        clock_wait = time.perf_counter() - t2
        if plan is not None and handoff_dir is not None and (new := plan.at(tick, n_tasks)) is not None:
            # a new assignment from this clock on: hand tasks off, rebuild for ours
            kept = {t: lay.state(t) for t in lay.tasks if new[t] == rank}
            received = tasks.handoff(tick, new, handoff_dir, lay.state)
            if plan.leaving(end=client.end_clocks):  # its tasks are given away: it leaves here (BYE on close)
                return
            # mini-batches for the workers the job has now (a lone worker's tick is one batch: LDAArgs.batches)
            lay = _Layout(corpus, a, cuts, tasks.mine, wt, ts, int(np.unique(new).size))
            lay.load({**kept, **received}, client.config.source)

    # closing barrier: after `staleness` more ticks every training update is readable
    while tick < pre + T + stale_bound:
        tick += 1
        client.clock()
    # the exact objective, summed over the workers: each one's doc part and its scored words' part
    final = lay.sampler.loglik_docs()
    if lay.scored.size:
        # read into the scoring view (no new array); a negative count adds nothing to the word part,
        # as the 0 it was clipped to before
        mine = _counts(lay.views.scored.refresh())
        final += float(evaluation.loglik_words(mine, a.beta, np.ones(lay.scored.size, dtype=np.bool_)))
    if rank == 0:
        nk_final = np.asarray(ts.get_rows(zero)[0], dtype=np.int64)
        final += float(evaluation.loglik_summary(nk_final.astype(np.int32), V, a.beta))
        run_dir = os.environ.get("BOSEN_RUN_DIR")
        save = Path(run_dir, "word_topic.npy") if run_dir and a.save_model else None
        top = _final_pass(wt, corpus_words(corpus), V, a.top_words, save)
        lines = top.lines(corpus.vocab)
        print("\n".join(lines), flush=True)
        if run_dir:
            Path(run_dir).mkdir(parents=True, exist_ok=True)
            Path(run_dir, "topics.txt").write_text("\n".join(lines) + "\n")
        if top.negative:
            print(f"lda: {top.negative} negative word-topic counts in the final table", file=sys.stderr)
        if snapshots is not None:
            # the reads above waited for every worker's last training clock, sent after its last file
            every = [pre + c for c in range(T) if (c + 1) % a.ll_every == 0 or c == T - 1]
            recs = consistent.combine(snapshots, every, scored_clocks, P, V, a.K, a.beta)
            consistent.write(snapshots.parent, recs)
    client.report(final_loglik=final)


def task_cuts(corpus: Corpus, n_tasks: int) -> np.ndarray:
    """The first document of each of ``n_tasks`` micro-tasks and the end (length n_tasks + 1):
    contiguous ranges balanced by tokens, the ranges ``Corpus.doc_range`` gives workers."""
    cuts = np.zeros(n_tasks + 1, dtype=np.int64)
    for t in range(n_tasks):
        cuts[t + 1] = corpus.doc_range(t, n_tasks)[1]
    return cuts


class _Layout:
    """What a worker holds for its micro-tasks ``tasks`` (sorted, contiguous ids): their documents (one
    range of the corpus, so one :class:`Sampler` over it), the mini-batches of each tick, the views.

    A micro-task is a range of the sampler's arrays, and its chain is its own: its tokens start from
    its own seed, its sweeps draw from (its seed, its sweep count, the offset in it), and its sparse
    sampler's dense phase is its own, so the task samples the same whichever worker runs it. Each
    mini-batch of a tick is the union of every task's piece of it (a task's documents cut into
    ``clocks_per_epoch`` slices, each into the batches): the batch reads its rows once and samples
    task by task. One task per worker is the worker's documents as a job without micro-tasks cut them."""

    def __init__(self, corpus: Corpus, a: LDAArgs, cuts: np.ndarray, tasks: np.ndarray, wt: PSTable, ts: PSTable,
                 P: int) -> None:
        self.tasks = [int(t) for t in tasks]
        lo, hi = (int(cuts[self.tasks[0]]), int(cuts[self.tasks[-1] + 1])) if self.tasks else (0, 0)
        self.lo, self.hi = lo, hi
        part = corpus.subset(lo, hi)
        self.doc = {t: (int(cuts[t]) - lo, int(cuts[t + 1]) - lo) for t in self.tasks}  # docs in the part
        self.seed = {t: a.seed * 7919 + t + 1 for t in self.tasks}
        s = self.sampler = Sampler(part, a.K, a.alpha, a.beta, corpus.n_vocab, a.method(), a.mh_steps,
                                   self.seed[self.tasks[0]] if self.tasks else 0)
        ptr = s.doc_ptr
        for t, (d0, d1) in self.doc.items():  # each task's tokens from its own seed
            sampling.random_init(s.z[ptr[d0]:ptr[d1]], a.K, self.seed[t])
        s.ndk[:] = sampling.doc_topic_counts(ptr, s.z, a.K)
        self.sweeps = {t: 0 for t in self.tasks}
        self.dense_phase = {t: s.dense_phase for t in self.tasks}
        m, b = a.clocks_per_epoch, a.batches(P)
        self.words_local = np.empty(part.n_tokens, dtype=np.int32)  # each token's row in its batch's read
        self.ticks: list[list[tuple[list[tuple[int, int, int]], np.ndarray]]] = []
        self.tick_words: list[tuple[np.ndarray, list[np.ndarray]]] = []  # MH: the tick's words, each batch's
        pieces = {t: part.subset(d0, d1) for t, (d0, d1) in self.doc.items()}
        for i in range(m):
            batches = []
            for j in range(b):
                ranges = []
                for t, (d0, _) in self.doc.items():
                    tc = pieces[t]
                    e0, e1 = tc.doc_range(i, m) if tc.n_docs else (0, 0)
                    s0, s1 = tc.subset(e0, e1).doc_range(j, b) if e1 > e0 else (0, 0)
                    if s1 > s0:
                        ranges.append((t, d0 + e0 + s0, d0 + e0 + s1))
                toks = [part.words[ptr[x]:ptr[y]] for _, x, y in ranges]
                U = np.unique(np.concatenate(toks)).astype(np.int64) if toks else np.zeros(0, np.int64)
                for _, x, y in ranges:
                    self.words_local[ptr[x]:ptr[y]] = np.searchsorted(U, part.words[ptr[x]:ptr[y]])
                batches.append((ranges, U))
            self.ticks.append(batches)
            allU = np.unique(np.concatenate([U for _, U in batches])) if batches else np.zeros(0, np.int64)
            self.tick_words.append((allU, [np.searchsorted(allU, U).astype(np.int64) for _, U in batches]))
        self.scored = scored_words(corpus, lo, hi)
        self.views = _Views(wt, ts, self.ticks, self.scored)

    def sweep(self, t: int, nwk: np.ndarray, nk: np.ndarray, lo: int, hi: int, tables: AliasTables | None,
              amap: np.ndarray) -> dict[str, float]:
        """Task ``t``'s documents [lo, hi) (of the part) resampled with the task's own seed and phase."""
        s = self.sampler
        seed = sweep_seed(self.seed[t], self.sweeps[t], lo - self.doc[t][0])
        self.sweeps[t] += 1
        s.dense_phase = self.dense_phase[t]
        st = s.sweep(nwk, nk, self.words_local, lo, hi, tables=tables, rows=amap, seed=seed) \
            if tables is not None else s.sweep(nwk, nk, self.words_local, lo, hi, seed=seed)
        self.dense_phase[t] = s.dense_phase
        return st

    def state(self, t: int) -> dict[str, np.ndarray]:
        """Task ``t``'s chain (``TASK_STATE``): its tokens' topics, its documents' topic counts, its
        sweeps so far and its sparse sampler's phase."""
        d0, d1 = self.doc[t]
        ptr = self.sampler.doc_ptr
        return {"z": self.sampler.z[ptr[d0]:ptr[d1]], "ndk": self.sampler.ndk[d0:d1],
                "sweeps": np.array([self.sweeps[t]]), "dense_phase": np.array([self.dense_phase[t]])}

    def adopt(self, states: Mapping[int, Mapping[str, np.ndarray]], wt: PSTable, ts: PSTable, source: str) -> None:
        """Take the chains ``states`` of some of this worker's tasks in place of their own (the app
        contract's ``adopt``, apps/microtasks.py), adding to the tables the counts of their assignments
        less those of the assignments they replace, so the tables stay the counts of every task's z."""
        ptr, K = self.sampler.doc_ptr, self.sampler.K
        words, old, new = [], [], []
        for t, st in states.items():
            d0, d1 = self.doc[t]
            words.append(self.sampler.words[ptr[d0]:ptr[d1]].astype(np.int64))
            old.append(self.sampler.z[ptr[d0]:ptr[d1]].astype(np.int64))
            new.append(np.asarray(st["z"], dtype=np.int64).ravel())
            if new[-1].shape != old[-1].shape:
                raise ConfigError(f"{source}: micro-task {t}'s handed-off topic assignments {new[-1].shape} do not "
                                  f"fit its {old[-1].size} tokens")
        w = np.concatenate(words)
        sign = np.concatenate([np.ones(w.size, np.int64), -np.ones(w.size, np.int64)])
        key = np.concatenate([w * K + np.concatenate(new), w * K + np.concatenate(old)])
        uk, inv = np.unique(key, return_inverse=True)
        diff = np.bincount(inv, weights=sign, minlength=uk.size).astype(np.int64)
        moved = diff != 0
        rows, cols = np.divmod(uk[moved], K)
        if rows.size:
            wt.inc_rows(rows, diff[moved].astype(np.dtype(wt.dtype)), cols=cols)
        nk = np.bincount(np.concatenate(new), minlength=K) - np.bincount(np.concatenate(old), minlength=K)
        if nk.any():
            ts.inc_rows(np.zeros(1, dtype=np.int64), nk[None, :].astype(np.dtype(ts.dtype)))
        self._put(states, source, list(states))

    def load(self, states: Mapping[int, Mapping[str, np.ndarray]], source: str) -> None:
        """Put every task's saved chain in place (ConfigError where it does not fit its documents)."""
        self._put(states, source, self.tasks)

    def _put(self, states: Mapping[int, Mapping[str, np.ndarray]], source: str, tasks: list[int]) -> None:
        ptr = self.sampler.doc_ptr
        for t in tasks:
            st, (d0, d1) = states[t], self.doc[t]
            z, ndk = self.sampler.z[ptr[d0]:ptr[d1]], self.sampler.ndk[d0:d1]
            if st["z"].shape != z.shape or st["ndk"].shape != ndk.shape:
                raise ConfigError(f"{source}: micro-task {t}'s saved topic assignments {st['z'].shape} / doc-topic "
                                  f"counts {st['ndk'].shape} do not fit its documents {z.shape} / {ndk.shape}: "
                                  "another corpus or K?")
            z[:] = st["z"]
            ndk[:] = st["ndk"]
            self.sweeps[t] = int(st["sweeps"][0])
            self.dense_phase[t] = bool(st["dense_phase"][0])


class _Views:
    """The worker's views (client/view.py) of the rows it reads again and again: each mini-batch's
    word rows (kept across ticks while they fit ``KEEP_VIEW_BYTES``, else made anew per mini-batch),
    the summary row, and the word rows it scores (read only: no second copy). int32 views: the
    sampling kernels' counts."""

    def __init__(self, wt: PSTable, ts: PSTable, ticks: list[list[tuple[list[tuple[int, int, int]], np.ndarray]]],
                 scored: np.ndarray) -> None:
        self.wt = wt
        self.summary = ts.view(np.zeros(1, dtype=np.int64))
        self.scored = wt.view(scored, base=False)
        size = sum(2 * U.shape[0] * wt.cols * np.dtype(wt.dtype).itemsize for batches in ticks for _, U in batches)
        self.kept = [[wt.view(U) for _, U in batches] for batches in ticks] if size <= KEEP_VIEW_BYTES else None

    def batch(self, i: int, j: int, U: np.ndarray) -> PSView:
        """The view of mini-batch ``j`` of tick slice ``i`` (word rows ``U``)."""
        return self.kept[i][j] if self.kept is not None else self.wt.view(U)


def scored_words(corpus: Corpus, lo: int, hi: int) -> np.ndarray:
    """The words whose part of the objective's word term the worker of documents [lo, hi) adds
    (sorted int64): those its documents hold that no document before ``lo`` holds. Workers hold
    contiguous document ranges in rank order, so every word some document holds is scored by exactly
    one worker, the first that holds it; a word no document holds has only zero counts, which add 0.
    Each worker scores rows it reads for sampling anyway, so the objective costs no rows of its own."""
    ptr = corpus.doc_ptr()
    mine = np.unique(corpus.words[ptr[lo]:ptr[hi]])
    before = corpus.words[:ptr[lo]]
    if before.size:
        mine = mine[~np.isin(mine, before)]
    return mine.astype(np.int64)


def corpus_words(corpus: Corpus) -> np.ndarray:
    """Every word some document holds (sorted int64): the rows of word_topic that can be non-zero."""
    return np.unique(corpus.words).astype(np.int64)


def _final_pass(wt: PSTable, words: np.ndarray, V: int, n_top: int, save: Path | None) -> TopWords:
    """Rank 0's pass over the final word rows: ``words`` read ``FINAL_CHUNK_BYTES`` at a time (rows of
    consecutive word ids), top words per topic kept as it goes, and with ``save`` the whole V x K
    int32 table written row range by row range as ``.npy`` (rows of other words are 0), so neither the
    pass nor the file costs a V x K array in memory."""
    K = wt.cols
    top = TopWords(K, n_top)
    step = max(1, FINAL_CHUNK_BYTES // (8 * K))
    out = save.open("wb") if save is not None else None
    try:
        if out is not None:
            np.lib.format.write_array_header_1_0(out, {"descr": np.dtype(np.int32).str, "fortran_order": False,
                                                       "shape": (V, K)})
        for first in range(0, V, step):
            last = min(V, first + step)
            ids = words[np.searchsorted(words, first):np.searchsorted(words, last)]
            block = np.zeros((last - first, K), dtype=np.int64)
            if ids.size:
                block[ids - first] = wt.get_rows(ids)
            top.add(first, block)
            if out is not None:
                out.write(block.astype(np.int32).tobytes())
    finally:
        if out is not None:
            out.close()
    return top


def _minibatch(lay: _Layout, words: PSView, summary: PSView, ranges: list[tuple[int, int, int]],
               tables: AliasTables | None, amap: np.ndarray) -> dict[str, float]:
    """One mini-batch (its micro-tasks' documents ``ranges``: (task, lo, hi) each): refresh the views of
    their word rows and the summary (copying only rows written since), sample each task's documents
    on the views' arrays with the task's own seed, push the count changes (one compiled pass a table).

    ``tables`` (MH) are the tick's alias tables, ``amap`` this batch's rows among theirs."""
    t0 = time.perf_counter()
    cur = _counts(words.refresh())
    nk2 = _counts(summary.refresh())
    t1 = time.perf_counter()
    neg = negative_rows(cur) + negative_rows(nk2)
    nk = nk2[0]
    st: dict[str, float] = {"tokens": 0.0}
    for t, lo, hi in ranges:
        for key, v in lay.sweep(t, cur, nk, lo, hi, tables, amap).items():
            st[key] = st.get(key, 0.0) + v
        st["tokens"] += float(lay.sampler.doc_ptr[hi] - lay.sampler.doc_ptr[lo])
    if cur is not words.values:  # an int64 table: the kernels counted on an int32 copy
        words.values[:] = cur
    if nk2 is not summary.values:
        summary.values[:] = nk2
    t2 = time.perf_counter()
    words.push()
    summary.push()
    t3 = time.perf_counter()
    return {**st, "compute_s": t2 - t1, "comm_s": (t1 - t0) + (t3 - t2), "read_s": t1 - t0, "send_s": t3 - t2,
            "negative_counts": float(neg)}


def _counts(values: np.ndarray) -> np.ndarray:
    """A view's counts as the sampling kernels take them: the array itself where it is int32."""
    return values if values.dtype == np.int32 else values.astype(np.int32)


def negative_rows(counts: np.ndarray) -> int:
    """How many rows of ``counts`` (as read) hold a negative count: one pass (a ``min``) when none do."""
    if counts.size == 0 or counts.min() >= 0:
        return 0
    return int(np.count_nonzero((counts < 0).any(axis=1)))
