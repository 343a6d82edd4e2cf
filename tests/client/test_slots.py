"""A client that keeps only the rows it touches (client/slots.py): the slot map against a model, and
real clients on tables far bigger than they touch, 64-bit ids, a bounded cache that evicts."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from bosen.client import Client
from bosen.client.slots import SlotMap
from bosen.config import UNBOUNDED

# ------------------------------------------------------------------------------------------------
# the slot map alone


def test_slot_map_against_a_dict():
    """Random inserts, lookups, growth and evictions against a dict: every held id keeps its slot,
    a slot keeps its id's server, evicted ids are gone and their slots are reused."""
    rng = np.random.default_rng(7)
    servers = 3
    m = SlotMap(servers, 4)
    model: dict[int, int] = {}
    op = m.begin()
    for step in range(300):
        keys = rng.integers(0, 1 << 62, size=int(rng.integers(1, 20)), dtype=np.int64)
        keys[rng.random(keys.shape[0]) < 0.5] = rng.choice(list(model) or [5], size=1)[0]  # repeats
        out = np.empty(keys.shape[0], dtype=np.int64)
        start = m.translate(keys, op, 0, out)
        while start < keys.shape[0]:
            j = int(keys[start] % servers)
            assert m.full(j)
            # evict a few of that server's rows, else grow
            victims = m.victims(j, 2, np.zeros(m.capacity, dtype=bool)) if step % 3 else keys[:0]
            if victims.shape[0]:
                assert (victims % servers == j).all()
                for v in victims:
                    del model[int(m.ids[v])]
                m.evict(victims)
            else:
                m.grow(m.per * 2)
            start = m.translate(keys, op, start, out)
        for k, s in zip(keys.tolist(), out.tolist(), strict=True):
            assert model.setdefault(k, s) == s
            assert s % servers == k % servers
        m.end(op)
        op = m.begin()  # rows of earlier operations may be evicted
        ids = np.array(list(model), dtype=np.int64)
        np.testing.assert_array_equal(m.lookup(ids), [model[k] for k in ids.tolist()])
        assert len(m) == len(model)
    assert (m.lookup(np.array([1, 2, 3], dtype=np.int64)) == -1).all()


def test_victims_leave_running_operations_and_kept_slots_alone():
    m = SlotMap(1, 8)
    first = m.begin()
    out = np.empty(4, dtype=np.int64)
    m.translate(np.arange(4, dtype=np.int64), first, 0, out)
    m.end(first)
    running = m.begin()
    m.translate(np.arange(4, 8, dtype=np.int64), running, 0, np.empty(4, dtype=np.int64))
    keep = np.zeros(8, dtype=bool)
    keep[out[0]] = True
    victims = m.victims(0, 8, keep)
    assert sorted(m.ids[victims].tolist()) == [1, 2, 3]  # not the kept one, nor the running op's rows


# ------------------------------------------------------------------------------------------------
# real clients


def ahead_reader(path, rank: int, clocks: int) -> Client:
    """A client that clocks ahead at once, so it never holds the job back; once the others have
    left, its reads (through an empty cache) return the servers' exact values."""
    c = Client.connect(path, rank=rank)
    for _ in range(clocks):
        c.clock()
    return c


@pytest.mark.timeout(60)
def test_a_client_holds_only_the_rows_it_touches_of_a_huge_dense_table(bosen_cluster):
    """20M rows x 16 (1.28 GB of values): the client's arrays hold slots for the rows it touched, a
    few thousand, and every value read back is exact."""
    c = bosen_cluster(2, workers=1, staleness=0, tables={"E": {"rows": 20_000_000, "cols": 16, "storage": "sparse"}})
    with Client.connect(c.path, rank=0) as client:
        t = client.table("E")
        rows = np.random.default_rng(1).choice(20_000_000, size=3000, replace=False)
        for tick in range(3):
            t.inc_rows(rows, np.full((rows.shape[0], 16), 1.0, dtype=np.float32))
            client.clock()
            got = t.get_rows(rows)
            np.testing.assert_array_equal(got, np.full_like(got, tick + 1))
        s = client.stats()["tables"]["E"]
        assert s["rows_held"] == 3000 and s["slots"] <= 2 * 4096, s


