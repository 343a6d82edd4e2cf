"""``update: adarevision``: AdaRevision (McMahan & Streeter 2014), the rule of reference/adarevision.md.

Per coordinate the server keeps x, the sum of applied gradients ḡ, the accumulator z and its running
maximum z'. A client sends a raw gradient g tagged with the row version v it read; with
ḡ_old = ḡ as of version v (0 for version 0):

    g_bck = ḡ − ḡ_old
    η_old = α / √z'
    z     = z + g² + 2·g·g_bck
    z'    = max(z, z')
    η     = α / √z'
    x     = x − η·g + (η_old − η)·g_bck
    ḡ     = ḡ + g

With no delay (g_bck = 0) this is per-coordinate AdaGrad with z starting at 1 (``update: adagrad``),
bit for bit. ḡ_old comes from the refcounted snapshots of ``versioning.SnapshotStore``. While more
than ``max_snapshots`` snapshot copies are live, budgeted (early) pushes stop: clients then keep
their versions and no new held versions are created until releases free some.

update_args: ``alpha`` (default 0.1), ``init_z`` (initial z and z', default 1.0),
``max_snapshots`` (default 10000).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from bosen.config import TableConfig
from bosen.errors import ProtocolError
from bosen.procedure import StoredProcedure
from bosen.server.procedures.common import count, gradients, positive
from bosen.server.procedures.versioning import CURRENT, INVALID, ZERO, SnapshotStore, copy_on_write, lookup
from bosen.wire import UpdateBatch


@njit(nogil=True, cache=True, inline="always")
def _coord(x, z, zmax, gsum, r, j, gj, gb, alpha):  # pragma: no cover - compiled
    """adarevision.md for one coordinate: gradient ``gj``, backlog g_bck = ``gb``."""
    zm = zmax[r, j]
    eta_old = alpha / np.sqrt(zm)
    zz = z[r, j] + gj * gj + 2.0 * gj * gb
    z[r, j] = zz
    zm = max(zz, zm)
    zmax[r, j] = zm
    eta = alpha / np.sqrt(zm)
    x[r, j] = np.float64(x[r, j]) - eta * gj + (eta_old - eta) * gb
    gsum[r, j] += gj


@njit(nogil=True, cache=True)
def _row(x, z, zmax, gsum, r, old, g, gi, alpha):  # pragma: no cover - compiled
    """The rule for one dense row: ``old`` is ḡ as of the update's version (a row), ``g[gi]`` the
    gradient. Branch-free, so LLVM vectorizes it; g_bck = ḡ − ḡ_old is exactly 0 when ``old`` is
    the live ḡ row (current version), which makes the step AdaGrad's, bit for bit."""
    for j in range(x.shape[1]):
        _coord(x, z, zmax, gsum, r, j, np.float64(g[gi, j]), gsum[r, j] - old[j], alpha)


@njit(nogil=True, cache=True)
def _old_row(gsum, pool, zeros, where, r):  # pragma: no cover - compiled
    """ḡ as of the tagged version: the live row (current), zeros (version 0) or a snapshot copy."""
    if where == CURRENT:
        return gsum[r]
    if where == ZERO:
        return zeros
    return pool[where]


@njit(nogil=True, cache=True)
def adarev_dense(x, z, zmax, gsum, rows, tags, g, alpha,
                 index, versions, cur_ref, pool, refcnt, free, nfree):  # pragma: no cover - compiled
    zeros = np.zeros(x.shape[1])
    scratch = np.empty(x.shape[1])
    for i in range(rows.shape[0]):
        r = rows[i]
        where = lookup(index, versions, r, tags[i])
        if where == INVALID:  # validated before; never revise from unknown state
            where = CURRENT
        copy_on_write(index, versions, cur_ref, pool, refcnt, free, nfree, gsum, r)
        old = _old_row(gsum, pool, zeros, where, r)
        if where == CURRENT:  # the live row changes as we go: g_bck must stay exactly 0
            scratch[:] = old
            old = scratch
        _row(x, z, zmax, gsum, r, old, g, i, alpha)
        versions[r] += 1


@njit(nogil=True, cache=True)
def adarev_csr(x, z, zmax, gsum, rows, indptr, cols, tags, g, alpha,
               index, versions, cur_ref, pool, refcnt, free, nfree):  # pragma: no cover - compiled
    zeros = np.zeros(x.shape[1])
    for i in range(rows.shape[0]):
        r = rows[i]
        where = lookup(index, versions, r, tags[i])
        if where == INVALID:
            where = CURRENT
        copy_on_write(index, versions, cur_ref, pool, refcnt, free, nfree, gsum, r)
        old = _old_row(gsum, pool, zeros, where, r)
        for k in range(indptr[i], indptr[i + 1]):
            j = cols[k]
            gb = gsum[r, j] - old[j] if where != CURRENT else 0.0
            _coord(x, z, zmax, gsum, r, j, np.float64(g[k]), gb, alpha)
        versions[r] += 1


