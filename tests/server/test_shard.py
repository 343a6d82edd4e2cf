"""A table shard in process: which changed rows the clock-advance push looks at, and what a first
reader resets."""

from __future__ import annotations

import numpy as np
import pytest

from bosen.config import CommConfig, TableConfig
from bosen.errors import ProtocolError
from bosen.partition import Partition
from bosen.server import procedures
from bosen.server.shard import TableShard
from bosen.wire import UpdateBatch


def shard(comm: CommConfig | None = None) -> TableShard:
    cfg = TableConfig(name="W", rows=8, cols=2, dtype="float64")
    return TableShard(0, cfg, Partition(1), 0, 2, procedures.load(cfg, "test.yaml"),
                      comm or CommConfig(enabled=False))


def inc(s: TableShard, rows: list[int], value: float = 1.0) -> None:
    r = np.array(rows, dtype=np.int64)
    s.apply(UpdateBatch(r, np.full((r.shape[0], 2), value)), client=0)


def test_only_rows_someone_reads_are_pushed_at_a_clock_advance():
    s = shard()
    inc(s, [0, 1, 2, 3])
    assert s.take_changed().tolist() == []  # nobody reads them: nothing to push, values still applied
    assert s.values[:4, 0].tolist() == [1, 1, 1, 1]
    s.subscribe(np.array([2, 5]), client=1)
    inc(s, [1, 2, 3])
    inc(s, [5, 6, 7])  # not a run: the scatter path
    inc(s, [7, 5])
    assert s.take_changed().tolist() == [2, 5]
    s.mark_sent(np.array([2, 5]))
    assert s.take_changed().tolist() == []  # until something changes again
    inc(s, [5])
    assert s.take_changed().tolist() == [5]


def test_a_first_reader_resets_the_rows_priority():
    s = shard(CommConfig(enabled=True, priority="relative", client_bandwidth_mbps=10, server_bandwidth_mbps=10))
    s.values[:] = 1.0
    s.subscribe(np.array([1]), client=0)
    inc(s, [0, 1, 2], value=0.5)
    assert s.importance[:3].tolist() == [1.0, 1.0, 1.0]  # |0.5 * 2 columns| / |1|
    s.subscribe(np.array([0, 1]), client=1)  # row 0: a first reader, who gets the value as it is
    assert s.importance[:3].tolist() == [0.0, 1.0, 1.0]  # row 1 is still owed to client 0


def test_local_rows_come_with_their_index_a_slice_for_a_run():
    s = shard()
    local, index = s.local_rows(np.array([3, 4, 5], dtype=np.int64), "INC")
    assert local.tolist() == [3, 4, 5] and index == slice(3, 6)
    local, index = s.local_rows(np.array([5, 3], dtype=np.int64), "INC")
    assert local.tolist() == [5, 3] and index.tolist() == [5, 3]
    cfg = TableConfig(name="W", rows=8, cols=2, dtype="float64")  # rows 1, 3, 5, 7 on server 1 of 2
    two = TableShard(0, cfg, Partition(2), 1, 1, procedures.load(cfg, "test.yaml"), CommConfig(enabled=False))
    local, index = two.local_rows(np.array([3, 5, 7], dtype=np.int64), "INC")
    assert local.tolist() == [1, 2, 3] and index == slice(1, 4)
    with pytest.raises(ProtocolError, match="row 4 of table 'W' belongs to server 0, not 1"):
        two.local_rows(np.array([3, 4], dtype=np.int64), "INC")
    with pytest.raises(ProtocolError, match="row 9 out of range"):
        s.local_rows(np.array([2, 9], dtype=np.int64), "READ")


@pytest.mark.parametrize("update", ["add", "sgd"])
def test_relative_scores_match_the_change_applied_for_dense_and_sparse_batches(update):
    """Plain add scores the deltas in one pass before applying them; a transforming procedure (sgd)
    is scored by the change it made. Either way: Σ |Δx / x_before| per row, |Δx| where x was 0."""
    cfg = TableConfig(name="W", rows=8, cols=2, dtype="float64", update=update,
                      update_args={"lr": 0.5} if update == "sgd" else {})
    comm = CommConfig(enabled=True, priority="relative", client_bandwidth_mbps=10, server_bandwidth_mbps=10)
    s = TableShard(0, cfg, Partition(1), 0, 1, procedures.load(cfg, "test.yaml"), comm)
    s.values[:] = [[2.0, 4.0]] * 4 + [[0.0, 0.0]] * 4
    before = s.values.copy()
    s.apply(UpdateBatch(np.array([0, 5], dtype=np.int64), np.array([[1.0, 2.0], [3.0, -1.0]])), client=0)
    s.apply(UpdateBatch(np.array([1, 6], dtype=np.int64), np.array([4.0, -2.0, 1.0]),  # CSR: row 1 cols 0, 1
                        indptr=np.array([0, 2, 3], dtype=np.int64), cols=np.array([0, 1, 1], dtype=np.int64)),
              client=0)
    change = np.abs(s.values - before)
    want = np.where(before != 0, change / np.where(before != 0, np.abs(before), 1), change).sum(axis=1)
    np.testing.assert_allclose(s.importance, want)
    assert want[[0, 1, 5, 6]].min() > 0 and want[[2, 3, 4, 7]].max() == 0


