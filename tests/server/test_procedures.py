"""Stored procedures in process: loading by name or import path, argument errors, the math of sgd,
adagrad and adarevision against plain numpy, and the versioning bookkeeping (refcounted snapshots,
copy on write, releases, the cap) through the server's TableShard, with no network."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from conftest import PY, TESTS, run_cmd, write_config

from bosen import config as config_mod
from bosen.config import CommConfig, TableConfig
from bosen.errors import ConfigError, ProtocolError
from bosen.partition import Partition
from bosen.procedure import StoredProcedure
from bosen.server import procedures
from bosen.server.procedures.adagrad import AdaGrad
from bosen.server.procedures.adarevision import AdaRevision
from bosen.server.procedures.versioning import SnapshotStore
from bosen.server.shard import TableShard
from bosen.wire import UpdateBatch

sys.path.insert(0, str(TESTS / "procs"))


def table(update: str = "add", args: dict | None = None, rows: int = 6, cols: int = 4, dtype: str = "float64",
          **kw) -> TableConfig:
    return TableConfig(name="W", rows=rows, cols=cols, dtype=dtype, update=update, update_args=args or {}, **kw)


def shard(cfg: TableConfig, clients: int = 3, comm: CommConfig | None = None) -> TableShard:
    return TableShard(0, cfg, Partition(1), 0, clients, procedures.load(cfg, "test.yaml"),
                      comm or CommConfig(enabled=False))


class RefAdaRevision:
    """The rule of reference/adarevision.md in plain numpy, one row at a time."""

    def __init__(self, x0: np.ndarray, alpha: float, z0: float = 1.0) -> None:
        self.alpha = alpha
        self.x = x0.astype(np.float64).copy()
        self.z = np.full_like(self.x, z0)
        self.zmax = self.z.copy()
        self.gsum = np.zeros_like(self.x)

    def apply(self, r: int, g: np.ndarray, gsum_old: np.ndarray) -> None:
        g_bck = self.gsum[r] - gsum_old
        eta_old = self.alpha / np.sqrt(self.zmax[r])
        self.z[r] = self.z[r] + g * g + 2.0 * g * g_bck
        self.zmax[r] = np.maximum(self.z[r], self.zmax[r])
        eta = self.alpha / np.sqrt(self.zmax[r])
        self.x[r] = self.x[r] - eta * g + (eta_old - eta) * g_bck
        self.gsum[r] = self.gsum[r] + g


# ------------------------------------------------------------------------------------------------
# loading


def test_builtins_load_by_name_with_their_properties():
    for name, cls, versioned in [("add", StoredProcedure, False), ("sgd", None, False), ("adagrad", AdaGrad, False),
                                 ("adarevision", AdaRevision, True)]:
        p = procedures.load(table(name))
        assert p.versioned is versioned
        assert p.read_my_writes is (name == "add")
        if cls is not None:
            assert type(p) is cls
    p = procedures.load(table("adarevision", {"alpha": 0.08, "max_snapshots": 5, "init_z": 2.0}))
    assert (p.alpha, p.max_snapshots, p.init_z) == (0.08, 5, 2.0)


def test_user_procedure_loads_from_import_path():
    p = procedures.load(table("userprocs:ScaledAdd", {"scale": 3.0}))
    assert type(p).__name__ == "ScaledAdd" and p.scale == 3.0 and not p.read_my_writes


@pytest.mark.parametrize("update, args, match", [
    ("adarevison", {}, r"tables\.W\.update: 'adarevison' is neither a built-in .*mypkg\.rules:MyRule"),
    ("nosuchmod_xyz:Rule", {}, r"tables\.W\.update: cannot load 'nosuchmod_xyz:Rule'"),
    ("userprocs:Missing", {}, r"tables\.W\.update: cannot load 'userprocs:Missing'"),
    ("userprocs:NotAProcedure", {}, r"not a bosen\.procedure\.StoredProcedure subclass"),
    ("adarevision", {"alpha": -1}, r"tables\.W\.update_args: alpha: expected a number > 0, got -1"),
    ("adarevision", {"alpha": "big"}, r"tables\.W\.update_args: alpha: expected a number > 0"),
    ("adarevision", {"max_snapshots": 1.5}, r"tables\.W\.update_args: max_snapshots: expected an integer >= 0"),
    ("adarevision", {"lr": 0.1}, r"tables\.W\.update_args: .*unexpected keyword argument 'lr'"),
    ("sgd", {"lr": 0}, r"tables\.W\.update_args: lr: expected a number > 0"),
    ("adagrad", {"alpha": True}, r"tables\.W\.update_args: alpha: expected a number > 0"),
    ("add", {"alpha": 1}, r"tables\.W\.update_args: unexpected update_args: alpha"),
    ("userprocs:ScaledAdd", {"scale": "x"}, r"tables\.W\.update_args: scale must be a number"),
])
def test_bad_procedure_name_path_or_args_is_a_config_error(update, args, match):
    with pytest.raises(ConfigError, match=match) as e:
        procedures.load(table(update, args), "job.yaml")
    assert "job.yaml" in str(e.value)


def test_step_procedures_need_float_tables_and_versioned_ones_no_read_my_writes():
    for name in ("sgd", "adagrad", "adarevision"):
        with pytest.raises(ConfigError, match=rf"tables\.W\.update: '{name}' needs a float table.*int64"):
            procedures.load(table(name, dtype="int64"), "job.yaml")
    with pytest.raises(ConfigError, match=r"tables\.W\.read_my_writes: cannot be true with 'adarevision'"):
        procedures.load(table("adarevision", read_my_writes=True), "job.yaml")
    # the YAML may turn read-my-writes off (or on, for a non-versioned procedure): the server tells clients
    assert procedures.read_my_writes(table("add", read_my_writes=False), StoredProcedure(table())) is False
    assert procedures.read_my_writes(table("sgd", read_my_writes=True), procedures.load(table("sgd"))) is True
    assert procedures.read_my_writes(table("sgd"), procedures.load(table("sgd"))) is False


def test_server_with_a_bad_procedure_fails_at_start_naming_the_key(tmp_path):
    cfg = {"cluster": {"servers": ["127.0.0.1:0"], "workers": 1},
           "tables": {"W": {"rows": 4, "cols": 2, "update": "adarevision", "update_args": {"alpha": 0}}}}
    path = write_config(tmp_path / "bad.yaml", cfg)
    r = run_cmd([PY, "-m", "bosen.server", "--config", path, "--rank", 0], timeout=60)
    assert r.returncode == 2
    assert f"{path}: tables.W.update_args: alpha: expected a number > 0, got 0" in r.stderr
    cfg["tables"]["W"] = {"rows": 4, "cols": 2, "update": "nope.mod:Rule"}
    r = run_cmd([PY, "-m", "bosen.server", "--config", write_config(tmp_path / "bad2.yaml", cfg), "--rank", 0],
                timeout=60)
    assert r.returncode == 2 and "tables.W.update: cannot load 'nope.mod:Rule'" in r.stderr


# ------------------------------------------------------------------------------------------------
# the math, unversioned


def test_sgd_takes_minus_lr_times_gradient_dense_and_sparse():
    s = shard(table("sgd", {"lr": 0.5}))
    x0 = s.values.copy()
    g = np.arange(8, dtype=np.float64).reshape(2, 4)
    s.apply(UpdateBatch(np.array([1, 1]), g), 0)  # duplicate rows accumulate
    expect = x0.copy()
    expect[1] -= 0.5 * (g[0] + g[1])
    np.testing.assert_array_equal(s.values, expect)
    s.apply(UpdateBatch(np.array([0, 3]), np.array([2.0, -4.0]), np.array([0, 1, 2]), np.array([1, 3], np.int32)), 0)
    expect[0, 1] -= 1.0
    expect[3, 3] += 2.0
    np.testing.assert_array_equal(s.values, expect)


def test_float16_wire_is_converted_before_the_kernels():
    s = shard(table("adagrad", {"alpha": 0.5}, dtype="float32"))
    s.apply(UpdateBatch(np.array([2]), np.full((1, 4), 0.5, dtype=np.float16)), 0)
    np.testing.assert_allclose(s.values[2], -0.5 * 0.5 / np.sqrt(1.25), rtol=1e-6)


def test_adagrad_matches_numpy_and_adarevision_without_delay_matches_adagrad_exactly():
    rng = np.random.default_rng(0)
    init = config_mod.InitConfig(normal=0.5, seed=3)
    ag = shard(table("adagrad", {"alpha": 0.3}, init=init))
    ar = shard(table("adarevision", {"alpha": 0.3}, init=init))
    np.testing.assert_array_equal(ag.values, ar.values)
    x, z = ag.values.copy(), np.ones_like(ag.values)
    for step in range(60):
        rows = np.sort(rng.choice(6, size=rng.integers(1, 7), replace=False))
        g = rng.standard_normal((rows.size, 4)) * rng.choice([0.01, 1, 100])
        if step % 3 == 0:  # sparse: some coordinates untouched
            g[rng.random(g.shape) < 0.5] = 0.0
        for i, r in enumerate(rows):
            z[r] = z[r] + g[i] * g[i]
            x[r] = x[r] - 0.3 / np.sqrt(z[r]) * g[i]
        ag.apply(UpdateBatch(rows, g), 0)
        # no delay: every update is tagged with the row's current version
        ar.apply(UpdateBatch(rows, g, tags=ar.procedure.versions[rows].copy(), eov=np.zeros(rows.size, bool),
                             rel_rows=np.empty(0, np.int64), rel_tags=np.empty(0, np.int64)), 0)
    np.testing.assert_array_equal(ag.values, x)
    np.testing.assert_array_equal(ar.values, ag.values)  # bit for bit (float64)
    np.testing.assert_array_equal(ar.procedure.z, ag.procedure.z)
    np.testing.assert_array_equal(ar.procedure.zmax, ar.procedure.z)


# ------------------------------------------------------------------------------------------------
# adarevision with delays, through the shard (tags, end-of-version marks, releases)


def vbatch(rows, values, tags, eov=None, rel=((), ()), sparse=False) -> UpdateBatch:
    rows = np.asarray(rows, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    b = UpdateBatch(rows, values)
    if sparse:
        nz = values != 0
        b = UpdateBatch(rows, values[nz], np.concatenate([[0], np.cumsum(nz.sum(axis=1))]).astype(np.int64),
                        np.nonzero(nz)[1].astype(np.int32))
    b.tags = np.asarray(tags, dtype=np.int64)
    b.eov = np.zeros(rows.size, bool) if eov is None else np.asarray(eov, bool)
    b.rel_rows = np.asarray(rel[0], dtype=np.int64)
    b.rel_tags = np.asarray(rel[1], dtype=np.int64)
    return b


class Sim:
    """Clients of one AdaRevision shard, driven step by step beside the numpy reference.

    A client holds, per row, the version it last received and the reference's ḡ at that moment.
    Updates are tagged with the held version. A receipt replaces the held version; the old one is
    then released later, either explicitly or by updates tagged with it marked end-of-version (a
    real client's retired updates), which the reference applies with the old ḡ.

    A sparse shard (``storage: sparse``) stores its rows first touched in a random order, so its
    slots are not the row ids: ``slot[r]`` is row r's local row, through which the procedure's
    arrays are read.
    """

    def __init__(self, n_clients: int, rows: int, cols: int, alpha: float, rng: np.random.Generator,
                 storage: str = "dense") -> None:
        self.s = shard(table("adarevision", {"alpha": alpha}, rows=rows, cols=cols, storage=storage,
                             init=config_mod.InitConfig(normal=1.0, seed=7)), clients=n_clients)
        self.p: AdaRevision = self.s.procedure
        if storage == "sparse":
            self.s.local_rows(rng.permutation(rows), "READ")
        self.slot = self.s.local_rows(np.arange(rows), "READ")[0]
        assert (self.slot == np.arange(rows)).all() == (storage == "dense")
        self.ref = RefAdaRevision(self.s.values[self.slot], alpha)
        self.rng = rng
        self.rows, self.cols = rows, cols
        self.held = np.zeros((n_clients, rows), dtype=np.int64)
        self.gold = np.zeros((n_clients, rows, cols))
        self.old: list[list[tuple[int, int, np.ndarray]]] = [[] for _ in range(n_clients)]  # to release

    def receive(self, c: int, rows: np.ndarray) -> None:
        self.p.rows_sent(self.slot[rows], 1)
        for r in rows:
            if self.held[c, r] > 0:
                self.old[c].append((int(r), int(self.held[c, r]), self.gold[c, r].copy()))
            self.held[c, r] = self.p.versions[self.slot[r]]
            self.gold[c, r] = self.ref.gsum[r]

    def _grad(self, n: int, sparse: bool) -> np.ndarray:
        g = self.rng.standard_normal((n, self.cols)) * self.rng.choice([0.1, 1.0, 10.0])
        if sparse:
            g[self.rng.random(g.shape) < 0.5] = 0.0
        return g

    def update(self, c: int, rows: np.ndarray, sparse: bool = False, release: bool = True) -> None:
        """Updates tagged with the held versions; optionally the old versions' explicit releases."""
        g = self._grad(rows.size, sparse)
        for i, r in enumerate(rows):
            self.ref.apply(r, g[i], self.gold[c, r])
        rel = self.old[c] if release else []
        self.s.apply(vbatch(rows, g, self.held[c, rows], None, ([r for r, _, _ in rel], [v for _, v, _ in rel]),
                            sparse), c)
        if release:
            self.old[c] = []

    def retire(self, c: int, sparse: bool = False) -> None:
        """Updates tagged with old versions, marked end-of-version, then current ones in one batch."""
        old, self.old[c] = self.old[c], []
        cur = np.sort(self.rng.choice(self.rows, size=2, replace=False))
        rows = np.concatenate([np.array([r for r, _, _ in old], np.int64), cur])
        tags = np.concatenate([np.array([v for _, v, _ in old], np.int64), self.held[c, cur]])
        golds = [gold for _, _, gold in old] + [self.gold[c, r] for r in cur]
        g = self._grad(rows.size, sparse)
        for i, r in enumerate(rows):
            self.ref.apply(r, g[i], golds[i])
        self.s.apply(vbatch(rows, g, tags, np.arange(rows.size) < len(old), sparse=sparse), c)

    def release_all(self, c: int) -> None:
        rel = [(r, v) for r, v, _ in self.old[c]] + [(r, int(v)) for r, v in enumerate(self.held[c]) if v > 0]
        self.old[c] = []
        self.held[c] = 0
        self.s.apply(vbatch([], np.empty((0, self.cols)), [], rel=([r for r, _ in rel], [v for _, v in rel])), c)

    def expected_snapshots(self) -> int:
        """Distinct (row, version) pairs still referenced whose version is no longer current."""
        now = self.p.versions[self.slot]
        pairs = {(r, int(v)) for c in range(self.held.shape[0]) for r, v in enumerate(self.held[c]) if 0 < v < now[r]}
        pairs |= {(r, v) for c in range(len(self.old)) for r, v, _ in self.old[c] if 0 < v < now[r]}
        return len(pairs)


@pytest.mark.parametrize("seed, storage", [(0, "dense"), (1, "dense"), (2, "dense"), (3, "dense"),
                                           (0, "sparse"), (1, "sparse")])
def test_adarevision_with_delays_matches_numpy_reference_and_frees_every_snapshot(seed, storage):
    rng = np.random.default_rng(seed)
    sim = Sim(n_clients=3, rows=7, cols=5, alpha=0.2, rng=rng, storage=storage)
    for c in range(3):
        sim.receive(c, np.arange(7))
    peak = 0
    for _ in range(300):
        c = int(rng.integers(3))
        rows = np.sort(rng.choice(7, size=rng.integers(1, 5), replace=False))
        if rng.random() < 0.3:
            rows = np.concatenate([rows, rows[:1]])  # a row twice in one message: applied in order
        kind = rng.random()
        if kind < 0.35:
            sim.receive(c, np.unique(rows[:rng.integers(1, rows.size + 1)]))
        elif kind < 0.5:
            sim.retire(c, sparse=kind < 0.42)
        else:
            sim.update(c, rows, sparse=kind > 0.85, release=rng.random() < 0.7)
        assert sim.p.store.live == sim.expected_snapshots()
        peak = max(peak, sim.p.store.live)
    slot = sim.slot
    np.testing.assert_array_equal(sim.s.values[slot], sim.ref.x)
    np.testing.assert_array_equal(sim.p.gsum[slot], sim.ref.gsum)
    np.testing.assert_array_equal(sim.p.z[slot], sim.ref.z)
    np.testing.assert_array_equal(sim.p.zmax[slot], sim.ref.zmax)
    assert peak > 0 and (sim.p.zmax > sim.p.z).any()  # delays did make z shrink somewhere
    for c in range(3):
        sim.release_all(c)
    st = sim.p.stats()
    assert (st["snapshots"], st["versions_held"], st["release_errors"]) == (0, 0, 0)
    assert st["snapshots_peak"] >= peak  # (measured before the releases of the same message)


def test_dense_and_sparse_batches_give_the_same_state():
    rng = np.random.default_rng(5)
    s = shard(table("adarevision", {"alpha": 0.1}, rows=3, cols=6))
    t = shard(table("adarevision", {"alpha": 0.1}, rows=3, cols=6))
    for x in (s, t):
        x.procedure.rows_sent(np.arange(3), 2)
    held = np.zeros((2, 3), dtype=np.int64)
    for step in range(50):
        c = step % 2
        rows = np.sort(rng.choice(3, size=2, replace=False))
        g = rng.standard_normal((2, 6))
        g[rng.random(g.shape) < 0.5] = 0.0
        s.apply(vbatch(rows, g, held[c, rows]), c)
        t.apply(vbatch(rows, g, held[c, rows], sparse=True), c)
        if step % 5 == 4:  # clients re-read now and then (the old versions stay held: no releases here)
            for x in (s, t):
                x.procedure.rows_sent(np.arange(3), 1)
            held[c] = s.procedure.versions
    np.testing.assert_array_equal(s.values, t.values)
    np.testing.assert_array_equal(s.procedure.zmax, t.procedure.zmax)


def test_tag_checks_and_versioned_mismatch_are_protocol_errors():
    s = shard(table("adarevision"))
    s.procedure.rows_sent(np.array([0, 1]), 1)
    s.apply(vbatch([0], np.ones((1, 4)), [0]), 0)  # row 0 -> version 1
    before = s.values.copy()
    with pytest.raises(ProtocolError, match=r"row 1: update tagged with version 3, which no client holds"):
        s.apply(vbatch([0, 1], np.ones((2, 4)), [1, 3]), 0)
    np.testing.assert_array_equal(s.values, before)  # checked before anything changed
    with pytest.raises(ProtocolError, match="version tags"):
        s.apply(UpdateBatch(np.array([0]), np.ones((1, 4))), 0)
    with pytest.raises(ProtocolError, match="not versioned"):
        shard(table("sgd")).apply(vbatch([0], np.ones((1, 4)), [0]), 0)
    with pytest.raises(ProtocolError, match="released row versions were not held"):
        s.apply(vbatch([], np.empty((0, 4)), [], rel=([1], [1])), 0)
    with pytest.raises(ProtocolError, match="out of range"):
        s.apply(vbatch([], np.empty((0, 4)), [], rel=([99], [1])), 0)


def test_snapshot_copy_on_write_refcounts_and_pool_growth():
    st = SnapshotStore(4, 2, capacity=1)
    src = np.arange(8, dtype=np.float64).reshape(4, 2)
    st.rows_sent(np.array([0, 1, 2, 3]), 2)  # version 0: nothing to hold
    assert st.held() == 0
    st.versions[:] = 1
    st.rows_sent(np.array([0, 1, 2, 3]), 2)
    assert (st.held(), st.live) == (8, 0)  # current versions need no copy
    from bosen.server.procedures.versioning import copy_on_write
    st.reserve(4)
    assert st.capacity >= 4 and int(st.nfree[0]) >= 4
    for r in range(4):
        copy_on_write(st.index, st.versions, st.cur_ref, st.pool, st.refcnt, st.free, st.nfree, src, r)
        st.versions[r] += 1
    assert (st.live, st.held()) == (4, 8)
    np.testing.assert_array_equal(st.pool[st.index[(2, 1)]], src[2])
    assert st.release(np.array([0, 1, 2, 3]), np.array([1, 1, 1, 1])) == 0
    assert st.live == 4  # each still held once
    assert st.release(np.array([0, 1, 2, 3, 3]), np.array([1, 1, 1, 1, 1])) == 1  # one too many
    assert (st.live, st.held(), st.release_errors) == (0, 0, 1)
    st.reserve(20)  # grows again after everything was freed; free slots stay consistent
    assert int(st.nfree[0]) == st.capacity and len(set(st.free.tolist())) == st.capacity


def test_cap_stops_budgeted_pushes_while_live_snapshots_exceed_it():
    s = shard(table("adarevision", {"max_snapshots": 2}))
    p = s.procedure
    p.rows_sent(np.arange(6), 1)
    s.apply(vbatch(np.arange(6), np.ones((6, 4)), np.zeros(6)), 0)  # every row -> version 1
    p.rows_sent(np.arange(6), 1)  # a client holds version 1 of every row
    assert p.allow_push()
    s.apply(vbatch([0, 1], np.ones((2, 4)), [1, 1]), 1)  # two held rows change: 2 copies
    assert p.store.live == 2 and p.allow_push()
    s.apply(vbatch([2], np.ones((1, 4)), [1]), 1)
    assert p.store.live == 3 and not p.allow_push()
    assert p.stats()["snapshots"] == 3 and p.stats()["snapshot_cap"] == 2
    s.apply(vbatch([], np.empty((0, 4)), [], rel=([0], [1])), 0)
    assert p.store.live == 2 and p.allow_push()
