"""Moving partitions between shards (``export_partitions`` / ``relayout``): every row keeps its value,
procedure state, change flag and subscriptions, and later updates land as if nothing had moved."""

from __future__ import annotations

import numpy as np
import pytest

from bosen.config import CommConfig, TableConfig
from bosen.errors import ConfigError
from bosen.partition import Partition
from bosen.server import procedures
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


def test_a_versioned_table_refuses_to_move():
    cfg = TableConfig(name="V", rows=8, cols=2, dtype="float32", update="adarevision")
    s = TableShard(0, cfg, Partition(1, 4), 0, 1, procedures.load(cfg, "t.yaml"), CommConfig(enabled=False))
    with pytest.raises(ConfigError, match="versioned procedure"):
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
