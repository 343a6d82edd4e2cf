"""One table's share of rows on one server: values, change flags and subscriptions."""

from __future__ import annotations

import numpy as np

from bosen import priority, rowmath
from bosen.config import CommConfig, TableConfig
from bosen.errors import ConfigError, Moving, NotOwned, ProtocolError
from bosen.partition import Partition
from bosen.procedure import StoredProcedure
from bosen.rowmap import RowMap
from bosen.server.holdings import Holdings
from bosen.wire import UpdateBatch

_NO_ROWS = np.empty(0, dtype=np.int64)
# A batch that passed ``TableShard.check``: it, its local rows, them as an index, and the local rows
# it releases (versioned tables; else None)
Checked = tuple[UpdateBatch, np.ndarray, "slice | np.ndarray", "np.ndarray | None"]
NOBODY, SEVERAL = -1, -2  # TableShard.writer, beside a client's rank
GROWTH = 1.25  # a sparse shard's per-row arrays grow by this factor: amortized copies, little unused room


class TableShard:
    """The rows of a table that server ``rank`` owns (its partitions, bosen/partition.py), stored densely
    by local index.

    ``subs[row, client]`` marks which clients read the row (subscribed on first read) and so receive
    its new values; ``dirty`` marks subscribed rows changed since they were last pushed. A row nobody
    reads is never dirty: the clock-advance push has nothing to look for when no changed row has a
    reader (``pending``), as in write-only phases.

    With ``comm.push_to: readers``, ``recent[row, client]`` marks the rows each client read in its
    last tick (its CLOCK says; a new subscription counts as read): budgeted pushes go only to those
    readers. A row a budgeted push gave only some of its subscribers stays dirty for the
    clock-advance push, which SSP needs to reach every subscriber; ``current[row, client]`` marks
    who already has its value, so that push skips them.

    With ``metrics.freshness_every`` on (``counts``), ``applied[row]`` and ``applied_by[client, row]``
    count the inc operations applied (per row, the sender's ``inc`` calls its update coalesces, INC
    "w"; one per row of a batch without them): the values sent to a client then
    carry ``others`` (how many of the row's updates came from other clients), which a freshness probe
    later compares with the count now (docs/design.md, "Freshness probes").

    A sparse table (``storage: sparse``) stores only the rows touched: ``row_map`` maps each row id to a
    slot (``bosen.rowmap``), and every per-row array above is indexed by slot instead of ``row // S``,
    grown as rows are first read or written (``_touch``), each new row taking the value a dense table
    starts with (``rowmath.init_rows`` is deterministic per row id). Everything past ``local_rows``
    sees slots as it sees local rows.
    """

    def __init__(self, index: int, cfg: TableConfig, partition: Partition, rank: int, num_clients: int,
                 procedure: StoredProcedure, comm: CommConfig, counts: bool = False) -> None:
        self.index = index
        self.cfg = cfg
        self.partition = partition
        self.rank = rank
        self.dtype = np.dtype(cfg.dtype)
        self.sparse = cfg.storage == "sparse"
        self.row_map = RowMap() if self.sparse else None
        self._global_rows = _NO_ROWS if self.sparse else partition.global_rows(rank, cfg.rows)
        try:
            self.values = rowmath.init_rows(cfg.init, self._global_rows, (cfg.rows, cfg.cols), self.dtype, index)
        except ValueError as e:
            raise ConfigError(f"tables.{cfg.name}.{e}") from None
        self.procedure = procedure
        if procedure.versioned and not cfg.push:
            raise ConfigError(f"tables.{cfg.name}.push: false is not for versioned procedures ({cfg.update}): "
                              "their clients learn of a row's new version from the pushes")
        procedure.create(self._global_rows, self.values)
        n = self._global_rows.shape[0]
        self.dirty = np.zeros(n, dtype=bool)
        self.pending = False  # some row became dirty since the last clock-advance push
        # rows that turned dirty since the last clock-advance push: its work is O(changed rows), not a
        # scan of the table's dirty flags (take_changed)
        self._changed: list[np.ndarray] = []
        self._mark = np.zeros(n, dtype=bool)  # take_changed's scratch (rowmath.unique_kept)
        self.subs = np.zeros((n, num_clients), dtype=bool)
        self.subscribed = np.zeros(n, dtype=bool)  # any client reads the row
        self.has_readers = False  # some row is subscribed
        self.check_finite = self.dtype.kind == "f"
        # managed communication: accumulated change per row since it was last pushed
        self.policy = priority.make(comm.priority, seed=1000 + index) if comm.enabled else None
        self.importance = np.zeros(n) if self.policy is not None and self.policy.uses_importance else None
        self.relative = comm.priority == "relative"
        # plain add (no transforming procedure): scores come from the deltas, no before/after gathers
        self._adds = type(self.procedure) is StoredProcedure
        # every row of a shard has a value (accumulate_dense, which only scores importance)
        self._known = np.zeros(n if self.importance is not None else 0, dtype=np.int64)
        self.send_count = np.zeros(n, dtype=np.int32)
        # Who changed each row since it was last pushed: NOBODY, one client's rank, or SEVERAL. Where
        # clients mirror their own increments in their caches (plain add with read-my-writes), a row
        # only its reader changed is not pushed back to it: its cache already holds that value, and
        # SCLOCK makes it fresh. ``skip_own`` is set by the server, which knows the table's flags.
        self.writer = np.full(n, NOBODY, dtype=np.int32)
        self.skip_own = False
        self.readers_only = comm.enabled and comm.push_to == "readers"
        shape = (n, num_clients) if self.readers_only else (0, num_clients)
        self.recent = np.zeros(shape, dtype=bool)
        self.current = np.zeros(shape, dtype=bool)
        self.read_recently = np.zeros(shape[0], dtype=bool)  # some client read the row in its last tick
        self.fresh = np.zeros(shape[0], dtype=bool)  # changed since last pushed (budgeted candidates)
        # tables.X.lapse: per row and client, the reader's clock at its last read of the row (its READ,
        # or its CLOCK's read set); a subscription not read for ``lapse`` clocks lapses (``note_reads``)
        self.lapse = cfg.lapse
        if self.lapse and procedure.versioned:
            raise ConfigError(f"tables.{cfg.name}.lapse: not for versioned procedures ({cfg.update}): their clients "
                              "hold row versions that the pushes keep current")
        self.last_read = np.zeros((n, num_clients) if self.lapse else (0, num_clients), dtype=np.int64)
        # per client, the rows whose ``recent`` mark is set (so a CLOCK clears only those)
        self._recent_rows: list[list[np.ndarray]] = [[] for _ in range(num_clients if self.readers_only else 0)]
        self._partial = False  # some row went to only some of its subscribers (``current`` is set)
        self.counts = counts
        self.applied = np.zeros(n if counts else 0, dtype=np.int64)
        self.applied_by = np.zeros((num_clients, n) if counts else (0, 0), dtype=np.int64)
        # versioned tables: each client's row-version references, released for it if it is lost
        self.holdings = [Holdings() for _ in range(num_clients)] if procedure.versioned else []
        # versioned tables: the stored rows exported to another server whose map is not in yet; they are
        # sent to nobody meanwhile (a client's hold on a version sent now would not reach the new owner)
        self.leaving: np.ndarray | None = None

    @property
    def global_rows(self) -> np.ndarray:
        """The row id of each local row (sparse: of each slot, in order of first touch)."""
        return self.row_map.ids if self.row_map is not None else self._global_rows

    @property
    def local_count(self) -> int:
        """Local rows a client may name in a read set (``row // S``, also for a sparse table)."""
        if self.row_map is None:
            return int(self._global_rows.shape[0])
        return self.partition.local_count(self.rank, self.cfg.rows)

    def local_rows(self, rows: np.ndarray, what: str) -> tuple[np.ndarray, slice | np.ndarray]:
        """Local indices of ``rows`` and them as an index (a slice for a run, ``rowmath.rows_index``);
        every row must exist and belong to this server. A sparse table creates the rows not stored yet."""
        if rows.shape[0] == 0:
            return rows, rows
        if self.leaving is not None and what == "READ":
            self._check_staying(rows)
        n = self.partition.num_servers
        if self.row_map is not None:
            slots = self._slots(rows, what)
            return slots, rowmath.rows_index(slots)
        if n == 1:  # local = global: bounds and run in one pass
            lo, hi, index = rowmath.span(rows)
            self._check_range(lo, hi, what)
            return rows, index
        self._check_range(*rowmath.min_max(rows), what)
        self._check_owner(rows, what)
        local = self.partition.local(rows, self.rank)
        return local, rowmath.rows_index(local)

    def _check_staying(self, rows: np.ndarray) -> None:
        """A read of rows exported to their next server (``leaving``): asked again under the new map."""
        assert self.leaving is not None
        gone = self.global_rows[:self.leaving.shape[0]][self.leaving]
        if gone.shape[0] and np.isin(rows, gone).any():
            raise Moving(f"READ: rows of table {self.cfg.name!r} are moving to another server")

    def _check_owner(self, rows: np.ndarray, what: str) -> None:
        owner = self.partition.owner(rows)
        wrong = owner != self.rank
        if wrong.any():
            i = int(np.argmax(wrong))
            raise NotOwned(f"{what}: row {int(rows[i])} of table {self.cfg.name!r} belongs to server "
                           f"{int(owner[i])}, not {self.rank}")

    def _slots(self, rows: np.ndarray, what: str) -> np.ndarray:
        """Sparse: the slots of ``rows``. One lookup pass when all are stored already (the steady state:
        only checked ids are ever inserted, so nothing needs checking); otherwise the ids are checked
        and the new ones stored (``_touch``)."""
        assert self.row_map is not None
        keys = rows if rows.dtype == np.int64 and rows.flags.c_contiguous else np.ascontiguousarray(rows, np.int64)
        slots, missing = self.row_map.find(keys)
        if missing:
            self._check_range(*rowmath.min_max(rows), what)
            if self.partition.num_servers > 1:
                self._check_owner(rows, what)
            self._touch(keys, slots)
        return slots

    def _touch(self, keys: np.ndarray, slots: np.ndarray) -> None:
        """Sparse: store the checked ``keys`` whose ``slots`` are -1 (their slots written there) with
        their initial values and procedure state."""
        assert self.row_map is not None
        _, before = self.row_map.fill(keys, slots)
        n = len(self.row_map)
        if n == before:
            return
        if n > self.values.shape[0]:
            self._grow(max(n, int(self.values.shape[0] * GROWTH) + 16))
        self.values[before:n] = self.initial(self.row_map.ids[before:])

    def initial(self, rows: np.ndarray) -> np.ndarray:
        """The initial values of rows ``rows`` (ids): deterministic per row id, so a sparse shard's row
        first touched now starts where the dense table's row starts (and a restore's absent rows too)."""
        return rowmath.init_rows(self.cfg.init, rows, (self.cfg.rows, self.cfg.cols), self.dtype, self.index)

    def _row_arrays(self) -> list[tuple[str, int, int]]:
        """(attribute, row axis, fill for new rows) of every per-row array this shard keeps (not the
        procedure's state, nor the row map): what a sparse shard grows and what ``nbytes`` counts."""
        names = ["values", "dirty", "_mark", "subs", "subscribed", "send_count"]
        names += ["importance", "_known"] if self.importance is not None else []
        names += ["recent", "current", "read_recently", "fresh"] if self.readers_only else []
        names += ["last_read"] if self.lapse else []
        names += ["applied"] if self.counts else []
        out = [(name, 0, 0) for name in names] + [("writer", 0, NOBODY)]
        return out + [("applied_by", 1, 0)] if self.counts else out

    def _grow(self, cap: int) -> None:
        """Sparse: room for ``cap`` slots in every per-row array (the stored rows copied once)."""
        n = self.values.shape[0]
        for name, axis, fill in self._row_arrays():
            setattr(self, name, rowmath.grown(getattr(self, name), cap, fill, axis))
        # the procedure's per-row state grows with them (``StoredProcedure.grow``; rows not yet stored
        # get what ``create`` gives them, as a dense table's rows start)
        assert self.row_map is not None
        ids = np.zeros(cap, dtype=np.int64)
        ids[:n] = self.row_map.ids[:n]
        self.procedure.grow(ids, self.values, n)

    # -- moving partitions (Litz: scaling moves partitions, never re-partitions rows) -------------------

    def export_partitions(self, parts: np.ndarray) -> dict[str, np.ndarray]:
        """Everything this shard keeps of the rows of partitions ``parts`` (stored rows only): "rows"
        (their ids), every per-row array (values, change flags, subscriptions, ...) and the stored
        procedure's state (``state.NAME``); what ``relayout`` on the new owner takes in."""
        self.check_movable()
        n = self.stored
        ids = self.global_rows[:n]
        mine = np.flatnonzero(np.isin(ids % self.partition.partitions, parts))
        out = {"rows": ids[mine].copy()}
        for name, axis, _ in self._row_arrays():
            if name != "_mark":
                out[name] = np.take(getattr(self, name), mine, axis=axis)
        for k, v in self.procedure.state().items():
            out[f"state.{k}"] = v[mine]
        step, whole = self.procedure.hand_over(mine)  # a backup table's gradients in progress, its step
        out.update({f"step.{k}": v for k, v in step.items()})
        out.update({f"whole.{k}": v for k, v in whole.items()})
        if self.procedure.versioned:
            out.update(self._export_held(ids, mine))
        return out

    def _export_held(self, ids: np.ndarray, mine: np.ndarray) -> dict[str, np.ndarray]:
        """Versioned: what clients hold of the exported rows ``mine`` (local), by row id: the holders of
        each current version ("refs", per row), the snapshot copies of older versions ("copy.*") and
        each client's reference log ("hold.*", for ``release_client``). The rows are sent to nobody until
        the new map is in (``leaving``)."""
        refs, copies = self.procedure.held(mine)
        out = {"refs": refs, "copy.row": ids[copies["row"]], "copy.version": copies["version"],
               "copy.refcnt": copies["refcnt"], "copy.values": copies["values"]}
        mask = np.zeros(ids.shape[0], dtype=bool)
        mask[mine] = True
        rows, versions, signs, clients = [], [], [], []
        for c, h in enumerate(self.holdings):
            r, v, sg = h.entries()  # the log as it is (sent +1, released -1): no netting sort
            sel = mask[r]
            rows.append(ids[r[sel]])
            versions.append(v[sel])
            signs.append(sg[sel])
            clients.append(np.full(int(sel.sum()), c, dtype=np.int64))
        out["hold.row"] = np.concatenate(rows) if rows else _NO_ROWS
        out["hold.version"] = np.concatenate(versions) if versions else _NO_ROWS
        out["hold.sign"] = np.concatenate(signs) if signs else np.empty(0)
        out["hold.client"] = np.concatenate(clients) if clients else _NO_ROWS
        self.leaving = mask if self.leaving is None else self.leaving | mask
        return out

    def staying(self, local: np.ndarray) -> np.ndarray:
        """The rows of ``local`` not exported to another server (all of them but during a versioned move)."""
        if self.leaving is None:
            return local
        inside = local < self.leaving.shape[0]
        gone = np.zeros(local.shape[0], dtype=bool)
        gone[inside] = self.leaving[local[inside]]
        return local[~gone]

    def stay(self) -> None:
        """A move given up before its map (MOVE abort): exported rows are this server's to send again."""
        self.leaving = None

    def relayout(self, partition: Partition, incoming: dict[str, np.ndarray] | None = None,
                 fresh: bool = False) -> None:
        """Follow the map ``partition``: rows of partitions this server no longer owns are dropped,
        rows of partitions it gained come from ``incoming`` (the old owner's ``export_partitions``;
        absent or partial for a sparse table, whose missing rows start as if never touched; with
        ``fresh``, a dense table's too: a resume then loads them), and every per-row array is laid
        out anew in the new local order (bosen/partition.py)."""
        self.check_movable()
        n = self.stored
        old_ids = self.global_rows[:n]
        got = incoming["rows"] if incoming is not None else _NO_ROWS
        if self.row_map is None:
            new_ids = partition.global_rows(self.rank, self.cfg.rows)
        else:
            keep = old_ids[partition.owner(old_ids) == self.rank]
            new_ids = np.concatenate([keep, got[partition.owner(got) == self.rank]])
        m = new_ids.shape[0]
        # where each new row comes from: its old local index here, or its position in ``incoming``
        here = np.full(m, -1, dtype=np.int64)
        stayed = self.partition.owner(new_ids) == self.rank
        if self.row_map is None:
            here[stayed] = self.partition.local(new_ids[stayed], self.rank)
        else:
            here[stayed] = self.row_map.lookup(new_ids[stayed])
        came = np.flatnonzero(here < 0)
        at = came
        if came.shape[0]:
            order = np.argsort(got)
            at = order[np.minimum(np.searchsorted(got, new_ids[came], sorter=order), max(got.shape[0] - 1, 0))] \
                if got.shape[0] else came
            if (got.shape[0] == 0 or not np.array_equal(got[at], new_ids[came])) and not fresh:
                raise ProtocolError(f"MOVE: table {self.cfg.name!r}: rows of partitions this server gains are "
                                    "missing from what the old owner sent")
        kept = np.flatnonzero(here >= 0)
        held = self._held_kept(n, here[kept], kept) if self.procedure.versioned else None
        state = self.procedure.state()
        old = {name: getattr(self, name) for name, _, _ in self._row_arrays()}
        values = rowmath.init_rows(self.cfg.init, new_ids, (self.cfg.rows, self.cfg.cols), self.dtype, self.index) \
            if self.row_map is not None or fresh else np.empty((m, self.cfg.cols), dtype=self.dtype)
        for name, axis, fill in self._row_arrays():
            arr = old[name]
            shape = list(arr.shape)
            shape[axis] = m
            new = values if name == "values" else np.full(shape, fill, dtype=arr.dtype)
            got_arr = incoming.get(name) if came.shape[0] and incoming is not None else None
            if axis == 0 and arr.ndim <= 2 and arr.flags.c_contiguous:  # one pass, no temporary
                rowmath.copy_rows(new, kept, arr, here[kept])
                if got_arr is not None:
                    rowmath.copy_rows(new, came, np.ascontiguousarray(got_arr, dtype=arr.dtype), at)
            else:
                put = (slice(None),) * axis
                new[put + (kept,)] = np.take(arr, here[kept], axis=axis)
                if got_arr is not None:
                    new[put + (came,)] = np.take(got_arr, at, axis=axis)
            setattr(self, name, new)
        if self.row_map is not None:
            self.row_map = RowMap.of(new_ids)
        else:
            self._global_rows = new_ids
        self.procedure.create(new_ids, self.values)  # fresh state arrays at the new size, then filled
        for k, v in self.procedure.state().items():
            v[kept] = state[k][here[kept]]
            if came.shape[0] and incoming is not None and f"state.{k}" in incoming:
                v[came] = incoming[f"state.{k}"][at]
        step = whole = None
        if came.shape[0] and incoming is not None:
            step = {k[5:]: v[at] for k, v in incoming.items() if k.startswith("step.")} or None
            whole = {k[6:]: v for k, v in incoming.items() if k.startswith("whole.")} or None
        self.procedure.take_over(n, kept, here[kept], came, step, whole)
        if held is not None:
            self._adopt_held(held, new_ids, kept, came, at, incoming)
        self.partition = partition
        # bookkeeping by local index starts again from the flags that moved
        self._changed = [np.flatnonzero(self.dirty)]
        self.pending = bool(self._changed[0].shape[0])
        self.has_readers = bool(self.subscribed.any())
        self._recent_rows = [[np.flatnonzero(self.recent[:, c])] for c in range(len(self._recent_rows))]

    def _held_kept(self, n: int, old_local: np.ndarray, new_local: np.ndarray) -> tuple:
        """Versioned, before ``relayout`` re-creates the procedure: what clients hold of the rows that
        stay (old local ``old_local``, to be ``new_local``), already in the new local order."""
        to_new = np.full(n, -1, dtype=np.int64)
        to_new[old_local] = new_local
        refs, copies = self.procedure.held(old_local)
        copies["row"] = to_new[copies["row"]]
        holds = []
        for h in self.holdings:
            r, v, sg = h.entries()
            r = to_new[r]
            keep = r >= 0  # a row's entries net out by themselves: those of rows that left go whole
            holds.append((r[keep], v[keep], sg[keep]))
        return refs, copies, holds

    def _adopt_held(self, held: tuple, new_ids: np.ndarray, kept: np.ndarray, came: np.ndarray, at: np.ndarray,
                    incoming: dict[str, np.ndarray] | None) -> None:
        """Versioned, end of ``relayout``: the holders, snapshot copies and per-client references of the
        rows that stayed (``held``) and of those that came (``incoming``, by row id) laid out here, so
        an update tagged with a version a client read from the old server is applied as it would have
        been there, and its release finds its reference."""
        refs, copies, holds = held
        self.procedure.hold(kept, refs, copies)
        got = incoming if came.shape[0] and incoming is not None and "refs" in incoming else None
        if got is not None:  # a group with nothing for this server is absent (the mover splits by row)
            cols = self.cfg.cols
            got = {"copy.row": _NO_ROWS, "copy.version": _NO_ROWS, "copy.refcnt": _NO_ROWS,
                   "copy.values": np.empty((0, cols)), "hold.row": _NO_ROWS, "hold.version": _NO_ROWS,
                   "hold.sign": np.empty(0), "hold.client": _NO_ROWS, **got}
            where = _positions(new_ids, got["copy.row"])
            ours = where >= 0  # copies of rows another server gains stay out (an export split by owner)
            self.procedure.hold(came, got["refs"][at], {"row": where[ours], "version": got["copy.version"][ours],
                                                       "refcnt": got["copy.refcnt"][ours],
                                                       "values": got["copy.values"][ours]})
            hold_at = _positions(new_ids, got["hold.row"])
        for c, h in enumerate(self.holdings):
            rows, versions, signs = holds[c]
            if got is not None:
                sel = (got["hold.client"] == c) & (hold_at >= 0)
                rows = np.concatenate([rows, hold_at[sel]])
                versions = np.concatenate([versions, got["hold.version"][sel]])
                signs = np.concatenate([signs, got["hold.sign"][sel]])
            h.replace(rows, versions, signs)
        self.leaving = None

    def check_movable(self) -> None:
        """Raise ConfigError if this table's partitions cannot move."""
        if self.procedure.versioned and not self.procedure.moves_versions:
            raise ConfigError(f"tables.{self.cfg.name}: partitions of a table with versioned procedure "
                              f"{self.cfg.update} cannot move (it hands no row versions over: "
                              "StoredProcedure.moves_versions)")

    def _check_range(self, lo: int, hi: int, what: str) -> None:
        if lo < 0 or hi >= self.cfg.rows:
            if self.sparse:
                raise ProtocolError(f"{what}: row {lo if lo < 0 else hi} out of range for sparse table "
                                    f"{self.cfg.name!r}: ids must be in [0, {self.cfg.rows})")
            raise ProtocolError(f"{what}: row {lo if lo < 0 else hi} out of range for table {self.cfg.name!r} "
                                f"with {self.cfg.rows} rows")

    @property
    def versioned(self) -> bool:
        return self.procedure.versioned

    def apply(self, batch: UpdateBatch, client: int) -> int:
        """Check ``batch`` and apply it; returns the rows applied."""
        return self.commit(self.check(batch), client)

    def check(self, batch: UpdateBatch) -> Checked:
        """Everything that can make ``batch`` invalid, checked before anything changes (a FLUSH checks
        all its parts before it applies one): its rows and values, as ``commit`` takes them."""
        versioned = batch.versioned
        if versioned != self.procedure.versioned:
            raise ProtocolError(f"INC: table {self.cfg.name!r} is {'' if self.versioned else 'not '}versioned "
                                f"(update: {self.cfg.update}); updates must {'' if self.versioned else 'not '}"
                                "carry version tags")
        local, index = self.local_rows(batch.rows, "INC")
        if self.check_finite and not rowmath.all_finite(batch.values):
            raise ProtocolError(f"INC: non-finite value for table {self.cfg.name!r}")
        released = None
        if versioned:
            assert batch.rel_rows is not None
            released, _ = self.local_rows(batch.rel_rows, "INC release")
        return batch, local, index, released

    def commit(self, checked: Checked, client: int) -> int:
        """Apply a batch ``check`` passed; returns the rows applied."""
        batch, local, index, released = checked
        if released is not None:
            tags, eov, rel_tags = batch.tags, batch.eov, batch.rel_tags
            assert tags is not None and eov is not None and rel_tags is not None
            n = self._apply(batch, local, index, client) if local.shape[0] else 0
            if eov.any() or released.shape[0]:
                rows, versions = np.concatenate([local[eov], released]), np.concatenate([tags[eov], rel_tags])
                self.procedure.release(rows, versions)
                self.holdings[client].released(rows, versions)
            return n
        return self._apply(batch, local, index, client)

    def _apply(self, batch: UpdateBatch, local: np.ndarray, index: slice | np.ndarray, client: int) -> int:
        if self.importance is None:
            self.procedure.apply(self.values, local, batch, client)
        elif self._adds and batch.values.dtype != np.float16:  # plain add: the change applied is the
            # delta itself, scored in one pass first (numba has no float16: those take the path below)
            if batch.indptr is not None:
                assert batch.cols is not None
                priority.accumulate_csr(self.importance, local, batch.indptr, batch.cols, batch.values, self.values,
                                        self.relative)
            else:
                priority.accumulate_dense(self.importance, local, batch.values, self.values, self._known,
                                          self.relative)
            self.procedure.apply(self.values, local, batch, client)
        else:  # priority from the change actually applied (|Δx|), whatever the procedure did
            before = self.values[local]
            self.procedure.apply(self.values, local, batch, client)
            change = np.abs(self.values[local] - before, dtype=np.float64)
            if self.relative:
                np.divide(change, np.abs(before), out=change, where=before != 0)
            np.add.at(self.importance, local, change.sum(axis=1))
        if self.counts:
            # per row, the sender's inc operations it coalesces (INC "w"); without them, one per row
            w: np.ndarray | int = 1 if batch.weights is None else batch.weights
            if type(index) is slice:  # a run: each row once
                self.applied[index] += w
                self.applied_by[client, index] += w
            else:
                np.add.at(self.applied, local, w)
                np.add.at(self.applied_by[client], local, w)
        if self.has_readers:  # else no row has a reader: nothing to mark (write-only phases)
            read = self.subscribed[index]
            if read.any():
                new = read & ~self.dirty[index]
                if new.any():
                    self._changed.append(local[new])
                self.dirty[index] |= read
                self.pending = True
                if self.readers_only:
                    self.fresh[index] |= read
                    if self._partial:  # a new value: nobody has it any more
                        self.current[index] = False
                if self.skip_own:
                    w = self.writer[index]
                    self.writer[index] = np.where((w == NOBODY) | (w == client), client, SEVERAL)
        return local.shape[0]

    def others(self, local: np.ndarray, client: int) -> np.ndarray:
        """Per row of ``local``, the inc operations of clients other than ``client`` applied so far
        (``counts`` on): what a value of the row sent now includes besides the client's own."""
        return self.applied[local] - self.applied_by[client, local]

    def push_to(self, local: np.ndarray, client: int) -> np.ndarray:
        """Which of ``local`` (rows being pushed) go to subscriber ``client``: all it reads, except,
        where clients mirror their own writes, those that nobody but it changed."""
        mine = self.subs[local, client]
        if self.skip_own:
            mine &= self.writer[local] != client
        if self._partial:
            mine &= ~self.current[local, client]
        return local[mine]

    def push_masks(self, local: np.ndarray, clients: np.ndarray) -> np.ndarray:
        """``push_to`` for several clients at once: row k of the result marks which of ``local`` go
        to ``clients[k]`` (one gather of the subscriptions for all, rather than one per client)."""
        mine = self.subs[local][:, clients]
        if self.skip_own:
            mine &= self.writer[local][:, None] != clients[None, :]
        if self._partial:
            mine &= ~self.current[local][:, clients]
        return np.ascontiguousarray(mine.T)

    def to_readers(self, local: np.ndarray, clients: np.ndarray, masks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A budgeted push of ``local`` with ``push_masks`` ``masks``: the masks narrowed to the clients
        that read each row in their last tick, and which rows then reach every subscriber owed them."""
        give = masks & self.recent[local][:, clients].T
        return give, ~(masks & ~give).any(axis=0)

    def mark_given(self, local: np.ndarray, clients: np.ndarray, give: np.ndarray, done: np.ndarray) -> None:
        """After a budgeted push to readers (``to_readers``): rows that reached every subscriber are
        sent; the others stay dirty for the clock-advance push, which skips the clients that have them,
        and are not picked again until they change."""
        self.mark_sent(local[done])
        rest = ~done
        if not rest.any():
            return
        rows = local[rest]
        self.fresh[rows] = False
        if self.importance is not None:
            self.importance[rows] = 0
        self.current[np.ix_(rows, clients)] |= give[:, rest].T
        self._partial = True

    def add_client(self) -> int:
        """One more client column in every per-client array (a worker that joins a running job takes
        the next rank: ranks are never reused); returns the new client's index. Nothing is owed to it
        yet: it subscribes by its first reads, as a client at the start does."""
        k = self.subs.shape[1]
        self.subs = np.concatenate([self.subs, np.zeros((self.subs.shape[0], 1), dtype=bool)], axis=1)
        if self.readers_only:
            for name in ("recent", "current"):
                a = getattr(self, name)
                setattr(self, name, np.concatenate([a, np.zeros((a.shape[0], 1), dtype=bool)], axis=1))
            self._recent_rows.append([])
        if self.counts:
            self.applied_by = np.concatenate([self.applied_by, np.zeros((1, self.applied_by.shape[1]), np.int64)])
        if self.lapse:
            self.last_read = np.concatenate([self.last_read, np.zeros((self.last_read.shape[0], 1), np.int64)], axis=1)
        if self.procedure.versioned:
            self.holdings.append(Holdings())
        return k

    def set_recent(self, client: int, read: np.ndarray) -> None:
        """``client``'s CLOCK says it read rows ``read`` (sorted local rows) in the tick just ended.
        Only the rows marked before and those read now are touched: O(read set), not O(table)."""
        if not self.readers_only:
            return
        if self.row_map is not None:  # the client names rows by their local index: their slots, sorted
            slots = self.row_map.lookup(self.partition.global_of(read, self.rank))
            read = np.sort(slots[slots >= 0])
        marked = self._recent_rows[client]
        prev = np.concatenate(marked) if marked else read[:0]
        self.recent[prev, client] = False
        now = read[self.subs[read, client]]
        self.recent[now, client] = True
        self._recent_rows[client] = [now]
        touched = np.union1d(prev, now)
        self.read_recently[touched] = self.recent[touched].any(axis=1)

    def subscribe(self, local: np.ndarray, client: int, index: slice | np.ndarray | None = None,
                  clock: int = 0) -> None:
        """``client`` reads ``local`` (``index``: them as an index, if known) at its clock ``clock``
        and gets their changes; a table with ``push: false`` keeps no subscriptions (its readers pull)."""
        if not self.cfg.push:
            return
        if index is None:
            index = rowmath.rows_index(local)
        if self.lapse:
            self.last_read[index, client] = clock
        if self.importance is not None:  # a first reader gets the current value: nothing is owed
            known = self.subscribed[index]
            if not known.all():
                self.importance[local[~known]] = 0
        self.subs[index, client] = True
        self.subscribed[index] = True
        if self.readers_only:  # a row just read is read this tick
            self.recent[index, client] = True
            self.read_recently[index] = True
            self._recent_rows[client].append(np.array(local, dtype=np.int64))
        self.has_readers = True

    def note_reads(self, client: int, read: np.ndarray, clock: int) -> np.ndarray:
        """``client``, now at ``clock``, read rows ``read`` (sorted local rows, its CLOCK's read set)
        in the tick it ended. Every ``lapse`` clocks, its subscriptions to rows it has not read for
        more than ``lapse`` clocks end: those rows (local) are returned, and it gets no more pushes of
        them until it reads them again (a READ subscribes anew)."""
        n = self.stored
        if self.row_map is not None and read.shape[0]:  # the client names local rows: their slots
            slots = self.row_map.lookup(self.partition.global_of(read, self.rank))
            read = slots[slots >= 0]
        read = read[read < n]
        self.last_read[read, client] = clock
        if clock % self.lapse:
            return read[:0]
        col = self.subs[:n, client]
        gone = np.flatnonzero(col & (self.last_read[:n, client] < clock - self.lapse))
        if gone.shape[0]:
            self.subs[gone, client] = False
            self.subscribed[gone] = self.subs[gone].any(axis=1)
            if self.readers_only:
                self.recent[gone, client] = False
                self.current[gone, client] = False
        return gone

    def mark_sent(self, local: np.ndarray) -> None:
        """These rows went to all their subscribers: nothing of theirs is pending any more."""
        self.dirty[local] = False
        self.writer[local] = NOBODY
        if self.importance is not None:
            self.importance[local] = 0
        if self.readers_only:
            self.fresh[local] = False
            if self._partial:
                self.current[local] = False
        self.send_count[local] += 1

    def take_changed(self) -> np.ndarray:
        """Rows to push at a clock advance (all dirty ones; the caller marks them sent)."""
        if not self.pending:
            return _NO_ROWS
        self.pending = False
        parts, self._changed = self._changed, []
        if not parts:
            return _NO_ROWS
        rows = np.concatenate(parts) if len(parts) > 1 else parts[0]
        # distinct and sorted, only those still dirty (a budgeted push may have sent some since)
        return rowmath.unique_kept(rows, self.dirty, self._mark)

    def rows_sent(self, local: np.ndarray, client: int) -> np.ndarray | None:
        """Tell the procedure these rows go to ``client``; their versions (versioned tables) or None."""
        proc = self.procedure
        proc.rows_sent(local, 1)
        if not proc.versioned:
            return None
        assert proc.versions is not None  # set by ``create`` in every versioned procedure
        versions = proc.versions[local]
        self.holdings[client].sent(local, versions)
        return versions

    def release_client(self, client: int, lost: bool) -> int:
        """``client`` left: if it was ``lost`` (no BYE, so it released nothing), release the row
        versions it still held; returns how many. A client that said BYE released them itself."""
        if not self.holdings:
            return 0
        h = self.holdings[client]
        rows, versions = h.outstanding() if lost else (np.empty(0, np.int64), np.empty(0, np.int64))
        h.clear()
        if rows.shape[0]:
            self.procedure.release(rows, versions)
        return int(rows.shape[0])

    @property
    def stored(self) -> int:
        """Rows stored (a sparse shard's touched rows; its arrays may have room for more)."""
        return len(self.row_map) if self.row_map is not None else int(self.values.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes of the rows and their per-row metadata (a sparse shard's row map included)."""
        arrays = [getattr(self, name) for name, _, _ in self._row_arrays()] + list(self.procedure.state().values())
        extra = self.row_map.nbytes if self.row_map is not None else 0
        return extra + sum(a.nbytes for a in arrays)


def _positions(ids: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Per row of ``rows``, its position in ``ids`` (distinct row ids in any order), or -1."""
    if ids.shape[0] == 0 or rows.shape[0] == 0:
        return np.full(rows.shape[0], -1, dtype=np.int64)
    order = np.argsort(ids, kind="stable")
    at = order[np.minimum(np.searchsorted(ids, rows, sorter=order), ids.shape[0] - 1)]
    return np.where(ids[at] == rows, at, -1)
