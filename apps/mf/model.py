"""The MF model as a worker computes on it: the L and R rows one mini-batch reads, and its step.

L (users x rank) and R (items x rank) live in the PS. A worker cuts its ratings into fixed batches
(:func:`batches`); each :class:`Batch` reads exactly the rows it needs (``users``, ``items``: unique
sorted ids, one ``get_rows`` per table) and the kernels work on local copies indexed by
``u_idx``/``i_idx``. What goes back to the PS: ``new - old`` after a local SGD pass (:meth:`Batch.sgd`,
for ``add`` tables), or the gradient at the values read (:meth:`Batch.gradient`, for tables whose
stored procedure takes the step on the server).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bosen.apps.mf.data import Triples
from bosen.apps.mf.kernels import grad_pass, sgd_pass

__all__ = ["Batch", "batches", "merge"]


@dataclass
class Batch:
    """The ratings of one mini-batch, re-indexed into the local row blocks it reads."""

    users: np.ndarray  # unique sorted global L row ids
    items: np.ndarray  # unique sorted global R row ids
    u_idx: np.ndarray  # per rating: index into users
    i_idx: np.ndarray  # per rating: index into items
    r: np.ndarray

    def sgd(self, Lv: np.ndarray, Rv: np.ndarray, lr: float, reg: float,
            order: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """One SGD pass in ``order`` on local copies of the rows read (``Lv``, ``Rv``); returns
        (running loss, new L - Lv, new R - Rv).

        The loss is sgd_pass's: each rating's squared error just before its own update. It costs
        nothing, where the exact loss at the rows read is a second pass over the ratings (measured: it
        added 27% to Batch.sgd on MovieLens-100K); the two differ by the progress made within the pass."""
        Lw = np.array(Lv, dtype=np.float32, order="C")
        Rw = np.array(Rv, dtype=np.float32, order="C")
        loss = float(sgd_pass(self.u_idx, self.i_idx, self.r, Lw, Rw, lr, reg, order))
        return loss, Lw - Lv, Rw - Rv

    def gradient(self, Lv: np.ndarray, Rv: np.ndarray, reg: float) -> tuple[float, np.ndarray, np.ndarray]:
        """(loss, gradient w.r.t. the L rows, gradient w.r.t. the R rows) at the rows read."""
        gL = np.zeros(Lv.shape, dtype=np.float32)
        gR = np.zeros(Rv.shape, dtype=np.float32)
        loss = float(grad_pass(self.u_idx, self.i_idx, self.r, np.ascontiguousarray(Lv, dtype=np.float32),
                               np.ascontiguousarray(Rv, dtype=np.float32), reg, gL, gR))
        return loss, gL, gR


def batches(part: Triples, k: int, rng: np.random.Generator) -> list[Batch]:
    """Cut a worker's ratings into k fixed random batches (each clock's loss then covers 1/k of them)."""
    u, i, r = part
    out = []
    for sel in np.array_split(rng.permutation(u.size), k):
        sel = np.sort(sel)
        users, u_idx = np.unique(u[sel], return_inverse=True)
        items, i_idx = np.unique(i[sel], return_inverse=True)
        out.append(Batch(users.astype(np.int64), items.astype(np.int64), u_idx.astype(np.int64),
                         i_idx.astype(np.int64), np.ascontiguousarray(r[sel], dtype=np.float32)))
    return out


def merge(parts: list[Batch]) -> Batch:
    """One batch of the ratings of ``parts``, in their order (micro-tasks' batches a worker runs as
    one); a single part comes back as it is."""
    if len(parts) == 1:
        return parts[0]
    if not parts:
        z = np.zeros(0, np.int64)
        return Batch(z, z, z, z, np.zeros(0, np.float32))
    u = np.concatenate([p.users[p.u_idx] for p in parts])
    i = np.concatenate([p.items[p.i_idx] for p in parts])
    users, u_idx = np.unique(u, return_inverse=True)
    items, i_idx = np.unique(i, return_inverse=True)
    return Batch(users.astype(np.int64), items.astype(np.int64), u_idx.astype(np.int64), i_idx.astype(np.int64),
                 np.concatenate([p.r for p in parts]))
