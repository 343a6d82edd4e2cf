"""Sparse tables (storage: sparse): a shard stores only the rows touched, each starting where the
dense table's row starts, so every procedure gives the dense table's values; through real servers,
bad row ids are refused by name and the server keeps serving."""

from __future__ import annotations

import numpy as np
import pytest
import zmq
from rawpeer import Raw

from bosen import config as config_mod
from bosen import rowmath
from bosen.client import Client
from bosen.client.state import TableState
from bosen.config import UNBOUNDED, CommConfig, InitConfig, TableConfig, build
from bosen.errors import ConfigError, ProtocolError
from bosen.jobs.status import format_table
from bosen.partition import Partition
from bosen.server import procedures
from bosen.server.shard import TableShard
from bosen.wire import Msg, UpdateBatch

PROCS = [("add", {}), ("sgd", {"lr": 0.5}), ("adagrad", {"alpha": 0.3})]


def pair(update: str, args: dict, rows: int, comm: CommConfig, servers: int = 1, rank: int = 0,
         counts: bool = False) -> tuple[TableShard, TableShard]:
    out = []
    for storage in ("dense", "sparse"):
        cfg = TableConfig(name="W", rows=rows, cols=3, dtype="float64", update=update, update_args=args,
                          init=InitConfig(normal=0.1, seed=4), storage=storage)
        out.append(TableShard(2, cfg, Partition(servers), rank, 2, procedures.load(cfg, "t.yaml"), comm, counts))
    return out[0], out[1]


@pytest.mark.parametrize("update,args", PROCS)
@pytest.mark.parametrize("comm", [CommConfig(enabled=False),
                                  CommConfig(enabled=True, priority="relative", push_to="readers")],
                         ids=["bs", "managed-readers"])
