"""The LDA model as a worker holds it: topic assignments, doc-topic counts, the sweep, the objective.

A :class:`Sampler` owns the state that stays local to a worker (the topic of each of its tokens,
``ndk`` for its documents) and resamples it against word-topic rows passed in per sweep: the worker
passes its local copies of PS rows, :func:`fit` (single process, no PS: tests and benchmarks) the
full model. :func:`loglikelihood` is the objective, log p(w, z).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from bosen.apps.lda import evaluation, sampling
from bosen.apps.lda.data import Corpus

__all__ = ["AliasTables", "Sampler", "sweep_seed", "FitResult", "DocumentCompletion", "fit", "loglikelihood",
           "top_words", "TopWords"]


@dataclass
class AliasTables:
    """The MH word proposal's alias tables and the counts they were built from (see
    ``sampling.build_word_alias``); ``build_s`` is the time building them took."""

    stale: np.ndarray        # (R, K) word-topic rows as read
    stale_nk: np.ndarray     # (K,) topic summary as read
    ptr: np.ndarray
    rec: np.ndarray
    mass: np.ndarray
    b_prob: np.ndarray
    b_alias: np.ndarray
    b_mass: float
    build_s: float = 0.0


class Sampler:
    """Topic assignments and doc-topic counts of one set of documents, plus the sweep logic.

    Word-topic rows and the summary are passed in per sweep: the worker passes its local copies of
    PS rows, :func:`fit` passes the full model.
    """

    def __init__(self, corpus: Corpus, K: int, alpha: float, beta: float, n_vocab: int,
                 method: str = "mh", mh_steps: int = 4, seed: int = 0) -> None:
        if method not in ("dense", "sparse", "mh"):
            raise ValueError(f"sampler method {method!r}: dense, sparse or mh")
        self.K, self.alpha, self.beta = K, float(alpha), float(beta)
        self.vbeta = n_vocab * self.beta
        self.method, self.mh_steps, self.seed = method, mh_steps, seed
        self.doc_ptr = corpus.doc_ptr()
        self.n_docs = corpus.n_docs
        self.words = corpus.words
        self.z = np.empty(corpus.n_tokens, dtype=np.int32)
        sampling.random_init(self.z, K, seed)
        self.ndk = sampling.doc_topic_counts(self.doc_ptr, self.z, K)
        self.sweeps = 0
        # "sparse" starts with dense sweeps while they are cheaper (see sweep)
        self.dense_phase = method == "sparse"
        self._ident: np.ndarray | None = None

    def word_topic_coo(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """This sampler's own contribution to n_wk as sparse (word, topic, count)."""
        key = self.words.astype(np.int64) * self.K + self.z
        uk, cnt = np.unique(key, return_counts=True)
        w, k = np.divmod(uk, self.K)
        return w, k, cnt.astype(np.int32)

    def topic_counts(self) -> np.ndarray:
        return np.bincount(self.z, minlength=self.K).astype(np.int32)

    def alias_tables(self, stale: np.ndarray, stale_nk: np.ndarray) -> AliasTables:
        """MH word-proposal tables from word-topic rows and a summary as read (kept, not copied)."""
        need = np.ones(stale.shape[0], dtype=np.bool_)
        t0 = time.perf_counter()
        ptr, rec, mass, b_prob, b_alias, b_mass = sampling.build_word_alias(stale, stale_nk, self.beta, self.vbeta,
                                                                            need)
        return AliasTables(stale, stale_nk, ptr, rec, mass, b_prob, b_alias, b_mass,
                           build_s=time.perf_counter() - t0)

    def sweep(self, nwk: np.ndarray, nk: np.ndarray, words_local: np.ndarray, doc_lo: int = 0,
              doc_hi: int | None = None, stale: np.ndarray | None = None,
              stale_nk: np.ndarray | None = None, tables: AliasTables | None = None,
              rows: np.ndarray | None = None, seed: int | None = None) -> dict[str, float]:
        """Resample the tokens of documents [doc_lo, doc_hi), updating nwk/nk/ndk in place.

        ``words_local`` maps each token to its row in ``nwk``. MH proposes from ``tables`` (built by
        :meth:`alias_tables`, possibly over more rows than ``nwk`` has: ``rows[r]`` is nwk's row r
        among them); without them it builds tables from ``stale``/``stale_nk`` (the rows as fetched;
        default: a copy of nwk/nk now). Stale tables keep MH exact: the acceptance test evaluates the
        proposal from the counts the tables were built from and the target from the live ones.
        ``seed`` (a micro-task's own stream, see the worker) replaces the sampler's: its sweep count
        is then left alone. Returns timings and counts; ``dense_sweeps`` (exact methods) is 1 where this sweep ran dense
        (a worker's tick report sums it over its mini-batches).
        """
        doc_hi = self.n_docs if doc_hi is None else doc_hi
        if seed is None:
            seed = sweep_seed(self.seed, self.sweeps, doc_lo)
            self.sweeps += 1
        t0 = time.perf_counter()
        c0 = time.thread_time()  # CPU too: wall above it is time the thread waited for a core
        if self.method != "mh":  # exact: dense or sparse, same arguments
            dense = self.method == "dense"
            if self.dense_phase:
                # After a random start every word spreads over most topics and the sparse sampler's
                # lists are long: a dense sweep is cheaper then (news, K=100: 0.11 against 0.21 s for
                # the first sweep; sparse wins from about the 8th). Dense while the measured mean list
                # length says so, then sparse for good (lists only get shorter as the chain settles).
                # Both kernels are exact collapsed Gibbs: the chain is the same, only its cost changes.
                L = sampling.mean_list_length(nwk, words_local, self.doc_ptr, doc_lo, doc_hi)
                dense = sampling.dense_is_cheaper(L, self.K)
                self.dense_phase = dense
            kernel = sampling.sample_dense if dense else sampling.sample_sparse
            changed = kernel(self.doc_ptr, words_local, self.z, self.ndk, nwk, nk, self.alpha, self.beta,
                             self.vbeta, doc_lo, doc_hi, seed)
            return {"sample_s": time.perf_counter() - t0, "sample_cpu_s": time.thread_time() - c0,
                    "changed": float(changed), "dense_sweeps": float(dense)}
        alias_s = 0.0
        if tables is None:
            tables = self.alias_tables(nwk.copy() if stale is None else stale,
                                       nk.copy() if stale_nk is None else stale_nk)
            alias_s = tables.build_s
            rows = None
        R = nwk.shape[0]
        if rows is None:
            if tables.stale.shape[0] != R:
                raise ValueError(f"alias tables over {tables.stale.shape[0]} rows for {R} word-topic rows: "
                                 "pass rows=")
            rows = self._identity(R)
        acc, prop = sampling.sample_mh(self.doc_ptr, words_local, self.z, self.ndk, nwk, tables.stale, rows, nk,
                                       tables.stale_nk, tables.ptr, tables.rec, tables.mass, tables.b_prob,
                                       tables.b_alias, tables.b_mass, self.alpha, self.beta, self.vbeta, self.mh_steps,
                                       doc_lo, doc_hi, seed)
        t2 = time.perf_counter()
        return {"sample_s": t2 - t0, "sample_cpu_s": time.thread_time() - c0, "alias_s": alias_s,
                "accepted": float(acc), "proposed": float(prop)}

    def _identity(self, R: int) -> np.ndarray:
        if self._ident is None or self._ident.shape[0] < R:
            self._ident = np.arange(max(R, 1), dtype=np.int64)
        return self._ident[:R]

    def loglik_docs(self) -> float:
        return float(evaluation.loglik_docs(self.ndk, self.alpha))