class AdaRevision(StoredProcedure):
    read_my_writes = False
    versioned = True
    float_only = True
    moves_versions = True

    def __init__(self, table: TableConfig, alpha: float = 0.1, init_z: float = 1.0,
                 max_snapshots: int = 10000) -> None:
        super().__init__(table)
        self.alpha = positive("alpha", alpha)
        self.init_z = positive("init_z", init_z)
        self.max_snapshots = count("max_snapshots", max_snapshots)
        self.store = SnapshotStore(0, table.cols)

    def create(self, global_rows: np.ndarray, values: np.ndarray) -> None:
        n, cols = values.shape
        self.z = np.full((n, cols), self.init_z, dtype=np.float64)
        self.zmax = self.z.copy()
        self.gsum = np.zeros((n, cols), dtype=np.float64)
        self.store = SnapshotStore(n, cols)
        self.versions = self.store.versions

    def grow(self, global_rows: np.ndarray, values: np.ndarray, stored: int) -> None:
        """A sparse shard grew: the accumulators get rows at their initial values (z = z' = init_z,
        ḡ = 0) and the version store rows at version 0, as a dense table's rows start; the snapshot
        copies clients still hold are kept (re-creating the store would lose them)."""
        n, cols = values.shape
        old = self.z.shape[0]
        for name, fill in (("z", self.init_z), ("zmax", self.init_z), ("gsum", 0.0)):
            a = np.full((n, cols), fill, dtype=np.float64)
            a[:old] = getattr(self, name)
            setattr(self, name, a)
        self.store.grow(n)
        self.versions = self.store.versions

    def apply(self, values: np.ndarray, local_rows: np.ndarray, batch: UpdateBatch, client: int) -> None:
        s = self.store
        tags = batch.tags
        assert tags is not None  # the shard accepts only tagged updates for a versioned table
        bad = s.first_invalid(local_rows, tags)
        if bad >= 0:
            r = int(local_rows[bad])  # a local row (a slot of a sparse table); the batch names its id
            raise ProtocolError(f"INC: table {self.table.name!r} row {int(batch.rows[bad])}: update tagged "
                                f"with version {int(tags[bad])}, which no client holds (row is at version "
                                f"{int(s.versions[r])})")
        s.reserve(local_rows.shape[0])
        g = gradients(values, batch)
        if batch.sparse:
            adarev_csr(values, self.z, self.zmax, self.gsum, local_rows, batch.indptr, batch.cols, tags, g,
                       self.alpha, s.index, s.versions, s.cur_ref, s.pool, s.refcnt, s.free, s.nfree)
        else:
            adarev_dense(values, self.z, self.zmax, self.gsum, local_rows, tags, g, self.alpha,
                         s.index, s.versions, s.cur_ref, s.pool, s.refcnt, s.free, s.nfree)
        s.note_peak()

    def rows_sent(self, local_rows: np.ndarray, num_clients: int) -> None:
        self.store.rows_sent(local_rows, num_clients)

    def release(self, local_rows: np.ndarray, versions: np.ndarray) -> None:
        errors = self.store.release(local_rows, versions)
        if errors:
            raise ProtocolError(f"INC: table {self.table.name!r}: {errors} released row versions were not held")

    def held(self, local_rows: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        mask = np.zeros(self.store.versions.shape[0], dtype=bool)
        mask[local_rows] = True
        return self.store.cur_ref[local_rows].copy(), self.store.copies(mask)

    def hold(self, local_rows: np.ndarray, refs: np.ndarray, copies: dict[str, np.ndarray]) -> None:
        self.store.adopt(local_rows, refs, copies)

    def allow_push(self) -> bool:
        return self.store.live <= self.max_snapshots

    def state(self) -> dict[str, np.ndarray]:
        """Accumulators and row versions. Snapshots held by clients are not saved: a job resumed from a
        checkpoint starts with clients that hold nothing."""
        return {"z": self.z, "zmax": self.zmax, "gsum": self.gsum, "versions": self.store.versions}

    def stats(self) -> dict[str, Any]:
        return {"procedure": "adarevision", "alpha": self.alpha, "snapshot_cap": self.max_snapshots,
                **self.store.stats()}