@pytest.mark.timeout(60)
def test_64_bit_ids_on_a_sparse_table_without_rows(bosen_cluster):
    """Ids anywhere in [0, 2**63 - 1): increments, reads and views round-trip through two servers."""
    c = bosen_cluster(2, workers=2, staleness=0, tables={"E": {"cols": 4, "storage": "sparse"}})
    ids = np.unique(np.random.default_rng(2).integers(0, UNBOUNDED, size=500, dtype=np.int64))
    reader = ahead_reader(c.path, 1, 3)
    with Client.connect(c.path, rank=0) as client:
        t = client.table("E")
        assert t.rows == UNBOUNDED
        deltas = np.arange(ids.shape[0] * 4, dtype=np.float32).reshape(-1, 4)
        t.inc_rows(ids, deltas)
        np.testing.assert_array_equal(t.get_rows(ids), deltas)  # read-my-writes before the clock
        client.clock()
        v = t.view(ids[::2])
        v.refresh()
        v.values += 1
        v.push()
        client.clock()
        want = deltas.copy()
        want[::2] += 1
        np.testing.assert_array_equal(t.get_rows(ids), want)
        with pytest.raises(IndexError, match="out of range"):
            t.get_rows(np.array([-1], dtype=np.int64))
    with reader:  # the servers' values, through an empty cache
        np.testing.assert_array_equal(reader.table("E").get_rows(ids), want)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("storage", ["dense", "sparse"])
def test_a_bounded_cache_evicts_clean_rows_and_loses_no_update(bosen_cluster, storage):
    """cache_rows 64 on 2 servers: a worker increments 1,000 rows, each read back many times across
    clocks; the cache never holds more than its bound once each clock's updates are out, rows are
    evicted and read again, and every value is exact."""
    c = bosen_cluster(2, workers=2, staleness=1,
                      tables={"T": {"rows": 1000, "cols": 2, "dtype": "int64", "storage": storage, "cache_rows": 64}})
    want = np.zeros((1000, 2), dtype=np.int64)
    rng = np.random.default_rng(3)
    reader = ahead_reader(c.path, 1, 9)
    with Client.connect(c.path, rank=0) as client:
        t = client.table("T")
        for _ in range(6):
            for _ in range(20):
                rows = np.unique(rng.integers(0, 1000, size=16))
                got = t.get_rows(rows)
                np.testing.assert_array_equal(got, want[rows])  # one process: its own updates, exactly
                t.inc_rows(rows, np.ones((rows.shape[0], 2), dtype=np.int64))
                want[rows] += 1
            client.clock()
        s = client.stats()["tables"]["T"]
        assert s["rows_evicted"] > 0 and s["slots"] <= 64 + 2 * 32, s
        np.testing.assert_array_equal(t.get_rows(np.arange(0, 1000, 97)), want[::97])
    with reader:
        np.testing.assert_array_equal(reader.table("T").get_rows(np.arange(1000)), want)


@pytest.mark.timeout(60)
def test_a_bound_far_above_the_rows_held_grows_the_slots_and_evicts_nothing(bosen_cluster):
    """cache_rows 100,000: reads of 5,000 new rows at a time outgrow the first slots (64 a server)
    long before the bound; the client grows them, where it once tried to evict a negative count."""
    c = bosen_cluster(2, workers=1, staleness=0,
                      tables={"T": {"cols": 2, "storage": "sparse", "cache_rows": 100_000}})
    with Client.connect(c.path, rank=0) as client:
        t = client.table("T")
        ids = np.random.default_rng(0).integers(0, UNBOUNDED, size=20_000)
        for k in range(4):
            assert t.get_rows(ids[k * 5000:(k + 1) * 5000]).shape == (5000, 2)
        s = client.stats()["tables"]["T"]
        assert s["rows_held"] == 20_000 and s["rows_evicted"] == 0, s


@pytest.mark.timeout(60)
def test_a_view_keeps_its_rows_until_it_is_dropped(bosen_cluster):
    """A view's rows are never evicted while it lives (its copy stamps name their slots); once it is
    gone they may be."""
    c = bosen_cluster(1, workers=1, staleness=0,
                      tables={"T": {"rows": 10_000, "cols": 2, "storage": "sparse", "cache_rows": 16}})
    with Client.connect(c.path, rank=0) as client:
        t = client.table("T")
        st = client._state("T")
        v = t.view(np.arange(8, dtype=np.int64))
        v.refresh()
        for k in range(10):
            t.get_rows(np.arange(100 + 8 * k, 108 + 8 * k, dtype=np.int64))
        held = st.slots.lookup(np.arange(8, dtype=np.int64))
        assert (held >= 0).all() and st.evicted > 0
        v.values += 1
        v.push()
        client.clock()
        np.testing.assert_array_equal(v.refresh(), np.ones((8, 2), dtype=np.float32))
        del v
        gc.collect()
        assert not st.pins.any()
