"""The stored-procedure interface: how a server table turns incoming updates into new values.

A procedure is chosen per table in YAML (``update: add`` or ``update: mypkg.rules:MyRule`` with
``update_args``). The server calls its hooks; everything is vectorized over rows. ``add`` is the
default and the only one that lets clients show their own updates before the server has applied
them (read-my-writes), because only plain addition commutes with the cache's local copy.

Hooks, in the order the server calls them (local row indices index this server's share of rows):

- ``__init__(table, **update_args)``: bad arguments raise TypeError/ValueError (a ConfigError at start).
- ``create(global_rows, values)``: rows exist with their initial values; allocate per-row state.
- ``grow(global_rows, values, stored)``: sparse tables only: the shard's per-row arrays grew to
  ``values.shape[0]`` slots; the first ``stored`` keep their state, the rest start as ``create``'s.
- ``apply(values, local_rows, batch, client)``: one client's update batch (rows may repeat; apply in
  order). Procedures other than ``add`` receive what apps send for them, e.g. raw gradients.
- ``rows_sent(local_rows, num_clients)``: these rows' current values (and versions) went out.
- ``release(local_rows, versions)``: versioned only; clients no longer hold these row versions
  (one reference each), after their last update computed from them was applied.
- ``held(local_rows)`` / ``hold(local_rows, refs, copies)``: versioned procedures whose partitions
  can move (``moves_versions``): what clients hold of these rows (holders of each current version,
  the snapshot copies of older ones) out of the old server and into the new one (server/shard.py).
- ``hand_over(local_rows)`` / ``check_take_over`` / ``take_over(...)``: any other state that moves with rows (a backup
  table's gradients in progress and its step), out of the old server and into the new one.
- ``allow_push()``: whether budgeted (early) pushes may go out now; ``stats()``: for STATUS.
- ``state()``: the live per-row state a checkpoint saves beside the values and restores into
  (arrays indexed by local row, e.g. AdaGrad's accumulators; their rows are written in place).

A *versioned* procedure (``versioned = True``) keeps ``self.versions`` (int64 per local row, 0 until
the row is first updated); the server sends them with row values, clients tag their updates with the
version they read (``batch.tags``, 0 = never read), and every version a client received is released
exactly once, either by an update marked end-of-version or by an explicit release.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bosen.config import TableConfig
from bosen.wire import UpdateBatch


class StoredProcedure:
    """Base class; the default behaviour is plain addition."""

    #: whether a client may apply its own updates to its cache (only true for plain addition)
    read_my_writes: bool = True
    #: whether rows carry versions and updates carry version tags (see the module docstring)
    versioned: bool = False
    #: per local row version, set by ``create`` in versioned procedures
    versions: np.ndarray | None = None
    #: versioned procedures: whether ``held``/``hold`` hand what clients hold over when partitions move
    moves_versions: bool = False
    #: whether the procedure needs a float table (steps scale the updates)
    float_only: bool = False

    def __init__(self, table: TableConfig, **args: Any) -> None:
        if args:
            raise TypeError(f"unexpected update_args: {', '.join(sorted(args))}")
        self.table = table

    def create(self, global_rows: np.ndarray, values: np.ndarray) -> None:
        """Rows were created with their initial values (may adjust them or allocate state)."""

    def grow(self, global_rows: np.ndarray, values: np.ndarray, stored: int) -> None:
        """A sparse shard grew its per-row arrays to ``values.shape[0]`` slots, of which the first
        ``stored`` hold rows (``global_rows``: their ids, then padding). By default ``create`` runs
        again at the new size and the stored rows' ``state()`` is copied back, so a procedure whose
        ``state()`` names all its per-row arrays needs nothing more; one that keeps other per-row
        bookkeeping (AdaRevision's snapshots) overrides this to keep it."""
        old = {k: v[:stored] for k, v in self.state().items()}  # views: ``create`` makes new arrays
        self.create(global_rows, values)
        for k, v in self.state().items():
            v[:stored] = old[k]

    def apply(self, values: np.ndarray, local_rows: np.ndarray, batch: UpdateBatch, client: int) -> None:
        """Apply one client's batch to ``values`` (local row indices already checked)."""
        import bosen.rowmath as rowmath  # local: keeps numba out of config-only imports (this form
        # skips importlib's Python-level fromlist handling, a microsecond on every message)

        upd = batch.values if batch.values.dtype == values.dtype else batch.values.astype(values.dtype)
        if batch.sparse:
            rowmath.scatter_add_csr(values, local_rows, batch.indptr, batch.cols, upd)
        else:
            rowmath.add_rows(values, local_rows, upd)

    def rows_sent(self, local_rows: np.ndarray, num_clients: int) -> None:
        """These rows' current values were sent to ``num_clients`` clients."""

    def release(self, local_rows: np.ndarray, versions: np.ndarray) -> None:
        """Versioned procedures: one client holder each of these (row, version) pairs is gone."""

    def held(self, local_rows: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Versioned procedures with ``moves_versions``: per row of ``local_rows``, the client holders of
        its current version, and the snapshot copies of those rows that clients still hold ("row": a
        local row, "version", "refcnt", "values"): what moves with the rows beside ``state()``."""
        raise NotImplementedError(f"{type(self).__name__}: its row versions cannot move")

    def hold(self, local_rows: np.ndarray, refs: np.ndarray, copies: dict[str, np.ndarray]) -> None:
        """Take in what ``held`` gave on the old server for rows now at ``local_rows`` (``copies["row"]``
        already local here), after ``create`` and with ``state()`` (the versions) filled in."""
        raise NotImplementedError(f"{type(self).__name__}: its row versions cannot move")

    def hand_over(self, local_rows: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Partitions move: what else of rows ``local_rows`` goes with them beside ``state()`` (arrays of
        one row per row of ``local_rows``), and of the whole shard (arrays, given whole to a server that
        gains rows); none by default. A backup table's step in progress (server/backup.py)."""
        return {}, {}

    def check_take_over(self, had: int, whole: dict[str, np.ndarray] | None) -> None:
        """Before any shard of the server changes: ProtocolError if rows with ``whole`` (``hand_over``'s)
        cannot arrive at this shard of ``had`` rows."""

    def take_over(self, had: int, kept: np.ndarray, old: np.ndarray, came: np.ndarray,
                  rows: dict[str, np.ndarray] | None, whole: dict[str, np.ndarray] | None) -> None:
        """After ``create`` at the new layout (``state()`` filled in): rows now at ``kept`` were at ``old``
        (of ``had`` rows before), those at ``came`` arrived with ``rows`` (``hand_over``'s, in ``came``'s
        order) and ``whole`` (None: nothing arrived)."""

    def state(self) -> dict[str, np.ndarray]:
        """The live arrays, one row per local row, a checkpoint saves and restores in place (none for
        plain addition). Names are file names: letters, digits and '_'."""
        return {}

    def table_state(self) -> dict[str, np.ndarray]:
        """State of the whole shard, not per row (a backup table's iteration and k_t estimator), that a
        checkpoint saves and ``load_table_state`` takes back on resume; names as ``state``'s."""
        return {}

    def load_table_state(self, arrays: dict[str, np.ndarray]) -> None:
        """A checkpoint's ``table_state``, read on resume or recovery (before the server starts)."""
        if arrays:
            raise ValueError(f"state {sorted(arrays)[0]!r} is not kept by update {self.table.update!r}")

    def allow_push(self) -> bool:
        """Whether budgeted (early) pushes may go out now."""
        return True

    def stats(self) -> dict[str, Any]:
        return {}
