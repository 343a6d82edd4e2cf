"""LDA app: readers, generator, kernels, worker logic, and end-to-end runs through the launcher.

Topic recovery is judged by Hellinger distance (in [0, 1]) between each planted topic-word
distribution and the learned one matched to it (greedy matching, cross-checked against the
Hungarian method). Bounds used below: every planted topic within 0.25, mean below 0.15; a correct
model on these corpora lands at 0.04-0.12 (finite-sample noise), a merged pair of topics at ~0.9.
Collapsed Gibbs from a random start sometimes merges two planted topics into one local optimum
when K equals the planted count; training with K = planted + 2 removes that (40/40 seeds in
development), so the recovery tests train with two spare topics, plus one exact-K case on an easy
corpus.
"""

from __future__ import annotations

import gzip
import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import PY, run_cmd
from inprocess import InProcessClient, InProcessTable
from resume import whole_and_resumed

from bosen.apps.lda import consistent, evaluation, sampling
from bosen.apps.lda.data import (
    DataError,
    generate,
    hellinger,
    load,
    match_topics,
    read_ldac,
    read_uci,
    read_vocab,
    write_ldac,
    write_uci,
)
from bosen.apps.lda.model import DocumentCompletion, Sampler, TopWords, fit, loglikelihood, top_words
from bosen.apps.lda.worker import LDAArgs, corpus_words, negative_rows, scored_words, train
from bosen.errors import ConfigError

# ------------------------------------------------------------------------------------------------
# readers


