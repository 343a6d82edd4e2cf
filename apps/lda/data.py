"""Corpora for LDA: UCI bag-of-words and LDA-C readers, a generator with planted topics, writers.

Every corpus becomes one representation, :class:`Corpus`: flat int32 token arrays (document id and
word id per token, sorted by document then word), so the worker, the tests and the benchmark share it
and nothing downstream loops over tokens in Python. Parsing runs in numba over the raw bytes, which
is what makes a 100M-token file (NYTimes) readable in seconds; every malformed input fails with a
:class:`DataError` that names the file and the 1-based line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numba import njit

from bosen.apps import textparse as tp
from bosen.errors import DataError

# ----------------------------------------------------------------------------------------------
# the corpus


@dataclass
class Corpus:
    """Tokens of a bag-of-words corpus as flat arrays (one entry per token occurrence).

    ``docs`` is non-decreasing, and within a document ``words`` is non-decreasing, which is the
    order the ``lda`` package uses too (so benchmarks feed both samplers identical token streams).
    ``phi``/``theta`` hold the planted topic-word and document-topic distributions of a generated
    corpus (None for files).
    """

    docs: np.ndarray
    words: np.ndarray
    n_docs: int
    n_vocab: int
    vocab: list[str] | None = None
    phi: np.ndarray | None = None
    theta: np.ndarray | None = None
    source: str = "<memory>"
    meta: dict = field(default_factory=dict)

    @property
    def n_tokens(self) -> int:
        return int(self.docs.size)

    def doc_ptr(self) -> np.ndarray:
        """CSR offsets: the tokens of document d are ``[ptr[d], ptr[d+1])``."""
        ptr = np.zeros(self.n_docs + 1, dtype=np.int64)
        np.cumsum(np.bincount(self.docs, minlength=self.n_docs), out=ptr[1:])
        return ptr

    def doc_range(self, rank: int, size: int) -> tuple[int, int]:
        """Contiguous documents of worker ``rank`` of ``size``, balanced by token count (not docs),
        so workers of a job do equal work per clock."""
        if not 0 <= rank < size:
            raise ValueError(f"rank {rank} not in [0, {size})")
        ptr = self.doc_ptr()
        cuts = np.searchsorted(ptr, np.arange(size + 1) * (self.n_tokens / size), side="left")
        cuts[0], cuts[-1] = 0, self.n_docs
        cuts = np.maximum.accumulate(np.clip(cuts, 0, self.n_docs))
        return int(cuts[rank]), int(cuts[rank + 1])

    def subset(self, doc_lo: int, doc_hi: int) -> Corpus:
        """Documents ``[doc_lo, doc_hi)`` renumbered from 0 (vocabulary unchanged)."""
        ptr = self.doc_ptr()
        a, b = int(ptr[doc_lo]), int(ptr[doc_hi])
        return Corpus((self.docs[a:b] - doc_lo).astype(np.int32), self.words[a:b].copy(),
                      doc_hi - doc_lo, self.n_vocab, self.vocab, self.phi,
                      None if self.theta is None else self.theta[doc_lo:doc_hi],
                      f"{self.source}[docs {doc_lo}:{doc_hi}]", dict(self.meta))

    def doc_word_matrix(self):
        """Documents x vocabulary count matrix (scipy CSR), the input the ``lda`` package takes."""
        import scipy.sparse as sp

        data = np.ones(self.n_tokens, dtype=np.int64)
        m = sp.csr_matrix((data, (self.docs, self.words)), shape=(self.n_docs, self.n_vocab))
        m.sum_duplicates()
        return m

    def word_names(self) -> list[str]:
        return self.vocab if self.vocab is not None else [f"w{i}" for i in range(self.n_vocab)]


def _from_triples(d: np.ndarray, w: np.ndarray, c: np.ndarray, n_docs: int, n_vocab: int,
                  vocab: list[str] | None, source: str) -> Corpus:
    """Expand (doc, word, count) entries into sorted per-token arrays."""
    key = d.astype(np.int64) * max(n_vocab, 1) + w
    if key.size > 1 and not np.all(key[1:] >= key[:-1]):  # files are usually sorted already
        order = np.argsort(key, kind="stable")
        d, w, c = d[order], w[order], c[order]
    c = c.astype(np.int64)
    return Corpus(np.repeat(d.astype(np.int32), c), np.repeat(w.astype(np.int32), c),
                  int(n_docs), int(n_vocab), vocab, source=source)


# ----------------------------------------------------------------------------------------------
# byte-level parsing (numba, on the shared primitives of bosen.apps.textparse)

_OK, _NOT_INT, _FIELDS, _DOC_RANGE, _WORD_RANGE, _COUNT, _TOO_MANY, _TRUNCATED, _COLON, _OVERFLOW = range(10)


@njit(cache=True, nogil=True)
def _parse_docword_body(buf, pos, line, nnz, n_docs, n_vocab, docs, words, counts):  # pragma: no cover - numba
    """Parse ``docID wordID count`` lines from buf[pos:] into the output arrays.

    Returns (status, line, line_start, n_entries, field, value): on an error, the 1-based line, the
    byte offset where it starts, the offending field (0-based) and value.
    """
    n = buf.size
    k = 0
    vals = np.zeros(3, dtype=np.int64)
    while pos < n:
        start = pos
        end = tp.line_end(buf, pos)
        nf = 0
        j = tp.skip_blanks(buf, start, end)
        while j < end:
            a = j
            j = tp.token_end(buf, a, end)
            if nf < 3:
                ok, v = tp.parse_int(buf, a, j)
                if not ok:
                    return _NOT_INT, line, start, k, nf, 0
                vals[nf] = v
            nf += 1
            j = tp.skip_blanks(buf, j, end)
        if nf != 0:
            if nf != 3:
                return _FIELDS, line, start, k, nf, 0
            if k >= nnz:
                return _TOO_MANY, line, start, k, 0, 0
            if vals[0] < 1 or vals[0] > n_docs:
                return _DOC_RANGE, line, start, k, 0, vals[0]
            if vals[1] < 1 or vals[1] > n_vocab:
                return _WORD_RANGE, line, start, k, 1, vals[1]
            if vals[2] < 1 or vals[2] > 2147483647:
                return _COUNT, line, start, k, 2, vals[2]
            docs[k] = vals[0] - 1
            words[k] = vals[1] - 1
            counts[k] = vals[2]
            k += 1
        pos = end + 1
        line += 1
    if k < nnz:
        return _TRUNCATED, line, n, k, 0, 0
    return _OK, line, n, k, 0, 0


@njit(cache=True, nogil=True)
def _parse_ldac(buf, n_vocab, docs, words, counts):  # pragma: no cover - numba
    """Parse LDA-C lines ``M term:count ...`` (term ids 0-based). n_vocab < 0: ids unchecked.

    Returns (status, line, line_start, n_docs, n_entries, field, value, max_term).
    """
    n = buf.size
    pos = 0
    line = 1
    d = 0
    k = 0
    max_term = -1
    while pos < n:
        start = pos
        end = tp.line_end(buf, pos)
        nf = 0
        m = 0
        j = tp.skip_blanks(buf, start, end)
        while j < end:
            a = j
            j = tp.token_end(buf, a, end)
            if nf == 0:
                ok, m = tp.parse_int(buf, a, j)
                if not ok or m < 0:
                    return _NOT_INT, line, start, d, k, 0, 0, max_term
            else:
                c = tp.find_byte(buf, a, j, tp.COLON)
                if c >= j:
                    return _COLON, line, start, d, k, nf, 0, max_term
                ok, t = tp.parse_int(buf, a, c)
                if not ok:
                    return _NOT_INT, line, start, d, k, nf, 0, max_term
                ok2, cnt = tp.parse_int(buf, c + 1, j)
                if not ok2:
                    return _NOT_INT, line, start, d, k, nf, 0, max_term
                if t < 0 or (n_vocab >= 0 and t >= n_vocab) or t > 2147483647:
                    return _WORD_RANGE, line, start, d, k, nf, t, max_term
                if cnt < 1 or cnt > 2147483647:
                    return _COUNT, line, start, d, k, nf, cnt, max_term
                if k >= words.size:
                    return _OVERFLOW, line, start, d, k, nf, 0, max_term
                docs[k] = d
                words[k] = t
                counts[k] = cnt
                if t > max_term:
                    max_term = t
                k += 1
            nf += 1
            j = tp.skip_blanks(buf, j, end)
        if nf != 0:
            if nf - 1 != m:
                return _FIELDS, line, start, d, k, nf - 1, m, max_term
            d += 1
        pos = end + 1
        line += 1
    return _OK, line, n, d, k, 0, 0, max_term


# ----------------------------------------------------------------------------------------------
# readers


def read_vocab(path: str | os.PathLike, expected: int | None = None) -> list[str]:
    """One word per line (line i names word id i, 1-based in UCI files, 0-based in LDA-C).

    ``expected``: the vocabulary size the corpus declares; a shorter file is reported as truncated.
    """
    buf = tp.read_bytes(path, "vocabulary")
    text = bytes(buf).decode("utf-8", "replace")
    words = [ln.strip() for ln in text.split("\n")]
    while words and not words[-1]:  # blank lines at the end are harmless
        words.pop()
    for i, w in enumerate(words):
        if not w:
            raise DataError(f"{path}:{i + 1}: empty line in vocabulary (word id {i + 1} has no name)")
    if expected is not None and len(words) < expected:
        raise DataError(f"{path}:{len(words) + 1}: truncated vocabulary: the corpus declares W={expected} "
                        f"words but the file ends after {len(words)}")
    if expected is not None and len(words) > expected:
        raise DataError(f"{path}:{expected + 1}: vocabulary has {len(words)} words but the corpus "
                        f"declares W={expected}")
    return words


def _header_line(buf: np.ndarray, pos: int, line: int, path: str, name: str) -> tuple[int, int]:
    """Parse one header line holding a single non-negative integer; returns (value, next pos)."""
    n = buf.size
    if pos >= n:
        raise DataError(f"{path}:{line}: truncated header: expected {name} on line {line}, the file ends")
    end = pos
    while end < n and buf[end] != 10:
        end += 1
    text = bytes(buf[pos:end]).decode("utf-8", "replace").strip()
    if not text.isdigit():
        raise DataError(f"{path}:{line}: bad header: expected {name} as one non-negative integer, "
                        f"got {text!r}")
    return int(text), end + 1


def read_uci(docword: str | os.PathLike, vocab: str | os.PathLike | None = None) -> Corpus:
    """Read a UCI bag-of-words corpus (``docword.NAME.txt[.gz]``: D, W, NNZ, then ``doc word count``).

    ``vocab``: a ``vocab.NAME.txt`` file; None looks for it next to ``docword`` (optional then).
    """
    path = str(docword)
    buf = tp.read_bytes(path, "docword")
    n_docs, pos = _header_line(buf, 0, 1, path, "the number of documents D")
    n_vocab, pos = _header_line(buf, pos, 2, path, "the vocabulary size W")
    nnz, pos = _header_line(buf, pos, 3, path, "the number of entries NNZ")
    if n_docs < 1:
        raise DataError(f"{path}:1: bad header: D={n_docs} documents, need at least 1")
    if n_vocab < 1:
        raise DataError(f"{path}:2: bad header: W={n_vocab} words, need at least 1")
    if nnz > n_docs * n_vocab:
        raise DataError(f"{path}:3: bad header: NNZ={nnz} exceeds D*W={n_docs * n_vocab}")
    docs = np.empty(nnz, dtype=np.int32)
    words = np.empty(nnz, dtype=np.int32)
    counts = np.empty(nnz, dtype=np.int32)
    st, line, start, k, fld, val = _parse_docword_body(buf, pos, 4, nnz, n_docs, n_vocab, docs, words, counts)
    if st != _OK:
        txt = tp.line_text(buf, start) if start < buf.size else ""
        fields = ("docID", "wordID", "count")
        msg = {
            _NOT_INT: f"field {fld + 1} ({fields[min(fld, 2)]}) is not an integer in {txt!r}",
            _FIELDS: f"expected 3 fields 'docID wordID count', found {fld} in {txt!r}",
            _DOC_RANGE: f"docID {val} out of range 1..{n_docs} (header D)",
            _WORD_RANGE: f"wordID {val} out of vocabulary range 1..{n_vocab} (header W)",
            _COUNT: f"count {val} must be a positive integer",
            _TOO_MANY: f"more entries than the header's NNZ={nnz}",
            _TRUNCATED: f"truncated file: the header declares NNZ={nnz} entries, the file ends after {k}",
        }[st]
        raise DataError(f"{path}:{line}: {msg}")
    names: list[str] | None = None
    if vocab is None:
        stem = Path(path).name
        for suffix in (".gz", ".txt"):
            stem = stem.removesuffix(suffix)
        guess = Path(path).with_name(stem.replace("docword", "vocab", 1) + ".txt")
        if stem.startswith("docword") and guess.exists():
            vocab = guess
    if vocab is not None:
        names = read_vocab(vocab, expected=n_vocab)
    c = _from_triples(docs, words, counts, n_docs, n_vocab, names, path)
    c.meta["nnz"] = nnz
    return c


def read_ldac(path: str | os.PathLike, vocab: str | os.PathLike | None = None) -> Corpus:
    """Read an LDA-C corpus: one document per line, ``M term:count ...`` with 0-based term ids.

    Without a vocabulary the vocabulary size is the largest term id + 1.
    """
    path = str(path)
    buf = tp.read_bytes(path, "LDA-C corpus")
    names = read_vocab(vocab) if vocab is not None else None
    cap = int(tp.count_byte(buf, tp.COLON))
    docs = np.empty(cap, dtype=np.int32)
    words = np.empty(cap, dtype=np.int32)
    counts = np.empty(cap, dtype=np.int32)
    nv = len(names) if names is not None else -1
    st, line, start, n_docs, k, fld, val, max_term = _parse_ldac(buf, nv, docs, words, counts)
    if st != _OK:
        txt = tp.line_text(buf, start) if start < buf.size else ""
        msg = {
            _NOT_INT: f"field {fld + 1} is not an integer (or term:count of integers) in {txt!r}",
            _COLON: f"field {fld + 1} is not of the form term:count in {txt!r}",
            _WORD_RANGE: f"term id {val} out of vocabulary range 0..{nv - 1}" if nv >= 0
            else f"term id {val} out of range",
            _COUNT: f"count {val} must be a positive integer",
            _FIELDS: f"the line declares M={val} terms but has {fld} term:count pairs (truncated?)",
            _OVERFLOW: "more term:count pairs than ':' characters (corrupt file)",
        }[st]
        raise DataError(f"{path}:{line}: {msg}")
    if n_docs == 0:
        raise DataError(f"{path}:1: no documents in LDA-C file")
    n_vocab = nv if nv >= 0 else max_term + 1
    return _from_triples(docs[:k], words[:k], counts[:k], n_docs, max(n_vocab, 1), names, path)


def load(data: str, vocab: str | None = None, fmt: str = "auto") -> Corpus:
    """Read ``data`` as UCI (``docword*``) or LDA-C (anything else unless ``fmt`` says)."""
    if fmt == "auto":
        fmt = "uci" if Path(data).name.startswith("docword") else "ldac"
    if fmt == "uci":
        return read_uci(data, vocab)
    if fmt == "ldac":
        return read_ldac(data, vocab)
    raise ValueError(f"unknown corpus format {fmt!r} (uci, ldac, auto)")


# ----------------------------------------------------------------------------------------------
# generator


@njit(cache=True, nogil=True)
def _draw_categorical(rows, cdf, u, out):
    """out[i] = first k with cdf[rows[i], k] > u[i] (inverse-CDF sampling, binary search)."""
    K = cdf.shape[1]
    for i in range(u.size):
        r = rows[i]
        lo, hi = 0, K - 1
        x = u[i] * cdf[r, K - 1]
        while lo < hi:
            mid = (lo + hi) >> 1
            if cdf[r, mid] > x:
                hi = mid
            else:
                lo = mid + 1
        out[i] = lo


def generate(n_docs: int = 1000, n_vocab: int = 500, n_topics: int = 10, doc_len: float = 100.0,
             alpha: float = 0.1, beta: float = 0.1, seed: int = 0) -> Corpus:
    """Sample a corpus from the LDA generative process (Blei, Ng and Jordan 2003) with known topics.

    phi_k ~ Dir(beta) over the vocabulary, theta_d ~ Dir(alpha), N_d ~ Poisson(doc_len) (at least 1),
    z ~ Cat(theta_d), w ~ Cat(phi_z). Returns the corpus with ``phi`` (K x V) and ``theta`` (D x K)
    so tests can check that training recovers the planted topics. Deterministic in ``seed``.
    """
    if n_docs < 1 or n_vocab < 2 or n_topics < 1:
        raise ValueError("generate: need n_docs >= 1, n_vocab >= 2, n_topics >= 1")
    if doc_len <= 0 or alpha <= 0 or beta <= 0:
        raise ValueError("generate: doc_len, alpha and beta must be > 0")
    rng = np.random.default_rng(seed)
    # Dirichlet via normalized gammas (stable for small concentrations)
    phi = rng.gamma(beta, 1.0, size=(n_topics, n_vocab)) + 1e-300
    phi /= phi.sum(axis=1, keepdims=True)
    theta = rng.gamma(alpha, 1.0, size=(n_docs, n_topics)) + 1e-300
    theta /= theta.sum(axis=1, keepdims=True)
    lens = np.maximum(rng.poisson(doc_len, size=n_docs), 1)
    docs = np.repeat(np.arange(n_docs, dtype=np.int32), lens)
    z = np.empty(docs.size, dtype=np.int32)
    _draw_categorical(docs, np.cumsum(theta, axis=1), rng.random(docs.size), z)
    words = np.empty(docs.size, dtype=np.int32)
    _draw_categorical(z, np.cumsum(phi, axis=1), rng.random(docs.size), words)
    # by document, then word (stable: the order np.lexsort((words, docs)) gives, in a third of its time)
    order = np.argsort(docs.astype(np.int64) * n_vocab + words, kind="stable")
    c = Corpus(docs[order], words[order], n_docs, n_vocab, [f"w{i:05d}" for i in range(n_vocab)],
               phi, theta, source=f"synthetic(seed={seed})")
    c.meta["z"] = z[order]
    return c


# ----------------------------------------------------------------------------------------------
# writers and topic matching


def write_uci(corpus: Corpus, docword: str | os.PathLike, vocab: str | os.PathLike | None = None) -> None:
    """Write ``corpus`` as UCI ``docword`` (+ ``vocab``) files."""
    key = corpus.docs.astype(np.int64) * corpus.n_vocab + corpus.words
    uk, cnt = np.unique(key, return_counts=True)
    d, w = np.divmod(uk, corpus.n_vocab)
    body = np.column_stack([d + 1, w + 1, cnt])
    with open(docword, "w") as f:
        f.write(f"{corpus.n_docs}\n{corpus.n_vocab}\n{uk.size}\n")
        np.savetxt(f, body, fmt="%d")
    if vocab is not None:
        Path(vocab).write_text("\n".join(corpus.word_names()) + "\n")


def write_ldac(corpus: Corpus, path: str | os.PathLike) -> None:
    """Write ``corpus`` in LDA-C format (one line per document, 0-based term ids)."""
    key = corpus.docs.astype(np.int64) * corpus.n_vocab + corpus.words
    uk, cnt = np.unique(key, return_counts=True)
    d, w = np.divmod(uk, corpus.n_vocab)
    starts = np.searchsorted(d, np.arange(corpus.n_docs + 1))
    lines = []
    for i in range(corpus.n_docs):  # per document, not per token
        a, b = starts[i], starts[i + 1]
        pairs = " ".join(f"{t}:{c}" for t, c in zip(w[a:b].tolist(), cnt[a:b].tolist(), strict=True))
        lines.append(f"{b - a} {pairs}".rstrip())
    Path(path).write_text("\n".join(lines) + "\n")


def hellinger(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Row-wise Hellinger distance in [0, 1] between distributions p and q (same shape)."""
    bc = np.sum(np.sqrt(np.clip(p, 0, None) * np.clip(q, 0, None)), axis=-1)
    return np.sqrt(np.clip(1.0 - bc, 0.0, None))