def test_rows_start_from_a_npy_file_split_across_servers(tmp_path):
    from bosen.config import InitConfig
    values = np.arange(7 * 3, dtype=np.float32).reshape(7, 3)
    np.save(tmp_path / "w.npy", values)
    cfg = TableConfig(name="W", rows=7, cols=3, init=InitConfig(file=str(tmp_path / "w.npy")))
    for rank in (0, 1):
        s = TableShard(0, cfg, Partition(2), rank, 1, procedures.load(cfg, "t.yaml"), CommConfig(enabled=False))
        assert np.array_equal(s.values, values[s.global_rows])


@pytest.mark.parametrize("content, message", [
    (np.zeros((6, 3), np.float32), r"shape \(6, 3\); the table is \(7, 3\)"),
    (np.zeros((7, 3), np.complex64), "complex64 values; the table is float32"),
    (None, "cannot read"),
])
def test_an_init_file_that_does_not_fit_names_table_and_file(tmp_path, content, message):
    from bosen.config import InitConfig
    from bosen.errors import ConfigError
    path = tmp_path / "w.npy"
    if content is not None:
        np.save(path, content)
    cfg = TableConfig(name="W", rows=7, cols=3, init=InitConfig(file=str(path)))
    with pytest.raises(ConfigError, match=f"tables.W.init.file: .*{message}"):
        TableShard(0, cfg, Partition(1), 0, 1, procedures.load(cfg, "t.yaml"), CommConfig(enabled=False))


def test_the_clock_advance_push_finds_changed_rows_without_scanning_the_table():
    """take_changed comes from the rows that turned dirty (each once, sorted), less those a budgeted
    push sent since; a row that changes again after its push is found again."""
    s = shard()
    s.subscribe(np.arange(8), client=0)
    inc(s, [6, 1])
    inc(s, [1, 4])
    s.mark_sent(np.array([4]))  # a budgeted push took row 4
    assert s.take_changed().tolist() == [1, 6]
    s.mark_sent(np.array([1, 6]))
    inc(s, [6])
    assert s.take_changed().tolist() == [6]
    assert s.take_changed().tolist() == []


def test_a_read_set_replaces_the_clients_last_one_and_touches_only_those_rows():
    s = shard(CommConfig(enabled=True, push_to="readers"))
    s.subscribe(np.array([0, 1, 2, 5]), client=0)  # a new subscription counts as read this tick
    s.subscribe(np.array([2]), client=1)
    assert s.recent[:, 0].tolist() == [True, True, True, False, False, True, False, False]
    s.set_recent(0, np.array([1, 3, 5], np.int64))  # row 3: not subscribed, so not marked
    assert np.flatnonzero(s.recent[:, 0]).tolist() == [1, 5]
    assert np.flatnonzero(s.read_recently).tolist() == [1, 2, 5]  # row 2: client 1 still read it
    s.set_recent(1, np.empty(0, np.int64))
    s.set_recent(0, np.array([0], np.int64))
    assert np.flatnonzero(s.recent[:, 0]).tolist() == [0] and not s.recent[:, 1].any()
    assert np.flatnonzero(s.read_recently).tolist() == [0]


def test_a_table_without_pushes_keeps_no_subscriptions_and_refuses_versioned_procedures():
    """``push: false``: a read subscribes nobody, so no change of the table is ever pushed; a
    versioned procedure, whose clients learn of new versions from pushes, is refused by name."""
    from bosen.errors import ConfigError

    cfg = TableConfig(name="E", rows=8, cols=2, push=False)
    s = TableShard(0, cfg, Partition(1), 0, 2, procedures.load(cfg, "t.yaml"), CommConfig(enabled=False))
    s.subscribe(np.arange(8, dtype=np.int64), 1)
    assert not s.subs.any() and not s.has_readers
    versioned = TableConfig(name="V", rows=8, cols=2, update="adarevision", push=False)
    with pytest.raises(ConfigError, match=r"tables\.V\.push: false is not for versioned procedures"):
        TableShard(0, versioned, Partition(1), 0, 1, procedures.load(versioned, "t.yaml"), CommConfig(enabled=False))