def sweep_seed(seed: int, sweeps: int, doc_lo: int) -> int:
    """The kernel seed of a sweep: a chain's seed, its sweeps so far, the first document's offset."""
    return (seed * 1_000_003 + sweeps * 7919 + doc_lo) & 0x7FFFFFFFFFFF


@dataclass
class FitResult:
    nwk: np.ndarray                    # (V, K) word-topic counts
    nk: np.ndarray
    sampler: Sampler
    loglik: list[float] = field(default_factory=list)   # after each iteration (if tracked)
    sample_s: list[float] = field(default_factory=list)  # seconds per iteration (kernel + alias)

    def phi(self) -> np.ndarray:
        """Topic-word distributions (K, V) from the counts: (n_wk + β) normalized."""
        p = self.nwk.T.astype(np.float64) + self.sampler.beta
        return p / p.sum(axis=1, keepdims=True)


def fit(corpus: Corpus, K: int, iterations: int, alpha: float = 0.1, beta: float = 0.1,
        method: str = "mh", mh_steps: int = 4, seed: int = 0, track_loglik: bool = True) -> FitResult:
    """Single-process LDA on the whole corpus (no PS): the kernels exactly as the worker runs them."""
    s = Sampler(corpus, K, alpha, beta, corpus.n_vocab, method, mh_steps, seed)
    nwk = np.zeros((corpus.n_vocab, K), dtype=np.int32)
    w, k, c = s.word_topic_coo()
    nwk[w, k] = c
    nk = s.topic_counts()
    res = FitResult(nwk, nk, s)
    for _ in range(iterations):
        st = s.sweep(nwk, nk, corpus.words)
        res.sample_s.append(st["sample_s"])
        if track_loglik:
            res.loglik.append(loglikelihood(s.ndk, nwk, nk, alpha, beta))
    return res


def top_words(nwk: np.ndarray, names: list[str] | None, n: int) -> list[str]:
    """One line per topic: its total count and the n most frequent words (ties: lower word id first)."""
    top = TopWords(nwk.shape[1], n)
    top.add(0, nwk)
    return top.lines(names)


