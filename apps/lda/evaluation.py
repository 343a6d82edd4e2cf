"""Numba kernels that measure an LDA model: the complete-data log-likelihood log p(w, z) and the
held-out log-likelihood by document completion.

log p(w, z) (Griffiths & Steyvers) is split into additive parts (:func:`loglik_docs`,
:func:`loglik_words`, :func:`loglik_summary`) so that each worker sums the part of it it holds and
the parts add up across workers. Counts read from the PS may be negative under bounded staleness:
the log-likelihood treats them as 0. Document completion (:func:`fold_in`, then
:func:`completion_loglik`) scores each held-out document's unseen half with θ inferred from its
seen half, the topics held fixed.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

# the samplers' random stream and count clamp, so fold-in draws exactly as they do
from bosen.apps.lda.sampling import _pos, _rand, seed_state

# ----------------------------------------------------------------------------------------------
# complete-data log-likelihood log p(w, z) (Griffiths & Steyvers), split into additive parts


@njit(nogil=True, cache=True)
def _lgamma_table(x, n):
    """t[i] = lgamma(x + i) - lgamma(x) for i < n."""
    t = np.empty(n)
    base = math.lgamma(x)
    for i in range(n):
        t[i] = math.lgamma(x + i) - base
    return t


@njit(nogil=True, cache=True)
def _sum_lgamma_counts(counts, x, mask):
    """Σ over rows r with mask[r], entries c > 0 of lgamma(c + x) - lgamma(x)."""
    R, K = counts.shape
    mx = 0
    for r in range(R):
        if mask[r]:
            for k in range(K):
                if counts[r, k] > mx:
                    mx = counts[r, k]
    cap = min(mx + 1, 1 << 16)
    tab = _lgamma_table(x, cap)
    base = math.lgamma(x)
    ll = 0.0
    for r in range(R):
        if mask[r]:
            for k in range(K):
                c = counts[r, k]
                if c > 0:
                    ll += tab[c] if c < cap else math.lgamma(c + x) - base
    return ll


@njit(nogil=True, cache=True)
def loglik_docs(ndk: np.ndarray, alpha: float) -> float:
    """Doc part of log p(z): Σ_d [lgamma(Kα) - lgamma(N_d + Kα) + Σ_k lgamma(n_dk+α) - lgamma(α)]."""
    D, K = ndk.shape
    mask = np.ones(D, dtype=np.bool_)
    ll = _sum_lgamma_counts(ndk, alpha, mask)
    ka = K * alpha
    lka = math.lgamma(ka)
    for d in range(D):
        nd = 0
        for k in range(K):
            nd += ndk[d, k]
        ll += lka - math.lgamma(nd + ka)
    return ll


@njit(nogil=True, cache=True)
def loglik_words(nwk: np.ndarray, beta: float, mask: np.ndarray) -> float:
    """Word part of log p(w|z) over rows with mask: Σ_{w,k} lgamma(n_wk+β) - lgamma(β)."""
    return _sum_lgamma_counts(nwk, beta, mask)


@njit(nogil=True, cache=True)
def loglik_summary(nk: np.ndarray, n_vocab: int, beta: float) -> float:
    """Topic part of log p(w|z): Σ_k lgamma(Vβ) - lgamma(n_k + Vβ)."""
    vb = n_vocab * beta
    lvb = math.lgamma(vb)
    ll = 0.0
    for k in range(nk.size):
        ll += lvb - math.lgamma(_pos(nk[k]) + vb)
    return ll


# ----------------------------------------------------------------------------------------------
# held-out log-likelihood by document completion


@njit(nogil=True, cache=True)
def fold_in(doc_ptr: np.ndarray, words: np.ndarray, phi: np.ndarray, alpha: float, sweeps: int, burn_in: int,
            seed: int) -> np.ndarray:
    """θ of each document from its observed tokens with the topics ``phi`` held fixed.

    ``words`` index rows of ``phi`` (local ids, W x K, each column a topic's word distribution over
    the rows it has). Gibbs sampling of the tokens' topics with p(k) ∝ (n_dk + α) φ_wk; θ_d is
    (n_dk + α)/(N_d + Kα) averaged over the sweeps after ``burn_in``.
    """
    D = doc_ptr.size - 1
    K = phi.shape[1]
    s = seed_state(seed)
    theta = np.zeros((D, K), dtype=np.float64)
    p = np.empty(K, dtype=np.float64)
    ndk = np.zeros(K, dtype=np.int64)
    start = burn_in if sweeps > burn_in else 0  # sweeps whose θ is averaged: start..sweeps-1
    kept = sweeps - start
    for d in range(D):
        a, b = doc_ptr[d], doc_ptr[d + 1]
        n = b - a
        z = np.empty(n, dtype=np.int64)
        ndk[:] = 0
        for t in range(n):
            s, u = _rand(s)
            k = min(int(u * K), K - 1)
            z[t] = k
            ndk[k] += 1
        for sweep in range(sweeps):
            for t in range(n):
                w = words[a + t]
                ndk[z[t]] -= 1
                total = 0.0
                for k in range(K):
                    total += (ndk[k] + alpha) * phi[w, k]
                    p[k] = total
                s, u = _rand(s)
                x = u * total
                k = 0
                while k < K - 1 and p[k] <= x:
                    k += 1
                z[t] = k
                ndk[k] += 1
            if sweep >= start:
                norm = 1.0 / (n + K * alpha)
                for k in range(K):
                    theta[d, k] += (ndk[k] + alpha) * norm / kept
        if sweeps == 0:
            for k in range(K):
                theta[d, k] = (ndk[k] + alpha) / (n + K * alpha)
    return theta


@njit(nogil=True, cache=True)
def completion_loglik(doc_ptr: np.ndarray, words: np.ndarray, theta: np.ndarray, phi: np.ndarray) -> float:
    """Σ over the tokens of log Σ_k θ_dk φ_wk: the log-likelihood of each document's unseen half."""
    K = phi.shape[1]
    ll = 0.0
    for d in range(doc_ptr.size - 1):
        for t in range(doc_ptr[d], doc_ptr[d + 1]):
            w = words[t]
            q = 0.0
            for k in range(K):
                q += theta[d, k] * phi[w, k]
            ll += math.log(q)
    return ll
