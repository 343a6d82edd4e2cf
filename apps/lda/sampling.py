"""Numba kernels that sample LDA's topic assignments: exact dense and sparse collapsed Gibbs, LightLDA MH.

The samplers share one state layout (``ndk`` doc-topic counts of the worker's documents, ``nwk``
working copies of the word-topic rows it needs, ``nk`` the topic summary) and all update the counts
token by token, so the worker sees its own writes at once (Bösen's read-my-writes):

* :func:`sample_dense` is plain collapsed Gibbs, O(K) per token, exact. With divisions hoisted out of
  the inner loop, and from 32 topics on the weights computed in a vectorized loop and drawn through
  block sums, it reaches a given log-likelihood faster than MH up to about K = 1000 on the news
  corpus (measured: K=100 and 300 clearly, K=1000 a tie after 10 iterations).
* :func:`sample_sparse` draws the same conditional in O(nonzeros) (SparseLDA's buckets): from about
  K = 64 on the fastest once the chain has settled; right after a random start, when lists are
  long, a dense sweep is cheaper, and :func:`mean_list_length` with :func:`dense_is_cheaper` tells
  ``Sampler`` which to run.
* :func:`sample_mh` is the LightLDA sampler (Yuan et al., WWW 2015): Metropolis–Hastings that
  alternates a *word proposal* ``q_w(k) ∝ (n_wk + β)/(n_k + Vβ)`` drawn in O(1) from alias tables built
  once per clock from the (stale) rows fetched from the PS, and a *doc proposal*
  ``q_d(k) ∝ n_dk + α`` drawn in O(1) by picking a random token of the document. Acceptance uses
  the fresh local counts, so the chain targets the exact collapsed conditional; cost per token is
  O(mh_steps), independent of K. The word proposal is split as LightLDA does: a sparse alias per
  word over its non-zero topics (mass ``Σ n_wk/(n_k+Vβ)``) plus one dense alias shared by all words
  (mass ``Σ β/(n_k+Vβ)``), so building costs O(nnz) per word, not O(K).

Counts read from the PS may be negative under bounded staleness (another worker's decrement seen
before the increment it undoes, or our own writes racing a stale row): every probability clamps
counts at 0 (``_pos``). The quality measures are in ``evaluation``; :func:`count_changes` turns a
mini-batch's new counts into the updates the worker sends.

Random numbers come from an inline splitmix64 stream seeded per call (``_rand``, also used by
``evaluation.fold_in``), so runs are reproducible and the kernels release the GIL (``nogil``) for
the client's communication thread.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S11 = np.uint64(11)
_INV53 = 1.0 / 9007199254740992.0


@njit(inline="always")
def _rand(state):
    """splitmix64: returns (new state, uniform in [0, 1))."""
    state = state + _GOLDEN
    x = state
    x = (x ^ (x >> _S30)) * _MIX1
    x = (x ^ (x >> _S27)) * _MIX2
    x = x ^ (x >> _S31)
    return state, float(x >> _S11) * _INV53


@njit(inline="always")
def _pos(c):
    return c if c > 0 else 0


@njit(nogil=True, cache=True)
def seed_state(seed: int) -> np.uint64:
    """A well-mixed splitmix64 state from an integer seed."""
    s = np.uint64(seed & 0x7FFFFFFFFFFFFFFF)
    s, _ = _rand(s)
    s, _ = _rand(s)
    return s


# ----------------------------------------------------------------------------------------------
# initialization


@njit(nogil=True, cache=True)
def random_init(z: np.ndarray, K: int, seed: int) -> None:
    """Uniform random topics for every token (z is filled in place)."""
    s = seed_state(seed)
    for i in range(z.size):
        s, u = _rand(s)
        t = int(u * K)
        z[i] = t if t < K else K - 1


@njit(nogil=True, cache=True)
def doc_topic_counts(doc_ptr: np.ndarray, z: np.ndarray, K: int) -> np.ndarray:
    """ndk[d, k] = number of tokens of document d assigned topic k."""
    D = doc_ptr.size - 1
    ndk = np.zeros((D, K), dtype=np.int32)
    for d in range(D):
        for i in range(doc_ptr[d], doc_ptr[d + 1]):
            ndk[d, z[i]] += 1
    return ndk


# ----------------------------------------------------------------------------------------------
# exact dense collapsed Gibbs


_BLOCK = 16  # topics per block of the blocked dense sampler


@njit(nogil=True, cache=True)
def sample_dense(doc_ptr: np.ndarray, words: np.ndarray, z: np.ndarray, ndk: np.ndarray, nwk: np.ndarray,
                 nk: np.ndarray, alpha: float, beta: float, vbeta: float, doc_lo: int, doc_hi: int,
                 seed: int) -> int:
    """One collapsed-Gibbs sweep over documents [doc_lo, doc_hi): O(K) per token, exact.

    ``words`` are row indices into ``nwk`` (the worker's local copy of word-topic rows); ``nk`` is
    its copy of the topic summary. All three count arrays are updated in place. Returns the number of
    tokens whose topic changed. Below 2 blocks of topics a running cumulative sum is cheapest; from
    there on the blocked form (:func:`_sample_dense_blocked`) is.
    """
    if nk.shape[0] < 2 * _BLOCK:
        return _sample_dense_cdf(doc_ptr, words, z, ndk, nwk, nk, alpha, beta, vbeta, doc_lo, doc_hi, seed)
    return _sample_dense_blocked(doc_ptr, words, z, ndk, nwk, nk, alpha, beta, vbeta, doc_lo, doc_hi, seed)


@njit(nogil=True, cache=True)
def _sample_dense_cdf(doc_ptr, words, z, ndk, nwk, nk, alpha, beta, vbeta, doc_lo, doc_hi, seed):
    """Small K: one pass builds the cumulative weights, a linear scan finds the draw."""
    K = nk.shape[0]
    inv = np.empty(K)
    cdf = np.empty(K)
    for k in range(K):
        inv[k] = 1.0 / (_pos(nk[k]) + vbeta)
    s = seed_state(seed)
    changed = 0
    for d in range(doc_lo, doc_hi):
        for i in range(doc_ptr[d], doc_ptr[d + 1]):
            w = words[i]
            old = z[i]
            ndk[d, old] -= 1
            nwk[w, old] -= 1
            nk[old] -= 1
            inv[old] = 1.0 / (_pos(nk[old]) + vbeta)
            total = 0.0
            for k in range(K):
                total += (ndk[d, k] + alpha) * (_pos(nwk[w, k]) + beta) * inv[k]
                cdf[k] = total
            s, u = _rand(s)
            u *= total
            t = 0
            while t < K - 1 and cdf[t] <= u:
                t += 1
            z[i] = t
            ndk[d, t] += 1
            nwk[w, t] += 1
            nk[t] += 1
            inv[t] = 1.0 / (_pos(nk[t]) + vbeta)
            if t != old:
                changed += 1
    return changed


@njit(nogil=True, cache=True, fastmath=True)
def _sample_dense_blocked(doc_ptr, words, z, ndk, nwk, nk, alpha, beta, vbeta, doc_lo, doc_hi, seed):
    """Larger K: the same draw with the dependency chain of a running sum broken up.

    The doc factor ``c_k = (n_dk+α)/(n_k+Vβ)`` is kept per document (only the old and new topic of a
    token change it), so a weight is one multiply ``c_k (n_wk+β)`` in a loop the compiler
    vectorizes; weights are summed in blocks of ``_BLOCK`` topics, and the draw scans block sums,
    then one block (about K/32 + 8 steps instead of K/2).
    """
    K = nk.shape[0]
    B = _BLOCK
    nb = (K + B - 1) // B
    inv = np.empty(K)
    c = np.zeros(nb * B)
    p = np.zeros(nb * B)  # the padding stays 0
    bs = np.empty(nb)
    for k in range(K):
        inv[k] = 1.0 / (_pos(nk[k]) + vbeta)
    s = seed_state(seed)
    changed = 0
    for d in range(doc_lo, doc_hi):
        for k in range(K):
            c[k] = (ndk[d, k] + alpha) * inv[k]
        for i in range(doc_ptr[d], doc_ptr[d + 1]):
            w = words[i]
            old = z[i]
            ndk[d, old] -= 1
            nwk[w, old] -= 1
            nk[old] -= 1
            inv[old] = 1.0 / (_pos(nk[old]) + vbeta)
            c[old] = (ndk[d, old] + alpha) * inv[old]
            row = nwk[w]
            for k in range(K):
                p[k] = c[k] * (max(row[k], 0) + beta)
            total = 0.0
            for b in range(nb):
                acc = 0.0
                o = b * B
                for j in range(B):
                    acc += p[o + j]
                bs[b] = acc
                total += acc
            s, u = _rand(s)
            u *= total
            b = 0
            while b < nb - 1 and bs[b] <= u:
                u -= bs[b]
                b += 1
            t = b * B
            last = min(t + B, K) - 1
            while t < last and p[t] <= u:
                u -= p[t]
                t += 1
            z[i] = t
            ndk[d, t] += 1
            nwk[w, t] += 1
            nk[t] += 1
            inv[t] = 1.0 / (_pos(nk[t]) + vbeta)
            c[t] = (ndk[d, t] + alpha) * inv[t]
            if t != old:
                changed += 1
    return changed


# ----------------------------------------------------------------------------------------------
# exact sparse collapsed Gibbs (SparseLDA)


@njit(nogil=True, cache=True)
def _word_lists(nwk, words, a, b):
    """The sparse sampler's word lists for the tokens [a, b): per row, its topics with a positive count
    and the count, counts decreasing and equal counts in topic order (a stable sort), packed in one
    array; a row no token in [a, b) uses gets none.

    Returns (wn, off, wl): row r's list is wl[off[r]:off[r] + wn[r]], with room up to off[r + 1]. The work
    and memory are those of the rows the tokens need, not of every row read (a worker reads rows for
    several mini-batches), and sorting is in place (no allocation per row)."""
    R, K = nwk.shape
    occ = np.zeros(R, dtype=np.int64)
    for i in range(a, b):
        occ[words[i]] += 1
    # room per row: its positive entries (counted in a loop the compiler vectorizes) plus one per token
    nnz = np.zeros(R, dtype=np.int64)
    off = np.zeros(R + 1, dtype=np.int64)
    for r in range(R):
        cap = 0
        if occ[r] > 0:
            c = 0
            for k in range(K):
                c += nwk[r, k] > 0
            nnz[r] = c
            cap = min(K, c + occ[r])
        off[r + 1] = off[r] + cap
    wn = np.zeros(R, dtype=np.int32)
    wl = np.empty((max(off[R], 1), 2), dtype=np.int32)
    for r in range(R):
        if occ[r] == 0:
            continue
        o = off[r]
        wl[o, 1] = 0  # an empty list reads as a count of 0 (the sampler reads its first count early)
        n = 0
        k = 0
        while n < nnz[r]:  # up to the last positive entry
            v = nwk[r, k]
            if v > 0:
                # insertion, stable: past every entry with a count >= v, so ties keep topic order
                j = n
                while j > 0 and wl[o + j - 1, 1] < v:
                    wl[o + j, 0] = wl[o + j - 1, 0]
                    wl[o + j, 1] = wl[o + j - 1, 1]
                    j -= 1
                wl[o + j, 0] = k
                wl[o + j, 1] = v
                n += 1
            k += 1
        wn[r] = n
    return wn, off, wl


@njit(nogil=True, cache=True, fastmath=True)
def sample_sparse(doc_ptr: np.ndarray, words: np.ndarray, z: np.ndarray, ndk: np.ndarray, nwk: np.ndarray,
                  nk: np.ndarray, alpha: float, beta: float, vbeta: float, doc_lo: int, doc_hi: int,
                  seed: int) -> int:
    """The draw of :func:`sample_dense` (exact collapsed Gibbs) in time O(nonzeros), not O(K).

    SparseLDA's split (Yao, Mimno and McCallum, KDD 2009) of the weight of topic k,
    ``(n_dk+α)(n_wk+β)/(n_k+Vβ)`` = ``αβ/(n_k+Vβ)`` (s, the same for every token) + ``n_dk β/(n_k+Vβ)``
    (r, non-zero only on the document's topics) + ``(n_dk+α) n_wk/(n_k+Vβ)`` (q, non-zero only on the
    word's topics). The masses of s and r are kept up to date as counts change, q is summed over the
    word's non-zero topics (lists built at the start of the sweep, kept as counts change), and the
    draw picks a bucket, then a topic within it. While the sweep runs, a positive n_wk lives in its
    word's list (counts go back into ``nwk`` at the end), so a token touches one short list, not the
    long row. Each list is kept in decreasing count order (a count that changes by one moves by one
    swap, with the first or last entry of its run of equal counts), so the search for a token's old
    topic and the walk of the q draw, both weighted by the counts, stop early; the document's topics
    are a list with each topic's place, so dropping one is O(1).
    Same arguments and updates as :func:`sample_dense`; negative counts (staleness) count as 0.
    Returns the number of tokens whose topic changed.
    """
    K = nk.shape[0]
    R = nwk.shape[0]
    ab = alpha * beta
    inv = np.empty(K)
    c = np.empty(K)          # (n_dk + α) / (n_k + Vβ) of the current document
    for k in range(K):
        inv[k] = 1.0 / (_pos(nk[k]) + vbeta)
    # each word row's topics with a positive count and that count, side by side, counts decreasing:
    # q reads one short contiguous list instead of K_w lines of a long row. Only the rows of the
    # tokens swept get a list, packed one after another (row r's at off[r]), each with room for what
    # the sweep can add (one entry per token of the word, at most K in all)
    wn, off, wl = _word_lists(nwk, words, doc_ptr[doc_lo], doc_ptr[doc_hi])
    B = 32
    nb = (K + B - 1) // B
    sblk = np.empty(nb)      # s in blocks of B topics, so drawing from it scans about K/(2B) + B/2
    dtop = np.empty(K, dtype=np.int32)  # the current document's topics with n_dk > 0
    dpos = np.empty(K, dtype=np.int32)  # a listed topic's place in dtop
    qv = np.empty(K)
    s = seed_state(seed)
    changed = 0
    pf = 0
    nt = doc_ptr[doc_hi]  # tokens past the range may index rows of another block
    for d in range(doc_lo, doc_hi):
        s_sum = 0.0
        r_sum = 0.0
        dn = 0
        for k in range(K):
            if k % B == 0:
                sblk[k // B] = 0.0
            s_sum += ab * inv[k]
            sblk[k // B] += ab * inv[k]
            ndk_k = ndk[d, k]
            c[k] = (ndk_k + alpha) * inv[k]
            if ndk_k > 0:
                dtop[dn] = k
                dpos[k] = dn
                dn += 1
                r_sum += ndk_k * beta * inv[k]
        for i in range(doc_ptr[d], doc_ptr[d + 1]):
            w = words[i]
            old = z[i]
            n = wn[w]
            o = off[w]
            if i + 2 < nt:
                # read the list of the token after next now: its cache miss then overlaps this token's
                # work instead of stalling that token (1.10x per settled sweep at K=100, measured)
                pf += wl[off[words[i + 2]], 1]
            # remove the token
            r_sum -= ndk[d, old] * beta * inv[old]
            ndk[d, old] -= 1
            # the word's count: in its list while positive (written back to nwk at the end), else in nwk
            j = 0
            while j < n and wl[o + j, 0] != old:
                j += 1
            if j < n:
                v = wl[o + j, 1]
                # the last entry of the run of counts equal to v takes the decremented one's place
                e = j
                while e + 1 < n and wl[o + e + 1, 1] == v:
                    e += 1
                if e != j:
                    wl[o + j, 0] = wl[o + e, 0]
                    wl[o + e, 0] = old
                if v == 1:  # then e is the list's last entry (every count after a 1 is 1)
                    n -= 1
                    wn[w] = n
                    nwk[w, old] = 0
                else:
                    wl[o + e, 1] = v - 1
            else:
                nwk[w, old] -= 1
            nk[old] -= 1
            x = 1.0 / (_pos(nk[old]) + vbeta)
            s_sum += ab * (x - inv[old])
            sblk[old // B] += ab * (x - inv[old])
            inv[old] = x
            r_sum += ndk[d, old] * beta * inv[old]
            c[old] = (ndk[d, old] + alpha) * inv[old]
            if ndk[d, old] == 0:
                dn -= 1
                j = dpos[old]
                last = dtop[dn]
                dtop[j] = last
                dpos[last] = j
            # q over the word's topics
            q_sum = 0.0
            for j in range(n):
                v = c[wl[o + j, 0]] * wl[o + j, 1]
                qv[j] = v
                q_sum += v
            s, u = _rand(s)
            u *= q_sum + r_sum + s_sum
            jq = -1  # t's place in the word's list when drawn from q
            if u < q_sum and n > 0:
                j = 0
                while j < n - 1 and qv[j] <= u:
                    u -= qv[j]
                    j += 1
                jq = j
                t = wl[o + j, 0]
            else:
                u -= q_sum
                if u < r_sum and dn > 0:
                    j = 0
                    while j < dn - 1:
                        v = ndk[d, dtop[j]] * beta * inv[dtop[j]]
                        if u < v:
                            break
                        u -= v
                        j += 1
                    t = dtop[j]
                else:
                    u -= r_sum
                    b = 0
                    while b < nb - 1 and sblk[b] <= u:
                        u -= sblk[b]
                        b += 1
                    k = b * B
                    last = min(k + B, K) - 1
                    while k < last:
                        v = ab * inv[k]
                        if u < v:
                            break
                        u -= v
                        k += 1
                    t = k
            # add it back with topic t
            z[i] = t
            r_sum -= ndk[d, t] * beta * inv[t]
            ndk[d, t] += 1
            nk[t] += 1
            x = 1.0 / (_pos(nk[t]) + vbeta)
            s_sum += ab * (x - inv[t])
            sblk[t // B] += ab * (x - inv[t])
            inv[t] = x
            r_sum += ndk[d, t] * beta * inv[t]
            c[t] = (ndk[d, t] + alpha) * inv[t]
            if ndk[d, t] == 1:
                dtop[dn] = t
                dpos[t] = dn
                dn += 1
            if jq < 0:
                jq = 0
                while jq < n and wl[o + jq, 0] != t:
                    jq += 1
            if jq < n:
                v = wl[o + jq, 1]
                # the first entry of the run of counts equal to v takes the incremented one's place
                f = jq
                while f > 0 and wl[o + f - 1, 1] == v:
                    f -= 1
                if f != jq:
                    wl[o + jq, 0] = wl[o + f, 0]
                    wl[o + f, 0] = t
                wl[o + f, 1] = v + 1
            else:
                nwk[w, t] += 1
                if nwk[w, t] == 1:  # a new list entry: a count of 1 goes last
                    wl[o + n, 0] = t
                    wl[o + n, 1] = 1
                    wn[w] = n + 1
            if t != old:
                changed += 1
    for r in range(R):  # the listed counts back into the rows
        for j in range(off[r], off[r] + wn[r]):
            nwk[r, wl[j, 0]] = wl[j, 1]
    if pf == -1:  # a use of the early reads, so the compiler keeps them (a sum of counts: never -1)
        changed += 1
    return changed


# the sparse sampler's cost per token grows with the word's list (entries), the dense one's with K;
# fitted on the news corpus (K = 64, 100, 1000, random start through 10 sweeps; 2-core dev machine):
# sparse ~ 78 + 1.95 L ns, dense ~ 45 + 0.73 K ns
SPARSE_NS_BASE, SPARSE_NS_PER_ENTRY = 78.0, 1.95
DENSE_NS_BASE, DENSE_NS_PER_TOPIC = 45.0, 0.73


@njit(nogil=True, cache=True)
def mean_list_length(nwk: np.ndarray, words: np.ndarray, doc_ptr: np.ndarray, doc_lo: int, doc_hi: int) -> float:
    """Mean over the tokens of documents [doc_lo, doc_hi) of their word's positive topic counts: the
    length of the list the sparse sampler walks for a token."""
    R, K = nwk.shape
    nnz = np.zeros(R, dtype=np.int64)
    need = np.zeros(R, dtype=np.bool_)
    a, b = doc_ptr[doc_lo], doc_ptr[doc_hi]
    for i in range(a, b):
        need[words[i]] = True
    for r in range(R):
        if need[r]:
            c = 0
            for k in range(K):
                if nwk[r, k] > 0:
                    c += 1
            nnz[r] = c
    tot = 0
    for i in range(a, b):
        tot += nnz[words[i]]
    return tot / max(b - a, 1)


def dense_is_cheaper(mean_list: float, K: int) -> bool:
    """Whether a dense sweep costs less than a sparse one at this mean list length (the fitted model above)."""
    return DENSE_NS_BASE + DENSE_NS_PER_TOPIC * K < SPARSE_NS_BASE + SPARSE_NS_PER_ENTRY * mean_list


# ----------------------------------------------------------------------------------------------
# alias tables (Walker / Vose)


@njit(nogil=True, cache=True)
def _vose(weights, n, total, prob, alias, topics, small, large):
    """Fill prob[0:n], alias[0:n] (alias holds topic ids, via ``topics``) for ``weights[0:n]``."""
    ns = 0
    nl = 0
    for j in range(n):
        x = weights[j] * n / total
        weights[j] = x
        if x < 1.0:
            small[ns] = j
            ns += 1
        else:
            large[nl] = j
            nl += 1
    while ns > 0 and nl > 0:
        ns -= 1
        a = small[ns]
        g = large[nl - 1]
        prob[a] = weights[a]
        alias[a] = topics[g]
        weights[g] = (weights[g] + weights[a]) - 1.0
        if weights[g] < 1.0:
            nl -= 1
            small[ns] = g
            ns += 1
    while nl > 0:
        nl -= 1
        prob[large[nl]] = 1.0
        alias[large[nl]] = topics[large[nl]]
    while ns > 0:  # numerical leftovers
        ns -= 1
        prob[small[ns]] = 1.0
        alias[small[ns]] = topics[small[ns]]


@njit(nogil=True, cache=True)
def build_word_alias(stale_nwk: np.ndarray, stale_nk: np.ndarray, beta: float, vbeta: float,
                     need: np.ndarray) -> tuple:
    """Alias tables of the word proposal, from the rows as fetched at the start of the clock.

    Returns ``(ptr, rec, mass, b_prob, b_alias, b_mass)``: for row r with need[r], records
    ``rec[ptr[r]:ptr[r+1]]`` sample its non-zero topics with weights ``n_rk/(n_k+Vβ)`` (total
    ``mass[r]``); a record is ``(topic, alias topic, threshold·2^31, 0)`` packed in 16 bytes so one
    draw touches one cache line. The dense table ``b_*`` samples k with weight ``β/(n_k+Vβ)``
    (total ``b_mass``).
    """
    R, K = stale_nwk.shape
    inv = np.empty(K)
    for k in range(K):
        inv[k] = 1.0 / (_pos(stale_nk[k]) + vbeta)
    ptr = np.zeros(R + 1, dtype=np.int64)
    for r in range(R):
        c = 0
        if need[r]:
            for k in range(K):
                if stale_nwk[r, k] > 0:
                    c += 1
        ptr[r + 1] = ptr[r] + c
    nnz = ptr[R]
    rec = np.zeros((nnz, 4), dtype=np.int32)
    mass = np.zeros(R, dtype=np.float64)
    wts = np.empty(K, dtype=np.float64)
    tps = np.empty(K, dtype=np.int32)
    prob = np.empty(K, dtype=np.float64)
    alias = np.empty(K, dtype=np.int32)
    small = np.empty(K, dtype=np.int64)
    large = np.empty(K, dtype=np.int64)
    for r in range(R):
        a = ptr[r]
        n = ptr[r + 1] - a
        if n == 0:
            continue
        j = 0
        tot = 0.0
        for k in range(K):
            c = stale_nwk[r, k]
            if c > 0:
                wts[j] = c * inv[k]
                tps[j] = k
                tot += wts[j]
                j += 1
        mass[r] = tot
        _vose(wts, n, tot, prob, alias, tps, small, large)
        for j in range(n):
            rec[a + j, 0] = tps[j]
            rec[a + j, 1] = alias[j]
            rec[a + j, 2] = min(int(prob[j] * 2147483648.0), 2147483647)
    b_prob = np.empty(K, dtype=np.float64)
    b_alias = np.empty(K, dtype=np.int32)
    btot = 0.0
    for k in range(K):
        wts[k] = beta * inv[k]
        tps[k] = k
        btot += wts[k]
    _vose(wts, K, btot, b_prob, b_alias, tps, small, large)
    return ptr, rec, mass, b_prob, b_alias, btot


# ----------------------------------------------------------------------------------------------
# LightLDA Metropolis-Hastings


@njit(nogil=True, cache=True)
def sample_mh(doc_ptr: np.ndarray, words: np.ndarray, z: np.ndarray, ndk: np.ndarray, nwk: np.ndarray,
              stale: np.ndarray, amap: np.ndarray, nk: np.ndarray, stale_nk: np.ndarray, a_ptr: np.ndarray,
              a_rec: np.ndarray, a_mass: np.ndarray, b_prob: np.ndarray, b_alias: np.ndarray, b_mass: float,
              alpha: float, beta: float, vbeta: float, mh_steps: int, doc_lo: int, doc_hi: int,
              seed: int) -> tuple[int, int]:
    """One MH sweep over documents [doc_lo, doc_hi): O(mh_steps) per token, independent of K.

    ``nwk`` holds the fresh local counts n_wk (updated in place); the alias tables and ``stale`` (the
    counts they were built from) may cover more rows: ``amap[r]`` is nwk's row r among them (the
    worker builds them once per clock over all the words of the clock's mini-batches, while ``nwk``
    holds one mini-batch's rows). Steps alternate word proposal (even) and doc proposal (odd); the
    word proposal's own density is evaluated from the stale counts, the target from the fresh ones
    (``ndk``, ``nwk``, ``nk``, updated in place), so the chain stays exact. Returns (accepted,
    proposed) counts of proposals with t != s.
    """
    K = nk.shape[0]
    Kalpha = K * alpha
    inv = np.empty(K)       # 1 / (n_k + Vβ), fresh
    qinv = np.empty(K)      # 1 / (stale n_k + Vβ)
    for k in range(K):
        inv[k] = 1.0 / (_pos(nk[k]) + vbeta)
        qinv[k] = 1.0 / (_pos(stale_nk[k]) + vbeta)
    st = seed_state(seed)
    accepted = 0
    proposed = 0
    for d in range(doc_lo, doc_hi):
        p0 = doc_ptr[d]
        nd = doc_ptr[d + 1] - p0
        for i in range(p0, p0 + nd):
            w = words[i]
            s = z[i]
            ndk[d, s] -= 1
            nwk[w, s] -= 1
            nk[s] -= 1
            inv[s] = 1.0 / (_pos(nk[s]) + vbeta)
            aw = amap[w]
            am = a_mass[aw]
            ab = am + b_mass
            aptr = a_ptr[aw]
            an = a_ptr[aw + 1] - aptr
            for step in range(mh_steps):
                st, u = _rand(st)
                if step % 2 == 0:
                    # word proposal from the alias tables
                    x = u * ab
                    if x < am:
                        y = x / am * an
                        j = int(y)
                        if j >= an:
                            j = an - 1
                        if (y - j) * 2147483648.0 < a_rec[aptr + j, 2]:
                            t = a_rec[aptr + j, 0]
                        else:
                            t = a_rec[aptr + j, 1]
                    else:
                        y = (x - am) / b_mass * K
                        j = int(y)
                        if j >= K:
                            j = K - 1
                        if (y - j) < b_prob[j]:
                            t = j
                        else:
                            t = b_alias[j]
                    if t == s:
                        continue
                    proposed += 1
                    # target p(k) ∝ (n_dk+α)(n_wk+β)/(n_k+Vβ); proposal q(k) from the stale counts
                    pt = (ndk[d, t] + alpha) * (_pos(nwk[w, t]) + beta) * inv[t]
                    ps = (ndk[d, s] + alpha) * (_pos(nwk[w, s]) + beta) * inv[s]
                    qt = (_pos(stale[aw, t]) + beta) * qinv[t]
                    qs = (_pos(stale[aw, s]) + beta) * qinv[s]
                    st, v = _rand(st)
                    if v * ps * qt < pt * qs:
                        s = t
                        z[i] = t
                        accepted += 1
                else:
                    # doc proposal: q(k) ∝ n_dk(current state) + α, by picking a random token
                    x = u * (nd + Kalpha)
                    if x < nd:
                        j = int(x)
                        if j >= nd:
                            j = nd - 1
                        t = z[p0 + j]
                    else:
                        t = int((x - nd) / alpha)
                        if t >= K:
                            t = K - 1
                    if t == s:
                        continue
                    proposed += 1
                    # the doc factors cancel against the proposal: ratio of word factors only
                    st, v = _rand(st)
                    if v * (_pos(nwk[w, s]) + beta) * inv[s] < (_pos(nwk[w, t]) + beta) * inv[t]:
                        s = t
                        z[i] = t
                        accepted += 1
            z[i] = s
            ndk[d, s] += 1
            nwk[w, s] += 1
            nk[s] += 1
            inv[s] = 1.0 / (_pos(nk[s]) + vbeta)
    return accepted, proposed


# ----------------------------------------------------------------------------------------------
# the worker's count changes


@njit(nogil=True, cache=True)
def count_changes(cur: np.ndarray, snap: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Net changes ``cur - snap`` of a (rows x K) block as COO (row, col, delta), in one pass.

    What a mini-batch sends: most entries of the dense difference are zero, and numpy's
    subtract / nonzero / gather would pass over the block three times with two temporaries.
    """
    R, K = cur.shape
    n = 0
    for r in range(R):
        for k in range(K):
            if cur[r, k] != snap[r, k]:
                n += 1
    rows = np.empty(n, dtype=np.int64)
    cols = np.empty(n, dtype=np.int64)
    vals = np.empty(n, dtype=cur.dtype)
    j = 0
    for r in range(R):
        for k in range(K):
            v = cur[r, k] - snap[r, k]
            if v != 0:
                rows[j] = r
                cols[j] = k
                vals[j] = v
                j += 1
    return rows, cols, vals
