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


def vbatch(rows: np.ndarray, g: np.ndarray, tags: list[int], eov: list[bool],
           rel: list[tuple[int, int]]) -> UpdateBatch:
    """A versioned update: rows by id, their tags and end-of-version marks, and (id, version) releases."""
    return UpdateBatch(np.asarray(rows, np.int64), g, tags=np.asarray(tags, np.int64), eov=np.asarray(eov, bool),
                       rel_rows=np.array([r for r, _ in rel], np.int64),
                       rel_tags=np.array([v for _, v in rel], np.int64))


def held_pairs(s: TableShard, client: int) -> list[tuple[int, int]]:
    """The (row id, version) references ``client`` holds on shard ``s``, by id."""
    rows, versions = s.holdings[client].outstanding()
    return sorted(zip(s.global_rows[rows].tolist(), versions.tolist(), strict=True))


@pytest.mark.parametrize("comm", [CommConfig(enabled=False),
                                  CommConfig(enabled=True, priority="relative", push_to="readers")],
                         ids=["bs", "managed-readers"])
def test_a_versioned_sparse_shard_gives_the_dense_values_versions_and_holdings(comm):
    """AdaRevision on a sparse shard that grows while clients hold snapshots: two clients read
    (receive versions), update tagged with what they hold, retire old versions (end-of-version) or
    release them; the sparse shard's values, accumulators, versions, snapshot copies and per-client
    holdings equal the dense shard's at every step, and a lost client's references are released."""
    servers, rank, rows = 3, 1, 3000
    dense, sparse = pair("adarevision", {"alpha": 0.2}, rows, comm, servers, rank)
    rng = np.random.default_rng(12)
    mine = np.arange(rank, rows, servers)
    held: list[dict[int, int]] = [{}, {}]  # per client: row id -> the newest version it received
    old: list[list[tuple[int, int]]] = [[], []]  # per client: versions received before, still to release
    grew_with_snapshots, cap = 0, sparse.values.shape[0]
    for step in range(240):
        client = step % 2
        picked = rng.choice(mine[:min(mine.shape[0], 8 + 4 * step)], size=int(rng.integers(1, 10)))
        if rng.random() < 0.4:  # a read: both shards send the same versions
            ids = np.unique(picked)
            got = []
            for s in (dense, sparse):
                local, index = s.local_rows(ids, "READ")
                s.subscribe(local, client, index)
                got.append(s.rows_sent(local, client))
            np.testing.assert_array_equal(got[0], got[1])
            for r, v in zip(ids.tolist(), got[0].tolist(), strict=True):
                if held[client].get(r, 0) > 0:
                    old[client].append((r, held[client][r]))
                held[client][r] = v
        else:  # updates tagged with the held versions; old ones retired (end-of-version) or released
            retire, release = [], []
            if old[client] and rng.random() < 0.5:
                k = int(rng.integers(1, len(old[client]) + 1))
                (retire if rng.random() < 0.5 else release).extend(old[client][:k])
                old[client] = old[client][k:]
            ids = np.concatenate([np.array([r for r, _ in retire], np.int64), picked])
            tags = [v for _, v in retire] + [held[client].get(int(r), 0) for r in picked]
            eov = [True] * len(retire) + [False] * picked.shape[0]
            g = rng.normal(size=(ids.shape[0], 3))
            for s in (dense, sparse):
                s.apply(vbatch(ids, g.copy(), tags, eov, release), client)
        if sparse.values.shape[0] != cap:
            cap = sparse.values.shape[0]
            grew_with_snapshots += sparse.procedure.store.live > 0
        ids = sparse.global_rows.copy()
        np.testing.assert_array_equal(sparse.values[:sparse.stored], dense.values[ids // servers])
        for k, v in sparse.procedure.state().items():
            np.testing.assert_array_equal(v[:sparse.stored], dense.procedure.state()[k][ids // servers], err_msg=k)
        assert sparse.procedure.stats() == dense.procedure.stats()
    assert grew_with_snapshots >= 2 and sparse.procedure.store.peak > 0, grew_with_snapshots
    assert sparse.stored < mine.shape[0]
    for c in range(2):
        assert held_pairs(sparse, c) == held_pairs(dense, c) != []
    # an update tagged with a version nobody holds names the row by its id, not its slot
    r = int(sparse.global_rows[-1])
    with pytest.raises(ProtocolError, match=rf"row {r}: update tagged with version 999, which no client holds"):
        sparse.apply(vbatch(np.array([r]), np.ones((1, 3)), [999], [False], []), 0)
    # client 1 is lost: its references are released for it; client 0 releases its own, as at BYE
    assert sparse.release_client(1, lost=True) == dense.release_client(1, lost=True) > 0
    mine0 = old[0] + [(r, v) for r, v in held[0].items() if v > 0]
    for s in (dense, sparse):
        s.apply(vbatch(np.empty(0, np.int64), np.empty((0, 3)), [], [], mine0), 0)
        st = s.procedure.stats()
        assert (st["snapshots"], st["versions_held"], st["release_errors"]) == (0, 0, 0), st


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
    # a client keeps such a table by slot, only the rows it touches (client/slots.py)
    assert TableState(0, cfg.tables[0], 0, 1, CommConfig(enabled=False)).slots is not None
    with pytest.raises(ConfigError, match=r"tables\.E\.cache_rows: must be an integer >= 1"):
        build({**base, "tables": {"E": {"rows": 5, "cols": 8, "cache_rows": 0}}})


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