class TopWords:
    """The n most frequent words per topic over word rows added in order of their ids, a block at a
    time, so the whole word-topic table is never in memory at once; the result is what one stable
    sort over the whole table gives. Also sums each topic's count and counts negative entries."""

    def __init__(self, K: int, n: int) -> None:
        self.n = n
        self.ids = np.zeros((0, K), dtype=np.int64)     # (<= n, K) the best so far, best first
        self.counts = np.zeros((0, K), dtype=np.int64)
        self.total = np.zeros(K, dtype=np.int64)
        self.negative = 0

    def add(self, first: int, rows: np.ndarray) -> None:
        """Rows of words ``first``, ``first + 1``, ...; all ids above those added before."""
        rows = np.asarray(rows, dtype=np.int64)
        self.total += rows.sum(axis=0)
        self.negative += int(np.count_nonzero(rows < 0))
        best = np.argsort(-rows, axis=0, kind="stable")[:self.n]
        ids = np.concatenate([self.ids, best + first])
        counts = np.concatenate([self.counts, np.take_along_axis(rows, best, axis=0)])
        # stable: among equal counts the earlier (lower) ids stay first, as in one sort of the whole table
        order = np.argsort(-counts, axis=0, kind="stable")[:self.n]
        self.ids = np.take_along_axis(ids, order, axis=0)
        self.counts = np.take_along_axis(counts, order, axis=0)

    def lines(self, names: list[str] | None) -> list[str]:
        """One line per topic: its total count and its top words (``names`` by id, else ``wID``)."""
        def name(i: int) -> str:
            return names[i] if names is not None else f"w{i}"
        return [f"topic {k:3d} (n={int(self.total[k])}): " + " ".join(name(int(i)) for i in self.ids[:, k])
                for k in range(self.total.size)]


def loglikelihood(ndk: np.ndarray, nwk: np.ndarray, nk: np.ndarray, alpha: float, beta: float) -> float:
    """Complete-data log p(w, z) of a whole model (the formula the ``lda`` package reports)."""
    mask = np.ones(nwk.shape[0], dtype=np.bool_)
    return float(evaluation.loglik_docs(ndk, alpha) + evaluation.loglik_words(nwk, beta, mask)
                 + evaluation.loglik_summary(nk, nwk.shape[0], beta))


class DocumentCompletion:
    """Held-out log-likelihood per token by document completion (Wallach et al. 2009's estimator in
    its simplest, widely used form): each held-out document's tokens are split at random in two
    halves; θ is folded in on one half with the current topics fixed, and the other half is scored
    as Σ log Σ_k θ_dk φ_wk, with φ_wk = (n_wk + β)/(n_k + Vβ) from the counts read."""

    def __init__(self, corpus: Corpus, alpha: float, beta: float, sweeps: int = 20, burn_in: int = 10,
                 seed: int = 0) -> None:
        self.alpha, self.beta, self.sweeps, self.burn_in, self.seed = alpha, beta, sweeps, burn_in, seed
        self.vbeta = corpus.n_vocab * beta
        rng = np.random.default_rng(seed)
        order = np.lexsort((rng.random(corpus.n_tokens), corpus.docs))
        ptr = corpus.doc_ptr()
        docs = corpus.docs[order]
        pos = np.arange(order.size) - ptr[docs]
        lens = np.diff(ptr)
        seen = pos < (lens[docs] + 1) // 2
        # the words either half needs, and each token's row among them
        self.rows = np.unique(corpus.words).astype(np.int64)
        local = np.searchsorted(self.rows, corpus.words[order]).astype(np.int64)
        self.obs_words, self.held_words = local[seen], local[~seen]
        self.obs_ptr = np.zeros(corpus.n_docs + 1, dtype=np.int64)
        np.cumsum(np.bincount(docs[seen], minlength=corpus.n_docs), out=self.obs_ptr[1:])
        self.held_ptr = np.zeros(corpus.n_docs + 1, dtype=np.int64)
        np.cumsum(np.bincount(docs[~seen], minlength=corpus.n_docs), out=self.held_ptr[1:])

    @property
    def tokens(self) -> int:
        """Tokens scored (the unseen halves)."""
        return int(self.held_words.size)

    def phi(self, nwk_rows: np.ndarray, nk: np.ndarray) -> np.ndarray:
        """φ restricted to ``self.rows`` from their counts and the topic summary (negatives as 0)."""
        num = np.clip(np.asarray(nwk_rows, dtype=np.float64), 0, None) + self.beta
        return num / (np.clip(np.asarray(nk, dtype=np.float64), 0, None) + self.vbeta)[None, :]

    def loglik(self, nwk_rows: np.ndarray, nk: np.ndarray) -> float:
        """Σ log p(unseen token | seen half, topics) over the held-out documents."""
        phi = self.phi(nwk_rows, nk)
        theta = evaluation.fold_in(self.obs_ptr, self.obs_words, phi, self.alpha, self.sweeps, self.burn_in, self.seed)
        return float(evaluation.completion_loglik(self.held_ptr, self.held_words, theta, phi))
