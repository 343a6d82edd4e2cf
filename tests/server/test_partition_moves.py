"""Moving partitions between shards (``export_partitions`` / ``relayout``): every row keeps its value,
procedure state, change flag and subscriptions (a versioned table's holders, snapshots and references
too), and later updates land as if nothing had moved."""

from __future__ import annotations

import numpy as np
import pytest

from bosen import wire
from bosen.config import CommConfig, TableConfig
from bosen.errors import ConfigError, Moving
from bosen.partition import Partition
from bosen.server import procedures
from bosen.server.procedures.adarevision import AdaRevision
from bosen.server.shard import TableShard
from bosen.wire import UpdateBatch

COMM = CommConfig(enabled=True, priority="relative", client_bandwidth_mbps=10, server_bandwidth_mbps=10)
ROWS, P = 37, 8


def shards(cfg: TableConfig, part: Partition) -> list[TableShard]:
    return [TableShard(0, cfg, part, j, 2, procedures.load(cfg, "t.yaml"), COMM) for j in range(part.num_servers)]


def apply(ss: list[TableShard], part: Partition, rows: np.ndarray, deltas: np.ndarray, client: int) -> None:
    for j, pos in enumerate(part.split(rows)):
        if pos.shape[0]:
            ss[j].apply(UpdateBatch(rows[pos], deltas[pos]), client)


def snapshot(ss: list[TableShard]) -> dict[int, tuple]:
    out = {}
    for s in ss:
        state = s.procedure.state()
        for i, r in enumerate(s.global_rows[:s.stored].tolist()):
            out[r] = (s.values[i].tolist(), {k: v[i].tolist() for k, v in state.items()}, bool(s.dirty[i]),
                      s.subs[i].tolist(), float(s.importance[i]))
    return out


def move(ss: list[TableShard], old: Partition, owner: np.ndarray) -> Partition:
    new = old.moved(owner)
    gone = {j: np.flatnonzero((old.owner_of == j) & (owner != j)) for j in range(old.num_servers)}
    exports = [s.export_partitions(gone[j]) for j, s in enumerate(ss)]
    for j, s in enumerate(ss):
        gained = [e for e in exports if e["rows"].shape[0] and (new.owner(e["rows"]) == j).any()]
        incoming = {k: np.concatenate([e[k] for e in gained], axis=1 if k == "applied_by" else 0)
                    for k in gained[0]} if gained else None
        s.relayout(new, incoming)
    return new


@pytest.mark.parametrize("update, storage", [("add", "dense"), ("adagrad", "dense"), ("add", "sparse"),
                                             ("adagrad", "sparse")])
def test_moved_partitions_keep_every_row_and_later_updates_land_as_without_moves(update, storage):
    dtype = "int64" if update == "add" else "float64"
    cfg = TableConfig(name="W", rows=ROWS, cols=3, dtype=dtype, update=update, storage=storage)
    rng = np.random.default_rng(7)
    part = Partition(2, P)
    ss, ref = shards(cfg, part), shards(cfg, Partition(1, P))

    def step() -> None:
        rows = rng.choice(ROWS, size=12, replace=False).astype(np.int64)
        deltas = rng.integers(-3, 4, size=(12, 3)).astype(dtype)
        client = int(rng.integers(2))
        apply(ss, part, rows, deltas, client)
        apply(ref, Partition(1, P), rows, deltas, client)

    for _ in range(5):
        step()
    for j, s in enumerate(ss):  # client 1 reads some rows of each server
        mine = part.global_rows(j, ROWS)[::3]
        local, index = s.local_rows(mine, "READ")
        s.subscribe(local, 1, index)
    before = snapshot(ss)
    owner = part.owner_of.copy()
    owner[[1, 3]] = 0  # server 1 hands two partitions to server 0, server 0 one to server 1
    owner[4] = 1
    part = move(ss, part, owner)
    assert not part.modular and part.version == 1
    assert snapshot(ss) == before  # nothing lost or changed by the move itself
    for j, s in enumerate(ss):
        assert (part.owner(s.global_rows[:s.stored]) == j).all()
        assert s.local_count == part.local_count(j, ROWS)
    for _ in range(5):
        step()
    got = {r: v for r, (v, *_rest) in snapshot(ss).items()}
    want = {r: v for r, (v, *_rest) in snapshot(ref).items()}
    assert {r: got.get(r, want[r]) for r in want} == want
    # and back to the modular map: the layout is the one a job starts with
    before = snapshot(ss)
    part = move(ss, part, np.arange(P) % 2)
    assert part.modular and snapshot(ss) == before
    for j, s in enumerate(ss):
        if storage == "dense":
            assert s.global_rows.tolist() == list(range(j, ROWS, 2))


