"""Kernel benchmark for SGD-MF: our numba ``sgd_pass`` beside a vectorized NumPy minibatch SGD.

Baseline choice: scikit-learn has no SGD matrix factorization, and PyTorch / Surprise are not
dependencies of this project, so the baseline is the standard way to write SGD-MF with the one
numerical library every user has: NumPy minibatch SGD (gather rows, einsum the predictions,
scatter-add the same per-rating gradient steps with ``np.add.at``), same data, same initial
factors, same lr/reg, same rating order, same number of passes. Besides ratings/s we report the
loss each reaches after that work, since minibatching trades per-pass progress for vector speed.

``python bench/apps_mf.py [--quick]`` prints one JSON line per result (``bench/apps.py`` runs it too).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from bosen.apps.mf.data import synthetic
from bosen.apps.mf.kernels import sgd_pass, squared_loss

BATCH = 1024


def numpy_sgd_pass(u: np.ndarray, i: np.ndarray, r: np.ndarray, L: np.ndarray, R: np.ndarray,
                   lr: float, reg: float, order: np.ndarray, batch: int = BATCH) -> None:
    """The same update as kernels.sgd_pass, applied ``batch`` ratings at a time (in place)."""
    lr32, reg32 = np.float32(lr), np.float32(reg)
    for s in range(0, order.size, batch):
        j = order[s:s + batch]
        uj, ij = u[j], i[j]
        Lu, Ri = L[uj], R[ij]
        e = (r[j] - np.einsum("ij,ij->i", Lu, Ri))[:, None]
        np.add.at(L, uj, lr32 * (e * Ri - reg32 * Lu))
        np.add.at(R, ij, lr32 * (e * Lu - reg32 * Ri))


def _run(step, u, i, r, L0, R0, lr, reg, orders) -> tuple[float, float]:
    L, R = L0.copy(), R0.copy()
    t0 = time.perf_counter()
    for ep, order in enumerate(orders):
        step(u, i, r, L, R, lr * 0.95 ** ep, reg, order)
    dt = time.perf_counter() - t0
    return dt, float(squared_loss(u, i, r, L, R))


def run_bench(quick: bool = False) -> list[dict]:
    """Measure SGD pass throughput (ratings/s) and loss after equal work, ours vs the baseline."""
    n_users, n_items, rank, nnz, epochs = ((10_000, 2_000, 16, 200_000, 3) if quick
                                           else (50_000, 10_000, 32, 2_000_000, 5))
    lr, reg = 0.08, 0.02
    u, i, r = synthetic(n_users, n_items, rank, nnz, noise=0.1, seed=0, alpha=0.8)
    rng = np.random.default_rng(0)
    L0 = (rng.standard_normal((n_users, rank)) * 0.1).astype(np.float32)
    R0 = (rng.standard_normal((n_items, rank)) * 0.1).astype(np.float32)
    orders = [rng.permutation(nnz) for _ in range(epochs)]
    sgd_pass(u[:10], i[:10], r[:10], L0.copy(), R0.copy(), lr, reg, np.arange(10))  # compile/load
    t_ours, loss_ours = _run(sgd_pass, u, i, r, L0, R0, lr, reg, orders)
    t_base, loss_base = _run(numpy_sgd_pass, u, i, r, L0, R0, lr, reg, orders)
    loss0 = float(squared_loss(u, i, r, L0, R0))
    ours, base = nnz * epochs / t_ours, nnz * epochs / t_base
    name = f"numpy minibatch SGD (batch {BATCH}, np.add.at)"
    common = {"bench": "apps", "case": "mf", "baseline_name": name, "n_users": n_users,
              "n_items": n_items, "rank": rank, "nnz": nnz, "epochs": epochs, "initial_loss": loss0}
    return [
        {**common, "metric": "sgd_throughput", "unit": "ratings/s", "ours": ours, "baseline": base,
         "ratio": ours / base, "loss_ours": loss_ours, "loss_baseline": loss_base},
        {**common, "metric": "loss_after_equal_work", "unit": "squared loss (lower is better)",
         "ours": loss_ours, "baseline": loss_base, "ratio": loss_base / loss_ours},
    ]


if __name__ == "__main__":
    for rec in run_bench(quick="--quick" in sys.argv[1:]):
        print(json.dumps(rec))
