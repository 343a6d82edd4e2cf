"""numba kernels for softmax (multiclass logistic) regression over CSR sparse features.

Model: p(y = k | x) = softmax_k(W_k . x + b_k), K classes, F features. Objective per sample:
log-loss -log p(y | x); L2 penalty (reg / 2) ||W||^2 on the weights (not the biases).

Local layout (why it differs from the PS table): the PS keeps one row per class, as Bösen does
(``W[k, :F]`` weights, ``W[k, F]`` bias). The kernels work on the transpose ``V[j, :]`` (F x K, all
K class weights of feature j contiguous), because a sparse sample touches a few features and needs
all K classes of each: with V, both the forward pass and the gradient scatter stream contiguous
K-vectors, which numba turns into SIMD loops; with the class-row layout every nonzero would stride
through K rows. ``model.LocalModel`` converts at synchronization points only.

L2 is applied exactly but lazily: the local weights are ``W = s * V`` with a scalar ``s``. One SGD
step W <- (1 - lr reg) W - lr g becomes s <- s (1 - lr reg); V <- V - (lr / s) g, so a minibatch
costs O(nnz K) instead of O(F K) for decaying every weight. ``s`` is folded back into V when it
gets small, keeping float32 precise.

All kernels are ``@njit(nogil=True, cache=True)``: they release the GIL (the client's communication
thread keeps running during compute) and compile once per machine.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["sgd_pass", "evaluate", "logits", "loss_grad"]

_RESCALE_BELOW = 1e-3


@njit(nogil=True, cache=True, fastmath=True)
def _logits(indptr, indices, values, i, V, b, s, z):  # pragma: no cover - numba
    K = b.shape[0]
    for k in range(K):
        z[k] = 0.0
    for p in range(indptr[i], indptr[i + 1]):
        j = indices[p]
        x = values[p]
        for k in range(K):
            z[k] += x * V[j, k]
    for k in range(K):
        z[k] = s * z[k] + b[k]


@njit(nogil=True, cache=True, fastmath=True)
def _softmax_inplace(z):  # pragma: no cover - numba
    """z <- softmax(z); returns log-sum-exp of the input (for the loss)."""
    m = z[0]
    for k in range(1, z.shape[0]):
        if z[k] > m:
            m = z[k]
    tot = 0.0
    for k in range(z.shape[0]):
        e = np.exp(z[k] - m)
        z[k] = e
        tot += e
    inv = 1.0 / tot
    for k in range(z.shape[0]):
        z[k] *= inv
    return m + np.log(tot)


@njit(nogil=True, cache=True, fastmath=True)
def sgd_pass(indptr: np.ndarray, indices: np.ndarray, values: np.ndarray, labels: np.ndarray,
             order: np.ndarray, batch_size: int, V: np.ndarray, b: np.ndarray, scale: np.ndarray,
             lr: float, reg: float) -> float:  # pragma: no cover - numba
    """Minibatch SGD over the samples ``order`` (in that order), updating V, b, scale in place.

    Each minibatch of B samples computes every probability with the weights at the start of the
    batch, then applies W <- W - lr (mean gradient + reg W), b <- b - lr (mean bias gradient).
    Returns the summed log-loss of the samples, each taken before its batch's update (the usual
    "progressive" training loss: free, since the forward pass computes it anyway).
    """
    K = b.shape[0]
    n = order.shape[0]
    R = np.empty((batch_size, K), V.dtype)
    db = np.empty(K, np.float64)
    s = scale[0]
    loss = 0.0
    for start in range(0, n, batch_size):
        B = min(batch_size, n - start)
        for t in range(B):
            i = order[start + t]
            z = R[t]
            _logits(indptr, indices, values, i, V, b, s, z)
            y = labels[i]
            zy = z[y]
            lse = _softmax_inplace(z)
            loss += lse - zy
            z[y] -= 1.0  # residual p - onehot(y): the logit gradient
        if reg > 0.0:
            s *= 1.0 - lr * reg
        c = lr / (B * s)
        for k in range(K):
            db[k] = 0.0
        for t in range(B):
            i = order[start + t]
            r = R[t]
            for k in range(K):
                db[k] += r[k]
            for p in range(indptr[i], indptr[i + 1]):
                j = indices[p]
                f = np.float32(c * values[p])
                for k in range(K):
                    V[j, k] -= f * r[k]
        cb = lr / B
        for k in range(K):
            b[k] -= np.float32(cb * db[k])
        if s < _RESCALE_BELOW:
            V *= s
            s = 1.0
    scale[0] = s
    return loss


@njit(nogil=True, cache=True, fastmath=True)
def evaluate(indptr: np.ndarray, indices: np.ndarray, values: np.ndarray, labels: np.ndarray,
             V: np.ndarray, b: np.ndarray, s: float | np.float32) -> tuple[int, float]:  # pragma: no cover - numba
    """(correct predictions, summed log-loss) of the model W = s V, b on all samples."""
    K = b.shape[0]
    n = labels.shape[0]
    z = np.empty(K, V.dtype)
    correct = 0
    loss = 0.0
    for i in range(n):
        _logits(indptr, indices, values, i, V, b, s, z)
        y = labels[i]
        best = 0
        for k in range(1, K):
            if z[k] > z[best]:
                best = k
        if best == y:
            correct += 1
        zy = z[y]
        lse = _softmax_inplace(z)
        loss += lse - zy
    return correct, loss


@njit(nogil=True, cache=True, fastmath=True)
def logits(indptr: np.ndarray, indices: np.ndarray, values: np.ndarray, V: np.ndarray,
           b: np.ndarray) -> np.ndarray:  # pragma: no cover - numba
    """(n, K) logits of every sample under W = V (F x K layout), b."""
    n = indptr.shape[0] - 1
    out = np.empty((n, b.shape[0]), V.dtype)
    for i in range(n):
        _logits(indptr, indices, values, i, V, b, 1.0, out[i])
    return out


@njit(nogil=True, cache=True)
def loss_grad(indptr: np.ndarray, indices: np.ndarray, values: np.ndarray, labels: np.ndarray,
              rows: np.ndarray, W: np.ndarray) -> tuple[float, np.ndarray]:  # pragma: no cover - numba
    """Summed log-loss and its gradient w.r.t. the class-row table W (K x (F+1), bias last) over
    samples ``rows``. The plain definition, in the PS layout: tests check the fast path against it."""
    K = W.shape[0]
    F = W.shape[1] - 1
    G = np.zeros((K, F + 1), np.float64)
    z = np.empty(K, np.float64)
    loss = 0.0
    for t in range(rows.shape[0]):
        i = rows[t]
        for k in range(K):
            z[k] = W[k, F]
        for p in range(indptr[i], indptr[i + 1]):
            j = indices[p]
            for k in range(K):
                z[k] += W[k, j] * values[p]
        y = labels[i]
        zy = z[y]
        lse = _softmax_inplace(z)
        loss += lse - zy
        z[y] -= 1.0
        for k in range(K):
            G[k, F] += z[k]
        for p in range(indptr[i], indptr[i + 1]):
            j = indices[p]
            for k in range(K):
                G[k, j] += z[k] * values[p]
    return loss, G
