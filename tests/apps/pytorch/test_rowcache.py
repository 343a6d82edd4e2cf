"""The device-side row cache of PSEmbedding rows (apps/pytorch/rowcache.py): training with it equals
training without it at staleness 0, stays within the bound at staleness 2, evicts the least recently
used rows, and refetches a row once it is older than the SSP bound (two real clients)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bosen.apps.pytorch import PSModule
from bosen.apps.pytorch.examples import criteo, dlrm
from bosen.apps.pytorch.rowcache import DeviceRowCache, fetch_through
from bosen.client import Client
from bosen.errors import ConfigError

SMALL = {"max_rows": 500, "train_samples": 4096, "test_samples": 2048, "batch_size": 128, "evals_per_epoch": 4,
         "clock_every": 2, "dim": 8, "bottom": 16, "top": 16, "optimizer": "adagrad", "lr": 0.05,
         "storage": "sparse"}
CPU = torch.device("cpu")


def run_dlrm(bosen_cluster: Any, out: Path, staleness: int, **args: Any) -> tuple[list[dict], np.ndarray]:
    """One worker through dlrm.train: (its reports, the touched embedding rows at the end)."""
    a = {**SMALL, **args}
    c = bosen_cluster(1, workers=1, staleness=staleness, tables=dlrm.tables(a, out))  # the cache, not the partition
    client = Client.connect(c.path, rank=0)
    try:
        dlrm.train(client, a)
        client.clock()
        p = dlrm.DLRMArgs(**a)
        ids = np.unique(criteo.generate(p.spec, 0, p.train_samples).ids + np.cumsum((0, *p.spec.cardinalities[:-1])))
        return list(client.reports), client.table("emb").get_rows(ids)
    finally:
        client.close()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("storage", ["sparse", "dense"])
def test_dlrm_with_the_device_cache_equals_without_at_staleness_0(bosen_cluster, tmp_path, storage):
    """At staleness 0 a row is reused only within the tick it was read in, where the client's cache
    serves the same value: losses, held-out scores and the rows are bit-identical, with hits. Sparse:
    PSEmbedding rows in the bounded device cache; dense: an nn.Embedding's weight, each row with its
    clock (server AdaGrad: the weight is not the client's view)."""
    base = run_dlrm(bosen_cluster, tmp_path / "base", 0, storage=storage)
    cached = run_dlrm(bosen_cluster, tmp_path / "cached", 0, storage=storage, device_cache_rows=3000)
    keys = ("objective", "heldout_logloss", "heldout_auc", "rows_pushed")
    assert [[r[k] for k in keys] for r in base[0]] == [[r[k] for k in keys] for r in cached[0]]
    np.testing.assert_array_equal(base[1], cached[1])
    hits = cached[0][-1]["device_cache_hits"]
    assert hits > 0
    # every row a step used came from the client or the device: hits take rows off the client's reads
    assert base[0][-1]["rows_pulled"] - cached[0][-1]["rows_pulled"] == hits


@pytest.mark.timeout(240)
def test_dlrm_with_the_device_cache_at_staleness_2_learns_as_without(bosen_cluster, tmp_path):
    """At staleness 2 rows are reused across ticks (within the bound), so the runs differ, but not by
    more than staleness does: the same held-out AUC to 0.02, over a fifth of the rows served from the
    device (held-out scoring, 6,000 distinct rows a pass through 3,000 slots, included)."""
    base = run_dlrm(bosen_cluster, tmp_path / "base", 2, clock_every=1)
    cached = run_dlrm(bosen_cluster, tmp_path / "cached", 2, clock_every=1, device_cache_rows=3000)
    last = cached[0][-1]
    assert base[0][-1]["rows_pulled"] - last["rows_pulled"] == last["device_cache_hits"]
    assert last["device_cache_hits"] > 0.2 * base[0][-1]["rows_pulled"]  # held-out scoring's reads included
    assert abs(last["heldout_auc"] - base[0][-1]["heldout_auc"]) < 0.02
    assert last["heldout_auc"] > 0.55


def add_table(rows: int = 64, cols: int = 4) -> dict[str, Any]:
    return {"emb": {"rows": rows, "cols": cols, "dtype": "float32", "update": "add", "storage": "sparse",
                    "init": {"uniform": [-1.0, 1.0], "seed": 3}}}


def test_the_least_recently_used_rows_are_evicted(bosen_cluster):
    c = bosen_cluster(1, workers=1, staleness=0, tables=add_table())
    with Client.connect(c.path, rank=0) as client:
        t = client.table("emb")
        cache = DeviceRowCache(4, 4, torch.float32, CPU)
        fetch = fetch_through(t, lambda: client.tick)

        def read(*rows: int) -> torch.Tensor:
            return cache.read(torch.tensor(rows), client.tick, fetch)

        read(0, 1)
        read(2, 3)
        got = read(0)  # hit: row 0 is now the most recently used
        assert (cache.hits, cache.misses, len(cache)) == (1, 4, 4)
        np.testing.assert_array_equal(got.numpy(), t.get_rows(np.array([0])))
        read(4)  # the cache is full: row 1, used longest ago, goes
        assert cache.find(torch.tensor([0, 1, 2, 3, 4])).ge(0).tolist() == [True, False, True, True, True]
        read(1)  # read again through the client; row 2 or 3 (both used at step 2) goes
        assert (cache.hits, cache.misses, len(cache)) == (1, 6, 4)
        # a batch larger than the cache: every value right, the cache keeps what fits
        rows = torch.arange(10, 20)
        got = read(*rows.tolist())
        np.testing.assert_array_equal(got.numpy(), t.get_rows(rows.numpy()))
        assert len(cache) == 4 and cache.bytes_saved == 1 * 4 * 4
        assert cache.find(rows).ge(0).tolist() == [True] * 4 + [False] * 6  # the first that fit
        got = read(0, 1, 4, 30, 31)
        assert cache.find(torch.tensor([0, 1, 4, 30, 31])).ge(0).tolist() == [True] * 4 + [False]
        np.testing.assert_array_equal(got.numpy(), t.get_rows(np.array([0, 1, 4, 30, 31])))


def test_a_row_older_than_the_bound_is_read_again(bosen_cluster):
    """Staleness 2. Worker 0 keeps row 5 on its device at tick 0; worker 1 then adds 10 to it and
    clocks. Worker 0 may use its copy at ticks 1 and 2 (the bound allows a value without worker 1's
    tick-0 update until tick 3), and at tick 3 must read the row again, with the update."""
    c = bosen_cluster(1, workers=2, staleness=2, tables=add_table())
    with Client.connect(c.path, rank=0) as a, Client.connect(c.path, rank=1) as b:
        ta = a.table("emb")
        cache = DeviceRowCache(8, 4, torch.float32, CPU)
        fetch = fetch_through(ta, lambda: max(a.tick - 2, 0))
        row = torch.tensor([5])

        def read() -> np.ndarray:
            return cache.read(row, max(a.tick - 2, 0), fetch).numpy()

        first = read()
        b.table("emb").inc_rows(np.array([5]), np.full((1, 4), 10, np.float32))
        for _ in range(3):
            b.clock()
        for _ in range(2):  # ticks 1 and 2
            a.clock()
            np.testing.assert_array_equal(read(), first)  # within the bound: the device copy
        assert (cache.hits, cache.misses, cache.stale) == (2, 1, 0)
        a.clock()  # tick 3: the copy (valid for clock 0) is older than 3 - 2
        np.testing.assert_allclose(read(), first + 10)
        assert (cache.hits, cache.misses, cache.stale) == (2, 2, 1)
        assert int(cache.clock[cache.find(row)]) >= 1


def test_own_pushes_show_in_the_device_copy_of_a_read_my_writes_table(bosen_cluster):
    c = bosen_cluster(1, workers=1, staleness=1, tables=add_table())
    with Client.connect(c.path, rank=0) as client:
        t = client.table("emb")
        cache = DeviceRowCache(8, 4, torch.float32, CPU)
        fetch = fetch_through(t, lambda: max(client.tick - 1, 0))
        rows = torch.tensor([1, 2, 3])
        cache.read(rows, 0, fetch)
        delta = torch.arange(8, dtype=torch.float32).reshape(2, 4)
        t.inc_rows(np.array([2, 9]), delta.numpy())  # row 9 is not held: left alone
        cache.add(torch.tensor([2, 9]), delta)
        got = cache.read(rows, 0, fetch)
        assert cache.hits == 3
        np.testing.assert_allclose(got.numpy(), t.get_rows(rows.numpy()))


def test_bad_device_cache_settings_are_named(bosen_cluster, tmp_path):
    c = bosen_cluster(1, workers=1, staleness=0, tables=dlrm.tables({**SMALL, "storage": "dense"}, tmp_path))
    with Client.connect(c.path, rank=0) as client:
        net = dlrm.model(dlrm.DLRMArgs(**{**SMALL, "storage": "dense"}))
        with pytest.raises(ValueError, match="device_cache_rows: must be a non-negative integer"):
            PSModule(net, client, device_cache_rows=-1)
        with pytest.raises(ValueError, match="the model has none"):
            PSModule(torch.nn.Linear(13, 1), client, device_cache_rows=10, prefix="none")
    # AdaRevision tags each update with the version of the client's copy it was computed from
    args = {**SMALL, "optimizer": "adarevision"}
    c = bosen_cluster(1, workers=1, staleness=0, tables=dlrm.tables(args, tmp_path / "rev"))
    with Client.connect(c.path, rank=0) as client:
        with pytest.raises(ConfigError, match="device_cache_rows: table emb applies adarevision"):
            PSModule(dlrm.model(dlrm.DLRMArgs(**args)), client, device_cache_rows=10)