def _w(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


GOOD = "2\n3\n4\n1 1 2\n1 3 1\n2 2 5\n2 3 1\n"


def test_uci_and_ldac_roundtrip(tmp_path):
    c = generate(50, 40, 4, 20.0, seed=1)
    write_uci(c, tmp_path / "docword.x.txt", tmp_path / "vocab.x.txt")
    u = read_uci(tmp_path / "docword.x.txt")  # vocab found beside docword
    assert u.vocab == c.vocab and u.n_docs == 50 and u.n_vocab == 40
    np.testing.assert_array_equal(u.docs, c.docs)
    np.testing.assert_array_equal(u.words, c.words)
    assert u.docs.dtype == np.int32 and u.words.dtype == np.int32
    write_ldac(c, tmp_path / "c.ldac")
    lc = read_ldac(tmp_path / "c.ldac", tmp_path / "vocab.x.txt")
    np.testing.assert_array_equal(lc.docs, c.docs)
    np.testing.assert_array_equal(lc.words, c.words)
    assert load(str(tmp_path / "c.ldac")).n_tokens == c.n_tokens
    # gzip, as the UCI site ships docword files
    with gzip.open(tmp_path / "docword.z.txt.gz", "wt") as f:
        f.write((tmp_path / "docword.x.txt").read_text())
    np.testing.assert_array_equal(read_uci(tmp_path / "docword.z.txt.gz").words, c.words)


def test_uci_small_file_contents(tmp_path):
    c = read_uci(_w(tmp_path / "docword.s.txt", GOOD))
    assert (c.n_docs, c.n_vocab, c.n_tokens) == (2, 3, 9)
    assert c.docs.tolist() == [0, 0, 0, 1, 1, 1, 1, 1, 1]
    assert c.words.tolist() == [0, 0, 2, 1, 1, 1, 1, 1, 2]
    assert c.vocab is None and c.doc_ptr().tolist() == [0, 3, 9]


@pytest.mark.parametrize("text, line, what", [
    ("x\n3\n4\n", 1, "bad header: expected the number of documents D"),
    ("2\n3 4\n4\n", 2, "bad header: expected the vocabulary size W"),
    ("2\n3\n", 3, "truncated header"),
    ("2\n3\n7\n", 3, "NNZ=7 exceeds D\\*W=6"),
    ("2\n3\n4\n1 1 2\n1 3 1\n", 6, "truncated file: the header declares NNZ=4 entries, the file ends after 2"),
    ("2\n3\n4\n1 1 2\n1 x 1\n2 2 5\n2 3 1\n", 5, "field 2 \\(wordID\\) is not an integer"),
    ("2\n3\n4\n1 1 2\n1 3 1.5\n2 2 5\n2 3 1\n", 5, "field 3 \\(count\\) is not an integer"),
    ("2\n3\n4\n1 1\n", 4, "expected 3 fields"),
    ("2\n3\n4\n1 1 2\n1 9 1\n2 2 5\n2 3 1\n", 5, "wordID 9 out of vocabulary range 1..3"),
    ("2\n3\n4\n1 1 2\n1 0 1\n2 2 5\n2 3 1\n", 5, "wordID 0 out of vocabulary range"),
    ("2\n3\n4\n1 1 2\n1 3 1\n3 2 5\n2 3 1\n", 6, "docID 3 out of range 1..2"),
    ("2\n3\n4\n1 1 0\n", 4, "count 0 must be a positive integer"),
    (GOOD + "2 1 1\n", 8, "more entries than the header's NNZ=4"),
])
def test_uci_errors_name_file_and_line(tmp_path, text, line, what):
    p = _w(tmp_path / "docword.bad.txt", text)
    with pytest.raises(DataError, match=what) as e:
        read_uci(p)
    assert str(e.value).startswith(f"{p}:{line}: "), str(e.value)


def test_uci_missing_files(tmp_path):
    with pytest.raises(DataError, match="docword file not found") as e:
        read_uci(tmp_path / "docword.none.txt")
    assert str(tmp_path / "docword.none.txt") in str(e.value)
    p = _w(tmp_path / "docword.s.txt", GOOD)
    with pytest.raises(DataError, match="vocabulary file not found"):
        read_uci(p, tmp_path / "vocab.none.txt")


def test_vocab_errors_name_file_and_line(tmp_path):
    p = _w(tmp_path / "docword.s.txt", GOOD)
    v = _w(tmp_path / "vocab.s.txt", "apple\nbanana\n")
    with pytest.raises(DataError, match="truncated vocabulary: the corpus declares W=3") as e:
        read_uci(p)  # vocab.s.txt found beside docword.s.txt
    assert str(e.value).startswith(f"{v}:3: ")
    _w(v, "apple\n\ncherry\n")
    with pytest.raises(DataError, match=f"{v}:2: empty line"):
        read_uci(p)
    _w(v, "apple\nbanana\ncherry\ndate\n")
    with pytest.raises(DataError, match=f"{v}:4: vocabulary has 4 words"):
        read_uci(p)
    _w(v, "apple\nbanana\ncherry\n\n")  # a blank tail is fine
    assert read_uci(p).vocab == ["apple", "banana", "cherry"]
    assert read_vocab(v) == ["apple", "banana", "cherry"]


@pytest.mark.parametrize("text, line, what", [
    ("2 0:1 1:2\n3 0:1 1:1\n", 2, "declares M=3 terms but has 2 term:count pairs"),
    ("1 0;1\n", 1, "field 2 is not of the form term:count"),
    ("1 a:1\n", 1, "field 2 is not an integer"),
    ("1 0:1\nx 1:1\n", 2, "field 1 is not an integer"),
    ("1 0:1\n1 7:1\n", 2, "term id 7 out of vocabulary range 0..2"),
    ("1 0:0\n", 1, "count 0 must be a positive integer"),
])
def test_ldac_errors_name_file_and_line(tmp_path, text, line, what):
    p = _w(tmp_path / "c.ldac", text)
    v = _w(tmp_path / "vocab.txt", "a\nb\nc\n")
    with pytest.raises(DataError, match=what) as e:
        read_ldac(p, v)
    assert str(e.value).startswith(f"{p}:{line}: "), str(e.value)


def test_ldac_missing_and_empty(tmp_path):
    with pytest.raises(DataError, match="LDA-C corpus file not found"):
        read_ldac(tmp_path / "none.ldac")
    with pytest.raises(DataError, match="no documents"):
        read_ldac(_w(tmp_path / "e.ldac", "\n\n"))


# ------------------------------------------------------------------------------------------------
# generator


def test_generator_sanity():
    c = generate(400, 100, 5, 50.0, alpha=0.1, beta=0.1, seed=3)
    c2 = generate(400, 100, 5, 50.0, alpha=0.1, beta=0.1, seed=3)
    np.testing.assert_array_equal(c.words, c2.words)
    assert not np.array_equal(generate(400, 100, 5, 50.0, seed=4).words[:500], c.words[:500])
    assert c.phi.shape == (5, 100) and c.theta.shape == (400, 5)
    np.testing.assert_allclose(c.phi.sum(1), 1.0)
    np.testing.assert_allclose(c.theta.sum(1), 1.0)
    assert abs(c.n_tokens - 400 * 50) < 5 * math.sqrt(400 * 50)
    assert np.all(np.diff(c.docs) >= 0) and c.words.min() >= 0 and c.words.max() < 100
    assert np.bincount(c.docs, minlength=400).min() >= 1
    # tokens of planted topic k follow phi_k
    z = c.meta["z"]
    for k in range(5):
        emp = np.bincount(c.words[z == k], minlength=100) / np.sum(z == k)
        assert hellinger(emp, c.phi[k]) < 0.12
    # partition by tokens is contiguous, complete and balanced
    cuts = [c.doc_range(r, 3) for r in range(3)]
    assert cuts[0][0] == 0 and cuts[-1][1] == 400 and all(a[1] == b[0] for a, b in zip(cuts, cuts[1:], strict=False))
    ptr = c.doc_ptr()
    sizes = [ptr[b] - ptr[a] for a, b in cuts]
    assert max(sizes) - min(sizes) < 200


def test_match_topics_agrees_with_hungarian():
    scipy_opt = pytest.importorskip("scipy.optimize")
    rng = np.random.default_rng(0)
    true = rng.dirichlet(np.full(50, 0.1), size=6)
    noisy = true[rng.permutation(6)] + rng.dirichlet(np.full(50, 1.0), size=6) * 0.05
    noisy = np.vstack([noisy, rng.dirichlet(np.full(50, 1.0), size=2)])  # spare topics
    perm, dist = match_topics(noisy, true)
    p = noisy / noisy.sum(1, keepdims=True)
    D = np.sqrt(np.clip(1 - np.sqrt(true) @ np.sqrt(p).T, 0, None))
    r, c = scipy_opt.linear_sum_assignment(D)
    assert perm.tolist() == c.tolist() and np.allclose(dist, D[r, c])


# ------------------------------------------------------------------------------------------------
# log-likelihood


def _ll_reference(ndk, nwk, nk, alpha, beta):
    from scipy.special import gammaln

    K = ndk.shape[1]
    V = nwk.shape[0]
    ll = K * gammaln(V * beta) - gammaln(nk + V * beta).sum() + (gammaln(nwk + beta) - gammaln(beta)).sum()
    nd = ndk.sum(1)
    ll += (gammaln(K * alpha) - gammaln(nd + K * alpha)).sum() + (gammaln(ndk + alpha) - gammaln(alpha)).sum()
    return ll


@pytest.mark.slow
def test_loglikelihood_matches_reference_and_lda_package():
    pytest.importorskip("scipy.special")
    c = generate(200, 150, 6, 60.0, seed=2)
    r = fit(c, 6, 3, alpha=0.2, beta=0.05, method="dense", track_loglik=False)
    ndk, nwk, nk = r.sampler.ndk, r.nwk, r.nk
    got = loglikelihood(ndk, nwk, nk, 0.2, 0.05)
    assert got == pytest.approx(_ll_reference(ndk, nwk, nk, 0.2, 0.05), rel=1e-10)
    # the additive split the worker reports sums to the whole
    mask = np.zeros(150, bool)
    mask[::2] = True
    parts = (evaluation.loglik_docs(ndk, 0.2) + evaluation.loglik_words(nwk, 0.05, mask)
             + evaluation.loglik_words(nwk, 0.05, ~mask) + evaluation.loglik_summary(nk, 150, 0.05))
    assert parts == pytest.approx(got, rel=1e-12)
    lda = pytest.importorskip("lda._lda")
    ref = lda._loglikelihood(np.asfortranarray(nwk.T.astype(np.intc)), ndk.astype(np.intc), nk.astype(np.intc),
                             ndk.sum(1).astype(np.intc), 0.2, 0.05)
    assert got == pytest.approx(ref, rel=1e-9)


# ------------------------------------------------------------------------------------------------
# samplers


def _model(c, K, seed=0):
    s = Sampler(c, K, 0.1, 0.05, c.n_vocab, "dense", 4, seed)
    nwk = np.zeros((c.n_vocab, K), np.int32)
    w, k, n = s.word_topic_coo()
    nwk[w, k] = n
    return s, nwk, s.topic_counts()


def _consistent(s, nwk, nk, words):
    K = nk.size
    assert s.z.min() >= 0 and s.z.max() < K
    np.testing.assert_array_equal(s.ndk, sampling.doc_topic_counts(s.doc_ptr, s.z, K))
    want = np.zeros_like(nwk)
    np.add.at(want, (words, s.z), 1)
    np.testing.assert_array_equal(nwk, want)
    np.testing.assert_array_equal(nk, np.bincount(s.z, minlength=K))


@pytest.mark.parametrize("method", ["dense", "sparse", "mh"])
@pytest.mark.slow
def test_sweeps_keep_counts_consistent(method):
    c = generate(300, 120, 5, 40.0, seed=5)
    s, nwk, nk = _model(c, 7)
    s.method = method
    for _ in range(3):
        st = s.sweep(nwk, nk, c.words)
        assert st["sample_s"] >= 0
        _consistent(s, nwk, nk, c.words)
    if method == "mh":
        assert 0 < st["accepted"] <= st["proposed"]
    # a sweep over a document range touches only those documents
    z0 = s.z.copy()
    ptr = s.doc_ptr
    s.sweep(nwk, nk, c.words, 10, 20)
    changed = np.nonzero(s.z != z0)[0]
    assert changed.size and changed.min() >= ptr[10] and changed.max() < ptr[20]
    _consistent(s, nwk, nk, c.words)


def _exact_posterior(docs, words, K, V, alpha, beta):
    """p(z | w) over all K^N assignments of a tiny corpus, by enumeration."""
    n = len(words)
    D = max(docs) + 1
    probs = np.empty(K ** n)
    for idx in range(K ** n):
        z = np.array([(idx // K ** i) % K for i in range(n)])
        ndk = np.zeros((D, K), np.int32)
        nwk = np.zeros((V, K), np.int32)
        np.add.at(ndk, (docs, z), 1)
        np.add.at(nwk, (words, z), 1)
        probs[idx] = loglikelihood(ndk, nwk, nwk.sum(0).astype(np.int32), alpha, beta)
    probs = np.exp(probs - probs.max())
    return probs / probs.sum()


@pytest.mark.parametrize("method", ["dense", "sparse", "mh"])
def test_samplers_target_the_exact_posterior(method):
    """Run the chain on a 4-token corpus and compare visit frequencies with the enumerated posterior.

    MH uses a fixed, deliberately wrong word proposal (arbitrary "stale" counts): the acceptance
    test must correct for it, so the chain still targets the exact collapsed posterior.
    """
    K, V, alpha, beta = 3, 3, 0.5, 0.3
    docs = np.array([0, 0, 1, 1], np.int32)
    words = np.array([0, 1, 1, 2], np.int32)
    exact = _exact_posterior(docs, words, K, V, alpha, beta)
    doc_ptr = np.array([0, 2, 4], np.int64)
    z = np.array([0, 1, 2, 0], np.int32)
    ndk = sampling.doc_topic_counts(doc_ptr, z, K)
    nwk = np.zeros((V, K), np.int32)
    np.add.at(nwk, (words, z), 1)
    nk = nwk.sum(0).astype(np.int32)
    vbeta = V * beta
    n = 40_000
    visits = np.zeros(K ** 4)
    weights = K ** np.arange(4)
    if method == "mh":
        stale = np.array([[5, 0, 1], [0, 0, 3], [2, 7, 0]], np.int32)
        stale_nk = stale.sum(0).astype(np.int32)
        tables = sampling.build_word_alias(stale, stale_nk, beta, vbeta, np.ones(V, np.bool_))
    for it in range(n):
        if method != "mh":
            kernel = sampling.sample_dense if method == "dense" else sampling.sample_sparse
            kernel(doc_ptr, words, z, ndk, nwk, nk, alpha, beta, vbeta, 0, 2, it)
        else:
            sampling.sample_mh(doc_ptr, words, z, ndk, nwk, stale, np.arange(V, dtype=np.int64), nk, stale_nk,
                               *tables, alpha, beta, vbeta, 2, 0, 2, it)
        visits[int(z @ weights)] += 1
    tv = 0.5 * np.abs(visits / n - exact).sum()
    assert tv < 0.035, f"total variation {tv:.4f} between the chain and the exact posterior"


@pytest.mark.parametrize("K", [5, 40, 100])
@pytest.mark.parametrize("kernel", ["sample_dense", "sample_sparse"])
def test_exact_draws_follow_the_conditional(kernel, K):
    """Both forms of the dense sampler (running sum below 32 topics, blocks of 16 above, with a
    partial last block at K=40 and 100) and the sparse one (buckets s, r, q) draw one token's topic
    from the collapsed conditional.

    Document 1 holds a single token, so each sweep over it redraws that token from the same
    conditional given all other tokens (which stay fixed): the draws are i.i.d. from it.
    """
    rng = np.random.default_rng(3)
    V, alpha, beta = 6, 0.3, 0.2
    words = np.concatenate([rng.integers(0, V, 200), [2]]).astype(np.int32)
    doc_ptr = np.array([0, 200, 201], np.int64)
    # a skewed state, so the conditional is far from uniform
    z = np.concatenate([rng.integers(0, max(K // 4, 2), 200), [0]]).astype(np.int32)
    ndk = sampling.doc_topic_counts(doc_ptr, z, K)
    nwk = np.zeros((V, K), np.int32)
    np.add.at(nwk, (words, z), 1)
    nk = nwk.sum(0).astype(np.int32)
    # the exact conditional of token 200 (word 2, document 1 alone) given the others
    nwk_o, nk_o = nwk.copy(), nk.copy()
    nwk_o[2, 0] -= 1
    nk_o[0] -= 1
    p = alpha * (nwk_o[2] + beta) / (nk_o + V * beta)
    p /= p.sum()
    n = 40_000
    draws = np.empty(n, np.int64)
    for it in range(n):
        getattr(sampling, kernel)(doc_ptr, words, z, ndk, nwk, nk, alpha, beta, V * beta, 1, 2, it)
        draws[it] = z[200]
    freq = np.bincount(draws, minlength=K) / n
    tv = 0.5 * np.abs(freq - p).sum()
    assert tv < 0.02 + 0.5 * math.sqrt(K / n), f"K={K}: total variation {tv:.4f} from the exact conditional"
    np.testing.assert_array_equal(nwk.sum(0), nk)


def test_mh_with_tables_over_more_rows_draws_the_same_chain():
    """The worker builds MH alias tables once per tick over all its words and passes each mini-batch
    its rows among them: a table row depends only on that word's counts, so sampling through a
    shuffled superset of rows must give exactly the chain of tables built over the batch's own rows."""
    c = generate(200, 60, 4, 40.0, seed=8)
    runs = []
    for superset in (False, True):
        s, nwk, nk = _model(c, 6, seed=3)
        s.method = "mh"
        for it in range(3):
            stale, stale_nk = nwk.copy(), nk.copy()
            if superset:
                extra = np.random.default_rng(it).integers(0, 9, (25, 6)).astype(np.int32)
                big = np.concatenate([extra, stale])
                perm = np.random.default_rng(10 + it).permutation(big.shape[0])
                tables = s.alias_tables(big[perm], stale_nk)
                rows = np.argsort(perm)[25:].astype(np.int64)  # nwk's row r sits at rows[r]
                s.sweep(nwk, nk, c.words, tables=tables, rows=rows)
            else:
                s.sweep(nwk, nk, c.words, tables=s.alias_tables(stale, stale_nk))
            _consistent(s, nwk, nk, c.words)
        runs.append(s.z.copy())
    np.testing.assert_array_equal(runs[0], runs[1])
    s, nwk, nk = _model(c, 6)
    s.method = "mh"
    with pytest.raises(ValueError, match="pass rows="):
        s.sweep(nwk, nk, c.words, tables=s.alias_tables(nwk[:10].copy(), nk.copy()))


@pytest.mark.parametrize("method", ["dense", "sparse", "mh"])
def test_negative_counts_from_staleness_are_clamped(method):
    c = generate(100, 50, 4, 30.0, seed=6)
    s, nwk, nk = _model(c, 5)
    s.method = method
    nwk[:10] -= 3  # what a stale row with someone else's decrements can look like
    nk[1] = -2
    for _ in range(3):
        s.sweep(nwk, nk, c.words)
    assert s.z.min() >= 0 and s.z.max() < 5
    assert np.isfinite(loglikelihood(s.ndk, nwk, nk, 0.1, 0.05))
    np.testing.assert_array_equal(s.ndk, sampling.doc_topic_counts(s.doc_ptr, s.z, 5))


def _recovery(phi_hat, phi_true):
    perm, dist = match_topics(phi_hat, phi_true)
    return dist.mean(), dist.max()


@pytest.mark.parametrize("method", ["dense", "sparse", "mh"])
def test_fit_recovers_planted_topics_and_loglik_rises(method):
    c = generate(1000, 300, 8, 100.0, alpha=0.05, beta=0.02, seed=5)
    r = fit(c, 10, 60, alpha=0.1, beta=0.01, method=method, mh_steps=4, seed=0)
    mean, worst = _recovery(r.phi(), c.phi)
    assert worst < 0.25 and mean < 0.15, f"{method}: Hellinger mean {mean:.3f} max {worst:.3f}"
    ll = r.loglik
    assert ll[-1] > ll[len(ll) // 2] > ll[0]
    assert sum(b >= a for a, b in zip(ll[:20], ll[1:21], strict=True)) >= 17  # rises steadily early on


def test_fit_recovers_with_exact_k_on_easy_corpus():
    c = generate(3000, 200, 5, 40.0, alpha=0.1, beta=0.05, seed=5)
    r = fit(c, 5, 40, alpha=0.1, beta=0.01, method="dense", seed=1, track_loglik=False)
    mean, worst = _recovery(r.phi(), c.phi)
    assert worst < 0.15 and mean < 0.1, f"Hellinger mean {mean:.3f} max {worst:.3f}"


def test_top_words():
    nwk = np.array([[5, 0], [1, 9], [3, 2]])
    lines = top_words(nwk, ["a", "b", "c"], 2)
    assert lines == ["topic   0 (n=9): a c", "topic   1 (n=11): b c"]


# ------------------------------------------------------------------------------------------------
# worker logic against an in-process stand-in for the client (one worker, exact reads)


def _client(V: int, K: int, summary_k: int | None = None, dtype: str = "int32") -> InProcessClient:
    return InProcessClient(InProcessTable("word_topic", V, K, dtype),
                           InProcessTable("topic_summary", 1, summary_k or K, dtype))


SYN = {"data": "synthetic", "K": 10, "synth_topics": 8, "synth_docs": 1000, "synth_vocab": 300,
       "synth_doc_len": 100.0, "synth_alpha": 0.05, "synth_beta": 0.02, "seed": 5, "beta": 0.01,
       "top_words": 5}


@pytest.mark.parametrize("batches", [1, 4])
def test_train_in_process(tmp_path, monkeypatch, batches):
    monkeypatch.setenv("BOSEN_RUN_DIR", str(tmp_path))
    c = _client(300, 10)
    train(c, {**SYN, "iterations": 30, "clocks_per_epoch": 2, "ll_every": 2, "batches_per_clock": batches})
    wt = c.tables["word_topic"].data
    corpus = generate(1000, 300, 8, 100.0, alpha=0.05, beta=0.02, seed=5)
    # barriers: 1 + staleness ticks before training, staleness after
    assert c.clocks == 1 + 2 + 60 + 2
    work = [r for r in c.reports if "tokens" in r]
    assert len(work) == 60 and sum(r["tokens"] for r in work[:2]) == corpus.n_tokens
    # one get_rows per mini-batch, one per scored tick (its scored words), the final read of those,
    # rank 0's final pass (one chunk at this size)
    reads = c.tables["word_topic"].reads
    assert len(reads) == 60 * batches + 30 + 2
    # a worker reads only rows of words its documents hold, never the whole vocabulary
    held = np.unique(corpus.words)
    assert held.size < 300 and all(np.isin(r, held).all() for r in reads)
    np.testing.assert_array_equal(reads[-2], held)
    ll = [r["objective"] for r in work if "objective" in r]
    assert len(ll) == 30 and ll[-1] > ll[0]
    assert wt.min() >= 0 and wt.sum() == corpus.n_tokens
    np.testing.assert_array_equal(c.tables["topic_summary"].data[0], wt.sum(0))
    final = c.reports[-1]["final_loglik"]
    assert final == pytest.approx(ll[-1], rel=1e-9)  # one worker, exact reads: same state
    mean, worst = _recovery((wt.T + 0.01), corpus.phi)
    assert worst < 0.25 and mean < 0.15
    assert (tmp_path / "topics.txt").read_text().count("\n") == 10
    np.testing.assert_array_equal(np.load(tmp_path / "word_topic.npy"), wt)


@pytest.mark.parametrize("sampler", ["sparse", "mh"])
def test_train_counts_reads_holding_negative_counts(tmp_path, monkeypatch, sampler):
    """``negative_counts``: 0 where every read is a valid count table; the rows read with a negative
    entry where one is planted (an in-process table, so the reads are exactly its contents)."""
    monkeypatch.setenv("BOSEN_RUN_DIR", str(tmp_path))
    args = {**SYN, "iterations": 2, "batches_per_clock": 2, "sampler": sampler}
    c = _client(300, 10)
    train(c, args)
    work = [r for r in c.reports if "tokens" in r]
    assert len(work) == 2 and all(r["negative_counts"] == 0 for r in work)
    c = _client(300, 10)
    c.tables["word_topic"].data[7, 3] = -1000  # far below what the corpus' counts can lift
    c.tables["topic_summary"].data[0, 2] = -10**6
    train(c, args)
    work = [r for r in c.reports if "tokens" in r]
    # every mini-batch reads the summary row; word 7 is read by the batches holding it (and MH's read)
    assert all(r["negative_counts"] >= 2 * (1 + (sampler == "mh")) for r in work), [r["negative_counts"] for r in work]
    assert negative_rows(np.array([[0, 1], [2, -1], [-3, -4]], np.int32)) == 2
    assert negative_rows(np.zeros((0, 4), np.int32)) == 0


def test_train_in_process_mh_builds_alias_tables_once_per_tick(tmp_path, monkeypatch):
    monkeypatch.setenv("BOSEN_RUN_DIR", str(tmp_path))
    c = _client(300, 10)
    train(c, {**SYN, "sampler": "mh", "iterations": 30, "clocks_per_epoch": 2, "ll_every": 2,
              "batches_per_clock": 4})
    wt = c.tables["word_topic"].data
    corpus = generate(1000, 300, 8, 100.0, alpha=0.05, beta=0.02, seed=5)
    # per tick: one read of all the tick's words (the alias tables), one per mini-batch; one per
    # scored tick; the final reads (the scored words, rank 0's pass)
    assert len(c.tables["word_topic"].reads) == 60 * (1 + 4) + 30 + 2
    work = [r for r in c.reports if "tokens" in r]
    assert all(r["alias_s"] > 0 and r["read_s"] > 0 and r["send_s"] > 0 for r in work)
    assert all(r["tick_s"] >= r["compute_s"] for r in work)
    assert wt.min() >= 0 and wt.sum() == corpus.n_tokens
    np.testing.assert_array_equal(c.tables["topic_summary"].data[0], wt.sum(0))
    ll = [r["objective"] for r in work if "objective" in r]
    assert ll[-1] > ll[0]
    mean, worst = _recovery((wt.T + 0.01), corpus.phi)
    assert worst < 0.25 and mean < 0.15


def test_count_changes_is_the_sparse_difference():
    rng = np.random.default_rng(0)
    snap = rng.integers(0, 5, (30, 7)).astype(np.int32)
    cur = snap.copy()
    cur[rng.random(cur.shape) < 0.2] += rng.integers(-3, 4, 1)[0] or 1
    r, k, v = sampling.count_changes(cur, snap)
    want = np.zeros_like(cur)
    want[r, k] = v
    np.testing.assert_array_equal(want, cur - snap)
    assert np.all(v != 0) and r.dtype == np.int64 and k.dtype == np.int64
    assert sampling.count_changes(snap, snap)[0].size == 0


def test_train_reads_uci_file(tmp_path):
    c = generate(200, 80, 4, 30.0, seed=2)
    write_uci(c, tmp_path / "docword.t.txt", tmp_path / "vocab.t.txt")
    fc = _client(80, 4)
    train(fc, {"data": str(tmp_path / "docword.t.txt"), "K": 4, "iterations": 3})
    assert fc.tables["word_topic"].data.sum() == c.n_tokens


@pytest.mark.parametrize("V, K, sk, dtype, args, exc, match", [
    (301, 10, None, "int32", {}, ConfigError, "tables.word_topic.rows=301 but the corpus .* 300 words"),
    (300, 12, None, "int32", {}, ConfigError, "tables.word_topic.cols=12 but app.args.K=10"),
    (300, 10, 9, "int32", {}, ConfigError, "tables.topic_summary.cols=9 but app.args.K=10"),
    (300, 10, None, "float32", {}, ConfigError, "tables.word_topic.dtype=float32"),
    (300, 10, None, "int32", {"topics": 5}, ValueError, "app.args.topics: unknown key"),
    (300, 10, None, "int32", {"K": "ten"}, ValueError, "app.args.K: expected an integer"),
    (300, 10, None, "int32", {"iterations": 0}, ValueError, "app.args.iterations: must be >= 1"),
    (300, 10, None, "int32", {"sampler": "gibbs"}, ValueError, "app.args.sampler"),
])
def test_train_rejects_bad_config(V, K, sk, dtype, args, exc, match):
    with pytest.raises(exc, match=match):
        train(_client(V, K, sk, dtype), {**SYN, "iterations": 1, **args})


def test_train_missing_table_and_bad_file(tmp_path):
    c = _client(300, 10)
    del c.tables["topic_summary"]
    with pytest.raises(ConfigError, match="topic_summary"):
        train(c, {**SYN, "iterations": 1})
    bad = _w(tmp_path / "docword.b.txt", "2\n3\n4\n1 1 2\n")
    with pytest.raises(DataError, match=f"{bad}:5: truncated file"):
        train(_client(3, 10), {"data": str(bad), "K": 10})


def test_args_method_choice():
    assert LDAArgs(K=20).method() == "dense" and LDAArgs(K=63).method() == "dense"
    assert LDAArgs(K=64).method() == "sparse" and LDAArgs(K=1000).method() == "sparse"
    assert LDAArgs(K=100, dense_max_k=200).method() == "dense"
    assert LDAArgs(K=20, sampler="mh").method() == "mh"


def test_mini_batches_default_to_one_only_for_a_lone_worker():
    assert LDAArgs().batches(1) == 1 and LDAArgs().batches(2) == 8 and LDAArgs().batches(16) == 8
    assert LDAArgs(batches_per_clock=3).batches(1) == 3 and LDAArgs(batches_per_clock=3).batches(4) == 3
    with pytest.raises(ValueError, match="batches_per_clock: must be >= 1, or 0"):
        LDAArgs(batches_per_clock=-1)


# ------------------------------------------------------------------------------------------------
# held-out log-likelihood by document completion


def test_completion_loglik_matches_numpy():
    rng = np.random.default_rng(0)
    phi = rng.dirichlet(np.ones(30), size=5).T.copy()  # (W=30, K=5), columns sum to 1
    theta = rng.dirichlet(np.ones(5), size=3)
    ptr = np.array([0, 4, 4, 9], np.int64)
    words = rng.integers(0, 30, size=9).astype(np.int64)
    docs = np.repeat(np.arange(3), np.diff(ptr))
    direct = float(np.sum(np.log(np.sum(theta[docs] * phi[words], axis=1))))
    assert evaluation.completion_loglik(ptr, words, theta, phi) == pytest.approx(direct, rel=1e-12)


def test_fold_in_recovers_the_topic_mix_of_planted_documents():
    corpus = generate(200, 300, 6, 200.0, alpha=0.1, beta=0.02, seed=4)
    phi = corpus.phi.T.copy()  # the true topics, (V, K)
    ptr = corpus.doc_ptr()
    theta = evaluation.fold_in(ptr, corpus.words.astype(np.int64), phi, 0.1, 30, 10, 1)
    np.testing.assert_allclose(theta.sum(axis=1), 1.0, rtol=1e-9)
    assert np.abs(theta - corpus.theta).sum(axis=1).mean() < 0.25  # L1 between topic mixes (max 2)
    uniform = np.full_like(theta, 1 / 6)
    words = corpus.words.astype(np.int64)
    gain = evaluation.completion_loglik(ptr, words, theta, phi) - evaluation.completion_loglik(ptr, words, uniform, phi)
    assert gain > 0.3 * words.size


def test_document_completion_scores_the_unseen_half_with_the_true_model_best():
    corpus = generate(300, 200, 5, 80.0, alpha=0.1, beta=0.05, seed=6)
    dc = DocumentCompletion(corpus, alpha=0.1, beta=0.05, sweeps=20, burn_in=10, seed=3)
    lens = np.diff(corpus.doc_ptr())
    assert dc.tokens == int((lens // 2).sum()) and dc.obs_words.size == corpus.n_tokens - dc.tokens
    # each document's two halves together are its tokens
    d0 = sorted(dc.rows[np.concatenate([dc.obs_words[dc.obs_ptr[0]:dc.obs_ptr[1]],
                                        dc.held_words[dc.held_ptr[0]:dc.held_ptr[1]]])].tolist())
    assert d0 == sorted(corpus.words[:lens[0]].tolist())
    true_counts = np.round(corpus.phi.T * 1e5).astype(np.int32)[dc.rows]  # phi as large counts
    good = dc.loglik(true_counts, true_counts.sum(axis=0)) / dc.tokens
    flat = np.ones_like(true_counts)
    bad = dc.loglik(flat, np.full(5, 200)) / dc.tokens  # every one of the V = 200 words counted once
    assert bad == pytest.approx(-np.log(200), abs=0.01)  # uniform topics: every word 1/V
    assert good > bad + 0.3


def test_train_in_process_reports_heldout_loglik_of_the_table_it_read(tmp_path):
    corpus = generate(240, 120, 4, 50.0, alpha=0.1, beta=0.05, seed=8)
    write_uci(corpus.subset(0, 200), tmp_path / "docword.t.txt")
    write_uci(corpus.subset(200, 240), tmp_path / "docword.t-heldout.txt")
    c = _client(120, 4)
    train(c, {"data": str(tmp_path / "docword.t.txt"), "test_data": str(tmp_path / "docword.t-heldout.txt"),
              "K": 4, "iterations": 6, "eval_every": 2, "foldin_sweeps": 8, "save_model": False})
    held = [r for r in c.reports if "heldout_ll" in r]
    assert len(held) == 3
    wt, ts = c.tables["word_topic"].data, c.tables["topic_summary"].data[0]
    dc = DocumentCompletion(corpus.subset(200, 240), 0.1, 0.1, 8, 4, 1)  # seed * 7919 + rank + 1
    assert held[-1]["heldout_tokens"] == dc.tokens
    assert held[-1]["heldout_ll"] == pytest.approx(dc.loglik(wt[dc.rows], ts), rel=1e-12)
    with pytest.raises(DataError, match="a vocabulary of 7 words, but the training corpus has 120"):
        write_uci(generate(5, 7, 2, 10.0, seed=1), tmp_path / "docword.small.txt")
        train(_client(120, 4), {"data": str(tmp_path / "docword.t.txt"), "K": 4, "iterations": 1,
                                "test_data": str(tmp_path / "docword.small.txt")})


# ------------------------------------------------------------------------------------------------
# end to end through `bosen launch` (2 workers, SSP staleness 2)


def _launch(tmp_path: Path, V: int, K: int, args: dict, timeout: float = 60,
            comm: dict | None = None, servers: int = 1, workers: int = 2, staleness: int = 2,
            word_topic: dict | None = None, name: str = "run") -> tuple[subprocess.CompletedProcess, Path]:
    cfg = {
        "cluster": {"servers": ["127.0.0.1:0"] * servers, "workers": workers},
        "consistency": {"staleness": staleness},
        "tables": {"word_topic": {"rows": V, "cols": K, "dtype": "int32", **(word_topic or {})},
                   "topic_summary": {"rows": 1, "cols": K, "dtype": "int32"}},
        "app": {"module": "bosen.apps.lda", "args": args},
    }
    if comm:
        cfg["comm"] = comm
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    run_dir = tmp_path / name
    p = run_cmd([PY, "-m", "bosen", "launch", str(path), "--workers", str(workers),
                "--run-dir", str(run_dir), "--no-plot"], timeout=timeout)
    return p, run_dir


def _clocks(run_dir: Path) -> list[dict]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return sorted((x for x in lines if x.get("kind") == "clock"), key=lambda x: x["clock"])


@pytest.mark.timeout(90)
@pytest.mark.slow
def test_e2e_two_workers_ssp_recovers_planted_topics(tmp_path):
    p, run_dir = _launch(tmp_path, 300, 10, {**SYN, "iterations": 40})
    assert p.returncode == 0, f"launch failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    corpus = generate(1000, 300, 8, 100.0, alpha=0.05, beta=0.02, seed=5)
    clocks = _clocks(run_dir)
    work = [c for c in clocks if "tokens" in c]
    assert len(work) == 40 and all(c["workers"] == 2 and c["tokens"] == corpus.n_tokens for c in work)
    ll = [c["objective"] for c in work]
    mid = ll[len(ll) // 2]
    # converged by mid-run: the second half wobbles around the optimum (within 1%), it does not fall back
    assert mid > ll[0] and ll[-1] > mid - 0.01 * abs(mid), ll
    final = clocks[-1]["final_loglik"]
    assert final > ll[0]
    # the PS holds exactly the corpus' counts after the closing barrier
    wt = np.load(run_dir / "word_topic.npy")
    assert wt.min() >= 0 and wt.sum() == corpus.n_tokens
    # Which interleaving of the two workers' ticks SSP allows varies from run to run, and now and then
    # (about 1 run in 15 with cold numba caches, as in CI, with this code and the code before it) two
    # planted topics end up sharing one learned topic (Hellinger ~0.45 and ~0.94 for those two, ~0.05
    # for the rest): a local optimum of the sampler, not lost counts, which are checked exactly above.
    # A broken PS spoils every topic, so 6 of the 8 planted topics must be recovered closely.
    _, dist = match_topics(wt.T + 0.01, corpus.phi)
    best6 = np.sort(dist)[:6]
    assert best6.max() < 0.25 and best6.mean() < 0.15, f"Hellinger per planted topic {np.round(dist, 3)}"
    assert (run_dir / "topics.txt").read_text().startswith("topic   0")


@pytest.mark.timeout(90)
@pytest.mark.slow
def test_e2e_managed_comm_mini_batches_read_mid_clock_values_and_keep_counts_exact(tmp_path):
    """Mini-batches on the live cache under managed communication: reads see rows pushed mid-clock,
    and the table still ends with exactly the corpus' counts."""
    p, run_dir = _launch(tmp_path, 300, 10, {**SYN, "iterations": 10, "batches_per_clock": 8},
                         comm={"client_bandwidth_mbps": 50, "server_bandwidth_mbps": 50, "priority": "relative"})
    assert p.returncode == 0, f"launch failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    corpus = generate(1000, 300, 8, 100.0, alpha=0.05, beta=0.02, seed=5)
    clocks = _clocks(run_dir)
    work = [c for c in clocks if "tokens" in c]
    assert len(work) == 10 and all(c["tokens"] == corpus.n_tokens for c in work)
    assert work[-1]["objective"] > work[0]["objective"]
    assert work[-1]["rows_read_early"] > 0 and work[-1]["rows_sent_budgeted"] > 0, work[-1]
    wt = np.load(run_dir / "word_topic.npy")
    assert wt.min() >= 0 and wt.sum() == corpus.n_tokens
    np.testing.assert_array_equal(wt.sum(axis=1), np.bincount(corpus.words, minlength=300))


@pytest.mark.timeout(90)
@pytest.mark.slow
@pytest.mark.parametrize("method", ["sparse", "mh"])
def test_e2e_managed_comm_at_a_high_budget_reads_no_negative_counts(tmp_path, method):
    """Issue 27.4: 2 servers, 2 workers, managed communication at 3000 Mbps in chunks of 4 rows. Each
    worker's share of a count is a count (never negative after any of its mini-batches), so a read
    that is a server value (prefix sums of each worker's updates) plus exactly the reader's own
    pending changes never holds a negative count: every clock record reports 0."""
    p, run_dir = _launch(tmp_path, 300, 10, {**SYN, "iterations": 8, "batches_per_clock": 8, "sampler": method},
                         comm={"client_bandwidth_mbps": 3000, "server_bandwidth_mbps": 3000, "priority": "relative",
                               "client_send_rows": 4, "server_push_rows": 4}, servers=2)
    assert p.returncode == 0, f"launch failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    work = [c for c in _clocks(run_dir) if "tokens" in c]
    assert len(work) == 8 and all(c["workers"] == 2 for c in work)
    assert [c["negative_counts"] for c in work] == [0] * 8
    assert work[-1]["rows_read_early"] > 0 and work[-1]["rows_sent_budgeted"] > 0, work[-1]
    wt = np.load(run_dir / "word_topic.npy")
    assert wt.min() >= 0 and wt.sum() == generate(1000, 300, 8, 100.0, alpha=0.05, beta=0.02, seed=5).n_tokens


@pytest.mark.timeout(90)
@pytest.mark.slow
def test_e2e_uci_file_finer_clocks_mh(tmp_path):
    c = generate(600, 400, 6, 60.0, alpha=0.1, beta=0.05, seed=9)
    write_uci(c.subset(0, 500), tmp_path / "docword.e.txt", tmp_path / "vocab.e.txt")
    write_uci(c.subset(500, 600), tmp_path / "docword.e-heldout.txt")
    c = c.subset(0, 500)
    args = {"data": str(tmp_path / "docword.e.txt"), "K": 8, "iterations": 10, "clocks_per_epoch": 2,
            "sampler": "mh", "beta": 0.01, "test_data": str(tmp_path / "docword.e-heldout.txt"), "eval_every": 4}
    p, run_dir = _launch(tmp_path, 400, 8, args)
    assert p.returncode == 0, f"launch failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    work = [x for x in _clocks(run_dir) if "tokens" in x]
    assert len(work) == 20 and sum(x["tokens"] for x in work[:2]) == c.n_tokens
    assert work[-1]["objective"] > work[0]["objective"]
    assert "w00" in (run_dir / "topics.txt").read_text()  # vocabulary names from vocab.e.txt
    held = [x for x in work if "heldout_ll_per_token" in x]
    assert len(held) == 5 and all(x["workers"] == 2 for x in held)  # ticks 4, 8, ..., 20 (the last)
    assert held[-1]["heldout_ll_per_token"] > held[0]["heldout_ll_per_token"] > -np.log(400)
    assert "ll per token" in p.stdout


@pytest.mark.timeout(90)
@pytest.mark.slow
def test_e2e_malformed_input_fails_naming_file_and_line(tmp_path):
    bad = _w(tmp_path / "docword.bad.txt", "2\n3\n4\n1 1 2\n1 x 1\n2 2 5\n2 3 1\n")
    p, run_dir = _launch(tmp_path, 3, 4, {"data": str(bad), "K": 4})
    assert p.returncode != 0
    out = p.stdout + p.stderr + "".join(f.read_text() for f in (run_dir / "logs").glob("worker-*.log"))
    assert f"{bad}:5: field 2 (wordID) is not an integer" in out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sampler", ["dense", "sparse"])
@pytest.mark.slow
def test_e2e_resume_continues_the_chain_exactly(tmp_path, sampler):
    """One worker at staleness 0 is deterministic, so a job stopped after its checkpoint at clock 6
    and resumed ends with exactly the counts of the job that ran through (topic assignments,
    doc-topic counts, the sweep count and the sparse sampler's phase come back from the worker's part;
    one server: the worker's state is the point)."""
    cfg = {"cluster": {"servers": ["127.0.0.1:0"], "workers": 1},
           "consistency": {"staleness": 0},
           "tables": {"word_topic": {"rows": 300, "cols": 10, "dtype": "int32"},
                      "topic_summary": {"rows": 1, "cols": 10, "dtype": "int32"}},
           "app": {"module": "bosen.apps.lda", "args": {**SYN, "iterations": 12, "batches_per_clock": 2,
                                                         "sampler": sampler}},
           "checkpoint": {"every_clocks": 3}}
    da, db = whole_and_resumed(cfg, tmp_path, 6, 1, 1)
    np.testing.assert_array_equal(np.load(db / "word_topic.npy"), np.load(da / "word_topic.npy"))
    a, b = _clocks(da), _clocks(db)
    assert [x["clock"] for x in b] == [x["clock"] for x in a]
    assert [x.get("objective") for x in b] == [x.get("objective") for x in a]  # the curve continues the original


def test_mean_list_length_matches_numpy():
    c = generate(50, 40, 4, 30.0, seed=3)
    s, nwk, nk = _model(c, 9)
    ptr = s.doc_ptr
    want = (nwk > 0).sum(1)[c.words[ptr[5]:ptr[30]]].mean()
    assert sampling.mean_list_length(nwk, c.words, ptr, 5, 30) == pytest.approx(want)
    assert sampling.dense_is_cheaper(9.0, 9) and not sampling.dense_is_cheaper(1.0, 1000)


def test_sparse_sampler_starts_dense_then_switches_and_stays_consistent():
    """The sparse method sweeps densely while the word lists are long (after a random start), then
    sparsely for good; counts stay exact across the switch, and the chain improves as a dense one does."""
    c = generate(400, 800, 4, 80.0, alpha=0.1, beta=0.05, seed=4)
    K = 100  # far more topics than the corpus uses: lists start long (~40 entries), end short
    s, nwk, nk = _model(c, K)
    s.method, s.dense_phase = "sparse", True
    used = []
    for _ in range(12):
        used.append(s.sweep(nwk, nk, c.words)["dense_sweeps"])
        _consistent(s, nwk, nk, c.words)
    assert used[0] == 1.0 and used[-1] == 0.0
    assert used == sorted(used, reverse=True)  # one switch, never back
    assert not s.dense_phase
    # the same number of sweeps of the plain dense sampler reaches a comparable log-likelihood
    d, dn, dk = _model(c, K)
    for _ in range(12):
        d.sweep(dn, dk, c.words)
    ll_s = loglikelihood(s.ndk, nwk, nk, 0.1, 0.05)
    ll_d = loglikelihood(d.ndk, dn, dk, 0.1, 0.05)
    assert abs(ll_s - ll_d) < 0.02 * abs(ll_d)


def test_sparse_word_lists_survive_long_runs_of_one_word():
    """Many tokens of a few words in one document: the sorted word lists see long runs of equal counts,
    removals from the middle and additions that move entries up; the counts must come back exact."""
    rng = np.random.default_rng(0)
    words = np.sort(rng.integers(0, 3, 600)).astype(np.int64)
    doc_ptr = np.array([0, 200, 600], np.int64)
    K = 12
    z = rng.integers(0, K, 600).astype(np.int32)
    ndk = sampling.doc_topic_counts(doc_ptr, z, K)
    nwk = np.zeros((3, K), np.int32)
    np.add.at(nwk, (words, z), 1)
    nk = nwk.sum(0).astype(np.int32)
    for it in range(20):
        sampling.sample_sparse(doc_ptr, words, z, ndk, nwk, nk, 0.1, 0.01, 0.03, 0, 2, it)
        want = np.zeros_like(nwk)
        np.add.at(want, (words, z), 1)
        np.testing.assert_array_equal(nwk, want)
        np.testing.assert_array_equal(ndk, sampling.doc_topic_counts(doc_ptr, z, K))
        np.testing.assert_array_equal(nk, np.bincount(z, minlength=K))


def test_sparse_sweep_reads_no_word_rows_of_tokens_outside_its_documents():
    """A worker's token -> row map holds rows of other mini-batches' reads past the range swept; the
    sweep must not look at them (an index far out of the block would fault if it did)."""
    c = generate(40, 30, 3, 20.0, seed=2)
    s, nwk, nk = _model(c, 70)
    ptr = s.doc_ptr
    words = c.words.astype(np.int64).copy()
    words[ptr[10]:] = 1 << 40
    mine = nwk.copy()
    s.method, s.dense_phase = "sparse", False
    s.sweep(mine, nk, words, 0, 10)
    assert (s.z[ptr[10]:] == _model(c, 70)[0].z[ptr[10]:]).all()


# ------------------------------------------------------------------------------------------------
# the objective from a consistent state (consistent_ll): the servers' tables at each scored clock


def _consistent_ll(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "consistent-ll.jsonl").read_text().splitlines() if x.strip()]


def test_local_counts_dense_and_sparse_are_the_samplers_counts():
    c = generate(200, 300, 5, 50.0, alpha=0.1, beta=0.05, seed=3)
    s = Sampler(c, 10, 0.1, 0.01, 300, "dense", seed=1)
    want = np.zeros((300, 10), np.int64)
    w, k, n = s.word_topic_coo()
    want[w, k] = n
    few = Sampler(c.subset(0, 5), 10, 0.1, 0.01, 300, "dense", seed=1)  # few tokens: sparse is smaller
    for smp, form in ((s, "dense"), (few, "keys")):
        got = consistent.local_counts(smp.words, smp.z, 10, 300)
        assert form in got
        dense = got["dense"] if "dense" in got else np.bincount(got["keys"], got["counts"], 3000).reshape(300, 10)
        if smp is s:
            np.testing.assert_array_equal(dense, want)
        else:
            assert dense.sum() == smp.z.size and (dense.sum(0) == smp.topic_counts()).all()


def test_consistent_ll_in_process_equals_the_single_workers_objective(tmp_path, monkeypatch):
    """One worker with exact reads: its own view is the servers' state, so both objectives agree at
    every scored clock, and the last one is final_loglik; the count files are gone afterwards."""
    monkeypatch.setenv("BOSEN_RUN_DIR", str(tmp_path))
    c = _client(300, 10)
    train(c, {**SYN, "iterations": 6, "clocks_per_epoch": 2, "ll_every": 2, "consistent_ll": True})
    work = [r for r in c.reports if "objective" in r]
    cons = _consistent_ll(tmp_path)
    assert [x["clock"] for x in cons] == [r["clock"] for r in work] and len(cons) == 6
    for x, r in zip(cons, work, strict=True):
        assert x["objective"] == pytest.approx(r["objective"], rel=1e-12)
        assert r["consistent_ll_s"] >= 0
    assert cons[-1]["objective"] == pytest.approx(c.reports[-1]["final_loglik"], rel=1e-12)
    assert not (tmp_path / "consistent-ll").exists()


def test_consistent_ll_errors(tmp_path, monkeypatch):
    monkeypatch.delenv("BOSEN_RUN_DIR", raising=False)
    with pytest.raises(ConfigError, match=r"consistent_ll: needs \$BOSEN_RUN_DIR"):
        train(_client(300, 10), {**SYN, "iterations": 1, "consistent_ll": True})
    with pytest.raises(ValueError, match="app.args.consistent_ll: expected true or false"):
        train(_client(300, 10), {**SYN, "iterations": 1, "consistent_ll": "yes"})
    folder = tmp_path / "consistent-ll"
    folder.mkdir()
    consistent.save(folder, 5, 0, {"dense": np.ones((3, 2), np.int32)}, -1.0)
    with pytest.raises(DataError, match="1 of the workers' count files are missing, e.g. .*0000005-00001.npz"):
        consistent.combine(folder, [5], [5], 2, 3, 2, 0.1)


@pytest.mark.timeout(90)
@pytest.mark.slow
def test_e2e_consistent_ll_per_scored_clock_ends_at_final_loglik(tmp_path):
    """Two workers under SSP: one consistent objective per scored clock, the last equal to the
    final_loglik of the servers' final table, and close to (not far from) the workers' own view."""
    p, run_dir = _launch(tmp_path, 300, 10, {**SYN, "iterations": 6, "clocks_per_epoch": 2, "ll_every": 2,
                                             "consistent_ll": True})
    assert p.returncode == 0, f"launch failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    clocks = _clocks(run_dir)
    scored = [c for c in clocks if "objective" in c]
    cons = _consistent_ll(run_dir)
    assert [x["clock"] for x in cons] == [c["clock"] for c in scored] and len(cons) == 6
    assert all(c["consistent_ll_s"] < 1.0 for c in scored)
    final = clocks[-1]["final_loglik"]
    assert cons[-1]["objective"] == pytest.approx(final, rel=1e-12)
    assert cons[-1]["ll_doc"] == pytest.approx(scored[-1]["ll_doc"], rel=1e-12)  # exact part
    assert cons[-1]["objective"] > cons[0]["objective"]
    # the workers' own view differs only in the word part. Each worker scores words its documents hold:
    # its own counts as of the end of the tick, the other worker's as its cache has them, mostly up to
    # `staleness` ticks old and less concentrated than the state at the clock while the objective climbs
    # (below it), but ahead of it where the other worker ran ahead (above it). Measured over 16 runs
    # under load: -8.6% to +2.4% (scoring w % P == rank, a worker's share of the whole vocabulary, it
    # was -7.5% to -0.1%: rows a worker does not hold carry only the other's older counts)
    for x, c in zip(cons, scored, strict=True):
        assert x["ll_doc"] == pytest.approx(c["ll_doc"], rel=1e-12)
        assert c["objective"] <= x["objective"] + 0.04 * abs(x["objective"]), (x, c)
        assert c["objective"] > x["objective"] - 0.2 * abs(x["objective"]), (x, c)
    assert not (run_dir / "consistent-ll").exists()


def test_convergence_read_run_uses_the_consistent_objective(tmp_path):
    """bench.convergence's per-epoch curve: the consistent objective where the run has one (targets
    and epochs-to-target use it), the workers' view kept beside it; without one, the workers' view."""
    from bench.convergence.curves import read_run  # pyproject's pytest pythonpath: the checkout
    from bosen.jobs.job import JobRun

    recs = [{"kind": "clock", "clock": c, "time": float(c), "objective": -100.0 + c, "bytes_sent": c}
            for c in (3, 4, 5, 6)] + [{"kind": "clock", "clock": 9, "time": 9.0, "final_loglik": -1.0}]
    job = JobRun(tmp_path, 0, 10.0, tmp_path / "launch.log", recs)
    plain = read_run(job, "BS", 0, 2, 2, "last", True, {})
    assert plain.objective == plain.objective_worker_view == [-96.0, -94.0]
    _w(tmp_path / "consistent-ll.jsonl", "".join(json.dumps({"clock": c, "objective": -90.0 + c}) + "\n"
                                                   for c in (3, 4, 5, 6)))
    run = read_run(job, "BS", 0, 2, 2, "last", True, {})
    assert run.objective == [-86.0, -84.0] and run.objective_worker_view == [-96.0, -94.0]
    assert run.epochs_to(-85.0) == 2 and run.failure is None


def test_sparse_word_lists_are_the_batch_rows_sorted_stably():
    """The sparse sampler's lists: only the rows the swept tokens use, each its positive counts in
    decreasing order with ties in topic order (what a stable argsort gives), room for one new entry per
    token of the word; a row no swept token uses gets none."""
    rng = np.random.default_rng(4)
    R, K = 30, 17
    nwk = rng.integers(-1, 4, (R, K)).astype(np.int32)
    nwk[5] = 0
    words = rng.integers(0, R, 400).astype(np.int64)
    a, b = 100, 250
    wn, off, wl = sampling._word_lists(nwk, words, a, b)
    used = np.bincount(words[a:b], minlength=R)
    for r in range(R):
        lst = wl[off[r]:off[r] + wn[r]]
        if used[r] == 0:
            assert wn[r] == 0 and off[r + 1] == off[r]
            continue
        pos = np.flatnonzero(nwk[r] > 0)
        want = pos[np.argsort(-nwk[r, pos], kind="stable")]
        np.testing.assert_array_equal(lst[:, 0], want)
        np.testing.assert_array_equal(lst[:, 1], nwk[r, want])
        assert off[r + 1] - off[r] == min(K, pos.size + used[r])


def test_sparse_sweep_draws_are_unchanged_by_its_list_building():
    """The chain is the same draw for draw as the sampler's before its lists were built per batch (the
    digest of z and the counts after 30 sweeps of 3 mini-batches each, in a worker's layout: each batch's
    rows read, a token -> local row map pointing far out for tokens outside it, a stale negative count),
    recorded from that sampler (apps/lda/sampling.py at f1e54e2)."""
    import hashlib
    c = generate(60, 50, 8, 40.0, seed=11)
    K, V = 24, 50
    ptr = c.doc_ptr().astype(np.int64)
    words = c.words.astype(np.int64)
    z = np.empty(len(words), np.int32)
    sampling.random_init(z, K, 3)
    ndk = sampling.doc_topic_counts(ptr, z, K)
    nwk = np.zeros((V, K), np.int32)
    np.add.at(nwk, (words, z), 1)
    nk = nwk.sum(0).astype(np.int32)
    nwk[7, 3] -= 2
    for it in range(30):
        for lo, hi in ((0, 17), (17, 40), (40, 60)):
            rows, loc = np.unique(words[ptr[lo]:ptr[hi]], return_inverse=True)
            local_of = np.full(len(words), 10**6, np.int64)
            local_of[ptr[lo]:ptr[hi]] = loc
            local = nwk[rows].copy()
            sampling.sample_sparse(ptr, local_of, z, ndk, local, nk, 0.1, 0.05, V * 0.05, lo, hi, it * 7 + lo)
            nwk[rows] = local
    assert hashlib.sha256(z.tobytes() + nwk.tobytes()).hexdigest()[:16] == "5e83fb4571233f9b"


def test_bench_job_profile_splits_a_tick_by_thread_and_phase():
    """bench/apps: an LDA job run with metrics.profile reports, per clock, the worker's kernel (wall and
    CPU), reads, buffering and clock, the communication thread's sends and the server's applies."""
    from bench.apps import tickprofile
    from bench.apps.lda import run_lda_job
    args = {"data": "synthetic", "synth_docs": 60, "synth_vocab": 80, "synth_topics": 5, "synth_doc_len": 30.0,
            "K": 8, "alpha": 0.1, "beta": 0.1, "iterations": 4, "test_data": "", "eval_every": 0, "ll_every": 4,
            "save_model": False, "top_words": 2}
    r = run_lda_job(args, 80, 8, 1, timeout=180)
    p = r["profile"]
    assert p is not None and p["clocks"] >= 3
    w = p["worker"]
    assert {"kernel", "read", "buffer", "clock", "app rest (delta, eval)"} <= set(w)
    assert 0 < w["kernel"]["cpu_ms"] <= w["kernel"]["wall_ms"] * 1.05 + 0.1
    assert w["kernel"]["wall_ms"] == pytest.approx(r["compute_s"] * 1e3 / p["clocks"], rel=1e-3, abs=1e-3)
    # the server applies updates from INC and from the end-of-tick FLUSH (every table and the clock in one)
    applied = sum(p["server0"].get(kind, {}).get("cpu_ms", 0.0) for kind in ("inc", "flush"))
    assert w["buffer"]["cpu_ms"] > 0 and "send" in p["comm"] and applied > 0
    lines = tickprofile.table(p).splitlines()
    assert lines[0].startswith("thread") and any(line.startswith(("server0  inc", "server0  flush")) for line in lines)


# ------------------------------------------------------------------------------------------------
# large vocabularies (issue 29): a worker holds and scores only rows of its own words


@pytest.mark.parametrize("method", ["dense", "sparse", "mh"])
def test_train_in_process_objective_is_the_whole_models_bit_for_bit(tmp_path, monkeypatch, method):
    """One worker, one mini-batch a tick: the same chain as ``fit`` on the whole model (its seed is
    the worker's), so every per-tick objective, summed over the worker's scored words only, and the
    final one equal the whole table's log p(w, z) exactly."""
    monkeypatch.setenv("BOSEN_RUN_DIR", str(tmp_path))
    c = _client(300, 10)
    train(c, {**SYN, "iterations": 5, "batches_per_clock": 1, "sampler": method})
    ll = [r["objective"] for r in c.reports if "objective" in r]
    corpus = generate(1000, 300, 8, 100.0, alpha=0.05, beta=0.02, seed=5)
    f = fit(corpus, 10, 5, 0.1, 0.01, method, 4, 5 * 7919 + 1)
    assert ll == f.loglik
    assert c.reports[-1]["final_loglik"] == f.loglik[-1]
    np.testing.assert_array_equal(np.load(tmp_path / "word_topic.npy"), f.nwk)


@pytest.mark.parametrize("P", [1, 2, 3, 5])
def test_scored_words_split_the_corpus_words_among_workers(P):
    """Each word some document holds is scored by exactly one worker, one whose documents hold it, so
    the workers' word parts add up to the whole table's."""
    corpus = generate(120, 400, 5, 20.0, alpha=0.1, beta=0.05, seed=4)
    held = corpus_words(corpus)
    assert held.size < 400  # words no document holds: nobody scores them
    parts = []
    for rank in range(P):
        lo, hi = corpus.doc_range(rank, P)
        mine = scored_words(corpus, lo, hi)
        assert mine.dtype == np.int64 and np.all(np.diff(mine) > 0)
        assert np.isin(mine, corpus.subset(lo, hi).words).all()
        parts.append(mine)
    together = np.concatenate(parts)
    assert together.size == held.size
    np.testing.assert_array_equal(np.sort(together), held)
    rng = np.random.default_rng(1)
    nwk = np.zeros((400, 6), np.int32)
    nwk[held] = rng.integers(0, 9, (held.size, 6))
    whole = evaluation.loglik_words(nwk, 0.01, np.ones(400, np.bool_))
    split = sum(evaluation.loglik_words(nwk[w], 0.01, np.ones(w.size, np.bool_)) for w in parts)
    assert split == pytest.approx(whole, rel=1e-12)


@pytest.mark.parametrize("block", [1, 3, 7, 50, 200])
def test_top_words_in_blocks_is_one_sort_of_the_whole_table(block):
    rng = np.random.default_rng(block)
    nwk = rng.integers(-1, 4, (60, 5))  # many ties, and negatives
    top = TopWords(5, 4)
    for first in range(0, 60, block):
        top.add(first, nwk[first:first + block])
    want = np.argsort(-nwk, axis=0, kind="stable")[:4]
    np.testing.assert_array_equal(top.ids, want)
    np.testing.assert_array_equal(top.total, nwk.sum(axis=0))
    assert top.negative == int((nwk < 0).sum())
    names = [f"n{i}" for i in range(60)]
    assert top.lines(names) == top_words(nwk, names, 4)
    assert top.lines(None)[0].split(": ")[1].split() == [f"w{i}" for i in want[:, 0]]


def test_consistent_combine_scores_the_dense_sum_exactly(tmp_path):
    """The workers' files summed by key, dense and sparse forms mixed, score exactly as the V x K sum."""
    rng = np.random.default_rng(2)
    V, K = 50, 4
    folder = tmp_path / "c"
    folder.mkdir()
    parts = [np.where(rng.random((V, K)) < 0.3, rng.integers(1, 30, (V, K)), 0).astype(np.int32) for _ in range(3)]
    consistent.save(folder, 7, 0, {"dense": parts[0]}, -1.5)
    for r in (1, 2):
        keys = np.flatnonzero(parts[r])
        consistent.save(folder, 7, r, {"keys": keys, "counts": parts[r].reshape(-1)[keys]}, -2.0)
    (rec,) = consistent.combine(folder, [7], [7], 3, V, K, 0.1)
    total = sum(parts)
    want = (evaluation.loglik_words(total, 0.1, np.ones(V, np.bool_))
            + evaluation.loglik_summary(total.sum(axis=0).astype(np.int32), V, 0.1))
    assert rec["ll_word"] == want and rec["ll_doc"] == -5.5


def _client_stats(run_dir: Path) -> dict[int, dict]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {x["rank"]: x["tables"]["word_topic"] for x in lines if x.get("kind") == "client"}


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_e2e_sparse_word_topic_gives_the_dense_tables_results(tmp_path):
    """One worker at staleness 0 (deterministic), one server (a sparse table partitioned across servers:
    tests/server/test_sparse_storage.py): a word_topic with ``storage: sparse`` gives the dense table's
    objectives, final log-likelihood and counts bit for bit, and the client holds only the rows of words
    the corpus holds."""
    args = {**SYN, "iterations": 4, "batches_per_clock": 2, "ll_every": 1}
    runs = {}
    for storage in ("dense", "sparse"):
        p, run_dir = _launch(tmp_path, 300, 10, args, workers=1, staleness=0,
                             word_topic={"storage": storage}, name=storage)
        assert p.returncode == 0, f"launch failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
        runs[storage] = run_dir
    a, b = _clocks(runs["dense"]), _clocks(runs["sparse"])
    assert len([x for x in a if "objective" in x]) == 4
    assert [x.get("objective") for x in b] == [x.get("objective") for x in a]
    assert b[-1]["final_loglik"] == a[-1]["final_loglik"]
    np.testing.assert_array_equal(np.load(runs["sparse"] / "word_topic.npy"), np.load(runs["dense"] / "word_topic.npy"))
    held = corpus_words(generate(1000, 300, 8, 100.0, alpha=0.05, beta=0.02, seed=5))
    assert _client_stats(runs["sparse"])[0]["rows_held"] == held.size < 300


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_e2e_two_workers_hold_only_their_words_and_sum_the_exact_objective(tmp_path):
    """2 workers, a sparse word_topic: rank 1 holds exactly the rows of its documents' words (sampling
    and scoring), rank 0 those of the corpus' words (its final pass), and the workers' final parts sum
    to the objective of the servers' final tables (the consistent one at the last clock)."""
    p, run_dir = _launch(tmp_path, 300, 10, {**SYN, "iterations": 4, "consistent_ll": True},
                         word_topic={"storage": "sparse"})
    assert p.returncode == 0, f"launch failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    corpus = generate(1000, 300, 8, 100.0, alpha=0.05, beta=0.02, seed=5)
    lo, hi = corpus.doc_range(1, 2)
    stats = _client_stats(run_dir)
    assert stats[1]["rows_held"] == np.unique(corpus.subset(lo, hi).words).size
    assert stats[0]["rows_held"] == corpus_words(corpus).size
    final = _clocks(run_dir)[-1]["final_loglik"]
    assert _consistent_ll(run_dir)[-1]["objective"] == pytest.approx(final, rel=1e-12)
    wt = np.load(run_dir / "word_topic.npy")
    np.testing.assert_array_equal(wt.sum(axis=1), np.bincount(corpus.words, minlength=300))



def test_final_pass_reads_blocks_of_the_corpus_words_and_writes_the_whole_table(tmp_path, monkeypatch):
    """Rank 0's final pass in blocks of 7 word ids (``FINAL_CHUNK_BYTES`` made small): it reads only
    rows of the corpus' words, at most a block at a time, and writes the V x K table and top words
    that one read of the whole table gives."""
    from bosen.apps.lda import worker

    monkeypatch.setattr(worker, "FINAL_CHUNK_BYTES", 7 * 8 * 10)
    monkeypatch.setenv("BOSEN_RUN_DIR", str(tmp_path))
    c = _client(300, 10)
    train(c, {**SYN, "iterations": 3})
    reads = c.tables["word_topic"].reads
    corpus = generate(1000, 300, 8, 100.0, alpha=0.05, beta=0.02, seed=5)
    held = corpus_words(corpus)
    blocks = reads[-np.unique(held // 7).size:]  # one read per block holding a corpus word
    assert all(r.size <= 7 and r[-1] // 7 == r[0] // 7 for r in blocks)
    np.testing.assert_array_equal(np.concatenate(blocks), held)
    wt = c.tables["word_topic"].data
    np.testing.assert_array_equal(np.load(tmp_path / "word_topic.npy"), wt)
    want = top_words(wt.astype(np.int64), corpus.vocab, 5)
    assert (tmp_path / "topics.txt").read_text().splitlines() == want


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_e2e_cache_rows_below_the_corpus_words_keeps_everything_exact(tmp_path):
    """A sparse word_topic with ``cache_rows`` (120) below what a worker must hold: its own words (the
    mini-batches' views, kept across ticks, pin them) and, at rank 0, the corpus' 209 in one block of
    the final pass. The client goes past the bound (counted) rather than fail, and the counts and the
    objective stay exact."""
    p, run_dir = _launch(tmp_path, 300, 10, {**SYN, "iterations": 4, "consistent_ll": True},
                         word_topic={"storage": "sparse", "cache_rows": 120})
    assert p.returncode == 0, f"launch failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    corpus = generate(1000, 300, 8, 100.0, alpha=0.05, beta=0.02, seed=5)
    stats = _client_stats(run_dir)
    assert stats[0]["cache_over_limit"] > 0 and stats[0]["rows_held"] > 120, stats
    final = _clocks(run_dir)[-1]["final_loglik"]
    assert _consistent_ll(run_dir)[-1]["objective"] == pytest.approx(final, rel=1e-12)
    wt = np.load(run_dir / "word_topic.npy")
    np.testing.assert_array_equal(wt.sum(axis=1), np.bincount(corpus.words, minlength=300))
    assert [c["negative_counts"] for c in _clocks(run_dir) if "tokens" in c] == [0] * 4