class _Reader:
    """One client of a versioned table as client/versions.py is: the version it holds of each row, and
    what each receipt queues (the old version released, or its buffered update retired with it)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.version = np.zeros(ROWS, dtype=np.int64)
        self.rng = rng
        self.retired: list[tuple[int, int]] = []  # (row, tag): an update sent with end-of-version
        self.released: list[tuple[int, int]] = []

    def receive(self, rows: np.ndarray, versions: np.ndarray) -> None:
        for r, v in zip(rows.tolist(), versions.tolist(), strict=True):
            old = int(self.version[r])
            if old > 0:
                (self.retired if old != v and self.rng.random() < 0.5 else self.released).append((r, old))
            self.version[r] = v


def _read(ss: list[TableShard], part: Partition, reader: _Reader, client: int, rows: np.ndarray) -> np.ndarray:
    """``client`` reads ``rows`` from their owners (a ROWS each: a reference to each row's version)."""
    got = np.zeros(rows.shape[0], dtype=np.int64)
    for j, pos in enumerate(part.split(rows)):
        if pos.shape[0]:
            local, index = ss[j].local_rows(rows[pos], "READ")
            ss[j].subscribe(local, client, index)
            got[pos] = ss[j].rows_sent(local, client)
    reader.receive(rows, got)
    return got


def _send(ss: list[TableShard], part: Partition, reader: _Reader, client: int, rows: np.ndarray,
          g: np.ndarray) -> None:
    """``client`` sends what client/encode.py's take_versioned does: its retired updates (end-of-version),
    gradients of ``rows`` tagged with the versions it holds, and its releases, each to the row's owner."""
    ret = np.array(reader.retired, dtype=np.int64).reshape(-1, 2)
    rel = np.array(reader.released, dtype=np.int64).reshape(-1, 2)
    reader.retired, reader.released = [], []
    all_rows = np.concatenate([ret[:, 0], rows])
    tags = np.concatenate([ret[:, 1], reader.version[rows]])
    eov = np.zeros(all_rows.shape[0], dtype=wire.EOV_DTYPE)
    eov[:ret.shape[0]] = 1
    values = np.concatenate([np.full((ret.shape[0], g.shape[1]), 0.25), g])
    rel_parts = part.split(rel[:, 0])
    for j, pos in enumerate(part.split(all_rows)):
        rp = rel_parts[j]
        if pos.shape[0] or rp.shape[0]:
            ss[j].apply(UpdateBatch(all_rows[pos], values[pos], tags=tags[pos], eov=eov[pos].view(np.bool_),
                                    rel_rows=rel[rp, 0], rel_tags=rel[rp, 1]), client)


def _versioned(ss: list[TableShard]) -> dict[int, tuple]:
    """Per row id: value, procedure state, holders of its current version, its snapshot copies and
    every client's references to it, as the shards keep them."""
    out = {}
    for s in ss:
        n = s.stored
        ids = s.global_rows[:n]
        refs, copies = s.procedure.held(np.arange(n))
        snaps: dict[int, list] = {}
        for r, v, c, x in zip(ids[copies["row"]].tolist(), copies["version"].tolist(), copies["refcnt"].tolist(),
                              copies["values"].tolist(), strict=True):
            snaps.setdefault(r, []).append((v, c, x))
        holds: dict[int, list] = {}
        for c, h in enumerate(s.holdings):
            r, v = h.outstanding()
            for rr, vv in zip(ids[r].tolist(), v.tolist(), strict=True):
                holds.setdefault(rr, []).append((c, vv))
        state = s.procedure.state()
        for i, r in enumerate(ids.tolist()):
            out[r] = (s.values[i].tolist(), {k: v[i].tolist() for k, v in state.items()}, int(refs[i]),
                      sorted(snaps.get(r, [])), sorted(holds.get(r, [])))
    return out


@pytest.mark.parametrize("storage", ["dense", "sparse"])
def test_versioned_partitions_move_with_their_snapshots_and_holdings(storage):
    """AdaRevision: partitions moved back and forth while clients hold versions of their rows (some read
    before the move and updated after it: their snapshots must be found on the new owner), against a
    shard that never moved: every row's value, state, holders, snapshots and references, after the
    move and after every later update and release; then a lost client's references all release."""
    cfg = TableConfig(name="V", rows=ROWS, cols=3, dtype="float64", update="adarevision",
                      update_args={"alpha": 0.3}, storage=storage)
    rng = np.random.default_rng(11)
    part, one = Partition(2, P), Partition(1, P)
    ss, ref = shards(cfg, part), shards(cfg, one)
    readers = [[_Reader(np.random.default_rng(c)) for c in range(2)] for _ in range(2)]  # moving, reference

    def step(read: bool = True) -> None:
        c = int(rng.integers(2))
        rows = np.sort(rng.choice(ROWS, size=9, replace=False)).astype(np.int64)
        g = rng.normal(size=(9, 3))
        if read:
            assert _read(ss, part, readers[0][c], c, rows).tolist() == _read(ref, one, readers[1][c], c, rows).tolist()
        _send(ss, part, readers[0][c], c, rows, g)
        _send(ref, one, readers[1][c], c, rows, g)

    for _ in range(12):
        step()
    for c in range(2):  # versions read now, updated only after the move (snapshots on the old owner)
        rows = np.arange(0, ROWS, 2, dtype=np.int64)
        _read(ss, part, readers[0][c], c, rows)
        _read(ref, one, readers[1][c], c, rows)
    for _ in range(3):
        step(read=False)  # rows change while clients hold older versions: copies
    assert sum(s.procedure.store.live for s in ss) > 0
    before = _versioned(ss)
    assert before == _versioned(ref)
    owner = part.owner_of.copy()
    owner[[1, 3]] = 0
    owner[4] = 1
    gone = np.flatnonzero((part.owner_of == 0) & (owner != 0))
    ss[0].export_partitions(gone)  # exported rows are read by nobody until the map is in
    with pytest.raises(Moving):
        ss[0].local_rows(np.array([4], dtype=np.int64), "READ")
    ss[0].stay()
    part = move(ss, part, owner)
    assert all(s.leaving is None for s in ss)
    assert _versioned(ss) == before  # the move itself changes nothing
    for _ in range(2):  # updates tagged with versions read before the move, releases of them: new owners
        step(read=False)
        assert _versioned(ss) == _versioned(ref)
    for _ in range(6):
        step()
    assert _versioned(ss) == _versioned(ref)
    part = move(ss, part, np.arange(P) % 2)  # and back, holding versions again
    for _ in range(6):
        step()
    assert _versioned(ss) == _versioned(ref)
    assert sum(s.release_client(0, lost=True) for s in ss) == ref[0].release_client(0, lost=True) > 0
    assert _versioned(ss) == _versioned(ref)
    assert sum(s.procedure.store.release_errors for s in ss) == 0


def test_a_versioned_procedure_that_hands_nothing_over_refuses_to_move():
    class Pinned(AdaRevision):
        moves_versions = False

    cfg = TableConfig(name="V", rows=8, cols=2, dtype="float32", update="adarevision")
    s = TableShard(0, cfg, Partition(1, 4), 0, 1, Pinned(cfg), CommConfig(enabled=False))
    with pytest.raises(ConfigError, match="versioned procedure .*cannot move"):
        s.export_partitions(np.array([1]))


def test_the_map_lays_out_local_rows_densely_and_inverts():
    for owner in ([0, 1, 0, 1, 0, 1], [1, 1, 0, 0, 1, 0], [2, 0, 1, 1, 2, 0]):
        part = Partition(max(owner) + 1, len(owner), np.array(owner))
        for rows in (0, 1, 5, 6, 7, 13, 18, 100):
            seen = []
            for j in range(part.num_servers):
                g = part.global_rows(j, rows)
                assert (part.owner(g) == j).all() and g.shape[0] == part.local_count(j, rows)
                assert part.local(g, j).tolist() == list(range(g.shape[0]))  # dense, in order
                assert part.global_of(part.local(g, j), j).tolist() == g.tolist()
                seen += g.tolist()
            assert sorted(seen) == list(range(rows))