def match_topics(phi_hat: np.ndarray, phi_true: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Match learned topics to planted ones, minimizing Hellinger distance (greedy on the pair matrix).

    Returns ``(perm, dist)``: planted topic j is matched to learned topic ``perm[j]`` at Hellinger
    distance ``dist[j]``. Greedy matching keeps the package free of scipy; tests cross-check it.
    """
    p = phi_hat / phi_hat.sum(axis=1, keepdims=True)
    q = phi_true / phi_true.sum(axis=1, keepdims=True)
    bc = np.sqrt(q) @ np.sqrt(p).T  # (K_true, K_hat)
    D = np.sqrt(np.clip(1.0 - bc, 0.0, None))
    perm = np.full(q.shape[0], -1, dtype=np.int64)
    dist = np.zeros(q.shape[0])
    used_r = np.zeros(D.shape[0], bool)
    used_c = np.zeros(D.shape[1], bool)
    order = np.argsort(D, axis=None)
    for flat in order:  # at most K_true * K_hat pairs, not tokens
        r, c = divmod(int(flat), D.shape[1])
        if used_r[r] or used_c[c]:
            continue
        perm[r], dist[r] = c, D[r, c]
        used_r[r] = used_c[c] = True
        if used_r.all() or used_c.all():
            break
    return perm, dist