def test_a_sparse_shard_gives_the_dense_values_for_every_procedure(update, args, comm):
    servers, rank, rows = 3, 1, 3000
    dense, sparse = pair(update, args, rows, comm, servers, rank, counts=True)
    rng = np.random.default_rng(11)
    mine = np.arange(rank, rows, servers)
    for step in range(60):
        picked = rng.choice(mine, size=int(rng.integers(1, 80)), replace=step % 3 == 0)
        client = step % 2
        if step % 4 == 0:  # reads subscribe (and create rows in the sparse shard)
            for s in (dense, sparse):
                local, index = s.local_rows(picked, "READ")
                s.subscribe(local, client, index)
        if step % 5 == 4:  # a CSR batch: two columns per row
            indptr = np.arange(0, 2 * picked.shape[0] + 1, 2, dtype=np.int64)
            cols = np.tile(np.array([0, 2], np.int32), picked.shape[0])
            vals = rng.normal(size=cols.shape[0])
            batches = [UpdateBatch(picked, vals.copy(), indptr, cols) for _ in range(2)]
        else:
            vals = rng.normal(size=(picked.shape[0], 3))
            batches = [UpdateBatch(picked, vals.copy()) for _ in range(2)]
        assert dense.apply(batches[0], client) == sparse.apply(batches[1], client)
        if step % 7 == 6:  # the rows a clock-advance push would send, as global ids
            assert sorted(dense.global_rows[dense.take_changed()]) == sorted(sparse.global_rows[sparse.take_changed()])
        if comm.enabled and step % 6 == 5:
            read = np.unique(picked // servers)
            for s in (dense, sparse):
                s.set_recent(client, read)
    ids = sparse.global_rows.copy()
    assert sparse.stored == ids.shape[0] < mine.shape[0]
    np.testing.assert_array_equal(sparse.values[:sparse.stored], dense.values[ids // servers])
    for k, v in sparse.procedure.state().items():
        np.testing.assert_array_equal(v[:sparse.stored], dense.procedure.state()[k][ids // servers])
    np.testing.assert_array_equal(sparse.applied[:sparse.stored], dense.applied[ids // servers])
    local, _ = sparse.local_rows(ids, "READ")
    np.testing.assert_array_equal(sparse.push_to(local, 0), sparse.local_rows(
        dense.global_rows[dense.push_to(dense.local_rows(ids, "READ")[0], 0)], "READ")[0])
    # an untouched row is created on read with the dense table's initial value
    fresh = np.setdiff1d(mine, ids)[:5]
    local, _ = sparse.local_rows(fresh, "READ")
    np.testing.assert_array_equal(sparse.values[local], dense.values[fresh // servers])


def test_sparse_memory_follows_the_rows_stored():
    cfg = TableConfig(name="E", rows=UNBOUNDED, cols=16, storage="sparse", init=InitConfig(uniform=(-1, 1)))
    s = TableShard(0, cfg, Partition(1), 0, 1, procedures.load(cfg, "t.yaml"), CommConfig(enabled=False))
    rng = np.random.default_rng(0)
    ids = np.unique(rng.integers(0, UNBOUNDED, size=200_000, dtype=np.int64))
    for part in np.array_split(ids, 50):
        s.apply(UpdateBatch(part, np.ones((part.shape[0], 16), np.float32)), 0)
    assert s.stored == ids.shape[0]
    row_bytes = 16 * 4
    assert s.nbytes < 2.2 * row_bytes * s.stored, s.nbytes / (row_bytes * s.stored)
    want = rowmath.init_rows(cfg.init, ids[:3], (UNBOUNDED, 16), np.dtype(np.float32), 0) + 1
    local, _ = s.local_rows(ids[:3], "READ")
    np.testing.assert_array_equal(s.values[local], want)


def test_stored_rows_skip_the_checks_but_a_new_bad_row_is_still_refused_before_anything_changes():
    # rows already stored take the one-lookup path; one new bad id among them fails the whole batch
    dense, sparse = pair("add", {}, 30, CommConfig(enabled=False), servers=3, rank=1)
    mine = np.array([1, 4, 7, 10], dtype=np.int64)
    for s in (dense, sparse):
        s.apply(UpdateBatch(mine, np.ones((4, 3))), 0)
    before, stored = sparse.values[:sparse.stored].copy(), sparse.stored
    for bad, msg in ((30, "row 30 out of range for sparse table 'W'"), (-1, "row -1 out of range"),
                     (5, "row 5 of table 'W' belongs to server 2, not 1")):
        rows = np.concatenate([mine, [bad]])
        with pytest.raises(ProtocolError, match=msg):
            sparse.apply(UpdateBatch(rows, np.ones((5, 3))), 0)
        assert sparse.stored == stored
        np.testing.assert_array_equal(sparse.values[:stored], before)
    # stored and new rows together, repeated, in a non-contiguous int64 view
    rows = np.array([[7, 0], [13, 0], [1, 0], [13, 0]], dtype=np.int64)[:, 0]
    for s in (dense, sparse):
        s.apply(UpdateBatch(rows, np.full((4, 3), 0.5)), 0)
    assert sparse.stored == stored + 1
    ids = sparse.global_rows
    np.testing.assert_array_equal(sparse.values[:sparse.stored], dense.values[ids // 3])


def test_config_storage_errors_name_the_key():
    base = {"cluster": {"servers": ["127.0.0.1:5000"], "workers": 1}}
    cfg = build({**base, "tables": {"E": {"storage": "sparse", "cols": 8}}})
    assert cfg.tables[0].rows == UNBOUNDED and not cfg.tables[0].bounded
    with pytest.raises(ConfigError, match=r"tables\.E\.rows: required key is missing"):
        build({**base, "tables": {"E": {"cols": 8}}})
    with pytest.raises(ConfigError, match=r"tables\.E\.storage"):
        build({**base, "tables": {"E": {"rows": 5, "cols": 8, "storage": "hashed"}}})
    with pytest.raises(ConfigError, match=r"tables\.E\.init\.file: a sparse table without rows"):
        build({**base, "tables": {"E": {"storage": "sparse", "cols": 2, "init": {"file": "x.npy"}}}})
    # today's client caches densely: a table without rows is refused where the client is made
    with pytest.raises(ConfigError, match=r"tables\.E\.rows: .*bounded client cache"):
        TableState(0, cfg.tables[0], 0, 1, CommConfig(enabled=False))
    versioned = TableConfig(name="V", rows=10, cols=2, update="adarevision", storage="sparse")
    with pytest.raises(ConfigError, match=r"tables\.V\.storage: sparse tables do not take versioned"):
        TableShard(0, versioned, Partition(1), 0, 1, procedures.load(versioned, "t.yaml"), CommConfig(enabled=False))


def _schedule(client: Client) -> list[np.ndarray]:
    """Four clocks of sgd increments on random rows, and what the client reads after each."""
    t = client.table("W")
    rng = np.random.default_rng(5)
    seen = []
    view = t.view(np.unique(rng.integers(0, SPEC["rows"], size=200)))
    for _ in range(4):
        rows = rng.integers(0, SPEC["rows"], size=300)
        t.inc_rows(rows, rng.normal(size=(rows.shape[0], 4)).astype(np.float32))
        view.refresh()
        view.values += 0.125  # a gradient through the view
        view.push()
        client.clock()
        probe = np.unique(np.concatenate([rows, rng.integers(0, SPEC["rows"], size=50)]))
        view.refresh()
        seen += [t.get_rows(probe), t.get_row(int(probe[0])), view.values.copy()]
    return seen


SPEC = {"rows": 50_000, "cols": 4, "dtype": "float32", "update": "sgd", "update_args": {"lr": 0.25},
        "init": {"normal": 0.5, "seed": 3}}


@pytest.mark.timeout(120)
def test_sparse_and_dense_tables_agree_through_real_servers(bosen_cluster):
    c = bosen_cluster(2, workers=1, staleness=0, tables={"W": SPEC})
    client = Client.connect(c.path, rank=0)
    try:
        want = _schedule(client)
        dense_bytes = sum(st["tables"]["W"]["bytes"] for st in c.status())
    finally:
        client.close()
    c.stop(check=True)

    c = bosen_cluster(2, workers=2, staleness=0, tables={"W": {**SPEC, "storage": "sparse"}})
    ctx = zmq.Context()
    raws = [Raw(ctx, a) for a in c.addresses]
    client = None
    try:
        # rank 1 is a raw peer: bad ids straight onto the wire are named, then it clocks far ahead
        fp = config_mod.load(c.path).fingerprint()
        inc = {"t": Msg.INC, "tb": 0, "n": 1, "dt": "float32", "sp": False}
        for raw in raws:
            raw.send({"t": Msg.HELLO, "rank": 1, "fp": fp})
            h, _ = raw.recv()
            assert h["t"] == Msg.WELCOME, h
            raw.bad("row -4 out of range for sparse table 'W'", inc, np.array([-4], np.int64), np.ones(4, np.float32))
            raw.bad("row 50000 out of range for sparse table 'W'", inc, np.array([50_000], np.int64),
                    np.ones(4, np.float32))
            raw.send({"t": Msg.CLOCK, "c": 100})
        client = Client.connect(c.path, rank=0)
        got = _schedule(client)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)
        status = c.status()
        stored = sum(st["tables"]["W"]["rows"] for st in status)
        assert 0 < stored < 2000, stored
        assert sum(st["tables"]["W"]["bytes"] for st in status) < dense_bytes / 10
        lines = format_table(status).splitlines()
        assert "MB rows" in lines[0] and str(status[0]["tables"]["W"]["rows"]) in lines[1]
    finally:
        if client is not None:
            client.close()
        for raw in raws:
            raw.close()
        ctx.term()
