"""The MLR model as a worker holds it: a local copy of the weight table, trained by the kernels.

The PS keeps one row per class (``W[k, :F]`` weights, ``W[k, F]`` bias); the kernels want the
transpose, scaled lazily for L2 (``W = s * V``, see kernels.py). :class:`LocalModel` holds the
kernels' layout and converts from and to the PS layout only when the worker synchronizes.
"""

from __future__ import annotations

import numpy as np

from bosen.apps.mlr.data import Dataset
from bosen.apps.mlr.kernels import evaluate, sgd_pass

__all__ = ["LocalModel"]


class LocalModel:
    """A worker's working copy of the weight table, in the kernels' layout (see module doc).

    float32 whatever the table dtype: the kernels are specialized for it (SIMD width, memory).
    """

    def __init__(self, classes: int, features: int) -> None:
        self.V = np.zeros((features, classes), dtype=np.float32)
        self.b = np.zeros(classes, dtype=np.float32)
        self.scale = np.ones(1, dtype=np.float64)

    def load(self, W: np.ndarray) -> None:
        """Take the PS rows (K x (F+1), bias last) as the current weights."""
        np.copyto(self.V, W[:, :-1].T)
        np.copyto(self.b, W[:, -1])
        self.scale[0] = 1.0

    def table(self) -> np.ndarray:
        """The current weights in the PS layout (K x (F+1))."""
        K = self.b.shape[0]
        return self.store(np.empty((K, self.V.shape[0] + 1), dtype=np.float32))

    def store(self, out: np.ndarray) -> np.ndarray:
        """Write the current weights into ``out`` (K x (F+1), the PS layout; a view's array) and return it."""
        np.multiply(self.V.T, np.float32(self.scale[0]), out=out[:, :-1])
        out[:, -1] = self.b
        return out

    def train(self, ds: Dataset, order: np.ndarray, batch_size: int, lr: float, reg: float) -> float:
        """Minibatch SGD over ``order`` (sample ids of ``ds``); returns the summed training log-loss."""
        return float(sgd_pass(ds.indptr, ds.indices, ds.values, ds.labels, order, batch_size,
                              self.V, self.b, self.scale, lr, reg))

    def evaluate(self, ds: Dataset) -> tuple[int, float]:
        """(correct, summed log-loss) on ``ds``."""
        correct, loss = evaluate(ds.indptr, ds.indices, ds.values, ds.labels, self.V, self.b,
                                 np.float32(self.scale[0]))
        return int(correct), float(loss)
